"""The compiled CPU kernel of N:M pruning (impl/cpu/nm_prune.c via impl.ops.nm_cpu) against
the torch reference that defines the op (SDGP Sec. III-A, III-B)."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch

from impl.methods.sdgp import SDGPConv2d
from impl.ops import cpu_kernels, nm_cpu
from impl.ops.nm import nm_prune, nm_prune_ref

needs_kernel = pytest.mark.skipif(
    not nm_cpu.is_available(), reason=f"compiled CPU kernel: {nm_cpu.unavailable_reason()}"
)

CASES = [  # (shape, dim, n, m)
    ((3, 12, 5, 7), 1, 2, 4),
    ((3, 12, 5, 7), 1, 3, 6),
    ((2, 16, 3, 5), 1, 2, 8),
    ((2, 32, 3, 3), 1, 4, 32),
    ((2, 32, 3, 3), 1, 16, 32),
    ((2, 13, 3, 5), 1, 2, 4),  # partial last group of 1
    ((2, 10, 3, 5), 1, 3, 4),  # partial last group of 2
    ((2, 5, 2, 2), 1, 2, 32),  # one partial group only
    ((4, 64, 4, 4), 1, 8, 16),
    ((9, 20), 0, 2, 4),  # grouping dim first: the plane rule is the channel rule
    ((5, 12, 3, 3), 2, 2, 4),  # grouping dim inside: the plane rule falls back
    ((6, 10), -1, 1, 4),  # last dim: one element per plane
]
IDS = [f"{'x'.join(map(str, s))}-d{d}-{n}of{m}" for s, d, n, m in CASES]


def _pair(x, n, m, method, dim, rule, seed=5):
    got = nm_prune(x, n, m, method, dim, rule, torch.Generator().manual_seed(seed), impl="cpu")
    want = nm_prune_ref(x, n, m, method, dim, rule, torch.Generator().manual_seed(seed))
    return got, want


@needs_kernel
@pytest.mark.parametrize(("shape", "dim", "n", "m"), CASES, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("method", ["magnitude", "random"])
def test_same_positions_and_bits_as_the_reference(shape, dim, n, m, dtype, method):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(sum(shape)), dtype=dtype)
    got, want = _pair(x, n, m, method, dim, "plane")
    assert torch.equal(got, want)


@needs_kernel
@pytest.mark.parametrize(("shape", "dim", "n", "m"), CASES, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("rule", ["plane", "channel"])
def test_rescaled_same_positions_values_to_the_last_bits(shape, dim, n, m, dtype, rule):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(sum(shape)), dtype=dtype)
    got, want = _pair(x, n, m, "rescaled", dim, rule)
    assert torch.equal(got != 0, want != 0)
    rtol = nm_cpu.RESCALE_RTOL if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(got, want, rtol=rtol, atol=0)


@needs_kernel
def test_where_it_applies_and_where_the_reference_runs():
    x = torch.randn(4, 8, 3, 3)
    args = (2, 4, "rescaled", 1, "plane", None, 1e-4)
    assert nm_cpu.nm_prune_cpu(x, *args) is not None
    assert nm_cpu.nm_prune_cpu(x.half(), *args) is None  # other dtypes: the reference
    assert nm_cpu.nm_prune_cpu(x, 2, 4, "rescaled", 2, "plane", None, 1e-4) is None
    assert nm_cpu.nm_prune_cpu(torch.randn(8), 2, 4, "rescaled", 0, "plane", None, 1e-4) is None
    x[1, 2, 0, 0] = math.nan  # a NaN magnitude: ranked by the reference (torch.sort order)
    assert nm_cpu.nm_prune_cpu(x, *args) is None
    assert nm_cpu.nm_prune_cpu(x, 2, 4, "magnitude", 1, "plane", None, 1e-4) is None
    for method in ("magnitude", "rescaled"):
        got = nm_prune(x, 2, 4, method, impl="cpu")
        assert torch.equal(got.isnan(), nm_prune_ref(x, 2, 4, method).isnan())
        assert torch.equal(got.nan_to_num(), nm_prune_ref(x, 2, 4, method).nan_to_num())
    # random ranks its own keys, so a NaN value is only carried
    got, want = _pair(x, 2, 4, "random", 1, "plane")
    assert torch.equal(got.nan_to_num(), want.nan_to_num()) and got.isnan().sum() <= 1
    half = torch.randn(2, 8, 3, 3).half()
    assert torch.equal(nm_prune(half, 2, 4, impl="cpu"), nm_prune_ref(half, 2, 4))


@needs_kernel
def test_ties_infinities_and_signed_zeros_as_the_reference():
    x = torch.tensor(
        [[1.0, 1.0, 1.0, 1.0, -0.0, 0.0, -0.0, 0.0, math.inf, -math.inf, 2.0, math.inf]]
    ).view(1, 12, 1)
    for method in ("magnitude", "rescaled"):
        got = nm_prune(x, 2, 4, method, impl="cpu")
        want = nm_prune_ref(x, 2, 4, method)
        assert torch.equal(got.isnan(), want.isnan())
        same = got.nan_to_num() == want.nan_to_num()
        assert bool(same.all())
        assert torch.equal(torch.signbit(got), torch.signbit(want))
    kept = nm_prune(x, 2, 4, "magnitude", impl="cpu").view(-1)
    assert kept[:4].tolist() == [1.0, 1.0, 0.0, 0.0]  # ties: the lowest index


@needs_kernel
def test_sums_channels_last_and_input_untouched():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 16, 5, 5, generator=gen)
    before = x.clone()
    out, l1_x, l1_y = nm_cpu.nm_prune_cpu(x, 2, 4, "rescaled", 1, "plane", None, 1e-4, True)
    assert torch.equal(x, before)
    assert l1_x.dtype == torch.float64
    torch.testing.assert_close(l1_x, x.abs().sum(dtype=torch.float64), rtol=1e-12, atol=0)
    torch.testing.assert_close(l1_y, out.abs().sum(dtype=torch.float64), rtol=1e-12, atol=0)
    cl = x.contiguous(memory_format=torch.channels_last)
    got = nm_prune(cl, 2, 4, "rescaled", impl="cpu")
    assert got.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(got, nm_prune(x, 2, 4, "rescaled", impl="cpu"))


@needs_kernel
def test_sdgp_conv_prunes_cpu_gradients_with_the_kernel_and_ref_opts_out(monkeypatch):
    conv = torch.nn.Conv2d(4, 16, 3, padding=1)
    x = torch.randn(3, 4, 6, 6, requires_grad=True)
    original, seen = nm_cpu.nm_prune_cpu, []
    monkeypatch.setattr(nm_cpu, "nm_prune_cpu", lambda *a, **k: seen.append(1) or original(*a, **k))
    grads = {}
    for impl in ("auto", "ref"):
        layer = SDGPConv2d.from_conv(conv, 2, 4, "magnitude")
        layer.prune_impl = impl
        seen.clear()
        (g,) = torch.autograd.grad(layer(x).square().sum(), x)
        grads[impl] = (g, layer.l1_ratio(), len(seen))
    assert grads["auto"][2] == 1 and grads["ref"][2] == 0
    assert torch.equal(grads["auto"][0], grads["ref"][0])  # magnitude: the same bits
    assert grads["auto"][1] == pytest.approx(grads["ref"][1], rel=1e-12)
    assert 0 < grads["auto"][1] < 1


def test_turned_off_or_unbuildable_runs_the_reference(monkeypatch, tmp_path):
    x = torch.randn(2, 8, 3, 3)
    monkeypatch.setenv("PDT_CPU_KERNELS", "0")
    assert not nm_cpu.is_available()
    assert "PDT_CPU_KERNELS=0" in nm_cpu.unavailable_reason()
    assert nm_cpu.nm_prune_cpu(x, 2, 4, "rescaled", 1, "plane", None, 1e-4) is None
    assert torch.equal(nm_prune(x, 2, 4), nm_prune_ref(x, 2, 4))
    with pytest.raises(RuntimeError, match="compiled CPU path of nm_prune is not available"):
        nm_prune(x, 2, 4, impl="cpu")
    monkeypatch.setenv("CC", "false")  # a compiler that always fails
    with pytest.raises(RuntimeError, match="failed"):
        nm_cpu.build(tmp_path)
    assert list(tmp_path.iterdir()) == []  # no partial library left behind


@pytest.mark.skipif(nm_cpu.compiler() is None, reason="no C compiler")
def test_build_is_cached_by_source_compiler_and_flags(tmp_path, monkeypatch):
    monkeypatch.delenv("CC", raising=False)
    first = nm_cpu.build(tmp_path)
    assert first.parent == tmp_path and first.name.startswith("nm_prune-")
    stamp = first.stat().st_mtime_ns
    assert nm_cpu.build(tmp_path) == first and first.stat().st_mtime_ns == stamp
    assert nm_cpu.library_name("some-other-cc") != first.name
    monkeypatch.setenv("PDT_CPU_KERNEL_CACHE", str(tmp_path / "elsewhere"))
    assert nm_cpu.cache_dir() == tmp_path / "elsewhere"
    monkeypatch.delenv("PDT_CPU_KERNEL_CACHE")
    assert nm_cpu.cache_dir() == Path.home() / ".cache" / "pdtbench" / "cpu-kernels"
    assert os.access(first, os.R_OK)


def _script(name, *args, check=True):
    """Run ``scripts/<name>`` with ``args`` from the repository root; the finished process."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    cmd = [sys.executable, str(root / "scripts" / name), *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=check, cwd=root)


