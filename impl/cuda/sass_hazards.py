"""``python -m impl.cuda.sass_hazards [--nvrtc ARCH] [--json PATH] [FILE ...]``: shared-memory
hazards in the kernels' machine code that compute-sanitizer's racecheck would report, found
without a GPU.

The race checker of the CPU emulation (docs/kernels.md, "Races, checked on the CPU") checks
the accesses the C++ source makes; the GPU's compiler may add its own. On the H200, racecheck
reported read/write hazards in eight SpMM kernels whose source had none: ptxas had hoisted a
load of a shared word (the mask of used rows) out of a ``threadIdx.x == 0`` branch, so every
thread loaded the word that thread 0 then stored, with no barrier between. This module reads
the SASS of a cubin (``cuobjdump -sass``) and reports that class of hazard: within one
interval between two block barriers (``BAR.SYNC`` / ``BAR.RED``), in program order, two
accesses to one **uniform** shared address (the same operand built from uniform registers
``URn`` and constants only, so the same address in every thread; none of its registers
written between the two), at least one a write (``STS``, ``ATOMS``, ``LDGSTS``'s shared
destination), which different threads can make: not both unpredicated stores (every thread
writing one word, each the same store), not two shared atomics, and not both under one
predicate register read in the same sense (which may select a single thread).

It walks each kernel's instructions in address order, and for each branch the path that
takes it: the accesses open at the branch (since the last barrier) against those from its
target up to the next barrier (so a loop's tail meets its head, and a branch around a barrier
is seen). What it does not see: accesses through per-thread addresses (``Rn``), which differ
between threads in general; one address spelled through two different registers; paths that
take two or more branches between the accesses; warp-level synchronisation (``WARPSYNC``,
shuffles), which it does not count as a barrier. No report
is evidence about that class only; racecheck on a GPU is the check.

The files are cubins (disassembled with ``cuobjdump``, :func:`find_cuobjdump`) or SASS text.
``--nvrtc ARCH`` scans, besides, the code the kernels run as: the loader's sources compiled
by NVRTC for ``ARCH`` with the options CuPy gives it (:mod:`impl.cuda.nvrtc`); on a GPU
machine, with the library CuPy loaded there (``PDT_NVRTC_LIB``), the very code it launches.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# "/*02b0*/   @!P1 STS [UR11+0x8000], RZ ;"
_INSTRUCTION = re.compile(
    r"/\*(?P<offset>[0-9a-f]{4,})\*/\s+(?P<pred>@!?U?P[T0-9]+\s+)?(?P<op>[A-Z][A-Z0-9_.]*)"
    r"(?P<operands>[^;]*);"
)
_FUNCTION = re.compile(r"Function : (\S+)")
_REGISTER = re.compile(r"\bU?R\d+\b|\bURZ\b|\bRZ\b")
_PER_THREAD_REGISTER = re.compile(r"(?<![U\w])R\d+\b")

SHARED_LOADS = frozenset({"LDS", "LDSM"})
SHARED_STORES = frozenset({"STS", "LDGSTS"})  # LDGSTS: an async copy into shared memory
SHARED_READ_WRITES = frozenset({"ATOMS"})
SHARED_ACCESSES = SHARED_LOADS | SHARED_STORES | SHARED_READ_WRITES
BARRIERS = frozenset({"BAR.SYNC", "BAR.RED"})
_BARRIER_PREFIXES = tuple(b + "." for b in BARRIERS)
_ADDRESS = re.compile(r"\[([^\]]*)\]")  # the first [...] of a shared access: the shared side


@dataclass(frozen=True)
class Instruction:
    """One SASS instruction: byte offset in its kernel, guard predicate (``""`` when none,
    else e.g. ``"@!P1"``), opcode with its modifiers, operand text."""

    offset: int
    predicate: str
    opcode: str
    operands: str

    @property
    def base(self) -> str:
        """The opcode without its modifiers (``LDS.U8`` -> ``LDS``)."""
        return self.opcode.split(".")[0]


@dataclass(frozen=True)
class Hazard:
    """Two accesses to one uniform shared address in one barrier interval, one a write."""

    kernel: str
    address: str
    first: Instruction
    second: Instruction

    def __str__(self) -> str:
        def show(i: Instruction) -> str:
            pred = f"{i.predicate} " if i.predicate else ""
            return f"+{i.offset:#x} {pred}{i.opcode} [{self.address}]"

        return f"{self.kernel}: {show(self.first)} and {show(self.second)}, no barrier between"


def parse_sass(text: str) -> dict[str, list[Instruction]]:
    """The instructions of each kernel (``Function : name``) of ``cuobjdump -sass`` output, in
    address order."""
    kernels: dict[str, list[Instruction]] = {}
    current: list[Instruction] | None = None
    for line in text.splitlines():
        function = _FUNCTION.search(line)
        if function:
            current = kernels.setdefault(function.group(1), [])
            continue
        match = _INSTRUCTION.search(line)
        if match and current is not None:
            current.append(
                Instruction(
                    offset=int(match.group("offset"), 16),
                    predicate=(match.group("pred") or "").strip(),
                    opcode=match.group("op"),
                    operands=match.group("operands").strip(),
                )
            )
    return kernels


def _is_barrier(ins: Instruction) -> bool:
    return ins.opcode in BARRIERS or ins.opcode.startswith(_BARRIER_PREFIXES)


def _shared_access(ins: Instruction) -> tuple[str, bool] | None:
    """``(address, writes)`` of a shared-memory access at a uniform address; ``None`` for any
    other instruction (a per-thread address included)."""
    if ins.base not in SHARED_ACCESSES:
        return None
    address = _ADDRESS.search(ins.operands)
    if address is None:
        return None
    text = address.group(1).replace(" ", "")
    if _PER_THREAD_REGISTER.search(text):
        return None
    return text, ins.base not in SHARED_LOADS


def _written_registers(ins: Instruction) -> set[str]:
    """The registers an instruction writes, as far as this scan needs: its first operand
    (SASS puts the destination first), unless that is a memory address (a store) or the
    instruction is a barrier or a branch."""
    if ins.base in {"BAR", "BRA", "EXIT", "RET", "CALL"}:
        return set()
    first = ins.operands.split(",")[0].strip()
    if "[" in first:
        return set()
    return {r for r in _REGISTER.findall(first) if r not in ("RZ", "URZ")}


def _same_guard(a: Instruction, b: Instruction) -> bool:
    return bool(a.predicate) and a.predicate == b.predicate


_Open = list[tuple[Instruction, str, bool, set[str]]]  # accesses since the last barrier


def _scan(
    name: str,
    instructions: Sequence[Instruction],
    hazards: list[Hazard],
    open_accesses: _Open,
    *,
    until_barrier: bool = False,
    states: dict[int, _Open] | None = None,
) -> None:
    """Walk ``instructions`` as one path from ``open_accesses``, appending each hazard to
    ``hazards``; a block barrier ends an interval (and the walk, ``until_barrier``).
    ``states``: filled with the accesses open after each branch, by its index."""
    for k, ins in enumerate(instructions):
        if _is_barrier(ins):
            if until_barrier:
                return
            open_accesses = []
            continue
        access = _shared_access(ins)
        if access is not None:
            address, writes = access
            for earlier, addr, earlier_writes, _ in open_accesses:
                if addr != address or not (writes or earlier_writes):
                    continue
                both_plain_stores = (
                    writes and earlier_writes and not ins.predicate and not earlier.predicate
                    and ins.base == earlier.base == "STS"
                )  # fmt: skip
                both_atomic = ins.base == earlier.base == "ATOMS"  # atomics do not race
                if both_plain_stores or both_atomic or _same_guard(earlier, ins):
                    continue
                hazards.append(Hazard(name, address, earlier, ins))
            regs = set(_REGISTER.findall(address)) - {"RZ", "URZ"}
            open_accesses = [*open_accesses, (ins, address, writes, regs)]
        written = _written_registers(ins) if open_accesses else None
        if written:  # an address register rewritten: later text no longer names that address
            open_accesses = [a for a in open_accesses if not (a[3] & written)]
        if states is not None and ins.base == "BRA":
            states[k] = open_accesses


_BRANCH_TARGET = re.compile(r"\b0x([0-9a-f]+)\b")


def _branches(instructions: Sequence[Instruction]) -> list[tuple[int, int]]:
    """``(branch, target)`` indices of the branches to an instruction of the kernel."""
    index = {ins.offset: k for k, ins in enumerate(instructions)}
    edges = []
    for k, ins in enumerate(instructions):
        target = _BRANCH_TARGET.search(ins.operands) if ins.base == "BRA" else None
        if target and int(target.group(1), 16) in index:
            edges.append((k, index[int(target.group(1), 16)]))
    return edges


def kernel_hazards(name: str, instructions: Sequence[Instruction]) -> list[Hazard]:
    """The hazards (see the module docstring) of one kernel's instructions: in address order,
    and along each branch (the code up to it, then the code from its target)."""
    hazards: list[Hazard] = []
    states: dict[int, _Open] = {}
    _scan(name, instructions, hazards, [], states=states)
    for branch, target in _branches(instructions):
        if states.get(branch):  # accesses open at the branch meet those from its target
            _scan(name, instructions[target:], hazards, states[branch], until_barrier=True)
    unique: dict[frozenset[int], Hazard] = {}  # one per pair of instructions
    for h in hazards:
        unique.setdefault(frozenset((h.first.offset, h.second.offset)), h)
    return list(unique.values())


def _hazards_of(kernels: dict[str, list[Instruction]]) -> list[Hazard]:
    return [h for name, body in kernels.items() for h in kernel_hazards(name, body)]


def sass_hazards(text: str) -> list[Hazard]:
    """The hazards of every kernel in ``cuobjdump -sass`` output ``text``."""
    return _hazards_of(parse_sass(text))


def find_cuobjdump() -> str | None:
    """``cuobjdump``: ``$CUOBJDUMP``, the PATH, the ``nvidia-cuda-cuobjdump`` wheel's copy on
    ``sys.path`` (``nvidia/<cuda>/bin/cuobjdump``), or the one Triton bundles (with CUDA builds
    of torch: ``triton/backends/nvidia/bin/cuobjdump``, nvdisasm beside it); ``None`` where
    there is none."""
    env = os.environ.get("CUOBJDUMP")
    if env:
        return env
    found = shutil.which("cuobjdump")
    if found:
        return found
    for base in sys.path:
        root = Path(base or ".")
        for cand in [
            *sorted(root.glob("nvidia/*/bin/cuobjdump")),
            root / "triton" / "backends" / "nvidia" / "bin" / "cuobjdump",
        ]:
            if os.access(cand, os.X_OK):
                return str(cand)
    return None


def disassemble(cubin: str | Path, cuobjdump: str | None = None) -> str:
    """``cuobjdump -sass`` of ``cubin`` (it needs ``nvdisasm``: on the PATH or beside it, as
    the ``nvidia-cuda-nvdisasm`` wheel puts it). Raises ``FileNotFoundError`` without a
    cuobjdump and ``RuntimeError`` when it fails."""
    tool = cuobjdump or find_cuobjdump()
    if tool is None:
        raise FileNotFoundError(
            "no cuobjdump (set CUOBJDUMP, put the CUDA toolkit's on the PATH, or pip install "
            "nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)"
        )
    # cuobjdump runs nvdisasm from the PATH: the wheels put the two side by side
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(tool).parent), env.get("PATH", "")])
    proc = subprocess.run([tool, "-sass", str(cubin)], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{tool} -sass {cubin} failed: {proc.stderr.strip()}")
    return proc.stdout


def file_hazards(
    paths: Iterable[str | Path], cuobjdump: str | None = None
) -> tuple[list[Hazard], int]:
    """The hazards of each file (a ``.cubin``, disassembled with ``cuobjdump``, default
    :func:`find_cuobjdump`, looked up once; anything else read as SASS text) and the number of
    kernels read."""
    hazards: list[Hazard] = []
    count = 0
    for path in paths:
        if str(path).endswith(".cubin"):
            cuobjdump = cuobjdump or find_cuobjdump()
            text = disassemble(path, cuobjdump)
        else:
            text = Path(path).read_text()
        kernels = parse_sass(text)
        count += len(kernels)
        hazards += _hazards_of(kernels)
    return hazards, count


def scan_report(
    files: Sequence[str | Path], arch: str | None = None, nvrtc_library: str | None = None
) -> dict[str, Any]:
    """Scan ``files`` and, with ``arch`` (``sm_90``), the loader's sources compiled by NVRTC
    for it (:func:`impl.cuda.nvrtc.compile_loader_sources`, the options CuPy gives it; from
    ``nvrtc_library``, default :func:`impl.cuda.nvrtc.find_library`): the hazards, the
    kernels read, the tools. Raises ``OSError`` / ``RuntimeError`` where a file, a tool or a
    compile fails, ``ValueError`` for a malformed ``arch``."""
    report: dict[str, Any] = {"files": [str(f) for f in files], "cuobjdump": find_cuobjdump()}
    paths = list(files)
    with tempfile.TemporaryDirectory(prefix="pdt-nvrtc-") as tmp:
        if arch is not None:
            from impl.cuda import nvrtc

            library = nvrtc_library or nvrtc.find_library()
            report["nvrtc"] = {"arch": arch, "library": library}
            paths += nvrtc.compile_loader_sources(arch, tmp, library)
            report["nvrtc"]["version"] = ".".join(map(str, nvrtc.version(nvrtc.load(library))))
            report["nvrtc"]["options"] = nvrtc.loader_options(arch)
        hazards, count = file_hazards(paths, report["cuobjdump"])
    report["kernels"] = count
    report["hazards"] = [str(h) for h in hazards]
    return report


def main(argv: list[str] | None = None) -> int:
    """Print each hazard of the files given (and, with ``--nvrtc ARCH``, of the loader's
    sources as NVRTC compiles them for ARCH); exit 1 if there is one, 2 on a usage error or
    a file, tool or compile that fails."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m impl.cuda.sass_hazards",
        description="S" + " ".join(__doc__.split("\n\n")[0].split("``: s", 1)[1].split()),
    )
    parser.add_argument("files", nargs="*", metavar="FILE", help="a .cubin, or SASS text")
    parser.add_argument(
        "--nvrtc",
        metavar="ARCH",
        help="also compile the loader's sources with NVRTC for ARCH (e.g. sm_90), with the "
        "options CuPy gives it, and scan them (libnvrtc: PDT_NVRTC_LIB, else found)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the result as JSON")
    args = sys.argv[1:] if argv is None else argv
    try:
        opts = parser.parse_args(args)
    except SystemExit as stop:
        return int(stop.code or 0)
    if not opts.files and opts.nvrtc is None:
        parser.print_usage(sys.stderr)
        print("sass_hazards: give a FILE or --nvrtc ARCH", file=sys.stderr)
        return 2
    try:
        report = scan_report(opts.files, opts.nvrtc)
    except (OSError, RuntimeError, ValueError) as err:
        print(f"sass_hazards: {err}", file=sys.stderr)
        return 2
    for hazard in report["hazards"]:
        print(hazard)
    print(f"{len(report['hazards'])} hazard(s) in {report['kernels']} kernel(s)")
    if opts.json:
        Path(opts.json).parent.mkdir(parents=True, exist_ok=True)
        Path(opts.json).write_text(json.dumps(report, indent=2) + "\n")
    return 1 if report["hazards"] else 0


if __name__ == "__main__":
    sys.exit(main())
