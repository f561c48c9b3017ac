"""The machine-code scan for shared-memory hazards (impl.cuda.sass_hazards), on SASS text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from impl.cuda import sass_hazards as sh

# The SASS nvcc 13.0 makes for sm_90 of pdt_spmm_f32_vec at f6084ab (cuobjdump -sass), the
# instructions around the two offsets the H200's racecheck reported (+0x2b0 read, +0x2e0
# write): every thread loads the mask word, thread 0 stores to it, no barrier between.
HOISTED = """
\t\tFunction : pdt_spmm_f32_vec
\t.headerflags\t@"EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0260*/                   S2UR UR10, SR_CgaCtaId ;                /* 0x0000000000 */
        /*0270*/                   UMOV UR7, 0x400 ;                       /* 0x0000040000 */
        /*0280*/                   UIADD3 UR5, UR4, 0x20, URZ ;            /* 0x0000002004 */
        /*0290*/                   BSSY B0, 0x410 ;                        /* 0x0000017000 */
        /*02a0*/                   ULEA UR11, UR10, UR7, 0x18 ;            /* 0x000000070a */
        /*02b0*/                   LDS R3, [UR11+0x8000] ;                 /* 0x00800000ff */
        /*02c0*/                   ISETP.NE.AND P1, PT, R3, RZ, PT ;       /* 0x000000ff03 */
        /*02d0*/                   ISETP.NE.OR P1, PT, R0, RZ, !P1 ;       /* 0x000000ff00 */
        /*02e0*/              @!P1 STS [UR11+0x8000], RZ ;                 /* 0x008000ffff */
        /*02f0*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;           /* 0x0000000000 */
