"""One daemon per spool.path: a second start on the same state folder is refused with the
first one's pid; the lock goes with its process, kill -9 included."""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from edge.instancelock import InstanceLock
from edgewise.errors import ConfigError
from tests.edge.helpers import settings_yaml
from tests.processes import ROOT, EdgeProcess
from tests.waiting import wait_until


def test_a_second_lock_on_the_same_spool_names_the_holder_and_waits_for_its_release(tmp_path):
    spool = str(tmp_path / "spool.db")
    first, second = InstanceLock(spool), InstanceLock(spool)
    first.acquire()
    with pytest.raises(ConfigError, match=rf"spool.db.lock: another edgewise daemon \(pid {os.getpid()}\) uses "
                                          r"this spool.path; stop it first"):
        second.acquire()
    InstanceLock(str(tmp_path / "other.db")).acquire()  # another spool: its own lock
    first.release()
    second.acquire()
    second.release()


def test_a_lock_held_by_a_process_killed_with_sigkill_is_free_at_once(tmp_path):
    spool = str(tmp_path / "spool.db")
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(ROOT)!r})
        from edge.instancelock import InstanceLock
        InstanceLock({spool!r}).acquire()
        print("held", flush=True)
        time.sleep(600)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(ConfigError, match=rf"\(pid {holder.pid}\)"):
            InstanceLock(spool).acquire()
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
        InstanceLock(spool).acquire()  # no stale lock to clean up
    finally:
        holder.kill()
        holder.wait(10)
        if holder.stdout is not None:
            holder.stdout.close()


def test_a_second_daemon_on_the_same_spool_path_is_refused_at_start(tmp_path, tiny_model):
    """Started by hand while the service runs (metrics off, so no port conflict stops it
    first): it refuses before it opens the spool, and the first daemon runs on."""
    config = settings_yaml(
        tmp_path / "edge.yaml", device_id="dev",
        streams=[{"id": "s", "kind": "synthetic", "uri": "160x120", "fps": 5}],
        model={"path": str(tiny_model)}, spool={"path": str(tmp_path / "state" / "spool.db")},
        sinks={"jsonl": str(tmp_path / "out.jsonl")}, metrics={"port": -1})
    first = EdgeProcess(config, tmp_path / "first.log")
    try:
        wait_until(lambda: first.check() and "running" in (tmp_path / "first.log").read_text(), 60, "first daemon")
        second = subprocess.run([sys.executable, "-m", "edgewise.cli", "edge", "run", "--config", str(config)],
                                capture_output=True, text=True, timeout=120, cwd=ROOT,
                                env=dict(os.environ, PYTHONPATH=str(ROOT)))
        assert second.returncode == 2, second.stderr
        assert f"another edgewise daemon (pid {first.proc.pid}) uses this spool.path" in second.stderr
        assert first.check()
        first.kill9(0)
        first.start()  # the killed daemon's lock went with it
        wait_until(lambda: first.check() and (tmp_path / "first.log").read_text().count(" running") >= 2, 60,
                   "restarted daemon")
        assert first.stop() == 0
    finally:
        first.close()


def test_the_mqtt_outbox_has_its_own_lock_and_a_refusal_keeps_no_lock(tmp_path):
    outbox = str(tmp_path / "mqtt-outbox.db")
    first = InstanceLock(str(tmp_path / "spool.db"), outbox)
    first.acquire()
    second = InstanceLock(str(tmp_path / "spool-b.db"), outbox)
    with pytest.raises(ConfigError, match=rf"mqtt-outbox.db.lock: another edgewise daemon \(pid {os.getpid()}\) uses "
                                          r"this sinks.mqtt_outbox; stop it first .*its own sinks.mqtt_outbox"):
        second.acquire()
    alone = InstanceLock(str(tmp_path / "spool-b.db"))
    alone.acquire()  # the refused one let go of the spool's lock it took
    alone.release()
    first.release()
    second.acquire()
    second.release()


