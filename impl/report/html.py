"""Self-contained HTML pages: tables, base64-embedded figures, and a provenance footer.

A page needs no other file: CSS is inline and figures are ``data:`` URIs. Every number of
ours is printed with the scale that produced it, beside the paper's number and its source.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import html
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
import pandas as pd

from impl.report.figures import draw, figure_data_uri, spread_note
from impl.report.labels import METRIC_LABELS, metric_label, n_label
from impl.report.results import FigureSpec, ResultSet
from impl.report.stats import ci95_half_width

PAPER_TITLES: dict[str, str] = {
    "clicktrain": "ClickTrain (ICS 2021)",
    "prunetrain": "PruneTrain (SC 2019)",
    "sdgp": "SDGP: Structured Data Gradient Pruning (2022)",
    "campfire": "Campfire (2020)",
    "cross": "Every method on equal terms (no paper has this table)",
    "claims": "The papers' headline claims, judged against our results",
    "runs": "Runs",
}


def page_title(paper: str, results: Sequence[ResultSet] = ()) -> str:
    """The title of ``paper``'s page (:data:`PAPER_TITLES`); the cross-method page counts the
    methods its results show (one row label each), so that a registered plug-in method
    is counted: "6 methods on equal terms (no paper has this table)"."""
    title = PAPER_TITLES.get(paper, paper)
    if paper != "cross":
        return title
    methods = {str(r.get("row", "")) for res in results for r in res.rows}
    if not methods:
        return title
    n = len(methods)
    return f"{n} method{'s' if n != 1 else ''} on equal terms (no paper has this table)"


@dataclass
class Table:
    """A table to show: its frame (already formatted or raw numbers) and a caption."""

    frame: pd.DataFrame
    caption: str = ""


@dataclass
class FigureBlock:
    """An embedded figure: a data URI, a caption, and an alt text."""

    uri: str
    caption: str = ""
    alt: str = "figure"


@dataclass
class Section:
    """One heading of a page: text, tables, figures, notes and what is missing."""

    title: str
    anchor: str = ""
    text: str = ""
    tables: list[Table] = field(default_factory=list)
    figures: list[FigureBlock] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    missing: list[dict[str, str]] = field(default_factory=list)
    scale: str = ""
    data: str = ""  # a relative link to the section's rows as CSV


#: The multiples a table cell writes with a letter (:func:`format_number`), largest first.
SUFFIXES: tuple[tuple[float, str], ...] = ((1e12, "T"), (1e9, "G"), (1e6, "M"))


def format_number(value: Any, digits: int = 4) -> str:
    """A number for a table cell: ``-`` for missing/NaN, thousands as k/M/G/T with
    ``digits`` significant digits, small numbers with up to ``digits`` significant digits."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    v = float(value)
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    a = abs(v)
    for factor, suffix in SUFFIXES:
        if a >= factor:
            return f"{v / factor:.{digits}g}{suffix}"
    short = f"{v:.{digits}g}"
    if a >= 1e5 or abs(float(short)) >= 10**digits:  # 9999.5 rounds to 1e+04: write 10,000
        return f"{v:,.0f}"
    if v == int(v):
        return str(int(v))
    return short


# Units whose single values are shown to two decimals (an accuracy or a change of one).
POINT_UNITS: tuple[str, ...] = ("%", "pp")


def _places(x: float, digits: int) -> int:
    """Decimals that show ``|x| > 0`` with ``digits`` significant digits (at least 0)."""
    return max(0, digits - 1 - math.floor(math.log10(abs(x))))


