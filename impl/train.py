"""The one Trainer: data, model and method in, a complete run directory out.

It knows no method by name: a method changes training only through the hooks of
:class:`impl.methods.base.Method` (see that module for the event order).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import random
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from impl import distributed, rundir
from impl.config import TrainConfig, read_config
from impl.data import check_dataset, dataset_dir_for, derived_seed
from impl.memory import TrainingPeak
from impl.messages import first_line
from impl.methods import (
    ENV_VAR,
    Method,
    TrainContext,
    create_method,
    identity_change,
    method_class,
    method_identity,
)
from impl.methods.masking import conv_weight_counts
from impl.out_dir import check_out_dir
from impl.run_files import holds_run
from impl.schedules import lr_multiplier
from impl.timing import PhaseTimer, synchronize

log = logging.getLogger(__name__)


class RunExistsError(FileExistsError):
    """The output directory already holds a run (resume it, or choose another directory)."""


class TrainingDiverged(RuntimeError):
    """Training stopped because an epoch left non-finite weights or buffers, or no finite
    loss. ``record`` is what the run directory's ``summary.json`` holds of it
    (``"status": "diverged"``, :func:`impl.rundir.diverged_summary`); the message says in
    which epoch, why, what was kept and what to do."""

    #: Every rank of a job finds it at the same step (from all-reduced figures): a
    #: distributed worker reports it once, from rank 0 (:func:`impl.distributed.run_worker`).
    same_on_every_rank = True

    def __init__(self, run_dir: Path, record: dict[str, Any]) -> None:
        self.run_dir = Path(run_dir)
        self.record = record
        epoch = int(record.get("diverged_epoch", 0))
        kept = (
            f"the checkpoint of epoch {epoch} in {self.run_dir} is its last finite state"
            if epoch
            else "no epoch had finished"
        )
        lr, peak = record.get("lr"), record.get("peak_lr")
        lr_text = f"learning rate {lr:.4g} at its last step" if lr is not None else "no step"
        peak_text = f" (this run's peak was {peak:g})" if peak is not None else ""
        super().__init__(
            f"training diverged in epoch {epoch + 1} of {record.get('epochs')} (found at its "
            f"end, step {record.get('found_at_step')}; {lr_text}): {record.get('reason')}; "
            f"{kept}. Train again with a lower --lr{peak_text} into another --out, or remove "
            f"{self.run_dir} to train it again"
        )


def nonfinite_state(model: nn.Module, limit: int = 3) -> list[str]:
    """Names of up to ``limit`` floating-point parameters or buffers of ``model`` (its
    ``state_dict``, batch-norm statistics included) holding a NaN or an infinity; empty when
    every value is finite. One device synchronisation, whatever the model's size."""
    tensors = {k: v for k, v in model.state_dict().items() if v.is_floating_point()}
    if not tensors:
        return []
    finite = torch.stack([torch.isfinite(v).all() for v in tensors.values()])
    if bool(finite.all()):
        return []
    return [k for k, ok in zip(tensors, finite.tolist(), strict=True) if not ok][:limit]


def divergence_reason(model: nn.Module, row: dict[str, Any]) -> str | None:
    """Why the epoch that produced ``row`` (a ``metrics.jsonl`` row, before evaluation) has
    diverged, or ``None``: a parameter or buffer of ``model`` is non-finite (an SGD step
    took a NaN or infinite gradient), or no step of the epoch had a finite loss (under fp16
    the gradient scaler skips such steps, so the weights stay finite while nothing trains).
    A few non-finite losses under fp16, whose steps were skipped, are not a divergence."""
    names = nonfinite_state(model)
    steps = int(row.get("iterations", 0))
    bad_steps = int(row.get("nonfinite_loss_steps", 0))
    if names:
        more = f" ({bad_steps} of {steps} steps had a non-finite loss)" if bad_steps else ""
        return f"non-finite values in {', '.join(names)}{more}"
    if steps and bad_steps == steps:
        return f"every one of the epoch's {steps} steps had a non-finite loss"
    return None


def check_scale_device(scale: str, device: str = "auto") -> None:
    """Refuse the ``gpu`` and ``paper`` scales where the work would not run on a CUDA GPU
    (``device`` as ``--device`` gives it, :func:`pick_device`): its timings and results would
    carry that scale's name beside the papers' GPU numbers, for a CPU run. Raises
    ``ValueError`` saying so."""
    if scale not in ("gpu", "paper") or pick_device(device).type == "cuda":
        return
    why = (
        f"torch sees none here (torch {torch.__version__})"
        if device == "auto"
        else f"--device {device} is not one"
    )
    raise ValueError(
        f"--scale {scale} times and trains on a CUDA GPU and {why}; on this machine use --scale cpu"
    )


