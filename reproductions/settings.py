"""What a reproduction's result says about how its runs were trained, in words.

A result with training runs carries a settings table (one line per row: the method's options
as run, its seeds, what of its setup differs from the shared one) and the setup its runs
share, both read from the runs' saved ``config.json``; the claims table says our setting
where it differs from the paper's (:mod:`reproductions.claims`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from impl.config import SCHEDULE_OWNERS, TrainConfig

if TYPE_CHECKING:
    from reproductions.common import RowResult


# TrainConfig fields that make a run's training setup (the rest: method, seed, where it runs).
SETUP_FIELDS: tuple[str, ...] = (
    "model", "stem", "data", "data_options", "epochs", "max_steps_per_epoch", "batch_size",
    "lr", "schedule", "warmup_fraction", "warmup_start", "milestones", "gamma", "momentum",
    "nesterov", "weight_decay", "bn_weight_decay", "label_smoothing", "augment",
    "augment_recipe", "eval_flip", "bf16", "fp16",
)  # fmt: skip


def setup_name(model: str | None, data: str | None, data_options: dict | None = None) -> str:
    """Model and data in words: "ResNet-20 on digits (16x16 px)" (the input size where the
    data options set one), "ResNet-9 on CIFAR-10"."""
    from impl.report.labels import data_name, model_name

    text = " on ".join(
        x for x in (model_name(model) if model else "", data_name(data) if data else "") if x
    )
    size = (data_options or {}).get("image_size")
    return f"{text} ({size}x{size} px)" if size else text


def setup_text(cfg: dict[str, Any]) -> str:
    """The training setup of the :data:`SETUP_FIELDS` present in ``cfg`` (a saved config or
    part of one), in words: "ResNet-20 on digits (16x16 px), 8 epochs, batch 32, SGD lr 0.2
    (one-cycle, 20% warm-up), momentum 0.9 (Nesterov), weight decay 0.0005"."""
    parts = []
    if cfg.get("model") or cfg.get("data"):
        parts.append(setup_name(cfg.get("model"), cfg.get("data"), cfg.get("data_options")))
    elif (cfg.get("data_options") or {}).get("image_size"):
        size = cfg["data_options"]["image_size"]
        parts.append(f"input {size}x{size} px")
    if cfg.get("stem") not in (None, "cifar"):
        parts.append(f"{cfg['stem']} stem")
    if "epochs" in cfg:
        steps = cfg.get("max_steps_per_epoch")
        epochs = f"{cfg['epochs']} epoch{'s' if cfg['epochs'] != 1 else ''}"
        parts.append(
            epochs + (f" of at most {steps} step{'s' if steps != 1 else ''}" if steps else "")
        )
    elif cfg.get("max_steps_per_epoch"):
        parts.append(f"at most {cfg['max_steps_per_epoch']} steps per epoch")
    if "batch_size" in cfg:
        parts.append(f"batch {cfg['batch_size']}")
    parts += _schedule_parts(cfg)
    if "momentum" in cfg:
        parts.append(
            f"momentum {cfg['momentum']:g}" + (" (Nesterov)" if cfg.get("nesterov") else "")
        )
    elif "nesterov" in cfg:
        parts.append("Nesterov momentum" if cfg["nesterov"] else "no Nesterov momentum")
    if "weight_decay" in cfg:
        parts.append(f"weight decay {cfg['weight_decay']:g}")
    if cfg.get("bn_weight_decay") is False:
        parts.append("none on BatchNorm")
    if cfg.get("label_smoothing"):
        parts.append(f"label smoothing {cfg['label_smoothing']:g}")
    if cfg.get("augment") is False:
        parts.append("no augmentation")
    elif cfg.get("augment_recipe") not in (None, "standard"):
        parts.append(f"{cfg['augment_recipe']} augmentation")
    if cfg.get("eval_flip"):
        parts.append("flip test-time averaging")
    if cfg.get("bf16"):
        parts.append("bf16")
    if cfg.get("fp16"):
        parts.append("fp16 with loss scaling")
    return ", ".join(parts)


