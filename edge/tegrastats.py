"""Jetson telemetry: ``tegrastats`` lines turned into Prometheus gauges of the edge daemon.

On a Jetson, ``tegrastats`` (L4T's utility, ``/usr/bin/tegrastats``) prints one line per
interval with what no Linux interface gathers in one place: GPU (GR3D) and memory-controller
(EMC) load, on-die and board temperatures, and the power rails of the module's INA3221
monitors. Its format (NVIDIA Jetson Linux Developer Guide, "tegrastats Utility"):

    RAM 2448/6854MB (lfb 74x4MB) SWAP 0/3427MB (cached 0MB) CPU [12%@1190,off,...]
    EMC_FREQ 3%@1600 GR3D_FREQ 41%@510 VIC_FREQ 115 APE 150 AUX@36C CPU@37.5C
    GPU@35.5C ... VDD_IN 5112mW/4980mW VDD_CPU_GPU_CV 1302mW/1290mW VDD_SOC 1468mW/1460mW

JetPack 5 prefixes a date and writes rails as ``<now>mW/<average>mW``; JetPack 4 writes
``<now>/<average>`` (milliwatts) and no date; newer GPUs write ``GR3D_FREQ 41%@[510,510]``.
:func:`parse` reads every form and skips what it does not know. The daemon runs
``tegrastats --interval MS`` in a thread (``metrics.tegrastats``: ``auto`` = when the
command exists) and sets the gauges of ``docs/metrics.md`` ("Jetson telemetry") from each
line; a line it cannot read is counted, never fatal, and a ``tegrastats`` that exits is
restarted with a growing delay.
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
import threading
from dataclasses import dataclass, field
from typing import Dict, Optional

from prometheus_client import CollectorRegistry, Counter, Gauge

log = logging.getLogger(__name__)

#: ``result`` of ``edgewise_edge_jetson_tegrastats_lines_total``.
LINE_RESULTS = ("ok", "unreadable")

_RAM = re.compile(r"\bRAM (\d+)/(\d+)MB")
_LOAD = re.compile(r"\b(GR3D_FREQ|EMC_FREQ) (\d+)%(?:@\[?([\d,]+)\]?)?")
_TEMP = re.compile(r"\b([A-Za-z][\w]*)@(-?\d+(?:\.\d+)?)C\b")
_RAIL = re.compile(r"\b((?:VDD|VIN|POM)_\w+) (\d+)(?:mW)?/(\d+)(?:mW)?\b")


@dataclass
class Sample:
    """One tegrastats line: loads as 0-1 ratios, frequencies in MHz, milliwatts, MB."""

    gpu_load: Optional[float] = None
    gpu_mhz: Optional[float] = None
    emc_load: Optional[float] = None
    emc_mhz: Optional[float] = None
    ram_used_mb: Optional[float] = None
    ram_total_mb: Optional[float] = None
    temperatures: Dict[str, float] = field(default_factory=dict)
    rails_mw: Dict[str, float] = field(default_factory=dict)

    def empty(self) -> bool:
        return self.gpu_load is None and self.emc_load is None and not self.temperatures and not self.rails_mw


def parse(line: str) -> Sample:
    """The values of one tegrastats line (fields absent from it stay ``None`` / empty)."""
    s = Sample()
    m = _RAM.search(line)
    if m:
        s.ram_used_mb, s.ram_total_mb = float(m.group(1)), float(m.group(2))
    for name, pct, freqs in _LOAD.findall(line):
        mhz = max((float(f) for f in freqs.split(",") if f), default=None)
        if name == "GR3D_FREQ":
            s.gpu_load, s.gpu_mhz = float(pct) / 100.0, mhz
        else:
            s.emc_load, s.emc_mhz = float(pct) / 100.0, mhz
    for name, temp in _TEMP.findall(line):
        if float(temp) > -200:  # a powered-down zone reads -256C
            s.temperatures[name] = float(temp)
    for rail, now, _avg in _RAIL.findall(line):
        s.rails_mw[rail] = float(now)
    return s


class JetsonGauges:
    """The ``edgewise_edge_jetson_*`` series, in the daemon's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.gpu_load = Gauge("edgewise_edge_jetson_gpu_load_ratio", "GPU (GR3D) busy share, 0-1", registry=r)
        self.gpu_freq = Gauge("edgewise_edge_jetson_gpu_frequency_hertz", "GPU (GR3D) clock", registry=r)
        self.emc_load = Gauge("edgewise_edge_jetson_emc_load_ratio", "Memory controller (EMC) busy share, 0-1",
                              registry=r)
        self.emc_freq = Gauge("edgewise_edge_jetson_emc_frequency_hertz", "Memory controller (EMC) clock",
                              registry=r)
        self.ram_used = Gauge("edgewise_edge_jetson_ram_used_bytes", "RAM in use (CPU and GPU share it)",
                              registry=r)
        self.ram_total = Gauge("edgewise_edge_jetson_ram_total_bytes", "RAM of the module", registry=r)
        self.temperature = Gauge("edgewise_edge_jetson_temperature_celsius", "Thermal zone temperature",
                                 ["sensor"], registry=r)
        self.power = Gauge("edgewise_edge_jetson_power_watts", "Power rail draw (instantaneous)", ["rail"],
                           registry=r)
        self.lines = Counter("edgewise_edge_jetson_tegrastats_lines", "tegrastats lines read, by result",
                             ["result"], registry=r)
        for result in LINE_RESULTS:  # at 0 from the start: a series first seen at 1 has no increase()
            self.lines.labels(result)

    def update(self, s: Sample) -> None:
        for gauge, value, scale in ((self.gpu_load, s.gpu_load, 1.0), (self.gpu_freq, s.gpu_mhz, 1e6),
                                    (self.emc_load, s.emc_load, 1.0), (self.emc_freq, s.emc_mhz, 1e6),
                                    (self.ram_used, s.ram_used_mb, 1 << 20),
                                    (self.ram_total, s.ram_total_mb, 1 << 20)):
            if value is not None:
                gauge.set(value * scale)
        for sensor, celsius in s.temperatures.items():
            self.temperature.labels(sensor).set(celsius)
        for rail, mw in s.rails_mw.items():
            self.power.labels(rail).set(mw / 1000.0)


