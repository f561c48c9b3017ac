"""Compile checks of the CUDA kernels that need no GPU (docs/kernels.md).

Where ``nvcc`` is on the PATH: every ``impl/cuda/*.cu`` compiles for sm_75, sm_80 and sm_90
with the loader's options, without errors, warnings or register spills, and every kernel the
ops launch is among the compiled entry points. Where a ``libnvrtc`` is found (CUDA toolkit,
the ``nvidia-cuda-nvrtc`` wheel that CUDA builds of torch and CuPy bring, or
``PDT_NVRTC_LIB``): NVRTC compiles the loader's expanded sources with the loader's options,
the exact path the loader takes at run time. Where a ``cuobjdump`` is found (CUDA toolkit,
the ``nvidia-cuda-cuobjdump`` and ``nvidia-cuda-nvdisasm`` wheels, or ``CUOBJDUMP``): no
kernel's machine code, nvcc's for the three archs and NVRTC's for sm_90, reads and writes
one shared word between two barriers (``impl.cuda.sass_hazards``).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from impl.cuda import loader, nvrtc, sass_hazards
from impl.ops import nm_cuda, pack_cuda, pattern_cuda

ARCHS = ("sm_75", "sm_80", "sm_90")  # Turing (T4) is the oldest GPU the kernels take
NVCC = shutil.which("nvcc")
_ENTRY_RE = re.compile(r"Compiling entry function '(\w+)' for '(sm_\d+)'")
_SPILL_RE = re.compile(
    r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads"
)


def _parse_ptxas(log: str) -> dict[str, tuple[int, int, int]]:
    """{kernel: (stack frame, spill stores, spill loads)} from ``-Xptxas -v`` output."""
    out: dict[str, tuple[int, int, int]] = {}
    current = None
    for line in log.splitlines():
        m = _ENTRY_RE.search(line)
        if m:
            current = m.group(1)
            continue
        m = _SPILL_RE.search(line)
        if m and current is not None:
            out[current] = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
            current = None
    return out


#: The tests that read the module's nvcc runs: one xdist worker runs them, so that nvcc runs
#: once, not once per worker.
NVCC_GROUP = pytest.mark.xdist_group("nvcc-compile")


#: The arch whose PTX the flush check reads (kept from its compile, not compiled again).
PTX_ARCH = "sm_90"


@pytest.fixture(scope="module")
def nvcc_root(tmp_path_factory) -> Path:
    """Where the module's nvcc runs write: ``<arch>/`` cubins, ``<arch>.log``, and the
    intermediate files of :data:`PTX_ARCH`'s compile in ``keep/`` (its PTX among them)."""
    return tmp_path_factory.mktemp("cubin")


