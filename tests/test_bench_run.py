"""Tests of bench.run (rows as CSV, JSON and Markdown) and of the asv configuration."""

from __future__ import annotations

import csv
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench import cases, run
from impl.env import REPO_ROOT


@pytest.mark.slow
def test_run_writes_tidy_rows_with_provenance(tmp_path, capsys):
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
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    assert sum(counts.values()) == len(rows) and all(n > 0 for n in counts.values())
    assert capsys.readouterr().out.strip().endswith(f"({counts})")  # rows per status
    assert 0 <= payload["wall_seconds"] < 600  # seconds this run took, not a clock reading
    skipped = [r for r in csr if r["status"] == "skipped"]  # the GPU implementations, here
    assert skipped and f"Not measured ({len(skipped)} rows):" in text
    for reason in {r["reason"] for r in skipped}:
        n = sum(r["reason"] == reason for r in skipped)
        assert f"- {n} x skipped: {reason}" in text


def test_a_run_with_an_error_row_exits_1(tmp_path, monkeypatch, capsys):
    rows = [{"status": "ok"}, {"status": "error"}, {"status": "ok"}]
    monkeypatch.setattr(run, "run", lambda *a, **k: rows)
    assert run.main(["--scale", "smoke", "--out", str(tmp_path), "--suite", "csr"]) == 1
    assert "({'ok': 2, 'error': 1})" in capsys.readouterr().out


def test_a_long_list_names_its_first_twelve_and_counts_the_rest():
    names = [f"case{i}" for i in range(14)]
    assert run._listed(names) == ", ".join(names[:12]) + ", ... (2 more)"
    assert run._listed(names[:12]) == ", ".join(names[:12])  # exactly the limit: all of them
    assert run._listed(names[:13]).endswith("case11, ... (1 more)")
    assert run._listed(names, limit=3) == "case0, case1, case2, ... (11 more)"


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


def test_the_scratch_asv_config_writes_outside_the_tracked_results(tmp_path):
    """A smoke asv check rewrote the tracked reports/asv/results/benchmarks.json with its
    own cases; the scratch copy sends every output elsewhere and keeps every other setting."""
    from bench.asv_scratch import scratch_config

    conf = json.loads((REPO_ROOT / "asv.conf.json").read_text())
    path = scratch_config(REPO_ROOT, tmp_path / "s")
    assert path == tmp_path / "s" / "asv.conf.json"
    copy = json.loads(path.read_text())
    for key, name in (("results_dir", "results"), ("html_dir", "html"), ("env_dir", "env")):
        assert copy[key] == str((tmp_path / "s" / name).resolve())
    assert copy["repo"] == str(Path(REPO_ROOT).resolve())
    assert copy["benchmark_dir"] == str((Path(REPO_ROOT) / "bench").resolve())
    moved = {"repo", "benchmark_dir", "results_dir", "html_dir", "env_dir"}
    assert {k: v for k, v in copy.items() if k not in moved} == {
        k: v for k, v in conf.items() if k not in moved
    }
    config = pytest.importorskip("asv.config")
    assert config.Config.load(str(path)).results_dir == copy["results_dir"]  # asv reads it


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


#: Units of the asv tracks where a larger value is better (asv reads every value as lower is
#: better, so a faster kernel would be flagged as a regression).
HIGHER_IS_BETTER_UNITS = {"TFLOP/s", "GB/s", "fraction"}


def test_asv_regression_search_skips_every_higher_is_better_track():
    discovery = pytest.importorskip("asv_runner.discovery")
    conf = json.loads((REPO_ROOT / "asv.conf.json").read_text())
    skipped = [
        rx for rx, start in conf.get("regressions_first_commits", {}).items() if start is None
    ]

    def excluded(name: str) -> bool:  # asv's own test: re.match on "name(params)"
        return any(re.match(rx, f"{name}(case, impl)") for rx in skipped)

    tracks = [b for b in discovery.disc_benchmarks(str(REPO_ROOT / "bench")) if b.type == "track"]
    rates = [b.name for b in tracks if b.unit in HIGHER_IS_BETTER_UNITS]
    others = [b.name for b in tracks if b.unit not in HIGHER_IS_BETTER_UNITS]
    assert rates and others
    assert [n for n in rates if not excluded(n)] == []
    assert [n for n in others if excluded(n)] == []  # times and bytes keep their search


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
    whole = [r | {"iteration_ms": 2.5, "iteration_speedup_vs_dense": 1.0} for r in rows]
    assert "| iteration_ms |" in run.summary(whole, meta)
    assert "| iteration_speedup_vs_dense |" in run.summary(whole, meta)
    cpu_rows = [{k: v for k, v in r.items() if k != "peak_memory_mib"} for r in rows]
    assert "peak_memory_mib" not in run.summary(cpu_rows, meta)


# -- a run cut by its time limit keeps what it measured -----------------------------------------


