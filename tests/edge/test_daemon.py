"""The daemon's robustness at its edges: hot reload survives files that are not a
policy at all, and start-up problems (spool path, metrics port) end ``edgewise edge
run`` with one ``edgewise: error:`` line and exit 2, no traceback."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from edge.daemon import EdgeDaemon
from edge.settings import load_settings
from tests.conftest import free_port
from tests.edge.helpers import policy_yaml, read_jsonl, settings_yaml
from tests.processes import DEFAULT_HUP, EdgeProcess, stop_under_sighups
from tests.waiting import async_wait_until

ROOT = Path(__file__).resolve().parents[2]

HUGE_NUMBER = "apiVersion: edgewise/v1\nkind: EscalationPolicy\nmetadata: {name: x}\nspec:\n  threshold: " + "9" * 5000
DEEP = "apiVersion: edgewise/v1\nkind: EscalationPolicy\nmetadata: {name: x}\nspec: " + "[" * 20000 + "]" * 20000


def _daemon(tmp_path, tiny_model, streams, **tree) -> EdgeDaemon:
    """An in-process daemon of ``streams`` on the tiny model: device ``dev``, its spool in
    ``tmp_path``, metrics off; ``tree`` adds or overrides settings."""
    return EdgeDaemon(load_settings(str(settings_yaml(
        tmp_path / "edge.yaml", **{"device_id": "dev", "streams": streams, "model": {"path": str(tiny_model)},
                                   "spool": {"path": str(tmp_path / "spool.db")}, "metrics": {"port": -1},
                                   **tree})), env={}))


def test_reload_survives_a_5000_digit_number_and_deep_nesting_then_takes_a_valid_file(tmp_path, tiny_model, caplog):
    """Each refusal is logged once, and files are read and validated off the event loop (a
    hostile file took seconds to refuse, during which no frame was processed)."""
    import logging
    import threading

    caplog.set_level(logging.INFO)
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_yaml("first", {"s": "never"}))
    d = _daemon(tmp_path, tiny_model, [{"id": "s", "kind": "synthetic", "uri": "160x120", "fps": 50}],
                policy_file=str(policy), policy_poll_s=0.05, sinks={"jsonl": str(tmp_path / "out.jsonl")})
    reloads = d.metrics.reloads
    prepared_on = []

    async def run():
        task = asyncio.ensure_future(d.run())
        await async_wait_until(lambda: d.pipeline is not None and d.pipeline.frames_done > 2, 60, "frames")
        prepare = d.holder.prepare
        d.holder.prepare = lambda path: prepared_on.append(threading.current_thread()) or prepare(path)
        for n, bad in enumerate((HUGE_NUMBER, DEEP, b"\xff\xfe not text"), 1):
            policy.write_bytes(bad.encode() if isinstance(bad, str) else bad)
            await async_wait_until(lambda: reloads.labels("refused")._value.get() == n, 10, f"refusal {n}")
        policy.write_text(policy_yaml("second", {"s": "never"}))
        await async_wait_until(lambda: d.holder.policy.metadata.name == "second", 10, "the file change")
        done = d.pipeline.frames_done
        await async_wait_until(lambda: d.pipeline.frames_done > done + 2, 10, "frames under 'second'")
        policy.write_bytes(HUGE_NUMBER.encode())
        await async_wait_until(lambda: reloads.labels("refused")._value.get() == 4, 10, "refusal 4")
        d.settings.policy_poll_s = 3600  # from now on only SIGHUP reloads
        policy.write_text(policy_yaml("third", {"s": "never"}))
        os.kill(os.getpid(), signal.SIGHUP)
        await async_wait_until(lambda: d.holder.policy.metadata.name == "third", 10, "the SIGHUP reload")
        done = d.pipeline.frames_done
        await async_wait_until(lambda: d.pipeline.frames_done > done + 2, 10, "frames under the new policy")
        d.request_stop()
        assert await asyncio.wait_for(task, 30) == 0

    asyncio.run(run())
    assert reloads.labels("ok")._value.get() == 2 and reloads.labels("error")._value.get() == 0
    assert prepared_on and threading.main_thread() not in prepared_on
    refusals = [r for r in caplog.records if "reload refused" in r.getMessage()]
    assert len(refusals) == 4, [r.getMessage()[:80] for r in refusals]
    names = [r["policy"] for r in sorted(read_jsonl(tmp_path / "out.jsonl"), key=lambda r: r["frame_seq"])]
    assert names[0] == "first" and names[-1] == "third" and "second" in names


def test_a_policy_written_in_place_is_put_in_force_whole_not_half_written(tmp_path, tiny_model):
    """An editor saving in place, ``scp`` or ``cat >`` writes the policy file in pieces, and half a
    policy is often a valid, different one: cut after ``deadlineMs: 2`` of ``deadlineMs: 2000``,
    every escalation times out. A poll that landed between the pieces put that half in force. A
    file modified less than POLICY_SETTLE_S ago is read at a later poll now: only the whole file
    goes in force; a SIGHUP still reloads at once."""
    from edge.daemon import POLICY_SETTLE_S
    from edgewise.policy.loading import parse_policy

    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_yaml("first", {"s": "never"}))
    second = policy_yaml("second", {"s": "never"})
    cut = second.index("deadlineMs: 2000") + len("deadlineMs: 2")
    assert parse_policy(second[:cut].encode(), "half").spec != parse_policy(second.encode(), "whole").spec
    d = _daemon(tmp_path, tiny_model, [{"id": "s", "kind": "synthetic", "uri": "160x120", "fps": 20}],
                policy_file=str(policy), policy_poll_s=0.05)
    in_force = []

    async def run():
        task = asyncio.ensure_future(d.run())
        await async_wait_until(lambda: d.pipeline is not None and d.pipeline.frames_done > 0, 60, "frames")
        d.holder.subscribe(in_force.append)
        with open(policy, "w") as f:  # in place, in two pieces a few polls apart
            f.write(second[:cut])
            f.flush()
            await asyncio.sleep(0.3)
            f.write(second[cut:])
        await async_wait_until(lambda: in_force, 10, "the whole file in force")
        await asyncio.sleep(POLICY_SETTLE_S + 0.2)
        d.settings.policy_poll_s = 3600  # from now on only SIGHUP reloads
        policy.write_text(policy_yaml("third", {"s": "never"}))
        os.kill(os.getpid(), signal.SIGHUP)
        await async_wait_until(lambda: len(in_force) == 2, 10, "the SIGHUP reload, at once")
        d.request_stop()
        assert await asyncio.wait_for(task, 30) == 0

    asyncio.run(run())
    assert [p.spec for p in in_force] == [parse_policy(second.encode(), "whole").spec,
                                          parse_policy(policy_yaml("third", {"s": "never"}).encode(), "t").spec]
    assert d.metrics.reloads.labels("refused")._value.get() == 0


def edge_run(tmp_path, **tree):
    base = dict(device_id="dev", streams=[{"id": "s", "kind": "synthetic", "max_frames": 2}],
                model={"path": "unused.onnx"}, spool={"path": str(tmp_path / "spool.db")}, metrics={"port": -1})
    base.update(tree)
    config = settings_yaml(tmp_path / "edge.yaml", **base)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "edgewise.cli", "edge", "run", "--config", str(config)],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)


@pytest.mark.parametrize("case", ["spool_folder", "spool_corrupt", "metrics_port_in_use",
                                  "jsonl_folder", "no_source_opens", "policy_transport", "model_output",
                                  "model_run"])
def test_start_up_problems_are_one_error_line_and_exit_2(tmp_path, case, tiny_model):
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_yaml("p"))
    spool = tmp_path / "spool.db"
    tree = {"policy_file": str(policy)}
    holder = None
    if case == "spool_folder":
        spool.mkdir()
        expected = f"spool.path {spool} is a folder; set spool.path to a file in it, e.g. {spool}/spool.db"
    elif case == "jsonl_folder":
        (tmp_path / "out.jsonl").mkdir()
        tree["sinks"] = {"jsonl": str(tmp_path / "out.jsonl")}
        expected = f"sinks.jsonl {tmp_path}/out.jsonl is a folder"
    elif case == "no_source_opens":  # not restarted by the unit (exit 2) as it would be on exit 1
        tree["streams"] = [{"id": "s", "kind": "folder", "uri": str(tmp_path / "missing")}]
        tree["model"] = {"path": str(tiny_model), "backend": "onnxruntime"}
        expected = "every source ended and no frame was processed"
    elif case == "policy_transport":  # every escalation would be spooled as 'not configured', for good
        policy.write_text(policy_yaml("p", transport="mqtt"))
        tree["cloud"] = {"endpoints": ["127.0.0.1:9"]}
        expected = "spec.transport is 'mqtt', but this device's settings configure only grpc"
    elif case == "model_output":  # graph leaves its output width open: known wrong at the first frame
        from tests.edgewise.runtime.test_own_models import P5_ROWS, const_model, head

        bad = const_model(tmp_path / "dyncols.onnx", head(P5_ROWS, 8), out_shape=(1, "anchors", "cols"),
                          meta={"names": "{0: 'a', 1: 'b'}"})
        tree["model"] = {"path": str(bad)}
        expected = "dyncols.onnx: the model's output has 8 columns but there are 2 class names"
    elif case == "model_run":  # loads, then fails in ONNX Runtime at the first frame: was a traceback, exit 1
        from tests.edgewise.runtime.test_own_models import P5_ROWS, const_model, head

        bad = const_model(tmp_path / "s2d.onnx", head(P5_ROWS, 8), in_shape=(1, 3, "height", "width"),
                          space_to_depth=3, meta={"names": "{0: 'a', 1: 'b', 2: 'c'}", "imgsz": "[64, 64]"})
        tree["model"] = {"path": str(bad), "backend": "onnxruntime"}
        expected = "s2d.onnx: first inference (64x64) failed: "
    elif case == "spool_corrupt":
        spool.write_bytes(b"\x00garbage" * 1000)
        expected = f"spool {spool} is not a readable spool"
    else:
        holder = socket.socket()
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        tree["metrics"] = {"port": port, "host": "127.0.0.1"}
        expected = f"metrics.port {port} on 127.0.0.1 is already in use"
    try:
        r = edge_run(tmp_path, **tree)
    finally:
        if holder is not None:
            holder.close()
    assert r.returncode == 2, r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("edgewise: error:")]
    assert len(errors) == 1 and expected in errors[0], r.stderr
    assert "Traceback" not in r.stderr


def test_a_damaged_spool_is_salvaged_and_the_daemon_runs(tmp_path, tiny_model):
    """The chaos probe's damaged key index: the daemon crashed at every start, then (with
    quick_check) refused to start, exit 2, so systemd left the camera's detection down. Now
    it moves the file aside, salvages what it held into a new spool, says so once and runs."""
    from edge.spool import Spool
    from tests.edge.spooldamage import damage_index

    spool = tmp_path / "spool.db"
    with Spool(spool, max_bytes=1 << 24, max_age_s=3600) as sp:
        for i in range(50):
            sp.put(f"dev/s/{i}", b"x" * 3000, {"i": i})
    damage_index(spool)
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_yaml("p"))
    r = edge_run(tmp_path, policy_file=str(policy), model={"path": str(tiny_model)},
                 sinks={"jsonl": str(tmp_path / "out.jsonl")})
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    said = [line for line in r.stderr.splitlines() if "started a new spool" in line]
    assert len(said) == 1 and said[0].endswith(": 50 escalation(s) salvaged"), r.stderr
    assert len(read_jsonl(tmp_path / "out.jsonl")) == 2  # both frames processed and recorded
    with Spool(spool, max_bytes=1 << 24, max_age_s=3600) as sp:  # a sound file with the backlog
        assert [it.meta["i"] for it in sp.peek(100)] == list(range(50))
    assert len(list(tmp_path.glob("spool.db.damaged-*Z"))) == 1


def test_a_lost_start_count_does_not_reuse_the_keys_the_sinks_and_spool_remember(tmp_path, tiny_model):
    """Runs 0 and 1 write their records; then the spool folder goes (its start count with it)
    and the sink file stays: run 2 must count above the runs the sink remembers, or the
    sink would drop its late answers as repeats of run 0's. The same from a spool that
    kept an older run's escalation while the count file was lost."""
    import shutil

    from edge.daemon import boot_epoch
    from edge.spool import Spool

    state = tmp_path / "state"
    tree = dict(streams=[{"id": "s", "kind": "synthetic", "max_frames": 2}],
                model={"path": str(tiny_model), "backend": "onnxruntime"},
                spool={"path": str(state / "spool.db")}, sinks={"jsonl": str(tmp_path / "out.jsonl")})
    for _ in range(2):
        r = edge_run(tmp_path, **tree)
        assert r.returncode == 0, r.stderr
    shutil.rmtree(state)
    r = edge_run(tmp_path, **tree)
    assert r.returncode == 0, r.stderr
    assert "behind the runs the spool and sinks remember" in r.stderr
    epochs = [rec["frame_seq"] >> 32 for rec in read_jsonl(tmp_path / "out.jsonl")]
    assert epochs == [0, 0, 1, 1, 2, 2], epochs

    spool = Spool(tmp_path / "other.db", max_bytes=1 << 20, max_age_s=3600)
    spool.put(f"dev/s/{(7 << 32) | 3}", b"x", {})
    assert spool.last_epoch() == 7
    spool.close()
    assert boot_epoch(str(tmp_path / "other.db"), floor=8) == 8  # no count file: the floor
    assert boot_epoch(str(tmp_path / "other.db"), floor=0) == 9  # the count goes on from there


