"""Addresses that cannot be bound: a ConfigError naming the setting, for the gateway's and the
worker's gRPC and metrics ports (real sockets held by this test, real servers)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket

import pytest

from cloud.gateway.server import Gateway
from cloud.worker.server import create_server
from edgewise.errors import ConfigError
from tests.cloud.gateway.test_gateway import settings_for
from tests.cloud.worker.test_server import make_settings
from tests.logs import errors


@contextlib.contextmanager
def held_port():
    """A port another process would hold: bound and listening, without SO_REUSEPORT."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    try:
        yield s.getsockname()[1]
    finally:
        s.close()


def _gateway_start(**over) -> None:
    async def main():
        gw = Gateway(settings_for([], **{"discovery.static": ["127.0.0.1:1"], **over}))
        try:
            await gw.start()
        finally:
            await gw.stop(0)
    asyncio.run(main())


def test_gateway_ports_in_use_name_their_setting():
    with held_port() as port:
        with pytest.raises(ConfigError, match=rf"^listen: cannot bind 127.0.0.1:{port}: .*Choose another port"):
            _gateway_start(listen=f"127.0.0.1:{port}")
        with pytest.raises(ConfigError, match=rf"(?i)^metrics_host/metrics_port: cannot bind 127.0.0.1:{port}: "
                                              r".*address already in use"):
            _gateway_start(metrics_port=port)
    with pytest.raises(ConfigError, match=r"^metrics_host/metrics_port: cannot bind no-such-host.invalid:0"):
        _gateway_start(metrics_host="no-such-host.invalid")


def test_an_ipv6_side_port_in_use_is_named_in_brackets(tiny_model):
    """The address in the message is one a user can read back: ``[::1]:9100``, not ``::1:9100``."""
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    s = socket.socket(socket.AF_INET6)
    s.bind(("::1", 0))
    s.listen()
    port = s.getsockname()[1]
    try:
        with pytest.raises(ConfigError, match=rf"^metrics_host/metrics_port: cannot bind \[::1\]:{port}: "):
            _gateway_start(metrics_host="::1", metrics_port=port)

        async def worker() -> None:
            server, _ = create_server(dataclasses.replace(make_settings(tiny_model), metrics_host="::1",
                                                          metrics_port=port))
            with pytest.raises(ConfigError, match=rf"^metrics_host/metrics_port: cannot bind \[::1\]:{port}"):
                await server.bind()
        asyncio.run(worker())
    finally:
        s.close()


def test_gateway_listen_port_out_of_range_is_a_settings_error():
    with pytest.raises(ConfigError, match=r"listen: 'nohost:99999': port 99999 is outside 0..65535"):
        settings_for([], **{"discovery.static": ["127.0.0.1:1"], "listen": "nohost:99999"})


def test_worker_ports_in_use_name_their_setting(tiny_model):
    async def main():
        with held_port() as port:
            with pytest.raises(ConfigError, match=rf"^host/port: cannot bind 127.0.0.1:{port}: "):
                create_server(dataclasses.replace(make_settings(tiny_model), port=port))
            server, _ = create_server(dataclasses.replace(make_settings(tiny_model), metrics_port=port))
            with pytest.raises(ConfigError, match=rf"^metrics_host/metrics_port: cannot bind 127.0.0.1:{port}"):
                await server.bind()
    asyncio.run(main())


def test_server_options_cap_streams_per_connection_only_when_asked():
    """The gateway's server caps the calls one connection holds (HTTP/2 max concurrent streams);
    the workers', which take all of a gateway's requests on one connection, does not; neither
    closes idle connections (an edge keeps its connection between escalations), and only the
    gateway's ends old ones (``limits.max_connection_age_s``), with no grace that would cut a call."""
    from cloud.binding import server_options

    capped = dict(server_options(1024, 100))
    assert capped["grpc.max_concurrent_streams"] == 100
    assert "grpc.max_concurrent_streams" not in dict(server_options(1024))
    for opts in (capped, dict(server_options(1024)), dict(server_options(1024, 100, 10, 0))):
        assert "grpc.max_connection_idle_ms" not in opts and "grpc.max_connection_age_ms" not in opts
        assert opts["grpc.keepalive_permit_without_calls"] == 1
    aged = dict(server_options(1024, 100, 10, 1800.0))
    assert aged["grpc.max_connection_age_ms"] == 1_800_000 and "grpc.max_connection_age_grace_ms" not in aged


