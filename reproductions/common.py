"""The reproduction framework: typed rows, run-or-reuse, metrics, comparison with the paper.

A reproduction module (``reproductions/<paper>/<item>.py``) declares a :class:`Target`: its
rows at each scale (:class:`Row`: one training config per seed, or one measurement), the
metrics it compares with the paper, and its figures. :func:`run_target` trains or reuses
every run through the public API (:func:`impl.config.resolve`, :func:`impl.train.train`),
one run directory per config named by the config hash, and saves a
:class:`impl.report.ResultSet`; :func:`reproduce` also renders the HTML report.

Reuse: a run directory whose ``summary.json`` says complete is read, not re-run; one with a
``config.json`` but no summary (a killed run) is resumed; a measurement whose JSON exists is
read back. Nothing is hidden: a row that cannot run at a scale, a method that is not
available, or a run that fails appears in the result's ``missing`` list with the reason.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import math
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from impl.data import DatasetMissingError, default_data_dir
from impl.methods import identity_change, is_builtin
from impl.report.results import (
    FigureSpec,
    ResultSet,
    load_results,
    save_result,
    warn_unreadable,
)
from impl.run_files import MetricsError
from impl.rundir import complete_summary
from reproductions.parallel import trained_here
from reproductions.published import lookup, paper_values
from reproductions.settings import settings_lines, setup_name

SCALES: tuple[str, ...] = ("smoke", "cpu", "gpu", "paper")
RUNS_ROOT = Path("runs/reproductions")

REPORTS_ROOT = Path("reports")

# Training settings shared by the reproductions at each scale (beyond impl.config's presets).
# smoke: proves the pipeline in seconds; cpu: digits and ResNet-20 on 2 cores, at 16x16 (the
# digits are 8x8: 32x32 carries no more of them and costs 4x the FLOPs) and batch 32 (4x the
# SGD steps of batch 128 at about the same cost on a CPU: 360 steps in 8 epochs), so that
# every table of the four papers trains within `make demo`'s 20 minutes; gpu: the papers'
# CIFAR models on digits (timing figures use the papers' shapes on synthetic data); paper:
# the papers' datasets and epochs (rows set them).
CPU_IMAGE_SIZE = 16
SCALE_TRAIN: dict[str, dict[str, Any]] = {
    "smoke": {"model": "resnet20", "data": "digits", "epochs": 4, "max_steps_per_epoch": 2,
              "batch_size": 32},
    "cpu": {"model": "resnet20", "data": "digits", "epochs": 8, "batch_size": 32,
            "data_options": {"image_size": CPU_IMAGE_SIZE}},
    "gpu": {"model": "resnet32", "data": "digits", "epochs": 30, "batch_size": 128},
    "paper": {},
}  # fmt: skip
SMOKE_RESULT_NOTE = (
    "Smoke scale is a pipeline check: runs of a few SGD steps on one seed show that every "
    "number is produced end to end, not how the methods compare (models sit near chance)."
)
# The same for a target that trains nothing (every row a measurement: kernel timings).
SMOKE_MEASURE_NOTE = (
    "Smoke scale is a pipeline check: small shapes and few timed calls show that every "
    "number is produced end to end, not what the paper's shapes cost."
)
SCALE_SEEDS: dict[str, tuple[int, ...]] = {
    "smoke": (0,),
    "cpu": (0,),
    "gpu": (0, 1, 2),
    "paper": (0, 1, 2),
}


# method -> function of the scale giving what every table with a run of that method must say
# at that scale (e.g. PruneTrain's settings on the short runs); registered by the method's
# reproductions package.
METHOD_SCALE_NOTES: dict[str, Callable[[str], str | None]] = {}


class MethodUnavailable(RuntimeError):
    """The method of a row cannot be built here (its module is missing or fails to import)."""


def unavailable_reason(name: str) -> str | None:
    """Why method ``name`` cannot be built here (the error of :func:`impl.methods.method_class`:
    not in this build, a plug-in that does not import, ...), or None when it can."""
    from impl.methods import method_class

    try:
        method_class(name)
    except ValueError as err:
        return str(err)
    return None


# ------------------------------------------------------------------------------------------
@dataclass
class Row:
    """One row of a reproduced table or one point of a figure.

    Either a training row (``method`` with ``options`` and TrainConfig fields in ``train``,
    one run per seed) or a measurement row (``measure`` = "module:function" called with
    ``params``; see :func:`measure_or_reuse`).

    Args:
        label: the row's name in the report.
        method: registered method name (training rows).
        options: the method's config fields (``TrainConfig.method_options``).
        train: TrainConfig fields over the scale's defaults (model, data, epochs, ...).
        seeds: seeds to average (None: the scale's default).
        paper: selector of the paper's rows in paper_values (model, dataset, method, setting).
        baseline: label of the row that deltas and savings are taken against.
        needs: when set, the row cannot run at this scale; the reason shown in the report.
        measure: "module:function" of a measurement row.
        params: keyword arguments of the measurement.
        group: free-form key for figures (e.g. the sparsity of a sweep).
        measure_keys: metric -> key of the measurement's values (measurement rows) or name of
            the metric that computes it (training rows), where they differ: lets two rows of
            one run stand beside two paper numbers of one metric (e.g. top-1 at epochs 90
            and 100).
        metrics: the metrics this row shows (None: all of the target's).
    """

    label: str
    method: str = "dense"
    options: dict[str, Any] = field(default_factory=dict)
    train: dict[str, Any] = field(default_factory=dict)
    seeds: tuple[int, ...] | None = None
    paper: dict[str, str] = field(default_factory=dict)
    baseline: str | None = None
    needs: str | None = None
    measure: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    group: dict[str, Any] = field(default_factory=dict)
    measure_keys: dict[str, str] = field(default_factory=dict)
    metrics: tuple[str, ...] | None = None

    def configs(self, scale: str, runs_root: str | Path = RUNS_ROOT) -> list[Any]:
        """The resolved TrainConfig of each seed, each with its run directory (by hash) and,
        for CIFAR and ImageNet, the dataset's directory from
        :func:`impl.data.default_data_dir`."""
        from impl.config import resolve

        if self.measure is not None:
            return []
        values = dict(SCALE_TRAIN[scale])
        values.update(self.train)
        seeds = self.seeds if self.seeds is not None else SCALE_SEEDS[scale]
        out = []
        for seed in seeds:
            cfg = resolve(
                scale,
                method=self.method,
                method_options=dict(self.options),
                seed=seed,
                **values,
            )
            if cfg.data_dir is None:  # where CIFAR / ImageNet are (not part of the run's hash)
                cfg.data_dir = default_data_dir(cfg.data)
            cfg.out = cfg.default_out(runs_root)
            out.append(cfg)
        return out


@dataclass
class RunRecord:
    """A finished run of a row: its directory, summary, per-epoch metrics and its config as
    saved (``config.json``: :meth:`impl.config.TrainConfig.to_dict`; empty where unknown)."""

    path: str
    seed: int
    summary: dict[str, Any]
    metrics: list[dict[str, Any]]
    reused: bool
    config: dict[str, Any] = field(default_factory=dict)


@dataclass
class RowResult:
    """What a row produced: its runs (training rows) or its measurement (measurement rows)."""

    row: Row
    runs: list[RunRecord] = field(default_factory=list)
    measured: dict[str, Any] | None = None
    error: str | None = None
    table: dict[str, tuple[str, Callable]] | None = None  # the target's metric table
    flags: dict[str, Any] | None = None  # a measurement's backend flags, as saved with it

    @property
    def ok(self) -> bool:
        """True when the row produced a result."""
        return self.error is None and (bool(self.runs) or self.measured is not None)


# ------------------------------------------------------------------------------------------
def reuse_refusal(summary: dict[str, Any], method: str) -> str | None:
    """Why a complete run cannot stand for ``method`` now: the method's code changed
    (:func:`impl.methods.identity_change`) or its summary predates a measurement the reports
    read (:func:`impl.rundir.outdated_summary`); ``None`` when it can be reused."""
    from impl.rundir import outdated_summary

    return identity_change(summary, method) or outdated_summary(summary)


def reusable_summary(run_dir: Path, method: str) -> dict[str, Any] | None:
    """The complete run's summary in ``run_dir`` where it can be reused as it is
    (:func:`reuse_refusal`), else None."""
    summary = complete_summary(run_dir)
    if summary is None or reuse_refusal(summary, method) is not None:
        return None
    return summary


def run_or_reuse(cfg: Any, *, progress: bool = False) -> tuple[dict[str, Any], bool]:
    """Train ``cfg`` into ``cfg.out``, or reuse the complete run already there.

    Returns ``(summary, reused)``. A directory with a config but no complete summary (a
    killed run) is resumed through :func:`impl.train.resume`. A complete run that cannot be
    reused (:func:`reuse_refusal`: a registered method whose class or code has changed since,
    or a summary older than what the reports read) is moved aside to
    ``<run dir>.stale-<time>`` and trained again, as is a killed run whose
    last checkpoint was written by other code of the method
    (:class:`impl.rundir.StaleRunError`), a killed run whose checkpoint or metrics file is
    damaged (:class:`impl.rundir.CheckpointError`, :class:`impl.rundir.MetricsError`), or a
    run that diverged under other code of a registered method. A run that diverged under
    this code raises :class:`impl.train.TrainingDiverged` again without training. A run
    another process is training (two reproductions sharing runs) is waited for, then reused
    or resumed. Raises
    :class:`MethodUnavailable` when the method's module is missing.
    """

    from impl.rundir import RunBusyError, wait_until_free

    while True:
        try:
            return _run_or_reuse(cfg, progress)
        except RunBusyError as err:  # another reproduction trains this run: wait, then reuse
            print(
                f"{cfg.out} is being trained by another process (pid {err.holder}): waiting for it",
                file=sys.stderr,
            )
            wait_until_free(Path(cfg.out))


def _run_or_reuse(cfg: Any, progress: bool) -> tuple[dict[str, Any], bool]:

    from impl.rundir import CheckpointError, MetricsError, StaleRunError, diverged_summary
    from impl.train import resume, train

    run_dir = Path(cfg.out)

    def move_aside(why: str) -> None:
        stamp = f"{run_dir.name}.stale-{time.strftime('%Y%m%d-%H%M%S')}"
        aside = run_dir.with_name(stamp)
        n = 1
        while aside.exists():  # moved aside already within this second
            n += 1
            aside = run_dir.with_name(f"{stamp}-{n}")
        run_dir.rename(aside)
        print(f"not reusing {run_dir}: {why}; moved to {aside}, training again", file=sys.stderr)

    summary = complete_summary(run_dir)
    if summary is not None:
        why = reuse_refusal(summary, cfg.method)
        if why is None:
            return summary, True
        move_aside(why)
    diverged = diverged_summary(run_dir)
    changed = identity_change(diverged, cfg.method) if diverged is not None else None
    if changed is not None:
        move_aside(f"it diverged under other code ({changed})")
    reason = unavailable_reason(cfg.method)
    if reason is not None:
        raise MethodUnavailable(reason)
    if (run_dir / "config.json").exists():
        try:
            return resume(run_dir, progress=progress), False
        except StaleRunError as err:  # a killed run of code that has changed since
            move_aside(err.why)
        except (CheckpointError, MetricsError) as err:  # a damaged file: kept aside, not lost
            move_aside(f"it cannot be continued ({err})")
    from impl.methods import create_method

    create_method(cfg.method, cfg.method_options).validate(cfg)  # fail before any file exists
    return train(cfg, progress=progress), False


def _read_config(run_dir: Path, cfg: Any) -> dict[str, Any]:
    """The run's saved ``config.json``, else the config it was resolved from."""
    try:
        return dict(json.loads((run_dir / "config.json").read_text()))
    except (OSError, json.JSONDecodeError, TypeError):
        return cfg.to_dict()


def _read_metrics(run_dir: Path, summary: dict[str, Any]) -> list[dict[str, Any]]:
    """A run's metrics rows, checked against its summary
    (:func:`impl.run_files.check_complete_metrics`: one row per epoch)."""
    from impl.run_files import check_complete_metrics, holds_type, read_metrics

    rows = read_metrics(run_dir)
    epochs = summary.get("epochs")
    if summary.get("status") == "complete" and holds_type(epochs, (int,)):
        check_complete_metrics(run_dir, rows, epochs)
    return rows


def _measure_function(fn: str) -> Callable[..., dict[str, Any]]:
    module_name, _, func_name = fn.partition(":")
    return getattr(importlib.import_module(module_name), func_name)


def _measure_path(fn: str, params: dict[str, Any], scale: str, root: Path) -> Path:
    key: dict[str, Any] = {"fn": fn, "params": params, "scale": scale}
    # A function whose saved values change form sets ``measure_version``; older files are
    # then measured again instead of being read in the old form.
    version = getattr(_measure_function(fn), "measure_version", None)
    if version is not None:
        key["version"] = version
    blob = json.dumps(key, sort_keys=True, default=str)
    digest = hashlib.sha256(blob.encode()).hexdigest()[:12]
    name = fn.replace(":", "-").replace(".", "_")
    return root / "measurements" / f"{name}-{scale}-{digest}.json"


#: The measurement files this process wrote: a row that reads one back (rows sharing a
#: measurement, as Campfire Table 6's epsilons) says "measured above", not "reused".
_MEASURED_HERE: set[Path] = set()


def measure_or_reuse(
    fn: str, params: dict[str, Any], scale: str, context: dict[str, Any], root: str | Path
) -> tuple[dict[str, Any], bool]:
    """Call measurement ``fn`` ("module:function") with ``params``, or read its saved JSON.

    The function is called as ``fn(scale=scale, context=context, **params)`` and returns a
    dict of plain values (numbers, lists, dicts). The saved file holds the values and the
    environment; it is keyed by (fn, params, scale, and the function's ``measure_version``
    where it sets one). ``context["runs"]`` maps the labels of
    rows run before to their run directories (for measurements on trained models). A saved
    file that does not read (torn, edited) is measured again, with a line saying so.
    Returns (values, reused).
    """
    path = _measure_path(fn, params, scale, Path(root))
    record, reused = _measurement_record(fn, params, scale, context, path)
    return record["values"], reused


def _measurement_record(
    fn: str, params: dict[str, Any], scale: str, context: dict[str, Any], path: Path
) -> tuple[dict[str, Any], bool]:
    """The record of :func:`measure_or_reuse` (values, environment, flags) saved at ``path``
    (:func:`_measure_path`), measured where none reads, and whether it was reused."""
    from impl.env import collect

    if path.exists():
        try:
            record = json.loads(path.read_text())
            if not isinstance(record, dict) or "values" not in record:
                raise ValueError("no values")
            return record, True
        except ValueError as err:  # a cache (torn, edited, not UTF-8): measured again, said so
            print(f"not reusing {path}: unreadable ({err!r}); measuring again", file=sys.stderr)
    import torch

    from bench.measure import pinned_flags

    # In float32: TF32 off for cuBLAS and cuDNN (cuDNN's benchmark mode as it was). The
    # papers timed float32 on GPUs without TF32 (V100, RTX 5000), and the project's kernels
    # compute in float32: a dense cuDNN baseline at torch's default (cuDNN TF32 on) would run
    # tensor-core TF32 against them. Nothing changes on a CPU; the saved file records the flags.
    with pinned_flags(cudnn_benchmark=torch.backends.cudnn.benchmark) as flags:
        values = _measure_function(fn)(scale=scale, context=context, **params)
    record = {"fn": fn, "params": params, "scale": scale, "values": values,
              "environment": collect(), "flags": flags}  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True, default=str))
    tmp.replace(path)
    _MEASURED_HERE.add(path.resolve())
    return record, False


