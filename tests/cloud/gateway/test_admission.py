"""Admission checks: request validation, bearer tokens, per-device token buckets."""

from __future__ import annotations

import numpy as np

from cloud.gateway.admission import BAD_TOKEN, Caller, RateLimiter, TokenAuth, oversize
from cloud.gateway.admission import validate_request as validate_head
from cloud.gateway.envelope import read_request
from cloud.gateway.settings import LimitSettings
from edgewise.imagefiles import ImageHeader
from edgewise.v1 import detect_pb2
from edgewise.wire import encode_image
from tests.cloud.gateway.workers import jpeg_bytes, request


def validate_request(req: detect_pb2.DetectRequest, lim: LimitSettings):
    """Admission as the gateway runs it: on the head read from the request's bytes."""
    return validate_head(read_request(req.SerializeToString()), lim)


def test_validation_messages():
    lim = LimitSettings(max_id_length=8, max_edge_detections=2)
    assert isinstance(validate_request(request(), lim), ImageHeader)
    assert validate_request(request(device="x" * 9), lim).message.startswith("device_id is 9 characters")
    assert "characters outside" in validate_request(request(device="a b"), lim).message
    r = request()
    r.ClearField("image")
    assert "image is missing" in validate_request(r, lim).message
    r = request()
    r.image.encoding = detect_pb2.Image.ENCODING_UNSPECIFIED
    assert "encoding 0 is not supported" in validate_request(r, lim).message
    r = request(data=encode_image(np.zeros((4, 6, 3), np.uint8), "png").data, encoding=detect_pb2.Image.PNG)
    assert validate_request(r, lim) == ImageHeader("png", 6, 4)  # what routing reads: 24 pixels
    r.image.encoding = detect_pb2.Image.JPEG
    assert "not a JPEG (its magic bytes say PNG)" in validate_request(r, lim).message
    r = request(data=bytes(12), encoding=detect_pb2.Image.RAW)
    r.image.shape[:] = [2, 2, 3]
    assert validate_request(r, lim).pixels == 4
    r.image.dtype = "float32"
    assert "must be 'uint8'" in validate_request(r, lim).message
    r.image.dtype = "uint8"
    r.image.shape[:] = [2, 2, 1]  # the worker needs BGR: refused here as well, not only there
    assert "[height, width, 3]" in validate_request(r, lim).message
    r = request()
    r.image.source_width, r.image.source_height, r.image.offset_x = 100, 100, 100
    assert "outside" in validate_request(r, lim).message
    r = request()
    r.edge_detections.add(x2=1, y2=1)
    r.edge_detections.add(x2=1, y2=1)
    assert isinstance(validate_request(r, lim), ImageHeader)
    r.edge_detections.add(x2=1, y2=1)
    assert validate_request(r, lim).message == "3 edge_detections; the limit is 2"
    r = request(data=jpeg_bytes() + b"\x00" * 100)  # zero padding after the end-of-image marker
    assert isinstance(validate_request(r, lim), ImageHeader)
    r = request(data=jpeg_bytes()[:-1] + b"\x00" * 100)
    assert "truncated JPEG" in validate_request(r, lim).message


def test_token_auth():
    auth = TokenAuth({"cam-1": "abc"})
    assert auth.check({"authorization": "Bearer abc"}, "cam-1") == ("cam-1", None)
    assert auth.check({"authorization": "bearer abc", "x-edgewise-device": "cam-1"}, "") == ("cam-1", None)
    for md, dev, needle in [({}, "cam-1", "missing"),
                            ({"authorization": "Bearer abd"}, "cam-1", "unknown device or bad token for device 'cam-1'"),
                            ({"authorization": "Bearer abc"}, "cam-2", "unknown device or bad token for device 'cam-2'"),
                            ({"authorization": "Bearer abc"}, "", "no device identity"),
                            ({"authorization": "Basic abc"}, "cam-1", "missing")]:
        who, rej = auth.check(md, dev)
        assert who is None and rej.status == detect_pb2.UNAUTHENTICATED and needle in rej.message
    assert TokenAuth({}).check({}, "any") == ("any", None)
    # a client cannot tell an unknown device from a bad token; only the log's detail can
    unknown = auth.check({"authorization": "Bearer abc"}, "cam-2")[1]
    bad = auth.check({"authorization": "Bearer abd"}, "cam-1")[1]
    assert unknown.message.replace("cam-2", "cam-1") == bad.message and unknown.detail != bad.detail
    assert "abc" not in unknown.message + unknown.detail and "abd" not in bad.message + bad.detail
    # a huge id is quoted cut short (a 20 KB one made the answer's metadata too large)
    huge = "d" * 20_000
    rej = auth.check({"authorization": "Bearer abc"}, huge)[1]
    assert repr("d" * 64) + "…" in rej.message and len(rej.message) < 300
    rej = auth.authenticate(Caller({"authorization": "Bearer abc"}, topic_device="cam-1"), huge)
    assert rej is not None and len(rej.message) < 300
    # a stream opens without a frame: what it lacks is the metadata, not a device_id
    assert "set the request's device_id" in auth.check({"authorization": "Bearer abc"}, "")[1].message
    assert "x-edgewise-device" in auth.check({"authorization": "Bearer abc"}, "", stream=True)[1].message


