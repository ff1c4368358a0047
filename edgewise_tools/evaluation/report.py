"""Eval outputs: ``eval.json`` (everything), ``eval.md`` (tables), ``eval.png`` (curves)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional

from edgewise_tools import provenance
from edgewise_tools.evaluation import bootstrap, scoring
from edgewise_tools.evaluation.metrics import share_of
from edgewise_tools.reference import markdown_cell

POLICY_LABELS = {
    "random": "random sampling",
    "sedna_threshold": "Sedna Threshold (mean conf)",
    "sedna_ibt": "Sedna IBT",
    "combined": "edgewise combined hardness",
    "learned": "edgewise learned gain",
    "learned_carry": "edgewise carry-aware gain",
    "oracle": "oracle (knows what escalating gains)",
}
#: the files :func:`write` writes into the report folder (eval.png only with matplotlib)
FILES = ("eval.json", "eval.md", "eval.png")
PAYLOAD_LABELS = {
    "full": "whole frame, full resolution",
    "crops": "one crop of the uncertain boxes",
    "downscaled": "whole frame, downscaled",
    "regions": "regions (uncertain boxes + unexplained motion)",
    "low+regions": "downscaled frame + regions",
}


def _payload_label(mode: str, result: Dict[str, Any]) -> str:
    """A payload table row's name; ``<mode>+whole`` is the policy's mode with its whole-frame refresh."""
    if not mode.endswith("+whole"):
        return PAYLOAD_LABELS.get(mode, mode)
    base = mode[:-len("+whole")]
    return f"{PAYLOAD_LABELS.get(base, base)}, the whole frame every {result.get('whole_frame_every_s', 0):g} s"


def _pct(x: Optional[float]) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _share(f1: float, cloud_f1: float) -> str:
    """``f1`` as a share of cloud-only F1; "n/a" when that is 0 (nothing to be a share of)."""
    return _pct(share_of(f1, cloud_f1))


def _ci(row: Dict[str, Any], scale: float = 1.0) -> str:
    lo, hi = row["f1_ci"]
    return f"[{lo / scale:.3f}, {hi / scale:.3f}]" if scale == 1.0 else f"[{100 * lo / scale:.1f}, {100 * hi / scale:.1f}]"


def _points(x: float, cloud_f1: float) -> str:
    """An F1 difference in points of cloud-only F1; the plain F1 difference (3 decimals) when
    cloud-only F1 is 0 and has no points."""
    return f"{100 * x / cloud_f1:+.1f}" if cloud_f1 > 0 else f"{x:+.3f}"


def _bootstrap(result: Dict[str, Any]) -> str:
    """How the intervals were drawn: samples, and the seed that draws them again."""
    b = result.get("bootstrap", {})
    seed = f" (seed {b['seed']})" if "seed" in b else ""
    return f"{b.get('samples', 0)} bootstrap samples of the streams{seed}"


def plot_title(result: Dict[str, Any]) -> str:
    """What produced the plot, above its panels: the code, the models, the data (preset, split
    and seed, which generate it again), the policy and the intervals' draw. A PNG travels
    without its eval.md; its title named neither the models nor the data's seed."""
    prov = result.get("provenance") or {}
    if not prov:
        return ""
    models = ", ".join(f"{k} {v['path']} ({v['sha256']})" for k, v in prov.get("models", {}).items())
    data = "; ".join(provenance.data_text(k, d, ("preset", "split", "seed"), quote="")
                     for k, d in prov.get("data", {}).items()) or f"data {result['data']}"
    return (f"edgewise {prov['edgewise']}, commit {prov['commit']}, {prov['date']}; models: {models}\n{data}; "
            f"policy {result['policy']}; payload {result.get('payload', 'full')}; 95% intervals from "
            f"{_bootstrap(result)}")


def _label(name: str) -> str:
    return POLICY_LABELS.get(name, name)


