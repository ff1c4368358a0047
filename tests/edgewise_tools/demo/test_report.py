"""The demo report's accuracy block: shares of cloud-only F1 say n/a when that F1 is 0."""

from __future__ import annotations

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