def test_the_start_count_is_renamed_into_place_durably(tmp_path, monkeypatch):
    """The count file's rename was not synced: a power cut within ext4's journal commit (5 s)
    of a start undid it, and the next start took the cut run's count again, its frames' keys
    those the MQTT consumers had already taken from the cut run. At the os-call boundary: the
    bytes synced, the rename, then the folder synced, before the count is used."""
    import stat

    from edge.daemon import boot_epoch

    done = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        done.append("fsync folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync file")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", lambda a, b: (done.append("replace"), real_replace(a, b)))
    spool = str(tmp_path / "spool.db")
    assert [boot_epoch(spool), boot_epoch(spool)] == [0, 1]
    assert done == ["fsync file", "replace", "fsync folder"] * 2


def test_a_start_count_no_frame_seq_can_carry_is_damage_not_a_count(tmp_path, caplog):
    """4294967296 in the count file, or a record's frame_seq of 2**64 or more, made every later
    frame_seq overflow its uint64: every escalation failed, for good, since the records kept
    raising the floor again (found by a probe). Such values are ignored, with a WARNING."""
    from edge.daemon import MAX_EPOCH, boot_epoch
    from edge.sinks import JsonlSink

    caplog.set_level("WARNING", logger="edge.daemon")
    spool = str(tmp_path / "spool.db")
    (tmp_path / "spool.db.epoch").write_text(str(1 << 32))
    assert boot_epoch(spool) == 0 and "not a count; counting anew" in caplog.text
    assert boot_epoch(spool, floor=MAX_EPOCH + 2) == 1 and "that value is ignored" in caplog.text
    assert boot_epoch(spool, floor=MAX_EPOCH) == MAX_EPOCH  # the largest one a frame_seq carries
    records = tmp_path / "out.jsonl"
    records.write_text("".join(json.dumps({"device": "d", "stream": "s", "frame_seq": seq}) + "\n"
                               for seq in (1 << 64, (5 << 32) | 1)))
    sink = JsonlSink(str(records))
    try:
        assert sink.last_epoch == 5
    finally:
        sink.close()


def test_policy_classes_the_model_does_not_have_are_warned_at_start_and_on_reload(tmp_path, tiny_model, caplog):
    """examples/policy.yaml lowers the threshold for `person`; on a model without that class
    the override never applies, silently: the daemon says so, naming the model's classes."""
    import logging

    import yaml

    caplog.set_level(logging.WARNING)
    policy = tmp_path / "policy.yaml"

    def write(classes):
        doc = yaml.safe_load(policy_yaml("p", {"s": "never"}))
        doc["spec"]["classes"] = {c: {"threshold": 0.3} for c in classes}
        policy.write_text(yaml.safe_dump(doc))

    write(["person", "0"])
    d = _daemon(tmp_path, tiny_model, [{"id": "s", "kind": "synthetic", "uri": "160x120"}],
                policy_file=str(policy), policy_poll_s=0.05)

    def warned():
        return [r.getMessage() for r in caplog.records if "are not classes of" in r.getMessage()]

    async def run():
        task = asyncio.ensure_future(d.run())
        await async_wait_until(lambda: d.pipeline is not None and d.pipeline.frames_done > 0, 60, "frames")
        assert len(warned()) == 1 and "spec.classes person are not" in warned()[0]
        assert str(tiny_model) in warned()[0]
        write(["car", "1"])
        await async_wait_until(lambda: len(warned()) == 2, 10, "the reload's warning")
        assert "spec.classes car are not" in warned()[1]
        d.request_stop()
        assert await asyncio.wait_for(task, 30) == 0

    asyncio.run(run())


def test_reload_sees_a_same_size_rewrite_with_its_old_mtime_and_refuses_a_fifo_without_blocking(tmp_path, tiny_model):
    """The watcher compared mtime / inode / size only: a same-size policy copied over the old
    one with its times kept (``cp -p``, or a refused unreadable file made readable by
    ``chmod``/``chown``, which changes only the change time) was never reloaded. A named
    pipe put where the policy was blocked the reading thread for ever: no later reload,
    no SIGHUP, and SIGTERM never ended the process."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_yaml("first", {"s": "never"}))
    d = _daemon(tmp_path, tiny_model, [{"id": "s", "kind": "synthetic", "uri": "160x120", "fps": 20}],
                policy_file=str(policy), policy_poll_s=0.05)
    reloads = d.metrics.reloads

    async def run():
        task = asyncio.ensure_future(d.run())
        await async_wait_until(lambda: d.pipeline is not None and d.pipeline.frames_done > 0, 60, "frames")
        before = os.stat(policy)
        with open(policy, "r+") as f:  # in place: same inode, same size, old mtime put back
            f.write(policy_yaml("other", {"s": "never"}))
        assert os.stat(policy).st_size == before.st_size
        os.utime(policy, ns=(before.st_atime_ns, before.st_mtime_ns))
        await async_wait_until(lambda: d.holder.policy.metadata.name == "other", 10, "the same-size rewrite")
        policy.unlink()
        os.mkfifo(policy)
        await async_wait_until(lambda: reloads.labels("refused")._value.get() == 1, 10, "the FIFO refused")
        assert "named pipe" in (d.holder.last_error or "")
        policy.unlink()
        policy.write_text(policy_yaml("third", {"s": "never"}))
        await async_wait_until(lambda: d.holder.policy.metadata.name == "third", 10, "the file after the FIFO")
        policy.unlink()
        os.mkfifo(policy)
        await async_wait_until(lambda: reloads.labels("refused")._value.get() == 2, 10, "the FIFO refused again")
        d.request_stop()
        assert await asyncio.wait_for(task, 30) == 0

    asyncio.run(run())
    assert reloads.labels("ok")._value.get() == 2 and reloads.labels("error")._value.get() == 0


def test_healthz_is_degraded_while_a_stream_is_down(tmp_path, tiny_model):
    """A dead camera (nothing listens at its address) next to a working stream: the daemon
    serves (200) but says degraded and names the stream, as a probe on status alone must see."""
    d = _daemon(tmp_path, tiny_model, [{"id": "ok", "kind": "synthetic", "uri": "160x120", "fps": 10},
                                       {"id": "dead", "kind": "rtsp", "uri": "rtsp://127.0.0.1:9/cam",
                                        "reconnect_min_s": 0.05, "reconnect_max_s": 0.2}])

    async def run():
        task = asyncio.ensure_future(d.run())
        # the dead stream down, and the working one streaming (its open, in a thread too, may come after)
        await async_wait_until(lambda: d.started and d.health()[1]["streams_down"] == ["dead"]
                               and d.health()[1]["streams"]["ok"] == "streaming", 60, "dead stream")
        ok, doc = d.health()
        assert ok and doc["status"] == "degraded" and doc["streams"]["ok"] == "streaming"
        d.request_stop()
        await asyncio.wait_for(task, 30)

    asyncio.run(run())


def test_healthz_names_a_stream_backing_off_for_corrupt_frames(tmp_path, tiny_model):
    """A looping folder whose files are all bad sits in backoff delivering nothing: /healthz said
    "ok" with streams_down [] (only open/read/stall failures counted); it is down like them."""
    bad = tmp_path / "bad"
    bad.mkdir()
    for i in range(3):
        (bad / f"{i}.jpg").write_bytes(b"")
    d = _daemon(tmp_path, tiny_model, [{"id": "ok", "kind": "synthetic", "uri": "160x120", "fps": 10},
                                       {"id": "bad", "kind": "folder", "uri": str(bad), "loop": True,
                                        "reconnect_min_s": 0.05, "reconnect_max_s": 0.2}])

    async def run():
        task = asyncio.ensure_future(d.run())
        await async_wait_until(lambda: d.started and d.health()[1]["streams_down"] == ["bad"]
                               and d.health()[1]["streams"]["ok"] == "streaming", 60, "bad stream")
        ok, doc = d.health()
        assert ok and doc["status"] == "degraded" and doc["streams"]["ok"] == "streaming"
        d.request_stop()
        await asyncio.wait_for(task, 30)

    asyncio.run(run())


def test_healthz_names_a_file_stream_that_could_not_be_opened(tmp_path, tiny_model):
    """A looping video whose path is wrong, and one that is not a video, next to a working
    stream: both ended at once with an error, and /healthz said "ok" with streams_down []
    while two of the three streams never delivered a frame (found by a probe). They failed to
    open and deliver nothing since: down, like a dead camera."""
    notvideo = tmp_path / "notvideo.avi"
    notvideo.write_text("not a video")
    d = _daemon(tmp_path, tiny_model, [{"id": "ok", "kind": "synthetic", "uri": "160x120", "fps": 10},
                                       {"id": "gone", "kind": "file", "uri": str(tmp_path / "gone.avi"),
                                        "loop": True},
                                       {"id": "bad", "kind": "file", "uri": str(notvideo)}])

    async def run():
        task = asyncio.ensure_future(d.run())
        await async_wait_until(lambda: d.started and d.health()[1]["streams"].get("bad") == "ended"
                               and d.health()[1]["streams"].get("gone") == "ended"
                               and d.health()[1]["streams"]["ok"] == "streaming", 60, "the bad streams ended")
        ok, doc = d.health()
        assert ok and doc["status"] == "degraded" and doc["streams_down"] == ["bad", "gone"], doc
        d.request_stop()
        await asyncio.wait_for(task, 30)

    asyncio.run(run())


def _start_daemon(tmp_path, tiny_model, **identity: str) -> tuple[subprocess.Popen[bytes], Path]:
    """A real `edgewise edge run` started as systemd starts it (SIGHUP at its default), its
    policy reloaded only on SIGHUP; ``identity``: ``device_id="dev"`` unless given (``{}``: unset,
    the shipped default)."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_yaml("first", {"s": "never"}))
    config = settings_yaml(tmp_path / "edge.yaml", **({"device_id": "dev"} if identity.get("device_id", "dev") else {}),
                           streams=[{"id": "s", "kind": "synthetic", "uri": "160x120", "fps": 5}],
                           model={"path": str(tiny_model)}, spool={"path": str(tmp_path / "spool.db")},
                           metrics={"port": -1}, policy_file=str(policy), policy_poll_s=3600)
    log = tmp_path / "edge.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen([*DEFAULT_HUP, sys.executable, "-m", "edgewise.cli", "edge", "run", "--config",
                                 str(config)], stdout=subprocess.DEVNULL, stderr=err, cwd=ROOT,
                                env=dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1"))
    deadline = time.monotonic() + 60
    while not _catches_sighup(proc.pid):  # edgewise/hangup.py holds it, first thing
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.002)
    return proc, log


