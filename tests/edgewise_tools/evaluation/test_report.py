"""``eval.md`` from hand-built results: cells that fell short of their column's rate, a set
of one stream, and a cloud model whose F1 is 0 (no share of it is printed)."""

from __future__ import annotations

from typing import Any, Dict, Optional

from edgewise_tools.evaluation import bootstrap
from edgewise_tools.evaluation.evaluating import judge_target
from edgewise_tools.evaluation.report import markdown


def _row(rate: float, f1: float, escalated: Optional[float] = None) -> Dict[str, Any]:
    esc = rate if escalated is None else escalated
    return {"rate": rate, "f1": f1, "escalated": esc, "short": (rate - esc) * 100 > 1, "f1_ci": [f1 - 0.01, f1 + 0.01],
            "map50": 0.5, "f1_vs_cloud": 0.8, "uplink_saved": 0.9}


def _result(cloud_f1: float = 0.8, streams: int = 30, ours_at_30: float = 0.3) -> Dict[str, Any]:
    """100 frames; ours (combined) escalates ``ours_at_30`` at the 30% column."""
    base = {"edge_only": {"f1": 0.6, "escalated": 0.0, "map50": 0.5, "f1_vs_cloud": 0.7, "uplink_saved": 1.0},
            "cloud_only": {"f1": cloud_f1, "escalated": 1.0, "map50": 0.6, "f1_vs_cloud": 1.0, "uplink_saved": 0.0}}
    rates = {"random": [_row(0.15, 0.65), _row(0.3, 0.70)],
             "combined": [_row(0.15, 0.76), _row(0.3, 0.78, ours_at_30)]}
    beats: Optional[bool] = True if streams >= bootstrap.MIN_STREAMS else None
    short = rates["combined"][1]["short"]
    diffs = {"random": [{"rate": 0.15, "diff": 0.11, "ci": [0.05, 0.15], "beats": beats, "comparable": True},
                        {"rate": 0.3, "diff": 0.08, "ci": [0.02, 0.12], "beats": None if short else beats,
                         "comparable": not short}]}
    target = judge_target(base, rates, [0.15, 0.3], 0.3, 0.9, diffs=diffs, ours="combined", margin=0.03)
    return {"data": "set", "frames": 100, "streams": streams, "edge_model": "e.onnx", "cloud_model": "c.onnx",
            "policy": "p.yaml", "merge": "fuse", "policy_run": base["edge_only"], "baselines": base,
            "at_rates": rates, "differences": diffs, "target": target, "bootstrap": {"samples": 100},
            "carry": {"lag_frames": None, "cooldown_frames": 3}}


def test_a_cell_short_of_its_rate_shows_its_share_and_is_not_compared() -> None:
    md = markdown(_result(ours_at_30=0.27))
    # 27 of 100 frames at the 30% column: 3 frames short
    assert "| 0.780 (97.5%) [96.2, 98.8] at 27.0%† |" in md
    assert "† escalated less than the column's rate by more than one frame: the policies keep the policy's " \
           "cooldown (3 frames apart in a stream)" in md
    assert "| **+13.8 [+6.2, +18.8]** | not comparable†: +10.0 [+2.5, +15.0] |" in md  # 15%: bold; 30%: not judged
    assert "-> not comparable: the cooldown allows at most 27.0% of frames escalated, not 30.0%" in md
    assert "Best of all policies at 30.0%: random sampling" in md  # not ours: it was not at 30%
    # within one frame of the rate: compared as usual
    md = markdown(_result(ours_at_30=0.295))
    assert "†" not in md and "| **+10.0 [+2.5, +15.0]** |" in md and "Best of all policies at 30.0%: edgewise" in md


def test_one_stream_is_said_in_the_singular_and_no_lead_is_bold() -> None:
    md = markdown(_result(streams=1))
    assert "(100 frames, 1 stream)" in md and "**Only 1 stream: resampling so few" in md
    assert "(one stream: they have no width), and no lead is judged (fewer than 10 streams).**" in md
    assert "**+" not in md and "CI above 0" not in md
    assert "-> not judged: fewer than 10 streams" in md
    assert "Only 3 streams:" in markdown(_result(streams=3))


def test_no_share_of_a_cloud_f1_of_0() -> None:
    md = markdown(_result(cloud_f1=0.0))
    assert "| cloud only | 100.0% | 0.000 | n/a |" in md
    assert "0.780 (n/a) [0.770, 0.790]" in md and ">= 90.0% of cloud-only F1: n/a -> NOT met" in md
    # leads in plain F1, not judged against a margin of nothing
    assert "minus each baseline (F1; cloud-only F1 is 0, so not in points of it" in md
    assert "| **+0.110 [+0.050, +0.150]** |" in md and "(100.0%)" not in md
    assert "random sampling +0.080 (CI above 0) -> not judged: cloud-only F1 is 0" in md


def test_the_policies_intervals_are_said_to_be_of_their_f1_not_of_its_share() -> None:
    """The table's header said "[95% CI of % of cloud F1]", an interval of the ratio; it is the
    interval of the policy's F1 drawn in points of the cloud's (point) F1, and a paired interval
    of the ratio would be far narrower (the streams' difficulty cancels in it)."""
    md = markdown(_result())
    assert "## Policies at equal escalation rates (F1 against ground truth, % of cloud-only F1, [95% CI of the F1, " \
           "in % of cloud-only F1])" in md and "CI of % of" not in md
    assert "% of cloud-only F1, [95% CI of the F1])" in markdown(_result(cloud_f1=0.0))  # plain F1: no share of 0