"""


def _kernel(*lines: str, name: str = "k") -> str:
    body = "\n".join(f"        /*{16 * i:04x}*/   {line} ;" for i, line in enumerate(lines))
    return f"\t\tFunction : {name}\n{body}\n"


def test_finds_the_hoisted_load_racecheck_reported_on_the_h200():
    (hazard,) = sh.sass_hazards(HOISTED)
    assert hazard.kernel == "pdt_spmm_f32_vec"
    assert hazard.address == "UR11+0x8000"
    assert (hazard.first.offset, hazard.first.opcode, hazard.first.predicate) == (0x2B0, "LDS", "")
    assert (hazard.second.offset, hazard.second.opcode, hazard.second.predicate) == (
        0x2E0,
        "STS",
        "@!P1",
    )
    assert str(hazard) == (
        "pdt_spmm_f32_vec: +0x2b0 LDS [UR11+0x8000] and +0x2e0 @!P1 STS [UR11+0x8000], "
        "no barrier between"
    )


def test_a_block_barrier_between_the_accesses_orders_them():
    fixed = HOISTED.replace("ISETP.NE.OR P1", "BAR.SYNC.DEFER_BLOCKING 0x0 ;  ISETP.NE.OR P1")
    assert sh.sass_hazards(fixed) == []
    for barrier in ("BAR.SYNC 0x0", "BAR.RED.POPC R2, 0x0, P0"):
        text = _kernel("LDS R3, [UR4+0x10]", barrier, "@!P1 STS [UR4+0x10], RZ")
        assert sh.sass_hazards(text) == []
    # an arrival alone does not wait for the others; a warp barrier does not order warps
    for not_a_barrier in ("BAR.ARV 0x1, 0x40", "WARPSYNC 0xffffffff", "NOP"):
        text = _kernel("LDS R3, [UR4+0x10]", not_a_barrier, "@!P1 STS [UR4+0x10], RZ")
        assert len(sh.sass_hazards(text)) == 1, not_a_barrier


@pytest.mark.parametrize(
    ("first", "second", "expected"),
    [
        ("LDS R3, [UR4+0x10]", "@P0 STS [UR4+0x10], R2", 1),  # read by all, write by some
        ("@P0 STS [UR4+0x10], R2", "LDS R3, [UR4+0x10]", 1),  # write by some, read by all
        ("LDS R3, [UR4+0x10]", "@P0 ATOMS.OR RZ, [UR4+0x10], R2", 1),  # an atomic writes
        ("LDS.U8 R3, [UR4+0x10]", "LDGSTS.E.BYPASS.128 [UR4+0x10], desc[UR6][R8.64]", 1),
        ("@P0 STS [UR4+0x10], R2", "@!P0 STS [UR4+0x10], R5", 1),  # two groups of writers
        ("@P0 LDS R3, [UR4+0x10]", "@P0 STS [UR4+0x10], R2", 0),  # one guard: maybe one thread
        ("STS [UR4+0x10], R2", "STS [UR4+0x10], R5", 0),  # every thread, each store the same
        ("@!P1 ATOMS.OR RZ, [UR4], R2", "@P1 ATOMS.OR RZ, [UR4], R3", 0),  # atomics do not race
        ("LDS R3, [UR4+0x10]", "LDSM.16.M88.4 R8, [UR4+0x10]", 0),  # reads only
        ("LDS R3, [UR4+0x10]", "@P0 STS [UR4+0x14], R2", 0),  # another word
        ("LDS R3, [R5+0x10]", "@P0 STS [R5+0x10], R2", 0),  # per-thread address: not judged
        ("LDS R3, [UR4+0x10]", "@P0 STG.E [R4.64], R2", 0),  # global memory: not shared
    ],
)
def test_which_pairs_of_accesses_to_one_uniform_address_are_hazards(first, second, expected):
    assert len(sh.sass_hazards(_kernel(first, "IADD3 R7, R7, 0x1, RZ", second))) == expected


def test_an_address_register_written_between_names_another_address():
    moved = _kernel("LDS R3, [UR4+0x10]", "UIADD3 UR4, UR4, 0x100, URZ", "@P0 STS [UR4+0x10], R2")
    assert sh.sass_hazards(moved) == []
    # writing another register, or storing through one, leaves the address as it was
    kept = _kernel("LDS R3, [UR4+0x10]", "UIADD3 UR5, UR4, 0x100, URZ", "STS [UR5], R2",
                   "@P0 STS [UR4+0x10], R2")  # fmt: skip
    assert len(sh.sass_hazards(kept)) == 1


def test_a_branch_joins_the_code_before_it_to_the_code_at_its_target():
    # +0x10 reads the word at the loop's head; +0x30 writes it at the tail, the branch at
    # +0x40 goes back to +0x10 with no barrier on the way: the next iteration's read races
    loop = ("BAR.SYNC 0x0", "LDS R3, [UR4+0x10]", "BAR.SYNC 0x0", "@!P1 STS [UR4+0x10], RZ")
    (hazard,) = sh.sass_hazards(_kernel(*loop, "BRA 0x10"))
    assert (hazard.first.offset, hazard.second.offset) == (0x30, 0x10)
    assert sh.sass_hazards(_kernel(*loop, "BAR.SYNC 0x0", "BRA 0x10")) == []  # closed by one
    assert sh.sass_hazards(_kernel(*loop, "BRA 0x60", "NOP", "NOP")) == []  # to no access
    # a branch over the barrier: the path that takes it has none between the two
    skip = ("LDS R3, [UR4+0x10]", "@P0 BRA 0x30", "BAR.SYNC 0x0", "@!P1 STS [UR4+0x10], RZ")
    (hazard,) = sh.sass_hazards(_kernel(*skip))
    assert (hazard.first.offset, hazard.second.offset) == (0x0, 0x30)
    assert sh.sass_hazards(_kernel(*skip[:1], "@P0 BRA 0x20", *skip[2:])) == []  # onto it
    # a loop with no barrier at all: a write and a read of one iteration already pair, once
    (hazard,) = sh.sass_hazards(_kernel("LDS R3, [UR4]", "@!P1 STS [UR4], RZ", "BRA 0x0"))
    assert (hazard.first.offset, hazard.second.offset) == (0x0, 0x10)


def test_kernels_are_scanned_apart_and_in_address_order():
    text = _kernel("LDS R3, [UR4+0x10]", name="a") + _kernel("@P0 STS [UR4+0x10], R2", name="b")
    kernels = sh.parse_sass(text)
    assert list(kernels) == ["a", "b"]
    assert [i.opcode for i in kernels["a"]] == ["LDS"]
    assert sh.sass_hazards(text) == []
    assert [h.kernel for h in sh.sass_hazards(text + _kernel("LDS R1, [UR9]", "@P2 STS [UR9], R1",
                                                             name="c"))] == ["c"]  # fmt: skip


def test_the_command_exits_1_on_a_hazard_0_without_and_2_on_bad_input(
    tmp_path, capsys, monkeypatch
):
    bad, good = tmp_path / "bad.sass", tmp_path / "good.sass"
    bad.write_text(HOISTED)
    good.write_text(HOISTED.replace("@!P1 STS", "@!P1 STG.E"))
    assert sh.main([str(bad), str(good)]) == 1
    out = capsys.readouterr().out
    assert "pdt_spmm_f32_vec: +0x2b0 LDS" in out and "1 hazard(s) in 2 kernel(s)" in out
    assert sh.main([str(good)]) == 0
    assert "0 hazard(s) in 1 kernel(s)" in capsys.readouterr().out
    assert sh.main([str(tmp_path / "missing.sass")]) == 2
    assert sh.main([]) == 2
    monkeypatch.setattr(sh, "find_cuobjdump", lambda: None)
    assert sh.main([str(tmp_path / "x.cubin")]) == 2
    assert "no cuobjdump" in capsys.readouterr().err


def test_find_cuobjdump_takes_the_environment_first(monkeypatch, tmp_path):
    monkeypatch.setenv("CUOBJDUMP", "/opt/cuda/bin/cuobjdump")
    assert sh.find_cuobjdump() == "/opt/cuda/bin/cuobjdump"
    monkeypatch.delenv("CUOBJDUMP")
    monkeypatch.setenv("PATH", str(tmp_path))
    wheel = tmp_path / "site" / "nvidia" / "cu13" / "bin" / "cuobjdump"
    wheel.parent.mkdir(parents=True)
    wheel.write_text("#!/bin/sh\necho '\t\tFunction : k'\n")
    wheel.chmod(0o755)
    monkeypatch.setattr("sys.path", [str(tmp_path / "site")])
    assert sh.find_cuobjdump() == str(wheel)
    assert sh.parse_sass(sh.disassemble(tmp_path / "k.cubin")) == {"k": []}
    wheel.write_text("#!/bin/sh\necho broken >&2\nexit 3\n")
    with pytest.raises(RuntimeError, match="broken"):
        sh.disassemble(tmp_path / "k.cubin")
    triton = tmp_path / "t" / "triton" / "backends" / "nvidia" / "bin" / "cuobjdump"
    triton.parent.mkdir(parents=True)
    triton.write_text("#!/bin/sh\n")
    triton.chmod(0o755)
    monkeypatch.setattr("sys.path", [str(tmp_path / "t")])
    assert sh.find_cuobjdump() == str(triton)
    triton.chmod(0o644)  # not executable: not taken
    assert sh.find_cuobjdump() is None
    monkeypatch.setattr("sys.path", [])
    assert sh.find_cuobjdump() is None


def test_the_command_writes_its_result_as_json(tmp_path, capsys):
    bad = tmp_path / "bad.sass"
    bad.write_text(HOISTED)
    out = tmp_path / "out" / "scan.json"
    assert sh.main([str(bad), "--json", str(out)]) == 1
    report = json.loads(out.read_text())
    assert report["files"] == [str(bad)]
    assert report["kernels"] == 1
    assert report["hazards"] == [str(sh.sass_hazards(HOISTED)[0])]
    assert "nvrtc" not in report


def test_the_command_scans_the_loader_sources_nvrtc_compiles(tmp_path, monkeypatch, capsys):
    """--nvrtc ARCH compiles the loader's sources for ARCH (here a stand-in that writes SASS
    text) and scans what it wrote, with the compiler's library, version and options."""
    from impl.cuda import nvrtc

    calls = []

    def fake_compile(arch, out_dir, library=None):
        calls.append((arch, library))
        path = Path(out_dir) / "pattern.sass"
        path.write_text(HOISTED)
        return [path]

    monkeypatch.setattr(nvrtc, "compile_loader_sources", fake_compile)
    monkeypatch.setattr(nvrtc, "find_library", lambda: "/opt/nvrtc/libnvrtc.so.13")
    monkeypatch.setattr(nvrtc, "load", lambda library=None: library)
    monkeypatch.setattr(nvrtc, "version", lambda lib: (13, 0))
    good = tmp_path / "good.sass"
    good.write_text(HOISTED.replace("@!P1 STS", "@!P1 STG.E"))
    out = tmp_path / "scan.json"
    assert sh.main(["--nvrtc", "sm_90", str(good), "--json", str(out)]) == 1
    assert calls == [("sm_90", "/opt/nvrtc/libnvrtc.so.13")]
    assert "1 hazard(s) in 2 kernel(s)" in capsys.readouterr().out
    report = json.loads(out.read_text())
    assert report["nvrtc"]["arch"] == "sm_90"
    assert report["nvrtc"]["library"] == "/opt/nvrtc/libnvrtc.so.13"
    assert report["nvrtc"]["version"] == "13.0"
    assert report["nvrtc"]["options"][-1] == "-arch=sm_90"
    assert report["kernels"] == 2 and len(report["hazards"]) == 1
    # a malformed architecture, or no library at all, is a usage error
    assert sh.main(["--nvrtc", "90"]) == 2
    assert "arch must look like 'sm_90'" in capsys.readouterr().err
    monkeypatch.undo()
    monkeypatch.setattr(nvrtc, "find_library", lambda: None)
    assert sh.main(["--nvrtc", "sm_90"]) == 2
    assert "no libnvrtc found" in capsys.readouterr().err
