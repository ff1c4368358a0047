"""A damaged MQTT sink outbox at the daemon's start (``edge.outbox_salvage``): it was refused
(exit 2, which systemd does not restart); now what it holds is copied into a new outbox and
published. Real SQLite files with a page overwritten as a bad flash block leaves it, a real
Mosquitto and the sink in a real process (``tests.edge.mqtt_sink_process``, which opens the
outbox as the daemon does), salvages killed with SIGKILL, and a real full tmpfs."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import List

import pytest

from edge.outbox import Outbox, OutboxDamaged, OutboxError
from edge.outbox_salvage import COPY_SUFFIX, open_outbox
from tests.conftest import TopicRecorder
from tests.processes import ROOT
from tests.waiting import wait_until

TOPIC = "edgewise/cam/detections"
PAGE = 4096


def damaged_outbox(path: Path, count: int = 900, size: int = 600, late_every: int = 3) -> None:
    """An outbox holding ``count`` records ``{"n": i}`` (padded to ``size`` bytes, a late key for
    every ``late_every``-th), some handed to the broker at QoS 2, a client id; then a page in the
    middle of its records overwritten, as a bad flash block leaves it."""
    ob = Outbox(path, 100_000)
    ob.client_id("cam-", lambda: "cam-0ld5e55", "host")
    for i in range(count):
        data = json.dumps({"n": i, "pad": "x" * size}).encode()
        assert ob.put(data, late_key=f"late-{i}" if i % late_every == 0 else None)
    for rid, _ in ob.peek(0, 5):
        ob.hand(rid, rid)  # in flight at QoS 2 in the old session
    ob.close()
    pages = path.stat().st_size // PAGE
    with open(path, "r+b") as f:
        f.seek(PAGE * (pages // 2))
        f.write(os.urandom(PAGE))


def numbers(ob: Outbox) -> List[int]:
    return [json.loads(d)["n"] for _, d in ob.peek(0, 10**6)]


def test_a_damaged_outbox_no_longer_stops_the_start_and_what_it_holds_reaches_the_broker(tmp_path, mosquitto):
    path = tmp_path / "mqtt-outbox.db"
    damaged_outbox(path)
    with pytest.raises(OutboxDamaged, match=r"MQTT sink outbox .* is damaged"):
        Outbox(path, 1000)  # what refused the daemon's start
    recorder = TopicRecorder(mosquitto, TOPIC)
    log = tmp_path / "sink.log"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with open(log, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "tests.edge.mqtt_sink_process", mosquitto.host,
                                 str(mosquitto.port), str(path), TOPIC, "0"], cwd=ROOT, env=env,
                                stdout=subprocess.DEVNULL, stderr=err)
    try:
        wait_until(lambda: "record(s) and" in log.read_text(), 30, "the salvage's line")
        line = log.read_text()
        said = re.search(r"is damaged \(.*\); moved it to (\S+) \(kept for inspection\) and started a new outbox "
                         r"at \S+: (\d+) record\(s\) and (\d+) late key\(s\) copied; records with ids ([\d, -]+) "
                         r"could not be read; a new MQTT session starts", line)
        assert said, line
        copied = int(said.group(2))
        assert 800 <= copied < 900 and Path(said.group(1)).exists()  # one page lost, the file kept
        wait_until(lambda: len(recorder.messages) >= copied, 60, f"{copied} records published")
        got = [json.loads(m[1])["n"] for m in recorder.messages]
        assert got == sorted(set(got)) and len(got) == copied  # in order, each once
        lost = sorted(set(range(900)) - set(got))
        assert lost == list(range(lost[0], lost[-1] + 1))  # the rows of the damaged page, nothing else
        assert proc.poll() is None  # the sink runs on
    finally:
        proc.kill()
        proc.wait(10)
        recorder.client.loop_stop()
        recorder.client.disconnect()
    with sqlite3.connect(str(path)) as db:  # a new session: the old one's packet ids are not reused
        meta = dict(db.execute("SELECT key, value FROM meta"))
        assert meta["client_id"] != "cam-0ld5e55" and meta["client_id"].startswith("cam-")


def test_the_late_keys_are_kept_so_a_replayed_result_is_not_published_twice(tmp_path, caplog):
    path = tmp_path / "mqtt-outbox.db"
    damaged_outbox(path, count=300, late_every=1)
    ob = open_outbox(path, 1000)
    try:
        kept = numbers(ob)
        assert 250 <= len(kept) < 300 and len(ob.late_keys()) == 300  # the keys' table was not hit
        for n in (0, 150, 299):
            assert ob.put(b"again", late_key=f"late-{n}") is False
        assert ob.put(b"new", late_key="late-300") is True
        assert ob.in_flight() == []
    finally:
        ob.close()
    assert sum("is damaged" in r.getMessage() for r in caplog.records) == 1
    ob = open_outbox(path, 1000)  # sound now: opened as it is
    assert len(ob) == len(kept) + 1
    ob.close()
    assert len(list(tmp_path.glob("mqtt-outbox.db.damaged-*"))) == 3  # the file, its -wal and -shm


def test_records_a_torn_page_left_as_zeros_are_not_copied_by_the_salvage(tmp_path, caplog):
    """A page of small records whose later sectors a power cut never wrote: SQLite finds the
    b-tree damaged, and the salvage read a record that lay there as zeros and copied it as a
    record, to be published to every consumer as NUL bytes. It is skipped and said now."""
    from tests.edge.spooldamage import tear_page_holding

    path = tmp_path / "mqtt-outbox.db"
    ob = Outbox(path, 1000)
    for i in range(10):
        ob.put(json.dumps({"n": i, "pad": "x" * 300, "end": f"<end-{i}>"}).encode())
    ob.close()
    tear_page_holding(path, b"<end-5>")
    ob = open_outbox(path, 1000)
    try:
        got = [d for _, d in ob.peek(0, 100)]
    finally:
        ob.close()
    assert all(b"\0" not in d for d in got)
    assert [json.loads(d)["n"] for d in got] == [6, 7, 8, 9]
    (line,) = [r.getMessage() for r in caplog.records if "is damaged" in r.getMessage()]
    assert "4 record(s) and 0 late key(s) copied" in line and "1 unreadable record(s) skipped" in line, line


def test_the_oldest_salvaged_records_over_the_bound_are_dropped_and_said(tmp_path, caplog):
    path = tmp_path / "mqtt-outbox.db"
    damaged_outbox(path, count=900)
    ob = open_outbox(path, 100)
    assert len(ob) == 100 and numbers(ob)[-1] == 899
    ob.close()
    assert re.search(r"\d+ oldest dropped over sinks.mqtt_outbox_max", caplog.text)


_SALVAGE = "import sys; from edge.outbox_salvage import open_outbox; open_outbox(sys.argv[1], 100000).close()"
#: The salvage, killed with SIGKILL at its Nth rename (``os.replace``: the complete copy marked
#: done, the damaged file's WAL, its -shm and itself moved aside, the copy put in place)
_KILLED_AT_RENAME = """
import os, signal, sys
from edge.outbox_salvage import open_outbox
n, calls, real = int(sys.argv[2]), [0], os.replace
def replace(a, b):
    calls[0] += 1
    if calls[0] == n:
        os.kill(os.getpid(), signal.SIGKILL)
    real(a, b)
