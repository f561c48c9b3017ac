"""A method of your own, as a pdtbench plug-in: gradual magnitude pruning (GMP).

Zhu and Gupta, "To prune, or not to prune: exploring the efficacy of pruning for model
compression" (2017), Sec. 3: unstructured magnitude pruning during training. Every
``interval`` optimizer steps between ``start`` and ``end`` (fractions of the run), each pruned
layer keeps its largest-magnitude weights, at the sparsity of the cubic schedule (their
Eq. 1)::

    s(t) = s_f + (s_i - s_f) * (1 - (t - t_0) / (t_end - t_0)) ** 3

A pruned weight stays pruned: its gradient, momentum and weight are held at zero by
:class:`impl.methods.masking.MaskSet`. After ``end`` the masks are fixed, and the method
offers them for sparse gradient communication.

This file is the worked example of ``docs/new-method.md``; it is not one of the built-in
methods. Train it with::

    PYTHONPATH=. PDTBENCH_METHODS=gmp=examples.gradual_magnitude:GradualMagnitude \\
        pdtbench train --method gmp --final-sparsity 0.8 --scale smoke --out runs/gmp
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from impl.methods.base import Method, MethodConfig, TrainContext
from impl.methods.masking import MaskSet, true_sparsity


@dataclass
class GradualMagnitudeConfig(MethodConfig):
    """Options of gradual magnitude pruning (each becomes a ``pdtbench train`` flag).

    Args:
        final_sparsity: s_f, the fraction of each pruned layer's weights removed at the end.
        initial_sparsity: s_i, the sparsity of the first pruning step.
        start: t_0 as a fraction of the run's optimizer steps.
        end: t_end as a fraction of the run's optimizer steps (the masks are fixed after it).
        interval: optimizer steps between two mask updates (their Delta t).
        prune_stem: also prune the first convolution (the one that reads the image).
    """

    final_sparsity: float = 0.8
    initial_sparsity: float = 0.0
    start: float = 0.2
    end: float = 0.7
    interval: int = 10
    prune_stem: bool = False


def cubic_sparsity(t: float, t0: float, t_end: float, s_i: float, s_f: float) -> float:
    """Target sparsity at step ``t`` of a pruning window ``[t0, t_end]`` (Zhu and Gupta 2017,
    Eq. 1): ``s_i`` at ``t0``, rising as a cubic to ``s_f`` at ``t_end``; ``t`` outside the
    window counts as its nearer end."""
    frac = min(max((t - t0) / (t_end - t0), 0.0), 1.0)
    return s_f + (s_i - s_f) * (1.0 - frac) ** 3


def magnitude_keep_mask(weight: torch.Tensor, sparsity: float) -> torch.Tensor:
    """Bool mask keeping the ``round((1 - sparsity) * numel)`` largest ``|weight|`` entries
    (ties broken by position, as ``torch.topk`` breaks them)."""
    keep = round((1.0 - sparsity) * weight.numel())
    mask = torch.zeros(weight.numel(), dtype=torch.bool, device=weight.device)
    if keep > 0:
        mask[torch.topk(weight.detach().abs().flatten(), keep).indices] = True
    return mask.view_as(weight)


class GradualMagnitude(Method):
    """Unstructured gradual magnitude pruning of every convolution (the stem optional)."""

    name = "gmp"
    Config = GradualMagnitudeConfig

    def __init__(self, config: GradualMagnitudeConfig | None = None) -> None:
        super().__init__(config)
        self.masks = MaskSet()
        self.layers: list[str] = []  # qualified names of the pruned conv weights
        self.target = 0.0
        self.fixed = False

    def validate(self, train_config: Any) -> None:
        """Reject a schedule that cannot run: sparsities outside [0, 1), an empty window."""
        c = self.config
        if not 0.0 <= c.initial_sparsity <= c.final_sparsity < 1.0:
            raise ValueError("need 0 <= initial_sparsity <= final_sparsity < 1")
        if not 0.0 <= c.start < c.end <= 1.0:
            raise ValueError(f"need 0 <= start < end <= 1, got start={c.start}, end={c.end}")
        if c.interval < 1:
            raise ValueError(f"interval must be >= 1, got {c.interval}")

    def setup(self, ctx: TrainContext) -> None:
        """Choose the layers: every conv weight, the first one only with ``prune_stem``."""
        convs = [n for n, m in ctx.model.named_modules() if isinstance(m, nn.Conv2d)]
        if not self.config.prune_stem:
            convs = convs[1:]
        self.layers = [f"{n}.weight" for n in convs]

    def _window(self, ctx: TrainContext) -> tuple[float, float]:
        total = ctx.config.epochs * max(ctx.steps_per_epoch, 1)
        return self.config.start * total, self.config.end * total

    def after_backward(self, ctx: TrainContext) -> None:
        """Hold the gradients of pruned weights at zero."""
        if len(self.masks):
            self.masks.apply_to_grads(ctx.model)

    def after_step(self, ctx: TrainContext) -> None:
        """Inside the window, every ``interval`` steps and at its end: new masks at the
        schedule's sparsity (a pruned weight never grows back); then fixed masks. Always:
        re-zero the pruned weights and their momentum."""
        t0, t_end = self._window(ctx)
        done = ctx.step + 1  # optimizer steps taken, this one included
        if not self.fixed and done >= t0:
            if (done - math.ceil(t0)) % self.config.interval == 0 or done >= t_end:
                c = self.config
                self.target = cubic_sparsity(done, t0, t_end, c.initial_sparsity, c.final_sparsity)
                for name in self.layers:
                    keep = magnitude_keep_mask(ctx.model.get_parameter(name), self.target)
                    if name in self.masks:
                        keep &= self.masks[name]
                    self.masks.set(name, keep)
            self.fixed = done >= t_end
        if len(self.masks):
            self.masks.enforce(ctx.model, ctx.optimizer)

    def epoch_metrics(self, ctx: TrainContext) -> dict[str, Any]:
        """The target sparsity the masks were last built for."""
        return {"gmp_target_sparsity": self.target}

    def summary(self, ctx: TrainContext) -> dict[str, Any]:
        """The sparsity each pruned layer ended with, and whether the masks were fixed."""
        return {
            "gmp": {
                "fixed": self.fixed,
                "layer_sparsity": {
                    n: true_sparsity(ctx.model.get_parameter(n).detach()) for n in self.layers
                },
            }
        }

    def cost(self, model: nn.Module) -> dict[str, Any]:
        """Nominal densities: all three products of a pruned conv scale with its kept
        weights (this example runs them dense: executed FLOPs stay those of dense)."""
        from impl.flops import LayerDensity

        return {
            n.removesuffix(".weight"): LayerDensity.uniform(
                1.0 - true_sparsity(model.get_parameter(n).detach())
            )
            for n in self.layers
        }

    def comm_masks(self, ctx: TrainContext) -> dict[str, torch.Tensor] | None:
        """The fixed masks once pruning is over (their zeros need not be all-reduced)."""
        return dict(self.masks.items()) if self.fixed else None

    def state_dict(self) -> dict[str, Any]:
        """Masks, the last target and whether the masks are fixed."""
        return {"masks": self.masks.state_dict(), "target": self.target, "fixed": self.fixed}

    def load_state_dict(self, state: dict[str, Any], ctx: TrainContext) -> None:
        """Restore :meth:`state_dict` (the model keeps its shapes: nothing to rebuild)."""
        self.masks.load_state_dict(state["masks"])
        self.target = float(state["target"])
        self.fixed = bool(state["fixed"])