# ------------------------------------------------------------------------------------------
def samples_seen(metrics: Sequence[dict[str, Any]]) -> float:
    """Training samples processed over the run, from the per-epoch metrics."""
    total = 0.0
    for m in metrics:
        if m.get("samples_per_second") is not None and m.get("train_seconds") is not None:
            total += float(m["samples_per_second"]) * float(m["train_seconds"])
        else:
            total += float(m.get("iterations", 0)) * float(m.get("batch_size", 0))
    return total


def run_iteration_ms(metrics: Sequence[dict[str, Any]]) -> float:
    """Mean time per iteration over the whole run, in ms: each epoch's median iteration
    (fwd + bwd + step, ``iter_ms``) weighted by its iterations. Unlike the last epoch's
    median it counts every stage: ClickTrain's dense and pattern-search epochs, Campfire's
    pruning era with its per-step mask updates, PruneTrain's epochs before each
    reconfiguration. NaN when an epoch has no ``iter_ms`` (trained before it was recorded)."""
    total = weight = 0.0
    for m in metrics:
        t, n = m.get("iter_ms"), m.get("iterations")
        if t is None or n is None or not math.isfinite(float(t)):
            return math.nan
        total += float(t) * float(n)
        weight += float(n)
    return total / weight if weight else math.nan


