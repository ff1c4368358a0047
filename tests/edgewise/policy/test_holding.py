"""PolicyHolder: atomic reload, invalid files refused with the old policy kept."""

from __future__ import annotations

import logging

import numpy as np

from edgewise.detections import Detections
from edgewise.policy import Escalator, PolicyHolder, plan_reload

HEAD = "apiVersion: edgewise/v1\nkind: EscalationPolicy\nmetadata: {name: %s}\n"


def text(name: str, threshold: float) -> str:
    return HEAD % name + f"spec:\n  threshold: {threshold}\n  signals: {{weights: {{uncertain_count: 1}}}}\n"


def test_reload_valid_invalid_unchanged(tmp_path, caplog):
    path = tmp_path / "policy.yaml"
    path.write_text(text("v1", 0.9))
    holder = PolicyHolder.from_file(path)
    seen = []
    holder.subscribe(seen.append)
    assert holder.policy.metadata.name == "v1" and holder.version == 1

    # same bytes: a no-op (a touch or a duplicate inotify event)
    r = holder.reload(path)
    assert (r.ok, r.changed, r.version) == (True, False, 1) and seen == []

    path.write_text(text("v2", 0.4))
    r = holder.reload(path)
    assert (r.ok, r.error, r.changed, r.version) == (True, None, True, 2)
    assert holder.policy.metadata.name == "v2" and [p.metadata.name for p in seen] == ["v2"]

    path.write_text(text("v3", 0.4).replace("threshold: 0.4", "threshold: 4"))
    with caplog.at_level(logging.WARNING, logger="edgewise.policy.holding"):
        r = holder.reload(path)
    assert not r.ok and not r.changed
    assert r.error == f"{path}:5: spec.threshold: 4 is out of range; allowed: a number in [0, 1]"
    assert holder.policy.metadata.name == "v2" and r.policy is holder.policy and r.version == 2
    assert holder.reloads_failed == 1 and holder.last_error == r.error
    assert "policy reload refused, keeping 'v2'" in caplog.text
    assert len(seen) == 1

    path.unlink()
    r = holder.reload(path)
    assert not r.ok and "policy file not found" in (r.error or "")
    assert holder.policy.metadata.name == "v2"


def test_plan_reload_is_pure():
    ok = plan_reload("", text("a", 0.5), "x.yaml")
    assert ok.ok and ok.changed and ok.policy is not None and ok.policy.source == "x.yaml"
    same = plan_reload(ok.digest, text("a", 0.5), "x.yaml")
    assert same.ok and not same.changed and same.policy is None
    bad = plan_reload(ok.digest, "kind: nope", "x.yaml")
    assert not bad.ok and bad.error is not None and bad.error.startswith("x.yaml:1: kind:")


def test_holder_drives_escalator_swap_between_frames(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(text("strict", 0.9))
    holder = PolicyHolder.from_file(path)
    esc = Escalator(holder.policy)
    holder.subscribe(lambda p: esc.swap(p))
    empty = Detections(np.zeros((0, 4), np.float32), np.zeros(0, np.float32), np.zeros(0, np.int32))
    names = []
    for i in range(20):
        if i == 10:
            path.write_text(text("eager", 0.3))
            assert holder.reload(path).changed
        d = esc.decide("s", i, empty, {"uncertain_count": 0.5}, now=float(i))
        names.append((d.policy_name, d.escalate))
    assert names[:10] == [("strict", False)] * 10
    assert names[10] == ("eager", True)  # the new policy applies from the frame after the reload


def test_a_policy_this_deployment_cannot_run_is_refused_at_start_and_on_reload(tmp_path, caplog):
    """``fit`` (the edge: the policy's transport must be one the settings configure) is the
    same check at start and at every reload; a refused reload keeps the policy in force."""
    import pytest

    from edgewise.errors import ConfigError

    def fit(policy):
        return "" if policy.spec.transport in (None, "grpc") else f"spec.transport {policy.spec.transport!r} is not set up"

    path = tmp_path / "policy.yaml"
    path.write_text(text("v1", 0.5) + "  transport: mqtt\n")
    with pytest.raises(ConfigError, match=r"policy.yaml: spec.transport 'mqtt' is not set up"):
        PolicyHolder.from_file(path, fit)
    path.write_text(text("v1", 0.5))
    holder = PolicyHolder.from_file(path, fit)
    path.write_text(text("v2", 0.5) + "  transport: mqtt\n")
    with caplog.at_level(logging.WARNING, logger="edgewise.policy.holding"):
        r = holder.reload(path)
    assert not r.ok and "spec.transport 'mqtt' is not set up" in (r.error or "")
    assert holder.policy.metadata.name == "v1" and "keeping 'v1'" in caplog.text