def _carry_lines(carry: Optional[Dict[str, Any]], cloud_f1: float) -> List[str]:
    """What carrying the cloud's answers did (``eval.json`` ``carry``), one paragraph."""
    if not carry or not carry.get("lag_frames"):
        return ["The edge carries no answer between escalations (policy `merge.carryFrames: 0` or "
                "`--carry-lag 0`): every frame not escalated is the edge's alone.", ""]
    on, off = carry["ours_at_target_rate"], carry["ours_without_carry"]
    return [f"Between escalations the edge carries each answer's boxes up to {carry['frames']} frames "
            f"(template match >= {carry['min_match']:g}; a newer answer replaces them"
            f"{' only inside the regions it saw' if carry.get('scope') == 'regions' else ''}), "
            f"from {carry['lag_frames']} frame(s) after the "
            f"escalated frame; every policy, and the oracle, keeps the policy's cooldown "
            f"({carry['cooldown_frames']} frames). "
            f"Our policy at the target rate: {_share(on['f1'], cloud_f1)} of cloud F1 carrying, "
            f"{_share(off['f1'], cloud_f1)} with the same frames escalated and nothing carried."
            + (f" {ff['ours']:.1%} of its escalations are a stream's first frame, where nothing is carried yet "
               f"(random sampling's: {ff['random']:.1%}; a live feed starts once)."
               if (ff := carry.get("first_frame_share")) else ""), ""]


def _at_quality(result: Dict[str, Any]) -> str:
    """" at JPEG quality Q" when the result's reference has a quality of its own, not the
    payload's (a report without ``--reference-quality`` reads as it did before the option)."""
    q = result.get("reference_quality")
    return f" at JPEG quality {q}" if q is not None and q != result.get("payload_quality") else ""


def _own_quality_saving(result: Dict[str, Any], saved: float) -> str:
    """What the same escalations save against every frame whole at the payload's own quality,
    when the reference was encoded at another: a policy's lower quality is a saving a
    cloud-only deployment could make too."""
    ref, own = result.get("uplink_all_frames_bytes"), result.get("uplink_all_frames_bytes_at_payload_quality")
    if not ref or not own or result.get("reference_quality") == result.get("payload_quality"):
        return ""
    return (f" (against every frame whole at the payload's own JPEG quality {result.get('payload_quality')}, "
            f"which a cloud-only deployment could send too: {_pct(1 - (1 - saved) * ref / own)})")


