"""The compiled CPU pattern conv (impl.ops.pattern_cpu, impl/cpu/pattern_conv.c) against the
dense convolution of the masked weight and against the reference path."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from impl.ops import PatternConv2d, cpu_kernels, pattern_conv2d, pattern_cpu, pattern_index
from impl.ops.pattern import PatternIndex

F64 = torch.float64

needs_kernel = pytest.mark.skipif(
    not pattern_cpu.is_available(),
    reason=f"the compiled CPU pattern conv is unavailable: {pattern_cpu.unavailable_reason()}",
)


def _case(batch, c_in, c_out, hw, kernel, dtype, seed=0, density=0.3):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, c_in, *hw, generator=gen, dtype=dtype)
    weight = torch.randn(c_out, c_in, *kernel, generator=gen, dtype=dtype)
    mask = torch.rand(weight.shape, generator=gen, dtype=F64) < density
    return gen, x, weight, mask


def _dense_grads(x, weight, mask, bias, g, **geometry):
    xd = x.clone().requires_grad_()
    wd = (weight * mask).requires_grad_()
    bd = None if bias is None else bias.clone().requires_grad_()
    out = F.conv2d(xd, wd, bd, **geometry)
    grads = torch.autograd.grad(out, [t for t in (xd, wd, bd) if t is not None], g)
    return out, grads


GEOMETRIES = [
    # batch, c_in, c_out, (H, W), kernel, stride, padding, dilation
    (32, 16, 16, (16, 16), (3, 3), 1, 1, 1),  # ResNet-20's first stage at cpu scale
    (33, 8, 12, (10, 7), (3, 3), 2, 1, 1),  # a lane remainder, stride 2 (the scatter)
    (7, 5, 7, (9, 11), (3, 3), 1, 1, 1),  # fewer samples than a vector's lanes
    (8, 4, 6, (12, 12), (3, 5), (2, 1), (0, 2), (1, 2)),
    (9, 6, 5, (8, 8), (3, 3), 1, 3, 1),  # padding wider than the kernel
    (17, 6, 5, (13, 13), (3, 3), 3, 2, 2),
    (1, 3, 2, (5, 5), (1, 1), 1, 0, 1),  # a pointwise conv, one sample
    (40, 16, 32, (8, 8), (3, 3), 2, 1, 1),  # ResNet-20's downsampling conv
    (64, 3, 4, (20, 3), (3, 3), 1, 1, 1),  # more output columns than one staged block
    (5, 4, 6, (9, 10), (3, 3), 1, 2, 2),  # dilation at stride 1 (the input-gradient gather)
    (6, 3, 4, (7, 9), (5, 3), 1, (1, 0), 1),  # uneven kernel and padding at stride 1
    (600, 2, 3, (3, 4), (3, 3), 1, 1, 1),  # more samples than one staged tile
    (1, 16, 8, (30, 30), (3, 3), 1, 1, 1),  # one sample: rows of the plane as the vectors
]


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, F64], ids=["f32", "f64"])
@pytest.mark.parametrize("case", GEOMETRIES, ids=[str(i) for i in range(len(GEOMETRIES))])
def test_output_and_gradients_are_the_masked_dense_convolution(case, dtype):
    batch, c_in, c_out, hw, kernel, stride, padding, dilation = case
    gen, x, weight, mask = _case(batch, c_in, c_out, hw, kernel, dtype)
    bias = torch.randn(c_out, generator=gen, dtype=dtype)
    geometry = {"stride": stride, "padding": padding, "dilation": dilation}
    xs, ws, bs = (t.clone().requires_grad_() for t in (x, weight, bias))
    out = pattern_conv2d(xs, ws, mask, bs, impl="cpu", **geometry)
    g = torch.randn(out.shape, generator=gen, dtype=dtype)
    want, want_grads = _dense_grads(x, weight, mask, bias, g, **geometry)
    got_grads = torch.autograd.grad(out, [xs, ws, bs], g)
    tol = pattern_cpu.RTOL if dtype == torch.float32 else 1e-13
    assert out.dtype == dtype and out.is_contiguous()
    for got, ref in zip((out, *got_grads), (want, *want_grads), strict=True):
        ref = ref * mask if got.shape == mask.shape else ref
        # sums of up to B*P*Q products in another order than oneDNN's
        assert (got - ref).abs().max() <= tol * ref.abs().max(), (got - ref).abs().max()
    assert torch.all(got_grads[1][~mask] == 0)  # nothing outside the kept positions


@contextlib.contextmanager
def _threads(count):
    """torch's intra-op thread count set to ``count`` inside, restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _random_geometries(count, seed):
    """``count`` geometries drawn at random (seeded): kernels 1-4 on each side, strides 1-3,
    paddings 0-4, dilations 1-3, planes 1-14, 1 to 33 samples, densities 0 to 1; those whose
    output would be empty are drawn again."""
    import random

    rng, out = random.Random(seed), []
    while len(out) < count:
        kernel = (rng.randint(1, 4), rng.randint(1, 4))
        stride, padding, dilation = ((rng.randint(1, hi), rng.randint(1, hi)) for hi in (3, 4, 3))
        hw = (rng.randint(1, 14), rng.randint(1, 14))
        size = [(hw[i] + 2 * padding[i] - dilation[i] * (kernel[i] - 1) - 1) // stride[i] + 1
                for i in (0, 1)]  # fmt: skip
        if min(size) < 1:
            continue
        batch = rng.choice([1, 2, 3, 5, 8, 9, 17, 33])
        density = rng.choice([0.0, 0.1, 0.5, 0.9, 1.0])
        out.append((batch, rng.randint(1, 6), rng.randint(1, 6), hw, kernel, stride, padding,
                    dilation, density))  # fmt: skip
    return out


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, F64], ids=["f32", "f64"])
def test_random_geometries_match_the_masked_dense_convolution(dtype, monkeypatch):
    """60 geometries drawn at random (combinations of stride, padding, dilation and uneven
    kernels the hand-picked ones leave out), every other one split over 2 threads."""
    monkeypatch.setattr(pattern_cpu, "PARALLEL_MIN_ELEMENTS", 1)  # small ones split too
    for i, case in enumerate(_random_geometries(60, seed=2026)):
        batch, c_in, c_out, hw, kernel, stride, padding, dilation, density = case
        gen, x, weight, mask = _case(batch, c_in, c_out, hw, kernel, dtype, i, density)
        geometry = {"stride": stride, "padding": padding, "dilation": dilation}
        xs, ws = (t.clone().requires_grad_() for t in (x, weight))
        with _threads(1 + i % 2):
            out = pattern_conv2d(xs, ws, mask, impl="cpu", **geometry)
            g = torch.randn(out.shape, generator=gen, dtype=dtype)
            got = (out, *torch.autograd.grad(out, [xs, ws], g))
        want, (gx, gw) = _dense_grads(x, weight, mask, None, g, **geometry)
        tol = pattern_cpu.RTOL if dtype == torch.float32 else 1e-13
        for name, a, b in zip(("output", "input grad", "weight grad"), got, (want, gx, gw * mask)):
            err, scale = (a - b).abs().max(), b.abs().max()
            assert err <= tol * scale, f"{name} of case {i} {case}: {err} (max {scale})"