@pytest.fixture(scope="module")
def nvcc_logs(nvcc_root: Path) -> dict[str, tuple[int, str, float]]:
    """Compile all sources once per arch (the archs in parallel): {arch: (rc, log, seconds)}."""
    if NVCC is None:
        pytest.skip("nvcc is not on the PATH: the compile check needs the CUDA toolkit")
    root = nvcc_root
    sources = [loader.KERNEL_DIR / s for s in loader.SOURCES]
    procs = {}
    start = time.perf_counter()
    for arch in ARCHS:
        out_dir = root / arch
        out_dir.mkdir()
        log = open(root / f"{arch}.log", "w")  # noqa: SIM115 (closed below)
        cmd = loader.nvcc_command(sources, arch, out_dir, nvcc=NVCC)
        if arch == PTX_ARCH:  # keep the PTX the cubins come from
            (root / "keep").mkdir()
            cmd += ["-keep", "-keep-dir", str(root / "keep")]
        procs[arch] = (subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), log)
    results = {}
    for arch, (proc, log) in procs.items():
        rc = proc.wait(timeout=900)
        log.close()
        results[arch] = (rc, (root / f"{arch}.log").read_text(), time.perf_counter() - start)
    return results


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS, ids=ARCHS)
@NVCC_GROUP
def test_nvcc_compiles_every_source_without_errors_or_warnings(nvcc_logs, arch):
    rc, log, seconds = nvcc_logs[arch]
    bad = [ln for ln in log.splitlines() if re.search(r"\b(error|warning)\b", ln, re.I)]
    assert rc == 0 and not bad, f"nvcc {arch} failed (rc={rc}) after {seconds:.1f} s:\n{log}"


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS, ids=ARCHS)
@NVCC_GROUP
def test_no_kernel_spills_registers(nvcc_logs, arch):
    rc, log, _ = nvcc_logs[arch]
    assert rc == 0, log
    usage = _parse_ptxas(log)
    assert usage, f"no ptxas resource usage found in the {arch} log:\n{log}"
    spills = {k: v for k, v in usage.items() if v[1] or v[2]}
    assert not spills, f"{arch}: register spills (stack, stores, loads): {spills}"


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS, ids=ARCHS)
@NVCC_GROUP
def test_every_kernel_the_ops_launch_is_compiled(nvcc_logs, arch):
    rc, log, _ = nvcc_logs[arch]
    assert rc == 0, log
    compiled = {name for name, a in _ENTRY_RE.findall(log) if a == arch}
    wanted = set(pattern_cuda.KERNELS) | set(nm_cuda.KERNELS) | set(pack_cuda.KERNELS)
    assert wanted <= compiled, f"launched but not compiled: {sorted(wanted - compiled)}"


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS, ids=ARCHS)
@NVCC_GROUP
def test_no_kernel_reads_and_writes_one_shared_word_between_barriers_in_its_machine_code(
    nvcc_logs, nvcc_root, arch
):
    """The hazard racecheck found on the H200 was in the machine code only (a load hoisted out
    of a one-thread branch): scan every kernel's SASS for that class (impl.cuda.sass_hazards)."""
    rc, log, _ = nvcc_logs[arch]
    assert rc == 0, log
    if sass_hazards.find_cuobjdump() is None:
        pytest.skip("no cuobjdump (CUDA toolkit, or the nvidia-cuda-cuobjdump/nvdisasm wheels)")
    cubins = sorted((nvcc_root / arch).glob("*.cubin"))
    assert len(cubins) == len(loader.SOURCES), cubins
    hazards, kernels = sass_hazards.file_hazards(cubins)
    compiled = {name for name, a in _ENTRY_RE.findall(log) if a == arch}
    assert kernels == len(compiled), (kernels, len(compiled))
    assert not hazards, "\n".join(map(str, hazards))


_SMEM_RE = re.compile(r"(\d+) bytes smem")


def _shared_memory(log: str) -> dict[str, int]:
    """{kernel: static shared memory bytes} from ``-Xptxas -v`` output (0 where none)."""
    out: dict[str, int] = {}
    current = None
    for line in log.splitlines():
        m = _ENTRY_RE.search(line)
        if m:
            current = m.group(1)
            out.setdefault(current, 0)
            continue
        m = _SMEM_RE.search(line)
        if m and current is not None:
            out[current] = int(m.group(1))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS, ids=ARCHS)
@NVCC_GROUP
def test_racecheck_fallback_lists_the_families_with_shared_memory(nvcc_logs, arch):
    # scripts/gpu/sanitizer_coverage.py asks racecheck for these families where no
    # kernels.json exists: they must be exactly those ptxas gives shared memory.
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts" / "gpu"))
    import sanitizer_coverage as cov

    rc, log, _ = nvcc_logs[arch]
    assert rc == 0, log
    launched = set(pattern_cuda.KERNELS) | set(nm_cuda.KERNELS) | set(pack_cuda.KERNELS)
    smem = _shared_memory(log)
    shared = {cov.family(k) for k, b in smem.items() if b > 0 and k in launched}
    assert shared == set(cov.SHARED_MEMORY_FAMILIES)


@pytest.mark.slow
@NVCC_GROUP
def test_no_float32_comparison_or_narrowing_flushes_a_denormal(nvcc_logs, nvcc_root):
    """Compiled as CuPy compiles (-ftz=true), a float32 comparison becomes ``setp.*.ftz``,
    which takes a positive denormal for zero: the N:M rescale's "kept sum > 0" did so, and
    with eps 0 a plane whose kept sum was denormal got the ratio 0 where the reference gives
    sx / sy. Likewise a cast of a double to float becomes ``cvt.rn.ftz.f32.f64``, which
    flushed a denormal float32 eps to 0 where torch adds it. The sources compare such values
    from their bits (``pdt_positive``) and narrow by ``pdt_double_to_float_rn``: the PTX of
    every source holds no flushing comparison or narrowing (the PTX kept from the
    :data:`PTX_ARCH` compile, the PTX its cubins come from)."""
    rc, log, _ = nvcc_logs[PTX_ARCH]
    assert rc == 0, log
    ptx = {p.name: p.read_text() for p in (nvcc_root / "keep").glob("*.ptx")}
    assert sorted(ptx) == sorted(Path(s).stem + ".ptx" for s in loader.SOURCES)
    assert all("pdt_" in text for text in ptx.values())
    flush = r"(?:setp\.\w+\.ftz\.f32|cvt\.\w+\.ftz\.f32\.f64)[^;]*;"
    flushing = {name: re.findall(flush, text) for name, text in ptx.items()}
    assert not any(flushing.values()), flushing