def markdown(result: Dict[str, Any]) -> str:
    base = result["baselines"]
    cloud_f1 = base["cloud_only"]["f1"]
    streams = result.get("streams", bootstrap.MIN_STREAMS)
    lines = [
        f"# edgewise eval: {result['data']} ({result['frames']} frames, {result.get('streams', '?')} "
        f"stream{'' if result.get('streams') == 1 else 's'})",
        "",
        provenance.markdown(result["provenance"]) if "provenance" in result else
        f"edge `{result['edge_model']}`, cloud `{result['cloud_model']}`",
        "",
        f"Merge `{result['merge']}`; policies compared with payload `{result.get('payload', 'full')}`"
        + (f" (the whole frame when a stream's last went {result['whole_frame_every_s']:g} s ago or more)"
           if result.get("whole_frame_every_s") else "")
        + (f" at JPEG quality {result['payload_quality']}, against a reference of every frame whole at quality "
           f"{result['reference_quality']} (cloud-only F1 and the uplink saved are taken against it)"
           if result.get("reference_quality", result.get("payload_quality")) != result.get("payload_quality") else "")
        + "; "
        f"95% intervals from {_bootstrap(result)}."
        + (f" **Only {streams} stream{'' if streams == 1 else 's'}: resampling so few understates the "
           "uncertainty; read the intervals as a floor"
           + (" (one stream: they have no width)" if streams == 1 else "")
           + f", and no lead is judged (fewer than {bootstrap.MIN_STREAMS} streams).**"
           if streams < bootstrap.MIN_STREAMS else ""),
        "",
        *_carry_lines(result.get("carry"), cloud_f1),
        "| run | escalated | F1 (GT) [95% CI] | % of cloud F1 | mAP@0.5 | F1 vs cloud | uplink saved |",
        "|---|---|---|---|---|---|---|",
    ]
    rows = [("edge only", base["edge_only"]), ("cloud only", base["cloud_only"]),
            (f"policy file `{markdown_cell(result['policy'])}`", result["policy_run"])]
    for name, r in rows:
        ci = f" {_ci(r)}" if "f1_ci" in r else ""
        lines.append(f"| {name} | {_pct(r['escalated'])} | {r['f1']:.3f}{ci} | {_share(r['f1'], cloud_f1)} | "
                     f"{r['map50']:.3f} | {r['f1_vs_cloud']:.3f} | {_pct(r['uplink_saved'])} |")
    t = result["target"]
    if result.get("payloads"):
        rate = _pct(t["compared_at_rate"])
        lines += ["", f"## Payload modes (uplink bytes from real JPEG encodes; hybrid = "
                      f"{_label(result.get('ours', t.get('ours', '')))} at {rate})", "",
                  "| payload | bytes per escalation | cloud ms per escalation | cloud-only F1 (% of full-frame cloud) "
                  f"| hybrid F1 at {rate} (% of cloud F1) | uplink saved at {rate} |",
                  "|---|---|---|---|---|---|"]
        for mode, p in result["payloads"].items():
            c, h = p["cloud_only"], p["at_target_rate"]
            lines.append(f"| {_payload_label(mode, result)} (`{mode}`) | {c['bytes_per_escalation'] / 1e3:.1f} kB | "
                         f"{c['cloud_ms_per_escalation']:.0f} | {c['f1']:.3f} ({_share(c['f1'], cloud_f1)}) | "
                         f"{h['f1']:.3f} ({_share(h['f1'], cloud_f1)}) | {_pct(h['uplink_saved'])} |")
    # the interval is the policy's F1's, drawn in points of the cloud's F1 (not an interval of the
    # ratio, whose paired draws would be narrower: the streams' difficulty cancels in it)
    lines += ["", "## Policies at equal escalation rates (F1 against ground truth, % of cloud-only F1, "
                  + ("[95% CI of the F1, in % of cloud-only F1])" if cloud_f1 > 0 else "[95% CI of the F1])"), ""]
    rates = [row["rate"] for row in next(iter(result["at_rates"].values()))]
    lines.append("| policy | " + " | ".join(_pct(r) for r in rates) + " |")
    lines.append("|---|" + "---|" * len(rates))
    short = False
    for name, rows_ in result["at_rates"].items():
        cells = []
        for row in rows_:
            ci = f" {_ci(row, cloud_f1 if cloud_f1 > 0 else 1.0)}" if "f1_ci" in row else ""
            cells.append(f"{row['f1']:.3f} ({_share(row['f1'], cloud_f1)}){ci}"
                         + (f" at {_pct(row['escalated'])}†" if row.get("short") else ""))
            short = short or bool(row.get("short"))
        lines.append(f"| {_label(name)} | " + " | ".join(cells) + " |")
    tied = [_label(n) for n, rows_ in result["at_rates"].items() if n != "random" and rows_[0].get("draws", 1) > 1]
    if tied:
        draws = max(rows_[0].get("draws", 1) for rows_ in result["at_rates"].values())
        lines += ["", f"Random sampling is averaged over {draws} seeds; " + ", ".join(tied)
                  + f" rank some frames equal, and each such row is averaged over {draws} draws of the order "
                  "among them."]
    if short:
        cooldown = (result.get("carry") or {}).get("cooldown_frames")
        lines += ["", "† escalated less than the column's rate by more than one frame"
                  + (f": the policies keep the policy's cooldown ({cooldown} frames apart in a stream), which "
                     "allows at most the share shown" if cooldown else "")
                  + "; not compared with the other policies at that rate (no lead, best policy or verdict "
                  "is drawn from it)."]
    if result.get("differences"):
        ours = result.get("ours", t.get("ours"))
        unit = "points of cloud-only F1" if cloud_f1 > 0 else "F1; cloud-only F1 is 0, so not in points of it"
        lines += ["", f"## {_label(ours)} minus each baseline ({unit}, [95% CI]; "
                      "**bold**: the interval lies above 0, a lead that is not noise)", "",
                  "| baseline | " + " | ".join(_pct(r) for r in rates) + " |", "|---|" + "---|" * len(rates)]
        for b, rows_ in result["differences"].items():
            cells = []
            for d in rows_:
                text = (f"{_points(d['diff'], cloud_f1)} [{_points(d['ci'][0], cloud_f1)}, "
                        f"{_points(d['ci'][1], cloud_f1)}]")
                if d.get("comparable") is False:
                    text = f"not comparable†: {text}"
                cells.append(f"**{text}**" if d["beats"] else text)
            lines.append(f"| {_label(b)} | " + " | ".join(cells) + " |")
    lines += ["", *verdict(result)]
    return "\n".join(lines) + "\n"


