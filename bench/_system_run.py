"""Process side of ``bench/system.py``: models, camera data, edge daemons, the local
cloud, a private Mosquitto, per-process CPU sampling and fault injection.

Reuses the demo's pieces (``edgewise_tools.demo.running``: data generation, stream
folders, the Mosquitto launcher; ``edgewise_tools.demo.records``: sink reading) and
``cloud.local.LocalCloud`` for the worker pool + gateway. Each load point starts
fresh edge daemons (one per group of ``per_daemon`` streams) against the same
warm cloud; CPU seconds come from ``/proc/<pid>/stat`` (utime + stime).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import cv2
import yaml

from edgewise_tools import cpu
from edgewise_tools.cpu import busy_s, proc_cpu_s
from edgewise_tools.demo import records as R
from edgewise_tools.demo import running as demo

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache" / "bench-models"
DATA_CACHE = ROOT / ".cache" / "bench-system-data"
VTEST = Path("/usr/share/doc/opencv-doc/examples/data/vtest.avi")


def say(line: str) -> None:
    """Progress goes to stderr; the report (stdout) stays clean Markdown."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


# ------------------------------------------------------------------------------ models

def default_models() -> Tuple[Path, Path, str]:
    """The demo's reference pair (``edgewise_tools.demo.running.DEMO_EDGE_MODEL`` /
    ``DEMO_CLOUD_MODEL``, the camera pair) when present, else seeded stand-ins (built once,
    cached): YOLOv5n@320 INT8 for the edge and YOLOv5s@320 float for the cloud, 10 classes."""
    ref_e, ref_c = demo.DEMO_EDGE_MODEL, demo.DEMO_CLOUD_MODEL
    if ref_e.is_file() and ref_c.is_file():
        return ref_e, ref_c, f"reference models ({ref_c.parent.relative_to(ROOT)}/)"
    from edgewise.synth import CLASS_NAMES
    from edgewise_tools.models import build_onnx
    from edgewise_tools.models.quantize import quantize

    CACHE.mkdir(parents=True, exist_ok=True)
    fp = CACHE / "sys-yolov5n-320-10.onnx"
    edge = CACHE / "sys-yolov5n-320-10-int8.onnx"
    cloud = CACHE / "sys-yolov5s-320-10.onnx"
    if not edge.exists():
        if not fp.exists():
            say(f"building stand-in edge model {fp.name} ...")
            build_onnx("yolov5n", imgsz=320, nc=10, path=fp, names=list(CLASS_NAMES), seed=0)
        say(f"quantizing {edge.name} (8 calibration frames of vtest.avi) ...")
        quantize(fp, VTEST, samples=8, out_path=edge, holdout=0)
    if not cloud.exists():
        say(f"building stand-in cloud model {cloud.name} ...")
        build_onnx("yolov5s", imgsz=320, nc=10, path=cloud, names=list(CLASS_NAMES), seed=1)
    return edge, cloud, "stand-ins (seeded random weights): edge YOLOv5n@320 INT8, cloud YOLOv5s@320"


# ------------------------------------------------------------------------------ data

def camera_folders(preset: str, distinct: int, frames: int, size: Tuple[int, int], seed: int) -> List[Path]:
    """``distinct`` generated camera streams of ``frames`` images each of an ``edgewise synth``
    world (cached by parameters); the daemons loop over them, so a long run needs few images."""
    key = f"{preset}-s{distinct}-f{frames}-{size[0]}x{size[1]}-seed{seed}"
    data = DATA_CACHE / key
    if not (data / "cams" / f"cam{distinct - 1}").is_dir():
        tmp = DATA_CACHE / (key + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        say(f"generating {distinct} camera streams x {frames} frames ({size[0]}x{size[1]}) ...")
        cfg = demo.DemoConfig(streams=distinct, frames=frames, seed=seed, size=size, preset=preset)
        demo._generate(cfg, tmp)
        demo._stream_folders(tmp, distinct)
        shutil.rmtree(data, ignore_errors=True)
        tmp.rename(data)
    return [data / "cams" / f"cam{i}" for i in range(distinct)]


def jpeg_sizes(folder: Path, quality: int) -> List[int]:
    """JPEG bytes at the policy's quality of each image, in the folder source's order."""
    out = []
    for p in sorted(folder.glob("*.jpg")):
        img = cv2.imread(str(p))
        if img is None:
            raise RuntimeError(f"cannot read camera frame {p}")
        out.append(len(cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, quality])[1]))
    return out


