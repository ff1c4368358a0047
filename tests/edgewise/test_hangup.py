"""SIGHUP while a command starts (edgewise/hangup.py), in real child processes with real
signals: a daemon notes it and reloads once running; every other command gets the default
back, and a SIGHUP noted meanwhile then ends it as it would have."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

from tests.processes import DEFAULT_HUP, ROOT


def _python(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*DEFAULT_HUP, sys.executable, "-c", textwrap.dedent(script), *args], capture_output=True,
                          text=True, timeout=120, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))


def test_a_sighup_noted_while_held_ends_a_process_at_release_as_the_default_would():
    p = _python("""
        import os, signal
        from edgewise import hangup
        hangup.hold()
        os.kill(os.getpid(), signal.SIGHUP)
        print("survived the hold", flush=True)
        hangup.release()
        print("survived the release", flush=True)
    """)
    assert p.returncode == -signal.SIGHUP, p
    assert p.stdout.splitlines() == ["survived the hold"]


def test_release_keeps_an_ignored_sighup_ignored_and_take_hands_it_to_the_daemon():
    p = _python("""
        import os, signal
        from edgewise import hangup
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # nohup, or the Jetson wrapper's trap
        hangup.hold()
        os.kill(os.getpid(), signal.SIGHUP)
        hangup.release()
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        hangup.hold()
        assert not hangup.take()
        hangup.hold()
        os.kill(os.getpid(), signal.SIGHUP)
        def reload(*_):
            print("the daemon's own handler", flush=True)
        signal.signal(signal.SIGHUP, reload)  # as the daemon's loop installs its own
        print("taken", hangup.take(), hangup.take(), flush=True)
        hangup.release()  # a daemon took it over: nothing to give back
        os.kill(os.getpid(), signal.SIGHUP)
        hangup.hold()
        print("taken", hangup.take(), flush=True)  # no handler of its own: the old disposition back
        print("previous back", signal.getsignal(signal.SIGHUP) is reload, flush=True)
    """)
    assert p.returncode == 0, p
    assert p.stdout.splitlines() == ["taken True False", "the daemon's own handler", "taken False",
                                     "previous back True"]


def test_a_daemon_that_fails_to_start_after_a_noted_sighup_exits_with_its_error_not_the_signal(tmp_path):
    """A reload asked for while `edge run` started, then a settings error: exit 2 with the
    error (systemd's RestartPreventExitStatus=2 holds), not death by SIGHUP."""
    p = _python("""
        import os, signal, sys
        from edgewise import hangup
        from edgewise.cli import main
        hangup.hold()
        os.kill(os.getpid(), signal.SIGHUP)
        print("exit", main(["edge", "run", "--config", sys.argv[1]]), flush=True)
    """, str(tmp_path / "missing.yaml"))
    assert p.returncode == 0 and p.stdout.splitlines() == ["exit 2"], p
    assert "missing.yaml" in p.stderr


def test_the_dispatcher_holds_sighup_while_commands_load_and_releases_it_for_a_one_shot_command(tmp_path):
    """Held while the command modules import (seconds on a Jetson), given back before a
    command that does not reload on SIGHUP runs; kept for `edge run` until the daemon takes it."""
    p = _python("""
        import argparse, signal, sys
        from edgewise import cli
        seen = []
        build = cli.build_parser
        def recording_build():
            seen.append(("loading", signal.getsignal(signal.SIGHUP)))
            return build()
        cli.build_parser = recording_build
        parse = argparse.ArgumentParser.parse_args
        def recording_parse(self, *a, **k):
            args = parse(self, *a, **k)
            func = args.func
            def run(ns):
                seen.append((ns.func_name, signal.getsignal(signal.SIGHUP)))
                return 0
            args.func_name, args.func = getattr(func, "__name__", "?"), run
            return args
        argparse.ArgumentParser.parse_args = recording_parse
        cli.main(["edge", "check-config", "--config", sys.argv[1]])
        cli.main(["edge", "run", "--config", sys.argv[1]])
        for what, handler in seen:
            print(what, "default" if handler is signal.SIG_DFL else handler.__name__)
    """, str(tmp_path / "edge.yaml"))
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == ["loading _note", "_check_config default",
                                     "loading _note", "_run _note"]


def test_ignore_from_now_never_gives_sighup_its_default_on_the_way(monkeypatch):
    """A daemon's stop ends with SIGHUP ignored. asyncio's ``remove_signal_handler`` sets SIG_DFL
    before the SIG_IGN that followed it, and a SIGHUP in between ended a finished stop killed by
    it: 1 of 20 real daemon stops under a SIGHUP every 2 ms (a CI run of
    test_sighups_while_the_daemon_stops_never_end_it_killed_by_the_signal). Every disposition
    SIGHUP takes is recorded here: never the default, ignored at the end, and the loop's close
    leaves it ignored."""
    import asyncio

    from edgewise import hangup

    before = signal.getsignal(signal.SIGHUP)
    set_to = []
    real = signal.signal

    def recording(sig, handler):
        if sig == signal.SIGHUP:
            set_to.append(handler)
        return real(sig, handler)

    loop = asyncio.new_event_loop()
    try:
        loop.add_signal_handler(signal.SIGHUP, lambda: None)
        monkeypatch.setattr(signal, "signal", recording)
        hangup.ignore_from_now(loop)
        loop.close()
        assert signal.SIG_DFL not in set_to, set_to
        assert real(signal.SIGHUP, before) == signal.SIG_IGN
        # the last handler gone, the loop's wake-up socket (closed with it) is no signal's to write
        # to: "Exception ignored when trying to write to the signal wakeup fd" in a later test
        assert signal.set_wakeup_fd(-1) == -1
    finally:
        if not loop.is_closed():
            loop.close()
        real(signal.SIGHUP, before)
        signal.set_wakeup_fd(-1)  # never a closed loop's socket left for a later test's signals

