"""LocalCloud (``edgewise cloud up``): bad ports, weights and thread counts are refused before any
process starts, and a failed start keeps the log its error names."""

from __future__ import annotations

import re
import shutil
import socket
from pathlib import Path
from typing import Any, Dict

import pytest

from cloud.local import LocalCloud
from edgewise.errors import ConfigError, UnavailableError


@pytest.mark.parametrize("kw, says", [
    ({"port": -5}, r"port: -5 must be within 0..65535"),
    ({"port": 70000}, r"port: 70000 must be within 0..65535"),
    ({"metrics_port": 65536}, r"metrics_port: 65536 must be within 0..65535"),
    ({"worker_threads": -3}, r"worker_threads: -3 must be >= 0"),
    ({"weights": [float("nan")]}, r"weights: nan must be a positive finite number"),
    ({"weights": [float("inf")]}, r"weights: inf must be a positive finite number"),
    ({"weights": [0.0]}, r"weights: 0 must be a positive finite number"),
    ({"weights": [-1.0]}, r"weights: -1 must be a positive finite number"),
])
def test_bad_values_are_refused_up_front(tmp_path: Path, kw: Dict[str, Any], says: str) -> None:
    model = tmp_path / "m.onnx"
    model.write_bytes(b"x")  # never loaded: nothing starts
    with pytest.raises(ConfigError, match=says):
        LocalCloud(model, workers=1, log_dir=tmp_path / "logs", **kw)
    assert not (tmp_path / "logs").exists()


def test_a_failed_start_keeps_the_log_its_error_names(tiny_model: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cloud = LocalCloud(tiny_model, workers=1, port=port, start_timeout=60)
        with pytest.raises(UnavailableError) as exc:
            cloud.start()
    m = re.search(r"log (\S+\.log)", str(exc.value))
    assert m is not None, exc.value
    log = Path(m.group(1))
    try:
        assert log.is_file() and "cannot bind" in log.read_text()
        assert cloud.workers == [None] and cloud.gateway is None  # every process was stopped
    finally:
        shutil.rmtree(log.parent, ignore_errors=True)


def test_cloud_up_needs_a_worker(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`edgewise cloud up --workers 0` passed LocalCloud's check (workers are added later in
    local mode) and then failed in the gateway on `discovery.static` at a line of a temporary
    file; the command now names its own flag."""
    from edgewise.cli import main

    model = tmp_path / "m.onnx"
    model.write_bytes(b"x")  # never loaded: nothing starts
    assert main(["cloud", "up", "--model", str(model), "--workers", "0"]) == 2
    assert "edgewise: error: --workers 0: the pool needs at least one worker" in capsys.readouterr().err


@pytest.mark.parametrize("content, says", [
    (b"\xff\xfe limits: {}\n", "not UTF-8 text ("),  # was a UnicodeDecodeError traceback
    (b"limits: [\n", ":2: not valid YAML"),  # was a yaml ScannerError traceback
    (b"- limits\n", ":1: the top level must be a mapping of gateway settings"),  # was a ValueError from dict()
])
def test_a_gateway_config_that_is_not_settings_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                           content: bytes, says: str) -> None:
    from edgewise.cli import main

    model = tmp_path / "m.onnx"
    model.write_bytes(b"x")  # never loaded: nothing starts
    config = tmp_path / "gateway.yaml"
    config.write_bytes(content)
    assert main(["cloud", "up", "--model", str(model), "--port", "0", "--gateway-config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"edgewise: error: {config}") and says in err and err.count("\n") == 1, err