def format_mean_sd(
    mean: float,
    sd: float | None,
    n: int | None,
    paired: bool = False,
    unit: str = "",
    seeds: Sequence[int] | None = None,
) -> str:
    """``mean ± sd (n=...)`` for a table cell, the mean rounded to the place of the sd's second
    significant digit (at most 4 significant digits, as :func:`format_number`; a mean of a
    million or more as "17.38M", its sd in the same multiple: "± 0.96M"); without an sd,
    a value in a unit of :data:`POINT_UNITS` (an accuracy or a change of one) to two decimals.
    Every number says how many seeds (or measurements) it stands for
    (:func:`impl.report.labels.n_label`): "(n=5)", and a single one "(n=1, seed 0)" (its seed
    where ``seeds`` gives it), so that one seed is never read as a mean. ``paired`` (a per-seed
    difference against a baseline, e.g. ``delta_top1``) adds the 95% confidence interval of
    the mean difference (:func:`ci95_half_width`): one that contains 0 says the difference is
    within seed-to-seed noise."""
    has_sd = sd is not None and not math.isnan(sd)
    text = format_number(mean)
    if not has_sd and unit in POINT_UNITS and abs(mean) < 1e5:
        text = f"{mean:.2f}"
    if has_sd and sd > 0 and abs(mean) < 1e5:
        places = _places(sd, 2) if mean == 0 else min(_places(sd, 2), _places(mean, 4))
        text = f"{mean:,.{places}f}"
    if has_sd:
        sd_text = f"{sd:.{_places(sd, 2)}f}" if 0 < sd < 1000 else format_number(sd, 2)
        suffix = next(((f, x) for f, x in SUFFIXES if abs(mean) >= f), None)
        # in the mean's multiple: "17.38M ± 0.96M", not "17.38M ± 964,322" (one far below
        # it keeps its own digits: "± 12", not "± 0.000012M")
        if suffix and sd >= 1e-3 * suffix[0]:
            scaled = sd / suffix[0]
            sd_text = f"{scaled:.{_places(scaled, 2)}f}{suffix[1]}"
        text = f"{text} ± {sd_text}"
    label = n_label(n, seeds)
    if label:
        text += f" {label}"
    if n and n > 1:
        half = ci95_half_width(sd, n) if has_sd else math.nan
        if paired and half > 0:
            p = _places(half, 2)
            text += f" [95% CI {mean - half:.{p}f}, {mean + half:.{p}f}]"
    return text


def _ours_text(r: dict[str, Any]) -> str:
    """The "Ours" cell of one comparison row (:func:`format_mean_sd`)."""
    ours = r.get("ours")
    if ours is None:
        return format_number(ours)
    paired = str(r.get("metric", "")).startswith("delta_")
    return format_mean_sd(float(ours), r.get("ours_sd"), r.get("n"), paired,
                          r.get("unit") or "", r.get("seeds"))  # fmt: skip


def row_label(r: dict[str, Any]) -> str:
    """The "Row" cell of one comparison row: its label, and where our runs and the paper's
    row use different models or data, both ("dense (ours: ResNet-20 on digits; paper:
    ResNet-9 on CIFAR-10)"), so that no number of ours stands beside the paper's unlabelled."""
    label = str(r.get("row", ""))
    ours, paper = r.get("ours_setup"), r.get("paper_setup")
    if ours and paper and ours != paper:
        return f"{label} (ours: {ours}; paper: {paper})"
    return label


