"""bench/edge.py --live: the row logic on hand-built records (the run itself needs minutes
of RTSP cameras; ``tests/edge/sources/test_rtsp.py`` covers the daemon on a real camera)."""

from __future__ import annotations

from bench import _edge_live as L


def rec(stream: str, age_ms: float, infer_ms: float = 4.0) -> dict:
    return {"stream": stream, "latency_ms": {"frame_age": age_ms, "infer": infer_ms}}


def test_row_sustained_when_age_p99_under_two_periods_and_every_stream_gets_its_fps() -> None:
    recs = [rec(f"cam{i}", 5.0 + k % 10) for i in range(2) for k in range(50)]  # 5 fps x 10 s each
    row = L.live_row(recs, n=2, cpu_s=1.0, window=10.0, fps=5.0, camera_fps=25)
    assert row["sustained"] and row["frames"] == 100 and row["fps_min"] == 5.0
    assert row["cpu_core"] == 0.1 and row["cpu_per_stream"] == 0.05
    assert row["age_p50_ms"] < row["age_p99_ms"] < 80.0


def test_row_not_sustained_when_frames_get_old_or_a_stream_starves() -> None:
    old = [rec("cam0", 5.0) for _ in range(48)] + [rec("cam0", 120.0) for _ in range(2)]
    assert not L.live_row(old, n=1, cpu_s=1.0, window=10.0, fps=5.0, camera_fps=25)["sustained"]
    starved = [rec("cam0", 5.0) for _ in range(50)] + [rec("cam1", 5.0) for _ in range(40)]
    row = L.live_row(starved, n=2, cpu_s=1.0, window=10.0, fps=5.0, camera_fps=25)
    assert row["fps_min"] == 4.0 and not row["sustained"]
    assert not L.live_row([], n=1, cpu_s=0.0, window=10.0, fps=5.0, camera_fps=25)["sustained"]
