"""The papers' headline claims: verdict rules, reading saved results, the claims report."""

from __future__ import annotations

import math
import shutil

import pytest

from impl.report import render_reports
from impl.report.results import FigureSpec, ResultSet, load_result, load_results, save_result
from reproductions import claims as C
from reproductions.common import result_dir


def _claim(**kw) -> C.Claim:
    base = dict(paper="p", claim="c", metric="m", paper_value=10.0, unit="x", source="s",
                rule="r", needs="p.fig1", read=lambda results: None)  # fmt: skip
    base.update(kw)
    return C.Claim(**base)


def _ev(low: float, high: float, n: int = 5) -> C.Evidence:
    return C.Evidence((low + high) / 2, None, n, low, high, "t")


@pytest.mark.parametrize(
    ("higher", "low", "high", "verdict"),
    [(True, 10.0, 12.0, "holds"), (True, 8.0, 9.9, "does not hold"),
     (True, 9.0, 11.0, "inconclusive"), (False, 8.0, 10.0, "holds"),
     (False, 10.5, 12.0, "does not hold"), (False, 9.0, 11.0, "inconclusive")],
    ids=["at-least-holds", "at-least-misses", "at-least-straddles", "at-most-holds",
         "at-most-misses", "at-most-straddles"],
)  # fmt: skip
def test_judge_compares_the_whole_interval_with_the_papers_number(higher, low, high, verdict):
    assert C.judge(_claim(higher_is_better=higher), _ev(low, high)) == verdict


def test_judge_at_the_edges_two_seeds_and_an_interval_ending_on_the_bound():
    claim = _claim(paper_value=10.0)
    assert C.judge(claim, _ev(10.5, 12.0, n=C.MIN_N)) == "holds"  # two seeds are judged
    assert C.judge(claim, _ev(10.5, 12.0, n=C.MIN_N - 1)) == "inconclusive"
    assert C.judge(claim, _ev(8.0, 10.0)) == "inconclusive"  # touches the bound: not below it
    assert C.judge(_claim(higher_is_better=False), _ev(10.0, 12.0)) == "inconclusive"


def test_a_no_significant_loss_claim_is_judged_against_the_papers_margin():
    # SDGP's "without significant loss" is "within 0.3% across all models" (Sec. V): a
    # non-inferiority bound. An interval that merely reaches 0 used to count as "holds", so
    # noisier data (a wider interval) made "holds" easier.
    (sdgp,) = [c for c in C.CLAIMS if c.paper == "sdgp" and "significant loss" in c.claim]
    assert sdgp.paper_value == -0.3 and sdgp.higher_is_better
    assert C.judge(sdgp, _ev(-0.25, 0.4)) == "holds"
    assert C.judge(sdgp, _ev(-0.9, -0.35)) == "does not hold"
    assert C.judge(sdgp, _ev(-0.77, 0.21)) == "inconclusive"  # the committed cpu interval
    assert C.judge(sdgp, _ev(-17.6, 14.1, n=2)) == "inconclusive"  # wide: never "holds"
    assert C.judge(sdgp, None) == "not measured at this scale"


def _row(row, metric, ours, sd=None, n=1, scale="cpu"):
    return {"row": row, "metric": metric, "ours": ours, "ours_sd": sd, "n": n, "scale": scale}


def _cross(click_delta=-0.5, click_cr=8.33, prune_cr=1.5, sd=0.4) -> ResultSet:
    rows = [
        _row("clicktrain", "delta_top1", click_delta, sd, 5),
        _row("prunetrain", "delta_top1", -2.3, sd, 5),
        _row("sdgp", "delta_top1", -0.3, sd, 5),
        _row("campfire", "delta_top1", 0.0, sd, 5),
        _row("clicktrain", "compression_ratio", click_cr, 0.0, 5),
        _row("prunetrain", "compression_ratio", prune_cr, 0.1, 5),
        _row("dense", "run_iter_ms", 30.0, 1.0, 5),
        _row("clicktrain", "run_iter_ms", 60.0, 1.0, 5),
        _row("prunetrain", "train_flops_saved", 45.0, 1.0, 5),
    ]
    return ResultSet(target="cross.methods", title="cross", scale="cpu", rows=rows)


def _by_claim(rows):
    return {r["row"]: r for r in rows}


def test_evaluate_reads_the_cross_table_and_marks_what_is_missing():
    rows = _by_claim(C.evaluate({"cross.methods": _cross()}, "cpu"))
    assert len(rows) == len(C.CLAIMS)
    # ClickTrain -0.5 +- CI vs PruneTrain -2.3 +- CI (sd 0.4, n 5: half-width 0.497) at 8.33x > 1.5x
    assert rows["clicktrain: more accuracy and more compression than PruneTrain"]["verdict"] == (
        "holds"
    )
    slow = rows["clicktrain: no extra training time over dense training"]
    # a ratio of two means without per-seed values is one number: no interval, no verdict
    assert slow["ours"] == pytest.approx(2.0) and slow["verdict"] == "inconclusive"
    assert slow["verdict_reason"] == C.NO_INTERVAL
    flops = [k for k in rows if k.startswith("prunetrain: 30% fewer training FLOPs")]
    assert len(flops) == 1 and rows[flops[0]]["verdict"] == "holds"  # CI [43.8, 46.2] >= 30
    assert rows["campfire: under 1% accuracy loss at 70% sparsity"]["verdict"] == "holds"
    sdgp = rows["sdgp: 2:4 rescaled gradient pruning without significant loss of accuracy"]
    assert sdgp["verdict"] == "inconclusive" and "95% CI [-0.80, 0.20]" in sdgp["note"]
    fig9 = rows["clicktrain: CSR conversion with predefined positions 4x faster than dense-to-CSR"]
    assert fig9["verdict"] == "not measured at this scale" and fig9["ours"] is None
    assert fig9["n"] == 0 and fig9["ours_sd"] is None
    assert "pdtbench reproduce clicktrain.fig9 --scale cpu" in fig9["note"]


def test_more_accuracy_at_less_compression_does_not_hold():
    rows = _by_claim(C.evaluate({"cross.methods": _cross(click_cr=1.2, prune_cr=1.5)}, "cpu"))
    row = rows["clicktrain: more accuracy and more compression than PruneTrain"]
    assert row["verdict"] == "does not hold" and "compresses no more" in row["note"]


def test_equal_compression_is_not_more_compression():
    rows = _by_claim(C.evaluate({"cross.methods": _cross(click_cr=1.5, prune_cr=1.5)}, "cpu"))
    row = rows["clicktrain: more accuracy and more compression than PruneTrain"]
    assert row["verdict"] == "does not hold" and "compresses no more" in row["note"]


def test_two_seeds_are_enough_for_an_interval_paired_or_not():
    """MIN_N = 2: two seeds give a t interval (t(0.975, 1) = 12.706205), paired by seed where
    both rows kept per-seed values, else from each row's own interval."""
    t1 = 12.706205
    unpaired = ResultSet(target="cross.methods", title="t", scale="cpu", rows=[
        _row("clicktrain", "delta_top1", -0.5, 0.1, 2),
        _row("prunetrain", "delta_top1", -2.3, 0.1, 2),
        _row("clicktrain", "compression_ratio", 8.33), _row("prunetrain", "compression_ratio", 1.5),
        _row("sdgp", "delta_top1", 0.0, 0.5, 2),
    ])  # fmt: skip
    rows = _by_claim(C.evaluate({"cross.methods": unpaired}, "cpu"))
    row = rows["clicktrain: more accuracy and more compression than PruneTrain"]
    half = t1 * 0.1 / math.sqrt(2)
    assert row["n"] == 2 and "non-overlap" in row["note"]
    assert f"95% interval [{1.8 - 2 * half:+.2f}, {1.8 + 2 * half:+.2f}]" in row["note"]
    one = rows["sdgp: 2:4 rescaled gradient pruning without significant loss of accuracy"]
    half = t1 * 0.5 / math.sqrt(2)  # one row's mean with its own interval, n = 2
    assert f"95% CI [{0.0 - half:.2f}, {0.0 + half:.2f}] (n=2)" in one["note"]
    paired = ResultSet(target="sdgp.table1", title="t", scale="cpu", rows=[
        {**_row("SDGP rescaled 2:4", "delta_top1", 0.0, 0.5, 2), "seeds": [3, 7],
         "values": [0.5, -0.5]},
        {**_row("SDGP random 2:4", "delta_top1", -1.0, 0.5, 2), "seeds": [3, 7],
         "values": [-0.4, -1.6]},
    ])  # fmt: skip
    row = _by_claim(C.evaluate({"sdgp.table1": paired}, "cpu"))[
        "sdgp: random pruning loses more accuracy than rescaled magnitude pruning"
    ]
    half = t1 * math.sqrt(0.02) / math.sqrt(2)  # differences 0.9 and 1.1: sd 0.1414
    assert "paired over seeds [3, 7]" in row["note"]
    assert f"[{1.0 - half:+.2f}, {1.0 + half:+.2f}]" in row["note"]