def _wait_for(proc: subprocess.Popen[bytes], log: Path, text: str) -> None:
    deadline = time.monotonic() + 60
    while text not in log.read_text():
        assert proc.poll() is None, f"the daemon ended ({proc.returncode}): {log.read_text()}"
        assert time.monotonic() < deadline, f"no {text!r} in: {log.read_text()}"
        time.sleep(0.02)


def test_sighups_from_the_first_moment_python_holds_them_never_end_the_start(tmp_path, tiny_model):
    """One SIGHUP every 20 ms from the moment the process catches SIGHUP until the daemon says
    it runs: none ends the start (the default action would have)."""
    proc, log = _start_daemon(tmp_path, tiny_model)
    try:
        sent = 0
        while " running: " not in log.read_text():
            assert proc.poll() is None, f"ended by SIGHUP number {sent} ({proc.returncode}): {log.read_text()}"
            proc.send_signal(signal.SIGHUP)
            sent += 1
            time.sleep(0.02)
        assert sent >= 3
        _reloaded_then_stopped(proc, log)
    finally:
        proc.kill()
        proc.wait(10)


def test_a_sighup_while_the_daemon_starts_is_a_reload_once_it_runs(tmp_path, tiny_model):
    """One SIGHUP, as early as the process catches it (long before the daemon's own handler):
    noted, and the policy is reloaded once the daemon runs."""
    proc, log = _start_daemon(tmp_path, tiny_model)
    try:
        proc.send_signal(signal.SIGHUP)
        _wait_for(proc, log, " running: ")
        _reloaded_then_stopped(proc, log)
    finally:
        proc.kill()
        proc.wait(10)


def test_a_sighup_names_the_settings_it_does_not_apply_and_settings_that_no_longer_load(tmp_path, tiny_model):
    """A SIGHUP reloads the policy only; an operator who changed a stream in edge.yaml and sent
    SIGHUP read "reloading policy" and waited for a change that needs a restart (the gateway
    names such keys; found by a probe). The real daemon reads its settings again and names what
    changed (names only), says settings that no longer load (a restart would fail), and says
    nothing when they are as they were."""
    proc, log = _start_daemon(tmp_path, tiny_model)
    config = tmp_path / "edge.yaml"
    started = config.read_text()
    try:
        _wait_for(proc, log, " running: ")
        config.write_text(started.replace("fps: 5", "fps: 7"))
        proc.send_signal(signal.SIGHUP)
        _wait_for(proc, log, "SIGHUP: streams changed in the settings (edge.yaml, the environment, the command "
                             "line), which a reload does not apply (it reloads the policy file only): restart the "
                             "daemon to apply it")
        config.write_text(started + "no_such_key: 1\n")
        proc.send_signal(signal.SIGHUP)
        _wait_for(proc, log, "SIGHUP: the daemon's settings no longer load: ")
        assert "no_such_key" in log.read_text().rsplit("no longer load: ", 1)[1].splitlines()[0]
        config.write_text(started)
        proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 60
        while log.read_text().count("SIGHUP: reloading policy") < 3:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.02)
        time.sleep(1.0)  # (the settings are read in a thread: time to say what it would)
        text = log.read_text()
        assert text.count("changed in the settings") == 1 and text.count("no longer load") == 1, text
        _stopped(proc, log)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_a_sighup_names_no_change_of_a_device_id_resolved_at_start(tmp_path, tiny_model):
    """The shipped edge.yaml sets no device_id: the daemon resolves it at start (serial number,
    else host name). A SIGHUP with the settings untouched said "device_id changed in the
    settings ... restart the daemon to apply it" on every device so set up (found by review R):
    the settings read again were compared with those the start had resolved."""
    proc, log = _start_daemon(tmp_path, tiny_model, device_id="")
    try:
        _wait_for(proc, log, " running: ")
        assert "(default: serial number, else host name)" in log.read_text()
        proc.send_signal(signal.SIGHUP)
        _wait_for(proc, log, "SIGHUP: reloading policy")
        (tmp_path / "edge.yaml").write_text((tmp_path / "edge.yaml").read_text().replace("fps: 5", "fps: 7"))
        proc.send_signal(signal.SIGHUP)  # a real change is still named, alone
        _wait_for(proc, log, "SIGHUP: streams changed in the settings")
        text = log.read_text()
        assert "changed in the settings" not in text.split("SIGHUP: streams changed", 1)[0], text
        assert "device_id" not in text.split("SIGHUP: streams changed", 1)[1].splitlines()[0], text
        _stopped(proc, log)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def _reloaded_then_stopped(proc: subprocess.Popen[bytes], log: Path) -> None:
    """The daemon reloads its policy (a SIGHUP came), then ends with 0 on SIGTERM."""
    _wait_for(proc, log, "SIGHUP: reloading policy")
    _stopped(proc, log)


def _stopped(proc: subprocess.Popen[bytes], log: Path) -> None:
    """SIGTERM: the daemon ends with 0."""
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0, log.read_text()


def _catches_sighup(pid: int) -> bool:
    """Whether the process has a handler for SIGHUP (its SigCgt mask in Linux /proc)."""
    with open(f"/proc/{pid}/status") as f:
        caught = next(line.split()[1] for line in f if line.startswith("SigCgt:"))
    return bool(int(caught, 16) & (1 << (signal.SIGHUP - 1)))


def test_a_policy_replaced_by_a_dangling_or_looping_link_is_named_as_such(tmp_path, tiny_model, caplog):
    """The watcher said "is gone" for a policy that became a symbolic link to itself (found by
    a probe); the policy in force stays either way, and a real file is taken again."""
    import logging

    caplog.set_level(logging.WARNING, logger="edge.daemon")
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_yaml("first", {"s": "never"}))
    d = _daemon(tmp_path, tiny_model, [{"id": "s", "kind": "synthetic", "uri": "160x120", "fps": 20}],
                policy_file=str(policy), policy_poll_s=0.05)

    def said(text):
        return [r.getMessage() for r in caplog.records if text in r.getMessage()]

    async def run():
        task = asyncio.ensure_future(d.run())
        await async_wait_until(lambda: d.pipeline is not None and d.pipeline.frames_done > 0, 60, "frames")
        policy.unlink()
        policy.symlink_to(policy)
        await async_wait_until(lambda: said("cannot be read (a symbolic link to nothing, or to itself)"), 10,
                               "the loop named")
        assert not said("is gone") and d.holder.policy.metadata.name == "first"
        policy.unlink()
        policy.write_text(policy_yaml("second", {"s": "never"}))
        await async_wait_until(lambda: d.holder.policy.metadata.name == "second", 10, "the file back")
        d.request_stop()
        assert await asyncio.wait_for(task, 30) == 0

    asyncio.run(run())


