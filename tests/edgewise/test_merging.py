"""Merging edge and cloud detections: replace and weighted box fusion, with per-box sources."""

from __future__ import annotations

import numpy as np
import pytest

from edgewise.detections import Detections
from edgewise.merging import merge

NAMES = ("car", "person")


def D(rows, names=NAMES, source="edge"):
    """rows: (x1, y1, x2, y2, score, class_id)."""
    a = np.asarray(rows, np.float32).reshape(-1, 6)
    return Detections(boxes=a[:, :4], scores=a[:, 4], class_ids=a[:, 5].astype(np.int32),
                      names=names, source=source)


def as_rows(d):
    return [(tuple(round(float(v), 4) for v in b), round(float(s), 4), d.names[c], src)
            for b, s, c, src in zip(d.boxes, d.scores, d.class_ids, d.box_sources())]


def test_replace_keeps_cloud_boxes_only():
    edge = D([[0, 0, 10, 10, 0.9, 0], [50, 50, 60, 60, 0.3, 1]])
    cloud = D([[1, 1, 11, 11, 0.8, 0]], source="cloud")
    out = merge(edge, cloud, "replace", iou=0.5)
    assert as_rows(out) == [((1, 1, 11, 11), 0.8, "car", "cloud")]
    assert out.source == "merged"


def test_fuse_weighted_box_fusion_of_matched_pair():
    edge = D([[0, 0, 10, 10, 0.6, 0]])
    cloud = D([[1, 1, 11, 11, 0.9, 0]], source="cloud")  # IoU 81/119 = 0.68
    out = merge(edge, cloud, "fuse", iou=0.55)
    # coordinates weighted by confidence: (0*0.6 + 1*0.9) / 1.5 = 0.6; score = mean = 0.75
    assert as_rows(out) == [((0.6, 0.6, 10.6, 10.6), 0.75, "car", "fused")]


def test_fuse_iou_below_threshold_or_other_class_not_fused():
    edge = D([[0, 0, 10, 10, 0.7, 0], [100, 100, 120, 120, 0.8, 1]])
    cloud = D([[5, 0, 15, 10, 0.9, 0],        # IoU 1/3 < 0.55 with the car
               [100, 100, 120, 120, 0.95, 0]], source="cloud")  # same box, other class
    out = merge(edge, cloud, "fuse", iou=0.55, edge_floor=0.5)
    assert sorted(as_rows(out), key=lambda r: -r[1]) == [
        ((100, 100, 120, 120), 0.95, "car", "cloud"),
        ((5, 0, 15, 10), 0.9, "car", "cloud"),
        ((100, 100, 120, 120), 0.8, "person", "edge"),
        ((0, 0, 10, 10), 0.7, "car", "edge"),
    ]


def test_fuse_drops_unmatched_edge_boxes_below_floor_keeps_unmatched_cloud():
    edge = D([[0, 0, 10, 10, 0.45, 0], [200, 200, 220, 220, 0.55, 1]])
    cloud = D([[400, 400, 420, 420, 0.3, 1]], source="cloud")
    out = merge(edge, cloud, "fuse", iou=0.5, edge_floor=0.5)
    assert as_rows(out) == [((200, 200, 220, 220), 0.55, "person", "edge"),
                            ((400, 400, 420, 420), 0.3, "person", "cloud")]


def test_fuse_greedy_one_to_one_matching():
    # two edge boxes overlap one cloud box; only the best-IoU one fuses
    edge = D([[0, 0, 10, 10, 0.8, 0], [0, 0, 10, 12, 0.8, 0]])
    cloud = D([[0, 0, 10, 10, 0.8, 0]], source="cloud")
    out = merge(edge, cloud, "fuse", iou=0.5, edge_floor=0.5)
    srcs = sorted(out.box_sources())
    assert srcs == ["edge", "fused"]
    fused = out.boxes[list(out.box_sources()).index("fused")]
    assert fused.tolist() == pytest.approx([0, 0, 10, 10])


def test_class_names_are_matched_by_name_across_models():
    edge = D([[0, 0, 10, 10, 0.6, 1]], names=("car", "person"))          # person
    cloud = D([[0, 0, 10, 10, 0.9, 0]], names=("person", "bike"), source="cloud")
    out = merge(edge, cloud, "fuse", iou=0.5)
    assert out.names == ("person", "bike", "car")
    assert as_rows(out) == [((0, 0, 10, 10), 0.75, "person", "fused")]
    edge2 = D([[50, 50, 60, 60, 0.9, 0]], names=("car", "person"))        # car: edge-only name
    out2 = merge(edge2, cloud, "fuse", iou=0.5)
    assert ("car", "edge") in [(r[2], r[3]) for r in as_rows(out2)]


def test_crop_regions_keep_edge_boxes_the_cloud_never_saw():
    edge = D([[0, 0, 10, 10, 0.2, 0], [300, 300, 310, 310, 0.3, 1]])
    cloud = D([[1, 1, 11, 11, 0.9, 0]], source="cloud")
    regions = np.array([[0, 0, 50, 50]], np.float32)  # the cloud only saw this crop
    out = merge(edge, cloud, "replace", iou=0.5, regions=regions)
    assert as_rows(out) == [((1, 1, 11, 11), 0.9, "car", "cloud"),
                            ((300, 300, 310, 310), 0.3, "person", "edge")]


