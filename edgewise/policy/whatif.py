"""The what-if table of ``edgewise edge check-policy --replay``, and its CI gates.

:func:`table` renders :func:`edgewise.policy.replay.replay`'s report for a
terminal: both sides side by side (overall, then per stream when there are
several), the decisions that change, whether the records were reproduced, the
hardest frames held back, the notes, and the replay's rate. :func:`gate_failures`
checks the limits a CI pipeline sets (``--max-share``, ``--max-bytes-per-day``,
``--strict``); any failure makes ``check-policy`` exit 1 (docs/policies.md).
"""

from __future__ import annotations

import datetime
from typing import Any, Dict, List, Optional, Sequence

#: Suppressors in the order the decision checks them (``edgewise.policy.deciding``).
_BY = (("cooldown", "cool"), ("priority", "prio"), ("budget_fraction", "frac"), ("budget_rate", "rate"))


def human_bytes(n: Optional[float]) -> str:
    """1234567 -> '1.2 MB' (decimal units, as uplink plans are sold)."""
    if n is None:
        return "-"
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000.0
    return "-"  # pragma: no cover


def _duration(s: float) -> str:
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def _utc(unix_s: float) -> str:
    return datetime.datetime.fromtimestamp(unix_s, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _cells(fig: Dict[str, Any]) -> Dict[str, str]:
    sat = fig["budget_saturated"]
    sup = fig["suppressed"]
    return {
        "escalated": f"{fig['escalated']:,} ({fig['share']:.1%})",
        "escalations/hour p50 / p95": f"{fig['per_hour_p50']:,.0f} / {fig['per_hour_p95']:,.0f}",
        "uplink per day": human_bytes(fig["uplink_bytes_per_day"]),
        "budget saturated": (f"{sat['episodes']:,}x, {sat['share_of_time']:.1%} of the time"
                             if sat["episodes"] else "never"),
        "  longest saturation": _duration(sat["longest_seconds"]) if sat["episodes"] else "-",
        "held back (" + "/".join(short for _, short in _BY) + ")": "/".join(f"{sup.get(k, 0):,}" for k, _ in _BY),
    }


def _rows(title: str, sides: Sequence[Dict[str, Any]], change: Optional[str], width: int) -> List[str]:
    cells = [_cells(f) for f in sides]
    out = [title]
    for name in cells[0]:
        line = f"  {name:<34}" + "".join(f"{c[name]:<{width}}" for c in cells)
        if name == "escalated" and change:
            line += change
        out.append(line.rstrip())
    return out


def table(report: Dict[str, Any]) -> str:
    """The what-if report as text (see module doc)."""
    rec = report["records"]
    sides = report["sides"]
    labels = [s["label"] for s in sides]
    width = max(24, *(len(lb) + 3 for lb in labels))
    span = (f", {_utc(rec['capture_start_unix_s'])} to {_utc(rec['capture_end_unix_s'])} UTC"
            if rec["frames"] else "")
    lines = [f"What-if replay over {rec['frames']:,} frames of {rec['streams']} stream(s) "
             f"({rec['hours']:.2f} h of capture time{span}) from {len(rec['files'])} file(s)"]
    for p in rec["policies"]:
        gens = ", ".join(str(g) for g in p["generations"])
        lines.append(f"  recorded under policy {p['name'] or '(none)'!r} (digest {p['digest'] or 'not recorded'}, "
                     f"generation {gens}): {p['frames']:,} frames")
    lines.append("")
    lines.append(" " * 36 + "".join(f"{lb:<{width}}" for lb in labels) + "change")
    ch = report["changes"]
    lines += _rows(f"overall ({rec['frames']:,} frames)", [s["overall"] for s in sides],
                   f"+{ch['newly_escalated']:,} / -{ch['no_longer_escalated']:,}", width)
    if rec["streams"] > 1:
        for sid in sides[0]["streams"]:
            figs = [s["streams"][sid] for s in sides]
            c = ch["streams"].get(sid, {"newly_escalated": 0, "no_longer_escalated": 0})
            lines += _rows(f"stream {sid} ({figs[0]['frames']:,} frames)", figs,
                           f"+{c['newly_escalated']:,} / -{c['no_longer_escalated']:,}", width)
    lines += ["", f"Decisions that change: {ch['newly_escalated']:,} frame(s) newly escalated by {labels[0]}, "
                  f"{ch['no_longer_escalated']:,} no longer escalated (against {labels[1]})."]
    for s in sides:
        r = s.get("reproduction")
        if r and r["checked"]:
            verdict = "reproduced exactly" if r["agreed"] == r["checked"] else "NOT reproduced"
            lines.append(f"{s['label']} decided {r['checked']:,} of these frames (same digest {s['policy']['digest']}): "
                         f"{r['agreed']:,} decisions agree ({r['share']:.2%}), {verdict}.")
        reloaded = r.get("after_reload", {}) if r else {}
        if reloaded.get("compared"):
            lines.append(f"{s['label']} decided {reloaded['compared']:,} more after a live reload from another version "
                         f"(not checked, see the notes): {reloaded['agreed']:,} decisions agree.")
        if r:
            for m in r["mismatches"][:5]:
                lines.append(f"  {m['stream']}/{m['frame_seq']}: recorded {m['recorded']} ({m['recorded_reason']}"
                             f"{', ' + m['recorded_suppressed_by'] if m['recorded_suppressed_by'] else ''}), replayed "
                             f"{m['replayed']} ({m['replayed_reason']}"
                             f"{', ' + m['replayed_suppressed_by'] if m['replayed_suppressed_by'] else ''})")
    for s in sides:
        if s["hardest_suppressed"]:
            lines += ["", f"Hardest frames held back ({s['label']}):",
                      f"  {'hardness':<9} {'stream':<16} {'frame_seq':<12} {'captured (UTC)':<20} held back by"]
            for h in s["hardest_suppressed"]:
                lines.append(f"  {h['hardness']:<9.4f} {h['stream']:<16} {h['frame_seq']:<12} "
                             f"{_utc(h['capture_unix_ns'] / 1e9):<20} {h['suppressed_by']}")
    lines.append("")
    lines.append("Uplink: " + "; ".join(f"{s['label']}: {s['overall']['uplink_basis']}" for s in sides) + ".")
    if report["notes"]:
        lines.append("Notes:")
        lines += [f"  - {n}" for n in report["notes"]]
    rate = rec["records_per_second"]
    lines.append(f"Replayed {rec['lines']:,} records in {rec['seconds']:.1f} s"
                 + (f" ({rate:,} records/s; {rec['cpu_seconds']:.2f} s of CPU)." if rate else "."))
    return "\n".join(lines)


def gate_failures(report: Optional[Dict[str, Any]], warnings: Sequence[str], max_share: Optional[float],
                  max_bytes_per_day: Optional[float], strict: bool) -> List[str]:
    """Why a CI gate fails (empty: it passes); see the module doc."""
    out: List[str] = []
    if strict and warnings:
        out.append(f"--strict: the policy has {len(warnings)} warning(s)")
    if report is None:
        return out
    side = report["sides"][0]
    fig = side["overall"]
    if max_share is not None and fig["share"] > max_share:
        out.append(f"--max-share {max_share:g}: {side['label']} escalates {fig['share']:.2%} of the recorded frames")
    per_day = fig["uplink_bytes_per_day"]
    if max_bytes_per_day is not None and per_day is not None and per_day > max_bytes_per_day:
        out.append(f"--max-bytes-per-day {max_bytes_per_day:g}: {side['label']} sends about "
                   f"{human_bytes(per_day)} ({per_day:,} bytes) per day")
    for s in report["sides"]:
        r = s.get("reproduction")
        if r and r["agreed"] != r["checked"]:
            out.append(f"{s['label']} decided {r['checked']:,} of the recorded frames but the replay reproduces "
                       f"only {r['agreed']:,}: the figures are not exact (see the notes)")
    return out
