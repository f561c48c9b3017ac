"""The papers' published numbers (``reproductions/paper_values/*.csv``), read as data.

One CSV per table or figure, named ``<paper>_<item>.csv`` (``clicktrain_table1.csv``,
``sdgp_fig9.csv``). Every row is one number with the table or figure and section it was
transcribed from; docs/reproductions.md lists what could not be read from the papers' text.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pandas as pd

VALUES_DIR = Path(__file__).resolve().parent / "paper_values"
COLUMNS: tuple[str, ...] = (
    "paper",
    "item",
    "model",
    "dataset",
    "method",
    "setting",
    "metric",
    "value",
    "unit",
    "source",
    "note",
)
PAPERS: tuple[str, ...] = ("clicktrain", "prunetrain", "sdgp", "campfire")


def value_files(directory: str | Path = VALUES_DIR) -> list[Path]:
    """Every ``<paper>_<item>.csv`` of published numbers in ``directory``, sorted by name."""
    return sorted(Path(directory).glob("*.csv"))


def read_value_file(path: str | Path) -> pd.DataFrame:
    """Read one CSV of published numbers; raise ``ValueError`` on a malformed file.

    Checks: the header is exactly :data:`COLUMNS`, ``paper``/``item`` match the file name,
    every ``value`` parses as a float and every row names its ``source``.
    """
    path = Path(path)
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        if tuple(reader.fieldnames or ()) != COLUMNS:
            raise ValueError(f"{path.name}: header {reader.fieldnames} != {list(COLUMNS)}")
        rows = list(reader)
    paper, _, item = path.stem.partition("_")
    for i, row in enumerate(rows, start=2):
        if row["paper"] != paper or row["item"] != item:
            found = f"{row['paper']}/{row['item']}"
            raise ValueError(f"{path.name}:{i}: paper/item {found} != file name")
        if not row["source"].strip():
            raise ValueError(f"{path.name}:{i}: row without a source")
        try:
            row["value"] = float(row["value"])
        except ValueError as err:
            raise ValueError(f"{path.name}:{i}: value {row['value']!r} is not a number") from err
    return pd.DataFrame(rows, columns=list(COLUMNS))


def paper_values(
    paper: str | None = None, item: str | None = None, directory: str | Path = VALUES_DIR
) -> pd.DataFrame:
    """Published numbers, optionally of one ``paper`` and one ``item`` ("table1", "fig9").

    Returns a DataFrame with :data:`COLUMNS` (``value`` as float). Raises ``ValueError``
    naming the valid papers or items for an unknown one.
    """
    if paper is not None and paper not in PAPERS:
        raise ValueError(f"unknown paper {paper!r}; valid papers: {', '.join(PAPERS)}")
    files = value_files(directory)
    if paper is not None:
        files = [f for f in files if f.stem.partition("_")[0] == paper]
    if item is not None:
        items = sorted(f.stem.partition("_")[2] for f in files)
        files = [f for f in files if f.stem.partition("_")[2] == item]
        if not files:
            raise ValueError(f"no published values for {paper}.{item}; valid items: {items}")
    if not files:
        return pd.DataFrame(columns=list(COLUMNS))
    return pd.concat([read_value_file(f) for f in files], ignore_index=True)


def lookup(frame: pd.DataFrame, **match: str) -> pd.DataFrame:
    """The rows of ``frame`` whose columns equal every ``match`` value (exact, as strings)."""
    mask = pd.Series(True, index=frame.index)
    for column, value in match.items():
        if column not in frame.columns:
            raise ValueError(f"unknown column {column!r}; valid columns: {list(frame.columns)}")
        mask &= frame[column].astype(str) == str(value)
    return frame[mask]


__all__ = ["COLUMNS", "PAPERS", "VALUES_DIR", "lookup", "paper_values", "read_value_file"]
