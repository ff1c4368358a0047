"""``set_signals``: a collected set's signals computed again under another policy (what
``check-policy --data`` does per policy), the motion signals kept as collected; and what
a malformed dataset (labels, dataset.json, images/, no labels/) is refused with."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import List, Optional

import numpy as np
import pytest

from edgewise.detections import Detections
from edgewise.errors import InvalidInputError
from edgewise.hardness import MOTION_SIGNALS
from edgewise.policy import parse_policy
from edgewise.runtime import DecodeParams
from edgewise_tools.evaluation.frames import (
    FrameRecord,
    collect,
    dataset_names,
    edge_pass,
    list_frames,
    read_labels,
    set_signals,
)

POLICY = """apiVersion: edgewise/v1
kind: EscalationPolicy
metadata: {name: p}
spec:
  threshold: 0.5
  band: {low: %s, high: 0.6}
"""


def _record(frame: int, score: float, motion: float) -> FrameRecord:
    edge = Detections(boxes=np.asarray([[10, 10, 30, 30]], np.float32), scores=np.asarray([score], np.float32),
                      class_ids=np.asarray([0], np.int32), names=("a",), source="edge")
    return FrameRecord(stream=0, frame=frame, width=100, height=100, gt_boxes=np.zeros((0, 4), np.float32),
                       gt_cls=np.zeros((0,), np.int32), edge=edge, cloud=edge, edge_all=edge, cloud_all=edge,
                       jpeg_bytes=100, signals={"motion": motion, "motion_blobs": motion / 2})


def test_box_signals_follow_the_policy_motion_signals_stay_as_collected() -> None:
    records = [_record(i, 0.3, 0.1 * i) for i in range(4)]
    set_signals(records, parse_policy(POLICY % 0.25))
    assert all(r.signals["uncertain_count"] > 0 for r in records)  # 0.3 is inside [0.25, 0.6]
    assert [r.signals["motion"] for r in records] == [round(0.1 * i, 4) for i in range(4)]
    assert [r.signals["motion_blobs"] for r in records] == [round(0.05 * i, 4) for i in range(4)]
    set_signals(records, parse_policy(POLICY % 0.4))
    assert all(r.signals["uncertain_count"] == 0 for r in records)  # now below the band
    assert [r.signals["motion"] for r in records] == [round(0.1 * i, 4) for i in range(4)]
    assert set(MOTION_SIGNALS) <= set(records[0].signals)


def test_signals_are_kept_at_the_precision_the_daemon_decides_on() -> None:
    """The daemon decides on its signals rounded to the record's precision (edge.deciding,
    ``as_recorded``); the evaluation decided on the unrounded ones, so a frame on the threshold
    could go one way in the daemon and the other in ``eval`` and ``check-policy --data``."""
    from edgewise.hardness.signals import as_recorded

    records = [_record(i, 0.3 + 0.0123456 * i, 0.1 * i + 1e-6) for i in range(4)]
    set_signals(records, parse_policy(POLICY % 0.25))
    assert all(r.signals == as_recorded(r.signals) for r in records)
    assert any(v != round(v, 3) for r in records for v in r.signals.values())  # not rounded more than that


# --------------------------------------------------------------------------- a malformed dataset

def _dataset(root: Path, streams: int = 1, frames: int = 3, labels: bool = True, meta: Optional[str] = None) -> Path:
    """A dataset folder laid out as ``edgewise synth`` writes it (tiny images, one label each)."""
    import cv2

    (root / "images").mkdir(parents=True)
    if labels:
        (root / "labels").mkdir()
    for s in range(streams):
        for f in range(frames):
            cv2.imwrite(str(root / "images" / f"s{s:03d}_f{f:06d}.jpg"), np.zeros((8, 8, 3), np.uint8))
            if labels:
                (root / "labels" / f"s{s:03d}_f{f:06d}.txt").write_text("3 0.5 0.5 0.25 0.25\n")
    (root / "dataset.json").write_text(meta if meta is not None else json.dumps(
        {"names": [str(i) for i in range(10)], "nc": 10, "streams": streams, "frames": frames}))
    return root


@pytest.mark.parametrize("line, problem", [
    ("a 0.5 0.5 0.1 0.1", "class 'a' is not a number"),
    ("3 0.5 x 0.1 0.1", "cy 'x' is not a number"),
    ("1.5 0.5 0.5 0.1 0.1", "class 1.5 is not a class id"),
    ("-1 0.5 0.5 0.1 0.1", "class -1 is not a class id"),
    ("42 0.5 0.5 0.1 0.1", "class 42 is not one of the 10 classes (0..9)"),
    ("3 0.5 0.5 2.0 0.1", "w 2.0 is not a normalised size"),
    ("3 0.5 0.5 0.1 -1", "h -1 is not a normalised size"),
    ("3 1.5 0.5 0.1 0.1", "cx 1.5 is not a normalised centre"),
    ("3 0.5 0.5 nan 0.1", "w nan is not a normalised size"),
    ("3 0.5 0.5", "expected 'class cx cy w h', got"),
])
def test_every_label_problem_is_one_clear_error_with_file_and_line(tmp_path: Path, line: str, problem: str) -> None:
    p = tmp_path / "s000_f000000.txt"
    p.write_text(f"3 0.5 0.5 0.2 0.4\n\n{line}\n")
    with pytest.raises(InvalidInputError) as err:
        read_labels(p, 100, 50, nc=10)
    assert str(err.value).startswith(f"{p}:3: {problem}")


def test_labels_in_range_are_read_and_the_class_bound_is_only_checked_when_known(tmp_path: Path) -> None:
    p = tmp_path / "x.txt"
    p.write_text("9 0.5 0.5 0.2 0.4\n0 0 1 1 0\n")
    boxes, cls = read_labels(p, 100, 50, nc=10)
    assert cls.tolist() == [9] and boxes[0].tolist() == [40.0, 15.0, 60.0, 35.0]  # no area: left out
    p.write_text("42 0.5 0.5 0.2 0.4\n")
    assert read_labels(p, 100, 50)[1].tolist() == [42]
    assert read_labels(tmp_path / "none.txt", 100, 50)[0].shape == (0, 4)  # no file: no objects (YOLO's rule)


def test_a_box_past_the_image_edge_is_clipped_and_one_without_area_in_it_left_out(tmp_path: Path) -> None:
    """Valid YOLO lines whose box runs past the edge: scored as the part every model can see
    (their boxes are clipped to the image too); w or h 0 can be found by no model."""
    p = tmp_path / "x.txt"
    p.write_text("3 0.99 0.5 0.1 0.2\n1 0.05 0.02 0.2 0.1\n2 0.5 0.5 0 0.3\n4 0.5 0.5 0.2 0\n")
    boxes, cls = read_labels(p, 100, 50)
    assert cls.tolist() == [3, 1]
    np.testing.assert_allclose(boxes, [[94.0, 20.0, 100.0, 30.0], [0.0, 0.0, 15.0, 3.5]], atol=1e-4)


def test_images_must_be_what_dataset_json_declares(tmp_path: Path) -> None:
    data = _dataset(tmp_path / "ok", streams=2, frames=2)
    assert [(s, f) for s, f, _, _ in list_frames(data)] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    (data / "images" / "s001_f000001.jpg").unlink()
    with pytest.raises(InvalidInputError, match=r"holds 3 frames but .*dataset.json declares 2 stream\(s\) x 2 "
                                                r"frame\(s\) = 4: 1 missing \(s001_f000001\)"):
        list_frames(data)
    extra = _dataset(tmp_path / "extra", frames=2)
    (extra / "images" / "s000_f000007.jpg").write_bytes((extra / "images" / "s000_f000000.jpg").read_bytes())
    with pytest.raises(InvalidInputError, match=r"1 not declared \(s000_f000007\)"):
        list_frames(extra)
    twice = _dataset(tmp_path / "twice", frames=2)
    (twice / "images" / "s000_f000001.png").write_bytes(b"")
    with pytest.raises(InvalidInputError, match="s000_f000001.jpg and s000_f000001.png are the same frame"):
        list_frames(twice)
    bad = _dataset(tmp_path / "bad", meta=json.dumps({"streams": "1", "frames": 3}))
    with pytest.raises(InvalidInputError, match="dataset.json: streams '1': must be an integer >= 1"):
        list_frames(bad)
    # a folder in the format without dataset.json, or one that declares no layout: whatever images/ holds
    assert len(list_frames(_dataset(tmp_path / "plain", meta="{}"))) == 3


def test_a_dataset_json_declaring_a_billion_frames_is_refused_at_once(tmp_path: Path) -> None:
    """The declared layout was built as a set of every (stream, frame): 'frames: 100000000'
    (a typo, an edited file) hung the evaluation while the set ate all memory."""
    data = _dataset(tmp_path / "d", frames=2, meta=json.dumps({"streams": 3, "frames": 10**9}))
    t0 = time.monotonic()
    with pytest.raises(InvalidInputError, match=r"holds 2 frames but .*dataset.json declares 3 stream\(s\) x "
                                                r"1000000000 frame\(s\) = 3000000000: 2999999998 missing "
                                                r"\(s000_f000002, s000_f000003, s000_f000004 and 2999999995 more\)"):
        list_frames(data)
    assert time.monotonic() - t0 < 5


def test_a_dataset_json_that_is_not_json_is_one_clear_error(tmp_path: Path) -> None:
    data = _dataset(tmp_path / "d", meta="{not json")
    with pytest.raises(InvalidInputError, match=r"dataset.json: not valid JSON \(Expecting property name"):
        list_frames(data)
    with pytest.raises(InvalidInputError, match="not valid JSON"):
        dataset_names(data)
    # nested past the decoder's depth: a RecursionError traceback of eval, check-policy --data and train
    (data / "dataset.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(InvalidInputError, match=r"dataset.json: not valid JSON \(maximum recursion depth exceeded"):
        list_frames(data)


def test_collect_needs_labels_and_a_limit_of_at_least_one_frame(tmp_path: Path) -> None:
    policy = parse_policy(POLICY % 0.25)
    data = _dataset(tmp_path / "unlabelled", labels=False)
    with pytest.raises(InvalidInputError, match="no labels/ folder"):
        collect(data, None, None, policy)  # type: ignore[arg-type]  # refused before any model runs
    data = _dataset(tmp_path / "labelled")
    for limit in (0, -1):
        with pytest.raises(InvalidInputError, match=f"limit {limit}: must be >= 1"):
            collect(data, None, None, policy, limit=limit)  # type: ignore[arg-type]
        with pytest.raises(InvalidInputError, match=f"limit {limit}: must be >= 1"):
            next(edge_pass(data, None, policy, limit))  # type: ignore[arg-type]


def test_a_label_file_that_is_not_text_or_is_a_folder_is_one_clear_error(tmp_path: Path) -> None:
    p = tmp_path / "s000_f000000.txt"
    p.write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(InvalidInputError, match=r"s000_f000000.txt: not a text label file \(not UTF-8: byte 0"):
        read_labels(p, 100, 50)
    p.unlink()
    p.mkdir()
    with pytest.raises(InvalidInputError, match="s000_f000000.txt: a folder where the frame's label file should be"):
        read_labels(p, 100, 50)


def test_the_edge_pass_reads_a_frame_as_the_edge_daemon_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a 12-bit camera's frame stored as a 16-bit PNG without sBIT: the daemon's folder source
    # scales it by the depth it uses; the evaluation read it with cv2.imread (divided by 256:
    # nearly black), so it measured the edge model on other pixels than the daemon runs it on
    import cv2

    from edge.sources.opencv import ImageFolderSource
    from edgewise_tools.evaluation import frames as frames_mod

    data = _dataset(tmp_path / "d", frames=1)
    path = data / "images" / "s000_f000000.png"
    (data / "images" / "s000_f000000.jpg").unlink()
    grey = np.tile(np.arange(0, 4096, 16, dtype=np.uint16), (24, 1))  # 0..4080: 12 bits
    assert cv2.imwrite(str(path), grey)
    empty = Detections(boxes=np.zeros((0, 4), np.float32), scores=np.zeros((0,), np.float32),
                       class_ids=np.zeros((0,), np.int32), names=("a",), source="edge")
    monkeypatch.setattr(frames_mod, "_run", lambda det, img, low: (empty, empty, 0.0))
    edge = type("E", (), {"params": DecodeParams()})()
    seen = next(edge_pass(data, edge, parse_policy(POLICY % 0.25))).image  # type: ignore[arg-type]
    src = ImageFolderSource(str(data / "images"))
    src.open()
    daemon = src.read()
    assert daemon is not None
    assert seen.max() == 255 and np.array_equal(seen, daemon)


def test_a_reference_quality_of_its_own_is_the_cloud_only_row_and_whole_frames_go_at_the_policys(
        tiny_model: Path, tmp_path: Path) -> None:
    """`edgewise eval --reference-quality`: a policy sending whole frames at JPEG quality 60 is
    judged against every frame whole at the reference's quality (the setting it replaces), so
    the reference's bytes and cloud answer are the reference's, what ``full`` (and a mode's
    whole-frame fallback) sends is the frame at 60, encoded and run once per frame."""
    import cv2

    from edgewise.imagefiles import read_image_file
    from edgewise.runtime import Detector
    from edgewise.synth import PRESETS, SynthJob, generate
    from edgewise_tools.evaluation.frames import REFERENCE

    data = tmp_path / "test"
    generate(SynthJob(out=data, frames=3, streams=2, seed=5, split="test", width=96, height=64,
                      difficulty=PRESETS["easy"]))
    policy = parse_policy(POLICY % 0.25 + "  payload: {mode: full, jpegQuality: 60}\n")
    edge, cloud = Detector.from_file(tiny_model, threads=1), Detector.from_file(tiny_model, threads=1)
    runs: List[int] = []
    infer = cloud.infer
    cloud.infer = lambda batch: (runs.append(1), infer(batch))[1]  # type: ignore[method-assign]
    images = [read_image_file(img) for _, _, img, _ in list_frames(data)]

    def size(img: np.ndarray, q: int) -> int:
        return len(cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, q])[1])

    records = collect(data, edge, cloud, policy, ("full", "regions"), reference_quality=95)
    for r, img in zip(records, images):
        assert r.jpeg_bytes == size(img, 95) and r.sent(REFERENCE).nbytes == r.jpeg_bytes
        assert r.sent(REFERENCE).cloud is r.cloud
        whole = r.sent("full")
        assert whole.whole and whole.nbytes == size(img, 60) < r.jpeg_bytes
        if r.modes["regions"].whole:  # no region proposed: the whole frame, the same answer
            assert r.modes["regions"] is whole
    partial = sum(not r.modes["regions"].whole for r in records)
    assert len(runs) == 2 * len(records) + partial  # the reference, the frame at 60, each region payload
    runs.clear()
    same = collect(data, edge, cloud, policy, ("full", "regions"))  # the reference at the policy's quality
    for r, img in zip(same, images):
        assert "full" not in r.modes and r.sent("full").nbytes == r.jpeg_bytes == size(img, 60)
    assert len(runs) == len(same) + sum(not r.modes["regions"].whole for r in same)
    with pytest.raises(InvalidInputError, match="reference JPEG quality 0: must be 1..100"):
        collect(data, edge, cloud, policy, ("full",), reference_quality=0)
