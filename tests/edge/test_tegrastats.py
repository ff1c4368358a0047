"""Jetson telemetry from tegrastats: recorded Xavier NX lines (JetPack 5 and 4 formats, written
from the format in NVIDIA's Jetson Linux Developer Guide, "tegrastats Utility"), a fake
``tegrastats`` on PATH, and the daemon's /metrics."""

from __future__ import annotations

import asyncio
import os
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from edge import tegrastats as T

JP5 = ("11-30-2026 10:15:02 RAM 3011/6854MB (lfb 210x4MB) SWAP 0/3427MB (cached 0MB) "
       "CPU [34%@1420,29%@1420,31%@1420,27%@1420,off,off] EMC_FREQ 21%@1600 GR3D_FREQ 47%@[1109] "
       "NVENC off NVDEC 716 VIC_FREQ 0%@115 APE 150 AUX@41C CPU@43.5C thermal@42.15C Tboard@40C "
       "AO@41C GPU@42.5C PMIC@50C CV0@-256C VDD_IN 6940mW/6512mW VDD_CPU_GPU_CV 2487mW/2203mW "
       "VDD_SOC 1612mW/1580mW")
JP4 = ("RAM 2448/7765MB (lfb 74x4MB) SWAP 0/3882MB (cached 0MB) CPU [12%@1190,8%@1190,10%@1190,"
       "9%@1190,off,off] EMC_FREQ 3%@1600 GR3D_FREQ 0%@114 APE 150 MTS fg 0% bg 0% AO@36.5C "
       "GPU@35.5C PMIC@50C AUX@36C CPU@37.5C thermal@36.85C VDD_IN 3936/3936 VDD_CPU_GPU_CV 449/449 "
       "VDD_SOC 1182/1182")


def test_jetpack5_xavier_nx_line() -> None:
    s = T.parse(JP5)
    assert (s.gpu_load, s.gpu_mhz, s.emc_load, s.emc_mhz) == (0.47, 1109.0, 0.21, 1600.0)
    assert (s.ram_used_mb, s.ram_total_mb) == (3011.0, 6854.0)
    assert s.temperatures == {"AUX": 41.0, "CPU": 43.5, "thermal": 42.15, "Tboard": 40.0, "AO": 41.0,
                              "GPU": 42.5, "PMIC": 50.0}  # CV0 at -256C is powered down
    assert s.rails_mw == {"VDD_IN": 6940.0, "VDD_CPU_GPU_CV": 2487.0, "VDD_SOC": 1612.0}


def test_jetpack4_line_and_other_forms() -> None:
    s = T.parse(JP4)
    assert (s.gpu_load, s.gpu_mhz, s.emc_load) == (0.0, 114.0, 0.03)
    assert s.rails_mw == {"VDD_IN": 3936.0, "VDD_CPU_GPU_CV": 449.0, "VDD_SOC": 1182.0}
    assert T.parse("GR3D_FREQ 12%@[510,306] VDD_GPU_SOC 3000mW/2900mW").gpu_mhz == 510.0
    assert T.parse("GR3D_FREQ 5% EMC_FREQ 1%").gpu_mhz is None
    assert T.parse("tegrastats: some warning").empty() and T.parse("").empty()
    # a frequency list with no number in it: the load is read, the clock is unknown (was a ValueError
    # that ended the reader thread)
    assert (T.parse("GR3D_FREQ 0%@[,]").gpu_load, T.parse("GR3D_FREQ 0%@[,]").gpu_mhz) == (0.0, None)


def test_gauges_in_prometheus_units() -> None:
    reg = CollectorRegistry()
    g = T.JetsonGauges(reg)
    g.update(T.parse(JP5))
    text = generate_latest(reg).decode()
    for line in ("edgewise_edge_jetson_gpu_load_ratio 0.47", "edgewise_edge_jetson_emc_load_ratio 0.21",
                 "edgewise_edge_jetson_gpu_frequency_hertz 1.109e+09",
                 'edgewise_edge_jetson_temperature_celsius{sensor="GPU"} 42.5',
                 'edgewise_edge_jetson_power_watts{rail="VDD_IN"} 6.94'):
        assert line in text, line
    assert reg.get_sample_value("edgewise_edge_jetson_ram_used_bytes") == 3011 * 2**20
    for result in ("ok", "unreadable"):  # at 0 from the start: a series first seen at 1 has no increase()
        assert reg.get_sample_value("edgewise_edge_jetson_tegrastats_lines_total", {"result": result}) == 0


