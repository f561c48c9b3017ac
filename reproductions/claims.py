"""The papers' headline claims, each judged against our saved results at one scale.

A claim is a sentence of a paper with a number (its abstract or a table), the result of ours
that speaks to it (a target, a row and a metric of a saved ``result.json``), and a stated
rule that turns the two into a verdict:

- ``holds``: ours meets the paper's number (for a mean over seeds, or over repeated timing
  sweeps: its whole 95% confidence interval does);
- ``does not hold``: ours misses it (the whole interval does);
- ``inconclusive``: the interval straddles the paper's number (more seeds or sweeps would
  tell), or there is no interval: a number from one seed (or one measurement) is never
  judged, whatever its value;
- ``not measured at this scale``: the result it needs is not there, with the target to run;
- ``not judged (smoke scale: pipeline check)``: every claim at the smoke scale, whose runs of
  a few SGD steps prove that the pipeline runs, not what a method does.

The verdict is about the scale that produced our number, never about the paper's setting:
a small-scale "does not hold" says what happens at small scale. A timed claim is judged on
the device that timed it (at the cpu scale, the CPU), which its row names. The claims are evaluated
after every ``pdtbench reproduce`` and saved as the target ``claims.headline``, so reports
read them like any other result.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from impl.report.results import ResultSet
from impl.report.stats import ci95_half_width, mean_ci95

TARGET_KEY = "claims.headline"
TITLE = "Do the papers' headline claims hold? (at the scale of our results)"
NOT_JUDGED = "not judged (smoke scale: pipeline check)"
VERDICTS: tuple[str, ...] = (
    "holds",
    "does not hold",
    "inconclusive",
    "not measured at this scale",
    NOT_JUDGED,
)
NO_INTERVAL = "one seed or measurement (n=1): no interval"
MIN_N = 2  # a verdict needs at least this many seeds (or sweeps): an interval


@dataclass(frozen=True)
class Evidence:
    """What our results say about one claim: the number shown (mean, sd over n seeds), its
    95% interval (``low``, ``high``; equal to the mean for a single measurement) and how it
    was read. ``n`` counts the values the verdict weighs; ``n_shown``, where it differs, those
    the mean rests on (a sweep that never crossed counts in the range, not in the mean)."""

    mean: float
    sd: float | None
    n: int
    low: float
    high: float
    text: str
    interval: str = "95% interval"  # what [low, high] is, as a verdict's reason names it
    n_shown: int | None = None


@dataclass(frozen=True)
class Claim:
    """One headline claim of a paper.

    Args:
        paper: the paper key ("clicktrain", "prunetrain", "sdgp", "campfire").
        claim: the claim in a few words.
        metric: the quantity compared, named as in our results.
        paper_value: the paper's number (the bound the rule compares against).
        unit: unit of ``paper_value`` and of ours.
        source: where the paper states it (abstract, table, figure, section).
        rule: how the verdict is reached, in words.
        needs: the target whose result :attr:`read` uses.
        read: our results of one scale (target key -> ResultSet) -> Evidence, or None when
            the result is not there.
        higher_is_better: whether ours must be at least (True) or at most (False) the
            paper's number.
        published: the paper's own number(s) behind the claim, in words, where it publishes
            one ("-1.47 pp (ResNet-50 ImageNet, ratio 0.2)"); ``paper_value`` is the bound
            the rule tests, which is not always a published number (e.g. the -0.3 pp margin
            of "within 0.3%").
        setting: scale -> the setting of our runs where it differs from the paper's (e.g.
            PruneTrain's penalty ratio on the short runs), in words; None: the model and
            data of :attr:`needs` only.
        strict: the interval must lie strictly beyond the bound ("above 0": a difference of
            exactly 0 is no evidence of "more"), for both verdicts; otherwise reaching it is
            enough ("at least", "at or above").
        timed: ours is a time (or a ratio of times): the setting names the device it was
            timed on and says that its interval is of repeats within one reproduction, not of
            reproductions on other days (:func:`timed_on`).
    """

    paper: str
    claim: str
    metric: str
    paper_value: float
    unit: str
    source: str
    rule: str
    needs: str
    read: Callable[[Mapping[str, ResultSet]], Evidence | None]
    higher_is_better: bool = True
    published: str = ""
    setting: Callable[[str], str] | None = None
    strict: bool = False
    timed: bool = False


#: A row's label, or a function of the result's scale giving it (a label that names what the
#: short runs of the cpu and gpu scales train with, as PruneTrain's "ratio 0.25, run at 0.85").
RowName = str | Callable[[str], str]


def row_label(row: RowName, scale: str) -> str:
    """The label ``row`` reads at ``scale``."""
    return row(scale) if callable(row) else row


def _row(
    results: Mapping[str, ResultSet],
    target: str,
    row: RowName,
    metric: str,
    *,
    or_values: bool = False,
) -> dict[str, Any] | None:
    """The comparison row of ``metric`` of ``row`` with a number of ours (or, with
    ``or_values``, at least per-sweep values, which may all be null), in the result of
    ``target``; None if absent."""
    res = results.get(target)
    if res is None:
        return None
    row = row_label(row, res.scale)
    for r in res.rows:
        if r.get("row") == row and r.get("metric") == metric:
            if r.get("ours") is not None or (or_values and r.get("values")):
                return r
    return None


def _stat(
    results: Mapping[str, ResultSet], target: str, row: RowName, metric: str
) -> tuple[float, float | None, int] | None:
    """(mean, sd, n) of ``metric`` of ``row`` in the result of ``target``; None if absent."""
    r = _row(results, target, row, metric)
    return None if r is None else (float(r["ours"]), r.get("ours_sd"), int(r.get("n") or 1))


def _log_interval(mean: float, sd: float, n: int) -> tuple[float, float]:
    """The 95% interval of a positive mean ratio on the log scale, its sd there by the delta
    method (``sd / mean``): it cannot reach below 0, as a symmetric one did for noisy sweeps."""
    half_log = ci95_half_width(sd / mean, n)
    return mean * math.exp(-half_log), mean * math.exp(half_log)


def _mean_ci(stat: tuple[float, float | None, int], fmt: str, unit: str) -> Evidence:
    mean, sd, n = stat
    sep = "" if unit in ("x", "%") else " "
    half = ci95_half_width(sd, n)  # NaN for one value or no sd
    if math.isnan(half):
        # no interval (one value, or no sd saved beside n values): judged as one value
        what = "one measurement" if n < 2 else f"n={n}, no standard deviation saved"
        return Evidence(mean, sd, 1, mean, mean, f"{mean:{fmt}}{sep}{unit} ({what})")
    if unit == "x" and mean > 0 and sd is not None:
        # A ratio's interval on the log scale (its sd there, by the delta method, sd / mean):
        # symmetric in the ratio's own scale it went below 0 for a few noisy sweeps, a
        # speedup no measurement can have.
        low, high = _log_interval(mean, sd, n)
        text = (
            f"{mean:{fmt}}x, 95% CI [{low:{fmt}}, {high:{fmt}}] "
            f"(n={n}, on the log scale, delta method)"
        )
        return Evidence(mean, sd, n, low, high, text)
    text = f"{mean:{fmt}}{sep}{unit}, 95% CI [{mean - half:{fmt}}, {mean + half:{fmt}}] (n={n})"
    return Evidence(mean, sd, n, mean - half, mean + half, text)


def metric_reader(
    target: str, row: RowName, metric: str, fmt: str = ".2f", unit: str = ""
) -> Callable[[Mapping[str, ResultSet]], Evidence | None]:
    """A reader of one row's metric: its mean with the 95% CI over seeds where it has one."""

    def read(results: Mapping[str, ResultSet]) -> Evidence | None:
        stat = _stat(results, target, row, metric)
        return None if stat is None else _mean_ci(stat, fmt, unit)

    read.reads = ((target, row),)  # type: ignore[attr-defined]
    return read


