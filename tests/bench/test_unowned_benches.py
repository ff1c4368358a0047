"""Benchmarks CI ran with ``--help`` only, run tiny (seconds each): what broke them silently
after later changes. The figures are the benches' to measure, not asserted here.

- ``decode_budget.py`` sent an 8x8 JPEG whose header declared 7600x4300; since the worker checks
  that the scans can code the declared blocks (a4ea654) every request was INVALID_ARGUMENT
  before decoding, and the table measured nothing.
- ``edge.py --paced`` and ``runtime.py``'s agreement line took the Jetson bundle's model, which
  became TensorRT's Q/DQ layout (1455341; ONNX Runtime runs it slower than float), not the
  model the daemon runs by default, and ``--paced`` had no row of the shipped model settings.
- ``edge.py``'s default mode timed an INT8 model without printing the CPU's flags.
- ``mqtt_sink.py`` printed a traceback per cancelled proxy connection when a round trip was added.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from edge.settings import ModelSettings

ROOT = Path(__file__).resolve().parents[2]


def _bench(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    r = subprocess.run([sys.executable, str(ROOT / "bench" / args[0]), *args[1:]], capture_output=True, text=True,
                       cwd=str(ROOT), timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def test_the_decode_budget_bench_sends_an_image_the_worker_decodes(tiny_model: Path) -> None:
    r = _bench("decode_budget.py", "--model", str(tiny_model), "--concurrency", "2")
    assert re.search(r"^\| one \| 1 \| OK 1 \|", r.stdout, re.M), r.stdout
    assert re.search(r"^\| concurrent \| 2 \| OK 2 \|", r.stdout, re.M), r.stdout


def test_the_edge_bench_prints_the_cpu_flags_and_the_models_size(tiny_model: Path) -> None:
    r = _bench("edge.py", "--streams", "1", "--frames", "4", "--model", str(tiny_model))
    header = next(line for line in r.stdout.splitlines() if line.startswith("### Edge daemon"))
    assert "@ 160," in header and re.search(r"; CPU [^,]+.*, load average [\d.]+ on \d+ CPUs$", header), header
    assert "| frames | 4 |" in r.stdout and "nan" not in r.stdout.lower(), r.stdout


def test_the_cpu_benches_run_the_daemons_default_model_and_settings() -> None:
    from bench import _edge_cpu
    from bench.runtime import shipped_pair_agreement

    defaults = ModelSettings()
    assert _edge_cpu.SHIPPED == ROOT / defaults.path and _edge_cpu.SHIPPED.exists()
    assert _edge_cpu.VARIANTS["shipped defaults"] == {"threads": defaults.threads, "spin": defaults.spin,
                                                      "max_batch": defaults.max_batch}
    line = shipped_pair_agreement(2, 1)
    assert f"-> {Path(defaults.path).name}, 2 camera val frames" in line, line


def test_the_int8_variants_bench_names_the_shipped_recipe(tiny_model: Path, tmp_path: Path) -> None:
    r = _bench("int8_variants.py", "--model", str(tiny_model), "--samples", "2", "--iters", "1", "--warmup", "0",
               "--variants", "none,head", "--holdout", "2", "--out-dir", str(tmp_path))
    rows = [line for line in r.stdout.splitlines() if line.startswith("| none") or line.startswith("| head")]
    assert rows[0].startswith("| none (shipped default) |") and "(shipped" not in rows[1], r.stdout
    assert "None" not in r.stdout, r.stdout  # no boxes at 0.25 from random weights: "-", not "None"


def test_the_mqtt_sink_bench_over_a_delayed_link_prints_no_traceback() -> None:
    from tests.conftest import mosquitto_binary

    mosquitto_binary()  # skips without Mosquitto
    r = _bench("mqtt_sink.py", "--rtt-ms", "20", "--records", "10", "--inflight", "20")
    assert len(re.findall(r"^\| 20 \| 15 \| 20 \| [12] \| off \| [\d.]+ \|", r.stdout, re.M)) == 2, r.stdout
    assert "Traceback" not in r.stderr, r.stderr[-3000:]


def test_the_whatif_bench_prints_the_cpu_flags_and_reproduces_every_decision(tmp_path: Path) -> None:
    r = _bench("whatif.py", "--hours", "0.005", "--keep", str(tmp_path))
    assert re.search(r"^load average .* CPUs \(.+\)$", r.stdout, re.M), r.stdout
    m = re.search(r"reproduced ([\d,]+) of ([\d,]+) decisions; exit 0", r.stdout)
    assert m and m.group(1) == m.group(2) == "270", r.stdout
