"""Train the runs of many reproduction targets at once, in worker processes.

Tables of different papers share runs (the dense baseline, a method's default row); a run is
one directory named by its config's hash, so :func:`plan_runs` collects the distinct configs
of every target first, and :func:`train_all` trains the ones not yet complete in ``jobs``
processes, longest first, each with ``threads`` torch threads. Afterwards the targets run
as before and find every run complete (measurements, which time things, then run alone).

On a small CPU a ResNet-20 iteration does not use two cores well, so two single-threaded
processes finish about twice the work of one two-threaded process in the same time.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
import traceback
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Relative cost of one epoch per method on a CPU (measured, ResNet-20 on digits, 1 thread);
# only the order of the work depends on it.
METHOD_COST: dict[str, float] = {"clicktrain": 1.5, "sdgp": 1.3}


@dataclass
class PlannedRun:
    """One distinct training run of the plan: its config and the targets that use it."""

    config: Any
    targets: list[str]

    @property
    def out(self) -> str:
        """The run directory."""
        return str(self.config.out)

    @property
    def cost(self) -> float:
        """A relative estimate of the run's training time (epochs x method cost)."""
        c = self.config
        return float(c.epochs) * METHOD_COST.get(c.method, 1.0) * (128.0 / c.batch_size) ** 0.1


#: The run directories :func:`train_all` trained in this process (not found finished).
_TRAINED_HERE: set[Path] = set()


def trained_here(run_dir: str | Path) -> bool:
    """Whether :func:`train_all` trained ``run_dir`` in this process: the targets then read
    it as a finished run, but it was trained by this command, not reused from before."""
    return Path(run_dir).resolve() in _TRAINED_HERE


def plan_runs(targets: Iterable[Any], scale: str, runs_root: str | Path) -> list[PlannedRun]:
    """The distinct training configs of every row of ``targets`` at ``scale``.

    Rows marked ``needs`` and measurement rows are left out; a config shared by several
    targets appears once, listing them. The order is that of the targets and rows. A target
    or row whose configs cannot be built is left out here: running it reports the error.
    """
    plan: dict[str, PlannedRun] = {}
    for target in targets:
        try:
            rows = target.rows(scale)
        except Exception:  # noqa: BLE001 - the target fails again, and is reported, when run
            continue
        for row in rows:
            if row.needs or row.measure is not None:
                continue
            try:
                configs = row.configs(scale, runs_root)
            except Exception:  # noqa: BLE001 - likewise: its row reports the error
                continue
            for cfg in configs:
                key = str(cfg.out)
                if key in plan:
                    if target.key not in plan[key].targets:
                        plan[key].targets.append(target.key)
                else:
                    plan[key] = PlannedRun(cfg, [target.key])
    return list(plan.values())


def _reuse_state(run_dir: str, method: str) -> tuple[bool, str | None]:
    """Whether ``run_dir`` holds a finished run that stands for ``method`` as it is now, and
    else why a finished run there does not (:func:`reproductions.common.reuse_refusal`;
    None where it holds no finished run): one reading of its summary for both."""
    from reproductions.common import complete_summary, reuse_refusal

    summary = complete_summary(Path(run_dir))
    if summary is None:
        return False, None
    why = reuse_refusal(summary, method)
    return why is None, why


def log_path(cfg: Any) -> Path:
    """Where a worker writes what training one run printed: ``<run dir>.log`` beside it."""
    out = Path(cfg.out)
    return out.with_name(out.name + ".log")


def _train_one(job: tuple[Any, int]) -> tuple[str, str | None, float]:
    """Worker: train (or resume) one config with its output in :func:`log_path`; returns
    (run directory, error or None, seconds)."""
    import contextlib

    import torch

    cfg, threads = job
    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    log = log_path(cfg)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as f, contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
        print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {cfg.method} seed {cfg.seed} -> {cfg.out}")
        try:
            from reproductions.common import run_or_reuse

            # progress=True: a line per epoch in the log (no bar: the log is not a terminal)
            summary, reused = run_or_reuse(cfg, progress=True)
            done = "reused a complete run" if reused else "complete"
            top1 = summary.get("top1")
            said = f"{top1:.2f}%" if isinstance(top1, (int, float)) else str(top1)
            print(f"{done}: top-1 {said} in {time.perf_counter() - t0:.1f} s")
            return str(cfg.out), None, time.perf_counter() - t0
        except Exception as err:  # noqa: BLE001 - reported to the parent, which goes on
            traceback.print_exc(file=f)
            return (
                str(cfg.out),
                f"{type(err).__name__}: {err} (log: {log})",
                (time.perf_counter() - t0),
            )


