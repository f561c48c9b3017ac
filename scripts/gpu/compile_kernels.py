"""Compile the CUDA kernels through the loader (CuPy RawModule, NVRTC) and record what ran.

    python scripts/gpu/compile_kernels.py [--json PATH] [--sass PATH [--report PATH]]

On the GPU machine: loads every source of :data:`impl.cuda.loader.SOURCES` (timing each
compile), looks up every kernel the ops launch (``KERNELS`` of ``impl.ops.pattern_cuda``,
``nm_cuda``, ``pack_cuda``) and reads its attributes from the driver (registers per thread,
local memory bytes: non-zero means spills or a stack array, static shared memory, the most
threads per block it can launch with). Exit status 1 when a source does not load or a kernel
is missing, with the loader's reason. It fills CuPy's on-disk kernel cache, so the test steps
after it do not compile again. It records the device's architecture and the ``libnvrtc``
CuPy compiled with (read from the process's memory map). With ``--sass PATH`` it then
compiles the sources once more with that very library for that architecture, directly
(:mod:`impl.cuda.nvrtc`), scans their machine code for the shared-memory hazard racecheck
found on the H200 (:mod:`impl.cuda.sass_hazards`) and writes the result to PATH: exit
status 1 on a hazard, 2 when the scan cannot run (no ``cuobjdump``). ``--report`` names the
JSON an earlier ``--json`` wrote, whose architecture and library the scan then takes without
loading the kernels again (kernels.sh's ``sass`` step reads the ``compile`` step's). Used by
``scripts/gpu/kernels.sh`` (docs/gpu-session.md).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: Attributes of a CuPy ``RawKernel`` that are recorded (``RawKernel.attributes`` keys).
ATTRIBUTES: tuple[str, ...] = (
    "num_regs",
    "local_size_bytes",
    "shared_size_bytes",
    "const_size_bytes",
    "max_threads_per_block",
    "ptx_version",
    "binary_version",
)


def kernels_by_source() -> dict[str, tuple[str, ...]]:
    """``{source file: kernel names the ops launch}`` (needs no GPU)."""
    from impl.ops import nm_cuda, pack_cuda, pattern_cuda

    return {
        pattern_cuda._SRC: pattern_cuda.KERNELS,
        nm_cuda._SRC: nm_cuda.KERNELS,
        pack_cuda._SRC: pack_cuda.KERNELS,
    }


def compile_all() -> dict[str, Any]:
    """Load each source and read each kernel's attributes: ``{"sources", "kernels", "errors"}``,
    and with a GPU ``"device"``, ``"arch"`` (``sm_90``), ``"compile_options"`` and
    ``"nvrtc_library"`` (the ``libnvrtc`` CuPy compiled with; ``None`` where none is mapped)."""
    import torch

    from impl.cuda import loader, nvrtc

    report: dict[str, Any] = {"sources": {}, "kernels": {}, "errors": []}
    if not torch.cuda.is_available():
        report["errors"].append("no CUDA GPU visible to torch")
        return report
    report["device"] = torch.cuda.get_device_name(0)
    major, minor = torch.cuda.get_device_capability(0)
    report["arch"] = f"sm_{major}{minor}"
    report["compile_options"] = list(loader.compile_options())
    for source, names in kernels_by_source().items():
        t0 = time.perf_counter()
        try:
            loader.load(source)
        except RuntimeError as err:
            report["errors"].append(str(err))
            continue
        report["sources"][source] = {"load_seconds": round(time.perf_counter() - t0, 2)}
        for name in names:
            try:
                attrs = loader.get_function(source, name).attributes
            except Exception as err:  # noqa: BLE001 - a missing kernel is a finding
                report["errors"].append(f"{source}:{name}: {type(err).__name__}: {err}")
                continue
            report["kernels"][name] = {k: attrs.get(k) for k in ATTRIBUTES}
    report["nvrtc_library"] = nvrtc.loaded_library()
    return report


def sass_scan(report: dict[str, Any]) -> dict[str, Any]:
    """The hazard scan (:func:`impl.cuda.sass_hazards.scan_report`) of the loader's sources as
    NVRTC compiles them for ``report``'s architecture, with the library CuPy loaded (else the
    one :func:`impl.cuda.nvrtc.find_library` finds). Raises ``OSError`` / ``RuntimeError``
    where the compile or the disassembly fails, ``KeyError`` without an architecture."""
    from impl.cuda import sass_hazards

    return sass_hazards.scan_report([], report["arch"], report.get("nvrtc_library"))


def main(argv: Sequence[str] | None = None) -> int:
    """Command line; prints a table of the kernels (and, with ``--sass``, the hazards of their
    machine code); returns 1 on any error or hazard, 2 when the scan cannot run or the
    ``--report`` cannot be read."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", type=Path, help="write the report here")
    p.add_argument(
        "--sass",
        type=Path,
        metavar="PATH",
        help="then scan the machine code NVRTC makes for this device, write the result here",
    )
    p.add_argument(
        "--report",
        type=Path,
        metavar="PATH",
        help="with --sass: the report an earlier --json wrote, read instead of compiling again",
    )
    args = p.parse_args(argv)
    if args.report is not None and args.sass is None:
        p.error("--report is read only for --sass")
    try:
        report = compile_all() if args.report is None else json.loads(args.report.read_text())
    except (OSError, ValueError) as err:
        print(f"ERROR: cannot read the report {args.report}: {err}")
        return 2
    for source, info in report["sources"].items():
        print(f"{source}: loaded in {info['load_seconds']} s")
    spills = []
    for name, a in sorted(report["kernels"].items()):
        print(
            f"{name:<32} regs {a['num_regs']:>3}  local {a['local_size_bytes']:>4} B  "
            f"shared {a['shared_size_bytes']:>6} B  max threads {a['max_threads_per_block']}"
        )
        if a["local_size_bytes"]:
            spills.append(name)
    if spills:
        print(f"local memory (spills or stack arrays) in: {', '.join(spills)}")
    for err in report["errors"]:
        print(f"ERROR: {err}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    if report["errors"]:
        return 1
    if args.sass is None:
        return 0
    try:
        scan = sass_scan(report)
    except (OSError, RuntimeError) as err:
        print(f"ERROR: the machine-code scan could not run: {err}")
        return 2
    for hazard in scan["hazards"]:
        print(f"HAZARD: {hazard}")
    nv = scan["nvrtc"]
    print(
        f"machine code (NVRTC {nv['version']}, {nv['arch']}, {nv['library']}): "
        f"{len(scan['hazards'])} hazard(s) in {scan['kernels']} kernel(s)"
    )
    args.sass.parent.mkdir(parents=True, exist_ok=True)
    args.sass.write_text(json.dumps(scan, indent=1) + "\n")
    return 1 if scan["hazards"] else 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    sys.exit(main())
