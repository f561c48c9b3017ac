"""Seaborn figures drawn from DataFrames, embedded in HTML as base64 data URIs.

Figures use matplotlib's object API (``matplotlib.figure.Figure`` with the Agg canvas), so
nothing here touches a display or pyplot's global state.
"""

from __future__ import annotations

import base64
import io
import textwrap
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_rgb
from matplotlib.container import BarContainer
from matplotlib.figure import Figure

from impl.report.results import FIGURE_KINDS
from impl.report.stats import mean_ci95

IMAGE_FORMATS: tuple[str, ...] = ("png", "svg")
#: One colour per method wherever a figure's groups are methods, so that a method keeps its
#: colour from figure to figure (seaborn's default gives the first group drawn the first
#: colour, and a figure without the dense run would shift every method's).
METHOD_ORDER: tuple[str, ...] = ("dense", "clicktrain", "prunetrain", "sdgp", "campfire")
#: Above this many categories on a bar or interval figure's x axis, the figure widens and its
#: labels stand steeper, so that they do not run into each other; labels of more than
#: CROWDED_CHARS characters in all stand steeper too.
CROWDED_X = 8
CROWDED_CHARS = 80


def figure_data_uri(fig: Figure, fmt: str = "png", dpi: int = 110) -> str:
    """``fig`` encoded as a ``data:image/...;base64,`` URI (PNG or SVG), for an ``<img src>``."""
    if fmt not in IMAGE_FORMATS:
        raise ValueError(f"unknown image format {fmt!r}; valid: {', '.join(IMAGE_FORMATS)}")
    if fig.canvas is None or not isinstance(fig.canvas, FigureCanvasAgg):
        FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, dpi=dpi, bbox_inches="tight")
    mime = "image/png" if fmt == "png" else "image/svg+xml"
    return f"data:{mime};base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def t_interval(values: Any) -> tuple[float, float]:
    """(low, high) of the 95% confidence interval of the mean of ``values``
    (:func:`impl.report.stats.mean_ci95`), as seaborn's ``errorbar`` callable; both equal the
    mean for a single value."""
    _, low, high = mean_ci95(values)
    return low, high


def group_palette(groups: Any) -> dict[str, Any] | None:
    """A fixed colour per group where the groups are known ones, so that a group keeps its
    colour from figure to figure: methods of :data:`METHOD_ORDER` (each method its own
    colour), or sources ("ours (<scale>)" in the first colour, "paper" in the second, also
    in a figure of the paper's numbers alone). None for any other groups (seaborn's order of
    appearance)."""
    import seaborn as sns

    names = [str(g) for g in pd.unique(pd.Series(list(groups)).dropna())]
    if not names:
        return None
    if set(names) <= set(METHOD_ORDER):
        colors = sns.color_palette(n_colors=len(METHOD_ORDER))
        return {m: colors[i] for i, m in enumerate(METHOD_ORDER) if m in names}
    ours = sorted(n for n in names if n.startswith("ours"))
    papers = sorted(n for n in names if n.startswith("paper"))
    if len(papers) == 1 and set(names) <= {*papers, *ours}:  # "paper", "paper (V100)"
        colors = sns.color_palette(n_colors=len(ours) + 2)
        slots = [0, *range(2, len(ours) + 1)][: len(ours)]
        mine = {n: colors[i] for n, i in zip(ours, slots, strict=True)}
        return {papers[0]: colors[1], **mine}
    return None


def figure_width(data: pd.DataFrame, kind: str, x: str) -> float:
    """Width of a figure in inches: 6.4, or wider for a bar or interval figure of more than
    :data:`CROWDED_X` categories (0.45 in each, at most 14)."""
    if kind in ("bar", "interval"):
        n = data[x].nunique()
        if n > CROWDED_X:
            return min(14.0, max(6.4, 0.45 * n))
    return 6.4


