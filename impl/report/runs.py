"""Saved results -> DataFrames. Reads run directories only; never trains or measures.

A run directory (see :mod:`impl.rundir`) is complete when its ``summary.json`` exists and says
``"status": "complete"``. Everything else found (a ``config.json`` without a summary, a
summary with another status, an unreadable file) is *incomplete*: it is listed, never shown
as a result.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from impl.cli_parser import flag_text
from impl.run_files import (
    CONFIG_FILE,
    SUMMARY_FILE,
    MetricsError,
    check_complete_metrics,
    holds_run,
    read_json,
    read_metrics,
    summary_fields_wrong,
)

# The summary fields a run table shows first (README, "Run directories"); others follow.
SUMMARY_COLUMNS: tuple[str, ...] = (
    "run",
    "method",
    "options",
    "model",
    "data",
    "scale",
    "seed",
    "epochs",
    "top1",
    "best_top1",
    "compression_ratio",
    "inference_flops",
    "train_flops_nominal",
    "train_flops_executed",
    "fwd_ms",
    "bwd_ms",
    "step_ms",
    "iter_ms",
    "comm_bytes_per_iter",
    "wall_seconds",
    "device",
    "commit",
    "path",
)


def find_run_dirs(paths: str | Path | Iterable[str | Path]) -> list[Path]:
    """Every run directory at or under ``paths`` (one path, or several; a directory holding
    ``config.json`` or ``summary.json``), sorted; a path that does not exist raises
    ``FileNotFoundError``.

    A file stands for the run directory that holds it (its ``summary.json``, say); a
    reproduction's ``result.json`` holds no run. Any other file raises ``ValueError``: its
    folder is not what was named (a file beside many runs read them all)."""
    from impl.report.results import RESULT_FILE

    found: set[Path] = set()
    for p in [paths] if isinstance(paths, str | Path) else paths:
        p = Path(p)
        if not p.exists():
            raise FileNotFoundError(f"{p} does not exist")
        if p.is_file():
            if p.name == RESULT_FILE:
                continue
            if not holds_run(p.parent):
                raise ValueError(
                    f"{p} is a file, neither in a run directory nor a reproduction's "
                    f"{RESULT_FILE}: give a run directory, a folder of runs or results, or a "
                    f"{RESULT_FILE}"
                )
            p = p.parent
        for name in (CONFIG_FILE, SUMMARY_FILE):
            found.update(f.parent for f in p.rglob(name) if holds_run(f.parent))
        if holds_run(p):  # a folder named config.json is no run's file
            found.add(p)
    return sorted(found)


def _flat(summary: dict[str, Any]) -> dict[str, Any]:
    """Scalar fields of a summary, plus the environment's commit/device fields."""
    row = {k: v for k, v in summary.items() if isinstance(v, (int, float, str, bool)) or v is None}
    env = summary.get("environment") or {}
    if isinstance(env, dict):
        row["commit"] = env.get("commit")
        row["date"] = env.get("date")
        row["torch"] = env.get("torch")
        row["gpu_name"] = env.get("gpu_name") or env.get("gpu")
        row["cpu_model"] = env.get("cpu_model")
    opts = summary.get("method_options")
    if isinstance(opts, dict):
        row["method_options"] = json.dumps(opts, sort_keys=True)
        # what tells runs of one method apart in a table (SDGP's rules, Campfire's masks)
        row["options"] = ", ".join(f"{k}={flag_text(v)}" for k, v in sorted(opts.items()))
    return row