def sweeps_won_reader(
    target: str, row: str, metric: str, crossover: str, bound: float
) -> Callable[[Mapping[str, ResultSet]], Evidence | None]:
    """A reader of a per-sweep test that passes (1) or fails (0) in each sweep, judged sweep
    by sweep: the evidence's range is [1, 1] when every sweep passed, [0, 0] when every one
    failed, [0, 1] otherwise, so a claim with the bound 1 holds only if every sweep passed
    and fails only if none did (ClickTrain Sec. 5.2: the pattern SpMM faster than both dense
    ways at every swept sparsity above 65%, ``metric``).

    A result saved before ``metric`` was measured is read from its per-sweep ``crossover``
    (the lowest swept sparsity where the test's event happened) and the swept grid of its
    figure: a sweep whose crossover lies above the lowest swept sparsity above ``bound``, or
    that has none, failed there; any other sweep is unknown (a win there says nothing of the
    points above it), which keeps the claim from failing without holding it."""

    def read(results: Mapping[str, ResultSet]) -> Evidence | None:
        r = _row(results, target, row, metric, or_values=True)
        if r is not None:
            raw = r.get("values") or [r.get("ours")]
            vals = [None if v is None or not math.isfinite(float(v)) else float(v) for v in raw]
            source = ""
        else:
            c = _row(results, target, row, crossover, or_values=True)
            if c is None:
                return None
            grid = {float(d["sparsity"]) for f in results[target].figures for d in f.data
                    if d.get("sparsity") is not None}  # fmt: skip
            first = min((g for g in grid if g > bound), default=None)
            if first is None:
                return None
            raw = c.get("values") or [c.get("ours")]
            lost = [v is None or not math.isfinite(float(v)) or float(v) > first for v in raw]
            vals = [0.0 if x else None for x in lost]
            source = (
                f"; read from each sweep's crossover: one above {first:g}% (or none) lost there"
            )
        won, lost_n = vals.count(1.0), vals.count(0.0)
        unknown = len(vals) - won - lost_n
        text = (
            f"beat both at every swept sparsity above {bound:g}% in {won} of {len(vals)} sweeps"
            + (f", lost at one of them in {lost_n}" if lost_n else "")
            + (f", {unknown} not known" if unknown else "")
            + source
        )
        mean = won / (won + lost_n) if won + lost_n else math.nan
        low = 1.0 if won == len(vals) else 0.0
        high = 0.0 if lost_n == len(vals) else 1.0
        return Evidence(mean, None, len(vals), low, high, text, "range over the sweeps",
                        n_shown=(won + lost_n) or None)  # fmt: skip

    read.reads = ((target, row),)  # type: ignore[attr-defined]
    return read


def _per_seed(
    results: Mapping[str, ResultSet],
    target: str,
    row: str,
    base_row: str,
    metric: str,
    nonzero_base: bool = True,
) -> tuple[list[int], dict[int, float], dict[int, float]] | None:
    """The seeds both rows kept finite per-seed values of ``metric`` for (at least two; with
    ``nonzero_base``, only those where the base row's value is not 0), and each row's values
    by seed; None where they cannot be paired."""
    ro, rb = _row(results, target, row, metric), _row(results, target, base_row, metric)
    if ro is None or rb is None:
        return None
    po, pb = (dict(zip(r.get("seeds") or [], r.get("values") or [])) for r in (ro, rb))

    def finite(v: Any) -> bool:  # a saved inf or NaN reads back as null (None)
        return v is not None and math.isfinite(v)

    common = sorted(
        s
        for s in set(po) & set(pb)
        if finite(po[s]) and finite(pb[s]) and (pb[s] or not nonzero_base)
    )
    return (common, po, pb) if len(common) >= 2 else None