def test_a_claim_of_more_needs_an_interval_strictly_above_the_bound():
    # "lies above 0": every seed's difference exactly 0 ([0, 0]) is no evidence of "more"
    # (on digits one test image is 0.28 pp, so equal accuracies happen); it held before
    strict = _claim(paper_value=0.0, strict=True)
    assert C.judge(strict, _ev(0.0, 0.0)) == "does not hold"
    assert C.judge(strict, _ev(0.0, 0.4)) == "inconclusive"
    assert C.judge(strict, _ev(0.01, 0.4)) == "holds"
    assert C.judge(strict, _ev(-0.4, 0.0)) == "does not hold"
    assert C.judge(_claim(paper_value=0.0), _ev(0.0, 0.4)) == "holds"  # "at least": reached
    for c in C.CLAIMS:  # the claims whose rule says "above" are the strict ones
        assert c.strict == ("lies above" in c.rule or "is above" in c.rule), c.claim
    zero = ResultSet(target="sdgp.table1", title="t", scale="cpu", rows=[
        {**_row("SDGP rescaled 2:4", "delta_top1", -0.28, 0.0, 3), "seeds": [0, 1, 2],
         "values": [-0.28, -0.28, -0.28]},
        {**_row("SDGP random 2:4", "delta_top1", -0.28, 0.0, 3), "seeds": [0, 1, 2],
         "values": [-0.28, -0.28, -0.28]},
    ])  # fmt: skip
    row = _by_claim(C.evaluate({"sdgp.table1": zero}, "cpu"))[
        "sdgp: random pruning loses more accuracy than rescaled magnitude pruning"
    ]
    assert row["verdict"] == "does not hold"


def test_a_paired_difference_counts_the_seeds_it_pairs():
    # rescaled on five seeds, random on two: the interval is over the two paired seeds, and
    # so are the n shown and saved (it said n=5)
    rows = ResultSet(target="sdgp.table1", title="t", scale="cpu", rows=[
        {**_row("SDGP rescaled 2:4", "delta_top1", 0.0, 0.5, 5), "seeds": [0, 1, 2, 3, 4],
         "values": [0.5, -0.5, 0.2, -0.2, 0.0]},
        {**_row("SDGP random 2:4", "delta_top1", -1.0, 0.5, 2), "seeds": [0, 1],
         "values": [-0.4, -1.6]},
    ])  # fmt: skip
    row = _by_claim(C.evaluate({"sdgp.table1": rows}, "cpu"))[
        "sdgp: random pruning loses more accuracy than rescaled magnitude pruning"
    ]
    assert row["n"] == 2 and "(n=2)" in row["note"] and "paired over seeds [0, 1]" in row["note"]
    # a per-seed value saved as null (an inf or NaN) is left out of the pairing, not a crash
    rows.rows[1]["seeds"], rows.rows[1]["values"] = [0, 1, 2], [-0.4, -1.6, None]
    row = _by_claim(C.evaluate({"sdgp.table1": rows}, "cpu"))[
        "sdgp: random pruning loses more accuracy than rescaled magnitude pruning"
    ]
    assert "paired over seeds [0, 1]" in row["note"]
    # rows sharing one seed are not paired on it (one pair has no spread): each row's
    # interval is over its own two seeds, and their non-overlap decides
    rows.rows[0]["seeds"], rows.rows[0]["values"] = [3, 7], [0.5, -0.5]
    rows.rows[0].update(ours=0.0, ours_sd=math.sqrt(0.5), n=2)
    rows.rows[1]["seeds"], rows.rows[1]["values"] = [7, 9], [-0.3, -1.7]
    rows.rows[1].update(ours=-1.0, ours_sd=math.sqrt(0.98), n=2)
    row = _by_claim(C.evaluate({"sdgp.table1": rows}, "cpu"))[
        "sdgp: random pruning loses more accuracy than rescaled magnitude pruning"
    ]
    assert row["n"] == 2 and row["ours"] == pytest.approx(1.0)
    assert "non-overlap" in row["note"] and "paired over" not in row["note"]


def test_a_mean_saved_without_its_standard_deviation_is_judged_as_one_value():
    # n = 5 but no sd: no interval to compare, so inconclusive (it was judged as exact)
    fig9 = ResultSet(target="clicktrain.fig9", title="t", scale="cpu", rows=[
        _row("pattern CSR with predefined positions", "speedup_vs_cusparse", 4.5, None, 5),
    ])  # fmt: skip
    (claim,) = [c for c in C.CLAIMS if c.needs == "clicktrain.fig9"]
    ev = claim.read({"clicktrain.fig9": fig9})
    assert ev.n == 1 and "no standard deviation saved" in ev.text
    assert C.judge(claim, ev) == "inconclusive"


def test_a_timed_claim_names_its_device_and_what_its_interval_covers():
    """A timing's interval is of repeats within one reproduction: the row says so and names
    the device that timed it (the CPU's model and ISA, or the GPU), where "Our setting" was
    empty; a measurement target's shared training setup is shown too."""
    fig9 = ResultSet(target="clicktrain.fig9", title="t", scale="cpu", rows=[
        _row("pattern CSR with predefined positions", "speedup_vs_cusparse", 2.0, 0.05, 5),
    ], environment={"cpu_model": "AMD EPYC", "cpu_capability": "AVX512"})  # fmt: skip
    fig11 = ResultSet(target="prunetrain.fig11", title="t", scale="cpu",
                      setup="ResNet-20 on digits (16x16 px), 8 epochs")  # fmt: skip
    rows = _by_claim(C.evaluate({"clicktrain.fig9": fig9, "prunetrain.fig11": fig11}, "cpu"))
    csr = rows["clicktrain: CSR conversion with predefined positions 4x faster than dense-to-CSR"]
    assert csr["ours_setting"] == (
        "timed on the CPU (AMD EPYC, AVX512); the interval is of repeats within one "
        "reproduction, not of reproductions run on other days, whose timings move beyond it"
    )
    gpu = ResultSet(target="clicktrain.fig9", title="t", scale="gpu", rows=fig9.rows,
                    environment={"gpu_name": "NVIDIA H200"})  # fmt: skip
    assert "timed on the GPU (NVIDIA H200)" in C.timed_on(gpu)
    comm = rows["prunetrain: 55% less inter-accelerator communication"]
    assert comm["ours_setting"] == "ResNet-20 on digits (16x16 px), 8 epochs"
    assert "timed" not in comm["ours_setting"]  # bytes, not time
    timed = {c.claim for c in C.CLAIMS if c.timed}
    assert len(timed) == 6 and all(("time" in c or "faster" in c or "beats" in c) for c in timed), (
        timed
    )


def test_overlapping_intervals_are_inconclusive():
    rows = _by_claim(C.evaluate({"cross.methods": _cross(click_delta=-1.9, sd=0.6)}, "cpu"))
    row = rows["clicktrain: more accuracy and more compression than PruneTrain"]
    assert row["verdict"] == "inconclusive"


