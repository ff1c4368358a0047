"""Process registry (build info, standard collectors, no _created) and JSON logs."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest
from prometheus_client import Counter, Histogram, generate_latest

from edgewise import __version__
from edgewise.observability import LogThrottle, process_registry, setup_logging


def test_process_registry_exports_build_info_and_process_metrics_without_created_series():
    reg = process_registry("worker")
    Counter("t_requests", "test", registry=reg).inc()
    Histogram("t_seconds", "test", registry=reg).observe(0.1)
    text = generate_latest(reg).decode()
    assert 'edgewise_build_info{process="worker",python="' in text
    assert f'version="{__version__}"' in text
    assert "process_resident_memory_bytes" in text and "python_info" in text
    assert "t_requests_total 1.0" in text
    assert "_created" not in text


def test_two_registries_do_not_collide():
    a, b = process_registry("edge"), process_registry("edge")
    assert a is not b
    assert "edgewise_build_info" in generate_latest(b).decode()


def test_json_log_lines_are_json(capsys):
    setup_logging("info", "json")
    try:
        logging.getLogger("edgewise.test").warning("spool %s full", "A")
        try:
            raise ValueError("boom")
        except ValueError:
            logging.getLogger("edgewise.test").exception("failed")
    finally:
        setup_logging("warning", "text")
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert lines[0]["message"] == "spool A full" and lines[0]["level"] == "WARNING"
    assert lines[0]["logger"] == "edgewise.test" and lines[0]["time"].endswith("Z")
    assert "ValueError: boom" in lines[1]["exception"]


@pytest.mark.parametrize("level, fmt, word", [("loud", "text", "level"), ("info", "xml", "format")])
def test_bad_log_settings_name_the_problem(level, fmt, word):
    with pytest.raises(ValueError, match=word):
        setup_logging(level, fmt)


def test_version_flag_and_python_dash_m():
    out = subprocess.run([sys.executable, "-m", "edgewise", "--version"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and out.stdout.startswith(f"edgewise {__version__}")
    bad = subprocess.run([sys.executable, "-m", "edgewise", "--log-format", "xml", "model"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "xml" in bad.stderr


def test_log_throttle_counts_what_it_holds_back():
    t = [0.0]
    th = LogThrottle(10.0, burst=2, clock=lambda: t[0])
    assert [th.allow() for _ in range(5)] == [0, 0, None, None, None]
    t[0] = 10.0
    assert th.allow() == 3 and th.allow() == 0 and th.allow() is None
