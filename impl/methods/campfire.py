"""Campfire: structured magnitude pruning inside a pruning era, with fixed masks after it.

Gamboa et al., "Campfire: Compressible, Regularization-Free, Structured Sparse Training for
Hardware Accelerators" (2020). No public code exists; this follows the paper's text, with the
corrections listed in :mod:`impl.methods.campfire_masks` and docs/methods.md.

What the method does (Sec. 2):

* Dense training until ``start_epoch``. The target sparsity follows the cubic schedule
  :func:`sparsity_at` of the pruning era ``start .. start + era``. By default
  (``schedule_every="epoch"``) it is set once per epoch from the epoch's number, as Eq. (1)
  reads (``e_c`` "the current epoch"; "Before or during the first epoch of pruning, we will
  have a sparsity threshold of zero", "setting the threshold ... in each epoch within the
  pruning window"): 0 in epoch ``start``, rising over epochs ``start + 1 ..``, the final
  sparsity from epoch ``start + era`` on, which must be an epoch of the run. The paper
  evaluates the masks after every optimizer step ("we evaluate the pruning mask after every
  training step until we reach the final epoch of pruning"); here the schedule is evaluated
  after every step and the masks recomputed where its target rises: with the target constant
  inside an epoch, at the epoch's first step. At an unchanged target a
  recomputation would rank weights already zero lowest and give the same masks (but for ties
  among zeros), or, for "combined", could cut one kernel more. Once the final sparsity is in
  force the masks are fixed. ``schedule_every="step"`` instead evaluates the schedule at the
  fractional epoch ``epoch + steps_done / steps_per_epoch`` after every step: a smooth ramp
  one epoch ahead of the paper's, reaching the final sparsity on the last step of epoch
  ``start + era - 1``.
* "If a weight is already zero, the gradient is also set to zero. This means that once a
  weight becomes zero, it will remain zero for the rest of the training period" (Sec. 2). So a
  recomputed mask is ANDed with the previous one (pruning never grows a weight back) and,
  inside the era and after it, pruned weights have their gradient, momentum and (through the
  zero weight) weight decay zeroed by :class:`impl.methods.masking.MaskSet`.
* Per layer (Sec. 2.1): convolutions with kernels of more than one weight (3x3) get the
  configured mask (``window``, ``ck`` or ``combined``); 1x1 convolutions are pruned by the CK
  rule with single-weight kernels; linear layers (``prune_fc``) by block and fine pruning,
  with inputs fed by a removed conv filter pruned first
  (:func:`impl.methods.campfire_masks.fc_mask`).
  Each layer is ranked on its own, at the same target sparsity.
* The first convolution (the stem, which reads the image) stays dense unless ``prune_stem``:
  the paper's ResNet-50 stem is a 7x7 convolution that none of its rules (3x3 window/CK,
  1x1, FC) covers. The 3x3 stems of the small models (ResNet-20/32, ResNet-9) stay dense too,
  so that every scale prunes the same layers.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from impl.methods.base import Method, MethodConfig, TrainContext
from impl.methods.campfire_masks import (
    CK_SCOPES,
    WINDOW_ROUNDINGS,
    ClassifierFeed,
    ck_mask,
    classifier_feeds,
    combined_mask,
    dead_inputs,
    fc_mask,
    window_mask,
)
from impl.methods.masking import MaskSet, true_sparsity

log = logging.getLogger(__name__)

MASK_TYPES: tuple[str, ...] = ("combined", "window", "ck")
SCHEDULE_EVERY: tuple[str, ...] = ("epoch", "step")

# Default pruning era as fractions of the run: the paper's main ImageNet setting prunes from
# epoch 30 for 20 epochs of 90 (Sec. 3.1, Tables 2-3: "start 30", era 30-50). Table 2's runs
# are 100 epochs, where these fractions give 33 and 22: the reproductions set start and era.
DEFAULT_START_FRACTION = 1.0 / 3.0
DEFAULT_ERA_FRACTION = 2.0 / 9.0


def sparsity_at(epoch: float, start: float, era: float, final: float, r: float = 3) -> float:
    """Target sparsity at (fractional) ``epoch``: Campfire's Eq. (1) with its typo corrected.

    ``s(e) = s_f + (s_i - s_f) * (1 - t)^r`` with ``t = (e - start) / era`` and ``s_i = 0``
    inside the era ``start <= e < start + era``; 0 before it and ``final`` from its end on. The
    paper prints ``s_f - (s_i + s_f)(1 - t)^r``, which for ``s_i = 0`` is the same curve; with
    ``r = 3`` the sparsity rises fast at first and flattens towards ``final``. ``era = 0``
    prunes to ``final`` at once at ``start``. Pass ``epoch + step / steps_per_epoch`` to
    recompute per step.

    Args:
        epoch: the current (fractional) epoch, from 0.
        start: first epoch of the pruning era.
        era: length of the pruning era in epochs (>= 0).
        final: final sparsity, in [0, 1).
        r: exponent (> 0; the paper uses 3).

    Returns:
        Fraction of weights to prune, in [0, final].
    """
    if not 0.0 <= final < 1.0:
        raise ValueError(f"final sparsity must be in [0, 1), got {final!r}")
    if era < 0 or start < 0:
        raise ValueError(f"start and era must be >= 0, got start={start!r}, era={era!r}")
    if not r > 0:
        raise ValueError(f"r must be > 0, got {r!r}")
    if not math.isfinite(epoch):
        raise ValueError(f"epoch must be a finite number, got {epoch!r}")
    if epoch < start:
        return 0.0
    if epoch >= start + era:
        return float(final)
    t = (epoch - start) / era
    return float(final - final * (1.0 - t) ** r)


@dataclass
class CampfireConfig(MethodConfig):
    """Options of Campfire.

    Args:
        final_sparsity: sparsity every pruned layer reaches at the end of the era, in [0, 1).
        mask: mask of the convolutions with R*S > 1: "combined" (default), "window" or "ck".
        start_epoch: first epoch of the pruning era (None: a third of the run, rounded, as the
            paper's start 30 of 90 epochs).
        era_epochs: length of the pruning era in epochs (None: 2/9 of the run, rounded, at least
            1, as the paper's era of 20 of 90 epochs, shortened to fit the run: under the
            per-epoch schedule down to 0, pruning at once, in a run too short for a ramp).
            The era must end by the last epoch.
        window_fraction: share of the target sparsity reached by window pruning in "combined"
            (the paper's 0.8), in [0, 1].
        window_rounding: "layer" (exact layer sparsity, floor or ceil nonzeros per kernel) or
            "kernel" (the same count in every kernel); see ``window_mask``.
        window_max_nonzero: optional cap on the nonzeros per kernel (Algorithm 3's
            ``max_non_zero``) of window pruning, alone or as the first phase of "combined";
            None for none.
        ck_scope: the CK phase's ranking, of ``mask="ck"`` and of ``"combined"``'s second
            phase: "layer" (all kernels of a layer together; Sec. 2.1's "examine each layer
            individually") or "input_channel" (per input channel, Algorithm 1's loops, which
            Algorithm 4 calls); it applies to the 1x1 convolutions too.
        prune_fc: prune linear layers too (Sec. 2.1.2).
        fc_block: block size n of block FC pruning, 1..4 (1: fine pruning only).
        fc_block_fraction: share of an FC layer's target reached by block pruning before fine
            pruning takes the rest, in [0, 1].
        prune_stem: also prune the first convolution (the one that reads the image).
        r: exponent of the sparsity schedule (the paper's r = 3).
        schedule_every: "epoch" (the paper's Eq. (1): the target set from each epoch's number;
            the era's last value, the final sparsity, needs ``start + era < epochs``) or
            "step" (the schedule at the fractional epoch after every step; ``start + era <=
            epochs``). See the module docstring.
    """

    final_sparsity: float = 0.7
    mask: str = "combined"
    start_epoch: int | None = None
    era_epochs: int | None = None
    window_fraction: float = 0.8
    window_rounding: str = "layer"
    window_max_nonzero: int | None = None
    ck_scope: str = "layer"
    prune_fc: bool = True
    fc_block: int = 2
    fc_block_fraction: float = 0.5
    prune_stem: bool = False
    r: float = 3.0
    schedule_every: str = "epoch"


@dataclass(frozen=True)
class PrunedLayer:
    """One pruned parameter: module name, parameter name, kind ("conv", "pointwise", "fc")."""

    module: str
    param: str
    kind: str


def pruned_layers(model: nn.Module, *, prune_fc: bool, prune_stem: bool) -> list[PrunedLayer]:
    """The layers Campfire prunes, in module order (see the module docstring for the rules)."""
    layers = []
    seen_conv = False
    for name, module in model.named_modules():
        if isinstance(module, nn.Conv2d):
            is_stem = not seen_conv
            seen_conv = True
            if is_stem and not prune_stem:
                continue
            kind = "pointwise" if math.prod(module.kernel_size) == 1 else "conv"
        elif isinstance(module, nn.Linear) and prune_fc:
            kind = "fc"
        else:
            continue
        layers.append(PrunedLayer(name, f"{name}.weight" if name else "weight", kind))
    return layers


def resolve_era(config: CampfireConfig, epochs: int) -> tuple[int, int]:
    """``(start_epoch, era_epochs)`` of a run of ``epochs`` epochs, defaults filled in."""
    start = config.start_epoch
    era = config.era_epochs
    if start is None:
        start = int(round(epochs * DEFAULT_START_FRACTION))
    if era is None:
        era = max(1, int(round(epochs * DEFAULT_ERA_FRACTION)))
        era = min(era, max(0, last_era_end(config, epochs) - start))
    return start, era


def last_era_end(config: CampfireConfig, epochs: int) -> int:
    """The latest ``start + era`` a run of ``epochs`` epochs allows: under the per-epoch
    schedule the final sparsity is set in epoch ``start + era``, which must be one of the run's
    (``epochs - 1``); under the per-step one it is reached on the last step of epoch ``start +
    era - 1`` (``epochs``)."""
    return epochs - 1 if config.schedule_every == "epoch" else epochs


class Campfire(Method):
    """Campfire (Gamboa et al., 2020) as a plug-in of the Trainer; see the module docstring."""

    name = "campfire"
    channels_last_on_cpu = True  # masked dense convs: gains as dense does (docs/reproductions.md)
    Config = CampfireConfig
    config: CampfireConfig

    def __init__(self, config: CampfireConfig | None = None) -> None:
        super().__init__(config)
        self.masks = MaskSet()
        self.layers: list[PrunedLayer] = []
        self.feeds: list[ClassifierFeed] = []
        self.start = 0
        self.era = 0
        self.target = 0.0  # target sparsity of the masks in force
        self.fixed = False
        self._step_in_epoch = 0
        # first and last epoch whose steps raised the masks (None: unknown, see load_state_dict)
        self.pruned_epochs: list[int] | None = []

    # -- validation -------------------------------------------------------------------------
    def validate(self, train_config: Any) -> None:
        """Reject a config that cannot work (Sec. 2 ranges), before training starts."""
        c = self.config
        if not isinstance(c.final_sparsity, int | float) or not 0.0 <= c.final_sparsity < 1.0:
            raise ValueError(f"final_sparsity must be in [0, 1), got {c.final_sparsity!r}")
        if c.mask not in MASK_TYPES:
            raise ValueError(f"unknown mask {c.mask!r}; valid masks: {', '.join(MASK_TYPES)}")
        if not 0.0 <= c.window_fraction <= 1.0:
            raise ValueError(f"window_fraction must be in [0, 1], got {c.window_fraction!r}")
        if c.window_rounding not in WINDOW_ROUNDINGS:
            raise ValueError(
                f"unknown window_rounding {c.window_rounding!r}; "
                f"valid: {', '.join(WINDOW_ROUNDINGS)}"
            )
        if c.window_max_nonzero is not None and c.window_max_nonzero < 1:
            raise ValueError(f"window_max_nonzero must be >= 1 or None, got {c.window_max_nonzero}")
        if c.ck_scope not in CK_SCOPES:
            raise ValueError(f"unknown ck_scope {c.ck_scope!r}; valid: {', '.join(CK_SCOPES)}")
        if c.ck_scope != "layer" and c.mask == "window":
            raise ValueError(
                f"ck_scope={c.ck_scope!r} applies to the masks with a CK phase, 'ck' and "
                f"'combined'; got mask={c.mask!r}"
            )
        if not isinstance(c.fc_block, int) or not 1 <= c.fc_block <= 4:
            raise ValueError(f"fc_block must be an int in 1..4 (n < 5), got {c.fc_block!r}")
        if not 0.0 <= c.fc_block_fraction <= 1.0:
            raise ValueError(f"fc_block_fraction must be in [0, 1], got {c.fc_block_fraction!r}")
        if not c.r > 0:
            raise ValueError(f"r must be > 0, got {c.r!r}")
        if c.start_epoch is not None and c.start_epoch < 0:
            raise ValueError(f"start_epoch must be >= 0, got {c.start_epoch}")
        if c.era_epochs is not None and c.era_epochs < 0:
            raise ValueError(f"era_epochs must be >= 0, got {c.era_epochs}")
        if c.schedule_every not in SCHEDULE_EVERY:
            raise ValueError(
                f"unknown schedule_every {c.schedule_every!r}; valid: {', '.join(SCHEDULE_EVERY)}"
            )
        epochs = int(train_config.epochs)
        start, era = resolve_era(c, epochs)
        end = last_era_end(c, epochs)
        # (an era of 0 epochs prunes at once in epoch start: checked below as a start)
        if start + era > end and not (era == 0 and c.schedule_every == "epoch"):
            rule = (
                "the final sparsity is set in epoch start_epoch + era_epochs, which must be an "
                "epoch of the run (schedule_every='step' ends the era one epoch earlier)"
                if c.schedule_every == "epoch"
                else "the final sparsity is reached on the era's last step"
            )
            raise ValueError(
                f"the pruning era (epochs {start} to {start + era}) ends after training "
                f"({epochs} epochs): {rule}; need start_epoch + era_epochs <= {end}"
            )
        if c.final_sparsity > 0 and start >= epochs:
            raise ValueError(
                f"the pruning era starts at epoch {start}, after the last epoch ({epochs - 1}): "
                "nothing would be pruned; need start_epoch < epochs (or final_sparsity 0)"
            )

    # -- events -----------------------------------------------------------------------------
    def setup(self, ctx: TrainContext) -> None:
        """Find the layers to prune and the classifier inputs fed by conv channels."""
        c = self.config
        self.start, self.era = resolve_era(c, int(ctx.config.epochs))
        self.layers = pruned_layers(ctx.model, prune_fc=c.prune_fc, prune_stem=c.prune_stem)
        pruned = {layer.module for layer in self.layers}
        self.feeds = [
            f for f in classifier_feeds(ctx.model) if f.linear in pruned and f.conv in pruned
        ]
        self.masks = MaskSet()
        self.target = 0.0
        self.fixed = False
        self.pruned_epochs = []

    def on_epoch_start(self, ctx: TrainContext) -> None:
        """Restart the count of steps in the epoch (the schedule's step position)."""
        self._step_in_epoch = 0

    def after_backward(self, ctx: TrainContext) -> None:
        """Zero the gradients of pruned weights (Sec. 2: "the gradient is also set to zero")."""
        if len(self.masks):
            self.masks.apply_to_grads(ctx.model)

    def after_step(self, ctx: TrainContext) -> None:
        """Inside the era: recompute the masks at this step's target sparsity (per epoch or
        per step, ``schedule_every``); always re-apply them."""
        self._step_in_epoch += 1
        if not self.fixed:
            epoch = float(ctx.epoch)
            if self.config.schedule_every == "step":
                epoch += self._step_in_epoch / max(ctx.steps_per_epoch, 1)
            s = self.sparsity_at(epoch)
            if s > self.target:  # the schedule rises (every epoch, or every step)
                self.update_masks(ctx.model, s)
                if self.pruned_epochs is not None:
                    first = self.pruned_epochs[0] if self.pruned_epochs else ctx.epoch
                    self.pruned_epochs = [first, ctx.epoch]
            if epoch >= self.start + self.era:
                self.fixed = True
        if len(self.masks):
            self.masks.enforce(ctx.model, ctx.optimizer)

    def sparsity_at(self, epoch: float) -> float:
        """This run's target sparsity at a fractional epoch (:func:`sparsity_at`)."""
        c = self.config
        return sparsity_at(epoch, self.start, self.era, c.final_sparsity, c.r)

    @torch.no_grad()
    def layer_mask(self, model: nn.Module, layer: PrunedLayer, sparsity: float) -> torch.Tensor:
        """The keep-mask of one layer at ``sparsity``, from its current (masked) weights."""
        c = self.config
        w = model.get_parameter(layer.param)
        if layer.kind == "fc":
            dead = None
            for feed in self.feeds:
                if feed.linear == layer.module:
                    dead = dead_inputs(model, feed)
            return fc_mask(
                w, sparsity, block=c.fc_block, block_fraction=c.fc_block_fraction, dead_inputs=dead
            )
        if layer.kind == "pointwise":  # CK on single-weight kernels (the CK phase's scope)
            return ck_mask(w, sparsity, scope=c.ck_scope)
        if c.mask == "window":
            return window_mask(
                w, sparsity, rounding=c.window_rounding, max_nonzero=c.window_max_nonzero
            )
        if c.mask == "ck":
            return ck_mask(w, sparsity, scope=c.ck_scope)
        return combined_mask(
            w,
            sparsity,
            c.window_fraction,
            rounding=c.window_rounding,
            max_nonzero=c.window_max_nonzero,
            scope=c.ck_scope,
        )

    @torch.no_grad()
    def update_masks(self, model: nn.Module, sparsity: float) -> None:
        """Recompute every layer's mask at ``sparsity``, ANDed with the masks already in force.

        Convolutions are masked first, so an FC layer sees the conv filters removed at this
        step when it looks for dead inputs.
        """
        order = [x for x in self.layers if x.kind != "fc"] + [
            x for x in self.layers if x.kind == "fc"
        ]
        for layer in order:
            mask = self.layer_mask(model, layer, sparsity)
            if layer.param in self.masks:
                mask &= self.masks[layer.param].to(mask.device)
            self.masks.set(layer.param, mask)
            # zeroed now, so that an FC layer later in this loop sees the removed conv filters;
            # the mask words cached here serve the enforcement that follows the update
            self.masks.zero_pruned(layer.param, model.get_parameter(layer.param))
        self.target = float(sparsity)

    # -- reporting --------------------------------------------------------------------------
    def sparsity_report(self, model: nn.Module) -> dict[str, Any]:
        """True sparsity (fraction of weights exactly zero): per pruned layer, pruned layers
        together, all convolutions together (stem included), and the largest number of nonzeros
        in any kernel of the pruned convolutions with R*S > 1."""
        per_layer: dict[str, float] = {}
        zeros = total = conv_zeros = conv_total = 0
        max_nz = 0
        for layer in self.layers:
            w = model.get_parameter(layer.param).detach()
            z = int((w == 0).sum())
            per_layer[layer.module] = z / max(w.numel(), 1)
            zeros += z
            total += w.numel()
            if layer.kind == "conv":
                nz = (w.reshape(w.shape[0] * w.shape[1], -1) != 0).sum(dim=1)
                max_nz = max(max_nz, int(nz.max()) if nz.numel() else 0)
        for module in model.modules():
            if isinstance(module, nn.Conv2d):
                conv_zeros += int((module.weight == 0).sum())
                conv_total += module.weight.numel()
        return {
            "target_sparsity": self.target,
            "true_sparsity": zeros / max(total, 1),
            "true_conv_sparsity": conv_zeros / max(conv_total, 1),
            "layer_sparsity": per_layer,
            "max_kernel_nonzeros": max_nz,
            "masks_fixed": self.fixed,
        }

    def epoch_metrics(self, ctx: TrainContext) -> dict[str, Any]:
        """True sparsity per layer and overall; the inference FLOPs of the model as the epoch
        ends. The epoch's training FLOPs are the Trainer's (:func:`impl.train.epoch_step_cost`:
        the first step at the cost as the epoch began, the others along the costs read at the
        start of steps 1, the middle one or two and the last), exact for the per-epoch target,
        whose masks change on an era epoch's first step, and for the per-step ramp (a cubic in
        the step); the cost at the epoch's end alone overstated the run's saving."""
        row = self.sparsity_report(ctx.model)
        try:
            from impl.flops import training_flops
        except ImportError:  # pragma: no cover - impl.flops ships with the package
            return row
        report = training_flops(ctx.model, ctx.input_shape, density=self.cost(ctx.model))
        row["inference_flops"] = report.inference_flops
        return row

    def summary(self, ctx: TrainContext) -> dict[str, Any]:
        """Final true sparsity, the era, and the options that shaped the masks.

        ``pruning_era`` is the era of the schedule (Eq. (1): sparsity 0 at its first epoch, the
        final one at its last); ``pruned_in_epochs`` the first and last epoch (0-based) in whose
        steps the masks grew, as measured: ``start + 1 .. start + era`` under the per-epoch
        schedule (``[start, start]`` for an era of 0), one epoch earlier under the per-step
        ramp (``[]``: nothing was pruned; ``None``: unknown, a run resumed from a checkpoint
        written before the record whose masks had grown already)."""
        report = self.sparsity_report(ctx.model)
        return {
            "true_sparsity": report["true_sparsity"],
            "true_conv_sparsity": report["true_conv_sparsity"],
            "layer_sparsity": report["layer_sparsity"],
            "max_kernel_nonzeros": report["max_kernel_nonzeros"],
            "pruning_era": [self.start, self.start + self.era],
            "pruned_in_epochs": None if self.pruned_epochs is None else list(self.pruned_epochs),
            "schedule_every": self.config.schedule_every,
            "mask": self.config.mask,
            "dead_input_rule_layers": [f.linear for f in self.feeds],
        }

    def cost(self, model: nn.Module) -> dict[str, Any]:
        """Nominal densities: forward, data gradient and weight gradient all scale with the
        fraction of nonzero weights of each pruned layer (pruned weights take no part in the
        product, and their gradients are discarded)."""
        from impl.flops import LayerDensity

        out = {}
        for layer in self.layers:
            w = model.get_parameter(layer.param)
            out[layer.module] = LayerDensity.uniform(1.0 - true_sparsity(w.detach()))
        return out

    # -- resume -----------------------------------------------------------------------------
    def comm_masks(self, ctx: TrainContext) -> dict[str, torch.Tensor] | None:
        """The fixed masks once the pruning era is over (sparse Allreduce), else ``None``."""
        return dict(self.masks.items()) if self.fixed and len(self.masks) else None

    def state_dict(self) -> dict[str, Any]:
        """Masks, the target they were built for, whether they are fixed, the epochs the masks
        grew in, and the schedule's granularity the run trains with."""
        return {
            "masks": self.masks.state_dict(),
            "target": self.target,
            "fixed": self.fixed,
            "pruned_epochs": None if self.pruned_epochs is None else list(self.pruned_epochs),
            "schedule_every": self.config.schedule_every,
        }

    def load_state_dict(self, state: dict[str, Any], ctx: TrainContext) -> None:
        """Restore the masks (no structural change: the model keeps its shapes). A run goes on
        with the schedule it trained with: a checkpoint without ``schedule_every`` was written
        when the per-step ramp was the only schedule, and resumes with it."""
        self.masks.load_state_dict(state.get("masks", {}))
        self.target = float(state.get("target", 0.0))
        self.fixed = bool(state.get("fixed", False))
        # a checkpoint from before the record: unknown where its masks had grown already
        saved = state.get("pruned_epochs", [] if self.target == 0 else None)
        self.pruned_epochs = None if saved is None else [int(e) for e in saved]
        known = {layer.param for layer in self.layers}
        unknown = sorted(set(self.masks) - known)
        if unknown:
            raise ValueError(f"saved masks name parameters this model does not prune: {unknown}")
        every = state.get("schedule_every", "step")
        if every != self.config.schedule_every:
            log.warning(
                "campfire: the checkpoint trained with schedule_every=%r; resuming with it "
                "(the config says %r)",
                every,
                self.config.schedule_every,
            )
            self.config.schedule_every = every


__all__ = [
    "MASK_TYPES",
    "Campfire",
    "CampfireConfig",
    "PrunedLayer",
    "ck_mask",
    "combined_mask",
    "fc_mask",
    "pruned_layers",
    "resolve_era",
    "sparsity_at",
    "window_mask",
]