def test_save_writes_the_claims_target_and_the_index_shows_it_first(tmp_path):
    runs = tmp_path / "runs"
    save_result(_cross(), result_dir("cross.methods", "cpu", runs))
    assert C.save("gpu", runs) is None  # nothing of that scale
    path = C.save("cpu", runs)
    saved = load_result(path)
    assert saved.target == C.TARGET_KEY and saved.scale == "cpu"
    assert {r["verdict"] for r in saved.rows} <= set(C.VERDICTS)
    assert any("holds" in n for n in saved.notes)
    assert any("time CPU implementations" in n for n in saved.notes)  # said at cpu scale
    assert C.SMOKE_NOTE not in saved.notes  # the pipeline-check note is the smoke scale's only
    index = render_reports([saved, _cross()], tmp_path / "reports")
    html = index.read_text()
    assert html.index("headline claims") < html.index("Reproductions")
    assert "<th>Verdict</th>" in html or ">Verdict<" in html
    assert (tmp_path / "reports" / "claims.html").exists()
    # the verdict stands beside the claim, in its colour
    head = html[html.index("<th>Claim</th>") :]
    assert head.index("<th>Verdict</th>") < head.index("<th>Ours</th>")
    held = [r for r in saved.rows if r["verdict"] == "holds"]
    assert held and html.count('<td class="verdict v-holds">holds') == len(held)


def test_every_claim_cites_its_source_and_states_a_rule():
    for c in C.CLAIMS:
        assert c.paper in ("clicktrain", "prunetrain", "sdgp", "campfire")
        assert c.source and c.rule and "." in c.needs and not math.isnan(c.paper_value)


def test_summary_lines_count_the_verdicts_and_give_one_line_per_claim(tmp_path):
    runs = tmp_path / "runs"
    save_result(_cross(), result_dir("cross.methods", "cpu", runs))
    lines = C.summary_lines(C.save("cpu", runs))
    assert lines[0].startswith("[claims] at cpu scale: ") and len(lines) == 1 + len(C.CLAIMS)
    assert any(line.strip().startswith("holds") and "campfire" in line for line in lines[1:])
    assert any("not measured at this scale" in line and "-" in line for line in lines[1:])
    # after a reproduction of some targets: the lines of the claims that read them
    some = C.summary_lines(C.save("cpu", runs), ["clicktrain.fig9"])
    reading = [c for c in C.CLAIMS if c.needs == "clicktrain.fig9"]
    assert len(some) == 1 + len(reading) and reading
    assert f"{len(reading)} read these targets, the other " in some[0]
    assert all(c.claim in "".join(some[1:]) for c in reading)


@pytest.mark.parametrize(
    ("rescaled", "random", "verdict"),
    [(-0.2, -1.5, "holds"), (-0.6, -1.0, "inconclusive"), (-1.5, -0.2, "does not hold")],
    ids=["apart", "overlapping", "reversed"],
)
def test_sdgp_ordering_claim_reads_the_difference_of_table1_rows(rescaled, random, verdict):
    table1 = ResultSet(target="sdgp.table1", title="t", scale="cpu", rows=[
        _row("SDGP rescaled 2:4", "delta_top1", rescaled, 0.3, 5),
        _row("SDGP random 2:4", "delta_top1", random, 0.3, 5),
    ])  # fmt: skip
    rows = _by_claim(C.evaluate({"sdgp.table1": table1}, "cpu"))
    row = rows["sdgp: random pruning loses more accuracy than rescaled magnitude pruning"]
    half = 2.776445 * 0.3 / math.sqrt(5)  # each row's 95% CI half-width: t(0.975, 4) sd / sqrt(n)
    assert row["ours"] == pytest.approx(rescaled - random) and row["verdict"] == verdict
    low = rescaled - half - (random + half)
    assert f"95% interval [{low:+.2f}," in row["note"] and "non-overlap" in row["note"]


def test_rows_with_per_seed_values_are_paired_by_seed():
    # random is 1 point below rescaled on every seed but one, and the seeds' spread is large:
    # unpaired, the intervals overlap; paired, the difference is clear.
    rescaled = [-0.5, 0.5, -1.0, 1.0, 0.0]
    random = [r - d for r, d in zip(rescaled, [1.0, 1.2, 0.8, 1.0, 1.0])]
    mean = lambda v: sum(v) / len(v)  # noqa: E731
    sd = lambda v: math.sqrt(sum((x - mean(v)) ** 2 for x in v) / (len(v) - 1))  # noqa: E731
    table1 = ResultSet(target="sdgp.table1", title="t", scale="cpu", rows=[
        {**_row("SDGP rescaled 2:4", "delta_top1", mean(rescaled), sd(rescaled), 5),
         "seeds": [0, 1, 2, 3, 4], "values": rescaled},
        {**_row("SDGP random 2:4", "delta_top1", mean(random), sd(random), 5),
         "seeds": [0, 1, 2, 3, 4], "values": random},
    ])  # fmt: skip
    row = _by_claim(C.evaluate({"sdgp.table1": table1}, "cpu"))[
        "sdgp: random pruning loses more accuracy than rescaled magnitude pruning"
    ]
    diffs = [1.0, 1.2, 0.8, 1.0, 1.0]  # mean 1.0, sd 0.1414; half-width 2.776445 * sd / sqrt(5)
    half = 2.776445 * sd(diffs) / math.sqrt(5)
    assert row["verdict"] == "holds" and "paired over seeds [0, 1, 2, 3, 4]" in row["note"]
    assert f"[{1.0 - half:+.2f}, {1.0 + half:+.2f}]" in row["note"]
    unpaired = ResultSet(target="sdgp.table1", title="t", scale="cpu",
                         rows=[{k: v for k, v in r.items() if k not in ("seeds", "values")}
                               for r in table1.rows])  # fmt: skip
    row = _by_claim(C.evaluate({"sdgp.table1": unpaired}, "cpu"))[
        "sdgp: random pruning loses more accuracy than rescaled magnitude pruning"
    ]
    assert row["verdict"] == "inconclusive" and "non-overlap" in row["note"]


NO_EXTRA_TIME = "clicktrain: no extra training time over dense training"


@pytest.mark.parametrize(
    ("click", "verdict"),
    [([31.0, 30.5, 29.5, 30.2, 30.8], "inconclusive"), ([45.0, 44.0, 46.0, 45.5, 44.5],
     "does not hold"), ([27.0, 28.0, 26.5, 27.5, 27.0], "holds")],
    ids=["straddles_1x", "slower", "faster"],
)  # fmt: skip
def test_time_ratio_is_paired_by_seed_with_its_interval(click, verdict):
    dense = [30.0, 30.0, 29.0, 30.5, 30.5]
    seeds = [0, 1, 2, 3, 4]
    cross = ResultSet(target="cross.methods", title="t", scale="cpu", rows=[
        {**_row("dense", "run_iter_ms", sum(dense) / 5, 0.5, 5), "seeds": seeds, "values": dense},
        {**_row("clicktrain", "run_iter_ms", sum(click) / 5, 0.5, 5), "seeds": seeds,
         "values": click},
    ])  # fmt: skip
    row = _by_claim(C.evaluate({"cross.methods": cross}, "cpu"))[NO_EXTRA_TIME]
    ratios = [c / d for c, d in zip(click, dense)]
    mean = sum(ratios) / 5
    assert row["ours"] == pytest.approx(mean) and row["verdict"] == verdict
    assert "paired over seeds [0, 1, 2, 3, 4]" in row["note"]


def test_a_paired_ratios_interval_is_on_the_log_scale_and_stays_above_zero():
    """Two noisy seeds: a linear interval of the per-seed ratios reached below 0."""
    dense, click = [10.0, 10.0], [2.0, 14.0]  # ratios 0.2 and 1.4: mean 0.8, sd 0.8485
    cross = ResultSet(target="cross.methods", title="t", scale="cpu", rows=[
        {**_row("dense", "run_iter_ms", 10.0, 0.0, 2), "seeds": [0, 1], "values": dense},
        {**_row("clicktrain", "run_iter_ms", 8.0, 8.5, 2), "seeds": [0, 1], "values": click},
    ])  # fmt: skip
    ev = C.ratio_reader("cross.methods", "clicktrain", "dense", "run_iter_ms")(
        {"cross.methods": cross}
    )
    half_log = 12.706205 * (math.sqrt(0.72) / 0.8) / math.sqrt(2)
    assert ev.mean == pytest.approx(0.8) and ev.low > 0
    assert (ev.low, ev.high) == pytest.approx((0.8 * math.exp(-half_log), 0.8 * math.exp(half_log)))
    assert "on the log scale" in ev.text
    saved = C.saved_reader("cross.methods", "clicktrain", "dense", "run_iter_ms")(
        {"cross.methods": cross}
    )
    assert saved.low < 0 < saved.high and "log scale" not in saved.text  # a saving: linear


