"""The reproduction framework: rows -> runs (reused by config hash) -> comparison -> report."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import time
import types
from pathlib import Path

import pytest
import torch

import reproductions
from reproductions import common, settings
from reproductions.common import (
    MethodUnavailable,
    Row,
    RowResult,
    RunRecord,
    Target,
    compare_rows,
    measure_or_reuse,
    row_metric,
    run_target,
    run_training_flops,
    samples_seen,
)
from reproductions.published import lookup, paper_values

TINY = {"epochs": 1, "max_steps_per_epoch": 1, "batch_size": 16, "threads": 1}
CALLS = {"n": 0}


def counted_measure(*, scale, context, x):
    """A measurement for the tests: counts its calls."""
    CALLS["n"] += 1
    return {"value": x * 2, "scale": scale, "seen": sorted(context["runs"])}


def _tiny_target(extra_rows=()):
    def rows(scale):
        return [
            Row("dense", "dense", train=TINY, paper={"model": "resnet9", "method": "dense"}),
            Row("sdgp", "sdgp", options={"profile": False}, train=TINY, baseline="dense",
                paper={"model": "resnet9", "setting": "rescaled 2:4"}),
            Row("imagenet row", needs="needs the paper scale (ImageNet)",
                paper={"model": "resnet18", "method": "dense"}),
            *extra_rows,
        ]  # fmt: skip

    return Target(
        key="sdgp.table1", title="tiny", description="tiny", rows=rows,
        metrics=("top1", "delta_top1", "compression_ratio"),
    )  # fmt: skip


@pytest.mark.slow
def test_run_target_trains_then_reuses_and_lists_what_is_missing(tmp_path, monkeypatch):
    logs: list[str] = []
    unavailable = Row("campfire", "campfire", train=TINY, baseline="dense")
    failing = Row("bad option", "sdgp", options={"no_such_option": 1}, train=TINY)
    twice = Row("dense read again", "dense", train=TINY)  # the dense row's run, read twice
    target = _tiny_target([unavailable, failing, twice])
    real = common.unavailable_reason
    missing = "method 'campfire' is not available in this build"
    monkeypatch.setattr(
        common, "unavailable_reason", lambda n: missing if n == "campfire" else real(n)
    )
    result = run_target(target, "smoke", tmp_path, log=logs.append)
    # one run directory per config, named by method, model, data, scale and config hash
    dirs = sorted(p.name for p in tmp_path.iterdir() if p.name not in ("results",))
    assert len(dirs) == 2 and dirs[0].startswith("dense-resnet20-digits-smoke-")
    assert all(json.loads((tmp_path / d / "summary.json").read_text())["status"] == "complete"
               for d in dirs)  # fmt: skip
    missing = {m["row"]: m["reason"] for m in result.missing}
    assert missing["imagenet row"] == "needs the paper scale (ImageNet)"
    assert missing["campfire"].startswith("not available")
    assert missing["bad option"].startswith("failed: ValueError")
    rows = {(r["row"], r["metric"]): r for r in result.rows}
    assert rows[("dense", "top1")]["paper"] == 95.3 and rows[("dense", "top1")]["scale"] == "smoke"
    assert rows[("sdgp", "top1")]["paper"] == 95.2
    delta = rows[("sdgp", "delta_top1")]["ours"]
    assert delta == pytest.approx(rows[("sdgp", "top1")]["ours"] - rows[("dense", "top1")]["ours"])
    assert ("dense", "delta_top1") not in rows  # a baseline has no delta to itself
    assert rows[("imagenet row", "top1")]["ours"] is None
    assert rows[("imagenet row", "top1")]["paper"] == 71.4
    assert rows[("campfire", "top1")]["note"].startswith("not available")
    # the paper's rows no row of ours stands for are listed, with ours empty
    assert any(r["row"].startswith("paper: resnet50") and r["ours"] is None for r in result.rows)
    saved = tmp_path / "results" / "sdgp.table1" / "smoke" / "result.json"
    assert saved.exists()
    # a smoke result says it is a pipeline check; single-seed numbers keep their seed; the
    # settings come from the runs' saved configs
    assert result.notes[0] == common.SMOKE_RESULT_NOTE
    assert rows[("dense", "top1")]["seeds"] == [0] and rows[("dense", "top1")]["n"] == 1
    assert [s["row"] for s in result.settings] == ["dense", "sdgp", "dense read again"]
    assert "2 runs trained and 0 reused" in result.notes[-1]  # the run read twice counts once
    assert "counts in each of them" in result.notes[-1]  # as it does in other results
    assert result.settings[1]["options"].startswith("2:4 data-gradient pruning, rescaled")
    assert result.settings[1]["options"].endswith("profile False")
    assert result.setup.startswith("ResNet-20 on digits, 1 epoch of at most 1 step, batch 16")
    # a second call trains nothing: every complete run is reused
    again = run_target(target, "smoke", tmp_path, log=logs.append)
    assert "0 runs trained and 2 reused" in again.notes[-1]
    wall = sum(
        json.loads((tmp_path / d / "summary.json").read_text())["wall_seconds"] for d in dirs
    )
    assert f"{wall:.0f} s in total" in again.notes[-1]
    assert [r["ours"] for r in again.rows] == [r["ours"] for r in result.rows]


@pytest.mark.slow
def test_a_killed_run_is_resumed_not_restarted(tmp_path):
    row = Row("dense", "dense", train=TINY)
    cfg = row.configs("smoke", tmp_path)[0]
    common.run_or_reuse(cfg)
    run_dir = tmp_path / cfg.out.rsplit("/", 1)[-1]
    summary = json.loads((run_dir / "summary.json").read_text())
    (run_dir / "summary.json").unlink()  # as if killed after its last checkpoint
    resumed, reused = common.run_or_reuse(cfg)
    assert not reused and resumed["top1"] == summary["top1"]


def test_a_run_whose_summary_predates_a_measurement_is_trained_again(tmp_path, capsys):
    from impl.rundir import SUMMARY_VERSION

    row = Row("dense", "dense", train=TINY)
    cfg = row.configs("smoke", tmp_path)[0]
    first, _ = common.run_or_reuse(cfg)
    assert first["summary_version"] == SUMMARY_VERSION
    run_dir = Path(cfg.out)
    old = {k: v for k, v in first.items() if k not in ("summary_version", "step_ms", "iter_ms")}
    (run_dir / "summary.json").write_text(json.dumps(old))  # as written before version 2
    assert common.reusable_summary(run_dir, "dense") is None
    capsys.readouterr()
    again, reused = common.run_or_reuse(cfg)
    assert not reused and again["iter_ms"] is not None
    assert "was written before the step phase" in capsys.readouterr().err
    assert len(list(run_dir.parent.glob(f"{run_dir.name}.stale-*"))) == 1  # kept aside
    assert common.run_or_reuse(cfg)[1] is True  # the new one is reused


def test_outdated_summary_names_what_each_later_version_added():
    from impl.rundir import SUMMARY_VERSION, outdated_summary

    assert outdated_summary({"summary_version": SUMMARY_VERSION}) is None
    why = outdated_summary({})  # no field: version 1
    assert why is not None and "version 1" in why and "step phase" in why
    assert outdated_summary({"summary_version": SUMMARY_VERSION + 1}) is None  # newer code's
    last = outdated_summary({"summary_version": SUMMARY_VERSION - 1})  # one behind is stale
    assert last is not None and f"version {SUMMARY_VERSION - 1}" in last


def test_outdated_summary_names_only_the_versions_after_its_own():
    """A summary one version behind lacks the newest version's change alone; a summary
    without the field (version 1) lacks those of versions 2 on, not its own."""
    from impl.rundir import SUMMARY_VERSION, SUMMARY_VERSIONS, outdated_summary

    last = outdated_summary({"summary_version": SUMMARY_VERSION - 1})
    assert last == (
        f"its summary (version {SUMMARY_VERSION - 1}) was written before "
        f"{SUMMARY_VERSIONS[SUMMARY_VERSION]}"
    )
    first = outdated_summary({})
    assert first is not None and SUMMARY_VERSIONS[1] not in first
    assert all(SUMMARY_VERSIONS[v] in first for v in range(2, SUMMARY_VERSION + 1))


def test_run_or_reuse_reports_a_missing_method(tmp_path, monkeypatch):
    monkeypatch.setattr(
        common, "unavailable_reason", lambda n: f"method {n!r} is not available in this build"
    )
    cfg = Row("x", "clicktrain", train=TINY).configs("smoke", tmp_path)[0]
    with pytest.raises(MethodUnavailable, match="not available"):
        common.run_or_reuse(cfg)


def test_row_configs_resolve_scale_defaults_and_seeds(tmp_path):
    cfgs = Row("r", "sdgp", options={"n": 2}, train={"epochs": 3}, seeds=(0, 5)).configs(
        "cpu", tmp_path
    )
    assert [c.seed for c in cfgs] == [0, 5]
    assert cfgs[0].model == "resnet20" and cfgs[0].data == "digits" and cfgs[0].epochs == 3
    assert cfgs[0].method_options == {"n": 2} and cfgs[0].scale == "cpu"
    assert cfgs[0].out != cfgs[1].out and cfgs[0].out.startswith(str(tmp_path))
    assert Row("m", measure="a:b").configs("cpu", tmp_path) == []


@pytest.mark.parametrize("scale", ["smoke", "cpu", "gpu", "paper"])
@pytest.mark.slow
def test_every_target_row_resolves_to_valid_configs_at_every_scale(scale, tmp_path):
    # resolve() refuses what no run can use (e.g. a step schedule whose drops all fall past
    # the last epoch): no table may hold a row that would fail only once it is run.
    # The model, the dataset and the method's options are checked as `pdtbench train` would.
    import dataclasses
    import importlib

    from impl.data import DATASETS
    from impl.methods import create_method
    from impl.models import MODELS

    checked: set[str] = set()  # a method's check builds the model: once per distinct config
    for key in reproductions.TARGETS:
        target = importlib.import_module(f"reproductions.{key}").TARGET
        for row in target.rows(scale):
            for cfg in row.configs(scale, tmp_path):
                assert cfg.scale == scale and cfg.model in MODELS and cfg.data in DATASETS, key
                fields = {**dataclasses.asdict(cfg), "seed": 0, "out": None}
                digest = json.dumps(fields, sort_keys=True, default=str)
                if digest not in checked:
                    create_method(cfg.method, cfg.method_options).validate(cfg)
                    checked.add(digest)
    assert checked


def test_measurements_are_cached_by_function_params_and_scale(tmp_path):
    CALLS["n"] = 0
    fn = "test_reproductions:counted_measure"
    ctx = {"runs": {"dense": ["d"]}}
    v1, reused1 = measure_or_reuse(fn, {"x": 3}, "smoke", ctx, tmp_path)
    v2, reused2 = measure_or_reuse(fn, {"x": 3}, "smoke", ctx, tmp_path)
    v3, _ = measure_or_reuse(fn, {"x": 4}, "smoke", ctx, tmp_path)
    assert (v1["value"], reused1, reused2, v3["value"], CALLS["n"]) == (6, False, True, 8, 2)
    assert v2 == v1 and v1["seen"] == ["dense"]


def test_a_damaged_saved_measurement_is_measured_again(tmp_path, capsys):
    CALLS["n"] = 0
    fn = "test_reproductions:counted_measure"
    ctx = {"runs": {}}
    measure_or_reuse(fn, {"x": 3}, "smoke", ctx, tmp_path)
    (saved,) = [p for p in tmp_path.rglob("*.json")]
    for damage in ('{"values": {"val', "[1, 2]", '{"no": "values"}'):
        saved.write_text(damage)
        values, reused = measure_or_reuse(fn, {"x": 3}, "smoke", ctx, tmp_path)
        assert values["value"] == 6 and not reused
        assert f"not reusing {saved}: unreadable" in capsys.readouterr().err
    assert CALLS["n"] == 4 and measure_or_reuse(fn, {"x": 3}, "smoke", ctx, tmp_path)[1]


def tf32_seen_measure(scale, context):
    """A measurement that reports the TF32 flags it ran under."""
    return {
        "matmul": bool(torch.backends.cuda.matmul.allow_tf32),
        "cudnn": bool(torch.backends.cudnn.allow_tf32),
    }


def test_measurements_run_in_float32_and_record_the_flags(tmp_path):
    # Timings compare float32 kernels with cuBLAS / cuDNN: TF32 is off while a measurement
    # runs (whatever it was before), restored after, and saved beside the values.
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        values, _ = measure_or_reuse(
            "test_reproductions:tf32_seen_measure", {}, "smoke", {}, tmp_path
        )
        assert values == {"matmul": False, "cudnn": False}
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before
    (saved,) = list(tmp_path.rglob("*.json"))
    benchmark = bool(torch.backends.cudnn.benchmark)  # left as it was
    assert json.loads(saved.read_text())["flags"] == {
        "tf32_matmul": False, "tf32_cudnn": False, "cudnn_benchmark": benchmark,
    }  # fmt: skip


def _run(seed=0, **summary):
    base = {"method": "dense", "scale": "cpu", "top1": 90.0, "compression_ratio": 1.0,
            "inference_flops": 100.0, "train_flops_nominal": 300.0, "train_flops_executed": 300.0,
            "fwd_ms": 2.0, "bwd_ms": 4.0, "step_ms": 1.0, "iter_ms": 7.0,
            "wall_seconds": 10.0}  # fmt: skip
    base.update(summary)
    metrics = [{"epoch": e, "samples_per_second": 10.0, "train_seconds": 5.0, "test_top1": 80.0,
                "iter_ms": 6.0 + 2 * e, "iterations": 3} for e in range(2)]  # fmt: skip
    return RunRecord(path="p", seed=seed, summary=base, metrics=metrics, reused=True)


def test_samples_and_run_training_flops_per_method():
    dense = _run()
    assert samples_seen(dense.metrics) == 100.0
    assert run_training_flops(dense.summary, dense.metrics) == 300.0 * 100
    pt = _run(method="prunetrain", train_flops_run=12345.0)
    assert run_training_flops(pt.summary, pt.metrics) == 12345.0
    cf = _run(method="campfire")
    cf.metrics[0]["train_flops_nominal"], cf.metrics[1]["train_flops_nominal"] = 300.0, 100.0
    assert run_training_flops(cf.summary, cf.metrics) == 300.0 * 50 + 100.0 * 50
    # an epoch without its rate counts its samples as samples_seen does: iterations x batch
    cf.metrics[1].update(samples_per_second=None, batch_size=8)  # 3 iterations of 8
    assert run_training_flops(cf.summary, cf.metrics) == 300.0 * 50 + 100.0 * 24
    ct = _run(method="clicktrain", clicktrain={"flops": {"train_flops_run_per_sample": {
        "nominal": 400.0, "executed": 500.0}}})  # fmt: skip
    assert run_training_flops(ct.summary, ct.metrics, "executed") == 500.0 * 100 / 2
    with pytest.raises(ValueError, match="nominal"):
        run_training_flops(dense.summary, dense.metrics, "peak")


# Every metric of METRICS on one run against its dense baseline (``_run`` defaults: top-1 90,
# inference 100 FLOPs, training 300 FLOPs per sample, fwd 2 / bwd 4 / step 1 / iteration 7 ms,
# 10 s; 100 samples over two epochs whose median iterations are 6 and 8 ms; the run compared
# trains 4 s an epoch where dense trains 5: train_time 80%).
EVERY_METRIC = {
    "top1": 85.0, "best_top1": 87.0, "base_top1": 90.0, "delta_top1": -5.0,
    "compression_ratio": 4.0, "conv_sparsity": 75.0, "inference_flops": 25.0,
    "inference_flops_saved": 75.0, "train_flops": 50.0, "train_flops_impl": 50.0,
    "train_flops_saved": 50.0, "train_flops_executed_saved": 100.0 / 3, "train_time": 80.0,
    "fwd_ms": 0.5,
    "bwd_ms": 3.0, "step_ms": 0.5, "iter_ms": 4.5, "run_iter_ms": 7.0, "forward_speedup": 4.0,
    "backward_speedup": 4.0 / 3, "wall_seconds": 8.0, "comm_bytes_per_iter": 1000.0,
    "peak_gpu_memory_mib": 12.5, "true_sparsity": 60.0, "train_flops_per_sample": 150.0,
    "train_flops_executed_per_sample": 200.0, "inference_flops_per_sample": 25.0,
    "inference_flops_executed_per_sample": 30.0,
}  # fmt: skip


def test_every_metric_of_a_run_against_its_baseline():
    base = RowResult(Row("dense"), runs=[_run(0)])
    ours = RowResult(Row("x", baseline="dense"), runs=[_run(
        0, method="campfire", top1=85.0, best_top1=87.0, compression_ratio=4.0,
        inference_flops=25.0, inference_flops_executed=30.0, train_flops_nominal=150.0,
        train_flops_executed=200.0, fwd_ms=0.5, bwd_ms=3.0, step_ms=0.5, iter_ms=4.5,
        wall_seconds=8.0, comm_bytes_per_iter=1000, peak_gpu_memory_mib=12.5,
        true_sparsity=0.6)])  # fmt: skip
    for m in ours.runs[0].metrics:  # 4 s of training steps an epoch, the same 50 samples
        m["train_seconds"], m["samples_per_second"] = 4.0, 12.5
    assert set(EVERY_METRIC) == set(common.METRICS)  # a new metric needs its expected value
    for metric, expected in EVERY_METRIC.items():
        assert row_metric(ours, metric, base) == [pytest.approx(expected)], metric


def test_samples_without_a_rate_count_iterations_times_batch():
    metrics = [{"iterations": 3, "batch_size": 16}, {"iterations": 2, "batch_size": 16}]
    assert samples_seen(metrics) == 80.0
    rated = [{"samples_per_second": 10.0, "train_seconds": 5.0, "iterations": 9}]
    assert samples_seen(rated) == 50.0


def test_clicktrain_run_flops_spread_over_any_number_of_epochs():
    per = {"flops": {"train_flops_run_per_sample": {"nominal": 400.0, "executed": 500.0}}}
    for epochs in (1, 3):
        run = _run(method="clicktrain", clicktrain=per)
        run.metrics[:] = [dict(run.metrics[0], epoch=e) for e in range(epochs)]  # 50 each
        # the per-sample cost covers the whole run: times the samples of one epoch
        assert run_training_flops(run.summary, run.metrics) == 400.0 * 50


def test_executed_inference_flops_fall_back_to_clicktrains_account():
    from reproductions.common import inference_executed

    assert inference_executed({"inference_flops_executed": 30}) == 30.0
    click = {"clicktrain": {"flops": {"per_sample_final": {"dense": {"forward": 1000.0}},
                                      "inference_flops_saved_executed": 0.25}}}  # fmt: skip
    assert inference_executed(click) == 750.0
    assert inference_executed({"clicktrain": {"flops": {}}}) is None
    assert inference_executed({}) is None


def test_time_per_iteration_over_the_run_weights_each_epoch_by_its_iterations():
    from reproductions.common import run_iteration_ms

    # a pruning era of 2 slow epochs, then 1 fast epoch of twice the iterations
    epochs = [{"iter_ms": 10.0, "iterations": 5}, {"iter_ms": 10.0, "iterations": 5},
              {"iter_ms": 4.0, "iterations": 10}]  # fmt: skip
    assert run_iteration_ms(epochs) == pytest.approx((100 + 40) / 20)
    assert row_metric(RowResult(Row("x"), runs=[_run(0)]), "run_iter_ms", None) == [7.0]
    assert math.isnan(run_iteration_ms([{"iter_ms": 3.0, "iterations": 5}, {"iterations": 5}]))
    assert math.isnan(run_iteration_ms([]))


def test_cross_figures_have_one_bar_per_kind_under_one_column():
    from reproductions.cross.methods import figures

    dense = RowResult(Row("dense", "dense"), runs=[_run(0), _run(1)])
    half = RowResult(Row("x", baseline="dense"), runs=[_run(0, train_flops_nominal=150.0)])
    figs = {f.title: f.data for f in figures([dense, half], "cpu", None)}
    time_rows = [r for r in figs["Time per iteration"] if r["row"] == "dense"]
    assert sorted((r["kind"], r["iter_ms"]) for r in time_rows) == [
        ("last epoch", 7.0), ("last epoch", 7.0), ("whole run", 7.0), ("whole run", 7.0)
    ]  # fmt: skip
    assert all("run_iter_ms" not in r for r in time_rows)  # the whole run's value moved over
    flops = figs["Training FLOPs saved over the run"]
    assert sorted((r["kind"], r["train_flops_saved"]) for r in flops) == [
        ("executed", 0.0), ("nominal", 50.0)]  # fmt: skip
    assert all("train_flops_executed_saved" not in r for r in flops)


def test_row_metric_seed_matched_mean_and_unknown_metric():
    base = RowResult(Row("dense"), runs=[_run(0, top1=90.0), _run(1, top1=80.0)])
    ours = RowResult(Row("x", baseline="dense"),
                     runs=[_run(1, top1=81.0, compression_ratio=4.0, inference_flops=25.0),
                           _run(2, top1=70.0)])  # fmt: skip
    # seed 1 against the baseline's seed 1; seed 2, absent there, has no delta (never one
    # against another seed's run)
    assert row_metric(ours, "delta_top1", base) == [pytest.approx(1.0)]
    assert row_metric(ours, "conv_sparsity", None)[0] == pytest.approx(75.0)
    assert row_metric(ours, "inference_flops_saved", base)[0] == pytest.approx(75.0)
    assert row_metric(ours, "iter_ms", None) == [7.0, 7.0]  # the whole iteration, step too
    old = RowResult(Row("x"), runs=[_run(0, iter_ms=None)])  # trained before it was recorded
    assert math.isnan(row_metric(old, "iter_ms", None)[0])  # not fwd + bwd passed off as it
    assert row_metric(ours, "delta_top1", None) == []  # no baseline: no value, no error
    with pytest.raises(ValueError, match="unknown metric"):
        row_metric(ours, "nope", base)
    measured = RowResult(Row("m", measure_keys={"t": "t_4"}), measured={"t_4": [1.0, 3.0]})
    assert row_metric(measured, "t", None) == [1.0, 3.0]


def test_compare_rows_mean_sd_and_paper_value():
    target = _tiny_target()
    results = [
        RowResult(Row("dense", paper={"model": "resnet9", "method": "dense"}),
                  runs=[_run(0, top1=96.0), _run(1, top1=98.0)]),
        RowResult(Row("imagenet row", needs="x", paper={"model": "resnet18", "method": "dense"}),
                  error="needs x"),
    ]  # fmt: skip
    rows = compare_rows(target, results, "cpu")
    top1 = next(r for r in rows if r["row"] == "dense" and r["metric"] == "top1")
    assert (top1["ours"], top1["n"], top1["scale"], top1["paper"]) == (97.0, 2, "cpu", 95.3)
    assert top1["ours_sd"] == pytest.approx(math.sqrt(2.0))
    assert (top1["seeds"], top1["values"]) == ([0, 1], [96.0, 98.0])  # kept for pairing
    assert top1["paper_source"] == "Table I, Sec. IV-A"
    missing = [r for r in rows if r["row"] == "imagenet row"]
    assert len(missing) == 1 and missing[0]["ours"] is None
    # what the paper_values file says of the number it stands beside comes along
    assert missing[0]["note"] == "needs x; paper's number: dense baseline"
    # a paper row one of ours stands beside is not listed again as a paper-only row
    assert [r["row"] for r in rows if r["paper"] == 95.3] == ["dense"]
    paper_only = [r for r in rows if r["row"].startswith("paper: ")]
    assert len(paper_only) == len(paper_values("sdgp", "table1")) - 2  # all but the two matched
    assert all(r["n"] == 0 and r["ours"] is None and r["scale"] is None for r in paper_only)


def test_a_row_that_failed_after_some_seeds_ran_shows_no_number_and_says_why():
    """A row whose seed 1 failed after seed 0 trained is a failed row: no mean of the seeds
    that ran stands in the table, and its note gives the failure."""
    partial = RowResult(Row("dense", paper={"model": "resnet9", "method": "dense"}),
                        runs=[_run(0, top1=96.0)], error="failed: RuntimeError: boom")  # fmt: skip
    assert not partial.ok
    rows = compare_rows(_tiny_target(), [partial], "cpu")
    top1 = next(r for r in rows if r["row"] == "dense" and r["metric"] == "top1")
    assert (top1["ours"], top1["n"], top1["scale"], top1["paper"]) == (None, 0, None, 95.3)
    assert top1["note"].startswith("failed: RuntimeError: boom")


def test_compare_rows_says_when_several_paper_rows_match_and_lists_them():
    target = _tiny_target()
    vague = RowResult(Row("vague", paper={"model": "resnet9"}), runs=[_run(0, top1=96.0)])
    rows = compare_rows(target, [vague], "cpu")
    top1 = next(r for r in rows if r["row"] == "vague" and r["metric"] == "top1")
    assert top1["paper"] is None and top1["ours"] == 96.0
    assert top1["note"] == "4 paper rows match; see the paper's rows below"
    listed = [r for r in rows if r["row"].startswith("paper: resnet9")]
    assert sorted(r["paper"] for r in listed) == [94.5, 95.2, 95.2, 95.3]
    one = RowResult(Row("one", paper={"model": "resnet9", "method": "dense"}), runs=[_run(0)])
    top1 = next(r for r in compare_rows(target, [one], "cpu") if r["metric"] == "top1")
    assert top1["paper"] == 95.3 and top1["note"] == "paper's number: dense baseline"
    failed = RowResult(Row("failed", paper={"model": "resnet9"}), error="needs x")
    top1 = next(r for r in compare_rows(target, [failed], "cpu") if r["row"] == "failed")
    assert top1["note"] == "4 paper rows match; see the paper's rows below; needs x"


def test_compare_rows_keeps_per_sweep_values_of_a_measurement_only_when_there_are_several():
    target = _tiny_target()
    sweeps = RowResult(Row("sweeps"), measured={"top1": [1.0, 3.0]})
    gap = RowResult(Row("gap"), measured={"top1": [2.0, float("nan"), 4.0]})
    single = RowResult(Row("single"), measured={"top1": 3.0})
    rows = {r["row"]: r for r in compare_rows(target, [sweeps, gap, single], "cpu")}
    assert rows["sweeps"]["values"] == [1.0, 3.0] and rows["sweeps"]["ours"] == 2.0
    assert rows["gap"]["values"][:1] == [2.0] and math.isnan(rows["gap"]["values"][1])
    assert rows["gap"]["ours"] == 3.0 and rows["gap"]["n"] == 2  # NaN left out of the mean
    assert rows["sweeps"]["paper"] is None  # no selector: no paper number
    assert "values" not in rows["single"] and "seeds" not in rows["single"]
    assert rows["single"]["ours"] == 3.0 and rows["single"]["ours_sd"] is None


# The paper states no number of these that a run of ours measures (only recommendations).
NOTHING_COMPARABLE = {"prunetrain.fig10"}


# -- every registered target -------------------------------------------------------------------
@pytest.mark.parametrize("key", reproductions.TARGETS, ids=reproductions.TARGETS)
def test_every_target_declares_consistent_rows_at_every_scale(key, tmp_path):
    target = reproductions.load_target(key)
    assert target.key == key and target.title and target.description
    paper = target.paper_frame()
    for scale in common.SCALES:
        rows = target.rows(scale)
        assert rows, (key, scale)
        labels = [r.label for r in rows]
        assert len(labels) == len(set(labels)), (key, scale)
        matched = 0
        for r in rows:
            assert r.baseline is None or r.baseline in labels, (key, scale, r.label)
            if r.measure is None and not r.needs:
                for cfg in r.configs(scale, tmp_path):
                    cfg.validate()
                for m in r.metrics or target.metrics:
                    assert r.measure_keys.get(m, m) in target.metric_table, (key, r.label, m)
            for m in r.metrics or target.metrics:
                n = len(lookup(paper, metric=m, **r.paper)) if r.paper else 0
                assert n <= 1 or r.needs, (key, scale, r.label, m, n)
                matched += n == 1
        if target.paper != "cross" and key not in NOTHING_COMPARABLE:
            assert matched > 0, (key, scale)  # ours stand beside at least one paper number


def test_cross_table_has_five_methods_on_equal_terms():
    from reproductions.cross.methods import METHOD_ORDER, rows

    for scale in ("cpu", "gpu", "paper"):
        rs = rows(scale)
        assert [r.method for r in rs] == list(METHOD_ORDER)
        assert all(len(r.seeds) >= 3 for r in rs)
        assert len({json.dumps(r.train, sort_keys=True) for r in rs}) == 1


def test_cli_lists_targets_and_rejects_unknown(capsys):
    assert reproductions.main(["--list"]) == 0
    out = capsys.readouterr().out
    assert all(k in out for k in reproductions.TARGETS)
    with pytest.raises(ValueError, match="valid: all"):
        reproductions.main(["nothing.like", "--scale", "smoke"])
    # a name close to one: the hint instead of the list (a typo, the case, a paper's name)
    with pytest.raises(ValueError, match=r"'sdgp.table7' \(did you mean 'sdgp.table1'\?\)$"):
        reproductions.main(["sdgp.table7", "--scale", "smoke"])
    with pytest.raises(ValueError, match=r"'SDGP.fig9' \(did you mean 'sdgp.fig9'\?\)"):
        reproductions.main(["SDGP.fig9", "--scale", "smoke"])
    with pytest.raises(ValueError, match=r"'clicktrain.fig99' \(did you mean 'clicktrain.fig9"):
        reproductions.main(["clicktrain.fig99", "--scale", "smoke"])
    with pytest.raises(ValueError, match=r"^unknown reproduction 'sdg'; valid: all, "):
        reproductions.main(["--list", "sdg"])  # a named list checks its names too
    with pytest.raises(ValueError, match="'all' runs every reproduction: name it alone"):
        reproductions.main(["sdgp.table1", "all", "--scale", "smoke"])
    with pytest.raises(ValueError, match="unknown reproduction"):
        reproductions.load_target("nope.table1")


def test_a_papers_name_stands_for_its_targets(tmp_path, monkeypatch, capsys):
    sdgp = ["sdgp.table1", "sdgp.fig8", "sdgp.fig9", "sdgp.fig10"]
    assert reproductions.resolve_targets(["sdgp.fig9", "sdgp"]) == sdgp  # once, in order
    assert reproductions.resolve_targets(["campfire.table2", "sdgp.table1"]) == [
        "sdgp.table1", "campfire.table2"]  # fmt: skip
    assert reproductions.resolve_targets(["all"]) == list(reproductions.TARGETS)
    # 'clicktrain' is close to 'clicktrain.fig9' by edit distance: it still means the paper
    clicktrain = [k for k in reproductions.TARGETS if k.startswith("clicktrain.")]
    assert len(clicktrain) == 9
    assert reproductions.resolve_targets(["clicktrain"]) == clicktrain
    assert reproductions.main(["--list", "sdgp"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert listed == sdgp
    ran = []
    monkeypatch.setattr(reproductions, "run", lambda keys, *a, **k: ran.append(keys) or "i")
    argv = ["sdgp", "--scale", "smoke", "--runs-root", str(tmp_path / "r"),
            "--out", str(tmp_path / "o")]  # fmt: skip
    assert reproductions.main(argv) == 0
    assert ran == [sdgp]


def test_reproduce_without_a_target_lists_them_and_exits_2(capsys):
    """No target and no --list is a usage error (argparse's exit 2), not a silent success."""
    with pytest.raises(SystemExit) as stop:
        reproductions.main([])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert all(k in err for k in reproductions.TARGETS)
    assert "error: name a target (PAPER.ITEM, listed above), a paper or all" in err


def test_an_unwritable_out_or_runs_root_is_refused_before_any_run(tmp_path, monkeypatch):
    afile = tmp_path / "afile"
    afile.write_text("")
    ran = []
    monkeypatch.setattr(reproductions, "run", lambda *a, **k: ran.append(a))
    for flag in ("--out", "--runs-root"):
        with pytest.raises(ValueError, match=f"^{flag} {afile}/x: {afile} is a file"):
            reproductions.main(["sdgp.table1", "--scale", "smoke", flag, str(afile / "x")])
    with pytest.raises(ValueError, match="--out .*is a file"):
        reproductions.demo("smoke", out=afile, runs_root=tmp_path / "runs")
    assert ran == []  # refused before any target ran


def test_a_broken_figure_is_listed_and_the_table_kept(tmp_path):
    def broken(results, scale, paper):
        raise KeyError("no such column")

    target = Target(
        key="cross.test", title="t", description="d",
        rows=lambda scale: [Row("m", measure="test_reproductions:counted_measure",
                                params={"x": 5}, metrics=("value",))],
        metrics=("value",), figures=broken, metric_units={"value": "u"},
    )  # fmt: skip
    result = run_target(target, "smoke", tmp_path, log=lambda *a: None)
    assert result.rows[0]["ours"] == 10.0 and result.rows[0]["unit"] == "u"
    assert result.rows[0]["n_of"] == "repeats"  # a measurement's n counts its repeats
    assert result.missing == [{"row": "figures", "reason": "failed: KeyError: 'no such column'"}]


def test_a_row_that_cannot_run_at_the_scale_is_listed_as_missing_with_its_reason(tmp_path):
    """A row that needs another scale runs nothing, yet the result lists it as missing with
    its reason beside the rows that did run."""
    target = Target(
        key="cross.test", title="t", description="d",
        rows=lambda scale: [
            Row("m", measure="test_reproductions:counted_measure", params={"x": 2},
                metrics=("value",)),
            Row("imagenet row", needs="needs the paper scale (ImageNet)", metrics=("value",)),
        ],
        metrics=("value",),
    )  # fmt: skip
    result = run_target(target, "smoke", tmp_path, log=lambda *a: None)
    assert result.missing == [{"row": "imagenet row", "reason": "needs the paper scale (ImageNet)"}]
    rows = {r["row"]: r for r in result.rows}
    assert rows["m"]["ours"] == 4.0 and rows["imagenet row"]["ours"] is None
    assert rows["imagenet row"]["note"] == "needs the paper scale (ImageNet)"


def test_run_keeps_going_past_a_failing_target(tmp_path, monkeypatch, capsys):
    def boom(scale):
        raise RuntimeError("boom")

    bad = Target(key="sdgp.table1", title="bad", description="d", rows=boom)
    monkeypatch.setattr(reproductions, "load_target", lambda key: bad)
    monkeypatch.setattr(reproductions, "expected_targets", lambda scale="cpu": [])
    index = reproductions.run(["sdgp.table1"], "smoke", tmp_path / "runs", tmp_path / "rep")
    assert "FAILED: RuntimeError: boom" in capsys.readouterr().out
    saved = json.loads((tmp_path / "runs/results/sdgp.table1/smoke/result.json").read_text())
    assert saved["missing"] == [{"row": "sdgp.table1", "reason": "failed: RuntimeError: boom"}]
    assert "failed: RuntimeError: boom" in (index.parent / "sdgp.html").read_text()
    # the command line renders all the same, names the failed target and exits 1
    argv = ["sdgp.table1", "--scale", "smoke", "--runs-root", str(tmp_path / "runs"),
            "--out", str(tmp_path / "rep"), "--no-progress"]  # fmt: skip
    assert reproductions.main(argv) == 1
    out = capsys.readouterr().out
    assert "1 target(s) failed: sdgp.table1 (see the report)" in out and "report: " in out
    assert reproductions.report_failures([]) == 0


def test_a_target_with_a_failed_row_makes_the_command_fail(tmp_path, monkeypatch, capsys):
    """One row failing must not stop the others, nor let the command exit 0 as if all ran."""
    failing = Row("bad option", "sdgp", options={"no_such_option": 1}, train=TINY)
    target = Target(key="sdgp.table1", title="t", description="d",
                    rows=lambda scale: [Row("dense", "dense", train=TINY), failing])  # fmt: skip
    monkeypatch.setattr(reproductions, "load_target", lambda key: target)
    monkeypatch.setattr(reproductions, "expected_targets", lambda scale="cpu": [])
    failed: list[str] = []
    reproductions.run(["sdgp.table1"], "smoke", tmp_path / "runs", tmp_path / "rep", jobs=1,
                      progress=False, failed=failed)  # fmt: skip
    assert failed == ["sdgp.table1 (1 row(s): bad option)"]
    assert "[sdgp.table1] 1 row(s) FAILED (see its page)" in capsys.readouterr().out
    assert reproductions.report_failures(failed) == 1


def test_a_killed_run_with_a_damaged_checkpoint_is_kept_aside_and_trained_again(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(common.time, "strftime", lambda fmt: "20261128-184421")  # one second
    row = Row("dense", "dense", train=TINY)
    cfg = row.configs("smoke", tmp_path)[0]
    first, _ = common.run_or_reuse(cfg)
    run_dir = Path(cfg.out)
    (run_dir / "summary.json").unlink()  # killed ...
    (run_dir / "checkpoint.pt").write_bytes(b"")  # ... while its disk failed
    capsys.readouterr()
    again, reused = common.run_or_reuse(cfg)
    assert not reused and again["top1"] == first["top1"]
    err = capsys.readouterr().err
    assert "it cannot be continued" in err and "the file is empty" in err
    (aside,) = run_dir.parent.glob(f"{run_dir.name}.stale-*")
    assert (aside / "checkpoint.pt").read_bytes() == b""  # kept as it was
    # a damaged metrics file (before its last line) likewise
    (run_dir / "summary.json").unlink()
    metrics = run_dir / "metrics.jsonl"
    metrics.write_text("{not json\n" + metrics.read_text())
    again, reused = common.run_or_reuse(cfg)
    assert not reused and again["top1"] == first["top1"]
    assert "line 1 of 2 is not JSON" in capsys.readouterr().err
    # both moved aside within one second: the second gets its own name
    assert (run_dir.parent / f"{run_dir.name}.stale-20261128-184421-2").is_dir()


def test_demo_runs_the_demo_targets_and_prints_the_index(tmp_path, monkeypatch, capsys):
    seen = {}

    def fake_run(keys, scale, runs_root, out, jobs=None, progress=True, failed=None, threads=None):
        seen.update(keys=keys, scale=scale, out=out, progress=progress)
        return tmp_path / "index.html"

    monkeypatch.setattr(reproductions, "run", fake_run)
    path = reproductions.demo("smoke", out=tmp_path)
    assert seen == {
        "keys": list(reproductions.DEMO_TARGETS), "scale": "smoke", "out": tmp_path,
        "progress": True,
    }  # fmt: skip
    reproductions.demo("smoke", out=tmp_path, progress=False)
    assert seen["progress"] is False
    assert seen["keys"] == list(reproductions.TARGETS)  # make demo is `reproduce all`
    assert "cross.methods" in seen["keys"] and path == tmp_path / "index.html"
    assert f"report: {(tmp_path / 'index.html').resolve()}" in capsys.readouterr().out


def test_prunetrain_options_map_the_paper_ratio_onto_the_short_runs():
    from reproductions.prunetrain import SHORT_RUN_RATIO, options

    assert options("paper", 0.2) == {"penalty_ratio": 0.2, "reconfig_interval": 10}
    assert options("paper", 0.25, "imagenet")["reconfig_interval"] == 5
    cpu = options("cpu", 0.2)
    assert cpu == {"penalty_ratio": 0.8, "threshold": 1e-2, "reconfig_interval": 1}
    assert options("gpu", 0.1)["penalty_ratio"] == 0.7
    ratios = [SHORT_RUN_RATIO[r] for r in sorted(SHORT_RUN_RATIO)]
    assert ratios == sorted(ratios) and all(0 < r < 1 for r in ratios)  # order kept, valid
    assert options("cpu", 0.2, dynamic_batch=True)["dynamic_batch"] is True
    with pytest.raises(ValueError, match="no cpu-scale ratio for the paper's 0.3"):
        options("cpu", 0.3)


def test_cpu_scale_tables_share_their_runs():
    """The dense baseline and each method's default row are one run across the tables."""
    from reproductions.parallel import plan_runs

    keys = ["clicktrain.table1", "sdgp.table1", "sdgp.fig10", "cross.methods"]
    plan = plan_runs([reproductions.load_target(k) for k in keys], "cpu", "runs")
    by_out = {p.out: p for p in plan}
    dense0 = [p for p in plan if p.config.method == "dense" and p.config.seed == 0]
    assert len(dense0) == 1 and set(dense0[0].targets) == {
        "clicktrain.table1",
        "sdgp.table1",
        "sdgp.fig10",
        "cross.methods",
    }
    sdgp24 = [p for p in by_out.values() if p.config.method == "sdgp" and p.config.seed == 0
              and p.config.method_options.get("prune_method") == "rescaled"
              and p.config.method_options.get("m") == 4]  # fmt: skip
    assert len(sdgp24) == 1 and {"sdgp.table1", "cross.methods"} <= set(sdgp24[0].targets)
    assert all(p.config.data_options == {"image_size": 16} for p in plan)


def test_a_method_scale_note_reaches_every_table_with_a_run_of_that_method(tmp_path, monkeypatch):
    from reproductions.prunetrain import ratio_label, short_run_note

    monkeypatch.setitem(common.METHOD_SCALE_NOTES, "dense", lambda scale: f"dense at {scale}")
    target = Target(key="sdgp.table1", title="t", description="d",
                    rows=lambda scale: [Row("dense", "dense", train=TINY)])  # fmt: skip
    result = run_target(target, "smoke", tmp_path, log=lambda *a: None)
    assert "dense at smoke" in result.notes
    # PruneTrain's: only where its settings differ from the paper's.
    assert short_run_note("smoke") is None and short_run_note("paper") is None
    assert "0.2 -> 0.8" in short_run_note("cpu") and "0.01" in short_run_note("cpu")
    assert common.METHOD_SCALE_NOTES["prunetrain"] is short_run_note
    assert ratio_label("cpu", 0.2) == "ratio 0.2, run at 0.8"
    assert ratio_label("paper", 0.2) == "ratio 0.2"


def _record(label, top1, metrics=None, baseline=None):
    row = Row(label, "dense", baseline=baseline, metrics=metrics)
    run = RunRecord(path=label, seed=0, summary={"top1": top1}, metrics=[], reused=True)
    return RowResult(row=row, runs=[run])


def test_figure_rows_leave_out_a_row_that_shows_other_metrics():
    results = [_record("a", 90.0), _record("b", 80.0, metrics=("top1",)),
               _record("a vs b", 70.0, metrics=("delta_top1",), baseline="b")]  # fmt: skip
    rows = common.figure_rows(results, "top1", "cpu")
    assert [(r["row"], r["top1"]) for r in rows] == [("a", 90.0), ("b", 80.0)]
    assert {r["source"] for r in rows} == {"ours (cpu)"}
    assert [r["row"] for r in common.figure_rows(results, "delta_top1", "cpu")] == ["a vs b"]


def test_the_papers_point_of_a_sweep_row_stands_at_the_rows_group():
    """A sweep figure places ours and the paper's number of a row at the row's group (its
    sparsity): the paper's 91.5 at 70% beside ours, not off the sweep's axis."""
    import pandas as pd

    paper = pd.DataFrame(
        [{"model": "m", "dataset": "d", "method": "sdgp", "setting": "70%", "metric": "top1",
          "value": 91.5, "source": "Fig. 8"}]
    )  # fmt: skip
    res = _record("sdgp 70%", 90.0)
    res.row.group = {"sparsity": 70}
    res.row.paper = {"method": "sdgp", "setting": "70%"}
    records = common.ours_vs_paper_records([res], "cpu", paper, "top1")
    assert sorted((r["source"], r["top1"], r["sparsity"]) for r in records) == [
        ("ours (cpu)", 90.0, 70),
        ("paper", 91.5, 70),
    ]


def test_a_bar_figure_puts_the_rows_across_and_tells_ours_from_the_papers_by_colour():
    import pandas as pd

    paper = pd.DataFrame(
        [{"model": "m", "dataset": "d", "method": "dense", "setting": "", "metric": "top1",
          "value": 70.0, "source": "Fig. 1"}]
    )  # fmt: skip
    res = _record("a", 90.0)
    res.row.paper = {"method": "dense"}
    (fig,) = common.bar_vs_paper("top1", "Top-1", "%")([res], "cpu", paper)
    assert (fig.kind, fig.x, fig.y, fig.hue) == ("bar", "row", "top1", "source")
    assert common.paper_figure_rows(paper, "top1", lambda p: p["method"]) == [
        {"row": "dense", "top1": 70.0, "source": "paper"}
    ]


def test_a_paper_figure_of_several_panels_draws_one_figure_each_in_the_papers_axes():
    import pandas as pd

    from impl.report.html import figure_scale
    from reproductions.clicktrain import fig11, fig14, fig15

    paper = pd.DataFrame(
        [{"model": "m", "dataset": "d", "method": "dense", "setting": "", "metric": "top1",
          "value": 70.0, "source": "Fig. 1"}]
    )  # fmt: skip
    results = [_record("a", 90.0), _record("b", 80.0)]
    results[0].row.paper = {"model": "m"}
    figs = common.panels_vs_paper(("top1", "Top-1", "%"), ("fwd_ms", "Forward", "ms"))(
        results, "cpu", paper
    )
    assert [(f.y, f.title, f.ylabel) for f in figs] == [("top1", "Top-1", "%"),
                                                        ("fwd_ms", "Forward", "ms")]  # fmt: skip
    assert sorted((r["row"], r["top1"], r["source"]) for r in figs[0].data) == [
        ("a", 70.0, "paper"), ("a", 90.0, "ours (cpu)"), ("b", 80.0, "ours (cpu)")]  # fmt: skip
    assert figs[0].caption == (  # ours and the paper's setups differ: the caption says so
        "Top-1; ours at scale cpu (ours: ResNet-20 on digits (16x16 px); the paper's: m on d)"
    )
    # a panel no run of ours fills: its numbers are the paper's, and it says so
    unrun = RowResult(row=results[0].row, error="needs the paper scale")
    only_paper = common.bar_vs_paper("top1", "Top-1", "%")([unrun], "cpu", paper)
    assert (
        only_paper[0].caption == "Top-1: the paper's numbers only (no result of ours at scale cpu)"
    )
    assert figure_scale(pd.DataFrame(only_paper[0].data), "cpu") == "paper"
    assert figure_scale(pd.DataFrame(figs[0].data), "cpu") == "cpu"
    # the papers' panels: Fig. 11 forward and backward apart, Fig. 14 total time and time
    # saved, Fig. 15 accuracy, compression and time
    panels = {m: [f.y for f in m.TARGET.figures([], "cpu", paper)] for m in (fig11, fig14, fig15)}
    assert panels == {
        fig11: ["fwd_ms", "bwd_ms"],
        fig14: ["train_hours", "train_hours_saved"],
        fig15: ["delta_top1", "compression_ratio", "wall_seconds"],
    }


def _curved(label, seed, values, key="test_top1", **group):
    row = Row(label, "dense", group=group)
    metrics = [{"epoch": e, key: v} for e, v in enumerate(values)]
    run = RunRecord(path=label, seed=seed, summary={}, metrics=metrics, reused=True)
    return RowResult(row=row, runs=[run])


def test_epoch_curves_count_epochs_from_one_and_leave_out_what_was_not_measured():
    results = [
        _curved("dense", 0, [50.0, 60.0]),
        _curved("ck", 1, [40.0, None, 70.0], mask="ck"),  # an epoch without evaluation
        RowResult(Row("failed"), error="needs the paper scale"),
        RowResult(Row("timed", measure_keys={"t": "t"}), measured={"t": [1.0]}),
    ]
    assert common.epoch_curves(results, "test_top1") == [
        {"row": "dense", "seed": 0, "epoch": 1, "test_top1": 50.0},
        {"row": "dense", "seed": 0, "epoch": 2, "test_top1": 60.0},
        {"row": "ck", "seed": 1, "epoch": 1, "test_top1": 40.0},
        {"row": "ck", "seed": 1, "epoch": 3, "test_top1": 70.0},
    ]
    only_ck = common.epoch_curves(results, "test_top1", rows=lambda r: r.group.get("mask") == "ck")
    assert {r["row"] for r in only_ck} == {"ck"}
    assert common.epoch_curves(results, "train_loss") == []


def test_curves_per_epoch_draw_ours_only_and_say_the_paper_prints_no_numbers():
    build = common.curves_per_epoch("test_top1", "Fig. 7: top-1", "top-1 (%)", "SDGP Fig. 7")
    one_seed = build([_curved("dense", 0, [50.0, 60.0])], "cpu", None)
    assert [(f.kind, f.x, f.y, f.hue) for f in one_seed] == [("line", "epoch", "test_top1", "row")]
    assert one_seed[0].caption.startswith("ours at scale cpu; SDGP Fig. 7 draws these curves")
    two = build([_curved("dense", 0, [50.0]), _curved("dense", 1, [52.0])], "cpu", None)
    assert "mean and sd over seeds" in two[0].caption
    assert build([RowResult(Row("x"), error="needs x")], "cpu", None) == []
    both = common.figures_of(build, common.bar_vs_paper("top1", "Top-1", "%"))
    assert [f.kind for f in both([_curved("dense", 0, [50.0])], "cpu", None)] == ["line", "bar"]


def test_the_papers_curve_figures_are_drawn_from_the_tables_runs():
    import pandas as pd

    from reproductions.campfire import table1 as cf1
    from reproductions.campfire import table2 as cf2
    from reproductions.sdgp import table1 as sd1

    def results(target, **metrics):
        out = []
        for row in target.rows("cpu"):
            epochs = [{"epoch": e, **{k: v + e for k, v in metrics.items()}} for e in range(3)]
            run = RunRecord(path=row.label, seed=0, summary={}, metrics=epochs, reused=True)
            out.append(RowResult(row=row, runs=[run]) if row.needs is None else
                       RowResult(row=row, error=row.needs))  # fmt: skip
        return out

    none = pd.DataFrame(columns=["model", "dataset", "method", "setting", "metric", "value"])
    sdgp = sd1.TARGET.figures(results(sd1.TARGET, train_loss=1.0, test_top1=50.0), "cpu", none)
    assert [f.y for f in sdgp if f.kind == "line"] == ["train_loss", "test_top1"]
    assert {r["row"] for r in sdgp[1].data} == {
        "dense", "SDGP random 2:4", "SDGP magnitude 2:4", "SDGP rescaled 2:4"}  # fmt: skip
    fig6 = [f for f in cf1.TARGET.figures(results(cf1.TARGET, test_top1=50.0), "cpu", none)
            if f.kind == "line"]  # fmt: skip
    assert [{r["row"] for r in f.data} for f in fig6] == [
        {"dense", "window, target 40%", "window, target 80%"},
        {"dense", "ck, target 40%", "ck, target 80%"},
    ]
    fig4 = [f for f in cf2.TARGET.figures(results(cf2.TARGET, test_top1=50.0,
                                                  true_sparsity=0.0), "cpu", none)
            if f.kind == "line"]  # fmt: skip
    assert [f.y for f in fig4] == ["test_top1", "true_sparsity", "test_top1"]
    assert {r["row"] for r in fig4[0].data} == {
        "dense", "ck, start 30, sparsity 70%", "combined, start 30, sparsity 70%",
        "window, start 30, sparsity 70%"}  # fmt: skip
    assert {r["row"] for r in fig4[2].data} == {
        "dense", "ck, start 40, sparsity 70%", "ck, start 30, sparsity 70%",
        "ck, start 20, sparsity 70%"}  # fmt: skip


def _figure_numbers(text: str) -> set[int]:
    """The figure numbers of "Fig. 1, 4, 6-7"."""
    out: set[int] = set()
    for part in text.removeprefix("Fig. ").split(","):
        low, _, high = part.strip().partition("-")
        out.update(range(int(low), int(high or low) + 1))
    return out


def test_every_figure_of_the_papers_has_a_target_or_says_where_it_is():
    from reproductions import TARGETS
    from reproductions.other_figures import other_figures

    # The figures of each paper's text (Campfire's holds no Fig. 9).
    papers = {"clicktrain": set(range(1, 16)), "prunetrain": set(range(1, 13)),
              "sdgp": set(range(1, 11)), "campfire": set(range(1, 12)) - {9}}  # fmt: skip
    rows = other_figures()
    assert all(set(r) == {"paper", "figure", "shows", "where"} and all(r.values()) for r in rows)
    for paper, figures in papers.items():
        targets = {int(k.partition(".fig")[2]) for k in TARGETS if k.startswith(f"{paper}.fig")}
        listed = [
            n
            for r in rows
            if r["paper"] == paper and r["figure"].startswith("Fig.")
            for n in _figure_numbers(r["figure"])
        ]
        assert len(listed) == len(set(listed)), paper  # none listed twice
        assert not targets & set(listed), paper  # a target's figure is not listed again
        assert targets | set(listed) == figures, paper
    # the one table of the four papers without a target: Campfire's table of words
    tables = {(r["paper"], r["figure"]) for r in rows if r["figure"].startswith("Table")}
    assert tables == {("campfire", "Table 7")} and "campfire.table7" not in TARGETS


def test_a_reproductions_index_lists_the_other_figures_and_a_plain_one_does_not(tmp_path):
    from impl.report.results import ResultSet, save_result

    save_result(ResultSet(target="sdgp.table1", title="SDGP Table I", scale="smoke", rows=[]),
                common.result_dir("sdgp.table1", "smoke", tmp_path / "runs"))  # fmt: skip
    expected = reproductions.expected_targets("smoke")
    with_targets = common.render(tmp_path / "runs", tmp_path / "a", expected=expected)
    text = with_targets.read_text()
    assert "no one-time selection variant" in text and "drawn under Table 1" in text
    plain = common.render(tmp_path / "runs", tmp_path / "b").read_text()
    assert "no one-time selection variant" not in plain


def test_the_other_figures_point_at_targets_and_paper_values_that_exist():
    from reproductions import TARGETS
    from reproductions.other_figures import other_figures

    rows = other_figures()
    named = [k for r in rows for k in re.findall(r"\((\w+\.\w+)\)", r["where"])]
    assert named and all(k in TARGETS for k in named)
    # "Table 2 (campfire.table2)": the table named in words is the target's
    roman = {"I": "1", "II": "2", "III": "3"}
    for r in rows:
        for number, paper, key in re.findall(r"Table (\w+) \((\w+)\.table(\d+)\)", r["where"]):
            assert (roman.get(number, number), paper) == (key, r["paper"]), r
    for r in rows:
        for csv in re.findall(r"paper_values/(\w+\.csv)", r["where"]):
            assert (Path(reproductions.__file__).parent / "paper_values" / csv).is_file()
    # ClickTrain Fig. 8: dynamic patterns 2 points above one-time selection (Sec. 4.3)
    fig8 = next(r for r in rows if (r["paper"], r["figure"]) == ("clicktrain", "Fig. 8"))
    gain = paper_values("clicktrain", "fig8")["value"].iloc[0]
    assert f"+{gain:g} points on CIFAR-10, Sec. 4.3" in fig8["shows"]
    assert "paper_values/clicktrain_fig8.csv" in fig8["where"]
    rows[0]["where"] = "changed"  # a copy: the module's rows stay as they are
    assert other_figures()[0]["where"] != "changed"


def test_a_change_figure_draws_the_papers_change_derived_from_its_top1s_and_names_setups():
    import pandas as pd

    paper = pd.DataFrame(
        [{"model": "resnet50", "dataset": "imagenet", "method": m, "setting": "", "metric": "top1",
          "value": v, "source": "Table 1"} for m, v in (("dense", 76.0), ("sdgp", 75.0))]
    )  # fmt: skip
    cfg = {"model": "resnet20", "data": "digits"}

    def res(label, method, top1, baseline=None):
        run = RunRecord(path=label, seed=0, summary={"top1": top1}, metrics=[], reused=True,
                        config=cfg)  # fmt: skip
        return RowResult(Row(label, method, baseline=baseline, paper={"method": method},
                             metrics=("top1",) if baseline is None else None),
                         runs=[run])  # fmt: skip

    results = [res("dense", "dense", 99.0), res("sdgp", "sdgp", 98.5, baseline="dense")]
    fig = common.bar_vs_paper("delta_top1", "Top-1 change", "pp")(results, "cpu", paper)[0]
    assert sorted((r["row"], r["source"], r["delta_top1"]) for r in fig.data) == [
        ("sdgp", "ours (cpu)", -0.5), ("sdgp", "paper", -1.0)]  # fmt: skip
    assert fig.caption == (
        "Top-1 change; ours at scale cpu (ours: ResNet-20 on digits; the paper's: ResNet-50 on "
        "ImageNet)"
    )
    assert common.setup_caption(results, "cpu", paper) in fig.caption
    # the rule both the table and the figure read the paper's number by
    none = paper.iloc[0:0]
    assert common.paper_number(paper, none, "delta_top1", results[1].row, results[0]) == (
        -1.0, "Table 1 (derived: 75 - 76)")  # fmt: skip
    assert common.paper_number(paper, none, "delta_top1", results[1].row, None) == (None, "")
    one = paper.iloc[1:2]
    assert common.paper_number(paper, one, "top1", results[1].row, results[0]) == (75.0, "Table 1")
    assert common.paper_number(paper, paper, "top1", results[1].row, None) == (None, "Table 1")
    same = [dataclasses.replace(r, runs=[dataclasses.replace(r.runs[0], config={
        "model": "resnet50", "data": "imagenet"})]) for r in results]  # fmt: skip
    assert common.setup_caption(same, "cpu", paper) == ""


def test_a_published_change_is_read_as_printed_and_several_setups_are_not_named_as_one():
    """Where the paper prints the change itself, that number stands beside ours, not one
    derived from its two top-1s; a figure whose rows compare several pairs of setups says
    they differ by row rather than naming one pair."""
    import pandas as pd

    paper = pd.DataFrame(
        [{"model": "resnet50", "dataset": "imagenet", "method": m, "setting": "", "metric": k,
          "value": v, "source": "Table 1"}
         for m, k, v in (("dense", "top1", 76.0), ("sdgp", "top1", 75.0),
                         ("sdgp", "delta_top1", -1.3))]
    )  # fmt: skip

    def res(label, method, model, baseline=None):
        run = RunRecord(path=label, seed=0, summary={"top1": 90.0}, metrics=[], reused=True,
                        config={"model": model, "data": "digits"})  # fmt: skip
        return RowResult(Row(label, method, baseline=baseline, paper={"method": method}),
                         runs=[run])  # fmt: skip

    dense, sdgp = res("dense", "dense", "resnet20"), res("sdgp", "sdgp", "resnet32", "dense")
    printed = common.lookup(paper, metric="delta_top1", method="sdgp")
    assert common.paper_number(paper, printed, "delta_top1", sdgp.row, dense) == (-1.3, "Table 1")
    assert common.setup_caption([dense, sdgp], "cpu", paper) == (
        "ours and the paper's models or data differ by row (see the table)"
    )
    assert common.setup_caption([dense], "cpu", paper) == (
        "ours: ResNet-20 on digits; the paper's: ResNet-50 on ImageNet"
    )


def test_a_description_says_what_each_scale_runs():
    from reproductions.clicktrain import fig10

    doc = "What the paper\nshows.\n\nA choice.\n\nScales: smoke a\n  tiny one; cpu 3136.\n"
    assert common.described(doc) == "What the paper shows. Scales: smoke a tiny one; cpu 3136."
    assert common.described("Only this.\n\nMore.") == "Only this."
    assert "3136 columns" in fig10.TARGET.description  # the cpu run's shape, not the paper's


def test_clicktrain_fig13_draws_the_papers_times_then_the_saving():
    import pandas as pd

    from reproductions.clicktrain import fig13

    measured = {"comm_time_saved_4": [20.0], "comm_ms_dense_4": [10.0],
                "comm_ms_clicktrain_4": [8.0], "comm_time_saved_8": [25.0],
                "comm_ms_dense_8": [12.0], "comm_ms_clicktrain_8": [9.0]}  # fmt: skip
    results = [RowResult(row=Row(f"p{g}", measure="x:y", group={"gpus": g}), measured=measured)
               for g in (4, 8)]  # fmt: skip
    paper = pd.DataFrame([{"model": "resnet50", "setting": "4 GPUs", "value": 23.9}])
    times, saved = fig13.figures(results, "cpu", paper)
    assert (times.x, times.y, saved.y) == ("gpus", "ms", "saved")
    assert sorted((d["gpus"], d["source"], d["ms"]) for d in times.data) == [
        (4, "ClickTrain, ours, projected (cpu)", 8.0), (4, "dense, ours, projected (cpu)", 10.0),
        (8, "ClickTrain, ours, projected (cpu)", 9.0),
        (8, "dense, ours, projected (cpu)", 12.0)]  # fmt: skip
    assert {(d["gpus"], d["saved"]) for d in saved.data} == {(4, 20.0), (8, 25.0), (4, 23.9)}
    # the run the projection starts from names its model: not the paper's ResNet-50 at cpu
    run = RunRecord(path="ct", seed=0, summary={}, metrics=[], reused=True,
                    config={"model": "resnet20", "data": "digits"})  # fmt: skip
    trained = RowResult(row=Row("clicktrain", "clicktrain"), runs=[run])
    _, saved = fig13.figures([trained, *results], "cpu", paper)
    assert {d["source"] for d in saved.data} == {
        "ours, ResNet-20 on digits, projected (cpu)", "paper resnet50"}  # fmt: skip


def test_clicktrain_fig13_projects_each_clicktrain_run_on_4_8_and_16_gpus():
    from reproductions.clicktrain import fig13

    # paper scale: ImageNet ClickTrain runs of the three models Fig. 13 plots, each projected
    # on every GPU count the paper measured
    rows = fig13.rows("paper")
    runs = {r.label: r for r in rows if r.method == "clicktrain"}
    assert {r.train["data"] for r in runs.values()} == {"imagenet"}
    projected = {(r.paper["model"], r.paper["setting"]) for r in rows if r.measure}
    published = {(p["model"], p["setting"]) for p in
                 paper_values("clicktrain", "fig13").to_dict("records")}  # fmt: skip
    assert projected == published and len(projected) == 9
    for r in rows:
        if r.measure:
            g = r.group["gpus"]
            assert r.params["row"] in runs and r.params["row"].startswith(r.paper["model"] + " ")
            assert r.measure_keys == {"comm_time_saved": f"comm_time_saved_{g}"}
    # below it, the scale's run stands for the paper's ResNet-50, and the labels say so
    cpu = fig13.rows("cpu")
    assert [r.label for r in cpu if r.measure] == [
        "projection, 4 GPUs (paper: resnet50)",
        "projection, 8 GPUs (paper: resnet50)",
        "projection, 16 GPUs (paper: resnet50)",
    ]
    (run,) = [r for r in cpu if not r.measure]
    assert run.method == "clicktrain" and "higher compression" in run.label
    assert run.metrics == ("compression_ratio",) and not run.paper and run.baseline is None


def test_clicktrain_fig13_projects_the_kept_gradients_of_the_pruned_convs_only(
    tmp_path, monkeypatch
):
    import impl.train
    from impl.comm_model import hierarchical_ring_allreduce
    from reproductions.clicktrain import kernels

    net = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3, bias=False), torch.nn.Linear(2, 2))
    with torch.no_grad():
        net[0].weight.zero_()
        net[0].weight.view(-1)[:8] = 1.0  # 8 of the pruned conv's 18 weights kept
        net[1].weight.view(-1)[:1] = 0.0  # a zero in a layer not pruned is still sent
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps({"clicktrain": {"pruned_layers": ["0"]}}))
    monkeypatch.setattr(impl.train, "load_trained_model", lambda path: (net, None))
    got = kernels.comm_projection(scale="cpu", context={"runs": {"ct": [str(run)]}}, row="ct",
                                  gpus=(4, 16))  # fmt: skip
    # float32: dense 18 + 4 + 2 weights, the pattern Allreduce 8 + 4 + 2
    assert got["dense_bytes_per_iter"] == 96 and got["pattern_bytes_per_iter"] == 56
    assert got["bytes_saved"] == pytest.approx(100 * (1 - 56 / 96))
    for g in (4, 16):
        dense, pattern = (hierarchical_ring_allreduce(b, g).seconds for b in (96, 56))
        assert got[f"comm_ms_dense_{g}"] == [pytest.approx(1e3 * dense)]
        assert got[f"comm_ms_clicktrain_{g}"] == [pytest.approx(1e3 * pattern)]
        assert got[f"comm_time_saved_{g}"] == [pytest.approx(100 * (1 - pattern / dense))]
    assert "comm_time_saved_8" not in got
    assert got["device"] == "model (impl.comm_model), not measured"  # Fig. 13 is projected
    with pytest.raises(ValueError, match="no finished run"):
        kernels.comm_projection(scale="cpu", context={"runs": {}}, row="ct")


