"""``pdtbench report PATHS... --out DIR``: render saved results into HTML (never re-runs)."""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from impl.cli_parser import OneLineParser, directory
from impl.out_dir import check_out_dir
from impl.report.pages import render_reports
from impl.report.results import load_results, warn_unreadable
from impl.report.runs import find_run_dirs, load_metrics, load_runs


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``pdtbench report``."""
    p = OneLineParser(
        prog="pdtbench report",
        description="Render saved reproduction results (result.json) and run directories "
        "(summary.json) into self-contained HTML pages. Nothing is trained or measured.",
    )
    p.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help="run directories, folders of runs or results, or result.json files",
    )
    p.add_argument("--out", default="reports", type=directory,
                   help="output folder (default: reports)")  # fmt: skip
    p.add_argument("--no-runs", action="store_true", help="omit the page of plain runs")
    return p


def _reproduction_index(results: list) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """Every reproduction target, where the results hold one: the pages then list a target
    without a result as missing, as ``pdtbench reproduce`` renders them (reports read saved
    results and list what is missing instead of hiding it), and the papers' figures without a
    target (:func:`reproductions.other_figures.other_figures`); nothing for other results."""
    from reproductions import TARGETS, expected_targets
    from reproductions.other_figures import other_figures

    scales = {r.scale for r in results if r.target in TARGETS}
    if not scales:
        return [], []
    return expected_targets(scales.pop() if len(scales) == 1 else "cpu"), other_figures()


def _rejudged_claims(results: list) -> list:
    """``results`` with the papers' claims judged again against the results read here
    (:func:`reproductions.claims.rejudge`), so that the claims never show a verdict of a
    result that is no longer there or has been made again since they were saved."""
    from reproductions.claims import TARGET_KEY, rejudge

    if not any(r.target == TARGET_KEY for r in results):
        return results
    return rejudge(results)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``pdtbench report``; prints the path of the index and returns 0.

    Where the results are reproductions', every reproduction target without a result is
    listed as missing, with the command that makes it. Raises ``FileNotFoundError`` for a path
    that does not exist and ``ValueError`` when the paths hold neither results nor run
    directories, or when ``--out`` (or a folder above it) is a file or cannot be written.
    """
    args = build_parser().parse_args(argv)
    for p in args.paths:
        if not Path(p).exists():
            raise FileNotFoundError(f"{p} does not exist")
    check_out_dir(args.out)  # a file at or above it, or a read-only parent: before any reading
    results, unreadable = load_results(args.paths)
    runs = metrics = None
    if not args.no_runs and find_run_dirs(args.paths):
        runs = load_runs(args.paths)
        metrics = load_metrics(runs)
    if not results and runs is None:
        if unreadable:
            raise ValueError(
                "no readable result.json and no run directory under "
                f"{', '.join(map(str, args.paths))}: {unreadable[0]['path']}: "
                f"{unreadable[0]['reason']}"
            )
        if args.no_runs and find_run_dirs(args.paths):
            raise ValueError(
                f"no result.json under {', '.join(map(str, args.paths))}, and --no-runs leaves "
                "out the run directories it holds: drop --no-runs to report on them"
            )
        raise ValueError(
            f"no result.json and no run directory under {', '.join(map(str, args.paths))}: "
            "make some first with `pdtbench reproduce TARGET` (results under "
            "runs/reproductions) or `pdtbench train`"
        )
    warn_unreadable(unreadable)
    results = _rejudged_claims(results)
    expected, others = _reproduction_index(results)
    index = render_reports(
        results,
        args.out,
        runs=runs,
        metrics=metrics,
        expected=expected,
        unreadable=unreadable,
        others=others,
    )
    listed = [] if runs is None else runs.attrs.get("incomplete", [])
    n_runs = 0 if runs is None else len(runs)
    kinds = Counter(r["status"] for r in listed if r["status"] != "metrics unreadable")
    n_bad = sum(kinds.values())  # the others are complete
    damaged = len(listed) - n_bad
    also = f", {damaged} of them with unreadable metrics (listed)" if damaged else ""
    why = ", ".join(f"{n} {status}" for status, n in sorted(kinds.items()))
    why = f": {why}" if why else ""
    print(f"{len(results)} results, {n_runs} complete runs{also}, {n_bad} incomplete (listed{why})")
    print(f"report: {index}")
    return 0


__all__ = ["build_parser", "main"]