def test_state_files_are_not_for_other_users_whatever_the_umask(tmp_path, tiny_model):
    """The daemon set no umask and no modes: under a umask of 000 (a container's, a shell's) the
    state folder was 0777 and the records 0666, the spool (camera frames) 0644 (found by a
    probe). ``edge run`` takes 027 away from whatever umask it is given."""
    import stat

    state = tmp_path / "state"
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_yaml("p"))
    config = settings_yaml(tmp_path / "edge.yaml", device_id="dev", policy_file=str(policy),
                           streams=[{"id": "s", "kind": "synthetic", "uri": "160x120", "fps": 20, "max_frames": 4}],
                           model={"path": str(tiny_model), "backend": "onnxruntime"},
                           cloud={"endpoints": ["127.0.0.1:9"]},
                           spool={"path": str(state / "spool.db")},
                           sinks={"jsonl": str(state / "out.jsonl")}, metrics={"port": -1})
    # umask 0 set in the new program, not in a preexec_fn (tests.processes.DEFAULT_HUP says why)
    out = subprocess.run([sys.executable, "-c", "import os, sys; os.umask(0); os.execvp(sys.argv[1], sys.argv[1:])",
                          sys.executable, "-m", "edgewise.cli", "edge", "run", "--config", str(config)],
                         capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    made = [state, *state.iterdir()]
    assert (state / "spool.db").exists() and (state / "out.jsonl").exists()
    loose = {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in made if p.stat().st_mode & 0o007}
    assert not loose, loose


def test_healthz_says_a_cloud_that_fails_every_escalation_and_its_return(tmp_path, tiny_model, real_cloud):
    """A cloud outage left /healthz "ok" (escalations spooled, as designed): `edge health` and a
    fleet's dashboards saw nothing. Now, once the calls to the cloud fail in a row, it is degraded
    (200: a restart would not bring the cloud back) with the cloud's state, how long, and the last
    failure's words; the cloud's first answer ends it."""
    from edge.cloudreach import FAILING_AFTER

    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_yaml("all", {"s": "always"}, deadline_ms=2000))
    real_cloud.stop_worker(0)  # the real gateway, no worker up: UNAVAILABLE
    d = _daemon(tmp_path, tiny_model, [{"id": "s", "kind": "synthetic", "uri": "160x120", "fps": 5}],
                policy_file=str(policy), cloud={"endpoints": [real_cloud.address]},
                sinks={"jsonl": str(tmp_path / "out.jsonl")})

    async def run():
        task = asyncio.ensure_future(d.run())
        await async_wait_until(lambda: d.started and d.health()[1]["cloud"]["state"] == "failing", 60,
                               "the cloud failing")
        ok, doc = d.health()
        assert ok and doc["status"] == "degraded", doc
        assert doc["cloud"]["failed_in_a_row"] >= FAILING_AFTER and doc["cloud"]["last_answer_s_ago"] is None
        assert doc["cloud"]["last_error"].startswith("UNAVAILABLE: "), doc
        real_cloud.start_worker(0)
        await async_wait_until(lambda: d.health()[1]["cloud"]["state"] == "answering", 60, "the cloud answering")
        assert d.health()[1]["status"] == "ok", d.health()
        d.request_stop()
        await asyncio.wait_for(task, 30)

    asyncio.run(run())


def test_healthz_is_degraded_while_a_sink_cannot_take_records(tmp_path, tiny_model, small_fs):
    """A durable sink that fails (its disk full: the records wait in memory, and are lost beyond
    16 MiB or at exit) left /healthz "ok". Now it is degraded and names the sink until the sink
    takes records again."""
    fs = small_fs(1024 * 1024)
    d = _daemon(tmp_path, tiny_model, [{"id": "s", "kind": "synthetic", "uri": "160x120", "fps": 20}],
                sinks={"jsonl": str(fs.path / "records.jsonl")})
    filler = fs.path / "filler"

    async def run():
        task = asyncio.ensure_future(d.run())
        await async_wait_until(lambda: d.started and d.pipeline is not None and d.pipeline.frames_done > 3, 60,
                               "frames")
        assert d.health()[1]["status"] == "ok" and d.health()[1]["sinks_failing"] == []
        st = os.statvfs(fs.path)
        filler.write_bytes(b"\0" * (st.f_bavail * st.f_frsize))  # the disk is full
        await async_wait_until(lambda: d.health()[1]["sinks_failing"] == ["jsonl"], 30, "the sink failing")
        ok, doc = d.health()
        assert ok and doc["status"] == "degraded"
        filler.unlink()
        await async_wait_until(lambda: d.health()[1]["sinks_failing"] == [], 30, "the sink taking records again")
        assert d.health()[1]["status"] == "ok"
        d.request_stop()
        await asyncio.wait_for(task, 30)

    asyncio.run(run())


def test_a_policy_changed_while_the_daemon_starts_is_put_in_force(tmp_path, tiny_model, monkeypatch):
    """The watcher took its first look after the model loaded (minutes with a TensorRT build): a
    policy edited in between was its starting point, never reloaded, and every record said the
    old policy until the next edit (found by a probe). It now starts from the file as the start
    read it."""
    from edgewise.runtime.detector import Detector

    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_yaml("first", {"s": "never"}))
    load = Detector.from_file.__func__

    def slow_load(cls, *args, **kwargs):
        policy.write_text(policy_yaml("second", {"s": "never"}))  # the operator's edit during the load
        return load(cls, *args, **kwargs)

    monkeypatch.setattr(Detector, "from_file", classmethod(slow_load))
    d = _daemon(tmp_path, tiny_model, [{"id": "s", "kind": "synthetic", "uri": "160x120", "fps": 20}],
                policy_file=str(policy), policy_poll_s=0.05)

    async def run():
        task = asyncio.ensure_future(d.run())
        await async_wait_until(lambda: d.pipeline is not None and d.pipeline.frames_done > 0, 60, "frames")
        await async_wait_until(lambda: d.holder.policy.metadata.name == "second", 10, "the edit made during the start")
        d.request_stop()
        assert await asyncio.wait_for(task, 30) == 0

    asyncio.run(run())
    assert d.metrics.reloads.labels("ok")._value.get() == 1


def test_a_device_configuring_only_mqtt_escalates_and_replays_over_mqtt(tmp_path, tiny_model):
    """The daemon hands its escalations the transport its settings configure (default_transport):
    with `cloud.transport` unset and only a broker set, MQTT, where the replay's fallback was
    `grpc`, not configured (found by a probe)."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_yaml("p", {"s": "never"}, transport=None))
    d = _daemon(tmp_path, tiny_model, [{"id": "s", "kind": "synthetic", "uri": "160x120", "fps": 20}],
                policy_file=str(policy), cloud={"mqtt": {"host": "127.0.0.1", "port": 1}})

    async def run():
        task = asyncio.ensure_future(d.run())
        await async_wait_until(lambda: d.escalating is not None, 60, "the daemon running")
        assert list(d.escalating.transports) == ["mqtt"] and d.escalating.default_transport == "mqtt"
        d.request_stop()
        assert await asyncio.wait_for(task, 30) == 0

    asyncio.run(run())


def test_the_sinks_beside_the_spool_keep_its_reserve_and_those_elsewhere_do_not(tmp_path, tiny_model, small_fs,
                                                                                mosquitto):
    """The JSON Lines file and the MQTT outbox on the spool's filesystem (the default) leave its
    reserve free; the outbox did not (found by a review). On another filesystem they may fill it."""
    from edge.spool import RESERVE_BYTES

    elsewhere = small_fs(256 * 1024).path
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_yaml("p", {"s": "never"}, transport=None))
    for where, reserve in ((tmp_path, RESERVE_BYTES), (elsewhere, 0)):
        d = _daemon(tmp_path, tiny_model, [{"id": "s", "kind": "synthetic", "uri": "160x120", "fps": 20}],
                    policy_file=str(policy), cloud={"mqtt": {"host": mosquitto.host, "port": mosquitto.port}},
                    sinks={"jsonl": str(where / "out.jsonl"), "mqtt": True,
                           "mqtt_outbox": str(where / "outbox.db")})

        async def run():
            task = asyncio.ensure_future(d.run())
            await async_wait_until(lambda: d.sinks is not None, 60, "the sinks")
            assert {s.name: s.reserve_bytes for s in d.sinks.sinks} == {"jsonl": reserve, "mqtt": reserve}
            d.request_stop()
            assert await asyncio.wait_for(task, 30) == 0

        asyncio.run(run())


def _mqtt_sink_config(tmp_path: Path, tiny_model: Path, mosquitto, out: Path) -> Path:
    """edge.yaml of a real daemon at 10 fps writing its records to ``out`` and, through the MQTT
    sink (its outbox in ``tmp_path/state``), to ``mosquitto``."""
    return settings_yaml(tmp_path / "edge.yaml", device_id="jet",
                         streams=[{"id": "cam", "kind": "synthetic", "uri": "160x120", "fps": 10}],
                         model={"path": str(tiny_model), "max_batch": 1},
                         cloud={"mqtt": {"host": mosquitto.host, "port": mosquitto.port}},
                         spool={"path": str(tmp_path / "state" / "spool.db")},
                         sinks={"jsonl": str(out), "mqtt": True}, metrics={"port": -1}, shutdown_grace_s=1.0)


def _all_published_in_order(daemon: EdgeProcess, log: Path, out: Path, topic, timeout_s: float) -> None:
    """Every record the JSON Lines file has so far reaches the broker's ``topic``, in order."""
    written = [r["frame_seq"] for r in read_jsonl(out)]
    deadline = time.monotonic() + timeout_s
    while not set(written) <= {r["frame_seq"] for r in topic.json()}:
        assert daemon.check() and time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)
    assert [r["frame_seq"] for r in topic.json()][:len(written)] == written  # in order, none lost


