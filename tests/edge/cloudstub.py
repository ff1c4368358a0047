"""A small real ``edgewise.v1.Escalation`` gRPC server and MQTT v5 responder for edge tests.

It decodes the JPEG, runs a real ONNX model through ``edgewise.runtime.Detector``
and answers with the boxes mapped back into source pixels (crop offsets applied).
The real cloud gateway has its own issue; this stub is what the edge tests talk
to. Run as a process: ``python tests/edge/cloudstub.py --port P --model M
[--mqtt-host H --mqtt-port Q --device D]`` (prints ``READY <port>``), so an e2e test
can kill it with a real signal.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
from pathlib import Path
from typing import Any, List, Optional

import cv2
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402
from grpc import aio  # noqa: E402

from edgewise import mqtt_topics  # noqa: E402
from edgewise.v1 import detect_pb2, service_pb2_grpc  # noqa: E402


class StubCloud:
    """Answers DetectRequests with a real detector; records what it saw."""

    def __init__(self, model: Optional[str], status: int = 0) -> None:
        self.detector: Any = None
        if model:
            from edgewise.runtime.detector import Detector

            self.detector = Detector.from_file(model, backend="onnxruntime", conf_thres=0.01, iou_thres=0.45, source="cloud")
        self.seen: List[Any] = []
        self.force_status = status  # e.g. detect_pb2.RESOURCE_EXHAUSTED
        self.delay_s = 0.0
        self.token: Optional[str] = None  # when set, Detect requires "authorization: Bearer <token>"
        self.lock = threading.Lock()

    def answer(self, req: Any) -> Any:
        with self.lock:
            self.seen.append(req)
        resp = detect_pb2.DetectResponse(
            device_id=req.device_id, stream_id=req.stream_id, frame_seq=req.frame_seq,
            trace_id=req.trace_id, model_name="stub-cloud", worker_id="stub",
        )
        if self.force_status:
            resp.status = self.force_status
            resp.error = "forced by the test"
            return resp
        img = cv2.imdecode(np.frombuffer(req.image.data, np.uint8), cv2.IMREAD_COLOR)
        if img is None:
            resp.status = detect_pb2.INVALID_ARGUMENT
            resp.error = "image does not decode"
            return resp
        resp.status = detect_pb2.OK
        if self.detector is not None:
            (dets,) = self.detector.postprocess(*self._run(img))
            for i in range(len(dets)):
                x1, y1, x2, y2 = (float(v) for v in dets.boxes[i])
                cid = int(dets.class_ids[i])
                resp.detections.add(
                    x1=x1 + req.image.offset_x, y1=y1 + req.image.offset_y,
                    x2=x2 + req.image.offset_x, y2=y2 + req.image.offset_y,
                    score=float(dets.scores[i]), class_id=cid,
                    class_name=dets.names[cid] if cid < len(dets.names) else str(cid), source="cloud",
                )
        return resp

    def _run(self, img: Any) -> Any:
        batch, metas = self.detector.preprocess([img])
        return self.detector.infer(batch), metas


class _Servicer(service_pb2_grpc.EscalationServicer):
    def __init__(self, cloud: StubCloud) -> None:
        self.cloud = cloud

    async def Detect(self, request: Any, context: Any) -> Any:
        if self.cloud.token is not None:
            md = dict(context.invocation_metadata())
            if md.get("authorization") != f"Bearer {self.cloud.token}":
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, "bad or missing bearer token")
        if self.cloud.delay_s:
            await asyncio.sleep(self.cloud.delay_s)
        return self.cloud.answer(request)


async def start_grpc(cloud: StubCloud, port: int = 0, tls: Optional[Any] = None) -> Any:
    """Serve on 127.0.0.1:port; ``tls`` = (key_pem, cert_pem, client_ca_pem or None) for TLS/mTLS."""
    server = aio.server()
    service_pb2_grpc.add_EscalationServicer_to_server(_Servicer(cloud), server)
    if tls is not None:
        key, cert, client_ca = tls
        creds = grpc.ssl_server_credentials([(key, cert)], root_certificates=client_ca,
                                            require_client_auth=client_ca is not None)
        bound = server.add_secure_port(f"127.0.0.1:{port}", creds)
    else:
        bound = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server, bound


class GrpcStubThread:
    """The gRPC stub on its own event loop in a background thread (in-process tests)."""

    def __init__(self, cloud: StubCloud, port: int = 0, tls: Optional[Any] = None) -> None:
        self.cloud = cloud
        self.tls = tls
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.port = 0
        self.server: Any = None
        self.thread = threading.Thread(target=self._main, args=(port,), daemon=True)
        self.thread.start()
        if not self.ready.wait(10):
            raise RuntimeError("stub gRPC server did not start")

    def _main(self, port: int) -> None:
        asyncio.set_event_loop(self.loop)
        self.server, self.port = self.loop.run_until_complete(start_grpc(self.cloud, port, self.tls))
        self.ready.set()
        self.loop.run_forever()

    def stop(self) -> None:
        fut = asyncio.run_coroutine_threadsafe(self.server.stop(0), self.loop)
        fut.result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


class MqttResponder:
    """Answers ``<prefix>/+/escalate`` requests on their MQTT v5 response topic."""

    def __init__(self, cloud: StubCloud, host: str, port: int, prefix: str = "edgewise") -> None:
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        self.cloud = cloud
        self.topic = mqtt_topics.escalate_filter(prefix)
        self.connected = threading.Event()
        self.client = mqtt.Client(callback_api_version=CallbackAPIVersion.VERSION2,
                                  client_id="stub-cloud-responder", protocol=mqtt.MQTTv5)

        def on_connect(c: Any, u: Any, f: Any, rc: Any, p: Any) -> None:
            c.subscribe(self.topic, qos=1)

        def on_subscribe(c: Any, u: Any, mid: Any, rcs: Any, p: Any) -> None:
            self.connected.set()

        def on_message(c: Any, u: Any, msg: Any) -> None:
            req = detect_pb2.DetectRequest()
            req.ParseFromString(msg.payload)
            resp = self.cloud.answer(req)
            props = Properties(PacketTypes.PUBLISH)
            props.CorrelationData = msg.properties.CorrelationData
            c.publish(msg.properties.ResponseTopic, resp.SerializeToString(), qos=1, properties=props)

        self.client.on_connect = on_connect
        self.client.on_subscribe = on_subscribe
        self.client.on_message = on_message
        self.client.connect(host, port)
        self.client.loop_start()
        if not self.connected.wait(10):
            raise RuntimeError("stub MQTT responder did not subscribe")

    def stop(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--model", default="")
    args = ap.parse_args(argv)
    cloud = StubCloud(args.model or None)

    async def serve() -> None:
        server, port = await start_grpc(cloud, args.port)
        print(f"READY {port}", flush=True)
        await server.wait_for_termination()

    asyncio.run(serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
