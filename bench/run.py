"""Run the benchmark cases without asv or pytest and write tidy rows as CSV and JSON.

    python -m bench.run --scale smoke|cpu|gpu --out reports/bench/<name> [--suite S ...]
                        [--match TEXT] [--case NAME ...]

writes ``<out>/rows.csv`` (one row per case and implementation, every column of
:func:`bench.cases.run_pair` and :func:`bench.cases.add_derived`), ``<out>/rows.json``
(``{"provenance": {...}, "scale": ..., "suites": [...], "complete": ..., "cut_at": ...,
"rows": [...]}``) and ``<out>/summary.md`` (a short table per suite). Reproductions and
reports read these files; they never re-run the benchmarks. Exit status 1 when a row ended
in ``"error"``; status 2 (nothing run) when ``--match``/``--case`` selects no case of the
chosen suites, or CUDA-only suites are asked for at the gpu scale without a GPU.

A run cut short keeps what it measured: each row is appended to ``<out>/rows.partial.jsonl``
as soon as it is measured, the CSV, JSON and summary are rewritten after every suite, and a
SIGTERM (what ``timeout`` sends) or Ctrl-C writes them once more before the process ends,
with ``"complete": false`` and ``"cut_at"`` (the pair that was running and why). A complete
run removes ``rows.partial.jsonl``; a new run into an ``--out`` that holds a cut one first
moves the cut run's files into ``<out>/cut-<time>/`` (:func:`keep_cut_run`). The files are
written atomically, and one ``--out`` takes one run at a time (a second is refused).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import math
import os
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from bench import cases
from impl import rundir
from impl.out_dir import check_out_dir

#: Rows appended one JSON line each as they are measured (removed when a run completes).
PARTIAL_NAME = "rows.partial.jsonl"

#: Columns written first, in this order; the others follow in order of appearance.
LEADING = (
    "suite",
    "case",
    "impl",
    "device",
    "status",
    "reason",
    "median_ms",
    "forward_ms",
    "backward_ms",
    "step_ms",
    "iteration_ms",
    "host_bound",
    "host_ms",
    "amortized_ms",
    "issue_ms",
    "tflops",
    "gbps",
    "frac_peak_spec",
    "frac_peak_measured",
    "frac_bw_spec",
    "frac_bw_measured",
)


def _json_value(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def columns(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Column order of the CSV: :data:`LEADING` that occur, then the rest by first appearance."""
    seen: dict[str, None] = {}
    for row in rows:
        for key in row:
            seen.setdefault(key, None)
    lead = [c for c in LEADING if c in seen]
    return lead + [c for c in seen if c not in lead]


def write_rows(rows: Sequence[dict[str, Any]], out: Path, meta: dict[str, Any]) -> None:
    """Write ``rows.csv``, ``rows.json`` and ``summary.md`` into ``out`` (created if needed),
    each atomically (a kill mid-write leaves the previous file whole)."""
    out.mkdir(parents=True, exist_ok=True)
    cols = columns(rows)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=cols, extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in cols})
    rundir.atomic_write_bytes(out / "rows.csv", buf.getvalue().encode())
    payload = dict(meta)
    payload["rows"] = [{k: _json_value(v) for k, v in row.items()} for row in rows]
    text = json.dumps(payload, indent=1, sort_keys=False) + "\n"
    rundir.atomic_write_bytes(out / "rows.json", text.encode())
    rundir.atomic_write_bytes(out / "summary.md", summary(rows, meta).encode())


def keep_cut_run(out: Path) -> Path | None:
    """Move the files of a run of ``out`` that was cut (its ``rows.partial.jsonl``, and the
    ``rows.*`` / ``summary.md`` written beside it) into ``out/cut-<time>/``, so that a new
    run into ``out`` does not write over rows measured before the cut; returns that folder,
    or None when ``out`` holds no cut run."""
    partial = out / PARTIAL_NAME
    if not partial.exists():
        return None
    aside = out / time.strftime("cut-%Y%m%d-%H%M%S")
    aside.mkdir(parents=True, exist_ok=True)
    for name in (PARTIAL_NAME, "rows.csv", "rows.json", "summary.md"):
        if (out / name).exists():
            os.replace(out / name, aside / name)
    return aside


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, float):
        if not math.isfinite(value):
            return "-"
        return f"{value:.{digits}g}"
    return str(value)


