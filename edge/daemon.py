"""The edge daemon process: builds everything from ``EdgeSettings`` and runs it.

One event loop; guarded long-lived tasks (policy watcher, spool replay,
watchdog: an error is logged and the task restarts, it never ends silently);
SIGTERM/SIGINT start a drain bounded by ``shutdown_grace_s`` from the signal
(capture stops and a read blocked on a frozen camera is woken, queued frames are
inferred until then and dropped after, in-flight escalations finish until then and
are spooled otherwise, the spool's replay sends no new entry and the one in flight may
finish until then, its entry staying spooled otherwise; health goes 503; a model still
loading is not waited for: ``edge.loading``), SIGHUP reloads the policy. The policy file is also
polled (mtime / ctime / inode / size; one modified less than ``POLICY_SETTLE_S`` ago, or
changed while it was read, is read at a later poll: its writer may be midway); an invalid new
file is refused with a logged reason and the old policy stays. Start-up problems (spool, metrics port) end
the process with one ``EdgewiseError`` line (exit 2), after what was started is closed;
so does one found once the daemon runs (the MQTT outbox cannot keep its client id, the MQTT
start fails ``MQTT_START_TRIES`` times in a row).
Style: docs/design/conventions.md#graceful-shutdown (kopf's
``running.py`` signal handling, gRPC's graceful-shutdown example).
Callers: ``edge.cli`` (``edgewise edge run``), tests, ``bench/edge.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from typing import Any, Awaitable, Callable, Dict, List, Optional, Tuple

import numpy as np

from edge import tegrastats
from edge.deciding import Decider
from edge.escalating import Escalating
from edge.framememory import FrameMemory
from edge.instancelock import InstanceLock
from edge.loading import Loading
from edge.metrics import EdgeMetrics, MetricsServer
from edge.outbox import Outbox, OutboxBusy, OutboxError, this_host
from edge.outbox_salvage import open_outbox
from edge.pipeline import Pipeline
from edge.preflight import identity_warning, opens_spool, preflight, tighten_state_files
from edge.records import FrameRecord
from edge.rereading import Rereader
from edge.sdnotify import Notifier
from edge.settings import EdgeSettings, default_transport, mqtt_outbox_path, policy_fit
from edge.sinks import JsonlSink, MqttSink, Sink, Sinks, StdoutSink, counter
from edge.sources.base import SourceState
from edge.sources.capturing import Capturer, FrameQueue
from edge.sources.making import make_source
from edge.spool import BUSY_SLICE_S, RESERVE_BYTES, Spool, SpoolError, SpoolFull
from edge.spool_salvage import open_spool
from edge.transports import MeteredTransport, Transport
from edgewise import hangup, mqtt_topics
from edgewise.errors import ConfigError, DeploymentError, EdgewiseError
from edgewise.filereads import FileIdentity, file_identity
from edgewise.outputs import fsync_dir

log = logging.getLogger(__name__)


EPOCH_WIDTH = 20  # digits: the file keeps one size, so it can be rewritten in place
#: the largest start count: frame_seq (a uint64 on the wire) is ``epoch << 32 | n``. A larger
#: one, in the file or from a record, is not a count but damage (or a planted value): it made
#: every escalation fail for good (found by a probe).
MAX_EPOCH = (1 << 32) - 1
#: tries of the MQTT start (``_start_mqtt``, 1 s apart) that fail in a row before the daemon stops
#: (exit 2): what fails there (the outbox's reads, the connection's start) does not heal by itself
MQTT_START_TRIES = 5
#: seconds without progress after which ``/healthz`` (served from its own thread) says the daemon
#: is stalled (503): no turn of the event loop, or no frame done while frames wait for the model
#: or its batches fail (the watchdog's rule, ``progress_beat``); the unit's WatchdogSec, for a supervisor without systemd's
#: watchdog (a container's health check, a Kubernetes liveness probe)
LOOP_STALL_S = 30.0
#: how often the event loop marks that it turns
LOOP_BEAT_S = 1.0
#: a policy file the poll finds modified less than this long ago is read at a later poll: a
#: writer (an editor saving in place, ``scp``, ``cat >``) may be midway, and half a policy is
#: often a valid, different one (half the cut points of examples/policy.yaml parse as a policy)
POLICY_SETTLE_S = 0.5


def being_written(seen: Optional[FileIdentity], now_ns: Optional[int] = None) -> bool:
    """Whether the policy file whose identity is ``seen`` was modified less than
    :data:`POLICY_SETTLE_S` ago (a modification time in the future, a clock stepped back, is not)."""
    if seen is None:
        return False
    age_ns = (time.time_ns() if now_ns is None else now_ns) - seen[4]
    return 0 <= age_ns < POLICY_SETTLE_S * 1e9


def boot_epoch(spool_path: str, floor: int = 0) -> int:
    """Count of daemon starts recorded next to the spool (``<spool>.epoch``), incremented
    durably on every start. Frame sequence numbers of a run start at ``epoch << 32``,
    so an idempotency key (device/stream/frame_seq) is never reused after a restart
    or a ``kill -9`` while older escalations of the same stream still sit in the spool.
    ``floor``: the lowest epoch this run may take, one above the newest run whose keys the
    spool or the sinks remember, so a lost or reset count (the spool folder deleted,
    ``spool.path`` moved) does not reuse keys either: a sink drops a late record whose key
    it has seen as a repeat. Written to a new file, fsync'd and renamed, and the folder fsync'd:
    a rename the journal had not committed yet (ext4: up to 5 s) was undone by a power cut soon
    after a start, and the next start took the cut run's count again, its frames' keys those the
    MQTT consumers had already seen from it. On a full disk (no
    block for the new file) the old file is overwritten in place instead, so a full spool
    disk does not stop the daemon. Raises ``SpoolError`` when neither works."""
    path = spool_path + ".epoch"
    try:
        with open(path) as f:
            counted = int(f.read().strip()) + 1
    except (OSError, ValueError):
        counted = 0
    if counted > MAX_EPOCH:
        log.warning("start count in %s is %d, beyond the largest a frame_seq can carry (%d): not a count; "
                    "counting anew", path, counted - 1, MAX_EPOCH)
        counted = 0
    if floor > MAX_EPOCH:
        log.warning("the spool or sinks remember a run numbered %d, beyond the largest a frame_seq can carry; "
                    "that value is ignored", floor - 1)
        floor = 0
    epoch = max(counted, floor)
    if epoch > counted:
        log.warning("start count %d in %s is behind the runs the spool and sinks remember; this run counts "
                    "from %d so that its frames' keys are new", counted, path, epoch)
    text = str(epoch).ljust(EPOCH_WIDTH)
    tmp = path + ".tmp"
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(os.path.dirname(os.path.abspath(path)))  # (the rename too: see the docstring)
    except OSError as exc:
        try:
            with open(path, "r+") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
        except OSError:
            raise SpoolError(f"cannot record the daemon's start count in {path} ({exc.strerror or exc}); "
                             "free space on that filesystem or set spool.path") from None
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    return epoch


class EdgeDaemon:
    """One daemon; ``await run()`` until the sources end or ``request_stop()``."""

    def __init__(self, settings: EdgeSettings, detector: Any = None,
                 reread: Optional[Callable[[], EdgeSettings]] = None) -> None:
        self.settings = settings
        #: reads the settings again on SIGHUP (``edge.rereading``: what a reload leaves unapplied),
        #: compared with a copy taken now, before the start fills in what it resolves (``device_id``)
        self.rereader = Rereader(settings, reread) if reread is not None else None
        self.detector = detector
        self.metrics = EdgeMetrics()
        self.stopping = False
        #: monotonic time by which a requested stop is done with frames and escalations
        self.stop_by: Optional[float] = None
        self.replaying: Optional[asyncio.Future[None]] = None  # the spool's replay loop
        self.started = False
        self.holder: Any = None
        self._policy_seen: Optional[FileIdentity] = None  # the policy file's identity before the start read it
        self.pipeline: Optional[Pipeline] = None
        self.escalating: Optional[Escalating] = None
        self.metrics_server: Optional[MetricsServer] = None
        self.telemetry: Optional[tegrastats.Tegrastats] = None
        self.spool: Optional[Spool] = None
        self.spool_problem = ""  # why the spool could not be opened at start (a full disk); retried
        self.mqtt: Any = None
        self.outbox: Optional[Outbox] = None  # the MQTT sink's; opened before the connection (its client id)
        self.mqtt_sink: Optional[MqttSink] = None
        #: a new client id (and this host) the outbox is still to keep before the connection starts
        self._new_client_id: Optional[Tuple[str, str]] = None
        self._starting_mqtt: Optional[asyncio.Future[None]] = None  # ``_start_mqtt``
        #: a start-up problem found once the daemon ran (``_start_mqtt``): ``run`` raises it after the stop
        self.failure: Optional[EdgewiseError] = None
        self.transports: Dict[str, Transport] = {}
        # (and the MQTT outbox's: beside the spool by default, but named by a setting of its own;
        # and the records file's, which two daemons appended to and rotated under each other)
        self.instance_lock = InstanceLock(settings.spool.path,
                                          mqtt_outbox_path(settings) if settings.sinks.mqtt else None,
                                          settings.sinks.jsonl or None)
        self.sinks: Optional[Sinks] = None
        self.stop_event: Optional[asyncio.Event] = None
        self.reload_event: Optional[asyncio.Event] = None
        self.capturers: List[Capturer] = []
        self.notifier = Notifier()
        #: when the event loop last turned (``_beat``; ``health`` runs on the metrics server's thread)
        self.loop_beat = time.monotonic()
        #: when frames last progressed, or no source streamed (``_note_progress``, at each beat):
        #: behind ``loop_beat`` while the loop turns and the pipeline does not (an inference call
        #: that never returns); what the watchdog pets by and ``health`` judges
        self.progress_beat = self.loop_beat
        self._frames_at_beat = -1
        self._wedged_said = False  # the stall of progress_beat was logged
        #: the detector's load (``edge.loading``): a stop does not wait for it
        self.loading: Optional[Loading[Any]] = None

    # ------------------------------------------------------------------ health
    def health(self) -> Tuple[bool, Dict[str, Any]]:
        states = {c.stream_id: (c.state.value if c.state else "new") for c in self.capturers}
        ok = self.started and not self.stopping
        # frozen: a write blocked on a pipe nobody reads (stdout, stderr), a stuck call on the loop,
        # or frames stopped while the loop turns (an inference call that never returns)
        now = time.monotonic()
        stalled = ok and now - self.progress_beat > LOOP_STALL_S
        ok = ok and not stalled
        # "off" until escalation is built (or without a cloud); a spool that cannot take
        # escalations leaves the daemon working (200), but not whole
        spool = self.escalating.spool_health() if self.escalating else {"state": "off"}
        # a cloud that failed the last calls: escalations spool or keep their edge result
        cloud = self.escalating.reach.health() if self.escalating else {"state": "off"}
        # a stream that failed and has not delivered a frame since (a dead or frozen camera):
        # restarting the daemon would not bring it back, so it is degraded, not unhealthy
        down = sorted(c.stream_id for c in self.capturers if c.down)
        # a sink whose last record did not get in (a full disk, a damaged outbox): records wait in memory
        failing = sorted(self.sinks.failing) if self.sinks else []
        # the last batch of frames failed in the model (frames dropped, counted inference_error:<type>)
        infer_failing = self.pipeline is not None and self.pipeline.inference_failing
        whole = (spool["state"] in ("ok", "off") and cloud["state"] != "failing" and not down and not failing
                 and not infer_failing)
        status = (("ok" if whole else "degraded") if ok else "stalled" if stalled
                  else "stopping" if self.stopping else "starting")
        why: Dict[str, Any] = {}
        if stalled:
            why["stalled"] = (
                f"the event loop has not turned for {now - self.loop_beat:.0f} s (a blocked write, e.g. to a "
                "stdout or stderr pipe nobody reads)" if now - self.loop_beat > LOOP_STALL_S else
                self._wedged_text(now))
        return ok, {
            "status": status,
            **why,
            "spool": spool,
            "cloud": cloud,
            "streams_down": down,
            "sinks_failing": failing,
            "inference_failing": infer_failing,
            "device": self.settings.device_id,
            "streams": states,
            "frames": self.pipeline.frames_done if self.pipeline else 0,
            "policy_version": self.holder.version if self.holder else 0,
            "escalations_in_flight": self.escalating.in_flight() if self.escalating else 0,
        }

    # ------------------------------------------------------------------ building
    def _load_detector(self) -> Any:
        if self.detector is not None:
            return self.detector
        from edgewise.runtime.detector import Detector
        from edgewise.runtime.firstframe import batch_failure, run_failure, short_of_memory
        from edgewise.runtime.metadata import setting_imgsz

        m = self.settings.model
        log.info("loading model %s (model.max_batch %d); a stop signal does not wait for the load", m.path,
                 m.max_batch)
        kwargs: Dict[str, Any] = dict(backend=m.backend, conf_thres=m.conf_thres, iou_thres=m.iou_thres,
                                      max_det=m.max_det, source="edge")
        if m.threads:
            kwargs["threads"] = m.threads
        size = setting_imgsz(m.imgsz)
        if size is not None:
            kwargs["imgsz"] = size
        # a TensorRT engine missing from the cache is built here (minutes): keep systemd waiting
        with self.notifier.busy(f"loading {m.path} (a TensorRT engine build takes minutes)"):
            det = Detector.from_file(m.path, max_batch=m.max_batch, spinning=m.spin, **kwargs)
            try:  # one dummy frame: a model whose output cannot be decoded fails here, at start
                h, w = det.imgsz
                try:
                    det.detect([np.zeros((h, w, 3), np.uint8)])
                except EdgewiseError:  # ours: one line naming the model
                    raise
                except Exception as exc:  # the runtime's, several lines: was a traceback and exit 1
                    if short_of_memory(exc):  # not the model's fault: exit 1, which the unit restarts
                        log.error("%s: first inference (%dx%d) found no memory for it; exiting for a restart",
                                  m.path, h, w)
                        raise
                    raise run_failure(det.info, (h, w), exc) from None
                if det.info.dynamic_batch and m.max_batch > 1:  # and the largest batch the pipeline forms
                    try:
                        det.detect([np.zeros((h, w, 3), np.uint8)] * m.max_batch)
                    except Exception as exc:
                        raise batch_failure(det.info, m.max_batch, exc, "model.max_batch") from None
            except BaseException:
                det.close()
                raise
            return det

    def _beside_the_spool(self, path: str) -> bool:
        """Whether a sink's file shares the spool's filesystem (by default both are in
        /var/lib/edgewise): its live records then leave the spool's reserve free."""
        if not opens_spool(self.settings):
            return False
        try:
            return (os.stat(os.path.dirname(os.path.abspath(path))).st_dev
                    == os.stat(os.path.dirname(os.path.abspath(self.settings.spool.path))).st_dev)
        except OSError:
            return False

    def _build_sinks(self) -> Sinks:
        s = self.settings.sinks
        out: List[Sink] = []
        if s.jsonl:
            out.append(JsonlSink(s.jsonl, fsync=s.fsync, max_bytes=s.jsonl_max_bytes, keep=s.jsonl_keep,
                                 compress=s.jsonl_compress,
                                 reserve_bytes=RESERVE_BYTES if self._beside_the_spool(s.jsonl) else 0,
                                 metrics=self.metrics))
        if s.stdout:
            out.append(StdoutSink(on_lost=counter(self.metrics, "stdout")))
        if s.mqtt and self.mqtt is not None:
            prefix = self.settings.cloud.mqtt.topic_prefix
            assert self.outbox is not None
            self.mqtt_sink = MqttSink(self.mqtt, mqtt_topics.detections_topic(prefix, self.settings.device_id),
                                      self.outbox, self.metrics, start=False,  # by _start_mqtt
                                      reserve_bytes=RESERVE_BYTES if self._beside_the_spool(str(self.outbox.path)) else 0)
            out.append(self.mqtt_sink)
        for sink in out:  # at 0 from the start: a series first seen at 1 has no increase() in Prometheus
            self.metrics.sink_errors.labels(sink.name)
            self.metrics.sink_dropped.labels(sink.name)
        return Sinks(out, on_error=lambda name: self.metrics.sink_errors.labels(name).inc())

    async def _build_transports(self) -> None:
        c = self.settings.cloud
        if c.mqtt.host:
            from edge.transports.mqtt import SESSION_EXPIRY_S, MqttConnection, MqttTransport

            device = self.settings.device_id
            client_id = MqttConnection.unique_client_id(device)
            if self.settings.sinks.mqtt:  # the sink's exchanges outlive a restart: one session, its id kept
                self.outbox = open_outbox(mqtt_outbox_path(self.settings), self.settings.sinks.mqtt_outbox_max)
                host = this_host()
                kept = self.outbox.kept_client_id(f"{device}-", host)  # a read: no lock to wait for
                if kept is None:  # kept by _start_mqtt, before the connection starts
                    self._new_client_id = (client_id, host)
                client_id = kept or client_id
            self.mqtt = MqttConnection(
                c.mqtt.host, c.mqtt.port, client_id=client_id, metrics=self.metrics,
                username=c.mqtt.username, password=c.mqtt.password, tls=c.mqtt.tls,
                tls_ca=c.tls_ca, tls_cert=c.tls_cert, tls_key=c.tls_key, keepalive_s=c.mqtt.keepalive_s,
                session_expiry_s=SESSION_EXPIRY_S if self.outbox is not None else 0,
            )
            t = MqttTransport(self.mqtt, self.settings.device_id, c.mqtt.topic_prefix, token=c.token,
                              max_in_flight_bytes=c.mqtt.max_in_flight_bytes)
            await t.start()
            self.transports["mqtt"] = MeteredTransport(t, self._count_uplink)
        if c.endpoints:
            from edge.transports.grpc import GrpcTransport

            g = GrpcTransport(c.endpoints, c.tls_ca, c.tls_cert, c.tls_key, c.token, c.keepalive_s)
            await g.start()
            self.transports["grpc"] = MeteredTransport(g, self._count_uplink)

    def _count_uplink(self, transport: str, nbytes: int) -> None:
        self.metrics.uplink_bytes.labels(transport).inc(nbytes)

    def _open_spool(self) -> Spool:
        """The spool; a damaged file is moved aside and what it holds salvaged (``edge.spool_salvage``)."""
        sp = self.settings.spool
        return open_spool(sp.path, max_bytes=sp.max_bytes, max_age_s=sp.max_age_s)

    def _spool_or_later(self) -> Optional[Spool]:
        """The spool, or None when its filesystem is full: the daemon starts anyway (its frames
        keep their edge result when the cloud cannot take them) and the replay loop opens
        the spool once space returns. Any other spool problem stops the start."""
        try:
            return self._open_spool()
        except SpoolFull as exc:
            log.error("%s; starting without the spool: escalations the cloud cannot take keep their edge "
                      "result, and the spool is opened again every spool.replay_interval_s", exc)
            self.spool_problem = str(exc)
            return None

    # ------------------------------------------------------------------ control
    def request_stop(self) -> None:
        """Start a graceful stop (idempotent, safe from a signal handler)."""
        if not self.stopping:
            log.info("stopping: capture ends; queued frames and in-flight escalations get shutdown_grace_s "
                     "(%g s), then frames still queued are dropped and escalations spooled",
                     self.settings.shutdown_grace_s)
        if self.stop_by is None:
            self.stop_by = time.monotonic() + self.settings.shutdown_grace_s
        self.stopping = True
        self.notifier.stopping()
        if self.pipeline is not None:
            self.pipeline.stop(self.stop_by)
        if self.stop_event is not None:
            self.stop_event.set()

    def request_reload(self) -> None:
        """SIGHUP: reload the policy, the one thing a running daemon re-reads (edge.yaml is read
        at start only). Without a ``policy_file`` it says so rather than doing nothing in silence:
        an operator who changed a camera's URL and reloaded was left waiting for it."""
        if self.reload_event is None:
            return
        if self.rereader is not None and not self.stopping:  # what changed waits for a restart: said
            self.rereader.request()
        if not self.settings.policy_file:
            log.warning("SIGHUP: nothing to reload (no policy_file); edge.yaml is read at start only: "
                        "restart the daemon to apply a change to it")
            return
        self.reload_event.set()

    async def reload_policy(self, seen: Optional[FileIdentity] = None) -> bool:
        """Re-read the policy file now: read and validated in a worker thread (a hostile file
        must not stall frames), put in force on the loop thread, between two frames. True
        when a new policy is in force; a refusal is logged once, by the holder. ``seen``: the
        file's identity before the read (the poll's); a file that changed while it was read may
        be half written and is not put in force (the next poll reads it again)."""
        if self.holder is None or not self.settings.policy_file:
            return False
        plan = await asyncio.get_running_loop().run_in_executor(
            None, self.holder.prepare, self.settings.policy_file)
        if seen is not None and file_identity(self.settings.policy_file) != seen:
            log.info("policy file %s changed while it was read; it is read again at the next look",
                     self.settings.policy_file)
            return False
        res = self.holder.apply(plan)
        if not res.ok:
            self.metrics.reloads.labels("refused").inc()
            return False
        if res.changed:
            self.metrics.reloads.labels("ok").inc()
            return True
        return False

    async def _beat(self) -> None:
        """Mark every ``LOOP_BEAT_S`` that the event loop turns, and whether frames progress,
        for ``health`` and the watchdog."""
        assert self.stop_event is not None
        while not self.stop_event.is_set():
            self.loop_beat = time.monotonic()
            self._note_progress(self.loop_beat)
            try:
                await asyncio.wait_for(self.stop_event.wait(), timeout=LOOP_BEAT_S)
            except asyncio.TimeoutError:
                pass

    def _note_progress(self, now: float) -> None:
        """``progress_beat`` = ``now`` while frames progress, or none waits for the model and its
        last batch did not fail: a wedged pipeline (not just a dead process or a stuck loop: an
        inference call that never returns, or a model that fails every batch, as after a CUDA
        error that sticks to the process) leaves it behind, a stream slower than the watchdog
        (``streams[].fps`` down to one frame a day) does not. (A failing call returns at once and
        its frames are dropped: most beats find none waiting, so waiting alone let it pass.)"""
        p = self.pipeline
        done = p.frames_done if p else 0
        if done != self._frames_at_beat or p is None or not (p.waiting() or p.inference_failing):
            if self._wedged_said:
                log.info("frames are processed again after %.0f s", now - self.progress_beat)
                self._wedged_said = False
            self.progress_beat = now
        elif not self._wedged_said and now - self.progress_beat > LOOP_STALL_S and self.started:
            self._wedged_said = True  # once per stall: /healthz says it meanwhile
            log.error("%s; /healthz says stalled, and systemd's watchdog restarts the daemon", self._wedged_text(now))
        self._frames_at_beat = done

    def _wedged_text(self, now: float) -> str:
        if self.pipeline is not None and self.pipeline.inference_failing:
            return (f"no frame was processed for {now - self.progress_beat:.0f} s: the model failed on every batch "
                    "(the log has its tracebacks; a CUDA error sticks to the process); restart the daemon")
        return (f"no frame was processed for {now - self.progress_beat:.0f} s while frames wait for the model: "
                "its inference call has not returned (a GPU or driver hang); restart the daemon")

    async def _pet_watchdog(self, interval: float) -> None:
        # Pet only while frames progress, or none waits for the model and its last batch did not
        # fail (``progress_beat``), so a wedged pipeline (not just a dead process) gets restarted by systemd.
        assert self.stop_event is not None
        while not self.stop_event.is_set():
            if time.monotonic() - self.progress_beat <= interval + LOOP_BEAT_S:
                self.notifier.watchdog()
            try:
                await asyncio.wait_for(self.stop_event.wait(), timeout=interval)
            except asyncio.TimeoutError:
                pass

    async def _watch_policy(self) -> None:
        assert self.stop_event is not None and self.reload_event is not None
        path = self.settings.policy_file
        last = self._policy_seen  # as it was when the start read it
        while not self.stop_event.is_set():
            seen: Optional[FileIdentity] = None
            try:
                await asyncio.wait_for(self.reload_event.wait(), timeout=self.settings.policy_poll_s)
                self.reload_event.clear()
                log.info("SIGHUP: reloading policy %s (edge.yaml is read at start only)", path)
                last = file_identity(path)
            except asyncio.TimeoutError:
                cur = file_identity(path)
                if cur is None and last is not None:  # said once: the policy in force stays
                    log.warning("policy file %s %s; the policy in force stays until it is back", path,
                                "cannot be read (a symbolic link to nothing, or to itself)" if os.path.islink(path)
                                else "is gone")
                if cur != last and being_written(cur):
                    continue  # (``last`` kept: the change is seen again at the next poll)
                last, changed = cur, cur != last
                if not changed or cur is None:
                    continue
                log.info("policy file %s changed; reloading", path)
                seen = cur
            try:
                await self.reload_policy(seen)  # (changed while read: ``last`` differs at the next poll)
            except Exception:  # a bug must not end hot reload: the next change is tried again
                self.metrics.reloads.labels("error").inc()
                log.exception("policy reload of %s failed; the old policy stays in force", path)

    def _stop_failed(self, failure: EdgewiseError) -> None:
        """Stop the daemon for a start-up problem found once it runs: logged now, raised by
        ``run`` after the stop (exit 2)."""
        self.failure = failure
        log.error("%s; the daemon stops", failure)
        self.request_stop()

    async def _guarded(self, name: str, task: Callable[[], Awaitable[None]], tries: int = 0) -> None:
        """Run a long-lived task until stop; if it fails it is logged and restarted after
        a second, so it never ends silently. With ``tries``, a task that failed that many times
        in a row stops the daemon, as a start-up problem (exit 2: ``failure``), instead of
        logging a traceback every second for as long as the daemon runs."""
        assert self.stop_event is not None
        failed = 0
        while not self.stop_event.is_set():
            try:
                await task()
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failed += 1
                if tries and failed >= tries:
                    self._stop_failed(DeploymentError(
                        f"{name} failed {failed} times in a row, 1 s apart (last: {type(exc).__name__}: {exc}); "
                        "the errors logged above say where; fix that (for the MQTT outbox's storage: dmesg, "
                        "free space, or move the outbox aside), then start the daemon again"))
                    return
                log.exception("%s failed; restarting it in 1 s", name)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.stop_event.wait(), timeout=1.0)

    # ------------------------------------------------------------------ running
    def _drop_detector(self, det: Any) -> None:
        """Close a detector this daemon loaded and no longer needs (a load given up at a stop)."""
        if det is not self.detector:
            det.close()

    async def _start(self) -> Optional[List[asyncio.Future[None]]]:
        """Open the spool, the metrics port, the model, transports and sinks, and build
        the pipeline; returns the long-lived tasks, or None when a stop came before the
        model was loaded (nothing is built after it). Cheap checks that can fail on a
        bad setting (policy, spool, metrics port) come first."""
        s = self.settings
        assert self.stop_event is not None
        id_defaulted = not s.device_id  # (preflight fills it)
        for line in preflight(s):  # device id, writable state folders: one-line errors
            log.info("%s", line)
        self.instance_lock.acquire()  # before anything of the state folder is touched
        for line in tighten_state_files(s):
            log.warning("%s", line)
        policy = None
        if s.policy_file:
            from edgewise.policy.holding import PolicyHolder

            # looked at before it is read: a change from now on (while the model loads, which can take
            # minutes with a TensorRT build) is one for the watcher, not its starting point
            self._policy_seen = file_identity(s.policy_file)
            self.holder = PolicyHolder.from_file(s.policy_file, policy_fit(s))  # as check-config does
            policy = self.holder.policy
        self.spool = self._spool_or_later() if opens_spool(s) else None
        if s.metrics.port >= 0:
            self.metrics_server = MetricsServer(self.metrics, self.health, s.metrics.host, s.metrics.port)
            self.metrics_server.start()
            self.telemetry = tegrastats.start(self.metrics.registry, s.metrics.tegrastats,
                                              s.metrics.tegrastats_interval_s)
        if self.stopping:  # a stop before the load: none begins
            return None
        self.loading = Loading(self._load_detector, self._drop_detector)
        detector = await self.loading.wait(self.stop_event)
        if detector is None:  # a stop during the load: not waited for (edge.loading)
            return None
        names = tuple(detector.names)
        if self.holder is not None:
            def check_fit(p: Any) -> None:
                for warning in p.fit_warnings(names, s.model.path, [st.id for st in s.streams]):
                    log.warning("%s", warning)
            check_fit(self.holder.policy)
            self.holder.subscribe(check_fit)
        await self._build_transports()
        for t in self.transports.values():  # at 0 from the start: a series first seen at 1 has no rate()
            self.metrics.follow_transport(t.name)
        self.sinks = self._build_sinks()
        # after the outbox keeps the client id and the MQTT sink resumed what the last process left in flight
        if self.mqtt is not None:  # guarded as the other tasks: an error in it is logged, never lost
            self._starting_mqtt = asyncio.ensure_future(self._guarded("MQTT start", self._start_mqtt,
                                                                      tries=MQTT_START_TRIES))
        remembered = max(self.sinks.last_epoch(), self.spool.last_epoch() if self.spool is not None else -1)
        if id_defaulted:
            renamed = identity_warning(s.device_id, self.sinks.devices() |
                                       (self.spool.devices() if self.spool is not None else set()))
            if renamed:
                log.warning("%s", renamed)
        epoch = boot_epoch(s.spool.path, remembered + 1)
        decider = Decider(policy)
        if self.transports:
            self.escalating = Escalating(
                s.device_id, self.transports, self.sinks.write, self.metrics, spool=self.spool,
                default_transport=default_transport(s), max_in_flight=s.cloud.max_in_flight,
                replay_interval_s=s.spool.replay_interval_s, replay_batch=s.spool.replay_batch, names=names,
                replay_deadline_s=s.spool.replay_deadline_s, replay_concurrency=s.spool.replay_concurrency,
                reopen=self._open_spool if self.spool_problem else None, spool_problem=self.spool_problem,
                durable=self.sinks.durable,
            )
        ready = asyncio.Event()
        queues: Dict[str, FrameQueue] = {}
        for st in s.streams:
            self.metrics.follow_stream(st.id)
            q = FrameQueue(st.resolved_queue_size(), st.resolved_drop_policy(), ready)
            queues[st.id] = q
            self.capturers.append(Capturer(
                st.id, make_source(st), q, fps=st.fps, max_frames=st.max_frames,
                reconnect_min_s=st.reconnect_min_s, reconnect_max_s=st.reconnect_max_s,
                on_state=self._on_state, on_corrupt=lambda sid: self.metrics.corrupt.labels(sid).inc(),
                on_drop=lambda sid: self.metrics.drops.labels(sid, "queue_full").inc(),
                start_seq=epoch << 32,
                on_truncated=lambda sid: self.metrics.truncated.labels(sid).inc(),
                on_skipped=lambda sid, n: self.metrics.skipped.labels(sid).inc(n),
                on_stale=lambda sid, n: self.metrics.drops.labels(sid, "stale").inc(n),
            ))
        memory = FrameMemory({st.id: st.resolved_queue_size() for st in s.streams}, s.model.max_batch,
                             s.cloud.max_in_flight if self.escalating is not None else 0)
        self.pipeline = Pipeline(s.device_id, detector, self.capturers, queues, ready, decider,
                                 self.escalating, self._write, self.metrics, s.model.max_batch, memory)
        if self.holder is not None:
            self.holder.subscribe(self.pipeline.apply_policy)
        if self.stopping:
            self.pipeline.stop(self.stop_by)
        tasks: List[asyncio.Future[None]] = [] if self._starting_mqtt is None else [self._starting_mqtt]
        if s.policy_file:
            tasks.append(asyncio.ensure_future(self._guarded("policy watcher", self._watch_policy)))
        escalating = self.escalating
        if escalating is not None and (self.spool is not None or escalating.reopen is not None):
            await escalating.update_spool_metrics()
            stop = self.stop_event
            self.replaying = asyncio.ensure_future(self._guarded("spool replay", lambda: escalating.replay_loop(stop)))
            tasks.append(self.replaying)
        tasks.append(asyncio.ensure_future(self._guarded("loop beat", self._beat)))
        if self.notifier.watchdog_interval:
            interval = self.notifier.watchdog_interval
            tasks.append(asyncio.ensure_future(self._guarded("watchdog", lambda: self._pet_watchdog(interval))))
        return tasks

    async def _start_mqtt(self) -> None:
        """Start the MQTT sink's publishing, then the connection, once the outbox keeps the
        connection's client id. A new one is written first (the old session's exchanges
        forgotten); a lock another process holds on the outbox (an sqlite3 shell left in a
        transaction) is tried every ``BUSY_SLICE_S`` here, never waited for on the event loop:
        frames go on, their records held in memory (``HeldRecords``) as whenever the outbox is
        busy, escalations over MQTT fail as with the broker down (spooled), and a stop ends the
        wait. Before, the start waited for it in SQLite for 30 s, signals unanswered, and then
        ended with ``OutboxBusy``. Run under ``_guarded``: an unexpected error is logged and the
        start tried again in 1 s, from where it failed (an id kept is not kept anew, a sink
        publishing is not started twice), ``MQTT_START_TRIES`` times in a row at most: then the
        daemon stops with exit 2 (``failure``), as when the id cannot be kept. It used to end the
        task unlogged, the connection never started."""
        assert self.mqtt is not None and self.stop_event is not None
        if self._new_client_id is not None:
            assert self.outbox is not None
            client_id, host = self._new_client_id
            waited = False
            while True:
                try:
                    self.outbox.keep_client_id(client_id, host, wait_s=0)
                    break
                except OutboxBusy as exc:
                    if not waited:
                        log.warning("%s; the MQTT connection starts once the outbox keeps its new client id %s: "
                                    "records wait in memory meanwhile, escalations over MQTT are spooled", exc,
                                    client_id)
                    waited = True
                except Exception as exc:  # a start-up problem: the daemon cannot go on without its outbox
                    # (it used to exit 0: a clean stop to the caller, which the unit's Restart=always starts again)
                    # (the message's words on one line: docs/troubleshooting.md quotes them, tests/docs checks it)
                    self._stop_failed(OutboxError(f"MQTT sink outbox {self.outbox.path}: cannot keep the client id ({exc}); "
                                                  "move the outbox aside (a new one is made at the start) or set "
                                                  "sinks.mqtt_outbox to a writable file, then start the daemon again"))
                    return
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.stop_event.wait(), BUSY_SLICE_S)
                if self.stop_event.is_set():
                    return
            if waited:
                log.info("MQTT sink outbox %s was let go: client id %s kept, connecting", self.outbox.path, client_id)
            self._new_client_id = None
        if self.mqtt_sink is not None:
            self.mqtt_sink.start()
        self.mqtt.start()

    async def run(self) -> int:
        """Run until the sources end or a stop is requested; returns an exit status."""
        s = self.settings
        loop = asyncio.get_running_loop()
        self.stop_event = asyncio.Event()
        self.reload_event = asyncio.Event()
        for sig, fn in ((signal.SIGTERM, self.request_stop), (signal.SIGINT, self.request_stop),
                        (signal.SIGHUP, self.request_reload)):
            try:
                loop.add_signal_handler(sig, fn)
            except (NotImplementedError, RuntimeError, ValueError):
                pass  # not the main thread (tests) or not POSIX
        if hangup.take():  # one came while the daemon started (edgewise.hangup)
            self.request_reload()
        try:
            tasks = await self._start()
        except BaseException:
            await self._close()  # what was opened before the failure
            raise
        if tasks is None:
            await self._close()
            log.info("edge daemon stopped after 0 frames: the stop came before the model was loaded")
            return 0
        assert self.pipeline is not None
        self.loop_beat = self.progress_beat = time.monotonic()  # the start took its time (a TensorRT build: minutes)
        self.started = True
        self.notifier.ready(f"{len(s.streams)} stream(s)")
        log.info("edge daemon %s running: %d stream(s), model %s, policy %s, transports %s",
                 s.device_id, len(s.streams), s.model.path, s.policy_file or "(none)",
                 ",".join(self.transports) or "(none)")
        try:
            await self.pipeline.run()
            if not self.stopping and s.streams and self.pipeline.frames_done == 0:
                # exit 2 (a settings problem, not restarted by the unit), after the usual cleanup
                raise ConfigError("every source ended and no frame was processed (see the errors above): check "
                                  "streams[].uri and the model; `edgewise edge check-config` checks local sources")
            if not self.stopping and self.escalating is not None:
                # Sources ended by themselves (files): let the last escalations settle and
                # what the spool holds be answered, within spool.replay_at_end_s.
                left = await self.escalating.replay_rest(s.spool.replay_at_end_s, self.stop_event)
                if left and self.stopping:  # a SIGTERM cut the wait short: not the setting's doing
                    log.warning("sources ended; stopped while waiting for the cloud to answer the spool, %d "
                                "escalations still spooled: they are replayed at the next start", left)
                elif left:
                    log.warning("sources ended; %d escalations still spooled after spool.replay_at_end_s "
                                "(%g s): they are replayed at the next start", left, s.spool.replay_at_end_s)
                await self.escalating.drain(self._grace_left())
        finally:
            self.stopping = True
            self.stop_event.set()
            if self.escalating is not None:
                await self.escalating.drain(self._grace_left())
            if self.replaying is not None:  # sends no new replay now; the one the cloud computes may finish
                await asyncio.wait([self.replaying], timeout=self._grace_left())
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._close()
        log.info("edge daemon stopped after %d frames", self.pipeline.frames_done if self.pipeline else 0)
        if self.failure is not None:  # exit 2, as a start-up problem found before the daemon ran
            raise self.failure
        return 0

    def _grace_left(self) -> float:
        """What is left of ``shutdown_grace_s`` for in-flight escalations: a requested stop shares
        one grace, from the signal, with the queued frames; otherwise the whole grace."""
        if self.stop_by is None:
            return self.settings.shutdown_grace_s
        return max(0.0, self.stop_by - time.monotonic())

    def _write(self, rec: FrameRecord) -> None:
        if self.sinks is not None:
            self.sinks.write(rec)

    def _on_state(self, stream: str, state: SourceState) -> None:
        self.metrics.set_source_state(stream, state)

    async def _close(self) -> None:
        if self._starting_mqtt is not None:  # (a start that failed after it began): nothing starts now
            self._starting_mqtt.cancel()
        for t in self.transports.values():
            try:
                await t.close()
            except Exception:
                log.exception("closing transport %s", t.name)
        if self.escalating is not None:
            await self.escalating.close()  # queued spool writes finish, and their records are written
        if self.sinks is not None:  # last: every settled escalation writes its record first
            await asyncio.get_running_loop().run_in_executor(None, self.sinks.close)
        elif self.outbox is not None:  # (a start that failed before the sinks were built): the MQTT sink closes it
            await asyncio.get_running_loop().run_in_executor(None, self.outbox.close)
        if self.mqtt is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.mqtt.stop)
        spool = self.escalating.spool if self.escalating is not None else self.spool  # maybe opened later
        if spool is not None:
            if spool.stop_by is None:  # no escalation drain set it (a stop during the model load, a failed start)
                spool.stop_by = time.monotonic()  # the close's checkpoint does not wait for a lock held elsewhere
            spool.close()
        if self.telemetry is not None:
            self.telemetry.stop()
        if self.metrics_server is not None:
            self.metrics_server.stop()
        self.instance_lock.release()  # last: the state folder is this daemon's until here
        hangup.ignore_from_now(asyncio.get_running_loop())  # nothing left to reload (edgewise.hangup)


def run_daemon(settings: EdgeSettings, reread: Optional[Callable[[], EdgeSettings]] = None) -> int:
    """Blocking entry point (``edgewise edge run``); ``reread`` loads the settings again as
    ``settings`` were (``edge.rereading``)."""
    start = time.monotonic()
    daemon = EdgeDaemon(settings, reread=reread)
    code = asyncio.run(daemon.run())
    log.debug("daemon ran %.1f s", time.monotonic() - start)
    if daemon.loading is not None and daemon.loading.running():
        # a load given up at a stop (edge.loading): everything else is closed; the interpreter's
        # exit would wait for, or tear down under, the runtime that still builds the model
        log.info("exiting without waiting for the model load the stop gave up")
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)
    return code
