"""Region payloads: proposals from uncertain boxes and unexplained motion, packing, mapping back."""

from __future__ import annotations

import numpy as np
import pytest

from edgewise.detections import Detections
from edgewise.regions import (
    GUTTER,
    Tile,
    merge_rects,
    pack,
    propose_regions,
    source_rects,
    tiles_to_frame,
)

SIZE = (1280, 720)
BAND = (0.25, 0.6)


def dets(boxes, scores, cls=None) -> Detections:
    b = np.array(boxes, np.float32).reshape(-1, 4)
    return Detections(boxes=b, scores=np.array(scores, np.float32),
                      class_ids=np.array(cls if cls is not None else [0] * len(b), np.int32), names=("a", "b"))


def test_uncertain_boxes_and_unexplained_motion_become_padded_regions() -> None:
    d = dets([[100, 100, 150, 160], [600, 300, 700, 420], [1000, 50, 1040, 90]], [0.4, 0.9, 0.3])
    blobs = np.array([[300, 250, 316, 270]], np.float32)
    regions = propose_regions(d, blobs, SIZE, BAND, padding=0.2, min_side=96)
    assert regions is not None and len(regions) == 3  # the confident box is not a region
    for r in regions:
        assert r[2] - r[0] >= 96 and r[3] - r[1] >= 96 and 0 <= r[0] and r[2] <= 1280 and r[3] <= 720
    # the box closest to the band's middle (0.4) first, motion last; each region holds its source
    assert regions[0][0] <= 100 - 10 and regions[0][2] >= 150 + 10
    assert regions[2][0] <= 300 and regions[2][2] >= 316
    assert propose_regions(dets([[0, 0, 10, 10]], [0.9]), None, SIZE, BAND) is None  # nothing uncertain


def test_overlapping_regions_merge_and_too_much_area_sends_the_whole_frame() -> None:
    assert merge_rects([(0, 0, 10, 10), (50, 50, 60, 60), (5, 5, 20, 20)]) == [(0, 0, 20, 20), (50, 50, 60, 60)]
    assert merge_rects([(0, 0, 10, 10), (8, 0, 30, 5), (25, 0, 40, 40)]) == [(0, 0, 40, 40)]
    near = dets([[100, 100, 140, 140], [150, 100, 190, 140]], [0.4, 0.4])
    (r,) = propose_regions(near, None, SIZE, BAND, min_side=96)
    assert r[0] <= 100 and r[2] >= 190
    many = np.array([[x, 400, x + 20, 420] for x in range(0, 1280, 130)], np.float32)
    assert len(propose_regions(dets([], []), many, SIZE, BAND, min_side=96, max_regions=4)) == 4
    big = dets([[0, 0, 900, 700]], [0.4])
    assert propose_regions(big, None, SIZE, BAND, max_area=0.4) is None


def test_pack_puts_regions_at_full_resolution_next_to_the_low_frame() -> None:
    rng = np.random.default_rng(0)
    frame = rng.integers(0, 255, (720, 1280, 3), dtype=np.uint8)
    regions = [(100, 100, 300, 196), (1000, 600, 1096, 700)]
    img, tiles = pack(frame, regions, low_width=640)
    assert tiles[0] == Tile(0, 0, 640, 360, 0, 0, 2.0)
    for t in tiles[1:]:  # full-resolution pixels, copied as they are
        assert t.scale == 1.0
        assert np.array_equal(img[t.y:t.y + t.height, t.x:t.x + t.width],
                              frame[t.source_y:t.source_y + t.height, t.source_x:t.source_x + t.width])
    assert tiles[1].x == 640 + GUTTER  # next to the low frame, after a gutter of letterbox grey
    assert (img[:360, 640:640 + GUTTER] == 114).all()
    img, tiles = pack(frame, regions)  # tallest first, one row: 96x100 + gutter + 200x96
    assert img.shape[:2] == (100, 96 + GUTTER + 200)
    assert sorted(source_rects(tiles).tolist()) == [[100, 100, 300, 196], [1000, 600, 1096, 700]]
    assert source_rects(pack(frame, [], low_width=640)[1]) is None


def test_boxes_map_back_to_the_frame_and_the_finer_tile_wins() -> None:
    tiles = [Tile(0, 0, 640, 360, 0, 0, 2.0), Tile(656, 0, 200, 96, 100, 100, 1.0)]
    found = dets([[10, 10, 20, 30],     # on the low frame: x2
                  [660, 10, 680, 40],   # in the region: shifted by its offset
                  [55, 55, 65, 65],     # low-frame box centred inside the region's area: the region wins
                  [645, 50, 652, 60],   # centre in the gutter: nobody's
                  [800, 70, 880, 110]],  # overhangs the region: clipped to it
                 [0.9, 0.8, 0.7, 0.6, 0.5])
    out = tiles_to_frame(found, tiles, (1280, 720))
    assert out.scores.tolist() == pytest.approx([0.9, 0.8, 0.5])
    assert out.boxes.tolist() == [[20, 20, 40, 60], [104, 110, 124, 140], [244, 170, 300, 196]]
    assert len(tiles_to_frame(dets([], []), tiles)) == 0