def test_a_second_daemon_in_the_same_state_folder_under_another_spool_name_is_refused_for_the_outbox(
        tmp_path, tiny_model, mosquitto):
    """A copied config whose spool.path got another name, in the same folder: both daemons
    took ``mqtt-outbox.db`` there (the default beside the spool) and ran, taking the MQTT session
    from each other at every reconnect and deleting each other's records until the first
    one's outbox count went below zero ("__len__() should return >= 0": no record written)."""
    def config(name: str):
        return settings_yaml(
            tmp_path / f"{name}.yaml", device_id="dev",
            streams=[{"id": "s", "kind": "synthetic", "uri": "160x120", "fps": 5}],
            model={"path": str(tiny_model)}, spool={"path": str(tmp_path / "state" / f"{name}.db")},
            cloud={"mqtt": {"host": mosquitto.host, "port": mosquitto.port}},
            sinks={"jsonl": str(tmp_path / f"{name}.jsonl"), "mqtt": True}, metrics={"port": -1})

    first = EdgeProcess(config("spool"), tmp_path / "first.log")
    try:
        wait_until(lambda: first.check() and "running" in (tmp_path / "first.log").read_text(), 60, "first daemon")
        second = subprocess.run([sys.executable, "-m", "edgewise.cli", "edge", "run", "--config",
                                 str(config("spool-copy"))], capture_output=True, text=True, timeout=120, cwd=ROOT,
                                env=dict(os.environ, PYTHONPATH=str(ROOT)))
        assert second.returncode == 2, second.stderr
        assert (f"mqtt-outbox.db.lock: another edgewise daemon (pid {first.proc.pid}) uses this sinks.mqtt_outbox"
                in second.stderr)
        assert first.check() and first.stop() == 0
    finally:
        first.close()


def test_every_path_to_one_spool_or_outbox_takes_one_lock(tmp_path):
    """A spool moved to a bigger disk and linked back: a second daemon whose spool.path was the
    symlink took ``<link>.lock``, a lock of its own, and ran on the first one's SQLite file.
    A symlink to the file (also before the file exists), a symlinked folder and ``..`` are all refused."""
    state = tmp_path / "state"
    state.mkdir()
    spool, outbox = state / "spool.db", state / "outbox.db"
    (tmp_path / "spool-link.db").symlink_to(spool)  # dangling until the first daemon makes the spool
    (tmp_path / "outbox-link.db").symlink_to(outbox)
    (tmp_path / "state-link").symlink_to(state, target_is_directory=True)
    first = InstanceLock(str(spool), str(outbox))
    first.acquire()
    for alias in (tmp_path / "spool-link.db", tmp_path / "state-link" / "spool.db",
                  tmp_path / "state-link" / ".." / "state" / "spool.db"):
        with pytest.raises(ConfigError, match=rf"{spool}.lock: another edgewise daemon \(pid {os.getpid()}\) "
                                              r"uses this spool.path"):
            InstanceLock(str(alias)).acquire()
    with pytest.raises(ConfigError, match=rf"{outbox}.lock: another edgewise daemon .* uses this sinks.mqtt_outbox"):
        InstanceLock(str(tmp_path / "other.db"), str(tmp_path / "outbox-link.db")).acquire()
    assert not (tmp_path / "spool-link.db.lock").exists()  # the refused ones made no lock of their own
    first.release()
    InstanceLock(str(tmp_path / "spool-link.db"), str(tmp_path / "outbox-link.db")).acquire()