os.replace = replace
open_outbox(sys.argv[1], 100000).close()
"""


def test_a_salvage_killed_at_any_point_loses_nothing_at_the_next_start(tmp_path):
    """SIGKILL while the copy is written (by time), and at each of its renames (by count): the
    next start finds every record the damaged file could give, each once, and no copy left."""
    template = tmp_path / "template.db"
    damaged_outbox(template, count=6000, size=300)
    with sqlite3.connect(str(template)) as db:  # the damaged file's last records in its WAL, as in use
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA wal_autocheckpoint=0")
        db.execute("INSERT INTO records(data) VALUES (?)", (json.dumps({"n": 6000}).encode(),))
        db.commit()
        shutil.copy(template, tmp_path / "with-wal.db")
        shutil.copy(str(template) + "-wal", str(tmp_path / "with-wal.db") + "-wal")
    db.close()
    template = tmp_path / "with-wal.db"

    def fresh(folder: Path) -> Path:
        folder.mkdir()
        shutil.copy(template, folder / "o.db")
        shutil.copy(str(template) + "-wal", str(folder / "o.db") + "-wal")
        return folder / "o.db"

    ob = open_outbox(fresh(tmp_path / "reference"), 100_000)
    expected = numbers(ob)
    ob.close()
    assert expected[-1] == 6000  # the WAL's record was copied
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    start = time.monotonic()
    subprocess.run([sys.executable, "-c", _SALVAGE, str(tmp_path / "timed.db")], cwd=ROOT, env=env,
                   check=True)  # an empty outbox: the interpreter's start alone
    startup = time.monotonic() - start
    runs = [("time", d) for d in (0.8, 1.0, 1.2)] + [("rename", n) for n in range(1, 7)]
    for i, (kind, at) in enumerate(runs):
        path = fresh(tmp_path / f"run{i}")
        if kind == "time":
            proc = subprocess.Popen([sys.executable, "-c", _SALVAGE, str(path)], cwd=ROOT, env=env)
            time.sleep(startup * at)
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
        else:
            proc = subprocess.run([sys.executable, "-c", _KILLED_AT_RENAME, str(path), str(at)], cwd=ROOT, env=env)
            assert proc.returncode == (-signal.SIGKILL if at <= 5 else 0), (at, proc.returncode)
        ob = open_outbox(path, 100_000)
        assert numbers(ob) == expected, (kind, at)
        ob.close()
        assert sorted(p.name for p in path.parent.iterdir() if "salvage" in p.name) == [], (kind, at)


@pytest.mark.parametrize("make", ["random bytes", "another program's database", "another program's, damaged",
                                  "another program's records"])
def test_a_file_that_is_not_an_outbox_is_refused_and_left_alone(tmp_path, make):
    """Not ours to rename, nor to write into: the outbox's tables were added to another
    program's sound database, and its journal mode changed to WAL."""
    path = tmp_path / "mqtt-outbox.db"
    if make == "random bytes":
        path.write_bytes(os.urandom(8 * PAGE))
    else:
        with sqlite3.connect(str(path)) as db:
            if make.endswith("records"):  # a table of that name, not the outbox's columns
                db.execute("CREATE TABLE records (name TEXT, score REAL)")
            else:
                db.execute("CREATE TABLE photos (id INTEGER PRIMARY KEY, jpeg BLOB)")
                db.executemany("INSERT INTO photos(jpeg) VALUES (?)", [(os.urandom(3000),) for _ in range(60)])
        db.close()
        if make.endswith("damaged"):
            with open(path, "r+b") as f:
                f.seek(PAGE * 20)
                f.write(os.urandom(PAGE))
    before = path.read_bytes()
    with pytest.raises(OutboxError, match="MQTT sink outbox") as err:
        open_outbox(path, 1000)
    assert "salvaged" not in str(err.value) and "aside" in str(err.value)
    if make.startswith("another program's") and not make.endswith("records"):
        assert "is another program's database (tables photos), not an outbox" in str(err.value)
    elif make == "another program's records":
        assert "is another program's database (tables records), not an outbox" in str(err.value)
    else:
        assert "is not a readable outbox (" in str(err.value) and "set sinks.mqtt_outbox" in str(err.value)
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["mqtt-outbox.db"]