def _gpu_seen(prov: dict[str, Any]) -> bool:
    # torch's answer where the provenance has it (NVML may be missing); else the GPU name.
    if prov.get("gpu_available") is not None:
        return bool(prov["gpu_available"])
    return bool(prov.get("gpu_name"))


def _incomplete_note(meta: dict[str, Any]) -> str:
    if meta.get("complete", True):
        return ""
    cut = meta.get("cut_at") or {}
    where = cut.get("pair") or "between pairs"
    return (
        f"**Incomplete**: the run was cut ({cut.get('reason', 'unknown')}) at {where}; "
        "the rows below are those measured before. "
    )


def summary(rows: Sequence[dict[str, Any]], meta: dict[str, Any]) -> str:
    """A Markdown summary: provenance, then per suite the measured rows and the skipped ones."""
    prov = meta.get("provenance", {})
    lines = [
        f"# Benchmark rows: scale `{meta.get('scale')}`",
        "",
        f"commit `{prov.get('commit')}` (dirty: {prov.get('dirty')}), {prov.get('date')}; "
        f"GPU: {prov.get('gpu_name') or 'none'}; CPU: {prov.get('cpu_model')} "
        f"({prov.get('torch_threads')} torch threads); torch {prov.get('torch')}, "
        f"CUDA {prov.get('cuda')}, CuPy {prov.get('cupy')}, NumPy {prov.get('numpy')}.",
        "",
        _incomplete_note(meta)
        + (
            "**CPU only**: no GPU was visible, every GPU row is skipped with its reason. "
            if not _gpu_seen(prov)
            else ""
        )
        + f"1-minute load average when collected: {prov.get('load_avg_1m')} "
        "(other work on the machine slows CPU timings).",
        "",
        "Times are medians in ms; speedups are the baseline's time over this row's "
        "(same case, same device). On a GPU, `host_bound` rows (event time under 20 us, the "
        "host's time to issue a call at least the device's back-to-back time per call, or "
        "back-to-back calls over 1.5x faster: bench.measure.host_bound) may time the host's "
        "launch overhead, not the kernel; `amortized_ms` is the per-call time of "
        "back-to-back calls. Generated by `python -m bench.run`; see docs/benchmarks.md.",
        "",
    ]
    for suite in meta.get("suites", []):
        srows = [r for r in rows if r["suite"] == suite]
        ok = [r for r in srows if r["status"] == "ok"]
        lines += [f"## {suite}", ""]
        if ok:
            speed_cols = sorted(
                {k for r in ok for k in r if k.startswith(("speedup_vs_", "iteration_speedup_vs_"))}
            )
            value_cols = [
                k
                for k in ("payload_bytes", "payload_fraction", "peak_memory_mib")
                if any(r.get(k) is not None for r in ok)
            ]
            time_cols = [
                k
                for k in ("median_ms", "forward_ms", "backward_ms", "step_ms", "iteration_ms")
                if k in ok[0]
            ]
            rate_cols = [k for k in ("tflops", "gbps") if any(r.get(k) for r in ok)]
            host_cols = [
                k
                for k in ("amortized_ms", "issue_ms", "host_bound")
                if any(r.get(k) is not None for r in ok)
            ]
            head = ["case", "impl", *time_cols, *host_cols, *value_cols, *rate_cols, *speed_cols]
            lines.append("| " + " | ".join(head) + " |")
            lines.append("|" + "---|" * len(head))
            for r in ok:
                lines.append("| " + " | ".join(_fmt(r.get(k)) for k in head) + " |")
            lines.append("")
        other = [r for r in srows if r["status"] != "ok"]
        if other:
            reasons: dict[tuple[str, str], int] = {}
            for r in other:
                key = (r["status"], r["reason"])
                reasons[key] = reasons.get(key, 0) + 1
            lines.append(f"Not measured ({len(other)} rows):")
            lines.append("")
            for (status, reason), n in sorted(reasons.items()):
                lines.append(f"- {n} x {status}: {reason}")
            lines.append("")
    return "\n".join(lines) + "\n"