def test_prunetrain_fig9_draws_the_memory_of_an_iteration_then_the_batch():
    import pandas as pd

    from reproductions.prunetrain import fig9

    mib = 2**20
    metrics = [{"epoch": e, "batch_size": 32, "next_batch_size": b,
                "iteration_memory_bytes": m * mib, "memory_budget_bytes": 10 * mib}
               for e, (b, m) in enumerate([(32, 10), (64, 7), (64, 9)])]  # fmt: skip
    run = RunRecord(path="p", seed=3, summary={}, metrics=metrics, reused=True,
                    config={"batch_size": 32, "epochs": 4})  # fmt: skip
    res = RowResult(row=Row("PruneTrain, dynamic mini-batch"), runs=[run])
    paper = pd.DataFrame(
        [
            {"dataset": "cifar100", "setting": "from epoch 91", "value": 256.0},
            {"dataset": "cifar100", "setting": "from epoch 0", "value": 128.0},
            {"dataset": "imagenet", "setting": "from epoch 30", "value": 128.0},
        ]
    )
    memory, batch = fig9.figures([res], "cpu", paper)
    assert (memory.y, batch.y) == ("mib", "batch_size")
    assert batch.steps and not memory.steps  # the batch changes in steps
    assert memory.y_from_zero and not batch.y_from_zero  # a memory drop is not magnified
    # both runs span the same axis: the share of their epochs (ours 4, the paper's 182)
    # each schedule's last batch is held to the end of training (100%): the paper's line
    # stopped at epoch 91 of 182, ours at the start of its last epoch
    # (the paper's points in the order of its schedule, only its last batch held to 100%)
    assert [d["training_pct"] for d in batch.data] == [0.0, 25.0, 50.0, 100.0, 0.0, 50.0, 100.0]
    assert [d["source"] for d in batch.data[-3:]] == ["paper (CIFAR-100)"] * 3
    # epochs counted from 1, as on every epoch axis of the reports (the metrics' from 0)
    assert [(d["epoch"], d["mib"]) for d in memory.data if d["source"].startswith("ours")] == [
        (1, 10.0), (2, 7.0), (3, 9.0)]  # fmt: skip
    assert {d["mib"] for d in memory.data if d["source"] == "budget (cpu), seed 3"} == {10.0}
    assert [d["batch_size"] for d in batch.data] == [32.0, 32.0, 64.0, 64.0, 128.0, 256.0, 256.0]
    # the budget drawn dashed, apart from ours where they coincide
    assert memory.style == "series"
    assert {d["series"] for d in memory.data} == {"ours", "budget"}