def test_a_full_disk_refuses_the_salvage_naming_it_and_leaves_the_file_for_the_next_start(tmp_path, small_fs):
    fs = small_fs(4 * 1024 * 1024)
    path = fs.path / "mqtt-outbox.db"
    damaged_outbox(tmp_path / "made.db", count=900)  # made where its WAL has room
    shutil.copy(tmp_path / "made.db", path)
    before = path.read_bytes()
    filler = fs.path / "filler"
    st = os.statvfs(fs.path)
    filler.write_bytes(b"\0" * (st.f_bavail * st.f_frsize - 200 * 1024))  # less room than the copy needs
    with pytest.raises(OutboxError, match=r"is damaged .*, and it could not be salvaged \(.*full.*\): free space "
                                          r"there, or move the file aside"):
        open_outbox(path, 1000)
    assert path.read_bytes() == before and not (fs.path / ("mqtt-outbox.db" + COPY_SUFFIX)).exists()
    assert not list(fs.path.glob("*.damaged-*"))
    filler.unlink()
    ob = open_outbox(path, 1000)
    assert 800 <= len(ob) < 900
    ob.close()


def test_an_outbox_damaged_while_in_use_says_to_restart_and_the_restart_salvages_it(tmp_path, caplog):
    """Damage found while the daemon runs: each record the outbox refuses waits in memory, the
    sink's error says what to do (the start salvages), and that start does."""
    from edge.sinks import MqttSink, Sinks
    from edge.transports.mqtt import MqttConnection
    from tests.edge.helpers import frame_record

    path = tmp_path / "mqtt-outbox.db"
    ob = Outbox(path, 10_000)
    conn = MqttConnection("127.0.0.1", 1, client_id="cam-test")  # never started: the records stay in the outbox
    sink = MqttSink(conn, TOPIC, ob)
    sinks = Sinks([sink])
    try:
        for seq in range(300):
            assert sinks.write(frame_record("cam", seq))
        ob._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        root = ob._db.execute("SELECT rootpage FROM sqlite_master WHERE name = 'records'").fetchone()[0]
        with open(path, "r+b") as f:  # the records table's root page, as a bad block leaves it
            f.seek(PAGE * (root - 1))
            f.write(os.urandom(PAGE))
        other = sqlite3.connect(str(path))  # another connection's write: the sink's cache is read again
        other.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('touched', '1')")
        other.commit()
        other.close()
        with pytest.raises(OutboxDamaged, match=r"is damaged \(database disk image is malformed; restart the "
                                                 r"daemon: its start copies what the outbox still holds"):
            sink.write(frame_record("cam", 300), frame_record("cam", 300).to_json())
        assert len(sink.held) == 1  # the live record waits in memory
        assert not sinks.write(frame_record("cam", 301)) and sinks.failing == {"mqtt"}
    finally:
        sink.close()
    ob = open_outbox(path, 10_000)  # the table's root page is lost: none of its records can be read,
    try:                             # but the daemon starts, with the late keys, and says so
        assert len(ob) == 0
    finally:
        ob.close()
    assert re.search(r"0 record\(s\) and \d+ late key\(s\) copied; records with ids 1-30\d could not be read",
                     caplog.text), caplog.text