def verdict(result: Dict[str, Any]) -> List[str]:
    """The target's verdict, one line per part."""
    t = result["target"]
    base = result["baselines"]
    cloud_f1 = base["cloud_only"]["f1"]
    at = _pct(t["compared_at_rate"])
    ours = _label(t.get("ours", t["best_policy"]))

    def mark(v: Any) -> str:
        return "not judged" if v is None else ("met" if v else "NOT met")

    esc = t.get("ours_escalated")
    really = "" if esc is None else f", which escalates {_pct(esc)} of the frames there"
    out = [f"Target at <= {_pct(t['max_rate'])} of frames escalated, judged at {at} for {ours} (the policy "
           f"declared before looking at the test set){really}:"]
    if t.get("edge_gap_met") is not None:
        mr = t.get("edge_map50_ratio")
        out.append(f"- a real gap, edge only <= {_pct(t['edge_ratio_target'])} of cloud only: F1 "
                   f"{_pct(t['edge_f1_ratio'])}" + (f", mAP@0.5 {_pct(mr)}" if mr is not None else "")
                   + f" -> {mark(t.get('edge_gap_met'))}")
    out += [
            f"- >= {_pct(t['f1_fraction'])} of cloud-only F1: {_pct(t.get('ours_f1_fraction'))} -> "
            f"{mark(t.get('fraction_met'))}"]
    if t.get("gap_closed") is not None:
        out.append(f"- edge-to-cloud F1 gap closed >= {_pct(t['gap_target'] or 0)}: {_pct(t['gap_closed'])} -> "
                   f"{mark(t.get('gap_met'))}")
    if t.get("ours_uplink_saved") is not None:
        out.append(f"- uplink saved >= {_pct(t['uplink_target'] or 0)} against every frame whole at full "
                   f"resolution{_at_quality(result)}: {_pct(t['ours_uplink_saved'])} -> {mark(t.get('uplink_met'))}"
                   + _own_quality_saving(result, t["ours_uplink_saved"]))
    if t.get("ours_minus_baselines"):
        ci = t.get("ours_beat_baselines_ci", {})
        margins = ", ".join(f"{_label(b)} {_points(m, cloud_f1)}"
                            + ("" if ci.get(b) is None else (" (CI above 0)" if ci[b] else " (CI not above 0)"))
                            for b, m in t["ours_minus_baselines"].items())
        out.append(f"- lead over each baseline >= {100 * (t.get('margin_target') or 0):.0f} points of cloud F1 "
                   f"with the interval above 0: {margins} -> {t.get('margins_why') or mark(t.get('margins_met'))}")
    out.append(f"**Overall: target {'met' if t['met'] else 'NOT met'}.** Best of all policies at {at}: "
               f"{_label(t['best_policy'])}, {_pct(t['best_f1_fraction'])} of cloud F1.")
    if t.get("oracle_f1_fraction") is not None:
        carried = bool((result.get("carry") or {}).get("lag_frames"))
        out.append(f"An oracle that ranks frames by what escalating each one alone truly gains (with the same "
                   f"cooldown) keeps "
                   f"{_pct(t['oracle_f1_fraction'])} at {at}: "
                   + ("a reference, not a ceiling, once answers are carried (a frame's gain then depends on "
                      "the frames escalated before it)." if carried else
                      "about the ceiling for frame selection with this model pair."))
    if not t.get("cloud_better", True):
        out.append(f"The cloud model is not more accurate than the edge model on this set (F1 "
                   f"{base['cloud_only']['f1']:.3f} vs {base['edge_only']['f1']:.3f}): escalation has nothing "
                   "to add, so the target is not counted as met.")
    return out


