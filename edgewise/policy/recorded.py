"""Reading the edge's frame records back for a replay: files, order, and what is odd.

The edge daemon writes one JSON object per frame (docs/records.md) to JSON Lines
files that an operator may rotate and gzip. :func:`frames` reads any number of
them, plain or gzip'd (told by the magic bytes, not the name), and yields each
stream's frames in the order the daemon decided them: by ``frame_seq``, which
also orders daemon restarts (a run starts at ``epoch << 32``). The daemon writes
an escalated frame's record only when its escalation is settled, so records are
a little out of order in the file; a bounded per-stream reorder window
(:data:`REORDER_FRAMES`) puts them back without holding a day of records in
memory. Files are read in the order of their first record's capture time, so
rotated files may be given in any order, under any name: the edge's own rotation
(``edge.rotation``: ``<file>.<UTC time>Z``, gzip'd to ``.gz``), ``logrotate``'s, or a
shell glob such as ``records.jsonl*`` (which may also catch a ``.gz.tmp`` being
written while its source still exists: the source's records come twice and the
second copy counts as duplicates; a gzip file cut short gives the records before
the cut, and a note).

Speed (a day of one 15 fps camera is 1.3 million records): the parts of a record
a replay does not read are cut out of the line before it is decoded (:func:`parse`;
decoding is most of a replay's time); a line the cut does not fit is decoded
whole. What cannot be used is counted in :class:`Reading`, never silently lost:
lines that are not JSON objects (a line torn by a crash), records without
``stream``/``frame_seq``/``signals``, records with a field a replay reads of
another type than docs/records.md gives it (:data:`FIELD_TYPES`), late records (a
spooled frame's second record: its decision is in the first), duplicates, and
records that arrived beyond the reorder window (decided where they arrived, best
effort).
"""

from __future__ import annotations

import gzip
import io
import json
import operator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Dict, FrozenSet, Iterator, List, Optional, Sequence, Tuple, Union

from edgewise.errors import InvalidInputError

#: Frames of one stream held back to restore the decision order (about 4.5 min at 15 fps).
REORDER_FRAMES = 4096
#: Bytes that open a gzip file (RFC 1952).
GZIP_MAGIC = b"\x1f\x8b"

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


@dataclass
class Reading:
    """What reading the records found besides the frames (counts of what was not used)."""

    files: List[str] = field(default_factory=list)
    lines: int = 0
    not_json: int = 0
    not_records: int = 0
    late: int = 0
    duplicates: int = 0
    beyond_window: int = 0
    wrong_types: Dict[str, int] = field(default_factory=dict)  # field -> records skipped for its type
    empty_files: List[str] = field(default_factory=list)
    cut_short: List[str] = field(default_factory=list)


def open_text(path: Union[str, Path]) -> IO[str]:
    """The file as text lines, gunzipped when it is gzip'd; InvalidInputError when unreadable."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            head = f.read(2)
        if head == GZIP_MAGIC:
            return io.TextIOWrapper(gzip.open(p, "rb"), encoding="utf-8", errors="replace")
        return open(p, encoding="utf-8", errors="replace")
    except IsADirectoryError:
        raise InvalidInputError(f"{p}: is a folder; give the JSON Lines files of the sink") from None
    except FileNotFoundError:
        raise InvalidInputError(f"{p}: records file not found") from None
    except OSError as exc:
        raise InvalidInputError(f"{p}: cannot read the records: {exc.strerror or exc}") from None


_DECODE = json.JSONDecoder().raw_decode


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
            except ValueError:
                doc = None
            if doc.__class__ is dict and "edge_classes" in doc:
                return doc
    try:
        return json.loads(line)
    except ValueError:
        return None


def _first_capture(path: str) -> Tuple[int, str]:
    """(capture time of the file's first record, path): the order to read files in."""
    with open_text(path) as f:
        for n, line in enumerate(f):
            doc = parse(line)
            if isinstance(doc, dict) and isinstance(doc.get("capture_unix_ns"), int):
                return doc["capture_unix_ns"], path
            if n > 100:
                break
    return 1 << 62, path


def _release(buf: List[Record], k: int, sid: str, done: Dict[str, int], reading: Reading) -> Iterator[Record]:
    """Sort a stream's held records by frame_seq and yield the first ``k`` (nearly sorted
    already, so the sort is about linear)."""
    buf.sort(key=_SEQ)
    out = buf[:k]
    del buf[:k]
    last = done.get(sid)
    for doc in out:
        seq = doc["frame_seq"]
        if last is not None and seq <= last:
            if seq == last:
                reading.duplicates += 1
                continue
            reading.beyond_window += 1  # too late to put back in order: decided here, best effort
        else:
            last = done[sid] = seq
        yield doc


_SEQ = operator.itemgetter("frame_seq")


def frames(paths: Sequence[str], reading: Reading, window: int = REORDER_FRAMES) -> Iterator[Record]:
    """Every usable record of ``paths``, each stream's in decision order (see module doc).
    A stream's records are held until ``2 * window`` have come, then sorted and the first
    ``window`` released: a record may come up to ``window`` records late."""
    if not paths:
        raise InvalidInputError("no records files given")
    held: Dict[str, List[Record]] = {}
    done: Dict[str, int] = {}  # stream -> frame_seq of the last frame yielded
    for path in sorted({str(p) for p in paths}, key=_first_capture):
        reading.files.append(path)
        n = 0
        with open_text(path) as f:
            try:
                for line in f:
                    n += 1
                    doc = parse(line)
                    if doc.__class__ is not dict:
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
                    buf = held.get(sid)
                    if buf is None:
                        buf = held[sid] = []
                    buf.append(doc)
                    if len(buf) >= 2 * window:
                        yield from _release(buf, window, sid, done, reading)
            except (OSError, EOFError) as exc:  # a gzip file cut short (being written, a crash, disk full)
                reading.cut_short.append(f"{path}: cannot read past line {n} ({exc}); the records before it are used")
            finally:
                reading.lines += n
        if n == 0:
            reading.empty_files.append(path)
    for sid, buf in held.items():
        yield from _release(buf, len(buf), sid, done, reading)
