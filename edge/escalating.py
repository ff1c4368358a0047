"""Escalation of hard frames to the cloud, the spool on failure, and its replay.

``Escalating`` (async shell) builds the frame's ``DetectRequest``
(``edge.payloads.build_request``) in a worker thread (the JPEG encode
stays off the event loop), sends it over the policy's transport with the
policy deadline, merges the answer with the edge boxes and writes the frame
record; the answer's boxes are then carried on the stream's next frames
(``edge.carrying``). When the cloud is unreachable, overloaded or too slow
(UNAVAILABLE / RESOURCE_EXHAUSTED / DEADLINE_EXCEEDED) the policy's
``onCloudUnavailable`` decides: ``spool`` (durable queue, replayed in order
later, at-least-once by the idempotency key device/stream/frame_seq, the late
result marked ``late: true``), ``edge_only`` (publish the edge result) or
``drop`` (publish nothing for the frame). Sedna drops everything when its cloud
is down and has no timeout (docs/design/escalation.md#sedna-baselines); we do neither.
Every spool call (each ``put``/``ack``/``nack`` is an fsync'd commit, up to ~10 ms)
runs on one dedicated spool thread, never on the event loop, in the order it
was issued; a replayed batch is acknowledged with one ``ack_many`` after its
records reached the sinks (at-least-once; the JSON Lines and MQTT sinks drop a
repeated late record, so a crash between the write and the ack does not duplicate
it), and after the sinks' files were fsync'd (``durable``: a power cut right after the
spool's fsync'd delete lost the unsynced late records, the answers' only other copy). Whatever fails, a frame whose record was not written yet gets its edge
result (``_guarded``); a frame the spool cannot take (full disk) keeps its edge
result with the reason, and replayed items whose ack cannot be written are not
sent again (docs/records.md). A spool whose file turns out damaged (``SpoolCorrupt``)
is salvaged by the spool thread itself, as the start would (``_recover``,
``edge.spool_salvage.salvage_in_use``): the call that met the damage, and those queued behind
it, go on with the new file; one ERROR says where the damaged file went and how many
escalations were salvaged (``corrupt``, ``salvaged``). A salvage that fails (a full disk) is
said and tried again after a back-off (``salvage_failed``), as is damage found again soon
after a salvage; meanwhile replay stops and frames keep their edge result. A stop cuts the
salvage's copy short between two batches (the next start goes on with it), so that the
escalations waiting behind it are spooled within the shutdown grace; a copy that stopped at a
full disk, here or at start, is gone on with by the replay loop after the same back-off
(``_continue_salvage``, ``edge.spool_salvage.continue_salvages``).
Callers: ``edge.pipeline`` (submit), ``edge.daemon`` (replay loop, drain, close).
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import (
    Any,
    Awaitable,
    Callable,
    Dict,
    List,
    NamedTuple,
    Optional,
    Set,
    Tuple,
    TypeVar,
    Union,
)

import numpy as np
from google.protobuf.message import DecodeError

from edge.carrying import Carrier
from edge.cloudreach import CloudReach
from edge.metrics import EdgeMetrics
from edge.payloads import Spooled, build_request, detections_json, note_payload, seen_regions
from edge.records import FrameRecord
from edge.settings import SpoolSettings
from edge.sources.base import Frame
from edge.spool import (
    SPOOL_BUSY_TIMEOUT_S,
    Spool,
    SpoolCorrupt,
    SpoolError,
    SpoolFull,
    SpoolItem,
    SpoolStats,
)
from edge.spool_salvage import SalvagePacing, continue_salvages, salvage_in_use
from edge.stuckentries import StuckEntries
from edge.transports import MAX_MODEL_NAME_CHARS, Transport, TransportError, printable
from edgewise import status
from edgewise.detections import Detections
from edgewise.observability import LogThrottle
from edgewise.policy.deciding import Decision
from edgewise.policy.schema import Merge, Policy, WholeFrames
from edgewise.wire import answer_mismatch

log = logging.getLogger(__name__)
#: "escalation ... spooled" (and "... dropped", by onCloudUnavailable: drop) is logged at most once
#: per this many seconds, with how many were not.
SPOOLED_LOG_INTERVAL_S = 15.0

T = TypeVar("T")
#: Seconds between the log lines of one kind about the cloud's answers (unusable answers,
#: replays refused, replays that failed unexpectedly): the first ``LOG_BURST`` of an
#: interval are logged, the rest counted in the next line.
LOG_INTERVAL_S = 30.0
LOG_BURST = 3
#: answers to replays held while no durable sink takes their records (``Escalating._held``)
MAX_HELD_ANSWERS = 256


class _Answer(NamedTuple):
    """The cloud's answer to a replayed escalation, waiting to be written in spool order."""

    spooled: Spooled
    edge: Detections
    resp: Any  # edgewise.v1.detect_pb2.DetectResponse
    rtt: float


class _Refused(NamedTuple):
    """A replayed escalation the cloud refused for good: its edge result becomes final."""

    spooled: Spooled
    error: str


def _check_answer_is_for(record: FrameRecord, resp: Any) -> None:
    """An answer names the frame it answers (the worker echoes device, stream and frame_seq):
    one for another frame (a misbehaving responder on the broker, a bug upstream) must not
    become this frame's cloud result. ValueError naming the difference."""
    wrong = answer_mismatch(resp, record.device, record.stream, record.frame_seq)
    if wrong:
        raise ValueError("the answer is for another frame: " + wrong)


