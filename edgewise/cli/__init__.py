"""The ``edgewise`` command line: one entry point, subcommands owned by their packages.

Each command group lives next to the code it drives and exposes
``register(subparsers)``, which adds its subcommands with
``set_defaults(func=handler)``; ``handler(args) -> int`` is the exit status. A
daemon that reloads on SIGHUP also sets ``reloads_on_sighup=True`` and calls
``edgewise.hangup.take()`` once its own handler is in place: a SIGHUP that comes while
it starts is then a reload, not its end (``edgewise/hangup.py``). For a command, SIGTERM
(``timeout``, a job's cancel, ``kill``) is what Ctrl-C is (:class:`Terminated`, a
KeyboardInterrupt): its clean-up runs (temporary files, the marker of an incomplete dataset,
its one-line message) and it exits 143, as Ctrl-C's 130. A command that sets
``own_sigterm=True`` (or ``reloads_on_sighup``) is left SIGTERM as it finds it: a service
that drains and exits 0 on its own handler, or a TensorRT engine build, whose minutes in one
C call a Python handler would wait out (systemd's stop timeout, then SIGKILL). Except as
PID 1 (a container without an init), where SIGTERM's default is to be ignored: there every
command has :class:`Terminated` from the first moment, until a service's loop puts its own
handler in place (``_catch_sigterm_as_init``).
The table below names those modules as strings: the runtime core never imports
``edge``, ``cloud`` or ``edgewise_tools`` (a layering test checks it); the
dispatcher imports each module when the parser is built and skips one that is
not installed, so the Jetson bundle (core + edge only) gets just the edge
commands. A module that needs a heavy dependency (torch, TensorRT) imports it
inside its handler.
"""

from __future__ import annotations

import argparse
import codecs
import importlib
import os
import platform
import signal
import sys
import threading
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple, Union

from edgewise import __version__, hangup, lifeline
from edgewise.errors import EdgewiseError
from edgewise.observability import LOG_FORMATS, setup_logging
from edgewise.systemdeps import missing_module_error

#: (group, module) pairs; a group may be filled by several modules.
#: Group "" means top-level subcommands.
COMMAND_MODULES: Tuple[Tuple[str, str], ...] = (
    ("model", "edgewise_tools.cli.model"),
    ("", "edgewise_tools.cli.synth"),
    ("", "edgewise_tools.cli.train"),
    ("", "edgewise_tools.cli.eval"),
    ("", "edgewise_tools.cli.demo"),
    ("edge", "edge.cli"),
    ("edge", "edge.models"),
    ("edge", "edge.provisioning"),
    ("edge", "edgewise_tools.cli.whatif"),  # check-policy --data: extends edge.cli's parser
    ("edge", "edge.bundle"),
    ("cloud", "cloud.worker.cli"),
    ("cloud", "cloud.gateway.cli"),
    ("cloud", "cloud.autoscaler.cli"),
    ("cloud", "cloud.probe"),
)

#: command groups that need a newer Python than the device's 3.8 (README, "Supported platforms"):
#: on an older one they answer with that instead of failing to import
MIN_PYTHON = {"cloud": (3, 10)}

GROUP_HELP = {
    "model": "inspect, build, quantize and compile YOLOv5 models",
    "edge": "the edge daemon: run and check it, its TensorRT engine, provision and bundle it for Jetson",
    "cloud": "the cloud tier: workers, gateway, autoscaler, local pool",
}