def crowded_axis(data: pd.DataFrame, kind: str, x: str) -> bool:
    """Whether a bar or interval figure's x labels would run into each other at 20 degrees:
    more than :data:`CROWDED_X` categories, or more than :data:`CROWDED_CHARS` characters of
    labels in all."""
    if kind not in ("bar", "interval"):
        return False
    labels = [str(v) for v in pd.unique(data[x].dropna())]
    return len(labels) > CROWDED_X or sum(map(len, labels)) > CROWDED_CHARS


#: Characters per line of a category label: a longer one is broken at its spaces.
LABEL_WRAP = 24
#: Characters per line of a legend entry (entries of 60 left the axes a third of the width).
LEGEND_WRAP = 30


def _slant(ax: Any, crowded: bool) -> None:
    """Break long x tick labels into lines of at most :data:`LABEL_WRAP` characters, tilt
    them (20 degrees, 45 where the axis is crowded), right-aligned, and make the figure
    taller by what the labels need, so that they do not squeeze the plot (seven labels of
    45 characters at 45 degrees left it 70 pixels high)."""
    texts = [t.get_text() for t in ax.get_xticklabels()]
    wrapped = [textwrap.fill(t, LABEL_WRAP, break_long_words=False) for t in texts]
    ax.set_xticks(ax.get_xticks())
    ax.set_xticklabels(wrapped)
    angle = 45 if crowded else 20
    for label in ax.get_xticklabels():
        label.set_rotation(angle)
        label.set_horizontalalignment("right")
    lines = [w.splitlines() or [""] for w in wrapped]
    longest = max((len(line) for w in lines for line in w), default=0)
    rows = max((len(w) for w in lines), default=1)
    # inches: about 0.075 per character of 10-point text, 0.17 per line
    below = longest * 0.075 * np.sin(np.radians(angle)) + rows * 0.17 * np.cos(np.radians(angle))
    fig = ax.get_figure()
    width, height = fig.get_size_inches()
    fig.set_size_inches(width, max(height, 3.0 + below))


def _mark_zero_bars(ax: Any) -> None:
    """Write "0" at each bar of zero height, which would otherwise look like a bar without a
    value."""
    for container in ax.containers:
        if isinstance(container, BarContainer) and (container.datavalues == 0).any():
            labels = ["0" if h == 0 else "" for h in container.datavalues]
            ax.bar_label(container, labels=labels, fontsize="x-small", padding=2)


def _new_figure(width: float = 6.4, height: float = 3.6) -> tuple[Figure, Any]:
    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot(1, 1, 1)


#: Marker shapes of a scatter's groups, in order, and the area (points^2) of the first and
#: the last group's: groups drawn later are smaller and on top, so points of two groups at
#: the same place read as one marker inside the other instead of one hiding the other.
SCATTER_MARKERS: tuple[str, ...] = ("o", "s", "D", "^", "v", "P", "X", "*", "p", "h")
SCATTER_AREAS: tuple[float, float] = (140.0, 55.0)


def _shrinking(big: float, small: float, n: int) -> list[float]:
    """``n`` marker sizes from ``big`` down to ``small`` in equal steps (``[big]`` for one):
    each group drawn later is smaller, so that it shows inside an earlier one it covers."""
    return [big if n == 1 else big - (big - small) * i / (n - 1) for i in range(n)]


def _pale(color: Any) -> tuple[float, float, float, float]:
    """``color`` at 30% opacity: the fill inside a marker's solid outline."""
    return (*to_rgb(color), 0.3)