@needs_kernel
@pytest.mark.slow
def test_step_timing_script_prints_each_configuration():
    bad = _script("sdgp_cpu_step.py", "--steps", "2", check=False)
    assert bad.returncode == 2 and "--steps" in bad.stderr
    lines = _script("sdgp_cpu_step.py", "--rounds", "1", "--steps", "3").stdout.splitlines()
    assert [ln.split()[0] for ln in lines] == ["2:4", "2:4", "8:16", "16:32"]
    assert all("compiled" in ln and "no pruning" in ln for ln in lines)


@needs_kernel
def test_a_sum_beyond_float32_runs_the_reference():
    # sum|x| of the plane is finite in float64 but rounds to inf in float32, where the
    # reference's float32 sum saturates at the largest float: the reference runs.
    x = torch.zeros(1, 4, 1, 3)
    x[0, 0, 0] = torch.tensor([3.4028234663852886e38, 2.0**102, 2.0**102])
    assert nm_cpu.nm_prune_cpu(x, 1, 4, "rescaled", 1, "plane", None, 1e-4) is None
    assert torch.equal(nm_prune(x, 1, 4, "rescaled", impl="cpu"), nm_prune_ref(x, 1, 4))
    assert bool(torch.isfinite(nm_prune(x, 1, 4, "rescaled", impl="cpu")).all())


