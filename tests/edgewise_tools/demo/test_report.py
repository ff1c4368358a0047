"""The demo report: shares of cloud-only F1 say n/a when that F1 is 0; a page without matplotlib."""

from __future__ import annotations

import html
import sys

import numpy as np
import pytest

from edgewise_tools.demo.report import _share_text, accuracy

BOX = [10.0, 10.0, 30.0, 30.0]


def _dets(boxes, cls, scores):
    return (np.asarray(boxes, np.float32).reshape(-1, 4), np.asarray(cls, np.int32),
            np.asarray(scores, np.float32))


def test_shares_of_cloud_f1() -> None:
    gts = [(np.asarray([BOX], np.float32), np.asarray([0], np.int32))] * 2
    hit, miss = _dets([BOX], [0], [0.9]), _dets([], [], [])
    acc = accuracy([hit, miss], [hit, hit], [hit, hit], gts, nc=2, step=1)
    assert acc["cloud_only"]["f1"] == 1.0 and acc["hybrid_fraction_of_cloud_f1"] == 1.0
    assert acc["edge_fraction_of_cloud_f1"] == pytest.approx(2 / 3, abs=1e-4)
    assert acc["scored_frames"] == 2 and acc["scored_every"] == 1


def test_no_share_of_a_cloud_f1_of_zero() -> None:
    """A floor of 1e-9 under cloud-only F1 made an edge F1 of 0.667 '66666666666.7%' of it."""
    gts = [(np.asarray([BOX], np.float32), np.asarray([0], np.int32))] * 2
    hit, miss = _dets([BOX], [0], [0.9]), _dets([], [], [])
    acc = accuracy([hit, miss], [hit, miss], [miss, miss], gts, nc=2, step=1)
    assert acc["cloud_only"]["f1"] == 0.0
    assert acc["edge_fraction_of_cloud_f1"] is None and acc["hybrid_fraction_of_cloud_f1"] is None
    assert _share_text(None, 1) == "n/a" and _share_text(0.9351, 1) == "93.5%" and _share_text(0.9351, 0) == "94%"


def test_without_matplotlib_the_page_is_written_and_says_why_it_has_no_figures(monkeypatch) -> None:
    """matplotlib is no dependency of the package (the train extra brings it): a pip-installed
    edgewise ran the whole demo and then ended in ModuleNotFoundError, with no report written."""
    from edgewise_tools.demo.report import _html, _plots
    from edgewise_tools.evaluation.report import NO_MATPLOTLIB

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what `import matplotlib` meets when it is not installed
    assert _plots({}, [], 0.5, {}, {}) is None
    f1 = {"f1": 0.9}
    summary = {
        "accuracy": {"edge_only": f1, "hybrid": f1, "cloud_only": f1, "scored_frames": 2, "scored_every": 1,
                     "edge_fraction_of_cloud_f1": 1.0, "hybrid_fraction_of_cloud_f1": 1.0},
        "accounting": {"frames": 2, "escalated": 1, "answered": 1, "answered_late": 0, "lost": 0},
        "latency_ms": dict.fromkeys(("edge_p50", "edge_p99", "escalated_p50", "escalated_p99", "cloud_rtt_p50",
                                     "cloud_rtt_p99"), 1.0),
        "world": {"preset": "camera", "size": [1280, 720], "seed": 1, "streams": 1, "frames_per_stream": 2},
        "cloud_cpu": {"ms_per_escalation": None}, "frames_generated": 2, "fps": 10.0, "escalation_rate": 0.5,
        "uplink": {"payload": "regions", "saved": 0.9}, "events": [], "transport": "grpc",
        "provenance": {"edgewise": "0.1.0", "commit": "abc", "date": "2026-12-07", "models": {}},
    }
    page = _html(summary, None)
    assert html.escape(NO_MATPLOTLIB) in page and "<img" not in page