def test_time_ratio_without_per_seed_values_is_one_number():
    row = _by_claim(C.evaluate({"cross.methods": _cross()}, "cpu"))[NO_EXTRA_TIME]
    assert row["ours"] == pytest.approx(2.0) and row["n"] == 1
    assert row["verdict"] == "inconclusive" and row["verdict_reason"] == C.NO_INTERVAL
    assert "means over 5 seeds" in row["note"]


@pytest.mark.parametrize(("n", "said"), [
    (None, "one seed"), (2, "means over 2 seeds"), ((5, 1), "means over one seed and 5 seeds"),
    ((3, 5), "means over 5 seeds and 3 seeds"),
], ids=["no-n", "two-seeds", "one-against-five", "five-against-three"])  # fmt: skip
def test_a_ratio_of_means_says_how_many_seeds_each_mean_is_over(n, said):
    # n: both rows' count, or (dense's, ClickTrain's); the ratio's own row is named first
    rows = [_row("dense", "run_iter_ms", 30.0), _row("clicktrain", "run_iter_ms", 45.0)]
    for k, r in enumerate(rows):
        r.pop("ours_sd")
        if n is None:
            r.pop("n")
        else:
            r["n"] = n[k] if isinstance(n, tuple) else n
    cross = ResultSet(target="cross.methods", title="t", scale="cpu", rows=rows)
    row = _by_claim(C.evaluate({"cross.methods": cross}, "cpu"))[NO_EXTRA_TIME]
    assert row["ours"] == pytest.approx(1.5) and said in row["note"]


def test_a_timing_measured_in_sweeps_is_judged_on_its_interval():
    # speedups 3.9-4.3 per sweep: mean 4.1, but the interval reaches below 4 -> inconclusive
    fig9 = ResultSet(target="clicktrain.fig9", title="t", scale="cpu", rows=[
        {**_row("pattern CSR with predefined positions", "speedup_vs_cusparse", 4.1, 0.158, 5),
         "values": [3.9, 4.0, 4.1, 4.2, 4.3]},
    ])  # fmt: skip
    row = _by_claim(C.evaluate({"clicktrain.fig9": fig9}, "cpu"))[
        "clicktrain: CSR conversion with predefined positions 4x faster than dense-to-CSR"
    ]
    assert row["verdict"] == "inconclusive"
    assert "(n=5, on the log scale, delta method)" in row["note"]


def test_training_time_saved_is_paired_by_seed_from_wall_seconds():
    (claim,) = [c.paper + ": " + c.claim for c in C.CLAIMS if "training time at" in c.claim]
    seeds = [0, 1, 2]
    dense, prune = [100.0, 110.0, 90.0], [76.0, 83.0, 69.0]  # 24%, 24.5%, 23.3% saved
    cross = ResultSet(target="cross.methods", title="t", scale="cpu", rows=[
        {**_row("dense", "wall_seconds", 100.0, 10.0, 3), "seeds": seeds, "values": dense},
        {**_row("prunetrain", "wall_seconds", 60.3, 5.5, 3), "seeds": seeds, "values": prune},
    ])  # fmt: skip
    row = _by_claim(C.evaluate({"cross.methods": cross}, "cpu"))[claim]
    saved = [100 * (1 - p / d) for p, d in zip(prune, dense)]
    assert row["ours"] == pytest.approx(sum(saved) / 3)
    assert row["verdict"] == "inconclusive"  # 23.3-24.5% with n=3: the interval straddles 24
    assert "paired over seeds [0, 1, 2]" in row["note"]
    rows = [_row("dense", "wall_seconds", 100.0), _row("prunetrain", "wall_seconds", 70.0)]
    one_seed = ResultSet(target="cross.methods", title="t", scale="cpu", rows=rows)
    row = _by_claim(C.evaluate({"cross.methods": one_seed}, "cpu"))[claim]
    # 30% saved misses 39%, but from one seed: no interval, so no verdict either way
    assert row["ours"] == pytest.approx(30.0) and row["verdict"] == "inconclusive"
    assert "one measurement" in row["note"]
    no_base = ResultSet(target="cross.methods", title="t", scale="cpu",
                        rows=[_row("prunetrain", "wall_seconds", 70.0)])  # fmt: skip
    row = _by_claim(C.evaluate({"cross.methods": no_base}, "cpu"))[claim]
    assert row["verdict"] == "not measured at this scale"


def test_a_seed_whose_timing_is_missing_is_left_out_of_the_pairing():
    seeds = [0, 1, 2, 3]
    dense, click = [30.0, 30.0, float("nan"), 31.0], [60.0, 61.0, 59.0, 62.0]
    cross = ResultSet(target="cross.methods", title="t", scale="cpu", rows=[
        {**_row("dense", "run_iter_ms", 30.3, 0.5, 3), "seeds": seeds, "values": dense},
        {**_row("clicktrain", "run_iter_ms", 60.5, 1.0, 4), "seeds": seeds, "values": click},
    ])  # fmt: skip
    row = _by_claim(C.evaluate({"cross.methods": cross}, "cpu"))[NO_EXTRA_TIME]
    assert "paired over seeds [0, 1, 3]" in row["note"]
    assert row["ours"] == pytest.approx((2.0 + 61 / 30 + 2.0) / 3)


@pytest.mark.parametrize(
    ("low", "high", "higher"),
    [(12.0, 12.0, True), (1.0, 1.0, True), (1.0, 1.0, False), (-5.0, -5.0, True)],
    ids=["above-bound", "below-bound", "at-most-below", "far-below"],
)  # fmt: skip
def test_one_seed_is_never_judged_whatever_its_value(low, high, higher):
    claim = _claim(higher_is_better=higher)
    assert C.judge_why(claim, _ev(low, high, n=1), "cpu") == ("inconclusive", C.NO_INTERVAL)
    assert C.judge(_claim(paper_value=-0.3), _ev(low, high, n=1)) == "inconclusive"
    assert C.judge(claim, _ev(9.0, 11.0, n=2), "cpu") == "inconclusive"  # n=2: judged


def test_smoke_scale_judges_no_claim_and_says_it_is_a_pipeline_check(tmp_path):
    claim = _claim()
    verdict, why = C.judge_why(claim, _ev(10.0, 12.0), "smoke")
    assert verdict == C.NOT_JUDGED == "not judged (smoke scale: pipeline check)" and why
    assert C.judge(claim, None, "smoke") == "not measured at this scale"
    runs = tmp_path / "runs"
    cross = _cross()
    cross.scale = "smoke"
    cross.rows = [{**r, "scale": "smoke"} for r in cross.rows]
    save_result(cross, result_dir("cross.methods", "smoke", runs))
    saved = load_result(C.save("smoke", runs))
    judged = {r["verdict"] for r in saved.rows if r["ours"] is not None}
    assert judged == {C.NOT_JUDGED}
    assert "pipeline check" in saved.description and "pipeline check" in saved.notes[0]
    lines = C.summary_lines(result_dir(C.TARGET_KEY, "smoke", runs) / "result.json")
    assert not any(" holds " in line or "does not hold" in line for line in lines)
    html = render_reports([saved], tmp_path / "reports")
    text = (tmp_path / "reports" / "claims.html").read_text()
    assert html.exists() and "not judged (smoke scale: pipeline check)" in text
    assert ">holds<" not in text and "does not hold:" not in text


