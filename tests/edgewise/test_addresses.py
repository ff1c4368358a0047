"""host:port as the edge's cloud.endpoints and the gateway's worker lists write it."""

from __future__ import annotations

import pytest

from edgewise.addresses import format_address, host_problem, parse_hostport
from edgewise.errors import ConfigError


@pytest.mark.parametrize("text, parsed", [
    ("10.0.0.5:50051", ("10.0.0.5", 50051)), ("gw.plant.lan:443", ("gw.plant.lan", 443)),
    ("[::1]:50051", ("::1", 50051)), ("localhost:1", ("localhost", 1)), ("fqdn.example.net.:65535", ("fqdn.example.net.", 65535)),
    ("xn--bcher-kva.example:80", ("xn--bcher-kva.example", 80)), ("_svc.w-1:8", ("_svc.w-1", 8)),
])
def test_addresses_that_work(text, parsed):
    assert parse_hostport(text) == parsed
    assert format_address(*parsed) == (text if "[" in text else text)


@pytest.mark.parametrize("text, says", [
    ("[a:1", r"is not '\[ipv6\]:port'"), ("[gw]:1", r"only IPv6 addresses go in brackets"),
    ("a b:1", r"the host 'a b' is not a host name"), ("ä:1", r"the host 'ä' is not a host name.*xn--"),
    ("a:1:2", r"write IPv6 addresses in brackets"), ("[::g]:1", r"is not an IPv6 address"),
    ("gw:0", r"port 0 is outside 1..65535"), ("gw:x", r"port 'x' is not an integer"), ("gw", r"is not 'host:port'"),
    ("-gw:1", r"not a host name"), ("a..b:1", r"not a host name"), ("x" * 64 + ".lan:1", r"not a host name"),
    (":1", r"is not 'host:port'"), ("gw:+1", r"port '\+1' is not an integer"),
    # any script's digits: '١٢٣٤' was port 1234, a full-width one too, and '²' (a digit to str.isdigit,
    # none to int()) was a ValueError traceback (found by a probe)
    ("gw:١٢٣٤", r"port '١٢٣٤' is not an integer \(write it in the ASCII digits 0-9\)$"),
    ("gw:５００５１", r"port '５００５１' is not an integer \(write it in the ASCII digits 0-9\)$"),
    ("gw:²", r"port '²' is not an integer \(write it in the ASCII digits 0-9\)$"),
    ("http://gw.lan:8080/", r"is a URL: give host:port, without a scheme \(e.g. 'gw.lan:8080'\)"),
])
def test_addresses_that_cannot_work_are_named(text, says):
    with pytest.raises(ConfigError, match=r"^endpoint: .*" + says):
        parse_hostport(text)


def test_an_address_to_listen_on_may_ask_for_any_port():
    assert parse_hostport("[::]:0", any_port=True) == ("::", 0)
    assert parse_hostport("0.0.0.0:50051", any_port=True) == ("0.0.0.0", 50051)
    with pytest.raises(ConfigError, match="outside 0..65535"):
        parse_hostport("gw:70000", any_port=True)


def test_host_problem_is_empty_for_hosts_and_names_the_rule_otherwise():
    assert host_problem("broker.plant.lan") == host_problem("192.168.1.2") == host_problem("fe80::1") == ""
    assert "is not a host name" in host_problem("broker plant")
    # the broker's host with its port, or as a URL: say so, not "not an IPv6 address"
    assert host_problem("127.0.0.1:18831") == "holds a port: give the host alone (the port has a setting of its own)"
    assert host_problem("mqtt://broker.lan") == "is a URL: give the host alone, without a scheme"
    assert host_problem("fe80::1:2:x") == "is not an IPv6 address"
    # a last newline (a YAML block scalar, a file read whole): '$' of re.match let it through
    assert "is not a host name" in host_problem("broker.plant.lan\n")


def test_an_id_ending_in_a_newline_is_refused():
    """``cam-1\n`` passed the id rule (``re.match`` with ``$``), so a tokens file could list it
    beside ``cam-1``, and it got a rate-limit bucket of its own (found by a probe)."""
    from edgewise.ids import id_problem

    assert id_problem("cam-1", "device_id") is None
    for bad in ("cam-1\n", "cam-1\n\n", "\ncam-1"):
        assert "has characters outside" in id_problem(bad, "device_id"), bad