def test_a_lock_another_process_holds_on_the_mqtt_outbox_freezes_neither_frames_nor_the_stop(tmp_path, tiny_model,
                                                                                              mosquitto):
    """A real daemon at 10 fps with the MQTT sink; another process holds the outbox's write lock
    (an operator's sqlite3 shell left in a transaction). Frames go on at their rate, the
    records wait in memory and reach the broker, in order, once the lock is let go. Held again,
    a SIGTERM exits within the grace and the sink's close_timeout_s, and the records that never
    got into the outbox are counted in an ERROR (the JSON Lines file has them). Each outbox
    write used to wait for the lock on the event loop for SQLite's 30 s busy timeout: one frame
    per 30 s (0.2 fps measured), and 114 s to exit after SIGTERM, past TimeoutStopSec=30."""
    import re
    import sqlite3

    from tests.conftest import TopicRecorder
    from tests.edge.helpers import hold_write_lock, let_go

    topic = TopicRecorder(mosquitto, "edgewise/jet/detections")
    out, log = tmp_path / "out.jsonl", tmp_path / "edge.log"
    outbox = tmp_path / "state" / "mqtt-outbox.db"
    config = _mqtt_sink_config(tmp_path, tiny_model, mosquitto, out)
    daemon = EdgeProcess(config, log)
    holder = None
    try:
        deadline = time.monotonic() + 60
        while len(topic.messages) < 5:
            assert daemon.check() and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        holder = hold_write_lock(outbox)
        before, t0 = len(read_jsonl(out)), time.monotonic()
        time.sleep(3.0)
        during = (len(read_jsonl(out)) - before) / (time.monotonic() - t0)
        let_go(holder)
        assert during > 6, during  # 10 fps; it was 0.2
        _all_published_in_order(daemon, log, out, topic, 20)
        holder = hold_write_lock(outbox)
        time.sleep(1.0)
        t0 = time.monotonic()
        rc = daemon.stop(60)
        took = time.monotonic() - t0
    finally:
        if holder is not None:
            let_go(holder)
        daemon.close()
        topic.stop()
    text = log.read_text()
    assert rc == 0 and took < 1.0 + 3.0 + 3.0, (rc, took, text)
    lost = re.search(r"ERROR edge.sinks: the MQTT sink's outbox: (\d+) live records held in memory are lost at exit: "
                     r"MQTT sink outbox \S+ is locked by another process", text)
    assert lost is not None, text
    db = sqlite3.connect(str(outbox))
    kept = [json.loads(d)["frame_seq"] for (d,) in db.execute("SELECT data FROM records ORDER BY id")]
    db.close()
    records = [r["frame_seq"] for r in read_jsonl(out)]
    published = {r["frame_seq"] for r in topic.json()}
    assert len(records) == int(text.rsplit("edge daemon stopped after ", 1)[1].split()[0])
    assert len(set(records) - published - set(kept)) == int(lost.group(1)) > 0


@pytest.mark.parametrize("then", ["let go", "SIGTERM"])
def test_a_lock_held_on_the_outbox_when_it_is_to_keep_a_new_client_id_holds_up_neither_frames_nor_signals(
        tmp_path, tiny_model, mosquitto, then):
    """The MQTT outbox has no client id yet (a new one is to be kept before the connection
    starts) and another process holds its write lock when the real daemon starts. Frames go on
    at 10 fps, their records held in memory; once the lock is let go the outbox keeps the new id,
    the connection starts under it and every record reaches the broker, in order; or a SIGTERM
    while it is still held ends the daemon with 0 within its grace and the sink's
    close_timeout_s. Before, the start waited for the lock on the event loop for SQLite's 30 s
    (no frame, SIGTERM unanswered), then ended with OutboxBusy (exit 2)."""
    import re
    import sqlite3

    from edge.outbox import Outbox
    from tests.conftest import TopicRecorder
    from tests.edge.helpers import hold_write_lock, let_go

    topic = TopicRecorder(mosquitto, "edgewise/jet/detections")
    out, log = tmp_path / "out.jsonl", tmp_path / "edge.log"
    outbox = tmp_path / "state" / "mqtt-outbox.db"
    Outbox(outbox, 100).close()  # an outbox without a client id
    config = _mqtt_sink_config(tmp_path, tiny_model, mosquitto, out)
    holder = hold_write_lock(outbox)
    daemon = EdgeProcess(config, log)
    try:
        deadline = time.monotonic() + 60
        while not (out.exists() and len(read_jsonl(out)) >= 5):
            assert daemon.check() and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        before, t0 = len(read_jsonl(out)), time.monotonic()
        time.sleep(2.0)  # the rate measured while the lock is held
        during = (len(read_jsonl(out)) - before) / (time.monotonic() - t0)
        assert during > 6, during  # 10 fps; none before
        assert not topic.messages  # not connected yet: the client id is not kept
        if then == "SIGTERM":
            t0 = time.monotonic()
            rc = daemon.stop(60)
            took = time.monotonic() - t0
            assert rc == 0 and took < 1.0 + 3.0 + 3.0, (rc, took, log.read_text())
            return
        let_go(holder)
        holder = None
        _all_published_in_order(daemon, log, out, topic, 30)
        assert daemon.stop(60) == 0
    finally:
        if holder is not None:
            let_go(holder)
        daemon.close()
        topic.stop()
    connected_as = re.search(r"MQTT connected to \S+ as (\S+)", log.read_text())
    assert connected_as is not None, log.read_text()
    db = sqlite3.connect(str(outbox))
    kept = dict(db.execute("SELECT key, value FROM meta"))
    db.close()
    assert kept["client_id"] == connected_as.group(1).rstrip(",;") and kept["client_id"].startswith("jet-")


def test_an_outbox_that_cannot_keep_the_client_id_ends_the_real_daemon_with_exit_2_and_what_to_do(
        tmp_path, tiny_model, mosquitto):
    """The MQTT outbox refuses to keep the new client id for a reason other than a lock another
    process holds (here SQLite refuses the write: a trigger planted in the file, as a read-only
    or damaged store would): the real daemon stops, closing what it started, and exits 2 with
    one line saying what to do, as for any start-up problem (the unit does not restart it).
    It used to exit 0, a clean stop to the caller, which the unit's Restart=always restarted."""
    import sqlite3

    from edge.outbox import Outbox

    outbox = tmp_path / "state" / "mqtt-outbox.db"
    Outbox(outbox, 100).close()  # an outbox without a client id: a new one is to be kept
    db = sqlite3.connect(str(outbox))
    db.execute("CREATE TRIGGER refuse BEFORE INSERT ON meta BEGIN SELECT RAISE(ABORT, 'refused by the test'); END")
    db.commit()
    db.close()
    config = _mqtt_sink_config(tmp_path, tiny_model, mosquitto, tmp_path / "out.jsonl")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-m", "edgewise.cli", "edge", "run", "--config", str(config)],
                       capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert r.returncode == 2, r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("edgewise: error:")]
    assert len(errors) == 1, r.stderr
    assert f"MQTT sink outbox {outbox}: cannot keep the client id (refused by the test); move the outbox aside" \
        in errors[0], r.stderr
    assert "Traceback" not in r.stderr and "edge daemon stopped after" in r.stderr


def test_an_error_in_the_mqtt_start_after_the_client_id_is_kept_is_logged_and_the_start_tried_again(
        tmp_path, tiny_model, mosquitto, monkeypatch, caplog):
    """The MQTT start (the task that keeps a new client id in the outbox, then starts the sink
    and the connection) runs guarded as the daemon's other tasks: an unexpected error after the
    id is kept (here the sink's resume, once) is logged with its traceback and the rest of the
    start tried again, so the records reach the broker. It used to end the task unlogged (its
    exception read only by the gather at the stop), the connection never started."""
    import logging

    from edge.outbox import this_host
    from edge.sinks import MqttSink
    from tests.conftest import TopicRecorder

    caplog.set_level(logging.INFO)
    resume = MqttSink._resume
    failed = []

    def resume_failing_once(sink):
        if not failed:
            failed.append(sink.outbox.kept_client_id("dev-", this_host()))
            raise RuntimeError("an unexpected error")
        resume(sink)

    monkeypatch.setattr(MqttSink, "_resume", resume_failing_once)
    topic = TopicRecorder(mosquitto, "edgewise/dev/detections")
    d = _daemon(tmp_path, tiny_model, [{"id": "s", "kind": "synthetic", "uri": "160x120", "fps": 20}],
                cloud={"mqtt": {"host": mosquitto.host, "port": mosquitto.port}}, sinks={"mqtt": True})

    async def run():
        task = asyncio.ensure_future(d.run())
        try:
            await async_wait_until(lambda: len(topic.messages) >= 3, 60, "records on the broker")
        finally:
            d.request_stop()
            assert await asyncio.wait_for(task, 30) == 0

    try:
        asyncio.run(run())
    finally:
        topic.stop()
    assert failed and failed[0] is not None and failed[0].startswith("dev-")  # it failed after the id was kept
    said = [r for r in caplog.records if r.getMessage().startswith("MQTT start failed")]
    assert len(said) == 1 and said[0].levelno == logging.ERROR, caplog.text
    assert said[0].exc_info is not None and "an unexpected error" in str(said[0].exc_info[1])


def test_an_mqtt_start_that_keeps_failing_stops_the_daemon_with_exit_2_instead_of_a_traceback_a_second(
        tmp_path, tiny_model, mosquitto, monkeypatch, caplog):
    """An error in the MQTT start that comes back at every try (here the sink's resume, as an
    outbox whose storage cannot be read) is tried ``MQTT_START_TRIES`` times, 1 s apart, then
    stops the daemon: run() raises one EdgewiseError (exit 2) saying what failed. It used to be
    logged with its traceback every second for as long as the daemon ran, the MQTT connection
    never started."""
    import logging

    from edge.daemon import MQTT_START_TRIES
    from edge.sinks import MqttSink
    from edgewise.errors import EdgewiseError

    caplog.set_level(logging.INFO)

    def resume_failing(sink):
        raise RuntimeError("an error that comes back")

    monkeypatch.setattr(MqttSink, "_resume", resume_failing)
    d = _daemon(tmp_path, tiny_model, [{"id": "s", "kind": "synthetic", "uri": "160x120", "fps": 20}],
                cloud={"mqtt": {"host": mosquitto.host, "port": mosquitto.port}}, sinks={"mqtt": True})

    async def run():
        task = asyncio.ensure_future(d.run())
        done, _ = await asyncio.wait([task], timeout=MQTT_START_TRIES + 60)
        if not done:  # (before the fix) it went on: stop it, then fail
            d.request_stop()
            await asyncio.wait([task], timeout=30)
            pytest.fail(f"the daemon still ran after {MQTT_START_TRIES + 60} s of a failing MQTT start")
        return task.result()

    with pytest.raises(EdgewiseError, match=f"MQTT start failed {MQTT_START_TRIES} times in a row, 1 s apart "
                                            r"\(last: RuntimeError: an error that comes back\)"):
        asyncio.run(run())
    said = [r for r in caplog.records if r.getMessage().startswith("MQTT start failed")]
    assert len(said) == MQTT_START_TRIES, caplog.text  # the tracebacks, then the line that stops the daemon
    assert all(r.exc_info is not None for r in said[:-1]) and said[-1].exc_info is None, caplog.text
    assert "edge daemon stopped after" in caplog.text