def test_prunetrain_fig2_draws_the_one_time_overhead_per_epoch():
    from reproductions.prunetrain import fig2

    # dense 10 per sample; PruneTrain's model costs 8, 6, 5 after epochs 0, 1, 2
    metrics = [{"epoch": e, "train_flops_per_sample": c} for e, c in enumerate([8.0, 6.0, 5.0])]
    pt = RunRecord(path="p", seed=0, summary={}, metrics=metrics, reused=True)
    dense = RunRecord(path="d", seed=0, summary={"train_flops_nominal": 10.0}, metrics=[],
                      reused=True)  # fmt: skip
    periodic = 10.0 + 8.0 + 6.0  # each epoch at the cost after the previous one
    once = [10 + 2 * 8.0, 20 + 6.0, 30.0]  # once after epoch 0, 1, 2
    want = [100 * (o / periodic - 1) for o in once]
    assert fig2.one_time_overheads(pt, 10.0) == pytest.approx(want)
    assert fig2.one_time_extra(pt, dense) == pytest.approx(min(want))
    results = [
        RowResult(row=Row("dense", "dense"), runs=[dense]),
        RowResult(row=Row("pt", "prunetrain", group={"ratio": 0.2}), runs=[pt]),
    ]
    flops, overhead = fig2.figures(results, "cpu", None)
    assert (flops.y, overhead.y) == ("flops", "extra")
    assert [d["epoch"] for d in overhead.data] == [1, 2, 3]
    assert [d["extra"] for d in overhead.data] == pytest.approx(want)
    # (a) the cost each epoch trained at: dense in epoch 1, then what the previous epoch's
    # reconfiguration left; the model after the last epoch's was never trained
    assert [(d["epoch"], d["flops"]) for d in flops.data] == [(1, 1.0), (2, 0.8), (3, 0.6)]
    assert flops.y_from_zero


def test_a_dynamic_batch_row_whose_batch_never_grew_says_so():
    from impl.report.html import glance_frame
    from impl.report.results import ResultSet
    from reproductions import claims
    from reproductions.common import compare_rows
    from reproductions.prunetrain import unchanged_batch_flag, unchanged_batch_note

    def result(label: str, nexts: list[int]) -> RowResult:
        metrics = [
            {"epoch": e, "batch_size": 32, "next_batch_size": b} for e, b in enumerate(nexts)
        ]
        run = RunRecord(path="p", seed=0, summary={}, metrics=metrics, reused=True,
                        config={"batch_size": 32})  # fmt: skip
        return RowResult(row=Row(label), runs=[run])

    fixed = result("PruneTrain, dynamic mini-batch", [32, 32, 32])
    assert unchanged_batch_note(fixed) == (
        "the batch of 32 never grew in this run: it trained as a fixed-batch run"
    )
    assert unchanged_batch_note(result("PruneTrain, dynamic mini-batch", [32, 64, 64])) == ""
    assert unchanged_batch_note(result("PruneTrain (ratio 0.2)", [32, 32, 32])) == ""
    # every target with a dynamic mini-batch row says so of it
    for key in ("prunetrain.table4", "prunetrain.fig9", "prunetrain.fig11"):
        target = reproductions.load_target(key)
        assert any("dynamic" in r.label for r in target.rows("cpu")), key
        assert target.row_note is unchanged_batch_note, key
        assert target.row_flag is unchanged_batch_flag, key
    # and beside its label where the note is not shown: at a glance, and in the claim
    # (Table 4 showed "dynamic mini-batch" beside "naive" as if the two runs differed)
    assert unchanged_batch_flag(fixed) == "batch never grew"
    assert unchanged_batch_flag(result("PruneTrain, dynamic mini-batch", [32, 64, 64])) == ""
    target = Target(key="prunetrain.table4", title="t", description="d",
                    rows=lambda scale: [fixed.row], metrics=("m", "k"),
                    extra_metrics={"m": ("", lambda run, base: 1.0),
                                   "k": ("", lambda run, base: 2.0)},
                    row_flag=unchanged_batch_flag)  # fmt: skip
    rows = [r for r in compare_rows(target, [fixed], "cpu") if r["row"] == fixed.row.label]
    assert [r.get("row_flag") for r in rows] == ["batch never grew"] * 2
    plain = [{**r, "row": "PruneTrain, naive"} for r in rows if r.pop("row_flag")]
    ours = [r for r in compare_rows(target, [fixed], "cpu") if r["row"] == fixed.row.label]
    glance = glance_frame([*plain, *ours])
    assert list(glance["Row"]) == [
        "PruneTrain, naive",
        "PruneTrain, dynamic mini-batch (batch never grew)",
    ]
    label = claims._prunetrain_dynamic_row("cpu")
    fig11 = ResultSet(target="prunetrain.fig11", title="t", scale="cpu", rows=[
        {"row": label, "metric": "comm_cost_saved", "ours": 3.4, "ours_sd": 1.3, "n": 5,
         "scale": "cpu", "row_flag": "batch never grew"}])  # fmt: skip
    (row,) = [r for r in claims.evaluate({"prunetrain.fig11": fig11}, "cpu")
              if "55% less" in r["row"]]  # fmt: skip
    assert row["ours_setting"].endswith(f"{label}: batch never grew")


def test_prunetrain_bn_cost_in_fig8_and_table1():
    from reproductions.prunetrain import bn_cost_pct, bn_traffic_saved, fig8

    costs = {"inference_flops": 5e6, "paper_train_flops_pct_of_dense": 70.0}
    pt = RunRecord(path="p", seed=1, summary={"method": "prunetrain", "top1": 80.0, **costs,
                   "bn_traffic_pct_of_dense": 64.0}, metrics=[], reused=True)  # fmt: skip
    old = RunRecord(
        path="o",
        seed=2,
        summary={"method": "prunetrain", "top1": 81.0, **costs},
        metrics=[],
        reused=True,
    )  # saved before the BN cost was written
    dense = RunRecord(path="d", seed=0, summary={"method": "dense", "top1": 90.0,
                      "inference_flops": 9e6}, metrics=[], reused=True)  # fmt: skip
    assert (bn_cost_pct(pt), bn_cost_pct(dense), bn_cost_pct(old)) == (64.0, 100.0, None)
    assert (bn_traffic_saved(pt), bn_traffic_saved(dense), bn_traffic_saved(old)) == (
        36.0, 0.0, None)  # fmt: skip
    results = [
        RowResult(row=Row("dense", "dense", group={"ratio": "dense"}), runs=[dense]),
        RowResult(row=Row("pt", "prunetrain", group={"ratio": "0.2"}), runs=[pt, old]),
    ]
    for r in results:
        r.table = fig8.TARGET.metric_table
    *_, bn = fig8.figures(results, "cpu", None)
    assert (bn.x, bn.y) == ("bn_cost", "top1")
    assert sorted((d["row"], d["bn_cost"], d["top1"]) for d in bn.data) == [
        ("dense", 100.0, 90.0), ("pt", 64.0, 80.0)]  # fmt: skip


def test_prunetrain_fig8_panels_pair_each_runs_cost_with_its_own_top1():
    from reproductions.prunetrain import fig8

    def run(seed, top1, **summary):
        return RunRecord(path=f"p{seed}", seed=seed, summary={"method": "prunetrain",
                         "top1": top1, **summary}, metrics=[], reused=True)  # fmt: skip

    dense = RunRecord(path="d", seed=0, summary={"method": "dense", "top1": 90.0,
                      "inference_flops": 9e6}, metrics=[], reused=True)  # fmt: skip
    pt = [
        run(1, 80.0, inference_flops=5e6),  # saved before its training FLOPs were written
        run(2, 81.0, inference_flops=6e6, paper_train_flops_pct_of_dense=70.0),
        run(3, 82.0, paper_train_flops_pct_of_dense=60.0),  # no inference FLOPs
    ]
    results = [
        RowResult(row=Row("dense", "dense", group={"ratio": "dense"}), runs=[dense]),
        RowResult(row=Row("pt", "prunetrain", group={"ratio": "0.2"}), runs=pt),
    ]
    for r in results:
        r.table = fig8.TARGET.metric_table
    inference, training, _ = fig8.figures(results, "cpu", None)
    drawn = sorted((d["row"], d["ratio"], d["inference_mflops"], d["top1"]) for d in inference.data)
    assert drawn == [("dense", "dense", 9.0, 90.0), ("pt", "0.2", 5.0, 80.0),
                     ("pt", "0.2", 6.0, 81.0)]  # fmt: skip
    assert sorted((d["row"], d["train_flops"], d["top1"]) for d in training.data) == [
        ("dense", 100.0, 90.0), ("pt", 60.0, 82.0), ("pt", 70.0, 81.0)]  # fmt: skip
    assert {d["source"] for d in inference.data + training.data} == {"ours (cpu)"}


def test_prunetrain_fig10_pairs_inference_flops_with_the_same_seeds_top1():
    from reproductions.prunetrain import fig10

    def run(seed, method, top1, **summary):
        return RunRecord(path=f"{method}{seed}", seed=seed, summary={"method": method,
                         "top1": top1, **summary}, metrics=[], reused=True)  # fmt: skip

    dense = [run(s, "dense", 90.0 + s, inference_flops=8e6) for s in (0, 1)]
    pt = [run(0, "prunetrain", 70.0), run(1, "prunetrain", 71.0, inference_flops=2e6)]
    results = [
        RowResult(row=Row("dense", "dense", baseline="dense"), runs=dense),
        RowResult(
            row=Row(
                "PruneTrain, interval 2", "prunetrain", baseline="dense", group={"interval": 2}
            ),
            runs=pt,
        ),  # fmt: skip
    ]
    (spec,) = fig10.figures(results, "cpu", None)
    assert (spec.x, spec.y) == ("inference_flops", "top1")
    drawn = sorted((d["row"], d["inference_flops"], d["top1"]) for d in spec.data)
    assert drawn == [("PruneTrain, interval 2", 25.0, 71.0), ("dense", 100.0, 90.0),
                     ("dense", 100.0, 91.0)]  # fmt: skip
    (point,) = [d for d in spec.data if d["row"] != "dense"]
    assert point["interval"] == 2


def test_figure_points_needs_every_metric_from_one_run():
    def res(label, runs, **kw):
        return RowResult(row=Row(label, "dense", **kw), runs=runs)

    a = RunRecord(path="a", seed=0, summary={"top1": 50.0, "inference_flops": 4.0},
                  metrics=[], reused=True)  # fmt: skip
    b = RunRecord(path="b", seed=1, summary={"top1": 60.0}, metrics=[], reused=True)
    listed = res("listed", [a], metrics=("top1",))  # lists top1 only: not drawn
    measured = RowResult(row=Row("m", measure="x:y"), measured={"top1": 1.0})
    table = {"top1": ("%", lambda r, _: r.summary["top1"]),
             "flops": ("FLOPs", lambda r, _: r.summary.get("inference_flops"))}  # fmt: skip
    points = common.figure_points([res("r", [a, b]), listed, measured], ("flops", "top1"),
                                  "gpu", table=table)  # fmt: skip
    assert points == [{"row": "r", "flops": 4.0, "top1": 50.0, "source": "ours (gpu)"}]
    with pytest.raises(ValueError, match="unknown metric 'nope'"):
        common.figure_points([res("r", [a])], ("nope",), "cpu", table=table)


def test_figure_points_take_each_runs_change_against_the_baseline_run_of_its_seed():
    """A pruned run's top-1 change is against the dense run of the same seed (89 - 90 and
    81 - 80), never another seed's; a seed the baseline lacks gives no point."""

    def run(seed, top1):
        return RunRecord(path=f"r{seed}", seed=seed, summary={"top1": top1}, metrics=[],
                         reused=True)  # fmt: skip

    dense = RowResult(row=Row("dense"), runs=[run(0, 90.0), run(1, 80.0)])
    pruned = RowResult(row=Row("pruned", "sdgp", baseline="dense"),
                       runs=[run(0, 89.0), run(1, 81.0), run(2, 70.0)])  # fmt: skip
    points = common.figure_points([dense, pruned], ("delta_top1", "top1"), "cpu")
    assert [(p["row"], p["top1"], p["delta_top1"]) for p in points] == [
        ("pruned", 89.0, -1.0),
        ("pruned", 81.0, 1.0),
    ]


def test_sdgp_fig9_draws_no_data_gradient_for_the_first_conv():
    from reproductions.sdgp.fig9 import figures

    layers = [{"name": "conv1", "fwd_ms": 1.0, "dgrad_ms": 9.0, "wgrad_ms": 2.0,
               "data_grad_needed": False},
              {"name": "layer1.0.conv1", "fwd_ms": 1.5, "dgrad_ms": 1.6, "wgrad_ms": 1.7,
               "data_grad_needed": True}]  # fmt: skip
    res = RowResult(row=Row("m", measure="x:y"), measured={"layers": layers, "shape": "s"})
    (fig,) = figures([res], "cpu", None)
    drawn = {(d["layer"], d["pass"]): d["ms"] for d in fig.data}
    assert ("conv1", "data gradient") not in drawn and drawn[("conv1", "forward")] == 1.0
    assert drawn[("layer1.0.conv1", "data gradient")] == 1.6 and len(drawn) == 5


def test_the_pattern_spmm_beats_dense_only_when_faster_than_gemm_and_convolution():
    from reproductions.clicktrain.kernels import pattern_beats_dense

    def times(gemm, conv, pattern):
        return {("dense GEMM", 75.0): gemm, ("dense conv", 75.0): conv,
                ("pattern SpMM", 75.0): pattern}  # fmt: skip

    assert pattern_beats_dense(times(2.0, 3.0, 1.0), 75.0)
    assert not pattern_beats_dense(times(2.0, 0.5, 1.0), 75.0)  # cuDNN's Winograd, say
    assert not pattern_beats_dense(times(0.5, 3.0, 1.0), 75.0)
    assert not pattern_beats_dense(times(1.0, 1.0, 1.0), 75.0)


def test_the_pattern_spmm_passes_the_papers_test_only_winning_at_every_sparsity_above_65():
    from reproductions.clicktrain.kernels import wins_above

    grid = [55.9, 64.9, 75.0, 85.1, 89.9]
    wins = {75.0, 85.1, 89.9}  # from 75% on, as Sec. 5.2 says it should
    times = {}
    for sp in grid:
        times[("dense GEMM", sp)], times[("dense conv", sp)] = 2.0, 3.0
        times[("pattern SpMM", sp)] = 1.0 if sp in wins else 5.0
    assert wins_above(times, grid) == 1.0  # no win at 64.9 asked for: it is not above 65
    times[("pattern SpMM", 85.1)] = 9.0
    assert wins_above(times, grid) == 0.0  # a loss at one point above 65% fails the sweep
    assert wins_above(times, grid, bound=85.1) == 1.0  # only 89.9 lies above 85.1
    assert math.isnan(wins_above(times, [55.9, 64.9]))  # nothing swept above 65%


def test_figs_9_and_10_pattern_masks_keep_equal_kernels_per_filter_of_4_of_9_patterns():
    from reproductions.clicktrain.kernels import pattern_mask

    # 75% asked of 18 channels: round(0.25 * 9 * 18 / 4) = 10 kernels kept per filter,
    # 40 of each filter's 162 weights
    mask = pattern_mask(8, 18, 0.75)
    assert mask.shape == (8, 18, 3, 3) and mask.dtype == torch.bool
    per_kernel = mask.flatten(2).sum(dim=2)
    assert set(per_kernel.unique().tolist()) == {0, 4}
    assert (per_kernel > 0).sum(dim=1).tolist() == [10] * 8
    assert float(1 - mask.float().mean()) == pytest.approx(1 - 40 / 162)
    assert len({tuple(k.tolist()) for k in mask.flatten(2)[per_kernel > 0]}) <= 12
    # 90% of 128 channels (Fig. 10's highest): round(0.1 * 9 * 128 / 4) = 29 kernels
    assert (pattern_mask(2, 128, 0.9).flatten(2).any(dim=2).sum(dim=1) == 29).all()
    with pytest.raises(ValueError, match="sparsity in"):
        pattern_mask(2, 9, 0.5)  # a 4-of-9 kernel alone is 5/9 sparse


