"""Reading the edge's frame records back for a replay: files, order, and what is odd.

The edge daemon writes one JSON object per frame (docs/records.md) to JSON Lines
files that an operator may rotate and gzip. :func:`frames` reads any number of
them, plain or gzip'd (told by the magic bytes, not the name), and yields each
stream's frames in the order the daemon decided them: by ``frame_seq``, which
also orders daemon restarts (a run starts at ``epoch << 32``). Files are read in the
order of their first record's capture time, so rotated files may be given in any
order, under any name: the edge's own rotation (``edge.rotation``: ``<file>.<UTC
time>Z``, gzip'd to ``.gz``), ``logrotate``'s, or a shell glob such as
``records.jsonl*`` (which may also catch a ``.gz.tmp`` being written while its source
still exists: the source's records come twice and the second copy counts as
duplicates; a gzip file cut short gives the records before the cut, and a note).

Order and memory: the daemon writes an escalated frame's record only when its
escalation is settled, so records are a little out of order in the file. A reorder
window puts them back without holding a day of records: each stream holds its
records in a heap by ``frame_seq``, and when a record comes to a stream that holds its
window, the smallest goes on to be decided. The window is :data:`REORDER_FRAMES` records
of a stream, or fewer: all streams together hold at most :data:`REORDER_BUDGET` records
(the memory a replay's reordering takes, however many streams the files hold), so with
more than ``REORDER_BUDGET // REORDER_FRAMES`` streams each stream's window is its share,
``REORDER_BUDGET // streams``, and it shrinks as streams appear (the streams holding more
give their smallest on). A record that comes at most its stream's window late (in the
file, after that many of its stream's records that the daemon decided after it) is put
back in order; one that comes later is decided where it comes and counted
(:attr:`Reading.beyond_window`; the replay's note names the window and the budget).
A frame already decided is told by its ``frame_seq`` at any distance, however small the
window: the frame_seqs each stream yielded are kept as runs of consecutive numbers
(:class:`_Released`, 16 bytes a run; a run ends only where the daemon wrote no record),
never as a set of records or keys.

Every read of a file goes through one guarded path (:class:`_Source`): a file that is
missing, a folder or not readable is an InvalidInputError; a read that fails part way
(a gzip file cut short, even inside its first record, or gzip's magic bytes followed
by junk) ends that file with a note in :attr:`Reading.cut_short` and the lines before
it are used, never a traceback. On a running daemon's files (``records.jsonl*``): a regular
file is read ahead, then opened again for its records, and it is the file read ahead that is
read (told by its inode), under its new name when the daemon rotated it meanwhile, never the
daemon's new file at the old name; a file the shell listed and the daemon gzip'd before the
replay opened it (a plain rotated file, its ``.gz.tmp``) is read as its ``.gz``. Each is noted. A file that is not a regular file (``/dev/stdin``, a
pipe, a shell's ``<(...)``) can be read only once: it is opened once, the lines read
ahead to find its first capture time are kept, and the rest is read on from there.

Speed (a day of one 15 fps camera is 1.3 million records): the parts of a record
a replay does not read are cut out of the line before it is decoded (:func:`parse`;
decoding is most of a replay's time); a line the cut does not fit is decoded
whole. What cannot be used is counted in :class:`Reading`, never silently lost:
lines that are not JSON objects (a line torn by a crash), lines longer than any record
(:data:`MAX_LINE`: read on in pieces, so memory never grows with a line; past
:data:`MAX_LINE_RUN` the file is given up), records without
``stream``/``frame_seq``/``signals``, records with a field a replay reads of
another type than docs/records.md gives it (:data:`FIELD_TYPES`), records with a
number a replay cannot compute with (NaN, an infinity, or beyond +-2**53, a size or count
below its least, no frame size, a frame_seq outside 0..2**63 - 1: :func:`bad_value`), a ``stream``,
``device``, reason or digest no daemon writes (:data:`PRINTED_FIELDS`), or a capture time outside
:data:`CAPTURE_MIN_NS`..:data:`CAPTURE_MAX_NS` (a clock not yet set), late records (a spooled frame's second record: its decision is in the
first), duplicates, and records that arrived beyond the reorder window (decided
where they arrived, best effort).
"""

from __future__ import annotations