def test_a_start_that_fails_after_the_mqtt_outbox_is_opened_closes_it(tmp_path, tiny_model, mosquitto):
    """The start opens the MQTT outbox with the transports, before the sinks; a start that fails
    in between (here sinks.jsonl is a FIFO, refused when the sinks are built) closes it, as
    the sink's close does once built. It was left open (its file, WAL and shared memory held by
    the process that went on: a test, bench/edge.py)."""
    from edgewise.errors import DeploymentError

    os.mkfifo(tmp_path / "out.jsonl")
    outbox = tmp_path / "mqtt-outbox.db"
    d = _daemon(tmp_path, tiny_model, [{"id": "s", "kind": "synthetic", "uri": "160x120", "fps": 20}],
                cloud={"mqtt": {"host": mosquitto.host, "port": mosquitto.port}},
                sinks={"jsonl": str(tmp_path / "out.jsonl"), "mqtt": True, "mqtt_outbox": str(outbox)})
    with pytest.raises(DeploymentError, match="is a named pipe"):
        asyncio.run(d.run())
    assert d.outbox is not None and d.sinks is None  # it failed between the two

    def held() -> list:
        out = []
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                out.append(os.readlink(f"/proc/self/fd/{fd}"))
        return [p for p in out if p.startswith(str(outbox))]

    assert held() == []


def test_a_lock_held_on_the_outbox_when_the_sink_resumes_a_stale_exchange_holds_up_neither_frames_nor_signals(
        tmp_path, tiny_model, mosquitto):
    """The outbox keeps this host's client id (no new one to keep) and a record whose packet
    identifier no exchange of this sink can have (0, as a damaged or stale row), which the
    sink's resume forgets (the record is published anew); another process holds the outbox's
    write lock when the real daemon starts. Frames go on at 10 fps and a SIGTERM ends the
    daemon within its grace and the sink's close_timeout_s. Before, the resume waited for the
    lock on the event loop for SQLite's 30 s: no frame and no signal answered meanwhile."""
    from edge.outbox import Outbox, this_host
    from tests.edge.helpers import hold_write_lock, let_go

    out, log = tmp_path / "out.jsonl", tmp_path / "edge.log"
    outbox = tmp_path / "state" / "mqtt-outbox.db"
    ob = Outbox(outbox, 100)
    ob.keep_client_id("jet-0123abcd", this_host())
    ob.put(b'{"device": "jet", "stream": "cam", "frame_seq": 1}')
    ob.hand(1, 0)  # in flight with an identifier no MQTT exchange has
    ob.close()
    config = _mqtt_sink_config(tmp_path, tiny_model, mosquitto, out)
    holder = hold_write_lock(outbox)
    daemon = EdgeProcess(config, log)
    try:
        deadline = time.monotonic() + 60
        while "edge daemon jet running" not in log.read_text():
            assert daemon.check() and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        time.sleep(3.0)
        frames = len(read_jsonl(out)) if out.exists() else 0
        t0 = time.monotonic()
        rc = daemon.stop(60)
        took = time.monotonic() - t0
    finally:
        let_go(holder)
        daemon.close()
    text = log.read_text()
    assert frames >= 15, (frames, text)  # 10 fps for 3 s; none before
    assert rc == 0 and took < 1.0 + 3.0 + 3.0, (rc, took, text)
    assert f"MQTT sink: the outbox {outbox} could not be written (MQTT sink outbox {outbox} is locked" in text


def test_a_sighup_without_a_policy_says_it_reloads_nothing(tmp_path, tiny_model, caplog):
    """A SIGHUP reloads the policy only; without one it did nothing and said nothing, so an
    operator who changed a camera's URL in edge.yaml and reloaded waited for a change that
    needs a restart. It is said now (a real SIGHUP to this process)."""
    import logging

    caplog.set_level(logging.INFO)
    d = _daemon(tmp_path, tiny_model, [{"id": "s", "kind": "synthetic", "uri": "160x120", "fps": 20}])

    async def run():
        task = asyncio.ensure_future(d.run())
        await async_wait_until(lambda: d.pipeline is not None and d.pipeline.frames_done > 2, 60, "frames")
        os.kill(os.getpid(), signal.SIGHUP)
        await async_wait_until(lambda: "SIGHUP: nothing to reload" in caplog.text, 10, "the SIGHUP said")
        d.request_stop()
        assert await asyncio.wait_for(task, 30) == 0

    asyncio.run(run())
    said = [r for r in caplog.records if "SIGHUP" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING
    assert "restart the daemon to apply a change to it" in said[0].getMessage()


def test_a_device_renamed_by_the_default_device_id_is_warned_about(tmp_path, tiny_model, caplog, monkeypatch):
    """Daemons before 2026-12-01 defaulted device_id to ``edge-0``; since then an empty one is the
    serial number. An upgraded device whose edge.yaml never set it came back under another id
    (its MQTT topics, frame keys and gateway token) while its spool and records were edge-0's,
    and the start said only "device id <serial> (default: ...)" at INFO."""
    import logging

    import edge.preflight
    from edge.records import idempotency_key
    from edge.spool import Spool
    from tests.edge.helpers import frame_record

    monkeypatch.setattr(edge.preflight, "default_device_id", lambda *a, **k: ("nx-0423", "serial number"))
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_yaml("p", {"s": "never"}))
    spool = Spool(tmp_path / "spool.db", max_bytes=1 << 20, max_age_s=3600)  # as the old daemon left them
    spool.put(idempotency_key("edge-0", "s", 7), b"x", {})
    spool.close()
    (tmp_path / "out.jsonl").write_bytes(frame_record("s", 6, device="edge-0").to_json() + b"\n")
    tree = dict(policy_file=str(policy), sinks={"jsonl": str(tmp_path / "out.jsonl")})
    streams = [{"id": "s", "kind": "synthetic", "uri": "160x120", "max_frames": 2}]

    def warned(device_id: str):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="edge.daemon"):
            assert asyncio.run(_daemon(tmp_path, tiny_model, streams, device_id=device_id, **tree).run()) == 0
        return [r.getMessage() for r in caplog.records if "device_id is not set" in r.getMessage()]

    said = warned("")
    assert len(said) == 1 and "'nx-0423'" in said[0] and "'edge-0'" in said[0], said
    assert "set device_id: edge-0 in edge.yaml" in said[0]
    assert warned("nx-0423") == []  # an id set is the operator's choice: nothing to say


def test_state_files_an_older_daemon_left_readable_by_others_lose_those_rights(tmp_path, tiny_model, caplog):
    """Daemons before 2026-12-05 did not take 027 away from their umask: their spool (camera
    frames) was 0644, their records 0644 or 0666. An upgraded daemon went on writing into those
    files as they were, while a fresh install's are 0640."""
    import logging
    import stat

    from edge.spool import Spool

    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_yaml("p", {"s": "never"}))
    Spool(tmp_path / "spool.db", max_bytes=1 << 20, max_age_s=3600).close()
    records = tmp_path / "out.jsonl"
    records.write_text("")
    rotated = tmp_path / "out.jsonl.20261130T120000Z.gz"  # rotated by an older daemon
    rotated.write_bytes(b"")
    mine = [tmp_path / "spool.db", records, rotated]  # (the start count is written anew at each start)
    for f, mode in zip(mine, (0o644, 0o666, 0o644)):
        os.chmod(f, mode)
    streams = [{"id": "s", "kind": "synthetic", "uri": "160x120", "max_frames": 2}]
    with caplog.at_level(logging.WARNING, logger="edge.daemon"):
        d = _daemon(tmp_path, tiny_model, streams, policy_file=str(policy), sinks={"jsonl": str(records)})
        assert asyncio.run(d.run()) == 0
    modes = {f.name: stat.S_IMODE(f.stat().st_mode) for f in mine}
    assert modes == {"spool.db": 0o640, "out.jsonl": 0o640, rotated.name: 0o640}, modes
    said = [r.getMessage() for r in caplog.records if "lose those rights" in r.getMessage()]
    assert len(said) == 1 and f"{records} 0666" in said[0], said


def test_the_sinks_error_and_drop_counters_exist_at_zero_from_the_start(tmp_path, tiny_model):
    # a series first seen at 1 has no increase() in Prometheus: the first records an MQTT sink
    # dropped never fired the documented increase(edgewise_edge_sink_dropped_total[1h]) > 0
    d = _daemon(tmp_path, tiny_model, [{"id": "s", "kind": "synthetic", "uri": "160x120", "fps": 20}],
                sinks={"jsonl": str(tmp_path / "out.jsonl")})

    async def run():
        task = asyncio.ensure_future(d.run())
        await async_wait_until(lambda: d.sinks is not None, 60, "the sinks")
        registry = d.metrics.registry
        for counter in ("edgewise_edge_sink_errors_total", "edgewise_edge_sink_dropped_total"):
            assert registry.get_sample_value(counter, {"sink": "jsonl"}) == 0.0
        d.request_stop()
        assert await asyncio.wait_for(task, 30) == 0

    asyncio.run(run())