def test_the_header_screen_wants_some_devices_token_and_follows_a_rotation():
    """``TokenAuth.screen`` (a Detect call's metadata, before its request): any device's
    token passes, the device is checked later; a rotated-out token no longer passes."""
    auth = TokenAuth({"cam-1": "one", "cam-2": "two"})
    for header, problem in (("", "missing 'authorization"), ("Basic one", "missing 'authorization"),
                            ("Bearer ", "missing 'authorization"), ("Bearer three", "unknown device or bad token; "),
                            ("Bearer one", None), ("bearer  two ", None)):
        bad = auth.screen({"authorization": header} if header else {})
        assert (bad is None) if problem is None else (bad is not None and problem in bad.message), (header, bad)
    # the words of every bad token, the device named where the caller claims one (bad_token)
    claimed = auth.screen({"authorization": "Bearer three", "x-edgewise-device": "cam-1"})
    assert claimed is not None and claimed.message == auth.check({"authorization": "Bearer three"}, "cam-1")[1].message
    assert claimed.message.startswith(BAD_TOKEN + " for device 'cam-1'; ") and claimed.detail
    auth.tokens = {"cam-1": "uno", "cam-2": "two"}  # as reload_tokens puts a rotation in force
    assert auth.screen({"authorization": "Bearer one"}) is not None
    assert auth.screen({"authorization": "Bearer uno"}) is None
    assert TokenAuth({}).screen({}) is None  # authentication off: nothing to screen


def test_authenticate_binds_topic_certificate_and_token_to_the_device():
    auth = TokenAuth({"cam-1": "abc", "cam-2": "xyz"})
    tok1 = {"authorization": "Bearer abc"}
    assert auth.authenticate(Caller(tok1), "cam-1") is None
    assert auth.authenticate(Caller(tok1, cert_names=("cam-1",)), "cam-1") is None
    cases = [
        (Caller({"authorization": "Bearer xyz"}, cert_names=("cam-1",)), "cam-2", "not a name of the client certificate"),
        (Caller(tok1, cert_names=()), "cam-1", "certificate (none"),  # a certificate without that name
        (Caller({**tok1, "x-edgewise-device": "cam-2"}, topic_device="cam-2"), "cam-1", "topic's device 'cam-2'"),
        (Caller({"x-edgewise-device": "cam-1"}, topic_device="cam-1"), "cam-1", "missing 'authorization"),
    ]
    for caller, device, needle in cases:
        rej = auth.authenticate(caller, device)
        assert rej is not None and rej.status == detect_pb2.UNAUTHENTICATED and needle in rej.message, rej
    # without tokens the topic and the certificate still bind the device
    off = TokenAuth({})
    assert off.authenticate(Caller({}, topic_device="cam-1"), "cam-1") is None
    assert off.authenticate(Caller({}, topic_device="cam-1"), "cam-2") is not None
    assert off.authenticate(Caller({}, cert_names=("cam-1",)), "cam-2") is not None
    assert off.authenticate(Caller({}, cert_names=("cam-1",)), "") is None  # empty id: validation says so


def test_rate_limiter_buckets():
    t = [0.0]
    rl = RateLimiter(rate=2.0, burst=2.0, clock=lambda: t[0], max_devices=2)
    assert rl.allow("a") is None and rl.allow("a") is None
    rej = rl.allow("a")
    assert rej.status == detect_pb2.RESOURCE_EXHAUSTED and "2 requests/s" in rej.message
    assert rl.allow("b") is None  # per device
    t[0] = 0.5
    assert rl.allow("a") is None and rl.allow("a") is not None
    assert rl.limited == 2
    rl.allow("c")
    assert len(rl._buckets) == 2  # bounded memory
    assert RateLimiter(0, 1).allow("x") is None


def test_the_size_rule_is_worded_as_grpc_words_its_own():
    """``oversize``: the MQTT bridge's refusal of a request over ``limits.max_message_bytes`` (gRPC
    core refuses a gRPC message over the same limit before the gateway sees it) carries gRPC's
    phrase, which the edge and docs/troubleshooting.md know, with the sizes as gRPC gives them."""
    assert oversize(1000, 1000) is None
    rej = oversize(1001, 1000)
    assert rej is not None and rej.status == detect_pb2.INVALID_ARGUMENT
    assert "message larger than max (1001 vs. 1000 bytes" in rej.message and "limits.max_message_bytes" in rej.message
