"""PruneTrain Fig. 7: per-layer execution time of channel gating and channel union for
ResNet-50 on ImageNet (the last layer of each residual block), on a GPU.

Channel gating is not implemented in pdtbench, and the figure needs ImageNet-sized layers on
a GPU: no scale fills it here. The paper's one stated number (channel union accelerates
convolution layers 1.9x on average over dense, Sec. 1) is shown.
"""

from __future__ import annotations

from pathlib import Path

from reproductions.common import Row, Target, reproduce


def rows(scale: str) -> list[Row]:
    """One row that names what is missing."""
    return [Row("channel union conv layers vs dense",
                needs="channel gating is not implemented in pdtbench; the union's per-layer "
                "times need a GPU run of ResNet-50 at ImageNet shapes",
                paper={"method": "channel union"})]  # fmt: skip


TARGET = Target(
    key="prunetrain.fig7",
    title="PruneTrain Fig. 7: per-layer time, channel gating vs channel union",
    description=__doc__.split("\n\n")[0].replace("\n", " "),
    rows=rows,
    metrics=("conv_speedup_vs_dense",),
    metric_units={"conv_speedup_vs_dense": "x"},
)


def main(scale: str = "gpu", runs_root: str | Path = "runs/reproductions",
         reports_root: str | Path = "reports") -> Path:  # fmt: skip
    """Write PruneTrain Fig. 7's section (the paper's number; nothing runs)."""
    return reproduce(TARGET, scale, runs_root, reports_root)