def run_training_flops(
    summary: dict[str, Any], metrics: Sequence[dict[str, Any]], kind: str = "nominal"
) -> float:
    """Training FLOPs of the whole run (all samples, all epochs), ``kind`` nominal or executed.

    Uses the most faithful account a run holds: PruneTrain's ``train_flops_run`` (per-sample
    cost of the model of each epoch times its samples), ClickTrain's
    ``train_flops_run_per_sample`` (dense epochs then sparse epochs), else the per-epoch
    ``train_flops_nominal``/``_executed`` of metrics.jsonl times that epoch's samples (the
    Trainer writes them for every method: :func:`impl.train.epoch_step_cost`, the first step
    at the cost as the epoch began, the others along the costs read at three or four
    steps); for runs without them, the final per-sample ``train_flops_<kind>`` of the summary
    times all samples.
    """
    if kind not in ("nominal", "executed"):
        raise ValueError(f"kind must be 'nominal' or 'executed', got {kind!r}")
    samples = samples_seen(metrics)
    epochs = max(len(metrics), 1)
    if summary.get("method") == "prunetrain" and summary.get("train_flops_run"):
        return float(summary["train_flops_run"])  # the model physically shrinks: executed too
    click = summary.get("clicktrain")
    if isinstance(click, dict):
        per = ((click.get("flops") or {}).get("train_flops_run_per_sample") or {}).get(kind)
        if per is not None:
            return float(per) * samples / epochs
    key = f"train_flops_{kind}"
    if metrics and all(m.get(key) is not None for m in metrics):
        total = 0.0
        for m in metrics:
            total += float(m[key]) * samples_seen([m])  # its samples, as samples_seen counts
        return total
    value = summary.get(key)
    return float(value) * samples if value is not None else math.nan


def inference_executed(summary: dict[str, Any]) -> float | None:
    """Executed inference FLOPs per sample: the summary's ``inference_flops_executed`` (the
    Trainer records it), else, for runs saved before it did, ClickTrain's own account (its
    ``inference_flops_saved_executed``), else None."""
    if summary.get("inference_flops_executed") is not None:
        return float(summary["inference_flops_executed"])
    click = summary.get("clicktrain")
    if isinstance(click, dict):
        flops = click.get("flops") or {}
        dense = ((flops.get("per_sample_final") or {}).get("dense") or {}).get("forward")
        saved = flops.get("inference_flops_saved_executed")
        if dense is not None and saved is not None:
            return float(dense) * (1.0 - float(saved))
    return None


def _stat(values: Sequence[float]) -> tuple[float, float, int]:
    vals = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    if not vals:
        return math.nan, math.nan, 0
    sd = statistics.stdev(vals) if len(vals) > 1 else math.nan
    return statistics.fmean(vals), sd, len(vals)


def _by_seed(result: RowResult | None) -> dict[int, RunRecord]:
    return {} if result is None else {r.seed: r for r in result.runs}


def _iter_ms(s: dict[str, Any]) -> float:
    """The whole iteration (forward + backward + the optimizer step and the method's per-step
    work), median over the last epoch; NaN for a run trained before it was recorded (its
    forward + backward alone would flatter a method with costly per-step work)."""
    t = s.get("iter_ms")
    return math.nan if t is None else float(t)


# metric name -> (unit, function of (run, baseline run or None) -> float)
def _ratio_saved(ours: float, base: float) -> float:
    return 100.0 * (1.0 - ours / base) if base and not math.isnan(base) else math.nan


def _pct_of(ours: float, base: float) -> float:
    return 100.0 * ours / base if base and not math.isnan(base) else math.nan


def training_step_seconds(run: Any) -> float:
    """Seconds a run spent in its training steps: the sum of its epochs' ``train_seconds``
    (forward, backward, optimizer step and data loading; not the evaluation, not the epoch's
    end, where PruneTrain reconfigures and probes its memory). PruneTrain's training times
    leave the reconfiguration out (Table 1: "Training time does not include network
    architecture reconfiguration time", Sec. 5.1). KeyError for a run without them."""
    if not run.metrics:
        raise KeyError("train_seconds")
    return float(sum(float(m["train_seconds"]) for m in run.metrics))


def train_time_pct_of_dense(run: Any, base: Any) -> float:
    """:func:`training_step_seconds` of ``run`` in % of its dense baseline's."""
    if base is None:
        raise KeyError("baseline")
    return 100.0 * training_step_seconds(run) / training_step_seconds(base)


def _need(base: RunRecord | None) -> RunRecord:
    if base is None:
        raise KeyError("baseline")
    return base