def test_claims_table_names_the_bound_apart_from_the_published_number_and_our_setting(tmp_path):
    rows = _by_claim(C.evaluate({"cross.methods": _cross()}, "cpu"))
    pt = rows["prunetrain: costs about 1.5 points of top-1 (ratio 0.2)"]
    assert pt["paper"] == -1.47 and "-1.47 pp" in pt["published"] and "Table 1" in pt["published"]
    # our runs use penalty ratio 0.8 on the short runs, and the row says so
    assert "penalty ratio 0.8 (the paper's 0.2" in pt["ours_setting"]
    assert (
        "ResNet-20 on digits (16x16 px)" in pt["ours_setting"] and "5 seeds" in pt["ours_setting"]
    )
    click = rows["clicktrain: more accuracy and more compression than PruneTrain"]
    assert click["paper"] == 0.0 and "-0.5 pp at 4.1x" in click["published"]
    from impl.report.html import comparison_frame

    frame = comparison_frame(list(rows.values()))
    assert "Paper" not in frame.columns and "Tested against" in frame.columns
    assert {"Published", "Paper source", "Our setting", "Verdict"} <= set(frame.columns)
    assert list(frame.columns[:2]) == ["Claim", "Verdict"]  # the verdict beside its claim
    shown = frame.set_index("Claim").loc["prunetrain: costs about 1.5 points of top-1 (ratio 0.2)"]
    assert "penalty ratio 0.8 (the paper's 0.2" in shown["Our setting"]
    assert "-1.47 pp" in shown["Published"] and shown["Tested against"] == "-1.47"
    sdgp = frame[frame["Claim"].str.startswith("sdgp: 2:4")].iloc[0]
    assert sdgp["Tested against"] == "-0.3" and "95.2 vs 95.3" in sdgp["Published"]
    slow = frame[frame["Claim"] == NO_EXTRA_TIME].iloc[0]
    assert slow["Verdict"] == f"inconclusive: {C.NO_INTERVAL}"
    assert all(c.published for c in C.CLAIMS)


def test_a_difference_of_single_seeds_gives_no_interval():
    one = ResultSet(target="cross.methods", title="t", scale="cpu", rows=[
        _row("clicktrain", "delta_top1", -0.28), _row("prunetrain", "delta_top1", 0.0),
        _row("clicktrain", "compression_ratio", 8.33), _row("prunetrain", "compression_ratio", 1.0),
    ])  # fmt: skip
    row = _by_claim(C.evaluate({"cross.methods": one}, "cpu"))[
        "clicktrain: more accuracy and more compression than PruneTrain"
    ]
    assert row["verdict"] == "inconclusive" and row["n"] == 1
    assert "interval [" not in row["note"] and "one seed: no interval" in row["note"]


CROSSOVER = "clicktrain: pattern SpMM beats dense GEMM and convolution above 65% sparsity"
GRID = [55.9, 64.9, 75.0, 85.1, 89.9]  # the achieved sparsities of the cpu sweep


def _fig10(rows, grid=GRID) -> ResultSet:
    points = [{"sparsity": sp, "impl": "pattern SpMM", "time_ms": 1.0} for sp in grid]
    figure = FigureSpec(kind="line", x="sparsity", y="time_ms", data=points)
    return ResultSet(target="clicktrain.fig10", title="t", scale="cpu", rows=rows,
                     figures=[figure])  # fmt: skip


@pytest.mark.parametrize(
    ("per_sweep", "verdict", "shown"),
    [([1.0, 1.0, 1.0], "holds", "in 3 of 3 sweeps"),
     ([0.0, 0.0, 0.0], "does not hold", "in 0 of 3 sweeps, lost at one of them in 3"),
     ([1.0, 0.0, 1.0], "inconclusive", "in 2 of 3 sweeps, lost at one of them in 1"),
     ([1.0, None, 1.0], "inconclusive", "in 2 of 3 sweeps, 1 not known")],
    ids=["every-sweep", "no-sweep", "some-sweeps", "one-unknown"],
)  # fmt: skip
def test_the_crossover_claim_is_judged_sweep_by_sweep(per_sweep, verdict, shown):
    """Sec. 5.2: faster than both dense ways 'when the sparsity ratio is higher than 65%':
    each sweep passes only if the pattern SpMM won at every swept sparsity above 65%."""
    known = [v for v in per_sweep if v is not None]
    fig10 = _fig10([{**_row("sparsity sweep", "beats_dense_above_65", sum(known) / len(known),
                            None, len(known)), "values": per_sweep}])  # fmt: skip
    row = _by_claim(C.evaluate({"clicktrain.fig10": fig10}, "cpu"))[CROSSOVER]
    assert row["verdict"] == verdict and shown in row["note"]
    assert row["n"] == len(known)  # the sweeps the share rests on
    if verdict == "inconclusive":
        assert row["verdict_reason"] == "the range over the sweeps straddles 1"


@pytest.mark.parametrize(
    ("crossovers", "verdict"),
    [([None, None, 89.9, None, None], "does not hold"),  # every sweep lost at 75.0
     ([75.0, None, None], "inconclusive"),  # won at 75.0: the points above it are not known
     ([55.9, 64.9, 75.0], "inconclusive")],
    ids=["all-lost-at-75", "one-won-at-75", "all-won-low"],
)  # fmt: skip
def test_a_result_saved_before_the_test_was_measured_is_judged_from_its_crossovers(
    crossovers, verdict
):
    """A sweep whose first win lies above 75.0 (the lowest swept point above 65) lost there,
    so it fails the claim; a sweep that won at or below it says nothing of the points above."""
    fig10 = _fig10([{**_row("sparsity sweep", "crossover_sparsity_vs_cublas_cudnn", 70.0,
                            None, 1), "values": crossovers}])  # fmt: skip
    row = _by_claim(C.evaluate({"clicktrain.fig10": fig10}, "cpu"))[CROSSOVER]
    assert row["verdict"] == verdict
    assert "read from each sweep's crossover: one above 75% (or none) lost there" in row["note"]
    lost = sum(c is None or c > 75.0 for c in crossovers)
    assert f"in 0 of {len(crossovers)} sweeps" in row["note"]
    assert (f"lost at one of them in {lost}" in row["note"]) == bool(lost)


def test_the_crossover_claim_is_not_measured_without_a_swept_point_above_65():
    fig10 = _fig10([{**_row("sparsity sweep", "crossover_sparsity_vs_cublas_cudnn", None,
                            None, 0), "values": [None, None]}], grid=[50.0, 60.0])  # fmt: skip
    row = _by_claim(C.evaluate({"clicktrain.fig10": fig10}, "cpu"))[CROSSOVER]
    assert row["verdict"] == "not measured at this scale"


def test_a_single_sweep_of_the_crossover_test_gives_no_verdict():
    fig10 = _fig10([_row("sparsity sweep", "beats_dense_above_65", 1.0, None, 1)])
    row = _by_claim(C.evaluate({"clicktrain.fig10": fig10}, "cpu"))[CROSSOVER]
    assert row["verdict"] == "inconclusive" and row["verdict_reason"] == C.NO_INTERVAL
    assert "in 1 of 1 sweeps" in row["note"]


@pytest.mark.parametrize(
    ("delta", "sd", "verdict"),
    [(-0.1, 0.05, "holds"), (-0.5, 0.4, "inconclusive"), (-1.0, 0.1, "does not hold")],
    ids=["within", "straddles", "below"],
)
def test_clicktrains_cifar_margin_of_0_3_points_is_a_non_inferiority_claim(delta, sd, verdict):
    """Sec. 6.2: 'within -0.3%' on CIFAR: the whole interval must lie at or above -0.3."""
    row = _by_claim(C.evaluate({"cross.methods": _cross(click_delta=delta, sd=sd)}, "cpu"))[
        "clicktrain: accuracy drop within 0.3 points on CIFAR"
    ]
    assert row["verdict"] == verdict and row["paper"] == -0.3


@pytest.mark.parametrize(
    ("pruned", "verdict"),
    [([10.0, 10.1, 10.2], "holds"), ([11.0, 11.1, 11.2], "inconclusive"),
     ([15.0, 15.1, 15.2], "does not hold")],
    ids=["half-saved", "about-44", "a-quarter-saved"],
)  # fmt: skip
def test_prunetrains_inference_flops_saved_are_paired_by_seed_against_dense(pruned, verdict):
    """Table 1 at ratio 0.2: 56% of dense, 44% saved; ours 100 (1 - pruned / dense) by seed."""

    def flops(row, values):
        return {
            **_row(row, "inference_flops_per_sample", sum(values) / 3, None, 3),
            "seeds": [0, 1, 2],
            "values": values,
        }

    cross = ResultSet(target="cross.methods", title="t", scale="cpu",
                      rows=[flops("dense", [20.0] * 3), flops("prunetrain", pruned)])  # fmt: skip
    row = _by_claim(C.evaluate({"cross.methods": cross}, "cpu"))[
        "prunetrain: 44% fewer inference FLOPs at penalty ratio 0.2 (53% at ratio 0.25)"
    ]
    saved = [100 * (1 - p / 20.0) for p in pruned]
    assert row["verdict"] == verdict and row["ours"] == pytest.approx(sum(saved) / 3)
    assert "paired over seeds [0, 1, 2]" in row["note"]


