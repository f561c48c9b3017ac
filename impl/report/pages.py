"""Report pages: one per paper, one for plain runs, and ``index.html`` linking them."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from impl.report.figures import draw, figure_data_uri
from impl.report.html import (
    FigureBlock,
    Section,
    Table,
    page_title,
    provenance_rows,
    render_html,
    result_section,
)
from impl.report.results import ResultSet, rows_csv_name, write_rows_csv
from impl.report.runs import SUMMARY_COLUMNS

# A page's run table: the summary fields of impl.report.runs without best_top1 and the
# provenance columns (device, commit, path), to keep the table narrow.
RUN_TABLE_COLUMNS: tuple[str, ...] = tuple(
    c for c in SUMMARY_COLUMNS if c not in ("best_top1", "device", "commit", "path")
)
#: The runs table's headers: a summary field's words and unit (its values per sample, per
#: iteration or for the run, as the summary holds them); other columns keep their names.
RUN_TABLE_HEADERS: dict[str, str] = {
    "top1": "top-1 (%)",
    "compression_ratio": "conv compression (x)",
    "inference_flops": "inference FLOPs per sample (nominal)",
    "train_flops_nominal": "final model's training FLOPs per sample (nominal)",
    "train_flops_executed": "final model's training FLOPs per sample (executed)",
    "fwd_ms": "forward (ms)",
    "bwd_ms": "backward (ms)",
    "step_ms": "step (ms)",
    "iter_ms": "iteration (ms)",
    "comm_bytes_per_iter": "Allreduce bytes per iteration",
    "wall_seconds": "wall time incl. evaluation (s)",
}
#: The index column counting the rows of a result without a number of ours (:func:`unfilled`).
UNFILLED = "no number of ours"
PAPER_ORDER: tuple[str, ...] = ("claims", "clicktrain", "prunetrain", "sdgp", "campfire", "cross")


def _item_key(target: str) -> tuple[int, int, str]:
    item = target.partition(".")[2]
    m = re.match(r"(table|fig)(\d+)", item)
    if m:
        return (0 if m.group(1) == "table" else 1, int(m.group(2)), item)
    return (2, 0, item)


def unfilled(result: ResultSet) -> int:
    """How many of a result's rows have no number of ours at its scale: the comparison rows
    whose "Ours" is empty (a paper row that needs another scale, data set, model or method),
    plus the entries of ``result.missing`` that name no row of the table (an item the page
    lists as not shown). The index's "no number of ours" column; the page says why."""
    labels = {str(x.get("row", "")) for x in result.rows}
    empty = sum(1 for x in result.rows if x.get("ours") is None)
    return empty + sum(1 for m in result.missing if str(m.get("row", "")) not in labels)


def _status(result: ResultSet) -> str:
    """'filled' when some number of ours is there, else what the rows need."""
    if any(x.get("ours") is not None for x in result.rows):
        return "filled" + (" (some rows need more; see the page)" if unfilled(result) else "")
    reasons = sorted({m.get("reason", "") for m in result.missing})
    if reasons:
        others = len(reasons) - 1
        more = f" (+{others} other reason{'s' if others > 1 else ''})" if others else ""
        return f"paper numbers only: {reasons[0]}{more}"
    return "empty"


# The fields of a run's environment kept in the runs frame's columns (impl.report.runs._flat).
_ENV_COLUMNS: tuple[str, ...] = ("commit", "date", "torch", "gpu_name", "cpu_model")


def run_environment(runs: pd.DataFrame, run: dict[str, Any]) -> dict[str, Any]:
    """The whole saved environment of one row ``run`` of ``runs`` (from
    ``runs.attrs["environments"]``, see :func:`impl.report.runs.load_runs`), so that the
    footer shows CUDA, driver, TF32 and a modified tree; a frame without it (built by hand)
    gives the few fields its columns hold."""
    env = runs.attrs.get("environments", {}).get(str(run.get("path")))
    if env:
        return dict(env)
    # a run saved without an environment (by hand, or by an older version) beside runs with
    # one: its cells in those columns are NaN, which is no value
    return {k: v for k in _ENV_COLUMNS if isinstance(v := run.get(k), str)}