def test_payloads_and_signals_agree_on_uncertain_boxes() -> None:
    """One test of "uncertain" (Detections.scored_within on score_bands): a score of exactly the
    band's end is inside for the signals, so the regions must send it too, and a class band
    counts for the payload as it does for the hardness."""
    from edgewise.hardness.signals import SignalConfig, score_bands, uncertain_signals
    from edgewise.regions import crop_region

    edge_of_band = dets([[100, 100, 150, 160]], [0.6])
    cfg = SignalConfig(band_low=0.3, band_high=0.6)
    assert uncertain_signals(edge_of_band, cfg)[1] == 1.0
    assert propose_regions(edge_of_band, None, SIZE, score_bands(edge_of_band, cfg)) is not None
    assert crop_region(edge_of_band, SIZE, score_bands(edge_of_band, cfg), 0.2) is not None
    # class "b" has its own band: its 0.9 box is uncertain, class "a"'s 0.9 box is not
    two = dets([[100, 100, 150, 160], [600, 300, 700, 420]], [0.9, 0.9], cls=[0, 1])
    per_class = SignalConfig(band_low=0.3, band_high=0.6, class_bands={"b": (0.5, 0.95)})
    assert uncertain_signals(two, per_class)[0] == pytest.approx(1 / per_class.uncertain_saturation)
    (r,) = propose_regions(two, None, SIZE, score_bands(two, per_class), min_side=96)
    assert r[0] <= 600 and r[2] >= 700 and r[0] > 150  # around the class-b box only


def test_a_frame_no_wider_than_the_low_width_goes_whole_not_twice() -> None:
    """A 640x480 camera under low+regions (downscaleWidth 640): the "low" frame was the frame
    itself at scale 1, next to each region at scale 1, so no tile won in tiles_to_frame and
    every object in a region came back twice (32 duplicate pairs in 30 frames through a real
    gateway), for more bytes than the whole frame."""
    from edgewise.regions import plan_payload

    rng = np.random.default_rng(1)
    d = dets([[100, 100, 150, 160], [400, 300, 450, 360]], [0.4, 0.4])
    for w, h in ((640, 480), (64, 48), (320, 640)):
        frame = rng.integers(0, 255, (h, w, 3), dtype=np.uint8)
        for mode in ("downscaled", "low+regions"):
            plan = plan_payload(frame, d, None, mode, BAND, low_width=640)
            assert plan.image is frame and plan.tiles == [] and plan.regions is None, (w, h, mode)
    wider = rng.integers(0, 255, (480, 641, 3), dtype=np.uint8)  # one pixel wider: scaled down, regions win
    plan = plan_payload(wider, d, None, "low+regions", BAND, low_width=640)
    assert plan.tiles[0].scale > 1.0 and len(plan.tiles) == 3
    both = np.array([[t.x + t.width / 2 - 1, t.y + t.height / 2 - 1, t.x + t.width / 2 + 1, t.y + t.height / 2 + 1]
                     for t in plan.tiles[1:2]] + [[k / plan.tiles[0].scale for k in (124, 129, 126, 131)]],
                    np.float32)
    assert len(tiles_to_frame(dets(both, [0.9, 0.9]), plan.tiles, (641, 480))) == 1  # one object, once


def test_low_plus_regions_never_packs_more_tiles_than_a_worker_takes() -> None:
    """maxRegions may be 64, the most tiles a worker takes; low+regions added its low frame as
    a 65th tile, and a 4K frame with 64 far motion blobs was refused by every worker
    (INVALID_ARGUMENT "image.tiles: 65 tiles, at most 64"): the frame never got an answer."""
    from edgewise.regions import MAX_TILES, plan_payload
    from edgewise.v1 import detect_pb2
    from edgewise.wire import check_image, encode_image, tiles_to_proto

    frame = np.zeros((2160, 3840, 3), np.uint8)
    blobs = np.array([[x, y, x + 20, y + 20] for x in range(100, 3800, 380) for y in range(100, 2100, 250)],
                     np.float32)
    assert len(blobs) > MAX_TILES
    for mode in ("regions", "low+regions"):
        plan = plan_payload(frame, dets([], []), blobs, mode, BAND, max_regions=MAX_TILES)
        assert len(plan.tiles) == MAX_TILES, mode
        img = encode_image(plan.image, "png")
        img.source_width, img.source_height = 3840, 2160
        img.tiles.extend(tiles_to_proto(plan.tiles))
        check_image(detect_pb2.Image.FromString(img.SerializeToString()))  # what the worker checks


def test_explain_says_how_many_regions_the_mode_packs() -> None:
    """`check-policy` explained low+regions with maxRegions 64 as "up to 64 full-resolution
    regions" while plan_payload packs at most 63 (its low frame is the 64th tile): the rule is
    edgewise.regions.regions_most, for both."""
    from edgewise.policy import explain, parse_policy
    from edgewise.regions import MAX_TILES

    head = "apiVersion: edgewise/v1\nkind: EscalationPolicy\nmetadata: {name: r}\nspec:\n  payload: "
    for mode, most in (("low+regions", MAX_TILES - 1), ("regions", MAX_TILES)):
        text = explain(parse_policy(head + f"{{mode: {mode}, maxRegions: {MAX_TILES}}}\n"))
        assert f"up to {most} full-resolution regions" in text, (mode, text)