METRICS: dict[str, tuple[str, Callable[[RunRecord, RunRecord | None], float]]] = {
    "top1": ("%", lambda r, b: r.summary.get("top1")),
    "best_top1": ("%", lambda r, b: r.summary.get("best_top1")),
    "base_top1": ("%", lambda r, b: _need(b).summary.get("top1")),
    "delta_top1": ("pp", lambda r, b: r.summary["top1"] - _need(b).summary["top1"]),
    "compression_ratio": ("x", lambda r, b: r.summary.get("compression_ratio")),
    "conv_sparsity": ("%", lambda r, b: 100.0 * (1 - 1 / r.summary["compression_ratio"])),
    "inference_flops": ("% of dense", lambda r, b: _pct_of(
        r.summary["inference_flops"], _need(b).summary["inference_flops"])),
    "inference_flops_saved": ("%", lambda r, b: _ratio_saved(
        r.summary["inference_flops"], _need(b).summary["inference_flops"])),
    "train_flops": ("% of dense", lambda r, b: _pct_of(
        run_training_flops(r.summary, r.metrics), run_training_flops(_need(b).summary, b.metrics))),
    "train_flops_saved": ("%", lambda r, b: _ratio_saved(
        run_training_flops(r.summary, r.metrics), run_training_flops(_need(b).summary, b.metrics))),
    "train_flops_executed_saved": ("%", lambda r, b: _ratio_saved(
        run_training_flops(r.summary, r.metrics, "executed"),
        run_training_flops(_need(b).summary, b.metrics, "executed"))),
    "train_time": ("% of dense", train_time_pct_of_dense),
    "fwd_ms": ("ms", lambda r, b: r.summary.get("fwd_ms")),
    "bwd_ms": ("ms", lambda r, b: r.summary.get("bwd_ms")),
    "step_ms": ("ms", lambda r, b: r.summary.get("step_ms")),
    "iter_ms": ("ms", lambda r, b: _iter_ms(r.summary)),
    "run_iter_ms": ("ms", lambda r, b: run_iteration_ms(r.metrics)),
    "forward_speedup": ("x", lambda r, b: _need(b).summary["fwd_ms"] / r.summary["fwd_ms"]),
    "backward_speedup": ("x", lambda r, b: _need(b).summary["bwd_ms"] / r.summary["bwd_ms"]),
    "wall_seconds": ("s", lambda r, b: r.summary.get("wall_seconds")),
    "comm_bytes_per_iter": ("B", lambda r, b: r.summary.get("comm_bytes_per_iter")),
    "peak_gpu_memory_mib": ("MiB", lambda r, b: r.summary.get("peak_gpu_memory_mib")),
    "true_sparsity": ("%", lambda r, b: 100.0 * r.summary["true_sparsity"]),
    "train_flops_per_sample": ("FLOPs", lambda r, b: r.summary.get("train_flops_nominal")),
    "train_flops_executed_per_sample": ("FLOPs", lambda r, b: r.summary["train_flops_executed"]),
    "inference_flops_per_sample": ("FLOPs", lambda r, b: r.summary.get("inference_flops")),
    "inference_flops_executed_per_sample": ("FLOPs", lambda r, b: inference_executed(r.summary)),
}  # fmt: skip
# By impl.flops, under a name of its own where a target's "train_flops" is another count
# (PruneTrain Table 1 and Fig. 8: the authors' formula)
METRICS["train_flops_impl"] = METRICS["train_flops"]


def row_metric(
    result: RowResult,
    metric: str,
    baseline: RowResult | None,
    table: dict[str, tuple[str, Callable]] | None = None,
) -> list[float]:
    """Values of ``metric`` for each seed of a training row, seed-matched to the baseline: a
    seed the baseline has no run of gets no value of a metric that needs the baseline (never
    another seed's baseline, which would pair unlike runs). Measurement rows return their
    value (a number, or a list of numbers, one per repeat). ``table`` defaults to
    :data:`METRICS`."""
    table = METRICS if table is None else table
    if result.measured is not None:
        v = result.measured.get(result.row.measure_keys.get(metric, metric))
        if v is None:
            return []
        return [float(x) for x in v] if isinstance(v, (list, tuple)) else [float(v)]
    fn = _metric_fn(result, metric, table)
    base_runs = _by_seed(baseline)
    out = []
    for run in result.runs:
        v = _run_metric(fn, run, base_runs.get(run.seed))
        if v is not None:
            out.append(v)
    return out


def _metric_fn(
    result: RowResult, metric: str, table: dict[str, tuple[str, Callable]]
) -> Callable[[RunRecord, RunRecord | None], Any]:
    """The function of ``metric`` (as ``result``'s row names it in its ``measure_keys``) in
    ``table``; ``ValueError`` naming the valid metrics where it has none."""
    key = result.row.measure_keys.get(metric, metric)
    if key not in table:
        raise ValueError(f"unknown metric {key!r}; valid: {', '.join(sorted(table))}")
    return table[key][1]


def _baseline(results: list[RowResult], result: RowResult) -> RowResult | None:
    """The result of ``result``'s baseline row among ``results``; None where it has none."""
    return next((r for r in results if r.row.label == result.row.baseline), None)


def _run_metric(fn: Callable, run: RunRecord, base: RunRecord | None) -> float | None:
    """``fn(run, base)`` as a float, or None where the metric does not apply to the run (no
    baseline run of its seed, a key the method does not write)."""
    try:
        v = fn(run, base)
    except (AttributeError, KeyError, TypeError, ZeroDivisionError, IndexError):
        return None
    return None if v is None else float(v)


# ------------------------------------------------------------------------------------------
@dataclass
class Target:
    """One table or figure of a paper (or the cross-method table).

    Args:
        key: "<paper>.<item>" (paper "cross" for tables no paper has).
        title: the section heading.
        description: what the paper shows and what this reproduction runs at each scale.
        rows: the rows at a scale.
        metrics: metrics compared with the paper (keys of :data:`METRICS` or of a
            measurement's values).
        figures: builds the figures from the row results and the paper's values.
        notes: remarks shown under the table at a scale.
        metric_units: units of measurement metrics (training metrics carry theirs).
        extra_metrics: this target's own metrics (name -> (unit, function of run, baseline)).
        wide: report one line per row and one column per metric.
        row_note: a note for the comparison rows of one row result, read from what it
            produced (e.g. the routines a measurement timed and the device it ran on), so
            that a row says what was measured where, not what the paper's hardware would run.
        row_flag: a few words a row result's label needs where the label alone would mislead
            (PruneTrain's dynamic mini-batch row whose batch never grew: "batch never grew"),
            shown beside the label at a glance and in a claim that reads the row.
        heading: the result's (title, description) from its row results and scale, where
            they depend on what ran (e.g. how many methods a table shows); None: ``title``
            and ``description``.
    """

    key: str
    title: str
    description: str
    rows: Callable[[str], list[Row]]
    metrics: tuple[str, ...] = ("top1",)
    figures: Callable[[list[RowResult], str, Any], list[FigureSpec]] | None = None
    notes: Callable[[str], list[str]] | None = None
    metric_units: dict[str, str] = field(default_factory=dict)
    extra_metrics: dict[str, tuple[str, Callable[[RunRecord, RunRecord | None], float]]] = field(
        default_factory=dict
    )
    wide: bool = False
    row_note: Callable[[RowResult], str] | None = None
    row_flag: Callable[[RowResult], str] | None = None
    heading: Callable[[list[RowResult], str], tuple[str, str]] | None = None

    @property
    def metric_table(self) -> dict[str, tuple[str, Callable]]:
        """:data:`METRICS` plus this target's own metrics."""
        return {**METRICS, **self.extra_metrics}

    @property
    def paper(self) -> str:
        """The paper key ("cross" for the cross-method tables)."""
        return self.key.partition(".")[0]

    @property
    def item(self) -> str:
        """The table or figure ("table1", "fig9")."""
        return self.key.partition(".")[2]

    def paper_frame(self) -> Any:
        """The paper's published values of this item (empty for "cross")."""
        import pandas as pd

        if self.paper == "cross":
            return pd.DataFrame(columns=["metric", "value", "unit", "source", "note"])
        try:
            return paper_values(self.paper, self.item)
        except ValueError:
            return pd.DataFrame(columns=["metric", "value", "unit", "source", "note"])