@needs_kernel
def test_gradcheck_in_float64():
    gen, x, weight, mask = _case(3, 3, 4, (6, 5), (3, 3), F64, seed=4, density=0.4)
    index = pattern_index(mask)

    def f(x, w):
        return pattern_conv2d(x, w, index, stride=(1, 2), padding=1, impl="cpu")

    assert torch.autograd.gradcheck(f, (x.requires_grad_(), weight.requires_grad_()))


@needs_kernel
def test_equals_the_reference_path_to_rounding_on_a_clicktrain_layer():
    # 4-of-9 patterns on a quarter of the kernels, ResNet-20's stage 2 at the cpu scale
    gen = torch.Generator().manual_seed(7)
    c = 32
    mask = torch.zeros(c, c, 9, dtype=torch.bool)
    for f in range(c):
        for k in torch.randperm(c, generator=gen)[: c // 4]:
            mask[f, k, torch.randperm(9, generator=gen)[:4]] = True
    mask = mask.view(c, c, 3, 3)
    conv = nn.Conv2d(c, c, 3, padding=1, bias=False)
    paths = {impl: PatternConv2d.from_conv(conv, mask, impl) for impl in ("cpu", "ref")}
    x = torch.randn(32, c, 8, 8, generator=gen)
    g = torch.randn(32, c, 8, 8, generator=gen)
    results = {}
    for impl, module in paths.items():
        xs = x.clone().requires_grad_()
        out = module(xs)
        results[impl] = (out, *torch.autograd.grad(out, [xs, module.weight], g))
    for got, want in zip(results["cpu"], results["ref"], strict=True):
        scale = want.abs().max()
        assert (got - want).abs().max() <= pattern_cpu.RTOL * scale
    assert not torch.equal(results["cpu"][0], x.new_zeros(1))  # it computed something


@needs_kernel
def test_results_do_not_depend_on_the_thread_count(monkeypatch):
    monkeypatch.setattr(pattern_cpu, "PARALLEL_MIN_ELEMENTS", 1)
    gen, x, weight, mask = _case(12, 7, 10, (9, 9), (3, 3), torch.float32, seed=5)
    calls = []
    original = cpu_kernels.run_slices

    def counted(call, parts):
        calls.append(len(parts))
        return original(call, parts)

    monkeypatch.setattr(cpu_kernels, "run_slices", counted)
    g = torch.randn(12, 10, 5, 5, generator=gen)
    results = []
    before = torch.get_num_threads()
    try:
        for threads in (1, 3):
            torch.set_num_threads(threads)
            xs, ws = x.clone().requires_grad_(), weight.clone().requires_grad_()
            out = pattern_conv2d(xs, ws, mask, stride=2, padding=1, impl="cpu")
            results.append((out, *torch.autograd.grad(out, [xs, ws], g)))
    finally:
        torch.set_num_threads(before)
    assert set(calls) == {1, 3}  # one slice, then three, per kernel call
    for one, three in zip(*results, strict=True):
        assert torch.equal(one, three)


@needs_kernel
def test_takes_channels_last_and_non_contiguous_inputs():
    gen, x, weight, mask = _case(6, 4, 5, (7, 7), (3, 3), F64, seed=6)
    want = F.conv2d(x, weight * mask, padding=1)
    for variant in (
        x.to(memory_format=torch.channels_last),
        x.transpose(2, 3).contiguous().transpose(2, 3),
        torch.cat([x, x], dim=1)[:, ::2],
    ):
        got = pattern_conv2d(variant, weight, mask, padding=1, impl="cpu")
        want_v = F.conv2d(variant, weight * mask, padding=1)
        torch.testing.assert_close(got, want_v, rtol=1e-12, atol=1e-12)
    w_nhwc = weight.to(memory_format=torch.channels_last)
    got = pattern_conv2d(x, w_nhwc, mask, padding=1, impl="cpu")
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@needs_kernel
def test_auto_takes_the_compiled_path_on_cpu_and_the_reference_where_it_cannot(monkeypatch):
    from impl.ops import resolve_conv_impl

    x, w = torch.randn(2, 3, 5, 5), torch.randn(4, 3, 3, 3)
    assert resolve_conv_impl("auto", x, w) == "cpu"
    assert resolve_conv_impl("auto", x, w.double()) == "ref"  # two dtypes
    assert resolve_conv_impl("auto", x.half(), w.half()) == "ref"
    assert resolve_conv_impl("ref", x, w) == "ref"
    assert resolve_conv_impl("auto") == "auto"  # a module being configured
    with pytest.raises(ValueError, match="unknown impl 'gpu'"):
        resolve_conv_impl("gpu", x, w)
    assert pattern_cpu.applies(x, w.double()) == "operands are not all float32 or all float64"
    assert pattern_cpu.applies(x.to("meta"), w.to("meta")) == "operands are not CPU tensors"
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
        fake = mode.from_tensor(x)
        assert "no memory" in pattern_cpu.applies(fake, mode.from_tensor(w))
    with pytest.raises(RuntimeError, match="cannot run these operands.*float32 or all float64"):
        resolve_conv_impl("cpu", x, w.double())
    with pytest.raises(ValueError, match="unknown impl 'gpu'.*cpu"):
        pattern_conv2d(x, w, torch.ones_like(w, dtype=torch.bool), impl="gpu")
    calls = []
    monkeypatch.setattr(
        pattern_cpu, "pattern_conv_cpu", lambda *a: calls.append(a) or F.conv2d(a[1], a[0])
    )
    pattern_conv2d(x, w, torch.ones_like(w, dtype=torch.bool))
    assert len(calls) == 1  # the default on a CPU
    pattern_conv2d(x, w, torch.ones_like(w, dtype=torch.bool), impl="ref")
    pattern_conv2d(x[:0], w, torch.ones_like(w, dtype=torch.bool), impl="cpu")  # empty batch
    assert len(calls) == 1


def test_turned_off_the_default_is_the_reference_and_cpu_says_why(monkeypatch):
    monkeypatch.setenv("PDT_CPU_KERNELS", "0")
    gen, x, weight, mask = _case(3, 4, 5, (6, 6), (3, 3), torch.float32, seed=8)
    assert not pattern_cpu.is_available()
    assert "PDT_CPU_KERNELS=0" in pattern_cpu.unavailable_reason()
    got = pattern_conv2d(x, weight, mask, padding=1)
    want = pattern_conv2d(x, weight, mask, padding=1, impl="ref")
    assert torch.equal(got, want)  # the reference's bits
    with pytest.raises(RuntimeError, match="PDT_CPU_KERNELS=0"):
        pattern_conv2d(x, weight, mask, padding=1, impl="cpu")
    with pytest.raises(RuntimeError, match="PDT_CPU_KERNELS=0"):
        PatternConv2d(nn.Parameter(weight), mask, padding=1, impl="cpu")(x)


@needs_kernel
def test_an_index_out_of_range_or_of_the_wrong_size_is_refused_not_read():
    _, x, weight, mask = _case(2, 3, 4, (5, 5), (3, 3), torch.float32, seed=9, density=0.5)
    index = pattern_index(mask)
    geometry = ((3, 3), (1, 1), (1, 1), (1, 1), (5, 5))
    bad_filter = index.t_col_ind.clone()
    bad_filter[0] = 4  # one filter past the last
    broken = index._replace(t_col_ind=bad_filter)
    x.requires_grad_()  # the input gradient reads the transposed structure
    out = pattern_cpu.pattern_conv_cpu(weight, x, broken, geometry)
    with pytest.raises(ValueError, match="out of range"):
        out.sum().backward()  # the transposed structure is read by the input gradient
    bad_ptr = index.t_row_ptr.clone()
    bad_ptr[-1] = index.col_ind.numel() + 5
    with pytest.raises(ValueError, match="out of range"):
        out = pattern_cpu.pattern_conv_cpu(weight, x, index._replace(t_row_ptr=bad_ptr), geometry)
        out.sum().backward()
    bad_col = index.col_ind.clone()
    bad_col[-1] = 27
    with pytest.raises(ValueError, match="out of range"):
        pattern_cpu.pattern_conv_cpu(weight, x, index._replace(col_ind=bad_col), geometry)
    with pytest.raises(ValueError, match="t_row_ptr must have 28 entries"):
        pattern_cpu.pattern_conv_cpu(weight, x, index._replace(t_row_ptr=bad_ptr[:-1]), geometry)
    with pytest.raises(ValueError, match="row_ptr must be a contiguous int64"):
        pattern_cpu.pattern_conv_cpu(
            weight, x, index._replace(row_ptr=index.row_ptr.to(torch.int32)), geometry
        )
    assert isinstance(index, PatternIndex)


@needs_kernel
def test_the_module_trains_on_the_compiled_path():
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 6, 3, padding=1)
    mask = torch.rand(conv.weight.shape) < 0.3
    layer = PatternConv2d.from_conv(conv, mask, impl="cpu")
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    x = torch.randn(8, 3, 6, 6)
    target = F.conv2d(x, torch.randn(conv.weight.shape) * mask, padding=1)  # reachable
    losses = []
    for _ in range(30):
        opt.zero_grad()
        loss = F.mse_loss(layer(x), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
    assert torch.all(layer.weight[~layer.mask] == 0)  # gradients kept the pruned weights at 0


def test_library_name_hashes_the_cpu_for_native_builds(monkeypatch, tmp_path):
    source = tmp_path / "k.c"
    source.write_text("int f(void) { return 0; }\n")
    native = ("-O3", "-march=native")
    plain = ("-O3",)
    base = {f: cpu_kernels.library_name("k", source, "gcc", f) for f in (native, plain)}
    cpu_kernels.machine_identity.cache_clear()
    monkeypatch.setattr(cpu_kernels, "machine_identity", lambda: "another cpu")
    assert cpu_kernels.library_name("k", source, "gcc", native) != base[native]
    assert cpu_kernels.library_name("k", source, "gcc", plain) == base[plain]
    assert base[native].startswith("k-") and base[native].endswith(".so")


def test_machine_identity_names_the_architecture():
    import platform

    cpu_kernels.machine_identity.cache_clear()
    identity = cpu_kernels.machine_identity()
    assert identity.splitlines()[0] == platform.machine()


def test_even_slices_cover_the_range_once():
    assert cpu_kernels.even_slices(10, 4) == [(0, 2), (2, 5), (5, 7), (7, 10)]
    assert cpu_kernels.even_slices(2, 8) == [(0, 1), (1, 2)]
    assert cpu_kernels.even_slices(0, 3) == [(0, 0)]
    assert cpu_kernels.even_slices(5, 0) == [(0, 5)]


@pytest.mark.skipif(cpu_kernels.compiler() is None, reason="no C compiler")
def test_the_source_builds_without_warnings(tmp_path, monkeypatch):
    import shlex
    import subprocess

    cmd = [*shlex.split(cpu_kernels.compiler()), *pattern_cpu.CFLAGS, "-Wextra", "-Werror"]
    proc = subprocess.run(
        [*cmd, "-o", str(tmp_path / "k.so"), str(pattern_cpu.SOURCE)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    monkeypatch.delenv("CC", raising=False)
    built = pattern_cpu.build(tmp_path / "cache")
    assert built.name.startswith("pattern_conv-") and built.exists()


def test_unavailable_reason_is_the_switch_then_the_loaders_reason(monkeypatch):
    calls = []

    def library(result):
        return lambda: calls.append(result) or result

    monkeypatch.delenv("PDT_CPU_KERNELS", raising=False)
    assert cpu_kernels.unavailable_reason(library("no C compiler")) == "no C compiler"
    assert cpu_kernels.unavailable_reason(library(object())) is None  # a loaded library
    monkeypatch.setenv("PDT_CPU_KERNELS", "0")
    reason = cpu_kernels.unavailable_reason(library("never asked"))
    assert reason == "turned off by PDT_CPU_KERNELS=0" and len(calls) == 2  # nothing built


def _compiler_refusing_native(tmp_path, log):
    """A ``CC`` that logs each run's native flag and fails on ``-march=native``, else runs the
    system compiler."""
    real = cpu_kernels.compiler()
    cc = tmp_path / "cc-without-native"
    cc.write_text(
        "#!/bin/sh\n"
        'case " $* " in *" -march=native "*) echo native >> ' + str(log) + "\n"
        '  echo "error: unknown value native for -march" >&2; exit 1;; esac\n'
        "echo portable >> " + str(log) + "\n"
        f'exec {real} "$@"\n'
    )
    cc.chmod(0o755)
    return cc


@pytest.mark.skipif(cpu_kernels.compiler() is None, reason="no C compiler")
def test_a_compiler_refusing_native_flags_builds_the_portable_library(
    tmp_path, monkeypatch, caplog
):
    """-march=native rejected: one more build without it, logged, and the kernel runs from
    that library (its name hashes the portable flags, not the CPU)."""
    runs = tmp_path / "runs.log"
    monkeypatch.setenv("CC", str(_compiler_refusing_native(tmp_path, runs)))
    monkeypatch.setenv("PDT_CPU_KERNEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("PDT_CPU_KERNELS", raising=False)
    portable = cpu_kernels.portable_flags(pattern_cpu.CFLAGS)
    assert "-march=native" in pattern_cpu.CFLAGS and "-march=native" not in portable
    assert [f for f in pattern_cpu.CFLAGS if f != "-march=native"] == list(portable)
    pattern_cpu._library.cache_clear()
    try:
        with caplog.at_level("WARNING", logger="impl.ops.cpu_kernels"):
            assert pattern_cpu.unavailable_reason() is None
        built = sorted(p.name for p in (tmp_path / "cache").glob("pattern_conv-*.so"))
        name = cpu_kernels.library_name("pattern_conv", pattern_cpu.SOURCE,
                                        str(tmp_path / "cc-without-native"), portable)  # fmt: skip
        assert built == [name]
        assert runs.read_text().split() == ["native", "portable"]
        assert any("-march=native failed" in r.getMessage() for r in caplog.records)
        gen, x, weight, mask = _case(3, 4, 5, (6, 6), (3, 3), torch.float32)
        out = pattern_conv2d(x, weight, pattern_index(mask), padding=1, impl="cpu")
        ref = F.conv2d(x, weight * mask, padding=1)
        torch.testing.assert_close(out, ref, rtol=pattern_cpu.RTOL, atol=1e-5)
    finally:
        pattern_cpu._library.cache_clear()


def test_a_compiler_failing_both_ways_gives_both_reasons(tmp_path, monkeypatch):
    """A source the compiler rejects with and without the native flags: two runs, and the
    reason holds both messages; flags with nothing native are not built twice."""
    runs = tmp_path / "runs.log"
    cc = tmp_path / "failing-cc"
    cc.write_text(f'#!/bin/sh\necho run >> {runs}\necho "syntax error $#" >&2\nexit 1\n')
    cc.chmod(0o755)
    monkeypatch.setenv("CC", str(cc))
    monkeypatch.setenv("PDT_CPU_KERNEL_CACHE", str(tmp_path / "cache"))
    source = tmp_path / "k.c"
    source.write_text("int f(void) { return 0; }\n")
    reason = cpu_kernels.load("k", source, ("-O3", "-march=native", "-shared"), "test kernel")
    assert isinstance(reason, str) and "and without the native flags" in reason
    assert runs.read_text().split() == ["run", "run"]
    assert reason.count("syntax error") == 2
    runs.unlink()
    reason = cpu_kernels.load("k", source, ("-O3", "-shared"), "test kernel")
    assert isinstance(reason, str) and "without the native flags" not in reason
    assert runs.read_text().split() == ["run"]
