"""NVRTC through ctypes (impl.cuda.nvrtc): finding the library, the options CuPy gives it,
compiling a program to a cubin, and reading which library a process has loaded."""

from __future__ import annotations

from pathlib import Path

import pytest

from impl.cuda import loader, nvrtc

PROBE = 'extern "C" __global__ void pdt_probe(float *x) { x[threadIdx.x] += 1.0f; }\n'


def test_loader_options_are_the_loaders_then_cupys_then_the_arch():
    opts = nvrtc.loader_options("sm_80")
    assert opts == [*loader.compile_options(), *loader.CUPY_NVRTC_OPTIONS, "-arch=sm_80"]
    assert nvrtc.loader_options("sm_90a")[-1] == "-arch=sm_90a"
    for bad in ("90", "sm90", "compute_90", "sm_90 -G"):
        with pytest.raises(ValueError, match="sm_90"):
            nvrtc.loader_options(bad)


def test_find_library_takes_the_environment_first(monkeypatch):
    monkeypatch.setenv("PDT_NVRTC_LIB", "/opt/cuda/lib64/libnvrtc.so.13")
    assert nvrtc.find_library() == "/opt/cuda/lib64/libnvrtc.so.13"


def test_find_library_skips_the_builtins_and_what_does_not_load(monkeypatch, tmp_path):
    monkeypatch.delenv("PDT_NVRTC_LIB", raising=False)
    monkeypatch.setattr(nvrtc.ctypes.util, "find_library", lambda name: None)
    lib = tmp_path / "nvidia" / "cu13" / "lib"
    lib.mkdir(parents=True)
    (lib / "libnvrtc-builtins.so.13").write_text("")
    (lib / "libnvrtc.so.13").write_text("not a library")
    monkeypatch.setattr(nvrtc.sys, "prefix", str(tmp_path))
    monkeypatch.setattr(nvrtc.sys, "path", [])
    real_glob = nvrtc.glob.glob  # (a toolkit's /usr/local/cuda* left out)
    monkeypatch.setattr(nvrtc.glob, "glob", lambda p: [] if p.startswith("/usr") else real_glob(p))
    assert nvrtc.find_library() is None
    loaded = []
    monkeypatch.setattr(nvrtc.ctypes, "CDLL", lambda path, **kw: loaded.append(path))
    assert nvrtc.find_library() == str(lib / "libnvrtc.so.13")
    assert loaded == [str(lib / "libnvrtc.so.13")]


def test_load_without_a_library_says_where_to_get_one(monkeypatch):
    monkeypatch.setattr(nvrtc, "find_library", lambda: None)
    with pytest.raises(FileNotFoundError, match="PDT_NVRTC_LIB"):
        nvrtc.load()


def test_loaded_library_reads_the_process_maps(tmp_path):
    maps = tmp_path / "maps"
    lib = "/site/nvidia/cu13/lib/libnvrtc.so.13"
    maps.write_text(
        "7f00-7f01 r--p 00000000 08:01 1 /usr/lib/libc.so.6\n"
        "7f02-7f03 r--p 00000000 08:01 2 /site/nvidia/cu13/lib/libnvrtc-builtins.so.13.0\n"
        f"7f04-7f05 r-xp 00000000 08:01 3 {lib}\n"
        "7f06-7f07 rw-p 00000000 00:00 0\n"
    )
    assert nvrtc.loaded_library(maps) == lib
    maps.write_text("7f00-7f01 r--p 00000000 08:01 1 /usr/lib/libc.so.6\n")
    assert nvrtc.loaded_library(maps) is None
    assert nvrtc.loaded_library(tmp_path / "missing") is None


@pytest.fixture(scope="module")
def lib():
    if nvrtc.find_library() is None:
        pytest.skip("no libnvrtc found (set PDT_NVRTC_LIB, or install nvidia-cuda-nvrtc)")
    return nvrtc.load()


def test_the_loaded_library_is_found_in_this_process_maps(lib):
    loaded = nvrtc.loaded_library()
    assert loaded is not None and Path(loaded).name.startswith("libnvrtc.so")
    assert Path(loaded).is_file()  # a path from the maps, not a bare name


def test_compile_program_returns_a_cubin_or_the_log_of_the_error(lib):
    major, minor = nvrtc.version(lib)
    assert major >= 11 and minor >= 0
    done = nvrtc.compile_program(lib, PROBE, "probe.cu", ["-arch=sm_80"])
    assert done.status == 0, done.log
    assert done.cubin is not None and done.cubin[:4] == b"\x7fELF"
    assert nvrtc.compile_program(lib, PROBE, "probe.cu", ["-arch=sm_80"], cubin=False).cubin is None
    broken = nvrtc.compile_program(lib, PROBE.replace("+=", "+= undeclared +"), "b.cu", [])
    assert broken.status != 0 and broken.cubin is None
    assert "undeclared" in broken.log


def test_compile_loader_sources_raises_with_the_log_on_an_error(lib, tmp_path, monkeypatch):
    monkeypatch.setattr(loader, "SOURCES", ("probe.cu",))
    monkeypatch.setattr(loader, "expand_source", lambda name: PROBE.replace("1.0f", "oops"))
    with pytest.raises(RuntimeError, match=r"NVRTC failed on probe\.cu for sm_80:\n.*oops"):
        nvrtc.compile_loader_sources("sm_80", tmp_path)
    monkeypatch.setattr(loader, "expand_source", lambda name: PROBE)
    (cubin,) = nvrtc.compile_loader_sources("sm_80", tmp_path / "out")
    assert cubin == tmp_path / "out" / "probe.cubin"
    assert cubin.read_bytes()[:4] == b"\x7fELF"
    assert cubin.with_suffix(".log").read_text() == ""
