"""Worker settings: layering file <- env <- flags, validation, unknown keys with their path."""

from __future__ import annotations

import pytest

from cloud.worker.settings import WorkerSettings, load_settings
from edgewise.cli import build_parser
from edgewise.errors import ConfigError
from edgewise.runtime.metadata import setting_imgsz


def write(tmp_path, text: str):
    p = tmp_path / "worker.yaml"
    p.write_text(text)
    return p


def test_layers_defaults_file_env_flags(tmp_path):
    cfg = write(tmp_path, "model: a.onnx\nport: 7000\nbatching:\n  max_batch_size: 4\n"
                          "  preferred_batch_sizes: [2, 4]\n  max_queue_delay_ms: 1.5\n")
    s = load_settings(cfg, env={})
    assert (s.model, s.port, s.metrics_port) == ("a.onnx", 7000, 9101)
    assert s.batching.max_batch_size == 4 and s.batching.preferred_batch_sizes == (2, 4)
    pol = s.batching.policy()
    assert pol.max_queue_delay_s == pytest.approx(0.0015) and pol.max_queue_size == 64
    env = {"EDGEWISE_WORKER__PORT": "7100", "EDGEWISE_WORKER__BATCHING__PREFERRED_BATCH_SIZES": "1,2",
           "EDGEWISE_WORKER__GRACE_S": "2.5", "OTHER": "x"}
    s = load_settings(cfg, env=env)
    assert s.port == 7100 and s.batching.preferred_batch_sizes == (1, 2) and s.grace_s == 2.5
    s = load_settings(cfg, env=env, overrides={"port": 0, "batching.max_batch_size": 2})
    assert s.port == 0 and s.batching.max_batch_size == 2 and s.batching.preferred_batch_sizes == (1, 2)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("model: a.onnx\nbatching:\n  max_batch_sise: 4\n",
         r":3: batching.max_batch_sise: unknown key \(did you mean 'max_batch_size'\?\)"),
        ("model: a.onnx\nprot: 1\n", r":2: prot: unknown key \(did you mean 'port'\?\)"),
        ("model: a.onnx\nport: high\n", ":2: port: 'high' is not an integer"),
        ("model: a.onnx\nbatching: 8\n", ":2: batching: expected a mapping, got 8"),
        ("model: a.onnx\nbatching:\n  preferred_batch_sizes: [4, x]\n",
         r":3: batching.preferred_batch_sizes\[1\]: 'x' is not an integer"),
        ("model: a.onnx\nport: 70000\n", r":2: port: 70000 is out of range; allowed: an integer in \[0, 65535\]"),
        ("model: a.onnx\nimgsz: -32\n", r":2: imgsz: '-32' is not a size; write 640 \(square\) or 384,640"),
        ("model: a.onnx\nbatching:\n  max_batch_size: 2\n  preferred_batch_sizes: [4]\n",
         ":2: batching: preferred batch size 4"),
        # a batch is taken from the queue: with 8 and 1 none grew past 1 and the gateway, sending up
        # to 8 + 1, had 16 of 90 requests refused by the worker (measured); the chart refuses it too
        ("model: a.onnx\nbatching:\n  max_queue_size: 1\n",
         "batching.max_queue_size: 1 is less than batching.max_batch_size 8: a batch is formed from the requests "
         "waiting, so none could exceed 1; give a queue of at least 8, or a smaller max_batch_size"),
        ("port: 1\n", "model: a YOLOv5 ONNX file is required"),
        ("model: a.onnx\nport: 9101\n", "metrics_port: 9101 is also the gRPC port; give each its own port"),
        # every image shrunk to 10 px: answered OK with no boxes, always
        ("model: a.onnx\nnative_max_side: 10\n", "native_max_side: 10 leaves nothing to detect; give 0"),
        ("- a\n- b\n", "top level must be a mapping"),
        ("model: [unclosed\n", "not valid YAML"),
    ],
)
def test_bad_files_name_the_file_and_key(tmp_path, text, message):
    cfg = write(tmp_path, text)
    with pytest.raises(ConfigError, match=message) as ei:
        load_settings(cfg, env={})
    assert str(cfg) in str(ei.value)


def test_bad_env_names_the_variable(tmp_path):
    with pytest.raises(ConfigError, match=r"^EDGEWISE_WORKER__BATCHING__MAX_BATCH: unknown key "
                                          r"\(did you mean EDGEWISE_WORKER__BATCHING__MAX_BATCH_SIZE\?\)"):
        load_settings(None, env={"EDGEWISE_WORKER__MODEL": "m.onnx", "EDGEWISE_WORKER__BATCHING__MAX_BATCH": "4"})
    with pytest.raises(ConfigError, match="^EDGEWISE_WORKER__THREADS: 'many' is not an integer"):
        load_settings(None, env={"EDGEWISE_WORKER__MODEL": "m.onnx", "EDGEWISE_WORKER__THREADS": "many"})
    with pytest.raises(ConfigError, match="^EDGEWISE_WORKER_THREADS: not a settings variable"):
        load_settings(None, env={"EDGEWISE_WORKER__MODEL": "m.onnx", "EDGEWISE_WORKER_THREADS": "2"})
    with pytest.raises(ConfigError, match="missing.yaml: worker settings file not found; check the path"):
        load_settings(tmp_path / "missing.yaml", env={})


def test_cli_flags_map_onto_settings_and_absent_flags_do_not_override(tmp_path, monkeypatch):
    import cloud.worker.cli as cli

    cfg = write(tmp_path, "model: from-file.onnx\nthreads: 3\nbatching:\n  max_queue_size: 9\n")
    args = build_parser().parse_args(
        ["cloud", "worker", "--config", str(cfg), "--port", "0", "--max-batch", "8", "--max-delay-ms", "5",
         "--preferred-batch", "4,8", "--queue-size", "64", "--metrics-port", "0", "--imgsz", "384,640"])
    seen = {}

    async def fake_serve(settings):  # stands in for the server: only the parsing is under test
        seen["s"] = settings
        return 0

    monkeypatch.setattr("cloud.worker.server.serve", fake_serve)
    monkeypatch.delenv("EDGEWISE_WORKER__PORT", raising=False)
    assert args.func is cli.handle and args.func(args) == 0
    s: WorkerSettings = seen["s"]
    assert s.model == "from-file.onnx" and s.threads == 3 and s.port == 0 and s.metrics_port == 0
    assert setting_imgsz(s.imgsz) == (384, 640)
    assert s.batching.max_batch_size == 8 and s.batching.preferred_batch_sizes == (4, 8)
    assert s.batching.max_queue_size == 64 and s.batching.max_queue_delay_ms == 5.0
    args = build_parser().parse_args(["cloud", "worker", "--model", "m.onnx", "--preferred-batch", "4,x"])
    with pytest.raises(ConfigError, match=r"^--preferred-batch: batching.preferred_batch_sizes\[1\]: 'x' is not"):
        args.func(args)
