"""EndpointSlice → endpoint mapping on real-shaped objects (raw dicts and kubernetes client models),
and the list+watch shell against a local HTTP server speaking the Kubernetes API."""

from __future__ import annotations

import asyncio
import time

import pytest
from kubernetes.client import V1EndpointSlice, V1Pod

from cloud.discovery.base import Endpoint, EndpointState
from cloud.discovery.kubeclient import KubeAccess, build_api_client
from cloud.discovery.kubernetes import (
    KubernetesDiscovery,
    endpoints_from_slices,
    pods_of,
    weight_from_pod,
)
from edgewise.errors import ConfigError
from tests.cloud.discovery.fakeapi import FakeKubeAPI, endpoint, slice_doc
from tests.listener import TricklingGateway
from tests.waiting import async_wait_until

R, D = EndpointState.READY, EndpointState.DRAINING


def as_model(doc):
    return V1EndpointSlice.from_dict(doc)


@pytest.mark.parametrize("form", [lambda d: d, as_model], ids=["dict", "model"])
def test_conditions_map_to_states(form):
    s = slice_doc("w-abc", "w", [
        endpoint("10.0.0.1", "p1", ready=True, serving=True, terminating=False),
        endpoint("10.0.0.2", "p2", ready=False, serving=True, terminating=True),    # draining, can serve
        endpoint("10.0.0.3", "p3", ready=False, serving=False, terminating=True),   # going away
        endpoint("10.0.0.4", "p4", ready=False, serving=False, terminating=False),  # failing readiness
        endpoint("10.0.0.5", "p5", ready=None),                                      # nil: ready (API docs)
        endpoint("10.0.0.6", "p6", ready=True, terminating=True),                   # publishNotReadyAddresses
    ])
    eps = endpoints_from_slices([form(s)], port_name="grpc")
    got = {e.address: (e.state, e.name, e.weight) for e in eps}
    assert got == {
        "10.0.0.1:50051": (R, "p1", 1.0), "10.0.0.2:50051": (D, "p2", 1.0), "10.0.0.3:50051": (D, "p3", 1.0),
        "10.0.0.4:50051": (D, "p4", 1.0), "10.0.0.5:50051": (R, "p5", 1.0), "10.0.0.6:50051": (D, "p6", 1.0),
    }


@pytest.mark.parametrize("form", [lambda d: d, as_model], ids=["dict", "model"])
def test_multiple_slices_duplicates_ports_and_weights(form):
    a = slice_doc("w-a", "w", [endpoint("10.0.0.1", "p1"), endpoint("10.0.0.2", "p2", ready=False)],
                  ports=(("metrics", 9100), ("grpc", 50051)))
    # the controller moved p2 to another slice and has not yet removed the old copy
    b = slice_doc("w-b", "w", [endpoint("10.0.0.2", "p2"), endpoint("10.0.0.3", "p3")],
                  ports=(("grpc", 50051),))
    v6 = slice_doc("w-c", "w", [endpoint("fd00::7", "p7")], address_type="IPv6")
    other_port = slice_doc("w-d", "w", [endpoint("10.0.0.9", "p9")], ports=(("http", 8080),))
    eps = endpoints_from_slices([form(a), form(b), form(v6), form(other_port)], port_name="grpc",
                                weights={"p1": 4.0, "p3": 0.5})
    assert eps == frozenset({
        Endpoint("10.0.0.1:50051", 4.0, R, "p1"), Endpoint("10.0.0.2:50051", 1.0, R, "p2"),
        Endpoint("10.0.0.3:50051", 0.5, R, "p3"), Endpoint("[fd00::7]:50051", 1.0, R, "p7"),
    })
    # duplicates resolve to READY whichever slice comes first
    assert endpoints_from_slices([form(b), form(a)], port_name="grpc") == \
        endpoints_from_slices([form(a), form(b)], port_name="grpc")
    # no port name: the first port; explicit override wins
    assert {e.address for e in endpoints_from_slices([form(other_port)])} == {"10.0.0.9:8080"}
    assert {e.address for e in endpoints_from_slices([form(other_port)], port=7000)} == {"10.0.0.9:7000"}
    assert pods_of([form(a), form(b)]) == {"p1", "p2", "p3"}