def build_parser() -> argparse.ArgumentParser:
    """Parser with every available command group registered."""
    parser = argparse.ArgumentParser(
        prog="edgewise",
        description="Edge/cloud hybrid object detection (YOLOv5 on the edge, a pool in the cloud).",
    )
    parser.add_argument(
        "--version", action="version",
        version=f"edgewise {__version__} (Python {platform.python_version()})",
    )
    parser.add_argument(
        "--log-level",
        help="logging level (env EDGEWISE_LOG_LEVEL; default INFO)",
    )
    parser.add_argument(
        "--log-format", choices=LOG_FORMATS,
        help="text, or json: one JSON object per line for log shippers (env EDGEWISE_LOG_FORMAT)",
    )
    top = parser.add_subparsers(dest="command", metavar="COMMAND")
    groups: Dict[str, argparse._SubParsersAction[argparse.ArgumentParser]] = {}
    refused: Set[str] = set()
    for group, module_name in COMMAND_MODULES:
        need = MIN_PYTHON.get(group)
        if need is not None and sys.version_info[:2] < need:
            if group not in refused:
                refused.add(group)
                gp = top.add_parser(group, help=GROUP_HELP.get(group, ""))
                gp.add_argument("rest", nargs=argparse.REMAINDER)
                gp.set_defaults(func=_needs_python(group, need))
            continue
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            # Only skip a command module that is itself absent (a trimmed
            # install); a missing dependency inside it is a real error.
            if exc.name is not None and module_name.startswith(exc.name):
                continue
            missing = missing_module_error(exc)  # one the platform provides (cv2): what installs it
            if missing is not None:
                raise missing from None
            raise
        if group:
            if group not in groups:
                gp = top.add_parser(group, help=GROUP_HELP.get(group, ""))
                groups[group] = gp.add_subparsers(dest=f"{group}_command", metavar="SUBCOMMAND")
                gp.set_defaults(func=_group_help(gp))
            module.register(groups[group])
        else:
            module.register(top)
    return parser


def _needs_python(group: str, need: Tuple[int, int]) -> Callable[[argparse.Namespace], int]:
    def refuse(_args: argparse.Namespace) -> int:
        print(f"edgewise: error: `edgewise {group}` needs Python >= {need[0]}.{need[1]} "
              f"(this is {platform.python_version()})", file=sys.stderr)
        return 2

    return refuse


def _group_help(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    def show(_args: argparse.Namespace) -> int:
        parser.print_help()
        return 2

    return show


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the CLI; returns the process exit status."""
    _catch_sigterm_as_init()  # first: until then a container's stop is lost (no init: we are PID 1)
    lifeline.watch()  # started by a local cloud or the demo: end with it, however it ends
    hangup.hold()  # before the command modules load: a daemon's reload must not kill its start
    _escape_what_stdout_cannot_encode()
    reloads = False
    try:
        try:
            parser = build_parser()
        except EdgewiseError as exc:  # a module the platform provides is missing (cv2): one line
            _say_error(exc)
            return 2
        args = parser.parse_args(list(argv) if argv is not None else None)
        reloads = bool(getattr(args, "reloads_on_sighup", False))
        if not reloads:
            hangup.release()
        return _run(parser, args)
    except KeyboardInterrupt as exc:  # Ctrl-C while the command modules load (seconds on a Jetson), or a
        return 143 if isinstance(exc, Terminated) else 130  # signal in _run's own clean-up: no traceback
    finally:
        # a no-op once a daemon took SIGHUP over; one that ended before (a settings error, exit
        # 2) drops a noted reload rather than dying of it
        hangup.release(deliver=not reloads)
        _settle_stderr()


#: stdout's error handler under a locale without UTF-8 (``_escape_what_stdout_cannot_encode``)
_STDOUT_ERRORS = "edgewise.stdout"


def _bytes_back_else_escaped(exc: UnicodeError) -> Tuple[Union[str, bytes], int]:
    """The ``_STDOUT_ERRORS`` handler, one character at a time: a file name's byte that the file
    system encoding read as a surrogate (U+DC80..U+DCFF, surrogateescape) is given back as that
    byte, as Python's own stdout does under the C locale; any other character is escaped
    (``\\u2014``)."""
    if not isinstance(exc, UnicodeEncodeError):
        raise exc
    c = exc.object[exc.start]
    if "\udc80" <= c <= "\udcff":
        return bytes([ord(c) - 0xDC00]), exc.start + 1
    one = UnicodeEncodeError(exc.encoding, exc.object, exc.start, exc.start + 1, exc.reason)
    return codecs.backslashreplace_errors(one)


def _escape_what_stdout_cannot_encode() -> None:
    """Under a locale without UTF-8 (ISO-8859-1, or C with PYTHONUTF8=0) a character of an
    operator's text that the locale cannot encode (an em dash in a policy's description) made
    the print of it raise: a traceback, exit 1. It is escaped (``\\u2014``) as on stderr. A
    file name's bytes that the locale read as surrogates are still printed as those bytes (the
    C locale's surrogateescape: an escaped name would name a file that does not exist). A
    UTF-8 stdout is left as it is (it encodes every character; surrogateescape gives back the
    bytes of a file name that is not UTF-8)."""
    reconfigure = getattr(sys.stdout, "reconfigure", None)  # a test's capture may have none
    try:
        if reconfigure is not None and codecs.lookup(sys.stdout.encoding or "utf-8").name != "utf-8":
            try:
                codecs.lookup_error(_STDOUT_ERRORS)
            except LookupError:
                codecs.register_error(_STDOUT_ERRORS, _bytes_back_else_escaped)
            reconfigure(errors=_STDOUT_ERRORS)
    except (AttributeError, LookupError, ValueError, OSError):
        pass


def _say_error(exc: BaseException) -> None:
    """``edgewise: error: ...`` on stderr; a stderr that cannot take it (a full disk, a reader
    gone) does not turn the exit status 2 into a traceback's 1."""
    try:
        print(f"edgewise: error: {exc}", file=sys.stderr)
    except OSError:
        pass