def _schedule_parts(cfg: dict[str, Any]) -> list[str]:
    """The optimizer and learning-rate schedule of ``cfg`` in words. Only the fields ``cfg``
    holds are named: a shared setup whose rows differ in milestones says "step decay" and
    each row's difference names its milestones ("lr decayed at epochs [72, 90]"), so no
    field is ever printed as None."""
    sched = cfg.get("schedule")
    how = {"onecycle": "one-cycle", "cosine": "cosine", "constant": "constant",
           "step": "step decay"}.get(sched, "")  # fmt: skip
    if sched == "step":
        if "gamma" in cfg:
            how = f"decayed {cfg['gamma']:g}x"
        if cfg.get("milestones") is not None:
            how += f" at epochs {cfg['milestones']}"
        if "gamma" in cfg and cfg.get("milestones") is None:
            how += " at milestones given per row"
    if sched == "onecycle" and "warmup_fraction" in cfg:
        how += f", {cfg['warmup_fraction']:.0%} warm-up"
        if cfg.get("warmup_start") not in (None, TrainConfig.warmup_start):
            how += f" from {cfg['warmup_start']:g} of the peak"
    parts = []
    if "lr" in cfg or "schedule" in cfg:
        lr = f"SGD lr {cfg['lr']:g}" if "lr" in cfg else "SGD"
        parts.append(f"{lr} ({how})" if how else lr)
    if "schedule" not in cfg:  # a row's difference from a shared schedule
        decay = []
        if "gamma" in cfg:
            decay.append(f"{cfg['gamma']:g}x")
        if cfg.get("milestones") is not None:
            decay.append(f"at epochs {cfg['milestones']}")
        if decay:
            parts.append("lr decayed " + " ".join(decay))
        if "warmup_fraction" in cfg:
            parts.append(f"{cfg['warmup_fraction']:.0%} warm-up")
        if cfg.get("warmup_start") is not None:
            parts.append(f"warm-up from {cfg['warmup_start']:g} of the peak lr")
    return parts


def method_defaults(method: str) -> dict[str, Any]:
    """The default options of ``method``'s config (empty for a method not built here)."""
    try:
        from impl.methods import method_class

        cls = method_class(method)
    except (ImportError, ValueError):
        return {}
    config = getattr(cls, "Config", None)
    if config is None or not dataclasses.is_dataclass(config):
        return {}
    return {f.name: f.default for f in dataclasses.fields(config)
            if f.default is not dataclasses.MISSING}  # fmt: skip


def _prunetrain_text(o: dict[str, Any], scale: str) -> tuple[list[str], set[str]]:
    from reproductions.prunetrain import SHORT_RUN_RATIO

    ratio = o.get("penalty_ratio")
    paper = [k for k, v in SHORT_RUN_RATIO.items() if v == ratio]
    mapped = (
        f" (the paper's {paper[0]:g}, mapped onto the short run)"
        if scale in ("cpu", "gpu") and paper
        else ""
    )
    parts = [f"penalty ratio {ratio:g}{mapped}", f"zero threshold {o.get('threshold'):g}",
             f"reconfigured every {o.get('reconfig_interval')} epoch(s)"]  # fmt: skip
    if o.get("dynamic_batch"):
        parts.append(f"dynamic mini-batch (step {o.get('batch_step')}, max {o.get('max_batch')})")
    keys = {"penalty_ratio", "threshold", "reconfig_interval", "dynamic_batch", "batch_step",
            "max_batch"}  # fmt: skip
    return parts, keys


def _clicktrain_text(o: dict[str, Any], scale: str) -> tuple[list[str], set[str]]:
    hard = o.get("hard_prune_epoch")
    parts = [
        f"connectivity sparsity {o.get('connectivity'):g} (kernels removed whole)",
        f"pattern pool of {o.get('pool_size')}",
        f"group-lasso penalty {o.get('penalty'):g}",
        (
            "hard pruning at half the epochs, or later where stages 1-3 need more"
            if hard is None
            else f"hard pruning at epoch {hard}"
        ),
    ]
    return parts, {"connectivity", "pool_size", "penalty", "hard_prune_epoch"}


