"""Figures of benchmark rows (``bench.run``'s ``rows.json``).

    python -m bench.plots spmm ROWS_JSON OUT.png [--case-prefix paper-256x1152x50176]
        (default: that shape where the rows hold it, else their first paper-sized one)
    python -m bench.plots iteration ROWS_JSON OUT.png

``spmm``: the SpMM suite's sweep over sparsity at one shape (ClickTrain Sec. 5.2, Fig. 10's
axes): each implementation's median time per call (ms, log scale) against the case's sparsity
(%), the dense baselines (cuBLAS, MKL) as dashed lines. The title names the device and the
commit of the rows, so a copy of the figure still says where it was measured.

``iteration``: the iteration suite's speedup of each method over dense per model/shape case
(``speedup_vs_dense``: forward plus backward), as grouped bars with a line at 1 (dense).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

#: The paper's shape in the spmm suite's case names (256 x 1152 filters, 1152 x 50176 input).
PAPER_SPMM_CASE = "paper-256x1152x50176"


def _finish(fig: Figure, ax: Any, rows: Sequence[dict[str, Any]], suite: str, what: str) -> Figure:
    """Title ``what``, the device, commit and scale of the suite's first row; legend; layout."""
    first = next(r for r in rows if r.get("suite") == suite)
    where = first.get("gpu_name") or first.get("cpu_model") or first.get("device") or "?"
    commit = str(first.get("commit") or "?")[:7]
    ax.set_title(f"{what}: {where}, commit {commit}, scale {first.get('scale', '?')}")
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    return fig


def spmm_series(rows: Sequence[dict[str, Any]], case_prefix: str) -> dict[str, list[tuple]]:
    """``{implementation: [(sparsity %, median ms), ...]}`` of the ``ok`` spmm rows whose case
    starts with ``case_prefix``, sorted by sparsity. ValueError when there is none."""
    series: dict[str, list[tuple]] = {}
    for r in rows:
        if r.get("suite") != "spmm" or not str(r.get("case", "")).startswith(case_prefix):
            continue
        if r.get("status", "ok") != "ok" or r.get("median_ms") is None:
            continue
        impl = str(r["impl"]).split("@")[0]
        series.setdefault(impl, []).append((100.0 * float(r["sparsity"]), float(r["median_ms"])))
    if not series:
        shapes = spmm_shapes(rows)
        there = f"; the rows' shapes: {', '.join(shapes)} (--case-prefix)" if shapes else ""
        raise ValueError(f"no measured spmm row of a case starting {case_prefix!r}{there}")
    return {k: sorted(v) for k, v in series.items()}


def spmm_shapes(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The shapes of the spmm rows' cases (a case without its ``-sNN`` sparsity), in order."""
    cases = (str(r.get("case", "")) for r in rows if r.get("suite") == "spmm")
    return list(dict.fromkeys(c.rsplit("-s", 1)[0] for c in cases if c))


def default_spmm_case(rows: Sequence[dict[str, Any]]) -> str:
    """The shape the spmm figure draws when none is named: the paper's (gpu scale's)
    :data:`PAPER_SPMM_CASE` where the rows hold it, else their first paper-sized shape (the
    smaller ``paper-256x1152x196`` of the cpu and smoke scales), else their first shape."""
    shapes = spmm_shapes(rows)
    if PAPER_SPMM_CASE in shapes or not shapes:
        return PAPER_SPMM_CASE
    return next((s for s in shapes if s.startswith("paper-")), shapes[0])


def spmm_figure(rows: Sequence[dict[str, Any]], case_prefix: str = PAPER_SPMM_CASE) -> Figure:
    """The sparsity sweep of :func:`spmm_series` as a figure: one line per implementation,
    baselines (``torch_*``, ``cublas_*``) dashed, time on a log axis."""
    series = spmm_series(rows, case_prefix)
    fig = Figure(figsize=(7.2, 4.2))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for impl, points in series.items():
        xs, ys = zip(*points, strict=True)
        dense = impl.startswith(("cublas", "torch_mm"))
        chosen = impl.endswith("[cuda]")  # the timed choice: wide and pale, under the kernel
        style = {"linewidth": 5, "alpha": 0.35} if chosen else {"marker": "o", "markersize": 3.5}
        ax.plot(xs, ys, "--" if dense else "-", label=impl, **style)
    ax.set_yscale("log")
    ax.set_xlabel("sparsity of the filter matrix (%)")
    ax.set_ylabel("median time per call (ms)")
    ax.grid(True, which="both", alpha=0.3)
    return _finish(fig, ax, rows, "spmm", case_prefix)


def iteration_speedups(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """``{method: {case: speedup_vs_dense}}`` of the ``ok`` iteration rows but dense's, cases
    in the rows' order. ValueError when there is none."""
    out: dict[str, dict[str, float]] = {}
    for r in rows:
        if r.get("suite") != "iteration" or r.get("status", "ok") != "ok":
            continue
        method = str(r["impl"]).split("@")[0]
        if method == "dense" or r.get("speedup_vs_dense") is None:
            continue
        out.setdefault(method, {})[str(r["case"])] = float(r["speedup_vs_dense"])
    if not out:
        raise ValueError("no measured iteration row of a method other than dense")
    return out


def iteration_figure(rows: Sequence[dict[str, Any]]) -> Figure:
    """The speedups of :func:`iteration_speedups` as grouped bars, one group per case."""
    speedups = iteration_speedups(rows)
    case_names = list(dict.fromkeys(c for per in speedups.values() for c in per))
    fig = Figure(figsize=(9.0, 4.2))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    width = 0.8 / len(speedups)
    for j, (method, per) in enumerate(speedups.items()):
        xs = [i + (j - (len(speedups) - 1) / 2) * width for i, c in enumerate(case_names)]
        ax.bar(xs, [per.get(c, float("nan")) for c in case_names], width, label=method)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(case_names)))
    ax.set_xticklabels(case_names, rotation=20, ha="right", fontsize=7)
    ax.set_ylabel("speedup over dense (forward + backward)")
    ax.grid(True, axis="y", alpha=0.3)
    return _finish(fig, ax, rows, "iteration", "per iteration")


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: write the figure named by the first argument."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("figure", choices=("spmm", "iteration"))
    p.add_argument("rows", type=Path, help="a rows.json of bench.run")
    p.add_argument("out", type=Path, help="the image to write (png, svg, pdf)")
    p.add_argument(
        "--case-prefix",
        help=f"the spmm shape to draw (default: {PAPER_SPMM_CASE} where the rows hold it, "
        "else their first paper-sized shape)",
    )
    args = p.parse_args(argv)
    try:
        rows = json.loads(args.rows.read_text())["rows"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        p.error(f"{args.rows} is not a rows.json of bench.run ({type(err).__name__}: {err})")
    try:
        if args.figure == "spmm":
            fig = spmm_figure(rows, args.case_prefix or default_spmm_case(rows))
        else:
            fig = iteration_figure(rows)
    except ValueError as err:
        p.error(str(err))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