def pick_device(name: str) -> torch.device:
    """``"auto"`` -> CUDA when available, else CPU; anything else as given.

    Raises:
        ValueError: ``name`` is not a torch device, or names a CUDA device this torch build
            and machine do not have (the message says how many there are).
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as err:
        raise ValueError(f"--device {name!r} is not a device (cpu, cuda, cuda:N, auto)") from err
    if device.type == "cuda":
        if not torch.cuda.is_available():
            build = "has no CUDA" if torch.version.cuda is None else "sees no CUDA GPU here"
            raise ValueError(
                f"--device {name!r}: this torch {torch.__version__} {build}; "
                "use --device cpu or auto"
            )
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise ValueError(f"--device {name!r}: this machine has {count} CUDA device(s)")
    return device


def refuse_folder_of_runs(run_dir: Path, flag: str = "--out") -> None:
    """Raise ValueError for a new run's directory that already holds other runs (a folder
    below it with a ``config.json`` or ``summary.json``, as ``runs/``): the run's files would
    sit among them, and the folder would read as one run holding the others. Looks one
    level down only."""
    if not run_dir.is_dir():
        return
    for child in sorted(run_dir.iterdir()):
        if child.is_dir() and holds_run(child):
            raise ValueError(
                f"{flag} {run_dir} holds other runs ({child.name}, ...): give this run a "
                f"directory of its own, e.g. {run_dir / 'NAME'}, or leave {flag} out for a "
                "name made from the config"
            )


def refuse_existing_run(run_dir: Path, check_lock: bool = True) -> None:
    """Raise for a new run's ``--out`` that already holds a run (its ``config.json``):
    :class:`RunExistsError` saying whether it finished, diverged or can be resumed, or, with
    ``check_lock``, :class:`impl.rundir.RunBusyError` while another process trains it."""
    if rundir.complete_summary(run_dir) is not None:
        raise RunExistsError(
            f"{run_dir} already holds a finished run (its summary.json); choose another --out"
        )
    diverged = rundir.diverged_summary(run_dir)
    if diverged is not None:
        raise RunExistsError(
            f"{run_dir} already holds a run that diverged in epoch "
            f"{int(diverged.get('diverged_epoch', 0)) + 1} (its summary.json); "
            f"choose another --out, or remove {run_dir} to train it again"
        )
    try:  # another program's config.json is no run to continue (nor to lock)
        read_config(run_dir / rundir.CONFIG_FILE)
    except (OSError, ValueError) as err:
        raise RunExistsError(f"{err}; choose another --out") from None
    if check_lock:  # RunBusyError while another process trains it: not "resume it"
        with rundir.locked(run_dir):
            pass
    raise RunExistsError(
        f"{run_dir} already holds a run; continue it with "
        f"`pdtbench train --resume {run_dir}` or choose another --out"
    )


def check_before_workers(
    cfg: TrainConfig | None = None,
    resume_dir: str | os.PathLike | None = None,
    data_dir: str | None = None,
) -> None:
    """What each worker of a ``--nproc N`` job would refuse, refused once by the process that
    launches them, before torchrun starts any (one line instead of N tracebacks): a new run
    ``cfg`` whose ``--out`` cannot be written or already holds a run, or whose dataset is
    missing; a ``resume_dir`` that is not a run, diverged, is being trained, or whose dataset
    (moved to ``data_dir``, if given) is missing. Raises as :func:`train` and :func:`resume`
    would."""
    if resume_dir is not None:
        run_dir = Path(resume_dir)
        if finished_summary_to_resume(run_dir) is not None:
            return  # resume returns its summary
        with rundir.locked(run_dir):
            pass
        saved = read_config(run_dir / rundir.CONFIG_FILE)
        check_dataset(saved.data, dataset_dir_for(data_dir, saved.data) or saved.data_dir)
        return
    if cfg is None:
        raise ValueError("check_before_workers needs a config or a run directory to resume")
    run_dir = Path(cfg.out or cfg.default_out())
    if (run_dir / rundir.CONFIG_FILE).exists():
        refuse_existing_run(run_dir)
    check_out_dir(run_dir)
    refuse_folder_of_runs(run_dir)
    check_dataset(cfg.data, cfg.data_dir)


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (CPU and every GPU) from one integer."""
    random.seed(seed)
    np.random.seed(seed % 2**32)  # noqa: NPY002 (seeds third-party global-state users)
    torch.manual_seed(seed)


def python_rng_states() -> dict[str, Any]:
    """The states of Python's and NumPy's global generators, which :func:`seed_everything`
    seeds, in types a ``weights_only`` checkpoint holds (a method drawing from them goes on
    where it was after a resumption, :func:`restore_python_rngs`)."""
    name, keys, pos, has_gauss, gauss = np.random.get_state()  # noqa: NPY002
    return {
        "python": random.getstate(),
        "numpy": {"name": str(name), "keys": torch.from_numpy(np.asarray(keys, np.int64)),
                  "pos": int(pos), "has_gauss": int(has_gauss), "gauss": float(gauss)},
    }  # fmt: skip


def restore_python_rngs(states: dict[str, Any] | None) -> None:
    """Set Python's and NumPy's global generators to :func:`python_rng_states`' ``states``
    (nothing for ``None``: a checkpoint written before they were kept)."""
    if not states:
        return
    version, internal, gauss_next = states["python"]
    random.setstate((version, tuple(internal), gauss_next))
    n = states["numpy"]
    keys = n["keys"].numpy().astype(np.uint32)
    np.random.set_state((n["name"], keys, n["pos"], n["has_gauss"], n["gauss"]))  # noqa: NPY002


def rank_rng_seed(seed: int, epoch: int, rank: int) -> int:
    """The seed of torch's global generators for ``rank``'s epoch ``epoch`` in a run of
    several processes.

    Every rank starts from the run's seed (the model is built alike everywhere), so what
    draws from the global generators in training, dropout above all, would draw the same
    numbers on every rank: sample i of each rank's share would get one dropout mask, draws
    one process never makes. Seeded per rank and epoch, the ranks draw independently, and a
    run resumed at an epoch's start draws what an uninterrupted one does (the checkpoint holds
    rank 0's generator only). One process keeps the generator seeded once."""
    return derived_seed(seed, epoch, rank, 0x52A4)


