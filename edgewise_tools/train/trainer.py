"""The YOLOv5 training loop (after Ultralytics YOLOv5 v7.0 ``train.py``), CPU-friendly.

SGD (momentum 0.937, Nesterov) or AdamW with the three parameter groups of
``smart_optimizer`` (weights with decay, BN weights and biases without), warmup of
lr/momentum/bias-lr as train.py, cosine or linear decay to ``lrf``, ModelEMA
(``utils/torch_utils.py``: decay 0.9999 ramped with tau), gradient clipping at
10, validation mAP@0.5 of the EMA model after every epoch, ``last.pt``/``best.pt``
checkpoints each epoch and the best model exported to ONNX at the end.

A wall-clock ``time_budget_s`` makes the schedule time-based: the LR follows
``max(epoch progress, time progress)`` and training stops at the budget, so a
run on a shared CPU still anneals and ends with a usable model.

Resumable: after every epoch ``resume.pt`` keeps what the next epoch needs (weights,
EMA, optimizer, random states, the training seconds spent, history, best score), whether
or not the run was started with ``resume``: a run interrupted hours in can be continued
however it was started. A run with ``resume`` and the same settings continues from it
after an interruption (a killed process loses at most the epoch in progress, and the time
budget counts training time only); without the file it starts afresh. A run without
``resume`` into a folder that holds the file is refused (ConfigError: continue it with
``resume``, or delete the file): starting afresh would write over the interrupted run's
checkpoints, and a later ``resume`` would go back to that older run over the new one. A
run that finished deletes the file. A fresh run into the folder of a finished one replaces
it and removes its ``summary.json`` and ``best.onnx`` as it starts (not the ``init`` it
starts from): interrupted, it would otherwise leave them beside its own checkpoints, as if
it had finished (the training scripts skip a stage whose ``summary.json`` exists).
"""

from __future__ import annotations

import copy
import json
import logging
import math
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import torch
from torch import nn

from edgewise.errors import ConfigError
from edgewise.outputs import check_output_folder, replace_durably
from edgewise_tools.models.yolov5 import ARCHS, YOLOv5, build_model
from edgewise_tools.options import check_option
from edgewise_tools.train.data import NO_AUGMENT, Augment, YoloDataset, batches, prefetched
from edgewise_tools.train.loss import ComputeLoss, LossGains, scaled_gains
from edgewise_tools.train.metrics import evaluate, postprocess

log = logging.getLogger("edgewise_tools.train")
#: training images that calibrate the BatchNorm statistics of an ONNX ``--init``
CALIBRATION_IMAGES = 64
#: ``--amp`` values (TrainConfig.amp)
AMP_MODES = ("auto", "bf16", "off")
#: batches in a row whose loss or gradient was not finite (each left out, or its step dropped,
#: the weights and BatchNorm statistics kept) after which the run stops as diverged
DIVERGED_BATCHES = 50


class TrainingDiverged(ConfigError):
    """The loss or the gradients stayed NaN or infinite: the settings make this run diverge."""


def _check_device(device: str) -> None:
    """Refuse a ``--device`` torch cannot train on here, before anything is written or loaded
    (torch itself fails later with a traceback: an AssertionError for CUDA it was not built with)."""
    if device in ("cpu", "auto"):
        return
    m = re.fullmatch(r"cuda(?::(\d+))?", device)
    if m is None:
        raise ConfigError(f"--device {device!r}: use cpu, cuda, cuda:N or auto")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    index = int(m.group(1) or 0)
    if index >= count:
        have = f"{count} CUDA device(s)" if count else "no CUDA device torch can use"
        raise ConfigError(f"--device {device}: this machine has {have} (torch {torch.__version__}); "
                          "use --device cpu, auto, or a cuda:N that exists")


