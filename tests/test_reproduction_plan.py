"""Planning and training the runs of many reproduction targets at once (reproductions.parallel)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import reproductions.common
from reproductions import parallel
from reproductions.common import Row, Target
from reproductions.parallel import PlannedRun, default_jobs, log_path, plan_runs, train_all

TINY = {"epochs": 1, "max_steps_per_epoch": 1, "batch_size": 16, "threads": 1}


def _target(key, rows):
    return Target(key=key, title=key, description=key, rows=lambda scale: list(rows))


def test_plan_lists_a_shared_run_once_with_every_target_that_uses_it(tmp_path):
    dense = Row("dense", "dense", train=TINY)
    a = _target("sdgp.table1", [dense, Row("sdgp", "sdgp", options={"m": 8}, train=TINY)])
    b = _target("cross.methods", [Row("baseline", "dense", train=TINY),
                                  Row("needs", needs="the paper scale"),
                                  Row("m", measure="x:y")])  # fmt: skip
    plan = plan_runs([a, b], "smoke", tmp_path)
    assert [p.config.method for p in plan] == ["dense", "sdgp"]
    assert plan[0].targets == ["sdgp.table1", "cross.methods"]
    assert plan[1].targets == ["sdgp.table1"]
    assert all(p.out.startswith(str(tmp_path)) for p in plan)


def test_plan_skips_a_target_whose_rows_fail_and_keeps_the_others(tmp_path):
    def boom(scale):
        raise RuntimeError("boom")

    bad = Target(key="sdgp.fig8", title="t", description="d", rows=boom)
    good = _target("sdgp.table1", [Row("dense", "dense", train=TINY)])
    assert [p.targets for p in plan_runs([bad, good], "smoke", tmp_path)] == [["sdgp.table1"]]


def test_cost_orders_slower_methods_and_longer_runs_first(tmp_path):
    (d,) = plan_runs([_target("a.b", [Row("d", "dense", train=TINY)])], "smoke", tmp_path)
    (c,) = plan_runs([_target("a.b", [Row("c", "clicktrain", train=TINY)])], "smoke", tmp_path)
    (d3,) = plan_runs([_target("a.b", [Row("d", "dense", train={**TINY, "epochs": 3})])],
                      "smoke", tmp_path)  # fmt: skip
    assert c.cost > d.cost and d3.cost == pytest.approx(3 * d.cost)


def test_default_jobs_one_per_core_on_cpu_scales_and_one_on_gpu_scales():
    assert default_jobs("gpu") == 1 and default_jobs("paper") == 1
    assert 1 <= default_jobs("cpu") <= 8 and default_jobs("smoke") == default_jobs("cpu")


def test_more_processes_than_cores_is_said_with_what_it_does_to_times():
    from reproductions.parallel import sharing_cores

    assert sharing_cores(2, 2) is None and sharing_cores(1, 8) is None
    assert sharing_cores(4, 2) == (
        "note: 4 processes on 2 cores: the runs share cores, so the times per iteration they "
        "record are slower than alone (--jobs times --threads at most the cores for times "
        "that compare)"
    )
    assert sharing_cores(2, 1).startswith("note: 2 processes on 1 core: ")
    assert sharing_cores(2, 8, threads=4) is None
    assert sharing_cores(2, 2, threads=4).startswith("note: 2 processes x 4 threads on 2 cores")


def test_training_in_this_process_leaves_its_thread_count_as_it_was(tmp_path):
    """With one job the runs train in this process, which then times the measurements:
    --threads 1 left it at one thread for them."""
    import torch

    def one_thread_worker(job):
        torch.set_num_threads(job[1])  # as _train_one does
        return str(job[0].out), None, 0.0

    plan = plan_runs([_target("a.b", [Row("d", "dense", train=TINY)])], "smoke", tmp_path)
    before = torch.get_num_threads()
    train_all(plan, 1, before + 1, log=lambda s: None, progress=False, worker=one_thread_worker)
    assert torch.get_num_threads() == before


def test_train_all_rejects_no_jobs():
    with pytest.raises(ValueError, match="jobs must be >= 1"):
        train_all([], 0)


@pytest.mark.slow
def test_train_all_trains_in_processes_reports_failures_and_then_reuses(tmp_path, monkeypatch):
    import reproductions.parallel

    monkeypatch.setattr(reproductions.parallel, "_cores", lambda: 1)  # 2 processes on 1 core
    rows = [Row("dense", "dense", train=TINY), Row("campfire", "campfire", train=TINY),
            Row("bad", "sdgp", options={"m": 3, "n": 5}, train=TINY)]  # fmt: skip
    plan = plan_runs([_target("cross.methods", rows)], "smoke", tmp_path)
    assert len(plan) == 3
    lines: list[str] = []
    failures = train_all(plan, jobs=2, log=lines.append, progress=False)
    bad = plan[2]
    assert list(failures) == [bad.out]
    assert "ValueError" in failures[bad.out] and "ValueError" in log_path(bad.config).read_text()
    for p in plan[:2]:
        summary = json.loads((tmp_path / p.out.split("/")[-1] / "summary.json").read_text())
        assert summary["status"] == "complete" and summary["method"] == p.config.method
        text = log_path(p.config).read_text()  # what a user reads when a run goes wrong
        assert f"-> {p.config.out}" in text and "epoch 1/" in text and "complete: top-1" in text
    assert "in 2 processes x 1 thread;" in lines[0]
    assert lines[1].startswith("note: 2 processes on 1 core: the runs share cores")
    lines.clear()
    # Complete runs are not trained again; the failed one is tried again (and said to go on
    # from its checkpoint where it left one).
    assert list(train_all(plan, jobs=2, log=lines.append, progress=False)) == [bad.out]
    assert lines[0].startswith("training 1 run (2 of 3 already complete) in 1 process x ")
    lines.clear()
    Path(bad.out).mkdir(parents=True)  # it failed before it wrote anything
    (Path(bad.out) / "checkpoint.pt").write_bytes(b"")
    assert list(train_all(plan, jobs=2, log=lines.append, progress=False)) == [bad.out]
    assert lines[0].startswith("training 1 run, 1 of them from a checkpoint (2 of 3 already")
    # the runs it trained are known as trained by this process (the targets, reading them
    # next, count them as trained, not reused); the failed one and others are not
    assert [parallel.trained_here(p.out) for p in plan] == [True, True, False]
    assert not parallel.trained_here(tmp_path / "elsewhere")


def test_planned_run_names_its_run_directory(tmp_path):
    (p,) = plan_runs([_target("a.b", [Row("d", "dense", train=TINY)])], "smoke", tmp_path)
    assert isinstance(p, PlannedRun) and p.out == str(p.config.out)
    assert log_path(p.config).name == p.config.out.split("/")[-1] + ".log"
    assert parallel.METHOD_COST["clicktrain"] > 1


def dying_worker(job):
    """A worker that dies without a word on the dense run, as one killed for memory would."""
    import os

    cfg, _ = job
    if cfg.method == "dense":
        os._exit(3)
    return str(cfg.out), None, 0.0


@pytest.mark.slow
def test_a_worker_that_dies_is_reported_not_waited_on(tmp_path):
    rows = [Row("dense", "dense", train=TINY), Row("campfire", "campfire", train=TINY)]
    plan = plan_runs([_target("cross.methods", rows)], "smoke", tmp_path)
    lines: list[str] = []
    failures = train_all(plan, jobs=2, log=lines.append, progress=False, worker=dying_worker)
    dense = next(p for p in plan if p.config.method == "dense")
    assert dense.out in failures and "worker process died" in failures[dense.out]
    assert all(out in {p.out for p in plan} for out in failures)  # nothing else is invented


@pytest.mark.parametrize("command", ["reproduce", "demo"], ids=["reproduce", "demo"])
def test_jobs_flag_takes_a_count_of_at_least_one_for_both_commands(command, capsys):
    from impl import cli
    from reproductions import build_parser

    parser = build_parser()
    assert parser.parse_args(["all", "--jobs", "2"]).jobs == 2
    assert parser.parse_args(["all"]).jobs is None
    for bad in ("0", "-1", "two"):
        with pytest.raises(SystemExit) as exc:
            cli.main([command, "--jobs", bad]) if command == "demo" else parser.parse_args(
                ["all", "--jobs", bad])  # fmt: skip
        assert exc.value.code == 2
        assert "--jobs" in capsys.readouterr().err


def test_jobs_help_names_the_gpu_default_only_where_gpu_scales_can_run(capsys):
    from impl import cli
    from reproductions import build_parser

    with pytest.raises(SystemExit):
        cli.main(["demo", "--help"])  # demo runs smoke and cpu only
    demo_help = " ".join(capsys.readouterr().out.split())
    assert "one per core, at most 8)" in demo_help and "1 at gpu" not in demo_help
    reproduce_help = " ".join(build_parser().format_help().split())
    assert "1 at gpu and paper" in reproduce_help


STARTED: list[str] = []


def recording_worker(job):
    """A worker that trains nothing and records which runs it was given."""
    cfg, _ = job
    STARTED.append(cfg.data)
    return str(cfg.out), None, 0.0


def test_runs_whose_dataset_is_missing_are_not_started_and_say_where_to_point(
    tmp_path, monkeypatch
):
    import numpy as np
    from test_data import _fake_cifar  # tests/ is on sys.path

    from impl.data import CIFAR_URL, DATA_DIR_ENV

    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    cifar = {**TINY, "data": "cifar10"}
    rows = [Row("digits", "dense", train=TINY), Row("c10", "dense", train=cifar),
            Row("c10 campfire", "campfire", train=cifar)]  # fmt: skip
    target = _target("a.b", rows)
    plan = plan_runs([target], "smoke", tmp_path / "runs")
    STARTED.clear()
    lines: list[str] = []
    failures = train_all(plan, 1, log=lines.append, progress=False, worker=recording_worker)
    assert STARTED == ["digits"]  # the cifar10 runs were never handed to a worker
    assert any(x.startswith("training 1 run (0 of 3 already complete, 2 without their dataset)")
               for x in lines) and lines[-1].startswith("trained 1 run in")  # fmt: skip
    assert sorted(failures) == sorted(p.out for p in plan[1:])
    assert all(e.startswith("DatasetMissingError: cifar10: no data directory")
               for e in failures.values())  # fmt: skip
    (line,) = [x for x in lines if x.startswith("not training")]
    assert line.startswith(
        f"not training 2 runs on cifar10: give it with --data-dir cifar10=DIR (or {DATA_DIR_ENV})"
        ". cifar10: no data directory"
    )
    assert CIFAR_URL in line  # and where to obtain it
    # Pointed at the dataset (its parent directory will do), the same runs start, and their
    # run directories are the same: where the data is read from is not part of the hash.
    _fake_cifar(tmp_path / "data", "cifar10", np.random.default_rng(0))
    monkeypatch.setenv(DATA_DIR_ENV, f"cifar10={tmp_path / 'data'}")
    again = plan_runs([target], "smoke", tmp_path / "runs")
    assert [p.out for p in again] == [p.out for p in plan]
    assert again[1].config.data_dir == str(tmp_path / "data")
    assert again[0].config.data_dir is None  # digits reads no directory
    STARTED.clear()
    assert train_all(again, 1, log=lines.append, progress=False, worker=recording_worker) == {}
    assert sorted(STARTED) == ["cifar10", "cifar10", "digits"]


def test_a_dataset_missing_for_another_reason_logs_its_own_remedy(tmp_path, monkeypatch):
    import impl.data
    from impl.data import DatasetMissingError

    def no_torchvision(name, data_dir):
        raise DatasetMissingError("imagenet: needs torchvision", dataset="imagenet",
                                  reason="torchvision is not installed",
                                  remedy="pip install torchvision")  # fmt: skip

    monkeypatch.setattr(impl.data, "check_dataset", no_torchvision)
    plan = plan_runs([_target("a.b", [Row("r", "dense", train=TINY)])], "smoke", tmp_path)
    lines: list[str] = []
    STARTED.clear()
    failures = train_all(plan, 1, log=lines.append, progress=False, worker=recording_worker)
    assert STARTED == [] and list(failures) == [plan[0].out]
    assert (
        "not training 1 run on digits: pip install torchvision. imagenet: needs torchvision"
        in lines
    )
    assert not any("--data-dir" in x for x in lines)  # not told to point at a directory


def sleeping_worker(job):
    """A worker that records its pid, then trains for a minute (a run of the cpu scale)."""
    import os
    import time
    from pathlib import Path

    cfg, _ = job
    Path(str(cfg.out) + ".started").write_text(str(os.getpid()))
    if cfg.method != "dense":
        time.sleep(60)
    return str(cfg.out), None, 0.0


def _three_runs(tmp_path):
    rows = [Row(m, m, train=TINY) for m in ("dense", "campfire", "sdgp")]
    return plan_runs([_target("cross.methods", rows)], "smoke", tmp_path)


@pytest.mark.slow
def test_ctrl_c_stops_the_workers_instead_of_training_the_queued_runs(tmp_path):
    # Ctrl-C reached the workers too: each dropped its run and took the next queued one, and
    # the pool's exit then waited for them all (minutes at the cpu scale, or forever)
    import multiprocessing
    import time

    plan = _three_runs(tmp_path)

    def interrupt(line):
        if "trained" in line:  # the quick run finished: the user presses Ctrl-C
            raise KeyboardInterrupt

    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        train_all(plan, jobs=2, log=interrupt, progress=False, worker=sleeping_worker)
    assert time.monotonic() - t0 < 30  # not the 60 s of a run, let alone two
    # every worker is gone (the pool's own thread may reap one a moment after our join)
    deadline = time.monotonic() + 10
    while multiprocessing.active_children() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not multiprocessing.active_children()


@pytest.mark.slow
def test_workers_exit_when_the_process_that_started_them_is_killed(tmp_path):
    # kill -9 of `pdtbench reproduce` left its workers training the queued runs, holding
    # their locks, so the next reproduce found them "being trained by another process"
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    script = f"""
import sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
from test_reproduction_plan import _three_runs, sleeping_worker
from pathlib import Path
from reproductions.parallel import train_all
train_all(_three_runs(Path({str(tmp_path)!r})), jobs=2, log=lambda s: None, progress=False,
          worker=sleeping_worker)
