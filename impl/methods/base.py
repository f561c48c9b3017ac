"""The plug-in interface between the Trainer and a pruning-during-training method.

A method is an object whose hooks the Trainer calls at fixed events. The Trainer knows no
method by name, and a method never reaches into the Trainer: everything it may read or
change is on the :class:`TrainContext` it is handed.

Event order for one run::

    setup(ctx)                      model built and on its device, optimizer not yet built
    [load_state_dict(state, ctx)]   only when resuming: restores the method's state and any
                                    structural change it made to ctx.model (pruned shapes,
                                    replaced modules) so that the saved weights fit
    (model weights loaded, optimizer built, optimizer state loaded when resuming)
    for epoch:
        on_epoch_start(ctx)
        for batch:
            loss = loss(ctx, loss, outputs, targets)   adds regularisation
            (backward)
            after_backward(ctx)     gradients are in .grad
            (optimizer.step())
            after_step(ctx)         re-apply masks etc.
        on_epoch_end(ctx)           may reconfigure ctx.model / ctx.optimizer in place
        epoch_metrics(ctx) -> dict  merged into that epoch's metrics.jsonl line
    summary(ctx) -> dict            merged into summary.json
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn


@dataclass
class MethodConfig:
    """Base of every method's typed config. Subclasses add fields with an ``Args:`` docstring.

    Field names become command-line flags: ``penalty_ratio`` -> ``--penalty-ratio``.
    """


@dataclass
class TrainContext:
    """What a method may read and change during training.

    Args:
        model: the network being trained (a method may replace it, or modules inside it).
        optimizer: the optimizer (``None`` during ``setup``); a method that changes the model's
            parameters must update the optimizer's param_groups and state to match. Under
            ``fp16`` a method may replace it in ``on_epoch_end`` only (the Trainer refuses a
            replacement in ``after_backward``: the new one's gradients were never unscaled).
        config: the run's resolved :class:`impl.config.TrainConfig`.
        device: where the model lives.
        epoch: the current epoch, from 0.
        step: training iterations run so far in the whole run (under ``fp16`` a step skipped
            for an overflow counts too: the schedule moves on as the data does).
        steps_per_epoch: batches per epoch at the current batch size.
        batch_size: the current training batch size (a method may change it; the Trainer
            rebuilds its loader and rescales the learning rate linearly when it does).
        input_shape: shape of one input sample, ``(C, H, W)``.
        last_loss: the mean training cross-entropy (before regularisation) of the last
            finished epoch, over its steps (each batch's mean counted once, the short last
            batch too, as the metrics' ``train_loss``); NaN during the first. Set once per
            epoch, whatever the progress display (a per-step value would cost a device sync
            every step); a resumed run restores it from the checkpoint.
        progress: whether this process shows what it does on standard error (a long
            end-of-run measurement can say it is running); how the process runs, not the
            run's state: never checkpointed.
        extra: free-form per-run scratch space for the method. The Trainer writes ``seed``
            at setup and, before ``on_epoch_end``, the epoch's ``epoch_samples`` (training
            samples over every rank), ``epoch_fwd_ms`` and ``epoch_bwd_ms`` (median ms per
            iteration) and ``epoch_train_loss``.
    """

    model: nn.Module
    optimizer: torch.optim.Optimizer | None
    config: Any
    device: torch.device
    epoch: int = 0
    step: int = 0
    steps_per_epoch: int = 0
    batch_size: int = 0
    input_shape: tuple[int, int, int] = (3, 32, 32)
    last_loss: float = float("nan")
    progress: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


class Method:
    """A pruning-during-training method: the dense baseline is this class with no overrides."""

    name: ClassVar[str] = "base"
    Config: ClassVar[type[MethodConfig]] = MethodConfig
    #: Whether the method's training step runs faster with channels_last weights on a CPU:
    #: ``TrainConfig.memory_format="auto"`` (the cpu preset) picks that layout only then.
    #: False unless measured (docs/reproductions.md, "make demo"): a method whose own ops
    #: read NCHW pays a layout copy per call instead.
    channels_last_on_cpu: ClassVar[bool] = False

    def __init__(self, config: MethodConfig | None = None) -> None:
        self.config = config if config is not None else self.Config()

    # -- validation -------------------------------------------------------------------------
    def validate(self, train_config: Any) -> None:
        """Raise ``ValueError`` on a config that cannot work, before any training starts."""

    # -- events -----------------------------------------------------------------------------
    def setup(self, ctx: TrainContext) -> None:
        """Called once, before the optimizer is built; may replace modules of ``ctx.model``."""

    def on_epoch_start(self, ctx: TrainContext) -> None:
        """Called at the start of every epoch."""

    def loss(
        self, ctx: TrainContext, loss: torch.Tensor, outputs: torch.Tensor, targets: torch.Tensor
    ) -> torch.Tensor:
        """Return the loss to back-propagate (default: unchanged)."""
        return loss

    def after_backward(self, ctx: TrainContext) -> None:
        """Called after ``loss.backward()``, before the optimizer step."""

    def after_step(self, ctx: TrainContext) -> None:
        """Called after every optimizer step."""

    def on_epoch_end(self, ctx: TrainContext) -> None:
        """Called after every epoch's training (before evaluation)."""

    # -- reporting --------------------------------------------------------------------------
    def epoch_metrics(self, ctx: TrainContext) -> dict[str, Any]:
        """Extra JSON-serialisable values for this epoch's line of metrics.jsonl."""
        return {}

    def summary(self, ctx: TrainContext) -> dict[str, Any]:
        """Extra JSON-serialisable values for summary.json."""
        return {}

    def cost(self, model: nn.Module) -> dict[str, Any]:
        """Per-layer densities the method saves, for nominal FLOPs (see :mod:`impl.flops`).

        Returns a mapping from a module's qualified name to a
        :class:`impl.flops.LayerDensity`; a layer not named counts at the fraction of its
        weights that are nonzero (dense for a dense layer; :func:`impl.flops.training_flops`).
        """
        return {}

    def comm_masks(self, ctx: TrainContext) -> dict[str, torch.Tensor] | None:
        """Fixed keep-masks ``{parameter name: bool tensor}`` whose pruned gradients need not be
        communicated (ClickTrain Sec. 5.3, pattern Allreduce), or ``None`` while training dense
        or while masks still change. Identical on every rank; read by the Trainer after every
        optimizer step and after ``on_epoch_end``.
        """
        return None

    # -- resume -----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue the method after a resume (tensors and plain data)."""
        return {}

    def load_state_dict(self, state: dict[str, Any], ctx: TrainContext) -> None:
        """Restore what :meth:`state_dict` returned.

        Called after ``setup`` and before the saved model weights are loaded and the optimizer
        is built, so a method that changed the model's structure (smaller layers, replaced
        modules) must redo that change on ``ctx.model`` here.
        """

    def config_dict(self) -> dict[str, Any]:
        """The method's config as plain data."""
        return dataclasses.asdict(self.config)