#: what a report without figures says: matplotlib is not a dependency of the package (the ``train``
#: extra brings it), so ``eval`` and ``demo`` draw only where it is installed
NO_MATPLOTLIB = "matplotlib is not installed, so no figures: `pip install matplotlib` (or the train extra) draws them"


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend, or None when matplotlib is not installed
    (:data:`NO_MATPLOTLIB`); the one test of it for every report that draws."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def plot(result: Dict[str, Any], path: Path) -> bool:
    """Curves of % of cloud F1 (with 95% bands) and mAP vs escalation rate, and accuracy vs
    bytes per payload mode; False when matplotlib is absent."""
    plt = pyplot()
    if plt is None:
        return False
    # a cloud-only F1 of 0 is no scale: the F1 itself is drawn (x 100), and the axis says so
    cloud_f1 = result["baselines"]["cloud_only"]["f1"] or 1.0
    share_of = "% of cloud-only F1" if result["baselines"]["cloud_only"]["f1"] > 0 else "x 100; cloud-only F1 is 0"
    panels = 3 if result.get("payloads") else 2
    fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 5.2))
    ax1, ax2 = axes[0], axes[1]
    for name, rows in result["at_rates"].items():
        xs = [100 * r.get("escalated", r["rate"]) for r in rows]  # what was escalated (a cooldown may fall short)
        style: Dict[str, Any] = {"ls": "--", "color": "black", "marker": "x"} if name == scoring.ORACLE \
            else {"marker": "o"}
        (line,) = ax1.plot(xs, [100 * r["f1"] / cloud_f1 for r in rows], label=_label(name), **style)
        if all("f1_ci" in r for r in rows) and name != scoring.ORACLE:
            ax1.fill_between(xs, [100 * r["f1_ci"][0] / cloud_f1 for r in rows],
                             [100 * r["f1_ci"][1] / cloud_f1 for r in rows], color=line.get_color(), alpha=0.12)
        ax2.plot(xs, [r["map50"] for r in rows], label=_label(name), **style)
    sweep = result["threshold_sweep"]
    ax1.plot([100 * r["escalated"] for r in sweep], [100 * r["f1"] / cloud_f1 for r in sweep],
             "k:", label="combined, threshold sweep")
    ax1.axhline(100 * result["baselines"]["edge_only"]["f1"] / cloud_f1, color="grey", ls="--", label="edge only")
    ax1.axhline(100 * result["target"]["f1_fraction"], color="red", ls=":", lw=1, label="target")
    ax1.axvline(100 * result["target"]["max_rate"], color="red", ls=":", lw=1)
    ax1.set(xlabel="frames escalated (%)", ylabel=f"hybrid F1 ({share_of})",
            title="Accuracy kept vs frames sent (bands: 95% CI)")
    ax2.axhline(result["baselines"]["cloud_only"]["map50"], color="grey", ls="--", label="cloud only")
    ax2.axhline(result["baselines"]["edge_only"]["map50"], color="grey", ls=":", label="edge only")
    ax2.set(xlabel="frames escalated (%)", ylabel="hybrid mAP@0.5", title="mAP@0.5 vs frames sent")
    for ax in (ax1, ax2):  # legends below the axes: they never cover a curve
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, frameon=False)
    if panels == 3:
        ax3 = axes[2]
        rate = _pct(result["target"]["compared_at_rate"])
        for mode, p in result["payloads"].items():
            h = p["at_target_rate"]
            ax3.scatter([p["cloud_only"]["bytes_per_escalation"] / 1e3], [100 * h["f1"] / cloud_f1], s=50,
                        label=f"{_payload_label(mode, result)}: {100 * h['uplink_saved']:.0f}% uplink saved")
        ax3.set(xlabel="bytes per escalation (kB)", ylabel=f"hybrid F1 at {rate} escalated ({share_of})",
                title="Payload modes: accuracy vs bytes")
        ax3.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=1, frameon=False)
    title = plot_title(result)
    if title:  # what produced it, above the panels; its paths' '$' as they are, not math
        fig.suptitle(title.replace("$", r"\$"), fontsize=8, color="grey", y=1.04)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return True


def write(result: Dict[str, Any], out: Path) -> List[Path]:
    """Write :data:`FILES` into ``out``; the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    data, text, png = (out / name for name in FILES)
    data.write_text(json.dumps(result, indent=1))
    text.write_text(markdown(result))
    return [data, text] + ([png] if plot(result, png) else [])