class Cut(SystemExit):
    """Raised by the SIGTERM handler of :func:`terminate_gracefully` (exit status 143)."""


def _on_sigterm(signum: int, frame: Any) -> None:
    # GNU timeout signals the child and then its whole process group: the second SIGTERM
    # must not raise again while the first one's cleanup writes the results.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Cut(128 + signum)


@contextlib.contextmanager
def _sigterm_handler(handler: Any) -> Iterator[None]:
    """Within the block, SIGTERM goes to ``handler`` (the main thread only: elsewhere the
    block runs unchanged); the previous handler is restored after it."""
    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def terminate_gracefully() -> contextlib.AbstractContextManager[None]:
    """Within the block, SIGTERM raises :class:`Cut` (a SystemExit, status 143), so that
    ``finally`` blocks run and write what was measured; the previous handler is restored.

    ``timeout`` sends SIGTERM when a step's time is up; Python's default is to die at once.
    Only the main thread may install a handler: elsewhere the block runs unchanged.
    """
    return _sigterm_handler(_on_sigterm)


def ignoring_sigterm() -> contextlib.AbstractContextManager[None]:
    """SIGTERM is ignored within the block (the main thread only), then handled as before."""
    return _sigterm_handler(signal.SIG_IGN)


def cut_reason(exc: BaseException | None) -> str:
    """Why a run stopped early, in words, from the exception that stopped it."""
    if isinstance(exc, Cut):
        return "SIGTERM (the step's time limit)"
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted (SIGINT)"
    if isinstance(exc, SystemExit):
        return f"SystemExit({exc.code})"
    if exc is None:
        return "unknown"
    return f"{type(exc).__name__}: {str(exc)[:300]}"


class PartialRows:
    """Appends each measured row to ``<out>/rows.partial.jsonl`` at once (flushed), so that a
    process killed outright (SIGKILL) still leaves its rows. Truncated when opened
    (:func:`run` first moves a cut run's file aside: :func:`keep_cut_run`)."""

    def __init__(self, out: Path, name: str = PARTIAL_NAME) -> None:
        out.mkdir(parents=True, exist_ok=True)
        self.path = out / name
        self._fh = open(self.path, "w")

    def append(self, row: dict[str, Any]) -> None:
        """Write ``row`` as one JSON line and flush it to the operating system."""
        line = json.dumps({k: _json_value(v) for k, v in row.items()}, default=str)
        self._fh.write(line + "\n")
        self._fh.flush()

    def close(self, remove: bool = False) -> None:
        """Close the file; ``remove`` deletes it (a complete run has everything in rows.json)."""
        self._fh.close()
        if remove:
            self.path.unlink(missing_ok=True)


def quiet_print(text: str) -> None:
    """Print ``text`` (flushed), ignoring a closed stdout: a ``| tee`` reading it may have been
    killed by the same time limit."""
    try:
        print(text, flush=True)
    except (BrokenPipeError, OSError):  # a reader killed with us (| tee under timeout)
        pass


def run(
    scale: str,
    out: Path,
    suites: Sequence[str] = cases.SUITES,
    match: str | None = None,
    case_names: Sequence[str] | None = None,
) -> list[dict[str, Any]]:
    """Run ``suites`` at ``scale`` and write the rows into ``out``; returns the rows.

    Rows are written as they come (see the module docstring); if the run is stopped (SIGTERM
    under :func:`terminate_gracefully`, Ctrl-C, an error) the files are written with
    ``complete = False`` and ``cut_at`` before the exception goes on.
    """
    scale = cases.resolve_scale(scale)
    for s in suites:
        if s not in cases.SUITES:
            raise ValueError(f"unknown suite {s!r}; valid: {', '.join(cases.SUITES)}")
    start = time.perf_counter()
    meta: dict[str, Any] = {
        "scale": scale,
        "suites": list(suites),
        "match": match,
        "cases": list(case_names) if case_names else None,
        "complete": False,
        "cut_at": None,
        "wall_seconds": None,
        "provenance": cases.provenance(scale),
    }
    out.mkdir(parents=True, exist_ok=True)
    with rundir.locked(out, "wait for it to end, or use another --out", doing="written"):
        kept = keep_cut_run(out)
        if kept is not None:
            quiet_print(f"{out} held a cut run: its rows are kept in {kept}")
        return _run(scale, out, suites, match, case_names, meta, start)


