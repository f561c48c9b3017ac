"""The saved result of one reproduction (one table or figure), as plain JSON.

A reproduction (``reproductions/<paper>/<item>.py``) runs or reuses its runs and measurements,
then saves a :class:`ResultSet`: comparison rows (ours beside the paper's number, each with
the scale that produced it), the data of its figures, the runs it read, and what is missing.
Reports are rendered from these files alone.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import numbers
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RESULT_FILE = "result.json"
SCALES: tuple[str, ...] = ("smoke", "cpu", "gpu", "paper")
# One comparison row: a number of ours beside the paper's, with the scale of each ("verdict",
# "verdict_reason", "published" and "ours_setting": only in the rows of the papers' claims,
# :mod:`reproductions.claims`, whose "paper" is the bound the verdict is tested against;
# "seeds" and "values": the per-seed values behind a number of ours (one seed included), for
# paired comparisons and the "(n=1, seed s)" label; "values" alone: the per-sweep values of
# a repeated measurement; "n_of": what "n" counts ("seeds" of runs, or a measurement's
# "repeats"); "ours_setup" and "paper_setup": the model and data of our runs and
# of the paper's row, e.g. "ResNet-20 on digits (16x16 px)" beside "ResNet-9 on CIFAR-10");
# "row_flag": a few words the row's label needs where it alone would mislead ("batch never
# grew" beside a dynamic mini-batch row), shown with the label at a glance and in a claim.
COMPARISON_COLUMNS: tuple[str, ...] = (
    "row",
    "metric",
    "ours",
    "ours_sd",
    "n",
    "n_of",
    "scale",
    "paper",
    "unit",
    "paper_source",
    "note",
    "verdict",
    "verdict_reason",
    "published",
    "ours_setting",
    "seeds",
    "values",
    "ours_setup",
    "paper_setup",
    "row_flag",
)
# One line of a result's settings table: a row's method, its options as run (in words), its
# seeds, and what of its training setup differs from the setup its target's runs share.
SETTINGS_COLUMNS: tuple[str, ...] = ("row", "method", "options", "seeds", "differs")


#: The kinds of figure :func:`impl.report.figures.draw` draws.
FIGURE_KINDS: tuple[str, ...] = ("bar", "line", "scatter", "heatmap", "interval", "tradeoff")
#: A target's form: "<paper>.<item>", each part letters, digits, "_" or "-" (the paper part
#: names a page file, so no path can hide in it).
TARGET_FORM = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+")
#: The comparison-row keys that hold a number of ours or the paper's, or none.
NUMBER_COLUMNS: tuple[str, ...] = ("ours", "ours_sd", "paper")


def _is_number(value: Any) -> bool:
    """A real number (numpy's too, which save_result then writes as Python's), not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _check_figure(spec: Any) -> None:
    """``ValueError`` unless ``spec`` is a :class:`FigureSpec` that can be drawn: a known
    kind, column names as text, and data rows as objects."""
    if not isinstance(spec, FigureSpec):
        raise ValueError(f"a figure must be an object of FigureSpec's keys, not {spec!r}")
    if spec.kind not in FIGURE_KINDS:
        raise ValueError(f"unknown figure kind {spec.kind!r}; valid: {', '.join(FIGURE_KINDS)}")
    names = [spec.x, spec.y] + [c for c in (spec.hue, spec.style) if c is not None]
    if not all(isinstance(c, str) for c in names):
        raise ValueError(f"figure {spec.title!r}: x, y, hue and style must be column names")
    if not isinstance(spec.data, list) or not all(isinstance(r, dict) for r in spec.data):
        raise ValueError(f"figure {spec.title!r}: data must be a list of objects")


@dataclass
class FigureSpec:
    """A figure as data: the rows plotted and how (see :func:`impl.report.figures.draw`)."""

    kind: str
    x: str
    y: str
    data: list[dict[str, Any]]
    hue: str | None = None
    style: str | None = None
    title: str = ""
    xlabel: str | None = None
    ylabel: str | None = None
    logy: bool = False
    logx: bool = False
    caption: str = ""
    steps: bool = False  # a line figure of a value that changes in steps (e.g. a schedule)
    y_from_zero: bool = False  # an amount (memory, time) whose axis should start at 0