import gzip
import heapq
import io
import json
import os
import stat
import zlib
from array import array
from bisect import bisect_right
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import chain
from typing import (
    IO,
    Any,
    Dict,
    FrozenSet,
    Iterable,
    Iterator,
    List,
    Optional,
    Sequence,
    Tuple,
)

from edgewise.errors import InvalidInputError
from edgewise.ids import DEFAULT_MAX_ID_LENGTH, ID_CHARS, id_problem

#: The most records of one stream held back to restore the decision order (its reorder
#: window): a record may come this many of its stream's records late (about 9 min at 15 fps)
#: and still be decided in order, while :data:`REORDER_BUDGET` leaves each stream that many.
REORDER_FRAMES = 8192
#: The most records held back across all streams: the memory a replay's reordering takes,
#: however many streams the records hold. A held record is about 3.7 KB as decoded (a
#: ``bench/whatif.py`` record), so this is about 250 MB at most. Up to
#: ``REORDER_BUDGET // REORDER_FRAMES`` (8) streams each holds :data:`REORDER_FRAMES`; more
#: share it, ``REORDER_BUDGET // streams`` records each (655 of 100 streams: 44 s of a 15 fps
#: camera, where an escalation's record comes a deadline, about a second, late).
REORDER_BUDGET = 65_536
#: Bytes that open a gzip file (RFC 1952).
GZIP_MAGIC = b"\x1f\x8b"
#: Lines read from the start of a file to find its first capture time (the order of the files).
HEAD_LINES = 100
#: The longest line read as a record, in characters. A record is a few KB (a frame's boxes and
#: signals); a longer line is no record (a file that is not the sink's, a run of NUL bytes a crash
#: left, ``/dev/zero``): it is read on and dropped in pieces of this size and counted
#: (:attr:`Reading.too_long`), so a replay's memory does not grow with a line (a 64 MB one took
#: 260 MB, an endless one all of it, then a MemoryError traceback).
MAX_LINE = 1 << 20
#: The longest line read on past :data:`MAX_LINE` before the file is given up: a records file
#: has no line of 64 MiB, and an endless one (``/dev/zero``, a device) would hold the replay
#: for ever. The records before it are used, and the note names the file (:class:`NoLineEnd`).
MAX_LINE_RUN = 64 * MAX_LINE
#: What :func:`_lines` gives for a line longer than :data:`MAX_LINE`: no JSON, told by identity.
#: Not one character: CPython shares one object per one-character string, so a last line of
#: just a NUL was counted as too long (found by a probe).
TOO_LONG = "\0(a line longer than MAX_LINE)\0"
#: Errors of a read that fails part way: a gzip file cut short (EOFError), gzip's magic
#: followed by junk (``gzip.BadGzipFile``, an OSError) or a corrupt deflate stream
#: (``zlib.error``), a disk error.
READ_ERRORS = (OSError, EOFError, zlib.error)


class NoLineEnd(OSError):
    """A line runs past :data:`MAX_LINE_RUN` without a line end: the file is not read on."""


#: The capture times a replay accepts, [2000-01-01, 2200-01-01) UTC in Unix ns. A record
#: outside them was taken by a clock that was not set (a Jetson without an RTC battery starts
#: at 1970 until NTP syncs) or is corrupt: its hour and span would be meaningless, and one
#: such record would stretch the capture span of a stream over decades.
CAPTURE_MIN_NS = 946_684_800 * 10**9
CAPTURE_MAX_NS = 7_258_118_400 * 10**9
#: The largest magnitude of a number a replay computes with (:func:`bad_value`): every
#: integer up to it is exact as a float, and it is far beyond any real value (a byte count
#: of 9 PB, a monotonic clock of 285 million years).
MAX_NUMBER = 2.0 ** 53

Record = Dict[str, Any]


class _Absent:
    """The value of a field a record does not have (older daemons lack some)."""