@pytest.fixture
def fake_tegrastats(tmp_path: Path, monkeypatch) -> Path:
    """A ``tegrastats`` on PATH that prints the recorded lines (and one it cannot read) at
    the asked interval, and records its arguments."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    script = bindir / "tegrastats"
    script.write_text(f"""#!/bin/sh
echo "$@" > {tmp_path}/args
ms=1000
while [ $# -gt 0 ]; do [ "$1" = --interval ] && ms=$2; shift; done
while true; do
  echo "{JP4}"
  echo "garbage line"
  echo "{JP5}"
  sleep $(awk "BEGIN {{print $ms/1000}}")
done
""")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    return tmp_path


def _wait(pred, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return False


def test_reader_runs_the_command_and_stops_it(fake_tegrastats: Path) -> None:
    reg = CollectorRegistry()
    assert T.start(reg, "off", 0.1) is None
    t = T.start(reg, "auto", 0.1)
    assert t is not None
    try:
        assert _wait(lambda: (reg.get_sample_value("edgewise_edge_jetson_tegrastats_lines_total",
                                                   {"result": "unreadable"}) or 0) >= 1)
        assert _wait(lambda: reg.get_sample_value("edgewise_edge_jetson_gpu_load_ratio") == 0.47)
        assert (fake_tegrastats / "args").read_text().split() == ["--interval", "100"]
    finally:
        t.stop()
    assert t.proc is not None and t.proc.poll() is not None and not t.thread.is_alive()


def test_a_dying_tegrastats_is_restarted(tmp_path: Path, monkeypatch) -> None:
    script = tmp_path / "tegrastats"
    script.write_text(f'#!/bin/sh\necho run >> {tmp_path}/runs\necho "{JP5}"\n')
    script.chmod(0o755)
    t = T.Tegrastats(CollectorRegistry(), str(script), 0.1, max_backoff_s=0.2)
    t.start()
    try:
        assert _wait(lambda: (tmp_path / "runs").exists() and len((tmp_path / "runs").read_text().split()) >= 2)
    finally:
        t.stop()


def test_no_tegrastats_no_telemetry(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert T.start(CollectorRegistry(), "auto", 1.0) is None


def test_daemon_exports_the_gauges(fake_tegrastats: Path, tmp_path: Path, tiny_model: Path) -> None:
    from edge.daemon import EdgeDaemon
    from edge.settings import load_settings
    from tests.edge.helpers import settings_yaml

    s = load_settings(str(settings_yaml(
        tmp_path / "edge.yaml", device_id="nx", streams=[{"id": "s", "kind": "synthetic", "uri": "64x48",
                                                          "fps": 5, "loop": True}],
        model={"path": str(tiny_model), "backend": "onnxruntime"}, spool={"path": str(tmp_path / "sp.db")},
        metrics={"port": 0, "tegrastats_interval_s": 0.2})), env={})
    d = EdgeDaemon(s)
    th = threading.Thread(target=lambda: asyncio.run(d.run()), daemon=True)
    th.start()
    try:
        assert _wait(lambda: d.metrics_server is not None and d.started, 60)
        url = f"http://127.0.0.1:{d.metrics_server.port}/metrics"
        assert _wait(lambda: 'edgewise_edge_jetson_power_watts{rail="VDD_SOC"} 1.612'
                     in urllib.request.urlopen(url, timeout=5).read().decode())
    finally:
        d.request_stop()
        th.join(30)
    assert d.telemetry is not None and d.telemetry.proc.poll() is not None


def test_a_stop_right_after_the_start_ends_tegrastats_at_once(fake_tegrastats: Path) -> None:
    """The daemon starts the telemetry just before the model load, and a SIGTERM that came
    meanwhile stops it a moment later, before its thread has started tegrastats: the stop found
    no process, waited 10 s for the thread (which then read tegrastats for good) and left
    tegrastats running after the daemon. Now the process started after the stop is ended."""
    for _ in range(3):  # (the thread starts tegrastats within milliseconds: each try is a race)
        t = T.start(CollectorRegistry(), "auto", 0.1)
        assert t is not None
        t0 = time.monotonic()
        t.stop()
        took = time.monotonic() - t0
        proc = t.proc
        try:
            assert took < 5.0 and not t.thread.is_alive(), (took, t.thread.is_alive())
            assert proc is None or proc.poll() is not None
        finally:
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(5)
