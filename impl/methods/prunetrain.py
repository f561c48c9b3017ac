"""PruneTrain (Lym et al., SC 2019): group lasso from the first iteration, periodic
reconfiguration into a smaller dense model, channel union, layer removal, dynamic mini-batch.

* :func:`group_lasso` is the regulariser of Eq. (2), :func:`lasso_coefficient` sets its single
  global coefficient from the penalty ratio of Eq. (3) at the first iteration (Sec. 4.1).
* :func:`reconfigure` (in :mod:`impl.methods.prunetrain_reconfig`) removes the channels and
  residual paths group lasso has zeroed, in place (Sec. 4.2, channel union Fig. 5c).
* :class:`PruneTrain` runs them as a method of the Trainer (Algorithm 1), with the dynamic
  mini-batch adjustment of Sec. 4.3 (:mod:`impl.methods.prunetrain_memory`).

Choices where the paper leaves room (each is a config field):

* Reconfiguration happens after every ``reconfig_interval``-th epoch and, with
  ``reconfig_at_end`` (default), also after the last epoch, so the final (evaluated and saved)
  model is the physically pruned one; removal changes the function only by weights below the
  threshold, which a BatchNorm after them can scale up (see
  :mod:`impl.methods.prunetrain_reconfig`).
* Dynamic mini-batch: the budget is the memory of the first iteration's configuration (the
  paper's CIFAR rule, "maintain similar device memory capacity utilization", Sec. 5.3 and
  Fig. 9b), or ``memory_budget_mb`` when given (its ImageNet rule: the device capacity,
  Fig. 9a). After each reconfiguration the batch becomes the largest ``B0 + 32 k`` whose
  iteration fits the budget (measured peak on CUDA, analytic estimate on CPU), never smaller
  than before and at most ``max_batch``; the Trainer scales the learning rate linearly.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from impl.methods.base import Method, MethodConfig, TrainContext
from impl.methods.channel_graph import build_graph
from impl.methods.prunetrain_memory import (
    choose_batch,
    estimate_iteration_bytes,
    measure_iteration_bytes,
    probe_iteration_ms,
)
from impl.methods.prunetrain_reconfig import (
    LayerChange,
    ReconfigReport,
    apply_architecture,
    architecture,
    reconfigure,
)

GROUP_EPS = 1e-8
# BatchNorm element accesses per element per training iteration: forward reads x twice
# (statistics, normalisation) and writes y; backward reads x and dy twice each and writes dx.
BN_ACCESSES_PER_ELEMENT = 8


def group_lasso(model: nn.Module) -> torch.Tensor:
    """PruneTrain's group lasso (Lym et al., SC 2019, Eq. 2, without the coefficient).

    Sum over groups of ``sqrt(||W_g||^2 + 1e-8)``; the groups are every convolution's output
    channels (``W[k]``), every convolution's input channels (``W[:, c]``) except those of the
    first convolution (the one reading the network input: the first ``nn.Conv2d`` in
    ``model.modules()`` order, the stem of every model of :mod:`impl.models`), every linear
    layer's input features (``W[:, i]``) and the output neurons (``W[j]``) of every linear
    layer but the last (the classifier; Sec. 4.1: "We do not apply group lasso to the input
    channels of the first convolution layer and the output neurons of the last
    fully-connected layer": the hidden layers of a multi-layer head, VGG's ImageNet one). No
    group-size scaling: one global coefficient multiplies the sum. Returns a scalar tensor
    that carries gradients.
    """
    terms: list[torch.Tensor] = []
    first = True
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            sq = m.weight.pow(2)
            terms.append((sq.sum(dim=(1, 2, 3)) + GROUP_EPS).sqrt().sum())
            if first:
                first = False
            else:
                terms.append((sq.sum(dim=(0, 2, 3)) + GROUP_EPS).sqrt().sum())
        elif isinstance(m, nn.Linear):
            sq = m.weight.pow(2)
            terms.append((sq.sum(dim=0) + GROUP_EPS).sqrt().sum())
            if m is not linears[-1]:
                terms.append((sq.sum(dim=1) + GROUP_EPS).sqrt().sum())
    if not terms:
        raise ValueError("group_lasso: the model has no Conv2d or Linear layer")
    return torch.stack(terms).sum()


def lasso_coefficient(
    ce_loss: float | torch.Tensor, lasso_loss: float | torch.Tensor, ratio: float
) -> float:
    """The global group-lasso coefficient from the penalty ratio (Lym et al., Eq. 3).

    Solves ``ratio = lambda * GL / (CE + lambda * GL)`` for lambda:
    ``lambda = ratio * CE / ((1 - ratio) * GL)``, with ``CE`` the cross-entropy of the first
    batch and ``GL`` = :func:`group_lasso` at initialisation.

    Plausibility (not a test: it depends on the initialisation): the authors' stored values
    for CIFAR ResNet-32 are 8.5e-5 (r=0.1), 3.79e-4 (r=0.2), 1.01e-3 (r=0.4); the last two
    imply CE/GL = 1.52e-3 and the first 7.7e-4. This project's ResNet-32 has GL ~ 3.24e3 at
    initialisation with a 10-class head and ~ 3.28e3 with a 100-class one (seeds 0 and 1):
    with CE = ln 100 and the 100-class GL for the last two and ln 10 and the 10-class GL for
    the first, lambda = 3.51e-4, 9.37e-4 and 7.9e-5, each about 1.08 times below the stored
    value (a first batch's cross-entropy a little above ln C would
    account for it); the authors' directory of coefficients does not say which dataset
    each is for.

    Raises:
        ValueError: ``ratio`` outside (0, 1), a negative or non-finite ``ce_loss``, or a
            ``lasso_loss`` that is not positive and finite.
    """
    ce = float(ce_loss)
    gl = float(lasso_loss)
    if not 0.0 < ratio < 1.0:
        raise ValueError(f"penalty ratio must be in (0, 1), got {ratio}")
    if not (math.isfinite(ce) and ce >= 0):
        raise ValueError(f"cross-entropy must be finite and >= 0, got {ce}")
    if not (math.isfinite(gl) and gl > 0):
        raise ValueError(f"group lasso loss must be finite and > 0, got {gl}")
    return ratio * ce / ((1.0 - ratio) * gl)


@dataclass
class PruneTrainConfig(MethodConfig):
    """PruneTrain options.

    Args:
        penalty_ratio: group-lasso share of the first iteration's loss, Eq. (3); in (0, 1).
            The paper recommends 0.2-0.25 (Sec. 4.1).
        reconfig_interval: epochs between reconfigurations (paper: 10 CIFAR, 5 ImageNet), >= 1.
        threshold: weights with ``|w|`` below it count as zero (paper: 1e-4), >= 0.
        reconfig_at_end: also reconfigure after the last epoch (the final model is pruned).
        dynamic_batch: dynamic mini-batch adjustment (Sec. 4.3) after each reconfiguration.
        batch_step: granularity of the batch growth in samples (paper: 32), >= 1.
        max_batch: upper limit of the dynamic batch, >= 1.
        memory_budget_mb: memory budget of one iteration in MiB; 0 keeps the first
            iteration's memory (the paper's CIFAR rule). The iteration measured is the
            global batch's in one process, so under ``--nproc N`` a budget meant for one
            device's share must be given for the whole batch (about N times it).
        probe_repeats: when > 0, time one iteration of the model at the start and after each
            reconfiguration (minimum of this many repetitions on random data, wall clock and,
            on CPU, process CPU time, which other processes sharing the cores do not inflate,
            unlike the Trainer's per-epoch wall-clock medians); 0: off.
    """

    penalty_ratio: float = 0.2
    reconfig_interval: int = 10
    threshold: float = 1e-4
    reconfig_at_end: bool = True
    dynamic_batch: bool = False
    batch_step: int = 32
    max_batch: int = 512
    memory_budget_mb: float = 0.0
    probe_repeats: int = 0

    def __post_init__(self) -> None:
        if not 0.0 < self.penalty_ratio < 1.0:
            raise ValueError(f"penalty_ratio must be in (0, 1), got {self.penalty_ratio}")
        if self.reconfig_interval < 1:
            raise ValueError(f"reconfig_interval must be >= 1, got {self.reconfig_interval}")
        if not self.threshold >= 0:
            raise ValueError(f"threshold must be >= 0, got {self.threshold}")
        for name in ("batch_step", "max_batch"):  # one message each: the CLI names its flag
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.probe_repeats < 0:
            raise ValueError(f"probe_repeats must be >= 0, got {self.probe_repeats}")
        if not self.memory_budget_mb >= 0:
            raise ValueError(f"memory_budget_mb must be >= 0, got {self.memory_budget_mb}")


class PruneTrain(Method):
    """PruneTrain as a Trainer method (Algorithm 1 of the paper); see the module docstring."""

    name = "prunetrain"
    channels_last_on_cpu = True  # dense (reconfigured) layers: 48.7 vs 69.2 ms per step, once
    Config = PruneTrainConfig
    config: PruneTrainConfig

    def __init__(self, config: PruneTrainConfig | None = None) -> None:
        super().__init__(config)
        self.lam: float | None = None
        self.stage = 0
        self.history: list[dict[str, Any]] = []
        self.epoch_log: list[dict[str, Any]] = []
        self.train_flops_run = 0.0
        # the same by the authors' cost formula (impl.flops.paper_training_cost); None for a
        # run resumed from a checkpoint saved before it was kept
        self.paper_train_flops_run: float | None = 0.0
        self.bn_bytes_run = 0.0
        self.initial: dict[str, Any] = {}
        self.budget: float | None = None
        self.initial_batch: int | None = None
        self._epoch_memory: float | None = None  # one iteration this epoch (dynamic batch)
        self._cost: dict[str, float] | None = None
        self._memory_at: dict[int, int] = {}  # batch -> bytes of one iteration, this model
        self._samples = 0
        self._lasso_sum: torch.Tensor | None = None
        self._lasso_steps = 0
        self._last_report: ReconfigReport | None = None
        self._arch: dict[str, Any] | None = None  # the model's structure, for resume
        self.probes: list[dict[str, Any]] = []  # per stage: probed fwd / bwd ms

    # -- validation and setup ---------------------------------------------------------------
    def validate(self, train_config: Any) -> None:
        """Check the model is supported (built on the meta device: no memory, no time)."""
        from impl.models import create

        name = getattr(train_config, "model", None)
        if name is None:
            return
        with torch.device("meta"):
            model = create(name, stem=getattr(train_config, "stem", "cifar"))
        build_graph(model)

    def setup(self, ctx: TrainContext) -> None:
        """Check the model's structure and record the dense model's costs."""
        build_graph(ctx.model)
        self._arch = architecture(ctx.model)
        cost = self._costs(ctx)
        self.initial = {
            "params": _params(ctx.model),
            "inference_flops": cost["inference_flops"],
            "train_flops_per_sample": cost["train_flops_per_sample"],
            "paper_train_flops_per_sample": cost["paper_train_flops_per_sample"],
            "bn_bytes_per_sample": cost["bn_bytes_per_sample"],
        }
        if self.config.dynamic_batch:
            self.initial_batch = ctx.batch_size
            if self.config.memory_budget_mb > 0:
                self.budget = self.config.memory_budget_mb * 2**20
            else:
                self.budget = float(self._memory(ctx, ctx.batch_size))
        if self.config.probe_repeats and not self.probes:
            self._probe(ctx)

    # -- training events --------------------------------------------------------------------
    def on_epoch_start(self, ctx: TrainContext) -> None:
        """Reset the epoch's sample count and group-lasso sums; with the dynamic mini-batch,
        take the memory of one iteration of the epoch's model and batch (Fig. 9's axis)."""
        self._samples = 0
        self._lasso_sum = None
        self._lasso_steps = 0
        self._last_report = None
        if self.config.dynamic_batch:
            self._epoch_memory = float(self._memory(ctx, ctx.batch_size))

    def loss(
        self, ctx: TrainContext, loss: torch.Tensor, outputs: torch.Tensor, targets: torch.Tensor
    ) -> torch.Tensor:
        """``loss + lambda * group_lasso``; lambda is set at the first iteration (Alg. 1)."""
        gl = group_lasso(ctx.model)
        if self.lam is None:
            self.lam = lasso_coefficient(loss.detach(), gl.detach(), self.config.penalty_ratio)
        self._samples += int(outputs.shape[0])
        self._lasso_steps += 1
        g = gl.detach()
        self._lasso_sum = g if self._lasso_sum is None else self._lasso_sum + g
        return loss + self.lam * gl

    def on_epoch_end(self, ctx: TrainContext) -> None:
        """Account the epoch's cost; reconfigure (and grow the batch) when it is time.

        The epoch's samples are the Trainer's count over every rank (``epoch_samples``):
        ``loss`` sees this rank's share of each batch only, so with several processes its
        own count would leave out the other ranks' samples; it stands in where the Trainer
        gives none (hooks driven by hand)."""
        self._samples = int(ctx.extra.get("epoch_samples", self._samples))
        cost = self._costs(ctx)
        self.train_flops_run += cost["train_flops_per_sample"] * self._samples
        if self.paper_train_flops_run is not None:
            self.paper_train_flops_run += cost["paper_train_flops_per_sample"] * self._samples
        self.bn_bytes_run += cost["bn_bytes_per_sample"] * self._samples
        self.epoch_log.append(
            {
                "epoch": ctx.epoch,
                "stage": self.stage,
                "batch_size": ctx.batch_size,
                "samples": self._samples,
                "fwd_ms": _float(ctx.extra.get("epoch_fwd_ms")),
                "bwd_ms": _float(ctx.extra.get("epoch_bwd_ms")),
                "inference_flops": cost["inference_flops"],
                "train_flops": cost["train_flops_per_sample"] * self._samples,
            }
        )
        total = getattr(ctx.config, "epochs", None)
        last = total is not None and ctx.epoch + 1 >= total
        due = (ctx.epoch + 1) % self.config.reconfig_interval == 0
        if not (due or (last and self.config.reconfig_at_end)):
            return
        report = reconfigure(ctx.model, ctx.optimizer, self.config.threshold)
        self._last_report = report
        self._arch = architecture(ctx.model)
        self._cost = None
        self._memory_at = {}
        after = self._costs(ctx)
        self.stage += 1
        entry: dict[str, Any] = {
            "epoch": ctx.epoch,
            "stage": self.stage,
            "params_before": report.params_before,
            "params_after": report.params_after,
            "inference_flops_before": cost["inference_flops"],
            "inference_flops_after": after["inference_flops"],
            "channels_before": report.channels_before,
            "channels_after": report.channels_after,
            "removed_paths": list(report.removed_paths),
            "removed_layers": list(report.removed_layers),
            "zeroed_groups": report.zeroed_groups,
            "batch_size_before": ctx.batch_size,
        }
        if self.config.dynamic_batch and not last:
            ctx.batch_size = self._grow_batch(ctx)
        entry["batch_size_after"] = ctx.batch_size
        self.history.append(entry)
        if self.config.probe_repeats and not last:
            self._probe(ctx)

    # -- reporting --------------------------------------------------------------------------
    def epoch_metrics(self, ctx: TrainContext) -> dict[str, Any]:
        """Per epoch: lambda, mean lasso term, channels per layer, params, FLOPs, BN traffic,
        what this epoch's reconfiguration removed (model sizes are after it)."""
        cost = self._costs(ctx)
        log = self.epoch_log[-1] if self.epoch_log else {}
        mean_gl = (
            float(self._lasso_sum) / self._lasso_steps if self._lasso_sum is not None else None
        )
        row: dict[str, Any] = {
            "lasso_lambda": self.lam,
            "lasso_loss": mean_gl,
            "stage": self.stage,
            "params": _params(ctx.model),
            "inference_flops": cost["inference_flops"],
            "train_flops_per_sample": cost["train_flops_per_sample"],
            "train_flops_epoch": log.get("train_flops"),
            "train_flops_run": self.train_flops_run,
            "bn_traffic_bytes_per_sample": cost["bn_bytes_per_sample"],
            "bn_traffic_bytes_run": self.bn_bytes_run,
            "channels": channels_per_layer(ctx.model),
            "reconfigured": self._last_report is not None,
        }
        if self._last_report is not None:
            rep = self._last_report
            row["removed_paths"] = list(rep.removed_paths)
            row["zeroed_groups"] = rep.zeroed_groups
            row["removed_channels"] = {
                n: [c.out_before, c.out_after]
                for n, c in rep.layers.items()
                if c.out_after != c.out_before
            }
        if self.config.dynamic_batch:
            row["memory_budget_bytes"] = self.budget
            row["iteration_memory_bytes"] = self._epoch_memory
            row["next_batch_size"] = ctx.batch_size
        return row

    def summary(self, ctx: TrainContext) -> dict[str, Any]:
        """Reconfiguration history, time per iteration per stage, costs over the run."""
        cost = self._costs(ctx)
        dense_flops = self.initial.get("inference_flops") or float("nan")
        return {
            "lasso_lambda": self.lam,
            "reconfigurations": self.history,
            "stage_timing": self.stage_timing(),
            "inference_flops_dense": dense_flops,
            "inference_flops_final": cost["inference_flops"],
            "inference_flops_reduction": 1.0 - cost["inference_flops"] / dense_flops,
            "params_dense": self.initial.get("params"),
            "params_final": _params(ctx.model),
            "train_flops_run": self.train_flops_run,
            "paper_train_flops_run": self.paper_train_flops_run,
            "paper_train_flops_pct_of_dense": self.paper_train_flops_pct_of_dense(),
            "bn_traffic_bytes_run": self.bn_bytes_run,
            "bn_traffic_pct_of_dense": self.bn_traffic_pct_of_dense(),
            "layers_removed": [p for h in self.history for p in h["removed_paths"]],
            "channels_final": channels_per_layer(ctx.model),
        }

    def paper_train_flops_pct_of_dense(self) -> float | None:
        """Training FLOPs of the run so far in % of dense training on the same samples, both
        by the authors' cost formula (:func:`impl.flops.paper_training_cost`; PruneTrain
        Table 1's "Train. FLOPs", Sec. 5.1): each epoch's model times its samples, over the
        dense model's cost times all of them. None before any sample, or for a run resumed
        from a checkpoint that did not keep the formula's count."""
        dense = self.initial.get("paper_train_flops_per_sample")
        samples = sum(row["samples"] for row in self.epoch_log)
        if self.paper_train_flops_run is None or not dense or not samples:
            return None
        return 100.0 * self.paper_train_flops_run / (dense * samples)

    def bn_traffic_pct_of_dense(self) -> float | None:
        """Off-chip traffic of the BatchNorm layers over the run so far in % of the dense
        model's on the same samples (each epoch's model times its samples, over the dense
        model's bytes per sample times all of them): the "BN cost" of PruneTrain Fig. 8b and
        100 minus the BN traffic saved of Sec. 5.1. None before any sample."""
        dense = self.initial.get("bn_bytes_per_sample")
        samples = sum(row["samples"] for row in self.epoch_log)
        if not dense or not samples:
            return None
        return 100.0 * self.bn_bytes_run / (dense * samples)

    def stage_timing(self) -> list[dict[str, Any]]:
        """Per stage (the epochs between two reconfigurations): median fwd / bwd ms per
        iteration as the Trainer measured them, batch size and inference FLOPs."""
        stages: dict[int, list[dict[str, Any]]] = {}
        for row in self.epoch_log:
            stages.setdefault(row["stage"], []).append(row)
        probes = {p["stage"]: p for p in self.probes}
        out = []
        for stage, rows in sorted(stages.items()):
            fwd = [r["fwd_ms"] for r in rows if r["fwd_ms"] is not None]
            bwd = [r["bwd_ms"] for r in rows if r["bwd_ms"] is not None]
            f = statistics.median(fwd) if fwd else None
            b = statistics.median(bwd) if bwd else None
            out.append(
                {
                    "stage": stage,
                    "epochs": [r["epoch"] for r in rows],
                    "batch_size": rows[-1]["batch_size"],
                    "inference_flops": rows[-1]["inference_flops"],
                    "fwd_ms": f,
                    "bwd_ms": b,
                    "iter_ms": f + b if f is not None and b is not None else None,
                }
            )
            if stage in probes:
                out[-1]["probe_fwd_ms"] = probes[stage]["fwd_ms"]
                out[-1]["probe_bwd_ms"] = probes[stage]["bwd_ms"]
                out[-1]["probe_iter_ms"] = probes[stage]["fwd_ms"] + probes[stage]["bwd_ms"]
                out[-1]["probe_batch_size"] = probes[stage]["batch_size"]
                if "cpu_fwd_ms" in probes[stage]:
                    cpu = probes[stage]["cpu_fwd_ms"] + probes[stage]["cpu_bwd_ms"]
                    out[-1]["probe_cpu_iter_ms"] = cpu
        return out

    def cost(self, model: nn.Module) -> dict[str, Any]:
        """Every conv and linear is dense: PruneTrain's savings are in the (smaller) shapes."""
        from impl.flops import LayerDensity

        one = LayerDensity()
        return {n: one for n, m in model.named_modules() if isinstance(m, nn.Conv2d | nn.Linear)}

    # -- resume -----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Lambda, the architecture (removed blocks, every tensor's shape) and the logs."""
        return {
            "lam": self.lam,
            "stage": self.stage,
            "history": self.history,
            "epoch_log": self.epoch_log,
            "train_flops_run": self.train_flops_run,
            "paper_train_flops_run": self.paper_train_flops_run,
            "bn_bytes_run": self.bn_bytes_run,
            "initial": self.initial,
            "budget": self.budget,
            "initial_batch": self.initial_batch,
            "probes": self.probes,
            "architecture": self._arch,
        }

    def load_state_dict(self, state: dict[str, Any], ctx: TrainContext) -> None:
        """Restore the logs and lambda, and shrink ``ctx.model`` to the saved architecture."""
        self.lam = state["lam"]
        self.stage = int(state["stage"])
        self.history = list(state["history"])
        self.epoch_log = list(state["epoch_log"])
        self.train_flops_run = float(state["train_flops_run"])
        paper_run = state.get("paper_train_flops_run")
        self.paper_train_flops_run = None if paper_run is None else float(paper_run)
        self.bn_bytes_run = float(state["bn_bytes_run"])
        self.initial = dict(state["initial"])
        self.budget = state["budget"]
        self.initial_batch = state["initial_batch"]
        self.probes = list(state.get("probes", []))
        if state.get("architecture") is not None:
            apply_architecture(ctx.model, state["architecture"])
        self._arch = architecture(ctx.model)
        self._cost = None
        self._memory_at = {}

    # -- helpers ----------------------------------------------------------------------------
    def _costs(self, ctx: TrainContext) -> dict[str, float]:
        """Per-sample costs of ``ctx.model`` (cached until the next reconfiguration)."""
        if self._cost is None:
            from impl.flops import paper_training_cost, training_flops

            report = training_flops(ctx.model, ctx.input_shape, density=self.cost(ctx.model))
            paper = paper_training_cost(ctx.model, ctx.input_shape, 1)
            bn_elements = sum(
                math.prod(layer.out_shape) * layer.calls
                for layer in report.layers
                if layer.kind == "bn"
            )
            elem = next(ctx.model.parameters()).element_size()
            self._cost = {
                "inference_flops": float(report.forward),
                "train_flops_per_sample": float(report.total),
                "paper_train_flops_per_sample": float(paper.train_flops),
                "bn_bytes_per_sample": float(bn_elements * BN_ACCESSES_PER_ELEMENT * elem),
            }
        return self._cost

    def _memory(self, ctx: TrainContext, batch: int) -> int:
        """Bytes of one iteration of ``ctx.model`` at ``batch``, each batch measured once per
        architecture (the budget, the batch search and every epoch's figure ask again)."""
        if batch not in self._memory_at:
            if next(ctx.model.parameters()).device.type == "cuda":
                self._memory_at[batch] = measure_iteration_bytes(ctx.model, ctx.input_shape, batch)
            else:
                self._memory_at[batch] = estimate_iteration_bytes(ctx.model, ctx.input_shape, batch)
        return self._memory_at[batch]

    def _probe(self, ctx: TrainContext) -> None:
        from impl.train import autocast_dtype

        args = (ctx.model, ctx.input_shape, ctx.batch_size, self.config.probe_repeats)
        amp = autocast_dtype(ctx.config)  # timed in the arithmetic the run trains in
        fwd, bwd = probe_iteration_ms(*args, amp_dtype=amp)
        row = {"stage": self.stage, "batch_size": ctx.batch_size, "fwd_ms": fwd, "bwd_ms": bwd}
        if next(ctx.model.parameters()).device.type == "cpu":
            row["cpu_fwd_ms"], row["cpu_bwd_ms"] = probe_iteration_ms(
                *args, clock="cpu", amp_dtype=amp
            )
        self.probes.append(row)

    def _grow_batch(self, ctx: TrainContext) -> int:
        assert self.budget is not None and self.initial_batch is not None
        return choose_batch(
            ctx.batch_size,
            self.initial_batch,
            self.budget,
            lambda b: self._memory(ctx, b),
            step=self.config.batch_step,
            max_batch=self.config.max_batch,
        )


def channels_per_layer(model: nn.Module) -> dict[str, int]:
    """Output channels of every conv (qualified name -> channels)."""
    return {n: m.out_channels for n, m in model.named_modules() if isinstance(m, nn.Conv2d)}


def _params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _float(value: Any) -> float | None:
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


__all__ = [
    "LayerChange",
    "PruneTrain",
    "PruneTrainConfig",
    "ReconfigReport",
    "apply_architecture",
    "architecture",
    "channels_per_layer",
    "group_lasso",
    "lasso_coefficient",
    "reconfigure",
]
