"""Trainer: the loss falls on a tiny synthetic set; a trained checkpoint exports to ONNX that agrees with torch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

from edgewise.errors import ConfigError  # noqa: E402
from edgewise_tools.train import TrainConfig, load_checkpoint, train  # noqa: E402
from edgewise_tools.train.data import NO_AUGMENT, YoloDataset, batches  # noqa: E402
from edgewise_tools.train.loss import ComputeLoss, LossGains, scaled_gains  # noqa: E402
from edgewise_tools.train.trainer import make_model, smart_optimizer  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_loss_decreases_on_a_tiny_set(tiny_data: Path) -> None:
    torch.manual_seed(0)
    ds = YoloDataset(tiny_data, 128)
    x, tg, _ = next(batches(ds, 8, np.random.default_rng(0), NO_AUGMENT, shuffle=False))
    assert len(tg) >= 8
    cfg = TrainConfig(data=str(tiny_data), out="unused", imgsz=128)
    model = make_model(cfg, 10).train()
    loss_fn = ComputeLoss(model, scaled_gains(LossGains(), 3, 10, 128))
    opt = smart_optimizer(model, "AdamW", 0.002, 0.9, 0.0)
    xt, tt = torch.from_numpy(x), torch.from_numpy(tg)
    losses = []
    for _ in range(25):
        loss, items = loss_fn(model(xt), tt)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert np.isfinite(losses).all()
    assert np.mean(losses[-3:]) < 0.6 * np.mean(losses[:3]), losses


def test_train_run_checkpoints_and_exports_onnx_matching_torch(tiny_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    cfg = TrainConfig(data=str(tiny_data), out=str(out), imgsz=128, epochs=2, batch=4, nbs=4,
                      warmup_epochs=0.0, log_every=0, seed=3, threads=1)
    summary = train(cfg)
    hist = json.loads((out / "history.json").read_text())
    assert [h["epoch"] for h in hist] == [1, 2] and summary["epochs_run"] == 2
    for name in ("last.pt", "best.pt", "best.onnx", "summary.json"):
        assert (out / name).exists(), name
    model = load_checkpoint(out / "best.pt")
    sess = ort.InferenceSession(str(out / "best.onnx"), providers=["CPUExecutionProvider"])
    meta = sess.get_modelmeta().custom_metadata_map
    assert meta["imgsz"] == "[128, 128]" and "'9'" in meta["names"] and meta["stride"] == "32"
    ds = YoloDataset(tiny_data, 128)
    x, _, _ = next(batches(ds, 2, np.random.default_rng(0), NO_AUGMENT, shuffle=False))
    with torch.no_grad():
        ref = model(torch.from_numpy(x)).numpy()
    got = sess.run(None, {"images": x})[0]
    assert got.shape == ref.shape == (2, 3 * (16 * 16 + 8 * 8 + 4 * 4), 15)
    np.testing.assert_allclose(got[..., 4:], ref[..., 4:], atol=1e-4)
    np.testing.assert_allclose(got[..., :4], ref[..., :4], atol=1e-2, rtol=1e-4)


def test_an_interrupted_run_resumes_where_it_stopped(tiny_data: Path, tmp_path: Path) -> None:
    """Killed while epoch 3 of 3 is being validated (the progress hook raises, as a SIGKILL
    would end it: resume.pt holds epoch 2), then run again with ``resume``: it does epoch 3
    again and ends with the weights of a run that was never interrupted; the finished run
    deletes resume.pt."""
    def cfg(out: Path, **kw: object) -> TrainConfig:
        return TrainConfig(data=str(tiny_data), out=str(out), imgsz=128, epochs=3, batch=2, nbs=4,
                           warmup_epochs=0.0, log_every=0, seed=5, threads=1, export_onnx=False, **kw)

    whole = train(cfg(tmp_path / "whole"))

    class Killed(Exception):
        pass

    def kill_in_three(rec: dict) -> None:
        if rec["epoch"] == 3:
            raise Killed

    out = tmp_path / "cut"
    with pytest.raises(Killed):
        train(cfg(out, resume=True), progress=kill_in_three)
    assert (out / "resume.pt").exists()
    epochs = []
    resumed = train(cfg(out, resume=True), progress=lambda rec: epochs.append(rec["epoch"]))
    assert epochs == [3] and [h["epoch"] for h in resumed["history"]] == [1, 2, 3]
    assert resumed["images_seen"] == whole["images_seen"]
    # the clock (the time budget's and the schedule's) continues from the training time spent
    hist = resumed["history"]
    assert hist[2]["elapsed_s"] >= hist[1]["elapsed_s"] > 0
    assert not (out / "resume.pt").exists()
    a = torch.load(str(tmp_path / "whole" / "last.pt"), weights_only=False)["model"]
    b = torch.load(str(out / "last.pt"), weights_only=False)["model"]
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-5, atol=1e-6, msg=k)


def test_resume_refuses_other_settings(tiny_data: Path, tmp_path: Path) -> None:
    from edgewise.errors import ConfigError

    out = tmp_path / "run"
    base = dict(data=str(tiny_data), out=str(out), imgsz=128, epochs=3, batch=2, nbs=4, warmup_epochs=0.0,
                log_every=0, threads=1, export_onnx=False, resume=True)

    def stop(rec: dict) -> None:
        if rec["epoch"] == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(TrainConfig(**base), progress=stop)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="lr0"):
        train(TrainConfig(**dict(base, lr0=0.02)))  # type: ignore[arg-type]
    (out / "resume.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigError, match="resume.pt: cannot resume from it"):
        train(TrainConfig(**base))  # type: ignore[arg-type]


def test_bad_config_is_rejected(tiny_data: Path) -> None:
    from edgewise.errors import ConfigError

    with pytest.raises(ConfigError, match="imgsz"):
        TrainConfig(data=str(tiny_data), out="x", imgsz=100).validate()
    with pytest.raises(ConfigError, match="arch"):
        TrainConfig(data=str(tiny_data), out="x", arch="yolov9").validate()


def test_edgewise_train_cli(tiny_data: Path, tmp_path: Path, capsys) -> None:
    from edgewise.cli import main

    rc = main(["train", "--data", str(tiny_data), "--out", str(tmp_path / "r"), "--imgsz", "128",
               "--epochs", "1", "--batch", "4", "--nbs", "4", "--threads", "1", "--no-export"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["epochs_run"] == 1 and (tmp_path / "r" / "best.pt").exists()
    assert not (tmp_path / "r" / "best.onnx").exists()
    assert main(["train", "--data", str(tiny_data), "--out", str(tmp_path / "s"), "--imgsz", "100"]) == 2


def _nan_loss_on(monkeypatch, bad) -> None:
    """The loss of the calls ``bad(n)`` names (n from 0) becomes NaN, as a numerical blow-up
    makes it; the step logic around it is what is tested."""
    from edgewise_tools.train import trainer as trainer_mod

    real = trainer_mod.ComputeLoss.__call__
    calls = {"n": 0}

    def call(self, preds, targets):
        loss, items = real(self, preds, targets)
        n = calls["n"]
        calls["n"] += 1
        return (loss * float("nan"), items * float("nan")) if bad(n) else (loss, items)
    monkeypatch.setattr(trainer_mod.ComputeLoss, "__call__", call)


def test_a_step_whose_loss_is_not_finite_is_skipped_and_the_weights_stay_finite(tiny_data: Path, tmp_path: Path,
                                                                                 monkeypatch, caplog) -> None:
    """A NaN loss used to be back-propagated and stepped: NaN weights, every later epoch NaN,
    and a best.onnx of NaN exported as if trained (a YOLOv5x at 1280 from scratch on a GPU
    went so). Now the step is skipped, as a loss scaler skips one, said once and counted."""
    _nan_loss_on(monkeypatch, lambda n: n in (3, 4, 9))
    out = tmp_path / "run"
    cfg = TrainConfig(data=str(tiny_data), out=str(out), imgsz=128, epochs=4, batch=1, nbs=1, warmup_epochs=0.0,
                      log_every=0, seed=0, threads=1, export_onnx=False)
    with caplog.at_level("WARNING", logger="edgewise_tools.train"):
        summary = train(cfg)
    assert summary["skipped_batches"] == 3 and summary["epochs_run"] == 4
    assert len([r for r in caplog.records if "is not finite; the batch is left out" in r.getMessage()]) == 1
    assert all(np.isfinite([h["box"], h["obj"], h["cls"]]).all() for h in summary["history"])
    weights = load_checkpoint(out / "last.pt").state_dict()
    assert all(bool(torch.isfinite(t).all()) for t in weights.values() if t.is_floating_point())


def test_a_forward_that_goes_not_finite_leaves_no_nan_in_the_batchnorm_statistics(tiny_data: Path, tmp_path: Path,
                                                                                    monkeypatch) -> None:
    """The forward pass updates BatchNorm's running statistics before the loss is known: a
    batch whose activations overflow left NaN there for good (and the EMA copied it), though
    its step was skipped. The statistics from before that forward are put back."""
    from edgewise_tools.train import trainer as trainer_mod

    real = trainer_mod._images
    calls = {"n": 0}

    def images(x, device):
        t = real(x, device)
        calls["n"] += 1
        return t * float("inf") if calls["n"] == 4 else t  # overflowing activations, once
    monkeypatch.setattr(trainer_mod, "_images", images)
    out = tmp_path / "run"
    summary = train(TrainConfig(data=str(tiny_data), out=str(out), imgsz=128, epochs=2, batch=1, nbs=1,
                                warmup_epochs=0.0, log_every=0, seed=0, threads=1, export_onnx=False))
    assert summary["skipped_batches"] == 1
    for name in ("last.pt", "best.pt"):
        state = load_checkpoint(out / name).state_dict()
        assert [k for k, t in state.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())] == []


def test_with_gradient_accumulation_a_bad_batch_is_left_out_and_the_window_goes_on(tiny_data: Path, tmp_path: Path,
                                                                                   monkeypatch) -> None:
    """batch 1, nbs 4: a step every 4 batches after the warm-up. A NaN batch in the middle of a
    window used to drop the gradient the window had gathered and restart the window; now only
    that batch is left out, and the optimizer steps after the same batches as without it."""
    def step_positions(bad) -> List[int]:
        from edgewise_tools.train import trainer as trainer_mod

        losses = {"n": 0}
        real_loss = trainer_mod.ComputeLoss.__call__

        def loss_call(self, preds, targets):
            loss, items = real_loss(self, preds, targets)
            losses["n"] += 1
            return (loss * float("nan"), items) if bad(losses["n"] - 1) else (loss, items)
        at: List[int] = []
        real_step = torch.optim.AdamW.step

        def step(self, *a, **k):
            at.append(losses["n"] - 1)  # the batch whose backward completed the window
            return real_step(self, *a, **k)
        with monkeypatch.context() as m:
            m.setattr(trainer_mod.ComputeLoss, "__call__", loss_call)
            m.setattr(torch.optim.AdamW, "step", step)
            summary = train(TrainConfig(data=str(tiny_data), out=str(tmp_path / f"run{len(at)}{id(bad)}"), imgsz=128,
                                        epochs=40, batch=1, nbs=4, optimizer="AdamW", warmup_epochs=0.0, log_every=0,
                                        seed=0, threads=1, export_onnx=False))
        assert summary["skipped_batches"] == sum(1 for n in range(summary["images_seen"]) if bad(n))
        return at

    clean = step_positions(lambda n: False)
    nan = step_positions(lambda n: n in (129, 130))  # inside a window, after the warm-up's 100 batches
    window = [p for p in clean if p > 120][:3]
    assert window and all(b - a == 4 for a, b in zip(window, window[1:])), clean
    assert nan == clean


def test_a_run_whose_loss_stays_not_finite_stops_naming_what_to_change(tiny_data: Path, tmp_path: Path,
                                                                       monkeypatch) -> None:
    from edgewise_tools.train.trainer import DIVERGED_BATCHES, TrainingDiverged

    _nan_loss_on(monkeypatch, lambda n: n >= 6)
    out = tmp_path / "run"
    cfg = TrainConfig(data=str(tiny_data), out=str(out), imgsz=128, epochs=100, batch=1, nbs=1, warmup_epochs=0.0,
                      log_every=0, seed=0, threads=1, lr0=0.002)
    with pytest.raises(TrainingDiverged, match=r"--lr0 \(now 0.002\).*--warmup-epochs") as ei:
        train(cfg)
    assert f"for {DIVERGED_BATCHES} batches in a row" in str(ei.value)
    assert not (out / "best.onnx").exists()  # nothing exported as if trained
    weights = load_checkpoint(out / "last.pt").state_dict()
    assert all(bool(torch.isfinite(t).all()) for t in weights.values() if t.is_floating_point())


def test_an_init_holding_nan_or_inf_is_refused(tiny_data: Path, tmp_path: Path) -> None:
    from edgewise.errors import ConfigError

    out = tmp_path / "run"
    train(TrainConfig(data=str(tiny_data), out=str(out), imgsz=128, epochs=1, batch=2, nbs=2, warmup_epochs=0.0,
                      log_every=0, threads=1, export_onnx=False))
    ckpt = torch.load(str(out / "last.pt"), map_location="cpu", weights_only=False)
    name = next(k for k, t in ckpt["model"].items() if t.is_floating_point() and t.numel() > 1)
    ckpt["model"][name].view(-1)[0] = float("inf")
    torch.save(ckpt, str(tmp_path / "bad.pt"))
    with pytest.raises(ConfigError, match=r"bad.pt.*not finite"):
        train(TrainConfig(data=str(tiny_data), out=str(tmp_path / "run2"), imgsz=128, epochs=1,
                          init=str(tmp_path / "bad.pt"), threads=1))


def test_amp_bf16_needs_a_device_that_has_it(tiny_data: Path, tmp_path: Path) -> None:
    from edgewise.errors import ConfigError

    with pytest.raises(ConfigError, match="--amp"):
        TrainConfig(data=str(tiny_data), out="x", amp="fp8").validate()
    with pytest.raises(ConfigError, match="bfloat16"):
        train(TrainConfig(data=str(tiny_data), out=str(tmp_path / "r"), imgsz=128, epochs=1, amp="bf16"))


@pytest.mark.parametrize("flag,value", [
    ("--warmup-epochs", "nan"),  # was a traceback: cannot convert float NaN to integer
    ("--warmup-bias-lr", "-1"),  # was accepted: it trained with a negative learning rate
    ("--time-budget", "-1"),  # was accepted and ignored
    ("--time-budget", "nan"),
    ("--threads", "-1"),  # was a traceback from torch.set_num_threads
    ("--seed", "-1"),
    ("--limit", "0"),  # was "DATA/images: no images", which it has
    ("--val-limit", "0"),
    ("--device", "cuda:99"),  # was an AssertionError traceback (or a CUDA error) once the data had loaded
    ("--device", "gpu"),
])
def test_cli_refuses_a_bad_number_or_device_before_writing(tiny_data: Path, tmp_path: Path, capsys,
                                                          flag: str, value: str) -> None:
    """`edgewise train` answers a bad option in one line naming it, exit 2, and leaves no run folder."""
    from edgewise.cli import main

    out = tmp_path / "run"
    rc = main(["train", "--data", str(tiny_data), "--out", str(out), "--imgsz", "128", "--epochs", "1",
               flag, value])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith(f"edgewise train: error: {flag} ") and err.count("\n") == 1, err
    assert not out.exists()


def test_a_run_started_without_resume_can_be_resumed_after_ctrl_c(tiny_data: Path, tmp_path: Path) -> None:
    """`edgewise train` without --resume, Ctrl-C'd (a real SIGINT) after its first epoch, then run
    again with --resume: it continues after the last finished epoch instead of starting afresh over
    the interrupted run's checkpoints (resume.pt was written only by runs started with --resume)."""
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "run"
    flags = ["--data", str(tiny_data), "--out", str(out), "--imgsz", "128", "--epochs", "40", "--batch", "2",
             "--nbs", "4", "--warmup-epochs", "0", "--threads", "1", "--seed", "5", "--no-export"]
    proc = subprocess.Popen([sys.executable, "-m", "edgewise.cli", "train", *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not (out / "resume.pt").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err.decode()[-2000:]
    assert b"Traceback" not in err
    done = torch.load(str(out / "resume.pt"), weights_only=False)["epoch"]
    assert 1 <= done < 40
    epochs: List[int] = []
    cfg = TrainConfig(data=str(tiny_data), out=str(out), imgsz=128, epochs=40, batch=2, nbs=4, warmup_epochs=0.0,
                      log_every=0, seed=5, threads=1, export_onnx=False, resume=True)

    class Enough(Exception):
        pass

    def first_epoch_only(rec: dict) -> None:
        epochs.append(rec["epoch"])
        raise Enough

    with pytest.raises(Enough):
        train(cfg, progress=first_epoch_only)
    assert epochs == [done + 1]


def test_a_fresh_run_into_an_interrupted_runs_folder_is_refused(tiny_data: Path, tmp_path: Path) -> None:
    """A run without resume into the folder of an interrupted run is refused before it writes
    anything: it would write over that run's checkpoints, and leave its resume.pt for a later
    --resume to go back to over the new run."""
    out = tmp_path / "run"

    def cfg(**kw: object) -> TrainConfig:
        return TrainConfig(data=str(tiny_data), out=str(out), imgsz=128, epochs=3, batch=2, nbs=4,
                           warmup_epochs=0.0, log_every=0, seed=5, threads=1, export_onnx=False, **kw)

    class Killed(Exception):
        pass

    def kill_in_two(rec: dict) -> None:
        if rec["epoch"] == 2:
            raise Killed

    with pytest.raises(Killed):
        train(cfg(), progress=kill_in_two)  # resume.pt: epoch 1
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    with pytest.raises(ConfigError, match=r"holds the resume.pt of an interrupted run; pass --resume to continue"):
        train(cfg())
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before


def test_a_fresh_run_over_a_finished_one_does_not_leave_its_results_as_if_it_had_finished(
        tiny_data: Path, tmp_path: Path) -> None:
    """A finished run's summary.json and best.onnx stayed beside the checkpoints of a new run
    into the same folder until that one finished: interrupted, the folder claimed a finished run
    (scripts/train_*.sh skip a stage whose summary.json exists) whose best.onnx was not its best.pt."""
    out = tmp_path / "run"

    def cfg(**kw: object) -> TrainConfig:
        return TrainConfig(**{"data": str(tiny_data), "out": str(out), "imgsz": 128, "epochs": 2, "batch": 2,
                              "nbs": 4, "warmup_epochs": 0.0, "log_every": 0, "seed": 5, "threads": 1, **kw})

    train(cfg(epochs=1))
    assert (out / "summary.json").exists() and (out / "best.onnx").exists()

    class Killed(Exception):
        pass

    def kill(rec: dict) -> None:
        raise Killed

    with pytest.raises(Killed):
        train(cfg(seed=6, export_onnx=False), progress=kill)
    assert not (out / "summary.json").exists() and not (out / "best.onnx").exists()
    assert (out / "last.pt").exists()
    # fine-tuning into its own folder from its own export: that model is what the run starts from,
    # and an interrupted run must not have deleted it (a review found it did)
    train(cfg(epochs=1))
    model = (out / "best.onnx").read_bytes()
    with pytest.raises(Killed):
        train(cfg(seed=6, export_onnx=False, init=str(out / "best.onnx")), progress=kill)
    assert (out / "best.onnx").read_bytes() == model and not (out / "summary.json").exists()


def test_a_checkpoint_reaches_the_disk_before_its_name(tmp_path: Path, monkeypatch) -> None:
    """A power cut during a training left resume.pt (renamed into place unsynced) empty under its
    name: the resumed run refused it, and the hours before were lost. The checkpoint's bytes are
    fsync'd before the rename and the folder after."""

    from edgewise_tools.models.yolov5 import build_model
    from edgewise_tools.train.trainer import TrainConfig, save_checkpoint
    from tests.syncs import record_syncs

    done = record_syncs(monkeypatch)
    save_checkpoint(tmp_path / "best.pt", build_model("yolov5n", nc=2), TrainConfig(data="d", out="o", arch="yolov5n"),
                    ["a", "b"], 0, {})
    assert done == [("fsync", (tmp_path / "best.pt").stat().st_size), ("replace", "best.pt"), ("fsync", "folder")]
