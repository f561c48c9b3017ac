"""bench.plots: the SpMM sparsity sweep figure of benchmark rows."""

from __future__ import annotations

import json
import math

import pytest

from bench import plots


def _rows() -> list[dict]:
    rows = []
    for s, ms in ((0.95, 0.7), (0.5, 1.1)):  # out of order: the series sorts them
        rows.append(
            {
                "suite": "spmm",
                "case": f"paper-256x1152x50176-s{int(s * 100)}",
                "impl": "pattern_spmm[cuda,row_tiled]@cuda",
                "sparsity": s,
                "median_ms": ms,
                "status": "ok",
                "gpu_name": "NVIDIA H200",
                "commit": "8f916d63ce56",
                "scale": "gpu",
            }
        )
    rows.append({**rows[0], "impl": "cublas_fp32@cuda", "median_ms": 0.6})
    rows.append({**rows[0], "impl": "torch_csr_spmm@cuda", "status": "skipped"})  # not drawn
    rows.append({**rows[0], "case": "odd-31x97x257-s95", "impl": "x@cuda"})  # another shape
    rows.append({**rows[0], "suite": "csr", "impl": "y@cuda"})  # another suite
    return rows


def test_spmm_series_are_the_measured_rows_of_one_shape_by_sparsity():
    series = plots.spmm_series(_rows(), plots.PAPER_SPMM_CASE)
    assert series == {
        "pattern_spmm[cuda,row_tiled]": [(50.0, 1.1), (95.0, 0.7)],
        "cublas_fp32": [(95.0, 0.6)],
    }
    with pytest.raises(ValueError, match="no measured spmm row"):
        plots.spmm_series(_rows(), "paper-1x2x3")