def _unit(target: Target, metric: str) -> str:
    if metric in target.metric_units:
        return target.metric_units[metric]
    table = target.metric_table
    return table[metric][0] if metric in table else ""


def execute_rows(
    target: Target, scale: str, runs_root: str | Path = RUNS_ROOT, *, log: Callable = print
) -> list[RowResult]:
    """Run (or reuse) every row of ``target`` at ``scale``; never raises for one row."""
    results: list[RowResult] = []
    context: dict[str, Any] = {"runs": {}, "results": {}}
    for row in target.rows(scale):
        res = RowResult(row=row, table=target.metric_table)
        results.append(res)
        if row.needs:
            res.error = row.needs
            continue
        try:
            if row.measure is not None:
                path = _measure_path(row.measure, row.params, scale, Path(runs_root))
                record, reused = _measurement_record(row.measure, row.params, scale, context, path)
                res.measured = record["values"]
                flags = record.get("flags")
                res.flags = flags if isinstance(flags, dict) else None
                how = "measured" if not reused else "reused"
                if reused and path.resolve() in _MEASURED_HERE:  # by a row above in this command
                    how = "measured above"
                log(f"  {target.key} | {row.label}: {how}")
            else:
                for cfg in row.configs(scale, runs_root):
                    t0 = time.perf_counter()
                    summary, reused = run_or_reuse(cfg)
                    if not reused:
                        how = f"trained in {time.perf_counter() - t0:.0f} s"
                    elif trained_here(cfg.out):  # by train_all, earlier in this command
                        how, reused = "trained above", False
                    else:
                        how = "reused"
                    res.runs.append(
                        RunRecord(cfg.out, cfg.seed, summary, _read_metrics(Path(cfg.out), summary),
                                  reused,
                                  _read_config(Path(cfg.out), cfg))
                    )  # fmt: skip
                    log(
                        f"  {target.key} | {row.label} seed {cfg.seed}: top-1 "
                        f"{summary.get('top1', float('nan')):.2f}% ({how}) -> {cfg.out}"
                    )
                context["runs"][row.label] = [r.path for r in res.runs]
        except MethodUnavailable as err:
            if is_builtin(row.method):  # a method this build leaves out
                res.error = f"not available: {err}"
            else:  # a plug-in registered to be run that cannot be built: a failure
                res.error = f"failed: {err}"
                log(f"  {target.key} | {row.label}: FAILED: {err}")
        except DatasetMissingError as err:  # expected where a user has not the dataset
            # the whole message (what is expected, where to get it) is in train_all's line;
            # the report's row says what is missing and what to do
            short = f"{err.dataset}: {err.reason}"
            res.error = f"needs its dataset: {short}; {err.remedy}"
            log(f"  {target.key} | {row.label}: not run, {short}")
        except MetricsError as err:  # a run's file damaged: its message names it and the remedy
            res.error = f"failed: {err}"
            log(f"  {target.key} | {row.label}: FAILED: {err}")
        except Exception as err:  # noqa: BLE001 - one failed row must not hide the others
            res.error = f"failed: {type(err).__name__}: {err}"
            log(f"  {target.key} | {row.label}: FAILED\n{traceback.format_exc(limit=4)}")
        context["results"][row.label] = res
    return results


def setups(
    row: Row, scale: str, result: RowResult | None = None, matched: Any = None
) -> dict[str, str]:
    """``{"ours_setup", "paper_setup"}`` of a training row that stands beside a paper's row:
    the model and data of our runs (their saved config, else the row's) and of the paper's
    row, in words (:func:`setup_name`): the selector's, else those of the one published row
    ``matched`` (a selector of a table of one model names none); empty for a measurement row,
    a paper row of no model or dataset, or a row with no run (no number of ours to label)."""

    def word(value: Any) -> str | None:  # an empty cell of the published values reads NaN
        return value if isinstance(value, str) and value else None

    paper_model, paper_data = row.paper.get("model"), row.paper.get("dataset")
    if matched is not None and len(matched) == 1:
        paper_model = paper_model or word(matched["model"].iloc[0])
        paper_data = paper_data or word(matched["dataset"].iloc[0])
    if row.measure is not None or not (paper_model or paper_data):
        return {}
    if result is None or not result.runs:  # no number of ours to label
        return {}
    cfg = next((run.config for run in result.runs if run.config), None)
    if cfg is None:
        cfg = {**SCALE_TRAIN.get(scale, {}), **row.train}
        cfg.setdefault("model", "resnet20")
        cfg.setdefault("data", "cifar10" if scale == "paper" else "digits")
    ours = setup_name(cfg.get("model"), cfg.get("data"), cfg.get("data_options"))
    theirs = setup_name(paper_model, paper_data)
    return {"ours_setup": ours, "paper_setup": theirs}


def paper_delta(
    paper: Any, metric: str, selector: dict[str, str], base_selector: dict[str, str]
) -> tuple[float, str] | None:
    """The paper's change of top-1 against its baseline row where the paper gives both top-1
    values but not the change (e.g. SDGP Table I: 95.2 - 95.3 = -0.1 pp), with its source
    ("Table I, Sec. IV-A (derived: 95.2 - 95.3)"); None for any other metric or when either
    value is missing."""
    if metric != "delta_top1" or not selector or not base_selector:
        return None
    ours, base = (lookup(paper, metric="top1", **sel) for sel in (selector, base_selector))
    if len(ours) != 1 or len(base) != 1:
        return None
    a, b = float(ours["value"].iloc[0]), float(base["value"].iloc[0])
    source = "; ".join(sorted(set(ours["source"]) | set(base["source"])))
    return round(a - b, 6), f"{source} (derived: {a:g} - {b:g})"


def paper_number(
    paper: Any, matched: Any, metric: str, row: Row, base: RowResult | None
) -> tuple[float | None, str]:
    """The paper's number of ``metric`` for ``row`` and its source: the one published row
    ``matched`` (its selector's lookup), else, where nothing matched, the change against the
    baseline ``base`` derived from the paper's two top-1s (:func:`paper_delta`); ``(None,
    sources)`` where several rows matched or none can be derived."""
    value = float(matched["value"].iloc[0]) if len(matched) == 1 else None
    source = "; ".join(sorted(set(matched["source"]))) if len(matched) else ""
    if not len(matched) and base is not None:
        derived = paper_delta(paper, metric, row.paper, base.row.paper)
        if derived is not None:
            return derived
    return value, source