def load_runs(paths: str | Path | Iterable[str | Path]) -> pd.DataFrame:
    """One row per *complete* run found at or under ``paths`` (one path or several; its
    summary's scalar fields).

    Columns begin with :data:`SUMMARY_COLUMNS` (``run`` is the directory name, ``path`` the
    directory). Runs that are not complete are not rows: they are listed in
    ``frame.attrs["incomplete"]`` as dicts ``{"path", "status", "reason"}``. Each run's whole
    ``environment`` (:func:`impl.env.collect`, for the provenance footer) is in
    ``frame.attrs["environments"]``, keyed by ``path``.
    """
    rows: list[dict[str, Any]] = []
    incomplete: list[dict[str, str]] = []
    environments: dict[str, dict[str, Any]] = {}
    for run_dir in find_run_dirs(paths):
        summary_path = run_dir / SUMMARY_FILE
        if not summary_path.exists():
            incomplete.append(
                {
                    "path": str(run_dir),
                    "status": "running or killed",
                    "reason": "no summary.json; a killed run continues with "
                    f"`pdtbench train --resume {run_dir}`",
                }
            )
            continue
        try:
            summary = read_json(summary_path)
        except (OSError, ValueError) as err:
            incomplete.append({"path": str(run_dir), "status": "unreadable", "reason": str(err)})
            continue
        status = summary.get("status")
        if status != "complete":
            why = summary.get("reason") if status == "diverged" else None
            incomplete.append(
                {
                    "path": str(run_dir),
                    "status": str(status),
                    "reason": str(why or "summary not complete"),
                }
            )
            continue
        wrong = summary_fields_wrong(summary)
        if wrong:
            incomplete.append(
                {
                    "path": str(run_dir),
                    "status": "unreadable",
                    "reason": f"{summary_path}: says complete, but {wrong}",
                }
            )
            continue
        row = _flat(summary)
        row["run"] = run_dir.name
        row["path"] = str(run_dir)
        rows.append(row)
        env = summary.get("environment")
        environments[str(run_dir)] = env if isinstance(env, dict) else {}
    frame = pd.DataFrame(rows)
    if frame.empty:
        frame = pd.DataFrame(columns=list(SUMMARY_COLUMNS))
    ordered = [c for c in SUMMARY_COLUMNS if c in frame.columns]
    frame = frame[ordered + [c for c in frame.columns if c not in ordered]]
    frame.attrs["incomplete"] = incomplete
    frame.attrs["environments"] = environments
    return frame


def load_metrics(runs: pd.DataFrame) -> pd.DataFrame:
    """Per-epoch metrics (``metrics.jsonl``) of the runs in ``runs`` (from :func:`load_runs`),
    long form: one row per (run, epoch), with the run's method, model, data, scale and seed.
    A run whose metrics file is damaged (:class:`impl.rundir.MetricsError`) has no rows and
    is added to ``runs.attrs["incomplete"]`` with the reason."""
    if not isinstance(runs, pd.DataFrame):
        raise TypeError(
            f"load_metrics takes the runs table of load_runs (a DataFrame), got "
            f"{type(runs).__name__}: load_metrics(load_runs(paths))"
        )
    frames = []
    keys = [k for k in ("run", "method", "model", "data", "scale", "seed") if k in runs.columns]
    for _, run in runs.iterrows():
        try:
            records = read_metrics(Path(run["path"]))
            # every row of runs is a complete run: one metrics row per epoch it completed
            epochs = run.get("epochs")
            if isinstance(epochs, (int, float)) and not pd.isna(epochs):
                check_complete_metrics(Path(run["path"]), records, int(epochs))
        except MetricsError as err:  # listed with the runs not shown, instead of stopping all
            runs.attrs.setdefault("incomplete", []).append(
                {"path": str(run["path"]), "status": "metrics unreadable", "reason": str(err)}
            )
            continue
        rows = [
            {k: v for k, v in rec.items() if not isinstance(v, (dict, list))} for rec in records
        ]
        if not rows:
            continue
        frame = pd.DataFrame(rows)
        for k in keys:
            frame[k] = run[k]
        frames.append(frame)
    if not frames:
        return pd.DataFrame(columns=keys + ["epoch"])
    return pd.concat(frames, ignore_index=True)


def time_to_accuracy(metrics: pd.DataFrame, target: float) -> float:
    """Seconds of training until the end of the first epoch whose ``test_top1`` reaches
    ``target`` % for one run's metrics; NaN when the run never reaches it.

    Training seconds: ``wall_seconds`` there less the evaluations up to it (each epoch's
    ``eval_seconds``), so the training steps and a method's work between epochs (PruneTrain's
    reconfiguration) count, the test passes do not. Runs whose metrics have no
    ``eval_seconds`` (written before it was recorded) give their ``wall_seconds``.

    This is the time-to-accuracy of DAWNBench, used by SDGP Fig. 10.
    """
    if metrics.empty or "test_top1" not in metrics.columns:
        return math.nan
    ordered = metrics.sort_values("epoch")
    spent = ordered["wall_seconds"]
    if "eval_seconds" in ordered.columns:
        spent = spent - ordered["eval_seconds"].fillna(0.0).cumsum()
    hit = ordered["test_top1"] >= target
    if not hit.any():
        return math.nan
    return float(spent[hit].iloc[0])


__all__ = [
    "SUMMARY_COLUMNS",
    "find_run_dirs",
    "load_metrics",
    "load_runs",
    "time_to_accuracy",
]