def _run(
    scale: str,
    out: Path,
    suites: Sequence[str],
    match: str | None,
    case_names: Sequence[str] | None,
    meta: dict[str, Any],
    start: float,
) -> list[dict[str, Any]]:
    partial = PartialRows(out)
    rows: list[dict[str, Any]] = []
    running: dict[str, str | None] = {"pair": None}

    def write_now() -> None:
        meta["wall_seconds"] = round(time.perf_counter() - start, 1)
        write_rows(cases.add_derived([dict(r) for r in rows]), out, meta)

    completed = False
    try:
        for suite in suites:
            for case, impl in cases.select_pairs(suite, scale, match=match, case_names=case_names):
                running["pair"] = f"{suite}/{case.name}/{impl.name}"
                row = cases.run_pair(case, impl, scale)
                running["pair"] = None
                rows.append(row)
                partial.append(row)
                ms = row.get("median_ms")
                what = f"{ms:.4g} ms" if isinstance(ms, float) else row["status"]
                quiet_print(f"{row['suite']:<12} {row['case']:<36} {row['impl']:<28} {what}")
            write_now()
        completed = True
    except BaseException as exc:
        meta["cut_at"] = {"pair": running["pair"], "reason": cut_reason(exc), "rows": len(rows)}
        raise
    finally:
        meta["complete"] = completed
        with ignoring_sigterm():  # a second SIGTERM must not cut the last write
            write_now()
            partial.close(remove=completed)
        if not completed:
            cut = meta.get("cut_at") or {}
            quiet_print(
                f"cut ({cut.get('reason', 'stopped')}) at {cut.get('pair')}: wrote "
                f"{len(rows)} measured rows to {out} (complete: false)"
            )
    return cases.add_derived(rows)


def check_device(scale: str, suites: Sequence[str]) -> None:
    """Refuse to run CUDA-only suites at the ``gpu`` scale where torch sees no GPU.

    Every pair of such a suite would be written as ``"skipped"``, and the rows file would
    look like a gpu-scale result (and could replace one). Suites with CPU pairs at that scale
    (the Allreduce byte counts, which are deterministic) still run; ``calibration`` is added
    by :func:`main` and does not count. Raises ``ValueError`` naming what can run instead.
    """
    if scale != "gpu" or cases._gpu_visible():
        return
    # per suite, once: whether any of its pairs at this scale runs without a GPU
    named = [s for s in dict.fromkeys((*suites, *cases.SUITES)) if s != "calibration"]
    cpu_pairs = {
        s: any(impl.device != "cuda" for _, impl in cases.select_pairs(s, scale)) for s in named
    }
    cuda_only = [s for s in suites if s != "calibration" and not cpu_pairs[s]]
    if cuda_only:
        can_run = [s for s in cases.SUITES if s != "calibration" and cpu_pairs[s]]
        raise ValueError(
            f"--scale gpu: suite(s) {', '.join(cuda_only)} time CUDA implementations only and "
            f"torch sees no GPU here (torch {torch.__version__}); on this machine use "
            f"--scale cpu, or --suite {' --suite '.join(can_run) or '<none>'} at the gpu scale"
        )


def _listed(names: Sequence[str], limit: int = 12) -> str:
    """``names`` joined by commas, the first ``limit`` of them and a count of the rest."""
    shown = ", ".join(names[:limit])
    more = len(names) - limit
    return f"{shown}, ... ({more} more)" if more > 0 else shown


