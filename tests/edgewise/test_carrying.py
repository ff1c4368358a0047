"""Carrying the cloud's boxes forward: tracking on real pixels, losing, ageing, combining."""

from __future__ import annotations

import numpy as np
import pytest

from edgewise.carrying import CARRIED, CarryConfig, CarryState, combine, seed, step
from edgewise.detections import Detections

NAMES = ("car", "person")


def D(rows, names=NAMES, source="edge"):
    """rows: (x1, y1, x2, y2, score, class_id)."""
    a = np.asarray(rows, np.float32).reshape(-1, 6)
    return Detections(boxes=a[:, :4], scores=a[:, 4], class_ids=a[:, 5].astype(np.int32),
                      names=names, source=source)


def scene(objects, size=(480, 640), noise=3.0, seed_=0):
    """A noisy grey-ish BGR background with textured objects pasted at (x, y, patch)."""
    rng = np.random.default_rng(seed_)
    img = np.clip(120 + rng.normal(0, noise, size + (3,)), 0, 255)
    for x, y, patch in objects:
        h, w = patch.shape
        img[y:y + h, x:x + w] = patch[..., None]
    return img.astype(np.uint8)


def digit(h=20, w=14, seed_=1):
    """A high-contrast random stroke pattern, like a small digit."""
    rng = np.random.default_rng(seed_)
    p = np.full((h, w), 200.0)
    p[rng.random((h, w)) < 0.35] = 30.0
    return p


def test_a_small_object_is_followed_frame_by_frame():
    cfg = CarryConfig(frames=30, min_match=0.5)
    far = digit()
    state = seed(scene([(100, 80, far)]), D([[100, 80, 114, 100, 0.8, 1]], source="cloud"), cfg)
    assert len(state) == 1
    for k in range(1, 16):  # 2 px right and 1 px down per frame
        state = step(state, scene([(100 + 2 * k, 80 + k, far)], seed_=k), cfg)
        assert len(state) == 1, f"lost at frame {k}"
    box = state.detections().boxes[0]
    assert np.allclose(box, [130, 95, 144, 115], atol=1.0)
    d = state.detections()
    assert d.source == CARRIED and d.names == NAMES and d.class_ids.tolist() == [1]


def test_a_large_object_is_matched_at_a_coarser_scale():
    cfg = CarryConfig(frames=30, min_match=0.5, template_px=32)
    near = np.kron(digit(12, 10, seed_=3), np.ones((10, 10)))  # 120x100 px
    state = seed(scene([(200, 150, near)]), D([[200, 150, 300, 270, 0.9, 0]], source="cloud"), cfg)
    assert state.tracks[0].factor == 4  # 120 px to 30: the smallest whole factor within 32 px
    state = step(state, scene([(212, 154, near)], seed_=5), cfg, frames=2)  # two frames at once
    assert np.allclose(state.detections().boxes[0], [212, 154, 312, 274], atol=4.0)


def test_an_object_that_leaves_is_dropped_not_guessed():
    cfg = CarryConfig(frames=30, min_match=0.5)
    far = digit()
    state = seed(scene([(100, 80, far)]), D([[100, 80, 114, 100, 0.8, 1]], source="cloud"), cfg)
    state = step(state, scene([], seed_=7), cfg)  # gone: only noise where it was
    assert len(state) == 0 and len(state.detections()) == 0


def test_the_answer_expires_after_its_frames():
    cfg = CarryConfig(frames=3, min_match=0.5)
    far = digit()
    frame = scene([(100, 80, far)])
    state = seed(frame, D([[100, 80, 114, 100, 0.8, 1]], source="cloud"), cfg)
    for _ in range(3):
        state = step(state, frame, cfg)
    assert len(state) == 1 and state.age == 3
    assert len(step(state, frame, cfg)) == 0


def test_flat_boxes_and_boxes_outside_the_frame_are_not_tracked():
    cfg = CarryConfig(frames=30, min_match=0.5)
    flat = np.zeros((50, 50, 3), np.uint8)
    state = seed(flat, D([[10, 10, 30, 30, 0.9, 0], [49, 49, 80, 80, 0.9, 0]], source="cloud"), cfg)
    assert len(state) == 0