def _seed_counts(n_row: int, n_base: int) -> str:
    """How many seeds the two means of a one-measurement ratio or difference are over: "one
    seed", "means over 5 seeds", or each count where they differ ("means over one seed and 5
    seeds", the row's first)."""
    if max(n_row, n_base) < 2:
        return "one seed"
    if n_row == n_base:
        return f"means over {n_row} seeds"
    each = ("one seed" if k < 2 else f"{k} seeds" for k in (n_row, n_base))
    return "means over " + " and ".join(each)


def _relative_reader(
    target: str,
    row: str,
    base_row: str,
    metric: str,
    value: Callable[[float, float], float],
    show: Callable[[float], str],
    log_scale: bool = False,
) -> Callable[[Mapping[str, ResultSet]], Evidence | None]:
    """A reader of ``value(ours, base)`` of ``metric``, ``row`` against ``base_row``: the mean
    of the per-seed values with its 95% CI where both rows kept their per-seed values on at
    least two common seeds (paired by seed: each seed's runs shared the machine's load
    alike), else ``value`` of the two means as one measurement. ``show`` formats a value;
    ``log_scale`` takes the interval of a positive ratio on the log scale (delta method, as
    :func:`_mean_ci`), so that it cannot reach below 0."""

    def read(results: Mapping[str, ResultSet]) -> Evidence | None:
        ours, base = _stat(results, target, row, metric), _stat(results, target, base_row, metric)
        if ours is None or base is None or not base[0]:
            return None
        both = f"{metric} {ours[0]:.4g} vs {base[0]:.4g}"
        paired = _per_seed(results, target, row, base_row, metric)
        if paired is None:
            v = value(ours[0], base[0])
            over = _seed_counts(ours[2], base[2])
            text = f"{show(v)} against {base_row} (one measurement: {both}, {over})"
            return Evidence(v, None, 1, v, v, text)
        common, po, pb = paired
        values = [value(po[s], pb[s]) for s in common]
        mean, low, high = mean_ci95(values)
        scale = ""
        if log_scale and mean > 0:
            low, high = _log_interval(mean, statistics.stdev(values), len(values))
            scale = ", on the log scale, delta method"
        text = (
            f"{show(mean)} against {base_row}, 95% CI [{show(low)}, {show(high)}] (per-seed "
            f"values paired over seeds {common}{scale}; means: {both})"
        )
        return Evidence(mean, None, len(common), low, high, text)

    read.reads = ((target, row), (target, base_row))  # type: ignore[attr-defined]
    return read


def ratio_reader(
    target: str, row: str, base_row: str, metric: str
) -> Callable[[Mapping[str, ResultSet]], Evidence | None]:
    """A reader of ``metric`` of ``row`` over that of ``base_row`` (x), paired by seed where
    it can be (:func:`_relative_reader`)."""
    return _relative_reader(
        target, row, base_row, metric, lambda o, b: o / b, lambda v: f"{v:.2f}x", log_scale=True
    )


def saved_reader(
    target: str, row: str, base_row: str, metric: str = "wall_seconds"
) -> Callable[[Mapping[str, ResultSet]], Evidence | None]:
    """A reader of the cost ``metric`` (a time by default; FLOPs, bytes) ``row`` saves against
    ``base_row``, in %: ``100 (1 - c / c_base)``, paired by seed where it can be
    (:func:`_relative_reader`)."""
    return _relative_reader(
        target, row, base_row, metric, lambda o, b: 100.0 * (1.0 - o / b), lambda v: f"{v:.1f}%"
    )


def _difference(
    results: Mapping[str, ResultSet], target: str, better: str, worse: str, metric: str
) -> tuple[Evidence, Evidence, float, float, float, str, int] | None:
    """Both rows' evidence, the mean and 95% interval of ``better - worse``, how they were
    made and how many values they rest on (the seeds paired, or the smaller row's n): paired by
    seed (:func:`impl.report.stats.mean_ci95` of the per-seed
    differences) where both rows kept their per-seed values on at least two common seeds;
    otherwise the difference of the means, with the far ends of the two rows' 95% CIs, which
    lie above 0 only when the CIs do not overlap (conservative)."""
    rb, rw = _row(results, target, better, metric), _row(results, target, worse, metric)
    if rb is None or rw is None:
        return None
    eb, ew = (_mean_ci(_stat(results, target, r, metric), ".2f", "pp") for r in (better, worse))
    paired = _per_seed(results, target, better, worse, metric, nonzero_base=False)
    if paired is not None:
        common, pb, pw = paired
        mean, low, high = mean_ci95(pb[s] - pw[s] for s in common)
        return eb, ew, mean, low, high, f"paired over seeds {common}", len(common)
    return (
        eb,
        ew,
        eb.mean - ew.mean,
        eb.low - ew.high,
        eb.high - ew.low,
        ("non-overlap of the two 95% CIs"),
        min(eb.n, ew.n),
    )