def test_an_interval_end_that_reads_as_the_bound_is_shown_in_full():
    """Printed to two decimals, -0.3004 reads -0.30 beside "straddles -0.3": the reason
    then gives the end in full."""
    claim = _claim(paper_value=-0.3)
    verdict, why = C.judge_why(claim, _ev(-0.3004, 0.39), "cpu")
    assert verdict == "inconclusive"
    assert why == "the 95% interval straddles -0.3 (low end -0.3004)"
    assert C.judge_why(claim, _ev(-0.84, 0.39), "cpu")[1] == "the 95% interval straddles -0.3"


@pytest.mark.parametrize("scale", ["cpu", "gpu", "paper"])
def test_every_claim_reads_rows_its_target_produces_at_each_scale(scale):
    # A claim that reads a row its target does not produce at a scale reads "not measured"
    # there however the target ran (PruneTrain Fig. 11's row is "ratio 0.25, run at 0.85" on
    # the short runs and "ratio 0.25" at paper scale).
    from reproductions import load_target

    for claim in C.CLAIMS:
        reads = claim.read.reads
        assert reads and all(target == claim.needs for target, _ in reads), claim.claim
        for target, row in reads:
            labels = [r.label for r in load_target(target).rows(scale)]
            assert C.row_label(row, scale) in labels, (claim.claim, scale)


def test_a_report_judges_the_claims_again_from_the_results_it_reads(tmp_path):
    # the claims were saved while cross.methods was there; it is removed since: pdtbench
    # report must not keep showing verdicts read from it
    from impl.report.cli import main as report_main

    runs = tmp_path / "runs"
    cross_dir = result_dir("cross.methods", "cpu", runs)
    save_result(_cross(), cross_dir)
    save_result(ResultSet(target="sdgp.table1", title="t", scale="cpu", rows=[
        _row("SDGP rescaled 2:4", "delta_top1", -0.2, 0.3, 5),
        _row("SDGP random 2:4", "delta_top1", -1.5, 0.3, 5),
    ]), result_dir("sdgp.table1", "cpu", runs))  # fmt: skip
    saved = load_result(C.save("cpu", runs))
    campfire = "campfire: under 1% accuracy loss at 70% sparsity"
    assert _by_claim(saved.rows)[campfire]["verdict"] == "holds"
    import shutil

    shutil.rmtree(cross_dir)
    (rejudged,) = [r for r in C.rejudge(load_results([runs / "results"])[0])
                   if r.target == C.TARGET_KEY]  # fmt: skip
    rows = _by_claim(rejudged.rows)
    assert rows[campfire]["verdict"] == "not measured at this scale"
    assert rows[campfire]["ours"] is None
    assert rows["sdgp: random pruning loses more accuracy than rescaled magnitude pruning"][
        "verdict"] == "holds"  # fmt: skip
    assert rejudged.environment == saved.environment  # where the verdicts' numbers came from
    assert report_main([str(runs / "results"), "--out", str(tmp_path / "reports")]) == 0
    page = (tmp_path / "reports" / "claims.html").read_text()
    evidence = _by_claim(saved.rows)[campfire]["note"].split(". Rule")[0]  # read from cross
    assert evidence and evidence not in page


def test_a_claims_unit_is_spaced_unless_it_is_x_or_percent():
    assert C._mean_ci((1.5, 0.1, 3), ".2f", "pp").text.startswith("1.50 pp, 95% CI")
    assert C._mean_ci((2.0, None, 1), ".2f", "x").text == "2.00x (one measurement)"
    # a ratio's interval is on the log scale: never below 0, however noisy (it read
    # "0.77x, 95% CI [-0.10, 1.64]" for two sweeps)
    noisy = C._mean_ci((0.77, 0.097, 2), ".2f", "x")
    assert 0 < noisy.low < 0.77 < noisy.high
    assert noisy.low * noisy.high == pytest.approx(0.77**2)  # symmetric in log
    assert noisy.text.endswith("(n=2, on the log scale, delta method)")
    tight = C._mean_ci((3.44, 0.2, 5), ".2f", "x")  # close to the linear one when tight
    half = C.ci95_half_width(0.2, 5)
    assert tight.low == pytest.approx(3.44 - half, rel=0.01)
    assert tight.high == pytest.approx(3.44 + half, rel=0.01)
    assert C._mean_ci((2.0, None, 1), ".1f", "%").text == "2.0% (one measurement)"


def test_a_seed_whose_baseline_is_zero_is_left_out_of_a_ratio():
    res = ResultSet(target="cross.methods", title="t", scale="cpu", rows=[
        {**_row("dense", "run_iter_ms", 2.0, None, 3), "seeds": [0, 1, 2],
         "values": [0.0, 3.0, 3.0]},
        {**_row("clicktrain", "run_iter_ms", 2.0, None, 3), "seeds": [0, 1, 2],
         "values": [1.0, 2.5, 2.5]},
    ])  # fmt: skip
    ev = C.ratio_reader("cross.methods", "clicktrain", "dense", "run_iter_ms")(
        {"cross.methods": res}
    )
    assert ev.n == 2 and "seeds [1, 2]" in ev.text


def test_claims_not_measured_carry_no_scale_and_a_summary_counts_those_left_out(tmp_path):
    rows = C.evaluate({}, "cpu")
    assert all(r["scale"] is None and r["n"] == 0 and r["ours"] is None for r in rows)
    path = save_result(C.build({}, "cpu", environment={}), tmp_path)
    lines = C.summary_lines(path, targets=["sdgp.fig9"])
    reading = [c for c in C.CLAIMS if c.needs == "sdgp.fig9"]
    left = len(C.CLAIMS) - len(reading)
    assert f"; {len(reading)} read these targets, the other {left} are in claims.html" in lines[0]
    assert len(lines) == 1 + len(reading)


def test_rejudged_claims_read_only_results_of_their_own_scale():
    """Claims saved from a cpu result, reported with a gpu result only: no cpu result is
    there to stand for their verdicts, so none is shown (the saved ones read results that
    have been removed)."""
    saved = C.build({"cross.methods": _cross()}, "cpu", environment={"x": 1})
    campfire = "campfire: under 1% accuracy loss at 70% sparsity"
    assert _by_claim(saved.rows)[campfire]["verdict"] == "holds"
    gpu = ResultSet(target="cross.methods", title="t", scale="gpu", rows=[])
    out = C.rejudge([gpu, saved])
    assert out[0] is gpu and out[-1].environment == {"x": 1}
    rows = _by_claim(out[-1].rows)
    assert {r["verdict"] for r in rows.values()} == {"not measured at this scale"}
    assert all(r["ours"] is None for r in rows.values())


def test_the_sdgp_claims_setting_counts_the_seeds_the_cpu_runs_use():
    from reproductions.sdgp.table1 import CPU_SEEDS

    assert C._needs_setting("sdgp.table1", "cpu").endswith(f", {len(CPU_SEEDS)} seeds")


def test_an_unpaired_difference_with_a_one_seed_row_is_judged_as_one_value():
    """The difference of a 3-seed row and a 1-seed one has no interval: a single seed is
    never judged (its n is the smaller of the two)."""
    rs = ResultSet(target="t", title="t", scale="cpu", rows=[
        _row("a", "delta_top1", 1.0, 0.1, 3), _row("b", "delta_top1", -5.0, None, 1)])  # fmt: skip
    ev = C.difference_reader("t", "a", "b")({"t": rs})
    assert ev.n == 1 and ev.low == ev.high == ev.mean == 6.0


def test_ratios_against_or_of_zero_read_no_division_by_zero():
    """A baseline mean of 0 is no ratio (None, not ZeroDivisionError stopping every claim);
    a paired ratio whose mean is 0 and a ratio row of mean 0 keep a linear interval."""
    rs = ResultSet(target="t", title="t", scale="cpu", rows=[
        _row("a", "ms", 3.0), _row("b", "ms", 0.0)])  # fmt: skip
    assert C.ratio_reader("t", "a", "b", "ms")({"t": rs}) is None
    paired = ResultSet(target="t", title="t", scale="cpu", rows=[
        {**_row("a", "ms", 0.0, 0.0, 2), "seeds": [1, 2], "values": [0.0, 0.0]},
        {**_row("b", "ms", 2.0, 0.1, 2), "seeds": [1, 2], "values": [1.0, 3.0]}])  # fmt: skip
    ev = C.ratio_reader("t", "a", "b", "ms")({"t": paired})
    assert ev.mean == 0 and ev.low == ev.high == 0
    zero = C._mean_ci((0.0, 0.5, 4), ".2f", "x")
    assert zero.low == pytest.approx(-zero.high) and zero.low < 0


