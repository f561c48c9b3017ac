"""A run directory's JSON files read back: ``metrics.jsonl`` (one JSON object per finished
epoch) and the JSON objects (``config.json``, ``summary.json``).

Kept apart from :mod:`impl.rundir` (which writes them, and needs torch for checkpoints) so
that the reports, which never import torch, read them by the same rules.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

METRICS_FILE = "metrics.jsonl"
CONFIG_FILE = "config.json"
SUMMARY_FILE = "summary.json"


def holds_run(directory: Path) -> bool:
    """Whether ``directory`` is a run directory: it holds the run's ``config.json`` (written
    first) or ``summary.json`` (written last)."""
    return any((Path(directory) / name).is_file() for name in (CONFIG_FILE, SUMMARY_FILE))


class MetricsError(ValueError):
    """A run's ``metrics.jsonl`` that is damaged (a line before the last is not a JSON
    object, the file is not text) or does not match its checkpoint; the message names the
    file, the line and what to do."""


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """All complete metric lines of a run: one JSON object per finished epoch (a torn last
    line, from a kill while it was written, is dropped).

    Raises :class:`MetricsError` naming the file and line where a line before the last is
    not a JSON object (the file was damaged: dropping it would drop the epochs after it)
    or the file is not text."""
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        return []
    try:
        lines = path.read_text().splitlines()
    except UnicodeDecodeError as err:
        raise MetricsError(f"{path}: not a text file ({err})") from err
    rows = []
    for number, line in enumerate(lines, 1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            if number == len(lines):
                break  # torn by a kill
            raise MetricsError(
                f"{path}: line {number} of {len(lines)} is not JSON ({err}); the lines after "
                "it hold later epochs: repair or remove that line"
            ) from err
        if not isinstance(row, dict):
            raise MetricsError(
                f"{path}: line {number} is a JSON {type(row).__name__}, not an object"
            )
        rows.append(row)
    return rows


def check_complete_metrics(run_dir: Path, rows: list[dict[str, Any]], epochs: int) -> None:
    """Raise :class:`MetricsError` where a run that completed ``epochs`` epochs does not hold
    one metrics row for each, epochs 0 to ``epochs - 1`` in order (a file cut short, emptied
    or edited: its per-epoch numbers would be read as the run's)."""
    seen = [row.get("epoch") for row in rows]
    if seen != list(range(epochs)):
        path = Path(run_dir) / METRICS_FILE
        held = f"{len(rows)} row(s)" + (f", epochs {seen[0]} to {seen[-1]}" if seen else "")
        raise MetricsError(
            f"{path}: the run's summary says it completed {epochs} epoch(s), the file holds "
            f"{held}: it was cut short or edited; restore it, or remove the run directory to "
            "train it again"
        )


#: The fields every complete run's summary has, and their types (what the runs table and
#: the reports select and compute on).
REQUIRED_SUMMARY_FIELDS: dict[str, tuple[type, ...]] = {
    "method": (str,), "model": (str,), "data": (str,), "scale": (str,), "seed": (int,),
    "epochs": (int,), "top1": (int, float),
}  # fmt: skip


def holds_type(value: Any, types: tuple[type, ...]) -> bool:
    """Whether ``value`` is an instance of ``types``, a bool never counting as a number
    (a JSON ``true`` in a numeric field is an edit, not a 1)."""
    return isinstance(value, types) and not isinstance(value, bool)


def summary_fields_wrong(summary: dict[str, Any]) -> str:
    """What of :data:`REQUIRED_SUMMARY_FIELDS` a complete summary lacks or holds in another
    type, in words ("" where nothing): a summary edited or written by hand."""
    missing = [k for k in REQUIRED_SUMMARY_FIELDS if k not in summary]
    typed = [
        f"{k} is {summary[k]!r}"
        for k, types in REQUIRED_SUMMARY_FIELDS.items()
        if k in summary and not holds_type(summary[k], types)
    ]
    parts = ([f"it lacks {', '.join(missing)}"] if missing else []) + typed
    return "; ".join(parts)


def read_json(path: Path) -> dict[str, Any]:
    """Read a JSON object from ``path``. Raises ``OSError`` where it cannot be read and
    ``ValueError`` naming the file where it is not JSON or not an object."""
    with open(path, "rb") as f:
        raw = f.read()
    try:
        data = json.loads(raw)
    except ValueError as err:  # JSONDecodeError, or bytes that are not text
        raise ValueError(f"{path}: not a JSON file ({err})") from err
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a JSON {type(data).__name__}, not an object")
    return data


__all__ = [
    "CONFIG_FILE",
    "METRICS_FILE",
    "SUMMARY_FILE",
    "MetricsError",
    "check_complete_metrics",
    "holds_type",
    "holds_run",
    "read_json",
    "read_metrics",
    "summary_fields_wrong",
    "REQUIRED_SUMMARY_FIELDS",
]