def _amp_dtype(mode: str, device: torch.device) -> Optional[torch.dtype]:
    """The autocast dtype of ``--amp`` on ``device``: bfloat16 (no loss scaling needed: the
    exponent range of float32), or None for float32 throughout."""
    if mode == "off":
        return None
    usable = device.type == "cuda" and torch.cuda.is_bf16_supported()
    if mode == "bf16" and not usable:
        raise ConfigError(f"--amp bf16: {device} has no bfloat16 support; use --amp off (or auto)")
    return torch.bfloat16 if usable else None


@dataclass
class TrainConfig:
    """Every knob of one training run (saved into checkpoints and the run folder)."""

    data: str
    out: str
    val: Optional[str] = None  # defaults to ``data`` (no separate val set)
    arch: str = "yolov5n"
    width_multiple: Optional[float] = None  # override the arch's width (e.g. a narrow yolov5s)
    imgsz: int = 256
    epochs: int = 10
    batch: int = 16
    nbs: int = 64  # nominal batch size (gradient accumulation to it, as Ultralytics)
    optimizer: str = "SGD"  # SGD | AdamW
    lr0: float = 0.01
    lrf: float = 0.01
    momentum: float = 0.937
    weight_decay: float = 5e-4
    warmup_epochs: float = 3.0
    warmup_momentum: float = 0.8
    warmup_bias_lr: float = 0.1
    cos_lr: bool = True
    ema_decay: float = 0.9999
    ema_tau: float = 2000.0
    seed: int = 0
    threads: int = 0  # torch intra-op threads (0: leave torch's default)
    device: str = "cpu"  # cpu | cuda | cuda:N | auto (cuda when available)
    #: mixed precision: auto (bfloat16 autocast on a CUDA device that has it, else off) | bf16 | off
    amp: str = "auto"
    time_budget_s: float = 0.0  # 0: no wall-clock limit
    limit: Optional[int] = None  # use only the first N training images
    epoch_size: Optional[int] = None  # images per "epoch" (validation + checkpoint); default: all
    val_limit: Optional[int] = None
    augment: Augment = field(default_factory=Augment)
    gains: LossGains = field(default_factory=LossGains)
    export_onnx: bool = True
    log_every: int = 20
    #: backbone file of edgewise_tools.train.pretrain, a checkpoint to fine-tune, or an ONNX
    #: file exported by edgewise (edgewise_tools.train.onnxinit: fused weights unfused)
    init: Optional[str] = None
    #: continue from ``out/resume.pt`` (written after every epoch of any run) when it exists
    #: (same settings), else start afresh
    resume: bool = False

    def validate(self) -> TrainConfig:
        if self.arch not in ARCHS:
            raise ConfigError(f"--arch {self.arch!r}: use one of {', '.join(ARCHS)}")
        if self.imgsz < 32 or self.imgsz % 32:
            raise ConfigError(f"--imgsz {self.imgsz}: must be a positive multiple of 32")
        if self.epochs < 1 or self.batch < 1 or self.nbs < 1:
            raise ConfigError("--epochs, --batch and --nbs must be >= 1")
        if self.epoch_size is not None and self.epoch_size < 1:
            raise ConfigError("--epoch-size must be >= 1")
        if self.optimizer not in ("SGD", "AdamW"):
            raise ConfigError("--optimizer must be SGD or AdamW")
        if not 0 < self.lr0 < 1 or not 0 < self.lrf <= 1:
            raise ConfigError("--lr0 must be in (0, 1) and --lrf in (0, 1]")
        if self.width_multiple is not None and not 0.05 <= self.width_multiple <= 2.0:
            raise ConfigError("--width must be within [0.05, 2]")
        if self.amp not in AMP_MODES:
            raise ConfigError(f"--amp {self.amp!r}: use one of {', '.join(AMP_MODES)}")
        for flag, value, rule, meaning in (
                ("--warmup-epochs", self.warmup_epochs, ">= 0", "epochs of learning-rate warm-up"),
                ("--warmup-bias-lr", self.warmup_bias_lr, "in [0, 1]", "the biases' learning rate as warm-up starts"),
                ("--time-budget", self.time_budget_s, ">= 0", "seconds of training; 0: no limit"),
                ("--threads", self.threads, ">= 0", "torch threads; 0: torch's default"),
                ("--seed", self.seed, ">= 0", "the seed of the weights and the shuffling"),
                ("--limit", self.limit, ">= 1", "the number of training images; leave it out for all"),
                ("--val-limit", self.val_limit, ">= 1", "the number of validation images; leave it out for all")):
            check_option(flag, value, rule, meaning)
        _check_device(self.device)
        if self.init is not None and not Path(self.init).is_file():
            raise ConfigError(f"--init {self.init}: no such file (a backbone of python -m edgewise_tools.train.pretrain, "
                              "a trainer checkpoint such as best.pt, or an ONNX model exported by edgewise)")
        return self