#: A PTX instruction that reads or writes memory, waits on other threads, or uses a loaded
#: value in a multiply-add (so that a run of loads ends where arithmetic on them begins).
_MEM_OP_RE = re.compile(r"^\s*(?:@!?%p\d+\s+)?((?:ld|st|cp|bar|redux|fma)\.[\w.]+)", re.MULTILINE)


def _entry_ptx(ptx: str, entry: str) -> str:
    """The PTX text of one ``.entry`` (from its header to the next entry's)."""
    start = ptx.index(f".entry {entry}(")
    end = ptx.find(".entry ", start + 1)
    return ptx[start : end if end >= 0 else len(ptx)]


def _load_runs(body: str) -> list[tuple[list[str], str]]:
    """The runs of consecutive global loads of a PTX body, each with the memory operation that
    ends it (``""`` at the end of the body)."""
    runs: list[tuple[list[str], str]] = []
    run: list[str] = []
    for op in _MEM_OP_RE.findall(body):
        if op.startswith("ld.global"):
            run.append(op)
            continue
        if run:
            runs.append((run, op))
        run = []
    if run:
        runs.append((run, ""))
    return runs


def _most_loads(ptx: str, entry: str, end: str, load: str | None = None) -> int:
    """The most global loads (of kind ``load``, or of any kind) in one run of ``entry``'s
    loads that ends at a memory operation starting with ``end`` (``""``: any run)."""
    return max(
        (
            sum(load is None or op == load for op in run)
            for run, stop in _load_runs(_entry_ptx(ptx, entry))
            if stop.startswith(end)
        ),
        default=0,
    )


def test_load_runs_reads_ptx():
    body = (
        "ld.global.nc.v4.f32 {%f1, %f2, %f3, %f4}, [%rd1];\n"
        "@%p1 ld.global.nc.v4.f32 {%f5, %f6, %f7, %f8}, [%rd2];\n"
        "add.s32 %r1, %r2, 1;\n"
        "st.shared.v4.f32 [%r3], {%f1, %f2, %f3, %f4};\n"
        "ld.global.nc.f32 %f9, [%rd3];\n"
        "bar.sync 0;\n"
        "ld.global.nc.f32 %f10, [%rd4];\n"
        "fma.rn.f32 %f11, %f10, %f9, %f11;\n"
    )
    assert _load_runs(body) == [
        (["ld.global.nc.v4.f32"] * 2, "st.shared.v4.f32"),
        (["ld.global.nc.f32"], "bar.sync"),
        (["ld.global.nc.f32"], "fma.rn.f32"),
    ]