def add_jobs_argument(parser: Any, *, gpu_scales: bool = True) -> None:
    """Add ``--jobs N`` (training runs at a time, one process each; N >= 1, else a usage
    error) and ``--threads N`` (torch threads per process) to an ``argparse`` parser:
    ``pdtbench reproduce`` and ``pdtbench demo`` share them.
    ``gpu_scales=False`` (demo, which runs only smoke and cpu) leaves the gpu and paper
    default out of the help."""

    import argparse

    def positive(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value < 1:
            raise argparse.ArgumentTypeError(f"needs a whole number >= 1, got {text!r}")
        return value

    parser.add_argument(
        "--jobs",
        type=positive,
        default=None,
        help="training runs at a time, each in its own process (default: one per core, at "
        "most 8" + (", at the smoke and cpu scales; 1 at gpu and paper)" if gpu_scales else ")"),
    )
    parser.add_argument(
        "--threads",
        type=positive,
        default=None,
        help="torch threads of each training process (default: the cores divided by --jobs, "
        "at least 1)",
    )


def _cores() -> int:
    """CPU cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def sharing_cores(workers: int, cores: int, threads: int = 1) -> str | None:
    """The note :func:`train_all` logs when its ``workers`` processes of ``threads`` torch
    threads each outnumber the ``cores`` (``--jobs`` or ``--threads`` over them): the runs
    then share cores, and the times per iteration they record (the reports' measured times)
    are slower than the same runs alone. None otherwise."""
    if workers * threads <= cores:
        return None
    each = f" x {threads} threads" if threads > 1 else ""
    return (
        f"note: {workers} processes{each} on {cores} core{'s' if cores != 1 else ''}: the runs "
        "share cores, so the times per iteration they record are slower than alone (--jobs "
        "times --threads at most the cores for times that compare)"
    )


def default_jobs(scale: str) -> int:
    """Worker processes for ``scale``: one per core (at most 8) on the CPU scales, 1 where
    runs share one accelerator (gpu, paper)."""
    if scale in ("gpu", "paper"):
        return 1
    return max(1, min(8, _cores()))


def train_all(
    plan: list[PlannedRun],
    jobs: int,
    threads: int | None = None,
    *,
    log: Callable[[str], None] = print,
    progress: bool = True,
    worker: Callable[[tuple[Any, int]], tuple[str, str | None, float]] | None = None,
) -> dict[str, str]:
    """Train every run of ``plan`` that is not complete, ``jobs`` at a time.

    A run whose dataset cannot be found (:func:`impl.data.check_dataset`) is not started: one
    line per dataset says how many runs wait for it and where it was looked for, and each
    such run is among the failures. Each worker process sets ``threads`` torch threads
    (default: the cores divided by ``jobs``, at least 1). Runs are started longest first. A
    run that fails does not stop the others; returns ``{run directory: error}`` of the
    failures (empty when all finished). Killed midway, a later call resumes the incomplete
    runs (each run directory is crash-safe on its own). ``worker`` replaces the function
    that trains one ``(config, threads)`` job in a process (a module-level function; for
    tests).
    """
    worker = worker or _train_one
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    state = {p.out: _reuse_state(p.out, p.config.method) for p in plan}
    todo = sorted((p for p in plan if not state[p.out][0]), key=lambda p: -p.cost)
    todo, failures = _with_data(todo, log)
    if not todo:
        return failures
    threads = threads or max(1, _cores() // jobs)
    no_dataset = len(failures)
    complete = len(plan) - len(todo) - no_dataset
    no_data = f", {no_dataset} without their dataset" if no_dataset else ""
    from impl.rundir import CHECKPOINT_FILE  # here: `reproduce --help` imports no torch

    # A finished run that cannot stand for its method now (its code changed) is moved aside
    # by its worker, whose words go to the run's log: said here, and not counted as resumed.
    refused = {p.out: state[p.out][1] for p in todo if state[p.out][1]}
    for out, why in refused.items():
        log(f"not reusing {Path(out).name}: {why}; it is moved aside and trained again")
    partly = sum(
        1 for p in todo if p.out not in refused and (Path(p.out) / CHECKPOINT_FILE).exists()
    )
    resumed = f", {partly} of them from a checkpoint" if partly else ""
    workers = min(jobs, len(todo))
    log(
        f"training {len(todo)} run{'s' if len(todo) != 1 else ''}{resumed} ({complete} of "
        f"{len(plan)} already complete{no_data}) in {workers} "
        f"process{'es' if workers != 1 else ''} x {threads} thread{'s' if threads != 1 else ''}"
        "; each run's log: <run directory>.log"
    )
    crowded = sharing_cores(workers, _cores(), threads)
    if crowded:
        log(crowded)
    bar = _bar(len(todo), progress)
    t0 = time.perf_counter()

    say = bar.write if bar is not None and log is print else log  # lines above the bar

    def done(out: str, err: str | None, seconds: float) -> None:
        name = Path(out).name
        if err is None:
            _TRAINED_HERE.add(Path(out).resolve())
            say(f"  trained {name} in {seconds:.0f} s")
        else:
            failures[out] = err
            say(f"  FAILED {name}: {err}")
        if bar is not None:
            bar.update(1)

    work = [(p.config, threads) for p in todo]
    if jobs == 1 or len(todo) == 1:
        import torch

        before = torch.get_num_threads()  # the training sets its own; measurements follow
        try:
            for job in work:
                done(*worker(job))
        finally:
            torch.set_num_threads(before)
    else:
        # A pool that fails loudly: a worker killed from outside (out of memory, a signal)
        # breaks the executor, and every run not finished is reported, never waited on.
        # Ctrl-C reaches the whole process group: the workers ignore it (a worker would drop
        # its run and take the next queued one) and this process stops them.
        ctx = mp.get_context("spawn")
        quiet_resource_tracker()
        pool = ProcessPoolExecutor(
            max_workers=min(jobs, len(todo)),
            mp_context=ctx,
            initializer=_worker_init,
            initargs=(os.getpid(),),
        )
        try:
            futures = {pool.submit(worker, job): str(job[0].out) for job in work}
            for fut in as_completed(futures):
                try:
                    done(*fut.result())
                except BrokenProcessPool as err:
                    done(futures[fut], f"the worker process died: {err}", 0.0)
        except BaseException:  # Ctrl-C, or this process failing: no run goes on without it
            stop_workers(pool)
            if bar is not None:
                bar.close()
            raise
        pool.shutdown(wait=True)
    if bar is not None:
        bar.close()
    failed = len(failures) - no_dataset
    done = len(todo) - failed
    log(f"trained {done} run{'s' if done != 1 else ''} in {time.perf_counter() - t0:.0f} s")
    return failures


#: The warning filter :func:`quiet_resource_tracker` adds to ``PYTHONWARNINGS``.
TRACKER_WARNINGS = "ignore::UserWarning:multiprocessing.resource_tracker"


def quiet_resource_tracker() -> None:
    """Keep multiprocessing's resource tracker from warning of "leaked semaphore objects"
    when Ctrl-C stops the workers: the workers it terminates cannot unregister the
    semaphores they made, which the tracker then removes itself (nothing is leaked), with a
    warning a user cannot act on. The tracker is a process that reads ``PYTHONWARNINGS`` when
    it starts (with the pool's first semaphore); the filter is added to the variable's
    entries, the user's own kept."""
    given = os.environ.get("PYTHONWARNINGS", "")
    if TRACKER_WARNINGS not in given.split(","):
        os.environ["PYTHONWARNINGS"] = ",".join(filter(None, [given, TRACKER_WARNINGS]))


def _worker_init(parent_pid: int) -> None:
    """In each worker process: leave Ctrl-C to the parent (:func:`train_all` stops the
    workers), and exit when the parent is gone (killed, say), so that no orphan goes on
    training queued runs and holding their locks."""
    import signal
    import threading

    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(1.0)
        os._exit(1)  # the run directory keeps its last checkpoint; its lock goes with us

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def stop_workers(pool: ProcessPoolExecutor, timeout_s: float = 10.0) -> None:
    """Terminate the worker processes of ``pool`` and drop its queued jobs, without waiting
    for a run to finish (each run directory keeps its last checkpoint: the next call resumes
    it)."""
    procs = list((getattr(pool, "_processes", None) or {}).values())
    for proc in procs:
        proc.terminate()
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in procs:
        proc.join(timeout_s)


def _with_data(
    todo: list[PlannedRun], log: Callable[[str], None]
) -> tuple[list[PlannedRun], dict[str, str]]:
    """``todo`` without the runs whose dataset is not found, and ``{run directory: error}``
    of those; logs one line per dataset and directory that is missing."""
    from impl.data import DatasetMissingError, check_dataset

    reasons: dict[tuple[str, str | None], DatasetMissingError | None] = {}
    keep: list[PlannedRun] = []
    failures: dict[str, str] = {}
    waiting: dict[tuple[str, str | None], int] = {}
    for p in todo:
        key = (p.config.data, p.config.data_dir)
        if key not in reasons:
            try:
                check_dataset(*key)
                reasons[key] = None
            except DatasetMissingError as err:
                reasons[key] = err
            except ValueError:  # an unknown dataset: the run reports its own error
                reasons[key] = None
        if reasons[key] is None:
            keep.append(p)
        else:
            failures[p.out] = f"DatasetMissingError: {reasons[key]}"
            waiting[key] = waiting.get(key, 0) + 1
    for key, count in waiting.items():
        err = reasons[key]
        # what to do here first, then the whole message (what is expected, where to get it)
        log(f"not training {count} run{'s' if count != 1 else ''} on {key[0]}: {err.remedy}. {err}")
    return keep, failures


def _bar(total: int, enabled: bool) -> Any:
    if not enabled:
        return None
    from tqdm.auto import tqdm

    # disable=None: no bar where stderr is not a terminal (a log file is not filled with
    # redrawn frames; each run's "trained ..." line still says where it is)
    return tqdm(total=total, desc="runs", unit="run", dynamic_ncols=True, disable=None)


__all__ = [
    "METHOD_COST",
    "PlannedRun",
    "add_jobs_argument",
    "default_jobs",
    "log_path",
    "plan_runs",
    "stop_workers",
    "train_all",
]