def _scatter(
    ax: Any, data: pd.DataFrame, x: str, y: str, hue: str | None, palette: dict | None
) -> None:
    """Points of ``data`` per ``hue`` group (in order of appearance), each group its own
    colour and marker (:data:`SCATTER_MARKERS`), the groups' markers shrinking from the
    first to the last (:data:`SCATTER_AREAS`) and drawn in that order, so that coinciding
    points of different groups all show (one PruneTrain penalty's point hid another's)."""
    import seaborn as sns

    if hue is None:
        ax.scatter(data[x], data[y], s=SCATTER_AREAS[0] / 2, zorder=2)
        return
    groups = list(pd.unique(data[hue].dropna()))
    colors = palette or dict(zip(groups, sns.color_palette(n_colors=len(groups)), strict=True))
    areas = _shrinking(*SCATTER_AREAS, len(groups))
    for i, (g, area) in enumerate(zip(groups, areas, strict=True)):
        part = data[data[hue] == g]
        # a pale fill inside a solid outline: a larger marker under a smaller one still
        # shows its whole outline
        ax.scatter(part[x], part[y], s=area, marker=SCATTER_MARKERS[i % len(SCATTER_MARKERS)],
                   facecolors=[_pale(colors[g])], edgecolors=[colors[g]], linewidths=1.6,
                   label=str(g), zorder=2 + i)  # fmt: skip
    ax.legend(title=hue)


def spread_note(
    kind: str,
    data: pd.DataFrame,
    x: str,
    hue: str | None = None,
    style: str | None = None,
    over: str = "repeats",
) -> str:
    """What a bar or line figure's error bars or bands show, for its caption: the standard
    deviation over the ``over`` ("seeds" of runs, "repeats" of a measurement, or "seeds or
    repeats") of a value (:func:`draw` draws ``errorbar="sd"``), said only
    where some bar or point has repeats to spread over ("" otherwise, and for the other
    kinds, whose captions state their 95% intervals). A heatmap's cells: one value each
    ("one run, whose colour carries its seed's noise") or the mean of several."""
    keys = [c for c in (x, hue, style) if c is not None and c in data.columns]
    if kind not in ("bar", "line", "heatmap") or data.empty or not keys:
        return ""
    repeated = bool((data.groupby(keys, dropna=False).size() > 1).any())
    if kind == "heatmap":
        if not repeated:
            return "Each cell is one run: differences between cells include seed-to-seed noise."
        return "Each cell is the mean of its runs."
    if not repeated:
        return ""
    what = "Error bars" if kind == "bar" else "Bands"
    return f"{what}: the standard deviation over the {over} of a value (mean drawn)."


#: Marker diameters (points) of the first and the last line of a line figure.
LINE_MARKERS: tuple[float, float] = (11.0, 4.0)


def _nest_markers(ax: Any) -> None:
    """Give the lines' markers a pale fill inside a solid outline, the first line's largest
    and each later one's smaller (:data:`LINE_MARKERS`), so that where two series coincide
    (Campfire's three masks at one sparsity; dense and Campfire's first epochs) the one drawn
    first still shows around the other instead of under it."""
    lines = [  # seaborn's legend handles are lines of no data: left as they are
        ln
        for ln in ax.get_lines()
        if ln.get_marker() not in (None, "None", "", " ") and len(ln.get_xdata())
    ]
    for line, size in zip(lines, _shrinking(*LINE_MARKERS, len(lines)), strict=True):
        line.set_markersize(size)
        line.set_markeredgecolor(line.get_color())
        line.set_markerfacecolor(_pale(line.get_color()))
        line.set_markeredgewidth(1.4)


def _tradeoff(ax: Any, data: pd.DataFrame, x: str, y: str, hue: str | None) -> None:
    """One point per ``hue`` group: means of ``x`` and ``y`` with their 95% CIs as error bars."""
    import seaborn as sns

    if hue is None:
        raise ValueError("a tradeoff figure needs hue (one point per group)")
    data[x] = pd.to_numeric(data[x], errors="coerce")
    groups = list(data.groupby(hue, sort=False))
    by_method = group_palette(name for name, _ in groups)
    colors = (
        [by_method[str(name)] for name, _ in groups]
        if by_method
        else sns.color_palette(n_colors=max(len(groups), 1))
    )
    for color, (name, g) in zip(colors, groups):
        xs, ys = g[x].dropna(), g[y].dropna()
        if xs.empty or ys.empty:
            continue
        (mx, xlo, xhi), (my, ylo, yhi) = mean_ci95(xs), mean_ci95(ys)
        ax.errorbar(mx, my, xerr=[[mx - xlo], [xhi - mx]], yerr=[[my - ylo], [yhi - my]],
                    fmt="o", capsize=3, color=color, label=str(name))  # fmt: skip
        ax.annotate(str(name), (mx, my), textcoords="offset points", xytext=(6, 6),
                    fontsize="small", color=color)  # fmt: skip
    ax.axhline(0.0, color="0.4", linestyle="--", linewidth=1)


