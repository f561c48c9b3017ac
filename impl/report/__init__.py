"""Results -> DataFrames -> seaborn figures -> self-contained HTML.

Reports only read what runs and reproductions saved (``summary.json``, ``metrics.jsonl``,
``result.json``); they never train or measure. Every number of ours is shown with the scale
that produced it, beside the paper's number where the paper has one.

- :func:`load_runs` / :func:`load_metrics`: run directories -> DataFrames (complete runs only;
  the others listed in ``frame.attrs["incomplete"]``).
- :class:`ResultSet`, :func:`save_result`, :func:`load_result`: one reproduction's result.
- :func:`render_html`: one page; :func:`render_reports`: a page per paper plus ``index.html`` (and
  ``runs.html`` where there are runs).
- :func:`main`: ``pdtbench report PATHS... --out DIR``.
"""

from impl.report.cli import main
from impl.report.figures import draw, figure_data_uri
from impl.report.html import (
    FigureBlock,
    Section,
    Table,
    comparison_frame,
    format_mean_sd,
    format_number,
    provenance_rows,
    render_html,
    result_section,
)
from impl.report.pages import render_reports, runs_section
from impl.report.results import (
    COMPARISON_COLUMNS,
    FigureSpec,
    ResultSet,
    find_results,
    load_result,
    save_result,
)
from impl.report.runs import find_run_dirs, load_metrics, load_runs, time_to_accuracy
from impl.report.stats import ci95_half_width, mean_ci95

__all__ = [
    "COMPARISON_COLUMNS",
    "FigureBlock",
    "FigureSpec",
    "ResultSet",
    "Section",
    "Table",
    "ci95_half_width",
    "comparison_frame",
    "draw",
    "figure_data_uri",
    "find_results",
    "find_run_dirs",
    "format_mean_sd",
    "format_number",
    "load_metrics",
    "load_result",
    "load_runs",
    "main",
    "mean_ci95",
    "provenance_rows",
    "render_html",
    "render_reports",
    "result_section",
    "runs_section",
    "save_result",
    "time_to_accuracy",
]
