"""Which CUDA kernels a compute-sanitizer run launched, and whether it launched every one it
must check.

    python scripts/gpu/sanitizer_coverage.py LOG --tool memcheck|racecheck
        [--kernels reports/gpu/kernels.json ...] [--json PATH] [--sanitizer-log PATH]

LOG holds the launch records that the test session under the sanitizer wrote as it went
(``PDT_KERNEL_LAUNCH_LOG``: a JSON line per test that launched kernels, those launched since
the process's last line, and one at the session's end; their sum is each process's
``impl.cuda.loader.launched()``), so a run stopped at its time limit still counts.
Kernels are counted by family, the name without its element type and variant (``pdt_spmm_
tiled_f32_vec`` is of ``pdt_spmm_tiled``). memcheck must launch every family of the kernels the
ops launch; racecheck every family with a kernel that uses shared memory (the compile step's
``kernels.json``, ``shared_size_bytes``; the first ``--kernels`` file that exists; without one,
:data:`SHARED_MEMORY_FAMILIES`, what ptxas reports for the sources). A sanitizer
that reports nothing says nothing of a kernel it never ran: this makes that visible. Exit
status 1 when a family it must check was not launched (a run cut at its time limit before it
reached one reads so), or no record was written (the run ended before its first test).

With ``--sanitizer-log`` it also counts the reports in the sanitizer's own console output
(:func:`sanitizer_findings`) and exits with status 2 when there is any: compute-sanitizer's
``--error-exitcode`` is given only at its exit, so a run stopped at its time limit would
otherwise hide the hazards it had already printed (racecheck on a first H200 run printed 100
shared-memory race reports before its cut, and the step read "cut"). Used by
``scripts/gpu/kernels.sh`` (docs/gpu-session.md).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

#: The kernel families that declare shared memory (static ``__shared__``, what the compile
#: step's ``shared_size_bytes`` reads), as ``nvcc -Xptxas -v`` reports them for sm_80 and
#: sm_90: racecheck's requirement where no ``kernels.json`` exists (a check run on a fresh
#: machine, or a compile step that was cut). tests/test_cuda_compile.py checks the list against
#: ptxas wherever nvcc is on the PATH, so it cannot go stale unnoticed.
SHARED_MEMORY_FAMILIES: tuple[str, ...] = (
    "pdt_conv_implicit_tiled",
    "pdt_expand",
    "pdt_nm_cstats",
    "pdt_nm_fused",
    "pdt_nm_gstats",
    "pdt_nm_stats",
    "pdt_sddmm",
    "pdt_sddmm_tiled",
    "pdt_spmm",
    "pdt_spmm_piped",
    "pdt_spmm_tiled",
)

#: Name parts that say a kernel's element type, index type, width or load path, not what it
#: computes.
_VARIANT = re.compile(r"_(?:f16|bf16|f32|f64|i32|i64|vec|scalar|w\d+|b\d+)$")


def family(name: str) -> str:
    """The kernel family of a kernel name: its name without variant parts at the end."""
    while (shorter := _VARIANT.sub("", name)) != name:
        name = shorter
    return name


def read_launches(log: Path) -> tuple[Counter[str], int]:
    """``(launches per kernel name, number of records)`` of a launch log (absent: none)."""
    total: Counter[str] = Counter()
    records = 0
    if not log.exists():
        return total, 0
    for line in log.read_text().splitlines():
        if line.strip():
            total.update(json.loads(line)["launched"])
            records += 1
    return total, records


def shared_memory_kernels(kernels_json: Path) -> set[str] | None:
    """Names of the kernels with static shared memory, from the compile step's report; ``None``
    when the report is absent or holds no kernel."""
    if not kernels_json.exists():
        return None
    kernels = json.loads(kernels_json.read_text()).get("kernels", {})
    if not kernels:
        return None
    return {n for n, a in kernels.items() if (a.get("shared_size_bytes") or 0) > 0}


#: A report's first line in compute-sanitizer's output: its prefix of nine "=" and a space
#: (not part of a longer run of "=", as pytest's rules are; pytest -v may print a test's name
#: before it), then text; continuation lines have more spaces there.
_REPORT_LINE = re.compile(r"(?:^|[^=])========= (\S.*)$")
#: Lines of that prefix that are not reports: the banner and the summaries.
_NOT_A_REPORT = re.compile(r"^(COMPUTE-SANITIZER|ERROR SUMMARY|RACECHECK SUMMARY|LEAK SUMMARY)")


def sanitizer_findings(text: str) -> list[str]:
    """The first line of each report in compute-sanitizer's console output ``text`` (a memcheck
    access error, a racecheck hazard, an API error...), without the prefix, in order; the banner,
    the summaries, a report's continuation lines and pytest's own rules are not counted."""
    found = []
    for line in text.splitlines():
        m = _REPORT_LINE.search(line)
        if m and not _NOT_A_REPORT.match(m.group(1)):
            found.append(m.group(1).strip())
    return found


def coverage(launched: Counter[str], kernels: Iterable[str], must: Iterable[str]) -> dict[str, Any]:
    """Coverage by family: which of the ``must`` families were launched, which were not, and
    how many of all ``kernels`` (names) ran."""
    names = set(kernels)
    kernels = sorted(names)
    must_families = sorted({family(k) for k in must})
    ran_families = {family(k) for k, n in launched.items() if n > 0}
    return {
        "families_required": must_families,
        "families_launched": sorted(ran_families & {family(k) for k in names}),
        "families_missing": [f for f in must_families if f not in ran_families],
        "kernels_launched": sorted(k for k in kernels if launched.get(k, 0) > 0),
        "kernels_total": len(kernels),
        "launches": sum(launched.values()),
        "unknown_launched": sorted(k for k in launched if k not in names),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Command line; prints the coverage; returns 2 when the sanitizer's log holds a report, else
    1 when a required family did not run, else 0."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("log", type=Path, help="PDT_KERNEL_LAUNCH_LOG of the sanitizer's run")
    p.add_argument("--tool", choices=("memcheck", "racecheck"), required=True)
    p.add_argument("--kernels", type=Path, action="append", default=[], help="kernels.json")
    p.add_argument("--json", type=Path, help="write the coverage here")
    p.add_argument(
        "--sanitizer-log", type=Path, help="the sanitizer's console output: count its reports"
    )
    args = p.parse_args(argv)

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from compile_kernels import kernels_by_source

    kernels = [k for ks in kernels_by_source().values() for k in ks]
    launched, records = read_launches(args.log)
    note = ""
    if args.tool == "memcheck":
        must: list[str] = kernels
    else:
        found = next((k for k in args.kernels if k.exists()), None)
        shared = shared_memory_kernels(found) if found else None
        if shared is None:  # the families ptxas reports shared memory for
            must = [k for k in kernels if family(k) in SHARED_MEMORY_FAMILIES]
            note = "no kernels.json: the families with shared memory by ptxas (sources)"
        else:
            must = sorted(shared)
            note = f"families with shared memory, from {found}"
    cov = coverage(launched, kernels, must)
    cov.update(tool=args.tool, records=records, note=note)
    print(
        f"{args.tool}: launched {len(cov['families_launched'])} kernel families "
        f"({len(cov['kernels_launched'])} of {cov['kernels_total']} kernels, "
        f"{cov['launches']} launches, {records} record(s)); required "
        f"{len(cov['families_required'])}{' (' + note + ')' if note else ''}"
    )
    print("  launched: " + ", ".join(cov["families_launched"]))
    if cov["families_missing"]:
        print("  NOT LAUNCHED (not checked): " + ", ".join(cov["families_missing"]))
    if records == 0:
        print(f"  no launch record in {args.log}: no test of the session ended (cut or crash)")
    findings: list[str] = []
    if args.sanitizer_log is not None:
        text = args.sanitizer_log.read_text(errors="replace") if args.sanitizer_log.exists() else ""
        findings = sanitizer_findings(text)
        kinds = Counter(re.sub(r"\s+at\s.*|\+0x[0-9a-f]+.*", "", f) for f in findings)
        cov.update(findings=len(findings), finding_kinds=dict(kinds.most_common()))
        if findings:
            print(f"  {len(findings)} sanitizer report(s) in {args.sanitizer_log}:")
            for kind, n in kinds.most_common(5):
                print(f"    {n} x {kind}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(cov, indent=1) + "\n")
    if findings:
        return 2
    return 1 if cov["families_missing"] or records == 0 else 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    sys.exit(main())
