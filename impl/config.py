"""Typed run configuration, scale presets, and their JSON form.

A config is data: it is written as JSON and read back field by field, never evaluated.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import numbers
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCALES: tuple[str, ...] = ("smoke", "cpu", "gpu", "paper")
#: One line per scale, for the command lines' help.
SCALE_HELP = (
    "smoke: seconds, for tests; cpu: digits and small models, minutes on 2 cores; gpu: "
    "one GPU, deeper models on digits for longer (and, in the reproductions' timing figures, "
    "the papers' shapes); paper: the papers' full protocol (their datasets)"
)
SCHEDULES: tuple[str, ...] = ("onecycle", "cosine", "step", "constant")
MEMORY_FORMATS: tuple[str, ...] = ("contiguous", "channels_last", "auto")
#: The largest seed: torch seeds its generators with an unsigned 64-bit integer.
MAX_SEED = 2**64 - 1
# training augmentation recipes (impl.data.AUGMENT_RECIPES, repeated so that this module
# imports nothing heavy; a test checks they agree)
AUGMENT_RECIPES: tuple[str, ...] = ("standard", "ffcv")


#: What a value of each annotation a config field may carry is (bools are not numbers here).
_FIELD_TYPES: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "int": ("an int", lambda v: isinstance(v, numbers.Integral) and not isinstance(v, bool)),
    "float": ("a number", lambda v: isinstance(v, numbers.Real) and not isinstance(v, bool)),
    "bool": ("a bool", lambda v: isinstance(v, bool)),
    "str": ("a string", lambda v: isinstance(v, str)),
    "list[int]": (
        "a list of ints",
        lambda v: (
            isinstance(v, (list, tuple))
            and all(isinstance(x, numbers.Integral) and not isinstance(x, bool) for x in v)
        ),
    ),
    "dict[str, Any]": ("a dict", lambda v: isinstance(v, dict)),
}


def check_field_types(config: Any, values: dict[str, Any] | None = None) -> None:
    """``ValueError`` naming the first field of the dataclass ``config`` (a class or an
    instance) whose value (from ``values`` where given, else the instance's) is not of its
    annotated type (``int``, ``float``, ``bool``, ``str``, ``list[int]``, a dict, each or None
    where the annotation allows it; other annotations are not checked): a float epoch count
    or a string rate would otherwise fail only inside training, after the run directory is
    written."""
    cls = config if isinstance(config, type) else type(config)
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # noqa: BLE001 - an annotation that does not resolve: not checked
        hints = {}
    for f in dataclasses.fields(config):
        if values is not None and f.name not in values:
            continue
        value = values[f.name] if values is not None else getattr(config, f.name)
        kind = _field_kind(hints.get(f.name, f.type))
        if kind is None:
            continue
        name, optional = kind
        said, ok = _FIELD_TYPES[name]
        if (value is None and optional) or ok(value):
            continue
        allowed = f"{said} or None" if optional else said
        raise ValueError(f"{f.name} must be {allowed}, got {value!r} ({type(value).__name__})")


def _field_kind(annotation: Any) -> tuple[str, bool] | None:
    """``(key of _FIELD_TYPES, whether None is allowed)`` for a field's annotation (a type, or
    its text where it did not resolve), or None for one not checked."""
    if isinstance(annotation, str):
        optional = annotation.endswith(" | None")
        kind = annotation.removesuffix(" | None")
        return (kind, optional) if kind in _FIELD_TYPES else None
    optional = False
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        if len(rest) != 1:
            return None
        annotation, optional = rest[0], True
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation in (int, float, bool, str):
        return annotation.__name__, optional
    if origin is list and args == (int,):
        return "list[int]", optional
    if origin is dict:
        return "dict[str, Any]", optional
    return None


@dataclass
class TrainConfig:
    """One training run.

    Args:
        method: a method name (``impl.methods.available_methods()``: the built-in five and
            any registered one, docs/new-method.md).
        method_options: the method's config fields, as plain data.
        model: model name (``impl.models.MODELS``).
        stem: "cifar" or "imagenet" for the models that have both.
        data: dataset name (``impl.data.DATASETS``).
        data_dir: directory of a local dataset (CIFAR, ImageNet); unused by embedded data.
        data_options: extra keyword arguments of :func:`impl.data.make_loaders` (e.g. the
            shape of ``synthetic`` data: image_size, in_channels, num_classes, train_size).
        epochs: number of training epochs.
        batch_size: training batch size: samples per optimizer step over all processes (the
            global batch; with N data-parallel processes each trains on a 1/N share).
        eval_batch_size: batch size for evaluation.
        lr: peak learning rate (one-cycle, cosine) or initial learning rate (step, constant),
            for ``batch_size``; scaled linearly if a method changes the batch size.
        momentum: SGD momentum.
        nesterov: Nesterov momentum.
        weight_decay: L2 weight decay (coupled, as torch.optim.SGD).
        schedule: "onecycle" (linear warm-up then linear decay to 0), "cosine", "step"
            (multiply by ``gamma`` at each of ``milestones``), or "constant".
        warmup_fraction: fraction of training spent warming up (one-cycle only).
        warmup_start: the one-cycle rate's starting multiplier of ``lr``, where its warm-up
            begins (0.04, the DAWNBench recipes'; the SDGP authors' CIFAR-10 script: 1e-4).
        milestones: epochs at which the step schedule multiplies the rate by ``gamma``, each
            given once, in any order.
        gamma: the step schedule's factor.
        label_smoothing: cross-entropy label smoothing.
        augment: random training-set augmentation (per dataset; see ``impl.data``).
        augment_recipe: "standard" (per dataset) or "ffcv" (ffcv's CIFAR-10 augmentation, which
            the SDGP authors train with: flip, translation by up to 2 pixels and a 4x4 cutout,
            filled with the mean).
        eval_flip: test-time flip averaging: a test image is scored by the sum of the logits
            of it and of its horizontal mirror (ffcv's ``lr_tta``, SDGP's evaluation).
        bn_weight_decay: weight decay on BatchNorm weights and biases too (the SDGP authors'
            ImageNet script exempts them).
        seed: seed of everything random in the run (init, shuffling, augmentation, methods),
            0 to 2**64 - 1.
        scale: the preset that produced the run: "smoke", "cpu", "gpu" or "paper".
        device: "auto" (CUDA when present), "cpu" or "cuda[:N]".
        bf16: bfloat16 autocast for forward and backward (on a CPU too, where it is slow
            without a native bf16 unit).
        fp16: float16 autocast for forward and backward with dynamic loss scaling
            (``torch.amp.GradScaler``: initial scale 2**16, halved on an overflow, doubled
            after 2,000 clean steps), as the SDGP authors train. A step whose gradients
            overflow is skipped whole: no optimizer step and no ``after_backward`` of the
            method (its gradients hold inf or NaN); ``after_step`` still runs. Counted per
            epoch as ``amp_skipped_steps``. On a CPU too (slow; for checks).
        cudnn_benchmark: ``torch.backends.cudnn.benchmark`` for the run: cuDNN picks its
            convolution algorithms by timing on the first call of each shape, and so do the
            pattern ops between their gradient paths (:mod:`impl.ops.timed_choice`). Faster on
            a GPU; off (the default), every choice is fixed, so a rerun runs the same
            algorithms (on a CPU the same bits; on a GPU some of them, adaptive pooling's
            backward and some of cuDNN's weight gradients among them, add by atomics in no
            fixed order, so a rerun may differ in the last bits).
        tf32: TF32 tensor-core math for float32 matmuls and convolutions for the run
            (``torch.backends.cuda.matmul.allow_tf32`` and ``torch.backends.cudnn.allow_tf32``;
            GPUs since Ampere). Off (the default), float32 is computed in float32 by every
            method: torch's own default lets cuDNN convolutions use TF32, which would time a
            dense run on tensor cores against pattern kernels that have none. The run's
            environment records both flags.
        memory_format: layout of the model's 4-D weights, and so of its activations and
            gradients: "contiguous" (NCHW; the smoke, gpu and paper presets' default),
            "channels_last" (NHWC: oneDNN's
            convolutions on a CPU skip a layout reorder per call; a dense ResNet-20 step at
            16x16, batch 32, one thread, 15-19% faster, docs/reproductions.md) or "auto"
            (the cpu preset: channels_last on a CPU for a method that gains from it,
            ``Method.channels_last_on_cpu``, else contiguous; the summary records which).
            Values differ from NCHW's in the last bits (other summation orders).
        threads: torch intra-op threads on CPU (None: torch's default).
        max_steps_per_epoch: stop each epoch after this many iterations, at any scale
            (None: every batch).
        out: the run directory.
    """

    method: str = "dense"
    method_options: dict[str, Any] = field(default_factory=dict)
    model: str = "resnet20"
    stem: str = "cifar"
    data: str = "digits"
    data_dir: str | None = None
    data_options: dict[str, Any] = field(default_factory=dict)
    epochs: int = 15
    batch_size: int = 128
    eval_batch_size: int = 512
    lr: float = 0.2
    momentum: float = 0.9
    nesterov: bool = True
    weight_decay: float = 5e-4
    schedule: str = "onecycle"
    warmup_fraction: float = 0.2
    warmup_start: float = 0.04
    milestones: list[int] = field(default_factory=list)
    gamma: float = 0.1
    label_smoothing: float = 0.0
    augment: bool = True
    augment_recipe: str = "standard"
    eval_flip: bool = False
    bn_weight_decay: bool = True
    seed: int = 0
    scale: str = "cpu"
    device: str = "auto"
    bf16: bool = False
    fp16: bool = False
    cudnn_benchmark: bool = False
    tf32: bool = False
    memory_format: str = "contiguous"
    threads: int | None = None
    max_steps_per_epoch: int | None = None
    out: str | None = None

    def validate(self) -> None:
        """Raise ``ValueError`` on values no run can use (before anything is written)."""
        check_field_types(self)
        if self.scale not in SCALES:
            raise ValueError(f"unknown scale {self.scale!r}; valid scales: {', '.join(SCALES)}")
        if self.schedule not in SCHEDULES:
            raise ValueError(
                f"unknown schedule {self.schedule!r}; valid schedules: {', '.join(SCHEDULES)}"
            )
        if self.memory_format not in MEMORY_FORMATS:
            raise ValueError(
                f"unknown memory_format {self.memory_format!r}; valid: {', '.join(MEMORY_FORMATS)}"
            )
        if self.epochs < 1:
            raise ValueError(f"epochs must be >= 1, got {self.epochs}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if not 0 < self.lr < math.inf:  # an infinite rate trains to NaN and "finishes"
            raise ValueError(f"lr must be > 0 and finite, got {self.lr}")
        check_seed(self.seed, "seed")
        if any(m < 0 for m in self.milestones):
            raise ValueError(f"milestones must be epochs >= 0, got {self.milestones}")
        if not self.gamma > 0:
            raise ValueError(f"gamma must be > 0, got {self.gamma}")
        if not 0 <= self.warmup_fraction < 1:
            raise ValueError(f"warmup_fraction must be in [0, 1), got {self.warmup_fraction}")
        if not 0 <= self.warmup_start <= 1:
            raise ValueError(f"warmup_start must be in [0, 1], got {self.warmup_start}")
        if self.augment_recipe not in AUGMENT_RECIPES:
            raise ValueError(
                f"unknown augment_recipe {self.augment_recipe!r}; "
                f"valid: {', '.join(AUGMENT_RECIPES)}"
            )
        if self.bf16 and self.fp16:
            raise ValueError("bf16 and fp16 exclude each other: choose one autocast dtype")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1 (unset: torch default), got {self.threads}")
        # torch's SGD and cross-entropy refuse these only once the run directory is written,
        # which then holds a run that neither a retry nor --resume can continue
        if not 0 <= self.momentum < 1:  # from 1 on, SGD's steps grow without bound
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum}")
        if not 0 <= self.weight_decay < math.inf:
            raise ValueError(f"weight_decay must be >= 0 and finite, got {self.weight_decay}")
        if not 0 <= self.label_smoothing < 1:  # at 1 every target is uniform: nothing to learn
            raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")
        if self.max_steps_per_epoch is not None and self.max_steps_per_epoch < 1:
            raise ValueError(
                f"max_steps_per_epoch must be >= 1 (unset: whole epochs), "
                f"got {self.max_steps_per_epoch}"
            )

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (JSON-serialisable)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        """Read a config back from plain data; unknown keys are an error, not ignored."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"unknown config keys: {', '.join(unknown)}")
        return cls(**data)

    def digest(self) -> str:
        """A short hash of everything that defines the run's result (not where it is written,
        nor the directory its dataset is read from).

        Fields at their default value are left out, so that adding a field (with a default)
        to this class does not change the digest of, and orphan, every existing run.
        """
        defaults = TrainConfig().to_dict()
        data = {k: v for k, v in self.to_dict().items() if v != defaults.get(k, object())}
        data.pop("out", None)
        data.pop("data_dir", None)  # where the dataset is read from, not which one it is
        if data.get("method_options"):  # likewise a method option given at its default
            opts = _non_default_options(self.method, data["method_options"])
            if opts:
                data["method_options"] = opts
            else:
                data.pop("method_options")
        blob = json.dumps(data, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]

    def default_out(self, root: str | Path = "runs") -> str:
        """The run directory named by method, model, data, scale and the config hash."""
        return str(
            Path(root) / f"{self.method}-{self.model}-{self.data}-{self.scale}-{self.digest()}"
        )


def check_seed(value: Any, name: str) -> None:
    """Raise ValueError unless ``value`` is an integer torch can seed a generator with, 0 to
    :data:`MAX_SEED` (a larger one failed inside torch once training began); ``name`` is the
    setting's name in the message (``seed``, SDGP's ``prune_seed``)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SEED:
        raise ValueError(
            f"{name} must be an integer from 0 to {MAX_SEED} (2**64 - 1), got {value!r}"
        )


def _option_defaults(method: str) -> dict[str, Any]:
    """The plain defaults of ``method``'s config fields (none where the method is unknown
    here; a field with a default factory has no plain default)."""
    import dataclasses

    try:
        from impl.methods import method_class

        cls = method_class(method)
    except (ImportError, ValueError):
        return {}
    return {f.name: f.default for f in dataclasses.fields(cls.Config)
            if f.default is not dataclasses.MISSING}  # fmt: skip


def is_default_option(method: str, name: str, value: Any) -> bool:
    """Whether ``value`` is the default of option ``name`` of ``method``'s config: what a
    saved run's ``method_options`` leave out (False where the method or option is unknown
    here)."""
    defaults = _option_defaults(method)
    return name in defaults and defaults[name] == value


def _non_default_options(method: str, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` without the entries equal to the default of ``method``'s config (all of
    them where the method is unknown here)."""
    defaults = _option_defaults(method)
    return {k: v for k, v in options.items() if k not in defaults or defaults[k] != v}