class ModelEMA:
    """Exponential moving average of the weights (utils/torch_utils.py ModelEMA)."""

    def __init__(self, model: nn.Module, decay: float = 0.9999, tau: float = 2000.0,
                 updates: int = 0) -> None:
        self.ema = copy.deepcopy(model).eval()
        self.updates = updates
        self.decay: Callable[[float], float] = lambda x: decay * (1 - math.exp(-x / tau))
        for p in self.ema.parameters():
            p.requires_grad_(False)

    def update(self, model: nn.Module) -> None:
        self.updates += 1
        d = self.decay(self.updates)
        msd = model.state_dict()
        with torch.no_grad():
            for k, v in self.ema.state_dict().items():
                if v.dtype.is_floating_point:
                    v *= d
                    v += (1 - d) * msd[k].detach()


def make_model(cfg: TrainConfig, nc: int) -> YOLOv5:
    """The YOLOv5 for ``cfg`` (optionally with an overridden width multiple)."""
    if cfg.width_multiple is None:
        return build_model(cfg.arch, nc=nc, seed=cfg.seed)
    gd, _ = ARCHS[cfg.arch]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        return YOLOv5({"depth_multiple": gd, "width_multiple": cfg.width_multiple,
                       "name": f"{cfg.arch}-w{cfg.width_multiple:g}"}, nc=nc)


def smart_optimizer(model: nn.Module, name: str, lr: float, momentum: float,
                    decay: float) -> torch.optim.Optimizer:
    """Three groups: biases (no decay), weights (decay), norm weights (no decay)."""
    g: List[List[nn.Parameter]] = [[], [], []]
    for v in model.modules():
        for p_name, p in v.named_parameters(recurse=False):
            if p_name == "bias":
                g[2].append(p)
            elif p_name == "weight" and isinstance(v, nn.BatchNorm2d):
                g[1].append(p)
            else:
                g[0].append(p)
    opt: torch.optim.Optimizer
    if name == "AdamW":
        opt = torch.optim.AdamW(g[2], lr=lr, betas=(momentum, 0.999), weight_decay=0.0)
    else:
        opt = torch.optim.SGD(g[2], lr=lr, momentum=momentum, nesterov=True)
    opt.add_param_group({"params": g[0], "weight_decay": decay})
    opt.add_param_group({"params": g[1], "weight_decay": 0.0})
    return opt


def lr_factor(progress: float, cfg: TrainConfig) -> float:
    """LR multiplier at training progress in [0, 1] (one_cycle cosine or linear to lrf)."""
    x = min(max(progress, 0.0), 1.0)
    if cfg.cos_lr:
        return ((1 - math.cos(x * math.pi)) / 2) * (cfg.lrf - 1) + 1
    return (1 - x) * (1.0 - cfg.lrf) + cfg.lrf


def _images(x: np.ndarray, device: torch.device) -> torch.Tensor:
    """uint8 RGB batch ``[B,3,H,W]`` as float32 0..1 on ``device`` (scaled there: a quarter of
    the bytes cross, and the division runs on the device; the same values as scaling first)."""
    return torch.from_numpy(x).to(device).float().div_(255.0)


