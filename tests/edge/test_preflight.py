"""What the daemon settles before it starts: device id, writable state folders, the backend,
and ``edgewise edge check-config`` saying each problem in one line."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from edge import preflight as P
from edge.settings import load_settings
from edgewise.errors import ConfigError, DeploymentError
from tests.edge.helpers import settings_yaml

ROOT = Path(__file__).resolve().parents[2]


def _settings(tmp_path: Path, **tree):
    base = dict(streams=[{"id": "s", "kind": "synthetic"}], spool={"path": str(tmp_path / "st" / "spool.db")},
                metrics={"port": -1})
    base.update(tree)
    return load_settings(str(settings_yaml(tmp_path / "edge.yaml", **base)), env={})


def test_serial_number_as_the_device_tree_writes_it(tmp_path: Path) -> None:
    serial = tmp_path / "serial-number"
    serial.write_bytes(b"1422019012345\x00")
    assert P.read_serial(str(serial)) == "1422019012345"
    s = _settings(tmp_path)
    assert P.resolve_device_id(s, str(serial), hostname="nx-lab") == "1422019012345" == s.device_id


def test_host_name_when_not_a_jetson_and_a_set_id_wins(tmp_path: Path) -> None:
    s = _settings(tmp_path)
    assert P.resolve_device_id(s, str(tmp_path / "absent"), hostname="cam-host-7") == "cam-host-7"
    s = _settings(tmp_path, device_id="gate-3")
    assert P.resolve_device_id(s, str(tmp_path / "absent"), hostname="x") == "gate-3"


@pytest.mark.parametrize("content, needle", [(None, "does not exist: not a Jetson"), (b"\x00", "is empty")])
def test_no_usable_id_is_one_line_naming_the_file_and_setting(tmp_path: Path, content, needle) -> None:
    serial = tmp_path / "serial-number"
    if content is not None:
        serial.write_bytes(content)
    with pytest.raises(ConfigError) as exc:
        P.resolve_device_id(_settings(tmp_path), str(serial), hostname="localhost")
    msg = str(exc.value)
    assert "\n" not in msg and str(serial) in msg and needle in msg and "set device_id" in msg
    with pytest.raises(DeploymentError, match=needle):
        P.read_serial(str(serial))


def test_a_host_name_that_is_no_topic_level_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="device_id: the default from the host name cannot be used"):
        P.resolve_device_id(_settings(tmp_path), str(tmp_path / "absent"), hostname="a+b")


def test_state_folders_are_created_and_a_file_in_the_way_is_named(tmp_path: Path) -> None:
    s = _settings(tmp_path, sinks={"jsonl": str(tmp_path / "out" / "d.jsonl")})
    P.check_state_dirs(s)
    assert (tmp_path / "st").is_dir() and (tmp_path / "out").is_dir()
    (tmp_path / "blocker").write_text("")
    s = _settings(tmp_path, sinks={"jsonl": str(tmp_path / "blocker" / "sub" / "d.jsonl")})
    for create in (True, False):
        with pytest.raises(DeploymentError) as exc:
            P.check_state_dirs(s, create=create)
        assert str(exc.value).startswith(f"sinks.jsonl {tmp_path}/blocker/sub/d.jsonl: the folder ")
        assert "\n" not in str(exc.value)


def test_the_mqtt_outbox_is_a_state_file_where_the_daemon_puts_it(tmp_path: Path) -> None:
    broker = {"mqtt": {"host": "broker.plant.lan"}}
    s = _settings(tmp_path, sinks={"mqtt": True}, cloud=broker)
    assert ("sinks.mqtt_outbox", str(tmp_path / "st" / "mqtt-outbox.db")) in P.state_files(s)
    (tmp_path / "blocker").write_text("")
    s = _settings(tmp_path, sinks={"mqtt": True, "mqtt_outbox": str(tmp_path / "blocker" / "o.db")}, cloud=broker)
    with pytest.raises(DeploymentError, match=r"^sinks.mqtt_outbox .*/blocker/o.db: the folder "):
        P.check_state_dirs(s)


def _error_as_unprivileged_user(fn) -> str:
    """``fn()``'s error message, run by an unprivileged user: a forked child that drops to
    nobody when the tests run as root (root may write anywhere), else this process."""
    if os.geteuid() != 0:
        try:
            fn()
        except DeploymentError as exc:
            return str(exc)
        return ""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(r)
        msg = ""
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            fn()
        except DeploymentError as exc:
            msg = str(exc)
        except BaseException as exc:
            msg = f"unexpected {exc!r}"
        os.write(w, msg.encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        out = f.read().decode()
    os.waitpid(pid, 0)
    return out


def test_unwritable_state_folder_is_one_line_naming_the_setting(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(0o555)
    tmp_path.chmod(0o755)
    s = _settings(tmp_path, device_id="d1", spool={"path": str(state / "spool.db")})
    for create in (True, False):
        msg = _error_as_unprivileged_user(lambda: P.check_state_dirs(s, create=create))
        assert msg.startswith(f"spool.path {state}/spool.db: the folder {state} cannot be written by uid "), msg
        assert "\n" not in msg and msg.endswith("or set spool.path")


def test_a_state_folder_another_user_could_fill_with_links_is_refused(tmp_path: Path) -> None:
    """A folder made in advance by another user (``/tmp/edgewise-dev``), or one every user may
    write, let that user plant links at the daemon's file names: its lock, start count and
    records were written through them into other files (found by a probe)."""
    state = tmp_path / "state"
    state.mkdir()
    s = _settings(tmp_path, device_id="d1", spool={"path": str(state / "spool.db")})
    P.check_state_dirs(s)  # this user's own folder
    state.chmod(0o777)
    with pytest.raises(DeploymentError, match=r"may be written by every user \(mode 0777, no sticky bit\): another "
                                              r"user could replace the daemon's files there with links"):
        P.check_state_dirs(s)
    state.chmod(0o1777)  # /tmp's mode: the kernel follows no other user's link there (protected_symlinks)
    P.check_state_dirs(s)
    state.chmod(0o755)
    if os.geteuid() == 0:
        os.chown(state, 65534, 65534)
        with pytest.raises(DeploymentError, match=r"belongs to uid 65534, not to the daemon's user \(uid 0\) or root"):
            P.check_state_dirs(s, create=False)


def test_check_config_ok_and_placeholder(tmp_path: Path, tiny_model: Path, capsys) -> None:
    from edgewise.cli import main

    cfg = settings_yaml(tmp_path / "edge.yaml", device_id="d1", streams=[{"id": "s", "kind": "synthetic"}],
                        model={"path": str(tiny_model), "backend": "onnxruntime"},
                        cloud={"endpoints": ["10.1.2.3:50051"]},
                        spool={"path": str(tmp_path / "spool.db")}, metrics={"port": -1})
    assert main(["edge", "check-config", "--config", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert "ok: device id d1" in out and "on onnxruntime" in out and "cloud 10.1.2.3:50051" in out
    assert main(["edge", "check-config", "--config", str(cfg), "--set", "cloud.endpoints.0=gw.example.com:1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--set cloud.endpoints.0: 'gw.example.com:1' is a placeholder" in err


def test_check_config_runs_one_frame_through_the_model(tmp_path: Path, capsys) -> None:
    """A model whose metadata and graph are valid but whose output every runtime refuses
    (logits here) said `ok` and the daemon then exited at its first frame."""
    from edgewise.cli import main
    from tests.edgewise.runtime.test_own_models import N3, P5_ROWS, const_model, head

    logits = head(P5_ROWS, 8)
    logits[..., 4:] = -6.0  # an export without the Detect layer's sigmoid
    model = const_model(tmp_path / "logits.onnx", logits, meta={"names": N3})
    cfg = settings_yaml(tmp_path / "edge.yaml", device_id="d1", streams=[{"id": "s", "kind": "synthetic"}],
                        model={"path": str(model), "backend": "onnxruntime"},
                        spool={"path": str(tmp_path / "spool.db")}, metrics={"port": -1})
    assert main(["edge", "check-config", "--config", str(cfg)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"edgewise: error: {model}: first inference: objectness/class scores range over")


def test_check_config_warns_of_policy_classes_the_model_does_not_have(tmp_path: Path, tiny_model: Path,
                                                                      capsys) -> None:
    """The daemon warned at its start that a `person` override never applies to a digit model;
    `check-config` said `ok` alone. It now prints the same line (and still passes)."""
    from edgewise.cli import main

    policy = tmp_path / "policy.yaml"
    policy.write_text("apiVersion: edgewise/v1\nkind: EscalationPolicy\nmetadata: {name: p}\n"
                      "spec: {classes: {person: {threshold: 0.3}}, streams: {S: {mode: never}, s: {mode: auto}}}\n")
    cfg = settings_yaml(tmp_path / "edge.yaml", device_id="d1", streams=[{"id": "s", "kind": "synthetic"}],
                        model={"path": str(tiny_model), "backend": "onnxruntime"}, policy_file=str(policy),
                        spool={"path": str(tmp_path / "spool.db")}, metrics={"port": -1})
    assert main(["edge", "check-config", "--config", str(cfg)]) == 0
    out, err = capsys.readouterr()
    assert "ok:" in out
    assert f"warning: policy {policy}: spec.classes person are not classes of {tiny_model}" in err
    # a misspelt stream id: its `mode: never` (a private area) applied to no stream, silently
    assert f"warning: policy {policy}: spec.streams S are not streams of this device (s): those overrides apply " \
           "to no stream here" in err


@pytest.mark.parametrize("max_batch", [1, 4])
def test_check_config_and_the_daemon_run_the_largest_batch_through_the_model(tmp_path: Path, capsys,
                                                                             max_batch) -> None:
    """A batch dynamic in name only: refused by `check-config` and by the daemon's start at the
    `model.max_batch` the pipeline forms; served as it is with `model.max_batch: 1`."""
    from edge.daemon import EdgeDaemon
    from edgewise.cli import main
    from edgewise.errors import ModelError
    from tests.edgewise.runtime.test_own_models import batch_of_one_only

    model = batch_of_one_only(tmp_path / "b1.onnx")
    cfg = settings_yaml(tmp_path / "edge.yaml", device_id="d1", streams=[{"id": "s", "kind": "synthetic"}],
                        model={"path": str(model), "backend": "onnxruntime", "max_batch": max_batch},
                        spool={"path": str(tmp_path / "spool.db")}, metrics={"port": -1})
    said = f"{model}: one frame runs but a batch of 4 fails ("
    daemon = EdgeDaemon(load_settings(cfg))
    if max_batch == 1:
        assert main(["edge", "check-config", "--config", str(cfg)]) == 0
        daemon._load_detector().close()
        return
    assert main(["edge", "check-config", "--config", str(cfg)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"edgewise: error: {said}") and line.endswith("or set model.max_batch to 1")
    with pytest.raises(ModelError, match=re.escape(said)):
        daemon._load_detector()


@pytest.mark.parametrize("transport, cloud, says", [
    ("mqtt", {"endpoints": ["10.1.2.3:50051"]}, "spec.transport is 'mqtt', but this device's settings configure only "
                                                "grpc: set cloud.mqtt.host"),
    ("grpc", {"mqtt": {"host": "10.1.2.4"}}, "spec.transport is 'grpc', but this device's settings configure only "
                                             "mqtt: set cloud.endpoints"),
    ("mqtt", {}, None),  # no cloud at all: an edge-only device, nothing is escalated
])
def test_check_config_refuses_a_policy_whose_transport_is_not_configured(tmp_path: Path, tiny_model: Path, capsys,
                                                                         transport, cloud, says) -> None:
    """Accepted before, and every escalation was then spooled as 'not configured', for good."""
    from edgewise.cli import main

    policy = tmp_path / "policy.yaml"
    policy.write_text("apiVersion: edgewise/v1\nkind: EscalationPolicy\nmetadata: {name: p}\n"
                      f"spec: {{transport: {transport}}}\n")
    cfg = settings_yaml(tmp_path / "edge.yaml", device_id="d1", streams=[{"id": "s", "kind": "synthetic"}],
                        model={"path": str(tiny_model), "backend": "onnxruntime"}, cloud=cloud,
                        policy_file=str(policy), spool={"path": str(tmp_path / "spool.db")}, metrics={"port": -1})
    rc = main(["edge", "check-config", "--config", str(cfg)])
    err = capsys.readouterr().err
    assert (rc, says is None or says in err) == ((0, True) if says is None else (2, True)), err


def test_backend_checks(monkeypatch, tmp_path: Path) -> None:
    from edgewise.runtime import detector
    from edgewise.runtime.backends import onnxruntime as ortb

    s = _settings(tmp_path, model={"backend": "auto"})
    monkeypatch.setattr(detector, "tensorrt_unusable_reason", lambda: "the tensorrt module is not installed")
    assert P.check_backend(s) == "onnxruntime"

    def missing():
        raise DeploymentError(ortb.ONNXRUNTIME_MISSING)

    monkeypatch.setattr(ortb, "import_onnxruntime", missing)
    with pytest.raises(DeploymentError, match=r"^model.backend auto: TensorRT is not usable here \(the tensorrt "
                                              r"module is not installed\) and the onnxruntime backend needs"):
        P.check_backend(s)
    s.model.backend = "onnxruntime"
    with pytest.raises(DeploymentError, match="pip install onnxruntime"):
        P.check_backend(s)
    s.model.backend = "tensorrt"
    with pytest.raises(DeploymentError, match="TensorRT's Python bindings"):
        P.check_backend(s)


def test_a_state_file_that_is_a_folder_is_named_with_a_file_to_use(tmp_path: Path) -> None:
    (tmp_path / "out.jsonl").mkdir()
    s = _settings(tmp_path, sinks={"jsonl": str(tmp_path / "out.jsonl")})
    with pytest.raises(ConfigError, match=rf"^sinks.jsonl {tmp_path}/out.jsonl is a folder; set sinks.jsonl to a "
                                          rf"file in it, e.g. {tmp_path}/out.jsonl/detections.jsonl$"):
        P.check_state_dirs(s)


def test_local_sources_that_cannot_open_are_named_by_check_config(tmp_path: Path, tiny_model: Path, capsys) -> None:
    from edgewise.cli import main

    (tmp_path / "empty").mkdir()
    (tmp_path / "zero.mp4").write_bytes(b"")
    os.mkfifo(tmp_path / "pipe.mp4")
    (tmp_path / "loop.mp4").symlink_to(tmp_path / "loop.mp4")
    cases = [({"kind": "file", "uri": str(tmp_path / "pipe.mp4")}, "video file .*pipe.mp4 is not a regular file"),
             ({"kind": "file", "uri": str(tmp_path / "loop.mp4")}, "video file .*loop.mp4 is a symbolic link to "
                                                                  "nothing"),
             ({"kind": "folder", "uri": str(tmp_path / "missing")}, "image folder .*missing does not exist"),
             ({"kind": "folder", "uri": str(tmp_path / "empty")}, "image folder .*empty has no images"),
             ({"kind": "file", "uri": str(tmp_path / "missing.mp4")}, "video file .*missing.mp4 does not exist"),
             ({"kind": "file", "uri": str(tmp_path / "empty")}, "video file .*empty is a folder"),
             ({"kind": "file", "uri": str(tmp_path / "zero.mp4")}, "video file .*zero.mp4 is empty")]
    for stream, needle in cases:
        cfg = settings_yaml(tmp_path / "edge.yaml", device_id="d1", streams=[{"id": "cam", **stream}],
                            model={"path": str(tiny_model), "backend": "onnxruntime"},
                            spool={"path": str(tmp_path / "spool.db")}, metrics={"port": -1})
        assert main(["edge", "check-config", "--config", str(cfg)]) == 2
        err = capsys.readouterr().err.strip()
        assert re.search(r"^edgewise: error: streams\[0\] \(cam\)\.uri: " + needle, err), err


def test_check_config_says_what_the_daemon_would_refuse_in_its_files_and_metrics_host(
        tmp_path: Path, tiny_model: Path, capsys) -> None:
    """check-config said "ok" where `edge run` then exited 2 (found by a probe): a spool or an
    MQTT outbox that is not a database, a spool that is another program's database, a metrics
    host that is not this machine's. A damaged spool of ours, an empty file and an empty
    database pass: the daemon salvages or fills them."""
    import sqlite3

    from edge.spool import Spool
    from edgewise.cli import main
    from tests.edge.spooldamage import damage_index

    spool, outbox = tmp_path / "spool.db", tmp_path / "outbox.db"
    policy = tmp_path / "policy.yaml"
    policy.write_text("apiVersion: edgewise/v1\nkind: EscalationPolicy\nmetadata: {name: p}\nspec: {}\n")
    cfg = settings_yaml(tmp_path / "edge.yaml", device_id="d1", streams=[{"id": "s", "kind": "synthetic"}],
                        model={"path": str(tiny_model), "backend": "onnxruntime"}, policy_file=str(policy),
                        cloud={"endpoints": ["10.1.2.3:50051"], "mqtt": {"host": "10.1.2.4"}},
                        sinks={"mqtt": True, "mqtt_outbox": str(outbox)},
                        spool={"path": str(spool)}, metrics={"port": 9464, "host": "127.0.0.1"})

    def check(*sets: str) -> str:
        args = ["edge", "check-config", "--config", str(cfg)]
        for s in sets:
            args += ["--set", s]
        rc = main(args)
        err = capsys.readouterr().err.strip()
        return "ok" if rc == 0 else err

    for empty in (spool, outbox):
        empty.write_bytes(b"")
    assert check() == "ok"
    spool.write_bytes(b"garbage")
    assert f"spool.path {spool} is not a database (file is not a database); the daemon refuses it" in check()
    assert check("policy_file=") == "ok"  # without a policy the daemon never opens the spool
    spool.unlink()
    with sqlite3.connect(str(spool)) as db:
        db.execute("CREATE TABLE photos (id INTEGER)")
    assert f"spool.path {spool} is another program's database (tables photos), not a spool" in check()
    spool.unlink()
    with Spool(spool, max_bytes=1 << 20, max_age_s=3600) as sp:
        for i in range(30):
            sp.put(f"d1/s/{i}", b"x" * 200, {})
    damage_index(spool)
    assert check() == "ok"  # ours, damaged: salvaged at the start, not refused
    outbox.write_bytes(b"garbage")
    assert f"sinks.mqtt_outbox {outbox} is not a database" in check()
    outbox.unlink()
    with sqlite3.connect(str(outbox)) as db:  # the daemon wrote its tables into it; now it refuses it
        db.execute("CREATE TABLE photos (id INTEGER)")
    db.close()
    assert f"sinks.mqtt_outbox {outbox} is another program's database (tables photos), not an MQTT sink outbox" \
        in check()
    outbox.unlink()
    from tests.edge.test_outbox_salvage import damaged_outbox
    damaged_outbox(outbox, count=300)
    assert check() == "ok"  # ours, damaged: salvaged at the start, not refused
    outbox.unlink()
    # root may write any file by its mode; the kernel still refuses to append to /proc/version,
    # and the daemon's sink exits 2 on it: check-config opens the file the same way
    if os.geteuid() == 0:  # (another user is refused by the file's mode first)
        assert "sinks.jsonl /proc/version: cannot open it for appending" in check("sinks.jsonl=/proc/version")
    os.mkfifo(tmp_path / "records")  # the daemon's start waited on it; check-config said ok
    assert "is a named pipe (FIFO), not a file" in check(f"sinks.jsonl={tmp_path / 'records'}")
    assert "metrics.host '192.0.2.1' cannot be bound on this machine" in check("metrics.host=192.0.2.1")
    # an IPv6 host is bound as the daemon's HTTP server binds it (IPv6), and judged the same way
    assert check("metrics.host=::1") == "ok"
    assert "metrics.host '2001:db8::1' cannot be bound on this machine" in check("metrics.host=2001:db8::1")