def read_config(path: str | Path) -> TrainConfig:
    """The :class:`TrainConfig` a run directory's ``config.json`` at ``path`` holds. Raises
    ``OSError`` where it cannot be read and ``ValueError`` naming the file where it is not
    a config pdtbench wrote (not JSON, keys of something else, a value it refuses)."""
    from impl.run_files import read_json

    data = read_json(Path(path))
    try:
        cfg = TrainConfig.from_dict(data)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{path} is not the config.json of a pdtbench run ({err})") from err
    try:
        cfg.validate()  # a value edited into one pdtbench would not write
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from err
    return cfg


# Per-scale defaults for the fields a user did not set. The "cpu" preset is the embedded
# default (digits, ResNet-20); "paper" follows the CIFAR recipes the papers share (batch 128,
# lr 0.1, PruneTrain Sec. 5 and ClickTrain Sec. 6.1; decayed 10x as the authors' PruneTrain
# code does, from its epochs 91 and 136 of 182, counted from 1 there: after 90 and 135 epochs
# done, the milestones here; neither paper's text names the decay).
SCALE_PRESETS: dict[str, dict[str, Any]] = {
    "smoke": {"epochs": 2, "batch_size": 32, "max_steps_per_epoch": 3, "eval_batch_size": 256},
    "cpu": {"epochs": 15, "batch_size": 128, "memory_format": "auto"},
    "gpu": {"epochs": 30, "batch_size": 128},
    "paper": {
        "data": "cifar10",
        "epochs": 182,
        "batch_size": 128,
        "lr": 0.1,
        "schedule": "step",
        "milestones": [90, 135],
        "nesterov": False,
    },
}