@pytest.mark.parametrize("form", [lambda d: d, as_model], ids=["dict", "model"])
def test_a_dual_stack_service_lists_each_pod_once(form):
    """An IPv4 and an IPv6 slice list every pod of a dual-stack Service: one worker per pod
    (its READY copy, then its IPv4 address), whichever slice comes first."""
    v4 = slice_doc("w-4", "w", [endpoint("10.0.0.1", "p1"), endpoint("10.0.0.2", "p2", ready=False)])
    v6 = slice_doc("w-6", "w", [endpoint("fd00::1", "p1"), endpoint("fd00::2", "p2"), endpoint("fd00::3", "p3")],
                   address_type="IPv6")
    want = frozenset({Endpoint("10.0.0.1:50051", 2.0, R, "p1"), Endpoint("[fd00::2]:50051", 1.0, R, "p2"),
                      Endpoint("[fd00::3]:50051", 1.0, R, "p3")})
    for order in ([v4, v6], [v6, v4]):
        assert endpoints_from_slices([form(s) for s in order], port_name="grpc", weights={"p1": 2.0}) == want


def test_empty_and_odd_slices():
    no_eps = slice_doc("w-e", "w", None)
    no_addr = slice_doc("w-f", "w", [{"addresses": [], "conditions": {"ready": True}}])
    no_ref = slice_doc("w-g", "w", [{"addresses": ["10.1.0.1"], "conditions": {}, "hostname": "h1"}])
    eps = endpoints_from_slices([no_eps, no_addr, no_ref])
    assert eps == frozenset({Endpoint("10.1.0.1:50051", 1.0, R, "h1")})


@pytest.mark.parametrize("ann, expect", [
    ({"edgewise.io/weight": "2.5"}, 2.5), ({"edgewise.io/weight": "abc"}, None),
    ({"edgewise.io/weight": "-1"}, None), ({"edgewise.io/weight": "inf"}, None), ({}, None), (None, None),
])
def test_weight_annotation(ann, expect):
    doc = {"metadata": {"name": "p", "annotations": ann}}
    assert weight_from_pod(doc) == expect
    assert weight_from_pod(V1Pod.from_dict(doc)) == expect


# ---- the watch against a local API server ---------------------------------------------------

@pytest.fixture
def kube():
    api = FakeKubeAPI(namespace="ns", service="edgewise-worker")
    yield api
    api.close()


def make(kube, **kw):
    client = build_api_client(KubeAccess(api_server=kube.url, token="tok"))
    kw.setdefault("backoff_initial_s", 0.05)
    kw.setdefault("backoff_max_s", 0.2)
    return KubernetesDiscovery("edgewise-worker", "ns", port_name="grpc", api_client=client,
                               watch_timeout_s=kw.pop("watch_timeout_s", 30), **kw)


async def until(agen, pred, timeout=10.0):
    """Next snapshots until ``pred(snapshot)``; returns it."""
    end = time.monotonic() + timeout
    while True:
        snap = await asyncio.wait_for(agen.__anext__(), max(0.01, end - time.monotonic()))
        if pred(snap):
            return snap


def by_addr(snap):
    return {e.address: (e.state, e.weight) for e in snap}


