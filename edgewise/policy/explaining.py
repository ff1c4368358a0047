"""Human-readable summary of a policy, printed by ``edgewise edge check-policy``.

Says in plain sentences what the policy will do, then lists warnings about
settings that are valid but probably not what the operator meant (a budget
that can never admit a frame, a band outside the detector's score range...).
"""

from __future__ import annotations

from typing import List

from edgewise.policy.budget import fraction_cap
from edgewise.policy.schema import Policy
from edgewise.regions import REGION_MODES, regions_most


def warnings(policy: Policy) -> List[str]:
    """Valid-but-suspicious settings, one sentence each."""
    out: List[str] = []
    s = policy.spec
    b = s.budget
    if fraction_cap(b.max_fraction, b.window_frames) < 1:
        out.append(
            f"budget.maxFraction {b.max_fraction:g} x windowFrames {b.window_frames} < 1: "
            "no frame can ever be escalated; raise one of them"
        )
    for sid, st in s.streams.items():
        if st.max_fraction is not None and fraction_cap(st.max_fraction, b.window_frames) < 1:
            out.append(f"streams.{sid}.maxFraction x windowFrames < 1: stream {sid} never escalates")
    if s.threshold == 0:
        out.append("threshold 0: every frame is hard; only the budget limits escalations")
    if policy.learned is not None:
        merge = policy.learned.info.get("merge")
        if merge and merge != s.merge.strategy:
            out.append(f"the gain model was fitted for merge.strategy {merge}, this policy merges with "
                       f"{s.merge.strategy}: its ranking assumed the other merge")
        sent = policy.learned.info.get("payload")
        if sent and sent != s.payload.mode:
            out.append(f"the gain model was fitted for payload.mode {sent}, this policy sends {s.payload.mode}: "
                       "its ranking assumed what the other payload lets the cloud see")
    else:  # the weighted signals decide
        if all(w == 0 for w in s.signals.weights.values()):
            out.append("no signal has a positive weight")
        if s.signals.weights.get("missed_object", 0.0) == 0 and s.audit_fraction == 0:
            out.append(
                "missed_object has no weight and auditFraction is 0: frames where the edge model "
                "saw nothing can only escalate through tracker_disagreement"
            )
    if s.payload.mode in ("crops", "regions") and s.merge.strategy == "replace":
        out.append(
            f"payload.mode {s.payload.mode} with merge.strategy replace: edge boxes outside the crops are "
            "kept only because the merge knows the crop regions; consider fuse"
        )
    if s.payload.refreshes and s.merge.carry_frames == 0:
        out.append(
            f"payload.wholeFrameEverySeconds {s.payload.whole_frame_every_s:g} without merge.carryFrames: what a "
            "whole frame finds is kept only for that frame; carrying keeps it between escalations"
        )
    if s.merge.carry_scope == "regions" and (s.merge.carry_frames == 0 or s.payload.mode not in REGION_MODES):
        why = ("nothing is carried" if s.merge.carry_frames == 0
               else f"every payload.mode {s.payload.mode} answer covers the whole frame")
        out.append(f"merge.carryScope regions has no effect: {why}")
    if s.merge.carry_edge_floor and s.merge.carry_frames == 0:
        out.append("merge.carryEdgeFloor has no effect: nothing is carried (merge.carryFrames 0), so no answer "
                   "is in force between escalations")
    if s.on_cloud_unavailable == "spool" and s.deadline_ms < 50:
        out.append(f"deadlineMs {s.deadline_ms} is very short; most escalations will spool")
    return out