def policy_copy(policy: Path, transport: str, dest: Path, audit: float = 0.0,
                deadline_ms: Optional[float] = None) -> Tuple[Path, int]:
    """The policy with its transport set; returns (path, jpeg quality).

    ``audit`` > 0 sets ``auditFraction`` (deterministic random escalations of easy frames)
    and lifts ``budget.maxFraction`` above it: stand-in models with random weights detect
    nothing, so hardness alone would escalate no frame and the cloud path would go unmeasured.
    ``deadline_ms`` replaces the policy's cloud deadline (a slow CPU cloud needs a longer one).
    """
    doc = yaml.safe_load(policy.read_text())
    spec = doc.setdefault("spec", {})
    spec["transport"] = transport
    if deadline_ms:
        spec["deadlineMs"] = int(deadline_ms)
    if audit > 0:
        spec["auditFraction"] = audit
        budget = spec.setdefault("budget", {})
        budget["maxFraction"] = max(float(budget.get("maxFraction", 0.0)), min(1.0, 1.5 * audit))
    dest.write_text(yaml.safe_dump(doc, sort_keys=False))
    return dest, int(spec.get("payload", {}).get("jpegQuality", 85))


# ------------------------------------------------------------------------------ CPU

def settle(pids: Callable[[], List[int]], quiet_s: float = 0.1, window: float = 1.0, limit: float = 30.0) -> float:
    """Wait until the given processes use < ``quiet_s`` CPU seconds per ``window`` (warm-up
    done); returns the seconds waited."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        a = sum(proc_cpu_s(p) or 0.0 for p in pids())
        time.sleep(window)
        if sum(proc_cpu_s(p) or 0.0 for p in pids()) - a < quiet_s:
            break
    return time.monotonic() - t0


class CpuMeter:
    """CPU seconds per role over a window, one :class:`edgewise_tools.cpu.CpuMeter` per role;
    a sampler thread keeps the last reading of processes that die in the window (a SIGKILLed
    worker) and picks up new ones."""

    def __init__(self, roles: Callable[[], Dict[str, List[int]]], every: float = 0.25) -> None:
        self.machine0 = busy_s()
        self.machine_s = 0.0
        self.roles = roles
        self.every = every
        self.meters: Dict[str, cpu.CpuMeter] = {}
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.t0 = self.t1 = 0.0

    def _sample(self) -> None:
        for role, pids in self.roles().items():
            meter = self.meters.get(role) or cpu.CpuMeter()
            meter.sample(pids)
            if meter.last:  # a role counts once one of its processes was read
                self.meters[role] = meter

    def start(self) -> None:
        self.t0 = time.monotonic()
        self.machine0 = busy_s()
        self._sample()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            self._sample()

    def stop(self) -> Dict[str, float]:
        self._sample()
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.t1 = time.monotonic()
        self.machine_s = busy_s() - self.machine0
        return {role: meter.seconds for role, meter in self.meters.items()}


def gateway_counters(cloud: Any) -> Dict[str, float]:
    """The gateway's retry / worker-error / request counters (best effort; {} when unreachable)."""
    try:
        text = cloud.metrics_text()
    except Exception:
        return {}
    out: Dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(("edgewise_gateway_retries_total", "edgewise_gateway_worker_errors_total",
                            "edgewise_gateway_requests_total", "edgewise_gateway_mqtt_messages_total")):
            key, _, val = line.rpartition(" ")
            try:
                out[key.replace("edgewise_gateway_", "")] = float(val)
            except ValueError:
                continue
    return out