def test_list_then_watch_add_drain_remove(kube):
    kube.put_pod("p1", weight=3)
    kube.put_pod("p2")
    kube.put_slice(slice_doc("w-a", "edgewise-worker", [endpoint("10.0.0.1", "p1"), endpoint("10.0.0.2", "p2")]))

    async def scenario():
        d = make(kube)
        agen = d.watch()
        first = await until(agen, lambda s: True)
        assert by_addr(first) == {"10.0.0.1:50051": (R, 3.0), "10.0.0.2:50051": (R, 1.0)}
        # a new worker in a second slice
        kube.put_pod("p3", weight=0.5)
        kube.put_slice(slice_doc("w-b", "edgewise-worker", [endpoint("10.0.0.3", "p3")]))
        snap = await until(agen, lambda s: len(s) == 3)
        assert by_addr(snap)["10.0.0.3:50051"] == (R, 0.5)
        # p2 terminates: still serving -> DRAINING, then gone from the slice
        kube.put_slice(slice_doc("w-a", "edgewise-worker", [
            endpoint("10.0.0.1", "p1"), endpoint("10.0.0.2", "p2", ready=False, serving=True, terminating=True)]))
        snap = await until(agen, lambda s: by_addr(s).get("10.0.0.2:50051", (None,))[0] is D)
        assert by_addr(snap)["10.0.0.1:50051"] == (R, 3.0)
        kube.put_slice(slice_doc("w-a", "edgewise-worker", [endpoint("10.0.0.1", "p1")]))
        snap = await until(agen, lambda s: "10.0.0.2:50051" not in by_addr(s))
        kube.delete_slice("w-b")
        snap = await until(agen, lambda s: len(s) == 1)
        assert by_addr(snap) == {"10.0.0.1:50051": (R, 3.0)}
        t0 = time.monotonic()
        await d.close()
        assert time.monotonic() - t0 < 3.0, "close must interrupt the blocked watch"
        return d

    d = asyncio.run(scenario())
    lists = [q for p, q, _ in kube.requests if p.endswith("/endpointslices") and "watch" not in q]
    assert len(lists) == 1 and d.lists == 1 and d.errors == 0
    assert all(auth == "Bearer tok" for _, _, auth in kube.requests)
    # each pod was read once (cached by name+uid)
    assert kube.count("/pods/p1") == 1 and kube.count("/pods/p3") == 1


def test_410_gone_relists_and_sees_changes_made_meanwhile(kube):
    kube.put_slice(slice_doc("w-a", "edgewise-worker", [endpoint("10.0.0.1", "p1")]))

    async def scenario():
        d = make(kube)
        agen = d.watch()
        await until(agen, lambda s: len(s) == 1)
        kube.expire()  # stream ends; history compacted
        kube.put_slice(slice_doc("w-b", "edgewise-worker", [endpoint("10.0.0.5", "p5")]))
        snap = await until(agen, lambda s: len(s) == 2)
        await d.close()
        return d, snap

    d, snap = asyncio.run(scenario())
    assert {e.address for e in snap} == {"10.0.0.1:50051", "10.0.0.5:50051"}
    assert d.relists_410 == 1 and d.lists == 2


def test_watch_resumes_from_bookmark_after_timeout(kube):
    kube.put_slice(slice_doc("w-a", "edgewise-worker", [endpoint("10.0.0.1", "p1")]))

    async def scenario():
        d = make(kube, watch_timeout_s=1)
        agen = d.watch()
        await until(agen, lambda s: len(s) == 1)
        kube.bookmark()
        mark = str(kube.rv)
        # the server ends the watch at timeoutSeconds=1; the client watches again from the bookmark
        await async_wait_until(lambda: sum(1 for p, q, _ in kube.requests
                                           if p.endswith("/endpointslices") and q.get("watch")) >= 2, 10,
                               "the second watch")
        kube.put_slice(slice_doc("w-b", "edgewise-worker", [endpoint("10.0.0.2", "p2")]))
        await until(agen, lambda s: len(s) == 2)
        await d.close()
        return d, mark

    d, mark = asyncio.run(scenario())
    watches = [q for p, q, _ in kube.requests if p.endswith("/endpointslices") and q.get("watch")]
    assert watches[0]["allowWatchBookmarks"] == "true" and watches[0]["timeoutSeconds"] == "1"
    assert any(q["resourceVersion"] == mark for q in watches[1:]), watches
    assert d.lists == 1  # a timed-out watch resumes, it does not re-list


def test_errors_back_off_and_recover(kube):
    kube.fail_next = 3
    kube.put_slice(slice_doc("w-a", "edgewise-worker", [endpoint("10.0.0.1", "p1")]))

    async def scenario():
        d = make(kube)
        agen = d.watch()
        snap = await until(agen, lambda s: True)
        t0 = time.monotonic()
        await d.close()  # right after the list: the thread may not have opened its watch yet
        assert time.monotonic() - t0 < 2.0 and not d._thread.is_alive()
        return d, snap

    d, snap = asyncio.run(scenario())
    assert len(snap) == 1 and d.errors == 3 and d.lists == 1


def test_unreachable_api_keeps_retrying_without_crashing():
    client = build_api_client(KubeAccess(api_server="http://127.0.0.1:9"))

    async def scenario():
        d = KubernetesDiscovery("w", "ns", api_client=client, backoff_initial_s=0.02, backoff_max_s=0.05,
                                request_timeout_s=1)
        agen = d.watch()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(agen.__anext__(), 0.5)
        await d.close()
        return d

    d = asyncio.run(scenario())
    assert d.errors >= 2


