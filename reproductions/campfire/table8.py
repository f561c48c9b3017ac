"""Campfire Table 8: gain in top-1 from epoch 90 to epoch 100 of the Table 2 runs (the
benefit of 10 more epochs after the last learning-rate drop).

Reads the Table 2 runs at every scale.
"""

from __future__ import annotations

from pathlib import Path

from reproductions.campfire import epoch_90_is_the_last, top1_at
from reproductions.campfire.table2 import combined_start_20_note
from reproductions.campfire.table2 import rows as table2_rows
from reproductions.common import Row, RunRecord, Target, bar_vs_paper, described, reproduce


def gain(run: RunRecord, base: RunRecord | None = None) -> float:
    """Final top-1 minus top-1 at 90% of the run (pp)."""
    return top1_at(1.0)(run) - top1_at(0.9)(run)


def rows(scale: str) -> list[Row]:
    """The Table 2 rows (the dense row too: the paper lists its gain)."""
    out = table2_rows(scale)
    out[0].paper = {"method": "dense"}
    out[0].metrics = None
    return out


TARGET = Target(
    key="campfire.table8",
    title="Campfire Table 8: top-1 gained from epoch 90 to 100",
    description=described(__doc__),
    rows=rows,
    metrics=("top1_gain_90_to_100",),
    figures=bar_vs_paper("top1_gain_90_to_100", "Top-1 gained in the last 10%", "pp"),
    extra_metrics={"top1_gain_90_to_100": ("pp", gain)},
    notes=lambda scale: [
        *combined_start_20_note(scale),
        *(
            [
                f"At {scale} scale 90% of the run is its last epoch: every gain is 0 by "
                "construction, and compares nothing with the paper's."
            ]
            if epoch_90_is_the_last(scale)
            else []
        ),
    ],
)


def main(scale: str = "cpu", runs_root: str | Path = "runs/reproductions",
         reports_root: str | Path = "reports") -> Path:  # fmt: skip
    """Run Campfire Table 8 at ``scale`` (reuses Table 2's runs); return the report's path."""
    return reproduce(TARGET, scale, runs_root, reports_root)