def difference_reader(
    target: str, better: str, worse: str, metric: str = "delta_top1"
) -> Callable[[Mapping[str, ResultSet]], Evidence | None]:
    """A reader of ``metric`` of row ``better`` minus that of row ``worse`` in ``target``,
    with the 95% interval of :func:`_difference` (paired by seed where it can be)."""

    def read(results: Mapping[str, ResultSet]) -> Evidence | None:
        d = _difference(results, target, better, worse, metric)
        if d is None:
            return None
        eb, ew, mean, low, high, how, n = d
        if n < MIN_N:  # one seed: a difference, with no interval to give
            text = (
                f"{better} {eb.mean:+.2f} pp, {worse} {ew.mean:+.2f} pp (n=1): difference "
                f"{mean:+.2f} pp (one seed: no interval)"
            )
            return Evidence(mean, None, n, mean, mean, text)
        text = (
            f"{better} {eb.mean:+.2f} pp, {worse} {ew.mean:+.2f} pp (n={n}): difference "
            f"{mean:+.2f} pp, 95% interval [{low:+.2f}, {high:+.2f}] ({how})"
        )
        return Evidence(mean, None, n, low, high, text)

    read.reads = ((target, better), (target, worse))  # type: ignore[attr-defined]
    return read


def _prunetrain_dynamic_row(scale: str) -> str:
    """PruneTrain Fig. 11's dynamic mini-batch row at ``scale`` (its label names the ratio the
    short runs train with: "ratio 0.25, run at 0.85" at cpu and gpu, "ratio 0.25" at paper)."""
    from reproductions.prunetrain import ratio_label

    return f"PruneTrain ({ratio_label(scale, 0.25)}), dynamic mini-batch"


def _clicktrain_vs_prunetrain(results: Mapping[str, ResultSet]) -> Evidence | None:
    """ClickTrain's top-1 change minus PruneTrain's (:func:`difference_reader`), which
    counts only when ClickTrain also compresses more."""
    t = "cross.methods"
    ev = difference_reader(t, "clicktrain", "prunetrain")(results)
    cc, pc = (_stat(results, t, m, "compression_ratio") for m in ("clicktrain", "prunetrain"))
    if ev is None or cc is None or pc is None:
        return None
    text = f"{ev.text}; compression {cc[0]:.2f}x vs {pc[0]:.2f}x"
    if cc[0] <= pc[0]:  # more accuracy at no more compression is not what the paper claims
        return Evidence(ev.mean, None, ev.n, -math.inf, -math.inf, text + ": it compresses no more")
    return Evidence(ev.mean, ev.sd, ev.n, ev.low, ev.high, text)


_clicktrain_vs_prunetrain.reads = (  # type: ignore[attr-defined]
    ("cross.methods", "clicktrain"),
    ("cross.methods", "prunetrain"),
)


def _needs_setting(target: str, scale: str, result: ResultSet | None = None) -> str:
    """The model, data, epochs and seeds of the training runs of ``target`` at ``scale`` in
    words (the cross-method table and SDGP Table I, which the accuracy claims read); for
    another target, what its ``result`` says every training run shares (its ``setup``; ""
    for a measurement)."""
    from reproductions.common import SCALE_SEEDS, SCALE_TRAIN
    from reproductions.cross.methods import SEEDS, TRAIN
    from reproductions.settings import setup_text

    if target not in ("cross.methods", "sdgp.table1"):
        return result.setup if result is not None else ""
    if target == "cross.methods":
        cfg, seeds = {**SCALE_TRAIN[scale], **TRAIN[scale]}, SEEDS[scale]
    elif target == "sdgp.table1":
        from reproductions.sdgp.table1 import CPU_SEEDS, rows

        dense = rows(scale)[0]
        cfg = {**SCALE_TRAIN[scale], **dense.train}
        seeds = CPU_SEEDS if scale == "cpu" else SCALE_SEEDS[scale]
    keep = ("model", "data", "data_options", "epochs", "max_steps_per_epoch")
    text = setup_text({k: cfg[k] for k in keep if k in cfg})
    return f"{text}, {len(seeds)} seed{'s' if len(seeds) > 1 else ''}"


def timed_on(result: ResultSet | None) -> str:
    """Where a timed claim's number was timed (the GPU, or the CPU model and vector ISA of the
    result's environment), and what its interval covers: the repeats of one reproduction
    (sweeps, or seeds trained side by side), not reproductions on other days, whose values
    on one machine have moved beyond it (docs/reproductions.md)."""
    env = (result.environment if result is not None else None) or {}
    device = env.get("gpu_name")
    if device:
        device = f"the GPU ({device})"
    else:
        cpu = env.get("cpu_model") or "?"
        isa = env.get("cpu_capability")
        device = f"the CPU ({cpu}{', ' + isa if isa else ''})"
    return (
        f"timed on {device}; the interval is of repeats within one reproduction, not of "
        "reproductions run on other days, whose timings move beyond it"
    )


def _cross_setting(method: str) -> Callable[[str], str]:
    """The setting of ``method``'s runs in the cross-method table at a scale: the shared
    setup (:func:`_needs_setting`) and the method's options as run
    (:func:`reproductions.settings.options_text`), e.g. PruneTrain's penalty ratio 0.8 for the
    paper's 0.2 on the short runs."""

    def setting(scale: str) -> str:
        from reproductions.cross.methods import method_options
        from reproductions.settings import options_text

        opts = options_text(method, method_options(method, scale), scale)
        return f"{_needs_setting('cross.methods', scale)}; {opts}"

    return setting