def test_figs_9_and_10_time_the_papers_filter_matrix_and_read_the_speedup_near_75_percent():
    from reproductions.clicktrain.kernels import (
        PAPER_SHAPE,
        SCALE_SHAPES,
        filter_matrix,
        pattern_beats_dense,
        spmm_sweep,
    )

    # Sec. 5.1: 256 filters of 128 channels, 3x3 (256 x 1152) times a 224 x 224 map's im2col;
    # cpu the same filters times a 56 x 56 map, smoke 32 x 144 times a 28 x 28 one
    assert PAPER_SHAPE == {"filters": 256, "channels": 128, "columns": 224 * 224}
    assert SCALE_SHAPES["gpu"] == SCALE_SHAPES["paper"] == PAPER_SHAPE
    assert SCALE_SHAPES["cpu"] == {"filters": 256, "channels": 128, "columns": 56 * 56}
    assert filter_matrix(PAPER_SHAPE) == "256x1152"
    assert filter_matrix(SCALE_SHAPES["smoke"]) == "32x144"
    spmm = spmm_sweep(scale="smoke", context={}, sparsities=(0.6, 0.75, 0.9), repeats=1)
    assert spmm["shape"] == "32x144 times 144x784"
    # 16 channels at 75%: 9 kernels of 4 weights kept of 144 weights a filter, 75.0% exactly
    assert spmm["speedup_sparsity"] == 75.0
    at = {(p["impl"], p["sparsity"]): p["time_ms"] for p in spmm["points"]}
    beaten = [sp for sp in sorted({p["sparsity"] for p in spmm["points"]})
              if pattern_beats_dense(at, sp)]  # fmt: skip
    pooled = spmm["crossover_sparsity_pooled"]
    assert pooled == beaten[0] if beaten else math.isnan(pooled)


def test_speed_measurements_give_one_headline_value_per_sweep():
    from reproductions.clicktrain.kernels import csr_conversion, spmm_sweep
    from reproductions.sdgp.measure import conv_times

    csr = csr_conversion(scale="smoke", context={}, repeats=3, sweeps=3)
    assert len(csr["speedup_vs_cusparse"]) == 3 and csr["sweeps"] == 3
    assert all(x > 0 for x in csr["speedup_vs_cusparse"])
    # the times too, one per sweep (a sweep's median): the page shows their n and spread,
    # and each sweep's speedup is the ratio of its two times
    assert len(csr["conversion_time"]) == len(csr["pattern_conversion_time"]) == 3
    ratios = [g / o for g, o in zip(csr["conversion_time"], csr["pattern_conversion_time"])]
    assert ratios == pytest.approx(csr["speedup_vs_cusparse"])

    spmm = spmm_sweep(scale="smoke", context={}, sparsities=(0.6, 0.75), repeats=2, sweeps=2)
    assert len(spmm["speedup_vs_cusparse"]) == 2 and spmm["speedup_sparsity"] > 70
    assert len(spmm["points"]) == 2 * 4  # one pooled median per (sparsity, implementation)
    assert {p["impl"] for p in spmm["points"]} == {
        "dense GEMM",
        "dense conv",
        "generic CSR SpMM",
        "pattern SpMM",
    }
    swept = {p["sparsity"] for p in spmm["points"]}
    cross = spmm["crossover_sparsity_vs_cublas_cudnn"]  # per sweep: a swept point, or NaN
    assert len(cross) == 2 and all(math.isnan(c) or c in swept for c in cross)
    pooled = spmm["crossover_sparsity_pooled"]
    assert math.isnan(pooled) or pooled in swept

    sdgp = conv_times(scale="smoke", context={}, repeats=1, sweeps=2)
    shares = sdgp["data_grad_time_share"]
    assert len(shares) == 2 and all(0 < s < 100 for s in shares)
    assert sdgp["reduction_ratio2"] == pytest.approx([s / 2 for s in shares])
    assert sdgp["reduction_ratio4"] == pytest.approx([s * 3 / 4 for s in shares])
    assert all(layer["fwd_ms"] > 0 for layer in sdgp["layers"])

    one = conv_times(scale="smoke", context={}, repeats=1)  # sweeps=1: plain numbers
    assert isinstance(one["data_grad_time_share"], float)
    for fn in (csr_conversion, spmm_sweep, conv_times):
        with pytest.raises(ValueError, match="sweeps"):
            fn(scale="smoke", context={}, sweeps=0)


CPU_FIG9 = {"conversion_time": 90.0, "pattern_conversion_time": 30.0, "speedup_vs_cusparse": 3.0,
            "device": "AMD EPYC 7B13", "generic_impl": "torch.Tensor.to_sparse_csr",
            "pattern_impl": "impl.ops.pattern_csr (ref)"}  # fmt: skip
GPU_FIG9 = {**CPU_FIG9, "device": "NVIDIA H100", "device_type": "cuda",
            "generic_impl": "cuSPARSE denseToSparse (CuPy)"}  # fmt: skip
GPU_FIG9_NO_CUPY = {**GPU_FIG9, "generic_impl": "torch.Tensor.to_sparse_csr (not cuSPARSE: x)"}
GPU_FIG10 = {"speedup_vs_cusparse": 3.0, "speedup_sparsity": 74.8, "device": "NVIDIA H100",
             "crossover_sparsity_vs_cublas_cudnn": 65.0, "points": []}  # fmt: skip


@pytest.mark.parametrize(
    ("key", "measured", "device", "named", "not_named"),
    [("clicktrain.fig9", CPU_FIG9, "AMD EPYC 7B13", "torch's CPU dense-to-CSR",
      "cuSPARSE dense2csr (torch"),
     ("clicktrain.fig9", GPU_FIG9, "NVIDIA H100",
      "cuSPARSE dense2csr (denseToSparse, through CuPy)", "to_sparse_csr"),
     ("clicktrain.fig9", GPU_FIG9_NO_CUPY, "NVIDIA H100",
      "torch's GPU dense-to-CSR converter (torch.Tensor.to_sparse_csr (not cuSPARSE", "CuPy)"),
     ("clicktrain.fig10", {**GPU_FIG10, "device": "AMD EPYC 7B13", "device_type": "cpu"},
      "AMD EPYC 7B13", "torch's CPU CSR SpMM (MKL; torch.addmm", "cuSPARSE SpMM (torch"),
     ("clicktrain.fig10", GPU_FIG10, "NVIDIA H100",
      "cuSPARSE SpMM (torch.addmm of the CSR matrix into a new result, beta 0)", "CPU")],
    ids=["fig9-cpu", "fig9-gpu", "fig9-gpu-without-cupy", "fig10-cpu", "fig10-gpu-old-file"],
)  # fmt: skip
def test_kernel_rows_name_the_routines_timed_on_the_measuring_device(
    key, measured, device, named, not_named
):
    target = reproductions.load_target(key)
    results = [RowResult(row, measured=dict(measured)) for row in target.rows("cpu")]
    rows = [r for r in compare_rows(target, results, "cpu") if r["ours"] is not None]
    assert rows
    for r in rows:
        assert "cuSPARSE" not in r["row"]  # a label names no library the row may not have run
        assert f"measured on {device}" in r["note"] and named in r["note"]
        assert not_named not in r["note"]
        assert "torch.sparse.mm" not in r["note"]  # the baseline is the bare addmm (csr_mm)
    if key == "clicktrain.fig10":
        assert "74.8% achieved sparsity" in rows[0]["note"]
        # per-sweep crossovers (a list) say in how many sweeps one was found
        per_sweep = {**measured, "crossover_sparsity_vs_cublas_cudnn": [None, 85.1, math.nan]}
        from reproductions.clicktrain.kernels import spmm_note

        note = spmm_note(RowResult(target.rows("cpu")[0], measured=per_sweep))
        assert "beat dense at some swept sparsity in 1 of 3 sweeps" in note
        assert any("achieved sparsity" in n for n in target.notes("cpu"))


def test_fig9_times_cusparse_on_a_gpu_and_says_so_where_it_cannot(monkeypatch):
    """The paper's baseline is cuSPARSE's dense2csr (Sec. 5.1); torch's to_sparse_csr is
    torch's own conversion, timed only where cuSPARSE (CuPy) is not there, and named so."""
    from bench import Unavailable, cases
    from reproductions.clicktrain import kernels

    flat = torch.randn(4, 9)
    convert, impl = kernels.generic_converter(flat)
    assert impl == "torch.Tensor.to_sparse_csr" and convert().layout == torch.sparse_csr

    def no_cupy():
        raise Unavailable("CuPy is not usable here")

    monkeypatch.setattr(cases, "_cupy", no_cupy)
    on_gpu = types.SimpleNamespace(device=torch.device("cuda"), to_sparse_csr=flat.to_sparse_csr)
    convert, impl = kernels.generic_converter(on_gpu)
    assert impl == "torch.Tensor.to_sparse_csr (not cuSPARSE: CuPy is not usable here)"
    monkeypatch.setattr(cases, "cusparse_dense_to_csr", lambda m: "cuSPARSE's call")
    assert kernels.generic_converter(on_gpu) == ("cuSPARSE's call", kernels.CUSPARSE_IMPL)


def _scripted_times(monkeypatch, ms):
    """Replace the kernel module's timer: the i-th timed case takes ``ms[i]`` ms (each call
    still runs once); returns the results the timed calls gave, in order."""
    from reproductions.clicktrain import kernels

    order, ran = iter(ms), []

    def fake_time_ms(fn, *, repeats=5, warmup=1):
        ran.append(fn())
        return [next(order)] * repeats

    monkeypatch.setattr(kernels, "time_ms", fake_time_ms)
    return ran


def test_fig10_derives_speedup_crossover_and_the_65_percent_test_from_its_times(monkeypatch):
    from reproductions.clicktrain.kernels import spmm_sweep

    # smoke: 16 channels, 4-of-9 kernels. Kept kernels round((1 - s) * 9 * 16 / 4): 56% -> 16
    # (1 - 64/144 = 55.6%), 68% -> 12 (66.7%), 80% -> 7 (1 - 28/144 = 80.6%), 90% -> 4 (88.9%)
    # per sparsity: dense GEMM, dense conv, generic CSR SpMM, pattern SpMM (ms)
    ms = [2.0, 3.0, 4.0, 5.0,  # 55.6: the pattern SpMM loses
          2.0, 3.0, 4.0, 1.5,  # 66.7: it wins, the lowest win
          2.0, 3.0, 6.0, 1.0,  # 80.6: it wins, 6x the generic CSR product
          2.0, 1.0, 4.0, 1.5]  # 88.9: cuDNN's convolution beats it  # fmt: skip
    _scripted_times(monkeypatch, ms)
    got = spmm_sweep(scale="smoke", context={}, sparsities=(0.56, 0.68, 0.8, 0.9), repeats=1)
    assert sorted({p["sparsity"] for p in got["points"]}) == [55.6, 66.7, 80.6, 88.9]
    assert got["speedup_sparsity"] == 80.6  # nearest 75% (66.7 is 8.3 away, 80.6 5.6)
    assert got["speedup_vs_cusparse"] == pytest.approx(6.0)  # generic CSR over pattern
    assert got["crossover_sparsity_vs_cublas_cudnn"] == 66.7
    assert got["crossover_sparsity_pooled"] == 66.7
    assert got["beats_dense_above_65"] == 0.0  # lost at 88.9, above 65%


def test_fig10_times_the_dense_convolution_of_the_same_layer_as_the_gemm(monkeypatch):
    from reproductions.clicktrain.kernels import spmm_sweep

    ran = _scripted_times(monkeypatch, [1.0] * 4)
    spmm_sweep(scale="smoke", context={}, sparsities=(0.75,), repeats=1)
    gemm, conv, csr, pattern = ran
    # 32 filters of 16 x 3 x 3 over a 16 x 28 x 28 map, padding 1: 32 x 784 outputs, as the
    # GEMM of the 32 x 144 filter matrix and the map's 144 x 784 im2col matrix
    assert tuple(gemm.shape) == (32, 784) and tuple(conv.shape) == (1, 32, 28, 28)
    assert torch.allclose(csr, gemm, atol=1e-4) and torch.allclose(pattern, gemm, atol=1e-4)


def test_fig9_and_10_sweep_the_papers_sparsities_by_default(monkeypatch):
    from reproductions.clicktrain.kernels import csr_conversion, spmm_sweep

    # Fig. 10's axis (the target's note: 56, 65, 75, 85 and 90%); smoke's 16 channels keep
    # 16, 13, 9, 5 and 4 kernels of 4 weights of 144: 55.6, 63.9, 75.0, 86.1, 88.9%
    _scripted_times(monkeypatch, [1.0] * 20)
    got = spmm_sweep(scale="smoke", context={}, repeats=1)
    assert sorted({p["sparsity"] for p in got["points"]}) == [55.6, 63.9, 75.0, 86.1, 88.9]
    # Fig. 9 converts the 75% sparse filter matrix (9 of 16 kernels kept: 36 of 144 weights)
    _scripted_times(monkeypatch, [0.09, 0.03])
    csr = csr_conversion(scale="smoke", context={}, repeats=1)
    assert csr["sparsity"] == pytest.approx(0.75) and csr["shape"] == "32x144"
    # microseconds, the generic conversion over the pattern's
    assert csr["conversion_time"] == pytest.approx(90.0)
    assert csr["pattern_conversion_time"] == pytest.approx(30.0)
    assert csr["speedup_vs_cusparse"] == pytest.approx(3.0)
    assert csr["device_type"] == "cpu" and csr["generic_impl"] == "torch.Tensor.to_sparse_csr"
    assert csr["pattern_impl"] == "impl.ops.pattern_csr (ref)"


def test_fig9_rows_name_their_own_routines_and_the_generic_row_the_papers_gpu():
    from reproductions.clicktrain.kernels import conversion_note

    published = paper_values("clicktrain", "fig9")
    (paper,) = published[published["metric"] == "conversion_time"]["note"].tolist()
    gpu = paper.split(", ")[-1]  # "NVIDIA Quadro RTX 5000"
    generic, pattern = reproductions.load_target("clicktrain.fig9").rows("cpu")
    note = conversion_note(RowResult(generic, measured=dict(CPU_FIG9)))
    assert note.startswith("measured on AMD EPYC 7B13: torch's CPU dense-to-CSR converter")
    assert note.endswith(f"the paper's: cuSPARSE dense2csr on an {gpu}")
    note = conversion_note(RowResult(pattern, measured=dict(CPU_FIG9)))
    assert note.startswith("measured on AMD EPYC 7B13: impl.ops.pattern_csr's reference path")
    assert "; speedup over torch's CPU dense-to-CSR converter" in note and gpu not in note
    note = conversion_note(RowResult(pattern, measured=dict(GPU_FIG9)))
    assert note.startswith("measured on NVIDIA H100: impl.ops.pattern_csr's CUDA kernel;")


def test_fig10_cpu_note_names_no_gpu_library_for_the_dense_products():
    from reproductions.clicktrain.kernels import spmm_note

    (row,) = reproductions.load_target("clicktrain.fig10").rows("cpu")
    cpu = {**GPU_FIG10, "device": "AMD EPYC 7B13", "device_type": "cpu"}
    note = spmm_note(RowResult(row, measured=cpu))
    dense = note.split("; dense: ")[1].split(";")[0]
    assert "not cuBLAS" in dense and "cuDNN" not in dense and "cuBLAS GEMM" not in dense


def test_pattern_masks_draw_from_a_pool_of_12_distinct_4_of_9_patterns():
    from reproductions.clicktrain.kernels import pattern_mask

    # 64 filters keeping round(0.44 * 9 * 128 / 4) = 127 kernels each: 8128 kernels, each a
    # pattern of the pool of 12 (Sec. 5.1), so all 12 distinct patterns show
    mask = pattern_mask(64, 128, 0.56).flatten(2)
    kept = mask[mask.any(dim=2)]
    assert len(kept) == 64 * 127 and set(kept.sum(dim=1).tolist()) == {4}
    assert len({tuple(k.tolist()) for k in kept}) == 12


def test_a_result_records_the_commits_its_runs_were_trained_at():
    def run(commit, dirty=False):
        env = {"commit": commit, "dirty": dirty}
        return RunRecord("r", 0, {"environment": env}, [], True)

    results = [RowResult(Row("a"), runs=[run("1" * 40), run("2" * 40, dirty=True)]),
               RowResult(Row("b"), runs=[run("1" * 40), RunRecord("r", 1, {}, [], True)]),
               RowResult(Row("m"), measured={"x": 1.0})]  # fmt: skip
    assert common.runs_trained_at(results) == ["1" * 12, "2" * 12 + "+"]
    assert common.runs_trained_at([RowResult(Row("m"), measured={"x": 1.0})]) == []


def test_a_results_backend_flags_are_its_runs_not_this_processes_defaults():
    """The footer showed tf32 False/True (torch's defaults in the comparing process) for
    runs that all trained with cuDNN TF32 off, and for measurements pinned to TF32 off."""

    def run(**flags):
        return RunRecord("r", 0, {"environment": flags}, [], True)

    off = {"tf32_matmul": False, "tf32_cudnn": False, "cudnn_benchmark": False}
    results = [RowResult(Row("a"), runs=[run(**off), run(**off)]),
               RowResult(Row("m"), measured={"x": 1.0})]  # fmt: skip
    assert common.backend_flags(results) == off
    results.append(RowResult(Row("b"), runs=[run(**{**off, "tf32_cudnn": True}), run()]))
    assert common.backend_flags(results) == {**off, "tf32_cudnn": "mixed"}
    assert common.backend_flags([RowResult(Row("m"), measured={"x": 1.0})]) == {}
    # a measurement's flags, as saved beside its values, count as a run's do
    measured = RowResult(Row("m"), measured={"x": 1.0}, flags=off)
    assert common.backend_flags([measured]) == off
    on = RowResult(Row("a"), runs=[run(**{**off, "tf32_matmul": True})])
    assert common.backend_flags([on, measured]) == {**off, "tf32_matmul": "mixed"}


def test_a_result_that_ran_nothing_shows_no_tf32_setting(tmp_path):
    """A result of the paper's numbers only (ClickTrain Fig. 14) and the claims showed this
    process's torch defaults, tf32 False/True, on a CPU demo whose every run had them off."""
    from impl.report.html import provenance_rows
    from reproductions.claims import build

    paper_only = [RowResult(Row("p", needs="needs the paper scale (4-16 GPUs)"))]
    flags = common.backend_flags(paper_only)
    assert flags == dict.fromkeys(common.BACKEND_FLAGS)
    claims = build({}, "cpu")
    assert all(claims.environment[k] is None for k in common.BACKEND_FLAGS)
    shown = provenance_rows([("cpu", {**claims.environment, "commit": "c"}, "claims")])
    assert list(shown["tf32 (matmul/cudnn)"]) == ["-"]
    ran = provenance_rows([("cpu", {"tf32_matmul": False, "tf32_cudnn": False}, "x")])
    assert list(ran["tf32 (matmul/cudnn)"]) == ["False/False"]
    # a CPU-only torch (no CUDA version) has no TF32: its results' defaults are not shown
    cpu_only = {"cuda": None, "tf32_matmul": False, "tf32_cudnn": True}
    assert list(provenance_rows([("cpu", cpu_only, "x")])["tf32 (matmul/cudnn)"]) == ["-"]
    on_gpu = {**cpu_only, "cuda": "13.0"}
    assert list(provenance_rows([("gpu", on_gpu, "x")])["tf32 (matmul/cudnn)"]) == ["False/True"]


def test_a_measurements_saved_flags_reach_its_results_provenance(tmp_path, monkeypatch):
    """Measurements run with TF32 pinned off; the footer said the process's cuDNN TF32 on."""
    import torch

    target = Target(key="sdgp.table1", title="t", description="t", metrics=("value",),
                    rows=lambda scale: [Row("m", measure=f"{__name__}:counted_measure",
                                            params={"x": 1.0})])  # fmt: skip
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)  # torch's default
    result = run_target(target, "cpu", tmp_path, log=lambda *a: None)
    assert result.environment["tf32_cudnn"] is False
    assert result.environment["tf32_matmul"] is False


def test_campfire_table4_dense_row_stands_beside_the_papers_v1_baseline():
    """Table 4 prints no dense row; App. B.2's ResNet-50 v1 baseline (74.94) is the one Sec.
    4.2 compares it with, cited as such."""
    target = reproductions.load_target("campfire.table4")
    for scale in ("cpu", "paper"):
        results = [RowResult(row, runs=[]) for row in target.rows(scale)]
        (dense,) = [r for r in compare_rows(target, results, scale) if r["row"] == "dense"]
        assert dense["paper"] == pytest.approx(74.94)
        assert dense["paper_source"].startswith("App. B.2")


def test_campfire_sparsity_is_in_percent_in_tables_1_and_4():
    def ran(row, sparsity):
        summary = {"top1": 90.0, "true_sparsity": sparsity, "inference_flops": 1.0,
                   "method": row.method}  # fmt: skip
        metrics = [{"test_top1": 90.0, "epoch": 0}]
        return RowResult(row, runs=[RunRecord("r", 0, summary, metrics, True)])

    shown = {}
    for key in ("campfire.table1", "campfire.table4"):
        target = reproductions.load_target(key)
        results = [ran(row, 0.6) for row in target.rows("cpu")]
        for r in compare_rows(target, results, "cpu"):
            if r["metric"] in ("true_sparsity", "sparsity") and r["row"].startswith(("ck", "win")):
                shown[(key, r["row"])] = r
    assert {k for k, _ in shown} == {"campfire.table1", "campfire.table4"}
    for r in shown.values():
        assert r["unit"] == "%" and r["ours"] == pytest.approx(60.0)
        assert r["paper"] is None or r["paper"] > 1  # the paper's numbers in % too
        assert r["n_of"] == "seeds"  # runs: n counts their seeds
    t1 = shown[("campfire.table1", "ck, target 40%")]
    assert t1["paper"] == pytest.approx(40.4) and "0.404" in lookup(
        reproductions.load_target("campfire.table1").paper_frame(), setting="ck, target 40%",
        metric="true_sparsity")["note"].iloc[0]  # fmt: skip


def test_clicktrain_fig12_shows_the_share_of_wall_time_saved_beside_the_hours():
    target = reproductions.load_target("clicktrain.fig12")
    walls = {"dense": 400.0}

    def ran(row):
        wall = walls.get(row.method, 300.0)
        return RowResult(row, runs=[RunRecord("r", 0, {"wall_seconds": wall}, [], True)])

    rows = compare_rows(target, [ran(r) for r in target.rows("cpu")], "cpu")
    saved = {r["metric"]: r for r in rows if r["row"] != "dense" and r["ours"] is not None}
    assert saved["wall_time_saved"]["ours"] == pytest.approx(25.0)  # 1 - 300 / 400
    assert saved["wall_time_saved"]["unit"] == "%"
    assert saved["train_hours_saved"]["ours"] == pytest.approx(100 / 3600)
    notes = " ".join(target.notes("cpu"))
    assert "wall time incl. evaluation" in notes and "not the hours" in notes


def test_clicktrain_fig14_shows_hours_of_training_and_hours_saved_per_gpu_count():
    from reproductions.clicktrain import fig14

    dense = RunRecord("d", 0, {"wall_seconds": 5.5 * 3600}, [], True)
    clicktrain = RunRecord("c", 0, {"wall_seconds": 4.0 * 3600}, [], True)
    assert fig14.train_hours(clicktrain) == pytest.approx(4.0)
    assert fig14.hours_saved(clicktrain, dense) == pytest.approx(1.5)
    # every model and GPU count the paper plots (Fig. 14: ResNet-50, ResNet-101, VGG-16 on
    # 4, 8 and 16 GPUs), each ClickTrain row beside its own dense run and the paper's bar
    rows = fig14.rows("paper")
    plotted = {(p["model"], p["setting"]) for p in
               paper_values("clicktrain", "fig14").to_dict("records")
               if p["metric"] == "train_hours_saved"}  # fmt: skip
    ours = {(r.paper["model"], r.paper["setting"]) for r in rows if r.method == "clicktrain"}
    assert ours == plotted and len(ours) == 9
    for r in rows:
        assert r.needs and "GPUs" in r.needs
        if r.method == "clicktrain":
            g = int(r.paper["setting"].split()[0])
            assert r.baseline == f"{r.paper['model']} dense, {g} GPUs"


def test_clicktrain_fig12_and_fig15_compare_the_higher_compression_run_with_its_dense_run():
    from reproductions.clicktrain import fig12, fig15

    # Fig. 12: dense and ClickTrain for every model and dataset whose hours the paper states
    # (Sec. 6.3), each ClickTrain row beside the dense run of its own recipe
    rows = fig12.rows("paper")
    ours = {(r.paper["model"], r.paper["dataset"]) for r in rows if r.method == "clicktrain"}
    stated = {(p["model"], p["dataset"]) for p in
              paper_values("clicktrain", "fig12").to_dict("records")}  # fmt: skip
    assert ours == stated and len(ours) == 8
    assert {r.method for r in rows} == {"dense", "clicktrain"}
    labels = {r.label for r in rows}
    for r in rows:
        assert "lower" not in r.label and "PruneTrain" not in r.label
        if r.method == "clicktrain":
            assert r.baseline in labels
            # Fig. 12's values have no compression setting: the selector names none
            assert r.paper == {"model": r.paper["model"], "dataset": r.paper["dataset"],
                               "method": "clicktrain"}  # fmt: skip
    assert [(r.label, r.method) for r in fig12.rows("cpu")] == [
        ("dense", "dense"), ("ClickTrain (higher compression)", "clicktrain")]  # fmt: skip
    # Fig. 15: dense, PruneTrain and ClickTrain (higher compression) on ResNet-50, each
    # against the paper's number of its own method (CIFAR-10; ImageNet at paper scale)
    cpu = fig15.rows("cpu")
    assert [r.label for r in cpu] == ["dense", "PruneTrain", "ClickTrain (higher compression)"]
    assert [r.paper.get("method") for r in cpu] == [None, "prunetrain", "clicktrain"]
    paper = [r for r in fig15.rows("paper") if r.paper]
    assert sorted((r.paper["dataset"], r.paper["method"]) for r in paper) == [
        ("cifar10", "clicktrain"), ("cifar10", "prunetrain"),
        ("imagenet", "clicktrain"), ("imagenet", "prunetrain")]  # fmt: skip
    assert {r.paper["model"] for r in paper} == {"resnet50"}


def test_speed_claim_targets_ask_for_the_scales_sweeps():
    from reproductions.clicktrain import fig9, fig10
    from reproductions.sdgp import fig9 as sdgp_fig9

    for scale in ("smoke", "cpu", "gpu"):
        for target in (fig9.TARGET, fig10.TARGET, sdgp_fig9.TARGET):
            for row in target.rows(scale):
                assert row.params == {"sweeps": common.TIMING_SWEEPS[scale]}, target.key


def test_cross_tradeoff_pairs_each_runs_own_two_metrics():
    from reproductions.common import RowResult, RunRecord
    from reproductions.cross.methods import seed_pairs

    def run(seed, top1, cr):
        return RunRecord(f"r{seed}", seed, {"top1": top1, "compression_ratio": cr}, [], True)

    dense = RowResult(Row("dense", "dense"), runs=[run(s, 99.0, 1.0) for s in (0, 1, 2)])
    method = RowResult(Row("m", "m", baseline="dense"),
                       runs=[run(0, 98.0, 2.0), run(1, None, 3.0), run(2, 97.0, 4.0)])  # fmt: skip
    pairs = seed_pairs([dense, method], "compression_ratio", "delta_top1", "cpu")
    got = [(p["row"], p["seed"], p["compression_ratio"], p["delta_top1"]) for p in pairs]
    # seed 1 has no top-1: left out, not paired with seed 2's compression (as a zip would)
    assert got == [("m", 0, 2.0, -1.0), ("m", 2, 4.0, -2.0)]


