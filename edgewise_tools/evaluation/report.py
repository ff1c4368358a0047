"""Eval outputs: ``eval.json`` (everything), ``eval.md`` (tables), ``eval.png`` (curves)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List

from edgewise_tools.evaluation import scoring

POLICY_LABELS = {
    "random": "random sampling",
    "sedna_threshold": "Sedna Threshold (mean conf)",
    "sedna_ibt": "Sedna IBT",
    "combined": "edgewise combined hardness",
    "learned": "edgewise learned gain",
    "oracle": "oracle (knows what escalating gains)",
}


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def markdown(result: Dict[str, Any]) -> str:
    base = result["baselines"]
    cloud_f1 = base["cloud_only"]["f1"] or 1.0
    lines = [
        f"# edgewise eval: {result['data']} ({result['frames']} frames)",
        "",
        f"edge `{result['edge_model']}`, cloud `{result['cloud_model']}`, merge `{result['merge']}`",
        "",
        "| run | escalated | F1 (GT) | % of cloud F1 | mAP@0.5 | F1 vs cloud | uplink saved |",
        "|---|---|---|---|---|---|---|",
    ]
    rows = [("edge only", base["edge_only"]), ("cloud only", base["cloud_only"]),
            (f"policy file `{result['policy']}`", result["policy_run"])]
    for name, r in rows:
        lines.append(f"| {name} | {_pct(r['escalated'])} | {r['f1']:.3f} | {_pct(r['f1'] / cloud_f1)} | "
                     f"{r['map50']:.3f} | {r['f1_vs_cloud']:.3f} | {_pct(r['uplink_saved'])} |")
    lines += ["", "## Policies at equal escalation rates (F1 against ground truth, % of cloud-only F1)", ""]
    rates = [row["rate"] for row in next(iter(result["at_rates"].values()))]
    lines.append("| policy | " + " | ".join(_pct(r) for r in rates) + " |")
    lines.append("|---|" + "---|" * len(rates))
    for name, rows_ in result["at_rates"].items():
        cells = [f"{row['f1']:.3f} ({_pct(row['f1'] / cloud_f1)})" for row in rows_]
        lines.append(f"| {POLICY_LABELS.get(name, name)} | " + " | ".join(cells) + " |")
    t = result["target"]
    lines += ["", f"Target: hybrid >= {_pct(t['f1_fraction'])} of cloud-only F1 with <= "
              f"{_pct(t['max_rate'])} of frames escalated. Best policy at {_pct(t['max_rate'])}: "
              f"**{POLICY_LABELS.get(t['best_policy'], t['best_policy'])}**, "
              f"{_pct(t['best_f1_fraction'])} of cloud F1"
              + (f" (closes {_pct(t['gap_closed'])} of the edge-to-cloud F1 gap)" if t.get("gap_closed") is not None
                 else "") + f" -> target {'met' if t['met'] else 'NOT met'}."]
    if t.get("ours_minus_baselines"):
        margins = ", ".join(f"{POLICY_LABELS.get(b, b)} {100 * m / cloud_f1:+.1f}"
                          for b, m in t["ours_minus_baselines"].items())
        lines.append(f"Our better policy against each baseline at {_pct(t['compared_at_rate'])} (points of cloud "
                     f"F1): {margins} -> {'beats' if t['ours_beat_baselines'] else 'does NOT beat'} all of them.")
    if t.get("oracle_f1_fraction") is not None:
        lines.append(f"An oracle that ranks frames by what escalating them truly gains keeps "
                     f"{_pct(t['oracle_f1_fraction'])} at {_pct(t['compared_at_rate'])}: about the ceiling for "
                     "frame selection with this model pair.")
    if not t.get("cloud_better", True):
        lines.append(f"The cloud model is not more accurate than the edge model on this set (F1 "
                     f"{base['cloud_only']['f1']:.3f} vs {base['edge_only']['f1']:.3f}): escalation has nothing "
                     "to add, so the target is not counted as met.")
    return "\n".join(lines) + "\n"


def plot(result: Dict[str, Any], path: Path) -> bool:
    """Curves of % of cloud F1 vs escalation rate; False when matplotlib is absent."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    cloud_f1 = result["baselines"]["cloud_only"]["f1"] or 1.0
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, rows in result["at_rates"].items():
        xs = [100 * r["rate"] for r in rows]
        style = {"ls": "--", "color": "black", "marker": "x"} if name == scoring.ORACLE else {"marker": "o"}
        ax1.plot(xs, [100 * r["f1"] / cloud_f1 for r in rows], label=POLICY_LABELS.get(name, name), **style)
        ax2.plot(xs, [r["map50"] for r in rows], label=POLICY_LABELS.get(name, name), **style)
    sweep = result["threshold_sweep"]
    ax1.plot([100 * r["escalated"] for r in sweep], [100 * r["f1"] / cloud_f1 for r in sweep],
             "k:", label="combined, threshold sweep")
    ax1.axhline(100 * result["baselines"]["edge_only"]["f1"] / cloud_f1, color="grey", ls="--", label="edge only")
    ax1.axhline(100 * result["target"]["f1_fraction"], color="red", ls=":", lw=1, label="target")
    ax1.axvline(100 * result["target"]["max_rate"], color="red", ls=":", lw=1)
    ax1.set(xlabel="frames escalated (%)", ylabel="hybrid F1 (% of cloud-only F1)", title="Accuracy kept vs frames sent")
    ax2.axhline(result["baselines"]["cloud_only"]["map50"], color="grey", ls="--", label="cloud only")
    ax2.axhline(result["baselines"]["edge_only"]["map50"], color="grey", ls=":", label="edge only")
    ax2.set(xlabel="frames escalated (%)", ylabel="hybrid mAP@0.5", title="mAP@0.5 vs frames sent")
    ax1.legend(fontsize=8)
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write(result: Dict[str, Any], out: Path) -> List[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "eval.json", out / "eval.md"]
    paths[0].write_text(json.dumps(result, indent=1))
    paths[1].write_text(markdown(result))
    if plot(result, out / "eval.png"):
        paths.append(out / "eval.png")
    return paths