def test_the_series_alerts_read_exist_from_the_start_for_every_stream_and_transport(tmp_path, tiny_model):
    """A series first seen at 1 has no increase() or rate() in Prometheus: a stream's first drops
    (``rate(edgewise_edge_dropped_total{reason="queue_full"}[5m])``), a transport's first round
    trip (the chart's EdgewiseEdgeCloudP99OverSLO), the first escalations a dead cloud spooled,
    the first publish a broker refused went unseen."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_yaml("p", {"s": "never"}, transport=None))
    d = _daemon(tmp_path, tiny_model, [{"id": "s", "kind": "synthetic", "uri": "160x120", "fps": 20}],
                policy_file=str(policy), cloud={"mqtt": {"host": "127.0.0.1", "port": 1}})

    async def run():
        task = asyncio.ensure_future(d.run())
        await async_wait_until(lambda: d.pipeline is not None, 60, "the daemon running")
        registry = d.metrics.registry
        expected = [
            ("edgewise_edge_frames_total", {"stream": "s"}),
            ("edgewise_edge_dropped_total", {"stream": "s", "reason": "queue_full"}),
            ("edgewise_edge_dropped_total", {"stream": "s", "reason": "cloud_unavailable"}),
            ("edgewise_edge_corrupt_frames_total", {"stream": "s"}),
            ("edgewise_edge_cloud_rtt_seconds_count", {"transport": "mqtt"}),
            ("edgewise_edge_uplink_bytes_total", {"transport": "mqtt"}),
            ("edgewise_edge_escalations_total", {"reason": "hard", "outcome": "spooled"}),
            ("edgewise_edge_mqtt_refused_total", {"topic": "edgewise/dev/escalate", "reason": "not_authorized"}),
        ]
        missing = [(name, labels) for name, labels in expected if registry.get_sample_value(name, labels) is None]
        d.request_stop()
        assert await asyncio.wait_for(task, 30) == 0
        assert not missing, missing

    asyncio.run(run())


def test_a_sigterm_while_another_process_holds_the_spool_lock_exits_well_within_timeoutstopsec(tmp_path, tiny_model):
    """The cloud is unreachable (escalations spool) and another process holds the spool's write
    lock when SIGTERM comes: the real daemon exits 0 within its grace, the 5 s floor for
    escalations waiting for the spool and a margin, and every frame it processed has its
    record (those the spool could not take keep their edge result). Its spool writes and its
    close's checkpoint each waited out SQLite's 30 s busy timeout in turn: 88 s, and systemd
    (TimeoutStopSec=30 in deploy/jetson) would have killed it."""
    import sqlite3

    out = tmp_path / "out.jsonl"
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_yaml("all", {"cam": "always"}, deadline_ms=300))
    config = settings_yaml(tmp_path / "edge.yaml", device_id="jet",
                           streams=[{"id": "cam", "kind": "synthetic", "uri": "160x120", "fps": 10}],
                           model={"path": str(tiny_model), "max_batch": 1}, policy_file=str(policy),
                           cloud={"endpoints": [f"127.0.0.1:{free_port()}"]},  # nobody there: UNAVAILABLE
                           spool={"path": str(tmp_path / "spool.db")}, sinks={"jsonl": str(out)},
                           metrics={"port": -1}, shutdown_grace_s=1.0)
    daemon = EdgeProcess(config, tmp_path / "edge.log")
    lock = sqlite3.connect(str(tmp_path / "spool.db"), isolation_level=None)
    try:
        deadline = time.monotonic() + 60
        while not [r for r in read_jsonl(out) if r.get("outcome") == "spooled"]:
            assert daemon.check() and time.monotonic() < deadline, (tmp_path / "edge.log").read_text()
            time.sleep(0.1)
        lock.execute("BEGIN IMMEDIATE")  # an operator's sqlite3 shell, a backup tool
        time.sleep(1.0)  # escalations pile up behind the spool write waiting for the lock
        t0 = time.monotonic()
        rc = daemon.stop(45)
        took = time.monotonic() - t0
    finally:
        lock.close()
        daemon.close()
    log = (tmp_path / "edge.log").read_text()
    assert rc == 0 and took < 1.0 + 5.0 + 3.0, (rc, took, log)
    frames = int(log.rsplit("edge daemon stopped after ", 1)[1].split()[0])
    records = read_jsonl(out)
    assert len({r["frame_seq"] for r in records}) == len(records) == frames, (len(records), frames)
    assert "stayed busy past the shutdown grace" in log


@pytest.mark.skipif(sys.version_info < (3, 10), reason="the local cloud tier needs Python >= 3.10 (the Jetson lane "
                    "runs the daemon's side of it; the main suite runs this test)")
def test_a_replay_the_cloud_answers_within_the_grace_of_a_sigterm_is_written_and_no_new_one_is_sent(
        tmp_path, tiny_model):
    """A real daemon replays its spool to a real cloud whose worker is stopped (SIGSTOP: a
    slow answer) and gets SIGTERM; the worker goes on 1 s later, within the grace. The replay
    in flight is answered and its late record written before the exit, its entry acknowledged;
    no other entry is sent, and the rest stays spooled for the next start. The daemon used to
    cancel the replay at once (no live escalation to wait for): the answer the cloud computed
    was thrown away, and the entry asked again at the next start."""
    import sqlite3

    from cloud.local import LocalCloud

    out = tmp_path / "out.jsonl"
    log = tmp_path / "edge.log"

    def config(mode: str, endpoint: str) -> Path:
        policy = tmp_path / f"policy-{mode}.yaml"
        policy.write_text(policy_yaml("p", {"cam": mode}, deadline_ms=800))
        return settings_yaml(tmp_path / f"edge-{mode}.yaml", device_id="jet",
                             streams=[{"id": "cam", "kind": "synthetic", "uri": "160x120", "fps": 5}],
                             model={"path": str(tiny_model), "max_batch": 1}, policy_file=str(policy),
                             cloud={"endpoints": [endpoint]}, sinks={"jsonl": str(out)}, metrics={"port": -1},
                             spool={"path": str(tmp_path / "spool.db"), "replay_interval_s": 0.3},
                             shutdown_grace_s=4.0)

    def spooled() -> list:
        db = sqlite3.connect(str(tmp_path / "spool.db"))
        try:
            return [k for (k,) in db.execute("SELECT key FROM items ORDER BY id")]
        finally:
            db.close()

    daemon = EdgeProcess(config("always", f"127.0.0.1:{free_port()}"), log)  # nobody there: it spools
    try:
        deadline = time.monotonic() + 60
        while len([r for r in read_jsonl(out) if r.get("outcome") == "spooled"]) < 3:
            assert daemon.check() and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        assert daemon.stop(30) == 0
    finally:
        daemon.close()
    backlog = spooled()
    assert len(backlog) >= 3
    # a log of its own: EdgeProcess appends, and the first run's "running" line would let the
    # SIGTERM below reach this daemon before it handles signals (killed, -15, under load)
    log = tmp_path / "edge-replay.log"
    with LocalCloud(tiny_model, workers=1, log_dir=tmp_path / "cloud") as cloud:
        worker = cloud.worker_pid(0)
        os.kill(worker, signal.SIGSTOP)
        try:
            daemon = EdgeProcess(config("never", cloud.address), log)
            try:
                _wait_for(daemon.proc, log, "edge daemon jet running")
                time.sleep(1.5)  # the first entry's replay waits for the stopped worker
                assert spooled() == backlog
                daemon.proc.send_signal(signal.SIGTERM)
                t0 = time.monotonic()
                time.sleep(1.0)
                os.kill(worker, signal.SIGCONT)
                rc = daemon.proc.wait(30)
                took = time.monotonic() - t0
            finally:
                daemon.close()
        finally:
            os.kill(worker, signal.SIGCONT)
    late = [r for r in read_jsonl(out) if r.get("late")]
    assert rc == 0 and took < 4.0 + 2.0, (rc, took, log.read_text())
    assert [f"jet/cam/{r['frame_seq']}" for r in late] == backlog[:1], (late, log.read_text())
    assert late[0]["outcome"] == "cloud" and late[0]["cloud_rtt_ms"] > 1000
    assert spooled() == backlog[1:]


@pytest.mark.parametrize("why", ["[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : CUDA failure 2: out of memory",
                                 "BFCArena::AllocateRawInternal Failed to allocate memory for requested buffer"])
def test_a_first_frame_out_of_memory_is_not_a_model_error(tmp_path, tiny_model, monkeypatch, why):
    """A first frame that fails for want of memory (another process holding the GPU's, on a
    Jetson the memory it shares with the CPU) is no fault of the model: as a ModelError it exited
    2, which the unit's RestartPreventExitStatus=2 does not restart ("restarting cannot fix that"),
    and told the operator to re-export a good model. It is raised as the runtime's error, which
    the unit restarts (exit 1), as before the first frame's failure became one line (review)."""
    from edgewise.errors import EdgewiseError
    from edgewise.runtime.detector import Detector

    load = Detector.from_file.__func__

    def short_of_memory(cls, *args, **kwargs):
        det = load(cls, *args, **kwargs)

        def fail(images):
            raise RuntimeError(why)

        det.detect = fail
        return det

    monkeypatch.setattr(Detector, "from_file", classmethod(short_of_memory))
    d = _daemon(tmp_path, tiny_model, [{"id": "s", "kind": "synthetic", "uri": "160x120", "fps": 20}])
    with pytest.raises(Exception) as e:
        d._load_detector()
    assert not isinstance(e.value, EdgewiseError), str(e.value)
    assert why in str(e.value)


def test_healthz_says_stalled_while_the_event_loop_is_stuck(tmp_path, tiny_model, monkeypatch):
    """``/healthz`` is served from its own thread: with the event loop stuck (a write blocked on
    a stderr pipe nobody reads, found by a probe) it answered 200 "ok", frames frozen, so a
    container's health check or a liveness probe never restarted the daemon. It now says
    "stalled" (503) once the loop has not turned for ``LOOP_STALL_S``, and "ok" again after."""
    import json
    import socket
    import threading
    import time
    import urllib.error
    import urllib.request

    import edge.daemon as daemon_module

    monkeypatch.setattr(daemon_module, "LOOP_STALL_S", 0.6)
    monkeypatch.setattr(daemon_module, "LOOP_BEAT_S", 0.05)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    d = _daemon(tmp_path, tiny_model, [{"id": "s", "kind": "synthetic", "uri": "160x120", "fps": 10}],
                metrics={"port": port, "host": "127.0.0.1"})

    def healthz() -> tuple:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
                return r.status, json.loads(r.read())["status"]
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())["status"]

    seen = []

    async def run():
        task = asyncio.ensure_future(d.run())
        await async_wait_until(lambda: d.started and d.pipeline.frames_done > 0, 60, "frames")
        assert healthz() == (200, "ok")
        asker = threading.Thread(target=lambda: (time.sleep(1.2), seen.append(healthz())))
        asker.start()
        time.sleep(2.0)  # the loop stuck, as behind a blocked write
        asker.join()
        await asyncio.sleep(0.2)
        seen.append(healthz())
        d.request_stop()
        assert await asyncio.wait_for(task, 30) == 0

    asyncio.run(run())
    assert seen == [(503, "stalled"), (200, "ok")]