def test_the_report_and_its_plot_name_what_produced_them(tmp_path) -> None:
    """The intervals' seed in eval.md, and in the plot's title (a PNG travels without its
    eval.md) the models and the data's preset, split and seed besides the code and the policy:
    the title named neither the models nor the seed that generates the data again."""
    import json

    from edgewise_tools.evaluation.report import plot_title
    from edgewise_tools.provenance import provenance

    edge, cloud, policy = (tmp_path / n for n in ("edge.onnx", "cloud.onnx", "p.yaml"))
    for f in (edge, cloud, policy):
        f.write_bytes(b"x")
    data = tmp_path / "cam-test"
    data.mkdir()
    (data / "dataset.json").write_text(json.dumps({"preset": "camera", "split": "test", "seed": 23}))
    result = dict(_result(), bootstrap={"samples": 100, "seed": 0, "unit": "stream"},
                  provenance=provenance({"edge": edge, "cloud": cloud}, policy, {"test": data}))
    assert "95% intervals from 100 bootstrap samples of the streams (seed 0)." in markdown(result)
    title = plot_title(result)
    assert f"edge {edge} (" in title and f"cloud {cloud} (" in title
    assert f"test data {data} (preset camera, split test, seed 23)" in title
    assert "commit " in title and "policy p.yaml" in title and "(seed 0)" in title
    assert plot_title(_result()) == ""  # no provenance block: no title


def test_a_data_folder_without_its_dataset_json_is_named_without_empty_brackets(tmp_path) -> None:
    # the report's provenance paragraph wrote "test data `PATH` ()" for such a folder
    from edgewise_tools.evaluation.report import plot_title
    from edgewise_tools.provenance import markdown as provenance_markdown
    from edgewise_tools.provenance import provenance

    model = tmp_path / "m.onnx"
    model.write_bytes(b"x")
    data = tmp_path / "shots"
    data.mkdir()
    prov = provenance({"edge": model}, None, {"test": data})
    text = provenance_markdown(prov)
    assert f"test data `{data}`" in text and "()" not in text, text
    assert f"test data {data};" in plot_title(dict(_result(), provenance=prov))


def test_a_reference_at_the_payloads_own_quality_leaves_the_report_as_it_was() -> None:
    """`edgewise eval` without --reference-quality (the reference at the policy's jpegQuality)
    writes the report it wrote before the option: the keys naming the two qualities add no
    word to it (escalation.md: "every other report is unchanged"). Only a reference of its own
    is said, in the header and the uplink verdict."""
    before = _result()
    before["target"]["ours_uplink_saved"], before["target"]["uplink_target"] = 0.9, 0.9
    after = dict(before, reference_quality=85, payload_quality=85, uplink_all_frames_bytes=1000,
                 uplink_all_frames_bytes_at_payload_quality=1000)
    assert markdown(after) == markdown(before)
    own = markdown(dict(after, payload_quality=60, uplink_all_frames_bytes_at_payload_quality=500))
    assert "against every frame whole at full resolution at JPEG quality 85: 90.0%" in own
    assert "at the payload's own JPEG quality 60, which a cloud-only deployment could send too: 80.0%)" in own


def test_a_policy_file_name_with_a_pipe_or_a_line_break_stays_in_its_cell() -> None:
    """eval.md's first table names the policy file in a cell: a `|` in the path split the row
    into one cell more than its header (every number after it one column off) and a line
    break ended the row half way."""
    for path, shown in (("policies/day|night.yaml", "policies/day\\|night.yaml"),
                        ("policies/day\nnight.yaml", "policies/day night.yaml")):
        md = markdown({**_result(), "policy": path})
        (row,) = [line for line in md.splitlines() if line.startswith("| policy file")]
        assert row.startswith(f"| policy file `{shown}` | 0.0% | 0.600 ")
        header = next(line for line in md.splitlines() if line.startswith("| run |"))
        assert row.replace("\\|", "").count("|") == header.count("|")


def test_paths_with_dollar_signs_are_written_in_the_plots_title_as_they_are(tmp_path) -> None:
    """The plot's title names the models, the policy and the data by path, and matplotlib reads
    text between two '$' as math: a model folder named 'run$x^$' made `edgewise eval` end in a
    ValueError traceback at the figure (after its whole run), and 'exp$_1$' drew a subscript
    where the path has an underscore."""
    import pytest

    from edgewise_tools.evaluation.report import plot_title, pyplot, write
    from edgewise_tools.provenance import provenance

    if pyplot() is None:
        pytest.skip("matplotlib is not installed")
    models = tmp_path / "run$x^$"
    models.mkdir()
    edge, cloud, policy = (models / n for n in ("edge.onnx", "cloud.onnx", "p$_1$.yaml"))
    for f in (edge, cloud, policy):
        f.write_bytes(b"x")
    result = dict(_result(), provenance=provenance({"edge": edge, "cloud": cloud}, policy),
                  threshold_sweep=[{"escalated": 0.1, "f1": 0.7}, {"escalated": 0.3, "f1": 0.78}])
    assert f"edge {edge} (" in plot_title(result)
    written = write(result, tmp_path / "report")
    assert tmp_path / "report" / "eval.png" in written and (tmp_path / "report" / "eval.png").stat().st_size > 0