"""
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=Path(__file__).parents[1])
    try:
        deadline = time.monotonic() + 60
        started = []
        while len(started) < 2 and time.monotonic() < deadline:
            started = list(tmp_path.rglob("*.started"))
            time.sleep(0.2)
        assert len(started) >= 2, "the workers did not start"
        pids = [int(p.read_text()) for p in started]
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()

    def alive(pid):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True

    deadline = time.monotonic() + 15
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    survivors = [p for p in pids if alive(p)]
    for p in survivors:
        os.kill(p, signal.SIGKILL)
    assert not survivors


@pytest.mark.slow
def test_a_run_another_reproduction_is_training_is_waited_for_then_resumed(tmp_path, capsys):
    # two reproductions sharing a --runs-root: the second printed a traceback for a run the
    # first was training (RunBusyError), saved its result without that row, and exited 0
    import subprocess
    import sys
    import time

    from impl.config import resolve
    from impl.rundir import SUMMARY_FILE
    from reproductions.common import run_or_reuse

    cfg = resolve("smoke", epochs=1, max_steps_per_epoch=1, threads=1)
    cfg.out = str(tmp_path / "run")
    first, reused = run_or_reuse(cfg)
    assert not reused
    (tmp_path / "run" / SUMMARY_FILE).unlink()  # killed before its end: to be resumed
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from impl.rundir import locked; "
         f"cm = locked({cfg.out!r}); cm.__enter__(); print('held', flush=True); time.sleep(3)"],
        cwd=Path(__file__).parents[1], stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        t0 = time.monotonic()
        summary, reused = run_or_reuse(cfg)
        waited = time.monotonic() - t0
    finally:
        holder.wait()
    assert summary["top1"] == first["top1"] and not reused  # resumed once the lock was free
    assert waited > 1.0
    assert "being trained by another process" in capsys.readouterr().err


def test_the_resource_trackers_warning_is_filtered_and_a_users_filters_kept(monkeypatch):
    monkeypatch.delenv("PYTHONWARNINGS", raising=False)
    parallel.quiet_resource_tracker()
    assert parallel.os.environ["PYTHONWARNINGS"] == parallel.TRACKER_WARNINGS
    parallel.quiet_resource_tracker()  # once only
    assert parallel.os.environ["PYTHONWARNINGS"] == parallel.TRACKER_WARNINGS
    monkeypatch.setenv("PYTHONWARNINGS", "error::DeprecationWarning")
    parallel.quiet_resource_tracker()
    assert parallel.os.environ["PYTHONWARNINGS"].split(",") == [
        "error::DeprecationWarning", parallel.TRACKER_WARNINGS]  # fmt: skip


def _fake_cfg(root, name, method="dense", epochs=1, batch_size=128, data="digits"):
    """A config with only what planning and train_all read of one (no model is built)."""
    return SimpleNamespace(out=str(root / name), method=method, epochs=epochs,
                           batch_size=batch_size, data=data, data_dir=None, seed=0)  # fmt: skip


@pytest.mark.parametrize(
    ("method", "epochs", "batch_size", "cost"),
    [("dense", 2, 128, 2.0), ("clicktrain", 1, 128, 1.5), ("sdgp", 3, 128, 3.9),
     ("campfire", 4, 128, 4.0), ("dense", 1, 16, 8**0.1), ("dense", 1, 1024, 8**-0.1)],
    ids=["dense", "clicktrain", "sdgp", "other-method", "small-batch", "large-batch"],
)  # fmt: skip
def test_cost_is_epochs_times_method_cost_times_a_tenth_power_of_the_batch_ratio(
    tmp_path, method, epochs, batch_size, cost
):
    """A run's cost: epochs x the method's relative cost (1 for a method not listed) x
    (128 / batch size) ** 0.1 (smaller batches take longer per epoch)."""
    cfg = _fake_cfg(tmp_path, "r", method, epochs, batch_size)
    assert PlannedRun(cfg, ["a.b"]).cost == pytest.approx(cost)


TRAINED: list[tuple[str, int]] = []


def listing_worker(job):
    """A worker that trains nothing, records each run's name and threads, and fails the runs
    named ``bad*``."""
    cfg, threads = job
    name = Path(cfg.out).name
    TRAINED.append((name, threads))
    return str(cfg.out), ("ValueError: bad" if name.startswith("bad") else None), 0.0


def test_in_process_training_goes_longest_first_skips_complete_runs_and_reports_each(
    tmp_path, monkeypatch
):
    """One job: the runs train in this process, longest first; a complete run that stands for
    its method is not trained, one that no longer does is said and trained again; each run
    is logged, a failure is returned and does not stop the others, and only the runs that
    finished count as trained here."""
    monkeypatch.setattr(parallel, "_TRAINED_HERE", set())
    done = {"complete", "stale"}
    monkeypatch.setattr(reproductions.common, "complete_summary",
                        lambda d: {"method": "x"} if d.name in done else None)  # fmt: skip
    monkeypatch.setattr(reproductions.common, "reuse_refusal",
                        lambda s, m: "its code changed" if m == "sdgp" else None)  # fmt: skip
    configs = [
        _fake_cfg(tmp_path, "complete"),
        _fake_cfg(tmp_path, "stale", "sdgp", epochs=2),  # cost 2.6
        _fake_cfg(tmp_path, "short"),  # cost 1
        _fake_cfg(tmp_path, "bad", "clicktrain", epochs=2),  # cost 3
        _fake_cfg(tmp_path, "long", epochs=5),  # cost 5
        _fake_cfg(tmp_path, "resumed", batch_size=16),  # cost 8 ** 0.1 = 1.23
    ]
    for name in ("stale", "resumed"):  # both left a checkpoint; only "resumed" resumes it
        (tmp_path / name).mkdir()
        (tmp_path / name / "checkpoint.pt").write_bytes(b"")
    plan = [PlannedRun(c, ["a.b"]) for c in configs]
    TRAINED.clear()
    lines: list[str] = []
    failures = train_all(plan, 1, 1, log=lines.append, progress=False, worker=listing_worker)
    assert TRAINED == [("long", 1), ("bad", 1), ("stale", 1), ("resumed", 1), ("short", 1)]
    assert failures == {str(tmp_path / "bad"): "ValueError: bad"}
    assert lines == [
        "not reusing stale: its code changed; it is moved aside and trained again",
        "training 5 runs, 1 of them from a checkpoint (1 of 6 already complete) in 1 process "
        "x 1 thread; each run's log: <run directory>.log",
        "  trained long in 0 s",
        "  FAILED bad: ValueError: bad",
        "  trained stale in 0 s",
        "  trained resumed in 0 s",
        "  trained short in 0 s",
        lines[-1],
    ]
    assert lines[-1].startswith("trained 4 runs in ")
    here = [parallel.trained_here(tmp_path / "x" / ".." / c.out.split("/")[-1]) for c in configs]
    assert here == [False, True, True, False, True, True]


def test_one_run_trains_in_this_process_with_the_cores_shared_among_the_jobs(tmp_path, monkeypatch):
    """A single run to train is trained in this process even with more jobs, as one process;
    its threads default to the cores divided by the jobs."""
    monkeypatch.setattr(parallel, "_cores", lambda: 4)
    TRAINED.clear()
    lines: list[str] = []
    plan = [PlannedRun(_fake_cfg(tmp_path, "only"), ["a.b"])]
    assert train_all(plan, 2, log=lines.append, progress=False, worker=listing_worker) == {}
    assert TRAINED == [("only", 2)]
    assert lines[0] == (
        "training 1 run (0 of 1 already complete) in 1 process x 2 threads; each run's log: "
        "<run directory>.log"
    )


def test_a_run_of_an_unknown_dataset_is_started_to_report_its_own_error(tmp_path):
    """An unknown dataset name is no missing dataset: the run is handed to a worker, whose
    error says what is wrong."""
    TRAINED.clear()
    plan = [PlannedRun(_fake_cfg(tmp_path, "odd", data="no-such-data"), ["a.b"])]
    assert train_all(plan, 1, 1, log=lambda s: None, progress=False, worker=listing_worker) == {}
    assert TRAINED == [("odd", 1)]


@pytest.mark.parametrize(("cores", "jobs"), [(1, 1), (3, 3), (8, 8), (16, 8)])
def test_default_jobs_on_cpu_scales_is_the_cores_up_to_eight(monkeypatch, cores, jobs):
    """On the CPU scales, one process per core, at most 8."""
    monkeypatch.setattr(parallel, "_cores", lambda: cores)
    assert default_jobs("cpu") == jobs and default_jobs("smoke") == jobs


def test_plan_lists_a_target_once_for_a_config_it_uses_twice_and_skips_a_row_that_fails(
    tmp_path,
):
    """Two rows of one target with one config give one run naming the target once; a row
    whose configs cannot be built is left out, the target's other rows kept."""

    def fails(scale, runs_root):
        raise ValueError("bad option")

    broken = SimpleNamespace(needs=None, measure=None, configs=fails)
    target = _target("a.b", [Row("d", "dense", train=TINY), broken,
                             Row("d again", "dense", train=TINY)])  # fmt: skip
    (p,) = plan_runs([target], "smoke", tmp_path)
    assert p.targets == ["a.b"] and p.config.method == "dense"