@dataclass
class ResultSet:
    """Everything a report shows about one table or figure, at one scale.

    Args:
        target: "<paper>.<item>" ("sdgp.table1", "cross.methods").
        title: heading of the section.
        scale: the scale that produced ``rows`` (smoke, cpu, gpu, paper).
        rows: comparison rows with the keys of :data:`COMPARISON_COLUMNS`.
        figures: figure specs (their data rows carry a ``scale`` or ``source`` column).
        runs: run directories read.
        missing: rows not produced here, each ``{"row", "reason"}`` (e.g. "needs gpu scale",
            "method 'x' not available").
        notes: free-text remarks shown under the table (choices, deviations from the paper).
        description: what the paper's table or figure shows and what this one runs.
        environment: :func:`impl.env.collect` at the time the result was produced.
        duration_s: wall seconds the reproduction took (runs reused count as 0).
        wide: show the rows as one line per row label and one column per metric (for tables
            with no paper numbers, such as the cross-method table).
        settings: the settings of the training rows, read from their runs' saved configs,
            one dict per row with the keys of :data:`SETTINGS_COLUMNS` (texts).
        setup: what every training run of the result shares (model, data, input size,
            epochs, batch size, optimizer), in words.
    """

    target: str
    title: str
    scale: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    figures: list[FigureSpec] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)
    missing: list[dict[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    description: str = ""
    environment: dict[str, Any] = field(default_factory=dict)
    duration_s: float = 0.0
    wide: bool = False
    settings: list[dict[str, str]] = field(default_factory=list)
    setup: str = ""

    @property
    def paper(self) -> str:
        """The paper key of ``target`` ("cross" for the cross-method tables)."""
        return self.target.partition(".")[0]

    @property
    def item(self) -> str:
        """The table or figure of ``target`` ("table1", "fig9")."""
        return self.target.partition(".")[2]

    def validate(self) -> None:
        """Raise ``ValueError`` on a bad target, scale, comparison row, missing entry or
        settings line."""
        if not isinstance(self.target, str) or not TARGET_FORM.fullmatch(self.target):
            raise ValueError(
                f"target {self.target!r} is not '<paper>.<item>' (letters, digits, '_', '-')"
            )
        if self.scale not in SCALES:
            raise ValueError(f"unknown scale {self.scale!r}; valid scales: {', '.join(SCALES)}")
        for part in ("rows", "missing", "settings"):
            entries = getattr(self, part)
            if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
                raise ValueError(f"{part} must be a list of objects")
        for part in ("notes", "runs"):
            entries = getattr(self, part)
            if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
                raise ValueError(f"{part} must be a list of texts")
        if not isinstance(self.environment, dict):
            raise ValueError("environment must be an object")
        if not isinstance(self.figures, list):
            raise ValueError("figures must be a list")
        for spec in self.figures:
            _check_figure(spec)
        for entry in self.missing:
            if "row" not in entry or "reason" not in entry:
                raise ValueError(f"missing entry without 'row' and 'reason': {entry}")
        for row in self.rows:
            unknown = sorted(set(row) - set(COMPARISON_COLUMNS))
            if unknown:
                raise ValueError(f"comparison row has unknown keys {unknown}")
            if "row" not in row or "metric" not in row:
                raise ValueError(f"comparison row without 'row' and 'metric': {row}")
            if row.get("ours") is not None and row.get("scale") not in SCALES:
                raise ValueError(f"a number of ours without its scale: {row}")
            for key in NUMBER_COLUMNS:
                if row.get(key) is not None and not _is_number(row[key]):
                    raise ValueError(f"comparison row's {key!r} is not a number: {row}")
            n = row.get("n")
            if n is not None and (
                not isinstance(n, numbers.Integral) or isinstance(n, bool) or n < 0
            ):
                raise ValueError(f"comparison row's 'n' is not a count: {row}")
        for line in self.settings:
            unknown = sorted(set(line) - set(SETTINGS_COLUMNS))
            if unknown or "row" not in line:
                raise ValueError(
                    f"settings line {line} needs 'row'; valid keys: {list(SETTINGS_COLUMNS)}"
                )


def _clean(value: Any) -> Any:
    """JSON-safe: NaN/inf -> None, numpy scalars -> Python, containers recursively."""
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        try:
            value = value.item()
        except (TypeError, ValueError):
            return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def save_result(result: ResultSet, directory: str | Path) -> Path:
    """Validate ``result`` and write it as ``<directory>/result.json``; return the path."""
    result.validate()
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / RESULT_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(_clean(dataclasses.asdict(result)), indent=1, sort_keys=True))
    tmp.replace(path)
    return path


#: The provenance each CSV row carries beside the comparison row's own keys.
CSV_PROVENANCE: tuple[str, ...] = ("commit", "date", "device", "torch")


def rows_csv_name(result: ResultSet) -> str:
    """The file name of ``result``'s rows as CSV: ``<target>.<scale>.csv``."""
    return f"{result.target}.{result.scale}.csv"


def rows_csv(result: ResultSet) -> str:
    """``result``'s comparison rows as CSV text: ``target``, then every key the rows hold
    (those of :data:`COMPARISON_COLUMNS` in its order: ours and the paper's number side by
    side, each row's ``scale``, empty where ours has no value; then the others by name),
    then the provenance of :data:`CSV_PROVENANCE` (the commit, the date, the GPU or else the
    CPU, the torch version). A list or dict cell is written as JSON; None as empty."""
    env = result.environment
    prov = {
        "commit": env.get("commit") or "",
        "date": env.get("date") or "",
        "device": env.get("gpu_name") or env.get("cpu_model") or "",
        "torch": env.get("torch") or "",
    }
    held = {k for row in result.rows for k in row}
    keys = [k for k in COMPARISON_COLUMNS if k in held] + sorted(held - set(COMPARISON_COLUMNS))
    columns = ["target", *(k for k in keys if k not in CSV_PROVENANCE), *CSV_PROVENANCE]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, columns, lineterminator="\n")
    writer.writeheader()
    for row in result.rows:
        cells = {k: _clean(v) for k, v in row.items()}  # NaN -> None, as in result.json
        cells = {k: "" if v is None else json.dumps(v) if isinstance(v, (list, dict)) else v
                 for k, v in cells.items()}  # fmt: skip
        writer.writerow({**cells, "target": result.target, **prov})
    return buf.getvalue()


