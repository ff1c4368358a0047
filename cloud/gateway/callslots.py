"""The gRPC calls each device holds open at the gateway, at most ``limits.max_calls_per_device``.

gRPC bounds the calls of all clients together (``limits.max_concurrent_rpcs``) and holds one
from its headers on, before its request arrives. Without a bound per device, one device with a
valid token (a compromised or broken one) that opened calls and never sent their requests held
every slot, and every other device was refused RESOURCE_EXHAUSTED (found by a probe: 200 such
calls of one device froze a gateway allowing 200). With authentication on, the device is known
from the headers (the device of the bearer token, ``TokenAuth.holder``), so the gateway's
interceptor hands each call of a device to :meth:`CallSlots.counted`, which takes one of that
device's slots when the call starts and gives it back when the call ends, however it ends (an
answer, an error, the client's cancellation, before or after its request arrived).

To see both ends of a call, whatever its request, each method is served as one taking a stream
of requests: gRPC calls such a handler at once, not when the request has arrived (a unary
handler of a call whose request never came would never run, and its slot never come back). The
wrapped unary method reads its one request from that stream itself.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

#: refuses a call over its device's bound: ends it with an error (raises, as ``context.abort``)
Refuse = Callable[[grpc.aio.ServicerContext], Awaitable[None]]


class CallSlots:
    """Open gRPC calls per device, at most ``cap`` each."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.open: dict[str, int] = {}  # device -> its calls open now (a device with none is absent)

    async def _take(self, device: str, context: grpc.aio.ServicerContext, refuse: Refuse) -> None:
        if self.open.get(device, 0) >= self.cap:
            await refuse(context)
            raise AssertionError("refuse() must end the call")  # (context.abort raises)
        self.open[device] = self.open.get(device, 0) + 1

    def _give_back(self, device: str) -> None:
        left = self.open[device] - 1
        if left:
            self.open[device] = left
        else:
            del self.open[device]

    def counted(self, handler: grpc.RpcMethodHandler, device: str, refuse: Refuse) -> grpc.RpcMethodHandler:
        """``handler`` served as a method taking a stream of requests, holding one of ``device``'s
        slots from the call's start to its end; a call over the bound is ended by ``refuse``."""
        take, give_back = self._take, self._give_back

        async def first(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
            async for request in requests:
                return request
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the call ended without its request message")

        async def behave(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
            if handler.request_streaming:
                return (handler.stream_stream or handler.stream_unary)(requests, context)
            return (handler.unary_stream or handler.unary_unary)(await first(requests, context), context)

        async def one_answer(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
            await take(device, context, refuse)
            try:
                answer = await behave(requests, context)
                return (await answer) if inspect.isawaitable(answer) else answer
            finally:
                give_back(device)

        async def answers(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> None:
            # writes (gRPC takes one style of a call's answers: an async generator or context.write)
            await take(device, context, refuse)
            try:
                out = await behave(requests, context)
                if hasattr(out, "__aiter__"):  # an async generator's answers
                    async for answer in out:
                        await context.write(answer)
                elif inspect.isawaitable(out):  # writes its answers with context.write
                    await out
            finally:
                give_back(device)

        if handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(answers, handler.request_deserializer,
                                                         handler.response_serializer)
        return grpc.stream_unary_rpc_method_handler(one_answer, handler.request_deserializer,
                                                    handler.response_serializer)
