"""The command dispatcher on an older Python than a group needs: a one-line refusal, not a
crash while importing the group (the cloud tier needs Python >= 3.10, a Jetson has 3.8)."""

from __future__ import annotations

import sys

import pytest

from edgewise import cli


def test_cloud_on_python38_is_refused_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(sys, "version_info", (3, 8, 18, "final", 0))
    monkeypatch.setattr(cli.platform, "python_version", lambda: "3.8.18")
    assert cli.main(["cloud", "worker", "--model", "m.onnx"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "edgewise: error: `edgewise cloud` needs Python >= 3.10 (this is 3.8.18)"
    assert "cloud" in cli.build_parser().format_help()  # still listed, with its help


@pytest.mark.skipif(sys.version_info < (3, 10), reason="the cloud tier needs Python >= 3.10")
def test_cloud_on_this_python_is_the_real_group(capsys):
    assert cli.main(["cloud"]) == 2  # the group's help, as for any group without a subcommand
    assert "worker" in capsys.readouterr().out


def test_output_into_a_closed_pipe_ends_quietly(tmp_path):
    """`edgewise edge check-policy FILE | head`: the reader went away; the command stops with
    the shell's status for it (141), not a BrokenPipeError traceback."""
    import os
    import subprocess
    from pathlib import Path

    policy = Path(__file__).resolve().parents[2] / "examples" / "policy.yaml"
    r, w = os.pipe()
    os.close(r)  # the reader is gone before the command writes
    try:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # buffered, as usual: the
        p = subprocess.run([sys.executable, "-m", "edgewise", "edge", "check-policy", str(policy)], stdout=w,
                           stderr=subprocess.PIPE, text=True, timeout=60, env=env)  # write comes at the flush
    finally:
        os.close(w)
    assert (p.returncode, p.stderr) == (141, "")


@pytest.mark.parametrize("unbuffered", ["", "1"])
@pytest.mark.parametrize("into", ["a full disk", "a closed pipe"])
def test_the_exit_status_survives_a_stderr_that_cannot_be_written(tmp_path, into, unbuffered):
    """Exit 2 means "the settings are wrong, a restart cannot fix it" (the unit's
    RestartPreventExitStatus=2). With stderr on a full disk (/dev/full) or a pipe whose reader
    is gone, the interpreter's last flush of stderr failed and turned every status into 120: a
    settings error was restarted, and a daemon whose files ended normally exited 120. With
    PYTHONUNBUFFERED (the images set it) the error line's print raised: exit 1."""
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    if unbuffered:
        env["PYTHONUNBUFFERED"] = unbuffered

    r, w = os.pipe()
    os.close(r)
    try:
        err = open(os.devnull if into == "a closed pipe" else "/dev/full", "w")
        with err:
            p = subprocess.run([sys.executable, "-m", "edgewise", "edge", "check-config", "--config",
                                str(tmp_path / "missing.yaml")], stdout=subprocess.DEVNULL, timeout=60,
                               stderr=w if into == "a closed pipe" else err, env=env)
    finally:
        os.close(w)
    assert p.returncode == 2


@pytest.mark.parametrize("argv, env, source", [
    (["--log-level", "debg"], {}, "--log-level: log level 'debg'"),
    ([], {"EDGEWISE_LOG_LEVEL": "debg"}, "EDGEWISE_LOG_LEVEL: log level 'debg'"),
    ([], {"EDGEWISE_LOG_FORMAT": "jsn"}, "EDGEWISE_LOG_FORMAT: log format 'jsn'"),
])
def test_a_bad_log_setting_names_the_flag_or_variable_it_came_from(monkeypatch, capsys, argv, env, source):
    # EDGEWISE_LOG_LEVEL=debg in /etc/default/edgewise-edge was refused as "log level 'debg'", naming no source
    for var in ("EDGEWISE_LOG_LEVEL", "EDGEWISE_LOG_FORMAT"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    with pytest.raises(SystemExit) as ei:
        cli.main([*argv, "edge"])
    assert ei.value.code == 2
    assert f"edgewise: error: {source}" in capsys.readouterr().err


def test_the_log_flags_win_over_the_variables(monkeypatch, capsys):
    monkeypatch.setenv("EDGEWISE_LOG_LEVEL", "bogus")
    monkeypatch.setenv("EDGEWISE_LOG_FORMAT", "bogus")
    assert cli.main(["--log-level", "info", "--log-format", "text", "edge"]) == 2  # the group's help
    assert "check-policy" in capsys.readouterr().out


def test_a_missing_opencv_is_one_line_naming_what_installs_it(tmp_path):
    """A Jetson without JetPack's OpenCV (``libopencv-python``; a rootfs flashed from the overlay
    without it): every command, ``edge run`` under systemd and postinst's ``edge check-config``
    included, ended in a 30-line traceback at ``import cv2`` with exit status 1, which the unit
    restarted every 3 s (found with a CPython 3.8 venv of the device's pins, no cv2). Now one
    line says what to install, with exit status 2 (the unit's RestartPreventExitStatus)."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    code = "import sys; sys.modules['cv2'] = None; from edgewise.cli import main; sys.exit(main(sys.argv[1:]))"
    for argv in (["edge", "check-config", "--config", str(root / "deploy/jetson/edge.yaml")], ["edge", "run"]):
        p = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120,
                           env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})
        assert p.returncode == 2 and p.stdout == "", (argv, p)
        lines = p.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("edgewise: error: OpenCV's Python module (cv2) is not "
                                                       "installed"), p.stderr
        assert "sudo apt-get install libopencv-python" in lines[0] and "python3-opencv" in lines[0]


def test_a_missing_paho_is_one_line_naming_the_extra(tmp_path, tiny_model):
    """paho-mqtt comes with the edge and cloud extras, not with ``pip install edgewise``. Without it,
    an edge configured for MQTT passed ``edge check-config`` ("ok") and then ``edge run`` ended in a
    ModuleNotFoundError traceback (exit 1, which the unit restarts), as did ``cloud gateway``, whose
    MQTT bridge is always imported. Now each says in one line what to install, with exit status 2."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    config = tmp_path / "edge.yaml"
    config.write_text(f"device_id: dev-1\nstreams: [{{id: cam, kind: synthetic, max_frames: 1}}]\n"
                      f"model: {{path: {tiny_model}}}\ncloud: {{mqtt: {{host: 127.0.0.1, port: 1}}}}\n"
                      f"spool: {{path: {tmp_path / 'spool.db'}}}\nsinks: {{jsonl: {tmp_path / 'd.jsonl'}}}\n"
                      "metrics: {port: -1}\n")
    code = "import sys; sys.modules['paho'] = None; from edgewise.cli import main; sys.exit(main(sys.argv[1:]))"
    runs = [(["edge", "check-config", "--config", str(config)], "edgewise[edge]"),
            (["edge", "run", "--config", str(config)], "edgewise[edge]")]
    if sys.version_info >= (3, 10):  # the cloud tier's Python
        runs.append((["cloud", "gateway", "--listen", "127.0.0.1:0", "--metrics-port", "-1"], "edgewise[cloud]"))
    for argv, extra in runs:
        p = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120,
                           env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})
        lines = [ln for ln in p.stderr.splitlines() if " INFO " not in ln]  # the daemon's start is logged
        assert p.returncode == 2 and len(lines) == 1, (argv, p.stderr)
        assert lines[0].startswith("edgewise: error: paho-mqtt is not installed, and MQTT needs it"), p.stderr
        assert f"'{extra}'" in lines[0], p.stderr


def test_output_a_locale_cannot_encode_is_escaped_not_a_crash(tmp_path):
    """Under a locale without UTF-8 (ISO-8859-1, or C with PYTHONUTF8=0) `edge check-policy`
    on a policy whose description held an em dash died printing it: a UnicodeEncodeError
    traceback, exit 1. The characters the locale cannot show are escaped now, as on stderr."""
    import os
    import subprocess
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "examples" / "policy.yaml").read_text(encoding="utf-8")
    policy = tmp_path / "policy.yaml"
    policy.write_text("# Einfahrt \u2014 Kamera 1\n" + text.replace("description: Full", "description: Gate \u2014 Full"),
                      encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LC_", "LANG", "PYTHONIOENCODING"))}
    env.update(LC_ALL="C", PYTHONUTF8="0")
    p = subprocess.run([sys.executable, "-m", "edgewise", "edge", "check-policy", str(policy)], capture_output=True,
                       timeout=60, env=env)
    assert p.returncode == 0, p.stderr.decode(errors="replace")[-600:]
    assert b"Gate \\u2014 Full" in p.stdout


def test_a_file_name_the_c_locale_reads_as_bytes_is_printed_as_its_bytes(tmp_path, tiny_model):
    """Under the C locale (ASCII, PYTHONUTF8=0) Python reads a file name's non-ASCII bytes as
    surrogates and stdout gives them back (surrogateescape): `edge model-info café.onnx`
    printed the name as it is on disk. The escaping of what the locale cannot encode (an em
    dash) replaced that: the name came out as `caf\\udcc3\\udca9.onnx`, a file that does not exist."""
    import os
    import shutil
    import subprocess

    model = os.path.join(os.fsencode(str(tmp_path)), b"caf\xc3\xa9.onnx")
    shutil.copyfile(tiny_model, model)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LC_", "LANG", "PYTHONIOENCODING"))}
    env.update(LC_ALL="C", PYTHONUTF8="0", PYTHONCOERCECLOCALE="0")
    p = subprocess.run([os.fsencode(sys.executable), b"-m", b"edgewise", b"edge", b"model-info", model],
                       capture_output=True, timeout=60, env=env)
    assert p.returncode == 0, p.stderr.decode(errors="replace")[-600:]
    assert model + b": YOLOv5 detector" in p.stdout, p.stdout[:300]


def test_ctrl_c_while_the_commands_load_ends_quietly_with_130():
    """A Ctrl-C in the first second, while the command modules load (several seconds on a
    Jetson), printed a 30-line traceback of the import it hit. A real SIGINT, sent by the
    process to itself as the parser is being built, now ends it with 130 and no traceback."""
    import subprocess

    code = ("import os, signal, sys\n"
            "import edgewise.cli as cli\n"
            "build = cli.build_parser\n"
            "def interrupted():\n"
            "    os.kill(os.getpid(), signal.SIGINT)\n"
            "    return build()\n"
            "cli.build_parser = interrupted\n"
            "sys.exit(cli.main(['synth', '--help']))\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 130, p.stderr
    assert "Traceback" not in p.stderr and p.stdout == ""


def _parsed(argv):
    """``argv`` parsed, or the test skipped where its command is not installed (the Jetson bundle
    has the edge's commands only: the lane runs this module under Python 3.8)."""
    import sys

    need = cli.MIN_PYTHON.get(argv[0])
    if need is not None and sys.version_info[:2] < need:  # a stand-in that only says so
        pytest.skip(f"`edgewise {argv[0]}` needs Python >= {need[0]}.{need[1]}")
    try:
        return cli.build_parser().parse_args(argv)
    except SystemExit:
        pytest.skip(f"`edgewise {' '.join(argv)}` is not installed here")


@pytest.mark.parametrize("argv", [["edge", "run"], ["cloud", "gateway"], ["cloud", "worker"], ["cloud", "autoscaler"],
                                  ["cloud", "up", "--model", "m.onnx"], ["edge", "engine"],
                                  ["model", "engine", "m.onnx"]])
def test_services_and_engine_builds_keep_sigterm_as_they_find_it(argv, monkeypatch):
    """The services stop on their own SIGTERM handler (drain, exit 0, as systemd and Kubernetes
    expect); a TensorRT build spends minutes in one C call, which a Python handler would wait
    out. The dispatcher installs its Ctrl-C-like SIGTERM handler for the other commands only."""
    import signal

    args = _parsed(argv)
    seen = []
    monkeypatch.setattr(args, "func", lambda _a: seen.append(signal.getsignal(signal.SIGTERM)) or 0)
    assert cli._run(cli.build_parser(), args) == 0
    assert seen == [signal.SIG_DFL]


def test_a_tool_gets_sigterm_as_ctrl_c_and_gives_it_back():
    import signal

    args = _parsed(["synth", "--out", "x"])
    seen = []
    args.func = lambda _a: seen.append(signal.getsignal(signal.SIGTERM)) or 0
    assert cli._run(cli.build_parser(), args) == 0
    assert seen == [cli._terminate] and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