@needs_kernel
def test_denormal_ties_rank_by_bits_whatever_the_denormal_mode():
    x = torch.tensor([1, 1, 2, 3], dtype=torch.int32).view(torch.float32).view(1, 4, 1)
    want = nm_prune_ref(x, 2, 4, "magnitude")
    assert want.view(torch.int32).flatten().tolist() == [0, 0, 2, 3]
    flushed = torch.set_flush_denormal(True)
    try:
        got = nm_prune(x, 2, 4, "magnitude", impl="cpu")
    finally:
        torch.set_flush_denormal(False)
    if flushed:  # the CPU supports the mode: the kernel must not rank flushed values
        assert torch.equal(got.view(torch.int32), want.view(torch.int32))


@needs_kernel
def test_empty_tensors_and_other_devices():
    for shape in ((0, 8, 3, 3), (2, 8, 0, 3), (2, 0, 3, 3)):
        x = torch.empty(shape)
        out, l1_x, l1_y = nm_cpu.nm_prune_cpu(x, 2, 4, "rescaled", 1, "plane", None, 1e-4, True)
        assert out.shape == x.shape and float(l1_x) == 0.0 and float(l1_y) == 0.0
        assert nm_prune(x, 2, 4, impl="cpu").shape == x.shape
    meta = torch.empty(2, 8, 3, 3, device="meta")
    with pytest.raises(RuntimeError, match="takes CPU tensors, got a tensor on meta"):
        nm_prune(meta, 2, 4, impl="cpu")


def test_sdgp_conv_counts_its_paths_and_cpu_raises_where_unavailable(monkeypatch):
    from impl.methods.sdgp import prune_path_counts

    conv = torch.nn.Conv2d(4, 8, 3, padding=1)
    x = torch.randn(2, 4, 5, 5, requires_grad=True)
    model = torch.nn.Sequential(SDGPConv2d.from_conv(conv, 2, 4, "magnitude"))
    layer = model[0]
    for impl in ("ref", "auto", "auto"):
        layer.prune_impl = impl
        torch.autograd.grad(model(x).sum(), x)
    auto_path = "cpu kernel" if nm_cpu.is_available() else "reference"
    want = {"reference": 1, auto_path: 2} if auto_path != "reference" else {"reference": 3}
    assert layer.prune_paths == want and prune_path_counts(model) == want
    monkeypatch.setenv("PDT_CPU_KERNELS", "0")
    layer.prune_impl = "cpu"
    with pytest.raises(RuntimeError, match="prune_impl='cpu'.*PDT_CPU_KERNELS=0"):
        torch.autograd.grad(model(x).sum(), x)


