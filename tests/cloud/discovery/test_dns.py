"""DNS discovery: the real getaddrinfo path on ``localhost``, and the add/drain/remove lifecycle
with an injected resolver (changing records cannot be made in /etc/hosts here)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from cloud.discovery.base import EndpointState
from cloud.discovery.dns import DnsDiscovery, DnsTracker, getaddrinfo_resolver
from edgewise.errors import ConfigError

R, D = EndpointState.READY, EndpointState.DRAINING


def test_real_resolver_resolves_localhost():
    ips = asyncio.run(getaddrinfo_resolver("localhost", 50051))
    assert "127.0.0.1" in ips or "::1" in ips
    assert len(ips) == len(set(ips))


def test_real_resolver_no_such_name_is_lookup_error():
    with pytest.raises((LookupError, OSError)):
        asyncio.run(getaddrinfo_resolver("no-such-host.invalid", 1))


def test_real_discovery_on_localhost():
    async def scenario():
        d = DnsDiscovery("localhost", 50051, interval_s=0.05)
        first = await asyncio.wait_for(d.watch().__anext__(), 5)
        await d.close()
        return first

    first = asyncio.run(scenario())
    addrs = {e.address for e in first}
    assert addrs & {"127.0.0.1:50051", "[::1]:50051"}
    assert all(e.state is R and e.weight == 1.0 for e in first)


def test_tracker_lifecycle():
    t = DnsTracker(port=80, drain_s=10)
    assert {(e.address, e.state) for e in t.update(["10.0.0.1", "10.0.0.2"], 0)} == {
        ("10.0.0.1:80", R), ("10.0.0.2:80", R)}
    snap = t.update(["10.0.0.1"], 5)                       # .2 disappeared -> draining until 15
    assert {(e.address, e.state) for e in snap} == {("10.0.0.1:80", R), ("10.0.0.2:80", D)}
    assert {e.address for e in t.update(["10.0.0.1"], 14.9)} == {"10.0.0.1:80", "10.0.0.2:80"}
    assert {e.address for e in t.update(["10.0.0.1"], 15)} == {"10.0.0.1:80"}
    t.update(["10.0.0.1"], 16)
    t.update([], 17)                                      # .1 drains
    assert {(e.address, e.state) for e in t.update(["10.0.0.1"], 18)} == {("10.0.0.1:80", R)}  # back
    assert {(e.address, e.state) for e in t.update(None, 100)} == {("10.0.0.1:80", R)}  # failure: keep
    assert {e.address for e in DnsTracker(port=80).update(["fd00::1"], 0)} == {"[fd00::1]:80"}


def test_discovery_follows_records_and_survives_failures():
    answers = [["10.0.0.1", "10.0.0.2"], ["10.0.0.1", "10.0.0.2"], OSError("timeout"),
               ["10.0.0.1"], ["10.0.0.1"], ["10.0.0.1"], LookupError("NXDOMAIN"), LookupError("NXDOMAIN")]
    clock = [0.0]

    async def resolver(host, port):
        assert (host, port) == ("workers.ns.svc.cluster.local", 50051)
        clock[0] += 1.0
        a = answers.pop(0) if answers else []
        if isinstance(a, Exception):
            raise a
        return a

    async def scenario():
        d = DnsDiscovery("workers.ns.svc.cluster.local", 50051, interval_s=0.01, drain_s=1.5,
                         resolver=resolver, clock=lambda: clock[0])
        snaps = []
        agen = d.watch()
        while len(snaps) < 5:
            snaps.append({(e.address, e.state) for e in await asyncio.wait_for(agen.__anext__(), 5)})
        await d.close()
        return d, snaps

    d, snaps = asyncio.run(scenario())
    assert snaps == [
        {("10.0.0.1:50051", R), ("10.0.0.2:50051", R)},   # t=1
        {("10.0.0.1:50051", R), ("10.0.0.2:50051", D)},   # t=4 (t=3 failed: kept)
        {("10.0.0.1:50051", R)},                           # t=6: drained 1.5 s later
        {("10.0.0.1:50051", D)},                           # t=7: no such name -> empty, drain
        set(),                                             # t=9
    ]
    assert d.resolve_errors == 1


def test_a_resolver_that_never_answers_keeps_the_set_and_lets_drains_end(caplog):
    # getaddrinfo has no timeout of its own: with a resolver that did not answer, the watch waited
    # in the lookup, unlogged and uncounted, and an address already draining was never removed
    calls = []

    async def resolver(host, port):
        calls.append(host)
        if len(calls) == 1:
            return ["10.0.0.1", "10.0.0.2"]
        if len(calls) == 2:
            return ["10.0.0.1"]
        await asyncio.Event().wait()  # hangs
        return []

    async def scenario():
        d = DnsDiscovery("workers.ns.svc.cluster.local", 50051, interval_s=0.05, drain_s=0.2, resolver=resolver)
        agen = d.watch()
        snaps = [{(e.address, e.state) for e in await asyncio.wait_for(agen.__anext__(), 5)} for _ in range(3)]
        await asyncio.sleep(0.3)
        await d.close()
        return d, snaps

    with caplog.at_level(logging.WARNING, logger="cloud.discovery.dns"):
        d, snaps = asyncio.run(scenario())
    assert snaps == [{("10.0.0.1:50051", R), ("10.0.0.2:50051", R)},
                     {("10.0.0.1:50051", R), ("10.0.0.2:50051", D)},
                     {("10.0.0.1:50051", R)}]  # drained on time while the third lookup hung
    assert len(calls) == 3  # the hung lookup was awaited again, not started at every poll
    assert d.resolve_errors >= 1
    assert "has not answered for 0.05 s or more; keeping the last 1 endpoints" in caplog.text


@pytest.mark.parametrize("kw, msg", [
    (dict(name="", port=1), "empty"), (dict(name="a b", port=1), "spaces"),
    (dict(name="a", port=0), r"discovery.dns.port: 0 is not allowed; allowed: an integer in \[1, 65535\]"),
    (dict(name="a", port=1, interval_s=0), "interval_s"),
    (dict(name="a", port=1, weight=0), "weight"),
    # the gateway's discovery.dns mapping is untyped YAML: these reached the poll loop, where the
    # first ended the watch (the worker set frozen) and the others failed at every poll or drain
    (dict(name="workers..svc", port=1), r"discovery.dns.name: 'workers..svc' is not a DNS name"),
    (dict(name="w" * 64 + ".svc", port=1), "is not a DNS name"),
    (dict(name=5, port=1), "discovery.dns.name: 5 is not allowed"),
    (dict(name="a", port="50051"), r"discovery.dns.port: '50051' is not allowed"),
    (dict(name="a", port=1, drain_s="3"), r"discovery.dns.drain_s: '3' is not allowed"),
    (dict(name="a", port=1, interval_s="5"), r"discovery.dns.interval_s: '5' is not allowed"),
])
def test_dns_config_validated(kw, msg):
    with pytest.raises(ConfigError, match=msg):
        DnsDiscovery(**kw)




def test_one_lookup_stays_one_when_two_callers_awaited_it():
    """Two callers await the same lookup; the first, woken by its answer, starts the next one at
    once; the second, woken after it, must not forget that new lookup (it did: the next call
    started a third while the second was still in the resolver)."""
    from cloud.discovery.dns import OneLookup

    async def scenario():
        answers: list[asyncio.Future[int]] = []

        async def start() -> int:
            answers.append(asyncio.get_running_loop().create_future())
            return await answers[-1]

        one = OneLookup(start)

        async def first() -> None:
            assert await one.result(5) == 1
            with pytest.raises(TimeoutError):  # the next one, started at once: still unanswered
                await one.result(0.05)

        a = asyncio.ensure_future(first())
        b = asyncio.ensure_future(one.result(5))
        await asyncio.sleep(0.01)
        assert len(answers) == 1
        answers[0].set_result(1)
        await a
        assert await b == 1
        with pytest.raises(TimeoutError):
            await one.result(0.05)
        assert len(answers) == 2, f"{len(answers)} lookups at once"
        answers[-1].set_result(2)
        assert await one.result(1) == 2

    asyncio.run(scenario())