def compare_rows(target: Target, results: list[RowResult], scale: str) -> list[dict[str, Any]]:
    """Comparison rows (ours beside the paper's number) for every row and metric, plus the
    paper's rows that no row of ours stands for (ours empty, so nothing is dropped)."""
    paper = target.paper_frame()
    by_label = {r.row.label: r for r in results}
    used: set[int] = set()
    out: list[dict[str, Any]] = []
    for res in results:
        row = res.row
        base = by_label.get(row.baseline) if row.baseline else None
        for metric in row.metrics or target.metrics:
            matched = lookup(paper, metric=metric, **row.paper) if row.paper else paper.iloc[0:0]
            if len(matched) == 1:
                used.update(matched.index.tolist())
            paper_value, source = paper_number(paper, matched, metric, row, base)
            note = ""
            if len(matched) > 1:
                note = f"{len(matched)} paper rows match; see the paper's rows below"
            if target.row_note is not None and res.ok:
                measured_note = target.row_note(res)
                if measured_note:
                    note = (note + "; " if note else "") + measured_note
            values = row_metric(res, metric, base, target.metric_table) if res.ok else []
            if not values and not res.ok:
                note = (note + "; " if note else "") + (res.error or "no result")
            paper_note = matched["note"].iloc[0].strip() if len(matched) == 1 else ""
            if paper_value is not None and paper_note:
                # what the paper_values file says of the number (a conflict in the paper, how
                # it was read) stays beside it wherever it stands beside ours
                note = (note + "; " if note else "") + f"paper's number: {paper_note}"
            first = (row.metrics or target.metrics)[0]
            if not values and paper_value is None and (res.ok or metric != first):
                continue  # the metric does not apply to this row (e.g. a delta of the baseline)
            mean, sd, n = _stat(values)
            if res.measured is None and 0 < n < len(res.runs):
                why = (
                    f" (no run of that seed in {row.baseline!r}, or the run never reached it)"
                    if row.baseline
                    else ""
                )
                left_out = f"{len(res.runs) - n} of {len(res.runs)} seeds without a value"
                note = (note + "; " if note else "") + f"{left_out}{why}: the mean is over {n}"
            entry = {
                "row": row.label,
                "metric": metric,
                "ours": None if n == 0 else mean,
                "ours_sd": None if n < 2 else sd,
                "n": n,
                # what n counts: a measurement's repeats, or the seeds of training runs
                "n_of": "repeats" if res.measured is not None else "seeds",
                "scale": scale if n else None,
                "paper": paper_value,
                "unit": _unit(target, metric) or (matched["unit"].iloc[0] if len(matched) else ""),
                "paper_source": source,
                "note": note,
            }
            entry.update(setups(row, scale, res, matched))
            flag = target.row_flag(res) if target.row_flag is not None and res.ok else ""
            if flag:
                entry["row_flag"] = flag
            seeds = [r.seed for r in res.runs]
            if n >= 1 and res.measured is None and len(seeds) == len(values) == n:
                # per-seed values, so that two rows run on the same seeds can be paired (and a
                # single seed's number is labelled with its seed)
                entry["seeds"], entry["values"] = seeds, [float(v) for v in values]
            elif len(values) > 1 and res.measured is not None:
                # one value per sweep of a measurement (NaN kept: a sweep that found none)
                entry["values"] = [float(v) for v in values]
            out.append(entry)
    for idx, p in paper.iterrows():
        if idx in used:
            continue
        label = " / ".join(str(p[c]) for c in ("model", "dataset", "method", "setting") if p[c])
        out.append(
            {
                "row": f"paper: {label}",
                "metric": p["metric"],
                "ours": None,
                "ours_sd": None,
                "n": 0,
                "scale": None,
                "paper": float(p["value"]),
                "unit": p["unit"],
                "paper_source": p["source"],
                "note": p["note"],
            }
        )
    return out


def run_target(
    target: Target,
    scale: str,
    runs_root: str | Path = RUNS_ROOT,
    *,
    log: Callable = print,
) -> ResultSet:
    """Run or reuse every row of ``target`` at ``scale``, save and return its ResultSet
    (``<runs_root>/results/<target>/<scale>/result.json``)."""
    from impl.env import collect

    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r}; valid scales: {', '.join(SCALES)}")
    t0 = time.perf_counter()
    results = execute_rows(target, scale, runs_root, log=log)
    rows = compare_rows(target, results, scale)
    missing = [{"row": r.row.label, "reason": r.error} for r in results if r.error]
    figures: list[FigureSpec] = []
    if target.figures:
        try:
            figures = target.figures(results, scale, target.paper_frame())
        except Exception as err:  # noqa: BLE001 - a broken figure must not lose the table
            missing.append({"row": "figures", "reason": f"failed: {type(err).__name__}: {err}"})
            log(f"  {target.key}: figures FAILED\n{traceback.format_exc(limit=4)}")
    runs = [run.path for r in results for run in r.runs]
    notes = list(target.notes(scale)) if target.notes else []
    # a target whose every row is a measurement trains no model: no note about runs
    trains = not results or any(r.row.measure is None for r in results)
    if scale == "smoke":
        notes.insert(0, SMOKE_RESULT_NOTE if trains else SMOKE_MEASURE_NOTE)
    for method in sorted({r.row.method for r in results if r.runs}):
        note = METHOD_SCALE_NOTES[method](scale) if method in METHOD_SCALE_NOTES else None
        if note and note not in notes:
            notes.append(note)
    # a run two rows read (Campfire Table 4 reads each run at two epochs) counts once
    first: dict[str, RunRecord] = {}  # (the second reading says "reused": counted as trained)
    for run in (run for r in results for run in r.runs):
        first.setdefault(run.path, run)
    distinct = first.values()
    trained = sum(1 for run in distinct if not run.reused)
    reused = sum(1 for run in distinct if run.reused)
    train_s = sum(float(run.summary.get("wall_seconds") or 0) for run in distinct)
    if trains:
        notes.append(
            f"{trained} runs trained and {reused} reused for this result (a run other results "
            "read too counts in each of them: the pages' counts do not add up to the runs "
            f"trained); the runs' training wall time, from their summaries: {train_s:.0f} s "
            "in total."
        )
    settings, setup = settings_lines(results, scale)
    title, description = target.title, target.description
    if target.heading is not None:
        title, description = target.heading(results, scale)
    result = ResultSet(
        target=target.key,
        title=title,
        scale=scale,
        rows=rows,
        settings=settings,
        setup=setup,
        figures=figures,
        runs=runs,
        missing=missing,
        notes=notes,
        description=description,
        environment={
            **collect(),
            **backend_flags(results),
            "runs_trained_at": runs_trained_at(results),
        },
        duration_s=time.perf_counter() - t0,
        wide=target.wide,
    )
    save_result(result, result_dir(target.key, scale, runs_root))
    return result


def runs_trained_at(results: Sequence[RowResult]) -> list[str]:
    """The commits (12 characters, "+" where the tree was modified) the runs behind
    ``results`` were trained at, from their summaries' environments: a result made from reused
    runs says which code trained them, beside the commit that compared them."""
    commits = set()
    for res in results:
        for run in res.runs:
            env = run.summary.get("environment") or {}
            if env.get("commit"):
                commits.add(str(env["commit"])[:12] + ("+" if env.get("dirty") else ""))
    return sorted(commits)


#: The backend settings a run sets for itself (``TrainConfig.tf32``, ``cudnn_benchmark``) and
#: a measurement has pinned around it, which the process comparing them holds at torch's
#: defaults.
BACKEND_FLAGS: tuple[str, ...] = ("tf32_matmul", "tf32_cudnn", "cudnn_benchmark")


