"""PruneTrain Fig. 6: inference FLOPs of channel union against channel gating for ResNet-32
and ResNet-50 on CIFAR-10 at different pruning intensities (the difference is 1-6%).

pdtbench implements channel union only (impl.methods.prunetrain); channel gating, with its
select and scatter layers, is not implemented, so no scale fills this figure. The paper's
numbers are shown.
"""

from __future__ import annotations

from pathlib import Path

from reproductions.common import Row, Target, reproduce


def rows(scale: str) -> list[Row]:
    """One row that names what is missing."""
    return [Row("channel union vs channel gating",
                needs="channel gating is not implemented in pdtbench (channel union only)",
                paper={"method": "channel union vs channel gating"})]  # fmt: skip


TARGET = Target(
    key="prunetrain.fig6",
    title="PruneTrain Fig. 6: channel union vs channel gating (inference FLOPs)",
    description=__doc__.split("\n\n")[0].replace("\n", " "),
    rows=rows,
    metrics=("inference_flops_difference_min", "inference_flops_difference_max"),
    metric_units={
        "inference_flops_difference_min": "%",
        "inference_flops_difference_max": "%",
    },  # fmt: skip
)


def main(scale: str = "cpu", runs_root: str | Path = "runs/reproductions",
         reports_root: str | Path = "reports") -> Path:  # fmt: skip
    """Write PruneTrain Fig. 6's section (the paper's numbers; nothing runs)."""
    return reproduce(TARGET, scale, runs_root, reports_root)