_ABSENT = _Absent()
_NUMBER: FrozenSet[type] = frozenset((int, float, _Absent))
#: The fields a replay reads besides ``stream``, ``frame_seq`` and ``signals``, and the
#: types docs/records.md gives them (exact classes: JSON true is no number). A field may
#: be missing (a record of an older daemon); one of another type makes the record
#: unusable (:attr:`Reading.wrong_types`). ``null`` is allowed where the daemon leaves
#: a field unset (``edge.records.OPTIONAL_FIELDS``).
FIELD_TYPES: Tuple[Tuple[str, FrozenSet[type]], ...] = (
    ("device", frozenset((str, _Absent))),
    ("capture_unix_ns", frozenset((int, _Absent))),
    ("width", frozenset((int, _Absent))),
    ("height", frozenset((int, _Absent))),
    ("escalated", frozenset((bool, _Absent))),
    ("reason", frozenset((str, _Absent))),
    ("hardness", _NUMBER),
    ("suppressed_by", frozenset((str, _Absent))),
    ("policy", frozenset((str, _Absent))),
    ("policy_generation", frozenset((int, _Absent))),
    ("decided_s", _NUMBER),
    ("edge_boxes", frozenset((int, _Absent))),
    ("edge_classes", frozenset((list, _Absent))),
    ("edge_max_score", _NUMBER),
    ("policy_digest", frozenset((str, _Absent))),
    ("detections", frozenset((list, _Absent))),
    ("crop", frozenset((list, type(None), _Absent))),
    ("regions", frozenset((list, type(None), _Absent))),
    ("payload", frozenset((str, type(None), _Absent))),
    ("payload_bytes", frozenset((int, type(None), _Absent))),
)
#: The numbers of :data:`FIELD_TYPES` a replay computes with (floats, products, sums): each
#: must be finite and at most :data:`MAX_NUMBER` in size (:func:`bad_value`).
BOUNDED_FIELDS: Tuple[str, ...] = (
    "hardness", "decided_s", "edge_max_score", "width", "height", "edge_boxes", "payload_bytes")
#: The least value of the sizes and counts of :data:`BOUNDED_FIELDS` (the others may be as low
#: as ``-MAX_NUMBER``): a negative width or ``payload_bytes`` made the uplink negative, and a
#: frame of width 0 (or none: every daemon has written its size) sent nothing, so either passed
#: any ``--max-bytes-per-day`` gate.
LEAST: Dict[str, int] = {"width": 1, "height": 1, "edge_boxes": 0, "payload_bytes": 0}
#: The text fields of a record the what-if table prints: the ids (``stream``, ``device``) and the
#: daemon's words (its reasons and suppressors, the policy's hex digest). Every daemon writes
#: them within the id rule (:mod:`edgewise.ids`, which it checks its own ids against); a record
#: with one outside it is not a daemon's (:func:`bad_value`). The policy's name is free text,
#: printed quoted (``repr``).
PRINTED_FIELDS: Tuple[str, ...] = ("stream", "device", "reason", "suppressed_by", "policy_digest")
#: One past the largest ``frame_seq``: the daemon's are ``epoch << 32`` plus the frame's number,
#: never negative, and each stream's are kept as 64-bit integers (:class:`_Released`).
FRAME_SEQ_END = 1 << 63


def wrong_field(doc: Record) -> Optional[str]:
    """The first field of a record (:data:`FIELD_TYPES`) whose value has the wrong type; None
    when all are as documented. ``edge_classes`` must hold class names (strings)."""
    get = doc.get
    for name, types in FIELD_TYPES:
        if get(name, _ABSENT).__class__ not in types:
            return name
    classes = get("edge_classes")
    if classes:
        for c in classes:
            if c.__class__ is not str:
                return "edge_classes"
    return None


