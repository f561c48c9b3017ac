"""The main job (``make demo``): training on the embedded default data, results on disk."""

from __future__ import annotations

from pathlib import Path

from impl.config import resolve
from impl.train import resume, train


def run_demo(scale: str = "cpu", out: str = "runs/demo") -> list[dict]:
    """Train the dense baseline ResNet-20 on digits at ``scale`` into ``out``; return summaries.

    A run directory that already holds a complete run is reused, a killed one is resumed.
    """
    summaries = []
    run_dir = Path(out) / f"dense-resnet20-digits-{scale}"
    cfg = resolve(scale, method="dense", model="resnet20", data="digits", out=str(run_dir))
    if (run_dir / "config.json").exists():
        summary = resume(run_dir)
    else:
        summary = train(cfg)
    summaries.append(summary)
    print(
        f"dense resnet20 digits [{scale}]: top-1 {summary['top1']:.2f}% "
        f"in {summary['wall_seconds']:.1f} s -> {run_dir}/summary.json"
    )
    return summaries