def test_a_second_daemon_whose_spool_path_is_a_symlink_to_the_first_ones_spool_is_refused(tmp_path, tiny_model):
    """The spool moved to a bigger disk and linked back, and a copied config naming the link:
    the second daemon took ``<link>.lock`` and ran on the same SQLite file."""
    state = tmp_path / "state"
    (tmp_path / "link.db").symlink_to(state / "spool.db")

    def config(name: str, spool: str):
        return settings_yaml(
            tmp_path / f"{name}.yaml", device_id="dev",
            streams=[{"id": "s", "kind": "synthetic", "uri": "160x120", "fps": 5}],
            model={"path": str(tiny_model)}, spool={"path": spool},
            sinks={"jsonl": str(tmp_path / f"{name}.jsonl")}, metrics={"port": -1})

    first = EdgeProcess(config("first", str(state / "spool.db")), tmp_path / "first.log")
    try:
        wait_until(lambda: first.check() and "running" in (tmp_path / "first.log").read_text(), 60, "first daemon")
        second = subprocess.run([sys.executable, "-m", "edgewise.cli", "edge", "run", "--config",
                                 str(config("second", str(tmp_path / "link.db")))], capture_output=True, text=True,
                                timeout=120, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
        assert second.returncode == 2, second.stderr
        assert (f"{state / 'spool.db'}.lock: another edgewise daemon (pid {first.proc.pid}) uses this spool.path"
                in second.stderr)
        assert not (tmp_path / "second.jsonl").exists()
        assert first.check() and first.stop() == 0
    finally:
        first.close()


def test_the_records_file_has_a_hidden_lock_no_records_glob_picks_up(tmp_path):
    """`check-policy --replay records.jsonl*` (docs/policies.md) must not read the lock as records:
    it is `.records.jsonl.lock`, beside the file the path names."""
    records = tmp_path / "records.jsonl"
    (tmp_path / "link.jsonl").symlink_to(records)
    first = InstanceLock(str(tmp_path / "a.db"), records_path=str(records))
    first.acquire()
    assert (tmp_path / ".records.jsonl.lock").exists()
    assert glob.glob(str(tmp_path / "records.jsonl*")) == []  # (the daemon makes records.jsonl itself)
    with pytest.raises(ConfigError, match=rf"{tmp_path}/.records.jsonl.lock: another edgewise daemon "
                                          rf"\(pid {os.getpid()}\) writes to this sinks.jsonl; stop it first .*its "
                                          r"own sinks.jsonl$"):
        InstanceLock(str(tmp_path / "b.db"), records_path=str(tmp_path / "link.jsonl")).acquire()
    InstanceLock(str(tmp_path / "b.db")).acquire()  # the refused one let go of its spool's lock
    first.release()


def test_a_second_daemon_with_its_own_spool_but_the_same_records_file_is_refused(tmp_path, tiny_model):
    """Two daemons with their own spool.path but one sinks.jsonl both ran: each appended to the
    file and each rotated it (renaming the file the other wrote, pruning the other's rotated
    ones), found by a probe. The second now stops at start naming the first; the records glob
    (`check-policy --replay records.jsonl*`) still finds only records."""
    records = tmp_path / "records.jsonl"

    def config(name: str):
        return settings_yaml(
            tmp_path / f"{name}.yaml", device_id="dev",
            streams=[{"id": "s", "kind": "synthetic", "uri": "160x120", "fps": 5}],
            model={"path": str(tiny_model)}, spool={"path": str(tmp_path / name / "spool.db")},
            sinks={"jsonl": str(records)}, metrics={"port": -1})

    first = EdgeProcess(config("first"), tmp_path / "first.log")
    try:
        wait_until(lambda: first.check() and "running" in (tmp_path / "first.log").read_text(), 60, "first daemon")
        second = subprocess.run([sys.executable, "-m", "edgewise.cli", "edge", "run", "--config",
                                 str(config("second"))], capture_output=True, text=True, timeout=120, cwd=ROOT,
                                env=dict(os.environ, PYTHONPATH=str(ROOT)))
        assert second.returncode == 2, second.stderr
        assert (f"{tmp_path}/.records.jsonl.lock: another edgewise daemon (pid {first.proc.pid}) writes to this "
                "sinks.jsonl" in second.stderr)
        assert not (tmp_path / "second" / "spool.db").exists()  # refused before it touched its state
        wait_until(lambda: records.exists() and records.stat().st_size > 0, 60, "records")
        assert first.check() and first.stop() == 0
    finally:
        first.close()
    assert glob.glob(str(tmp_path / "records.jsonl*")) == [str(records)]  # what check-policy --replay gets