def test_healthz_says_stalled_while_an_inference_call_never_returns(tmp_path, tiny_model, monkeypatch, caplog):
    """The event loop turns but frames stopped: the one inference call the pipeline waits for
    never returns (a GPU or driver hang on a Jetson). systemd's watchdog restarts the daemon
    (no pet while a stream streams and no frame is done), but ``/healthz``, which a container's
    health check or a liveness probe reads instead, said 200 "ok" for good: it judged the loop
    alone. It now says "stalled" (503) once no frame was done for ``LOOP_STALL_S`` while frames
    wait for the model, says why (and the log, once), and "ok" again once frames go on. (The call is held
    in the inference thread around the real model: a driver hang cannot be made on this machine.)"""
    import json
    import logging
    import socket
    import threading
    import urllib.error
    import urllib.request

    import edge.daemon as daemon_module

    monkeypatch.setattr(daemon_module, "LOOP_STALL_S", 1.0)
    monkeypatch.setattr(daemon_module, "LOOP_BEAT_S", 0.05)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    d = _daemon(tmp_path, tiny_model, [{"id": "s", "kind": "synthetic", "uri": "160x120", "fps": 10}],
                metrics={"port": port, "host": "127.0.0.1"})
    real = d._load_detector()
    hang, hung = threading.Event(), threading.Event()
    release = threading.Event()

    class Held:  # the real detector, whose infer call waits while ``hang`` is set
        def __getattr__(self, name):
            return getattr(real, name)

        def infer(self, batch):
            if hang.is_set():
                hung.set()
                release.wait(30)
            return real.infer(batch)

    d.detector = Held()

    def healthz() -> tuple:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
                body = json.loads(r.read())
                return r.status, body["status"], body.get("stalled", "")
        except urllib.error.HTTPError as e:
            body = json.loads(e.read())
            return e.code, body["status"], body.get("stalled", "")

    seen = []

    async def run():
        task = asyncio.ensure_future(d.run())
        try:
            await async_wait_until(lambda: d.started and d.pipeline.frames_done > 0, 60, "frames")
            seen.append(await asyncio.get_running_loop().run_in_executor(None, healthz))
            hang.set()
            await async_wait_until(hung.is_set, 10, "the inference call held")
            await asyncio.sleep(1.6)  # the loop turns meanwhile; no frame is done
            seen.append(await asyncio.get_running_loop().run_in_executor(None, healthz))
            hang.clear()
            release.set()
            done = d.pipeline.frames_done
            await async_wait_until(lambda: d.pipeline.frames_done > done + 2, 10, "frames again")
            await asyncio.sleep(0.2)  # a beat (0.05 s) notes it: the frames queued meanwhile go in a burst
            seen.append(await asyncio.get_running_loop().run_in_executor(None, healthz))
        finally:
            release.set()
            d.request_stop()
            assert await asyncio.wait_for(task, 30) == 0

    with caplog.at_level(logging.INFO, logger="edge.daemon"):
        asyncio.run(run())
    assert [s[:2] for s in seen] == [(200, "ok"), (503, "stalled"), (200, "ok")], seen
    assert "no frame was processed for" in seen[1][2] and "inference call has not returned" in seen[1][2], seen[1]
    said = [r.getMessage() for r in caplog.records if r.name == "edge.daemon"]
    stalls = [m for m in said if m.startswith("no frame was processed for")]
    assert len(stalls) == 1 and "/healthz says stalled" in stalls[0], said  # once per stall, not at every beat
    assert any(m.startswith("frames are processed again after") for m in said), said


def _read_pets(sock: socket.socket, stop: threading.Event, pets: list) -> None:
    """Append the time of each ``WATCHDOG=1`` the daemon sends to ``sock`` until ``stop``."""
    while not stop.is_set():
        try:
            msg = sock.recv(4096)
        except socket.timeout:
            continue
        if b"WATCHDOG=1" in msg.split(b"\n"):
            pets.append(time.monotonic())


def test_the_watchdog_is_petted_between_the_frames_of_a_slow_stream_and_not_while_inference_hangs(
        tmp_path, tiny_model, monkeypatch):
    """systemd's watchdog was petted only when a frame had been done since the last pet while a
    stream streamed: a stream capped below the pet rate (``streams[].fps`` may be one frame a
    day; here one in 2 s against pets every 0.3 s) went unpetted between its frames, and under
    the unit's WatchdogSec=30 a stream slower than a frame in 30 s was killed and restarted for
    good. Now it is petted while frames progress or none waits for the model, and not while
    the model holds a batch and frames are done no more (``progress_beat``, which ``/healthz``
    reads too). Pets are read from a real datagram socket, as systemd's NOTIFY_SOCKET."""
    import socket
    import threading
    import time

    import edge.daemon as daemon_module

    monkeypatch.setattr(daemon_module, "LOOP_BEAT_S", 0.05)
    sock_path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(sock_path)
    sock.settimeout(0.2)
    monkeypatch.setenv("NOTIFY_SOCKET", sock_path)
    monkeypatch.setenv("WATCHDOG_USEC", "600000")  # pets every 0.3 s
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    d = _daemon(tmp_path, tiny_model, [{"id": "s", "kind": "synthetic", "uri": "160x120", "fps": 0.5}])
    real = d._load_detector()
    hang, hung, release = threading.Event(), threading.Event(), threading.Event()

    class Held:  # the real detector, whose infer call waits while ``hang`` is set
        def __getattr__(self, name):
            return getattr(real, name)

        def infer(self, batch):
            if hang.is_set():
                hung.set()
                release.wait(30)
            return real.infer(batch)

    d.detector = Held()
    pets: list = []
    stop = threading.Event()

    reader = threading.Thread(target=_read_pets, args=(sock, stop, pets))
    reader.start()

    def longest_gap(since: float, until: float) -> float:
        marks = [since] + [t for t in pets if since < t < until] + [until]
        return max(b - a for a, b in zip(marks, marks[1:]))

    async def run():
        task = asyncio.ensure_future(d.run())
        try:
            await async_wait_until(lambda: d.started and d.pipeline.frames_done > 0, 60, "a first frame")
            t0 = time.monotonic()
            await asyncio.sleep(4.5)  # two more frames, 2 s apart
            slow = longest_gap(t0, time.monotonic())
            assert d.pipeline.frames_done >= 2
            hang.set()
            await async_wait_until(hung.is_set, 10, "the next frame's inference call held")
            t1 = time.monotonic()
            await asyncio.sleep(3.5)  # pets may go on for a pet interval (0.3 s) after the last progress
            held = longest_gap(t1, time.monotonic())
            return slow, held
        finally:
            release.set()
            d.request_stop()
            assert await asyncio.wait_for(task, 30) == 0

    try:
        slow, held = asyncio.run(run())
    finally:
        stop.set()
        reader.join()
        sock.close()
    assert slow < 1.0, f"no pet for {slow:.2f} s between a slow stream's frames (pets every 0.3 s)"
    assert held > 2.5, f"petted while the model held a batch (longest gap {held:.2f} s)"


def test_a_model_that_fails_every_batch_is_stalled_and_not_petted_whatever_the_beat_finds(
        tmp_path, tiny_model, monkeypatch):
    """A model whose every call raises (a CUDA error that sticks to the process until it
    restarts) does no frame. systemd's watchdog used to restart such a daemon (no frame done
    while a stream streamed); since pets follow ``progress_beat`` it was petted whenever a beat
    found no frame waiting, which a fast failure makes the rule (the batcher takes each frame
    at once and drops it), so the device stayed broken, 200 "degraded" for good. A failing
    model is no progress now: ``/healthz`` says stalled after ``LOOP_STALL_S``, naming the
    failures (not a call that never returns), and the pets stop. Pets are read from a real
    datagram socket, as systemd's NOTIFY_SOCKET; the model is the real one, failing on demand."""
    import json
    import socket
    import threading
    import time
    import urllib.error
    import urllib.request

    import edge.daemon as daemon_module

    monkeypatch.setattr(daemon_module, "LOOP_STALL_S", 1.0)
    monkeypatch.setattr(daemon_module, "LOOP_BEAT_S", 0.05)
    sock_path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(sock_path)
    sock.settimeout(0.2)
    monkeypatch.setenv("NOTIFY_SOCKET", sock_path)
    monkeypatch.setenv("WATCHDOG_USEC", "600000")  # pets every 0.3 s
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    d = _daemon(tmp_path, tiny_model, [{"id": "s", "kind": "synthetic", "uri": "160x120", "fps": 5}],
                metrics={"port": port, "host": "127.0.0.1"})
    real = d._load_detector()
    fail = threading.Event()

    class Failing:  # the real detector, whose infer call raises at once while ``fail`` is set
        def __getattr__(self, name):
            return getattr(real, name)

        def infer(self, batch):
            if fail.is_set():
                raise RuntimeError("CUDA error: an illegal memory access was encountered")
            return real.infer(batch)

    d.detector = Failing()
    pets: list = []
    stop = threading.Event()

    def healthz() -> tuple:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
                body = json.loads(r.read())
                return r.status, body["status"], body.get("stalled", "")
        except urllib.error.HTTPError as e:
            body = json.loads(e.read())
            return e.code, body["status"], body.get("stalled", "")

    reader = threading.Thread(target=_read_pets, args=(sock, stop, pets))
    reader.start()

    async def run():
        task = asyncio.ensure_future(d.run())
        try:
            await async_wait_until(lambda: d.started and d.pipeline.frames_done > 0, 60, "a first frame")
            fail.set()
            await async_wait_until(lambda: d.pipeline.inference_failing, 10, "a failed batch")
            t1 = time.monotonic()
            await asyncio.sleep(3.0)
            marks = [t1] + [t for t in pets if t > t1] + [time.monotonic()]
            return max(b - a for a, b in zip(marks, marks[1:])), await asyncio.get_running_loop().run_in_executor(None, healthz)
        finally:
            d.request_stop()
            assert await asyncio.wait_for(task, 30) == 0

    try:
        held, seen = asyncio.run(run())
    finally:
        stop.set()
        reader.join()
        sock.close()
    assert held > 2.0, f"petted while every batch failed (longest gap {held:.2f} s)"
    assert seen[:2] == (503, "stalled"), seen
    assert "failed" in seen[2] and "has not returned" not in seen[2], seen


def test_sighups_while_the_daemon_stops_never_end_it_killed_by_the_signal(tmp_path, tiny_model):
    """SIGTERM, then a SIGHUP every 2 ms (a script reloading the policy as the unit stops) until
    the process is gone: it exits 0. The loop's close gave SIGHUP back its default, and one in
    the exit's last moments ended the finished stop killed by SIGHUP, a failure to systemd."""
    proc, log = _start_daemon(tmp_path, tiny_model)
    try:
        _wait_for(proc, log, " running: ")
        assert stop_under_sighups(proc) == 0, log.read_text()
        assert "edge daemon stopped after" in log.read_text()
        assert "Traceback" not in log.read_text()  # (nor one from a SIGHUP as the loop closed)
    finally:
        proc.kill()
        proc.wait(10)
