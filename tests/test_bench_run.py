"""Tests of bench.run (rows as CSV, JSON and Markdown) and of the asv configuration."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from bench import cases, run
from impl.env import REPO_ROOT


def test_run_writes_tidy_rows_with_provenance(tmp_path):
    out = tmp_path / "bench"
    status = run.main(
        ["--scale", "smoke", "--out", str(out), "--suite", "csr", "--match", "37x13x3x3-s95"]
    )
    assert status == 0
    payload = json.loads((out / "rows.json").read_text())
    assert payload["scale"] == "smoke" and payload["suites"] == ["calibration", "csr"]
    assert payload["provenance"]["commit"] == cases.provenance()["commit"]
    rows = payload["rows"]
    csr = [r for r in rows if r["suite"] == "csr"]
    assert {r["case"] for r in csr} == {"37x13x3x3-s95"}
    assert len(csr) == len(cases.implementations("csr", "smoke"))
    ok = {r["impl"]: r for r in csr if r["status"] == "ok"}
    assert {"pattern_csr[ref]@cpu", "torch_to_sparse_csr@cpu", "scipy_csr@cpu"} <= set(ok)
    assert ok["pattern_csr[ref]@cpu"]["speedup_vs_scipy_csr"] > 0
    assert ok["pattern_csr[ref]@cpu"]["frac_bw_measured"] > 0  # against the calibration copy
    assert all(r["reason"] for r in csr if r["status"] == "skipped")
    with open(out / "rows.csv") as fh:
        table = list(csv.DictReader(fh))
    assert len(table) == len(rows)
    assert list(table[0])[:5] == ["suite", "case", "impl", "device", "status"]
    assert "torch" in table[0] and "tf32_matmul" in table[0]
    text = (out / "summary.md").read_text()
    assert "## csr" in text and "37x13x3x3-s95" in text


def test_run_rejects_an_unknown_suite(tmp_path):
    with pytest.raises(ValueError, match="unknown suite"):
        run.run("smoke", tmp_path, ["sorting"])


def test_columns_lead_with_identity():
    cols = run.columns([{"x": 1, "impl": "a", "suite": "s"}, {"median_ms": 2.0, "y": 3}])
    assert cols == ["suite", "impl", "median_ms", "x", "y"]


def test_asv_config_points_at_bench_and_reports():
    conf = json.loads((REPO_ROOT / "asv.conf.json").read_text())
    assert conf["benchmark_dir"] == "bench"
    assert conf["results_dir"].startswith("reports/asv/")
    assert conf["html_dir"].startswith("reports/asv/")
    assert conf["matrix"]["req"]["torch"] == ["2.13.0"]


def test_asv_discovers_only_the_asv_modules():
    discovery = pytest.importorskip("asv_runner.discovery")
    names = [b.name for b in discovery.disc_benchmarks(str(REPO_ROOT / "bench"))]
    assert names, "asv found no benchmark"
    assert all(n.split(".")[0] in ("asv_kernels", "asv_iteration", "asv_comm") for n in names)
    for expected in (
        "asv_kernels.SpMM.time_op",
        "asv_kernels.SpMM.track_tflops",
        "asv_kernels.CSRConversion.track_gbps",
        "asv_kernels.SpMMFraction.track_fraction_of_peak",
        "asv_iteration.Iteration.track_forward_ms",
        "asv_comm.AllreduceBytes.track_payload_bytes",
    ):
        assert expected in names
    assert not (Path(REPO_ROOT) / "bench" / "pytest_suite" / "__init__.py").exists()


def test_summary_shows_peak_memory_where_rows_have_it():
    meta = {"scale": "gpu", "suites": ["iteration"], "provenance": {"gpu_name": "GPU"}}
    rows = [
        {"suite": "iteration", "case": "c", "impl": "dense@cuda", "status": "ok",
         "median_ms": 2.0, "peak_memory_mib": 1234.5},
        {"suite": "iteration", "case": "c", "impl": "sdgp@cuda", "status": "ok",
         "median_ms": 3.0, "peak_memory_mib": 1300.0},
    ]  # fmt: skip
    text = run.summary(rows, meta)
    assert "| case | impl | median_ms | peak_memory_mib |" in text and "| 1.23e+03 |" in text
    cpu_rows = [{k: v for k, v in r.items() if k != "peak_memory_mib"} for r in rows]
    assert "peak_memory_mib" not in run.summary(cpu_rows, meta)