def bad_value(doc: Record) -> Optional[str]:
    """The first field of a record of the documented type (:func:`wrong_field` found none)
    whose value a replay cannot use; None when all can be used (what each must be:
    :func:`value_rule`). ``frame_seq`` must lie in [0, :data:`FRAME_SEQ_END`) (a larger one
    crashed the replay). ``capture_unix_ns`` must be there (taken as 1970, it stretched the
    stream's span over decades) and lie in [:data:`CAPTURE_MIN_NS`, :data:`CAPTURE_MAX_NS`);
    each of :data:`BOUNDED_FIELDS` must be a finite number of at most :data:`MAX_NUMBER` in size
    (JSON ``NaN``, ``Infinity``, ``1e400`` and a 400-digit integer are not; a comparison with
    NaN is false), and those of :data:`LEAST` not below their least value (``width`` and
    ``height`` must be there). Runs on every record, so the common case is one expression, and
    :data:`BOUNDED_FIELDS` are looked at one by one only to name the one that is not.
    The text of :data:`PRINTED_FIELDS` must follow the id rule (:func:`_an_id`): the what-if
    table prints it, and a line break or a terminal escape in one forged its lines."""
    get = doc.get
    if not 0 <= doc["frame_seq"] < FRAME_SEQ_END:  # an int: frames() skipped the others
        return "frame_seq"
    for name in PRINTED_FIELDS:
        if not _an_id(get(name) or ""):
            return name
    cap = get("capture_unix_ns")  # every daemon has written it: a record without it is damaged
    if cap is None or not CAPTURE_MIN_NS <= cap < CAPTURE_MAX_NS:
        return "capture_unix_ns"
    hi = MAX_NUMBER
    lo = -hi
    if (lo <= (get("hardness") or 0) <= hi and lo <= (get("decided_s") or 0) <= hi
            and lo <= (get("edge_max_score") or 0) <= hi and 1 <= (get("width") or 0) <= hi
            and 1 <= (get("height") or 0) <= hi and 0 <= (get("edge_boxes") or 0) <= hi
            and 0 <= (get("payload_bytes") or 0) <= hi):
        return None
    for name in BOUNDED_FIELDS:
        if not LEAST.get(name, lo) <= (get(name) or 0) <= hi:
            return name
    return None  # pragma: no cover (the expression above is BOUNDED_FIELDS)


@lru_cache(maxsize=4096)
def _an_id(value: str) -> bool:
    """``value`` (a record's text of :data:`PRINTED_FIELDS`) follows the rule the daemon checks
    its own ids against when it loads its settings (:func:`edgewise.ids.id_problem`); cached, as
    a replay asks it of every record and its files hold a few values."""
    return id_problem(value, "") is None


def value_rule(name: str) -> str:
    """What a value of the field ``name`` (not ``capture_unix_ns``, which has its own note) must
    be for :func:`bad_value` to take it, in words: the replay's note on the records it skipped."""
    if name in PRINTED_FIELDS:
        return (f"text a daemon writes (at most {DEFAULT_MAX_ID_LENGTH} characters of [{ID_CHARS}]; a line "
                "break or a terminal escape in it would forge lines of this report)")
    if name == "frame_seq":
        return "an integer from 0 to 2**63 - 1 (the daemon's are epoch << 32 plus the frame's number)"
    if name in LEAST:
        return (f"a finite number of at least {LEAST[name]} (NaN, Infinity, too large for a float, "
                + ("below 1, or missing: every daemon records the frame's size)" if LEAST[name] else "or negative)"))
    return "a finite number (NaN, Infinity, or too large for a float)"


@dataclass
class Reading:
    """What reading the records found besides the frames (counts of what was not used)."""

    files: List[str] = field(default_factory=list)
    lines: int = 0
    not_json: int = 0
    too_long: int = 0  # lines longer than MAX_LINE: skipped
    not_records: int = 0
    late: int = 0
    duplicates: int = 0
    beyond_window: int = 0  # records decided out of order: later than the window of their stream
    reorder_frames: int = 0  # the window at the end: records a stream could hold (REORDER_FRAMES or less)
    reorder_budget: int = 0  # the records all streams could hold together (REORDER_BUDGET)
    streams: int = 0         # streams (device, stream) that shared the budget
    held_most: int = 0       # the most records held back at once, all streams together
    wrong_types: Dict[str, int] = field(default_factory=dict)  # field -> records skipped for its type
    bad_values: Dict[str, int] = field(default_factory=dict)   # field -> records skipped for its value
    empty_files: List[str] = field(default_factory=list)
    #: a note per file whose reading failed part way, or that moved while read (rotated, gzip'd)
    cut_short: List[str] = field(default_factory=list)


def _lines(text: IO[str]) -> Iterator[str]:
    """The lines of ``text``, each at most :data:`MAX_LINE` characters: a longer one is read on
    to its end in pieces that are dropped, and given as :data:`TOO_LONG`; one longer than
    :data:`MAX_LINE_RUN` raises :class:`NoLineEnd`."""
    readline = text.readline
    while True:
        line = readline(MAX_LINE)
        if len(line) < MAX_LINE or line[-1] == "\n":
            if not line:
                return
            yield line
            continue
        run = len(line)
        while line and line[-1] != "\n":  # the rest of the line, a piece at a time
            if run >= MAX_LINE_RUN:
                raise NoLineEnd(f"a line of over {MAX_LINE_RUN >> 20} MiB without a line end: not a records "
                                "file")
            line = readline(MAX_LINE)
            run += len(line)
        yield TOO_LONG