@pytest.mark.slow
@NVCC_GROUP
def test_staging_and_gather_loads_are_in_flight_together(nvcc_logs, nvcc_root):
    """The SpMM kernels stage B's K-step with several 16-byte loads a thread in flight before
    the thread's stores to shared memory (``PDT_STAGE_LB``: 64 bytes, four vectors), the
    row-tiled kernels load every row's value of a K-step before they use any, the SDDMM
    kernels four vectors of a kept column's row at a time, the implicit conv the pixels of four
    nonzeros, and the CSR
    gather and scatter, pack, unpack and expand kernels load four entries a thread before
    they store them. With one load,
    one store, then the next load, each vector waits a full memory latency: a step of the
    row-tiled SpMM waited eight in a row for B and eight for the values (docs/kernels.md,
    "Loads in flight"). Read from the PTX the cubins come from: the longest run of B-vector
    loads (or of the pack kernels' loads) that ends at a store, and the most value loads in
    one run of loads."""
    rc, log, _ = nvcc_logs[PTX_ARCH]
    assert rc == 0, log
    ptx = (nvcc_root / "keep" / "pattern.ptx").read_text()
    vec_load = {"f32": "ld.global.nc.v4.f32", "f64": "ld.global.nc.v2.f64"}
    stage = {
        name: _most_loads(ptx, name, "st.shared", vec_load[suf])
        for suf in ("f32", "f64")
        for name in (f"pdt_spmm_{suf}_vec", f"pdt_spmm_tiled_{suf}_vec")
    }
    assert all(n >= 4 for n in stage.values()), stage
    # the SDDMM's loads of a kept column's row of Bm (3a as 3d): four vectors in flight
    sddmm = {
        name: _most_loads(ptx, name, "", vec_load[suf])
        for suf in ("f32", "f64")
        for name in (f"pdt_sddmm_{suf}_vec", f"pdt_sddmm_tiled_{suf}_vec")
    }
    assert all(n >= 4 for n in sddmm.values()), sddmm
    rows_per_warp = {
        "f32": loader.DEFINES["PDT_SPMM_RW_F32"],
        "f64": loader.DEFINES["PDT_SPMM_RW_F64"],
    }
    gather = {
        name: (_most_loads(ptx, name, "", f"ld.global.nc.{suf}"), rows_per_warp[suf])
        for suf in ("f32", "f64")
        for name in (
            f"pdt_spmm_tiled_{suf}_vec",
            f"pdt_spmm_piped_{suf}_vec",
            f"pdt_conv_implicit_tiled_{suf}",
        )
    }
    assert all(n >= rw for n, rw in gather.values()), gather
    # the pipelined SpMM's gather of step s loads before the wait for step s's copies
    for suf in ("f32", "f64"):
        ops = _MEM_OP_RE.findall(_entry_ptx(ptx, f"pdt_spmm_piped_{suf}_vec"))
        rw, value = rows_per_warp[suf], f"ld.global.nc.{suf}"
        first_wait = ops.index(next(op for op in ops if op.startswith("cp.async.wait_group")))
        assert ops[:first_wait].count(value) >= rw, (suf, ops[first_wait - 8 : first_wait + 8])
    # the implicit conv (3b): the input pixels of PDT_CONV_U = 4 nonzeros (CPT = 4 each)
    conv = {
        name: _most_loads(ptx, name, "", f"ld.global.nc.{suf}")
        for suf in ("f32", "f64")
        for name in (f"pdt_conv_implicit_{suf}",)
    }
    assert all(n >= 8 for n in conv.values()), conv
    # four (index, value) pairs a thread in flight before its stores, to the shared tile
    # (expand) or to global memory (pack, unpack, and the CSR gather and scatter)
    pack_ptx = (nvcc_root / "keep" / "pack.ptx").read_text()
    moves = {
        name: _most_loads(pack_ptx, name, end)
        for suf in ("b1_i32", "b2_i64", "b4_i32", "b8_i64")
        for name, end in (
            (f"pdt_expand_{suf}", "st.shared"),
            (f"pdt_pack_{suf}", "st.global"),
            (f"pdt_unpack_{suf}", "st.global"),
        )
    }
    moves |= {
        name: _most_loads(ptx, name, "st.global")
        for suf in ("f32", "f64")
        for name in (f"pdt_csr_gather_{suf}", f"pdt_csr_scatter_{suf}")
    }
    assert all(n >= 8 for n in moves.values()), moves


def test_shared_memory_parse():
    log = (
        "ptxas info    : Compiling entry function 'k1' for 'sm_90'\n"
        "ptxas info    : Used 71 registers, used 1 barriers, 37960 bytes smem\n"
        "ptxas info    : Compiling entry function 'k2' for 'sm_90'\n"
        "ptxas info    : Used 12 registers, used 0 barriers\n"
    )
    assert _shared_memory(log) == {"k1": 37960, "k2": 0}


def test_parse_ptxas_reads_spills():
    log = (
        "ptxas info    : Compiling entry function 'k1' for 'sm_80'\n"
        "ptxas info    : Function properties for k1\n"
        "    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n"
        "ptxas info    : Compiling entry function 'k2' for 'sm_80'\n"
        "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
    )
    assert _parse_ptxas(log) == {"k1": (8, 4, 12), "k2": (0, 0, 0)}


def test_nvcc_command_uses_the_loader_options(tmp_path):
    cmd = loader.nvcc_command(["a.cu"], "sm_90", tmp_path)
    for opt in loader.compile_options():
        assert opt in cmd
    assert "-arch=sm_90" in cmd and "-cubin" in cmd and cmd[-1] == "a.cu"
    assert "-ftz=true" in cmd  # what CuPy adds at run time
    assert not any("fast-math" in c or "fast_math" in c for c in cmd)