#: The settings only one learning-rate schedule reads, and that schedule.
SCHEDULE_OWNERS: dict[str, str] = {
    "milestones": "step",
    "gamma": "step",
    "warmup_fraction": "onecycle",
    "warmup_start": "onecycle",
}


def resolve(scale: str, **overrides: Any) -> TrainConfig:
    """Build a config from a scale preset, then the caller's explicit values (None = unset)."""
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r}; valid scales: {', '.join(SCALES)}")
    values: dict[str, Any] = dict(SCALE_PRESETS[scale])
    values.update({k: v for k, v in overrides.items() if v is not None})
    values["scale"] = scale
    cfg = TrainConfig.from_dict(values)
    cfg.validate()
    # A new run only (a saved one that did this still resumes and loads as it trained).
    if cfg.schedule == "step" and not cfg.milestones:
        raise ValueError(
            "schedule 'step' needs milestones (--milestones: the epochs at which the rate "
            "is multiplied by gamma); without them use schedule 'constant'"
        )
    # a schedule's own settings given for another schedule would be silently ignored
    for name, schedule in SCHEDULE_OWNERS.items():
        if overrides.get(name) not in (None, []) and cfg.schedule != schedule:  # [] clears
            raise ValueError(
                f"{name} is a setting of schedule {schedule!r}, and the schedule is "
                f"{cfg.schedule!r} (set --schedule {schedule}, or leave --{name.replace('_', '-')} "
                "out)"
            )
    # each milestone multiplies the rate by gamma once: a repeated one would do it twice (their
    # order does not matter, the multiplier counts the milestones passed)
    repeated = sorted({m for m in cfg.milestones if cfg.milestones.count(m) > 1})
    if repeated:
        raise ValueError(
            f"--milestones repeats epoch {', '.join(map(str, repeated))} ({cfg.milestones}): "
            "each milestone multiplies the rate by --gamma once, so give each epoch once (a "
            "larger drop at one epoch: a smaller --gamma)"
        )
    if cfg.schedule == "step" and min(cfg.milestones) >= cfg.epochs:
        raise ValueError(
            f"schedule 'step' with milestones {cfg.milestones} never changes the rate in "
            f"{cfg.epochs} epochs (a milestone is an epoch, 0 to {cfg.epochs - 1}): give "
            "--milestones below --epochs, or use schedule 'constant'"
        )
    return cfg