def gradient_bytes(model: nn.Module) -> int:
    """Bytes of the gradients a data-parallel step all-reduces for a dense model."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def resolve_memory_format(
    memory_format: str, method: Method | type[Method], device: torch.device
) -> str:
    """The layout a run trains in: ``TrainConfig.memory_format`` as given, or for "auto"
    "channels_last" on a CPU when ``method`` (a method or its class) gains from it
    (``Method.channels_last_on_cpu``) and "contiguous" otherwise (on a GPU too: unmeasured
    there)."""
    if memory_format != "auto":
        return memory_format
    on_cpu = device.type == "cpu"
    return "channels_last" if on_cpu and method.channels_last_on_cpu else "contiguous"


def apply_memory_format(model: nn.Module, memory_format: str) -> bool:
    """Lay out every 4-D parameter and buffer of ``model`` in ``memory_format``
    (``TrainConfig.memory_format``: "contiguous" or "channels_last"), in place: the same
    ``Parameter`` objects, so an optimizer built on them stays valid. Returns whether any
    tensor had to move. A method that rebuilds layers (PruneTrain's reconfiguration) makes
    them NCHW; the trainer calls this again after every epoch."""
    fmt = {"contiguous": torch.contiguous_format, "channels_last": torch.channels_last}.get(
        memory_format
    )
    if fmt is None:
        raise ValueError(f"unknown memory_format {memory_format!r}")
    tensors = [*model.parameters(), *model.buffers()]
    if all(t.dim() != 4 or t.is_contiguous(memory_format=fmt) for t in tensors):
        return False
    model.to(memory_format=fmt)
    return True


def check_input_fits(model: nn.Module, cfg: TrainConfig, spec: Any) -> None:
    """Refuse, before a run directory is written, a model that cannot take the dataset's
    images (ffcv's ResNet-9, for one, needs 11 px or more): one forward pass of one image of
    zeros through ``model`` (just built, on the CPU) in eval mode without gradients, which
    changes no parameter, no running statistic and no random state. A meta-device pass would
    hold no memory, but its first use loads torch's meta kernels and decompositions: about 2 s
    of every training process, more than this pass costs for any model here.

    Raises:
        ValueError: the model's forward pass fails at ``spec``'s image size.
    """
    size = (1, spec.in_channels, spec.image_size, spec.image_size)
    param = next(model.parameters(), None)
    training = model.training
    try:
        with torch.no_grad():
            model.eval()(torch.zeros(size, dtype=param.dtype if param is not None else None))
    except RuntimeError as err:
        raise ValueError(
            f"model {cfg.model!r} cannot take {spec.image_size}x{spec.image_size} images "
            f"of {cfg.data!r} ({first_line(err)}); choose a larger --image-size "
            "or another --model"
        ) from None
    finally:
        model.train(training)


def autocast_dtype(cfg: TrainConfig | Any) -> torch.dtype | None:
    """The dtype forward and backward autocast to: bfloat16 (``bf16``), float16 (``fp16``),
    or ``None`` (float32 throughout). A config without the fields (a method driven outside
    the Trainer) means float32."""
    if getattr(cfg, "bf16", False):
        return torch.bfloat16
    return torch.float16 if getattr(cfg, "fp16", False) else None


def step_overflowed(scaler: torch.amp.GradScaler, optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``scaler.step(optimizer)`` will skip this step: after ``scaler.unscale_``, the
    inf/NaN flags the scaler found in the gradients (its own record, read as its ``step``
    reads it, so the two always agree; one host sync, no kernel)."""
    found = scaler._found_inf_per_device(optimizer)
    return bool(sum(float(v.item()) for v in found.values()))


def epoch_step_cost(start: float, points: Sequence[tuple[int, float]], steps: int) -> float:
    """Per-sample training FLOPs of an epoch of ``steps`` steps: the first step (step 0) at
    ``start``, the model's cost as the epoch began; steps 1 to ``steps - 1`` at the polynomial
    through ``points`` (``(step, cost at that step's start)``, up to four: the Trainer samples
    step 1, the middle one, or the two middle ones of an odd count, and the last), averaged
    over exactly those steps; no point: all at ``start``.

    Exact for a cost that changes once, on the first step (Campfire's per-epoch target) or not
    within the epoch (dense, SDGP, PruneTrain and ClickTrain, which change between epochs),
    and for one that changes step by step along a cubic (Campfire's per-step ramp; three
    points, a quadratic, left 0.24% of an era epoch of 45 steps, and a trapezoid over the
    epoch's two ends 5%). A cost that changes in jumps within the epoch (masks updated every
    few steps) is approximated by the cubic. The mean of ``start`` and the end alone counted
    half of a per-epoch Campfire epoch at the previous epoch's density, understating its
    saving."""
    if steps <= 1:
        return float(start)
    pts = sorted(dict(points).items())
    if not pts:
        return float(start)
    if len({c for _, c in pts}) == 1:  # no change after the first step: exact, no rounding
        return (start + (steps - 1) * pts[0][1]) / steps
    xs = [float(x) for x, _ in pts]
    total = 0.0
    for k in range(1, steps):  # Lagrange form of the polynomial through the points
        for a, (xa, (_, ya)) in enumerate(zip(xs, pts, strict=True)):
            basis = 1.0
            for b, xb in enumerate(xs):
                if b != a:
                    basis *= (k - xb) / (xa - xb)
            total += ya * basis
    return (start + total) / steps


def parameter_groups(
    model: nn.Module, weight_decay: float, bn_weight_decay: bool = True
) -> list[dict[str, Any]]:
    """The optimizer's parameter groups: one with ``weight_decay`` for every parameter, or,
    without ``bn_weight_decay``, BatchNorm weights and biases in a second group without it (as
    the SDGP authors' ImageNet script). Groups keep the order of ``model.parameters()``."""
    if bn_weight_decay:
        return [{"params": list(model.parameters()), "weight_decay": weight_decay}]
    norm = {
        id(p)
        for m in model.modules()
        if isinstance(m, nn.modules.batchnorm._NormBase)
        for p in m.parameters(recurse=False)
    }
    params = list(model.parameters())
    return [
        {"params": [p for p in params if id(p) not in norm], "weight_decay": weight_decay},
        {"params": [p for p in params if id(p) in norm], "weight_decay": 0.0},
    ]


@torch.no_grad()
def evaluate(
    model: nn.Module,
    loader: Any,
    device: torch.device,
    dp: Any = None,
    flip: bool = False,
) -> tuple[float, float]:
    """(mean cross-entropy, top-1 accuracy in %) of ``model`` over ``loader``.

    With ``dp`` (a :class:`impl.distributed.DataParallel` of several processes) each rank
    scores its share of every batch (the loader's, when it delivers shares:
    :meth:`impl.data.Loader.set_shard`) and the sums are all-reduced. With ``flip`` an image
    is scored by the sum of the logits of it and of its horizontal mirror (test-time flip
    averaging, ffcv's ``lr_tta``); the loss is that of the summed logits.
    """
    was_training = model.training
    model.eval()
    loss_sum = 0.0
    correct = count = 0
    for x, y in loader:
        if dp is not None and not getattr(loader, "sharded", False):
            x, y = distributed.shard(x, y, dp.info)
        out = model(x)
        if flip:
            out = out + model(x.flip(-1))
        loss_sum += float(F.cross_entropy(out.float(), y, reduction="sum"))
        correct += int((out.argmax(1) == y).sum())
        count += y.numel()
    if dp is not None:
        loss_sum, correct, count = dp.reduce([loss_sum, correct, count])
    model.train(was_training)
    return loss_sum / max(count, 1), 100.0 * correct / max(count, 1)


@contextlib.contextmanager
def _backend_flags(cudnn_benchmark: bool, tf32: bool) -> Iterator[None]:
    """``torch.backends.cudnn.benchmark`` (TrainConfig.cudnn_benchmark) and TF32 for float32
    matmuls and cuDNN convolutions (TrainConfig.tf32) for a run, the caller's settings
    restored after it."""
    flags = (torch.backends.cudnn, "benchmark"), (torch.backends.cudnn, "allow_tf32")
    flags += ((torch.backends.cuda.matmul, "allow_tf32"),)
    before = [getattr(obj, name) for obj, name in flags]
    for (obj, name), on in zip(flags, (cudnn_benchmark, tf32, tf32)):
        setattr(obj, name, on)
    try:
        yield
    finally:
        for (obj, name), value in zip(flags, before):
            setattr(obj, name, value)


class Trainer:
    """Trains one config into one run directory, resumably."""

    def __init__(self, cfg: TrainConfig, *, progress: bool = True) -> None:
        cfg.validate()
        if cfg.out is None:
            cfg.out = cfg.default_out()
        self.cfg = cfg
        self.run_dir = Path(cfg.out)
        self.dist = distributed.current()  # several processes when a process group is up
        self.progress = progress and self.dist.is_main
        self.device = distributed.rank_device(pick_device(cfg.device), self.dist)
        if self.device.type == "cuda" and self.device.index is not None:
            torch.cuda.set_device(self.device)
        self.memory_format = cfg.memory_format  # "auto" resolved once the method is built

    # ------------------------------------------------------------------------------------------
    def _build(self) -> tuple[TrainContext, Method, Any, Any, Any]:
        from impl.data import make_loaders
        from impl.models import create

        cfg = self.cfg
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        seed_everything(cfg.seed)
        method = create_method(cfg.method, cfg.method_options)
        method.validate(cfg)
        train_loader, test_loader, spec = make_loaders(
            cfg.data,
            cfg.batch_size,
            data_dir=cfg.data_dir,
            seed=cfg.seed,
            augment=cfg.augment,
            augment_recipe=cfg.augment_recipe,
            device=self.device,
            eval_batch_size=cfg.eval_batch_size,
            **cfg.data_options,
        )
        model = create(
            cfg.model, num_classes=spec.num_classes, in_channels=spec.in_channels, stem=cfg.stem
        )
        check_input_fits(model, cfg, spec)
        model = model.to(self.device)
        ctx = TrainContext(
            model=model,
            optimizer=None,
            config=cfg,
            device=self.device,
            batch_size=cfg.batch_size,
            input_shape=(spec.in_channels, spec.image_size, spec.image_size),
            progress=self.progress,
        )
        ctx.extra["seed"] = cfg.seed
        return ctx, method, train_loader, test_loader, spec

    def _optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        cfg = self.cfg
        return torch.optim.SGD(
            parameter_groups(model, cfg.weight_decay, cfg.bn_weight_decay),
            lr=cfg.lr,
            momentum=cfg.momentum,
            nesterov=cfg.nesterov and cfg.momentum > 0,
            weight_decay=cfg.weight_decay,
        )

    def _set_lr(self, ctx: TrainContext, epoch_progress: float) -> float:
        cfg = self.cfg
        mult = lr_multiplier(
            cfg.schedule,
            epoch_progress,
            cfg.epochs,
            warmup_fraction=cfg.warmup_fraction,
            milestones=cfg.milestones,
            gamma=cfg.gamma,
            warmup_start=cfg.warmup_start,
        )
        # Linear scaling with the batch when a method (dynamic mini-batch) changes it.
        lr = cfg.lr * mult * ctx.batch_size / cfg.batch_size
        assert ctx.optimizer is not None
        for group in ctx.optimizer.param_groups:
            group["lr"] = lr
        return lr

    # ------------------------------------------------------------------------------------------
    def run(self, resume: bool = False) -> dict[str, Any]:
        """Train to the end (or continue a killed run when ``resume``) and return the summary.

        The main process holds the run directory's lock (:func:`impl.rundir.locked`) from
        before it writes anything until it returns, so a second process training into the
        same directory is refused (:class:`impl.rundir.RunBusyError`).
        """
        with contextlib.ExitStack() as held:
            held.enter_context(_backend_flags(self.cfg.cudnn_benchmark, self.cfg.tf32))
            return self._run(resume, held)

    def _run(self, resume: bool, held: contextlib.ExitStack) -> dict[str, Any]:
        cfg = self.cfg
        run_dir = self.run_dir
        config_path = run_dir / rundir.CONFIG_FILE
        dp = distributed.DataParallel(self.dist, self.device)
        main = dp.is_main  # only rank 0 writes the run directory
        if resume:
            if main:
                held.enter_context(rundir.locked(run_dir))
            saved = read_config(config_path)
            if saved.digest() != cfg.digest():
                raise rundir.CheckpointError(f"{config_path} does not match the run's config")
        else:
            # A bad method option is an error before anything is written.
            create_method(cfg.method, cfg.method_options).validate(cfg)
            if dp.broadcast_flag(main and config_path.exists()):
                refuse_existing_run(run_dir, check_lock=main)
            if main:
                check_out_dir(run_dir)
                refuse_folder_of_runs(run_dir)
        # Data, model and method are built before anything is written, so a bad dataset
        # directory or image size leaves no run directory behind to block the next try.
        ctx, method, train_loader, test_loader, spec = self._build()
        if not resume and main:
            run_dir.mkdir(parents=True, exist_ok=True)
            held.enter_context(rundir.locked(run_dir))
            if config_path.exists():  # another process got here first
                raise RunExistsError(f"{run_dir} already holds a run (started meanwhile)")
            rundir.write_json(config_path, cfg.to_dict())
        method.setup(ctx)
        dense_conv_total, _ = conv_weight_counts(ctx.model)
        start_epoch = 0
        state = rundir.load_checkpoint(run_dir, cfg.digest()) if resume else None
        if state is not None and "method_class" in state:
            why = identity_change(state, cfg.method)
            if why is not None:
                raise rundir.StaleRunError(run_dir, why)
        if state is not None:
            method.load_state_dict(state["method"], ctx)
            ctx.model.load_state_dict(state["model"])
        self.memory_format = resolve_memory_format(cfg.memory_format, method, self.device)
        apply_memory_format(ctx.model, self.memory_format)
        ctx.optimizer = self._optimizer(ctx.model)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=cfg.fp16)
        wall_before = 0.0
        if state is not None:
            ctx.optimizer.load_state_dict(state["optimizer"])
            if cfg.fp16 and state.get("grad_scaler"):
                self.scaler.load_state_dict(state["grad_scaler"])
            torch.set_rng_state(state["rng_cpu"])
            restore_cuda_rng(state.get("rng_cuda"), self.device)
            restore_python_rngs(state.get("rng_python"))
            ctx.last_loss = float(state.get("last_loss", float("nan")))
            start_epoch = int(state["epoch"])
            ctx.step = int(state["step"])
            ctx.batch_size = int(state["batch_size"])
            ctx.extra.update(state.get("ctx_extra", {}))
            wall_before = float(state["wall_seconds"])
            dense_conv_total = int(state["dense_conv_total"])
            threads = state.get("torch_threads")
            if threads and threads != torch.get_num_threads():
                # CPU kernels split their sums by thread: the same steps under another count
                # give other bits, so a resumed run would not equal the uninterrupted one
                if main:
                    print(
                        f"resuming with {threads} torch threads, as the run began (not "
                        f"{torch.get_num_threads()}): its results depend on the count",
                        file=sys.stderr,
                    )
                held.callback(torch.set_num_threads, torch.get_num_threads())  # after the run
                torch.set_num_threads(int(threads))
        if resume and main:
            rundir.truncate_metrics(run_dir, start_epoch)
        dp.prepare(ctx, method)
        if dp.active:  # each rank loads only its share of every global batch
            for loader in (train_loader, test_loader):
                loader.set_shard(dp.info.rank, dp.info.world_size)

        wall = wall_before
        last_row: dict[str, Any] = {}
        # peak memory of the training steps, carried over a resumption
        peak = TrainingPeak(self.device, int(state.get("peak_gpu_memory_bytes", 0)) if state else 0)
        for epoch in range(start_epoch, cfg.epochs):
            t_epoch = time.perf_counter()
            if dp.active:  # independent draws per rank (dropout), reproducible on resume
                torch.manual_seed(rank_rng_seed(cfg.seed, epoch, dp.info.rank))
            row = self._train_epoch(ctx, method, train_loader, epoch, dp, peak)
            why = divergence_reason(ctx.model, row)
            if why is not None:  # nothing of this epoch is kept: the checkpoint stays finite
                record = self._divergence_record(ctx, method, epoch, row, why)
                if main:
                    rundir.write_json(run_dir / rundir.SUMMARY_FILE, record)
                dp.barrier()  # no rank ends the job before rank 0 has kept the record
                raise TrainingDiverged(run_dir, record)
            t_eval = time.perf_counter()
            test_loss, top1 = evaluate(
                ctx.model,
                test_loader,
                self.device,
                dp if dp.active else None,
                flip=self.cfg.eval_flip,
            )
            now = time.perf_counter()
            eval_seconds = now - t_eval
            epoch_seconds = now - t_epoch
            wall += epoch_seconds
            row.update(
                epoch=epoch,
                test_loss=test_loss,
                test_top1=top1,
                epoch_seconds=epoch_seconds,
                eval_seconds=eval_seconds,
                wall_seconds=wall,
            )
            row.update(method.epoch_metrics(ctx))
            last_row = row
            if not main:
                continue
            rundir.append_metrics(run_dir, row)
            if self.progress:  # a line per epoch, kept; on a terminal the epoch's bar is gone
                print(
                    f"epoch {epoch + 1}/{cfg.epochs}: train loss {row['train_loss']:.4f}, "
                    f"test top-1 {top1:.2f}%, {epoch_seconds:.1f} s",
                    file=sys.stderr,
                    flush=True,
                )
            rundir.save_checkpoint(
                run_dir,
                {
                    "epoch": epoch + 1,
                    "step": ctx.step,
                    "batch_size": ctx.batch_size,
                    "model": ctx.model.state_dict(),
                    "optimizer": ctx.optimizer.state_dict(),
                    "grad_scaler": self.scaler.state_dict() if cfg.fp16 else None,
                    "method": method.state_dict(),
                    **method_identity(type(method)),
                    "rng_cpu": torch.get_rng_state(),
                    "rng_cuda": cuda_rng_state(self.device),
                    "rng_python": python_rng_states(),
                    "last_loss": ctx.last_loss,
                    "ctx_extra": {k: v for k, v in ctx.extra.items() if _plain(v)},
                    "wall_seconds": wall,
                    "dense_conv_total": dense_conv_total,
                    "peak_gpu_memory_bytes": peak.bytes,
                    "torch_threads": torch.get_num_threads(),
                },
                cfg.digest(),
            )
        if not last_row:
            rows = rundir.read_metrics(run_dir)
            last_row = rows[-1] if rows else {}
        dp.release(ctx)
        summary = self._summary(ctx, method, spec, last_row, wall, dense_conv_total, peak)
        summary.update(dp.summary(last_row, ctx))
        if main:
            rundir.write_json(run_dir / rundir.SUMMARY_FILE, summary)
        return summary

    def _train_epoch(
        self,
        ctx: TrainContext,
        method: Method,
        loader: Any,
        epoch: int,
        dp: Any,
        peak: TrainingPeak,
    ) -> dict[str, Any]:
        cfg = self.cfg
        ctx.epoch = epoch
        if getattr(loader, "batch_size", ctx.batch_size) != ctx.batch_size:
            loader.batch_size = ctx.batch_size
        epoch_batch = ctx.batch_size  # the batch these steps use: on_epoch_end may change it
        loader.set_epoch(epoch)
        steps = len(loader)
        if cfg.max_steps_per_epoch:
            steps = min(steps, cfg.max_steps_per_epoch)
        ctx.steps_per_epoch = steps
        method.on_epoch_start(ctx)
        cost_start = _step_cost(ctx, method)
        model = dp.module(ctx)
        model.train()
        timer = PhaseTimer(self.device)
        amp_dtype = autocast_dtype(cfg)
        scaler = self.scaler
        skipped = 0
        losses: list[torch.Tensor] = []
        correct = torch.zeros((), dtype=torch.long, device=self.device)
        seen = 0
        lr = float("nan")
        bar = _progress(steps, f"epoch {epoch + 1}/{cfg.epochs}", self.progress)
        peak.open()
        synchronize(self.device)  # the clock starts with nothing of before still running
        t0 = time.perf_counter()
        # the cost at the start of steps 1, the middle one of steps 1 to steps - 1 (the middle
        # two where that count is even, i.e. steps odd), and the last: a cubic through them is
        # exact either way (with one middle point the rule is Simpson's; epoch_step_cost)
        sampled = sorted({1, steps // 2, (steps + 1) // 2, steps - 1} - {0}) if steps > 1 else []
        costs: list[tuple[int, tuple[float, float]]] = []
        for i, (x, y) in enumerate(loader):
            if i >= steps:
                break
            if i in sampled:
                # after the first step a method's masks may change (Campfire's per-epoch
                # target); they may change every step (its per-step ramp): the cost is read
                # at the sampled steps, and reading it is not training time (the steps before
                # finish first: their queued GPU work is training time)
                synchronize(self.device)
                t_cost = time.perf_counter()
                costs.append((i, _step_cost(ctx, method)))
                t0 += time.perf_counter() - t_cost
            lr = self._set_lr(ctx, epoch + i / steps)
            # This rank's share of the global batch (the loader's own share when sharded).
            sharded = getattr(loader, "sharded", False)
            x, y = dp.shard(x, y, loader.global_batch_size(i) if sharded else None)
            timer.start("fwd")
            with torch.autocast(
                self.device.type, dtype=amp_dtype or torch.bfloat16, enabled=amp_dtype is not None
            ):
                out = model(x)
                local = F.cross_entropy(out.float(), y, label_smoothing=cfg.label_smoothing)
                loss = dp.global_loss(local, out)
                total = dp.backward_loss(method.loss(ctx, loss, out, y), local)
            timer.stop("fwd")
            ctx.optimizer.zero_grad(set_to_none=True)
            timer.start("bwd")
            scaler.scale(total).backward()  # the loss itself when fp16 is off
            timer.stop("bwd")
            # No autograd graph outlives backward: when a method reshapes parameters the DDP
            # wrapper is rebuilt, and that needs the old gradient accumulators gone.
            out, loss = out.detach(), loss.detach()
            del total, local
            # the rest of the iteration: the method's per-step work (masks, mask updates), the
            # optimizer step and the communication tally, a training cost like fwd and bwd
            timer.start("step")
            # (a disabled GradScaler, fp16 off, steps the optimizer as it is and updates nothing)
            unscaled = ctx.optimizer
            if scaler.is_enabled():
                scaler.unscale_(unscaled)
            if scaler.is_enabled() and step_overflowed(scaler, unscaled):
                skipped += 1  # GradScaler skips the step and halves its scale
            else:
                method.after_backward(ctx)
                if scaler.is_enabled() and ctx.optimizer is not unscaled:
                    raise RuntimeError(
                        f"{type(method).__name__}.after_backward replaced the optimizer; "
                        "under fp16 a method may do so in on_epoch_end only (the new one's "
                        "gradients were never unscaled)"
                    )
            scaler.step(ctx.optimizer)
            scaler.update()
            method.after_step(ctx)
            dp.end_iteration(ctx)
            dp.refresh(ctx, method)
            timer.stop("step")
            ctx.step += 1
            losses.append(loss.detach())
            correct += (out.detach().argmax(1) == y).sum()
            seen += y.numel()
            if bar is not None and (i % 5 == 0 or i == steps - 1):
                rate = seen / max(time.perf_counter() - t0, 1e-9)
                bar.set_postfix(loss=f"{loss.item():.3f}", img_s=f"{rate:.0f}")
            if bar is not None:
                bar.update(1)
            model = dp.module(ctx)  # a method may have replaced it
        synchronize(self.device)  # the last steps' queued GPU work is training time
        train_seconds = time.perf_counter() - t0
        epoch_peak = peak.close()  # before on_epoch_end, which may probe (and reset) memory
        if bar is not None:
            bar.close()
        # the mean over the steps whose loss was finite (a step skipped under fp16 for an
        # overflow in the forward pass is counted apart); NaN when none was
        stacked = torch.stack(losses) if losses else torch.zeros(0)
        finite = torch.isfinite(stacked)
        nonfinite_steps = int((~finite).sum())
        train_loss = (
            float(stacked[finite].mean()) if nonfinite_steps < len(losses) else float("nan")
        )
        correct, seen = dp.reduce([int(correct), seen])
        ctx.extra["epoch_samples"] = int(seen)  # every rank's samples this epoch
        ctx.last_loss = train_loss
        fwd = timer.times("fwd")
        bwd = timer.times("bwd")
        step_times = timer.times("step")
        whole = [f + b + t for f, b, t in zip(fwd, bwd, step_times, strict=True)]
        ctx.extra["epoch_fwd_ms"] = _median(fwd)
        ctx.extra["epoch_bwd_ms"] = _median(bwd)
        ctx.extra["epoch_train_loss"] = train_loss
        ran = len(fwd)
        if ran > 1 and (not costs or costs[-1][0] < ran - 1):  # the loader ended early
            costs.append((ran, _step_cost(ctx, method)))  # the cost after its last step
        method.on_epoch_end(ctx)
        # one batch size for the job: a method that sizes it by the memory it measures
        # (PruneTrain on a GPU) may read other bytes on each rank
        ctx.batch_size = dp.broadcast_int(ctx.batch_size)
        apply_memory_format(ctx.model, self.memory_format)  # layers a method rebuilt
        dp.refresh(ctx, method)
        comm_row = dp.epoch_metrics(ctx)
        if scaler.is_enabled():
            comm_row |= {"amp_skipped_steps": skipped, "amp_loss_scale": float(scaler.get_scale())}
        return comm_row | {
            "train_loss": train_loss,
            "nonfinite_loss_steps": nonfinite_steps,
            "train_top1": 100.0 * int(correct) / max(seen, 1),
            "lr": lr,
            "batch_size": epoch_batch,
            "iterations": len(fwd),
            "fwd_ms": _median(fwd),
            "bwd_ms": _median(bwd),
            "step_ms": _median(step_times),
            # median over iterations of forward + backward + step: the whole iteration
            "iter_ms": _median(whole),
            "train_seconds": train_seconds,
            "samples_per_second": seen / max(train_seconds, 1e-9),
            # Per-sample cost of this epoch's training steps (before on_epoch_end reconfigures
            # anything): the first step at the cost as the epoch began, the others along the
            # costs read at three or four of them (epoch_step_cost).
            "train_flops_nominal": epoch_step_cost(
                cost_start[0], [(k, c[0]) for k, c in costs], len(fwd)
            ),
            "train_flops_executed": epoch_step_cost(
                cost_start[1], [(k, c[1]) for k, c in costs], len(fwd)
            ),
            # peak GPU memory allocated by tensors during this epoch's steps (None on the CPU)
            "peak_gpu_memory_mib": None if epoch_peak is None else epoch_peak / 2**20,
        }

    def _divergence_record(
        self, ctx: TrainContext, method: Method, epoch: int, row: dict[str, Any], why: str
    ) -> dict[str, Any]:
        """``summary.json`` of a run that diverged in ``epoch`` (0-based, as in
        ``metrics.jsonl``): what it was, where it stopped and why (:class:`TrainingDiverged`)."""
        cfg = self.cfg
        return {
            **self._summary_head("diverged", method),
            "diverged_epoch": epoch,
            # the run's step count where the divergence was found: the epoch's end (the
            # weights are checked once an epoch, not at every step)
            "found_at_step": ctx.step,
            "lr": _finite_or_none(row.get("lr")),
            "peak_lr": cfg.lr,
            "train_loss": _finite_or_none(row.get("train_loss")),
            "nonfinite_loss_steps": row.get("nonfinite_loss_steps"),
            "iterations": row.get("iterations"),
            "reason": why,
        }

    def _summary_head(self, status: str, method: Method) -> dict[str, Any]:
        """What every ``summary.json`` begins with: its status and version, the method (and
        which code ran under its name: a registered method's name is the user's choice), the
        model, data, scale, seed and epochs."""
        cfg = self.cfg
        return {
            "status": status,
            "summary_version": rundir.SUMMARY_VERSION,
            "method": cfg.method,
            **method_identity(type(method)),
            "model": cfg.model,
            "data": cfg.data,
            "scale": cfg.scale,
            "seed": cfg.seed,
            "epochs": cfg.epochs,
        }

    def _summary(
        self,
        ctx: TrainContext,
        method: Method,
        spec: Any,
        last_row: dict[str, Any],
        wall: float,
        dense_conv_total: int,
        peak: TrainingPeak,
    ) -> dict[str, Any]:
        from impl.env import collect
        from impl.flops import training_flops

        model = ctx.model
        _, nonzero = conv_weight_counts(model)
        flops = training_flops(model, ctx.input_shape, density=method.cost(model))
        metrics = rundir.read_metrics(self.run_dir)
        summary: dict[str, Any] = {
            **self._summary_head("complete", method),
            "method_options": method.config_dict(),
            "data_synthetic": bool(getattr(spec, "synthetic", False)),
            "data_spec": spec.to_dict(),
            "top1": last_row.get("test_top1"),
            "best_top1": max((r["test_top1"] for r in metrics), default=None),
            "compression_ratio": dense_conv_total / max(nonzero, 1),
            "conv_weights_dense": dense_conv_total,
            "conv_weights_nonzero": nonzero,
            "parameters": sum(p.numel() for p in model.parameters()),
            "inference_flops": flops.forward,
            "inference_flops_executed": flops.executed.forward,
            "train_flops_nominal": flops.total,
            "train_flops_executed": flops.executed.total,
            "fwd_ms": last_row.get("fwd_ms"),
            "bwd_ms": last_row.get("bwd_ms"),
            "step_ms": last_row.get("step_ms"),
            "iter_ms": last_row.get("iter_ms"),
            # peak GPU memory allocated by tensors during training steps, over every epoch
            # including those before a resumption (None on the CPU: no allocator statistics)
            "peak_gpu_memory_mib": peak.mib,
            "batch_size": ctx.batch_size,
            "wall_seconds": wall,
            "device": str(self.device),
            "memory_format": self.memory_format,  # TrainConfig's, "auto" resolved
            # the GPU the run trained on, whatever the current one is
            "environment": collect(self.device.index if self.device.type == "cuda" else None),
        }
        summary.update(method.summary(ctx))
        return summary


def _step_cost(ctx: TrainContext, method: Method) -> tuple[float, float]:
    """(nominal, executed) training FLOPs per sample of ``ctx.model`` now (impl.flops, with
    the method's nominal densities)."""
    from impl.flops import training_flops

    report = training_flops(ctx.model, ctx.input_shape, density=method.cost(ctx.model))
    return report.total, report.executed.total


def _finite_or_none(value: Any) -> float | None:
    """``value`` as a float where it is a finite number, else None (JSON has no NaN)."""
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def cuda_rng_state(device: torch.device) -> torch.Tensor | None:
    """The random state of the GPU a run trains on, for its checkpoint (None on a CPU). One
    GPU's state, not every visible GPU's: a run resumed where fewer GPUs are visible (another
    ``CUDA_VISIBLE_DEVICES``, a one-GPU job) restores it all the same."""
    return torch.cuda.get_rng_state(device) if device.type == "cuda" else None


def restore_cuda_rng(saved: Any, device: torch.device) -> None:
    """Restore :func:`cuda_rng_state`'s ``saved`` on the GPU ``device`` the run resumes on.
    A checkpoint written before held one state per visible GPU (a list): the one at the
    resuming GPU's index is taken where it exists, else none (the run resumes, its GPU draws
    then differ from the uninterrupted run's)."""
    if saved is None or device.type != "cuda" or not torch.cuda.is_available():
        return
    if isinstance(saved, (list, tuple)):
        index = torch.cuda.current_device() if device.index is None else device.index
        if index >= len(saved):
            return
        saved = saved[index]
    torch.cuda.set_rng_state(saved, device)


def _plain(value: Any) -> bool:
    return isinstance(value, (int, float, str, bool)) or value is None


def _median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def _progress(total: int, desc: str, enabled: bool) -> Any:
    if not enabled:
        return None
    from tqdm.auto import tqdm

    # disable=None: no bar when stderr is not a terminal (logs, CI), a live bar otherwise.
    bar = tqdm(
        total=total, desc=desc, leave=False, dynamic_ncols=True, mininterval=0.5, disable=None
    )
    # None where it would show nothing: the loop then reads no loss for it (a device sync)
    return None if bar.disable else bar


def check_run_method(run_dir: Path, cfg: TrainConfig) -> None:
    """Check that the method ``run_dir`` was trained with can be built here; else a
    ``ValueError`` that names the class the run recorded (its summary, or its checkpoint for a
    killed run) and how to register it: a plug-in's run read without its registration."""
    try:
        method_class(cfg.method)
    except ValueError as err:
        record: dict[str, Any] | None = rundir.complete_summary(run_dir)
        if record is None:
            try:
                record = rundir.load_checkpoint(run_dir, cfg.digest())
            except rundir.CheckpointError:
                record = None
        target = (record or {}).get("method_class")
        if not target:
            raise
        raise ValueError(
            f"{err}; {run_dir} was trained with {target}: register it, e.g. "
            f"{ENV_VAR}={cfg.method}={target} (docs/new-method.md)"
        ) from err


def train(cfg: TrainConfig, *, progress: bool = True) -> dict[str, Any]:
    """Run ``cfg`` into ``cfg.out`` and return its summary (README, "Run directories")."""
    return Trainer(cfg, progress=progress).run(resume=False)


def finished_summary_to_resume(run_dir: Path) -> dict[str, Any] | None:
    """For ``--resume run_dir``: its summary when the run is complete (resume returns it as
    is; an unreadable one counts as not complete, and the run continues from its
    checkpoint), else None. Raises ``FileNotFoundError`` where ``run_dir`` is not a run and
    :class:`TrainingDiverged` where it diverged (resuming would repeat the same steps from
    the same state)."""
    if not (run_dir / rundir.CONFIG_FILE).exists():
        if not run_dir.exists():
            why = "does not exist"
        elif not run_dir.is_dir():
            why = "is a file, not a directory"
        else:
            why = f"has no {rundir.CONFIG_FILE}"
        raise FileNotFoundError(f"{run_dir} is not a run directory (it {why})")
    summary = rundir.complete_summary(run_dir)
    if summary is not None:
        return summary
    diverged = rundir.diverged_summary(run_dir)
    if diverged is not None:
        raise TrainingDiverged(run_dir, diverged)
    return None


def resume(
    run_dir: str | os.PathLike, *, progress: bool = True, data_dir: str | None = None
) -> dict[str, Any]:
    """Continue the run in ``run_dir`` from its last checkpoint; a complete run is returned as is.
    A run that diverged raises :class:`TrainingDiverged` again (its last checkpoint would
    take the same steps to the same place).

    The result equals that of an uninterrupted run (same weights and metrics on the CPU: the
    run continues with the torch thread count it was checkpointed with).
    ``data_dir``: where the dataset is now, for a run whose data moved (where it is read
    from is not part of the run's identity); saved in its ``config.json`` for later resumes.
    """
    run_dir = Path(run_dir)
    config_path = run_dir / rundir.CONFIG_FILE
    summary = finished_summary_to_resume(run_dir)
    if summary is not None:
        return summary
    cfg = read_config(config_path)
    check_run_method(run_dir, cfg)
    data_dir = dataset_dir_for(data_dir, cfg.data)
    if data_dir is not None and data_dir != cfg.data_dir:
        cfg.data_dir = data_dir
        if distributed.current().is_main:  # only rank 0 writes the run's files
            rundir.write_json(config_path, cfg.to_dict())  # atomic; the digest leaves it out
    cfg.out = str(run_dir)
    return Trainer(cfg, progress=progress).run(resume=True)


def load_trained_model(
    run_dir: str | os.PathLike, device: str | torch.device = "cpu", data_dir: str | None = None
) -> tuple[nn.Module, TrainConfig]:
    """Rebuild a run's model from its config and last checkpoint, in eval mode. ``data_dir``:
    where the run's dataset is now, if it moved (None: the run's own); the returned config
    names it."""
    run_dir = Path(run_dir)
    cfg = read_config(run_dir / rundir.CONFIG_FILE)
    check_run_method(run_dir, cfg)
    digest = cfg.digest()  # of the run as trained, before the device is changed for loading
    cfg.device = str(device)  # a torch.device too
    if data_dir is not None:
        cfg.data_dir = dataset_dir_for(data_dir, cfg.data)  # not part of the digest
    trainer = Trainer(cfg, progress=False)
    ctx, method, _, _, _ = trainer._build()
    method.setup(ctx)
    state = rundir.load_checkpoint(run_dir, digest)
    if state is None:
        raise rundir.CheckpointError(f"{run_dir} has no checkpoint")
    method.load_state_dict(state["method"], ctx)
    ctx.model.load_state_dict(state["model"])
    ctx.model.eval()
    return ctx.model, cfg


__all__ = [
    "RunExistsError",
    "Trainer",
    "TrainingDiverged",
    "apply_memory_format",
    "check_out_dir",
    "refuse_folder_of_runs",
    "check_run_method",
    "conv_weight_counts",
    "divergence_reason",
    "evaluate",
    "load_trained_model",
    "nonfinite_state",
    "resolve_memory_format",
    "resume",
    "train",
]