class Tegrastats:
    """``tegrastats --interval MS`` in a thread, each line into :class:`JetsonGauges`."""

    def __init__(self, registry: CollectorRegistry, command: str, interval_s: float = 2.0,
                 max_backoff_s: float = 60.0) -> None:
        self.gauges = JetsonGauges(registry)
        self.command = command
        self.interval_s = interval_s
        self.max_backoff_s = max_backoff_s
        self.proc: Optional[subprocess.Popen[str]] = None
        self.stopped = threading.Event()
        #: ``stop`` and a process just started: one of them ends it (a stop right after the start,
        #: a SIGTERM before the model load, found no process yet, waited 10 s for the thread and
        #: left tegrastats running after the daemon)
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, name="tegrastats", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        backoff = 1.0
        while not self.stopped.is_set():
            good = self._one_process()
            if self.stopped.is_set():
                return
            backoff = 1.0 if good else min(backoff * 2, self.max_backoff_s)
            log.warning("%s exited; restarting it in %.0f s", self.command, backoff)
            self.stopped.wait(backoff)

    def _one_process(self) -> bool:
        """Read one tegrastats process to its end; True when it gave at least one good line."""
        argv = [self.command, "--interval", str(max(1, int(self.interval_s * 1000)))]
        good = False
        try:
            with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) as proc:
                with self._lock:
                    self.proc = proc
                    if self.stopped.is_set():  # stopped while it started: stop() did not see it
                        proc.terminate()
                assert proc.stdout is not None
                for line in proc.stdout:
                    try:
                        sample = parse(line)
                    except ValueError:  # a field the patterns let through but float() refuses
                        sample = Sample()
                    if sample.empty():
                        self.gauges.lines.labels("unreadable").inc()
                        continue
                    self.gauges.update(sample)
                    self.gauges.lines.labels("ok").inc()
                    good = True
        except OSError as exc:
            log.warning("cannot run %s: %s", self.command, exc)
        return good

    def stop(self) -> None:
        with self._lock:
            self.stopped.set()
            proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        self.thread.join(10)


def start(registry: CollectorRegistry, mode: str, interval_s: float) -> Optional[Tegrastats]:
    """Start the telemetry when ``mode`` is ``auto`` and ``tegrastats`` is on PATH."""
    if mode != "auto":
        return None
    command = shutil.which("tegrastats")
    if command is None:
        log.debug("no tegrastats on PATH: not a Jetson, no Jetson telemetry")
        return None
    t = Tegrastats(registry, command, interval_s)
    t.start()
    log.info("Jetson telemetry from %s every %.1f s", command, interval_s)
    return t