def _run_and_cut(
    cmd: list[str], out: Path, min_rows: int, env_extra: dict[str, str], signals: int = 1
):
    """Start ``cmd``, wait until ``out/rows.partial.jsonl`` holds ``min_rows`` rows, SIGTERM it
    (``signals`` times back to back, as GNU timeout signals the child and then its group).

    Returns (exit status, rows in the partial file when the process ended)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", **env_extra)
    proc = subprocess.Popen(
        cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    partial = out / run.PARTIAL_NAME
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if partial.exists() and len(partial.read_text().splitlines()) >= min_rows:
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the run ended before it could be cut"
        for _ in range(signals):
            proc.send_signal(signal.SIGTERM)
        text, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = partial.read_text().splitlines()
    return proc.returncode, [json.loads(ln) for ln in lines], text


@pytest.mark.slow
@pytest.mark.parametrize("signals", [1, 2], ids=["one-sigterm", "child-then-group"])
def test_bench_run_cut_by_sigterm_keeps_its_rows(tmp_path, signals):
    out = tmp_path / "cut"
    cmd = [sys.executable, "-m", "bench.run", "--scale", "smoke", "--out", str(out)]
    rc, partial, text = _run_and_cut(cmd, out, 5, {}, signals)
    assert rc == 143, text[-2000:]  # 128 + SIGTERM, after the files were written
    payload = json.loads((out / "rows.json").read_text())
    assert payload["complete"] is False
    cut = payload["cut_at"]
    assert cut["reason"].startswith("SIGTERM") and cut["rows"] == len(payload["rows"])
    assert len(payload["rows"]) >= 5 and len(partial) == len(payload["rows"])
    assert [r["impl"] for r in partial] == [r["impl"] for r in payload["rows"]]
    assert payload["rows"][0]["suite"] == "calibration"
    assert len(payload["rows"]) < sum(len(cases.pairs(s, "smoke")) for s in cases.SUITES)
    with open(out / "rows.csv") as fh:
        assert len(list(csv.DictReader(fh))) == len(payload["rows"])
    assert "**Incomplete**" in (out / "summary.md").read_text()
    assert "complete: false" in text


@pytest.mark.slow
def test_sdgp_semi_cut_by_sigterm_keeps_its_rows(tmp_path):
    out = tmp_path / "semi"
    cmd = [sys.executable, "-m", "bench.sdgp_semi", "--out", str(out), "--device", "cpu"]
    rc, partial, text = _run_and_cut(cmd, out, 3, {"PDTBENCH_BENCH_SMALL": "1"})
    assert rc == 143, text[-2000:]
    payload = json.loads((out / "rows.json").read_text())
    meta = payload["meta"]
    assert meta["complete"] is False and meta["cut_at"]["reason"].startswith("SIGTERM")
    assert meta["cut_at"]["model"] in ("resnet18", "resnet50")
    assert len(payload["rows"]) == len(partial) >= 3
    assert "**Incomplete**" in (out / "summary.md").read_text()
    flags = {"tf32_matmul": False, "tf32_cudnn": False, "cudnn_benchmark": False}
    assert all(flags.items() <= r.items() for r in payload["rows"])  # each row says its flags


@pytest.mark.slow
def test_complete_run_is_marked_complete_and_drops_the_partial_file(tmp_path):
    out = tmp_path / "done"
    rows = run.run("smoke", out, ["calibration"])
    payload = json.loads((out / "rows.json").read_text())
    assert payload["complete"] is True and payload["cut_at"] is None
    assert len(payload["rows"]) == len(rows) == len(cases.pairs("calibration", "smoke"))
    assert not (out / run.PARTIAL_NAME).exists()
    assert "Incomplete" not in (out / "summary.md").read_text()


@pytest.mark.slow
def test_an_error_mid_run_writes_the_rows_before_it(tmp_path, monkeypatch):
    real = cases.run_pair
    calls = []

    def flaky(case, impl, scale=None):
        calls.append(case.suite)
        if case.suite == "nm_prune":
            raise KeyboardInterrupt
        return real(case, impl, scale)

    monkeypatch.setattr(cases, "run_pair", flaky)
    out = tmp_path / "err"
    with pytest.raises(KeyboardInterrupt):
        run.run("smoke", out, ["calibration", "nm_prune"])
    payload = json.loads((out / "rows.json").read_text())
    assert payload["complete"] is False
    assert payload["cut_at"]["pair"].startswith("nm_prune/")
    assert payload["cut_at"]["reason"] == "interrupted (SIGINT)"
    assert {r["suite"] for r in payload["rows"]} == {"calibration"}
    assert payload["cut_at"]["rows"] == len(payload["rows"]) > 0  # the rows before the cut
    assert (out / run.PARTIAL_NAME).exists()

    # the next run into the same --out keeps the cut run's rows (it truncated them)
    monkeypatch.setattr(cases, "run_pair", real)
    cut_rows = (out / run.PARTIAL_NAME).read_text()
    run.run("smoke", out, ["calibration"])
    (kept,) = out.glob("cut-*")
    assert (kept / run.PARTIAL_NAME).read_text() == cut_rows
    assert {r["suite"] for r in csv.DictReader((kept / "rows.csv").open())} == {"calibration"}
    assert json.loads((kept / "rows.json").read_text())["complete"] is False
    assert json.loads((out / "rows.json").read_text())["complete"] is True
    assert not (out / run.PARTIAL_NAME).exists()  # complete: everything is in rows.json


def test_ctrl_c_ends_bench_run_in_one_line_with_its_rows_written(tmp_path, monkeypatch, capsys):
    # SIGINT kept the rows but ended in a KeyboardInterrupt traceback
    real = cases.run_pair

    def interrupted(case, impl, scale=None):
        if case.suite == "nm_prune":
            raise KeyboardInterrupt
        return real(case, impl, scale)

    monkeypatch.setattr(cases, "run_pair", interrupted)
    out = tmp_path / "int"
    argv = ["--scale", "smoke", "--suite", "nm_prune", "--out", str(out)]
    assert run.main(argv) == 130
    err = capsys.readouterr().err.strip()
    assert err.endswith(f"interrupted; the rows measured are in {out}") and "Traceback" not in err
    payload = json.loads((out / "rows.json").read_text())
    assert payload["complete"] is False and {r["suite"] for r in payload["rows"]} == {"calibration"}


def test_a_second_run_into_the_same_out_is_refused_while_the_first_writes(tmp_path, capsys):
    # two runs into one --out tore each other's rows.partial.jsonl lines
    from impl import rundir

    out = tmp_path / "busy"
    out.mkdir()
    with rundir.locked(out):  # another bench.run writing there (flock: per open file)
        assert run.main(["--scale", "smoke", "--suite", "calibration", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "is being written by another process" in err and "use another --out" in err
    assert not (out / "rows.json").exists()


def test_an_out_that_cannot_be_a_directory_is_one_line_before_any_measurement(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("")
    for out in (afile, afile / "sub"):
        assert run.main(["--scale", "smoke", "--suite", "calibration", "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err == f"python -m bench.run: --out {out}: {afile} is a file, not a directory\n"


def test_rows_are_written_whole_or_not_at_all(tmp_path, monkeypatch):
    # a kill mid-write left rows.json empty (JSONDecodeError) and the previous rows lost
    out = tmp_path / "atomic"
    run.write_rows([{"suite": "s", "case": "c", "impl": "i", "status": "ok"}], out, {"x": 1})
    before = (out / "rows.json").read_text()

    def killed(fd):  # a signal arriving once the new bytes are written, before they count
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", killed)
    with pytest.raises(KeyboardInterrupt):
        run.write_rows([], out, {"x": 2})
    monkeypatch.undo()
    assert (out / "rows.json").read_text() == before
    assert not list(out.glob(".*.tmp"))  # the half-done file is gone too


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (run.Cut(143), "SIGTERM (the step's time limit)"),
        (KeyboardInterrupt(), "interrupted (SIGINT)"),
        (SystemExit(3), "SystemExit(3)"),
        (ValueError("bad"), "ValueError: bad"),
        (None, "unknown"),
    ],
    ids=["sigterm", "sigint", "exit", "error", "none"],
)
def test_cut_reason(exc, expected):
    assert run.cut_reason(exc) == expected


def test_terminate_gracefully_turns_sigterm_into_systemexit_and_restores():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as info, run.terminate_gracefully():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)  # the handler runs at the next bytecode
    assert info.value.code == 143 and isinstance(info.value, run.Cut)
    assert signal.getsignal(signal.SIGTERM) is before
    # a second SIGTERM while the first one's cleanup runs is ignored, not raised again
    cleaned_up = False
    with run.terminate_gracefully():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)
        except run.Cut:
            assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGTERM)  # ignored during the cleanup
            time.sleep(0.2)
            cleaned_up = True
    assert cleaned_up and signal.getsignal(signal.SIGTERM) is before
    with run.ignoring_sigterm():
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    assert signal.getsignal(signal.SIGTERM) is before


def test_case_names_select_and_order_pairs():
    names = ["resnet50-imagenet224-b64", "resnet18-cifar32-b128", "no-such-case"]
    got = cases.select_pairs("iteration", "gpu", case_names=names)
    assert [c.name for c, _ in got][:: len(cases.implementations("iteration", "gpu"))] == names[:2]
    assert len(got) == 2 * len(cases.implementations("iteration", "gpu"))
    calib = cases.select_pairs("calibration", "gpu", case_names=names, match="zzz")
    assert len(calib) == len(cases.pairs("calibration", "gpu"))  # never filtered
    odd = cases.select_pairs("csr", "smoke", match="37x13x3x3-s95")
    assert odd and all(c.name == "37x13x3x3-s95" for c, _ in odd)


@pytest.mark.parametrize(
    ("prov", "cpu_only"),
    [
        ({"gpu_name": None, "gpu_available": True}, False),
        ({"gpu_name": "NVIDIA H100", "gpu_available": False}, True),
        ({"gpu_name": "NVIDIA H100"}, False),
        ({"gpu_name": None}, True),
    ],
    ids=["unnamed-gpu", "named-but-unusable", "old-rows-named", "old-rows-none"],
)
def test_summary_says_cpu_only_from_torch_not_the_gpu_name(prov, cpu_only):
    meta = {"scale": "gpu", "suites": [], "provenance": prov}
    assert ("**CPU only**" in run.summary([], meta)) is cpu_only


def test_asv_kernel_setup_makes_one_untimed_call_before_the_timed_one(monkeypatch):
    # `asv run --quick` takes one sample: a first call (autotuning, library handles, lazy
    # module loading) must not be it
    from bench import asv_kernels

    bench_obj = asv_kernels.SpMM()
    case, impl = bench_obj.params[0][-1], "torch_mm@cpu"  # dense GEMM applies to every case
    assert impl in bench_obj.params[1]
    made = []
    real_prepare = cases.prepare

    def counting_prepare(*a, **kw):
        prepared = real_prepare(*a, **kw)
        call = prepared.call
        prepared.call = lambda i: made.append(i) or call(i)
        return prepared

    monkeypatch.setattr(cases, "prepare", counting_prepare)
    bench_obj.setup(case, impl)
    try:
        assert made == [0] and bench_obj.calls == 1
        bench_obj.time_op(case, impl)
        assert made == [0, 1]
    finally:
        bench_obj.teardown(case, impl)


def test_gpu_scale_without_a_gpu_refuses_cuda_only_suites_and_writes_nothing(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(run.cases, "_gpu_visible", lambda: False)
    out = tmp_path / "gpu"
    assert run.main(["--scale", "gpu", "--out", str(out), "--suite", "csr"]) == 2
    err = capsys.readouterr().err
    assert "suite(s) csr time CUDA implementations only" in err
    assert "--suite allreduce" in err  # what can still run here
    assert not out.exists()


def test_gpu_scale_without_a_gpu_still_counts_allreduce_bytes(monkeypatch):
    monkeypatch.setattr(run.cases, "_gpu_visible", lambda: False)
    run.check_device("gpu", ["allreduce"])  # CPU pairs: no refusal
    run.check_device("cpu", ["csr", "spmm"])  # other scales are never refused


@pytest.mark.parametrize(
    ("flag", "text"),
    [(["--case", "nope"], "--case nope"), (["--match", "zzz"], "--match 'zzz'")],
    ids=["case", "match"],
)
def test_a_filter_that_selects_no_case_is_refused_before_running(tmp_path, capsys, flag, text):
    # calibration alone used to run and exit 0 ("wrote 5 rows")
    out = tmp_path / "none"
    assert run.main(["--scale", "smoke", "--out", str(out), "--suite", "csr", *flag]) == 2
    err = capsys.readouterr().err
    assert text in err and "selects no case of suite(s) csr at scale smoke" in err
    assert "37x13x3x3-s95" in err  # the valid names of the chosen suite
    assert not out.exists()


def test_check_filter_shortens_long_lists_and_passes_what_selects_something():
    with pytest.raises(ValueError, match=r"more\)$"):
        run.check_filter("smoke", ["csr", "spmm", "conv"], match="zzz")
    run.check_filter("smoke", ["csr"], match="37x13x3x3-s95")  # selects a case: no refusal
    run.check_filter("smoke", ["csr", "spmm"], case_names=["37x13x3x3-s95"])  # one suite has it
    run.check_filter("smoke", ["calibration"], match="zzz")  # calibration alone: never filtered
    run.check_filter("smoke", ["csr"])  # no filter


def test_a_loaded_cpu_is_warned_of_before_cpu_timings():
    assert run.load_warning("cpu", load_1m=0.3, cores=2) == ""
    busy = run.load_warning("cpu", load_1m=1.8, cores=2)
    assert "1.80 on 2 cores" in busy and "load_avg_1m" in busy
    assert run.load_warning("smoke", load_1m=1.8, cores=2) != ""
    assert run.load_warning("gpu", load_1m=40.0, cores=2) == ""  # times the GPU


@pytest.mark.parametrize("impl", ["dense@cpu", "sdgp@cpu"])
@pytest.mark.slow
def test_asv_iteration_times_one_step_and_tracks_its_phases_as_asv_calls_them(monkeypatch, impl):
    """asv's order on one parameter pair: setup, the timed iteration, each track_*, then
    teardown; at the smoke case every phase is a positive time in ms and the TF32 flags
    setup pinned are restored after."""
    import torch

    from bench import asv_iteration

    monkeypatch.setattr(asv_iteration, "_SCALE", "smoke")
    case = cases.grid("iteration", "smoke")[0].name
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    bench_obj = asv_iteration.Iteration()
    bench_obj.setup(case, impl)
    try:
        assert bench_obj.calls == 1  # one untimed warm-up iteration
        bench_obj.time_iteration(case, impl)
        assert bench_obj.calls == 2
        phases = {
            k: getattr(bench_obj, f"track_{k}")(case, impl)
            for k in ("forward_ms", "backward_ms", "step_ms", "forward_backward_tflops")
        }
    finally:
        bench_obj.teardown(case, impl)
    assert all(v > 0 for v in phases.values()), phases
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == before
    assert bench_obj.prepared is None


def test_asv_allreduce_counts_each_methods_bytes_once_and_skips_what_could_not_count(
    monkeypatch,
):
    from bench import asv_comm

    monkeypatch.setattr(asv_comm, "_SCALE", "smoke")
    case = cases.grid("allreduce", "smoke")[0].name
    bench_obj = asv_comm.AllreduceBytes()
    rows = bench_obj.setup_cache()
    assert {k[1] for k in rows} == set(cases.implementations("allreduce", "smoke"))
    got = {}
    for impl in ("dense@cpu", "prunetrain@cpu", "clicktrain@cpu"):
        bench_obj.setup(rows, case, impl)
        got[impl] = (
            bench_obj.track_payload_bytes(rows, case, impl),
            bench_obj.track_payload_fraction(rows, case, impl),
            bench_obj.track_ring_bytes_per_rank_p8(rows, case, impl),
        )
    payload, fraction, ring = got["dense@cpu"]
    assert fraction == 1.0 and ring == pytest.approx(2 * 7 / 8 * payload)
    # the pruned methods send less than dense; a ring over 8 ranks sends 2 (p - 1) / p of it
    for impl in ("prunetrain@cpu", "clicktrain@cpu"):
        p, f, r = got[impl]
        assert p < payload and f == pytest.approx(p / payload)
        assert r == pytest.approx(2 * 7 / 8 * p)
    broken = dict(rows)
    broken[(case, "dense@cpu")] = {**rows[(case, "dense@cpu")], "status": "error", "reason": "x"}
    with pytest.raises(NotImplementedError, match="error: x"):  # asv skips the pair
        bench_obj.setup(broken, case, "dense@cpu")


@pytest.mark.slow
def test_an_infinite_value_is_written_as_null_in_strict_json(tmp_path, monkeypatch):
    """rows.json and the partial file stay strict JSON (no ``Infinity``) whatever a row holds."""
    real = cases.run_pair

    def infinite(case, impl, scale=None):
        return {**real(case, impl, scale), "speedup": float("inf"), "gbps": float("-inf")}

    monkeypatch.setattr(cases, "run_pair", infinite)
    out = tmp_path / "inf"
    run.run("smoke", out, ["calibration"])
    text = (out / "rows.json").read_text()
    assert "Infinity" not in text and "NaN" not in text
    rows = json.loads(text)["rows"]
    assert rows and all(r["speedup"] is None and r["gbps"] is None for r in rows)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, "-"),
        ("", "-"),
        (float("inf"), "-"),
        (float("nan"), "-"),
        (1234.5, "1.23e+03"),
        (0.5, "0.5"),
        (2, "2"),
        (False, "False"),
        ("x@cpu", "x@cpu"),
    ],
    ids=["none", "empty", "inf", "nan", "large", "half", "int", "bool", "text"],
)
def test_summary_cells_show_three_significant_digits_and_a_dash_for_no_value(value, text):
    """A missing, empty or non-finite value is a dash; floats keep three significant digits."""
    assert run._fmt(value) == text


def test_summary_table_columns_and_the_rows_not_measured():
    """Per suite: one table of the ok rows (times, host columns, values, rates, speedups, in
    that order; a column where any ok row has it), then a count of the other rows per status
    and reason, sorted; rows of suites not asked for are left out."""
    ok = {"suite": "s", "case": "a", "status": "ok"}
    rows = [
        ok | {"impl": "x@cpu", "median_ms": 2.0, "host_bound": False, "payload_bytes": 100,
              "tflops": 0.5, "speedup_vs_b": 1.5, "iteration_speedup_vs_b": 2.0},
        ok | {"impl": "b@cpu", "median_ms": 3.0, "host_bound": None, "payload_bytes": None,
              "tflops": None},
        {"suite": "s", "case": "a", "impl": "g@cuda", "status": "skipped", "reason": "no GPU"},
        {"suite": "s", "case": "b", "impl": "g@cuda", "status": "skipped", "reason": "no GPU"},
        {"suite": "s", "case": "b", "impl": "y@cpu", "status": "error", "reason": "KeyError: w"},
        {"suite": "t", "case": "z", "impl": "q@cpu", "status": "ok", "median_ms": 9.0},
    ]  # fmt: skip
    meta = {"scale": "cpu", "suites": ["s"], "provenance": {}, "complete": True}
    text = run.summary(rows, meta)
    expected = [
        "## s",
        "",
        "| case | impl | median_ms | host_bound | payload_bytes | tflops "
        "| iteration_speedup_vs_b | speedup_vs_b |",
        "|" + "---|" * 8,
        "| a | x@cpu | 2 | False | 100 | 0.5 | 2 | 1.5 |",
        "| a | b@cpu | 3 | - | - | - | - | - |",
        "",
        "Not measured (3 rows):",
        "",
        "- 1 x error: KeyError: w",
        "- 2 x skipped: no GPU",
        "",
    ]
    lines = text.splitlines()
    start = lines.index("## s")
    assert lines[start : start + len(expected)] == expected
    assert "q@cpu" not in text and "## t" not in text


@pytest.mark.parametrize(
    ("meta", "note"),
    [
        ({}, None),
        ({"complete": True, "cut_at": None}, None),
        ({"complete": False, "cut_at": None}, "the run was cut (unknown) at between pairs;"),
        (
            {"complete": False, "cut_at": {"pair": "csr/c/i@cpu", "reason": "SIGTERM (x)"}},
            "the run was cut (SIGTERM (x)) at csr/c/i@cpu;",
        ),
    ],
    ids=["no-flag", "complete", "cut-between-pairs", "cut-in-a-pair"],
)
def test_summary_says_where_an_incomplete_run_was_cut(meta, note):
    """Rows written without ``complete`` (older files) or complete carry no note; a cut run
    names the reason and the pair that was running, or says it was cut between pairs."""
    text = run.summary([], {"scale": "cpu", "suites": [], "provenance": {}, **meta})
    if note is None:
        assert "Incomplete" not in text
    else:
        assert f"**Incomplete**: {note}" in text


def test_rows_json_writes_non_finite_values_as_null(tmp_path):
    """rows.json and the partial file stay strict JSON: inf, -inf and NaN are null, the CSV
    cell of a missing value is empty."""
    row = {"suite": "s", "case": "c", "impl": "i", "status": "ok", "a": float("inf"),
           "b": float("-inf"), "c": float("nan"), "d": 1.5, "e": None}  # fmt: skip
    run.write_rows([row], tmp_path, {"scale": "smoke"})
    text = (tmp_path / "rows.json").read_text()
    assert "Infinity" not in text and "NaN" not in text
    (got,) = json.loads(text)["rows"]
    assert [got[k] for k in "abcde"] == [None, None, None, 1.5, None]
    with open(tmp_path / "rows.csv") as fh:
        (cells,) = list(csv.DictReader(fh))
    assert cells["d"] == "1.5" and cells["e"] == ""
    partial = run.PartialRows(tmp_path)
    partial.append(row)
    partial.close()
    line = json.loads((tmp_path / run.PARTIAL_NAME).read_text())
    assert [line[k] for k in "abcde"] == [None, None, None, 1.5, None]


def test_partial_rows_are_flushed_at_once_truncated_when_opened_and_removed_on_request(tmp_path):
    """Each appended row is on disk before the file is closed (a SIGKILL keeps it); a new
    file starts empty; ``close(remove=True)`` deletes it, ``close()`` keeps it."""
    (tmp_path / run.PARTIAL_NAME).write_text('{"old": 1}\n')
    partial = run.PartialRows(tmp_path)
    assert (tmp_path / run.PARTIAL_NAME).read_text() == ""
    partial.append({"x": 1})
    assert (tmp_path / run.PARTIAL_NAME).read_text() == '{"x": 1}\n'
    partial.close()
    assert (tmp_path / run.PARTIAL_NAME).exists()
    run.PartialRows(tmp_path).close(remove=True)
    assert not (tmp_path / run.PARTIAL_NAME).exists()


def test_keep_cut_run_moves_every_file_of_a_cut_run_aside(tmp_path):
    """A cut run (its partial file there) has the partial file, the CSV, the JSON and the
    summary moved into ``cut-<time>/``; other files stay; without a partial file nothing
    moves and None is returned."""
    names = (run.PARTIAL_NAME, "rows.csv", "rows.json", "summary.md")
    for name in (*names, "notes.txt"):
        (tmp_path / name).write_text(name)
    kept = run.keep_cut_run(tmp_path)
    assert kept is not None and kept.parent == tmp_path and kept.name.startswith("cut-")
    assert sorted(p.name for p in kept.iterdir()) == sorted(names)
    assert all((kept / n).read_text() == n for n in names)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["notes.txt", kept.name])
    for name in names[1:]:
        (tmp_path / name).write_text(name)
    assert run.keep_cut_run(tmp_path) is None
    assert all((tmp_path / n).exists() for n in names[1:])


def test_cut_reason_keeps_the_first_300_characters_of_an_error():
    assert run.cut_reason(RuntimeError("e" * 400)) == "RuntimeError: " + "e" * 300


def _fake_pair(case, impl, scale=None):
    return {
        "suite": case.suite,
        "case": case.name,
        "impl": impl.name,
        "device": impl.device,
        "status": "ok",
        "reason": "",
        "median_ms": 4.0 if impl.baseline else 2.0,
        "baseline": impl.baseline,
        "math": impl.math,
    }


def test_run_writes_each_suite_and_each_row_as_it_goes(tmp_path, monkeypatch):
    """While the second suite runs, rows.json already holds the first suite's rows and the
    partial file every row measured so far; the complete run records its filter, returns
    the rows with their speedups, and removes the partial file."""
    out = tmp_path / "out"
    seen = []

    def pair(case, impl, scale=None):
        if case.suite == "csr":
            written = json.loads((out / "rows.json").read_text())["rows"]
            partial = (out / run.PARTIAL_NAME).read_text().splitlines()
            seen.append((len(written), len(partial)))
        return _fake_pair(case, impl, scale)

    monkeypatch.setattr(cases, "run_pair", pair)
    n_calib = len(cases.pairs("calibration", "smoke"))
    rows = run.run("smoke", out, ["calibration", "csr"], match="s95", case_names=["37x13x3x3-s95"])
    n_csr = len(cases.select_pairs("csr", "smoke", match="s95", case_names=["37x13x3x3-s95"]))
    assert n_csr > 1 and len(rows) == n_calib + n_csr
    assert seen == [(n_calib, n_calib + k) for k in range(n_csr)]
    payload = json.loads((out / "rows.json").read_text())
    assert payload["match"] == "s95" and payload["cases"] == ["37x13x3x3-s95"]
    assert payload["complete"] is True and payload["cut_at"] is None
    assert 0 <= payload["wall_seconds"] < 60
    assert not (out / run.PARTIAL_NAME).exists()
    ref = next(r for r in rows if r["impl"] == "pattern_csr[ref]@cpu")
    assert ref["speedup_vs_scipy_csr"] == 2.0  # a baseline's 4 ms over this row's 2 ms


def _interrupted_calibration(tmp_path):
    """Run the smoke calibration suite into ``tmp_path/out``, which Ctrl-C cuts; the out dir."""
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        run.run("smoke", out, ["calibration"])
    return out


def test_a_run_cut_in_a_pair_records_the_pair_and_the_rows_before_it(tmp_path, monkeypatch):
    """Ctrl-C in the third pair: the two rows before it are kept, in rows.json and the
    partial file, and the cut names that pair and the signal."""
    calls = []

    def pair(case, impl, scale=None):
        calls.append(impl.name)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return _fake_pair(case, impl, scale)

    monkeypatch.setattr(cases, "run_pair", pair)
    out = _interrupted_calibration(tmp_path)
    payload = json.loads((out / "rows.json").read_text())
    assert payload["complete"] is False
    case = cases.select_pairs("calibration", "smoke")[2][0].name
    assert payload["cut_at"] == {
        "pair": f"calibration/{case}/{calls[2]}",
        "reason": "interrupted (SIGINT)",
        "rows": 2,
    }
    assert len(payload["rows"]) == 2
    assert len((out / run.PARTIAL_NAME).read_text().splitlines()) == 2  # kept: not complete


def test_a_run_cut_between_pairs_names_no_pair(tmp_path, monkeypatch):
    """A cut while the rows of a finished suite are written is not put on its last pair."""
    monkeypatch.setattr(cases, "run_pair", _fake_pair)
    real = run.write_rows
    writes = []

    def write_rows(rows, out, meta):
        writes.append(len(rows))
        if len(writes) == 1:
            raise KeyboardInterrupt
        return real(rows, out, meta)

    monkeypatch.setattr(run, "write_rows", write_rows)
    out = _interrupted_calibration(tmp_path)
    cut = json.loads((out / "rows.json").read_text())["cut_at"]
    assert cut["pair"] is None and cut["rows"] == len(cases.pairs("calibration", "smoke"))
    assert "cut (interrupted (SIGINT)) at between pairs" in (out / "summary.md").read_text()


def test_run_rejects_an_unknown_suite_before_writing_anything(tmp_path):
    out = tmp_path / "none"
    with pytest.raises(ValueError, match="unknown suite 'sorting'; valid: calibration, csr"):
        run.run("smoke", out, ["csr", "sorting"])
    assert not out.exists()


def test_gpu_scale_without_a_gpu_names_only_the_suites_that_can_run(monkeypatch):
    """Calibration does not count as a CUDA-only suite; the message offers only the suites
    with CPU pairs at the gpu scale (the Allreduce byte counts)."""
    monkeypatch.setattr(run.cases, "_gpu_visible", lambda: False)
    run.check_device("gpu", ["calibration", "allreduce"])
    with pytest.raises(ValueError) as info:
        run.check_device("gpu", ["calibration", "csr", "spmm"])
    msg = str(info.value)
    assert "suite(s) csr, spmm time CUDA" in msg
    assert msg.endswith("or --suite allreduce at the gpu scale")


@pytest.mark.parametrize(
    ("load", "cores", "warned"),
    [(1.0, 2, False), (1.01, 2, True), (3.0, 64, False), (40.0, 64, True)],
    ids=["at-half", "over-half", "many-cores", "many-cores-busy"],
)
def test_a_cpu_is_busy_above_half_its_cores(load, cores, warned):
    """The warning starts above a load of half the cores given (not this machine's)."""
    text = run.load_warning("cpu", load_1m=load, cores=cores)
    assert bool(text) is warned
    if warned:
        assert f"{load:.2f} on {cores} cores" in text


@pytest.mark.parametrize(
    ("name", "arith", "row", "expected"),
    [
        ("NMPruneFraction", "fp32", {"gbps": 2400.0, "tflops": 9.0}, 0.5),
        ("GradPackFraction", "fp32", {"gbps": 1200.0, "tflops": 9.0}, 0.25),
        ("CSRConversionFraction", "fp32", {"gbps": 480.0, "tflops": 9.0}, 0.1),
        ("SpMMFraction", "fp32", {"gbps": 9.0, "tflops": 33.5}, 0.5),
        ("SpMMFraction", "tf32", {"gbps": 9.0, "tflops": 247.25}, 0.5),
        ("Conv2dFraction", "fp32", {"gbps": 9.0, "tflops": 6.7}, 0.1),
    ],
    ids=["nm", "pack", "csr", "spmm-fp32", "spmm-tf32", "conv"],
)
def test_asv_fraction_of_peak_is_the_rate_over_the_data_sheet_figure(
    monkeypatch, name, arith, row, expected
):
    """H200 SXM data sheet: 4.8 TB/s of HBM3e, 67 TFLOP/s FP32, 989 TFLOP/s TF32 with
    sparsity (494.5 dense): the bandwidth-bound suites over the first, the others over their
    math's peak."""
    from types import SimpleNamespace

    from bench import asv_kernels

    bench_obj = getattr(asv_kernels, name)()
    bench_obj.impl = SimpleNamespace(math=arith)
    monkeypatch.setattr(bench_obj, "_row", lambda: {**row, "gpu_name": "NVIDIA H200"})
    got = bench_obj.track_fraction_of_peak("case", "impl")
    assert got == pytest.approx(expected)


def test_asv_kernel_suites_track_the_rate_each_is_bound_by():
    """GB/s for the copy, the CSR conversion, N:M pruning and the pack; TFLOP/s for the
    GEMM, SpMM and the convolution; the fractions only over GPU implementations."""
    from bench import asv_kernels

    gbps = ("CalibrationCopy", "CSRConversion", "NMPrune", "GradPack")
    tflops = ("CalibrationGemm", "SpMM", "Conv2d")
    for name in gbps:
        cls = getattr(asv_kernels, name)
        assert hasattr(cls, "track_gbps") and not hasattr(cls, "track_tflops"), name
    for name in tflops:
        cls = getattr(asv_kernels, name)
        assert hasattr(cls, "track_tflops") and not hasattr(cls, "track_gbps"), name
    assert [n.split("-")[0] for n in asv_kernels.CalibrationCopy.params[0]] == ["copy"]
    assert [n.split("-")[0] for n in asv_kernels.CalibrationGemm.params[0]] == ["gemm"]
    for name in ("CSRConversion", "SpMM", "Conv2d", "NMPrune", "GradPack"):
        impls = getattr(asv_kernels, f"{name}Fraction").params[1]
        assert impls and all(i.endswith("@cuda") for i in impls), name


def test_asv_fraction_skips_a_cpu_implementation_and_a_pair_that_does_not_apply():
    from bench import asv_kernels

    case = asv_kernels.SpMM.params[0][0]
    with pytest.raises(NotImplementedError, match="only for GPUs"):
        asv_kernels.SpMMFraction().setup(case, "torch_mm@cpu")
    conv = asv_kernels.Conv2d()
    fwd = next(c for c in conv.params[0] if "-fwd-" in c)
    with pytest.raises(NotImplementedError, match="does not apply"):
        conv.setup(fwd, "pattern_conv2d[cuda,sparse_grads]@cuda")


def test_asv_iteration_warms_up_once_and_tracks_each_phase_under_its_name(monkeypatch):
    """setup runs one untimed iteration; each ``track_*_ms`` reads its own phase (in ms), the
    TFLOP/s the forward + backward rate, and a missing figure is NaN, not a zero."""
    import torch

    from bench import asv_iteration

    monkeypatch.setattr(asv_iteration, "_SCALE", "smoke")
    made = []
    prepared = cases.Prepared([("forward", made.append)], torch.device("cpu"))
    monkeypatch.setattr(cases, "prepare", lambda *a, **kw: prepared)
    case = cases.grid("iteration", "smoke")[0].name
    bench_obj = asv_iteration.Iteration()
    bench_obj.setup(case, "dense@cpu")
    try:
        assert made == [0]
        row = {"forward_ms": 1.5, "backward_ms": 2.5, "step_ms": 0.5, "tflops": 0.25}
        monkeypatch.setattr(bench_obj, "_row", lambda: dict(row))
        got = {
            k: getattr(bench_obj, f"track_{k}")(case, "dense@cpu")
            for k in ("forward_ms", "backward_ms", "step_ms", "forward_backward_tflops")
        }
        assert got == {
            "forward_ms": 1.5,
            "backward_ms": 2.5,
            "step_ms": 0.5,
            "forward_backward_tflops": 0.25,
        }
        monkeypatch.setattr(bench_obj, "_row", lambda: {"forward_ms": None})
        assert math.isnan(bench_obj.track_forward_ms(case, "dense@cpu"))
        assert math.isnan(bench_obj.track_step_ms(case, "dense@cpu"))
    finally:
        bench_obj.teardown(case, "dense@cpu")
    for k in ("forward", "backward", "step"):
        assert getattr(asv_iteration.Iteration, f"track_{k}_ms").unit == "ms"
    assert asv_iteration.Iteration.track_forward_backward_tflops.unit == "TFLOP/s"