def _settle_stderr() -> None:
    """Flush stderr now; when it cannot be written (its file's disk is full, its pipe's
    reader is gone), point it at the null device, so that the interpreter's own last flush
    does not fail and turn the command's exit status into 120 (RestartPreventExitStatus=2
    must see the 2 of a settings error)."""
    try:
        sys.stderr.flush()
    except OSError:
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stderr.fileno())
            os.close(devnull)
        except (OSError, ValueError):  # a replaced sys.stderr without a file (a test's capture)
            pass


def _flag_or_env(flag_value: Optional[str], flag: str, var: str, default: str) -> Tuple[str, str]:
    """The value of ``flag`` when given, else of the environment variable ``var``, else
    ``default``; with the name of where it came from."""
    if flag_value is not None:
        return flag_value, flag
    if var in os.environ:
        return os.environ[var], var
    return default, flag


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in a command where Ctrl-C raises KeyboardInterrupt: the clean-up that
    Ctrl-C runs (``except KeyboardInterrupt``, ``finally``, a temporary folder's removal) runs
    for it too; it used to end the process where it stood, leaving a quantize run's copies of
    the model in the temporary folder."""


def _terminate(_signum: int, _frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends it at once
    raise Terminated


def _catch_sigterm_as_init() -> None:
    """As PID 1 (a container without an init: the image's ENTRYPOINT is ``edgewise``, and the
    Jetson image execs it), SIGTERM is :class:`Terminated` from the first moment, for every
    command. The kernel ignores a signal whose disposition is the default in its PID
    namespace's init, so a ``docker stop`` or a pod's termination while a service started
    (imports, a worker's model load: before its loop's own handler) was lost: the worker went
    on to serve until SIGKILL at terminationGracePeriodSeconds, its calls cut undrained.
    Elsewhere SIGTERM's default ends a starting service at once, and is left to it."""
    if os.getpid() == 1 and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminate)


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    # the flag, else the variable (EDGEWISE_LOG_LEVEL=debg in /etc/default/edgewise-edge was
    # refused as "log level 'debg'", naming neither), else the default
    level, level_src = _flag_or_env(args.log_level, "--log-level", "EDGEWISE_LOG_LEVEL", "INFO")
    fmt, fmt_src = _flag_or_env(args.log_format, "--log-format", "EDGEWISE_LOG_FORMAT", "text")
    try:
        setup_logging(level, fmt)
    except ValueError as exc:  # its message starts "log level" or "log format"
        parser.error(f"{level_src if str(exc).startswith('log level') else fmt_src}: {exc}")
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    service = getattr(args, "own_sigterm", False) or getattr(args, "reloads_on_sighup", False)
    previous = None
    if not service and threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        rc = int(func(args) or 0)
        sys.stdout.flush()  # here, not at exit: a reader gone ('| head') is caught below
        return rc
    except EdgewiseError as exc:
        # Errors we raise already say what to do; no traceback for the operator.
        _say_error(exc)
        return 2
    except ModuleNotFoundError as exc:  # an extra's module a command imports as it runs (paho): what installs it
        missing = missing_module_error(exc)
        if missing is None:
            raise
        _say_error(missing)
        return 2
    except KeyboardInterrupt as exc:
        return 143 if isinstance(exc, Terminated) else 130  # 128 + the signal, as a shell reports it
    except BrokenPipeError:  # `edgewise ... | head` closed our output: stop quietly, as cat does
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's final flush must not fail again
        return 141  # 128 + SIGPIPE, as a shell reports a command its pipe closed
    finally:
        if not service and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


__all__: List[str] = ["Terminated", "build_parser", "main"]
