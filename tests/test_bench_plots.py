"""bench.plots: the SpMM sparsity sweep figure of benchmark rows."""

from __future__ import annotations

import json

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