def test_built_from_plain_config_keys(kube, tmp_path):
    """The gateway passes its YAML ``discovery`` mapping straight in (as the chart writes it)."""
    token = tmp_path / "token"
    token.write_text("tok\n")
    kube.put_slice(slice_doc("w-a", "edgewise-worker", [endpoint("10.0.0.1", "p1")], ports=(("grpc", 1),)))
    opts = {"service": "edgewise-worker", "namespace": "ns", "port": 50051, "api_server": kube.url,
            "token_file": str(token), "backoff_initial_s": 0.05}

    async def scenario():
        d = KubernetesDiscovery(**opts)
        snap = await until(d.watch(), lambda s: True)
        await d.close()
        return snap

    assert {e.address for e in asyncio.run(scenario())} == {"10.0.0.1:50051"}
    assert all(auth == "Bearer tok" for _, _, auth in kube.requests)


@pytest.mark.parametrize("kw, msg", [
    (dict(service=""), "Service name"),
    (dict(service="w", port=0), r"discovery.kubernetes.port: 0 is not allowed; allowed: an integer in \[1, 65535\]"),
    (dict(service="w", default_weight=0), "default_weight"),
    # the gateway's discovery.kubernetes mapping is untyped YAML: each of these reached the watch
    (dict(service="w", backoff_initial_s="0.5"), r"discovery.kubernetes.backoff_initial_s: '0.5' is not allowed"),
    (dict(service="w", backoff_initial_s=0), r"backoff_initial_s: 0 is not allowed; allowed: a number in \(0"),
    (dict(service="w", backoff_max_s=0.1), r"backoff_max_s: 0.1 is below backoff_initial_s \(0.5\)"),
    (dict(service="w", request_timeout_s="10"), r"request_timeout_s: '10' is not allowed"),
    (dict(service="w", watch_timeout_s=True), r"watch_timeout_s: true is not allowed; allowed: an integer >= 1"),
    (dict(service="w", port_name=50051), r"port_name: 50051 is not allowed.*a port number goes in port"),
    (dict(service="w", api_server="http://127.0.0.1:9", token_file="/nonexistent/token"), "token_file"),
])
def test_config_errors(kw, msg):
    with pytest.raises(ConfigError, match=msg):
        KubernetesDiscovery(**kw)


def _watches(kube: FakeKubeAPI) -> int:
    return sum(1 for p, q, _ in kube.requests if p.endswith("/endpointslices") and q.get("watch"))


