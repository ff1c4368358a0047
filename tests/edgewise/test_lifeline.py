"""A child given a lifeline ends when the process that started it is gone (edgewise.lifeline):
real processes, the middle one killed with SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from edgewise import lifeline
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]

CHILD = textwrap.dedent("""
    import os, signal, sys, time
    from edgewise import lifeline
    def stop(*_):
        open(sys.argv[1], "w").write("SIGTERM " + str(os.environ.get(lifeline.ENV)))
        sys.exit(0)
    signal.signal(signal.SIGTERM, stop)
    assert lifeline.watch()
    print("watching", flush=True)
    time.sleep(60)
""")

MIDDLE = textwrap.dedent("""
    import subprocess, sys, time
    from edgewise.lifeline import Lifeline
    life = Lifeline()
    child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], env=life.child_env({**__import__("os").environ}),
                             pass_fds=(life.read_fd,), start_new_session=True, stdout=subprocess.PIPE, text=True)
    print(child.pid, child.stdout.readline().strip(), flush=True)
    time.sleep(60)
""")


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_a_child_ends_with_sigterm_when_its_parent_is_killed(tmp_path: Path) -> None:
    said = tmp_path / "said"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    middle = subprocess.Popen([sys.executable, "-c", MIDDLE, CHILD, str(said)], stdout=subprocess.PIPE, text=True,
                              env=env)
    try:
        assert middle.stdout is not None
        pid_text, state = middle.stdout.readline().split()
        child = int(pid_text)
        assert state == "watching" and _alive(child)
        middle.send_signal(signal.SIGKILL)
        middle.wait(10)
        wait_until(lambda: not _alive(child), 15, "the child ended with its parent")
        # its own SIGTERM handler ran (a service drains), and the variable was not left for its children
        assert said.read_text() == "SIGTERM None"
    finally:
        if middle.poll() is None:
            middle.kill()
            middle.wait()
        if middle.stdout is not None:
            middle.stdout.close()


def test_nothing_is_watched_without_an_open_pipe(caplog) -> None:
    assert not lifeline.watch({})
    assert not lifeline.watch({lifeline.ENV: "x"})
    env = {lifeline.ENV: "999999"}  # no such descriptor
    assert not lifeline.watch(env)
    assert lifeline.ENV not in env
    assert "names no open pipe: this process will not end with its parent" in caplog.text