@torch.no_grad()
def validate_model(model: nn.Module, ds: YoloDataset, batch: int = 32, conf_thres: float = 0.001,
                   iou_thres: float = 0.6) -> Dict[str, float]:
    """mAP@0.5 and mAP@0.5:0.95 of ``model`` (eval mode) on ``ds``."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    dets, labs = [], []
    rng = np.random.default_rng(0)
    for x, _, idx in batches(ds, batch, rng, NO_AUGMENT, shuffle=False, as_uint8=True):
        out = model(_images(x, device)).float().cpu().numpy()
        for j, k in enumerate(idx):
            dets.append(postprocess(out[j], conf_thres, iou_thres))
            labs.append(ds.labels[k])
    model.train(was_training)
    return evaluate(dets, labs, nc=int(model.nc))  # type: ignore[arg-type]


def save_checkpoint(path: Path, model: nn.Module, cfg: TrainConfig, names: List[str],
                    epoch: int, metrics: Dict[str, float]) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save({"model": model.state_dict(), "config": asdict(cfg), "names": names,
                "epoch": epoch, "metrics": metrics,
                "arch": getattr(model, "arch", cfg.arch),
                "depth_multiple": model.depth_multiple, "width_multiple": model.width_multiple,
                "nc": model.nc}, tmp)
    replace_durably(tmp, path)


#: settings a resumed run may change: where it runs and how it logs, not what it learns
RESUMABLE_CHANGES = ("resume", "threads", "device", "log_every", "export_onnx", "amp")


def _settings(cfg: TrainConfig) -> Dict[str, Any]:
    """``cfg`` as plain JSON values (as config.json and resume.pt keep it)."""
    return json.loads(json.dumps(asdict(cfg), default=str))  # type: ignore[no-any-return]


def _same_run(saved: Dict[str, Any], cfg: TrainConfig) -> List[str]:
    """The settings in which ``cfg`` differs from the interrupted run's (beyond RESUMABLE_CHANGES)."""
    now = _settings(cfg)
    return sorted(k for k in set(saved) | set(now) if k not in RESUMABLE_CHANGES and saved.get(k) != now.get(k))


def save_resume(path: Path, model: nn.Module, ema: ModelEMA, optimizer: torch.optim.Optimizer,
                cfg: TrainConfig, state: Dict[str, Any]) -> None:
    """What the next epoch needs, written atomically and durably (a kill or a power cut leaves
    the previous file)."""
    tmp = path.with_suffix(".tmp")
    torch.save({"model": model.state_dict(), "ema": ema.ema.state_dict(), "ema_updates": ema.updates,
                "optimizer": optimizer.state_dict(), "torch_rng": torch.get_rng_state(),
                "config": _settings(cfg), **state}, tmp)
    replace_durably(tmp, path)


def load_checkpoint(path: Path) -> YOLOv5:
    """Rebuild the model of a checkpoint written by :func:`train` (eval mode)."""
    ck = torch.load(str(path), map_location="cpu", weights_only=False)
    model = YOLOv5({"depth_multiple": ck["depth_multiple"], "width_multiple": ck["width_multiple"],
                    "name": ck["arch"]}, nc=int(ck["nc"]))
    model.load_state_dict(ck["model"])
    model.names = list(ck["names"])  # type: ignore[assignment]
    return model.eval()


#: what only a finished run writes into ``out`` (:func:`train` removes an earlier run's at a fresh start)
FINISHED_RUN_FILES = ("summary.json", "best.onnx")