def test_empty_inputs_and_bad_strategy():
    e = Detections.empty(NAMES)
    out = merge(e, e, "fuse", iou=0.5)
    assert len(out) == 0 and out.box_sources() == ()
    only_edge = merge(D([[0, 0, 10, 10, 0.9, 0]]), e, "fuse", iou=0.5)
    assert as_rows(only_edge) == [((0, 0, 10, 10), 0.9, "car", "edge")]
    assert len(merge(D([[0, 0, 10, 10, 0.9, 0]]), e, "replace", iou=0.5)) == 0
    with pytest.raises(ValueError, match="replace"):
        merge(e, e, "union", iou=0.5)


def test_model_weights_shift_the_fused_box():
    edge = D([[0, 0, 10, 10, 0.5, 0]])
    cloud = D([[2, 0, 12, 10, 0.5, 0]], source="cloud")  # IoU 8/12
    out = merge(edge, cloud, "fuse", iou=0.5, edge_weight=1.0, cloud_weight=3.0)
    assert out.boxes[0].tolist() == pytest.approx([1.5, 0, 11.5, 10])
    assert float(out.scores[0]) == pytest.approx(0.5)


def test_an_edge_box_a_region_cuts_fuses_with_the_clouds_box_cut_there_too():
    """A real daemon's record (camera world, regions payload): the region [630, 462, 754, 720]
    cut through a digit the edge had boxed [622, 429, 678, 518]; the worker clipped the cloud's
    box of it to the region, [631, 462, 666, 513]. Matched whole, their IoU was 0.36, so the
    record held the digit twice: the edge box and the cloud's cut one."""
    edge = D([[622.15, 429.11, 678.36, 518.3, 0.8, 1], [640, 600, 700, 700, 0.9, 0]])
    cloud = D([[630.9, 462.0, 666.04, 513.44, 0.7, 1], [642, 602, 701, 702, 0.9, 0]], source="cloud")
    regions = np.array([[630, 462, 754, 720]], np.float32)
    out = merge(edge, cloud, "fuse", iou=0.55, edge_floor=0.5, regions=regions)
    assert out.box_sources() == ("fused", "fused")
    box = [round(float(v), 2) for v in out.boxes[out.class_ids == 1][0]]
    # left and top lie beyond the region: the edge's; right and bottom weighted as in WBF
    assert box[:2] == [622.15, 429.11]
    assert box[2] == pytest.approx((678.36 * 0.8 + 666.04 * 0.7) / 1.5, abs=0.01)
    assert box[3] == pytest.approx((518.3 * 0.8 + 513.44 * 0.7) / 1.5, abs=0.01)
    # a box wholly inside the region fuses as before
    assert [round(float(v), 4) for v in out.boxes[out.class_ids == 0][0]] == [
        round((640 * 0.9 + 642 * 0.9) / 1.8, 4), 601.0, 700.5, 701.0]
    # without regions (the whole frame seen) nothing is cut: the pair stays unmatched
    whole = merge(edge, cloud, "fuse", iou=0.55, edge_floor=0.5)
    assert sorted(whole.box_sources()) == ["cloud", "edge", "fused"]


def test_a_cloud_box_inside_a_region_is_not_matched_with_a_cut_edge_box_it_does_not_reach_the_border_of():
    """Only a cloud box cut where the edge box crosses the region's border is the cut part of
    that object: a smaller object of the same class inside a region that a large edge box
    surrounds keeps its own box."""
    edge = D([[0, 0, 400, 400, 0.9, 0]])
    cloud = D([[160, 160, 240, 240, 0.8, 0]], source="cloud")  # fills 64% of the region
    regions = np.array([[150, 150, 250, 250]], np.float32)
    out = merge(edge, cloud, "fuse", iou=0.55, edge_floor=0.5, regions=regions)
    assert sorted(as_rows(out)) == [((0, 0, 400, 400), 0.9, "car", "edge"), ((160, 160, 240, 240), 0.8, "car", "cloud")]


def test_a_cut_cloud_box_is_carried_with_the_sides_the_region_cut_taken_from_the_edge():
    """The fused box of the escalated frame keeps the edge's sides beyond the region, but the
    carrying was seeded from the cloud's cut box, which overlaps the edge's box of the same
    object too little to be taken for it: the next frames showed the object twice."""
    from edgewise.merging import carried_boxes

    edge = D([[622.15, 429.11, 678.36, 518.3, 0.8, 1]])
    cloud = D([[630.9, 462.0, 666.04, 513.44, 0.7, 1], [700, 600, 740, 660, 0.9, 0]], source="cloud")
    regions = np.array([[630, 462, 754, 720]], np.float32)
    out = carried_boxes(edge, cloud, "fuse", 0.55, regions)
    # left and top were cut by the region: the edge's; right and bottom are the cloud's own
    assert [round(float(v), 2) for v in out.boxes[0]] == [622.15, 429.11, 666.04, 513.44]
    assert out.boxes[1].tolist() == [700, 600, 740, 660]  # matched with nothing: as it came
    assert (out.scores == cloud.scores).all() and out.names == cloud.names and out.source == "cloud"
    for same in (carried_boxes(edge, cloud, "replace", 0.55, regions), carried_boxes(edge, cloud, "fuse", 0.55)):
        assert same is cloud  # replace: the cloud's boxes are the result; no regions: nothing was cut