@pytest.mark.parametrize("age_s", [1.0, 0.0])
def test_a_gateway_sends_an_old_connection_goaway_so_its_client_reconnects(age_s):
    """A Service spreads connections, not calls, and an edge kept its connection for good: after a
    rolling restart of two gateway replicas every edge sat on the one restarted last (found by a
    probe). With ``limits.max_connection_age_s`` the gateway sends an old connection GOAWAY (the
    client's channel leaves READY, and its next call connects anew, through the Service); a call
    still open on it is not cut (a real gateway, a real channel; 0: never)."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    async def main() -> grpc.ChannelConnectivity:
        gw = Gateway(settings_for([], **{"discovery.static": ["127.0.0.1:9"], "limits.max_connection_age_s": age_s}))
        await gw.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as ch:
                stub = health_pb2_grpc.HealthStub(ch)
                watch = stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=30)
                assert (await watch.read()).status  # a long call open on the connection
                deadline = asyncio.get_running_loop().time() + 4.0
                while ch.get_state() == grpc.ChannelConnectivity.READY and asyncio.get_running_loop().time() < deadline:
                    await asyncio.sleep(0.05)
                state = ch.get_state()
                assert watch.done() is False or await watch.code() == grpc.StatusCode.OK  # not cut
                await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)  # a new connection serves
                watch.cancel()
                return state
        finally:
            await gw.stop(0)

    state = asyncio.run(main())
    assert (state != grpc.ChannelConnectivity.READY) == (age_s > 0), state


@pytest.mark.parametrize("key", ["limits.max_message_bytes", "limits.max_concurrent_rpcs",
                                 "limits.max_streams_per_connection"])
def test_grpc_bound_gateway_settings_stop_at_what_grpc_takes(key):
    """gRPC takes its options as C ints: one more was an OverflowError traceback at start
    (and a crash-looping pod from a chart value); now a settings error naming the key.
    The largest allowed value starts a server."""
    from cloud.binding import GRPC_INT_MAX

    with pytest.raises(ConfigError, match=rf"{key}: '{GRPC_INT_MAX + 1}' is out of range"):
        settings_for([], **{key: str(GRPC_INT_MAX + 1), "discovery.static": ["127.0.0.1:9"]})

    async def main():
        gw = Gateway(settings_for([], **{key: GRPC_INT_MAX, "discovery.static": ["127.0.0.1:9"]}))
        await gw.start()
        await gw.stop(0)
    asyncio.run(main())


def test_a_health_request_that_does_not_parse_is_invalid_argument_not_a_logged_traceback(caplog):
    """A probe's b'\\xff' to Health/Check or Watch was UNKNOWN and 7 lines of traceback at ERROR
    in the gateway's log per request; the health service (``add_health``, the gateway's and the
    workers') now parses its requests itself."""
    import logging

    import grpc
    from grpc_health.v1 import health_pb2

    async def main():
        gw = Gateway(settings_for([], **{"discovery.static": ["127.0.0.1:9"]}))
        await gw.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as ch:
                for method, call in (("Check", ch.unary_unary), ("Watch", ch.unary_stream)):
                    rpc = call(f"/grpc.health.v1.Health/{method}")(b"\xff", timeout=5)
                    with pytest.raises(grpc.aio.AioRpcError) as info:
                        await (rpc if method == "Check" else rpc.read())
                    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                    assert "request is not a serialized grpc.health.v1.HealthCheckRequest" in (info.value.details() or "")
                check = ch.unary_unary("/grpc.health.v1.Health/Check",
                                       response_deserializer=health_pb2.HealthCheckResponse.FromString)
                answer = await check(health_pb2.HealthCheckRequest().SerializeToString(), timeout=5)
                assert answer.status == health_pb2.HealthCheckResponse.SERVING
        finally:
            await gw.stop(0)

    with caplog.at_level(logging.INFO):
        asyncio.run(main())
    assert not errors(caplog.records), caplog.text



async def _told_while_one_watcher_leaves(address: str, stop) -> list[int]:  # type: ignore[no-untyped-def]
    """Two clients Watch the server's health; one leaves (cancels its Watch), then ``stop()``
    drains the server. What the other one was told, in order, until its stream ended."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    own = [("grpc.use_local_subchannel_pool", 1)]  # a connection each
    async with grpc.aio.insecure_channel(address, options=own) as a, \
            grpc.aio.insecure_channel(address, options=own) as b:
        staying = health_pb2_grpc.HealthStub(a).Watch(health_pb2.HealthCheckRequest())
        leaving = health_pb2_grpc.HealthStub(b).Watch(health_pb2.HealthCheckRequest())
        told = [(await staying.read()).status]
        assert (await leaving.read()).status == health_pb2.HealthCheckResponse.SERVING
        leaving.cancel()
        await asyncio.sleep(0.3)  # the server has seen it leave
        loop = asyncio.get_running_loop()
        stopping = asyncio.ensure_future(stop())
        t0 = loop.time()
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.CancelledError):
            while (answer := await staying.read()) is not grpc.aio.EOF:
                told.append(answer.status)
                if answer.status == health_pb2.HealthCheckResponse.NOT_SERVING:
                    assert loop.time() - t0 < 1.0, "NOT_SERVING came only at the end of the drain"
                    staying.cancel()
        await stopping
        return told


def test_a_watcher_that_leaves_leaves_the_others_told_of_a_drain(tiny_model):
    """grpc_health's asyncio servicer shares one condition among the Watch calls of a service
    and deletes it when any of them ends (grpc/grpc#43403): the watchers still there waited on
    a condition nobody notified again, so a SIGTERM's NOT_SERVING, which tells balancers to stop
    sending, reached none of them: their streams just ended when the drain's grace period was
    over, and meanwhile they sent calls the draining server refused. Found by a probe: two
    watchers, one leaves, the gateway drains. The gateway and the workers share the servicer
    (``cloud.binding.HealthServicer``)."""
    from grpc_health.v1 import health_pb2

    serving, not_serving = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING

    async def gateway() -> list[int]:
        gw = Gateway(settings_for([], **{"discovery.static": ["127.0.0.1:9"]}))
        await gw.start()
        return await _told_while_one_watcher_leaves(f"127.0.0.1:{gw.port}", lambda: gw.stop(2))

    async def worker() -> list[int]:
        server, port = create_server(make_settings(tiny_model))
        await server.start()
        return await _told_while_one_watcher_leaves(f"127.0.0.1:{port}", lambda: server.stop(2))

    assert asyncio.run(gateway()) == [serving, not_serving]
    assert asyncio.run(worker()) == [serving, not_serving]