def test_off_carries_nothing_and_bad_steps_are_refused():
    frame = scene([(100, 80, digit())])
    assert len(seed(frame, D([[100, 80, 114, 100, 0.8, 1]]), CarryConfig(frames=0, min_match=0.5))) == 0
    with pytest.raises(ValueError, match="frames must be >= 1"):
        step(CarryState(), frame, CarryConfig(frames=30, min_match=0.5), frames=0)


def test_combine_keeps_the_edge_box_with_the_clouds_class_and_adds_what_only_the_cloud_saw():
    edge = D([[0, 0, 10, 10, 0.6, 0], [50, 50, 60, 60, 0.7, 1]])
    carried = D([[1, 1, 11, 11, 0.9, 1], [200, 200, 210, 210, 0.8, 0]], source=CARRIED)
    out = combine(edge, carried)
    rows = sorted(zip(out.boxes[:, 0].tolist(), out.scores.tolist(), [out.names[c] for c in out.class_ids],
                      out.box_sources()))
    assert [(x, round(s, 3), n, src) for x, s, n, src in rows] == [
        (0.0, 0.9, "person", "fused"),      # the edge's fresh box, the cloud's class and score
        (50.0, 0.7, "person", "edge"),      # nothing carried there
        (200.0, 0.8, "car", CARRIED),       # only the cloud found it
    ]
    assert combine(edge, D([], source=CARRIED)) is edge


def test_combine_maps_class_names_across_models():
    edge = D([[0, 0, 10, 10, 0.6, 0]], names=("person",))
    carried = D([[0, 0, 10, 10, 0.9, 1]], names=("car", "person"), source=CARRIED)
    out = combine(edge, carried)
    assert [out.names[c] for c in out.class_ids] == ["person"]


def test_a_box_leaving_the_frame_stays_inside_the_frame():
    # A coarse template (a 100 px box shrunk 13 times) covers the box trimmed to whole
    # multiples of the factor: without clamping, the best match at the window's edge maps
    # back to a box several pixels past the frame's border.
    cfg = CarryConfig(frames=30, min_match=0.3, template_px=8)
    near = np.kron(digit(10, 7, seed_=4), np.ones((10, 10)))[:, :67]  # 100x67 px

    def frame(x, k):
        img = scene([], size=(360, 640), seed_=k)
        img[100:200, x:min(640, x + 67)] = near[:, :640 - x, None]
        return img

    state = seed(frame(570, 0), D([[570, 100, 637, 200, 0.9, 0]], source="cloud"), cfg)
    seen = 0
    for k in range(1, 8):  # 1 px right per frame: partly out of view from frame 4 on
        state = step(state, frame(570 + k, k), cfg)
        if len(state):
            seen += 1
            x0, y0, x1, y1 = state.detections().boxes[0]
            assert 0 <= x0 < x1 <= 640 and 0 <= y0 < y1 <= 360
    assert seen >= 4


def test_layered_keeps_an_older_answers_boxes_only_where_no_newer_answer_looked():
    from edgewise.carrying import layered

    newest = D([[10, 10, 20, 20, 0.9, 0]], source=CARRIED)
    middle = D([[100, 100, 110, 110, 0.8, 1], [200, 10, 210, 20, 0.7, 0]], source=CARRIED)
    oldest = D([[300, 300, 310, 310, 0.6, 1], [104, 104, 112, 112, 0.5, 0]], source=CARRIED)
    around = np.array([[90, 90, 120, 120]], np.float64)  # the newest answer looked around (105, 105)
    got = layered([(newest, around), (middle, np.array([[290, 290, 320, 320]], np.float64)), (oldest, None)])
    # middle's (105, 105) box is inside the newest's region; oldest's (305, 305) inside middle's,
    # its (108, 108) inside the newest's
    assert got.boxes.tolist() == [[10, 10, 20, 20], [200, 10, 210, 20]] and got.source == CARRIED
    assert got.class_ids.tolist() == [0, 0] and got.scores.tolist() == pytest.approx([0.9, 0.7])
    # a whole-frame answer (None) hides everything older; an older whole frame shows outside the newer regions
    assert len(layered([(D([]), None), (middle, None)])) == 0
    assert layered([(D([]), around), (middle, None)]).boxes.tolist() == [[200, 10, 210, 20]]
    assert len(layered([])) == 0