def runs_section(runs: pd.DataFrame, metrics: pd.DataFrame | None = None) -> Section:
    """Complete runs as a table (with their scale), top-1 per method, and test accuracy per
    epoch; the incomplete runs of ``runs.attrs["incomplete"]`` are listed as missing."""
    section = Section(title="Runs", anchor="runs")
    incomplete = runs.attrs.get("incomplete", [])
    # a run whose metrics do not read is complete: its summary's row and top-1 are shown,
    # its per-epoch curve is not
    section.missing = [
        {
            "row": r["path"],
            "reason": f"{r['status']}: {r['reason']} ("
            + ("its per-epoch curve not shown)" if r["status"] == "metrics unreadable"
               else "not shown)"),
        }
        for r in incomplete
    ]  # fmt: skip
    if runs.empty:
        section.text = "No complete run was found."
        return section
    if "scale" not in runs.columns:  # summaries written without it (by hand, older code)
        runs = runs.assign(scale="?")
    cols = [c for c in RUN_TABLE_COLUMNS if c in runs.columns]
    section.tables.append(
        Table(
            runs[cols].rename(columns=RUN_TABLE_HEADERS),
            "complete runs, each with its scale; FLOPs are the final model's, times the last "
            "epoch's medians",
        )
    )
    scales = sorted(set(runs["scale"].dropna().astype(str)))
    section.scale = ", ".join(scales)
    if "top1" in runs.columns and runs["top1"].notna().any():
        fig = draw(
            "bar",
            runs,
            x="method",
            y="top1",
            hue="scale",
            title="Final top-1 per method",
            ylabel="top-1 (%)",
        )
        section.figures.append(
            FigureBlock(
                figure_data_uri(fig),
                "mean over each method's runs; the bar's line: their sd, where it has several",
                alt="Final top-1 per method",
            )
        )
    if metrics is not None and not metrics.empty and "test_top1" in metrics.columns:
        fig = draw(
            "line",
            metrics.assign(epoch=metrics["epoch"] + 1),  # counted from 1, as every figure
            x="epoch",
            y="test_top1",
            hue="method",
            style="scale",
            title="Test top-1 per epoch",
            ylabel="top-1 (%)",
        )
        section.figures.append(
            FigureBlock(
                figure_data_uri(fig),
                "mean over each method's runs; the band: their sd, where it has several",
                alt="Test top-1 per epoch",
            )
        )
    return section


def section_with_csv(result: ResultSet, out_dir: Path) -> Section:
    """:func:`impl.report.html.result_section` of ``result``, with its rows written to
    ``<out_dir>/csv/<target>.<scale>.csv`` and linked from the section (a result of no row
    writes nothing)."""
    section = result_section(result)
    if result.rows:
        name = f"csv/{rows_csv_name(result)}"
        write_rows_csv(result, out_dir / name)
        section.data = name
    return section


