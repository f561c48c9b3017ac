"""Reproductions of Campfire's tables (2020), one module each.

Shared here: the paper's ImageNet timeline (epochs, learning-rate drops, start and length of
the pruning era) mapped onto a scale's run, and the rows the tables reuse: a row of Table 2
at cpu scale is the same run (same config hash) as the matching row of Tables 3, 4, 6 and 8.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from reproductions.common import Row, RunRecord

# Epochs of a run at each scale, standing for the paper's 100 (ImageNet, Sec. 3 / App. B.3).
EPOCHS = {"smoke": 4, "cpu": 10, "gpu": 30, "paper": 100}
PAPER_EPOCHS = 100


def to_scale(paper_epoch: int, scale: str) -> int:
    """An epoch of the paper's 100-epoch timeline on the scale's run (rounded)."""
    return round(paper_epoch * EPOCHS[scale] / PAPER_EPOCHS)


def train_for(
    scale: str, *, last_drop: int = 90, batch: int | None = None, paper_model: str = "resnet50"
) -> dict[str, Any]:
    """TrainConfig fields: the paper's step schedule (x0.1 at epochs 30, 60 and
    ``last_drop`` of 100, lr 0.05 at batch 64, momentum 0.9, weight decay 1e-4) on the
    scale's timeline; ResNet-20 on digits (smoke/cpu), ResNet-32 on digits (gpu),
    ``paper_model`` on ImageNet (paper: ResNet-50 v1.5, torchvision's ``resnet50``; Tables 4-5
    train v1, ``resnet50_v1``)."""
    milestones = [to_scale(e, scale) for e in (30, 60, last_drop)]
    out: dict[str, Any] = {
        "epochs": EPOCHS[scale],
        "schedule": "step",
        "milestones": sorted(set(milestones)),
        "lr": 0.05,
        "nesterov": False,
        "weight_decay": 1e-4,
    }
    if scale == "smoke":
        out.pop("lr")
    if scale == "gpu":
        out["model"] = "resnet32"
    if scale == "paper":
        out.update({"model": paper_model, "stem": "imagenet", "data": "imagenet",
                    "batch_size": 64})  # fmt: skip
    if batch is not None:
        out["batch_size"] = batch
        out["lr"] = 0.1 if batch >= 256 else out.get("lr", 0.05)
    return out


def campfire_row(
    scale: str,
    mask: str,
    start: int,
    sparsity: int,
    *,
    era: int = 20,
    last_drop: int = 90,
    batch: int | None = None,
    label: str | None = None,
    paper_setting: str | None = None,
    paper_model: str = "resnet50",
) -> Row:
    """A Campfire row: ``mask`` (window, ck, combined) pruning from paper epoch ``start`` for
    ``era`` paper epochs to ``sparsity`` %, on the scale's timeline (``paper_model``: the
    network of the paper scale, see :func:`train_for`)."""
    e0 = to_scale(start, scale)
    length = max(1, to_scale(start + era, scale) - e0)
    opts = {"mask": mask, "final_sparsity": sparsity / 100, "start_epoch": e0,
            "era_epochs": length}  # fmt: skip
    era_txt = f", era {start}-{start + era}" if era != 20 else ""
    name = label or f"{mask}, start {start}{era_txt}, sparsity {sparsity}%"
    train = train_for(scale, last_drop=last_drop, batch=batch, paper_model=paper_model)
    return Row(name, "campfire", options=opts, train=train, baseline="dense",
               paper={"setting": paper_setting or name}, group={"mask": mask, "start": start,
                                                                "sparsity": sparsity})  # fmt: skip


#: The note of the tables read from Table 2's runs at epochs 90 and 100 (Tables 3 and 8): one
#: of those runs stands there without a paper number.
NO_PAPER_COMBINED_START_20 = (
    "Our combined start-20 row at 70% has no paper number: the paper's table has no such row "
    "(its Table 2 has one, -2.02 at epoch 100)."
)


def dense_row(
    scale: str, *, batch: int | None = None, last_drop: int = 90, paper_model: str = "resnet50"
) -> Row:
    """The dense baseline on the same timeline (paper selector: the table's dense row)."""
    train = train_for(scale, last_drop=last_drop, batch=batch, paper_model=paper_model)
    return Row("dense", "dense", train=train,
               paper={"method": "dense"}, metrics=("top1",))  # fmt: skip


def epoch_90_is_the_last(scale: str) -> bool:
    """Whether :func:`top1_at` ``(0.9)`` reads the run's last epoch at ``scale`` (4 epochs:
    round(3.6) = 4th), so a table read at epoch 90 reads what Table 2 reads at 100."""
    epochs = EPOCHS[scale]
    return max(0, round(0.9 * epochs) - 1) == epochs - 1


def last_drop_note(scale: str) -> str:
    """Where the scale's run takes the last learning-rate drop at paper epoch 80 and 90 (of
    100): Table 9 compares the two."""
    e80, e90, epochs = to_scale(80, scale), to_scale(90, scale), EPOCHS[scale]
    if e90 >= epochs:
        return (
            f"At {scale} scale ({epochs} epochs) the drop at 90 of 100 falls on epoch {e90}, "
            f"after the run's last: the rows with the drop at 80 (epoch {e80}) are compared "
            "with runs that never take their last drop."
        )
    return (
        f"At {scale} scale the drops at 80 and 90 of 100 fall on epochs {e80} and {e90} "
        f"(counted from 0) of {epochs}."
    )


def top1_at(fraction: float) -> Callable[[RunRecord, RunRecord | None], float]:
    """A metric: test top-1 at ``fraction`` of the run (e.g. 0.9: epoch 90 of 100)."""

    def fn(run: RunRecord, base: RunRecord | None = None) -> float:
        idx = max(0, round(fraction * len(run.metrics)) - 1)
        return float(run.metrics[idx]["test_top1"])

    return fn