DESCRIPTION = (
    "Each headline claim of the four papers (a sentence of the abstract or a table, with its "
    "number) beside the result of ours that speaks to it, and a verdict reached by the rule "
    "in its note: holds, does not hold, inconclusive (our 95% confidence interval straddles "
    "the bound, or a number from one seed has no interval), or not measured at this scale "
    "(with the reproduction to run)."
)
SMOKE_DESCRIPTION = (
    "Smoke scale is a pipeline check: its runs take a few SGD steps on one seed, so every "
    "model sits near chance and no claim is judged here (verdict: not judged). The table "
    "shows that each claim's numbers are read end to end; the cpu, gpu and paper scales "
    "judge them."
)
SMOKE_NOTE = (
    "Smoke scale: a pipeline check, not evidence. No claim is judged at this scale; run "
    "`pdtbench reproduce all --scale cpu` (or gpu, paper) for verdicts."
)
AT_LEAST = (
    "holds if ours is at least the paper's number (for a mean over seeds or repeated "
    "measurements: its whole 95% CI)"
)
AT_MOST = (
    "holds if ours is at most the paper's number (for a mean over seeds or repeated "
    "measurements: its whole 95% CI)"
)

CLAIMS: tuple[Claim, ...] = (
    Claim(
        "clicktrain",
        "more accuracy and more compression than PruneTrain",
        "top-1 change minus PruneTrain's (pp), at a higher compression",
        0.0,
        "pp",
        "abstract; Table 1, Sec. 6.2 (ResNet-50 ImageNet: -0.5 pp at 4.1x vs -1.9 pp at 2.1x)",
        "holds if ClickTrain compresses more and the 95% interval of its top-1 minus "
        "PruneTrain's (paired by seed) lies above 0; does not hold if it compresses no more "
        "or the interval lies at or below 0",
        "cross.methods",
        _clicktrain_vs_prunetrain,
        strict=True,
        published=(
            "ClickTrain -0.5 pp at 4.1x vs PruneTrain -1.9 pp at 2.1x (ResNet-50 ImageNet, Table 1)"
        ),
        setting=_cross_setting("clicktrain"),
    ),
    Claim(
        "clicktrain",
        "accuracy drop within 0.3 points on CIFAR",
        "top-1 change vs dense (pp)",
        -0.3,
        "pp",
        'Sec. 6.2 ("precisely control the accuracy drop within -0.3% for all the tested models '
        'on CIFAR10/100"); Table 1',
        "holds if the whole 95% CI of our change is at or above -0.3 point (the paper's "
        "margin); does not hold if it lies wholly below; inconclusive otherwise (an interval "
        "too wide to tell is not evidence of no loss)",
        "cross.methods",
        metric_reader("cross.methods", "clicktrain", "delta_top1", unit="pp"),
        published="-0.3 pp at the worst of Table 1's CIFAR rows (VGG-13 CIFAR-100 at 10.2x); "
        "-0.2 pp for ResNet-50 CIFAR-10 at 10.8x",
        setting=_cross_setting("clicktrain"),
    ),
    Claim(
        "clicktrain",
        "no extra training time over dense training",
        "time per iteration over the whole run (fwd + bwd + step) over dense (x)",
        1.0,
        "x",
        "abstract; Fig. 12, Sec. 6.3",
        AT_MOST,
        "cross.methods",
        ratio_reader("cross.methods", "clicktrain", "dense", "run_iter_ms"),
        higher_is_better=False,
        published=(
            "time saved, not added (Fig. 12: 0.15-0.59 h per CIFAR-10 run, 5.1-20.4 h per "
            "ImageNet run)"
        ),
        setting=_cross_setting("clicktrain"),
        timed=True,
    ),
    Claim(
        "clicktrain",
        "CSR conversion with predefined positions 4x faster than dense-to-CSR",
        "speedup over the generic conversion (x)",
        4.0,
        "x",
        "Fig. 9, Sec. 5.1 (cuSPARSE dense2csr, RTX 5000)",
        AT_LEAST,
        "clicktrain.fig9",
        metric_reader(
            "clicktrain.fig9",
            "pattern CSR with predefined positions",
            "speedup_vs_cusparse",
            unit="x",
        ),  # fmt: skip
        published="4x (Fig. 9)",
        timed=True,
    ),
    Claim(
        "clicktrain",
        "pattern SpMM 3.2x faster than generic sparse (cuSPARSE) SpMM",
        "speedup over generic CSR SpMM (x)",
        3.2,
        "x",
        "Fig. 10, Sec. 5.2",
        AT_LEAST,
        "clicktrain.fig10",
        metric_reader("clicktrain.fig10", "sparsity sweep", "speedup_vs_cusparse", unit="x"),
        published="3.2x (Fig. 10)",
        timed=True,
    ),
    Claim(
        "clicktrain",
        "pattern SpMM beats dense GEMM and convolution above 65% sparsity",
        "share of sweeps in which it beat both at every swept sparsity above 65%",
        1.0,
        "",
        "Fig. 10, Sec. 5.2 ('faster than cuBLAS's GEMM and cuDNN's convolution when the "
        "sparsity ratio is higher than 65%')",
        "holds if in every timing sweep the pattern SpMM beats both dense GEMM and the dense "
        "convolution (cuBLAS and cuDNN on a GPU) at every swept sparsity above 65%; does not "
        "hold if in every sweep it loses at one of them; inconclusive otherwise",
        "clicktrain.fig10",
        sweeps_won_reader(
            "clicktrain.fig10",
            "sparsity sweep",
            "beats_dense_above_65",
            "crossover_sparsity_vs_cublas_cudnn",
            65.0,
        ),  # fmt: skip
        published="from 65% on (Fig. 10, Sec. 5.2)",
        timed=True,
    ),
    Claim(
        "prunetrain",
        "30% fewer training FLOPs at penalty ratio 0.2 (the abstract's 40%: ratio 0.25)",
        "training FLOPs saved over the run (%, counted by impl.flops as the cross table counts "
        "every method; Table 1's page also gives the authors' formula)",
        30.0,
        "%",
        'Table 1, Sec. 5.1 (ResNet-50 ImageNet, ratio 0.2: 70% of dense; "40%, 30%, and 3% '
        'for ... 0.25, 0.2, and 0.1")',
        AT_LEAST,
        "cross.methods",
        metric_reader("cross.methods", "prunetrain", "train_flops_saved", unit="%"),
        published="30% at ratio 0.2; 40% at 0.25 (abstract) (ResNet-50 ImageNet, Sec. 5.1)",
        setting=_cross_setting("prunetrain"),
    ),
    Claim(
        "prunetrain",
        "44% fewer inference FLOPs at penalty ratio 0.2 (53% at ratio 0.25)",
        "inference FLOPs per sample saved against dense (%, nominal, the final model)",
        44.0,
        "%",
        'Table 1, Sec. 5.1 (ResNet-50 ImageNet, ratio 0.2: 56% of dense; "53%, 44%, and 12% '
        'reduced inference FLOPs" for 0.25, 0.2 and 0.1)',
        AT_LEAST,
        "cross.methods",
        saved_reader("cross.methods", "prunetrain", "dense", "inference_flops_per_sample"),
        published="44% at ratio 0.2; 53% at 0.25 (ResNet-50 ImageNet, Table 1, Sec. 5.1)",
        setting=_cross_setting("prunetrain"),
    ),
    Claim(
        "prunetrain",
        "24% less end-to-end training time at penalty ratio 0.2 (the abstract's 39%: ratio "
        "0.25 with dynamic mini-batch, V100)",
        "end-to-end time saved (%, wall time incl. evaluation, as the abstract's end-to-end; "
        "Table 1's page gives the training steps alone; 100 - time as % of dense)",
        24.0,
        "%",
        "Table 1, Sec. 5.1 (ResNet-50 ImageNet, ratio 0.2, four 1080 Ti: 76% of dense; 72% on "
        "four V100); Table 4 for the 39%",
        AT_LEAST,
        "cross.methods",
        saved_reader("cross.methods", "prunetrain", "dense"),
        published="24% at ratio 0.2 (28% on V100, Table 1); 39% at 0.25 with dynamic "
        "mini-batch on V100 (abstract, Table 4)",
        setting=_cross_setting("prunetrain"),
        timed=True,
    ),
    Claim(
        "prunetrain",
        "55% less inter-accelerator communication",
        "communication cost saved (%)",
        55.0,
        "%",
        "abstract; Fig. 11, Sec. 5.3",
        AT_LEAST,
        "prunetrain.fig11",
        metric_reader(
            "prunetrain.fig11",
            _prunetrain_dynamic_row,
            "comm_cost_saved",
            unit="%",
        ),
        published="55% (ResNet-50 ImageNet, penalty ratio 0.25, 16-256 GPUs; Fig. 11)",
    ),
    Claim(
        "prunetrain",
        "costs about 1.5 points of top-1 (ratio 0.2)",
        "top-1 change vs dense (pp)",
        -1.47,
        "pp",
        "Table 1, Sec. 5.1 (ResNet-50 ImageNet, ratio 0.2)",
        "holds if our loss is no larger than the paper's (the whole 95% CI at or above it)",
        "cross.methods",
        metric_reader("cross.methods", "prunetrain", "delta_top1", unit="pp"),
        published="-1.47 pp (ResNet-50 ImageNet, penalty ratio 0.2, Table 1)",
        setting=_cross_setting("prunetrain"),
    ),
    Claim(
        "sdgp",
        "2:4 rescaled gradient pruning without significant loss of accuracy",
        "top-1 change vs dense (pp)",
        -0.3,
        "pp",
        'abstract; Sec. V ("within 0.3% across all models"); Table I',
        "holds if the whole 95% CI of our change is at or above -0.3 point (the paper's "
        "margin); does not hold if it lies wholly below; inconclusive otherwise (an interval "
        "too wide to tell is not evidence of no loss)",
        "cross.methods",
        metric_reader("cross.methods", "sdgp", "delta_top1", unit="pp"),
        published="within 0.3 pp of dense on every model (Sec. V); -0.1 pp on ResNet-9 "
        "CIFAR-10 (95.2 vs 95.3, Table I), though Table I's own ImageNet rows are -0.2 "
        "(ResNet-18), -0.9 (RegNetX-400MF) and -0.5 pp (ResNet-50)",
        setting=_cross_setting("sdgp"),
    ),
    Claim(
        "sdgp",
        "random pruning loses more accuracy than rescaled magnitude pruning",
        "top-1 change of rescaled 2:4 minus random 2:4 (pp)",
        0.0,
        "pp",
        "Table I, Sec. IV-A (ResNet-9 CIFAR-10: rescaled 95.2 vs random 94.5; ImageNet likewise)",
        "holds if the 95% interval of rescaled's top-1 minus random's (paired by seed) lies "
        "above 0; does not hold if it lies at or below 0",
        "sdgp.table1",
        difference_reader("sdgp.table1", "SDGP rescaled 2:4", "SDGP random 2:4"),
        strict=True,
        published="+0.7 pp (ResNet-9 CIFAR-10: rescaled 95.2 vs random 94.5, Table I)",
    ),
    Claim(
        "sdgp",
        "15-25% less training time, estimated (2:4)",
        "estimated reduction of conv time at 2:4 (%), the paper's estimate of training time",
        15.0,
        "%",
        "abstract; Sec. IV-C (16.6% at 2:4 from Fig. 9)",
        "holds if our estimate, made the paper's way (the data-gradient share of the convs' "
        "forward and backward time, halved; not a whole iteration, whose other work it does "
        "not count), is at least 15%",
        "sdgp.fig9",
        metric_reader(
            "sdgp.fig9", "estimate at ratio 2 (2:4)", "estimated_runtime_reduction", unit="%"
        ),  # fmt: skip
        published="16.6% at 2:4 (ResNet-18 ImageNet; Sec. IV-C, from Fig. 9)",
        timed=True,
    ),
    Claim(
        "campfire",
        "under 1% accuracy loss at 70% sparsity",
        "top-1 change vs dense (pp)",
        -1.0,
        "pp",
        "abstract; Sec. 1, contribution 6 (60-70% sparsity, under 1% loss); Tables 2-3",
        "holds if the whole 95% CI of our change is above -1 point (under 1 point lost); "
        "does not hold if it lies at or below -1",
        "cross.methods",
        metric_reader("cross.methods", "campfire", "delta_top1", unit="pp"),
        strict=True,
        published="under 1 point of top-1 at 60-70% sparsity (Sec. 1, contribution 6; "
        "abstract: <1% loss); at 70% the best rows are -0.87 pp (Table 3, 90 epochs) and "
        "-1.13 pp (Table 2, 100 epochs)",
        setting=_cross_setting("campfire"),
    ),
)