def _cfg(method="dense", options=None, **train):
    base = {"model": "resnet20", "data": "digits", "data_options": {"image_size": 16},
            "epochs": 8, "batch_size": 32, "lr": 0.2, "schedule": "onecycle",
            "warmup_fraction": 0.2, "momentum": 0.9, "nesterov": True, "weight_decay": 5e-4,
            "label_smoothing": 0.0, "method": method, "method_options": options or {}}  # fmt: skip
    return {**base, **train}


@pytest.mark.parametrize(
    ("method", "options", "scale", "words"),
    [("prunetrain", {"penalty_ratio": 0.8, "threshold": 1e-2, "reconfig_interval": 1}, "cpu",
      "penalty ratio 0.8 (the paper's 0.2, mapped onto the short run), zero threshold 0.01, "
      "reconfigured every 1 epoch(s)"),
     ("prunetrain", {"penalty_ratio": 0.2, "reconfig_interval": 2}, "smoke",
      "penalty ratio 0.2, zero threshold 0.0001, reconfigured every 2 epoch(s)"),
     ("sdgp", {"n": 2, "m": 4, "prune_method": "rescaled", "profile": True}, "cpu",
      "2:4 data-gradient pruning, rescaled magnitude"),
     ("sdgp", {"n": 3, "m": 7, "prune_method": "random", "profile": False}, "cpu",
      "3:7 data-gradient pruning, random, profile False"),
     ("campfire", {"final_sparsity": 0.7, "mask": "combined"}, "cpu",
      "70% final sparsity, combined (window + CK) masks"),
     ("clicktrain", {}, "cpu", "connectivity sparsity 0.75 (kernels removed whole), pattern "
      "pool of 12, group-lasso penalty 0.00025, hard pruning at half the epochs, or later "
      "where stages 1-3 need more"),
     ("dense", {}, "cpu", "no pruning (the baseline)"),
     ("no_such_method", {"alpha": 3}, "cpu", "alpha 3"),
     ("prunetrain", {"penalty_ratio": 0.2, "dynamic_batch": True, "batch_step": 16,
                     "max_batch": 256}, "smoke",
      "penalty ratio 0.2, zero threshold 0.0001, reconfigured every 10 epoch(s), dynamic "
      "mini-batch (step 16, max 256)"),
     ("clicktrain", {"hard_prune_epoch": 5}, "cpu", "connectivity sparsity 0.75 (kernels "
      "removed whole), pattern pool of 12, group-lasso penalty 0.00025, hard pruning at epoch 5"),
     ("campfire", {"final_sparsity": 0.5, "mask": "ck"}, "cpu", "50% final sparsity, CK masks"),
     ("campfire", {"final_sparsity": "most", "mask": "ck"}, "cpu",
      "final sparsity most, mask ck"),
     ("campfire", {"final_sparsity": None}, "cpu", "final sparsity None"),
     ("no_such_method", {}, "cpu", "the method's defaults")],
    ids=["prunetrain-mapped", "prunetrain-smoke", "sdgp-2of4", "sdgp-3of7-odd", "campfire",
         "clicktrain-defaults", "dense", "unknown-method", "prunetrain-dynamic-batch",
         "clicktrain-hard-epoch", "campfire-ck", "option-of-unexpected-type", "option-of-no-value",
         "no-options"],
)  # fmt: skip
def test_options_text_words_each_methods_options_as_run(method, options, scale, words):
    assert settings.options_text(method, options, scale) == words


def test_setup_text_reads_a_saved_config_in_words():
    text = settings.setup_text(_cfg())
    assert text == ("ResNet-20 on digits (16x16 px), 8 epochs, batch 32, SGD lr 0.2 (one-cycle, "
                    "20% warm-up), momentum 0.9 (Nesterov), weight decay 0.0005")  # fmt: skip
    step = settings.setup_text(
        {
            "schedule": "step",
            "lr": 0.1,
            "milestones": [91, 136],
            "gamma": 0.1,
            "label_smoothing": 0.1,
            "max_steps_per_epoch": 3,
        }
    )
    assert step == ("at most 3 steps per epoch, SGD lr 0.1 (decayed 0.1x at epochs [91, 136]), "
                    "label smoothing 0.1")  # fmt: skip
    assert settings.setup_text({}) == ""
    ffcv = settings.setup_text({"schedule": "onecycle", "lr": 0.5, "warmup_fraction": 0.02,
                                "warmup_start": 1e-4, "weight_decay": 5e-4,
                                "bn_weight_decay": False, "augment_recipe": "ffcv",
                                "eval_flip": True})  # fmt: skip
    assert ffcv == (
        "SGD lr 0.5 (one-cycle, 2% warm-up from 0.0001 of the peak), weight decay "
        "0.0005, none on BatchNorm, ffcv augmentation, flip test-time averaging"
    )


@pytest.mark.parametrize(
    ("cfg", "words"),
    [({"data_options": {"image_size": 16}}, "input 16x16 px"),
     ({"stem": "cifar"}, ""),
     ({"stem": "imagenet"}, "imagenet stem"),
     ({"epochs": 1, "max_steps_per_epoch": 1}, "1 epoch of at most 1 step"),
     ({"epochs": 2, "max_steps_per_epoch": 5}, "2 epochs of at most 5 steps"),
     ({"momentum": 0.9, "nesterov": False}, "momentum 0.9"),
     ({"nesterov": False}, "no Nesterov momentum"),
     ({"nesterov": True}, "Nesterov momentum"),
     ({"augment_recipe": "standard"}, ""),
     ({"augment": False, "augment_recipe": "ffcv"}, "no augmentation"),
     ({"schedule": "cosine", "lr": 0.1, "warmup_fraction": 0.2}, "SGD lr 0.1 (cosine)"),
     ({"schedule": "constant", "lr": 0.05}, "SGD lr 0.05 (constant)"),
     ({"schedule": "step"}, "SGD (step decay)"),
     ({"gamma": 0.2}, "lr decayed 0.2x"),
     ({"warmup_fraction": 0.05}, "5% warm-up"),
     ({"weight_decay": 1e-4, "bn_weight_decay": True}, "weight decay 0.0001")],
    ids=["input-size-alone", "cifar-stem", "imagenet-stem", "one-epoch-one-step",
         "epochs-steps", "momentum-no-nesterov", "no-nesterov", "nesterov", "standard-recipe",
         "no-augment-over-recipe", "cosine-no-warm-up", "constant", "step-bare", "row-gamma",
         "row-warm-up", "bn-decayed"],
)  # fmt: skip
def test_setup_text_words_each_setting_as_it_reads(cfg, words):
    """Each setup setting reads in words, with singular/plural counts and the defaults (the
    CIFAR stem, the standard recipe, BatchNorm decayed) left unsaid."""
    assert settings.setup_text(cfg) == words


def test_settings_lines_read_the_runs_configs_and_name_what_differs():
    def run(seed, cfg):
        return RunRecord(f"r{seed}", seed, {"top1": 90.0}, [], True, cfg)

    pt_opts = {"penalty_ratio": 0.8, "threshold": 0.01, "reconfig_interval": 1}
    results = [
        RowResult(Row("dense"), runs=[run(s, _cfg()) for s in range(5)]),
        RowResult(Row("prunetrain", "prunetrain", baseline="dense"),
                  runs=[run(s, _cfg("prunetrain", pt_opts)) for s in range(5)]),
        RowResult(Row("sdgp smoothed", "sdgp"), runs=[run(3, _cfg("sdgp", label_smoothing=0.1))]),
        RowResult(Row("not run", needs="x"), error="x"),
    ]  # fmt: skip
    lines, setup = settings.settings_lines(results, "cpu")
    assert setup.startswith("ResNet-20 on digits (16x16 px), 8 epochs, batch 32")
    assert "label smoothing" not in setup  # not shared by every run
    assert [line["row"] for line in lines] == ["dense", "prunetrain", "sdgp smoothed"]
    assert lines[1]["options"].startswith("penalty ratio 0.8 (the paper's 0.2")
    assert (lines[0]["seeds"], lines[2]["seeds"]) == ("0-4", "3")
    assert lines[2]["differs"] == "label smoothing 0.1" and lines[0]["differs"] == ""
    assert settings.settings_lines([RowResult(Row("m", measure="a:b"), measured={})], "cpu") == (
        [], "")  # fmt: skip


def test_a_rows_warm_up_start_reads_as_a_fraction_of_the_peak_lr():
    """A row whose warm-up starts elsewhere than the shared setup's says where, as a fraction
    of the peak learning rate."""
    assert settings.setup_text({"warmup_start": 1e-4}) == "warm-up from 0.0001 of the peak lr"
    assert settings.setup_text({"warmup_fraction": 0.1, "warmup_start": 0.5}) == (
        "10% warm-up, warm-up from 0.5 of the peak lr"
    )


def test_a_row_without_runs_between_rows_with_runs_leaves_the_later_rows_their_lines():
    def run(seed, cfg):
        return RunRecord(f"r{seed}", seed, {"top1": 90.0}, [], True, cfg)

    results = [
        RowResult(Row("dense"), runs=[run(0, _cfg())]),
        RowResult(Row("not run", needs="the paper scale"), error="the paper scale"),
        RowResult(Row("campfire", "campfire"),
                  runs=[run(1, _cfg("campfire", {"final_sparsity": 0.5, "mask": "ck"}))]),
    ]  # fmt: skip
    lines, _ = settings.settings_lines(results, "cpu")
    assert [line["row"] for line in lines] == ["dense", "campfire"]
    assert lines[1]["options"] == "50% final sparsity, CK masks" and lines[1]["seeds"] == "1"


def test_a_setup_field_that_differs_between_rows_is_in_each_rows_differs_not_none():
    def run(seed, **train):
        step = {"schedule": "step", "lr": 0.05, "gamma": 0.1, "warmup_fraction": 0.0}
        return RunRecord(f"r{seed}", seed, {"top1": 90.0}, [], True, _cfg(**step, **train))

    results = [
        RowResult(Row("drop at 90"), runs=[run(0, milestones=[27, 30], epochs=33)]),
        RowResult(Row("drop at 80"), runs=[run(0, milestones=[24, 30], epochs=33)]),
        RowResult(Row("drop at 90, 7 epochs"), runs=[run(1, milestones=[5, 6], epochs=7)]),
    ]  # fmt: skip
    lines, setup = settings.settings_lines(results, "cpu")
    assert "None" not in setup and "SGD lr 0.05 (decayed 0.1x at milestones given per row)" in setup
    assert [line["differs"] for line in lines] == [
        "33 epochs, lr decayed at epochs [27, 30]",
        "33 epochs, lr decayed at epochs [24, 30]",
        "7 epochs, lr decayed at epochs [5, 6]",
    ]


def test_shared_setup_names_no_setting_of_a_schedule_some_rows_did_not_train_with():
    """Step and one-cycle rows both save gamma and the warm-up defaults: neither is shared."""

    def run(seed, **train):
        return RunRecord(f"r{seed}", seed, {"top1": 90.0}, [], True, _cfg(**train))

    step = {"schedule": "step", "milestones": [3, 6], "gamma": 0.1, "warmup_fraction": 0.2}
    onecycle = {"schedule": "onecycle", "milestones": [], "gamma": 0.1, "warmup_fraction": 0.2}
    results = [RowResult(Row("campfire"), runs=[run(0, **step)]),
               RowResult(Row("prunetrain"), runs=[run(0, **onecycle)])]  # fmt: skip
    lines, setup = settings.settings_lines(results, "cpu")
    assert "decayed" not in setup and "warm-up" not in setup, setup
    assert "0.1x at epochs [3, 6]" in lines[0]["differs"] and "warm-up" not in lines[0]["differs"]
    assert "one-cycle, 20% warm-up" in lines[1]["differs"] and "0.1x" not in lines[1]["differs"]


def test_settings_lines_take_the_method_as_run_and_keep_the_warm_up_of_a_config_without_schedule():
    """A row's method is the one its runs' configs name, and a config saved without a schedule
    keeps its warm-up setting in the shared setup."""
    partial = {"method": "sdgp", "epochs": 4, "warmup_fraction": 0.2}
    results = [
        RowResult(Row("pruned"), runs=[RunRecord("r0", 0, {}, [], True, partial)]),
        RowResult(Row("again"), runs=[RunRecord("r1", 1, {}, [], True, partial)]),
    ]
    lines, setup = settings.settings_lines(results, "cpu")
    assert setup == "4 epochs, 20% warm-up"
    assert [line["method"] for line in lines] == ["sdgp", "sdgp"]


@pytest.mark.parametrize("field", settings.SETUP_FIELDS, ids=list(settings.SETUP_FIELDS))
def test_every_setup_field_alone_reads_as_words_without_none(field):
    cfg = _cfg(schedule="step", milestones=[3, 5], gamma=0.2, max_steps_per_epoch=4,
               stem="imagenet", augment=False, bf16=True, fp16=True, label_smoothing=0.1,
               warmup_start=1e-4, bn_weight_decay=False, augment_recipe="ffcv",
               eval_flip=True)  # fmt: skip
    text = settings.setup_text({field: cfg[field]})
    assert text and "None" not in text, field


def test_sdgp_rows_name_both_models_and_show_the_papers_derived_change():
    target = _tiny_target()
    results = [
        RowResult(Row("dense", paper={"model": "resnet9", "dataset": "cifar10",
                                      "method": "dense"}),
                  runs=[RunRecord("d", 0, {"top1": 99.28}, [], True, _cfg())]),
        RowResult(Row("SDGP rescaled 2:4", "sdgp", baseline="dense",
                      paper={"model": "resnet9", "dataset": "cifar10", "setting": "rescaled 2:4"}),
                  runs=[RunRecord("s", 0, {"top1": 99.0}, [], True, _cfg("sdgp"))]),
    ]  # fmt: skip
    rows = compare_rows(target, results, "cpu")
    dense = next(r for r in rows if r["row"] == "dense" and r["metric"] == "top1")
    assert dense["ours_setup"] == "ResNet-20 on digits (16x16 px)"
    assert dense["paper_setup"] == "ResNet-9 on CIFAR-10"
    assert (dense["seeds"], dense["n"]) == ([0], 1)  # one seed: labelled with it
    delta = next(r for r in rows if r["row"] == "SDGP rescaled 2:4" and r["metric"] == "delta_top1")
    assert delta["paper"] == pytest.approx(-0.1) and delta["ours"] == pytest.approx(-0.28)
    assert delta["paper_source"] == "Table I, Sec. IV-A (derived: 95.2 - 95.3)"
    from impl.report.html import comparison_frame

    frame = comparison_frame(rows)
    shown = frame[frame["Row"].str.startswith("SDGP rescaled 2:4")].set_index("Metric")
    assert shown.loc["top-1 change vs dense", "Paper"] == "-0.1"
    assert shown.loc["top-1 change vs dense", "Ours"] == "-0.28 (n=1, seed 0)"
    assert shown.index.size == 2 and shown["Row"].iloc[0] == (
        "SDGP rescaled 2:4 (ours: ResNet-20 on digits (16x16 px); paper: ResNet-9 on CIFAR-10)"
    )
    paper = target.paper_frame()
    assert common.paper_delta(paper, "top1", {"model": "resnet9"}, {"model": "resnet9"}) is None
    assert (
        common.paper_delta(
            paper, "delta_top1", {"model": "nope"}, {"model": "resnet9", "method": "dense"}
        )
        is None
    )


@pytest.mark.parametrize(
    "scale", ["smoke", "cpu", "gpu"], ids=["smoke-scale", "cpu-scale", "gpu-scale"]
)
def test_cross_table_states_its_setup_in_words_and_labels_every_metric(scale):
    from impl.report.labels import METRIC_LABELS
    from reproductions.cross import methods

    note = next(n for n in methods.notes(scale) if n.startswith("Same setup"))
    assert "{" not in note and "'model'" not in note and "batch " in note
    assert "ResNet-" in note and "digits" in note
    assert set(methods.METRICS_SHOWN) <= set(METRIC_LABELS)  # no internal key as a row label


def test_cross_table_says_which_layout_each_method_trained_in(monkeypatch):
    from impl.methods.dense import Dense
    from reproductions.cross import methods

    cpu = methods.layout_note("cpu")
    assert cpu in methods.notes("cpu")
    assert "dense, PruneTrain, Campfire train channels_last" in cpu
    assert "ClickTrain, SDGP NCHW" in cpu
    assert methods.layout_note("smoke") == (
        "Memory layout: NCHW (memory_format contiguous) for every method."
    )
    monkeypatch.setattr(Dense, "channels_last_on_cpu", False)  # read from the classes
    assert "PruneTrain, Campfire train channels_last" in methods.layout_note("cpu")
    assert "dense, ClickTrain, SDGP NCHW" in methods.layout_note("cpu")


def _shown_metrics(target, scale):
    """Every metric key a target's report can show at ``scale``: its metrics, each row's,
    its own metrics and units, and the metrics of the paper's rows (shown when unmatched)."""
    keys = set(target.metrics) | set(target.extra_metrics) | set(target.metric_units)
    for row in target.rows(scale):
        keys |= set(row.metrics or ()) | set(row.measure_keys)
    frame = target.paper_frame()
    return keys | (set(frame["metric"]) if len(frame) else set())


@pytest.mark.parametrize("key", reproductions.TARGETS, ids=list(reproductions.TARGETS))
def test_every_metric_a_target_can_show_has_words(key):
    from impl.report.labels import METRIC_LABELS

    target = reproductions.load_target(key)
    for scale in common.SCALES:
        unlabelled = sorted(_shown_metrics(target, scale) - set(METRIC_LABELS))
        assert not unlabelled, f"{key} at {scale}: add to impl.report.labels.METRIC_LABELS"


def test_cross_title_and_description_count_registered_methods(monkeypatch):
    from reproductions.cross import methods

    monkeypatch.setattr(methods, "registered_methods", lambda: ("gradual_magnitude",))
    results = [RowResult(row) for row in methods.rows("cpu")]
    title, description = methods.heading(results, "cpu")
    assert "6 methods" in title and title.endswith("Campfire, gradual_magnitude)")
    assert description.startswith("Dense, ClickTrain, PruneTrain, SDGP, Campfire and "
                                  "gradual_magnitude train the same model")  # fmt: skip
    assert "five" not in title + description


def test_cross_table_trains_each_scale_as_its_docstring_says():
    # the module docstring: smoke one seed; cpu ResNet-20 on digits, 8 epochs, 5 seeds; gpu
    # ResNet-32 on digits, 30 epochs, 5 seeds; paper ResNet-32 on CIFAR-10, 182 epochs, step
    # schedule from epochs 91 and 136 counted from 1, 3 seeds
    from reproductions.cross import methods

    expected = {
        "smoke": ("resnet20", "digits", None, 1),
        "cpu": ("resnet20", "digits", 8, 5),
        "gpu": ("resnet32", "digits", 30, 5),
        "paper": ("resnet32", "cifar10", 182, 3),
    }
    for scale, (model, data, epochs, n_seeds) in expected.items():
        for row in methods.rows(scale):
            assert (row.train["model"], row.train["data"]) == (model, data), (scale, row.label)
            assert row.train.get("epochs") == epochs, (scale, row.label)
            assert tuple(row.seeds) == tuple(range(n_seeds)), (scale, row.label)
            assert row.baseline == (None if row.method == "dense" else "dense")
    assert "ResNet-32 on CIFAR-10, 182 epochs" in methods.shared_setup("paper")
    assert "[90, 135]" in methods.shared_setup("paper")
    assert "ResNet-20 on digits (16x16 px), 8 epochs, batch 32" in methods.shared_setup("cpu")


def test_cross_table_runs_each_method_at_its_papers_defaults():
    # PruneTrain: penalty ratio 0.2 (docs/methods.md), at cpu/gpu scale run at 0.8 with the
    # short-run threshold, reconfiguring every epoch (cpu), 3 epochs (gpu), 10 (paper, CIFAR);
    # SDGP: rescaled 2:4, profiled; Campfire: combined mask to 70%; dense and ClickTrain: none
    from reproductions.cross import methods

    by = {s: {r.method: r.options for r in methods.rows(s)} for s in ("cpu", "gpu", "paper")}
    assert by["cpu"]["prunetrain"] == {"penalty_ratio": 0.8, "threshold": 0.01,
                                       "reconfig_interval": 1}  # fmt: skip
    assert by["gpu"]["prunetrain"]["reconfig_interval"] == 3
    assert by["paper"]["prunetrain"] == {"penalty_ratio": 0.2, "reconfig_interval": 10}
    for opts in by.values():
        assert opts["sdgp"] == {"n": 2, "m": 4, "prune_method": "rescaled", "profile": True}
        assert opts["campfire"] == {"final_sparsity": 0.7, "mask": "combined"}
        assert opts["dense"] == {} and opts["clicktrain"] == {}


def test_cross_table_time_to_accuracy_targets_and_their_note():
    from reproductions.cross import methods

    # smoke proves the pipeline: chance level on digits' 10 classes
    assert methods.TTA_TARGET["smoke"] == 100 / 10
    # the paper scale reads it a little below PruneTrain's dense ResNet-32 on CIFAR-10 (93.6%,
    # Table 1), which a dense run reaches
    table1 = paper_values("prunetrain", "table1")
    query = "model == 'resnet32' and dataset == 'cifar10' and metric == 'base_top1'"
    dense = float(table1.query(query)["value"].iloc[0])
    assert dense == 93.6 and dense - 2 <= methods.TTA_TARGET["paper"] < dense
    for scale, target in methods.TTA_TARGET.items():
        note = next(n for n in methods.notes(scale) if n.startswith("Time to accuracy"))
        assert f"reaches {target}%" in note


def test_cross_table_shows_the_rows_of_the_documented_table_and_reads_time_to_90_at_cpu():
    # docs/reproductions.md's cross-method table (cpu scale): top-1, its change against dense,
    # conv compression, training FLOPs saved (nominal / executed), inference FLOPs, bytes
    # all-reduced, fwd / bwd / step, time per iteration (last epoch, whole run) and the time
    # to 90% top-1
    from reproductions.cross import methods

    documented = {"top1", "delta_top1", "compression_ratio", "train_flops_saved",
                  "train_flops_executed_saved", "inference_flops_per_sample",
                  "comm_bytes_per_iter", "fwd_ms", "bwd_ms", "step_ms", "iter_ms",
                  "run_iter_ms", "time_to_accuracy"}  # fmt: skip
    assert documented <= set(methods.TARGET.metrics)
    assert methods.TTA_TARGET["cpu"] == 90.0
    note = next(n for n in methods.notes("cpu") if n.startswith("Time to accuracy"))
    assert "first reaches 90.0% " in note


def test_cross_table_notes_name_the_seeds_and_the_size_of_one_digits_test_image():
    from reproductions.cross import methods

    def same(scale):
        return next(n for n in methods.notes(scale) if n.startswith("Same setup"))

    assert same("smoke").endswith("; seed 0. Each method's options as run: the settings "
                                  "table under the results.")  # fmt: skip
    assert "; seeds 0-4. " in same("cpu") and "; seeds 0-2. " in same("paper")
    # digits' test split: 360 images, so one image is 100/360 = 0.28 points
    cpu = next(n for n in methods.notes("cpu") if n.startswith("Top-1 change"))
    assert cpu.endswith(f"one test image is {100 / 360:.2f} points (360 test images).")
    paper = next(n for n in methods.notes("paper") if n.startswith("Top-1 change"))
    assert "test image" not in paper  # CIFAR-10 is not digits


def test_cross_heading_for_one_method_and_for_none():
    from reproductions.cross import methods

    title, description = methods.heading([RowResult(Row("dense", "dense"))], "cpu")
    assert title == "Cross-method table: 1 method on equal terms (dense)"
    assert description.startswith("Dense trains the same model on the same data for ")
    title, description = methods.heading(
        [RowResult(Row("sdgp", "sdgp")), RowResult(Row("campfire", "campfire"))], "cpu"
    )
    assert title == "Cross-method table: 2 methods on equal terms (SDGP, Campfire)"
    assert description.startswith("SDGP and Campfire train the same model on the same data")
    title, description = methods.heading([], "cpu")
    assert title == "Cross-method table: 0 methods on equal terms"
    assert description == methods.DESCRIPTION
    assert methods.TARGET.extra_metrics["time_to_accuracy"][0] == "s" and methods.TARGET.wide


def test_cross_figures_plot_delta_against_flops_saved_and_test_top1_per_epoch():
    from reproductions.cross.methods import figures, seed_pairs

    dense = RowResult(Row("dense", "dense"), runs=[_run(0, top1=99.0)])
    half = RowResult(Row("x", "x", baseline="dense"),
                     runs=[_run(0, top1=97.0, train_flops_nominal=150.0)])  # fmt: skip
    measured = RowResult(Row("m", baseline="dense", measure_keys={"top1": "t"}),
                         runs=[_run(0, top1=98.0)], measured={"t": [1.0]})  # fmt: skip
    figs = {f.kind: f for f in figures([dense, half, measured], "gpu", None)}
    trade = figs["tradeoff"]
    assert (trade.x, trade.y) == ("train_flops_saved", "delta_top1")
    # 300 -> 150 FLOPs per sample: 50% saved; 97 - 99 = -2 points; the measured row has no runs
    assert [(d["row"], d["train_flops_saved"], d["delta_top1"], d["source"])
            for d in trade.data] == [("x", 50.0, -2.0, "ours (gpu)")]  # fmt: skip
    assert [p["row"] for p in seed_pairs([dense, half, measured], "top1", "top1", "gpu")] == [
        "dense", "x"]  # fmt: skip
    # last epoch: the summary's median iteration; whole run: the epochs' 6 and 8 ms weighted
    # by their 3 iterations each, 7 ms
    slow = RowResult(Row("s", "s", baseline="dense"), runs=[_run(0, iter_ms=9.0)])
    (it,) = [f for f in figures([dense, slow], "gpu", None) if f.y == "iter_ms"]
    assert {(d["kind"], d["iter_ms"]) for d in it.data if d["row"] == "s"} == {
        ("last epoch", 9.0), ("whole run", 7.0)}  # fmt: skip
    line = figs["line"]
    assert line.y == "test_top1" and {d["test_top1"] for d in line.data} == {80.0}


def test_a_target_heading_titles_its_saved_result(tmp_path):
    row = Row("m", measure="test_reproductions:counted_measure", params={"x": 1})
    target = Target("sdgp.fig9", "static title", "static", rows=lambda s: [row],
                    metrics=("value",),
                    heading=lambda res, s: (f"{len(res)} row", "counted"))  # fmt: skip
    result = run_target(target, "smoke", tmp_path, log=lambda *a: None)
    assert (result.title, result.description) == ("1 row", "counted")


def test_a_row_without_runs_gets_no_setup_label():
    row = Row("resnet18 dense", train={"model": "resnet18", "data": "imagenet"},
              paper={"model": "resnet18", "dataset": "imagenet"}, needs="paper scale")  # fmt: skip
    assert common.setups(row, "cpu", RowResult(row, error="paper scale")) == {}
    ran = RowResult(row, runs=[RunRecord("r", 0, {"top1": 1.0}, [], True)])  # no saved config
    assert common.setups(row, "cpu", ran) == {
        "ours_setup": "ResNet-18 on ImageNet (16x16 px)",
        "paper_setup": "ResNet-18 on ImageNet",
    }
    bare = Row("dense", paper={"model": "resnet20", "dataset": "cifar10"})  # scale defaults
    ran = RowResult(bare, runs=[RunRecord("r", 0, {"top1": 1.0}, [], True)])
    assert common.setups(bare, "paper", ran)["ours_setup"] == "ResNet-20 on CIFAR-10"
    assert common.setups(bare, "cpu", ran)["ours_setup"].startswith("ResNet-20 on digits")
    # a selector of a one-model table names no model: the published row it matched does
    import pandas as pd

    window = Row("Window, start 0", paper={"method": "window", "setting": "start 0"})
    ran = RowResult(window, runs=[RunRecord("r", 0, {"top1": 1.0}, [], True)])
    matched = pd.DataFrame([{"model": "resnet50", "dataset": "imagenet", "value": 75.0}])
    assert common.setups(window, "cpu", ran) == {}
    assert common.setups(window, "cpu", ran, matched)["paper_setup"] == "ResNet-50 on ImageNet"
    no_words = pd.DataFrame([{"model": float("nan"), "dataset": float("nan"), "value": 1.0}])
    assert common.setups(window, "cpu", ran, no_words) == {}  # empty cells read NaN


