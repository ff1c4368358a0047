"""The frames' worst-case memory against the device's, and the one warning (pure logic, then
the daemon with real frames from a folder)."""

from __future__ import annotations

import asyncio
import logging

import cv2
import numpy as np

from edge import framememory
from edge.framememory import FrameMemory, cgroup_memory_limit, mem_total_bytes, worst_case_bytes
from tests.logs import said as logged

EIGHT_K = (4320, 7680, 3)
GIB = 2**30


def test_worst_case_counts_queues_batches_and_escalations():
    one = 4320 * 7680 * 3  # 99.5 MB
    # one 8K file stream with the file defaults (queue 8), batch 4, 16 in flight: 9 + 8 + 32 frames
    assert worst_case_bytes({"a": one}, {"a": 8}, 4, 16) == 49 * one
    # a small stream beside it: its own queue at its own size, the shared parts at the largest
    small = 720 * 1280 * 3
    assert worst_case_bytes({"a": one, "b": small}, {"a": 8, "b": 2}, 4, 16) == 49 * one + 3 * small
    assert worst_case_bytes({}, {"a": 8}, 4, 16) == 0


def test_warned_once_when_the_worst_case_passes_half_the_device(caplog):
    m = FrameMemory({"a": 2, "b": 2}, max_batch=4, max_in_flight=16, total=7 * GIB)
    with caplog.at_level(logging.WARNING, logger="edge.framememory"):
        assert m.seen("a", (1080, 1920, 3)) is None  # 6 MB frames: 0.3 GB at worst
        said = m.seen("b", EIGHT_K)  # 3 + 8 + 32 frames of 99.5 MB (and a's 3): 4.0 GiB
        assert m.seen("a", EIGHT_K) is None  # said once
    assert said is not None and said.startswith("frames may hold 4.0 GiB at once, 57% of the 7.0 GiB memory of this device")
    assert "a 1920x1080, b 7680x4320" in said and "cloud.max_in_flight 16" in said
    assert logged(caplog.records, "edge.framememory") == [said]
    quiet = FrameMemory({"a": 2}, max_batch=4, max_in_flight=0, total=7 * GIB)
    assert quiet.seen("a", EIGHT_K) is None  # no cloud: 3 + 8 frames, 1.0 GiB


def test_mem_total_reads_meminfo(tmp_path):
    p = tmp_path / "meminfo"
    p.write_text("MemTotal:        7999496 kB\nMemFree:  1 kB\n")
    assert mem_total_bytes(str(p)) == 7999496 * 1024
    assert mem_total_bytes(str(tmp_path / "missing")) is None
    p.write_text("garbage\n")
    assert mem_total_bytes(str(p)) is None


def _warnings_of_a_4k_folder(tmp_path, tiny_model, caplog) -> list:
    """What ``edge.framememory`` warns when the real daemon reads a folder of two 4K images."""
    from edge.daemon import EdgeDaemon
    from tests.edge.test_pipeline import base_settings

    folder = tmp_path / "shots"
    folder.mkdir()
    for i in range(2):
        assert cv2.imwrite(str(folder / f"{i}.png"), np.zeros((2160, 3840, 3), np.uint8))
    s = base_settings(tmp_path, tiny_model, [{"id": "uhd", "kind": "folder", "uri": str(folder)}])
    with caplog.at_level(logging.WARNING, logger="edge.framememory"):
        assert asyncio.run(asyncio.wait_for(EdgeDaemon(s).run(), 60)) == 0
    return [r.getMessage() for r in caplog.records if r.name == "edge.framememory"]


def test_the_daemon_warns_about_big_frames_it_actually_reads(tmp_path, tiny_model, caplog, monkeypatch):
    """The path a user takes: a folder of 4K images on a device with (here, said to have) 512 MiB."""
    monkeypatch.setattr(framememory, "mem_total_bytes", lambda path="/proc/meminfo": GIB // 2)
    monkeypatch.setattr(framememory, "cgroup_memory_limit", lambda: None)
    said = _warnings_of_a_4k_folder(tmp_path, tiny_model, caplog)
    # queue 8 (+1) and two batches of 4: 17 frames of 24.9 MB, 0.4 GiB of 0.5 GiB
    assert len(said) == 1 and said[0].startswith("frames may hold 0.4 GiB at once, 79% of the 0.5 GiB memory of this device")


def _cgroup_tree(tmp_path, proc_line: str, limits: dict) -> tuple:
    """A ``/proc/self/cgroup`` of ``proc_line`` and a cgroup mount whose ``limits`` map a file
    below it (``a/b/memory.max``) to its content."""
    proc = tmp_path / "cgroup"
    proc.write_text(proc_line + "\n")
    root = tmp_path / "fs"
    root.mkdir()
    for rel, text in limits.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text + "\n")
    return str(proc), str(root)


def test_the_cgroup_memory_limit_is_the_smallest_on_the_way_up_in_v1_and_v2(tmp_path):
    unit = "system.slice/edgewise-edge.service"
    proc, root = _cgroup_tree(tmp_path, "0::/" + unit, {
        f"{unit}/memory.max": str(4 * GIB), "system.slice/memory.max": "max", "memory.max": "max"})
    assert cgroup_memory_limit(proc, root) == 4 * GIB  # systemd's MemoryMax=4G
    (tmp_path / "v1").mkdir()
    proc, root = _cgroup_tree(tmp_path / "v1", "4:memory:/docker/abc\n3:cpu:/docker/abc", {
        "memory/memory.limit_in_bytes": str(GIB)})  # a container's mount: its cgroup is the root
    assert cgroup_memory_limit(proc, root) == GIB
    (tmp_path / "none").mkdir()
    proc, root = _cgroup_tree(tmp_path / "none", "4:memory:/\n0::/", {
        "memory/memory.limit_in_bytes": "9223372036854771712", "memory.max": "max"})
    assert cgroup_memory_limit(proc, root) is None
    assert cgroup_memory_limit(str(tmp_path / "missing"), root) is None


def test_the_daemon_warns_against_its_cgroup_memory_limit_not_the_whole_device(tmp_path, tiny_model, caplog,
                                                                                monkeypatch):
    """The shipped unit caps the daemon at MemoryMax=4G, a container at its --memory; the kernel
    kills it there, whatever the device has. The warning compared the frames with half of
    MemTotal only (found by a probe: 4 synthetic 4K streams in a 600 MiB memory cgroup on a
    24 GB machine were OOM-killed without it). Here the cgroup allows 512 MiB."""
    proc, root = _cgroup_tree(tmp_path, "0::/system.slice/edgewise-edge.service",
                              {"system.slice/edgewise-edge.service/memory.max": str(GIB // 2)})
    monkeypatch.setattr(framememory, "PROC_CGROUP", proc)
    monkeypatch.setattr(framememory, "CGROUP_ROOT", root)
    monkeypatch.setattr(framememory, "mem_total_bytes", lambda path="/proc/meminfo": 32 * GIB)  # an Orin
    said = _warnings_of_a_4k_folder(tmp_path, tiny_model, caplog)
    assert len(said) == 1 and said[0].startswith(
        "frames may hold 0.4 GiB at once, 79% of the 0.5 GiB memory limit of this daemon's cgroup"), said