def _whole_numbers(values: pd.Series) -> bool:
    """Whether every value is a whole number (epochs, batch sizes): ticks between them mean
    nothing."""
    v = pd.to_numeric(values, errors="coerce")
    return bool(v.notna().all() and len(v) and (v == v.round()).all())


def _plain_short_log_ticks(axis: Any, values: pd.Series) -> None:
    """On a log axis whose data span less than a decade, label the ticks as plain numbers
    (matplotlib's default there is "3 x 10^1" on a few minor ticks only)."""
    from matplotlib.ticker import FuncFormatter

    v = pd.to_numeric(values, errors="coerce")
    v = v[v > 0]
    if v.empty or v.max() >= 10 * v.min():
        return
    plain = FuncFormatter(lambda value, _pos: f"{value:g}")
    axis.set_major_formatter(plain)
    axis.set_minor_formatter(plain)


def plain_text(text: str) -> str:
    """``text`` as matplotlib draws it literally: each ``$`` escaped, so that a label such as
    a run named ``a$b$`` is not read as mathtext (italics, or an error that stops the page)."""
    return text.replace("$", r"\$")


def draw(
    kind: str,
    data: pd.DataFrame,
    *,
    x: str,
    y: str,
    hue: str | None = None,
    style: str | None = None,
    title: str = "",
    xlabel: str | None = None,
    ylabel: str | None = None,
    logy: bool = False,
    logx: bool = False,
    steps: bool = False,
    y_from_zero: bool = False,
) -> Figure:
    """One seaborn plot of ``data`` (``kind`` in :data:`FIGURE_KINDS`).

    ``bar``: mean of ``y`` per ``x`` (and ``hue``) with the standard deviation as error bar;
    ``line``: ``y`` against ``x`` per ``hue``/``style`` (mean and sd band over repeats; with
    ``steps``, each value held until the next ``x``, for a schedule that changes in steps);
    ``scatter``: points, each ``hue`` group its own marker, later groups' smaller and on
    top so that coinciding points all show; ``interval``: mean of ``y`` per ``x`` (and
    ``hue``) with its 95% confidence interval (:func:`t_interval`) and a dashed line at
    ``y = 0``, for per-seed differences against a baseline; ``heatmap``: ``y`` is the value
    column, ``x`` the columns and ``hue`` the rows of the grid (a cell with no value is grey
    and says "not run"); ``tradeoff``: one labelled point per ``hue`` group at the means of
    ``x`` and ``y`` over its repeats, with the 95% confidence interval of each as
    error bars and a dashed line at ``y = 0`` (e.g. top-1 change against FLOPs saved, one point
    per method). ``y_from_zero`` starts the value axis at 0 (an amount such as memory, whose
    changes a cropped axis would magnify). Raises ``ValueError`` on an unknown kind or missing
    column.
    """
    import seaborn as sns

    if kind not in FIGURE_KINDS:
        raise ValueError(f"unknown figure kind {kind!r}; valid: {', '.join(FIGURE_KINDS)}")
    needed = [c for c in (x, y, hue, style) if c is not None]
    missing = [c for c in needed if c not in data.columns]
    if missing:
        raise ValueError(f"columns {missing} not in the data (have {list(data.columns)})")
    data = data.copy()
    data[y] = pd.to_numeric(data[y], errors="coerce")
    for column in {x, hue, style} - {None, y}:  # category labels: ticks, legend, annotations
        data[column] = data[column].map(lambda v: plain_text(v) if isinstance(v, str) else v)
    title = plain_text(title)
    xlabel = plain_text(xlabel if xlabel is not None else x)
    ylabel = plain_text(ylabel if ylabel is not None else y)
    width = figure_width(data, kind, x)
    fig, ax = _new_figure(width)
    palette = group_palette(data[hue]) if hue is not None else None
    if kind == "bar":
        sns.barplot(data=data, x=x, y=y, hue=hue, errorbar="sd", palette=palette, ax=ax)
        _slant(ax, crowded_axis(data, kind, x))
        _mark_zero_bars(ax)
    elif kind == "line":
        # each group its own dashes too (style=hue), unless the caller styles by another
        # column: a line drawn over an equal one then shows the first through its gaps
        sns.lineplot(data=data, x=x, y=y, hue=hue, style=style if style else hue, marker="o",
                     errorbar="sd",
                     palette=palette, drawstyle="steps-post" if steps else "default",
                     ax=ax)  # fmt: skip
        _nest_markers(ax)
    elif kind == "interval":
        sns.pointplot(data=data, x=x, y=y, hue=hue, errorbar=t_interval, linestyle="none",
                      capsize=0.15, dodge=0.3 if hue else False, palette=palette,
                      ax=ax)  # fmt: skip
        ax.axhline(0.0, color="0.4", linestyle="--", linewidth=1)
        _slant(ax, crowded_axis(data, kind, x))
    elif kind == "scatter":
        if style is None:
            _scatter(ax, data, x, y, hue, palette)
        else:
            sns.scatterplot(data=data, x=x, y=y, hue=hue, style=style, s=60, palette=palette,
                            ax=ax)  # fmt: skip
    elif kind == "tradeoff":
        _tradeoff(ax, data, x, y, hue)
    else:
        if hue is None:
            raise ValueError("a heatmap needs hue (the row labels)")
        grid = data.pivot_table(index=hue, columns=x, values=y, aggfunc="mean")
        sns.heatmap(grid, annot=True, fmt=".1f", cmap="viridis", ax=ax)
        ax.set_facecolor("0.9")
        for i, j in zip(*np.nonzero(grid.isna().to_numpy())):
            ax.text(j + 0.5, i + 0.5, "not run", ha="center", va="center", color="0.35",
                    fontsize="small")  # fmt: skip
    if logy:
        ax.set_yscale("log")
        _plain_short_log_ticks(ax.yaxis, data[y])
    if logx:
        ax.set_xscale("log")
        _plain_short_log_ticks(ax.xaxis, data[x])
    if y_from_zero:
        # from 0, with room above the highest value: a line at its top would lie on the frame
        top = float(np.nanmax(data[y])) if data[y].notna().any() else 0.0
        ax.set_ylim(0.0, max(ax.get_ylim()[1], 1.05 * top) if top > 0 else None)
    ax.set_title(title, wrap=True)  # a long title breaks into lines, not past the figure
    if kind in ("line", "scatter") and not logx and _whole_numbers(data[x]):
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # epochs: 1, 2, 3, not 1.5
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if ax.get_legend() is not None and kind != "heatmap":
        # Beside the axes, not over them: a legend inside hid bars and points. With a style
        # too, seaborn's legend holds a heading per mapping; one title would repeat hue's.
        legend = ax.legend(fontsize="small", title=hue if style is None else None,
                           loc="upper left", bbox_to_anchor=(1.01, 1.0),
                           borderaxespad=0.0)  # fmt: skip
        # a long entry broken into lines, so that the legend does not take the axes' width
        for text in legend.get_texts():
            text.set_text(textwrap.fill(text.get_text(), LEGEND_WRAP, break_long_words=False))
    fig.tight_layout()
    return fig


__all__ = [
    "CROWDED_CHARS",
    "plain_text",
    "CROWDED_X",
    "FIGURE_KINDS",
    "IMAGE_FORMATS",
    "LABEL_WRAP",
    "LEGEND_WRAP",
    "LINE_MARKERS",
    "METHOD_ORDER",
    "SCATTER_AREAS",
    "SCATTER_MARKERS",
    "crowded_axis",
    "draw",
    "figure_data_uri",
    "figure_width",
    "group_palette",
    "spread_note",
    "t_interval",
]