@pytest.mark.parametrize("fault", ["empty", "gone"])
def test_a_watch_that_ends_at_once_backs_off_instead_of_looping(kube: FakeKubeAPI, fault: str,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """A watch stream that closes at once with no event (a proxy, an API server shutting down), or
    answers 410 right after every list, was reopened (re-listed) at once: about 25 requests a second
    against a local server, as many as the network allows against a real one."""
    kube.watch_fault = fault
    kube.put_slice(slice_doc("w-a", "edgewise-worker", [endpoint("10.0.0.1", "p1")]))

    async def scenario() -> KubernetesDiscovery:
        d = make(kube, backoff_initial_s=0.2, backoff_max_s=5.0)
        snap = await until(d.watch(), lambda s: True)
        assert {e.address for e in snap} == {"10.0.0.1:50051"}
        await asyncio.sleep(1.5)
        await d.close()
        return d

    d = asyncio.run(scenario())
    # backing off 0.2, 0.4, 0.8 s (x0.8-1.2): at most 4 watches in 1.5 s, where the loop made ~35
    assert 2 <= _watches(kube) <= 4, _watches(kube)
    if fault == "empty":
        assert d.lists == 1 and d.errors >= 2  # re-watched from the same resourceVersion, not re-listed
        assert "ended after" in caplog.text and "closes watches early" in caplog.text
    else:
        assert d.relists_410 >= 2 and "410 Gone) right after listing" in caplog.text


def test_recovers_when_the_watch_works_again(kube: FakeKubeAPI) -> None:
    """After 410s right after each list (backing off, growing: a list that succeeds no longer resets
    the back-off, only a watch that worked does), changes are seen once the API server recovers."""
    kube.watch_fault = "gone"
    kube.put_slice(slice_doc("w-a", "edgewise-worker", [endpoint("10.0.0.1", "p1")]))

    async def scenario() -> None:
        d = make(kube, backoff_initial_s=0.1, backoff_max_s=0.4)
        agen = d.watch()
        await until(agen, lambda s: True)
        await async_wait_until(lambda: d.relists_410 >= 3, 10, "three 410s")
        kube.watch_fault = None  # the API server recovers: changes are seen again
        kube.put_slice(slice_doc("w-b", "edgewise-worker", [endpoint("10.0.0.2", "p2")]))
        await until(agen, lambda s: len(s) == 2)
        await d.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("fault", ["forbidden", "slow"])
def test_failing_pod_reads_do_not_hold_endpoint_changes_back(kube: FakeKubeAPI, fault: str,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """Each pod was read (for its weight) on every change while reads failed: with a Role lacking
    ``get pods`` one warning per pod per change; with a slow API server every change waited
    pods x request_timeout_s (10 pods, 1 s: a worker turning not-ready reached the gateway 10 s late)."""
    if fault == "forbidden":
        kube.pod_status = 403
    else:
        kube.pod_delay_s = 2.0
    pods = [f"p{i}" for i in range(8)]
    for p in pods:
        kube.put_pod(p, weight=2)
    kube.put_slice(slice_doc("w-a", "edgewise-worker",
                             [endpoint(f"10.0.0.{i}", p) for i, p in enumerate(pods)]))

    async def scenario() -> list[float]:
        d = make(kube, request_timeout_s=0.5)
        agen = d.watch()
        t0 = time.monotonic()
        first = await until(agen, lambda s: True)
        assert {e.weight for e in first} == {1.0}  # default weight while pods cannot be read
        took = [time.monotonic() - t0]
        for i in range(3):  # three workers become not ready, one change each
            t0 = time.monotonic()
            kube.put_slice(slice_doc("w-a", "edgewise-worker", [
                endpoint(f"10.0.0.{j}", p, ready=j > i) for j, p in enumerate(pods)]))
            await until(agen, lambda s, i=i: by_addr(s)[f"10.0.0.{i}:50051"][0] is D)
            took.append(time.monotonic() - t0)
        await d.close()
        return took

    took = asyncio.run(scenario())
    assert max(took) < 2.0, took  # one failed read (0.5 s) at most, not 8 per change
    assert kube.count("/pods/p0") + sum(kube.count(f"/pods/{p}") for p in pods[1:]) == 1
    warnings = [r for r in caplog.records if "for its edgewise.io/weight weight failed" in r.getMessage()]
    assert len(warnings) == 1
    if fault == "forbidden":
        assert "needs get on pods" in warnings[0].getMessage()


def test_a_zero_back_off_is_refused_not_a_relist_loop(kube: FakeKubeAPI) -> None:
    """``backoff_initial_s: 0`` was taken: against an API server answering 500 the watch re-listed
    as fast as it answered (28 lists in 2 s here, unbounded against a real one); a quoted number
    (``"0.5"``) killed the watch thread at its first failure, leaving the gateway serving with its
    worker set frozen. Both are refused where the options are read, naming the key."""
    kube.fail_next = 10**9
    with pytest.raises(ConfigError, match="discovery.kubernetes.backoff_initial_s: 0 is not allowed"):
        make(kube, backoff_initial_s=0, backoff_max_s=0.2)
    assert kube.requests == []  # refused before any call


def test_a_trickling_list_ends_at_its_timeout_and_does_not_hold_a_stop(caplog: pytest.LogCaptureFixture) -> None:
    """The client's timeout bounds each read: an API server (or a proxy) trickling its list a byte
    every 50 ms held the list, and the worker set, for as long as it trickled, and a gateway
    stopping meanwhile waited 5 s for the thread, left it reading and aborted at exit (SIGABRT,
    exit 134). Each list now ends at request_timeout_s and a close ends one in progress."""
    slow = TricklingGateway("body", seconds=30.0)
    try:
        async def scenario() -> tuple[KubernetesDiscovery, float]:
            d = KubernetesDiscovery("edgewise-worker", "ns", port_name="grpc", api_server=slow.url, token="t",
                                    request_timeout_s=0.5, backoff_initial_s=0.05, backoff_max_s=0.1)
            agen = d.watch()
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(agen.__anext__(), 3.0)
            await async_wait_until(lambda: slow.connections >= 1, 10, "a list in progress")
            t0 = time.monotonic()
            await d.close()
            return d, time.monotonic() - t0

        d, took = asyncio.run(scenario())
        assert d.errors >= 2, d.errors  # 3 s of lists of at most 0.5 s each, where one list ran all along
        assert took < 2.0 and d._thread is not None and not d._thread.is_alive(), took
        assert "listing EndpointSlices: no complete answer within request_timeout_s (0.5 s)" in caplog.text
    finally:
        slow.close()



NOT_A_LIST = "the answer to listing EndpointSlices is not an EndpointSliceList (no metadata.resourceVersion)"


@pytest.mark.parametrize("answer, said", [
    (b'{"kind": "EndpointSliceList", "items": []}', NOT_A_LIST),
    (b"null", NOT_A_LIST),
    (b"{}", "ValidationError: 1 validation error for V1EndpointSliceList items "),
    (b'{"kind": "Status", "apiVersion": "v1", "status": "Success"}', "ValidationError: "),
])
def test_a_list_answer_that_is_no_list_keeps_the_workers(kube: FakeKubeAPI, answer: bytes, said: str,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    """A 200 that is no EndpointSliceList (a proxy's own answer, another service at api_server):
    one without metadata but with empty items replaced every worker with none (the pool emptied)
    before failing; the others failed as "'NoneType' object has no attribute 'items'" or a
    validation error over four lines. The workers are kept and the failure is said on one line."""
    kube.put_slice(slice_doc("w-a", "edgewise-worker", [endpoint("10.0.0.1", "p1")]))

    async def scenario() -> tuple[KubernetesDiscovery, list]:
        d = make(kube)
        agen = d.watch()
        snaps = [await until(agen, lambda s: True)]
        kube.list_answer = answer
        kube.expire()  # the watch gets 410: the discovery lists again, and again while it fails
        await async_wait_until(lambda: d.errors >= 2, 10, "two failed lists")
        with pytest.raises(asyncio.TimeoutError):
            snaps.append(await asyncio.wait_for(agen.__anext__(), 0.5))
        await d.close()
        return d, snaps

    d, snaps = asyncio.run(scenario())
    assert [{e.address for e in s} for s in snaps] == [{"10.0.0.1:50051"}]
    failed = [r.getMessage() for r in caplog.records if "EndpointSlice list/watch" in r.getMessage()]
    assert failed and all("\n" not in m for m in failed)
    assert said in failed[-1]


def test_a_slice_without_the_port_is_said_once_not_at_each_event(kube: FakeKubeAPI,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    """A slice without the configured port was warned about at each watch event of any slice
    (a pool whose pods change often logged it on every change); it is said when a slice
    first lacks the port, and again only after the port came back and went again."""
    kube.put_slice(slice_doc("w-a", "edgewise-worker", [endpoint("10.0.0.1", "p1")]))
    kube.put_slice(slice_doc("w-http", "edgewise-worker", [endpoint("10.0.0.9", "p9")], ports=(("http", 8080),)))

    async def scenario() -> None:
        d = make(kube)
        agen = d.watch()
        await until(agen, lambda s: len(s) == 1)
        for n in range(2, 5):  # three changes of the good slice
            kube.put_slice(slice_doc("w-a", "edgewise-worker", [endpoint(f"10.0.0.{i}", f"p{i}")
                                                                for i in range(1, n + 1)]))
            await until(agen, lambda s, n=n: len(s) == n)
        kube.put_slice(slice_doc("w-http", "edgewise-worker", [endpoint("10.0.0.9", "p9")]))
        await until(agen, lambda s: len(s) == 5)
        kube.put_slice(slice_doc("w-http", "edgewise-worker", [endpoint("10.0.0.9", "p9")], ports=(("http", 8080),)))
        await until(agen, lambda s: len(s) == 4)
        await d.close()

    asyncio.run(scenario())
    said = [r.getMessage() for r in caplog.records if "has no port" in r.getMessage()]
    assert said == ["EndpointSlice w-http has no port 'grpc'; skipped (set the port name in discovery)"] * 2
