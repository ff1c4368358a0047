"""`edgewise cloud probe`: send one real frame through a gateway and check the answer.

The Helm chart's ``helm test`` hook runs it inside the cluster; operators run it
after an install or from an edge site to check reachability, TLS and tokens.
The frame is rendered locally (digits drawn on a textured background) so the
probe needs no files; exit status 0 only when the gateway answers OK from a
worker within the timeout, 1 when it does not, 2 when an argument cannot be used
(one line naming the flag: a TLS file, a ``--target`` that is not ``host:port``, a
``--timeout`` that is not a number of seconds in (0, 3600]).

TLS is on with any TLS flag: ``--tls-ca`` verifies the gateway with that CA bundle,
``--tls`` alone with gRPC's default roots (a certificate from a public CA);
``--tls-server-name`` checks the certificate for that name instead of the target's
host (a certificate issued for ``gateway.example.com`` reached through the Service
name), as ``grpc.ssl_target_name_override`` does for any gRPC client.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
import uuid

import cv2
import grpc
import numpy as np

from edgewise import status
from edgewise.addresses import parse_hostport
from edgewise.errors import ConfigError
from edgewise.filereads import read_small
from edgewise.v1 import detect_pb2, service_pb2_grpc
from edgewise.wire import encode_image


def probe_frame(width: int = 640, height: int = 480, seed: int = 0) -> np.ndarray:
    """A deterministic BGR test frame with a few drawn digits."""
    rng = np.random.default_rng(seed)
    img = rng.integers(60, 120, size=(height, width, 3), dtype=np.uint8)
    for i, digit in enumerate("3817"):
        x = 60 + i * (width - 120) // 4
        cv2.putText(img, digit, (x, height // 2 + 40), cv2.FONT_HERSHEY_SIMPLEX, 4, (240, 240, 240), 12)
    return img


class ProbeFileError(ConfigError):
    """A TLS file named on the command line is missing, unreadable or not PEM."""


def _read(path: str, flag: str) -> bytes | None:
    """The bytes of ``path`` (None when not given); ProbeFileError names ``flag`` and the file."""
    if not path:
        return None
    try:
        data = read_small(path, f"{flag} {path}")  # capped: /dev/zero was read until the memory ran out
    except OSError as exc:
        raise ProbeFileError(f"{flag} {path}: {exc.strerror or exc}") from None
    except ConfigError as exc:
        raise ProbeFileError(str(exc)) from None
    if b"-----BEGIN " not in data:
        raise ProbeFileError(f"{flag} {path}: not a PEM file (no -----BEGIN line)")
    return data


def channel_credentials(tls_ca: str = "", tls_cert: str = "", tls_key: str = "") -> grpc.ChannelCredentials:
    """TLS credentials from PEM files; empty ``tls_ca`` means gRPC's default roots.

    Raises:
        ProbeFileError: a file cannot be read, is not PEM, or only one of cert/key is given.
    """
    if bool(tls_cert) != bool(tls_key):
        given, missing = ("--tls-cert", "--tls-key") if tls_cert else ("--tls-key", "--tls-cert")
        raise ProbeFileError(f"{given} needs {missing} (a client certificate and its key go together)")
    return grpc.ssl_channel_credentials(
        root_certificates=_read(tls_ca, "--tls-ca"), private_key=_read(tls_key, "--tls-key"),
        certificate_chain=_read(tls_cert, "--tls-cert"))


def _tls_on(tls: bool, *tls_args: str) -> bool:
    """TLS is on with ``--tls`` or any other TLS argument."""
    return tls or any(tls_args)


def probe(
    target: str,
    timeout: float = 10.0,
    tls_ca: str = "",
    token: str = "",
    device_id: str = "probe",
    tls_cert: str = "",
    tls_key: str = "",
    tls: bool = False,
    tls_server_name: str = "",
) -> detect_pb2.DetectResponse:
    """One unary Detect through the gateway at ``target``; raises grpc.RpcError on failure.

    TLS is on when ``tls`` or any TLS argument is set; ``tls_cert``/``tls_key`` add a client
    certificate (mTLS); ``tls_server_name`` is the name the gateway's certificate must carry.
    Raises ProbeFileError for an unusable TLS file.
    """
    if _tls_on(tls, tls_ca, tls_cert, tls_key, tls_server_name):
        options = [("grpc.ssl_target_name_override", tls_server_name)] if tls_server_name else []
        channel = grpc.secure_channel(target, channel_credentials(tls_ca, tls_cert, tls_key), options=options)
    else:
        channel = grpc.insecure_channel(target)
    with channel:
        grpc.channel_ready_future(channel).result(timeout=timeout)
        stub = service_pb2_grpc.EscalationStub(channel)
        now = time.time_ns()
        req = detect_pb2.DetectRequest(
            device_id=device_id,
            stream_id="probe",
            frame_seq=now,
            capture_time_unix_ns=now,
            # no deadline_unix_ns: it would be read against the gateway's clock, and a probe
            # from a host whose clock is behind would always expire; the call's timeout bounds it
            trace_id=uuid.uuid4().hex,
            image=encode_image(probe_frame(), "jpeg", 90),
            reason="probe",
        )
        metadata = [("authorization", f"Bearer {token}"), ("x-edgewise-device", device_id)] if token else None
        return stub.Detect(req, timeout=timeout, metadata=metadata)


#: the longest --timeout, seconds: a probe answers in seconds; far larger values (inf, 1e300)
#: overflowed the wait with a traceback, and NaN waited forever
MAX_TIMEOUT_S = 3600.0


def check_args(target: str, timeout: float) -> None:
    """ConfigError naming ``--target`` (not ``host:port``: the probe waited out its timeout to say it
    could not connect) or ``--timeout`` (not a number of seconds in (0, :data:`MAX_TIMEOUT_S`])."""
    parse_hostport(target, where="--target")
    if not (math.isfinite(timeout) and 0 < timeout <= MAX_TIMEOUT_S):
        raise ConfigError(f"--timeout {timeout:g}: must be a number of seconds in (0, {MAX_TIMEOUT_S:g}]")


def _handler(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    try:
        check_args(args.target, args.timeout)
    except ConfigError as exc:
        print(f"probe: {exc}")
        return 2
    try:
        resp = probe(args.target, args.timeout, args.tls_ca, args.token, args.device_id, args.tls_cert, args.tls_key,
                     args.tls, args.tls_server_name)
    except ProbeFileError as exc:
        print(f"probe: {exc}")
        return 2
    except grpc.FutureTimeoutError:
        name = args.tls_server_name or parse_hostport(args.target)[0]  # [::1]:port: the certificate holds ::1
        hint = (f"TLS: is the certificate valid for {name!r} and signed by the CA?"
                if _tls_on(args.tls, args.tls_ca, args.tls_cert, args.tls_key, args.tls_server_name) else "TLS?")
        print(f"probe: cannot connect to {args.target} within {args.timeout:.0f} s (address, port, {hint})")
        return 1
    except grpc.RpcError as exc:
        print(f"probe: gateway {args.target} answered {status.name(status.status_of(exc))}: {exc.details()}")
        return 1
    ms = (time.perf_counter() - t0) * 1e3
    print(json.dumps({
        "target": args.target, "status": status.name(resp.status), "worker": resp.worker_id, "model": resp.model_name,
        "detections": len(resp.detections), "round_trip_ms": round(ms, 1),
        "queue_ms": round(resp.timing.queue_ms, 2), "compute_ms": round(resp.timing.compute_ms, 2),
    }))
    return 0 if status.is_ok(resp.status) else 1


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``cloud probe``."""
    p = subparsers.add_parser("probe", help="send one real frame through a gateway and check the answer")
    p.add_argument("--target", required=True, help="gateway host:port")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds for connect and answer (default %(default)s)")
    p.add_argument("--tls", action="store_true",
                   help="TLS with gRPC's default roots (a gateway certificate from a public CA)")
    p.add_argument("--tls-ca", default="", help="CA bundle to verify the gateway's certificate (enables TLS)")
    p.add_argument("--tls-server-name", default="",
                   help="name the gateway's certificate must carry, when not the target's host (enables TLS)")
    p.add_argument("--tls-cert", default="", help="client certificate (PEM) for mTLS")
    p.add_argument("--tls-key", default="", help="client private key (PEM) for mTLS")
    p.add_argument("--token", default=os.environ.get("EDGEWISE_PROBE_TOKEN", ""),
                   help="bearer token of --device-id when the gateway checks tokens (env EDGEWISE_PROBE_TOKEN)")
    p.add_argument("--device-id", default="probe", help="device id sent with the request (default %(default)s)")
    p.set_defaults(func=_handler)