def test_the_communication_claims_row_runs_the_cross_tables_seeds_at_cpu_scale():
    from reproductions.cross.methods import SEEDS
    from reproductions.prunetrain import fig11

    by_label = {r.label: r for r in fig11.rows("cpu")}
    claim_row = by_label["PruneTrain (ratio 0.25, run at 0.85), dynamic mini-batch"]
    assert claim_row.seeds == SEEDS["cpu"] and len(SEEDS["cpu"]) >= 2
    assert all(r.seeds is None for r in fig11.rows("smoke"))  # smoke stays one seed


def test_prunetrain_training_flops_beside_the_paper_are_by_the_authors_formula():
    # Table 1 and Fig. 8 print "Train. FLOPs" by the authors' cost formula; ours counted them
    # by impl.flops, which weighs layers differently. Table 1 keeps impl.flops beside it.
    from reproductions.prunetrain import fig8, table1

    pt = RunRecord("p", 0, {"method": "prunetrain", "paper_train_flops_pct_of_dense": 61.5,
                            "train_flops_run": 3.0}, [], True)  # fmt: skip
    dense = RunRecord("d", 0, {"method": "dense", "train_flops_nominal": 1.0}, [], True)
    for target in (table1.TARGET, fig8.TARGET):
        unit, fn = target.metric_table["train_flops"]
        assert unit == "% of dense" and fn(pt, dense) == 61.5 and fn(dense, None) == 100.0
        with pytest.raises(KeyError):  # a run that did not count it has no value
            fn(RunRecord("o", 0, {"method": "prunetrain"}, [], True), dense)
    assert "train_flops_impl" in table1.TARGET.metrics


def test_prunetrain_training_time_leaves_evaluation_and_reconfiguration_out():
    # Table 1: "Training time does not include network architecture reconfiguration time";
    # ours read the run's wall time, evaluation and the epochs' ends included.
    from reproductions.prunetrain import table1, table4

    def run(steps, wall):
        metrics = [{"epoch": e, "train_seconds": s} for e, s in enumerate(steps)]
        return RunRecord("r", 0, {"wall_seconds": wall}, metrics, True)

    pruned, dense = run([3.0, 2.0, 1.0], wall=30.0), run([4.0, 4.0, 4.0], wall=24.0)
    _, pct = table1.TARGET.metric_table["train_time"]
    assert pct(pruned, dense) == pytest.approx(50.0)  # the wall times would say 125%
    _, saved = table4.TARGET.metric_table["train_time_reduction"]
    assert saved(pruned, dense) == pytest.approx(50.0)
    with pytest.raises(KeyError):  # no per-epoch times: no value, not the wall time
        pct(RunRecord("o", 0, {"wall_seconds": 1.0}, [], True), dense)


@pytest.mark.parametrize("rows_store", ["own batch", "next batch"])
def test_fig11_communication_saving_counts_each_epochs_own_batch(rows_store):
    # The batch doubled at the end of epoch 0: epochs trained at 32, 64, 64, so with the same
    # parameters the per-epoch cost is 1, 1/2, 1/2 of dense (33.3% saved). Metrics rows store
    # the epoch's own batch; runs trained before that stored the next one. Both read 33.3%
    # (the next-batch rows read 0.0 and the own-batch rows 16.7 when the first epoch's batch
    # came from the first row).
    from reproductions.prunetrain import epoch_batches, fig11

    own = [32, 64, 64] if rows_store == "own batch" else [64, 64, 64]
    metrics = [
        {"epoch": e, "params": 1000, "batch_size": b, "next_batch_size": 64}
        for e, b in enumerate(own)
    ]
    run = RunRecord("r", 0, {"params_dense": 1000}, metrics, True, {"batch_size": 32})
    assert epoch_batches(run) == [32, 64, 64]
    assert fig11.comm_cost_saved(run) == pytest.approx(100 / 3)


def test_a_measurement_that_changes_form_is_measured_again(tmp_path, monkeypatch):
    from reproductions.clicktrain import kernels

    fn, params = "reproductions.clicktrain.kernels:spmm_sweep", {"sweeps": 5}
    now = common._measure_path(fn, params, "cpu", tmp_path)
    monkeypatch.setattr(kernels.spmm_sweep, "measure_version", 99)
    assert common._measure_path(fn, params, "cpu", tmp_path) != now
    monkeypatch.delattr(kernels.spmm_sweep, "measure_version")
    # without a version the key is (fn, params, scale) alone, as files saved before it was
    unversioned = common._measure_path(fn, params, "cpu", tmp_path)
    assert unversioned != now and unversioned.parent == now.parent


@pytest.mark.parametrize(
    ("fn", "older"),
    [
        # saved before each sweep judged beats_dense_above_65 (version 3)
        ("reproductions.clicktrain.kernels:spmm_sweep", 3),
        # saved before gpu and paper timed in float16 (unversioned)
        ("reproductions.sdgp.measure:conv_times", None),
    ],
    ids=["spmm-without-beats-above-65", "sdgp-float32-at-gpu"],
)
def test_a_measurement_saved_in_an_older_form_is_not_read_back(tmp_path, monkeypatch, fn, older):
    module, name = fn.split(":")
    func = getattr(__import__(module, fromlist=[name]), name)
    now = common._measure_path(fn, {}, "gpu", tmp_path)
    if older is None:
        monkeypatch.delattr(func, "measure_version")
    else:
        monkeypatch.setattr(func, "measure_version", older)
    assert common._measure_path(fn, {}, "gpu", tmp_path) != now


def test_fig7_gpu_state_with_unused_shared_channels_is_not_read_from_an_older_file(
    tmp_path, monkeypatch
):
    from reproductions.prunetrain import fig7, measure

    (row,) = fig7.rows("gpu")
    now = common._measure_path(row.measure, row.params, "gpu", tmp_path)
    monkeypatch.delattr(measure.union_gating_layer_times_at_shape, "measure_version")
    # the key a file measured before the state changed was saved under
    assert common._measure_path(row.measure, row.params, "gpu", tmp_path) != now


# -- ClickTrain Fig. 11 at gpu scale: the benchmark suite's iteration rows ----------------------


def _iteration_row(case, impl, fwd, bwd, status="ok"):
    return {"suite": "iteration", "case": case, "impl": impl, "status": status,
            "forward_ms": fwd, "backward_ms": bwd, "device_name": "Test GPU"}  # fmt: skip


def test_fig11_gpu_rows_time_the_benchmarks_method_states():
    from reproductions.clicktrain import fig11

    rows = fig11.rows("gpu")
    assert len(rows) == 2 * len(fig11.GPU_CASES) and all(r.measure == fig11.MEASURE for r in rows)
    click = [r for r in rows if r.label.endswith("ClickTrain")]
    assert {r.paper["model"] for r in click} == {"resnet18", "resnet34", "resnet50", "vgg16"}
    assert all(r.measure_keys["fwd_ms"] == "clicktrain_fwd_ms" for r in click)
    dense = [r for r in rows if r.label.endswith("dense")]
    assert all(r.metrics == ("fwd_ms", "bwd_ms") for r in dense)
    assert all(r.train is None or not r.train for r in rows)  # nothing is trained
    assert any(r.method == "clicktrain" for r in fig11.rows("paper"))  # paper scale trains


def test_fig11_takes_times_only_from_benchmark_rows_that_ran():
    from reproductions.clicktrain import fig11

    ok = {"status": "ok", "forward_ms": 1.5, "backward_ms": 2.5}
    assert fig11._phases(ok) == {"fwd_ms": 1.5, "bwd_ms": 2.5, "iter_ms": 4.0}
    # a row that failed (out of memory, say) part way is no time, whatever it holds
    assert fig11._phases({**ok, "status": "error"}) is None
    assert fig11._phases({"status": "ok", "forward_ms": None}) is None


def test_fig11_reads_a_gpu_benchmark_run_instead_of_measuring_again(tmp_path):
    from reproductions.clicktrain import fig11

    case = "resnet50-cifar32-b128"
    path = tmp_path / "rows.json"
    path.write_text(json.dumps({"provenance": {"commit": "abcdef123456"}, "rows": [
        _iteration_row(case, "dense@cuda", 30.0, 60.0),
        {**_iteration_row(case, "clicktrain@cuda", 15.0, 40.0),
         "paths_per_iteration": "input_grad dense x16"},
        _iteration_row("vgg16-cifar32-b128", "dense@cuda", 1.0, 1.0),
    ]}))  # fmt: skip
    got = fig11.iteration_times("gpu", {}, case, rows_path=str(path))
    assert got["forward_speedup"] == 2.0 and got["backward_speedup"] == 1.5
    assert got["clicktrain_iter_ms"] == 55.0 and got["dense_iter_ms"] == 90.0
    assert got["source"].startswith("bench.run iteration rows") and "abcdef1" in got["source"]
    assert got["device"] == "Test GPU"
    assert got["clicktrain_paths"] == "input_grad dense x16"
    # the table's note names the file, its commit, the device and ClickTrain's CUDA paths
    click = next(r for r in fig11.rows("gpu") if r.label.endswith("ClickTrain"))
    note = fig11.TARGET.row_note(RowResult(click, measured=got))
    assert "abcdef1" in note and "on Test GPU" in note and "ran input_grad dense x16" in note
    dense = next(r for r in fig11.rows("gpu") if r.label.endswith("dense"))
    assert "ran" not in fig11.TARGET.row_note(RowResult(dense, measured=got))


def test_fig11_notes_the_layout_each_trained_row_ran_in():
    from reproductions.clicktrain import fig11

    row = fig11.rows("smoke")[0]
    runs = [RunRecord("r", s, {"memory_format": f}, [], True)
            for s, f in ((0, "channels_last"), (1, "channels_last"))]  # fmt: skip
    assert fig11.TARGET.row_note(RowResult(row, runs=runs)) == "trained in the channels_last layout"
    assert fig11.TARGET.row_note(RowResult(row, runs=[RunRecord("r", 0, {}, [], True)])) == ""


def test_fig11_measures_with_the_benchmark_code_where_no_run_has_the_rows(tmp_path):
    from reproductions.clicktrain import fig11

    path = tmp_path / "rows.json"  # a run whose ClickTrain row ran out of memory
    path.write_text(json.dumps({"rows": [
        _iteration_row("resnet20-cifar32-b4", "dense@cpu", 1.0, 2.0),
        _iteration_row("resnet20-cifar32-b4", "clicktrain@cpu", None, None, status="oom"),
    ]}))  # fmt: skip
    got = fig11.iteration_times("smoke", {}, "resnet20-cifar32-b4", rows_path=str(path))
    assert got["source"].startswith("measured by reproductions.clicktrain.fig11")
    assert got["dense_fwd_ms"] > 0 and got["clicktrain_bwd_ms"] > 0 and got["forward_speedup"] > 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU measures the row instead")
def test_fig11_without_a_gpu_raises_rather_than_saving_an_empty_measurement(tmp_path):
    from reproductions.clicktrain import fig11

    with pytest.raises(RuntimeError, match=r"dense@cuda: skipped \(dense@cuda needs a CUDA GPU"):
        fig11.iteration_times("gpu", {}, "resnet18-cifar32-b128", rows_path=str(tmp_path / "x"))


def test_dataset_dirs_reads_named_and_bare_entries(monkeypatch):
    import os

    import impl.data as data_mod

    value = os.pathsep.join(["cifar10=/data/c10", "/data", "imagenet=/ilsvrc"])
    assert data_mod.dataset_dirs(value) == {
        "cifar10": "/data/c10",
        "*": "/data",
        "imagenet": "/ilsvrc",
    }
    monkeypatch.setenv(data_mod.DATA_DIR_ENV, "cifar100=/x")
    assert data_mod.dataset_dirs() == {"cifar100": "/x"}
    monkeypatch.delenv(data_mod.DATA_DIR_ENV)
    assert data_mod.dataset_dirs() == {}
    with pytest.raises(ValueError, match="'digits' is not a dataset read from a directory"):
        data_mod.dataset_dirs("digits=/x")
    with pytest.raises(ValueError, match="no directory"):
        data_mod.dataset_dirs("cifar10=")
    with pytest.raises(ValueError, match="^--data-dir: 'bogus' is not a dataset"):
        data_mod.dataset_dirs("bogus=", "--data-dir")  # what the message blames


def test_reproduce_blames_its_flag_for_a_bad_data_dir_entry(tmp_path, capsys):
    from impl import cli

    args = ["--data-dir", "bogus=/x", "--runs-root", str(tmp_path / "r"), "--out", str(tmp_path)]
    code = cli.main(["reproduce", "clicktrain.table1", "--scale", "smoke", *args])
    assert code == 2
    assert "error: --data-dir: 'bogus' is not a dataset" in capsys.readouterr().err


def test_one_runs_data_dir_may_be_written_as_the_variables_entry(tmp_path, monkeypatch):
    from impl.data import dataset_dir_for

    assert dataset_dir_for(None, "cifar10") is None
    assert dataset_dir_for("/data/c10", "cifar10") == "/data/c10"
    assert dataset_dir_for("cifar10=/data/c10", "cifar10") == "/data/c10"
    with pytest.raises(ValueError, match="names imagenet, and the run reads cifar10"):
        dataset_dir_for("imagenet=/ilsvrc", "cifar10")
    with pytest.raises(ValueError, match="names no directory"):
        dataset_dir_for("cifar10=", "cifar10")
    literal = tmp_path / "cifar10=old"  # a directory whose name has the form is itself
    literal.mkdir()
    assert dataset_dir_for(str(literal), "cifar100") == str(literal)
    monkeypatch.chdir(tmp_path)  # the same directory given by its relative name
    assert dataset_dir_for("cifar10=old", "cifar100") == "cifar10=old"
    # not a dataset's name, nor a directory: a mistyped NAME, said as one
    with pytest.raises(ValueError, match="no such directory, and 'other' is not a dataset"):
        dataset_dir_for("other=/x", "cifar10")
    (tmp_path / "other=x").mkdir()  # where it is a directory, it is one
    assert dataset_dir_for("other=x", "cifar10") == "other=x"
    # embedded data is read from no directory: a --data-dir for it (a new run's, a resume's,
    # eval-fgsm's, written NAME=DIR or not) is refused rather than saved and read by nothing
    assert dataset_dir_for(None, "digits") is None
    for value in ("cifar10=/x", str(tmp_path), "/nowhere"):
        with pytest.raises(ValueError, match="digits is not read from a directory"):
            dataset_dir_for(value, "digits")