def render_reports(
    results: Sequence[ResultSet],
    out_dir: str | Path,
    *,
    runs: pd.DataFrame | None = None,
    metrics: pd.DataFrame | None = None,
    expected: Sequence[dict[str, str]] = (),
    unreadable: Sequence[dict[str, str]] = (),
    others: Sequence[dict[str, str]] = (),
) -> Path:
    """Write ``<out_dir>/<paper>.html`` per paper, ``runs.html`` for ``runs``, and
    ``index.html``, and each result's rows as ``<out_dir>/csv/<target>.<scale>.csv``;
    return the index's path.

    ``expected`` lists every target a complete report should hold (``{"target", "title",
    "needs"}``); one without a result is shown in the index as missing, with the scale it
    needs, instead of disappearing. ``unreadable`` lists the result files that could not be
    read (:func:`impl.report.results.load_results`): the index names each with its error,
    and an expected target whose only result is one of them says so instead of "not run".
    ``others`` lists the papers' figures without a target of their own (``{"paper",
    "figure", "shows", "where"}``): the index shows them in a table of their own, each with
    where it is drawn instead or why it is not.
    """
    broken = {u["target"]: u for u in unreadable}
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    by_paper: dict[str, list[ResultSet]] = {}
    for r in results:
        by_paper.setdefault(r.paper, []).append(r)
    papers = [p for p in PAPER_ORDER if p in by_paper] + sorted(
        p for p in by_paper if p not in PAPER_ORDER
    )
    expected_by_paper: dict[str, list[dict[str, str]]] = {}
    for e in expected:
        expected_by_paper.setdefault(e["target"].partition(".")[0], []).append(e)
    for p in expected_by_paper:
        if p not in papers:
            papers.append(p)
    nav = [("index.html", "index")] + [(f"{p}.html", p) for p in papers]
    if runs is not None:
        nav.append(("runs.html", "runs"))
    index_rows: list[dict[str, Any]] = []
    built: dict[int, Section] = {}  # each result's section, drawn and written once (the
    # claims' are shown again on the index)
    for paper in papers:
        items = sorted(by_paper.get(paper, []), key=lambda r: (_item_key(r.target), r.scale))
        built.update((id(r), section_with_csv(r, out_dir)) for r in items)
        sections = [built[id(r)] for r in items]
        have = {r.target for r in items}
        for e in sorted(expected_by_paper.get(paper, []), key=lambda e: _item_key(e["target"])):
            if e["target"] in have:
                continue
            # the page says why in a sentence, the index in its status column
            if e["target"] in broken:
                why = f"its result is unreadable ({broken[e['target']]['path']})"
                status = f"unreadable: {broken[e['target']]['path']}"
            else:
                why = e.get("needs") or "not run"
                status = f"not run: {e['needs']}" if e.get("needs") else "not run"
            sections.append(
                Section(
                    title=e.get("title", e["target"]),
                    anchor=e["target"].replace(".", "-"),
                    missing=[{"row": e["target"], "reason": why}],
                )
            )
            index_rows.append(
                {
                    "page": f"{paper}.html",
                    "target": e["target"],
                    "title": e.get("title", ""),
                    "scale": "-",
                    "ours": 0,
                    UNFILLED: "all",
                    "status": status,
                }
            )
        prov = provenance_rows((r.scale, r.environment, r.target) for r in items)
        render_html(
            page_title(paper, items),
            sections,
            out_dir / f"{paper}.html",
            provenance=prov,
            nav=nav,
        )
        for r in items:
            index_rows.append(
                {
                    "page": f"{paper}.html",
                    "target": r.target,
                    "title": r.title,
                    "scale": r.scale,
                    "ours": sum(1 for x in r.rows if x.get("ours") is not None),
                    UNFILLED: unfilled(r),
                    "status": _status(r),
                }
            )
    if runs is not None:
        envs = [(str(r.get("scale")), run_environment(runs, r)) for r in runs.to_dict("records")]
        render_html(
            "Runs",
            [runs_section(runs, metrics)],
            out_dir / "runs.html",
            nav=nav,
            provenance=provenance_rows(envs),
        )
    order = {p: i for i, p in enumerate(papers)}
    index_rows.sort(key=lambda r: (order.get(r["page"][:-5], 99), _item_key(r["target"])))
    index = pd.DataFrame(
        index_rows, columns=["page", "target", "title", "scale", "ours", UNFILLED, "status"]
    )
    section = Section(
        title="Reproductions",
        anchor="index",
        missing=[
            {"row": u["path"], "reason": f"unreadable result, not shown: {u['reason']}"}
            for u in unreadable
        ],
        text="Each table and figure of the four papers, with the scale that produced it "
        "(or the scale it needs), and the cross-method table no paper has.",
        tables=[
            Table(
                index,
                "one row per table or figure and scale; 'ours': rows with a number of ours at "
                f"that scale; '{UNFILLED}': rows without one (most need another scale, data "
                "set, model or method; some were measured and found nothing to report, as "
                "a crossover never reached in the swept grid; the page says which)",
            )
        ],
    )
    if others:
        section.tables.append(
            Table(
                pd.DataFrame(list(others), columns=["paper", "figure", "shows", "where"]),
                "the papers' other figures: where each is drawn, or why it is not",
            )
        )
    if index.empty:
        section.tables = []
        section.text = "No reproduction results: the paths given held no result.json" + (
            "; the training runs are on the runs page (runs.html)." if runs is not None else "."
        )
    # The claims come first on the index: what a reader asks before any table.
    claims = [built[id(r)] for r in sorted(by_paper.get("claims", []), key=lambda r: r.scale)]
    prov = provenance_rows((r.scale, r.environment, r.target) for r in results)
    return render_html(
        "pdtbench reproductions", [*claims, section], out_dir / "index.html", provenance=prov,
        nav=nav,
    )  # fmt: skip


__all__ = [
    "RUN_TABLE_COLUMNS",
    "UNFILLED",
    "render_reports",
    "run_environment",
    "section_with_csv",
    "runs_section",
    "unfilled",
]
