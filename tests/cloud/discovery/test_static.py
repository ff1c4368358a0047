"""Static discovery: parsing and validation of ``host:port[=weight]`` lists."""

from __future__ import annotations

import asyncio

import pytest

from cloud.discovery.base import Endpoint, EndpointState
from cloud.discovery.static import StaticDiscovery, parse_endpoint, parse_endpoints
from edgewise.errors import ConfigError


@pytest.mark.parametrize("spec, address, weight", [
    ("10.0.0.5:50051", "10.0.0.5:50051", 1.0),
    ("worker-0.local:50051=2.5", "worker-0.local:50051", 2.5),
    (" [::1]:7000=3 ", "[::1]:7000", 3.0),
    ("localhost:1", "localhost:1", 1.0),
])
def test_parse_ok(spec, address, weight):
    ep = parse_endpoint(spec)
    assert ep == Endpoint(address, weight, EndpointState.READY, address)


@pytest.mark.parametrize("spec, msg", [
    ("10.0.0.5", "is not 'host:port'"),
    (":50051", "is not 'host:port'"),
    ("host:http", "not an integer"),
    ("host:0", "outside 1..65535"),
    ("host:70000", "outside 1..65535"),
    ("::1:50051", "IPv6 addresses in brackets"),
    ("[::1]50051", "'\\[ipv6\\]:port'"),
    ("host:1=0", "positive finite"),
    ("host:1=-2", "positive finite"),
    ("host:1=nan", "positive finite"),
    ("host:1=heavy", "not a number"),
    ("", "expected 'host:port'"),
])
def test_parse_rejects_with_a_message(spec, msg):
    with pytest.raises(ConfigError, match=msg):
        parse_endpoint(spec, where="gateway.workers[0]")


def test_duplicates_rejected_and_error_names_position():
    with pytest.raises(ConfigError, match=r"workers\[2\]: 10.0.0.1:1 is listed twice"):
        parse_endpoints(["10.0.0.1:1", "10.0.0.2:1", "10.0.0.1:1=3"], where="workers")
    with pytest.raises(ConfigError, match=r"workers\[1\]"):
        parse_endpoints(["10.0.0.1:1", "bad"], where="workers")


def test_watch_yields_once_then_waits_until_closed():
    async def scenario():
        d = StaticDiscovery(["127.0.0.1:5001=2", "127.0.0.1:5002"])
        agen = d.watch()
        first = await agen.__anext__()
        nxt = asyncio.ensure_future(agen.__anext__())
        for _ in range(20):  # let the loop run: nothing changed, so nothing is yielded
            await asyncio.sleep(0)
        assert not nxt.done()
        await d.close()
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(nxt, 1.0)
        return first

    first = asyncio.run(scenario())
    assert {(e.address, e.weight) for e in first} == {("127.0.0.1:5001", 2.0), ("127.0.0.1:5002", 1.0)}