def backend_flags(results: Sequence[RowResult]) -> dict[str, Any]:
    """The TF32 and cuDNN benchmark settings the numbers of ``results`` were made with: each
    run's (its summary's environment: ``TrainConfig.tf32``, ``cudnn_benchmark``) and each
    measurement's (pinned around it, :func:`measure_or_reuse`, and saved beside its values):
    one value where they agree, "mixed" where not; none where nothing recorded them (this
    process's settings then stand). The result's provenance shows these, not this process's
    torch defaults (cuDNN TF32 on), under which neither its runs nor its measurements ran.
    A result with neither runs nor measurements (the paper's numbers only) has each flag
    None: nothing of it ran under one."""
    if not any(r.runs or r.measured is not None for r in results):
        return dict.fromkeys(BACKEND_FLAGS)
    seen: dict[str, set[Any]] = {k: set() for k in BACKEND_FLAGS}
    recorded = [r.flags for r in results if r.measured is not None and r.flags]
    recorded += [run.summary.get("environment") or {} for res in results for run in res.runs]
    for env in recorded:
        for key in BACKEND_FLAGS:
            if key in env:
                seen[key].add(env[key])
    return {k: next(iter(v)) if len(v) == 1 else "mixed" for k, v in seen.items() if v}


def result_dir(key: str, scale: str, runs_root: str | Path = RUNS_ROOT) -> Path:
    """Where the result of ``key`` at ``scale`` is saved."""
    return Path(runs_root) / "results" / key / scale


def render(
    runs_root: str | Path = RUNS_ROOT,
    reports_root: str | Path = REPORTS_ROOT,
    expected: Sequence[dict[str, str]] = (),
) -> Path:
    """Render every saved result under ``runs_root`` into ``reports_root``; return the index.
    Where ``expected`` lists the reproduction targets, the index also accounts for the papers'
    figures without a target (:data:`reproductions.other_figures.OTHER_FIGURES`)."""
    from impl.report import render_reports
    from reproductions.other_figures import other_figures

    results, unreadable = load_results([Path(runs_root) / "results"])
    warn_unreadable(unreadable)
    others = other_figures() if expected else []
    return render_reports(
        results, reports_root, expected=expected, unreadable=unreadable, others=others
    )


def reproduce(
    target: Target,
    scale: str,
    runs_root: str | Path = RUNS_ROOT,
    reports_root: str | Path = REPORTS_ROOT,
) -> Path:
    """Run ``target`` at ``scale`` and render the reports; return the path of its paper's page."""
    from reproductions import expected_targets

    run_target(target, scale, runs_root)
    render(runs_root, reports_root, expected=expected_targets(scale))
    return Path(reports_root) / f"{target.paper}.html"


# -- helpers for figures --------------------------------------------------------------------
def figure_rows(
    results: list[RowResult],
    metric: str,
    scale: str,
    *,
    extra: Callable[[Row], dict] | None = None,
    table: dict[str, tuple[str, Callable]] | None = None,
) -> list[dict[str, Any]]:
    """One record per seed of each row with a value of ``metric`` (for seaborn: mean and sd
    are drawn from the repeats), labelled ``source = "ours (<scale>)"``. A row that lists
    its ``metrics`` appears only for those."""
    out = []
    for res in results:
        if res.row.metrics is not None and metric not in res.row.metrics:
            continue  # a row that shows other metrics (e.g. a ratio against another row)
        base = _baseline(results, res)
        for v in row_metric(res, metric, base, table or res.table) if res.ok else []:
            rec = {"row": res.row.label, metric: v, "source": f"ours ({scale})"}
            rec.update(res.row.group)
            if extra:
                rec.update(extra(res.row))
            out.append(rec)
    return out


def figure_points(
    results: list[RowResult],
    metrics: tuple[str, ...],
    scale: str,
    *,
    table: dict[str, tuple[str, Callable]] | None = None,
) -> list[dict[str, Any]]:
    """One record per run of each training row that has a value of every metric in
    ``metrics`` (a scatter's x and y, read from the same run: a run lacking one is left out,
    never paired with another run's value), with the row's label and group, labelled
    ``source = "ours (<scale>)"``. Metrics needing a baseline use the baseline's run of the
    same seed. A row that lists its ``metrics`` appears only if it lists them all."""
    out = []
    for res in results:
        if not res.ok or res.measured is not None:
            continue
        if res.row.metrics is not None and not set(metrics) <= set(res.row.metrics):
            continue
        fns = {m: _metric_fn(res, m, table or res.table or METRICS) for m in metrics}
        base_runs = _by_seed(_baseline(results, res))
        for run in res.runs:
            base = base_runs.get(run.seed)
            values = {m: _run_metric(fn, run, base) for m, fn in fns.items()}
            if None in values.values():
                continue
            out.append({"row": res.row.label, **values, "source": f"ours ({scale})",
                        **res.row.group})  # fmt: skip
    return out


def paper_figure_rows(
    paper: Any, metric: str, label: Callable[[dict[str, Any]], str], **match: str
) -> list[dict[str, Any]]:
    """The paper's values of ``metric`` as figure records labelled ``source = "paper"``."""
    rows = lookup(paper, metric=metric, **match)
    return [
        {"row": label(p), metric: float(p["value"]), "source": "paper"}
        for p in rows.to_dict("records")
    ]


def ours_vs_paper_records(
    results: list[RowResult], scale: str, paper: Any, metric: str
) -> list[dict[str, Any]]:
    """Figure records of ``metric``: ours per seed and the paper's value of each row's paper
    selector, both under the row's label (``source`` tells them apart)."""
    out = figure_rows(results, metric, scale)
    for res in results:
        if not res.row.paper:
            continue
        matched = lookup(paper, metric=metric, **res.row.paper)
        base = _baseline(results, res)
        value, _ = paper_number(paper, matched, metric, res.row, base)
        if value is not None:
            rec = {"row": res.row.label, metric: value, "source": "paper"}
            rec.update(res.row.group)
            out.append(rec)
    return out


def setup_caption(results: list[RowResult], scale: str, paper: Any) -> str:
    """What a figure of ours beside the paper's compares, where the two differ: "ours:
    ResNet-20 on digits (16x16 px); the paper's: ResNet-50 on ImageNet" (one pair for every
    row), "ours and the paper's models or data differ by row (see the table)" (several), or
    "" where they are the same or unknown (:func:`setups`, the paper's top-1 row naming the
    paper's model where the selector does not)."""
    pairs = set()
    for res in results:
        if not res.ok or not res.row.paper:
            continue
        matched = lookup(paper, metric="top1", **res.row.paper) if len(paper) else None
        named = setups(res.row, scale, res, matched)
        if named and named["ours_setup"] != named["paper_setup"]:
            pairs.add((named["ours_setup"], named["paper_setup"]))
    if len(pairs) == 1:
        ours, theirs = pairs.pop()
        return f"ours: {ours}; the paper's: {theirs}"
    return "ours and the paper's models or data differ by row (see the table)" if pairs else ""


def described(doc: str | None) -> str:
    """A target's description from its module's docstring: the first paragraph (what the
    paper shows) and the paragraph beginning "Scales:" (what each scale runs), where there
    is one, each on one line. The reader of a report learns the shape or model a scale ran
    from it, not only the paper's."""
    paragraphs = [" ".join(p.split()) for p in (doc or "").strip().split("\n\n")]
    scales = [p for p in paragraphs[1:] if p.startswith("Scales:")]
    return " ".join(paragraphs[:1] + scales[:1])