def test_a_seed_whose_compared_row_value_is_missing_is_left_out_of_the_pairing():
    """A null per-seed value of the row compared (not only of its baseline) drops that seed
    from a paired ratio and from a paired difference, rather than stopping the claims."""
    from scipy.stats import t

    cross = ResultSet(target="cross.methods", title="t", scale="cpu", rows=[
        {**_row("dense", "run_iter_ms", 30.25, 0.5, 4), "seeds": [0, 1, 2, 3],
         "values": [30.0, 30.0, 31.0, 30.0]},
        {**_row("clicktrain", "run_iter_ms", 61.0, 1.0, 3), "seeds": [0, 1, 2, 3],
         "values": [60.0, None, 62.0, 61.0]},
    ])  # fmt: skip
    row = _by_claim(C.evaluate({"cross.methods": cross}, "cpu"))[NO_EXTRA_TIME]
    assert "paired over seeds [0, 2, 3]" in row["note"] and row["n"] == 3
    assert row["ours"] == pytest.approx((2.0 + 2.0 + 61.0 / 30.0) / 3)
    table1 = ResultSet(target="sdgp.table1", title="t", scale="cpu", rows=[
        {**_row("SDGP rescaled 2:4", "delta_top1", 0.4, 0.1, 2), "seeds": [0, 1, 2],
         "values": [0.5, None, 0.3]},
        {**_row("SDGP random 2:4", "delta_top1", -0.5, 0.1, 3), "seeds": [0, 1, 2],
         "values": [-0.5, -0.4, -0.6]},
    ])  # fmt: skip
    ev = C.difference_reader("sdgp.table1", "SDGP rescaled 2:4", "SDGP random 2:4")(
        {"sdgp.table1": table1}
    )
    # seeds 0 and 2: differences 1.0 and 0.9, mean 0.95, sd 0.0707
    half = t.ppf(0.975, 1) * math.sqrt(0.005) / math.sqrt(2)
    assert ev.n == 2 and "paired over seeds [0, 2]" in ev.text
    assert (ev.mean, ev.low, ev.high) == pytest.approx((0.95, 0.95 - half, 0.95 + half))


def test_a_sweep_saved_as_nan_is_read_as_a_null_one():
    # a NaN per-sweep value is a sweep with no value, as a null is: a crossover that never
    # happened lost at the first point above 65%; a test with no swept point above it is
    # not known
    (claim,) = [c for c in C.CLAIMS if c.paper + ": " + c.claim == CROSSOVER]
    old = _fig10([{**_row("sparsity sweep", "crossover_sparsity_vs_cublas_cudnn", 89.9, None,
                          1), "values": [math.nan, None, 89.9]}])  # fmt: skip
    ev = claim.read({"clicktrain.fig10": old})
    assert (ev.low, ev.high, ev.n) == (0.0, 0.0, 3) and "lost at one of them in 3" in ev.text
    new = _fig10([{**_row("sparsity sweep", "beats_dense_above_65", 1.0, None, 2),
                   "values": [1.0, math.nan, 1.0]}])  # fmt: skip
    ev = claim.read({"clicktrain.fig10": new})
    assert (ev.low, ev.high, ev.n, ev.mean) == (0.0, 1.0, 3, 1.0) and "1 not known" in ev.text
    assert C.judge(claim, ev, "cpu") == "inconclusive"


def test_an_interval_end_is_given_in_full_only_where_two_decimals_hide_it():
    # an end exactly on the bound, or one that reads apart from it at two decimals, needs no
    # more digits; one that reads as the bound but is not, high end as well as low, does
    assert C.judge_why(_claim(paper_value=0.0, strict=True), _ev(0.0, 0.4), "cpu") == (
        "inconclusive",
        "the 95% interval straddles 0",
    )
    claim = _claim(paper_value=-0.3)
    assert C.judge_why(claim, _ev(-0.34, 0.39), "cpu") == (
        "inconclusive",
        "the 95% interval straddles -0.3",
    )
    assert C.judge_why(_claim(paper_value=-0.3, higher_is_better=False), _ev(-0.9, -0.2996)) == (
        "inconclusive",
        "the 95% interval straddles -0.3 (high end -0.2996)",
    )


def _named(prefix: str) -> C.Claim:
    (claim,) = [c for c in C.CLAIMS if c.claim.startswith(prefix)]
    return claim


def test_each_claims_bound_is_the_number_its_paper_publishes():
    """The bounds, from the papers' numbers (reproductions/paper_values): PruneTrain Table 1
    gives ResNet-50 ImageNet at penalty ratio 0.2 as % of dense, whose complements are the
    savings claimed; the abstracts' ranges ("15-25%", "under 1%") are tested at their ends."""
    from reproductions.published import lookup, paper_values

    def published(paper, item, **match):
        (value,) = lookup(paper_values(paper, item), **match)["value"]
        return value

    table1 = dict(
        paper="prunetrain",
        item="table1",
        model="resnet50",
        dataset="imagenet",
        setting="penalty ratio 0.2",
    )
    assert _named("30% fewer training FLOPs").paper_value == 100 - published(
        **table1, metric="train_flops"
    )  # 70% of dense
    assert _named("44% fewer inference FLOPs").paper_value == 100 - published(
        **table1, metric="inference_flops"
    )  # 56% of dense
    assert _named("24% less end-to-end").paper_value == 100 - published(
        **table1, metric="train_time"
    )  # 76% of dense (four 1080 Ti)
    assert _named("costs about 1.5 points").paper_value == published(**table1, metric="delta_top1")
    assert _named("55% less inter-accelerator").paper_value == published(
        "prunetrain", "fig11", metric="comm_cost_saved"
    )
    assert _named("CSR conversion").paper_value == published(
        "clicktrain", "fig9", metric="speedup_vs_cusparse"
    )
    assert _named("pattern SpMM 3.2x").paper_value == published(
        "clicktrain", "fig10", metric="speedup_vs_cusparse"
    )
    sdgp = _named("15-25% less training time")
    assert sdgp.paper_value == 15.0  # the abstract's range at its low end
    assert f"{published('sdgp', 'fig9', setting='ratio 2 (2:4)'):g}%" in sdgp.published
    campfire = _named("under 1% accuracy loss at 70% sparsity")
    assert campfire.paper_value == -1.0 and campfire.strict  # "under 1%": -1 itself misses
    for table, epochs in (("table3", "90 epochs"), ("table2", "100 epochs")):
        rows = paper_values("campfire", table)
        at70 = rows[(rows["metric"] == "delta_top1") & rows["setting"].str.endswith("sparsity 70%")]
        best = f"{at70['value'].max():.2f} pp (Table {table[-1]}, {epochs})"
        assert best in campfire.published


@pytest.mark.parametrize(
    ("saved", "verdict"),
    [(60.0, "holds"), (54.0, "inconclusive"), (50.0, "does not hold")],
    ids=["above-55", "straddles-55", "below-55"],
)
def test_communication_saved_is_read_from_the_dynamic_batch_row_of_fig11(saved, verdict):
    """Fig. 11: 55% less communication; ours over five seeds (sd 1: 95% CI +-1.24 pp)."""
    fig11 = ResultSet(
        target="prunetrain.fig11",
        title="t",
        scale="cpu",
        rows=[_row(C._prunetrain_dynamic_row("cpu"), "comm_cost_saved", saved, 1.0, 5)],
    )
    row = _by_claim(C.evaluate({"prunetrain.fig11": fig11}, "cpu"))[
        "prunetrain: 55% less inter-accelerator communication"
    ]
    half = 2.776445 / math.sqrt(5)
    assert row["verdict"] == verdict and row["paper"] == 55.0
    assert f"95% CI [{saved - half:.2f}, {saved + half:.2f}] (n=5)" in row["note"]