def explain(policy: Policy) -> str:
    """Multi-line plain-language summary of ``policy`` (ends with warnings, if any)."""
    s = policy.spec
    sig = s.signals
    b = s.budget
    lines = [f"Policy {policy.metadata.name!r}" + (f" from {policy.source}" if policy.source else "")]
    if policy.metadata.description:
        lines.append(f"  {policy.metadata.description}")
    if policy.learned is not None:
        info = policy.learned.info
        lines.append(
            f"Hardness: percentile of the predicted F1 gain of escalating the frame, among the "
            f"{info.get('frames', '?')} training frames of the gain model {policy.learned.source or sig.learned_model}"
            f" (fitted on {info.get('trainData', '?')}); threshold {s.threshold:g} escalates about "
            f"{1 - s.threshold:.0%} of traffic like those frames. Signal weights are unused."
            + (" The model reads the carry state (what the stream's carried answers already explain), which "
               "its own escalations change: the share it escalates differs, and `check-policy --data` "
               "measures it." if policy.learned.uses_carry() else "")
        )
    else:
        weights = ", ".join(f"{k}={v:g}" for k, v in sig.weights.items() if v > 0)
        how = "the highest weighted signal" if sig.combine == "max" else "the weighted mean of signals"
        lines.append(f"Hardness: {how} ({weights}).")
    lines.append(
        f"A frame is hard when hardness >= {s.threshold:g}; boxes scoring in "
        f"[{s.band.low:g}, {s.band.high:g}] count as uncertain "
        f"({sig.uncertain_saturation} of them saturate uncertain_count)."
    )
    for name, co in s.classes.items():
        parts = []
        if co.threshold is not None:
            parts.append(f"threshold {co.threshold:g} when present")
        if co.band is not None:
            parts.append(f"band [{co.band.low:g}, {co.band.high:g}]")
        lines.append(f"  class {name}: " + (", ".join(parts) or "no change"))
    for sid, st in s.streams.items():
        parts = []
        if st.mode != "auto":
            parts.append(f"mode {st.mode}")
        if st.threshold is not None:
            parts.append(f"threshold {st.threshold:g} (overrides classes)")
        if st.band is not None:
            parts.append(f"band [{st.band.low:g}, {st.band.high:g}]")
        if st.cooldown_seconds is not None:
            parts.append(f"cooldown {st.cooldown_seconds:g}s")
        rate, burst = policy.rate_for(sid)
        if st.max_per_second is not None or st.burst is not None:
            parts.append(f"rate {rate:g}/s burst {burst}" if rate else f"burst {burst}")
        if st.max_fraction is not None:
            parts.append(f"maxFraction {st.max_fraction:g} (at most {fraction_cap(st.max_fraction, b.window_frames)} "
                         f"of any {b.window_frames} frames)")
        lines.append(f"  stream {sid}: " + (", ".join(parts) or "no change"))
    if s.audit_fraction > 0:
        lines.append(f"Also {s.audit_fraction:.1%} of easy frames are escalated as random audits.")
    rate_text = (f"{b.max_per_second:g}/s with bursts of {b.burst}" if b.max_per_second
                 else "no rate limit")
    lines.append(
        f"Budget per stream: at most {fraction_cap(b.max_fraction, b.window_frames)} of any {b.window_frames} "
        f"frames (maxFraction {b.max_fraction:g}), "
        f"{rate_text}; "
        + ("when over budget the hardest recent frames go first." if b.priority == "hardest"
           else "first come, first served.")
    )
    lines.append(
        "Cooldown: " + (f"{s.cooldown_seconds:g}s between escalations of a stream."
                        if s.cooldown_seconds > 0 else "none.")
    )
    pl = s.payload
    regions = (f"up to {regions_most(pl.mode, pl.max_regions)} full-resolution regions (padding {pl.crop_padding:g} x box size, "
               f"at least {pl.region_min} px, together at most {pl.max_region_area:.0%} of the frame) around the "
               "uncertain boxes and the motion no detection explains")
    payload = {
        "full": "the full frame",
        "crops": f"one padded crop (padding {pl.crop_padding:g} x box size) around the uncertain boxes",
        "downscaled": f"the frame scaled to {pl.downscale_width} px wide",
        "regions": regions,
        "low+regions": f"the frame at {pl.downscale_width} px wide plus {regions}",
    }[pl.mode]
    if pl.refreshes:
        payload += (f"; the whole frame instead when the stream's last went {pl.whole_frame_every_s:g}s ago or "
                    "more (its first escalation too),")
    over = s.transport or "the device's own transport (its cloud.transport)"
    lines.append(
        f"Escalation: {over} with a {s.deadline_ms} ms deadline, sending {payload} "
        f"as JPEG quality {s.payload.jpeg_quality}."
    )
    unavailable = {
        "spool": "escalations are spooled on disk and replayed when it returns",
        "edge_only": "the edge result is published and the escalation is given up",
        "drop": "the frame's result is dropped",
    }[s.on_cloud_unavailable]
    lines.append(f"Cloud unavailable: {unavailable}.")
    if s.merge.strategy == "replace":
        lines.append("Merge: cloud boxes replace edge boxes.")
    else:
        lines.append(
            f"Merge: edge and cloud boxes of one class with IoU >= {s.merge.iou:g} are fused "
            f"(weighted box fusion); unmatched edge boxes kept when score >= {s.merge.edge_floor:g}."
        )
    if s.merge.carry_frames:
        lines.append(f"Carrying: the cloud's boxes are tracked and kept up to {s.merge.carry_frames} frames after "
                     f"its answer (dropped below a template match of {s.merge.carry_match:g}); "
                     + ("a newer answer replaces them only inside the regions it saw, older answers' boxes stay "
                        "carried elsewhere." if s.merge.carry_scope == "regions" else "a newer answer replaces them.")
                     + (f" While an answer is in force, the edge's boxes under {s.merge.edge_floor:g} that no carried box "
                        "confirms are dropped where it looked." if s.merge.carry_edge_floor else ""))
    warns = warnings(policy)
    if warns:
        lines.append("Warnings:")
        lines.extend(f"  - {w}" for w in warns)
    return "\n".join(lines)