class _Rejoined(io.RawIOBase):
    """A stream's first bytes, read to tell gzip by its magic, put back in front of the rest
    (a pipe cannot seek back to them)."""

    def __init__(self, head: bytes, rest: IO[bytes]) -> None:
        super().__init__()
        self._head = head
        self._rest = rest

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        view = memoryview(b).cast("B")
        if self._head:
            n = min(len(view), len(self._head))
            view[:n] = self._head[:n]
            self._head = self._head[n:]
            return n
        data = self._rest.read1(len(view))  # type: ignore[attr-defined]
        view[:len(data)] = data
        return len(data)

    def close(self) -> None:
        try:
            self._rest.close()
        finally:
            super().close()


def _open_binary(path: str) -> Tuple[IO[bytes], IO[bytes], bool]:
    """(the file's bytes, gunzipped when its magic says gzip; the file under them, which a
    GzipFile does not close; whether it is a regular file). InvalidInputError when it is
    missing, a folder or cannot be opened."""
    try:
        f = open(path, "rb")
    except IsADirectoryError:
        raise InvalidInputError(f"{path}: is a folder; give the JSON Lines files of the sink") from None
    except FileNotFoundError:
        raise InvalidInputError(f"{path}: records file not found") from None
    except OSError as exc:
        raise InvalidInputError(f"{path}: cannot read the records: {exc.strerror or exc}") from None
    try:
        regular = stat.S_ISREG(os.fstat(f.fileno()).st_mode)
        head = f.read(2)
        binary: IO[bytes]
        if regular:
            f.seek(0)
            binary = f
        else:  # read once: the magic bytes go back in front of the rest
            binary = io.BufferedReader(_Rejoined(head, f))
    except OSError as exc:
        f.close()
        raise InvalidInputError(f"{path}: cannot read the records: {exc.strerror or exc}") from None
    if head == GZIP_MAGIC:
        return gzip.GzipFile(fileobj=binary, mode="rb"), binary, regular  # type: ignore[return-value]
    return binary, binary, regular


