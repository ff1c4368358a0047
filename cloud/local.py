"""Local mode: a worker pool and a gateway as real processes on one machine.

``LocalCloud`` starts N ``edgewise cloud worker`` processes on chosen free ports
and one ``edgewise cloud gateway`` with static discovery of them, waits until
each prints its listening line, and stops them all (SIGTERM, then SIGKILL after
a grace period). Tests and the demo use it to kill, restart and add workers
with real signals; ``edgewise cloud up`` is its command-line face. Adding a
worker rewrites the gateway's config and sends SIGHUP (the gateway re-reads its
static worker list; new workers enter slow start). Each process ends by itself once the
process that started it is gone, however that one ended (``edgewise.lifeline``): a ``cloud up``
or a demo killed with SIGKILL left its pool running under init, holding its ports.

Paths are the caller's: the model and gateway config are resolved against the
working directory ``LocalCloud`` is created in, and the processes run in that
directory, so relative paths inside a gateway config or in extra worker arguments
mean what they mean to ``edgewise cloud gateway`` / ``worker`` run there by hand.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from edgewise.errors import ConfigError, UnavailableError
from edgewise.lifeline import Lifeline
from edgewise.settings.tree import plain, read_yaml

log = logging.getLogger("edgewise.local")
ROOT = Path(__file__).resolve().parents[1]
_CLI = "import sys; from edgewise.cli import main; sys.exit(main(sys.argv[1:]))"
_WORKER_RE = re.compile(r"EDGEWISE_WORKER_SERVING port=(\d+)")  # printed after warm-up
_GATEWAY_RE = re.compile(r"EDGEWISE_GATEWAY_LISTENING port=(\d+) metrics_port=(-?\d+)")
#: The gateway's ``limits`` that hold on both hops, and the worker flag each one sets.
_BOTH_HOPS = {"max_message_bytes": "max-message-bytes", "max_image_pixels": "max-image-pixels"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cli_command(*args: str) -> list[str]:
    """argv that runs ``edgewise <args>`` with this interpreter and this checkout."""
    return [sys.executable, "-c", _CLI, *args]


class _Proc:
    def __init__(self, name: str, argv: list[str], log_path: Path, env: Mapping[str, str],
                 cwd: Path, lifeline: Lifeline) -> None:
        self.name = name
        self.argv = argv
        self.log_path = log_path
        self._offset = log_path.stat().st_size if log_path.exists() else 0  # a restart appends
        self._log = open(log_path, "ab")
        # its own session (the terminal's Ctrl-C reaches us, and we stop the pool in order), and
        # the lifeline: it stops by itself if we are killed before we can stop it
        self.popen = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT,
                                      env=lifeline.child_env(dict(env)), pass_fds=(lifeline.read_fd,),
                                      cwd=str(cwd), start_new_session=True)

    def wait_line(self, pattern: re.Pattern[str], timeout: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with open(self.log_path, "rb") as f:
                f.seek(self._offset)
                text = f.read().decode(errors="replace")
            m = pattern.search(text)
            if m:
                return m
            if self.popen.poll() is not None:
                raise UnavailableError(f"{self.name} exited with {self.popen.returncode} before listening; "
                                       f"log {self.log_path}:\n{text[-3000:]}")
            time.sleep(0.05)
        raise UnavailableError(f"{self.name} did not print its listening line within {timeout:.0f} s; "
                               f"log {self.log_path}")

    def signal(self, sig: int) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(sig)

    def stop(self, grace: float) -> int | None:
        return stop_all([self], grace)[0]

    def reaped(self, timeout: float) -> int:
        """Wait for the process to end (after a signal), close its log, return its status."""
        try:
            return self.popen.wait(timeout)
        finally:
            if self.popen.poll() is not None:
                self._log.close()


#: most worker processes a local cloud starts (``--workers 100000`` started hundreds, each loading the
#: model, until the machine stalled)
MAX_WORKERS = 64
#: seconds a process killed by SIGKILL is given to be reaped before ``stop_all`` names it and goes on
KILL_REAP_S = 5.0


def _wait_until(proc: _Proc, deadline: float) -> None:
    try:
        proc.popen.wait(max(0.01, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pass


def stop_all(procs: Sequence[_Proc], grace: float) -> list[int | None]:
    """Stop ``procs`` together: SIGTERM to each, ``grace`` seconds for all of them, SIGKILL to
    what is left; their exit statuses, None for one that even SIGKILL did not end within
    ``KILL_REAP_S`` (named in a warning). One by one, N workers took N graces, and the first
    that outlived its SIGKILL by 5 s (a loaded machine) raised, leaving every later one running."""
    for p in procs:
        p.signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for p in procs:
        _wait_until(p, deadline)
    for p in procs:
        p.signal(signal.SIGKILL)
    deadline = time.monotonic() + KILL_REAP_S
    for p in procs:
        _wait_until(p, deadline)
    for p in procs:
        p._log.close()  # (the process writes to its own copy of the descriptor)
        if p.popen.poll() is None:
            log.warning("%s (pid %d) did not end within %.0f s of SIGKILL; left to the system",
                        p.name, p.popen.pid, KILL_REAP_S)
    return [p.popen.returncode for p in procs]


class LocalCloud:
    """N workers + one gateway as processes; a context manager."""

    def __init__(
        self,
        model: str | Path,
        workers: int = 2,
        *,
        port: int = 0,
        metrics_port: int = 0,
        worker_threads: int = 1,
        weights: Sequence[float] | None = None,
        gateway_config: str | Path | None = None,
        gateway_settings: Mapping[str, Any] | None = None,
        worker_args: Sequence[str] = (),
        per_worker_args: Sequence[Sequence[str]] | None = None,
        env: Mapping[str, str] | None = None,
        start_timeout: float = 90.0,
        stop_grace: float = 15.0,
        log_dir: str | Path | None = None,
        flags: bool = False,
    ) -> None:
        def arg(name: str) -> str:  # as the caller named it: ``cloud up`` names its options
            return "--" + name.replace("_", "-") if flags else name

        if not 0 <= workers <= MAX_WORKERS:
            raise ConfigError(f"{arg('workers')}: {workers} must be within 0..{MAX_WORKERS} (processes on this one "
                              "machine, each with its own copy of the model; a larger pool is the Helm chart's)")
        if weights is not None and len(weights) != workers:
            raise ConfigError(f"{arg('weights')}: {len(weights)} given for {workers} workers")
        if per_worker_args is not None and len(per_worker_args) != workers:
            raise ConfigError(f"per_worker_args: {len(per_worker_args)} given for {workers} workers")
        # Checked here, before any worker warms up, rather than by a child process after it.
        for name, value in (("port", port), ("metrics_port", metrics_port)):
            if not 0 <= value <= 65535:
                raise ConfigError(f"{arg(name)}: {value} must be within 0..65535 (0 picks a free one)")
        if worker_threads < 0:
            raise ConfigError(f"{arg('worker_threads')}: {worker_threads} must be >= 0 (0: ONNX Runtime's default)")
        for w in weights or ():
            if not (math.isfinite(w) and w > 0):
                raise ConfigError(f"{arg('weights')}: {w:g} must be a positive finite number")
        self.cwd = Path.cwd()
        if not Path(model).is_file():
            raise ConfigError(f"{arg('model')} {model}: file not found (relative paths start in {self.cwd})")
        if gateway_config is not None and not Path(gateway_config).is_file():
            raise ConfigError(f"{arg('gateway_config') if flags else 'gateway config'} {gateway_config}: file not found "
                              f"(relative paths start in {self.cwd})")
        self.model = str(Path(model).resolve())
        self.n_workers = workers
        self.port = port
        self.requested_metrics_port = metrics_port
        self.worker_threads = worker_threads
        self.weights = [float(w) for w in weights] if weights else [1.0] * workers
        self.gateway_config = Path(gateway_config).resolve() if gateway_config is not None else None
        self.gateway_settings = dict(gateway_settings or {})
        self.worker_args = list(worker_args)
        self.per_worker_args = [list(a) for a in per_worker_args] if per_worker_args else [[]] * workers
        self.env = dict(os.environ if env is None else env)
        # The processes run in the caller's directory: make this checkout importable there.
        path = [p for p in self.env.get("PYTHONPATH", "").split(os.pathsep) if p]
        if str(ROOT) not in path:
            self.env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *path])
        self.env.setdefault("PYTHONUNBUFFERED", "1")
        self.start_timeout = start_timeout
        self.stop_grace = stop_grace
        self._own_dir = log_dir is None
        self._keep_logs = False  # set when a failed start's error names a log in an own folder
        self.dir = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="edgewise-local-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.workers: list[_Proc | None] = []
        self.worker_ports: list[int] = []
        self.worker_specs: list[list[str]] = []
        self.gateway: _Proc | None = None
        self.gateway_port = 0
        self.metrics_port = 0
        self._gateway_ports: tuple[str, int] | None = None  # listen and metrics_port in the gateway's config
        self.exit_codes: dict[str, int | None] = {}  # process name -> exit status after stop()
        self._lifeline: Lifeline | None = None  # the processes end by themselves once we are gone

    def _proc(self, name: str, argv: list[str], log_name: str) -> _Proc:
        if self._lifeline is None:
            self._lifeline = Lifeline()
        return _Proc(name, argv, self.dir / log_name, self.env, self.cwd, self._lifeline)

    # ---- addresses -----------------------------------------------------------------------
    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.gateway_port}"

    @property
    def worker_addresses(self) -> list[str]:
        return [f"127.0.0.1:{p}" for p in self.worker_ports]

    # ---- lifecycle -----------------------------------------------------------------------
    def __enter__(self) -> LocalCloud:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        try:
            for i in range(self.n_workers):
                self._start_worker_slot(i, self.per_worker_args[i])
            for i in range(self.n_workers):
                self._wait_worker(i)
            self._write_gateway_config()
            self._start_gateway()
        except BaseException as exc:
            # The error may name a process's log: keep the log folder so that it can be read.
            self._keep_logs = self._keep_logs or isinstance(exc, UnavailableError)
            self.stop()
            raise

    def _worker_argv(self, port: int, extra: Sequence[str]) -> list[str]:
        # Metrics on any free port: several workers share this machine. The gateway's limits
        # that hold on both hops go to the workers too, as the chart passes them.
        limits = self._gateway_tree().get("limits") or {}
        both = [f"--{flag}={limits[key]}" for key, flag in _BOTH_HOPS.items() if limits.get(key) is not None]
        return cli_command("cloud", "worker", "--model", self.model, "--host", "127.0.0.1",
                           "--port", str(port), "--metrics-port", "0", "--worker-id", f"worker-{port}",
                           "--threads", str(self.worker_threads), *both, *self.worker_args, *extra)

    def _start_worker_slot(self, i: int, extra: Sequence[str]) -> None:
        if i == len(self.workers):
            self.workers.append(None)
            self.worker_ports.append(_free_port())
            self.worker_specs.append(list(extra))
        argv = self._worker_argv(self.worker_ports[i], self.worker_specs[i])
        self.workers[i] = self._proc(f"worker {i}", argv, f"worker-{i}.log")

    def _wait_worker(self, i: int) -> None:
        proc = self.workers[i]
        assert proc is not None
        proc.wait_line(_WORKER_RE, self.start_timeout)

    def _gateway_tree(self) -> dict[str, Any]:
        """The gateway's settings as given: its config file with ``gateway_settings`` over it."""
        tree: dict[str, Any] = {}
        if self.gateway_config:
            # the settings files' reader: UTF-8, YAML and a mapping checked, each a line naming the file
            tree = plain(read_yaml(self.gateway_config, "gateway settings"))
        for key, value in self.gateway_settings.items():
            node = tree
            parts = key.split(".")
            for p in parts[:-1]:
                node = node.setdefault(p, {})
            node[parts[-1]] = value
        return tree

    def _write_gateway_config(self, reload: bool = False) -> Path:
        """The gateway's config file: its settings, this cloud's workers and its ports (the ones
        it has when it is started again; with ``reload``, for a SIGHUP to the running gateway, the
        ones it was started with: a bound port in place of 0 was a change the gateway warned
        about, a setting a reload does not apply)."""
        tree = self._gateway_tree()
        if not (reload and self._gateway_ports):
            self._gateway_ports = (f"127.0.0.1:{self.gateway_port or self.port}",
                                   self.metrics_port or self.requested_metrics_port)
        tree["listen"], tree["metrics_port"] = self._gateway_ports
        tree["metrics_host"] = "127.0.0.1"
        disc = tree.setdefault("discovery", {})
        disc["kind"] = "static"
        disc["static"] = [f"{a}={w:g}" for a, w, p in zip(self.worker_addresses, self.weights, self.workers)
                          if p is not None]
        path = self.dir / "gateway.yaml"
        path.write_text(yaml.safe_dump(tree, sort_keys=False))
        return path

    def _start_gateway(self) -> None:
        path = self.dir / "gateway.yaml"
        self.gateway = self._proc("gateway", cli_command("cloud", "gateway", "--config", str(path)), "gateway.log")
        m = self.gateway.wait_line(_GATEWAY_RE, self.start_timeout)
        self.gateway_port, self.metrics_port = int(m.group(1)), int(m.group(2))

    def stop(self) -> None:
        """Stop the gateway first (it drains), then the workers."""
        if self.gateway is not None:
            self.exit_codes["gateway"] = self.gateway.stop(self.stop_grace)
            self.gateway = None
        running = [(i, proc) for i, proc in enumerate(self.workers) if proc is not None]
        for (i, _), code in zip(running, stop_all([proc for _, proc in running], self.stop_grace)):
            self.exit_codes[f"worker {i}"] = code
            self.workers[i] = None
        if self._lifeline is not None:
            self._lifeline.close()
            self._lifeline = None
        if self._own_dir and not self._keep_logs and os.environ.get("EDGEWISE_KEEP_LOGS") != "1":
            shutil.rmtree(self.dir, ignore_errors=True)

    def gateway_exited(self) -> bool:
        return self.gateway is None or self.gateway.popen.poll() is not None

    # ---- chaos and scaling -----------------------------------------------------------------
    def worker_pid(self, i: int) -> int:
        proc = self.workers[i]
        if proc is None:
            raise ConfigError(f"worker {i} is not running")
        return int(proc.popen.pid)

    def kill_worker(self, i: int, sig: int = signal.SIGKILL, wait: bool = True,
                    timeout: float = 30.0) -> int | None:
        """Send a real signal to worker i; with ``wait``, reap it and return its exit status."""
        proc = self.workers[i]
        if proc is None:
            return None
        proc.signal(sig)
        if not wait:
            return None
        try:
            return proc.reaped(timeout)
        finally:
            if proc.popen.poll() is not None:
                self.workers[i] = None

    def kill_gateway(self, sig: int = signal.SIGKILL, timeout: float = 30.0) -> int | None:
        """Send a real signal to the gateway and reap it; returns its exit status."""
        if self.gateway is None:
            return None
        self.gateway.signal(sig)
        try:
            return self.gateway.reaped(timeout)
        finally:
            if self.gateway.popen.poll() is not None:
                self.gateway = None

    def restart_gateway(self) -> None:
        """(Re)start the gateway on its old port, in front of the workers running now."""
        if self.gateway is not None:
            self.gateway.stop(self.stop_grace)
        self._write_gateway_config()
        self._start_gateway()

    def restart_worker(self, i: int) -> None:
        """(Re)start worker i on its old port (the gateway reconnects to the same address)."""
        proc = self.workers[i]
        if proc is not None:
            proc.stop(self.stop_grace)
        self._start_worker_slot(i, self.worker_specs[i])
        self._wait_worker(i)

    def add_worker(self, weight: float = 1.0, extra_args: Sequence[str] = ()) -> int:
        """Start one more worker and tell the gateway (SIGHUP reload). Returns its index."""
        i = len(self.workers)
        self.weights.append(float(weight))
        self._start_worker_slot(i, extra_args)
        self._wait_worker(i)
        self._write_gateway_config(reload=True)
        if self.gateway is not None:
            self.gateway.signal(signal.SIGHUP)
        return i

    def pool(self) -> dict[str, Any]:
        """The gateway's ``GET /pool`` document."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/pool", timeout=5) as r:
            return json.loads(r.read())  # type: ignore[no-any-return]

    def metrics_text(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            return r.read().decode()  # type: ignore[no-any-return]
