"""Time SDGP's cpu-scale training step with the reference pruning, the compiled CPU kernel,
and no pruning at all (what pruning costs in the step; SDGP Sec. III-A).

ResNet-20 on 16x16 one-channel inputs, batch 32, one thread, SGD with momentum: the step of
``pdtbench reproduce sdgp.* --scale cpu``. The three variants run interleaved, ``--rounds``
times ``--steps`` steps each (two warm-up steps per round dropped); medians are printed.

    .venv/bin/python scripts/sdgp_cpu_step.py [--rounds 5] [--steps 12]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn as nn

from impl import models
from impl.methods.sdgp import sdgp_convert, sdgp_modules
from impl.ops import nm_cpu

CONFIGS = ((2, 4, "rescaled"), (2, 4, "random"), (8, 16, "rescaled"), (16, 32, "rescaled"))
VARIANTS = ("ref", "auto", "none")  # prune_impl, or no pruning (the gradient passed through)


def _model(n: int, m: int, method: str, variant: str) -> nn.Module:
    model = sdgp_convert(models.create("resnet20", 10, 1), n=n, m=m, method=method)
    for mod in sdgp_modules(model).values():
        if variant == "none":
            mod.prune_grad = lambda g: g  # type: ignore[method-assign]
        else:
            mod.prune_impl = variant
    return model


def _steps(model: nn.Module, x: torch.Tensor, y: torch.Tensor, k: int) -> list[float]:
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss = nn.CrossEntropyLoss()
    times = []
    for _ in range(k):
        t0 = time.perf_counter()
        opt.zero_grad()
        loss(model(x), y).backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    return times[2:]


def main() -> None:
    """Print, per N:M configuration, the median step time of each variant in ms."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=12)
    args = ap.parse_args()
    if args.rounds < 1 or args.steps < 3:
        ap.error("--rounds must be >= 1 and --steps >= 3")
    if not nm_cpu.is_available():
        raise SystemExit(f"the compiled CPU kernel is not available: {nm_cpu.unavailable_reason()}")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    x, y = torch.randn(32, 1, 16, 16), torch.randint(0, 10, (32,))
    built = {(c, v): _model(*c, v) for c in CONFIGS for v in VARIANTS}
    times: dict[tuple, list[float]] = {k: [] for k in built}
    for _ in range(args.rounds):
        for key, model in built.items():
            times[key] += _steps(model, x, y, args.steps)
    for c in CONFIGS:
        ms = {v: statistics.median(times[(c, v)]) * 1e3 for v in VARIANTS}
        print(
            f"{c[0]}:{c[1]} {c[2]}: step reference {ms['ref']:.1f} ms, compiled {ms['auto']:.1f}"
            f" ms, no pruning {ms['none']:.1f} ms; pruning {ms['ref'] - ms['none']:.1f} ->"
            f" {ms['auto'] - ms['none']:.1f} ms"
        )


if __name__ == "__main__":
    main()
