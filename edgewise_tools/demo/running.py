"""Orchestration of the demo: data, cloud, edge, a worker failure, live progress, report."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, TextIO, Tuple

import yaml

from edgewise.errors import ConfigError, ModelError
from edgewise.lifeline import Lifeline
from edgewise_tools.cpu import CpuMeter
from edgewise_tools.demo import records as R

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class World:
    """A generated world the demo's cameras can show, with the demo's defaults for it."""

    size: Tuple[int, int]  # frame size (width, height)
    frames: int  # per stream
    score_frames: int  # frames scored against the ground truth (evenly spaced; 0: every frame)
    kill_worker_at: float  # fraction of the run
    policy: Path


#: The ``edgewise synth`` presets the demo can show; it shows the one its cloud model was
#: trained for (``model_world``).
WORLDS: Dict[str, World] = {
    # the episodes pair (models/): 224x224 frames (what it was trained on), every frame scored
    "episodes": World((224, 224), 200, 0, 0.35, ROOT / "examples" / "policies" / "episodes.yaml"),
    # the camera pair (models/camera/, scripts/train_camera.sh): the cloud model at native size
    # costs about half a second of CPU per whole 1280x720 frame, so a sample of the frames is
    # scored (the whole demo stays under 3 minutes on 2 cores)
    "camera": World((1280, 720), 150, 100, 0.2, ROOT / "examples" / "policy.yaml"),
}

#: The pair ``make demo`` and ``bench/system.py`` run: the camera pair, whose cloud model sees
#: the far objects the edge model cannot (README, "Camera world").
DEMO_EDGE_MODEL = ROOT / "models" / "camera" / "edge-int8.onnx"
DEMO_CLOUD_MODEL = ROOT / "models" / "camera" / "cloud.onnx"


def model_world(path: Path) -> str:
    """The world a model was trained for: its ONNX metadata ``edgewise_world`` (written by the
    camera packaging, ``edgewise_tools.train.camera``), else ``episodes`` (also for a file that
    cannot be read: ``DemoConfig.validate`` reports it)."""
    from edgewise.errors import EdgewiseError
    from edgewise.runtime.metadata import load_model_info

    try:
        world = load_model_info(path).metadata.get("edgewise_world", "episodes")
    except (EdgewiseError, OSError):
        return "episodes"
    return world if world in WORLDS else "episodes"


@dataclass
class DemoConfig:
    """What the demo runs. Fields left empty (``""``, 0, ``None``) take the world's default.

    Attributes:
        edge_model: the INT8 reference edge model (default: the camera pair's).
        cloud_model: the reference cloud model (default: the camera pair's).
        policy: escalation policy (its ``transport`` is set from ``transport``).
        transport: ``grpc`` or ``mqtt`` (MQTT needs a local ``mosquitto`` binary).
        streams: generated camera streams.
        frames: frames per stream.
        fps: camera frame rate.
        workers: cloud workers.
        kill_worker_at: fraction of the run at which worker 0 is SIGKILLed.
        kill_seconds: how long it stays down before it is restarted.
        out: report folder.
        seed: data seed.
        preset: the ``edgewise synth`` world the cameras show; default: the one the cloud model
            was trained for (``model_world``: ``camera`` for the default pair, ``episodes`` for
            the pair in ``models/``).
        size: frame size (width, height).
        score_frames: frames scored against the ground truth for the report's accuracy
            (evenly spaced; 0: every frame).
        live: print a live progress line (off: only the start and end lines).
        keep_workdir: keep the work directory (data, logs, the sink) for inspection.
    """

    edge_model: Path = DEMO_EDGE_MODEL
    cloud_model: Path = DEMO_CLOUD_MODEL
    policy: Optional[Path] = None
    transport: str = "grpc"
    streams: int = 2
    frames: int = 0
    fps: float = 10.0
    workers: int = 2
    kill_worker_at: float = 0.0
    kill_seconds: float = 4.0
    out: Path = Path("demo-report")
    seed: int = 2026
    preset: str = ""
    size: Optional[Tuple[int, int]] = None
    score_frames: int = 0
    live: bool = True
    keep_workdir: bool = False

    def __post_init__(self) -> None:
        from edgewise.synth import default_size

        self.preset = self.preset or model_world(Path(self.cloud_model))
        world = WORLDS.get(self.preset, WORLDS["episodes"])
        if self.size is None:
            self.size = world.size if self.preset in WORLDS else default_size(self.preset)
        self.frames = self.frames or world.frames
        self.score_frames = self.score_frames or world.score_frames
        self.kill_worker_at = self.kill_worker_at or world.kill_worker_at
        self.policy = self.policy or world.policy

    @property
    def policy_file(self) -> Path:
        assert self.policy is not None  # set by __post_init__
        return Path(self.policy)

    @property
    def frame_size(self) -> Tuple[int, int]:
        assert self.size is not None  # set by __post_init__
        return self.size

    def validate(self) -> None:
        for name in ("edge_model", "cloud_model", "policy"):
            p = Path(getattr(self, name))
            if not p.is_file():
                flag = "--" + name.replace("_", "-")
                if ROOT in p.parents and not (ROOT / "pyproject.toml").is_file():
                    # a default of a pip-installed package: models/ and examples/ are the checkout's
                    raise ConfigError(
                        f"demo {flag}: its default {p.relative_to(ROOT)} is a file of a source checkout of "
                        f"edgewise, and this edgewise is an installed package ({ROOT}), which holds no "
                        "models/ or examples/: run the demo from a checkout (`make demo`), or pass "
                        "--edge-model, --cloud-model and --policy (the checkout's models/camera/edge-int8.onnx, "
                        "models/camera/cloud.onnx and examples/policy.yaml)")
                hint = " (the reference models ship in models/; see models/MODEL_CARD.md)" if "model" in name else ""
                raise ConfigError(f"demo {name.replace('_', '-')}: {p} not found{hint}")
        # read now, not by the processes after the frames are made and the cloud is warm (a policy that
        # is not UTF-8 was a traceback; a damaged edge model failed only in the started daemon)
        from edgewise.policy import load_policy
        from edgewise.runtime.metadata import load_model_info

        for flag, model in (("--edge-model", self.edge_model), ("--cloud-model", self.cloud_model)):
            try:
                load_model_info(Path(model))
            except ModelError as exc:
                raise ConfigError(f"demo {flag}: {exc}") from None
        load_policy(self.policy_file)
        if self.transport not in ("grpc", "mqtt"):
            raise ConfigError(f"--transport {self.transport!r}: use grpc or mqtt")
        few = frames_problem(self.frames)
        if few:
            raise ConfigError(few)
        for name, value, ok, need in (("--streams", self.streams, self.streams >= 1, ">= 1"),
                                      ("--fps", self.fps, self.fps > 0, "> 0"),
                                      ("--workers", self.workers, self.workers >= 1, ">= 1"),
                                      ("score_frames", self.score_frames, self.score_frames >= 0, ">= 0")):
            if not ok:  # the one that is wrong, as the command line names it
                raise ConfigError(f"demo {name} {value}: must be {need}")


#: fewest frames per stream a demo runs (fewer leave nothing to escalate, answer and report)
MIN_FRAMES = 10


def frames_problem(frames: int) -> Optional[str]:
    """Why ``frames`` per stream cannot be a demo's (the one rule of ``--frames`` and
    ``DemoConfig.frames`` once its world's default is in), or None."""
    if frames >= MIN_FRAMES:
        return None
    return f"--frames {frames}: must be >= {MIN_FRAMES} (frames per stream; leave it out for the world's)"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _mosquitto(work: Path) -> tuple[subprocess.Popen[bytes], int]:
    exe = shutil.which("mosquitto") or ("/usr/sbin/mosquitto" if os.path.exists("/usr/sbin/mosquitto") else None)
    if exe is None:
        raise ConfigError(
            "--transport mqtt needs the Mosquitto broker: `sudo apt-get install mosquitto` "
            "(or `make test`, which installs it); no broker found on PATH or in /usr/sbin"
        )
    port = _free_port()
    conf = work / "mosquitto.conf"
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\n")
    proc = subprocess.Popen([exe, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import socket

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return proc, port
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise ConfigError("mosquitto did not start within 10 s")


class _Cancelled(Exception):
    """The demo was stopped while its frames were being generated."""


def _generate(cfg: DemoConfig, data: Path, cancel: Optional[threading.Event] = None) -> Dict[str, Any]:
    from edgewise.synth import SynthJob, generate, load_difficulty

    def progress(_n: int) -> None:  # a stopped demo's thread stops writing into the work dir it removes
        if cancel is not None and cancel.is_set():
            raise _Cancelled

    w, h = cfg.frame_size
    return generate(SynthJob(out=data, frames=cfg.frames, streams=cfg.streams, seed=cfg.seed, split="test",
                             width=int(w), height=int(h), difficulty=load_difficulty(cfg.preset), preset=cfg.preset),
                    progress)


def _stream_folders(data: Path, streams: int) -> List[Path]:
    """The daemon reads one folder per camera: link each stream's frames into its own."""
    dirs = []
    for s in range(streams):
        d = data / "cams" / f"cam{s}"
        d.mkdir(parents=True, exist_ok=True)
        for img in sorted((data / "images").glob(f"s{s:03d}_f*.jpg")):
            link = d / img.name
            if not link.exists():
                os.link(img, link)
        dirs.append(d)
    return dirs


def _edge_config(cfg: DemoConfig, work: Path, cams: List[Path], gateway: str, policy: Path,
                 mqtt_port: Optional[int], metrics_port: int) -> Path:
    tree: Dict[str, Any] = {
        "device_id": "demo-edge",
        "streams": [{"id": f"cam{i}", "kind": "folder", "uri": str(d), "fps": cfg.fps} for i, d in enumerate(cams)],
        "model": {"path": str(cfg.edge_model), "backend": "onnxruntime", "threads": 1, "max_batch": 2},
        "policy_file": str(policy),
        "cloud": {"endpoints": [gateway], "transport": cfg.transport},
        # replay promptly once the killed worker is back: the run is short
        "spool": {"path": str(work / "spool.db"), "max_bytes": 256 << 20, "max_age_s": 3600, "replay_interval_s": 0.5},
        "sinks": {"jsonl": str(work / "detections.jsonl"), "stdout": False},
        "metrics": {"host": "127.0.0.1", "port": metrics_port},
    }
    if mqtt_port is not None:
        tree["cloud"]["mqtt"] = {"host": "127.0.0.1", "port": mqtt_port}
    path = work / "edge.yaml"
    path.write_text(yaml.safe_dump(tree, sort_keys=False))
    return path


def _policy_copy(cfg: DemoConfig, work: Path) -> Path:
    doc = yaml.safe_load(cfg.policy_file.read_text())
    doc.setdefault("spec", {})["transport"] = cfg.transport
    path = work / "policy.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _scrape(port: int) -> Dict[str, float]:
    """A few gauges/counters from the daemon's /metrics (best effort)."""
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=0.5).read().decode()
    except OSError:
        return {}
    out: Dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("edgewise_edge_spool_depth "):
            out["spool_depth"] = float(line.split()[1])
        elif line.startswith("edgewise_edge_escalations_in_flight "):
            out["in_flight"] = float(line.split()[1])
    return out


class _Progress:
    """One refreshing status line from the sink file and the daemon's metrics."""

    def __init__(self, sink: Path, metrics_port: int, total: int, stream: TextIO, enabled: bool = True) -> None:
        self.sink, self.metrics_port, self.total, self.stream = sink, metrics_port, total, stream
        self.enabled = enabled
        self.t0 = time.monotonic()
        self.tty = stream.isatty()
        self.last_print = 0.0
        self.metrics: Dict[str, float] = {}  # the last scrape that answered (the daemon may have exited)

    def show(self, note: str = "") -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not self.tty and now - self.last_print < 5 and not note:
            return
        self.last_print = now
        recs = R.read_jsonl(self.sink)
        final = R.latest_per_frame(recs)
        esc = [r for r in final.values() if r.get("escalated")]
        rtts = sorted(r["cloud_rtt_ms"] for r in final.values() if r.get("cloud_rtt_ms"))
        self.metrics = _scrape(self.metrics_port) or self.metrics
        m = self.metrics
        elapsed = now - self.t0
        line = (f"[{elapsed:5.1f}s] frames {len(final)}/{self.total}  fps {len(final) / max(elapsed, 1e-6):5.1f}  "
                f"escalated {len(esc)} ({100 * len(esc) / max(len(final), 1):4.1f}%)  "
                f"cloud rtt p50 {rtts[len(rtts) // 2] if rtts else 0:6.1f} ms  "
                f"spool {int(m.get('spool_depth', 0))}  {note}")
        if self.tty:
            self.stream.write("\r" + line.ljust(130))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def done(self) -> None:
        if self.tty and self.enabled:
            self.stream.write("\n")


def run_demo(cfg: DemoConfig, stream: TextIO = sys.stdout) -> Dict[str, Any]:
    """Run the demo; returns the JSON summary (also written to ``<out>/summary.json``). Interrupted
    (KeyboardInterrupt), it stops what it started and removes its work dir (unless ``keep_workdir``)."""
    cfg.validate()
    t_start = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="edgewise-demo-"))
    w, h = cfg.frame_size
    stream.write(f"edgewise demo: {cfg.streams} {cfg.preset} streams of {w}x{h} x {cfg.frames} frames at "
                 f"{cfg.fps:g} fps, {cfg.workers} cloud workers, transport {cfg.transport} (work dir {work})\n")
    stream.flush()
    data = work / "data"
    # the cameras' frames are generated while the cloud processes start (they do not share a core's work)
    gen = ThreadPoolExecutor(max_workers=1, thread_name_prefix="demo-synth")
    cancel = threading.Event()
    generated = gen.submit(_generate, cfg, data, cancel)
    gen.shutdown(wait=False)
    try:
        return _run(cfg, work, data, generated, stream, t_start)
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM/SIGHUP (edgewise_tools.cli.demo): the processes are stopped
        cancel.set()
        gen.shutdown(wait=True)
        if not cfg.keep_workdir:
            shutil.rmtree(work, ignore_errors=True)
        raise


def _run(cfg: DemoConfig, work: Path, data: Path, generated: Future[Dict[str, Any]], stream: TextIO,
         t_start: float) -> Dict[str, Any]:
    """The demo once its work dir is made and its frames are being generated (:func:`run_demo`)."""
    from cloud.local import LocalCloud  # app wiring: the demo drives both tiers
    from edgewise_tools.demo.report import INDEX, SUMMARY, build_report

    def say(text: str) -> None:
        stream.write(text + "\n")
        stream.flush()

    broker = None
    mqtt_port: Optional[int] = None
    if cfg.transport == "mqtt":
        broker, mqtt_port = _mosquitto(work)
    gateway_settings: Dict[str, Any] = {}
    if mqtt_port is not None:
        gateway_settings = {"mqtt.enabled": True, "mqtt.host": "127.0.0.1", "mqtt.port": mqtt_port}
    policy = _policy_copy(cfg, work)
    events: List[Dict[str, Any]] = []
    cloud = LocalCloud(cfg.cloud_model, workers=cfg.workers, gateway_settings=gateway_settings,
                       log_dir=work / "cloud")
    daemon: Optional[subprocess.Popen[bytes]] = None
    life = Lifeline()  # the edge daemon ends by itself if the demo is killed (the cloud's have their own)
    try:
        say("generating the cameras' frames and starting the local cloud (gateway + workers, warm-up) ...")
        cloud.start()
        say(f"cloud up: gateway {cloud.address}, workers {', '.join(cloud.worker_addresses)}")
        generated.result()
        cams = _stream_folders(data, cfg.streams)
        metrics_port = _free_port()
        edge_yaml = _edge_config(cfg, work, cams, cloud.address, policy, mqtt_port, metrics_port)
        sink = work / "detections.jsonl"
        env = dict(os.environ)
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        with open(work / "edge.log", "wb") as edge_log:  # the child has its own copy of the file
            daemon = subprocess.Popen([sys.executable, "-m", "edgewise.cli", "edge", "run", "--config",
                                       str(edge_yaml)], stdout=edge_log, stderr=subprocess.STDOUT,
                                      env=life.child_env(env), pass_fds=(life.read_fd,))
        say("edge daemon started; live progress:")
        total = cfg.streams * cfg.frames
        progress = _Progress(sink, metrics_port, total, stream, cfg.live)
        run_s = cfg.frames / cfg.fps
        # The run's clock starts with the first frame out of the daemon (model load and
        # warm-up before that are not part of the camera timeline).
        t_wait = time.monotonic() + 120
        while daemon.poll() is None and not R.read_jsonl(sink) and time.monotonic() < t_wait:
            time.sleep(0.2)
        t0 = time.monotonic()
        cpu = CpuMeter()  # the workers' CPU from the first frame on: the cloud's cost per escalation

        def worker_pids() -> List[int]:
            return [w.popen.pid for w in cloud.workers if w is not None]

        cpu.sample(worker_pids())
        kill_at: Optional[float] = t0 + cfg.kill_worker_at * run_s
        restart_at: Optional[float] = None
        deadline = t0 + run_s * 3 + 60
        while daemon.poll() is None and time.monotonic() < deadline:
            now = time.monotonic()
            cpu.sample(worker_pids())
            if kill_at is not None and now >= kill_at:
                cloud.kill_worker(0, signal.SIGKILL)
                events.append({"event": "worker 0 killed (SIGKILL)", "t": round(now - t0, 2), "unix_ns": time.time_ns()})
                progress.show("<- worker 0 killed")
                kill_at, restart_at = None, now + cfg.kill_seconds
            if restart_at is not None and now >= restart_at:
                cloud.restart_worker(0)
                events.append({"event": "worker 0 restarted", "t": round(time.monotonic() - t0, 2),
                               "unix_ns": time.time_ns()})
                progress.show("<- worker 0 back")
                restart_at = None
            progress.show()
            time.sleep(0.5)
        if daemon.poll() is None:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(30)
        cpu.sample(worker_pids())
        progress.show("edge daemon finished")
        progress.done()
        run_wall = time.monotonic() - t0
        recs = R.read_jsonl(sink)
    finally:
        if daemon is not None and daemon.poll() is None:
            daemon.kill()
        life.close()
        cloud.stop()
        if broker is not None:
            broker.terminate()
    summary = build_report(cfg, data, recs, events, run_wall, Path(cfg.out), policy, cloud_cpu_s=cpu.seconds)
    summary["wall_seconds"] = round(time.monotonic() - t_start, 1)
    (Path(cfg.out) / SUMMARY).write_text(json.dumps(summary, indent=1))
    if not cfg.keep_workdir:
        shutil.rmtree(work, ignore_errors=True)
    acc = summary["accounting"]
    say(f"frames {acc['frames']}/{summary['frames_generated']}, escalated {acc['escalated']} "
        f"({100 * summary['escalation_rate']:.1f}%), answered {acc['answered']} "
        f"({acc['answered_late']} late from the spool), lost {acc['lost']}")
    a = summary["accuracy"]
    say(f"F1 vs ground truth ({a['scored_frames']} scored frames): edge only {a['edge_only']['f1']:.3f}, "
        f"hybrid {a['hybrid']['f1']:.3f}, cloud only {a['cloud_only']['f1']:.3f}; uplink saved "
        f"{100 * summary['uplink']['saved']:.1f}%; cloud CPU per escalation "
        f"{summary['cloud_cpu']['ms_per_escalation']} ms")
    say(f"report: {Path(cfg.out).resolve() / INDEX}  ({SUMMARY} beside it); "
        f"total {summary['wall_seconds']:.0f} s")
    return summary