def train(cfg: TrainConfig, progress: Optional[Callable[[Dict[str, Any]], None]] = None) -> Dict[str, Any]:
    """Run one training; returns a summary (also written to ``out/summary.json``)."""
    cfg.validate()
    t_start = time.monotonic()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    out = check_output_folder(cfg.out, "--out")
    resume_path = out / "resume.pt"
    if not cfg.resume and resume_path.exists():
        raise ConfigError(f"--out {out}: holds the resume.pt of an interrupted run; pass --resume to continue it "
                          f"(same settings), or delete {resume_path} (or choose another --out) to start afresh")
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(_settings(cfg), indent=1))
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    ds = YoloDataset(Path(cfg.data), cfg.imgsz, cfg.limit)
    val_ds = ds if cfg.val is None else YoloDataset(Path(cfg.val), cfg.imgsz, cfg.val_limit)
    names = ds.names
    nc = len(names)
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if cfg.device == "auto"
                          else cfg.device)
    model = make_model(cfg, nc)
    saved: Optional[Dict[str, Any]] = None
    if cfg.resume and resume_path.exists():
        try:
            saved = torch.load(str(resume_path), map_location="cpu", weights_only=False)
            changed = _same_run(saved["config"], cfg)
        except Exception as exc:  # not a file this trainer wrote (atomic writes leave no half file)
            raise ConfigError(f"{resume_path}: cannot resume from it ({type(exc).__name__}: {exc}); "
                              "delete it to start afresh") from exc
        if changed:
            raise ConfigError(f"{resume_path}: the interrupted run had other settings ({', '.join(changed)}); "
                              "run with them, or delete the file to start afresh")
        model.load_state_dict(saved["model"])
        log.info("resuming %s after epoch %d (%.0f s of training done)", out, saved["epoch"], saved["elapsed_s"])
    elif cfg.init and Path(cfg.init).suffix.lower() == ".onnx":
        from edgewise.runtime.letterbox import to_chw_rgb
        from edgewise_tools.train.onnxinit import load_onnx

        calib = to_chw_rgb(list(ds.images[:CALIBRATION_IMAGES]))
        log.info("initialised from %s (%d tensors, BatchNorm unfused on %d training images)", cfg.init,
                 load_onnx(model, Path(cfg.init), calib), len(calib))
    elif cfg.init:
        from edgewise_tools.train.pretrain import load_backbone

        log.info("backbone initialised from %s (%d tensors)", cfg.init, load_backbone(model, Path(cfg.init)))
    if cfg.init and saved is None:
        broken = [k for k, t in model.state_dict().items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
        if broken:
            raise ConfigError(f"--init {cfg.init}: {len(broken)} tensor(s) hold values that are not finite (NaN or "
                              f"infinity), such as {broken[0]!r}: the file is damaged or comes from a run that "
                              "diverged; start from another file")
    if saved is None and cfg.resume:
        log.info("%s: no resume.pt (no run was interrupted there after a finished epoch): starting afresh", out)
    if saved is None:
        # what says an earlier run in ``out`` finished: this run replaces it, and one interrupted must
        # not leave the old results beside its own checkpoints (a script skips a stage with a summary);
        # but not the model this run starts from (fine-tuning into its own folder: --init out/best.onnx),
        # which an interrupted run would otherwise have destroyed
        init = Path(cfg.init).resolve() if cfg.init else None
        for name in FINISHED_RUN_FILES:
            if (out / name).resolve() != init:
                (out / name).unlink(missing_ok=True)
    model = model.to(device).train()
    amp = _amp_dtype(cfg.amp, device)
    det = model.detect
    gains = scaled_gains(cfg.gains, det.nl, nc, cfg.imgsz)
    compute_loss = ComputeLoss(model, gains)
    accumulate = max(round(cfg.nbs / cfg.batch), 1)
    decay = cfg.weight_decay * cfg.batch * accumulate / cfg.nbs
    optimizer = smart_optimizer(model, cfg.optimizer, cfg.lr0, cfg.momentum, decay)
    for g in optimizer.param_groups:
        g["initial_lr"] = cfg.lr0
    ema = ModelEMA(model, cfg.ema_decay, cfg.ema_tau)
    if saved is not None:
        optimizer.load_state_dict(saved["optimizer"])
        ema.ema.load_state_dict(saved["ema"])
        ema.updates = int(saved["ema_updates"])
    epoch_size = min(cfg.epoch_size or len(ds), len(ds))
    nb = math.ceil(epoch_size / cfg.batch)
    # an endless shuffled stream of image indices, cut into epochs of ``epoch_size``
    order = np.concatenate([rng.permutation(len(ds)) for _ in range(
        math.ceil(epoch_size * cfg.epochs / len(ds)) + 1)])
    total_iters = nb * cfg.epochs
    nw = max(round(cfg.warmup_epochs * nb), 100)
    last_opt_step = -1
    best = -1.0
    history: List[Dict[str, Any]] = []
    images_seen = 0
    stop = False
    ni = 0
    first_epoch = 0
    if saved is not None:
        first_epoch, last_opt_step, best = int(saved["epoch"]), int(saved["last_opt_step"]), float(saved["best"])
        history, images_seen = list(saved["history"]), int(saved["images_seen"])
        rng.bit_generator.state = saved["numpy_rng"]
        torch.set_rng_state(saved["torch_rng"])
        t_start -= float(saved["elapsed_s"])  # the budget counts training time, not the interruption
    # BatchNorm running statistics (float buffers), and a copy taken before each forward
    bn_buffers = [b for name, b in model.named_buffers() if b.is_floating_point() and "running_" in name]
    bn_kept = [b.detach().clone() for b in bn_buffers]
    skipped = 0  # batches left out or steps dropped for a loss or gradient that was not finite, in all
    skipped_run = 0  # and in a row
    log.info("train %s nc=%d imgsz=%d on %s%s: %d train / %d val images, %d batches/epoch",
             model.arch, nc, cfg.imgsz, device, " (bfloat16 autocast)" if amp is not None else "",
             len(ds), len(val_ds), nb)
    for epoch in range(first_epoch, cfg.epochs):
        model.train()
        mloss = torch.zeros(3)
        counted = 0  # batches in mloss (not those whose loss was not finite)
        t_epoch = time.monotonic()
        optimizer.zero_grad()
        idx = order[epoch * epoch_size:(epoch + 1) * epoch_size]
        for i, (x, tg, _) in enumerate(prefetched(batches(ds, cfg.batch, rng, cfg.augment, shuffle=False,
                                                          indices=idx.tolist(), as_uint8=True))):
            ni = i + nb * epoch
            elapsed = time.monotonic() - t_start
            prog = ni / total_iters
            if cfg.time_budget_s > 0:
                prog = max(prog, elapsed / cfg.time_budget_s)
            lf = lr_factor(prog, cfg)
            if ni <= nw:
                xi = [0, nw]
                accumulate = max(1, int(np.interp(ni, xi, [1, cfg.nbs / cfg.batch]).round()))
                for j, g in enumerate(optimizer.param_groups):
                    g["lr"] = float(np.interp(ni, xi, [cfg.warmup_bias_lr if j == 0 else 0.0,
                                                       g["initial_lr"] * lf]))
                    if "momentum" in g:
                        g["momentum"] = float(np.interp(ni, xi, [cfg.warmup_momentum, cfg.momentum]))
            else:
                for g in optimizer.param_groups:
                    g["lr"] = g["initial_lr"] * lf
            for keep, now in zip(bn_kept, bn_buffers):
                keep.copy_(now)  # a forward that goes non-finite must not leave its statistics behind
            with torch.autocast(device.type, dtype=amp or torch.float32, enabled=amp is not None):
                preds = model(_images(x, device))
            if amp is not None:
                preds = [p.float() for p in preds]  # the loss in float32
            loss, items = compute_loss(preds, torch.from_numpy(tg).to(device))
            finite = bool(torch.isfinite(loss))
            if finite:
                loss.backward()
            else:  # this batch only: the gradient gathered so far stays, the step comes as due
                for keep, now in zip(bn_kept, bn_buffers):
                    now.copy_(keep)
            stepped = False
            if finite and ni - last_opt_step >= accumulate:
                norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=10.0)
                if bool(torch.isfinite(norm)):
                    optimizer.step()
                    ema.update(model)
                    stepped = True
                optimizer.zero_grad()  # a gradient that is not finite is dropped, as a loss scaler does
                last_opt_step = ni
            if stepped:
                skipped_run = 0
            elif not finite or ni == last_opt_step:  # a batch left out, or a step dropped
                skipped, skipped_run = skipped + 1, skipped_run + 1
                if skipped == 1:
                    log.warning("epoch %d it %d: the %s is not finite; %s (the weights and the BatchNorm "
                                "statistics are kept); %d such batches in a row stop the run", epoch + 1, i,
                                "loss" if not finite else "gradient",
                                "the batch is left out" if not finite else "the step is dropped", DIVERGED_BATCHES)
                if skipped_run >= DIVERGED_BATCHES:
                    raise TrainingDiverged(
                        f"training diverged at epoch {epoch + 1} it {i}: the loss or the gradients were not "
                        f"finite for {skipped_run} batches in a row ({skipped} left out in all); the last good "
                        f"weights are in {out / 'last.pt'} and {out / 'best.pt'} (when an epoch ended before). "
                        f"Lower --lr0 (now {cfg.lr0:g}) or lengthen --warmup-epochs (now {cfg.warmup_epochs:g}; "
                        "a model trained from scratch wants about 3)")
            images_seen += len(x)
            if finite:
                mloss = (mloss * counted + items.cpu()) / (counted + 1)
                counted += 1
            if cfg.log_every and i % cfg.log_every == 0:
                log.info("epoch %d/%d it %d/%d loss box %.4f obj %.4f cls %.4f lr %.5f %.1f img/s",
                         epoch + 1, cfg.epochs, i, nb, *mloss.tolist(), optimizer.param_groups[0]["lr"],
                         (i + 1) * cfg.batch / max(time.monotonic() - t_epoch, 1e-6))
            if cfg.time_budget_s > 0 and time.monotonic() - t_start >= cfg.time_budget_s:
                stop = True
                break
        metrics = validate_model(ema.ema, val_ds)
        losses = [float(v) for v in mloss] if counted else [None, None, None]  # no batch with a finite loss
        rec = {"epoch": epoch + 1, "box": losses[0], "obj": losses[1], "cls": losses[2],
               "map50": metrics["map50"], "map": metrics["map"], "images_seen": images_seen,
               "elapsed_s": round(time.monotonic() - t_start, 1), "partial_epoch": stop, "skipped_batches": skipped}
        history.append(rec)
        log.info("epoch %d: %s", epoch + 1, json.dumps(rec))
        if progress is not None:
            progress(rec)
        save_checkpoint(out / "last.pt", ema.ema, cfg, names, epoch + 1, metrics)
        if metrics["map50"] > best:
            best = metrics["map50"]
            save_checkpoint(out / "best.pt", ema.ema, cfg, names, epoch + 1, metrics)
        (out / "history.json").write_text(json.dumps(history, indent=1))
        if stop:
            break
        if epoch + 1 < cfg.epochs:  # with or without resume: any interrupted run can be continued
            save_resume(resume_path, model, ema, optimizer, cfg, {
                "epoch": epoch + 1, "last_opt_step": last_opt_step, "best": best, "history": history,
                "images_seen": images_seen, "numpy_rng": rng.bit_generator.state,
                "elapsed_s": time.monotonic() - t_start})
    summary: Dict[str, Any] = {"best_map50": best, "epochs_run": len(history), "images_seen": images_seen,
                               "train_seconds": round(time.monotonic() - t_start, 1), "history": history,
                               "arch": model.arch, "imgsz": cfg.imgsz, "names": names, "skipped_batches": skipped}
    if cfg.export_onnx and (out / "best.pt").exists():
        from edgewise_tools.models.export import export_onnx

        best_model = load_checkpoint(out / "best.pt")
        export_onnx(best_model, out / "best.onnx", imgsz=cfg.imgsz, names=names, arch=model.arch,
                    extra_metadata={"edgewise_val_map50": f"{best:.4f}"})
        summary["onnx"] = str(out / "best.onnx")
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    resume_path.unlink(missing_ok=True)
    return summary