def judge_why(claim: Claim, evidence: Evidence | None, scale: str | None = None) -> tuple[str, str]:
    """The verdict (one of :data:`VERDICTS`) of ``claim`` given ``evidence`` at ``scale``, and
    its reason where the numbers alone do not tell it ("" otherwise).

    At the smoke scale no claim is judged (:data:`NOT_JUDGED`: its runs prove the pipeline);
    a number from fewer than :data:`MIN_N` seeds (or sweeps) is "inconclusive" whatever its
    value (:data:`NO_INTERVAL`: one value has no confidence interval to compare); otherwise
    the whole 95% interval is compared with the bound (the paper's number): a claim of no
    more than some loss is one of non-inferiority, whose bound is the paper's margin, so an
    interval too wide to tell is "inconclusive", never "holds"."""
    if evidence is None:
        return "not measured at this scale", ""
    if scale == "smoke":
        return NOT_JUDGED, "a few SGD steps prove that the pipeline runs, not what a method does"
    if evidence.n < MIN_N:
        return "inconclusive", NO_INTERVAL
    bound = claim.paper_value
    low, high = (evidence.low, evidence.high)
    if not claim.higher_is_better:
        low, high, bound = -high, -low, -bound
    if low > bound or (low == bound and not claim.strict):
        return "holds", ""
    if high < bound or (high == bound and claim.strict):
        return "does not hold", ""
    why = f"the {evidence.interval} straddles {claim.paper_value:g}"
    # an end that reads as the bound at the two decimals shown: say where it lies
    close = [v for v in (evidence.low, evidence.high)
             if f"{v:.2f}" == f"{claim.paper_value:.2f}" and v != claim.paper_value]  # fmt: skip
    if close:
        why += " (" + ", ".join(f"{'low' if v == evidence.low else 'high'} end {v:.4g}"
                                for v in close) + ")"  # fmt: skip
    return "inconclusive", why