def write_rows_csv(result: ResultSet, path: str | Path) -> Path:
    """Write :func:`rows_csv` of ``result`` to ``path`` (through a temporary file, so that a
    crash never leaves half a file); return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(rows_csv(result), encoding="utf-8")
    tmp.replace(path)
    return path


#: Keys a result file cannot be read without: a file lacking ``rows`` read as a result of no
#: row, and its page showed neither the paper's numbers nor a line saying they were missing.
REQUIRED_KEYS = ("target", "title", "scale", "rows")


def load_result(path: str | Path) -> ResultSet:
    """Read a ``result.json`` (a file, or a directory holding one) back into a ResultSet.

    Raises ``ValueError`` naming the file when it is not JSON, not a result's form (unknown
    or missing keys, a bad row) or fails :meth:`ResultSet.validate`."""
    path = Path(path)
    if path.is_dir():
        path = path / RESULT_FILE
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            raise ValueError(f"a JSON {type(data).__name__}, not an object")
        names = {f.name for f in dataclasses.fields(ResultSet)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"unknown keys {unknown}")
        missing = sorted(set(REQUIRED_KEYS) - set(data))  # save_result writes every key
        if missing:
            raise ValueError(f"missing keys {missing}")
        figures = data.get("figures", [])
        if not isinstance(figures, list) or not all(isinstance(f, dict) for f in figures):
            raise ValueError("figures must be a list of objects")
        data["figures"] = [FigureSpec(**f) for f in figures]
        result = ResultSet(**data)
        result.validate()
    except (ValueError, TypeError, AttributeError, KeyError) as err:  # JSON, or its shape
        detail = err if isinstance(err, ValueError) else f"{type(err).__name__}: {err}"
        raise ValueError(f"{path}: {detail}") from err
    return result


def load_results(paths: list[str | Path]) -> tuple[list[ResultSet], list[dict[str, str]]]:
    """Every ``result.json`` at or under ``paths`` (:func:`find_results`) that reads, and one
    ``{"path", "target", "reason"}`` for each that does not (``target``: the folder two
    above it, where results are saved, :func:`reproductions.common.result_dir`), so that
    one damaged file is listed instead of stopping every report."""
    results: list[ResultSet] = []
    unreadable: list[dict[str, str]] = []
    for path in find_results(paths):
        try:
            results.append(load_result(path))
        except (OSError, ValueError) as err:
            reason = str(err).removeprefix(f"{path}: ")
            unreadable.append(
                {"path": str(path), "target": path.parent.parent.name, "reason": reason}
            )
    return results, unreadable


def warn_unreadable(unreadable: list[dict[str, str]]) -> None:
    """One line on stderr for each result file :func:`load_results` could not read (the
    index lists them too)."""
    for u in unreadable:
        print(f"unreadable, listed on the index: {u['path']}: {u['reason']}", file=sys.stderr)


def find_results(paths: list[str | Path]) -> list[Path]:
    """Every ``result.json`` at or under ``paths``, sorted."""
    found: set[Path] = set()
    for p in paths:
        p = Path(p)
        if p.is_file() and p.name == RESULT_FILE:
            found.add(p)
        elif p.is_dir():
            found.update(p.rglob(RESULT_FILE))
    return sorted(found)


__all__ = [
    "COMPARISON_COLUMNS",
    "CSV_PROVENANCE",
    "RESULT_FILE",
    "SETTINGS_COLUMNS",
    "FigureSpec",
    "ResultSet",
    "find_results",
    "load_result",
    "load_results",
    "rows_csv",
    "rows_csv_name",
    "warn_unreadable",
    "write_rows_csv",
    "save_result",
]