def test_a_worker_logs_the_run_and_returns_its_error_with_the_log(tmp_path, monkeypatch):
    """A worker writes a header and the outcome of a run to ``<run dir>.log``; a run that
    raises gives ``"<type>: <message> (log: <path>)"`` and its traceback in the log."""
    cfg = _fake_cfg(tmp_path, "run")
    before = torch.get_num_threads()

    def ok(c, progress):
        return {"top1": 12.345}, False

    def broken(c, progress):
        raise ValueError("m must be below n")

    try:
        monkeypatch.setattr(reproductions.common, "run_or_reuse", ok)
        out, err, _ = parallel._train_one((cfg, 1))
        assert (out, err) == (cfg.out, None)
        monkeypatch.setattr(reproductions.common, "run_or_reuse", broken)
        out, err, _ = parallel._train_one((cfg, 1))
    finally:
        torch.set_num_threads(before)
    log = log_path(cfg)
    assert (out, err) == (cfg.out, f"ValueError: m must be below n (log: {log})")
    text = log.read_text()
    assert f"dense seed 0 -> {cfg.out}" in text and "complete: top-1 12.35% in " in text
    assert "Traceback" in text and "ValueError: m must be below n" in text


def test_a_worker_trains_its_run_with_the_threads_of_its_job(tmp_path, monkeypatch):
    """Each worker process sets the torch threads its job names (--threads, or the cores
    divided among the jobs) before it trains, and says which reuse it found in its log."""
    cfg = _fake_cfg(tmp_path, "run")
    before = torch.get_num_threads()
    seen: list[int] = []

    def reused(c, progress):
        seen.append(torch.get_num_threads())
        return {"top1": 50.0}, True

    monkeypatch.setattr(reproductions.common, "run_or_reuse", reused)
    try:
        out, err, _ = parallel._train_one((cfg, 3))
    finally:
        torch.set_num_threads(before)
    assert (out, err, seen) == (cfg.out, None, [3])
    assert "reused a complete run: top-1 50.00% in " in log_path(cfg).read_text()