def test_spmm_figure_draws_one_line_per_implementation_on_a_log_axis(tmp_path):
    fig = plots.spmm_figure(_rows())
    (ax,) = fig.axes
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    assert set(lines) == {"pattern_spmm[cuda,row_tiled]", "cublas_fp32"}
    assert list(lines["pattern_spmm[cuda,row_tiled]"].get_xdata()) == [50.0, 95.0]
    assert lines["cublas_fp32"].get_linestyle() == "--"  # a dense baseline
    assert lines["pattern_spmm[cuda,row_tiled]"].get_linestyle() == "-"
    assert ax.get_yscale() == "log"
    assert ax.get_title() == "paper-256x1152x50176: NVIDIA H200, commit 8f916d6, scale gpu"
    src = tmp_path / "rows.json"
    src.write_text(json.dumps({"rows": _rows()}))
    out = tmp_path / "fig" / "spmm.png"
    assert plots.main(["spmm", str(src), str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_spmm_figure_of_cpu_scale_rows_draws_their_paper_sized_shape(tmp_path, capsys):
    """The cpu and smoke scales measure paper-256x1152x196: the figure drew nothing but a
    traceback naming the gpu scale's shape."""
    small = [{**r, "case": r["case"].replace("x50176", "x196")} for r in _rows()]
    assert plots.spmm_shapes(small) == ["paper-256x1152x196", "odd-31x97x257"]
    assert plots.default_spmm_case(small) == "paper-256x1152x196"
    assert plots.default_spmm_case(_rows()) == plots.PAPER_SPMM_CASE
    assert plots.default_spmm_case([small[-2]]) == "odd-31x97x257"  # no paper shape at all
    with pytest.raises(ValueError, match=r"the rows' shapes: paper-256x1152x196, odd-31x97"):
        plots.spmm_series(small, plots.PAPER_SPMM_CASE)
    src = tmp_path / "rows.json"
    src.write_text(json.dumps({"rows": small}))
    out = tmp_path / "spmm.png"
    assert plots.main(["spmm", str(src), str(out)]) == 0 and out.is_file()
    # a named shape that is not there, and a file that is not rows.json: one line, exit 2
    csv = tmp_path / "rows.csv"
    csv.write_text("suite,case\nspmm,x\n")
    for argv, said in (
        (["spmm", str(src), str(out), "--case-prefix", "paper-1x2"], "the rows' shapes: "),
        (["spmm", str(csv), str(out)], "rows.csv is not a rows.json of bench.run (JSONDecode"),
        (["spmm", str(tmp_path / "none.json"), str(out)], "is not a rows.json of bench.run"),
    ):
        with pytest.raises(SystemExit) as stop:
            plots.main(argv)
        assert stop.value.code == 2 and said in capsys.readouterr().err


def _iteration_rows() -> list[dict]:
    base = {"suite": "iteration", "status": "ok", "gpu_name": "NVIDIA H200", "scale": "gpu"}
    base["commit"] = "8f916d63ce56"
    rows = []
    for case, speedups in (("r18-c32", (1.0, 0.5, 1.2)), ("r50-i224", (1.0, 0.9, 1.4))):
        for method, sp in zip(("dense", "clicktrain", "prunetrain"), speedups, strict=True):
            rows.append({**base, "case": case, "impl": f"{method}@cuda", "speedup_vs_dense": sp})
    rows.append({**rows[1], "impl": "sdgp@cuda", "status": "failed"})  # not drawn
    rows.append({**rows[1], "suite": "calibration", "impl": "copy@cuda"})  # another suite
    return rows


def test_iteration_speedups_are_each_methods_but_dense_by_case():
    assert plots.iteration_speedups(_iteration_rows()) == {
        "clicktrain": {"r18-c32": 0.5, "r50-i224": 0.9},
        "prunetrain": {"r18-c32": 1.2, "r50-i224": 1.4},
    }
    with pytest.raises(ValueError, match="no measured iteration row"):
        plots.iteration_speedups(_iteration_rows()[:1])


def test_iteration_figure_groups_a_bar_per_method_by_case(tmp_path):
    fig = plots.iteration_figure(_iteration_rows())
    (ax,) = fig.axes
    bars = {c.get_label(): [p.get_height() for p in c.patches] for c in ax.containers}
    assert bars == {"clicktrain": [0.5, 0.9], "prunetrain": [1.2, 1.4]}
    assert [t.get_text() for t in ax.get_xticklabels()] == ["r18-c32", "r50-i224"]
    assert [ln.get_ydata()[0] for ln in ax.get_lines()] == [1.0]  # the dense line
    assert ax.get_title() == "per iteration: NVIDIA H200, commit 8f916d6, scale gpu"
    src = tmp_path / "rows.json"
    src.write_text(json.dumps({"rows": _iteration_rows()}))
    out = tmp_path / "it.png"
    assert plots.main(["iteration", str(src), str(out)]) == 0 and out.stat().st_size > 1000


def test_spmm_figure_labels_its_axes_with_their_units():
    (ax,) = plots.spmm_figure(_rows()).axes
    assert ax.get_xlabel() == "sparsity of the filter matrix (%)"
    assert ax.get_ylabel() == "median time per call (ms)"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "pattern_spmm[cuda,row_tiled]",
        "cublas_fp32",
    ]


def test_figure_titles_name_where_the_suites_rows_ran_or_a_question_mark():
    iteration = {"suite": "iteration", "gpu_name": "Tesla V100", "commit": "0123456789"}
    spmm = {"suite": "spmm", "case": "paper-256x1152x196-s90", "impl": "a@cpu", "sparsity": 0.9}
    spmm["median_ms"] = 2.0
    for fields, title in (
        ({"gpu_name": "NVIDIA H200", "cpu_model": "Xeon"}, "NVIDIA H200, commit ?, scale ?"),
        ({"cpu_model": "Xeon", "device": "cpu"}, "Xeon, commit ?, scale ?"),
        (
            {"device": "cpu", "commit": "abcdef0123", "scale": "cpu"},
            "cpu, commit abcdef0, scale cpu",
        ),
        ({}, "?, commit ?, scale ?"),
    ):
        # the title reads the spmm suite's first row, not an earlier row of another suite
        (ax,) = plots.spmm_figure([iteration, {**spmm, **fields}], "paper-256x1152x196").axes
        assert ax.get_title() == f"paper-256x1152x196: {title}"


def test_spmm_series_draws_rows_without_a_status_and_skips_rows_without_a_median():
    row = {"suite": "spmm", "case": "paper-256x1152x196-s90", "impl": "a@cpu", "sparsity": 0.9}
    rows = [
        {**row, "median_ms": 2.0, "mean_ms": 9.0},  # no status: measured; the median, not mean
        {**row, "impl": "b@cpu", "status": "ok", "median_ms": None},
    ]
    assert plots.spmm_series(rows, "paper-256x1152x196") == {"a": [(90.0, 2.0)]}


def test_spmm_shapes_are_the_spmm_suites_cases_less_their_last_sparsity_part():
    rows = [
        {"suite": "spmm", "case": "odd-sm-31x97-s95"},
        {"suite": "csr", "case": "csr-64x64-s50"},
        {"suite": "spmm", "case": "paper-256x1152x196-s90"},
    ]
    assert plots.spmm_shapes(rows) == ["odd-sm-31x97", "paper-256x1152x196"]
    assert plots.default_spmm_case(rows) == "paper-256x1152x196"  # not the first, odd one
    assert plots.default_spmm_case(rows[:2]) == "odd-sm-31x97"
    two = [{"suite": "spmm", "case": "a-1x2x3-s50"}, {"suite": "spmm", "case": "b-4x5x6-s50"}]
    assert plots.default_spmm_case(two) == "a-1x2x3"
    assert plots.default_spmm_case([]) == plots.PAPER_SPMM_CASE


def test_spmm_figure_dashes_both_dense_baselines_and_widens_the_timed_choice():
    base = _rows()[0]
    rows = [
        {**base, "impl": "torch_mm_fp32@cuda"},
        {**base, "impl": "pattern_spmm[cuda]@cuda"},
        {**base, "impl": "pattern_spmm[cuda,row_tiled]@cuda"},
    ]
    (ax,) = plots.spmm_figure(rows).axes
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    assert lines["torch_mm_fp32"].get_linestyle() == "--"
    assert lines["pattern_spmm[cuda]"].get_linewidth() == 5
    assert lines["pattern_spmm[cuda]"].get_alpha() == 0.35
    assert lines["pattern_spmm[cuda,row_tiled]"].get_marker() == "o"
    assert lines["pattern_spmm[cuda,row_tiled]"].get_linewidth() != 5


def test_iteration_figure_keeps_the_rows_case_order_and_leaves_a_missing_bar_empty():
    """Two methods: bars 0.8 / 2 = 0.4 wide, centred 0.2 either side of each case's tick."""
    base = {"suite": "iteration", "gpu_name": "NVIDIA H200", "commit": "8f916d63ce56"}
    rows = [
        {**base, "case": "r50-i224", "impl": "clicktrain@cuda", "speedup_vs_dense": 0.9},
        {**base, "case": "r18-c32", "impl": "prunetrain@cuda", "speedup_vs_dense": 1.2},
        {**base, "case": "r50-i224", "impl": "prunetrain@cuda", "speedup_vs_dense": 1.4},
        {**base, "case": "r18-c32", "impl": "sdgp@cuda", "speedup_vs_dense": None},  # not run
    ]
    assert plots.iteration_speedups(rows) == {
        "clicktrain": {"r50-i224": 0.9},
        "prunetrain": {"r18-c32": 1.2, "r50-i224": 1.4},
    }
    (ax,) = plots.iteration_figure(rows).axes
    assert [t.get_text() for t in ax.get_xticklabels()] == ["r50-i224", "r18-c32"]
    assert list(ax.get_xticks()) == [0, 1]
    assert ax.get_ylabel() == "speedup over dense (forward + backward)"
    bars = {c.get_label(): c.patches for c in ax.containers}
    heights = [p.get_height() for p in bars["clicktrain"]]
    assert heights[0] == 0.9 and math.isnan(heights[1])
    for method, offset in (("clicktrain", -0.2), ("prunetrain", 0.2)):
        for i, p in enumerate(bars[method]):
            assert p.get_width() == pytest.approx(0.4)
            assert p.get_x() + p.get_width() / 2 == pytest.approx(i + offset)


def test_main_refuses_a_json_that_is_not_rows_and_an_unknown_figure(tmp_path, capsys):
    out = tmp_path / "fig.png"
    for i, text in enumerate(('{"runs": []}', "[1, 2]", '{"rows": [{"suite": "csr"}]}')):
        src = tmp_path / f"bad{i}.json"
        src.write_text(text)
        with pytest.raises(SystemExit) as stop:
            plots.main(["spmm", str(src), str(out)])
        err = capsys.readouterr().err
        assert stop.value.code == 2
        assert ("is not a rows.json of bench.run" if i < 2 else "no measured spmm row") in err
    with pytest.raises(SystemExit) as stop:
        plots.main(["csr", str(src), str(out)])
    assert stop.value.code == 2 and "invalid choice: 'csr'" in capsys.readouterr().err
    assert not out.exists()


def test_main_writes_the_format_of_the_files_suffix_and_says_where(tmp_path, capsys):
    src = tmp_path / "rows.json"
    src.write_text(json.dumps({"rows": _rows()}))
    out = tmp_path / "spmm.svg"
    assert plots.main(["spmm", str(src), str(out)]) == 0
    assert "<svg" in out.read_text()[:1000]
    assert capsys.readouterr().out == f"wrote {out}\n"