def comparison_frame(rows: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """Comparison rows -> the displayed table: Row, Metric, Ours, Scale, Paper, Unit, Source,
    Note. "Ours" reads ``mean ± sd (n)`` (:func:`format_mean_sd`; with the 95% CI for
    ``delta_*`` metrics, which are per-seed differences against the baseline; "(n=1, seed s)"
    for one seed); a number never loses its scale; metrics read as words
    (:data:`impl.report.labels.METRIC_LABELS`).

    Rows with a ``verdict`` (the papers' claims) make a table of claims instead: the bound the
    verdict is tested against is not the paper's number, so its column is "Tested against";
    "Published" gives the paper's own number with its citation, "Our setting" the setting of
    our runs where it differs from the paper's, and "Verdict" the verdict with its reason."""
    if any(r.get("verdict") for r in rows):
        return _claims_frame(rows)
    out = []
    for r in rows:
        ours = r.get("ours")
        metric = str(r.get("metric", ""))
        out.append(
            {
                "Row": row_label(r),
                "Metric": METRIC_LABELS.get(metric, metric),
                "Ours": _ours_text(r),
                "Scale": r.get("scale") or ("-" if ours is None else "?"),
                "Paper": format_number(r.get("paper")),
                "Unit": r.get("unit") or "",
                "Paper source": r.get("paper_source") or "",
                "Note": r.get("note") or "",
            }
        )
    columns = ["Row", "Metric", "Ours", "Scale", "Paper", "Unit", "Paper source", "Note"]
    return pd.DataFrame(out, columns=columns)


# The verdict beside the claim, where a reader looks first; the evidence after it.
CLAIMS_COLUMNS: tuple[str, ...] = (
    "Claim", "Verdict", "Ours", "Tested against", "Unit", "Scale", "Metric", "Published",
    "Paper source", "Our setting", "Note",
)  # fmt: skip
#: The class of a claims table's verdict cell, by the verdict it begins with (coloured).
VERDICT_CLASSES: dict[str, str] = {
    "holds": "v-holds", "does not hold": "v-not", "inconclusive": "v-open",
}  # fmt: skip


def _claims_frame(rows: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """The table of claims of :func:`comparison_frame`."""
    out = []
    for r in rows:
        ours = r.get("ours")
        verdict = r.get("verdict") or ""
        if r.get("verdict_reason"):
            verdict = f"{verdict}: {r['verdict_reason']}"
        out.append(
            {
                "Claim": r.get("row", ""),
                "Metric": r.get("metric", ""),
                "Ours": _ours_text(r),
                "Scale": r.get("scale") or ("-" if ours is None else "?"),
                "Tested against": format_number(r.get("paper")),
                "Unit": r.get("unit") or "",
                "Published": r.get("published") or "",
                "Paper source": r.get("paper_source") or "",
                "Our setting": r.get("ours_setting") or "",
                "Verdict": verdict,
                "Note": r.get("note") or "",
            }
        )
    return pd.DataFrame(out, columns=list(CLAIMS_COLUMNS))


def glance_frame(rows: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """The rows we measured, one line per row label and one column per metric (in words, with
    its unit), each cell our mean with the paper's number in brackets where it has one
    ("98.79 (paper 47)"): a comparison table at a glance, above the long one that gives the
    spreads, sources and notes. Empty where fewer than two labels or two metrics were
    measured (the long table is then short enough)."""
    if any(r.get("verdict") for r in rows):  # the claims: one metric each, a table of their own
        return pd.DataFrame()
    cells: dict[tuple[str, str], str] = {}  # (row label, metric in words) -> cell, in order
    for r in rows:
        if r.get("ours") is None:
            continue
        ours = float(r["ours"])
        # -0.8333 as the rows below: -0.83; under 0.01 as they do too (-0.00403, not -0.00)
        small = 0.01 <= abs(ours) < 10 and ours != int(ours)
        text = f"{ours:.2f}" if small else format_number(ours)
        if r.get("paper") is not None:
            text += f" (paper {format_number(r.get('paper'))})"
        metric = metric_label(str(r.get("metric", "")), r.get("unit") or "")
        label = str(r.get("row", ""))
        if r.get("row_flag"):  # what the label alone would hide ("batch never grew")
            label = f"{label} ({r['row_flag']})"
        cells[(label, metric)] = text
    labels = list(dict.fromkeys(label for label, _ in cells))
    metrics = list(dict.fromkeys(metric for _, metric in cells))
    if len(labels) < 2 or len(metrics) < 2:
        return pd.DataFrame()
    out = [{"Row": label, **{m: cells.get((label, m), "-") for m in metrics}} for label in labels]
    return pd.DataFrame(out, columns=["Row", *metrics])


def _counted_over(rows: Sequence[dict[str, Any]]) -> str:
    """What the n of the ``rows`` of ours count: "seeds" (runs), "repeats" (a measurement's,
    ``n_of``), or "seeds or repeats" where they differ."""
    kinds = {r.get("n_of") or "seeds" for r in rows if r.get("ours") is not None}
    return kinds.pop() if len(kinds) == 1 else "seeds or repeats"


def glance_subject(rows: Sequence[dict[str, Any]]) -> str:
    """What the cells of :func:`glance_frame` are, for its caption: "our means over 5 seeds"
    where every row of ours has the same ``n``, "our values (one seed each)" for 1, "our
    means (seeds per row: see below)" where they differ, and "our means" where no row says.
    A measurement's rows count repeats, not seeds (``n_of``: "repeats"), and say so."""
    ours = [r for r in rows if r.get("ours") is not None]
    counts = {r.get("n") for r in ours}
    what = _counted_over(ours)
    one = {"seeds": "seed", "repeats": "repeat"}.get(what, "seed or repeat")
    if not counts or counts == {None}:
        return "our means"
    if len(counts) > 1:
        return f"our means ({what} per row: see below)"
    (n,) = counts
    return f"our values (one {one} each)" if int(n) == 1 else f"our means over {int(n)} {what}"


def wide_frame(rows: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """Comparison rows as one line per metric (in words, with its unit:
    :func:`impl.report.labels.metric_label`) and one column per row label, each cell
    ``mean ± sd (n)`` (:func:`format_mean_sd`); a last line names each column's scale(s)."""
    if not rows:
        return pd.DataFrame()
    labels = list(dict.fromkeys(str(r.get("row", "")) for r in rows))
    per_row: dict[str, list[str]] = {}
    cells: dict[tuple[str, str], str] = {}
    scales: dict[str, set[str]] = {}
    for r in rows:
        label, metric = str(r.get("row", "")), metric_label(str(r.get("metric", "")),
                                                            r.get("unit") or "")  # fmt: skip
        per_row.setdefault(label, []).append(metric)
        cells[(label, metric)] = _ours_text(r)
        if r.get("ours") is not None:
            scales.setdefault(label, set()).add(str(r.get("scale") or "?"))
    richest = max(per_row.values(), key=len)  # the row with the most metrics sets the order
    metrics = list(dict.fromkeys(richest + [m for ms in per_row.values() for m in ms]))
    out = [{"Metric": m, **{r: cells.get((r, m), "-") for r in labels}} for m in metrics]
    out.append({"Metric": "Scale", **{r: ", ".join(sorted(scales.get(r, {"-"}))) for r in labels}})
    return pd.DataFrame(out, columns=["Metric", *labels])


def _frame_html(frame: pd.DataFrame) -> str:
    shown = frame.copy()
    for c in shown.columns:
        shown[c] = shown[c].map(format_number)
    body = shown.to_html(index=False, escape=True, border=0, classes="data", na_rep="-")
    body = body.replace("<td>-</td>", '<td class="na">-</td>')
    if "Verdict" in frame.columns:  # a claims table: each verdict in its colour
        words = "|".join(re.escape(v) for v in VERDICT_CLASSES)
        body = re.sub(
            rf"<td>({words})(:|</td>)",
            lambda m: f'<td class="verdict {VERDICT_CLASSES[m.group(1)]}">{m.group(1)}{m.group(2)}',
            body,
        )
    # a cell naming a page of the report links to it, and one naming a target to its section
    body = re.sub(r"<td>([a-z0-9_]+\.html)</td>", r'<td><a href="\1">\1</a></td>', body)
    return re.sub(
        rf"<td>(({'|'.join(TARGET_PAGES)})\.[a-z0-9_]+)</td>",
        lambda m: (
            f'<td><a href="{m.group(2)}.html#{m.group(1).replace(".", "-")}">{m.group(1)}</a></td>'
        ),
        body,
    )


#: The pages whose sections are targets ("<page>.<item>", anchored "<page>-<item>").
TARGET_PAGES: tuple[str, ...] = ("clicktrain", "prunetrain", "sdgp", "campfire", "cross")


def settings_frame(settings: Sequence[dict[str, str]]) -> pd.DataFrame:
    """A result's settings lines (:data:`impl.report.results.SETTINGS_COLUMNS`) as the table
    shown under its numbers: Row, Method, Options (as run), Seeds, and what differs from the
    shared setup (a column left out when nothing does)."""
    frame = pd.DataFrame(
        [
            {
                "Row": s.get("row", ""),
                "Method": s.get("method", ""),
                "Options (as run)": s.get("options", ""),
                "Seeds": s.get("seeds", ""),
                "Differs from the shared setup": s.get("differs", ""),
            }
            for s in settings
        ]
    )
    if not any(s.get("differs") for s in settings):
        frame = frame.drop(columns=["Differs from the shared setup"])
    return frame


def settings_caption(result: ResultSet) -> str:
    """The caption of a result's settings table: where the settings come from and the setup
    every run shares."""
    shared = f" Shared by every run: {result.setup}." if result.setup else ""
    return (
        f"Settings of the runs of {result.target} at scale {result.scale}, from their saved "
        f"configs.{shared}"
    )


def result_section(result: ResultSet) -> Section:
    """A :class:`ResultSet` as a page section: comparison table, figures, notes, missing."""
    section = Section(
        title=result.title,
        anchor=result.target.replace(".", "-"),
        text=result.description,
        notes=list(result.notes),
        missing=list(result.missing),
        scale=result.scale,
    )
    if result.rows and result.wide:
        section.tables.append(
            Table(wide_frame(result.rows), f"{result.target} at scale {result.scale}")
        )
    elif result.rows:
        glance = glance_frame(result.rows)
        if not glance.empty:
            section.tables.append(
                Table(glance, f"At a glance: {glance_subject(result.rows)} at scale "
                      f"{result.scale}, the paper's number in brackets (its own models and "
                      "data: see the rows below, with spreads, sources and notes)")
            )  # fmt: skip
        section.tables.append(
            Table(comparison_frame(result.rows), f"{result.target} at scale {result.scale}")
        )
    if result.settings:
        section.tables.append(Table(settings_frame(result.settings), settings_caption(result)))
    over = _counted_over(result.rows)  # what the figures' error bars spread over
    for spec in [part for f in result.figures for part in paper_only_apart(f, result.scale)]:
        data = pd.DataFrame(spec.data)
        if data.empty:
            section.missing.append({"row": spec.title or "figure", "reason": "no data to plot"})
            continue
        try:
            fig = draw(
                spec.kind,
                data,
                x=spec.x,
                y=spec.y,
                hue=spec.hue,
                style=spec.style,
                # the scale in the picture itself, so that it stays labelled wherever shown
                title=scaled_title(spec.title, figure_scale(data, result.scale)),
                xlabel=spec.xlabel,
                ylabel=spec.ylabel,
                logy=spec.logy,
                logx=spec.logx,
                steps=spec.steps,
                y_from_zero=spec.y_from_zero,
            )
        except ValueError as err:  # a column the saved data lacks: listed, the page goes on
            reason = f"figure could not be drawn: {err}"
            section.missing.append({"row": spec.title or "figure", "reason": reason})
            continue
        caption = spec.caption or spec.title
        note = spread_note(spec.kind, data, spec.x, spec.hue, spec.style, over)
        if note and not re.search(r"\bsd\b|standard deviation", caption, re.IGNORECASE):
            caption = f"{caption.rstrip()} {note}" if caption else note
        section.figures.append(FigureBlock(figure_data_uri(fig), caption, alt=spec.title))
    return section


def paper_only_apart(spec: FigureSpec, scale: str) -> list[FigureSpec]:
    """A bar figure of ours beside the paper's, per row, as one or two figures: where some
    rows hold only the paper's number (rows that need a larger scale than ``scale``), those
    bars move to a second figure, so that the paper's numbers for other models and data
    neither sit among the compared bars nor set their axis. Any other figure is returned
    as it is."""
    if spec.kind != "bar" or spec.hue != "source":
        return [spec]
    ours = {r.get(spec.x) for r in spec.data if not str(r.get("source", "")).startswith("paper")}
    compared = [r for r in spec.data if r.get(spec.x) in ours]
    alone = [r for r in spec.data if r.get(spec.x) not in ours]
    if not compared or not alone:
        return [spec]
    return [
        dataclasses.replace(spec, data=compared),
        dataclasses.replace(
            spec,
            data=alone,
            title=f"{spec.title}: the paper's other rows"
            if spec.title
            else "The paper's other rows",
            caption=f"The paper's numbers for the rows not run at scale {scale} (the table "
            "says what each needs).",
        ),
    ]


def figure_scale(data: pd.DataFrame, scale: str) -> str:
    """The scale a figure's numbers are of: "paper" when every record's ``source`` is the
    paper's (a figure that no run of ours fills), else the result's ``scale``."""
    if "source" in data.columns and len(data):
        if data["source"].astype(str).str.startswith("paper").all():
            return "paper"
    return scale


def scaled_title(title: str, scale: str | None) -> str:
    """A figure's title with the scale of its numbers: "Fig. 9 (cpu scale)"; a title that
    names its scale already is kept as it is."""
    if not scale or f"{scale} scale" in title:
        return title
    return f"{title} ({scale} scale)" if title else f"{scale} scale"


def _tf32(env: dict[str, Any]) -> str:
    """The TF32 flags (matmul/cudnn) a result's numbers were made with; "-" where nothing of
    it ran under them: a result of the paper's numbers only, or of other results (the
    claims), or one made with a CPU-only torch (no CUDA version), which has no TF32."""
    flags = (env.get("tf32_matmul", "?"), env.get("tf32_cudnn", "?"))
    if flags == (None, None) or ("cuda" in env and not env["cuda"]):
        return "-"
    return f"{flags[0]}/{flags[1]}"


def provenance_rows(environments: Iterable[tuple[Any, ...]]) -> pd.DataFrame:
    """The provenance footer: one row per distinct (scale, commit, device, versions) seen.

    ``environments`` yields ``(scale, environment)`` or ``(scale, environment, label)``
    (``environment`` as written by :func:`impl.env.collect`; a reproduction's result adds
    ``runs_trained_at``, the commits its runs were trained at, shown where it has runs).
    Where labels are given and there is more than one row, a "results" column names the
    labels (a page's targets) each row holds for.
    """
    seen: list[dict[str, Any]] = []
    labels: list[list[str]] = []
    for item in environments:
        scale, env, label = (*item, None) if len(item) == 2 else item
        env = env or {}
        device = env.get("gpu_name")
        if not device:  # a CPU run: the model, and the vector ISA that can change rounding
            device = env.get("cpu_model") or "?"
            if env.get("cpu_model") and env.get("cpu_capability"):
                device = f"{device} ({env['cpu_capability']})"
        commit = env.get("commit") or "?"
        if env.get("dirty"):
            commit = f"{commit[:12]} (modified tree)"
        else:
            commit = commit[:12]
        row = {
            "scale": scale,
            "commit": commit,
            "device": device,
            "torch": env.get("torch") or "?",
            "cuda": env.get("cuda") or "-",
            "driver": env.get("gpu_driver") or env.get("driver") or "-",
            "tf32 (matmul/cudnn)": _tf32(env),
            "date": (env.get("date") or "?")[:10],
        }
        trained = env.get("runs_trained_at")
        if trained:  # a result compared at one commit from runs trained at others
            row["runs trained at"] = ", ".join(trained)
        if row not in seen:
            seen.append(row)
            labels.append([])
        held = labels[seen.index(row)]
        if label is not None and label not in held:
            held.append(str(label))
    frame = pd.DataFrame(seen)
    if len(seen) > 1 and any(labels):
        frame.insert(0, "results", [", ".join(held) for held in labels])
    return frame


_TEMPLATE = jinja2.Template(
    """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>{{ title }}</title>
<style>
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em auto;
max-width:1200px;padding:0 1em;color:#222;line-height:1.45}
h1{font-size:1.6em;margin-bottom:.2em} h2{font-size:1.25em;margin-top:2em;
border-bottom:1px solid #ddd;padding-bottom:.2em} .sub{color:#555;margin-top:0}
table.data{border-collapse:collapse;font-size:.85em;margin:.6em 0 1em 0}
table.data th,table.data td{border:1px solid #ccc;padding:.25em .5em;text-align:left;
vertical-align:top} table.data th{background:#f3f3f3} td.na{color:#999}
.scale{display:inline-block;border-radius:3px;padding:0 .4em;font-size:.8em;
background:#e8f0fe;color:#1a4b9b;margin-left:.4em}
figure{margin:1em 0} figure img{max-width:100%;border:1px solid #eee}
figcaption{font-size:.85em;color:#555} .missing{color:#8a4b00}
footer{margin-top:3em;border-top:1px solid #ddd;font-size:.8em;color:#555}
nav a{margin-right:1em}
td.v-holds{background:#e6f4ea} td.v-not{background:#fce8e6} td.v-open{background:#fef7e0}
</style></head><body>
<nav>{% for href, label in nav %}<a href="{{ href }}">{{ label }}</a>{% endfor %}</nav>
<h1>{{ title }}</h1>
{% if subtitle %}<p class="sub">{{ subtitle }}</p>{% endif %}
{% if sections|length > 1 %}<ul>{% for s in sections %}
<li><a href="#{{ s.anchor }}">{{ s.title }}</a>{% if s.scale %}<span class="scale">{{ s.scale }}
</span>{% endif %}</li>{% endfor %}</ul>{% endif %}
{% for s in sections %}
<section id="{{ s.anchor }}">
<h2>{{ s.title }}{% if s.scale %}<span class="scale">scale: {{ s.scale }}</span>{% endif %}</h2>
{% if s.text %}<p>{{ s.text }}</p>{% endif %}
{% for t in s.tables %}{{ t.html }}{% if t.caption %}<p class="sub">{{ t.caption }}</p>
{% endif %}{% endfor %}
{% if s.data %}<p class="sub">The rows as CSV: <a href="{{ s.data }}">{{ s.data }}</a></p>
{% endif %}
{% for f in s.figures %}<figure><img src="{{ f.uri }}" alt="{{ f.alt }}">
<figcaption>{{ f.caption }}</figcaption></figure>{% endfor %}
{% if s.notes %}<ul>{% for n in s.notes %}<li>{{ n }}</li>{% endfor %}</ul>{% endif %}
{% if s.missing %}<p class="missing"><b>Not shown here:</b></p><ul class="missing">
{% for m in s.missing %}<li>{{ m.row }}: {{ m.reason }}</li>{% endfor %}</ul>{% endif %}
</section>
{% endfor %}
<footer><p><b>Provenance.</b> Generated {{ generated }}. Scales: smoke (pipeline check),
cpu (digits, small models, 2 CPU cores), gpu (paper shapes on one GPU), paper (full protocol).
Numbers in a "Paper" or "Published" column are the papers' own, at their full protocol;
a "Tested against" column holds the bound a claim's verdict is judged against. Every number
of ours says how many seeds it stands for: "(n=1, seed 0)" is one run, not a mean.</p>
{{ provenance }}</footer>
</body></html>
""",
    autoescape=False,
)


def render_html(
    title: str,
    sections: Sequence[Section],
    out: str | Path,
    *,
    subtitle: str = "",
    provenance: pd.DataFrame | None = None,
    nav: Sequence[tuple[str, str]] = (),
) -> Path:
    """Write one self-contained HTML page to ``out`` and return its path.

    Tables are escaped; figures must already be data URIs (see
    :func:`impl.report.figures.figure_data_uri`), so the page loads no other file.
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rendered = []
    for i, s in enumerate(sections):
        tables = [
            {"html": _frame_html(t.frame), "caption": html.escape(t.caption)} for t in s.tables
        ]
        figures = [
            {"uri": f.uri, "caption": html.escape(f.caption), "alt": html.escape(f.alt)}
            for f in s.figures
            if f.uri.startswith("data:image/")
        ]
        rendered.append(
            {
                "title": html.escape(s.title),
                "anchor": html.escape(s.anchor or f"s{i}"),
                "text": html.escape(s.text),
                "tables": tables,
                "figures": figures,
                "notes": [html.escape(n) for n in s.notes],
                "missing": [
                    {
                        "row": html.escape(str(m.get("row", ""))),
                        "reason": html.escape(str(m.get("reason", ""))),
                    }
                    for m in s.missing
                ],
                "scale": html.escape(s.scale),
                "data": html.escape(s.data),
            }
        )
    prov = "" if provenance is None or provenance.empty else _frame_html(provenance)
    page = _TEMPLATE.render(
        title=html.escape(title),
        subtitle=html.escape(subtitle),
        sections=rendered,
        provenance=prov,
        generated=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        nav=[(html.escape(h), html.escape(label)) for h, label in nav],
    )
    out.write_text(page, encoding="utf-8")
    return out


__all__ = [
    "PAPER_TITLES",
    "page_title",
    "FigureBlock",
    "Section",
    "Table",
    "comparison_frame",
    "format_mean_sd",
    "row_label",
    "settings_caption",
    "settings_frame",
    "wide_frame",
    "format_number",
    "provenance_rows",
    "render_html",
    "result_section",
    "scaled_title",
]