class Escalating:
    """Sends escalations, falls back per policy, replays the spool."""

    def __init__(
        self,
        device_id: str,
        transports: Dict[str, Transport],
        write: Callable[[FrameRecord], Optional[bool]],
        metrics: EdgeMetrics,
        spool: Optional[Spool] = None,
        default_transport: str = "grpc",
        max_in_flight: int = 16,
        replay_interval_s: float = SpoolSettings.replay_interval_s,
        replay_batch: int = SpoolSettings.replay_batch,
        names: Tuple[str, ...] = (),
        replay_deadline_s: float = SpoolSettings.replay_deadline_s,
        replay_concurrency: int = SpoolSettings.replay_concurrency,
        reopen: Optional[Callable[[], Spool]] = None,
        spool_problem: str = "",
        salvage_pacing: Optional[SalvagePacing] = None,
        durable: Optional[Callable[[], Callable[[], None]]] = None,
    ) -> None:
        self.device_id = device_id
        self.transports = transports
        self.write = write
        #: (event loop) what makes the records written so far durable, called in the spool's
        #: thread before it acknowledges replays (``edge.sinks.Sinks.durable``)
        self.durable = durable
        self.metrics = metrics
        self.spool = spool
        # No spool yet (its filesystem was full at start): how to open it, and why it is not open
        self.reopen = reopen if spool is None else None
        self.spool_problem = spool_problem
        self.default_transport = default_transport
        self.max_in_flight = max_in_flight
        self.replay_interval_s = replay_interval_s
        self.replay_batch = replay_batch
        self.replay_deadline_s = replay_deadline_s
        self.replay_concurrency = replay_concurrency
        self.names = names
        self.carrier = Carrier()  # the answers the pipeline keeps publishing between escalations
        self.tasks: Set[asyncio.Task[None]] = set()  # escalations waiting for the cloud
        self.on_the_wire: Set[Optional[asyncio.Task[Any]]] = set()  # ... of them, still inside transport.detect
        self.settling: Set[asyncio.Task[None]] = set()  # refused at submit, being spooled/settled
        self.shutting_down = False
        self.replay_now = asyncio.Event()
        # One thread: spool calls keep the order they were issued in (Spool is thread-safe).
        self.spool_io = ThreadPoolExecutor(1, thread_name_prefix="spool")
        self._spool_dropped: Optional[Tuple[int, int]] = None  # (expired, evicted) seen so far
        # Replayed items whose late records reached the sinks but whose acknowledgement
        # could not be written (full disk): never sent again, acknowledged when possible.
        self._unacked: List[int] = []
        self.whole_frames = WholeFrames()  # the policy's payload.wholeFrameEverySeconds, per stream
        self._unusable_log = LogThrottle(LOG_INTERVAL_S, burst=LOG_BURST)
        self._refused_log = LogThrottle(LOG_INTERVAL_S, burst=LOG_BURST)
        self._replay_failed_log = LogThrottle(LOG_INTERVAL_S, burst=1)
        self._stuck = StuckEntries(replay_interval_s)  # which spooled entries a round steps over
        self.reach = CloudReach()  # whether the cloud answers, as /healthz shows it
        self._stuck_log = LogThrottle(LOG_INTERVAL_S, burst=1)
        self._unwritten_log = LogThrottle(LOG_INTERVAL_S, burst=1)
        # Answers to replays whose records no durable sink took (a full disk), by idempotency key:
        # the entry stays spooled, and its next round writes this answer instead of asking the
        # cloud again (rounds are kicked by every live answer: the cloud recomputed the same
        # frame several times a second). At most MAX_HELD_ANSWERS; lost at exit (asked again);
        # with the entry's spool id, to forget those that left the spool otherwise (expired, evicted).
        self._held: Dict[str, Tuple[int, Union[Tuple[Any, float], str]]] = {}
        self._spooled_log = LogThrottle(SPOOLED_LOG_INTERVAL_S)
        #: escalations dropped by onCloudUnavailable: drop, said as spooled ones are (an outage
        #: drops one per escalated frame)
        self._dropped_log = LogThrottle(SPOOLED_LOG_INTERVAL_S)
        #: escalations not spooled, by why (one cause's lines never hide another's)
        self._not_spooled_log = {kind: LogThrottle(LOG_INTERVAL_S, burst=LOG_BURST)
                                 for kind in ("disk_full", "write_failed", "refused")}
        #: escalations the cloud refused for good (not spooled: a resend would fail the same way)
        self._refused_log = LogThrottle(LOG_INTERVAL_S, burst=LOG_BURST)
        self._ack_log = LogThrottle(LOG_INTERVAL_S, burst=1)  # acks that fail round after round
        self._spool_log = LogThrottle(LOG_INTERVAL_S, burst=1)  # replay rounds the spool fails
        self._damage_said = False  # the damage of a spool refused when reopened is logged once
        self._reopen_damaged = False  # the spool not open yet is refused as damaged (not a full disk)
        # Salvage of a spool found damaged in use; spool thread only (``_recover``):
        self._salvage_pacing = salvage_pacing or SalvagePacing()
        self._damage_noted = -1  # the spool generation whose damage was counted and said
        self._salvage_problem = ""  # why the last salvage failed (shown by spool_health)
        #: why the last escalation the spool should have taken was not stored (a full disk, a
        #: write error), until one is stored again (shown by spool_health)
        self._put_problem = ""
        self._stats_generation = 0  # the spool file the drop counters' baseline is of (event loop)
        self._salvaging = False  # the spool thread is copying a damaged file (said by drain)
        self._stop: Optional[asyncio.Event] = None  # the replay loop's stop (read by the spool thread)
        # Copies of damaged files cut short by a full disk (at start, or here): gone on with by
        # the replay loop; checked once at the first round, then after each salvage
        self._rest_wanted = True
        self._rest_pacing = SalvagePacing(self._salvage_pacing.first_s, self._salvage_pacing.max_s)

    async def _spool_call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a blocking spool call on the spool thread (``_recovering``: one that meets a
        damaged file salvages it first and runs again on the new file)."""
        return await asyncio.get_running_loop().run_in_executor(self.spool_io, self._recovering, fn, *args)

    def _recovering(self, fn: Callable[..., T], *args: Any) -> T:
        """(spool thread) ``fn(*args)``; when it meets a damaged spool file, salvage the file
        (``_recover``) and, the spool sound again, call it once more, on the new file: what it
        was to store or acknowledge is not lost to the damage (ids and keys are kept, so a
        second try never does a thing twice). ``SpoolCorrupt`` when the spool stays damaged."""
        try:
            return fn(*args)
        except SpoolCorrupt:
            if not self._recover():
                raise
        return fn(*args)

    def _recover(self) -> bool:
        """(spool thread, the only one making spool calls) The spool's file was found damaged:
        move it aside and salvage what it holds into a new file at its path, as the start does,
        when ``_salvage_pacing`` allows (not while the daemon stops: its next start salvages
        it). Counts the damage once (``corrupt``) and says it once, and each salvage
        (``salvaged`` or ``salvage_failed``). True when the spool is sound (again)."""
        spool = self.spool
        if spool is None:
            return False
        if spool.damaged is None:
            return True  # salvaged by a call queued before this one
        now = time.monotonic()
        first = self._damage_noted != spool.generation
        if first:
            self._damage_noted = spool.generation
            self.metrics.spool_events.labels("corrupt").inc()
        stopping = bool(self._stop_reason(spool))
        if stopping or not self._salvage_pacing.due(now):
            if first:
                when = ("at the next start (the daemon is stopping)" if stopping else
                        f"in {self._salvage_pacing.wait_s(now):.0f} s (found damaged again soon after a salvage)")
                self._salvage_problem = f"{spool.damaged}; salvaged {when}"
                log.error("%s. It is salvaged %s; until then escalations the cloud cannot take keep their edge "
                          "result, and spooled ones are not replayed", spool.damaged, when)
            return False
        cause = spool.damage_cause or "damaged"
        self._salvaging = True
        try:
            result = salvage_in_use(spool, should_stop=lambda: self._stop_reason(spool))
        except Exception as exc:  # a SpoolError says why; anything else is a bug, not to be met at every call
            self._salvage_pacing.attempted(now, ok=False)
            wait = self._salvage_pacing.wait_s(now)
            self.metrics.spool_events.labels("salvage_failed").inc()
            why = str(exc) if isinstance(exc, SpoolError) else f"INTERNAL: {exc!r}"
            self._salvage_problem = (f"spool {spool.path} is damaged ({cause}) and could not be salvaged: {why}; "
                                     f"tried again in {wait:.0f} s")
            log.error("%s. Until then escalations the cloud cannot take keep their edge result, and spooled ones "
                      "are not replayed; a restart salvages it too once the cause is fixed", self._salvage_problem,
                      exc_info=None if isinstance(exc, SpoolError) else exc)
            return False
        finally:
            self._salvaging = False
        self._salvage_pacing.attempted(now, ok=True)
        self._rest_wanted = True  # an earlier copy left unfinished, or this one if it stopped at a full disk
        if result.full:
            self._rest_pacing.attempted(now, ok=False)
        self._salvage_problem = ""
        self.metrics.spool_events.labels("salvaged").inc()
        where = (f"moved it to {result.moved_to} (kept for inspection)" if result.moved_to is not None
                 else "its file had been deleted as well, so it was read through the open spool")
        again = f"; the new spool is damaged too: {spool.damaged}" if spool.damaged is not None else ""
        goes_on = "" if result.stopped else "; spooling and replay go on"
        log.error("spool %s was found damaged while the daemon ran (%s); %s and started a new spool at %s: %s%s%s",
                  spool.path, cause, where, spool.path, result.describe(), goes_on, again)
        return spool.damaged is None

    def _stop_reason(self, spool: Spool) -> str:
        """(any thread) Why a salvage's copy should stop now: the daemon is stopping (its next start
        goes on with it); "" otherwise."""
        if self.shutting_down or spool.stop_by is not None or (self._stop is not None and self._stop.is_set()):
            return "the daemon is stopping"
        return ""

    def _continue_salvage(self) -> None:
        """(spool thread) Go on with the copies of damaged files that a full disk cut short (the
        salvage marker, ``continue_salvages``); when one still cannot finish, try again after a
        back-off (``SalvagePacing``: 30 s, doubling), sooner again when it made progress."""
        spool = self.spool
        if spool is None or spool.damaged is not None or self._stop_reason(spool):
            return
        now = time.monotonic()
        self._salvaging = True
        try:
            results = continue_salvages(spool, should_stop=lambda: self._stop_reason(spool), quiet=True)
        except Exception:  # a bug: said, and tried again after the back-off rather than every round
            self._rest_pacing.attempted(now, ok=False)
            log.exception("INTERNAL: going on with the salvage of a damaged spool file failed; tried again in %.0f s",
                          self._rest_pacing.wait_s(now))
            return
        finally:
            self._salvaging = False
        if all(r.finished for r in results):
            self._rest_wanted = False
            self._rest_pacing.reset()
            return
        if any(r.salvaged for r in results):  # room came back (acknowledged replays): the back-off starts over
            self._rest_pacing.reset()
        if not any(r.stopped for r in results):
            self._rest_pacing.attempted(now, ok=False)

    # ------------------------------------------------------------------ submit
    def in_flight(self) -> int:
        return len(self.tasks)

    def _reached(self, exc: TransportError) -> None:
        """A call to the cloud ended in ``exc``: the cloud's outcome for ``/healthz`` (a refusal for
        good is an answer, except of this device's token: every call fails the same way, the cloud
        lost to the device as in an outage; a daemon's own stop is neither)."""
        if self.shutting_down:
            return
        if exc.spoolable or exc.status == status.UNAUTHENTICATED:
            self.reach.failed(printable(str(exc)))
        else:
            self.reach.answered()

    def spool_health(self) -> Dict[str, str]:
        """The spool as ``/healthz`` reports it: ``ok``; ``damaged`` (the file is malformed:
        nothing is spooled or replayed until it is salvaged, which the spool thread does by
        itself, at once or after a back-off; ``problem`` says which); ``unavailable`` (it could
        not be opened, e.g. a full disk; opened again every replay interval); ``full`` (the
        last escalation it should have taken was not stored: its disk is full or refused the
        write; until one is stored again)."""
        if self.spool is not None and self.spool.damaged is not None:
            return {"state": "damaged", "problem": self._salvage_problem or self.spool.damaged}
        if self.spool is None:
            if self.reopen is None and not self.spool_problem:
                return {"state": "off"}  # built without a spool (no policy file: nothing escalates)
            return {"state": "damaged" if self._reopen_damaged else "unavailable", "problem": self.spool_problem}
        if self._put_problem:
            return {"state": "full", "problem": self._put_problem}
        return {"state": "ok"}

    def submit(self, frame: Frame, dets: Detections, decision: Decision, policy: Policy,
               record: FrameRecord, blobs: Optional[np.ndarray] = None) -> None:
        """Start escalating one frame; the frame's record is written when it is settled.
        The request (a JPEG encode, milliseconds) is built off the event loop; ``blobs``
        (the motion no detection explains) seed a region payload's regions."""
        if len(self.tasks) >= self.max_in_flight:
            refused = TransportError(
                status.RESOURCE_EXHAUSTED, f"{len(self.tasks)} escalations already in flight (cloud.max_in_flight)")
            if len(self.settling) >= self.max_in_flight:
                # The spool thread is behind as well (more escalations than fsyncs per
                # second): the bound on that queue; the frame keeps its edge result.
                self.metrics.spool_events.labels("refused").inc()
                self._settle_without_cloud(policy, record, TransportError(
                    status.RESOURCE_EXHAUSTED, f"{len(self.settling)} escalations already waiting for the spool"))
                return
            settle = asyncio.ensure_future(self._guarded(
                self._refuse(frame, dets, decision, policy, record, refused, blobs), record))
            self.settling.add(settle)
            settle.add_done_callback(self._settled)
            return
        task = asyncio.ensure_future(self._guarded(self._escalate(frame, dets, decision, policy, record, blobs),
                                                   record))
        self.tasks.add(task)
        self.metrics.in_flight.set(len(self.tasks))
        task.add_done_callback(self._done)

    async def _request(self, frame: Frame, dets: Detections, decision: Decision, policy: Policy,
                       record: FrameRecord, blobs: Optional[np.ndarray] = None) -> Optional[Any]:
        """The frame's DetectRequest, built in a worker thread (what it sends noted in the
        record: payload mode and bytes, the crop or the regions); None when it cannot be
        built (the record is written edge-only)."""
        # decided before the first await: escalations of a stream take their turns in order
        mode = self.whole_frames.mode(policy.spec.payload, frame.stream_id, record.decided_s)
        try:
            req, plan = await asyncio.get_running_loop().run_in_executor(
                None, build_request, self.device_id, frame, dets, decision, policy, blobs, mode)
        except Exception as exc:  # an unencodable frame must not stop the pipeline
            log.exception("cannot build escalation of %s/%d", frame.stream_id, frame.seq)
            record.outcome = "edge_only"
            record.error = f"INTERNAL: {exc}"
            self.metrics.escalations.labels(decision.reason, "error").inc()
            self.write(record)
            return None
        if plan.image is frame.image:  # the whole frame went (a partial mode found nothing to crop)
            self.whole_frames.sent_whole(frame.stream_id, record.decided_s)
        note_payload(record, req, plan, mode)
        return req

    async def _refuse(self, frame: Frame, dets: Detections, decision: Decision, policy: Policy,
                      record: FrameRecord, exc: TransportError, blobs: Optional[np.ndarray] = None) -> None:
        req = await self._request(frame, dets, decision, policy, record, blobs)
        if req is not None:
            await self._fail(req, policy, record, exc)

    async def _guarded(self, settle: Awaitable[None], record: FrameRecord) -> None:
        """Run one escalation to its end; whatever goes wrong, a frame whose record was not
        written yet gets its edge result written (the policy's drop aside)."""
        try:
            await settle
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("escalation of %s failed", record.key)
            if record.outcome == "pending":
                record.outcome = "edge_only"
                record.error = f"INTERNAL: {exc!r}"
                self.metrics.escalations.labels(record.reason, "error").inc()
                self.write(record)

    def _done(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        self.metrics.in_flight.set(len(self.tasks))
        self._settled(task)

    def _settled(self, task: asyncio.Task[None]) -> None:
        self.settling.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("escalation task failed: %r", task.exception())

    def _transport(self, name: str) -> Transport:
        t = self.transports.get(name)
        if t is None:
            raise TransportError(status.UNAVAILABLE, f"transport {name!r} is not configured in the settings (cloud.*)")
        return t

    async def _escalate(self, frame: Frame, dets: Detections, decision: Decision, policy: Policy,
                        record: FrameRecord, blobs: Optional[np.ndarray] = None) -> None:
        reason = record.reason
        req = await self._request(frame, dets, decision, policy, record, blobs)
        if req is None:
            return
        if self.shutting_down:  # drain() already cut off the calls on the wire
            await self._fail(req, policy, record, TransportError(status.UNAVAILABLE, "daemon shutting down"))
            return
        t0 = time.monotonic()
        me = asyncio.current_task()
        self.on_the_wire.add(me)
        try:
            transport = self._transport(policy.spec.transport or self.default_transport)
            resp = await transport.detect(req, policy.spec.deadline_ms / 1000.0)
        except TransportError as exc:
            failure: Optional[TransportError] = exc
        except asyncio.CancelledError:
            if not self.shutting_down:
                raise
            failure = TransportError(status.UNAVAILABLE, "daemon shutting down")  # cut off by drain()
        else:
            failure = None
        finally:
            self.on_the_wire.discard(me)
        if failure is not None:
            (self._stuck.unanswered if failure.spoolable else self._stuck.answered)()
            self._reached(failure)
            await self._fail(req, policy, record, failure)
            return
        rtt = time.monotonic() - t0
        self.metrics.cloud_rtt.labels(transport.name).observe(rtt)
        self._stuck.answered()
        self.reach.answered()
        self.replay_now.set()
        try:
            self._write_merged(record, dets, resp, policy.spec.merge, rtt, late=False)
        except ValueError as exc:  # boxes the cloud sent do not validate: the frame keeps its edge result
            why = printable(exc)
            held = self._unusable_log.allow()
            if held is not None:
                log.warning("cloud answer for %s/%d unusable: %s; edge result kept%s", req.stream_id, req.frame_seq,
                            why, f" ({held} more unusable answers not logged)" if held else "")
            record.outcome = "edge_only"
            record.error = f"INVALID_ARGUMENT: cloud answer: {why}"
            self.metrics.escalations.labels(reason, "error").inc()
            self.write(record)
            return
        self.metrics.escalations.labels(reason, "ok").inc()

    def _write_merged(self, record: FrameRecord, dets: Detections, resp: Any, merge: Merge, rtt: float,
                      late: bool) -> Optional[bool]:
        """Merge the cloud's answer in and write the record (what ``write`` said: False when a
        durable sink did not take it); ValueError (record untouched) when the answer's
        detections do not validate."""
        from edgewise.wire import answer_detections

        _check_answer_is_for(record, resp)
        cloud = answer_detections(resp.detections, names=dets.names or self.names,
                                  frame_size=(record.width, record.height), source="cloud")
        regions = seen_regions(record)
        merged = merge.apply(dets, cloud, regions)
        record.detections = detections_json(merged)
        record.outcome = "cloud"
        record.cloud_rtt_ms = round(rtt * 1000.0, 2)
        record.cloud_model = printable(resp.model_name, MAX_MODEL_NAME_CHARS)  # the cloud's words: untrusted
        record.late = late
        record.emit_unix_ns = time.time_ns()
        kept = self.write(record)
        if not late:
            self.carrier.answered(record.stream, record.frame_seq, merge.carried(dets, cloud, regions), merge.carry(),
                                  regions)
        return kept

    async def _fail(self, req: Any, policy: Policy, record: FrameRecord, exc: TransportError) -> None:
        spec = policy.spec
        action = spec.on_cloud_unavailable if exc.spoolable else "edge_only"
        reason = record.reason
        record.error = str(exc)
        if action == "spool" and (self.spool is not None or self.spool_problem):
            key = record.key
            stored: bool
            stats: Optional[SpoolStats]
            problem: Optional[SpoolError]
            if self.spool is None:  # not open yet (its filesystem was full at start): as a full disk now
                why = SpoolCorrupt if self._reopen_damaged else SpoolFull
                stored, stats, problem = False, None, why(self.spool_problem)
            else:
                meta = Spooled(record, spec.merge, spec.deadline_ms,
                               spec.transport or self.default_transport).to_meta()
                stored, stats, problem = await self._spool_call(self._put, key, req.SerializeToString(), meta)
            if stored:
                self._put_problem = ""
                record.outcome = "spooled"
                self.metrics.spool_events.labels("put").inc()
                held = self._spooled_log.allow()  # one line per SPOOLED_LOG_INTERVAL_S in an outage
                if held is not None:
                    more = f" ({held} more spooled since the last such line)" if held else ""
                    log.info("escalation %s spooled: %s%s", key, exc, more)
            elif isinstance(problem, SpoolCorrupt):  # said once, as an ERROR, and counted
                record.outcome = "edge_only"
                record.error = f"{exc}; not spooled: {problem}"
                self._spool_damaged(problem, escalation=True)
                log.debug("escalation %s not spooled, edge result kept: %s", key, problem)
            elif problem is not None:  # full disk or a failed write: the edge result is kept
                record.outcome = "edge_only"
                record.error = f"{exc}; not spooled: {problem}"
                kind = "disk_full" if isinstance(problem, SpoolFull) else "write_failed"
                self.metrics.spool_events.labels(kind).inc()
                self._put_problem = str(problem)
                held = self._not_spooled_log[kind].allow()  # a full disk refuses every escalation: not a line each
                if held is not None:
                    log.warning("escalation %s not spooled, edge result kept: %s%s", key, problem,
                                f" ({held} more not spooled since the last such line)" if held else "")
            else:
                record.outcome = "edge_only"
                self.metrics.spool_events.labels("refused").inc()
                held = self._not_spooled_log["refused"].allow()
                if held is not None:
                    log.warning("escalation %s not spooled (spool full: max_bytes); edge result kept%s", key,
                                f" ({held} more not spooled since the last such line)" if held else "")
            self.metrics.escalations.labels(reason, record.outcome).inc()
            if stats is not None:
                self._show_spool(stats)
            self.write(record)
            return
        self._settle_without_cloud(policy, record, exc)

    def _settle_without_cloud(self, policy: Policy, record: FrameRecord, exc: TransportError) -> None:
        """Publish the edge result, or nothing when the policy says drop (and ``exc`` is a
        failure the policy's onCloudUnavailable is about)."""
        reason = record.reason
        record.error = str(exc)
        if exc.spoolable and policy.spec.on_cloud_unavailable == "drop":
            self.metrics.escalations.labels(reason, "dropped").inc()
            self.metrics.drops.labels(record.stream, "cloud_unavailable").inc()
            record.outcome = "dropped"  # settled: no record is written
            held = self._dropped_log.allow()  # one line per SPOOLED_LOG_INTERVAL_S in an outage
            if held is not None:
                more = f" ({held} more dropped since the last such line)" if held else ""
                log.info("escalation %s dropped (policy onCloudUnavailable=drop): %s%s", record.key, exc, more)
            return
        record.outcome = "edge_only"
        self.metrics.escalations.labels(reason, "edge_only").inc()
        if not exc.spoolable:
            # the cloud refused it for good (a payload over the gateway's limits, a bad token):
            # every such escalation fails the same way, so it is said, not only recorded
            held = self._refused_log.allow()
            if held is not None:  # INVALID_ARGUMENT has other causes than size: the advice says when it applies
                log.warning("escalation %s refused by the cloud, edge result kept: %s; its payload was %s bytes "
                            "(spec.payload.mode %s): where the message names a size limit, lower "
                            "spec.payload.jpegQuality, send regions or a downscaled frame (spec.payload.mode), or "
                            "raise the gateway's limits.max_message_bytes and limits.max_image_bytes%s", record.key,
                            exc, record.payload_bytes, record.payload,
                            f" ({held} more refused since the last such line)" if held else "")
        self.write(record)

    def _put(self, key: str, payload: bytes, meta: Dict[str, Any]
             ) -> Tuple[bool, Optional[SpoolStats], Optional[SpoolError]]:
        """(spool thread) Store one escalation: (stored, the spool's stats after it, why it
        could not be written)."""
        assert self.spool is not None
        try:
            stored = self._recovering(self.spool.put, key, payload, meta)  # a damaged file: salvaged, stored after
        except SpoolError as exc:
            return False, None, exc
        try:
            return stored, self.spool.stats(), None
        except SpoolError:  # the gauges wait for the next stats; the item is stored
            return stored, None, None

    def _spool_damaged(self, exc: SpoolCorrupt, escalation: bool = False) -> None:
        """The spool's file is damaged: counted (``corrupt``) for every ``escalation`` not spooled
        because of it. An open spool's damage is counted and said once by ``_recover``, which
        salvages it; a spool refused as damaged when reopened is counted and said once here."""
        if self.spool is not None:
            if escalation:
                self.metrics.spool_events.labels("corrupt").inc()
            return
        if escalation or not self._damage_said:
            self.metrics.spool_events.labels("corrupt").inc()
        if self._damage_said:
            return
        self._damage_said = True
        log.error("%s. Until then escalations the cloud cannot take keep their edge result, and spooled "
                  "ones are not replayed%s", exc,
                  f" ({len(self._unacked)} of its escalations were delivered but cannot be acknowledged)"
                  if self._unacked else "")

    async def _stats(self, spool: Spool) -> Optional[SpoolStats]:
        """The spool's stats, None when they cannot be read (said by ``_spool_failed``)."""
        try:
            return await self._spool_call(spool.stats)
        except SpoolError as exc:
            self._spool_failed(exc)
            return None

    def _spool_failed(self, exc: SpoolError) -> None:
        """A spool call of the replay failed: a damaged file is said once, anything else
        throttled (the next round tries again)."""
        if isinstance(exc, SpoolCorrupt):
            self._spool_damaged(exc)
            return
        held = self._spool_log.allow()
        if held is not None:
            more = f" ({held} more such failures)" if held else ""
            log.warning("spool replay round failed: %s; tried again every spool.replay_interval_s%s", exc, more)

    # ------------------------------------------------------------------ replay
    async def replay_loop(self, stop: asyncio.Event) -> None:
        """Drain the spool in order whenever the cloud answers; runs until ``stop``. Without a
        spool yet (``reopen``), try to open it every interval first."""
        if self.spool is None and self.reopen is None:
            return
        self._stop = stop
        while not stop.is_set():
            settled = 0
            try:
                if self.spool is not None and self.spool.damaged is not None:
                    await self._spool_call(self._recover)  # once the back-off of a failed salvage is over
                if self.spool is not None and self.spool.damaged is None:
                    await self._recovered(self.spool)
                if (self.spool is not None and self.spool.damaged is None and self._rest_wanted
                        and self._rest_pacing.due(time.monotonic())):
                    await self._spool_call(self._continue_salvage)
                settled = await self._reopened() if self.spool is None else await self.replay_once()
            except SpoolError as exc:
                self._spool_failed(exc)
            except Exception:
                log.exception("spool replay round failed")
            if settled:
                continue  # more may be waiting
            self.replay_now.clear()
            stopper = asyncio.ensure_future(stop.wait())
            kick = asyncio.ensure_future(self.replay_now.wait())
            try:
                await asyncio.wait([stopper, kick], timeout=self.replay_interval_s,
                                   return_when=asyncio.FIRST_COMPLETED)
            finally:
                stopper.cancel()
                kick.cancel()

    async def _recovered(self, spool: Spool) -> None:
        """Put a spool whose file was deleted under the daemon back on disk (items kept)."""
        try:
            moved = await self._spool_call(spool.recover_if_deleted)
        except SpoolError as exc:
            log.error("spool %s was deleted while the daemon runs and cannot be written again (%s); what is "
                      "spooled is lost if the daemon stops before it is replayed", spool.path, exc)
            return
        if moved is not None:
            self.metrics.spool_events.labels("recreated").inc()
            log.error("spool %s was deleted while the daemon runs; made it again with the %d escalations it "
                      "held", spool.path, moved)

    async def _reopened(self) -> int:
        """One attempt to open the spool that could not be opened at start; 0 (nothing settled)."""
        assert self.reopen is not None
        try:
            self.spool = await self._spool_call(self.reopen)
        except SpoolError as exc:
            self._reopen_damaged = isinstance(exc, SpoolCorrupt)
            if isinstance(exc, SpoolCorrupt):
                self._spool_damaged(exc)
            self.spool_problem = str(exc)
            log.debug("spool still cannot be opened: %s", exc)
            return 0
        log.info("spool %s opened: escalations are spooled again and its backlog is replayed", self.spool.path)
        self.spool_problem = ""
        self.reopen = None
        self.replay_now.set()
        return 0

    async def replay_once(self) -> int:
        """One replay round: send spooled entries oldest first, ``replay_concurrency`` at a
        time, until one cannot be delivered now; the settled ones (delivered or rejected) are
        acknowledged together once their records were written. Returns how many settled.

        Answers are written in spool order whatever order they arrive in. When an entry cannot
        be delivered, the entries sent beside it that were answered are written (their answer
        is not thrown away) and the round stops: the rest waits, in order. Except for an entry
        the cloud keeps failing while it answers others (``edge.stuckentries``): it is stepped
        over, and tried again less and less often; when the cloud is not known to answer, a
        round stopped by such an entry probes one entry behind it (``_probe``). Once the replay
        loop's stop is set no new entries are sent; a round cancelled at the end of the stop's
        grace writes the answers already in, like a blocked round.

        When the acknowledgement cannot be written (full disk) the settled ids are kept
        and acknowledged in a later round; they are never sent again meanwhile (the
        entries after them still are). A damaged spool file (``SpoolCorrupt``) is said
        once and nothing more is replayed from it (0)."""
        spool = self.spool
        assert spool is not None
        if spool.damaged is not None:
            return 0
        if self._unacked:
            await self._ack()
        stuck = self._stuck
        try:  # expires what is too old; reads past the stuck entries the round skips and the unacknowledged,
            # and one entry past the batch: a probe's candidate when the whole batch is one window
            peeked = await self._spool_call(spool.peek, self.replay_batch + stuck.resting_count() + 1, 0,
                                            frozenset(self._unacked))
        except SpoolError as exc:
            self._spool_failed(exc)
            return 0
        if self._held:  # the spool is first in, first out: an unsettled entry before its head has left it
            head = peeked[0].id if peeked else None
            self._held = {k: v for k, v in self._held.items() if head is not None and v[0] >= head}
        stuck.keep(e.id for e in peeked)
        ready: List[SpoolItem] = []
        skipped: List[SpoolItem] = []
        for e in peeked:
            (skipped if stuck.resting(e.id) else ready).append(e)
        entries = ready[:self.replay_batch]
        if skipped:
            self._stepped_over(skipped[0])
        settled: List[int] = []
        blocker: Optional[SpoolItem] = None  # the entry that stops the round
        probing = False  # ... is stuck, and the cloud not known to answer: one entry behind it is probed
        step = max(1, self.replay_concurrency)
        try:
            for start in range(0, len(entries), step):
                if start and self._stop is not None and self._stop.is_set():
                    break  # a stop: no new replay (the rest stays spooled), the one sent may finish
                # what the byte cap evicted (or age expired) since the peek is lost: not sent; what is
                # sent, or answered and not yet acknowledged, is not lost: the cap evicts it last
                try:
                    kept = await self._spool_call(spool.present, [e.id for e in entries[start:start + step]])
                except SpoolError as exc:
                    self._spool_failed(exc)
                    break
                window = [e for e in entries[start:start + step] if e.id in kept]
                spool.sending = frozenset(self._unacked + settled + [e.id for e in window])
                sent = [asyncio.ensure_future(self._send_replay(e)) for e in window]
                try:
                    answers = await asyncio.gather(*sent)
                except asyncio.CancelledError:  # the stop's grace is over: what the cloud answered is written
                    settled.extend(e.id for e, t in zip(window, sent) if t.done() and not t.cancelled()
                                   and t.exception() is None and self._settle_replay(e, t.result()) is not None)
                    raise
                for e, answer in zip(window, answers):
                    done = self._settle_replay(e, answer)
                    if done is None:  # the cloud is still unreachable, or a sink cannot take the record
                        await self._spool_call(spool.nack, e.id)
                        if answer is None and stuck.steps_over(e.id):  # (counted by _send_replay)
                            self._stepped_over(e)  # the cloud answers others: the rest goes on
                            continue
                        if blocker is None:  # the rest waits, in order
                            blocker, probing = e, answer is None and stuck.needs_probe(e.id)
                    else:
                        stuck.settled(e.id)
                        settled.append(e.id)
                if blocker is not None:
                    if probing and not (self._stop is not None and self._stop.is_set()):
                        await self._probe(ready[start + step:], settled)
                    break
        finally:  # also when cancelled at shutdown: what reached the sinks is acknowledged
            if settled:
                self._unacked.extend(settled)
                await self._ack()
            spool.sending = frozenset(self._unacked)
            st = await self._stats(spool)
            if st is not None:
                self._show_spool(st)
        return len(settled)

    async def _probe(self, behind: List[SpoolItem], settled: List[int]) -> None:
        """The round stopped at a stuck entry while the cloud is not known to answer: send the
        entry ``behind`` it that the cloud failed least often (``StuckEntries.probe``). Its answer
        says the cloud answers (the next round steps over the stuck one); its failure is counted
        in memory only (no attempt written: this is what an outage costs each round)."""
        assert self.spool is not None
        stuck = self._stuck
        target = stuck.probe([e.id for e in behind])
        if target is None:
            return
        e = next(e for e in behind if e.id == target)
        kept = await self._spool_call(self.spool.present, [e.id])
        if e.id not in kept:
            return
        self.spool.sending = frozenset(self._unacked + settled + [e.id])
        answer = await self._send_replay(e)
        done = self._settle_replay(e, answer)
        if done is None:
            if answer is None:  # (counted by _send_replay): the cloud answers nothing, as far as we know
                stuck.unanswered()
            return
        stuck.settled(e.id)
        settled.append(e.id)

    def _stepped_over(self, e: SpoolItem) -> None:
        """Say (at most once per ``LOG_INTERVAL_S``) that the stuck entry ``e`` is stepped over."""
        held = self._stuck_log.allow()
        if held is not None:
            log.warning("spooled %s failed %d replays in a row while the cloud answers others; stepped over, so "
                        "the escalations behind it are replayed meanwhile (it is tried again, less and less often, "
                        "until spool.max_age_s)%s", e.key, self._stuck.failures(e.id),
                        f" ({held} more such lines held back)" if held else "")

    async def _ack(self) -> None:
        """Acknowledge the settled replays; on a write failure keep them for the next round
        (said at most once per ``LOG_INTERVAL_S``); a damaged file is said once, not retried."""
        assert self.spool is not None
        try:
            synced = self.durable() if self.durable is not None else None
            await self._spool_call(self._ack_synced, synced, self._unacked)
        except SpoolCorrupt as exc:
            self._spool_damaged(exc)
            return
        except (SpoolError, OSError) as exc:
            if not isinstance(exc, SpoolError):  # the late records' files could not be synced
                exc = SpoolError(f"the sinks' records could not be synced to disk first: {exc.strerror or exc}")
            self.metrics.spool_events.labels("ack_failed").inc()
            held = self._ack_log.allow()
            if held is not None:
                more = f"; {held} more failed acknowledgements since the last such line" if held else ""
                log.warning("%d replayed escalations delivered but not yet acknowledged (%s); "
                            "acknowledging them again later, they are not sent again%s", len(self._unacked), exc,
                            more)
            return
        self._unacked.clear()

    def _ack_synced(self, synced: Optional[Callable[[], None]], ids: List[int]) -> int:
        """(spool thread) Sync the sinks' files (``durable``), then delete ``ids`` from the spool:
        a late record must be on disk before the only other copy of its answer goes."""
        if synced is not None:
            synced()
        assert self.spool is not None
        return self.spool.ack_many(ids)

    async def _send_replay(self, e: SpoolItem) -> Union[None, bool, _Answer, _Refused]:
        """Send one spooled escalation: its answer to write, its refusal (the edge result
        becomes final), False when the entry is unreadable (to be acked away), None to keep
        it for later."""
        from edgewise.v1 import detect_pb2
        from edgewise.wire import detections_from_proto

        try:  # an unreadable entry must not block the spool's head forever
            spooled = Spooled.from_meta(e.meta)
            req = detect_pb2.DetectRequest()
            req.ParseFromString(e.payload)
            edge = detections_from_proto(req.edge_detections, names=self.names, source="edge")
        except (ValueError, DecodeError) as exc:
            self.metrics.spool_events.labels("rejected").inc()
            log.error("spooled %s is unreadable (%s); dropped from the spool", e.key, exc)
            return False
        req.replay = True
        held = self._held.get(e.key)
        if held is not None:  # answered in an earlier round, its record not written then: not asked again
            answered = held[1]
            if isinstance(answered, str):
                return _Refused(spooled, answered)
            return _Answer(spooled, edge, answered[0], answered[1])
        transport = self.transports.get(spooled.transport) or self.transports.get(self.default_transport)
        if transport is None:  # no cloud configured at all (edge-only now): kept, and said
            if self._replay_failed_log.allow() is not None:
                log.warning("spooled escalations wait: %s was sent over %s, and this device configures no cloud "
                            "transport now (cloud.endpoints, cloud.mqtt.host); they are replayed once one is",
                            e.key, spooled.transport)
            self._stuck.failed(e.id)
            return None
        t0 = time.monotonic()
        try:
            resp = await transport.detect(req, max(spooled.deadline_ms / 1000.0, self.replay_deadline_s))
        except TransportError as exc:
            self._reached(exc)
            if exc.spoolable:
                self.metrics.spool_events.labels("nack").inc()
                log.debug("replay of %s failed (%s); retrying later", e.key, exc)
                if exc.status == status.RESOURCE_EXHAUSTED:  # a busy cloud: nothing about this entry
                    self._stuck.unanswered()
                else:  # timed out or not carried: maybe this entry's own doing
                    self._stuck.failed(e.id)
                return None
            self._stuck.answered()
            return _Refused(spooled, f"cloud refused the replay: {exc}")  # a resend would fail the same way
        except Exception as exc:  # not the transport's kind of failure: it must not block the spool's head
            self._replay_failed(e, "sending", exc)
            return _Refused(spooled, f"INTERNAL: the replay failed: {printable(repr(exc))}")
        rtt = time.monotonic() - t0
        self.metrics.cloud_rtt.labels(transport.name).observe(rtt)
        self._stuck.answered()
        self.reach.answered()
        return _Answer(spooled, edge, resp, rtt)

    def _settle_replay(self, e: SpoolItem, answer: Union[None, bool, _Answer, _Refused]) -> Optional[bool]:
        """Write a replayed escalation's late record, in spool order. True: written (to be
        acked); False: nothing to write (unreadable entry, to be acked away); None: keep it in
        the spool, for the cloud did not answer or a durable sink did not take the record
        (a full disk): the answer is asked for again later rather than lost."""
        if answer is None or isinstance(answer, bool):
            return answer
        if isinstance(answer, _Answer):
            record = answer.spooled.record
            record.error = None
            try:
                kept = self._write_merged(record, answer.edge, answer.resp, answer.spooled.merge,
                                          answer.rtt, late=True)
            except ValueError as exc:
                answer = _Refused(answer.spooled, f"cloud answer to the replay unusable: {printable(exc)}")
            except Exception as exc:  # a bug on our side must not block the spool's head either
                self._replay_failed(e, "merging the answer to", exc)
                answer = _Refused(answer.spooled, f"INTERNAL: merging the replay's answer failed: "
                                                  f"{printable(repr(exc))}")
            else:
                if kept is False:
                    self._unwritten(e, (answer.resp, answer.rtt))
                    return None
                self._held.pop(e.key, None)
                self.metrics.escalations.labels(record.reason, "late").inc()
                self.metrics.spool_events.labels("replayed").inc()
                return True
        # refused for good: the frame's final record is its edge result, with the reason
        record = answer.spooled.record
        record.outcome = "edge_only"
        record.error = answer.error
        record.late = True
        record.emit_unix_ns = time.time_ns()
        if self.write(record) is False:
            self._unwritten(e, answer.error)
            return None
        self._held.pop(e.key, None)
        self.metrics.escalations.labels(record.reason, "edge_only").inc()
        self.metrics.spool_events.labels("rejected").inc()
        held = self._refused_log.allow()
        if held is not None:
            log.error("replayed %s: %s; its edge result is final, dropped from the spool%s", e.key, answer.error,
                      f" ({held} more refused replays not logged)" if held else "")
        return True

    def _replay_failed(self, e: SpoolItem, doing: str, exc: Exception) -> None:
        """Say (throttled, with the traceback) that replaying ``e`` failed unexpectedly; the
        entry is settled with its edge result rather than failing every round."""
        held = self._replay_failed_log.allow()
        if held is not None:
            log.error("%s replayed %s failed unexpectedly; its edge result is final%s", doing.capitalize(), e.key,
                      f" ({held} more such failures not logged)" if held else "",
                      exc_info=(type(exc), exc, exc.__traceback__))

    def _unwritten(self, e: SpoolItem, answer: Union[Tuple[Any, float], str]) -> None:
        """Count and say (a few times a minute) why a replayed entry stays spooled though the
        cloud answered, and hold the ``answer`` for its next round."""
        self.metrics.spool_events.labels("sink_failed").inc()
        if e.key in self._held or len(self._held) < MAX_HELD_ANSWERS:
            self._held[e.key] = (e.id, answer)
        held = self._unwritten_log.allow()
        if held is not None:
            log.warning("the record of replayed %s could not be written to every durable sink; it stays "
                        "spooled, and its answer is written when a sink takes records again%s", e.key,
                        f" ({held} more such records since the last such line)" if held else "")

    async def update_spool_metrics(self) -> Optional[SpoolStats]:
        """Refresh the spool gauges (depth, bytes, oldest age); the stats they came from."""
        if self.spool is None:
            return None
        st = await self._stats(self.spool)
        if st is not None:
            self._show_spool(st)
        return st

    def _show_spool(self, st: SpoolStats) -> None:
        """Gauges from the spool's stats; its persisted drop counters (age expiry and
        byte-cap eviction, whichever call did them) become spool_events increments."""
        if st.generation < self._stats_generation:
            return  # read from a file salvaged since
        if st.generation > self._stats_generation:  # a new file after damage: its counters start at 0
            self._stats_generation = st.generation
            if self._spool_dropped is not None:
                self._spool_dropped = (0, 0)
        self.metrics.spool_depth.set(st.depth)
        self.metrics.spool_bytes.set(st.bytes)
        self.metrics.spool_oldest.set(st.oldest_age_s)
        now = (st.dropped_age_cap, st.dropped_bytes_cap)
        if self._spool_dropped is not None:  # the first stats (at start) are the baseline
            for event, n, seen in zip(("expired", "evicted"), now, self._spool_dropped):
                if n > seen:
                    self.metrics.spool_events.labels(event).inc(n - seen)
            if now[0] > self._spool_dropped[0]:
                log.warning("%d spooled escalations expired (spool.max_age_s) and were discarded",
                            now[0] - self._spool_dropped[0])
        self._spool_dropped = now

    # ---------------------------------------------------------------- shutdown
    async def replay_rest(self, limit_s: float, stop: asyncio.Event) -> int:
        """Every source ended by itself (a file): wait up to ``limit_s`` while the escalations
        in flight settle and the replay loop empties the spool, so a recorded video's
        escalations get their answers before the daemon exits. Returns the entries still
        spooled (they stay on disk for the next start); ``stop`` (SIGTERM) cuts it short."""
        if self.spool is None or limit_s <= 0:
            return 0
        loop = asyncio.get_running_loop()
        end = loop.time() + limit_s
        while True:
            busy = self.tasks | self.settling
            if busy and loop.time() < end and not stop.is_set():
                await asyncio.wait(list(busy), timeout=min(0.2, end - loop.time()))
                continue
            st = await self.update_spool_metrics()
            depth = len(self.spool) if st is None else st.depth
            left = end - loop.time()
            if (depth == 0 and not busy) or left <= 0 or stop.is_set() or self.spool.damaged is not None:
                return depth  # what is still in flight settles in drain()
            self.replay_now.set()  # do not wait for the replay interval
            try:
                await asyncio.wait_for(stop.wait(), timeout=min(0.2, left))
            except asyncio.TimeoutError:
                pass

    async def drain(self, grace_s: float) -> None:
        """Let in-flight escalations finish for ``grace_s``; then cut off those still
        waiting for the cloud, which settle per policy (spooled, usually), so SIGTERM
        loses nothing the policy wants kept."""
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=grace_s)
        self.shutting_down = True
        for task in list(self.on_the_wire):
            if task is not None:
                task.cancel()
        rest = self.tasks | self.settling
        if rest:
            # Settling is spool writes (~10 ms each), bounded by cloud.max_in_flight.
            _, late = await asyncio.wait(list(rest), timeout=max(5.0, grace_s))
            if late and self.spool is not None:
                # The spool is stuck (its lock held elsewhere, or a salvage's batch on a slow card):
                # the writes still queued refuse at once and their frames keep the edge result; the
                # one waiting for the lock ends within edge.spool.BUSY_SLICE_S, a salvage at its next batch.
                held = (" (the spool thread is salvaging its damaged file: the copy stops after its current batch, "
                        "and the next start goes on with it)" if self._salvaging else "")
                log.warning("%d escalations still waiting for the spool at shutdown%s; the rest keep "
                            "their edge result", len(late), held)
                self.spool.stop_by = time.monotonic()
                _, late = await asyncio.wait(list(late), timeout=SPOOL_BUSY_TIMEOUT_S + 5.0)
            if late:
                log.error("%d escalations not settled at shutdown", len(late))
        if self.spool is not None and self.spool.stop_by is None:
            # From here a spool write never waits for a lock another process holds (the replay's
            # last acknowledgement, the calls close() lets finish): it is tried once
            self.spool.stop_by = time.monotonic()

    async def close(self) -> None:
        """After ``drain``: let queued spool calls finish, stop the spool thread, and give the
        escalations they settle the moment to write their records (before the sinks close)."""
        await asyncio.get_running_loop().run_in_executor(None, self.spool_io.shutdown)
        rest = self.tasks | self.settling
        if rest:
            await asyncio.wait(list(rest), timeout=5.0)