def judge(claim: Claim, evidence: Evidence | None, scale: str | None = None) -> str:
    """The verdict (one of :data:`VERDICTS`) of ``claim`` given ``evidence`` at ``scale``
    (:func:`judge_why` without its reason)."""
    return judge_why(claim, evidence, scale)[0]


def _setting(claim: Claim, scale: str, results: Mapping[str, ResultSet]) -> str:
    """The "Our setting" of ``claim``'s row: its own setting, or what its target's runs
    share, and for a timed claim where it was timed (:func:`timed_on`)."""
    result = results.get(claim.needs)
    if claim.setting is not None:
        text = claim.setting(scale)
    else:
        text = _needs_setting(claim.needs, scale, result)
    if claim.timed and result is not None:
        text = "; ".join(t for t in (text, timed_on(result)) if t)
    for target, row in getattr(claim.read, "reads", ()):
        # what the read row's label alone would hide (a dynamic mini-batch row whose batch
        # never grew: the claim's number is then a fixed-batch run's)
        label = row_label(row, scale)
        read = results.get(target)
        flags = {r["row_flag"] for r in (read.rows if read else []) if r.get("row") == label
                 and r.get("row_flag")}  # fmt: skip
        if flags:
            text = "; ".join(t for t in (text, f"{label}: {', '.join(sorted(flags))}") if t)
    return text


def evaluate(results: Mapping[str, ResultSet], scale: str) -> list[dict[str, Any]]:
    """One comparison row per claim (see :mod:`impl.report.results`), with its verdict."""
    rows = []
    for c in CLAIMS:
        ev = c.read(results)
        verdict, why = judge_why(c, ev, scale)
        how = c.rule
        if ev is None:
            how = f"needs `pdtbench reproduce {c.needs} --scale {scale}` ({c.rule})"
        else:
            how = f"{ev.text}. Rule: {c.rule}. From {c.needs}."
        rows.append(
            {
                "row": f"{c.paper}: {c.claim}",
                "metric": c.metric,
                "ours": None if ev is None else ev.mean,
                "ours_sd": None if ev is None else ev.sd,
                "n": 0 if ev is None else ev.n if ev.n_shown is None else ev.n_shown,
                "scale": None if ev is None else scale,
                "paper": c.paper_value,
                "unit": c.unit,
                "paper_source": c.source,
                "published": c.published,
                "ours_setting": _setting(c, scale, results),
                "verdict": verdict,
                "verdict_reason": why,
                "note": how,
            }
        )
    return rows