class _Source:
    """One records file, read through one guarded path (see module doc): :meth:`read_ahead`
    opens it and reads its first lines for the order of the files; :meth:`open_lines` gives
    its lines from the start, for the records. A regular file is opened again for them; any
    other file (a pipe) stays open and the lines read ahead are given first."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.first_ns = 1 << 62  # the first usable capture time (none: last)
        self.ahead: List[str] = []  # lines of a stream read ahead, still to be used
        self.error: Optional[BaseException] = None  # a stream's read error met ahead
        self.regular = True
        self._open: List[IO[Any]] = []
        #: (device, inode) of the file read ahead: the file its records are read from
        self.identity: Optional[Tuple[int, int]] = None
        #: where the file read ahead was found when its records were read: renamed since (rotated)
        self.moved_to = ""

    def _text(self, path: str = "") -> IO[str]:
        binary, under, regular = _open_binary(path or self.path)
        self.regular = regular
        if regular:
            st = os.fstat(under.fileno())
            if self.identity is None:
                self.identity = (st.st_dev, st.st_ino)
            elif (st.st_dev, st.st_ino) != self.identity:
                for f in (binary, under):
                    f.close()
                raise _Replaced()
        # utf-8-sig: a byte order mark an editor put at the start is not part of the first record
        text = io.TextIOWrapper(binary, encoding="utf-8-sig", errors="replace")
        self._open = [text, under]
        return text

    def read_ahead(self) -> None:
        """Find the capture time of the first record (of a usable time: a clock not yet set
        does not put a file first); a read error here is met again, and noted, when reading."""
        f = self._text()
        lines: List[str] = []
        try:
            for line in _lines(f):
                lines.append(line)
                doc = parse(line)
                if doc.__class__ is dict:
                    cap = doc.get("capture_unix_ns")
                    if cap.__class__ is int and CAPTURE_MIN_NS <= cap < CAPTURE_MAX_NS:
                        self.first_ns = cap
                        break
                if len(lines) > HEAD_LINES:
                    break
        except READ_ERRORS as exc:
            self.error = exc
        if self.regular:  # read again from the start for the records, errors and all
            self.error = None
            self.close()
        else:
            self.ahead = lines
            if self.error is not None:
                self.close()

    def open_lines(self) -> Iterable[str]:
        """The file's lines from its first (a read error may end them: :data:`READ_ERRORS`): of
        the file read ahead, also when the daemon rotated it away since (a records file that a
        long replay read ahead, then opened again by its name, was the daemon's new file: the
        records of the one rotated away were left out without a word). InvalidInputError when
        it is gone (gzip'd since its rotation, pruned)."""
        if self.regular:
            try:
                return _lines(self._text())
            except (_Replaced, InvalidInputError) as exc:
                moved = _renamed(self.path, self.identity)
                if moved and os.path.basename(moved) == os.path.basename(self.path):
                    moved = ""  # still there under its name: unreadable now, said as such
                    if isinstance(exc, InvalidInputError):
                        raise
                if not moved:
                    raise InvalidInputError(f"{self.path}: is no longer the file read when the replay began, "
                                            "and that file is not in its folder under another name") from None
                self.moved_to = moved
                return _lines(self._text(moved))
        if self.error is not None or not self._open:
            return self.ahead
        rest = _lines(self._open[0])
        return chain(self.ahead, rest) if self.ahead else rest

    def close(self) -> None:
        for f in self._open:
            try:
                f.close()
            except READ_ERRORS:  # closing a cut gzip file
                pass
        self._open = []

    def unreadable(self, exc: BaseException, line: int) -> str:
        """The note on a read that failed after ``line`` lines."""
        if isinstance(exc, NoLineEnd) and line == 0:
            return f"{self.path}: {exc}: skipped"
        if line == 0:
            return (f"{self.path}: cannot be read ({exc.__class__.__name__}: {exc}): skipped; a gzip file still "
                    "being written (.gz.tmp) or cut short in its first record, or not a records file")
        return f"{self.path}: cannot read past line {line} ({exc}); the records before it are used"


_DECODE = json.JSONDecoder().raw_decode
#: What decoding a line that is no record raises: ValueError (not JSON), RecursionError (JSON
#: nested deeper than the decoder goes: a line of 100000 '[', a traceback of every replay, and of
#: every start of a daemon whose sink file held it).
UNDECODABLE = (ValueError, RecursionError)


def parse(line: str) -> Optional[Any]:
    """One record line as JSON; None when the line is not JSON.

    Fast path for a line laid out as the daemon writes it (``FrameRecord`` field order)
    that carries the decision's inputs: the parts a replay does not read are cut out
    before decoding (``detections``; ``detail`` to ``priority``; ``latency_ms`` to
    ``capture_clock``), unless the last part holds ``"late":true`` or a ``crop``. Any
    other line is decoded whole."""
    i = line.find('"detections":[')
    if i > 0:
        j = line.find('],"escalated":', i)
        k = line.find('"detail":', j)
        m = line.find('"policy":', k)
        p = line.find('"latency_ms":{', m)
        q = line.find('"decided_s":', p)
        if (j > 0 and k > 0 and m > 0 and p > 0 and q > 0 and line.find('"late":true', p, q) < 0
                and line.find('"crop":', p, q) < 0):
            try:
                doc = _DECODE(line[:i] + line[j + 2:k] + line[m:p] + line[q:])[0]
            except UNDECODABLE:
                doc = None
            if doc.__class__ is dict and "edge_classes" in doc:
                return doc
    try:
        return json.loads(line)
    except UNDECODABLE:
        return None


class _Released:
    """The frame_seqs of one stream already yielded, as sorted disjoint runs of consecutive
    numbers (a daemon's frame_seqs are consecutive but for frames it dropped or never settled,
    so the runs are few: 16 bytes each), and the last one; tells a repeat at any distance (the
    same records in two files: a ``.gz.tmp`` and its source, a file under two names) from a
    frame that is late. A late frame joins the runs too (it fills a gap: the runs merge)."""

    __slots__ = ("starts", "ends", "last")

    def __init__(self) -> None:
        self.starts = array("q")  # run i covers starts[i]..ends[i], sorted, disjoint, not adjacent
        self.ends = array("q")
        self.last: Optional[int] = None

    def add_next(self, seq: int) -> None:
        """``seq``, above every frame_seq yielded so far, is yielded."""
        if self.last is not None and seq == self.last + 1:
            self.ends[-1] = seq
        else:
            self.starts.append(seq)
            self.ends.append(seq)
        self.last = seq

    def seen(self, seq: int) -> bool:
        """Whether ``seq`` (below :attr:`last`) was yielded; it is taken as yielded from now."""
        starts, ends = self.starts, self.ends
        i = bisect_right(starts, seq) - 1
        if i >= 0 and seq <= ends[i]:
            return True
        joins_next = i + 1 < len(starts) and starts[i + 1] == seq + 1
        if i >= 0 and ends[i] == seq - 1:
            if joins_next:  # the gap between two runs is filled: one run
                ends[i] = ends[i + 1]
                del starts[i + 1]
                del ends[i + 1]
            else:
                ends[i] = seq
        elif joins_next:
            starts[i + 1] = seq
        else:
            starts.insert(i + 1, seq)
            ends.insert(i + 1, seq)
        return False


class _Held:
    """One stream's records held back, a heap by (frame_seq, arrival), and what it yielded."""

    __slots__ = ("heap", "done")

    def __init__(self) -> None:
        self.heap: List[Tuple[int, int, Record]] = []
        self.done = _Released()


def _next(held: _Held, reading: Reading) -> Optional[Record]:
    """Take a stream's held record of the smallest frame_seq (the first of equal ones to come):
    the record to decide, or None for a duplicate of a frame already yielded."""
    seq, _, doc = heapq.heappop(held.heap)
    return _release(held.done, seq, doc, reading)


def _release(rel: _Released, seq: int, doc: Record, reading: Reading) -> Optional[Record]:
    """A stream's record of ``seq`` taken out of the window: the record to decide, or None for
    a duplicate of a frame already yielded."""
    last = rel.last
    if last is not None and seq <= last:
        if seq == last or rel.seen(seq):
            reading.duplicates += 1
            return None
        reading.beyond_window += 1  # too late to put back in order: decided here, best effort
    else:
        rel.add_next(seq)
    return doc


class _Replaced(Exception):
    """A records file's name names another file than the one read ahead (rotated since)."""


def _renamed(path: str, identity: Optional[Tuple[int, int]]) -> str:
    """The name the file ``identity`` (read ahead as ``path``) has now in ``path``'s folder,
    where a rotation renames it (the daemon's ``<file>.<UTC time>``, logrotate's); "" if none."""
    if identity is None:
        return ""
    folder = os.path.dirname(path) or "."
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                try:
                    if entry.inode() == identity[1] and entry.stat(follow_symlinks=False).st_dev == identity[0]:
                        return os.path.join(folder, entry.name)
                except OSError:
                    continue
    except OSError:
        pass
    return ""


def _gzipped(path: str) -> str:
    """The gzip'd file a rotated records file becomes: ``<file>.gz``, written as ``<file>.gz.tmp``
    (``edge.rotation``; logrotate's ``compress`` makes ``<file>.gz`` too)."""
    return path[:-len(".tmp")] if path.endswith(".gz.tmp") else path + ".gz"


def _sources(paths: Sequence[str], reading: Optional[Reading] = None) -> List[_Source]:
    """The files, each opened and read ahead, in the order of their first capture time. A file
    given (by a glob) that is gone when it is opened, gzip'd by the daemon meanwhile (a plain
    rotated file, or its ``.gz.tmp``), is read as its ``.gz`` when that was not given, and
    noted in ``reading``: the replay stopped with "records file not found" for a file that
    was there a second before."""
    sources: List[_Source] = []
    # "-" is standard input, as for cat and gzip (the docs' /dev/stdin is the same pipe)
    given = sorted({"/dev/stdin" if str(p) == "-" else str(p) for p in paths})
    taken = set(given)
    try:
        for path in given:
            if not os.path.lexists(path) and os.path.isfile(_gzipped(path)):
                gz = _gzipped(path)
                note = f"{path}: gzip'd to {gz} since the files were listed"
                if gz in taken:
                    if reading is not None:
                        reading.cut_short.append(f"{note}, which is read too: skipped")
                    continue
                if reading is not None:
                    reading.cut_short.append(f"{note}: {gz} read in its place")
                taken.add(gz)
                path = gz
            src = _Source(path)
            src.read_ahead()
            sources.append(src)
    except BaseException:
        for src in sources:
            src.close()
        raise
    sources.sort(key=lambda s: (s.first_ns, s.path))
    return sources


def frames(paths: Sequence[str], reading: Reading, window: int = REORDER_FRAMES,
           budget: int = REORDER_BUDGET) -> Iterator[Record]:
    """Every usable record of ``paths``, each stream's in decision order (see module doc).
    A stream holds at most ``min(window, budget // streams)`` records (its smallest
    frame_seq is yielded when one more comes), so at most ``budget`` are held in all, and a
    record may come up to that many of its stream's records late. ``reading`` says the
    window at the end, the budget and the most records held at once."""
    if not paths:
        raise InvalidInputError("no records files given")
    if window < 0 or budget < 0:
        raise ValueError(f"reorder window {window} and budget {budget}: give numbers of records, 0 or more")
    # per stream of a device (device, stream): frame_seqs count per device, and two devices
    # may well name a stream alike
    held: Dict[Tuple[str, str], _Held] = {}
    share = window  # the records a stream may hold: window, or the budget's share
    holding = 0     # records held, all streams
    reading.reorder_budget = budget
    reading.reorder_frames = min(window, budget)
    sources = _sources(paths, reading)
    try:
        for src in sources:
            reading.files.append(src.path)
            try:
                lines = src.open_lines()
            except InvalidInputError as exc:  # e.g. a .gz.tmp renamed to .gz since it was read ahead
                reading.cut_short.append(f"{exc}; it was there when the replay began (a file being rotated or "
                                         "gzip'd?): skipped")
                continue
            if src.moved_to:
                reading.cut_short.append(f"{src.path}: rotated to {src.moved_to} while the replay ran: its records "
                                         "were read there")
            n = 0
            try:
                for line in lines:
                    n += 1
                    doc = parse(line)
                    if doc.__class__ is not dict:
                        if line is TOO_LONG:
                            reading.too_long += 1
                        else:
                            reading.not_json += 1
                        continue
                    sid = doc.get("stream")
                    if (sid.__class__ is not str or doc.get("frame_seq").__class__ is not int
                            or doc.get("signals").__class__ is not dict):
                        reading.not_records += 1
                        continue
                    if doc.get("late"):
                        reading.late += 1
                        continue
                    wrong = wrong_field(doc)
                    if wrong is not None:
                        reading.wrong_types[wrong] = reading.wrong_types.get(wrong, 0) + 1
                        continue
                    wrong = bad_value(doc)
                    if wrong is not None:
                        reading.bad_values[wrong] = reading.bad_values.get(wrong, 0) + 1
                        continue
                    key = (doc.get("device", ""), sid)
                    h = held.get(key)
                    if h is None:
                        h = held[key] = _Held()
                        reading.streams = len(held)
                        if budget // len(held) < share:  # one stream more: every stream's share shrinks
                            share = reading.reorder_frames = budget // len(held)
                            for other in held.values():
                                while len(other.heap) > share:
                                    holding -= 1
                                    out = _next(other, reading)
                                    if out is not None:
                                        yield out
                    item = (doc["frame_seq"], reading.lines + n, doc)  # (frame_seq, arrival, record)
                    if len(h.heap) < share:
                        heapq.heappush(h.heap, item)
                        holding += 1
                        if holding > reading.held_most:
                            reading.held_most = holding
                    else:  # the stream's window is full: its smallest frame_seq goes, maybe this one
                        seq, _, first = heapq.heappushpop(h.heap, item)
                        out = _release(h.done, seq, first, reading)
                        if out is not None:
                            yield out
                if src.error is not None:  # a stream's read error, met reading ahead
                    raise src.error
            except READ_ERRORS as exc:  # a gzip file cut short (being written, a crash, disk full), junk
                reading.cut_short.append(src.unreadable(exc, n))
            else:
                if n == 0:
                    reading.empty_files.append(src.path)
            finally:
                src.close()
                reading.lines += n
    finally:
        for src in sources:
            src.close()
    for h in held.values():
        while h.heap:
            out = _next(h, reading)
            if out is not None:
                yield out