def test_a_row_saved_with_no_number_of_ours_is_not_measured():
    """A metric saved as null (the run never produced it) is no number to judge: the claim is
    not measured, rather than stopping every claim on it."""
    cross = ResultSet(
        target="cross.methods",
        title="t",
        scale="cpu",
        rows=[
            _row("clicktrain", "delta_top1", None, None, 0),
            _row("dense", "run_iter_ms", 30.0),
            _row("clicktrain", "run_iter_ms", None),
        ],
    )
    rows = _by_claim(C.evaluate({"cross.methods": cross}, "cpu"))
    for claim in ("accuracy drop within 0.3 points on CIFAR", "no extra training time over"):
        (row,) = [r for k, r in rows.items() if k.startswith("clicktrain: " + claim)]
        assert row["verdict"] == "not measured at this scale" and row["ours"] is None


def test_a_swept_point_at_exactly_65_is_not_above_65():
    """Sec. 5.2: 'higher than 65%'. With 65.0 swept, the first point above it is 75.0: a
    sweep whose crossover is 75.0 won there, which says nothing of the points above."""
    crossovers = {
        **_row("sparsity sweep", "crossover_sparsity_vs_cublas_cudnn", 75.0, None, 2),
        "values": [75.0, 75.0],
    }
    fig10 = _fig10([crossovers], grid=[55.0, 65.0, 75.0, 85.0])
    row = _by_claim(C.evaluate({"clicktrain.fig10": fig10}, "cpu"))[CROSSOVER]
    assert row["verdict"] == "inconclusive"
    assert "one above 75% (or none) lost there" in row["note"] and "2 not known" in row["note"]


@pytest.mark.parametrize(
    ("scale", "setup"),
    [
        ("smoke", "ResNet-20 on digits, 4 epochs of at most 2 steps, 1 seed"),
        ("cpu", "ResNet-20 on digits (16x16 px), 8 epochs, 5 seeds"),
        ("gpu", "ResNet-32 on digits, 30 epochs, 5 seeds"),
        ("paper", "ResNet-32 on CIFAR-10, 182 epochs, 3 seeds"),
    ],
)
def test_the_cross_tables_setting_names_its_model_epochs_and_seeds_at_each_scale(scale, setup):
    # the cross-method table's runs (docs/reproductions.md): one seed on the smoke scale's
    # few steps, five at cpu and gpu, three at paper scale on CIFAR-10 for 182 epochs
    assert C._needs_setting("cross.methods", scale) == setup


def test_each_methods_claims_name_that_methods_options_as_run():
    """The setting of a claim is that of its own method's runs, options included: SDGP's 2:4
    pruning, Campfire's 70% sparsity, ClickTrain's pattern pool, PruneTrain's ratio."""
    rows = _by_claim(C.evaluate({}, "cpu"))
    said = {
        "sdgp: 2:4 rescaled gradient pruning without significant loss of accuracy": "2:4",
        "campfire: under 1% accuracy loss at 70% sparsity": "70% final sparsity",
        "clicktrain: accuracy drop within 0.3 points on CIFAR": "pattern pool",
        "prunetrain: costs about 1.5 points of top-1 (ratio 0.2)": "penalty ratio",
    }
    for claim, option in said.items():
        setting = rows[claim]["ours_setting"]
        assert setting.startswith("ResNet-20 on digits (16x16 px), 8 epochs, 5 seeds; ")
        assert option in setting, (claim, setting)
        others = [o for o in said.values() if o != option]
        assert not any(o in setting for o in others), (claim, setting)


def test_a_timed_claim_not_measured_names_no_device():
    # with no result there is no environment to name: nothing was timed
    rows = _by_claim(C.evaluate({}, "cpu"))
    csr = rows["clicktrain: CSR conversion with predefined positions 4x faster than dense-to-CSR"]
    assert csr["verdict"] == "not measured at this scale" and csr["ours_setting"] == ""


def test_summary_lines_give_each_claims_verdict_number_and_reason(tmp_path):
    """One line per claim: the verdict padded to the longest verdict's width, the claim, our
    number without the rule, and the verdict's reason in brackets; at the smoke scale the
    pipeline-check note comes first."""
    path = save_result(C.build({"cross.methods": _cross()}, "cpu", environment={}), tmp_path)
    lines = C.summary_lines(path, targets=["cross.methods"])
    width = len("not judged (smoke scale: pipeline check)")
    slow = (
        f"  {'inconclusive':<{width}}  {NO_EXTRA_TIME}: 2.00x against dense (one measurement: "
        "run_iter_ms 60 vs 30, means over 5 seeds) [one seed or measurement (n=1): no interval]"
    )
    assert slow in lines
    campfire = [line for line in lines if "campfire: under 1%" in line]
    # 0.00 +- 2.776445 * 0.4 / sqrt(5) = 0.4967
    assert campfire == [
        f"  {'holds':<{width}}  campfire: under 1% accuracy loss at 70% sparsity: 0.00 pp, "
        "95% CI [-0.50, 0.50] (n=5)"
    ]
    build = C.build({"cross.methods": _cross()}, "smoke", environment={})
    smoke = C.summary_lines(save_result(build, tmp_path / "smoke"))
    assert smoke[1] == f"  {C.SMOKE_NOTE}"
    assert "runs of a few SGD steps" in " ".join(build.notes)
    cpu = C.build({}, "cpu", environment={})
    assert "runs of a few hundred SGD steps" in " ".join(cpu.notes)


def test_a_claims_row_carries_our_sd_its_unit_and_the_papers_citation():
    rows = _by_claim(C.evaluate({"cross.methods": _cross()}, "cpu"))
    campfire = rows["campfire: under 1% accuracy loss at 70% sparsity"]
    assert (campfire["ours"], campfire["ours_sd"], campfire["n"]) == (0.0, 0.4, 5)
    assert campfire["unit"] == "pp" and campfire["paper"] == -1.0
    assert campfire["paper_source"].startswith("abstract; Sec. 1, contribution 6")
    assert "Tables 2-3" in campfire["paper_source"]
    pt = rows["prunetrain: costs about 1.5 points of top-1 (ratio 0.2)"]
    # PruneTrain's own change, -2.3 +- 0.50 (not ClickTrain's -0.5): wholly below -1.47
    assert pt["ours"] == -2.3 and pt["verdict"] == "does not hold"
    comm = rows["prunetrain: 55% less inter-accelerator communication"]
    assert comm["unit"] == "%" and comm["paper_source"] == "abstract; Fig. 11, Sec. 5.3"


def test_saved_claims_alone_are_no_results_to_judge_again(tmp_path):
    runs = tmp_path / "runs"
    cross_dir = result_dir("cross.methods", "cpu", runs)
    save_result(_cross(), cross_dir)
    assert C.save("cpu", runs) is not None
    shutil.rmtree(cross_dir)
    assert C.save("cpu", runs) is None  # only the claims saved before: nothing to judge


def test_more_accuracy_without_the_compression_ratios_is_not_measured():
    cross = _cross()
    cross.rows = [r for r in cross.rows if r["metric"] != "compression_ratio"]
    row = _by_claim(C.evaluate({"cross.methods": cross}, "cpu"))[
        "clicktrain: more accuracy and more compression than PruneTrain"
    ]
    assert row["verdict"] == "not measured at this scale" and row["ours"] is None


def test_a_claims_setting_names_only_the_flags_of_the_row_it_reads():
    # Fig. 11's dynamic mini-batch row trained as one; a flag on another row of the same
    # result (the naive run) says nothing of the claim's number
    label = C._prunetrain_dynamic_row("cpu")
    naive = {**_row("PruneTrain, naive", "comm_cost_saved", 0.0, 0.0, 5), "row_flag": "other"}
    rows = [_row(label, "comm_cost_saved", 60.0, 1.0, 5), naive]
    fig11 = ResultSet(target="prunetrain.fig11", title="t", scale="cpu", setup="s", rows=rows)
    row = _by_claim(C.evaluate({"prunetrain.fig11": fig11}, "cpu"))[
        "prunetrain: 55% less inter-accelerator communication"
    ]
    assert row["ours_setting"] == "s"
    fig11.rows[0]["row_flag"] = "batch never grew"
    row = _by_claim(C.evaluate({"prunetrain.fig11": fig11}, "cpu"))[
        "prunetrain: 55% less inter-accelerator communication"
    ]
    assert row["ours_setting"] == f"s; {label}: batch never grew"