# ------------------------------------------------------------------------------ broker

def mqtt_bridge_available() -> bool:
    """Whether the gateway can bridge MQTT (its module is present in this checkout)."""
    import importlib.util

    try:
        return importlib.util.find_spec("cloud.gateway.mqtt_bridge") is not None
    except ImportError:
        return False


class Broker:
    """Our own Mosquitto on a free port; ``restart`` stops it and starts it on the same port."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.proc, self.port = demo._mosquitto(work)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def start_again(self, timeout: float = 15.0) -> None:
        exe = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        deadline = time.monotonic() + timeout
        while True:  # the port may sit in TIME_WAIT for a moment
            self.proc = subprocess.Popen([exe, "-c", str(self.work / "mosquitto.conf")],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            t = time.monotonic() + 3
            while time.monotonic() < t and self.proc.poll() is None:
                try:
                    with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                        return
                except OSError:
                    time.sleep(0.05)
            self.proc.kill()
            self.proc.wait(5)
            if time.monotonic() > deadline:
                raise RuntimeError(f"mosquitto did not come back on port {self.port}")
            time.sleep(0.5)


# ------------------------------------------------------------------------------ edge

@dataclass
class PointConfig:
    """One load point: N cameras through ceil(N / per_daemon) daemons."""

    n: int
    fps: float
    seconds: float
    per_daemon: int
    edge_model: Path
    policy: Path
    transport: str
    gateway: str
    mqtt_port: Optional[int]
    folders: List[Path]
    edge_threads: int = 1
    max_batch: int = 4
    extra: Dict[str, Any] = field(default_factory=dict)

    @property
    def frames_per_stream(self) -> int:
        return max(2, int(round(self.fps * self.seconds)))

    def groups(self) -> List[List[int]]:
        return [list(range(i, min(self.n, i + self.per_daemon))) for i in range(0, self.n, self.per_daemon)]


def edge_yaml(pc: PointConfig, d: int, streams: Sequence[int], work: Path) -> Tuple[Path, Path]:
    """Config of daemon ``d``; camera semantics: fixed fps, drop_oldest, 2-frame queue."""
    tree: Dict[str, Any] = {
        "device_id": f"bench-edge{d}",
        "streams": [{"id": f"cam{i}", "kind": "folder", "uri": str(pc.folders[i % len(pc.folders)]),
                     "fps": pc.fps, "loop": True, "max_frames": pc.frames_per_stream,
                     "queue_size": 2, "drop_policy": "drop_oldest"} for i in streams],
        "model": {"path": str(pc.edge_model), "backend": "onnxruntime", "threads": pc.edge_threads,
                  "max_batch": max(1, min(pc.max_batch, len(streams)))},
        "policy_file": str(pc.policy),
        "cloud": {"endpoints": [pc.gateway], "transport": pc.transport},
        "spool": {"path": str(work / f"spool{d}.db"), "max_bytes": 256 << 20, "max_age_s": 3600,
                  "replay_interval_s": 1.0},
        "sinks": {"jsonl": str(work / f"sink{d}.jsonl"), "stdout": False},
        "metrics": {"host": "127.0.0.1", "port": -1},
        "shutdown_grace_s": 5.0,
    }
    if pc.mqtt_port is not None:
        tree["cloud"]["mqtt"] = {"host": "127.0.0.1", "port": pc.mqtt_port}
    path = work / f"edge{d}.yaml"
    path.write_text(yaml.safe_dump(tree, sort_keys=False))
    return path, work / f"sink{d}.jsonl"


Fault = Callable[[float, List[Dict[str, Any]]], None]


def run_point(pc: PointConfig, work: Path, cloud: Any, broker: Optional[Broker] = None,
              fault: Optional[Fault] = None) -> Dict[str, Any]:
    """Run the daemons of one point to their end; returns records, CPU and events.

    The measurement window opens when every daemon has written its first record (model
    load and the first inference are not camera time) and closes when the last exits.
    ``fault(t, events)`` is called about every 0.2 s with the seconds since the window opened.
    """
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    daemons: List[subprocess.Popen[bytes]] = []
    sinks: List[Path] = []
    logs = []
    try:
        for d, streams in enumerate(pc.groups()):
            cfg, sink = edge_yaml(pc, d, streams, work)
            log = open(work / f"edge{d}.log", "wb")
            logs.append(log)
            daemons.append(subprocess.Popen(
                [sys.executable, "-m", "edgewise.cli", "edge", "run", "--config", str(cfg)],
                stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(ROOT)))
            sinks.append(sink)

        def roles() -> Dict[str, List[int]]:
            r: Dict[str, List[int]] = {"edge": [p.pid for p in daemons if p.poll() is None]}
            r["workers"] = [p.popen.pid for p in cloud.workers if p is not None]
            if cloud.gateway is not None:
                r["gateway"] = [cloud.gateway.popen.pid]
            if broker is not None:
                r["broker"] = [broker.proc.pid]
            return r

        t_wait = time.monotonic() + 180
        while time.monotonic() < t_wait:
            if all(s.exists() and s.stat().st_size > 0 for s in sinks):
                break
            dead = [p for p in daemons if p.poll() is not None]
            if dead:
                raise RuntimeError(f"edge daemon exited with {dead[0].returncode} before its first frame; "
                                   f"see {work}/edge*.log:\n" + (work / "edge0.log").read_text()[-2000:])
            time.sleep(0.1)
        else:
            raise RuntimeError(f"edge daemons wrote no record within 180 s; see {work}/edge*.log")
        meter = CpuMeter(roles)
        meter.start()
        t0 = time.monotonic()
        events: List[Dict[str, Any]] = []
        deadline = t0 + pc.seconds * 3 + 90
        while any(p.poll() is None for p in daemons) and time.monotonic() < deadline:
            if fault is not None:
                fault(time.monotonic() - t0, events)
            time.sleep(0.2)
        for p in daemons:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                p.wait(30)
        cpu = meter.stop()
        wall = meter.t1 - meter.t0
    finally:
        for p in daemons:
            if p.poll() is None:
                p.kill()
                p.wait(5)
        for log in logs:
            log.close()
    recs = [R.read_jsonl(s) for s in sinks]
    return {"records": recs, "cpu_s": cpu, "wall_s": wall, "events": events,
            "machine_cpu_s": meter.machine_s, "loadavg": os.getloadavg()[0],
            "daemons": len(daemons), "exit_codes": [p.returncode for p in daemons]}


def worker_kill_fault(cloud: Any, at_s: float, down_s: float) -> Fault:
    """SIGKILL worker 0 at ``at_s``; restart it ``down_s`` later."""
    state = {"killed": False, "back": False}

    def fault(t: float, events: List[Dict[str, Any]]) -> None:
        if not state["killed"] and t >= at_s:
            cloud.kill_worker(0, signal.SIGKILL)
            state["killed"] = True
            events.append({"event": "worker 0 SIGKILLed", "t": round(t, 1)})
        elif state["killed"] and not state["back"] and t >= at_s + down_s:
            cloud.restart_worker(0)
            state["back"] = True
            events.append({"event": "worker 0 restarted", "t": round(t, 1)})

    return fault


def broker_restart_fault(broker: Broker, at_s: float, down_s: float) -> Fault:
    """Stop our Mosquitto at ``at_s``; start it again on the same port ``down_s`` later."""
    state = {"down": False, "back": False}

    def fault(t: float, events: List[Dict[str, Any]]) -> None:
        if not state["down"] and t >= at_s:
            broker.stop()
            state["down"] = True
            events.append({"event": "broker stopped", "t": round(t, 1)})
        elif state["down"] and not state["back"] and t >= at_s + down_s:
            broker.start_again()
            state["back"] = True
            events.append({"event": "broker restarted", "t": round(t, 1)})

    return fault