def build(
    results: Mapping[str, ResultSet], scale: str, environment: dict[str, Any] | None = None
) -> ResultSet:
    """The result ``claims.headline``: every claim judged against ``results`` (``{target:
    result}``, all of ``scale``), with the counts and how to read them; ``environment``
    defaults to this machine's (:func:`impl.env.collect`), without its TF32 and cuDNN
    benchmark settings: the claims compute on other results, under none of them."""
    from impl.env import collect
    from reproductions.common import BACKEND_FLAGS

    rows = evaluate(results, scale)
    counts = {v: sum(r["verdict"] == v for r in rows) for v in VERDICTS}
    result = ResultSet(
        target=TARGET_KEY,
        title=TITLE,
        scale=scale,
        rows=rows,
        description=SMOKE_DESCRIPTION if scale == "smoke" else DESCRIPTION,
        notes=[
            *([SMOKE_NOTE] if scale == "smoke" else []),
            "At this scale: " + ", ".join(f"{v}: {n}" for v, n in counts.items() if n) + ".",
            "A verdict is about the scale that produced our number (see the Scale column), "
            "not about the paper's models, data and hardware. 'Tested against' is the bound "
            "the rule compares with (for a claim of little or no loss, the paper's margin); "
            "'Published' is "
            "the paper's own number, with its citation; 'Our setting' names the setting of "
            "our runs where it differs from the paper's.",
            "'Ours' reads the mean of n values (± their standard deviation where shown); the "
            "verdict compares the 95% "
            "confidence interval of that mean (Student's t, n - 1 degrees of freedom), given "
            "in the note, with the bound (a mean speedup's on the log scale, its standard "
            "deviation there by the delta method, sd / mean). A number from one "
            "seed or one measurement has no interval, so no verdict either way: it reads "
            "inconclusive (at the smoke scale every claim reads not judged). For a timed "
            "claim the "
            "n values are repeats within one reproduction (sweeps, or seeds trained side by "
            "side): its interval leaves out how timings move between reproductions on other "
            "days, and its setting names the device that timed it.",
            *(
                [
                    "At this scale the speed claims time CPU implementations (torch "
                    "references and the compiled CPU kernels of impl/cpu) in runs of "
                    + ("a few SGD steps" if scale == "smoke" else "a few hundred SGD steps")
                    + "; the papers' speed claims are about GPU kernels and full-length runs, "
                    "which the gpu and paper scales measure."
                ]
                if scale in ("smoke", "cpu")
                else []
            ),  # fmt: skip
        ],
        environment={**collect(), **dict.fromkeys(BACKEND_FLAGS)}
        if environment is None
        else environment,
    )
    return result


def save(scale: str, runs_root: str | Path) -> Path | None:
    """Evaluate every claim against the results saved under ``runs_root`` at ``scale`` and
    save them as the target ``claims.headline``; return the result's path (None when no
    result of that scale exists)."""
    from impl.report.results import load_results, save_result
    from reproductions.common import result_dir

    results = {}
    for res in load_results([Path(runs_root) / "results"])[0]:  # unreadable: not judged
        if res.scale == scale and res.target != TARGET_KEY:
            results[res.target] = res
    if not results:
        return None
    return save_result(build(results, scale), result_dir(TARGET_KEY, scale, runs_root))


def rejudge(results: list[ResultSet]) -> list[ResultSet]:
    """``results`` with each saved ``claims.headline`` judged again against the other results
    of its scale in the list: a report shows the verdicts its own results give (a result
    removed, or made again, since the claims were saved would leave them stale). A scale
    with claims but no other result has every claim not measured: its saved verdicts read
    results this report does not hold. The saved claims' environment is kept."""
    out = [r for r in results if r.target != TARGET_KEY]
    for saved in (r for r in results if r.target == TARGET_KEY):
        mine = {r.target: r for r in out if r.scale == saved.scale}
        out.append(build(mine, saved.scale, saved.environment))
    return out


def summary_lines(path: str | Path, targets: Iterable[str] | None = None) -> list[str]:
    """The saved claims at ``path`` as terminal lines: one per claim (verdict, paper, claim,
    our number) under a line counting the verdicts of all. With ``targets``, only the
    claims that read one of them (:attr:`Claim.needs`) get a line, and the count line says
    how many were left out."""
    from impl.report.results import load_result

    res = load_result(path)
    counts = {v: sum(r.get("verdict") == v for r in res.rows) for v in VERDICTS}
    head = ", ".join(f"{v}: {n}" for v, n in counts.items() if n)
    rows = res.rows
    if targets is not None:
        wanted = set(targets)
        reads = {f"{c.paper}: {c.claim}" for c in CLAIMS if c.needs in wanted}
        rows = [r for r in res.rows if r.get("row") in reads]
    left = len(res.rows) - len(rows)
    shown = f"; {len(rows)} read these targets, the other {left} are in claims.html" if left else ""
    lines = [f"[claims] at {res.scale} scale: {head} (the index's first table{shown})"]
    if res.scale == "smoke" and rows:
        lines.append(f"  {SMOKE_NOTE}")
    width = max(len(v) for v in VERDICTS)
    for r in rows:
        ours = r["note"].split(". Rule:")[0] if r.get("ours") is not None else "-"
        why = f" [{r['verdict_reason']}]" if r.get("verdict_reason") else ""
        lines.append(f"  {r['verdict']:<{width}}  {r['row']}: {ours}{why}")
    return lines


__all__ = [
    "CLAIMS",
    "TARGET_KEY",
    "VERDICTS",
    "Claim",
    "Evidence",
    "difference_reader",
    "evaluate",
    "judge",
    "judge_why",
    "MIN_N",
    "NO_INTERVAL",
    "NOT_JUDGED",
    "metric_reader",
    "ratio_reader",
    "saved_reader",
    "save",
    "summary_lines",
]