@pytest.mark.skipif(nm_cpu.compiler() is None, reason="no C compiler")
def test_build_takes_a_compiler_with_arguments_and_says_why_it_cannot(tmp_path, monkeypatch):
    import shutil

    gcc = shutil.which("gcc") or shutil.which("cc")
    monkeypatch.setenv("CC", f"{gcc} -O2")  # a command with arguments, as ccache gcc
    lib = nm_cpu.build(tmp_path / "args")
    assert lib.exists() and (lib.stat().st_mode & 0o777) == 0o755  # loadable by other users
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.raises(RuntimeError, match="could not run"):
        nm_cpu.build(tmp_path / "missing")
    unwritable = tmp_path / "file"
    unwritable.write_text("not a directory")
    monkeypatch.setenv("CC", gcc)
    with pytest.raises(RuntimeError, match="cannot write the kernel cache"):
        nm_cpu.build(unwritable / "cache")


@pytest.mark.skipif(nm_cpu.compiler() is None, reason="no C compiler")
def test_a_cached_library_that_does_not_load_is_rebuilt(tmp_path, monkeypatch):
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PDT_CPU_KERNEL_CACHE", str(tmp_path))
    target = tmp_path / nm_cpu.library_name(nm_cpu.compiler())
    target.write_bytes(b"truncated")
    nm_cpu._library.cache_clear()
    try:
        assert nm_cpu.is_available(), nm_cpu.unavailable_reason()
        assert target.stat().st_size > 1000
    finally:
        nm_cpu._library.cache_clear()  # the next test loads from the default cache again


