"""The one status table: every wire status round-trips, every error class maps."""

from __future__ import annotations

import inspect

import grpc
import pytest

from edgewise import errors, status
from edgewise.runtime.backends.tensorrt import TensorRTUnavailableError
from edgewise.v1 import detect_pb2


def _subclasses(cls: type) -> set[type]:
    out = set()
    for sub in cls.__subclasses__():
        out |= {sub} | _subclasses(sub)
    return out


def test_table_covers_every_wire_status_once():
    assert sorted(r.status for r in status.TABLE) == sorted(detect_pb2.Status.values())
    codes = [c for r in status.TABLE for c in (r.code, *r.also_from)]
    assert len(codes) == len(set(codes))  # a gRPC code means one wire status


@pytest.mark.parametrize("wire", detect_pb2.Status.values())
def test_every_wire_status_round_trips(wire):
    code = status.grpc_code(wire)
    assert status.from_grpc(code) == wire
    assert status.name(wire) == detect_pb2.Status.Name(wire)
    resp = status.error_response(None, wire, "why")
    assert resp.status == wire and resp.error == "why"
    if wire != detect_pb2.OK:
        assert status.status_of(status.error_of(wire, "x")) in (wire, detect_pb2.INTERNAL)


def test_every_error_class_maps():
    declared = {
        errors.EdgewiseError: detect_pb2.INTERNAL,
        errors.InvalidInputError: detect_pb2.INVALID_ARGUMENT,
        errors.DeploymentError: detect_pb2.UNAVAILABLE,
        errors.OverloadedError: detect_pb2.RESOURCE_EXHAUSTED,
        errors.UnavailableError: detect_pb2.UNAVAILABLE,
        errors.DeadlineExceededError: detect_pb2.DEADLINE_EXCEEDED,
        errors.UnauthenticatedError: detect_pb2.UNAUTHENTICATED,
    }
    # the table's own rows, nothing more or less
    assert {e: r.status for r in status.TABLE for e in r.errors} == declared
    # every class in edgewise.errors is an EdgewiseError, so it maps
    assert {c for _, c in inspect.getmembers(errors, inspect.isclass)} <= _subclasses(errors.EdgewiseError) | {
        errors.EdgewiseError}
    # every subclass anywhere (settings, backends, ...) gets its nearest declared ancestor's status
    for cls in _subclasses(errors.EdgewiseError) | {errors.EdgewiseError}:
        nearest = next(declared[c] for c in cls.__mro__ if c in declared)
        assert status.status_of(cls.__new__(cls)) == nearest, cls.__name__
    assert status.status_of(errors.ConfigError("m")) == detect_pb2.INVALID_ARGUMENT
    assert status.status_of(TensorRTUnavailableError("m")) == detect_pb2.UNAVAILABLE  # the host's problem
    assert status.status_of(ValueError("not ours")) == detect_pb2.INTERNAL


def test_codes_from_peers():
    assert status.from_grpc(grpc.StatusCode.CANCELLED) == detect_pb2.UNAVAILABLE  # a peer shutting down
    assert status.from_grpc(grpc.StatusCode.PERMISSION_DENIED) == detect_pb2.UNAUTHENTICATED
    assert status.from_grpc(grpc.StatusCode.UNIMPLEMENTED) == detect_pb2.INTERNAL
    assert status.from_grpc(grpc.StatusCode.UNKNOWN) == detect_pb2.STATUS_UNSPECIFIED
    assert status.name(99) == "INTERNAL" and status.grpc_code(99) is grpc.StatusCode.INTERNAL


def test_a_message_over_a_size_limit_is_the_requests_fault_not_overload():
    # gRPC core sends both as RESOURCE_EXHAUSTED; only the overload is worth a spool and replay
    ex = grpc.StatusCode.RESOURCE_EXHAUSTED
    assert status.from_grpc(ex, "Received message larger than max (10576364 vs. 8388608)") == detect_pb2.INVALID_ARGUMENT
    assert status.from_grpc(ex, "CLIENT: Sent message larger than max (9 vs. 8)") == detect_pb2.INVALID_ARGUMENT
    assert status.from_grpc(ex, "all 3 workers are saturated") == detect_pb2.RESOURCE_EXHAUSTED
    assert status.from_grpc(ex) == detect_pb2.RESOURCE_EXHAUSTED
    assert status.from_grpc(grpc.StatusCode.UNAVAILABLE, "message larger than max") == detect_pb2.UNAVAILABLE


def test_retryable_and_spoolable_sets():
    assert status.RETRYABLE == {detect_pb2.UNAVAILABLE}
    assert status.SPOOLABLE == {detect_pb2.UNAVAILABLE, detect_pb2.RESOURCE_EXHAUSTED, detect_pb2.DEADLINE_EXCEEDED}
    assert not status.is_ok(detect_pb2.STATUS_UNSPECIFIED)  # an answer that does not say is no success


def test_error_response_keys_the_request():
    req = detect_pb2.DetectRequest(device_id="d", stream_id="s", frame_seq=7, trace_id="t")
    resp = status.error_response(req, detect_pb2.UNAVAILABLE, "down")
    assert (resp.device_id, resp.stream_id, resp.frame_seq, resp.trace_id) == ("d", "s", 7, "t")
