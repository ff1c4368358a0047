"""Reading the daemon's JSON Lines sink: the latest record per frame, and what was lost.

A frame escalated while the cloud was down is written first as ``spooled`` (edge
boxes), then again as ``late`` when the spool replays it; the later record wins.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Tuple

Record = Dict[str, Any]
SEQ_MASK = 0xFFFFFFFF  # frame_seq = boot epoch << 32 | frame counter (edge.daemon)


def read_jsonl(path: Path) -> List[Record]:
    out: List[Record] = []
    if not path.exists():
        return out
    with open(path) as fh:
        for line in fh:
            line = line.strip()
            if line:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue  # a torn last line while the daemon is writing
    return out


def latest_per_frame(records: List[Record]) -> Dict[Tuple[str, int], Record]:
    """(stream, frame index) -> final record (cloud answers supersede spooled/edge ones)."""
    final: Dict[Tuple[str, int], Record] = {}
    for rec in records:
        key = (str(rec["stream"]), int(rec["frame_seq"]) & SEQ_MASK)
        old = final.get(key)
        if old is None or old.get("outcome") != "cloud" or rec.get("outcome") == "cloud":
            final[key] = rec
    return final


def accounting(final: Dict[Tuple[str, int], Record]) -> Dict[str, int]:
    """Escalation outcomes; ``lost`` = escalated frames that never got a cloud answer."""
    esc = [r for r in final.values() if r.get("escalated")]
    answered = sum(1 for r in esc if r.get("outcome") == "cloud")
    late = sum(1 for r in esc if r.get("outcome") == "cloud" and r.get("late"))
    pending = sum(1 for r in esc if r.get("outcome") in ("spooled", "pending"))
    edge_only = sum(1 for r in esc if r.get("outcome") in ("edge_only", "dropped"))
    return {
        "frames": len(final),
        "escalated": len(esc),
        "answered": answered,
        "answered_late": late,
        "still_spooled": pending,
        "edge_only_fallback": edge_only,
        "lost": len(esc) - answered,
    }