def _sdgp_text(o: dict[str, Any], scale: str) -> tuple[list[str], set[str]]:
    how = {"rescaled": "rescaled magnitude"}.get(str(o.get("prune_method")), o.get("prune_method"))
    parts = [f"{o.get('n')}:{o.get('m')} data-gradient pruning, {how}"]
    return parts, {"n", "m", "prune_method"}


def _campfire_text(o: dict[str, Any], scale: str) -> tuple[list[str], set[str]]:
    mask = {"combined": "combined (window + CK)", "ck": "CK"}.get(str(o.get("mask")), o.get("mask"))
    parts = [f"{o.get('final_sparsity'):.0%} final sparsity", f"{mask} masks"]
    return parts, {"final_sparsity", "mask"}


# method -> function of (its options with the defaults filled in, scale) -> (phrases, the
# options they describe): how a settings table words a method's options.
METHOD_OPTION_TEXT: dict[str, Callable[[dict[str, Any], str], tuple[list[str], set[str]]]] = {
    "dense": lambda o, scale: (["no pruning (the baseline)"], set()),
    "prunetrain": _prunetrain_text,
    "clicktrain": _clicktrain_text,
    "sdgp": _sdgp_text,
    "campfire": _campfire_text,
}


def options_text(method: str, options: dict[str, Any], scale: str) -> str:
    """``method``'s options as run, in words: its main options (:data:`METHOD_OPTION_TEXT`,
    from ``options`` over the method's defaults, e.g. "penalty ratio 0.8 (the paper's 0.2,
    mapped onto the short run), zero threshold 0.01, reconfigured every 1 epoch(s)"), then
    every other option set away from its default ("name value")."""
    defaults = method_defaults(method)
    full = {**defaults, **options}
    parts: list[str] = []
    keys: set[str] = set()
    if method in METHOD_OPTION_TEXT:
        try:
            parts, keys = METHOD_OPTION_TEXT[method](full, scale)
        except (TypeError, ValueError):  # an option of an unexpected type: list them all
            parts, keys = [], set()
    rest = [f"{k.replace('_', ' ')} {v}" for k, v in sorted(options.items())
            if k not in keys and (k not in defaults or defaults[k] != v)]  # fmt: skip
    return ", ".join(parts + rest) or "the method's defaults"


def _in_effect(cfg: dict[str, Any]) -> dict[str, Any]:
    """A saved config without the settings of schedules it did not train with (a step
    schedule's run keeps its warm-up defaults in ``config.json``; they shaped nothing)."""
    return {
        k: v
        for k, v in cfg.items()
        if k not in SCHEDULE_OWNERS or cfg.get("schedule") in (None, SCHEDULE_OWNERS[k])
    }


def settings_lines(results: list[RowResult], scale: str) -> tuple[list[dict[str, str]], str]:
    """The settings table of a target's training rows (one line per row with runs: method,
    options as run (:func:`options_text`), seeds, and what of its setup differs from the
    shared one) and the setup every run shares (:func:`setup_text`), both read from the runs'
    saved configs."""
    from impl.report.labels import seeds_text

    runs = [_in_effect(run.config) for res in results for run in res.runs if run.config]
    if not runs:
        return [], ""
    shared = {
        k: runs[0].get(k)
        for k in SETUP_FIELDS
        if k in runs[0] and all(k in cfg and cfg[k] == runs[0][k] for cfg in runs)
    }
    lines = []
    for res in results:
        cfgs = [_in_effect(run.config) for run in res.runs if run.config]
        if not cfgs:
            continue
        cfg = cfgs[0]
        differs = {k: cfg.get(k) for k in SETUP_FIELDS if k in cfg and k not in shared}
        lines.append(
            {
                "row": res.row.label,
                "method": str(cfg.get("method", res.row.method)),
                "options": options_text(str(cfg.get("method", res.row.method)),
                                        dict(cfg.get("method_options") or {}), scale),
                "seeds": seeds_text([run.seed for run in res.runs]),
                "differs": setup_text(differs),
            }
        )  # fmt: skip
    return lines, setup_text(shared)