def test_train_reads_name_equals_dir_as_the_datasets_directory(tmp_path, capsys):
    from impl import cli

    missing = tmp_path / "c10"
    code = cli.main(["train", "--data", "cifar10", "--data-dir", f"cifar10={missing}",
                     "--out", str(tmp_path / "run"), "--no-progress"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and f"directory {missing} does not exist" in err
    assert "cifar10=" not in err.split("does not exist")[0]


def test_a_row_without_its_dataset_says_so_and_trains_once_pointed_at_it(
    tmp_path, monkeypatch, capsys
):
    import numpy as np
    from test_data import _fake_cifar  # tests/ is on sys.path

    import impl.data as data_mod

    monkeypatch.delenv(data_mod.DATA_DIR_ENV, raising=False)
    rows = [Row("c100", "dense", train={**TINY, "data": "cifar100"})]
    target = Target(key="x.y", title="x", description="x", rows=lambda scale: list(rows))
    lines: list[str] = []
    (res,) = common.execute_rows(target, "smoke", tmp_path / "runs", log=lines.append)
    assert res.error == (
        "needs its dataset: cifar100: no data directory; give it with --data-dir cifar100=DIR "
        "(or PDTBENCH_DATA_DIR)"
    )
    assert lines == ["  x.y | c100: not run, cifar100: no data directory"]  # no traceback
    _fake_cifar(tmp_path / "data", "cifar100", np.random.default_rng(0))
    # a bare directory stands for every local dataset (here the parent of cifar-100-python)
    monkeypatch.setenv(data_mod.DATA_DIR_ENV, str(tmp_path / "data"))
    (res,) = common.execute_rows(target, "smoke", tmp_path / "runs", log=lines.append)
    assert res.error is None and res.runs[0].summary["data_spec"]["num_classes"] == 100
    assert res.runs[0].config["data_dir"] == str(tmp_path / "data")


def test_reproduce_says_a_data_dir_is_not_read_where_no_run_reads_a_local_dataset(
    tmp_path, monkeypatch
):
    """Every run of the smoke, cpu and gpu scales trains on digits: a --data-dir there is
    said to be unused (and still passed on); at paper scale SDGP Table I trains on CIFAR, and
    a target that trains no run reads no directory either."""
    import impl.data
    from reproductions.parallel import plan_runs

    monkeypatch.setattr(reproductions, "check_scale_device", lambda scale: None)
    said = {}

    def run(keys, scale, runs_root, *a, **k):
        plan = plan_runs([reproductions.load_target(key) for key in keys], scale, runs_root)
        said[scale] = reproductions.unread_data_dir_note(plan, scale)
        return tmp_path / "index.html"

    monkeypatch.setattr(reproductions, "run", run)
    monkeypatch.delenv(impl.data.DATA_DIR_ENV, raising=False)
    where = ["--runs-root", str(tmp_path / "r"), "--out", str(tmp_path / "o")]
    for scale in ("smoke", "cpu", "gpu", "paper"):
        argv = ["sdgp.table1", "--scale", scale, "--data-dir", "cifar10=/nowhere", *where]
        assert reproductions.main(argv) == 0
        assert os.environ[impl.data.DATA_DIR_ENV] == "cifar10=/nowhere"
    for scale in ("smoke", "cpu", "gpu"):
        assert said[scale] == f"--data-dir is not read at scale {scale}: its runs train on digits"
    assert said["paper"] is None  # Table I's runs read CIFAR-10 and CIFAR-100
    assert reproductions.unread_data_dir_note([], "cpu") == (
        "--data-dir is not read at scale cpu: it trains no run"
    )
    monkeypatch.delenv(impl.data.DATA_DIR_ENV)  # no directory given: nothing to say
    assert reproductions.unread_data_dir_note([], "cpu") is None


def test_reproduce_refuses_a_data_dir_that_names_no_local_dataset(capsys):
    from impl import cli

    assert cli.main(["reproduce", "sdgp.table1", "--data-dir", "mnist=/x"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "'mnist' is not a dataset read from a directory" in err


def test_the_gpu_scales_are_refused_where_torch_sees_no_gpu(monkeypatch, capsys):
    from impl import cli

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for scale in ("gpu", "paper"):
        with pytest.raises(ValueError, match=f"--scale {scale} times and trains on a CUDA GPU"):
            reproductions.check_scale_device(scale)
    reproductions.check_scale_device("cpu")
    reproductions.check_scale_device("smoke")
    assert cli.main(["reproduce", "sdgp.fig9", "--scale", "gpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "on this machine use --scale cpu" in err
    assert cli.main(["reproduce", "--list", "--scale", "gpu"]) == 0  # listing needs no GPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    reproductions.check_scale_device("gpu")


def test_clicktrain_fig9_names_the_matrix_it_timed_and_no_training_notes(tmp_path):
    # smoke times 32 x 144, not the paper's 256 x 1152; and this target trains nothing, so
    # "models sit near chance" and "0 runs trained and 0 reused ... 0 s" do not apply
    from reproductions.clicktrain import fig9

    result = run_target(fig9.TARGET, "smoke", tmp_path, log=lambda *a: None)
    assert "convert the 32 x 144 filter matrix (the paper's is 256 x 1152)" in result.description
    assert result.figures[0].caption.startswith("32 x 144 filter matrix; ours the mean over")
    times = {r["metric"]: r for r in result.rows if r.get("ours") is not None}
    # the times carry their sweeps' n, as the speedup beside them does
    assert times["conversion_time"]["n"] == times["speedup_vs_cusparse"]["n"] == 2
    notes = " ".join(result.notes)
    assert result.notes[0] == common.SMOKE_MEASURE_NOTE
    assert "near chance" not in notes and "runs trained" not in notes
    # before anything is measured, the scale's shape; the paper's own shape says so
    _, described = fig9.heading([], "cpu")
    assert "the 256 x 1152 filter matrix (the paper's shape)" in described
    # a reused measurement names the shape it timed, whatever the scale's shape is now
    reused = RowResult(row=fig9.rows("cpu")[0], measured={"shape": "64x288"})
    assert fig9.matrix_shape([reused], "cpu") == "64 x 288"
    _, described = fig9.heading([reused], "cpu")
    assert "the 64 x 288 filter matrix (the paper's is 256 x 1152)" in described


def test_execute_rows_says_how_each_run_came_and_counts_only_older_runs_as_reused(
    tmp_path, monkeypatch
):
    from reproductions import parallel

    rows = [Row("r", "dense", train=TINY, seeds=(0, 1, 2))]
    target = Target(key="x.y", title="x", description="x", rows=lambda scale: list(rows))
    outs = [c.out for c in rows[0].configs("smoke", tmp_path)]
    # seed 0 trained by this call, seed 1 by train_all earlier in this command, seed 2 older
    came = {outs[0]: False, outs[1]: True, outs[2]: True}
    monkeypatch.setattr(common, "run_or_reuse", lambda cfg: ({"top1": 50.0}, came[cfg.out]))
    monkeypatch.setattr(parallel, "_TRAINED_HERE", {Path(outs[1]).resolve()})
    lines: list[str] = []
    (res,) = common.execute_rows(target, "smoke", tmp_path, log=lines.append)
    assert [run.reused for run in res.runs] == [False, False, True]
    assert "(trained in " in lines[0] and "(trained above)" in lines[1] and "(reused)" in lines[2]


def test_a_builtin_method_left_out_of_the_build_is_not_available_not_failed(tmp_path, monkeypatch):
    """A built-in method this build cannot construct is reported as not available (a build
    choice), not as a failure of the command, and the row says why."""

    def unavailable(cfg):
        raise MethodUnavailable("method 'campfire' is not available in this build")

    monkeypatch.setattr(common, "run_or_reuse", unavailable)
    target = Target(key="x.y", title="x", description="x",
                    rows=lambda scale: [Row("campfire", "campfire", train=TINY)])  # fmt: skip
    lines: list[str] = []
    (res,) = common.execute_rows(target, "smoke", tmp_path, log=lines.append)
    assert res.error == "not available: method 'campfire' is not available in this build"
    assert not res.ok and lines == []


def test_execute_rows_says_a_measurement_a_row_above_made_was_measured_above(tmp_path, monkeypatch):
    # Rows sharing one measurement (Campfire Table 6's epsilons) read the file the first wrote
    # moments before: "reused" made a fresh command look as if it had read stale numbers.
    fn = "test_reproductions:counted_measure"
    rows = [Row(f"eps {i}", "dense", measure=fn, params={"x": 3}) for i in range(2)]
    rows.append(Row("older", "dense", measure=fn, params={"x": 5}))
    target = Target(key="x.y", title="x", description="x", rows=lambda scale: list(rows))
    monkeypatch.setattr(common, "_MEASURED_HERE", set())
    measure_or_reuse(fn, {"x": 5}, "smoke", {"runs": {}}, tmp_path)  # an earlier command's
    common._MEASURED_HERE.clear()
    lines: list[str] = []
    common.execute_rows(target, "smoke", tmp_path, log=lines.append)
    assert lines == ["  x.y | eps 0: measured", "  x.y | eps 1: measured above",
                     "  x.y | older: reused"]  # fmt: skip


def test_fig10_generic_csr_product_is_the_library_product_without_extra_passes():
    # ClickTrain Fig. 10's generic CSR SpMM: the same product as torch.sparse.mm, into a new
    # result (no zero fill and copy around it), so that it is compared as a product.
    import warnings

    from reproductions.clicktrain.kernels import csr_mm

    torch.manual_seed(0)
    w = torch.randn(16, 36) * (torch.rand(16, 36) < 0.3)
    b = torch.randn(36, 10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's "sparse CSR is in beta"
        csr = w.to_sparse_csr()
        got, again = csr_mm(csr, b), csr_mm(csr, b)
        expected = torch.sparse.mm(csr, b)
    assert torch.allclose(got, expected, rtol=1e-6, atol=1e-6)
    assert torch.allclose(got, w @ b, atol=1e-5)
    assert torch.equal(got, again) and got.data_ptr() != again.data_ptr()  # a new result


def test_a_seed_without_a_baseline_run_gets_no_value_and_the_row_says_so():
    # A delta is each seed's value minus the baseline's of the same seed: where the baseline's
    # run of a seed failed, that seed has no value (it was paired with the baseline's first
    # run, another seed), and the row's note counts the seeds left out.
    dense = RowResult(Row("dense", "dense"), runs=[_run(s, top1=90.0 + s) for s in (0, 1, 2)])
    method_row = Row("m", "sdgp", baseline="dense")
    method = RowResult(method_row, runs=[_run(s, top1=89.0 + s) for s in range(5)])
    assert row_metric(method, "delta_top1", dense) == [-1.0, -1.0, -1.0]
    assert len(row_metric(method, "top1", dense)) == 5  # a metric of the run alone: every seed
    target = Target(key="cross.test", title="t", description="d",
                    rows=lambda scale: [dense.row, method_row],
                    metrics=("delta_top1",))  # fmt: skip
    rows = compare_rows(target, [dense, method], "cpu")
    (entry,) = [r for r in rows if r["row"] == "m" and r["metric"] == "delta_top1"]
    assert entry["n"] == 3 and entry["ours"] == -1.0 and "seeds" not in entry  # not paired
    assert "2 of 5 seeds without a value" in entry["note"] and "'dense'" in entry["note"]


def test_a_rows_number_is_the_mean_of_its_seeds():
    results = [
        RowResult(
            Row("dense", paper={"model": "resnet9", "method": "dense"}),
            runs=[_run(0, top1=90.0), _run(1, top1=91.0), _run(2, top1=99.0)],
        )
    ]
    rows = common.compare_rows(_tiny_target(), results, "cpu")
    top1 = next(r for r in rows if r["metric"] == "top1" and r["row"] == "dense")
    assert top1["ours"] == pytest.approx(280.0 / 3) and top1["n"] == 3  # not the median, 91


def test_a_plain_row_trains_each_scales_documented_setup(tmp_path):
    """docs/reproductions.md's scale table: cpu is ResNet-20 on digits at 16x16, batch 32, 8
    epochs, 1 seed; gpu is ResNet-32 on digits, 30 epochs, 3 seeds."""
    (cpu,) = Row("dense").configs("cpu", tmp_path)
    assert (cpu.model, cpu.data, cpu.batch_size, cpu.epochs, cpu.seed) == (
        "resnet20", "digits", 32, 8, 0)  # fmt: skip
    assert cpu.data_options["image_size"] == 16
    gpu = Row("dense").configs("gpu", tmp_path)
    assert [c.seed for c in gpu] == [0, 1, 2]
    assert {(c.model, c.data, c.epochs) for c in gpu} == {("resnet32", "digits", 30)}
    assert all(Path(c.out).parent == tmp_path for c in gpu + [cpu])


def test_a_row_needing_the_paper_scale_runs_only_there():
    assert common.needs_paper("paper", "ImageNet") is None
    for scale in ("smoke", "cpu", "gpu"):
        assert common.needs_paper(scale, "ImageNet") == "needs the paper scale (ImageNet)"


def test_the_cifar_recipe_drops_from_the_epochs_at_half_and_three_quarters():
    # the authors' code lowers the rate from its epochs 91 and 136 of 182, counted from 1
    # (epoch >= 91): milestones are epochs done, so the first lower epoch is the 91st
    from impl.schedules import lr_multiplier

    assert common.cifar_step_recipe(182)["milestones"] == [90, 135]
    assert common.cifar_step_recipe(190)["milestones"] == [94, 141]
    steps = [lr_multiplier("step", e, 182, milestones=[90, 135]) for e in (89, 90, 134, 135)]
    assert steps == pytest.approx([1.0, 0.1, 0.1, 0.01])


def test_time_ms_is_in_milliseconds():
    times = common.time_ms(lambda: time.sleep(0.004), repeats=2, warmup=0)
    assert len(times) == 2 and all(3.5 <= t < 1000 for t in times)


def test_time_to_accuracy_takes_the_runs_own_scales_target():
    from reproductions.cross.methods import TTA_TARGET, tta_seconds

    metrics = [
        {"epoch": 0, "test_top1": 93.0, "wall_seconds": 5.0, "eval_seconds": 1.0},
        {"epoch": 1, "test_top1": 96.0, "wall_seconds": 10.0, "eval_seconds": 1.0},
    ]
    run = RunRecord(path="p", seed=0, summary={"scale": "gpu"}, metrics=metrics, reused=True)
    assert TTA_TARGET["gpu"] == 95.0 > 93.0 > TTA_TARGET["cpu"]
    assert tta_seconds(run) == pytest.approx(8.0)  # the second epoch, evaluation left out


def test_a_seed_with_a_nonfinite_value_is_left_out_of_the_pairs():
    from reproductions.cross.methods import seed_pairs

    def run(seed, top1, cr):
        return RunRecord(f"r{seed}", seed, {"top1": top1, "compression_ratio": cr}, [], True)

    dense = RowResult(Row("dense", "dense"), runs=[run(s, 99.0, 1.0) for s in (0, 1)])
    method = RowResult(Row("m", "m", baseline="dense"),
                       runs=[run(0, 98.0, 2.0), run(1, math.nan, 3.0)])  # fmt: skip
    pairs = seed_pairs([dense, method], "compression_ratio", "delta_top1", "cpu")
    assert [p["seed"] for p in pairs] == [0]


def test_clicktrain_fig9_draws_the_papers_conversion_times_beside_ours():
    from reproductions.clicktrain import fig9

    measured = {"conversion_time": 1200.0, "pattern_conversion_time": 400.0,
                "device": "AMD EPYC", "shape": "256x1152"}  # fmt: skip
    res = RowResult(row=Row("generic dense->CSR"), measured=measured)
    (spec,) = fig9.figures([res], "cpu", paper_values("clicktrain", "fig9"))
    bars = {(d["source"], d["converter"]): d["time_us"] for d in spec.data}
    assert bars == {
        ("ours (cpu, AMD EPYC)", "generic dense-to-CSR"): 1200.0,
        ("ours (cpu, AMD EPYC)", "pattern CSR"): 400.0,
        ("paper (Quadro RTX 5000)", "generic dense-to-CSR"): 800.0,  # Fig. 9, Sec. 5.1
        ("paper (Quadro RTX 5000)", "pattern CSR"): 200.0,  # derived: 800 us / 4x
    }
    assert spec.hue == "source" and "derived" in spec.caption
    # times saved one per sweep are drawn as their mean
    per_sweep = {**measured, "conversion_time": [1100.0, 1300.0]}
    res = RowResult(row=Row("generic dense->CSR"), measured=per_sweep)
    (spec,) = fig9.figures([res], "cpu", paper_values("clicktrain", "fig9"))
    assert spec.data[0]["time_us"] == pytest.approx(1200.0)


def test_campfire_table6_draws_the_papers_fgsm_curves_for_the_models_ours_trained():
    from reproductions.campfire import table6

    paper = paper_values("campfire", "table6")
    assert len(table6.figures([], "cpu", paper)[1].data) == 42  # 7 models x 6 epsilons
    results = [
        RowResult(row=Row(f"{m}, eps {e}", group={"model": m, "eps": e}),
                  measured={f"eps_{e}": [v]})
        for m in ("dense", "ck, start 30, sparsity 70%") for e, v in ((0.05, 80.0), (0.1, 40.0))
    ]  # fmt: skip
    ours, published = table6.figures(results, "cpu", paper)
    assert [(d["model"], d["eps"]) for d in ours.data][:2] == [("dense", 0.05), ("dense", 0.1)]
    assert [d["model"] for d in published.data] == ["dense"] * 6 + [
        "ck, start 30, sparsity 70%"
    ] * 6
    first = next(d for d in published.data if d["eps"] == 0.05)
    assert first["top1"] == 41.71  # Table 6, Sec. 4.2: dense at epsilon 0.05


def test_prunetrain_table2_draws_the_speedup_beside_the_papers():
    from reproductions.prunetrain import table2

    results = [
        RowResult(row=Row(f"{who}, batch {b}", group={"batch": b}),
                  measured={"dense": 100.0, "prunetrain": 90.0, "speedup": 0.9})
        for who in ("dense", "PruneTrain") for b in (10, 100)
    ]  # fmt: skip
    _, speedup = table2.figures(results, "cpu", paper_values("prunetrain", "table2"))
    bars = {(d["source"], d["batch"]): d["speedup"] for d in speedup.data}
    assert bars[("ours (cpu)", 10)] == bars[("ours (cpu)", 100)] == 0.9
    assert bars[("paper resnet32", 10)] == 1.34 and bars[("paper vgg13", 100)] == 1.64
    assert not any("imagenet" in s for s, _ in bars)  # the CIFAR-100 rows only


def _curve(top1s, *, scale="cpu", method="dense", seconds=None, saved=None, **summary):
    """A run record whose epochs reached ``top1s`` (test top-1, %), each taking ``seconds``."""
    seconds = seconds or [1.0] * len(top1s)
    metrics = [{"epoch": i, "test_top1": t, "train_seconds": s}
               for i, (t, s) in enumerate(zip(top1s, seconds))]  # fmt: skip
    head = {"scale": scale, "method": method, "top1": top1s[-1], **summary}
    if saved is not None:
        head["sdgp_time"] = {"est_saved_fraction_of_iteration": saved}
    return RunRecord(path="p", seed=0, summary=head, metrics=metrics, reused=True)


def test_campfire_per_run_metrics_read_the_epochs_they_name():
    from reproductions.campfire import top1_at
    from reproductions.campfire.table1 import epoch_of_convergence
    from reproductions.campfire.table8 import gain
    from reproductions.campfire.table9 import improvement

    run = _curve([10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 100.0])
    assert top1_at(0.9)(run) == 90.0 and top1_at(1.0)(run) == 100.0  # epochs 9 and 10
    assert top1_at(0.5)(run) == 50.0
    assert gain(run) == 10.0  # the last 10% of the run: 90 -> 100
    # Table 1: the first epoch (1-based) within 0.5 pp of the best
    assert epoch_of_convergence(_curve([50.0, 89.4, 89.6, 90.0, 89.0])) == 3.0
    early, late = _curve([1.0, 98.5]), _curve([1.0, 98.0])  # drop at 80 vs at 90
    assert improvement(early, late) == pytest.approx(0.5)
    assert improvement(late, early) == pytest.approx(-0.5)


def test_sdgp_fig10_estimates_time_to_accuracy_from_dense_epochs_and_the_saving():
    from reproductions.sdgp.fig10 import estimated_tta, relative_speedup

    dense = _curve([50.0, 80.0, 95.0], seconds=[10.0, 20.0, 40.0])
    # reaches 90% in its 3rd epoch, each dense epoch 25% cheaper: (10 + 20 + 40) x 0.75
    sdgp = _curve([40.0, 85.0, 91.0], method="sdgp", saved=0.25)
    assert estimated_tta(sdgp, dense) == pytest.approx(52.5)
    assert estimated_tta(dense, None) == pytest.approx(70.0)  # dense saves nothing
    assert math.isnan(estimated_tta(_curve([50.0, 60.0]), None))  # never reaches 90%
    # 4:32 reaches 90% in 2 epochs saving 20%, 16:32 in 3 saving 10%: 2.7 / 1.6 - 1
    fast = _curve([80.0, 92.0], method="sdgp", saved=0.2)
    slow = _curve([70.0, 85.0, 93.0], method="sdgp", saved=0.1)
    assert relative_speedup(fast, slow) == pytest.approx(100.0 * (2.7 / 1.6 - 1))


def test_sdgp_fig8_and_prunetrain_fig8_metrics():
    from reproductions.prunetrain.fig8 import inference_mflops
    from reproductions.sdgp.fig8 import top1_change

    wide, ref = _curve([97.0, 98.6], method="sdgp"), _curve([97.0, 99.0], method="sdgp")
    assert top1_change(wide, ref) == pytest.approx(-0.4)  # 4:32 against 2:4, as Sec. V reads
    assert inference_mflops(_curve([90.0], inference_flops=2.5e6), None) == 2.5


def test_sdgp_fig10_says_its_speedup_moves_in_whole_epochs_as_computed():
    """The note's example is what :func:`relative_speedup` gives: 5 epochs to the target
    against 6, no saving, reads +20%; the one-seed warning only where a scale runs one seed."""
    from reproductions.common import SCALE_SEEDS
    from reproductions.sdgp import fig10

    def run(epochs_to_target: int) -> RunRecord:
        top1 = [50.0] * (epochs_to_target - 1) + [95.0, 96.0]
        metrics = [{"test_top1": t, "train_seconds": 1.0} for t in top1]
        return RunRecord(path="p", seed=0, summary={"scale": "cpu", "method": "sdgp",
                         "sdgp_time": {}}, metrics=metrics, reused=True)  # fmt: skip

    assert fig10.relative_speedup(run(5), run(6)) == pytest.approx(20.0)
    for scale in ("cpu", "gpu"):
        (note,) = [n for n in fig10.TARGET.notes(scale) if "whole epochs" in n]
        assert "5 epochs against 6, already reads +20%" in note
        assert ("one seed per setting" in note) == (len(SCALE_SEEDS[scale]) == 1)


def test_compare_rows_says_when_two_paper_rows_match(monkeypatch):
    import pandas as pd

    from reproductions.published import COLUMNS

    two = pd.DataFrame(
        [
            dict.fromkeys(COLUMNS, "")
            | {"model": "resnet9", "metric": "top1", "value": v, "unit": "%", "setting": s}
            for v, s in ((95.2, "a"), (94.5, "b"))
        ],
        columns=list(COLUMNS),
    )
    monkeypatch.setattr(common, "paper_values", lambda paper, item: two)
    vague = RowResult(Row("two", paper={"model": "resnet9"}), runs=[_run(0)])
    top1 = next(r for r in compare_rows(_tiny_target(), [vague], "cpu") if r["row"] == "two")
    assert top1["paper"] is None
    assert top1["note"] == "2 paper rows match; see the paper's rows below"


def test_fractions_of_dense_say_so_in_their_unit():
    assert {common.METRICS[m][0] for m in ("inference_flops", "train_flops", "train_time")} == {
        "% of dense"
    }


def test_run_target_refuses_an_unknown_scale_before_running_any_row(tmp_path):
    logs: list[str] = []
    with pytest.raises(ValueError, match=r"unknown scale 'huge'; valid scales: smoke, cpu, gpu"):
        run_target(_tiny_target(), "huge", tmp_path, log=logs.append)
    assert logs == [] and not any(tmp_path.iterdir())  # no row tried, nothing written


def test_setup_text_names_the_precision_and_a_default_warm_up_start_quietly():
    from impl.train import TrainConfig

    assert settings.setup_text({"fp16": True}) == "fp16 with loss scaling"
    assert settings.setup_text({"bf16": True}) == "bf16"
    cfg = {"lr": 0.2, "schedule": "onecycle", "warmup_fraction": 0.2}
    cfg["warmup_start"] = TrainConfig.warmup_start
    assert settings.setup_text(cfg) == "SGD lr 0.2 (one-cycle, 20% warm-up)"


def test_prunetrain_options_map_the_short_runs_ratio_at_the_short_scales_only():
    text = settings.options_text("prunetrain", {"penalty_ratio": 0.8}, "gpu")
    assert text.startswith("penalty ratio 0.8 (the paper's 0.2, mapped onto the short run)")
    assert "mapped" not in settings.options_text("prunetrain", {"penalty_ratio": 0.8}, "paper")


def test_campfire_table5_counts_the_steps_its_runs_take():
    """The note said a smoke run was 24 SGD steps (6 per epoch) where its runs stop each
    epoch at 2: 8 in all."""
    notes = reproductions.load_target("campfire.table5").notes
    assert "stops each at 2), so a smoke-scale run is 8 SGD steps in all" in notes("smoke")[0]
    assert "6 steps per epoch, so a cpu-scale run is 60 SGD steps in all" in notes("cpu")[0]


def test_threads_per_training_process_reach_the_workers(tmp_path, monkeypatch):
    """`--jobs 1` still trained with 2 torch threads on 2 cores, and nothing could say 1."""
    import reproductions.parallel
    from impl import cli

    seen = []

    def train_all(plan, jobs, threads=None, **kwargs):
        seen.append((jobs, threads))
        return {}

    monkeypatch.setattr(reproductions.parallel, "train_all", train_all)
    reproductions.run([], "smoke", tmp_path / "r", tmp_path / "o", jobs=2, progress=False,
                      threads=1)  # fmt: skip
    assert seen == [(2, 1)]
    ran = []
    monkeypatch.setattr(reproductions, "run", lambda *a, **k: ran.append(k) or tmp_path / "i")
    where = ["--runs-root", str(tmp_path / "r"), "--out", str(tmp_path / "o"), "--no-progress"]
    assert reproductions.main(["sdgp.table1", "--scale", "smoke", "--threads", "1", *where]) == 0
    assert cli.main(["demo", "--scale", "smoke", "--threads", "3", *where]) == 0
    assert [k["threads"] for k in ran] == [1, 3]
    with pytest.raises(SystemExit):
        reproductions.main(["sdgp.table1", "--threads", "0"])


def test_campfire_tables_3_and_8_note_the_start_20_row_only_where_it_runs():
    """The note on the combined start-20 row stands only at scales whose grid runs that row."""
    for key in ("campfire.table3", "campfire.table8"):
        target = reproductions.load_target(key)
        for scale in ("smoke", "cpu", "gpu"):
            labels = {row.label for row in target.rows(scale)}
            runs_it = "combined, start 20, sparsity 70%" in labels
            noted = any("start-20" in note for note in target.notes(scale))
            assert noted == runs_it, (key, scale)
        assert "combined, start 20, sparsity 70%" not in {r.label for r in target.rows("smoke")}


def test_campfire_tables_3_8_and_9_say_where_the_scale_cannot_compare():
    """At smoke scale (4 epochs) epoch 90 of 100 is the last and the drop at 90 never comes;
    Table 9's table is whole in the paper (no note of missing rows)."""
    t3, t8, t9 = (reproductions.load_target(f"campfire.table{i}") for i in (3, 8, 9))
    for target in (t3, t8):
        assert any("last epoch" in n for n in target.notes("smoke"))
        assert not any("last epoch" in n for n in target.notes("cpu"))
    assert any("never take their last drop" in n for n in t9.notes("smoke"))
    assert any("epochs 8 and 9 (counted from 0) of 10" in n for n in t9.notes("cpu"))
    assert not any("missing" in n for scale in ("smoke", "cpu", "paper") for n in t9.notes(scale))


def test_notes_name_only_rows_and_settings_the_scale_has():
    t4 = reproductions.load_target("campfire.table4")
    for scale, runs_window in (("smoke", False), ("cpu", False), ("gpu", True)):
        has_row = any(r.label.startswith("window") for r in t4.rows(scale))
        assert has_row == runs_window
        assert any("window start-0 row" in n for n in t4.notes(scale)) == runs_window
    from reproductions.claims import build

    smoke, cpu = (" ".join(build({}, s, environment={}).notes) for s in ("smoke", "cpu"))
    assert "a few SGD steps" in smoke and "a few hundred" not in smoke
    assert "a few hundred SGD steps" in cpu


def test_a_reused_run_whose_metrics_are_short_fails_its_row_in_one_line(tmp_path, monkeypatch):
    """A complete run with a metrics file cut short was reused, and its per-epoch numbers
    (time per iteration, FLOPs saved) published from the epochs left; a damaged line gave a
    traceback of some 30 lines."""
    row = Row("dense", "dense", train=TINY)
    target = Target(key="sdgp.table1", title="t", description="t", metrics=("top1",),
                    rows=lambda scale: [row])  # fmt: skip
    (cfg,) = row.configs("smoke", tmp_path)
    Path(cfg.out).mkdir(parents=True)
    metrics = Path(cfg.out) / "metrics.jsonl"
    summary = {"status": "complete", "epochs": 2, "top1": 90.0}
    monkeypatch.setattr(common, "run_or_reuse", lambda cfg, **kw: (summary, True))
    for text, says in (
        ('{"epoch": 0}\n', "completed 2 epoch(s), the file holds 1 row(s)"),
        ('{"epoch": 0}\n{garbage\n{"epoch": 1}\n', "line 2 of 3 is not JSON"),
    ):
        metrics.write_text(text)
        logs: list[str] = []
        (res,) = common.execute_rows(target, "smoke", tmp_path, log=logs.append)
        assert res.error.startswith(f"failed: {metrics}") and says in res.error
        assert len(logs) == 1 and "\n" not in logs[0] and says in logs[0]
    metrics.write_text('{"epoch": 0}\n{"epoch": 1}\n')
    (res,) = common.execute_rows(target, "smoke", tmp_path, log=lambda *a: None)
    assert res.error is None and len(res.runs[0].metrics) == 2


def test_a_metric_name_means_one_computation_in_every_target():
    """PruneTrain Fig. 2 showed "training FLOPs (% of dense)" 99.29 by impl.flops for the
    run that Table 1 and Fig. 8 showed at 99.38 by the authors' formula, under one label.
    A metric computed otherwise in some target is so only where that table defines it so."""
    from reproductions import TARGETS, load_target

    # the paper's table reads its own quantity: Campfire Table 1 the best top-1, Table 3 the
    # top-1 at epoch 90 of 100 (its page and note say so); Fig. 14 the hours of a GPU count
    intended = {
        ("top1", "campfire.table1"),
        ("top1", "campfire.table3"),
        ("delta_top1", "campfire.table3"),
        ("train_hours_saved", "clicktrain.fig14"),
    }
    computed: dict[str, dict[tuple, list[str]]] = {}
    for key in TARGETS:
        target = load_target(key)
        for metric in target.metrics:
            if metric in target.metric_table and (metric, key) not in intended:
                unit, fn = target.metric_table[metric]
                computed.setdefault(metric, {}).setdefault((unit, fn), []).append(key)
    twice = {m: list(by.values()) for m, by in computed.items() if len(by) > 1}
    assert not twice, twice
    assert len(computed["train_flops"]) == 1 and len(computed["top1"]) == 1


def test_a_key_prefix_that_is_not_a_paper_is_unknown_not_the_keys_it_begins():
    """'clicktrain.fig1' begins clicktrain.fig10 to fig15: it names none of them."""
    with pytest.raises(ValueError, match=r"^unknown reproduction 'clicktrain.fig1'"):
        reproductions.resolve_targets(["clicktrain.fig1"])
    assert reproductions.resolve_targets(["clicktrain.fig10"]) == ["clicktrain.fig10"]


def test_expected_targets_give_each_title_and_the_command_at_the_scale(monkeypatch):
    sdgp = {e["target"]: e for e in reproductions.expected_targets("gpu")}["sdgp.table1"]
    assert sdgp == {
        "target": "sdgp.table1",
        "title": "SDGP Table I: top-1 with pruned data gradients (2:4)",
        "needs": "pdtbench reproduce sdgp.table1 --scale gpu",
    }
    first = reproductions.expected_targets()[0]
    assert first["needs"] == "pdtbench reproduce clicktrain.table1 --scale cpu"

    def missing_module(key):
        raise ModuleNotFoundError(key)

    monkeypatch.setattr(reproductions, "load_target", missing_module)
    unloaded = {"target": "cross.methods", "title": "cross.methods", "needs": "not implemented"}
    assert reproductions.expected_targets()[-1] == unloaded


def test_list_prints_each_target_with_its_title(capsys):
    assert reproductions.main(["--list", "sdgp.table1"]) == 0
    assert capsys.readouterr().out == (
        "sdgp.table1          SDGP Table I: top-1 with pruned data gradients (2:4)\n"
    )


def test_reproduce_defaults_to_the_cpu_scale_and_the_usual_folders():
    args = reproductions.build_parser().parse_args(["sdgp.table1"])
    assert (args.scale, args.runs_root, args.out) == ("cpu", "runs/reproductions", "reports")
    assert args.data_dir is None and args.list is False and args.no_progress is False


def test_reproduce_passes_its_flags_to_run(tmp_path, monkeypatch, capsys):
    seen = {}

    def fake_run(keys, scale, runs_root, out, jobs=None, progress=True, failed=None, threads=None):
        seen.update(keys=keys, scale=scale, runs_root=runs_root, out=out, jobs=jobs,
                    progress=progress, threads=threads)  # fmt: skip
        failed.extend(["sdgp.fig8", "sdgp.fig9"])
        return tmp_path / "o" / "index.html"

    monkeypatch.setattr(reproductions, "run", fake_run)
    monkeypatch.setenv("PDTBENCH_DATA_DIR", "")  # restored after the test, as main sets it
    argv = ["sdgp.table1", "--scale", "smoke", "--runs-root", str(tmp_path / "r"),
            "--out", str(tmp_path / "o"), "--jobs", "2", "--no-progress",
            "--data-dir", "cifar10=/d/c10", "--data-dir", "/d/rest"]  # fmt: skip
    assert reproductions.main(argv) == 1
    assert seen == {
        "keys": ["sdgp.table1"],
        "scale": "smoke",
        "runs_root": str(tmp_path / "r"),
        "out": str(tmp_path / "o"),
        "jobs": 2,
        "progress": False,
        "threads": None,
    }
    assert os.environ["PDTBENCH_DATA_DIR"] == f"cifar10=/d/c10{os.pathsep}/d/rest"
    out = capsys.readouterr().out
    assert f"report: {tmp_path / 'o' / 'index.html'}" in out
    assert "2 target(s) failed: sdgp.fig8, sdgp.fig9 (see the report)" in out


def test_demo_passes_jobs_threads_and_the_failed_list_to_run(tmp_path, monkeypatch):
    seen = {}

    def fake_run(keys, scale, runs_root, out, jobs=None, progress=True, failed=None, threads=None):
        seen.update(runs_root=runs_root, out=out, jobs=jobs, failed=failed, threads=threads)
        return out / "index.html"

    monkeypatch.setattr(reproductions, "run", fake_run)
    failed: list[str] = []
    path = reproductions.demo("smoke", out=tmp_path / "o", runs_root=tmp_path / "r", jobs=3,
                              failed=failed, threads=2)  # fmt: skip
    assert seen == {"runs_root": tmp_path / "r", "out": tmp_path / "o", "jobs": 3,
                    "failed": failed, "threads": 2}  # fmt: skip
    assert seen["failed"] is failed and path == tmp_path / "o" / "index.html"


def test_run_plans_every_loaded_target_then_judges_the_claims_and_renders(
    tmp_path, monkeypatch, capsys
):
    import reproductions.claims
    import reproductions.parallel
    from impl.report.results import ResultSet

    good = Target(key="sdgp.table1", title="T1", description="d", rows=lambda scale: [])
    broken = Target(key="sdgp.fig8", title="F8", description="d", rows=lambda scale: [])

    def load(key):
        if key == "sdgp.fig9":
            raise SyntaxError("bad module")
        return broken if key == "sdgp.fig8" else good

    def run_target(target, scale, root):
        if target is broken:
            raise RuntimeError("no rows")
        return ResultSet(target=target.key, title=target.title, scale=scale)

    calls = {}
    monkeypatch.setattr(reproductions, "load_target", load)
    monkeypatch.setattr(reproductions, "expected_targets", lambda scale="cpu": [{"at": scale}])
    monkeypatch.setattr(reproductions.parallel, "default_jobs", lambda scale: 5)

    def plan_runs(targets, scale, root):
        calls["plan"] = (list(targets), scale)
        return ["p"]

    def train_all(plan, jobs, threads, progress):
        calls["train"] = (plan, jobs, threads, progress)

    monkeypatch.setattr(reproductions.parallel, "plan_runs", plan_runs)
    monkeypatch.setattr(reproductions.parallel, "train_all", train_all)
    monkeypatch.setattr(common, "run_target", run_target)
    monkeypatch.setattr(reproductions.claims, "save", lambda scale, root: f"claims-{scale}")
    monkeypatch.setattr(
        reproductions.claims,
        "summary_lines",
        lambda claims, keys: [f"{claims} for {', '.join(keys)}"],
    )
    monkeypatch.setattr(common, "render", lambda runs, reports, expected: (runs, reports, expected))
    failed: list[str] = []
    runs_root, reports = tmp_path / "r", tmp_path / "o"
    keys = ["sdgp.table1", "sdgp.fig8", "sdgp.fig9"]
    got = reproductions.run(keys, "smoke", runs_root, reports, progress=False, failed=failed)
    assert got == (runs_root, reports, [{"at": "smoke"}])
    assert calls == {"plan": ([good, broken], "smoke"), "train": (["p"], 5, None, False)}
    assert failed == ["sdgp.fig8", "sdgp.fig9"]
    out = capsys.readouterr().out
    assert "[sdgp.fig9] FAILED to load: SyntaxError: bad module" in out
    assert (
        "[sdgp.fig9] FAILED: ImportError: reproductions module of sdgp.fig9 failed to load" in out
    )
    assert "[sdgp.table1] done in" in out and "[sdgp.fig9] done in" not in out
    assert "claims-smoke for sdgp.table1, sdgp.fig8, sdgp.fig9" in out
    saved = json.loads((runs_root / "results/sdgp.fig8/smoke/result.json").read_text())
    assert saved["title"] == "F8"
    assert saved["missing"] == [{"row": "sdgp.fig8", "reason": "failed: RuntimeError: no rows"}]
    reproductions.run([], "smoke", runs_root, reports, jobs=1, progress=True)
    assert calls["train"] == (["p"], 1, None, True)


def test_prunetrain_short_run_label_names_both_ratios_at_gpu_scale_too():
    from reproductions.prunetrain import ratio_label

    assert ratio_label("gpu", 0.25) == "ratio 0.25, run at 0.85"
    assert ratio_label("smoke", 0.2) == "ratio 0.2"
    assert ratio_label("cpu", 0.3) == "ratio 0.3"  # a ratio the map does not know


def test_a_dynamic_batch_row_is_flagged_only_when_no_seed_grew_its_batch():
    from reproductions.prunetrain import unchanged_batch_flag

    def run(nexts):
        metrics = [
            {"epoch": e, "batch_size": 32, "next_batch_size": b} for e, b in enumerate(nexts)
        ]
        return RunRecord("p", 0, {}, metrics, True, {"batch_size": 32})

    label = "PruneTrain, dynamic mini-batch"
    grew, fixed = run([32, 64, 64]), run([32, 32, 32])
    assert unchanged_batch_flag(RowResult(row=Row(label), runs=[fixed, grew])) == ""
    assert unchanged_batch_flag(RowResult(row=Row(label), runs=[fixed, fixed])) == (
        "batch never grew"
    )
    assert unchanged_batch_flag(RowResult(row=Row(label), runs=[])) == ""


def test_prunetrain_table2_times_resnet32_on_cifar100_at_batches_10_and_100():
    from reproductions.prunetrain import table2

    rows = table2.rows("paper")
    dense, pt, *timed = rows
    assert dense.train["data"] == pt.train["data"] == "cifar100"
    assert dense.train["model"] == "resnet32"
    assert [r.group["batch"] for r in timed] == [10, 10, 100, 100]
    for r in timed:
        b = r.group["batch"]
        assert r.params == {"row": pt.label, "dense_row": dense.label, "batch": b}
        if r.label.startswith("dense"):
            assert r.measure_keys == {f"images_per_second_bs{b}": "dense"}
            assert r.paper["method"] == "dense"
        else:
            assert r.measure_keys == {f"images_per_second_bs{b}": "prunetrain",
                                      f"speedup_bs{b}": "speedup"}  # fmt: skip
            assert r.paper == {"model": "resnet32", "dataset": "cifar100", "method": "prunetrain"}
    # one bar of ours per batch: the dense rows' measurement is the same one
    measured = {"dense": 100.0, "prunetrain": 150.0, "speedup": 1.5}
    results = [RowResult(row=r, measured=measured) for r in timed]
    _, speedup = table2.figures(results, "paper", paper_values("prunetrain", "table2"))
    ours = [(d["batch"], d["speedup"]) for d in speedup.data if d["source"] == "ours (paper)"]
    assert ours == [(10, 1.5), (100, 1.5)]


def test_prunetrain_table3_trains_resnet56_and_counts_removed_layers():
    from reproductions.prunetrain import table3

    for scale in ("gpu", "paper"):
        dense, pt = table3.rows(scale)
        assert dense.train["model"] == pt.train["model"] == "resnet56", scale
        assert pt.paper == {"model": "resnet56", "method": "prunetrain"} and not dense.paper
    assert table3.rows("paper")[0].train["epochs"] == 182
    # two reconfigurations removed one BasicBlock path each: 2 conv layers apiece
    run = RunRecord("p", 0, {"reconfigurations": [
        {"removed_layers": ["layer1.0.conv1", "layer1.0.conv2"]}, {"removed_layers": []},
        {"removed_layers": ["layer3.4.conv1", "layer3.4.conv2"]}]}, [], True)  # fmt: skip
    unit, fn = table3.TARGET.metric_table["removed_layers"]
    assert unit == "layers" and fn(run, None) == 4.0


def test_prunetrain_table4_training_time_saved_is_100_minus_the_time_share():
    from reproductions.prunetrain import table4

    def run(steps):
        return RunRecord("r", 0, {}, [{"epoch": e, "train_seconds": s}
                                      for e, s in enumerate(steps)], True)  # fmt: skip

    # 6 of dense's 10 seconds: 40% saved (the paper's 34% for CIFAR-100's naive row)
    assert table4.train_time_reduction(run([3.0, 3.0]), run([5.0, 5.0])) == pytest.approx(40.0)


def test_prunetrain_fig2_rows_sweep_three_ratios_and_the_paper_reads_ratio_02():
    from reproductions.prunetrain import fig2

    rows = fig2.rows("paper")
    assert rows[0].method == "dense" and rows[0].train["model"] == "prunetrain_resnet50"
    pts = rows[1:]
    assert [r.options["penalty_ratio"] for r in pts] == [0.1, 0.2, 0.25]
    assert [r.paper for r in pts] == [{}, {"method": "one-time reconfiguration"}, {}]
    # at cpu scale the paper's ratios are named beside the one run
    assert [r.group["ratio"] for r in fig2.rows("cpu")[1:]] == [
        "ratio 0.1, run at 0.7",
        "ratio 0.2, run at 0.8",
        "ratio 0.25, run at 0.85",
    ]


def test_prunetrain_fig6_counts_every_ratio_of_the_fig8_sweep():
    from reproductions.prunetrain import fig6, fig8

    rows = fig6.rows("cpu")
    *sweep, count = rows
    assert [r.label for r in sweep] == [r.label for r in fig8.rows("cpu")]
    assert count.params == {"rows": [r.label for r in sweep[1:]], "dense_row": sweep[0].label}
    assert len(count.params["rows"]) == 4
    assert count.measure_keys == {"inference_flops_difference_min": "difference_min",
                                  "inference_flops_difference_max": "difference_max"}  # fmt: skip
    # the note names the model and the data the sweep trained (the docstring's scales)
    assert fig6.sweep_model("gpu") == "ResNet-32 on digits"
    paper = fig6.sweep_model("paper")
    assert paper.startswith("ResNet-50") and paper.endswith("on CIFAR-10")
    measured = {"per_row": {sweep[1].label: {"union": 60.0, "gating": 57.0}},
                "difference_min": 3.0, "difference_max": 3.0}  # fmt: skip
    (fig,) = fig6.figures([RowResult(row=count, measured=measured)], "cpu", None)
    assert sorted((d["scheme"], d["flops"]) for d in fig.data) == [
        ("gating", 57.0),
        ("union", 60.0),
    ]


def test_prunetrain_fig7_times_the_papers_shapes_at_gpu_scale():
    from reproductions.prunetrain import fig7

    (row,) = fig7.rows("gpu")
    assert row.params == {"model": "resnet50", "image": 224, "stem": "imagenet",
                          "num_classes": 1000, "batch": 64}  # fmt: skip
    dense, pt, timing = fig7.rows("paper")
    assert dense.train["data"] == "imagenet" and dense.train["model"] == "resnet50"
    assert timing.params == {"row": pt.label, "dense_row": dense.label, "batch": 64}
    layers = [{"name": "layer1.0.conv3", "dense_ms": 3.0, "union_ms": 2.0, "gating_ms": 2.5}]
    (fig,) = fig7.figures([RowResult(row=timing, measured={"layers": layers, "batch": 64})],
                          "paper", None)  # fmt: skip
    assert [(d["scheme"], d["ms"]) for d in fig.data] == [
        ("dense", 3.0),
        ("union", 2.0),
        ("gating", 2.5),
    ]


def test_prunetrain_fig8_sweeps_four_ratios_beside_the_dense_230_mflops():
    from reproductions.prunetrain import fig8

    rows = fig8.rows("paper")
    assert [r.options["penalty_ratio"] for r in rows[1:]] == [0.05, 0.1, 0.15, 0.2]
    paper = paper_values("prunetrain", "fig8")
    dense_paper = lookup(paper, metric="inference_mflops", **rows[0].paper)
    assert list(dense_paper["value"]) == [230]  # Sec. 5.2: 'the dense 230 MFLOPs/inference'
    run = RunRecord("p", 0, {"inference_flops": 230e6}, [], True)
    assert fig8.inference_mflops(run, None) == pytest.approx(230.0)
    unit, fn = fig8.TARGET.metric_table["bn_cost"]
    pt = RunRecord("p", 0, {"method": "prunetrain", "bn_traffic_pct_of_dense": 64.0,
                            "paper_train_flops_pct_of_dense": 50.0}, [], True)  # fmt: skip
    assert fn(pt, None) == 64.0


def test_prunetrain_fig9_compares_the_last_epochs_batch_with_the_papers_final_one():
    from reproductions.prunetrain import fig9

    run = RunRecord("r", 0, {}, [{"epoch": e, "batch_size": 128, "next_batch_size": b}
                                 for e, b in enumerate([128, 192, 320])], True,
                    {"batch_size": 128})  # fmt: skip
    assert fig9.final_batch(run) == 192.0  # the last epoch trained at what epoch 1 set
    assert fig9.final_batch_per_gpu(run) == 48.0  # over the paper's 4 GPUs
    rows = {r.label: r for r in fig9.rows("paper")}
    assert not any("naive" in label for label in rows)
    paper = paper_values("prunetrain", "fig9")
    for label, final in (("cifar100 PruneTrain, dynamic mini-batch", 320),
                         ("imagenet PruneTrain, dynamic mini-batch", 128)):  # fmt: skip
        r = rows[label]
        (m,) = r.metrics
        assert list(lookup(paper, metric=m, **r.paper)["value"]) == [final]


def test_prunetrain_fig10_runs_each_interval_it_names():
    from reproductions.prunetrain import fig10

    for scale, intervals in (("smoke", [1, 2]), ("cpu", [1, 2, 4]), ("gpu", [2, 5, 10]),
                             ("paper", [5, 10, 20])):  # fmt: skip
        dense, *pts = fig10.rows(scale)
        assert [r.options["reconfig_interval"] for r in pts] == intervals, scale
        assert [r.label for r in pts] == [f"PruneTrain, interval {k}" for k in intervals]
    assert fig10.rows("paper")[0].train["model"] == "prunetrain_resnet50"


def test_prunetrain_fig11_projects_the_cost_from_params_and_batch():
    from reproductions.prunetrain import fig11

    # 1000 parameters dense; after epoch 0: 500, after epoch 1: 250. The batch doubles from
    # epoch 2. Per iteration: 1, 0.5, 0.25; per epoch (x 32 / batch): 1, 0.5, 0.125
    metrics = [{"epoch": 0, "params": 500, "batch_size": 32, "next_batch_size": 32},
               {"epoch": 1, "params": 250, "batch_size": 32, "next_batch_size": 64},
               {"epoch": 2, "params": 250, "batch_size": 64, "next_batch_size": 64}]  # fmt: skip
    run = RunRecord("r", 0, {"params_dense": 1000}, metrics, True, {"batch_size": 32})
    assert fig11.comm_cost_saved(run) == pytest.approx(100 * (1 - 1.625 / 3))
    (fig,) = fig11.figures([RowResult(row=Row("pt"), runs=[run])], "cpu", None)
    got = {(d["kind"], d["epoch"]): d["cost"] for d in fig.data}
    assert [got["per iteration", e] for e in (1, 2, 3)] == [1.0, 0.5, 0.25]
    assert [got["per epoch", e] for e in (1, 2, 3)] == [1.0, 0.5, 0.125]
    rows = fig11.rows("paper")
    assert [(r.options["penalty_ratio"], bool(r.options.get("dynamic_batch"))) for r in rows] == [
        (0.2, False),
        (0.25, False),
        (0.25, True),
    ]
    assert all(r.train["data"] == "imagenet" for r in rows)
    assert rows[2].paper == {"setting": "penalty ratio 0.25, 16-256 GPUs"}


def test_sdgp_table1_trains_the_scales_network_and_smooths_labels_as_the_paper():
    """ResNet-20 stands in for ResNet-9 at smoke and cpu; gpu trains ResNet-9 with the paper
    recipe's label smoothing 0.1; the three pruning functions each prune 2:4 against dense."""
    from reproductions.sdgp.table1 import rows

    for scale, model in (("smoke", "resnet20"), ("cpu", "resnet20"), ("gpu", "resnet9")):
        trained = [r for r in rows(scale) if not r.needs]
        assert [r.label for r in trained] == [
            "dense", "SDGP random 2:4", "SDGP magnitude 2:4", "SDGP rescaled 2:4"]  # fmt: skip
        assert {r.train["model"] for r in trained} == {model}
        assert all(r.train.get("label_smoothing", 0.0) == (0.1 if scale == "gpu" else 0.0)
                   for r in trained)  # fmt: skip
        for r in trained[1:]:
            assert (r.options["n"], r.options["m"], r.baseline) == (2, 4, "dense")
            assert r.options["prune_method"] in r.label and "rescale_eps" not in r.options


def test_sdgp_fig8_runs_the_settings_each_scale_names():
    """r = m/n = 2 and 4 for m in {4, 8, 16, 32} (cpu), r = 8 added for m >= 8 (gpu, paper);
    the 4:32 row is read against 2:4, as Sec. V's -0.4 pp."""
    from reproductions.sdgp.fig8 import rows, settings

    assert settings("smoke") == [(2, 4), (4, 32)]
    assert sorted(settings("cpu")) == sorted(
        [(2, 4), (1, 4), (4, 8), (2, 8), (8, 16), (4, 16), (16, 32), (8, 32), (4, 32)]
    )
    assert sorted(settings("gpu")) == sorted(settings("cpu") + [(1, 8), (2, 16)])
    for scale in ("smoke", "cpu", "gpu"):
        out = {r.label: r for r in rows(scale)}
        for r in out.values():
            n, m = r.options["n"], r.options["m"]
            assert r.label == f"{n}:{m}" and r.group == {"m": m, "ratio": f"r={m // n}"}
            assert r.options["prune_method"] == "rescaled"
        assert out["4:32"].baseline == "2:4" and "2:4" in out
        assert out["4:32"].paper == {"setting": "rescaled 4:32 vs 2:4"}
        assert out["4:32"].group["ratio"] == "r=8" and out["2:4"].group["ratio"] == "r=2"


def test_sdgp_fig9_rows_read_the_estimate_at_their_ratio():
    from reproductions.sdgp.fig9 import MEASURE, TARGET

    share, r2, r4 = TARGET.rows("cpu")
    assert {r.measure for r in (share, r2, r4)} == {MEASURE}
    assert r2.measure_keys == {"estimated_runtime_reduction": "reduction_ratio2"}
    assert r4.measure_keys == {"estimated_runtime_reduction": "reduction_ratio4"}
    # the paper's rows: 16.6% at ratio 2 and 24.9% at ratio 4 (Sec. IV-C)
    paper = paper_values("sdgp", "fig9")
    assert lookup(paper, metric="data_grad_time_share", **share.paper).value.tolist() == [33.17]
    assert lookup(paper, metric="estimated_runtime_reduction", **r2.paper).value.tolist() == [16.6]
    assert lookup(paper, metric="estimated_runtime_reduction", **r4.paper).value.tolist() == [24.9]
    for scale, dtype in (("cpu", "float32"), ("gpu", "float16"), ("paper", "float16")):
        assert any(f"Timed in {dtype}" in n for n in TARGET.notes(scale))


def test_sdgp_fig9_times_the_papers_shape_and_counts_no_first_conv_data_gradient(monkeypatch):
    """The paper's shape: ResNet-18, batch 256 of 3 x 224 x 224, in float16 on the GPU; the
    share leaves out the data gradient of a layer that never computes one."""
    import impl.methods.sdgp_timing
    from reproductions.sdgp import measure

    for scale in ("gpu", "paper"):
        assert measure.SHAPES[scale] == {"model": "resnet18", "stem": "imagenet", "batch": 256,
                                         "image": 224}  # fmt: skip
        assert measure.DTYPES[scale] == torch.float16
    layers = [{"name": "conv1", "data_grad_needed": False, "fwd_ms": 1.0, "dgrad_ms": 5.0,
               "wgrad_ms": 1.0, "prune_ms": 0.0},
              {"name": "conv2", "data_grad_needed": True, "fwd_ms": 2.0, "dgrad_ms": 2.0,
               "wgrad_ms": 2.0, "prune_ms": 0.0}]  # fmt: skip
    seen = []

    def profile(model, shape, batch, n, m, repeats, amp_dtype=None):
        seen.append((shape, batch, amp_dtype))
        return [dict(layer) for layer in layers]

    monkeypatch.setattr(impl.methods.sdgp_timing, "profile_conv_layers", profile)
    out = measure.conv_times(scale="smoke", context={}, repeats=1, sweeps=1)
    # data gradient 2 of 1 + 2 + 1 + 2 + 2 = 8 ms: 25%; x 1/2 and x 3/4 at ratios 2 and 4
    assert out["data_grad_time_share"] == pytest.approx(25.0)  # one sweep: the number
    assert out["reduction_ratio2"] == pytest.approx(12.5)
    assert out["reduction_ratio4"] == pytest.approx(18.75)
    assert seen == [((3, 32, 32), 4, None)] and out["dtype"] == "float32"


def test_sdgp_fig10_reads_the_target_of_the_paper_and_saves_nothing_for_dense():
    """Fig. 10's target is 94.5% on CIFAR-10; an epoch reaching exactly the target counts; a
    dense run saves nothing whatever its profile says."""
    from reproductions.sdgp.fig10 import TARGET_TOP1, estimated_tta, relative_speedup

    paper = paper_values("sdgp", "fig10")
    assert lookup(paper, metric="target_top1").value.tolist() == [94.5]
    assert TARGET_TOP1["paper"] == TARGET_TOP1["gpu"] == 94.5
    exact = _curve([80.0, 94.5, 96.0], scale="paper", method="sdgp", seconds=[4.0, 4.0, 4.0],
                   saved=0.5)  # fmt: skip
    assert estimated_tta(exact, None) == pytest.approx(4.0)  # 2 epochs of 4 s, half saved
    dense = _curve([80.0, 94.5], scale="paper", seconds=[4.0, 6.0], saved=0.5)
    assert estimated_tta(dense, None) == pytest.approx(10.0)
    assert relative_speedup(exact, dense) == pytest.approx(100.0)  # 2 x 1 against 2 x 0.5


def test_sdgp_fig10_compares_4_32_with_16_32_and_profiles_every_setting():
    from reproductions.sdgp.fig10 import rows

    for scale in ("smoke", "cpu", "gpu"):
        out = rows(scale)
        assert out[0].label == "dense" and out[0].method == "dense"
        for r in out[1:]:
            assert r.options["profile"] is True and r.method == "sdgp"
            assert r.options["prune_method"] == "rescaled"
        (rel,) = [r for r in out if r.metrics == ("tta_relative_speedup",)]
        assert rel.baseline == "16:32" and (rel.options["n"], rel.options["m"]) == (4, 32)
        assert rel.paper == {"setting": "rescaled 4:32 vs 16:32"}
    assert [r.label for r in rows("cpu")][1:4] == ["2:4", "16:32", "4:32"]
    assert len(rows("gpu")) == 1 + 8 + 1


def test_campfire_timeline_maps_the_papers_epochs_onto_the_scale():
    """Sec. 3 / App. B.3: 100 epochs, lr 0.05 at batch 64 (0.1 at batch 256), momentum 0.9,
    weight decay 1e-4, the rate x0.1 at epochs 30, 60 and 90."""
    from reproductions.campfire import campfire_row, dense_row, to_scale, top1_at, train_for

    cpu = train_for("cpu")
    assert (cpu["epochs"], cpu["milestones"], cpu["lr"], cpu["weight_decay"]) == (
        10, [3, 6, 9], 0.05, 1e-4)  # fmt: skip
    assert train_for("cpu", last_drop=80)["milestones"] == [3, 6, 8]
    assert (train_for("cpu", batch=256)["batch_size"], train_for("cpu", batch=256)["lr"]) == (
        256, 0.1)  # fmt: skip
    assert train_for("cpu", batch=128)["lr"] == 0.05
    assert train_for("gpu")["epochs"] == 30 and train_for("gpu")["milestones"] == [9, 18, 27]
    assert dense_row("cpu").train == cpu and to_scale(45, "cpu") == 4
    # at smoke (4 epochs) an era of 20 of 100 is under one epoch: it still prunes for one
    row = campfire_row("smoke", "ck", 40, 70)
    assert (row.options["start_epoch"], row.options["era_epochs"]) == (2, 1)
    assert row.options["final_sparsity"] == 0.7 and row.label == "ck, start 40, sparsity 70%"
    long = campfire_row("cpu", "combined", 40, 60, era=30)
    assert long.label == "combined, start 40, era 40-70, sparsity 60%"
    assert (long.options["start_epoch"], long.options["era_epochs"]) == (4, 3)
    # epoch 90 of a 4-epoch run is its 4th (round(3.6)), not its 3rd
    assert top1_at(0.9)(_curve([10.0, 20.0, 30.0, 40.0])) == 40.0


def test_campfire_fgsm_measure_reads_each_seeds_run_per_epsilon(monkeypatch):
    import impl.robustness
    from reproductions.campfire.measure import fgsm

    top1 = {"a": {0.1: 50.0, 0.2: 30.0}, "b": {0.1: 40.0, 0.2: 20.0}}

    def attack(path, eps, device):
        return [{"eps": e, "top1": top1[path][e]} for e in eps]

    monkeypatch.setattr(impl.robustness, "eval_fgsm_run", attack)
    out = fgsm(scale="cpu", context={"runs": {"ck": ["a", "b"]}}, row="ck", eps=[0.1, 0.2])
    assert out["eps_0.1"] == [50.0, 40.0] and out["eps_0.2"] == [30.0, 20.0]
    assert out["mean"] == {"eps_0.1": 45.0, "eps_0.2": 25.0}
    with pytest.raises(ValueError, match="'ck' has no finished run"):
        fgsm(scale="cpu", context={"runs": {"ck": []}}, row="ck", eps=[0.1])


def test_campfire_table1_rows_prune_the_first_quarter_at_the_scales_targets():
    from reproductions.campfire.table1 import TARGET

    for scale, sparsities, era in (("smoke", [60], 1), ("cpu", [40, 80], 2),
                                   ("gpu", [20, 40, 60, 80], 7)):  # fmt: skip
        rows = TARGET.rows(scale)
        assert rows[0].label == "dense" and not rows[0].needs
        for mask in ("window", "ck"):
            mine = [r for r in rows if r.group.get("mask") == mask]
            assert [r.options["final_sparsity"] for r in mine] == [s / 100 for s in sparsities]
            assert {(r.options["start_epoch"], r.options["era_epochs"]) for r in mine} == {
                (0, era)}  # fmt: skip
    best = _curve([50.0, 70.0, 60.0], best_top1=70.0)
    assert TARGET.extra_metrics["top1"][1](best, None) == 70.0  # the best, not the last


def test_campfire_table2_grid_at_each_scale():
    from reproductions.campfire.table2 import TARGET, _ck_starts, _start_30, grid

    cpu = grid("cpu")
    assert len(cpu) == 10 and {sp for _, _, sp, _ in cpu[:8]} == {70}
    assert ("window", 30, 70, 20) in cpu and ("window", 0, 70, 20) in cpu
    assert cpu[8:] == [("ck", 40, 60, 20), ("combined", 40, 60, 20)]
    gpu = grid("gpu")
    assert ("window", 0, 40, 20) not in gpu and ("window", 30, 40, 20) not in gpu
    assert ("ck", 40, 40, 20) in gpu and len(gpu) == 6 * 4 + 2 * 3 + 4
    assert [g for g in gpu if g[3] == 30] == [
        ("ck", 40, 60, 30),
        ("ck", 40, 70, 30),
        ("combined", 40, 60, 30),
        ("combined", 40, 70, 30),
    ]
    rows = TARGET.rows("cpu")
    assert [r.label for r in rows if _start_30(r)] == [
        "dense",
        "ck, start 30, sparsity 70%",
        "combined, start 30, sparsity 70%",
        "window, start 30, sparsity 70%",
    ]
    assert [r.label for r in rows if _ck_starts(r)] == [
        "dense",
        "ck, start 40, sparsity 70%",
        "ck, start 30, sparsity 70%",
        "ck, start 20, sparsity 70%",
    ]


def test_campfire_tables_3_and_8_read_table_2s_runs_at_epoch_90():
    from reproductions.campfire import table3, table8

    run = _curve([10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 91.0, 95.0])
    dense = _curve([11.0, 21.0, 31.0, 41.0, 51.0, 61.0, 71.0, 81.0, 90.0, 99.0])
    assert table3.TARGET.extra_metrics["top1"][1](run, None) == 91.0
    assert table3.delta_at_90(run, dense) == pytest.approx(1.0)
    assert table8.gain(run) == pytest.approx(4.0)
    rows = table8.rows("cpu")
    assert rows[0].label == "dense" and rows[0].paper == {"method": "dense"}
    assert rows[0].metrics is None  # the dense row's gain is in the paper's table
    paper = paper_values("campfire", "table8")
    assert lookup(paper, metric="top1_gain_90_to_100", **rows[0].paper).value.tolist() == [1.04]


def test_campfire_table4_reads_each_case_at_epochs_90_and_100():
    from reproductions.campfire.table4 import TARGET

    rows = {r.label: r for r in TARGET.rows("cpu")}
    r90, r100 = (
        rows["ck, start 40, sparsity 60% (epoch 90)"],
        rows["ck, start 40, sparsity 60% (epoch 100)"],
    )
    assert r90.measure_keys["top1"] == "top1_at_90" and r100.measure_keys["top1"] == "top1"
    assert r90.paper["setting"] == "ck, start 40, epoch 90"
    assert r90.measure_keys["sparsity"] == "sparsity_pct"
    run = _curve([1.0] * 9 + [2.0], true_sparsity=0.6)
    assert TARGET.extra_metrics["sparsity_pct"][1](run, None) == pytest.approx(60.0)
    assert TARGET.extra_metrics["top1_at_90"][1](run, None) == 1.0
    pt = next(r for r in rows.values() if r.method == "prunetrain")
    assert pt.measure_keys == {"sparsity": "inference_flops_saved"}
    paper_pt = next(r for r in TARGET.rows("paper") if r.method == "prunetrain")
    assert (paper_pt.train["model"], paper_pt.train["data"]) == ("resnet50", "imagenet")


def test_campfire_table5_trains_dense_and_campfire_at_batch_256():
    from reproductions.campfire.table5 import TARGET

    rows = TARGET.rows("cpu")
    assert [r.label for r in rows] == ["dense", "ck, start 30, sparsity 70%",
                                       "window, start 30, sparsity 70%",
                                       "combined, start 30, sparsity 70%"]  # fmt: skip
    assert {(r.train["batch_size"], r.train["lr"]) for r in rows} == {(256, 0.1)}
    assert len(TARGET.rows("gpu")) == 10


def test_campfire_table6_attacks_each_model_at_the_papers_epsilons():
    from reproductions.campfire.table6 import EPS, MEASURE, TARGET

    paper = paper_values("campfire", "table6")
    attacked = paper[paper.metric == "fgsm_top1"].setting
    assert sorted(EPS) == sorted({float(s.rsplit("eps ", 1)[1]) for s in attacked})
    rows = TARGET.rows("cpu")
    models = [r.label for r in rows if not r.measure]
    assert models == ["dense", "combined, start 40, sparsity 60%",
                      "combined, start 40, sparsity 70%", "window, start 30, sparsity 70%",
                      "ck, start 40, sparsity 60%", "ck, start 30, sparsity 70%"]  # fmt: skip
    assert [r.label for r in TARGET.rows("smoke") if not r.measure] == [
        "dense", "ck, start 30, sparsity 70%"]  # fmt: skip
    attacks = [r for r in rows if r.measure == MEASURE]
    assert len(attacks) == len(models) * 6
    for r in attacks:
        e = r.group["eps"]
        assert r.measure_keys == {"fgsm_top1": f"eps_{e}"} and r.params["row"] == r.group["model"]
        assert len(lookup(paper, metric="fgsm_top1", **r.paper)) == 1, r.label
    dense_05 = next(r for r in attacks if r.group == {"model": "dense", "eps": 0.05})
    assert lookup(paper, metric="fgsm_top1", **dense_05.paper).value.tolist() == [41.71]


def test_campfire_table9_rows_drop_the_rate_at_80_against_table_2s_run():
    from reproductions.campfire.table9 import TARGET

    rows = TARGET.rows("cpu")
    pairs = [(r.baseline, r.label) for r in rows if r.label.endswith("last drop at 80")]
    assert pairs == [
        ("ck, start 40, sparsity 60%", "ck, start 40, sparsity 60%, last drop at 80"),
        ("combined, start 40, sparsity 60%", "combined, start 40, sparsity 60%, last drop at 80"),
        ("window, start 0, sparsity 60%", "window, start 0, sparsity 60%, last drop at 80"),
    ]
    by = {r.label: r for r in rows}
    for ref, early in pairs:
        assert by[early].train["milestones"] == [3, 6, 8]
        assert by[ref].train["milestones"] == [3, 6, 9]
        assert by[early].options == by[ref].options