def test_layered_maps_class_names_of_answers_from_different_models():
    from edgewise.carrying import layered

    newest = D([[10, 10, 20, 20, 0.9, 0]], names=("car", "person"), source=CARRIED)
    older = D([[200, 10, 210, 20, 0.7, 0]], names=("person", "bike"), source=CARRIED)
    got = layered([(newest, np.array([[0, 0, 50, 50]], np.float64)), (older, None)])
    assert [got.names[c] for c in got.class_ids] == ["car", "person"]


def test_stacked_keeps_older_answers_only_under_scope_regions_and_after_a_partial_answer():
    from edgewise.carrying import MAX_LAYERS, stacked

    part = np.array([[0, 0, 10, 10]], np.float64)
    regions = CarryConfig(frames=30, min_match=0.5, scope="regions")
    answer = CarryConfig(frames=30, min_match=0.5)
    assert answer.scope == "answer"  # the default: a newer answer replaces the older ones
    assert stacked([2, 1], 3, part, answer) == [3]
    assert stacked([2, 1], 3, None, regions) == [3]  # a whole frame looked everywhere
    assert stacked([2, 1], 3, part, regions) == [3, 2, 1]
    assert stacked(list(range(MAX_LAYERS, 0, -1)), 99, part, regions) == [99, *range(MAX_LAYERS, 1, -1)]
    with pytest.raises(ValueError, match="carry scope 'tiles'"):
        CarryConfig(frames=30, min_match=0.5, scope="tiles")


def test_boxes_are_not_carried_onto_a_frame_of_another_size():
    # a stream that changes resolution: the answer's boxes are in the old frame's pixels and its
    # templates at the old scale; carried onto the new frame they land where nothing is (the daemon
    # carried a 1280x720 answer onto 1920x1080 frames). Here the same pattern sits at the same
    # pixels of a larger frame, so only the size tells the answer is stale.
    cfg = CarryConfig(frames=30, min_match=0.5)
    far = digit()
    state = seed(scene([(100, 80, far)]), D([[100, 80, 114, 100, 0.8, 1]], source="cloud"), cfg)
    assert len(step(state, scene([(100, 80, far)], seed_=1), cfg)) == 1
    moved = step(state, scene([(100, 80, far)], size=(720, 1280), seed_=1), cfg)
    assert len(moved) == 0 and moved.age == 1
    assert state.size == moved.size == (480, 640)
    assert len(step(moved, scene([(100, 80, far)], seed_=2), cfg)) == 0  # and not back when the size returns


def test_the_edge_floor_drops_doubtful_edge_boxes_only_where_an_answer_in_force_looked():
    """``merge.carryEdgeFloor``: between answers an edge box under the floor that no carried box
    confirms is dropped where the cloud looked (it saw that place and found nothing), as the
    merge's ``edgeFloor`` rules on the escalated frame; elsewhere, above the floor, confirmed,
    or with no answer in force, the edge's boxes stay."""
    edge = D([[10, 10, 30, 30, 0.3, 0],     # doubtful, where the cloud looked: dropped
              [100, 10, 120, 30, 0.6, 0],   # confident: kept
              [200, 10, 220, 30, 0.3, 1],   # doubtful, but a carried box confirms it: fused
              [400, 10, 420, 30, 0.3, 0]])  # doubtful, outside the regions the answer saw: kept
    carried = D([[201, 10, 221, 30, 0.9, 0]], source=CARRIED)
    regions = np.array([[0, 0, 300, 100]], np.float32)
    out = combine(edge, carried, edge_floor=0.5, looked=(regions,))
    assert sorted(zip(out.boxes[:, 0].tolist(), out.box_sources())) == [
        (100.0, "edge"), (200.0, "fused"), (400.0, "edge")]
    # a whole-frame answer looked everywhere; with nothing carried the floor still holds
    out = combine(edge, D([], source=CARRIED), edge_floor=0.5, looked=(None,))
    assert out.boxes[:, 0].tolist() == [100.0]
    # no answer in force, or the floor off (0, the default): every edge box stays, as it was
    assert combine(edge, D([], source=CARRIED), edge_floor=0.5, looked=()) is edge
    assert combine(edge, carried, looked=(None,)).box_sources().count("edge") == 3
    # a score exactly at the floor is kept (the merge's ">= edgeFloor", in float32)
    at_floor = D([[10, 10, 30, 30, 0.5, 0]])
    assert len(combine(at_floor, D([], source=CARRIED), edge_floor=0.5, looked=(None,))) == 1
