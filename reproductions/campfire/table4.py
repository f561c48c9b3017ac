"""Campfire Table 4: top-1 of ResNet-50 v1 on ImageNet after 90 and 100 epochs at 60-80%
sparsity, beside PruneTrain (about 50% sparse) and dynamic sparse reparameterisation.

Dynamic sparse reparameterisation is not implemented in pdtbench; its published numbers are
shown. Scales: smoke/cpu/gpu read Campfire runs of Table 2's timeline (ResNet-20/-32 on
digits) at their 90% and final epochs, and PruneTrain's Table 1 run; paper trains ResNet-50
on ImageNet.
"""

from __future__ import annotations

from pathlib import Path

from reproductions.campfire import campfire_row, dense_row, top1_at
from reproductions.common import Row, Target, bar_vs_paper, described, reproduce
from reproductions.prunetrain import pair

CASES = [("ck", 40, 60), ("combined", 40, 60), ("window", 0, 60), ("ck", 30, 80)]


def cases_at(scale: str) -> list[tuple[str, int, int]]:
    """The (mask, start, sparsity) cases the scale runs: CK and combined at smoke and cpu."""
    return CASES[:2] if scale in ("smoke", "cpu") else CASES


def rows(scale: str) -> list[Row]:
    """Each Campfire case read at epochs 90 and 100, dense, and PruneTrain."""
    cases = cases_at(scale)
    # the paper's ResNet-50 v1; its number is App. B.2's baseline (Table 4 prints no dense row)
    out = [dense_row(scale, paper_model="resnet50_v1")]
    for mask, start, sp in cases:
        for epoch, reading in ((90, "top1_at_90"), (100, "top1")):
            r = campfire_row(scale, mask, start, sp, paper_model="resnet50_v1")
            r.label = f"{mask}, start {start}, sparsity {sp}% (epoch {epoch})"
            r.paper = {"method": "campfire", "setting": f"{mask}, start {start}, epoch {epoch}"}
            r.measure_keys = {"top1": reading, "sparsity": "sparsity_pct"}
            out.append(r)
    model, dataset = ("resnet50", "imagenet") if scale == "paper" else ("resnet32", "cifar10")
    pt_dense, pt = pair(scale, model, dataset)
    pt_dense.label = "dense (PruneTrain's recipe)"
    pt_dense.paper, pt_dense.metrics, pt_dense.baseline = {}, ("top1",), pt_dense.label
    pt.baseline = pt_dense.label
    pt.paper = {"method": "prunetrain"}
    pt.measure_keys = {"sparsity": "inference_flops_saved"}
    out += [pt_dense, pt]
    return out


TARGET = Target(
    key="campfire.table4",
    title="Campfire Table 4: ResNet-50 v1 after 90 and 100 epochs; PruneTrain, dynamic sparse",
    description=described(__doc__),
    rows=rows,
    metrics=("sparsity", "top1"),
    figures=bar_vs_paper("top1", "Top-1", "top-1 (%)"),
    extra_metrics={
        "top1_at_90": ("%", top1_at(0.9)),
        "sparsity_pct": ("%", lambda run, base: 100.0 * run.summary["true_sparsity"]),
    },
    metric_units={"sparsity": "%"},
    notes=lambda scale: [
        "PruneTrain's sparsity is estimated as Campfire does: 1 - inference FLOPs (% saved).",
        "PruneTrain runs its own recipe (Table 1's), not Campfire's timeline.",
        "Dynamic sparse reparameterisation (Mostafa and Wang) is not implemented here.",
        *(
            [
                "The window start-0 row prunes for 20 epochs (0-20); Sec. 3.1 tried 0-30 first "
                "and then 0-20, which it says caused a large drop in accuracy, and Table 5 "
                "labels its start-0 row 0-30: the paper does not say which era this row ran."
            ]
            if any(mask == "window" for mask, _, _ in cases_at(scale))
            else []
        ),
        "Campfire's rows follow the caption (batch 64, lr 0.05); App. B.2 describes ResNet-50 "
        "on ImageNet with batch 128 and lr 0.1, which the paper does not tie to this table. "
        "The paper's dense number (74.94) is App. B.2's baseline at batch 128, 90 epochs: Table 4 "
        "prints none, and Sec. 4.2 compares its rows with 'the baseline' (0.1-0.3% below). "
        "Our dense number is its run's last epoch (where the rows read 'epoch 100'). "
        "The paper's PruneTrain row (50%, 73.0) matches neither of PruneTrain's own ImageNet "
        "rows (ratio 0.25: 53% saved, 74.33; 0.2: 44%, 74.73); ours run ratio 0.2.",
    ],
)


def main(scale: str = "cpu", runs_root: str | Path = "runs/reproductions",
         reports_root: str | Path = "reports") -> Path:  # fmt: skip
    """Run Campfire Table 4 at ``scale``; return the report's path."""
    return reproduce(TARGET, scale, runs_root, reports_root)
