"""Reproductions of every table and figure of the four papers, and the cross-method table.

Each ``reproductions/<paper>/<item>.py`` declares ``TARGET`` (typed rows per scale, the
metrics compared with the paper, its figures) and ``main(scale) -> path of the report``.
``pdtbench reproduce <paper>.<item>|<paper>|all --scale S`` runs them through the public API
(``impl.config.resolve`` + ``impl.train.train``), reusing complete runs, and renders
``reports/<paper>.html`` and ``reports/index.html``. The published numbers are in
``reproductions/paper_values/`` (see docs/reproductions.md).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from pathlib import Path
from typing import Any

from impl.cli_parser import OneLineParser, did_you_mean, directory
from impl.out_dir import check_out_dir

# Every target, in the order of the papers' numbering. (paper.item, the scale it needs to be
# filled when the cpu scale cannot fill it).
TARGETS: tuple[str, ...] = (
    "clicktrain.table1",
    "clicktrain.table2",
    "clicktrain.fig9",
    "clicktrain.fig10",
    "clicktrain.fig11",
    "clicktrain.fig12",
    "clicktrain.fig13",
    "clicktrain.fig14",
    "clicktrain.fig15",
    "prunetrain.table1",
    "prunetrain.table2",
    "prunetrain.table3",
    "prunetrain.table4",
    "prunetrain.fig2",
    "prunetrain.fig6",
    "prunetrain.fig7",
    "prunetrain.fig8",
    "prunetrain.fig9",
    "prunetrain.fig10",
    "prunetrain.fig11",
    "sdgp.table1",
    "sdgp.fig8",
    "sdgp.fig9",
    "sdgp.fig10",
    "campfire.table1",
    "campfire.table2",
    "campfire.table3",
    "campfire.table4",
    "campfire.table5",
    "campfire.table6",
    "campfire.table8",
    "campfire.table9",
    "cross.methods",
)
# What `make demo` runs: every target (`pdtbench reproduce all`). A row that the scale cannot
# fill runs nothing and is listed with the scale it needs.
DEMO_TARGETS: tuple[str, ...] = TARGETS


def unknown_target(key: str) -> str:
    """The error for a reproduction ``key`` that is not one: a hint where one is close
    (:func:`impl.cli_parser.did_you_mean`: a typo, the case, a paper's name), else the list."""
    hint = did_you_mean(key, TARGETS)
    if hint:
        return f"unknown reproduction {key!r}{hint}"
    return f"unknown reproduction {key!r}; valid: all, {', '.join(TARGETS)}"


def resolve_targets(names: list[str]) -> list[str]:
    """The target keys that ``names`` stand for, in :data:`TARGETS`' order: ``all`` for every
    target, a paper's name (``clicktrain``) for its targets, a key for itself.

    Raises ``ValueError`` on a name that is none of these (with a hint where one is close),
    and on ``all`` named with other targets.
    """
    if "all" in names and len(names) > 1:
        raise ValueError("'all' runs every reproduction: name it alone, or name the targets")
    wanted: set[str] = set()
    for name in names:
        if name == "all":
            wanted.update(TARGETS)
            continue
        items = [k for k in TARGETS if k == name or k.startswith(f"{name}.")]
        if not items:
            raise ValueError(unknown_target(name))
        wanted.update(items)
    return [k for k in TARGETS if k in wanted]


def load_target(key: str) -> Any:
    """The ``TARGET`` of ``reproductions/<paper>/<item>.py`` for ``key`` = "<paper>.<item>".

    Raises ``ValueError`` naming the valid keys for an unknown one.
    """
    if key not in TARGETS:
        raise ValueError(unknown_target(key))
    paper, _, item = key.partition(".")
    return importlib.import_module(f"reproductions.{paper}.{item}").TARGET


def expected_targets(scale: str = "cpu") -> list[dict[str, str]]:
    """Every target with its title and the command that makes its result at ``scale``, for
    the index of a report (the ones without a result are listed as missing)."""
    out = []
    for key in TARGETS:
        try:
            title = load_target(key).title
            needs = f"pdtbench reproduce {key} --scale {scale}"
        except ModuleNotFoundError:
            title, needs = key, "not implemented"
        out.append({"target": key, "title": title, "needs": needs})
    return out


def run(
    keys: list[str],
    scale: str,
    runs_root: str | Path = "runs/reproductions",
    reports_root: str | Path = "reports",
    jobs: int | None = None,
    progress: bool = True,
    failed: list[str] | None = None,
    threads: int | None = None,
) -> Path:
    """Run (or reuse) each target of ``keys`` at ``scale``, judge the papers' headline claims
    against every result of that scale (:mod:`reproductions.claims`), then render every
    saved result under ``runs_root`` into ``reports_root``; return the path of ``index.html``.

    The distinct training runs of all the targets are trained first, ``jobs`` processes at
    a time (default :func:`reproductions.parallel.default_jobs`), each with ``threads``
    torch threads (default: the cores divided by ``jobs``); the targets then reuse
    them, and their measurements (timings) run with the machine to themselves. A target that
    fails is reported (and listed in its page) and the others go on; its key is appended to
    ``failed`` when given, as is a target some of whose rows failed (with their count).
    """
    from impl.report.results import ResultSet, save_result
    from reproductions.common import render, result_dir, run_target
    from reproductions.parallel import default_jobs, plan_runs, train_all

    targets = {}
    for key in keys:
        try:
            targets[key] = load_target(key)
        except Exception as err:  # noqa: BLE001 - a module that fails to import is reported
            print(f"[{key}] FAILED to load: {type(err).__name__}: {err}")
    plan = plan_runs(targets.values(), scale, runs_root)
    unread = unread_data_dir_note(plan, scale)
    if unread:  # accepted (a shared command line), but said
        print(unread, file=sys.stderr)
    jobs = default_jobs(scale) if jobs is None else jobs
    train_all(plan, jobs, threads, progress=progress)
    for key in keys:
        target = targets.get(key)
        t0 = time.perf_counter()
        print(f"[{key}] scale {scale}")
        try:
            if target is None:
                raise ImportError(f"reproductions module of {key} failed to load")
            result = run_target(target, scale, runs_root)
            broken = [m for m in result.missing if str(m.get("reason", "")).startswith("failed:")]
            if broken:  # the other rows stand, and the command says it did not all work
                print(f"[{key}] {len(broken)} row(s) FAILED (see its page)")
                if failed is not None:
                    labels = ", ".join(str(m.get("row")) for m in broken)
                    failed.append(f"{key} ({len(broken)} row(s): {labels})")
        except Exception as err:  # noqa: BLE001 - one broken target must not stop the others
            print(f"[{key}] FAILED: {type(err).__name__}: {err}")
            if failed is not None:
                failed.append(key)
            reason = f"failed: {type(err).__name__}: {err}"
            save_result(
                ResultSet(target=key, title=getattr(target, "title", key), scale=scale,
                          missing=[{"row": key, "reason": reason}]),
                result_dir(key, scale, runs_root),
            )  # fmt: skip
            continue
        print(f"[{key}] done in {time.perf_counter() - t0:.0f} s")
    from reproductions.claims import save as save_claims
    from reproductions.claims import summary_lines

    try:
        claims = save_claims(scale, runs_root)
        if claims is not None:
            print("\n".join(summary_lines(claims, keys)))
    except Exception as err:  # noqa: BLE001 - the tables stand without the claims
        print(f"[claims] FAILED: {type(err).__name__}: {err}")
    return render(runs_root, reports_root, expected=expected_targets(scale))


def unread_data_dir_note(plan: list[Any], scale: str) -> str | None:
    """The line saying that the data directory given (``--data-dir``, which sets
    ``PDTBENCH_DATA_DIR``) is not read, where no run of ``plan``
    (:func:`reproductions.parallel.plan_runs`) trains on a local dataset: the smoke, cpu and
    gpu scales train on the embedded digits. None where one does, or where none is given."""
    from impl.data import DATA_DIR_ENV, LOCAL_DATASETS

    if not os.environ.get(DATA_DIR_ENV):
        return None
    data = sorted({run.config.data for run in plan})
    if any(name in LOCAL_DATASETS for name in data):
        return None
    trained = f"its runs train on {', '.join(data)}" if data else "it trains no run"
    return f"--data-dir is not read at scale {scale}: {trained}"


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``pdtbench reproduce``."""
    from reproductions.parallel import add_jobs_argument

    p = OneLineParser(
        prog="pdtbench reproduce",
        description="Regenerate the papers' tables and figures (and the cross-method table) "
        "at a scale, reusing complete runs, and render the HTML reports.",
    )
    p.add_argument(
        "targets",
        nargs="*",
        metavar="PAPER.ITEM",
        help="e.g. sdgp.table1; a paper's name (sdgp) for all its targets; or all",
    )
    from impl.config import SCALE_HELP, SCALES

    p.add_argument("--scale", default="cpu", choices=SCALES, help=f"{SCALE_HELP} (default: cpu)")
    p.add_argument(
        "--runs-root",
        default="runs/reproductions",
        type=directory,
        help="where runs and results go (default: runs/reproductions)",
    )
    p.add_argument("--out", default="reports", type=directory,
                   help="where the HTML reports go (default: reports)")  # fmt: skip
    p.add_argument(
        "--data-dir",
        action="append",
        metavar="[NAME=]DIR",
        help="where a local dataset is: NAME=DIR for one (cifar10, cifar100, imagenet), DIR "
        "for every other one; repeatable (default: the PDTBENCH_DATA_DIR variable, the same "
        "entries joined by ':'); the cpu scale needs none",
    )
    p.add_argument(
        "--list", action="store_true", help="list the targets (those named, if any) and exit"
    )
    add_jobs_argument(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``pdtbench reproduce``; prints where the report is and returns 0, or 1
    when a target or a row of one failed (the report is rendered all the same, listing it).
    With no target and no ``--list``, lists the targets and exits 2 (argparse's usage error).

    Raises ``ValueError`` (naming the valid targets) on an unknown target, on a
    ``--data-dir`` entry that names no local dataset, or on a GPU scale where no CUDA GPU
    is present (:func:`check_scale_device`).
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    keys = resolve_targets(args.targets)  # an unknown name is an error before anything else
    if args.list or not args.targets:
        out = sys.stdout if args.list else sys.stderr
        listed = set(keys) if args.targets else set(TARGETS)
        for e in expected_targets():
            if e["target"] in listed:
                print(f"{e['target']:20s} {e['title']}", file=out)
        if not args.list:  # nothing named: a usage error, as argparse's (exit 2)
            parser.error("name a target (PAPER.ITEM, listed above), a paper or all")
        return 0
    check_scale_device(args.scale)
    check_writable(args.runs_root, args.out)
    if args.data_dir:
        from impl.data import DATA_DIR_ENV, dataset_dirs

        value = os.pathsep.join(args.data_dir)
        dataset_dirs(value, "--data-dir")  # a bad entry is a ValueError now, before any work
        os.environ[DATA_DIR_ENV] = value  # the runs' configs read it, in this process
    failed: list[str] = []
    index = run(keys, args.scale, args.runs_root, args.out, args.jobs, not args.no_progress,
                failed, threads=args.threads)  # fmt: skip
    print(f"report: {index}")
    return report_failures(failed)


def check_writable(runs_root: str | Path, out: str | Path) -> None:
    """Refuse, before any run, a ``--runs-root`` or ``--out`` that cannot be written (a file
    at it or above it, a read-only parent), which would otherwise fail after every run had
    trained (:func:`impl.out_dir.check_out_dir`). Raises ``ValueError`` naming the flag."""
    check_out_dir(Path(runs_root), "--runs-root")
    check_out_dir(Path(out), "--out")


def check_scale_device(scale: str) -> None:
    """Refuse the ``gpu`` and ``paper`` scales on a machine without a CUDA GPU
    (:func:`impl.train.check_scale_device`, imported here only when called: listing and
    planning import no torch). Raises ``ValueError`` saying so."""
    from impl.train import check_scale_device as check

    check(scale)


def report_failures(failed: list[str]) -> int:
    """1 after one line naming the failed targets, 0 when there are none."""
    if failed:
        print(f"{len(failed)} target(s) failed: {', '.join(failed)} (see the report)")
        return 1
    return 0


def demo(
    scale: str = "cpu",
    out: str | Path = "reports",
    runs_root: str | Path = "runs/reproductions",
    jobs: int | None = None,
    failed: list[str] | None = None,
    progress: bool = True,
    threads: int | None = None,
) -> Path:
    """The CPU-scale reproduction of ``make demo``: :data:`DEMO_TARGETS` at ``scale`` (``jobs``
    training processes of ``threads`` torch threads), then the HTML report of everything
    saved under ``runs_root``; prints the index path and the wall time in seconds, and returns
    the index path. Failed targets are appended to ``failed`` when given; ``progress``: a
    progress bar (on a terminal)."""
    check_writable(runs_root, out)
    t0 = time.perf_counter()
    index = run(list(DEMO_TARGETS), scale, runs_root, out, jobs, progress=progress, failed=failed,
                threads=threads)  # fmt: skip
    print(f"demo ({scale} scale) finished in {time.perf_counter() - t0:.0f} s")
    print(f"report: {Path(index).resolve()}")
    return Path(index)


__all__ = [
    "DEMO_TARGETS",
    "TARGETS",
    "check_scale_device",
    "check_writable",
    "demo",
    "expected_targets",
    "load_target",
    "main",
    "report_failures",
    "resolve_targets",
    "run",
]