def test_nvcc_command_writes_cubins_where_asked_with_the_kernel_headers_and_ptxas_report(
    tmp_path,
):
    cmd = loader.nvcc_command(["x.cu", "y.cu"], "sm_80", tmp_path / "out", nvcc="/opt/nvcc")
    assert cmd[0] == "/opt/nvcc" and cmd[-2:] == ["x.cu", "y.cu"]
    assert f"-I{loader.KERNEL_DIR}" in cmd
    assert cmd[cmd.index("-odir") + 1] == str(tmp_path / "out")
    assert cmd[cmd.index("-Xptxas") + 1] == "-v"
    if NVCC is None:
        pytest.skip("nvcc is not on the PATH")
    # A kernel that needs the kernel directory on the include path and a loader define.
    src = tmp_path / "probe.cu"
    src.write_text(
        '#include "pdt_common.cuh"\n'
        'extern "C" __global__ void pdt_probe(int* x) { x[threadIdx.x] = PDT_NM_BLOCK; }\n'
    )
    (tmp_path / "out").mkdir()
    res = subprocess.run(
        loader.nvcc_command([src], "sm_80", tmp_path / "out", nvcc=NVCC),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert (tmp_path / "out" / "probe.cubin").is_file()
    assert _parse_ptxas(res.stdout + res.stderr) == {"pdt_probe": (0, 0, 0)}


def test_header_defaults_equal_the_loader_defines():
    """The kernels' #define defaults and the host's launch constants are the same numbers."""
    text = (loader.KERNEL_DIR / "pdt_common.cuh").read_text()
    defaults = {k: int(v) for k, v in re.findall(r"#define (PDT_[A-Z0-9_]+) (\d+)\b", text)}
    for key, value in loader.DEFINES.items():
        assert defaults.get(key) == value, f"{key}: header {defaults.get(key)}, loader {value}"


def test_every_source_is_listed_and_self_contained():
    on_disk = sorted(p.name for p in loader.KERNEL_DIR.glob("*.cu"))
    assert sorted(loader.SOURCES) == on_disk
    for src in loader.SOURCES:
        text = loader.expand_source(src)
        # NVRTC has no system headers: only pasted local headers, no <...> includes.
        assert not re.search(r"^\s*#\s*include", text, re.M), src
        assert 'extern "C"' in text


# -- NVRTC (the loader's own compile path) ----------------------------------------------------


NVRTC_GROUP = pytest.mark.xdist_group("nvrtc-compile")


@pytest.fixture(scope="module")
def nvrtc_cubins(tmp_path_factory) -> list[Path]:
    """The loader's sources compiled once by NVRTC for sm_90, as CuPy compiles them there:
    ``<stem>.cubin`` with NVRTC's log beside it (``<stem>.log``)."""
    if nvrtc.find_library() is None:
        pytest.skip("no libnvrtc found (set PDT_NVRTC_LIB, or install nvidia-cuda-nvrtc)")
    return nvrtc.compile_loader_sources("sm_90", tmp_path_factory.mktemp("nvrtc"))


@pytest.mark.slow
@NVRTC_GROUP
def test_nvrtc_compiles_the_expanded_sources_with_the_loader_options(nvrtc_cubins):
    assert [p.stem for p in nvrtc_cubins] == [Path(s).stem for s in loader.SOURCES]
    for cubin in nvrtc_cubins:
        assert cubin.stat().st_size > 0, cubin
        log = cubin.with_suffix(".log").read_text()
        assert "warning" not in log.lower(), f"NVRTC warnings on {cubin.stem}:\n{log}"


@pytest.mark.slow
@NVRTC_GROUP
def test_no_kernel_nvrtc_compiles_reads_and_writes_one_shared_word_between_barriers(nvrtc_cubins):
    """The scan of nvcc's cubins, on the code NVRTC makes from the loader's sources: the
    compiler the kernels are built with at run time (its machine code differs from nvcc's
    in places, as the H200's did)."""
    if sass_hazards.find_cuobjdump() is None:
        pytest.skip("no cuobjdump (CUDA toolkit, or the nvidia-cuda-cuobjdump/nvdisasm wheels)")
    hazards, kernels = sass_hazards.file_hazards(nvrtc_cubins)
    launched = set(pattern_cuda.KERNELS) | set(nm_cuda.KERNELS) | set(pack_cuda.KERNELS)
    assert not hazards, "\n".join(map(str, hazards))
    assert kernels >= len(launched), kernels  # every kernel read
