"""ClickTrain (Zhang et al., ICS 2021): pattern-based pruning during training, stages 1 to 5.

The five stages (paper Fig. 4, Sec. 4 and 5), each a range of whole epochs:

1. ``dense``: dense training until the loss derivative over epochs falls below a threshold
   (Sec. 4.1), or for a fixed number of epochs.
2. ``pool``: dynamic pattern pool generation (Sec. 4.2, :class:`PatternPool`); the positions
   of a kernel that none of its candidate patterns can keep are penalised at once.
3. ``finalize``: adaptive pattern and kernel finalization (Sec. 4.3): per batch, each
   kernel's best pool pattern by Eq. (1) is counted; at the end each kernel takes its most
   frequent one, and the lowest-importance kernels (Eq. 2) are marked for removal.
4. ``regularize``: modified group lasso (Sec. 4.4) on the weights outside each kernel's
   pattern and on the removed kernels, until the hard-pruning epoch.
5. ``sparse``: hard pruning (masked weights exactly zero for the rest of training, gradient,
   momentum and weight decay included), and every pruned conv sparser than a threshold runs
   as a pattern-sparse conv (:class:`impl.ops.PatternConv2d`, Sec. 5.2 and 5.4).

Which convolutions are pruned: every 3x3 conv with ``groups=1`` except the model's first
conv (the stem, which reads the image). In the CIFAR/ImageNet ResNets that is exactly the 3x3
convs inside the residual stages (the authors' code; shortcut convs are 1x1 and the
classifier is linear, so they stay dense); in VGG every 3x3 conv but the first. With
``prune_pointwise`` the 1x1 convs (``groups=1``, all but the first conv) are pruned too, by
connectivity alone: a 1x1 kernel is one weight, so whole kernels go at the same fraction, and
no pattern applies (the bottleneck ResNets' rows of the paper need it; see the option).

Choices the paper leaves open are documented where they are made, and collected in
``docs/clicktrain.md``.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from impl.methods.base import Method, MethodConfig, TrainContext
from impl.methods.clicktrain_patterns import (
    KERNEL_SIZE,
    N_PATTERNS,
    LayerFinalizer,
    PatternPool,
    kernel_keep_mask,
    kernel_scores,
    loss_rose,
    modified_group_lasso,
    pattern_scores,
)
from impl.methods.masking import MaskSet, conv_weight_counts

logger = logging.getLogger(__name__)

STAGES: tuple[str, ...] = ("dense", "pool", "finalize", "regularize", "sparse")
KERNEL_RANKINGS: tuple[str, ...] = ("balanced", "layer")
SPARSE_IMPLS: tuple[str, ...] = ("auto", "ref", "cuda", "cpu", "none")

# Default stage lengths as fractions of the run's epochs (used when a field is None). The
# paper's CIFAR runs (190 epochs) hard-prune at epoch 90 to 98 (Table 1), about half-way.
DENSE_MAX_FRACTION = 0.25
POOL_FRACTION = 0.05
FINALIZE_FRACTION = 0.05
HARD_PRUNE_FRACTION = 0.5


def sparse_impl_missing(sparse_impl: str, device: str) -> str | None:
    """Why the pattern convs' ``sparse_impl`` cannot run for a run on ``device`` ("auto",
    "cpu", "cuda[:N]", resolved as the Trainer does: :func:`impl.train.pick_device`), or None
    when it can: ``"cuda"`` needs a run on a GPU whose CUDA pattern kernels load (compiling
    them on first use; a torchrun worker's GPU is that of its local rank), ``"cpu"`` a run on
    the CPU and the compiled pattern conv built
    (:func:`impl.ops.pattern_cpu.unavailable_reason`); ``"auto"``, ``"ref"`` and ``"none"``
    run anywhere."""
    if sparse_impl not in ("cuda", "cpu"):
        return None
    from impl.train import pick_device

    try:
        resolved = pick_device(str(device))
    except ValueError as err:
        return str(err)
    if resolved.type != sparse_impl:
        where = "CPU" if resolved.type == "cpu" else "GPU"
        return f"the run trains on the {where} (--device {device})"
    if sparse_impl == "cpu":
        from impl.ops import pattern_cpu

        return pattern_cpu.unavailable_reason()
    from impl import distributed
    from impl.ops.pattern import has_cuda_kernels

    world = distributed.env_world()  # a torchrun worker: the GPU of its local rank
    if world is not None:
        rank, size, local = world
        resolved = distributed.rank_device(resolved, distributed.DistInfo(rank, size, local))
    if has_cuda_kernels(resolved):
        return None
    from impl.cuda import cuda_kernels_error

    return cuda_kernels_error() or "the CUDA pattern kernels do not load"


@dataclass
class ClickTrainConfig(MethodConfig):
    """Options of ClickTrain (defaults: the paper's, Sec. 6.1, unless noted).

    Args:
        dense_epochs: fixed length of stage 1 in epochs; None (default) ends stage 1 by the
            loss-derivative rule, at the latest after ``max_dense_epochs``.
        loss_derivative_threshold: stage 1 ends after the first epoch ``e >= 1`` with
            ``|L[e-1] - L[e]| < threshold``, where ``L[e]`` is the mean training
            cross-entropy over epoch ``e``'s batches (paper: 0.27); a loss that rises by less
            than the threshold ends it too, one that jumps up by more does not.
        max_dense_epochs: latest end of stage 1 by the derivative rule; None: 25% of the
            epochs (at least 1), shortened if needed so that pool generation and
            finalization end by ``hard_prune_epoch`` with one epoch of stage 4 (the
            modified group lasso) before it (0, no stage 1, in runs of 2 to 6 epochs).
        pool_epochs: length of stage 2 (pattern pool generation); None: 5% of the epochs,
            at least 1.
        finalize_epochs: length of stage 3 (pattern and kernel finalization); None: 5% of
            the epochs, at least 1.
        hard_prune_epoch: the epoch at whose start masked weights become exactly zero and
            stage 5 begins (epochs count from 0: 98 hard-prunes after 98 whole epochs; equal
            to the run's epochs prunes the final model only); None: 50% of the epochs (paper
            Table 1: 90 to 98 of 190), moved later where stages 1 to 3 and one epoch of
            stage 4 need it, at most the run's epochs.
        pool_size: number of patterns in the dynamic pool, 1 to 126 (paper: 12; 4 and 8
            also studied).
        connectivity: fraction of each layer's kernels removed whole (connectivity
            sparsity), in [0, 1). 0.75 with 4-of-9 patterns gives 9 / (4 x 0.25) = 9x on the
            pruned layers (the authors' code uses 0.55 to 0.75 per layer).
        kernel_ranking: "balanced" (default): every filter of a layer loses the same number
            of kernels, so the sparse filter matrix has equal row lengths (Sec. 5.2's load
            balance); "layer": one ranking over the whole layer (the authors' code).
        loss_margin: delta of Sec. 4.3: a finalization batch whose loss rose by more than
            this fraction over the previous batch's is not counted (paper: 0.0018).
        penalty: coefficient of the modified group lasso (paper: 2.5e-4).
        early_regularization: penalise, during pool generation, the positions of each
            kernel that none of its candidate patterns can keep (Sec. 4.2, "Detailed
            optimizations").
        sparse_threshold: after hard pruning, a pruned conv whose fraction of zero weights
            exceeds this runs as a pattern-sparse conv (paper: 0.65, Sec. 5.2).
        sparse_impl: implementation of the pattern-sparse conv: "auto" (the CUDA kernels on a
            GPU, the compiled direct sparse conv on a CPU, where each can run), "ref" (im2col
            and torch's CSR SpMM, the paper's formulation), "cuda", "cpu", or "none" to keep
            every conv dense (masked) after hard pruning.
        prune_pointwise: also prune the 1x1 convs (``groups=1``, all but the first conv;
            shortcuts included) by connectivity alone: the ``connectivity`` fraction of their
            kernels (single weights) removed whole, chosen by the same Eq. (2) votes in stage
            3, penalised whole in stage 4 and zeroed at hard pruning; no pattern. Off by
            default, as in the authors' code (basic-block ResNets only). The paper's
            ResNet-50 rows need it: its 3x3 convs hold 48% of the conv weights, so 3x3
            pruning alone compresses them at most 1.9x, against Table 1's 4.1x (ImageNet)
            and 8.7-10.8x (CIFAR).
    """

    dense_epochs: int | None = None
    loss_derivative_threshold: float = 0.27
    max_dense_epochs: int | None = None
    pool_epochs: int | None = None
    finalize_epochs: int | None = None
    hard_prune_epoch: int | None = None
    pool_size: int = 12
    connectivity: float = 0.75
    kernel_ranking: str = "balanced"
    loss_margin: float = 0.0018
    penalty: float = 2.5e-4
    early_regularization: bool = True
    sparse_threshold: float = 0.65
    sparse_impl: str = "auto"
    prune_pointwise: bool = False


@dataclass(frozen=True)
class Schedule:
    """Resolved stage boundaries of one run, in epochs counted from 0.

    Args:
        epochs: the run's epochs.
        dense_epochs: fixed stage-1 length, or None for the loss-derivative rule.
        max_dense_epochs: latest end of stage 1.
        pool_epochs: stage-2 length.
        finalize_epochs: stage-3 length.
        hard_prune_epoch: first epoch of stage 5.
    """

    epochs: int
    dense_epochs: int | None
    max_dense_epochs: int
    pool_epochs: int
    finalize_epochs: int
    hard_prune_epoch: int


def resolve_schedule(cfg: ClickTrainConfig, epochs: int) -> Schedule:
    """Stage boundaries for a run of ``epochs`` epochs; ``ValueError`` when they cannot fit.

    Stages must come in order: stage 1 (fixed or at most ``max_dense_epochs``), then
    ``pool_epochs``, then ``finalize_epochs``, all ending by ``hard_prune_epoch <= epochs``.
    A stage left unset takes its fraction of the run (``*_FRACTION``), rounded half up; the
    default bound of stage 1, and an unset ``hard_prune_epoch`` after a set stage 1, leave
    stage 4 at least one epoch before hard pruning where the run has room for one (not in a
    2-epoch run, nor where a set stage 1 and stages 2-3 fill the run).
    """
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")

    def half_up(x: float) -> int:  # round() would round halves to even: 2.5 -> 2, 3.5 -> 4
        return math.floor(x + 0.5)

    def frac(f: float) -> int:
        return max(1, half_up(f * epochs))

    for name in ("dense_epochs", "max_dense_epochs", "pool_epochs", "finalize_epochs"):
        value = getattr(cfg, name)
        if value is not None and value < (0 if name == "dense_epochs" else 1):
            low = 0 if name == "dense_epochs" else 1
            raise ValueError(f"{name} must be >= {low} in ClickTrain's schedule, got {value}")
    pool = cfg.pool_epochs if cfg.pool_epochs is not None else frac(POOL_FRACTION)
    fin = cfg.finalize_epochs if cfg.finalize_epochs is not None else frac(FINALIZE_FRACTION)
    if cfg.dense_epochs is not None:
        dense_max = cfg.dense_epochs
    elif cfg.max_dense_epochs is not None:
        dense_max = cfg.max_dense_epochs
    else:
        dense_max = None
    needed = (dense_max or 0) + pool + fin
    if needed > epochs:
        raise ValueError(
            f"ClickTrain stage schedule does not fit in {epochs} epochs: stage 1 "
            f"({dense_max or 0}), pool generation ({pool}) and finalization ({fin}) need "
            f"{needed} (set more --epochs, or shorter stages)"
        )
    if cfg.hard_prune_epoch is not None:
        hard = cfg.hard_prune_epoch
    else:
        # after stages 1-3 and one epoch of stage 4 (the modified group lasso that drives
        # the weights outside the patterns towards zero before they are cut, Sec. 4.4), where
        # the run has room: a set stage 1 (dense_epochs=12 of 30) left stage 4 no epoch
        hard = min(epochs, max(half_up(HARD_PRUNE_FRACTION * epochs), needed + 1))
    if dense_max is None:
        # the derivative rule's cap: 25%, shortened so that stage 4 (the modified group
        # lasso) keeps at least one epoch where the run has room (0 skips stage 1); without
        # it a stage 1 that ran to its cap left runs of up to 10 epochs no regularization
        default = max(1, half_up(DENSE_MAX_FRACTION * epochs))
        dense_max = max(0, min(default, hard - pool - fin - 1))
    if hard > epochs:
        raise ValueError(
            f"ClickTrain stage schedule does not fit in {epochs} epochs: hard pruning at epoch "
            f"{hard} comes after the end of training; stages 1-3 need {dense_max} + {pool} + "
            f"{fin} epochs (set --epochs, or shorter stages)"
        )
    if dense_max + pool + fin > hard:
        raise ValueError(
            f"inconsistent ClickTrain stage schedule: stage 1 (up to {dense_max} epochs) + pool "
            f"generation ({pool}) + finalization ({fin}) end at epoch {dense_max + pool + fin}, "
            f"after hard_prune_epoch={hard}; hard pruning must come after finalization ends"
        )
    return Schedule(epochs, cfg.dense_epochs, dense_max, pool, fin, hard)


def prunable_layers(model: nn.Module, pointwise: bool = False) -> list[str]:
    """Qualified names of the convs ClickTrain prunes (see the module docstring), in the
    model's order.

    Every ``nn.Conv2d`` with a 3x3 kernel and ``groups=1``, except the model's first conv;
    with ``pointwise`` the 1x1 convs with ``groups=1`` too (:func:`pointwise_layers`).
    """
    sizes = [(KERNEL_SIZE, KERNEL_SIZE)] + ([(1, 1)] if pointwise else [])
    convs = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Conv2d)]
    return [
        name
        for i, (name, m) in enumerate(convs)
        if i > 0 and tuple(m.kernel_size) in sizes and m.groups == 1
    ]


def pointwise_layers(model: nn.Module) -> list[str]:
    """The 1x1 convs (``groups=1``, all but the first conv) that ``prune_pointwise`` adds."""
    return [
        n
        for n in prunable_layers(model, pointwise=True)
        if tuple(model.get_submodule(n).kernel_size) == (1, 1)
    ]


# The one "pattern" of a 1x1 kernel: its single weight (connectivity pruning only).
POINTWISE_PATTERNS = torch.ones(1, 1, 1, dtype=torch.bool)


def _check_model(model: nn.Module, model_name: str = "the model") -> list[str]:
    names = prunable_layers(model)
    if not names:
        raise ValueError(
            f"ClickTrain needs 3x3 convolutions (groups=1) besides the first conv; "
            f"{model_name} has none"
        )
    return names


def _set_module(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, module)


class ClickTrain(Method):
    """ClickTrain: importance-driven pattern and connectivity pruning during training."""

    name = "clicktrain"
    Config = ClickTrainConfig

    def __init__(self, config: ClickTrainConfig | None = None) -> None:
        super().__init__(config)
        self.cfg: ClickTrainConfig = self.config  # type: ignore[assignment]
        self.schedule: Schedule | None = None
        self.layers: list[str] = []
        self.pointwise: set[str] = set()  # 1x1 layers of self.layers (prune_pointwise)
        self.stage = "dense"
        self.stage_start: dict[str, int] = {}
        self.epoch_losses: list[float] = []
        self.pool = PatternPool()  # rebuilt with the configured size in setup(), once validated
        self.reachable: dict[str, torch.Tensor] = {}
        self.finalizers: dict[str, LayerFinalizer] = {}
        self.chosen: dict[str, torch.Tensor] = {}  # [F, C] pool indices
        self.removed: dict[str, torch.Tensor] = {}  # [F, C] bool
        self.keep: dict[str, torch.Tensor] = {}  # [F, C, R, S] bool, patterns of all kernels
        self.masks = MaskSet()
        self.sparse_layers: dict[str, dict[str, Any]] = {}
        # cross-entropy of the previous batch (a tensor: no device sync outside stage 3)
        self._prev_loss: torch.Tensor | float | None = None
        # per-epoch accumulators (reset at each epoch start; checkpoints come at epoch ends)
        self._epoch_stage = self.stage
        self._loss_sum: torch.Tensor | None = None
        self._penalty_sum: torch.Tensor | None = None
        self._batches = 0
        self._batch_loss: torch.Tensor | None = None
        self._counted = 0
        self._last_derivative: float | None = None

    # -- validation ---------------------------------------------------------------------------
    def validate(self, train_config: Any) -> None:
        """Check every option, the stage schedule and the model before training starts."""
        c = self.cfg
        if not isinstance(c.pool_size, int) or not 1 <= c.pool_size <= N_PATTERNS:
            raise ValueError(f"pool_size must be an int in 1..{N_PATTERNS}, got {c.pool_size!r}")
        if not 0.0 <= c.connectivity < 1.0:
            raise ValueError(f"connectivity must be in [0, 1), got {c.connectivity}")
        if c.kernel_ranking not in KERNEL_RANKINGS:
            raise ValueError(
                f"kernel_ranking must be one of {', '.join(KERNEL_RANKINGS)}, "
                f"got {c.kernel_ranking!r}"
            )
        if c.sparse_impl not in SPARSE_IMPLS:
            raise ValueError(
                f"sparse_impl must be one of {', '.join(SPARSE_IMPLS)}, got {c.sparse_impl!r}"
            )
        # The pattern convs are built at hard pruning, half-way through the run: say now, not
        # then, that the kernels asked for cannot run.
        reason = sparse_impl_missing(c.sparse_impl, getattr(train_config, "device", "auto"))
        if reason is not None:
            kernels = "CUDA kernels" if c.sparse_impl == "cuda" else "compiled path"
            raise ValueError(
                f"sparse_impl={c.sparse_impl!r} cannot run here: {reason}; use 'auto' (the "
                f"{kernels} where they run, the reference elsewhere) or 'ref'"
            )
        if not c.loss_derivative_threshold > 0:
            raise ValueError(
                f"loss_derivative_threshold must be > 0, got {c.loss_derivative_threshold}"
            )
        if not (c.loss_margin >= 0 and math.isfinite(c.loss_margin)):
            raise ValueError(f"loss_margin must be a finite number >= 0, got {c.loss_margin}")
        if not (c.penalty >= 0 and math.isfinite(c.penalty)):
            raise ValueError(f"penalty must be a finite number >= 0, got {c.penalty}")
        if not 0.0 <= c.sparse_threshold <= 1.0:
            raise ValueError(f"sparse_threshold must be in [0, 1], got {c.sparse_threshold}")
        resolve_schedule(c, int(train_config.epochs))
        model_name = getattr(train_config, "model", None)
        if model_name:
            from impl.models import create

            with torch.device("meta"):  # structure only: no memory, no initialisation cost
                model = create(model_name, stem=getattr(train_config, "stem", "cifar"))
            _check_model(model, repr(model_name))

    # -- events -------------------------------------------------------------------------------
    def setup(self, ctx: TrainContext) -> None:
        """Find the prunable convs and resolve the stage schedule."""
        _check_model(ctx.model)
        self.layers = prunable_layers(ctx.model, self.cfg.prune_pointwise)
        self.pointwise = set(pointwise_layers(ctx.model)) if self.cfg.prune_pointwise else set()
        self.schedule = resolve_schedule(self.cfg, int(ctx.config.epochs))
        self.pool = PatternPool(self.cfg.pool_size)
        self.stage_start = {"dense": 0}
        if self.schedule.max_dense_epochs == 0:
            self._enter("pool", 0)

    def _enter(self, stage: str, epoch: int) -> None:
        self.stage = stage
        self.stage_start[stage] = epoch

    def _weight(self, model: nn.Module, name: str) -> nn.Parameter:
        return model.get_submodule(name).weight

    def _patterns(self, name: str, device: torch.device | str | None = None) -> torch.Tensor:
        """The patterns layer ``name`` chooses among: the pool's, or a 1x1 kernel's one."""
        if name in self.pointwise:
            return POINTWISE_PATTERNS.to(device)
        return self.pool.patterns(device)

    def on_epoch_start(self, ctx: TrainContext) -> None:
        """Record the stage this epoch trains in and reset the epoch's loss and penalty sums."""
        self._epoch_stage = self.stage
        self._last_derivative = None
        self._loss_sum = None
        self._penalty_sum = None
        self._batches = 0
        self._counted = 0

    def loss(
        self, ctx: TrainContext, loss: torch.Tensor, outputs: torch.Tensor, targets: torch.Tensor
    ) -> torch.Tensor:
        """Record the batch's cross-entropy and add the stage's modified group lasso."""
        ce = loss.detach()
        self._batch_loss = ce
        self._loss_sum = ce if self._loss_sum is None else self._loss_sum + ce
        self._batches += 1
        if self.cfg.penalty == 0 or self.stage in ("dense", "sparse"):
            return loss
        penalty = self._penalty(ctx.model)
        if penalty is None:
            return loss
        value = penalty.detach()
        self._penalty_sum = value if self._penalty_sum is None else self._penalty_sum + value
        return loss + self.cfg.penalty * penalty

    def _penalty(self, model: nn.Module) -> torch.Tensor | None:
        """The modified group lasso of the current stage, summed over the pruned layers.

        Stage 2: per kernel, the positions no candidate pattern can keep (from the previous
        batch's candidates). Stage 3: the positions covered by no pool pattern (usually
        none). Stage 4: outside each kernel's final pattern, plus removed kernels whole.
        """
        terms = []
        if self.stage == "pool":
            if not self.cfg.early_regularization or not self.reachable:
                return None
            for name in self.layers:
                if name in self.reachable:
                    w = self._weight(model, name)
                    terms.append(modified_group_lasso(w, self.reachable[name]))
        elif self.stage == "finalize":
            union = self.pool.patterns().any(dim=0)
            if bool(union.all()):
                return None
            for name in self.layers:
                if name in self.pointwise:  # no pattern: nothing outside one to penalise
                    continue
                w = self._weight(model, name)
                keep = union.to(w.device).expand_as(w)
                terms.append(modified_group_lasso(w, keep))
        elif self.stage == "regularize":
            for name in self.layers:
                w = self._weight(model, name)
                keep = None if name in self.pointwise else self.keep[name]
                terms.append(modified_group_lasso(w, keep, self.removed[name]))
        return torch.stack(terms).sum() if terms else None

    @torch.no_grad()
    def after_backward(self, ctx: TrainContext) -> None:
        """Stage 2: candidate patterns into the pool; stage 3: count best patterns; stage 5:
        zero the gradients of pruned weights."""
        model = ctx.model
        if self.stage == "pool":
            for name in self.layers:
                w = self._weight(model, name)
                if w.grad is None or name in self.pointwise:  # the pool is of 3x3 patterns
                    continue
                self.reachable[name] = self.pool.update(w.detach(), w.grad.detach())
        elif self.stage == "finalize":
            loss = float(self._batch_loss) if self._batch_loss is not None else float("nan")
            prev = None if self._prev_loss is None else float(self._prev_loss)
            count = not loss_rose(prev, loss, self.cfg.loss_margin)
            self._counted += int(count)
            patterns: dict[bool, torch.Tensor] = {}  # per kind of layer, once per batch
            for name in self.layers:
                w = self._weight(model, name)
                if w.grad is None:
                    continue
                kind = name in self.pointwise
                if kind not in patterns:
                    patterns[kind] = self._patterns(name, w.device)
                self.finalizers[name].update(w.detach(), w.grad.detach(), patterns[kind], count)
        elif self.stage == "sparse":
            self.masks.apply_to_grads(model)
        # The loss margin compares consecutive batches (across epoch boundaries too).
        self._prev_loss = self._batch_loss

    def after_step(self, ctx: TrainContext) -> None:
        """Stage 5: re-zero pruned weights and their optimizer state."""
        if self.stage == "sparse":
            self.masks.enforce(ctx.model, ctx.optimizer)

    def on_epoch_end(self, ctx: TrainContext) -> None:
        """Advance the stages whose end has come (several may end at one boundary)."""
        assert self.schedule is not None
        s = self.schedule
        epoch = ctx.epoch
        mean_loss = (
            float(self._loss_sum) / self._batches if self._loss_sum is not None else float("nan")
        )
        self.epoch_losses.append(mean_loss)
        nxt = epoch + 1
        if self.stage == "dense":
            if len(self.epoch_losses) >= 2:
                self._last_derivative = self.epoch_losses[-2] - self.epoch_losses[-1]
            if s.dense_epochs is not None:
                done = nxt >= s.dense_epochs
            else:
                # |dL/de|: a loss that jumps up is not a loss that has settled.
                below = (
                    self._last_derivative is not None
                    and abs(self._last_derivative) < self.cfg.loss_derivative_threshold
                )
                done = below or nxt >= s.max_dense_epochs
            if done:
                self._enter("pool", nxt)
        if self.stage == "pool" and nxt - self.stage_start["pool"] >= s.pool_epochs:
            self._finish_pool(ctx)
            self._enter("finalize", nxt)
        if self.stage == "finalize" and nxt - self.stage_start["finalize"] >= s.finalize_epochs:
            self._finish_finalization()
            self._enter("regularize", nxt)
        if self.stage == "regularize" and nxt >= s.hard_prune_epoch:
            self._hard_prune(ctx)
            self._enter("sparse", nxt)

    # -- stage transitions --------------------------------------------------------------------
    def _finish_pool(self, ctx: TrainContext) -> None:
        self.pool.finalize()
        self.reachable = {}
        n = self.pool.pattern_ids.numel()  # type: ignore[union-attr]
        balanced = self.cfg.kernel_ranking == "balanced"
        for name in self.layers:
            w = self._weight(ctx.model, name)
            size = 1 if name in self.pointwise else n
            self.finalizers[name] = LayerFinalizer(
                (w.shape[0], w.shape[1]), size, self.cfg.connectivity, balanced, device=w.device
            )

    def _finish_finalization(self) -> None:
        for name, fin in self.finalizers.items():
            chosen = fin.final_patterns()
            self.chosen[name] = chosen.cpu()
            self.removed[name] = fin.removed_kernels()
            self.keep[name] = self._patterns(name, chosen.device)[chosen]
        self.finalizers = {}

    def _hard_prune(self, ctx: TrainContext) -> None:
        """Zero masked weights for good and swap sparse-enough convs for pattern convs."""
        model = ctx.model
        for name in self.layers:
            keep = kernel_keep_mask(self._patterns(name), self.chosen[name], self.removed[name])
            w = self._weight(model, name)
            self.masks.set(f"{name}.weight", keep.to(w.device))
        self.masks.enforce(model, ctx.optimizer)
        self._replace_convs(model)

    def _replace_convs(self, model: nn.Module) -> None:
        from impl.ops import PatternConv2d
        from impl.ops.pattern import pattern_conv_unsupported

        self.sparse_layers = {}
        for name in self.layers:
            keep = self.masks[f"{name}.weight"]
            sparsity = 1.0 - float(keep.double().mean())
            use = self.cfg.sparse_impl != "none" and sparsity > self.cfg.sparse_threshold
            conv = model.get_submodule(name)
            why = None if isinstance(conv, PatternConv2d) else pattern_conv_unsupported(conv)
            if use and why:  # pruned all the same: a masked dense conv, as below the threshold
                logger.warning("ClickTrain: %s stays a masked dense conv: PatternConv2d %s",
                               name, why)  # fmt: skip
                use = False
            self.sparse_layers[name] = {"sparsity": sparsity, "pattern_conv": use}
            if why:
                self.sparse_layers[name]["dense_because"] = f"PatternConv2d {why}"
            if use:
                if not isinstance(conv, PatternConv2d):
                    sparse = PatternConv2d.from_conv(conv, keep, self.cfg.sparse_impl)
                    _set_module(model, name, sparse)

    # -- reporting ----------------------------------------------------------------------------
    def epoch_metrics(self, ctx: TrainContext) -> dict[str, Any]:
        """Stage, loss derivative, mean penalty, counted batches (of the epoch's batches), and
        sparsity once pruned."""
        out: dict[str, Any] = {"clicktrain_stage": self._epoch_stage}
        if self._last_derivative is not None:
            out["clicktrain_loss_derivative"] = self._last_derivative
        if self._penalty_sum is not None and self._batches:
            out["clicktrain_penalty"] = float(self._penalty_sum) / self._batches
        if self._epoch_stage == "finalize":
            # counted of all the epoch's batches: a batch whose loss rose by more than delta
            # over the one before is not counted
            out["clicktrain_counted_batches"] = self._counted
            out["clicktrain_finalize_batches"] = self._batches
        if self.stage == "sparse":
            total, nonzero = conv_weight_counts(ctx.model)
            out["clicktrain_conv_compression"] = total / max(nonzero, 1)
            if self._epoch_stage != "sparse":  # hard-pruned at this epoch's end, then tested
                out["clicktrain_evaluated_after_hard_prune"] = True
        return out

    def cost(self, model: nn.Module) -> dict[str, Any]:
        """Nominal densities of the hard-pruned convs (kept fraction, for all three kinds)."""
        if self.stage != "sparse":
            return {}
        from impl.flops import LayerDensity

        return {
            name: LayerDensity.uniform(float(self.masks[f"{name}.weight"].double().mean()))
            for name in self.layers
        }

    def summary(self, ctx: TrainContext) -> dict[str, Any]:
        """Pool, pattern usage, per-layer sparsity, compression and FLOPs (see docs)."""
        from impl.methods.clicktrain_report import clicktrain_summary

        return clicktrain_summary(self, ctx)

    # -- resume -------------------------------------------------------------------------------
    def comm_masks(self, ctx: TrainContext) -> dict[str, torch.Tensor] | None:
        """The fixed masks once hard-pruned (pattern Allreduce, Sec. 5.3), else ``None``."""
        return dict(self.masks.items()) if self.stage == "sparse" and len(self.masks) else None

    def state_dict(self) -> dict[str, Any]:
        """Stage, schedule state, pool, counters, masks and replaced convs (for resume)."""
        return {
            "stage": self.stage,
            "stage_start": dict(self.stage_start),
            "epoch_losses": list(self.epoch_losses),
            "prev_loss": None if self._prev_loss is None else float(self._prev_loss),
            "last_derivative": self._last_derivative,
            "pool": self.pool.state_dict(),
            "reachable": {n: t.cpu().clone() for n, t in self.reachable.items()},
            "finalizers": {n: f.state_dict() for n, f in self.finalizers.items()},
            "chosen": {n: t.cpu().clone() for n, t in self.chosen.items()},
            "removed": {n: t.cpu().clone() for n, t in self.removed.items()},
            "keep": {n: t.cpu().clone() for n, t in self.keep.items()},
            "masks": self.masks.state_dict(),
            "sparse_layers": {n: dict(v) for n, v in self.sparse_layers.items()},
        }

    def load_state_dict(self, state: dict[str, Any], ctx: TrainContext) -> None:
        """Restore the state and redo the conv replacements on ``ctx.model``."""
        device = ctx.device
        self.stage = str(state["stage"])
        if self.stage not in STAGES:
            raise ValueError(f"unknown ClickTrain stage {self.stage!r} in the checkpoint")
        self.stage_start = {k: int(v) for k, v in state["stage_start"].items()}
        self.epoch_losses = [float(v) for v in state["epoch_losses"]]
        self._prev_loss = None if state["prev_loss"] is None else float(state["prev_loss"])
        ld = state["last_derivative"]
        self._last_derivative = None if ld is None else float(ld)
        self.pool.load_state_dict(state["pool"])
        self.reachable = {n: t.to(device) for n, t in state["reachable"].items()}
        self.finalizers = {}
        for name, fs in state["finalizers"].items():
            w = self._weight(ctx.model, name)
            n_pool = fs["pattern_counts"].shape[-1]
            fin = LayerFinalizer(
                (w.shape[0], w.shape[1]), n_pool, fs["fraction"], fs["balanced"], device=w.device
            )
            fin.load_state_dict(fs)
            self.finalizers[name] = fin
        self.chosen = {n: t.cpu() for n, t in state["chosen"].items()}
        self.removed = {n: t.to(device) for n, t in state["removed"].items()}
        self.keep = {n: t.to(device) for n, t in state["keep"].items()}
        self.masks.load_state_dict({n: t.to(device) for n, t in state["masks"].items()})
        self.sparse_layers = {}
        if self.stage == "sparse":
            self._replace_convs(ctx.model)


__all__ = [
    "STAGES",
    "ClickTrain",
    "ClickTrainConfig",
    "PatternPool",
    "Schedule",
    "kernel_scores",
    "pattern_scores",
    "pointwise_layers",
    "prunable_layers",
    "resolve_schedule",
]
