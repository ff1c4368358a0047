"""``edgewise demo`` refuses a frame rate that is not a finite number above 0, and a report folder
it could not write its report into, before it starts anything."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from edgewise.cli import main


@pytest.mark.parametrize("fps", ["nan", "inf", "-inf", "0", "-1", "1e309", "abc"])
def test_fps_must_be_a_finite_number_above_zero(fps: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["demo", f"--fps={fps}"])
    assert exc.value.code == 2
    assert "argument --fps: must be a" in capsys.readouterr().err


@pytest.mark.parametrize("frames", ["0", "9", "-5"])
def test_too_few_frames_are_refused_not_taken_for_the_default(
        frames: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """``--frames 0`` ran the world's 150 frames in silence, while the demo's own rule says >= 10."""
    import edgewise_tools.demo

    def started(*_args: Any, **_kw: Any) -> Any:
        raise AssertionError("the demo started")

    monkeypatch.setattr(edgewise_tools.demo, "run_demo", started)
    assert main(["demo", "--frames", frames, "--out", str(tmp_path)]) == 2
    assert f"--frames {frames}: must be >= 10" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["index.html", "summary.json"])
def test_a_report_file_that_cannot_be_written_is_refused_before_anything_starts(
        name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A folder where the demo writes its report was found only after the whole run."""
    import edgewise_tools.demo

    def started(*_args: Any, **_kw: Any) -> Any:
        raise AssertionError("the demo started")

    monkeypatch.setattr(edgewise_tools.demo, "run_demo", started)
    (tmp_path / name).mkdir()
    assert main(["demo", "--short", "--out", str(tmp_path)]) == 2
    assert (f"edgewise: error: --out {tmp_path}: {tmp_path / name} is a folder, where this command writes its "
            f"{name}; move it away or choose another folder") in capsys.readouterr().err


def _children(pid: int) -> list:
    """The processes whose parent is ``pid`` (from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP"])
@pytest.mark.timeout(240)
def test_sigterm_or_sighup_stops_the_cloud_it_started_and_removes_its_work_dir(
        sig: str, tmp_path: Path, tiny_model: Path, small_model: Path) -> None:
    """SIGTERM (`timeout`, a CI cancel) or SIGHUP (a closed terminal) ended the demo at once: its
    gateway and workers ran on, orphaned, and its work dir (tens of MB) stayed in /tmp."""
    import os
    import re
    import shutil
    import signal
    import subprocess
    import sys
    import time

    from tests.processes import DEFAULT_HUP, ROOT

    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([*DEFAULT_HUP, sys.executable, "-m", "edgewise.cli", "demo", "--edge-model", str(tiny_model),
                             "--cloud-model", str(small_model), "--frames", "10", "--streams", "1", "--workers", "1",
                             "--out", str(tmp_path / "report")], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env=env, text=True)
    assert proc.stdout is not None
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("cloud up:"):  # the gateway and the worker run
                break
        work = Path(re.search(r"\(work dir (\S+)\)", "".join(lines)).group(1))  # type: ignore[union-attr]
        started = _children(proc.pid)
        assert len(started) >= 2, lines  # the worker and the gateway
        proc.send_signal(getattr(signal, sig))
        rest = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    deadline = time.monotonic() + 30
    while any(Path(f"/proc/{pid}").exists() for pid in started) and time.monotonic() < deadline:
        time.sleep(0.2)
    alive = [pid for pid in started if Path(f"/proc/{pid}").exists()]
    for pid in alive:  # cleaned up before the asserts, which would leave them running
        os.kill(pid, signal.SIGKILL)
    left = work.exists()
    shutil.rmtree(work, ignore_errors=True)
    assert proc.returncode == 130, "".join(lines) + rest
    assert "Traceback" not in rest, rest
    assert not alive, "processes of the demo outlived it"
    assert not left, "the demo's work dir was left behind"


def test_a_second_stop_signal_does_not_cut_the_clean_up_short() -> None:
    """The first SIGTERM or SIGHUP stops the demo as Ctrl-C does; a second one (a cancel sent
    twice) raised again inside the clean-up that stops the gateway and workers, and could leave
    them running. Later ones are ignored until the command puts its handlers back."""
    import os
    import signal

    from edgewise_tools.cli import demo as D

    previous = {sig: signal.getsignal(sig) for sig in D._STOPPING}
    try:
        for sig in D._STOPPING:
            signal.signal(sig, D._interrupt)
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)  # Python runs the handler before the next line
        os.kill(os.getpid(), signal.SIGTERM)  # during the clean-up: nothing raised
        os.kill(os.getpid(), signal.SIGHUP)
        assert all(signal.getsignal(sig) == signal.SIG_IGN for sig in D._STOPPING)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