def bar_vs_paper(metric: str, title: str, ylabel: str, caption: str = "") -> Callable:
    """A ``Target.figures`` builder: bars of ``metric`` per row, ours (with sd) and paper."""

    def build(results: list[RowResult], scale: str, paper: Any) -> list[FigureSpec]:
        data = ours_vs_paper_records(results, scale, paper, metric)
        ours = any(r["source"] != "paper" for r in data)
        said = caption or (
            f"{title}; ours at scale {scale}"
            if ours
            else f"{title}: the paper's numbers only (no result of ours at scale {scale})"
        )
        both = ours and any(r["source"] == "paper" for r in data)
        differ = setup_caption(results, scale, paper) if both else ""
        if differ:
            said = f"{said} ({differ})"
        return [
            FigureSpec(
                kind="bar", x="row", y=metric, hue="source", data=data, title=title,
                ylabel=ylabel, xlabel="", caption=said,
            )
        ]  # fmt: skip

    return build


def panels_vs_paper(*panels: tuple[str, str, str]) -> Callable:
    """A ``Target.figures`` builder for a paper figure of several panels: one
    :func:`bar_vs_paper` figure per ``(metric, title, ylabel)``, in order."""
    return figures_of(*(bar_vs_paper(*panel) for panel in panels))


def figures_of(*builders: Callable) -> Callable:
    """A ``Target.figures`` builder drawing every figure of ``builders``, in order."""

    def build(results: list[RowResult], scale: str, paper: Any) -> list[FigureSpec]:
        return [spec for b in builders for spec in b(results, scale, paper)]

    return build


def epoch_curves(
    results: list[RowResult], metric: str, *, rows: Callable[[Row], bool] | None = None
) -> list[dict[str, Any]]:
    """One record per epoch of every run of the training rows (those ``rows`` accepts, all
    when None): ``{"row", "seed", "epoch", metric}`` with the epoch counted from 1, as the
    papers' axes do. An epoch whose metrics lack ``metric`` (or hold None) is left out."""
    out = []
    for res in results:
        if not res.ok or res.measured is not None or (rows is not None and not rows(res.row)):
            continue
        for run in res.runs:
            for m in run.metrics:
                value, epoch = m.get(metric), m.get("epoch")
                if value is not None and epoch is not None:
                    rec = {"row": res.row.label, "seed": run.seed, "epoch": int(epoch) + 1}
                    out.append({**rec, metric: float(value)})
    return out


def curves_per_epoch(
    metric: str,
    title: str,
    ylabel: str,
    paper_figure: str,
    *,
    rows: Callable[[Row], bool] | None = None,
) -> Callable:
    """A ``Target.figures`` builder: ``metric`` per epoch of each training row (mean over
    seeds, sd band), for a paper figure of curves (``paper_figure``, e.g. "SDGP Fig. 7")
    whose numbers the paper does not print; only ours is drawn. No figure where no run has
    the metric."""

    def build(results: list[RowResult], scale: str, paper: Any) -> list[FigureSpec]:
        data = epoch_curves(results, metric, rows=rows)
        if not data:
            return []
        seeds = len({r["seed"] for r in data})
        said = (f"ours at scale {scale}" + (", mean and sd over seeds" if seeds > 1 else "")
                + f"; {paper_figure} draws these curves without printing their numbers, "
                "so only ours is drawn")  # fmt: skip
        return [
            FigureSpec(kind="line", x="epoch", y=metric, hue="row", data=data, title=title,
                       xlabel="epoch", ylabel=ylabel, caption=said)
        ]  # fmt: skip

    return build


def asdict_rows(rows: Sequence[Row]) -> list[dict[str, Any]]:
    """Rows as plain dicts (for listing a target's configuration)."""
    return [dataclasses.asdict(r) for r in rows]


__all__ = [
    "METRICS",
    "bar_vs_paper",
    "described",
    "ours_vs_paper_records",
    "panels_vs_paper",
    "REPORTS_ROOT",
    "RUNS_ROOT",
    "SCALES",
    "SCALE_SEEDS",
    "SCALE_TRAIN",
    "MethodUnavailable",
    "Row",
    "RowResult",
    "RunRecord",
    "Target",
    "compare_rows",
    "execute_rows",
    "figure_rows",
    "measure_or_reuse",
    "paper_delta",
    "paper_figure_rows",
    "per_sweep",
    "render",
    "reproduce",
    "result_dir",
    "run_or_reuse",
    "run_target",
    "run_iteration_ms",
    "run_training_flops",
    "samples_seen",
    "setups",
    "TIMING_SWEEPS",
    "check_sweeps",
    "unavailable_reason",
]


# -- helpers for rows and measurements ------------------------------------------------------
def needs_paper(scale: str, what: str) -> str | None:
    """None at the paper scale, else the reason a row needs it ("needs the paper scale (...)")."""
    return None if scale == "paper" else f"needs the paper scale ({what})"


def cifar_step_recipe(epochs: int, dataset: str = "cifar10", lr: float = 0.1) -> dict[str, Any]:
    """The CIFAR recipe the papers share: SGD momentum 0.9 (no Nesterov), batch 128, ``lr``
    (0.1: PruneTrain Sec. 5; ClickTrain Sec. 6.1) decayed 10x from the epochs at half and
    three quarters of ``epochs`` (rounded down), counted from 1.

    Neither paper's text names the decay: the authors' public PruneTrain code lowers the rate
    from its epochs 91 and 136 of 182, counted from 1 (``epoch >= 91``), so after 90 and 135
    epochs done, the milestones here (a step schedule's milestones are epochs done); for
    ClickTrain's 190 epochs (from epochs 95 and 142, the first inside Table 1's hard-pruning
    epochs 90-98) they are this project's choice."""
    return {
        "data": dataset,
        "epochs": epochs,
        "batch_size": 128,
        "lr": lr,
        "schedule": "step",
        "milestones": [epochs // 2 - 1, (3 * epochs) // 4 - 1],
        "nesterov": False,
    }


TIMING_SWEEPS: dict[str, int] = {"smoke": 2, "cpu": 5, "gpu": 5, "paper": 5}
"""Independent passes of the timing measurements the papers' speed claims rest on (ClickTrain
Figs. 9-10, SDGP Fig. 9): each pass gives one value of the headline ratio, so a report shows
its spread and a claim is judged on its 95% confidence interval, not on one draw."""


def check_sweeps(sweeps: int) -> None:
    """``ValueError`` unless a measurement is asked for at least one sweep."""
    if sweeps < 1:
        raise ValueError(f"sweeps must be >= 1, got {sweeps}")


def per_sweep(values: list[float]) -> float | list[float]:
    """A measurement's headline value as saved: the list of one value per sweep, or the
    number itself after a single sweep (the form :func:`row_metric` reads)."""
    return values if len(values) > 1 else values[0]


def time_ms(fn: Callable[[], Any], *, repeats: int = 5, warmup: int = 1) -> list[float]:
    """Wall times of ``fn()`` in ms, ``repeats`` times after ``warmup`` calls: CUDA events
    when a GPU is present (synchronised), ``time.perf_counter`` otherwise."""
    import torch

    for _ in range(warmup):
        fn()
    out = []
    cuda = torch.cuda.is_available()
    for _ in range(repeats):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            out.append(float(start.elapsed_time(end)))
        else:
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e3)
    return out


def device_name() -> str:
    """The GPU's name when one is present, else the CPU's model."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    from impl.env import collect

    return str(collect().get("cpu_model") or "cpu")