def check_filter(
    scale: str,
    suites: Sequence[str],
    match: str | None = None,
    case_names: Sequence[str] | None = None,
) -> None:
    """Refuse a ``--match``/``--case`` filter that selects no pair of the chosen suites.

    Calibration is never filtered (:func:`bench.cases.select_pairs`) and does not count:
    without this check such a run measures calibration alone and reports success. Suites
    other than calibration only are checked; no filter, nothing to check. Raises
    ``ValueError`` naming the filter and the case names of the chosen suites at ``scale``
    (the first few of them when there are many).
    """
    chosen = [s for s in suites if s != "calibration"]
    if not chosen or (not match and not case_names):
        return
    if any(cases.select_pairs(s, scale, match=match, case_names=case_names) for s in chosen):
        return
    names: dict[str, None] = {}
    for s in chosen:
        for case, _ in cases.pairs(s, scale):
            names.setdefault(case.name, None)
    what = []
    if case_names:
        what.append("--case " + " --case ".join(case_names))
    if match:
        what.append(f"--match {match!r} (tested against suite/case/impl)")
    raise ValueError(
        f"{' and '.join(what)} selects no case of suite(s) {', '.join(chosen)} at scale "
        f"{cases.resolve_scale(scale)}; their cases: {_listed(list(names)) or '<none>'}"
    )


#: A 1-minute load average above this fraction of the CPU cores, before a CPU-timing run
#: starts, is warned of: other work on the cores slows (and spreads) the CPU medians.
BUSY_LOAD_FRACTION = 0.5


def load_warning(scale: str, load_1m: float | None = None, cores: int | None = None) -> str:
    """A warning (empty when none) that the CPU is already loaded before CPU timings start:
    the 1-minute load average (``os.getloadavg``, processes) over the cores torch may use.
    GPU-scale runs time the GPU and are not warned."""
    if cases.resolve_scale(scale) == "gpu":
        return ""
    if load_1m is None:
        try:
            load_1m = os.getloadavg()[0]
        except OSError:  # not available on this platform
            return ""
    cores = cores or os.cpu_count() or 1
    if load_1m <= BUSY_LOAD_FRACTION * cores:
        return ""
    return (
        f"the 1-minute load average is {load_1m:.2f} on {cores} cores before timing starts: "
        "other work shares the CPU, so CPU medians will be slower and noisier (each row "
        "records load_avg_1m); run on an idle machine for numbers to keep"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Command line of ``python -m bench.run``; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n")[0])
    parser.add_argument("--scale", choices=cases.SCALES, required=True)
    parser.add_argument("--out", type=Path, required=True, help="directory for rows.csv/json")
    parser.add_argument(
        "--suite",
        action="append",
        choices=cases.SUITES,
        help="suite to run (repeatable; default: all)",
    )
    parser.add_argument("--match", help="only pairs whose suite/case/impl contains this text")
    parser.add_argument(
        "--case",
        action="append",
        dest="cases",
        help="only cases of this name, run in the order given (repeatable; default: all)",
    )
    args = parser.parse_args(argv)
    suites = args.suite or list(cases.SUITES)
    try:
        check_out_dir(args.out)  # a file at --out or above it: one line now, not a traceback
        check_device(args.scale, suites)
        check_filter(args.scale, suites, args.match, args.cases)
    except ValueError as exc:
        print(f"python -m bench.run: {exc}", file=sys.stderr)
        return 2
    if "calibration" not in suites:
        suites = ["calibration", *suites]
    busy = load_warning(args.scale)
    if busy:
        print(f"python -m bench.run: warning: {busy}", file=sys.stderr)
    try:
        with terminate_gracefully():
            rows = run(args.scale, args.out, suites, args.match, args.cases)
    except rundir.RunBusyError as exc:  # another bench.run writes into --out
        print(f"python -m bench.run: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # the rows measured are written (run's last write): no traceback
        print(
            f"python -m bench.run: interrupted; the rows measured are in {args.out}",
            file=sys.stderr,
        )
        return 130  # 128 + SIGINT, as a shell reports Ctrl-C
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    print(f"wrote {len(rows)} rows to {args.out} ({counts})")
    return 1 if counts.get("error") else 0


if __name__ == "__main__":
    sys.exit(main())