@pytest.mark.skipif(nm_cpu.compiler() is None, reason="no C compiler")
def test_an_unwritable_default_cache_builds_under_the_temporary_directory(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.write_text("a file, so nothing can be made under it")  # an unwritable home
    monkeypatch.setattr(Path, "home", classmethod(lambda cls: home))
    monkeypatch.delenv("PDT_CPU_KERNEL_CACHE", raising=False)
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setattr(cpu_kernels.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    nm_cpu._library.cache_clear()
    try:
        assert nm_cpu.is_available(), nm_cpu.unavailable_reason()
        built = list(nm_cpu.fallback_cache_dir().glob("nm_prune-*.so"))
        assert len(built) == 1 and nm_cpu.fallback_cache_dir().parent == tmp_path / "tmp"
        monkeypatch.setenv("PDT_CPU_KERNEL_CACHE", str(home / "cache"))  # the user's choice
        nm_cpu._library.cache_clear()
        assert "cannot write the kernel cache" in nm_cpu.unavailable_reason()
    finally:
        nm_cpu._library.cache_clear()


def _prune_with_threads(threads, x, method, rule):
    """nm_prune_cpu on ``threads`` torch threads (restored after): its slices and result."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        parts = nm_cpu.slices(x.numel(), x.shape[0], rule)
        gen = torch.Generator().manual_seed(5)
        out = nm_cpu.nm_prune_cpu(x, 2, 4, method, 1, rule or "plane", gen, 1e-4, True)
    finally:
        torch.set_num_threads(before)
    return parts, out


@needs_kernel
@pytest.mark.parametrize(
    ("method", "rule"),
    [("magnitude", None), ("random", None), ("rescaled", "plane"), ("rescaled", "channel")],
)
def test_slices_on_threads_give_the_bits_of_one_call(monkeypatch, method, rule):
    monkeypatch.setattr(nm_cpu, "PARALLEL_MIN_ELEMENTS", 1)  # slice even a small tensor
    pools = []  # the number of slices handed to the pool, per call
    original = cpu_kernels.POOL.submit
    monkeypatch.setattr(cpu_kernels.POOL, "submit", lambda t: pools.append(len(t)) or original(t))
    x = torch.randn(7, 12, 3, 5, generator=torch.Generator().manual_seed(3))  # 7 = 2 + 2 + 3
    one, (y1, sx1, sy1) = _prune_with_threads(1, x, method, rule)
    assert one == [(0, 7)] and pools == []
    three, (y3, sx3, sy3) = _prune_with_threads(3, x, method, rule)
    if rule == "channel":  # its sums span every slice: one call
        assert three == [(0, 7)] and pools == []
    else:
        assert three == [(0, 2), (2, 4), (4, 7)] and pools == [2]
    assert torch.equal(y3, y1)
    want = nm_prune_ref(x, 2, 4, method, 1, rule or "plane", torch.Generator().manual_seed(5))
    if method == "rescaled":
        torch.testing.assert_close(y3, want, rtol=nm_cpu.RESCALE_RTOL, atol=0)
    else:
        assert torch.equal(y3, want)
    torch.testing.assert_close(sx3, x.abs().sum(dtype=torch.float64), rtol=1e-12, atol=0)
    torch.testing.assert_close(sy3, sy1, rtol=1e-12, atol=0)


def test_slices_follow_the_threads_and_the_size():
    before = torch.get_num_threads()
    torch.set_num_threads(4)
    try:
        big = 10 * nm_cpu.PARALLEL_MIN_ELEMENTS
        assert nm_cpu.slices(big, 10, None) == [(0, 2), (2, 5), (5, 7), (7, 10)]
        assert nm_cpu.slices(big, 3, "plane") == [(0, 1), (1, 2), (2, 3)]  # no more than O
        assert nm_cpu.slices(2 * nm_cpu.PARALLEL_MIN_ELEMENTS, 10, None) == [(0, 5), (5, 10)]
        assert nm_cpu.slices(nm_cpu.PARALLEL_MIN_ELEMENTS - 1, 10, None) == [(0, 10)]
        assert nm_cpu.slices(big, 10, "channel") == [(0, 10)]
        assert nm_cpu.slices(0, 0, None) == [(0, 0)]
    finally:
        torch.set_num_threads(before)


def _prune_in_forked_child(x, want):
    ok = len(nm_cpu.slices(x.numel(), x.shape[0], None)) > 1
    got = nm_cpu.nm_prune_cpu(x, 2, 4, "magnitude", 1, "plane", None, 1e-4)
    os._exit(0 if ok and torch.equal(got[0], want) else 3)


@needs_kernel
def test_a_forked_child_slices_on_a_pool_of_its_own(monkeypatch):
    import multiprocessing

    monkeypatch.setattr(nm_cpu, "PARALLEL_MIN_ELEMENTS", 1)
    x = torch.randn(6, 8, 3, 3, generator=torch.Generator().manual_seed(1))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        want = nm_cpu.nm_prune_cpu(x, 2, 4, "magnitude", 1, "plane", None, 1e-4)[0]  # the pool
        child = multiprocessing.get_context("fork").Process(
            target=_prune_in_forked_child, args=(x, want)
        )
        child.start()
        child.join(30)  # the parent's pool has no threads in the child: it would wait forever
        hung = child.is_alive()
        if hung:
            child.kill()
    finally:
        torch.set_num_threads(before)
    assert not hung and child.exitcode == 0


@needs_kernel
@pytest.mark.slow
def test_threads_timing_script_prints_each_configuration():
    bad = _script("nm_cpu_threads.py", "--calls", "0", check=False)
    assert bad.returncode == 2 and "--calls" in bad.stderr
    args = ("--rounds", "1", "--calls", "1", "--shape", "4", "8", "3", "3")
    head, *rows = _script("nm_cpu_threads.py", *args).stdout.strip().splitlines()
    assert head == "shape 4x8x3x3, 2 threads, 1 slice"  # too small to slice
    assert [r.split()[0] for r in rows] == ["2:4", "4:8", "8:16", "16:32"]
    assert all("reference" in r and "one call" in r and "sliced" in r for r in rows)


@pytest.mark.skipif(nm_cpu.compiler() is None, reason="no C compiler")
def test_building_removes_libraries_unused_for_a_month_and_loading_marks_use(tmp_path, monkeypatch):
    monkeypatch.delenv("CC", raising=False)
    day = 86400
    old_lib, recent_lib = tmp_path / "nm_prune-0000000000000000.so", tmp_path / "nm_prune-1.so"
    killed_build, other = tmp_path / "tmpab12.so", tmp_path / "unrelated-old.so"
    for path in (old_lib, recent_lib, killed_build, other):
        path.write_bytes(b"x")
        os.utime(path, (0, 0))  # 1970
    os.utime(recent_lib)  # loaded just now
    built = nm_cpu.build(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [built.name, recent_lib.name, other.name]
    )
    os.utime(built, (0, 0))  # a cached library last used long ago, then loaded
    monkeypatch.setenv("PDT_CPU_KERNEL_CACHE", str(tmp_path))
    nm_cpu._library.cache_clear()
    try:
        assert nm_cpu.is_available()
        assert built.stat().st_mtime > 30 * day  # marked used: a later build keeps it
    finally:
        nm_cpu._library.cache_clear()
    assert nm_cpu.prune_stale(tmp_path, built) == []


@needs_kernel
def test_one_pool_per_process_grows_to_the_most_slices_and_no_further(monkeypatch):
    import threading
    import time

    monkeypatch.setattr(nm_cpu, "PARALLEL_MIN_ELEMENTS", 1)
    pool = cpu_kernels.SlicePool()  # a fresh one, as a process starts with
    monkeypatch.setattr(cpu_kernels, "POOL", pool)
    existing = set(threading.enumerate())
    x = torch.randn(12, 8, 3, 3, generator=torch.Generator().manual_seed(2))
    want = nm_prune_ref(x, 2, 4, "magnitude")
    before = torch.get_num_threads()
    try:
        for threads in (3, 2, 4, 2, 4, 3):  # 2, 1, 3, 1, 3, 2 slices on the pool
            torch.set_num_threads(threads)
            got = nm_cpu.nm_prune_cpu(x, 2, 4, "magnitude", 1, "plane", None, 0.0)[0]
            assert torch.equal(got, want)
    finally:
        torch.set_num_threads(before)
    assert pool.workers == 3  # grown once, from 2 to 3; never rebuilt for fewer

    def ours():
        return [
            t for t in threading.enumerate()
            if t not in existing and t.name.startswith("pdt-cpu-kernel")
        ]  # fmt: skip

    deadline = time.monotonic() + 10
    while len(ours()) > 3 and time.monotonic() < deadline:  # the smaller pool's threads leave
        time.sleep(0.05)
    assert 1 <= len(ours()) <= 3  # one pool's threads, not one pool per slice count


def test_prune_stale_removes_only_what_aged_past_its_limit_and_never_keep(tmp_path):
    """Libraries older than STALE_DAYS days go, younger ones stay (29 days: kept); a killed
    build's temporary goes after a day; ``keep`` stays however old."""
    import time

    day, now = 86400, time.time()
    ages = {"nm_prune-a.so": 31, "nm_prune-b.so": 29, "tmp1.so": 2, "tmp2.so": 0.5, "keep.so": 0}
    for name, days in ages.items():
        (tmp_path / name).write_bytes(b"x")
        os.utime(tmp_path / name, (now - days * day, now - days * day))
    keep = tmp_path / "nm_prune-kept.so"
    keep.write_bytes(b"x")
    os.utime(keep, (0, 0))  # 1970, but the library in use
    removed = nm_cpu.prune_stale(tmp_path, keep)
    assert sorted(p.name for p in removed) == ["nm_prune-a.so", "tmp1.so"]
    assert keep.exists() and (tmp_path / "nm_prune-b.so").exists()


_TRACED = """
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from impl.ops import nm_prune
with FakeTensorMode():
    for impl in ("auto", "cpu", "ref"):
        y = nm_prune(torch.randn(2, 8, 3, 3), 2, 4, impl=impl)
        assert type(y).__name__ == "FakeTensor" and y.shape == (2, 8, 3, 3), impl
print("traced")
"""


def test_a_fake_tensor_gets_a_shape_not_a_crash():
    """The compiled kernel read a fake tensor's data pointer: the process died (SIGSEGV)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _TRACED], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).resolve().parents[1])  # fmt: skip
    assert done.returncode == 0 and "traced" in done.stdout, done.stderr[-2000:]


def test_meta_vmap_and_a_wrong_generator():
    x = torch.randn(2, 8, 3, 3, device="meta").to(memory_format=torch.channels_last)
    y = nm_prune(x, 2, 4)
    assert y.device.type == "meta" and y.shape == x.shape
    assert y.is_contiguous(memory_format=torch.channels_last)
    assert not nm_cpu.has_storage(x) and nm_cpu.has_storage(torch.zeros(1))
    with pytest.raises(RuntimeError, match="CUDA kernel of nm_prune is not available"):
        nm_prune(x, 2, 4, impl="cuda")  # as for a CPU tensor with data
    with pytest.raises(ValueError, match="torch.func transforms"):
        torch.vmap(lambda t: nm_prune(t, 2, 4, dim=0))(torch.randn(3, 8, 4))
    with pytest.raises(TypeError, match="generator must be a torch.Generator"):
        nm_prune(torch.randn(2, 8), 2, 4, method="random", generator=5)


@pytest.mark.parametrize(
    ("value", "on"),
    [(None, True), ("1", True), ("yes", True), ("", True), ("0", False)],
    ids=["unset", "1", "yes", "empty", "0"],
)
def test_only_pdt_cpu_kernels_0_turns_the_path_off(monkeypatch, value, on) -> None:
    """``PDT_CPU_KERNELS``: the compiled path is enabled unless it is exactly ``0``."""
    if value is None:
        monkeypatch.delenv("PDT_CPU_KERNELS", raising=False)
    else:
        monkeypatch.setenv("PDT_CPU_KERNELS", value)
    assert nm_cpu.enabled() is on


def test_the_fallback_cache_is_per_user_under_the_temporary_directory(tmp_path, monkeypatch):
    """``<tmp>/pdtbench-cpu-kernels-<uid>``: users sharing a machine do not share it."""
    monkeypatch.setattr(cpu_kernels.tempfile, "gettempdir", lambda: str(tmp_path))
    assert nm_cpu.fallback_cache_dir() == tmp_path / f"pdtbench-cpu-kernels-{os.getuid()}"


def test_a_blank_cc_is_unset(monkeypatch) -> None:
    """``CC`` of only spaces names no compiler: cc or gcc on the PATH is used; a set ``CC``
    is taken stripped."""
    import shutil

    monkeypatch.setenv("CC", "   ")
    assert nm_cpu.compiler() == (shutil.which("cc") or shutil.which("gcc"))
    monkeypatch.setenv("CC", "  ccache gcc ")
    assert nm_cpu.compiler() == "ccache gcc"


def test_library_name_changes_with_source_flags_and_machine(tmp_path, monkeypatch) -> None:
    """The cached library's name hashes the kernel's source, the compiler, the flags and the
    machine type: a change to any builds a new library; it is a ``nm_prune-<16 hex>.so``
    that :func:`nm_cpu.prune_stale` recognises."""
    import re

    base = nm_cpu.library_name("gcc")
    assert re.fullmatch(r"nm_prune-[0-9a-f]{16}\.so", base)
    assert nm_cpu.library_name("gcc") == base
    source = tmp_path / "nm_prune.c"
    source.write_bytes(nm_cpu.SOURCE.read_bytes() + b"\n/* changed */\n")
    names = {base, nm_cpu.library_name("clang")}
    with monkeypatch.context() as patch:
        patch.setattr(nm_cpu, "SOURCE", source)
        names.add(nm_cpu.library_name("gcc"))
    with monkeypatch.context() as patch:
        patch.setattr(nm_cpu, "CFLAGS", (*nm_cpu.CFLAGS, "-g"))
        names.add(nm_cpu.library_name("gcc"))
    with monkeypatch.context() as patch:
        patch.setattr(cpu_kernels.platform, "machine", lambda: "some-other-arch")
        names.add(nm_cpu.library_name("gcc"))
    assert len(names) == 5


@pytest.mark.parametrize(
    ("name", "days", "removed"),
    [
        ("nm_prune-a.so", 30.5, True),
        ("nm_prune-a.so", 29.5, False),
        ("tmpab.so", 1.5, True),
        ("tmpab.so", 0.9, False),
    ],
    ids=["lib-30.5d", "lib-29.5d", "tmp-1.5d", "tmp-0.9d"],
)
def test_stale_limits_are_thirty_days_for_libraries_and_one_for_temporaries(
    tmp_path, name, days, removed
) -> None:
    """A library unused for more than 30 days goes, a killed build's temporary after 1 day."""
    import time

    path = tmp_path / name
    path.write_bytes(b"x")
    then = time.time() - days * 86400
    os.utime(path, (then, then))
    assert nm_cpu.prune_stale(tmp_path, tmp_path / "nm_prune-kept.so") == (
        [path] if removed else []
    )
    assert path.exists() is not removed


def test_prune_stale_leaves_a_file_it_cannot_remove_and_goes_on(tmp_path, monkeypatch) -> None:
    """Best effort: a stale library whose removal is refused (another user's, say) stays, and
    the others are still removed."""
    locked, other = tmp_path / "nm_prune-locked.so", tmp_path / "nm_prune-other.so"
    for path in (locked, other):
        path.write_bytes(b"x")
        os.utime(path, (0, 0))  # 1970
    unlink = Path.unlink

    def refuse(self, *args, **kwargs):
        if self.name == locked.name:
            raise PermissionError(13, "Permission denied", str(self))
        return unlink(self, *args, **kwargs)

    monkeypatch.setattr(Path, "unlink", refuse)
    assert nm_cpu.prune_stale(tmp_path, tmp_path / "nm_prune-kept.so") == [other]
    assert locked.exists() and not other.exists()


def test_a_failing_compiler_is_not_retried_in_the_fallback_cache(tmp_path, monkeypatch) -> None:
    """Only an unwritable default cache moves the build under the temporary directory; a
    compiler that fails is run once, its failure is the reason, and no other cache is made."""
    calls = tmp_path / "calls.log"
    cc = tmp_path / "failing-cc"
    cc.write_text(f'#!/bin/sh\necho run >> {calls}\necho "syntax error" >&2\nexit 1\n')
    cc.chmod(0o755)
    monkeypatch.setenv("CC", str(cc))
    monkeypatch.delenv("PDT_CPU_KERNEL_CACHE", raising=False)
    monkeypatch.delenv("PDT_CPU_KERNELS", raising=False)
    monkeypatch.setattr(Path, "home", classmethod(lambda cls: tmp_path / "home"))
    monkeypatch.setattr(cpu_kernels.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    nm_cpu._library.cache_clear()
    try:
        reason = nm_cpu.unavailable_reason()
    finally:
        nm_cpu._library.cache_clear()
    assert reason is not None and "failed" in reason and "syntax error" in reason
    assert calls.read_text().splitlines() == ["run"]
    assert not nm_cpu.fallback_cache_dir().exists()


@needs_kernel
def test_without_stats_the_sums_are_none() -> None:
    """``stats=False``: ``(y, None, None)``, the sums not computed."""
    x = torch.randn(2, 8, 3, 3, generator=torch.Generator().manual_seed(4))
    y, l1_x, l1_y = nm_cpu.nm_prune_cpu(x, 2, 4, "magnitude", 1, "plane", None, 1e-4)
    assert l1_x is None and l1_y is None
    assert torch.equal(y, nm_prune_ref(x, 2, 4, "magnitude"))


def test_build_without_a_compiler_says_so(tmp_path, monkeypatch) -> None:
    """No ``CC`` and no cc or gcc on the PATH: ``build`` raises, naming what to install."""
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert nm_cpu.compiler() is None
    with pytest.raises(RuntimeError, match="no C compiler"):
        nm_cpu.build(tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


def test_every_entry_point_checks_the_same_options_and_tensor():
    """nm_prune, its reference, an SDGP layer's configuration and the conversion refuse the
    same bad options with the same words (one set of checks, :func:`check_prune_args`), a
    generator that is not a ``torch.Generator`` included; the dim comes back non-negative."""
    from impl.methods.sdgp import SDGPConv2d, sdgp_convert
    from impl.ops.nm import check_options, check_prune_args, nm_prune_ref

    x = torch.randn(2, 8, 3)
    assert check_prune_args(x, 2, 4, "rescaled", -2, "plane", 0.0) == 1
    assert check_options(2, 4, "random", "channel", 0.0, torch.Generator()) is None
    conv = SDGPConv2d.from_conv(torch.nn.Conv2d(8, 8, 1), 2, 4)
    entries = {
        "nm_prune": lambda **kw: nm_prune(x, **kw),
        "nm_prune_ref": lambda **kw: nm_prune_ref(x, **kw),
        "configure": lambda **kw: conv.configure(**kw),
        "convert": lambda **kw: sdgp_convert(torch.nn.Sequential(torch.nn.Conv2d(8, 8, 1)), **kw),
    }
    for call in entries.values():
        with pytest.raises(ValueError, match="need 1 <= n <= m"):
            call(n=5, m=4)
        with pytest.raises(ValueError, match="unknown rescale"):
            call(n=2, m=4, rescale="row")
        with pytest.raises(ValueError, match="eps must be a finite number"):
            call(n=2, m=4, eps=-1.0)
        with pytest.raises(TypeError, match="generator must be a torch.Generator"):
            call(n=2, m=4, method="random", generator=5)
    with pytest.raises(ValueError, match=r"dim must be an int in \[-3, 2\]"):
        check_prune_args(x, 2, 4, "rescaled", 3, "plane", 0.0)
