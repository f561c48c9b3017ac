"""The CUDA ops (``impl.ops.pattern_cuda``, ``nm_cuda``, ``pack_cuda``) and their loader.

Without a GPU: the loader's behaviour (nothing touched at import, a recorded reason, clear
errors), the fake implementations (shapes, dtypes, memory formats, autograd), the launch
planning, and the references of pack/unpack.

On a GPU (``gpu`` marker): every kernel against its reference (docs/kernels.md): the kernel's error
against the float64 reference must be within ``k`` times the error of the same-precision
reference (plus a floor of a few ulps of the result's magnitude bound), one tolerance table
per dtype; odd sizes beside the paper's (256 x 1152 filters, 1152 x 50176 input), fresh
random inputs, outputs poisoned with NaN before the kernel runs so that every element is
checked written; N:M magnitude bit for bit; pack/unpack round trips.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import math
import os
import re
import shutil
import subprocess
import sys
import types
import zlib
from itertools import combinations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from impl.cuda import loader
from impl.ops import device_check, nm_cuda, pack_cuda, pattern_cuda, timed_choice
from impl.ops.nm import nm_prune_ref
from impl.ops.pattern import (
    PatternIndex,
    pattern_conv2d,
    pattern_csr,
    pattern_index,
    pattern_positions,
    pattern_spmm,
)

NO_GPU = not torch.cuda.is_available()


# =============================================================================================
# Without a GPU
# =============================================================================================


def test_import_touches_neither_the_gpu_nor_cupy():
    code = (
        "import sys, torch\n"
        "import impl.cuda, impl.cuda.loader, impl.ops.pattern_cuda, impl.ops.nm_cuda\n"
        "import impl.ops.pack_cuda\n"
        "assert not torch.cuda.is_initialized(), 'CUDA initialised at import'\n"
        "assert 'cupy' not in sys.modules, 'CuPy imported at import'\n"
        "print('ok')\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr


@pytest.mark.skipif(not NO_GPU, reason="checks the behaviour on a machine without a GPU")
def test_without_gpu_no_kernels_and_a_recorded_reason():
    assert loader.has_cuda_kernels() is False
    reason = loader.cuda_kernels_error()
    assert reason is not None and "torch.cuda.is_available() is False" in reason
    assert nm_cuda.is_available() is False
    with pytest.raises(RuntimeError, match="CUDA kernels unavailable: no CUDA GPU"):
        loader.load("pattern.cu")


def test_auto_dispatch_asks_about_the_operands_gpu_and_only_its_source(monkeypatch):
    # N:M, SDGP's 2:4 rows and the sparse Allreduce's pack asked whether the kernels load on
    # the current GPU (and the pack compiled all three sources): on a machine of several
    # GPUs, "auto" then decided for another GPU than the one the tensors are on.
    from impl import comm
    from impl.methods import sdgp_semi
    from impl.ops import nm

    asked = []
    monkeypatch.setattr(
        loader,
        "has_cuda_kernels",
        lambda device=None, sources=None: asked.append((device, sources)),
    )
    gpu = torch.device("cuda", 2)
    sdgp_semi._nm_kernel.cache_clear()
    try:
        nm._load_cuda(gpu)
        sdgp_semi._nm_kernel(gpu)
    finally:
        sdgp_semi._nm_kernel.cache_clear()
    comm._cuda_pack_module(gpu)
    assert asked == [
        (gpu, ("nm_prune.cu",)),
        (gpu, ("nm_prune.cu",)),
        (gpu, ("pack.cu",)),
    ]


def test_load_rejects_an_unknown_source():
    with pytest.raises(ValueError, match="unknown kernel source 'nope.cu'; valid: pattern.cu"):
        loader.load("nope.cu")


def test_the_products_refuse_operands_that_disagree_before_any_launch():
    """The kernels read values by column index and walk row_ptr over the gradient's rows:
    operands of other lengths would read past an end or leave rows unwritten."""
    idx = pattern_index(torch.rand(6, 2, 3, 3) < 0.5)
    vals = torch.randn(idx.col_ind.numel())
    b = torch.randn(18, 7)
    with pytest.raises(ValueError, match=r"values \(\d+,\) must be 1-D, one per column"):
        pattern_cuda._spmm(vals[:-1], idx.row_ptr, idx.col_ind, b)
    with pytest.raises(ValueError, match="must be 1-D"):
        pattern_cuda._spmm(vals.reshape(1, -1), idx.row_ptr, idx.col_ind, b)
    for grad in (torch.randn(5, 7), torch.randn(2, 7, 7), torch.randn(6)):
        with pytest.raises(ValueError, match="row_ptr of 6 rows for a gradient"):
            pattern_cuda._sddmm(idx.row_ptr, idx.col_ind, grad, torch.randn(18, 7))


def _cpu_calls():
    idx = pattern_index(torch.rand(6, 2, 3, 3) < 0.5)
    w = torch.randn(6, 2, 3, 3)
    x = torch.randn(2, 2, 5, 5)
    vals = pattern_csr(w, idx.row_ptr, idx.col_ind, impl="ref")
    b = torch.randn(18, 7)
    g = torch.randn(3, 4)
    i = torch.tensor([0, 5, 7], dtype=torch.int32)
    return {
        "pattern_csr": lambda: pattern_cuda.pattern_csr_cuda(w, idx.row_ptr, idx.col_ind),
        "pattern_spmm": lambda: pattern_cuda.pattern_spmm_cuda(
            vals, idx.row_ptr, idx.col_ind, b, index=idx
        ),
        "pattern_conv2d": lambda: pattern_cuda.pattern_conv2d_cuda(x, w, idx, padding=1),
        "pattern_conv2d_explicit": lambda: pattern_cuda.pattern_conv2d_cuda(
            x, w, idx, padding=1, implicit=False
        ),
        "nm_prune": lambda: nm_cuda.nm_prune_cuda(x, 2, 4),
        "nm_prune_op": lambda: torch.ops.pdtbench.nm_prune(x, 2, 4, 2, 1, False, None, 1e-4),
        "grad_pack": lambda: pack_cuda.grad_pack(g, i, impl="cuda"),
        "grad_unpack": lambda: pack_cuda.grad_unpack(g.reshape(-1)[:3], i, (3, 4), impl="cuda"),
    }


CPU_CALLS = list(_cpu_calls())


# The function with an ``impl`` argument each CUDA op names when handed CPU tensors.
CPU_CALL_PUBLIC = {
    "pattern_csr": "impl.ops.pattern_csr",
    "pattern_spmm": "impl.ops.pattern_spmm",
    "pattern_conv2d": "impl.ops.pattern_conv2d",
    "pattern_conv2d_explicit": "impl.ops.pattern_conv2d",
    "nm_prune": "impl.ops.nm_prune",
    "nm_prune_op": "impl.ops.nm_prune",
    "grad_pack": "impl.ops.grad_pack",
    "grad_unpack": "impl.ops.grad_unpack",
}


def test_cuda_op_on_gpu_operands_with_a_cpu_index_says_to_move_the_index():
    """impl='auto' takes the kernels for GPU operands; an index left on the CPU is named as
    what to move, not answered with "use impl='auto'", which the caller already did."""
    on = types.SimpleNamespace  # only .device is read: no GPU needed
    gpu_operand, cpu_index = on(device=torch.device("cuda", 0)), on(device=torch.device("cpu"))
    with pytest.raises(RuntimeError, match=r"every tensor on the GPU, got cpu, cuda:0; move"):
        device_check.check_devices("pattern_spmm", "impl.ops.pattern_spmm", gpu_operand, cpu_index)
    device_check.check_devices("pattern_spmm", "impl.ops.pattern_spmm", gpu_operand, gpu_operand)


@pytest.mark.parametrize("op", CPU_CALLS, ids=CPU_CALLS)
def test_cuda_op_on_cpu_tensors_raises_a_clear_error(op):
    public = re.escape(CPU_CALL_PUBLIC[op])
    match = f"needs CUDA tensors, got cpu; use impl='ref' \\(or 'auto'\\) of {public},"
    with pytest.raises(RuntimeError, match=match):
        _cpu_calls()[op]()


def test_expand_source_pastes_each_header_once_and_the_hash_follows_it(tmp_path):
    (tmp_path / "h.cuh").write_text("#pragma once\n#define ANSWER 41\n")
    (tmp_path / "k.cu").write_text(
        '#include "h.cuh"\n#include "h.cuh"\nint f() { return ANSWER; }\n'
    )
    text = loader.expand_source("k.cu", tmp_path)
    assert text.count("#define ANSWER 41") == 1
    assert "#include" not in text and "pragma once" not in text
    before = loader.source_hash("k.cu", tmp_path)
    (tmp_path / "h.cuh").write_text("#pragma once\n#define ANSWER 42\n")
    assert loader.source_hash("k.cu", tmp_path) != before
    assert "pdt_philox" in loader.expand_source("nm_prune.cu")


def test_compile_options_carry_every_define_and_no_fast_math():
    opts = loader.compile_options()
    assert opts[0] == f"--std={loader.CXX_STD}"
    assert {o for o in opts if o.startswith("-D")} == {
        f"-D{k}={v}" for k, v in loader.DEFINES.items()
    }
    assert not any("fast" in o for o in opts)


class _OnGpu(torch.Tensor):
    """A CPU tensor that says it is on ``cuda:<gpu>`` (only ``device`` and ``is_cuda`` are
    read by the checks below): device checks without a GPU."""

    gpu = 0

    @property
    def is_cuda(self):
        return True

    @property
    def device(self):
        return torch.device("cuda", self.gpu)


def _on_gpu(index: int) -> torch.Tensor:
    t = torch.zeros(4).as_subclass(_OnGpu)
    t.gpu = index
    return t


def test_kernel_args_are_pointers_null_and_numpy_scalars_only():
    t = _on_gpu(1)
    args = loader.kernel_args([t, None, np.int32(7), np.float64(0.5)], 1, "k")
    assert [type(a) for a in args] == [np.uint64, np.uint64, np.int32, np.float64]
    assert args == (np.uint64(t.data_ptr()), np.uint64(0), np.int32(7), np.float64(0.5))
    assert args[0] == t.data_ptr() and args[1] == 0 and args[2] == 7
    with pytest.raises(ValueError, match=r"k: tensor on cuda:1, expected cuda:0"):
        loader.kernel_args([t], 0, "k")
    with pytest.raises(ValueError, match=r"k: tensor on cuda:0, expected cuda:1"):
        loader.kernel_args([_on_gpu(0)], 1, "k")
    with pytest.raises(ValueError, match=r"k: tensor on cpu, expected cuda:0"):
        loader.kernel_args([torch.zeros(2)], 0, "k")
    for bad in (3, 0.5):
        with pytest.raises(TypeError, match="pass numpy scalars of the kernel's exact types"):
            loader.kernel_args([bad], 0, "k")


def test_require_cuda_names_the_op_and_what_is_wrong():
    with pytest.raises(
        RuntimeError, match=r"op: the CUDA implementation needs CUDA tensors, got cpu, cuda:0"
    ):
        loader.require_cuda("op", torch.zeros(2), _on_gpu(0))
    with pytest.raises(
        RuntimeError, match=r"op: tensors on several devices: \['cuda:0', 'cuda:1'\]"
    ):
        loader.require_cuda("op", _on_gpu(0), _on_gpu(1))
    assert loader.require_cuda("op", _on_gpu(2), _on_gpu(2), sources=()) == 2
    if NO_GPU:
        with pytest.raises(RuntimeError, match="^op: CUDA kernels unavailable: no CUDA GPU"):
            loader.require_cuda("op", _on_gpu(0), sources=("pack.cu",))


def test_device_index_of_ints_devices_and_the_current_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 5)
    assert loader._device_index(3) == 3
    assert loader._device_index(torch.device("cuda", 2)) == 2
    assert loader._device_index("cuda:1") == 1
    assert loader._device_index("cuda") == 5
    assert loader._device_index(None) == 5
    with pytest.raises(ValueError, match="not a CUDA device: cpu"):
        loader._device_index(torch.device("cpu"))


def test_environment_check_names_a_missing_cupy_and_is_kept_once_it_passes(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy raises ImportError
    loader.clear_caches()
    try:
        reason = loader._environment_error()
        assert re.fullmatch(
            r"CuPy could not be imported \(\w*Error: .+\); pip install cupy\S*", reason
        )
        monkeypatch.setitem(sys.modules, "cupy", types.ModuleType("cupy"))
        assert loader._environment_error() is None
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        assert loader._environment_error() is None  # found once: not asked again
        loader.clear_caches()
        assert "torch.cuda.is_available() is False" in loader._environment_error()
    finally:
        loader.clear_caches()


def test_clear_caches_forgets_modules_functions_failures_and_limits(monkeypatch):
    attrs = {"MaxSharedMemoryPerBlockOptin": 1234}
    cupy = types.ModuleType("cupy")
    cupy.cuda = types.SimpleNamespace(Device=lambda i: types.SimpleNamespace(attributes=attrs))
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    try:
        loader.clear_caches()
        assert loader.max_shared_per_block(0) == 1234
        key = ("pack.cu", 0)
        loader._modules[("pack.cu", "hash", 0, (9, 0))] = object()
        loader._loaded[key] = object()
        loader._errors[key] = "failed"
        loader._functions[("pack.cu", "k", 0)] = object()
        loader._dynamic_smem_set[("pack.cu", "k", 0)] = 1024
        monkeypatch.setattr(loader, "_last_error", "failed")
        monkeypatch.setattr(loader, "_environment_ok", True)
        loader.clear_caches()
        for cache in (loader._modules, loader._loaded, loader._errors, loader._functions,
                      loader._dynamic_smem_set):  # fmt: skip
            assert cache == {}
        assert loader._last_error is None and loader._environment_ok is False
        attrs["MaxSharedMemoryPerBlockOptin"] = 4321
        assert loader.max_shared_per_block(0) == 4321  # asked again, not the cached 1234
    finally:
        loader.clear_caches()  # nothing of the fake CuPy stays cached


def test_source_hash_follows_the_compile_options(tmp_path, monkeypatch):
    (tmp_path / "k.cu").write_text("int f() { return 1; }\n")
    before = loader.source_hash("k.cu", tmp_path)
    assert loader.source_hash("k.cu", tmp_path) == before
    monkeypatch.setitem(loader.DEFINES, "PDT_NM_BLOCK", loader.DEFINES["PDT_NM_BLOCK"] * 2)
    assert loader.source_hash("k.cu", tmp_path) != before


def test_launched_is_a_copy_of_the_launch_record(monkeypatch):
    monkeypatch.setattr(loader, "_launches", collections.Counter({"k": 2}))
    record = loader.launched()
    assert record == {"k": 2}
    record["k"] = 99
    assert loader.launched() == {"k": 2}


# -- fake implementations ---------------------------------------------------------------------


def _fake_index(f_out: int, k: int, nnz: int) -> PatternIndex:
    def e(n):
        return torch.empty(n, dtype=torch.int64, device="cuda")

    return PatternIndex(e(f_out + 1), e(nnz), e(k + 1), e(nnz), e(nnz), (f_out, k))


CONV_FAKE = [
    ((2, 8, 9, 9), (16, 8, 3, 3), 1, 1, 1),
    ((3, 5, 11, 7), (7, 5, 3, 3), 2, 1, 2),
    ((1, 4, 8, 8), (6, 4, 1, 1), 1, 0, 1),
    ((2, 3, 13, 10), (5, 3, 5, 3), (2, 1), (2, 1), 1),
]
CONV_FAKE_IDS = ["3x3", "stride2-dil2", "1x1", "rect"]


FAKE_MODES = [("fake-cuda", True), ("meta", True), ("meta", False)]
FAKE_MODE_IDS = ["fake-cuda-implicit", "meta-implicit", "meta-explicit"]


@pytest.mark.parametrize("mode", FAKE_MODES, ids=FAKE_MODE_IDS)
@pytest.mark.parametrize("case", CONV_FAKE, ids=CONV_FAKE_IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_fake_conv_matches_torch_conv_shape(case, mode, dtype):
    """Fake CUDA tensors work without a GPU for the implicit op; the explicit path's unfold
    needs a CUDA build under FakeTensorMode, so it is checked on meta tensors."""
    xs, ws, stride, padding, dilation = case
    where, implicit = mode
    expected = F.conv2d(
        torch.empty(xs, device="meta"),
        torch.empty(ws, device="meta"),
        None,
        stride,
        padding,
        dilation,
    ).shape
    k = math.prod(ws[1:])
    if where == "meta":
        idx = pattern_index(torch.rand(ws) < 0.5)
        idx = PatternIndex(*(t.to("meta") for t in idx[:5]), idx.shape)
        x = torch.empty(xs, device="meta", dtype=dtype)
        w = torch.empty(ws, device="meta", dtype=dtype)
        out = pattern_cuda.pattern_conv2d_cuda(
            x, w, idx, None, stride, padding, dilation, implicit=implicit
        )
    else:
        with FakeTensorMode():
            x = torch.empty(xs, device="cuda", dtype=dtype)
            w = torch.empty(ws, device="cuda", dtype=dtype)
            idx = _fake_index(ws[0], k, 11)
            out = pattern_cuda.pattern_conv2d_cuda(
                x, w, idx, None, stride, padding, dilation, implicit=implicit
            )
    assert out.shape == expected and out.dtype == dtype
    assert out.device.type == ("meta" if where == "meta" else "cuda")


def test_fakes_of_csr_spmm_sddmm_and_scatter():
    with FakeTensorMode():
        idx = _fake_index(16, 72, 30)
        w = torch.empty(16, 8, 3, 3, device="cuda", dtype=torch.float64)
        vals = pattern_cuda.pattern_csr_cuda(w, idx.row_ptr, idx.col_ind)
        assert vals.shape == (30,) and vals.dtype == torch.float64
        # index given: building the transpose has data-dependent shapes (not traceable)
        out2 = pattern_cuda.pattern_spmm_cuda(
            vals,
            idx.row_ptr,
            idx.col_ind,
            torch.empty(72, 33, device="cuda", dtype=w.dtype),
            index=idx,
        )
        out3 = pattern_cuda.pattern_spmm_cuda(
            vals,
            idx.row_ptr,
            idx.col_ind,
            torch.empty(3, 72, 33, device="cuda", dtype=w.dtype),
            index=idx,
        )
        g = torch.ops.pdtbench.sddmm(
            idx.row_ptr, idx.col_ind, torch.empty(3, 16, 33, device="cuda"), out3.float()
        )
        d = torch.ops.pdtbench.csr_scatter(vals, idx.row_ptr, idx.col_ind, [16, 8, 3, 3])
    assert out2.shape == (16, 33) and out3.shape == (3, 16, 33)
    assert g.shape == (30,) and g.dtype == torch.float32
    assert d.shape == (16, 8, 3, 3) and d.dtype == torch.float64


@pytest.mark.parametrize("implicit", [True, False], ids=["implicit", "explicit"])
def test_autograd_through_the_ops_gives_gradient_shapes_on_meta(implicit):
    mask = torch.rand(16, 8, 3, 3, generator=torch.Generator().manual_seed(3)) < 0.4
    idx = pattern_index(mask)
    midx = PatternIndex(*(t.to("meta") for t in idx[:5]), idx.shape)
    x = torch.empty(2, 8, 9, 9, device="meta", requires_grad=True)
    w = torch.empty(16, 8, 3, 3, device="meta", requires_grad=True)
    b = torch.empty(16, device="meta", requires_grad=True)
    out = pattern_cuda.pattern_conv2d_cuda(x, w, midx, b, 2, 1, implicit=implicit)
    assert out.shape == (2, 16, 5, 5)
    out.sum().backward()
    assert x.grad.shape == x.shape and w.grad.shape == w.shape and b.grad.shape == b.shape


def test_autograd_of_spmm_batched_on_meta():
    idx = pattern_index(torch.rand(7, 13, generator=torch.Generator().manual_seed(4)) < 0.5)
    midx = PatternIndex(*(t.to("meta") for t in idx[:5]), idx.shape)
    vals = torch.empty(idx.col_ind.numel(), device="meta", requires_grad=True)
    b = torch.empty(3, 13, 10, device="meta", requires_grad=True)
    out = pattern_cuda.pattern_spmm_cuda(vals, midx.row_ptr, midx.col_ind, b, index=midx)
    out.sum().backward()
    assert out.shape == (3, 7, 10) and vals.grad.shape == vals.shape and b.grad.shape == b.shape


@pytest.mark.parametrize("fmt", ["nchw", "channels_last"], ids=["nchw", "channels_last"])
@pytest.mark.parametrize(
    "dtype",
    [torch.float32, torch.float64, torch.float16, torch.bfloat16],
    ids=["f32", "f64", "f16", "bf16"],
)
def test_fake_nm_prune_keeps_shape_dtype_and_memory_format(fmt, dtype):
    with FakeTensorMode():
        x = torch.empty(4, 12, 5, 7, device="cuda", dtype=dtype)
        if fmt == "channels_last":
            x = x.to(memory_format=torch.channels_last)
        y = nm_cuda.nm_prune_cuda(x, 2, 4, "rescaled")
    assert y.shape == x.shape and y.dtype == dtype and y.stride() == x.stride()


def test_expand_starts_count_the_positions_below_each_tile_and_check_cpu_indices():
    tile = pack_cuda.EXPAND_TILE
    idx = torch.tensor([0, 5, tile - 1, tile, tile + 3, 3 * tile + 2], dtype=torch.int32)
    starts = pack_cuda.expand_starts(idx, 3 * tile + 3)  # 4 tiles
    assert starts.dtype == torch.int64 and starts.tolist() == [0, 3, 5, 5, 6]
    assert pack_cuda.expand_starts(idx[:0], 10).tolist() == [0, 0]
    with pytest.raises(ValueError, match="strictly ascending"):
        pack_cuda.expand_starts(torch.tensor([3, 1]), 10)
    with pytest.raises(ValueError, match="strictly ascending"):
        pack_cuda.expand_starts(torch.tensor([1, 1]), 10)
    with pytest.raises(ValueError, match=r"lie in \[0, 10\)"):
        pack_cuda.expand_starts(torch.tensor([1, 10]), 10)


def test_expand_starts_of_an_int32_index_count_tiles_past_2_31():
    numel = 2**31 + 2 * pack_cuda.EXPAND_TILE  # positions past int32, tile bounds with them
    idx = torch.tensor([5, 2**31 - 1], dtype=torch.int32)  # in the last tile below 2**31
    starts = pack_cuda.expand_starts(idx, numel)
    first_past = 2**31 // pack_cuda.EXPAND_TILE  # the tile bound at exactly 2**31
    assert starts.numel() == first_past + 3
    assert starts[:2].tolist() == [0, 1]
    assert starts[first_past - 1 : first_past + 1].tolist() == [1, 2]  # 2**31 - 1 below 2**31
    assert starts[-1].item() == 2


def test_nm_prune_cuda_checks_its_arguments_as_nm_prune_does():
    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match="eps must be a finite number >= 0"):
        nm_cuda.nm_prune_cuda(x, 2, 4, eps=-1.0)
    with pytest.raises(ValueError, match="eps must be a finite number >= 0"):
        nm_cuda.nm_prune_cuda(x, 2, 4, eps=float("nan"))
    with pytest.raises(ValueError, match="dim must be an int"):
        nm_cuda.nm_prune_cuda(x, 2, 4, dim=True)
    with pytest.raises(ValueError, match="not differentiable"):
        nm_cuda.nm_prune_cuda(x.requires_grad_(), 2, 4)
    with pytest.raises(TypeError, match="generator must be a torch.Generator"):
        nm_cuda.nm_prune_cuda(x.detach(), 2, 4, "random", generator=7)


def test_the_nm_prune_op_refuses_random_pruning_without_a_seed():
    # the kernel reads the seed tensor's one value: without one it read address 0
    with pytest.raises(ValueError, match="random pruning needs a seed tensor"):
        torch.ops.pdtbench.nm_prune(torch.zeros(2, 4), 2, 4, nm_cuda.METHODS["random"], 1, False,
                                    None, 1e-4)  # fmt: skip


def test_nm_counts_must_fit_32_bits_with_c_rounded_up_to_whole_groups():
    def view(o, c, i):
        return nm_cuda.NMView(o, c, i, c * i, i, 1, 1, o)

    nm_cuda.check_counts("nm_prune", view(1, 2**31 - 4, 1), 4)  # C + 3 = 2**31 - 1 fits
    for shape in ((1, 2**31 - 3, 1), (2**31, 1, 1), (1, 4, 2**31), (2**16, 2**16, 2**16)):
        with pytest.raises(ValueError, match="exceed the kernels' 32-bit counts"):
            nm_cuda.check_counts("nm_prune", view(*shape), 4)
    # I rounded up to whole units of 8 half-precision positions (4 single-precision ones)
    nm_cuda.check_counts("nm_prune", view(1, 2, 2**31 - 8), 2, itemsize=2)
    nm_cuda.check_counts("nm_prune", view(1, 2, 2**31 - 4), 2, itemsize=4)
    with pytest.raises(ValueError, match="exceed the kernels' 32-bit counts"):
        nm_cuda.check_counts("nm_prune", view(1, 2, 2**31 - 7), 2, itemsize=2)


def test_csr_scatter_refuses_an_index_of_another_shape_before_any_launch():
    row_ptr, col_ind = torch.tensor([0, 1, 2]), torch.tensor([0, 3])
    with pytest.raises(ValueError, match=r"row_ptr has 3 entries for shape \[8, 9\]"):
        pattern_cuda._csr_scatter(torch.ones(2), row_ptr, col_ind, [8, 9])
    with pytest.raises(ValueError, match="3 values for 2 columns"):
        pattern_cuda._csr_scatter(torch.ones(3), row_ptr, col_ind, [2, 9])
    with pytest.raises(RuntimeError, match="needs CUDA tensors"):
        pattern_cuda._csr_scatter(torch.ones(2), row_ptr, col_ind, [2, 9])


def test_expand_refuses_a_wrong_tile_table_before_any_launch():
    idx = torch.tensor([1, 4], dtype=torch.int64)
    out = torch.zeros(10)
    with pytest.raises(ValueError, match=r"starts must be expand_starts\(index, 10\)"):
        pack_cuda._expand_into(torch.ones(2), idx, torch.zeros(3, dtype=torch.int64), out)
    with pytest.raises(ValueError, match="must match index"):
        pack_cuda._expand_into(torch.ones(3), idx, pack_cuda.expand_starts(idx, 10), out)
    with pytest.raises(RuntimeError, match="needs CUDA tensors"):
        pack_cuda._expand_into(torch.ones(2), idx, pack_cuda.expand_starts(idx, 10), out)


def test_fake_pack_and_unpack():
    with FakeTensorMode():
        g = torch.empty(10, 10, device="cuda", dtype=torch.bfloat16)
        i = torch.empty(30, dtype=torch.int32, device="cuda")
        buf = pack_cuda.grad_pack(g, i, impl="cuda")
        back = pack_cuda.grad_unpack(buf, i, (10, 10), impl="cuda")
        out = pack_cuda.unpack(buf, i, torch.empty(100, device="cuda", dtype=torch.bfloat16))
        starts = torch.empty(2, dtype=torch.int64, device="cuda")
        full = pack_cuda.expand(buf, i, starts, torch.empty(100, device="cuda", dtype=buf.dtype))
    assert full.shape == (100,) and full.dtype == torch.bfloat16
    assert buf.shape == (30,) and buf.dtype == torch.bfloat16
    assert back.shape == (10, 10) and out.shape == (100,)


def test_opcheck_schemas_and_fakes_on_meta():
    idx = pattern_index(torch.rand(9, 20, generator=torch.Generator().manual_seed(5)) < 0.5)
    m = {k: getattr(idx, k).to("meta") for k in ("row_ptr", "col_ind")}
    nnz = idx.col_ind.numel()
    cases = [
        (torch.ops.pdtbench.pattern_csr.default, (torch.empty(9, 20, device="meta"),)),
        (torch.ops.pdtbench.spmm.default, (torch.empty(nnz, device="meta"),)),
    ]
    for op, first in cases:
        args = (*first, m["row_ptr"], m["col_ind"])
        if op is torch.ops.pdtbench.spmm.default:
            args = (*args, torch.empty(20, 6, device="meta"))
        torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor"))


# -- launch planning ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "case",
    [
        (torch.float32, 1024, (1024, 4096), (0, 64), True),
        (torch.float32, 1023, (1023,), (0,), False),
        (torch.float32, 1024, (1026,), (0,), False),
        (torch.float32, 1024, (1024,), (4,), False),
        (torch.float64, 6, (6, 12), (16, 32), True),
        (torch.float64, 7, (8,), (0,), False),
    ],
    ids=["f32-aligned", "f32-odd-n", "f32-odd-ld", "f32-misaligned-ptr", "f64-aligned", "f64-odd"],
)
def test_vector_ok(case):
    dtype, n, strides, ptrs, expected = case
    assert pattern_cuda.vector_ok(dtype, n, strides, ptrs) is expected


def test_spmm_grid_covers_rows_and_columns_and_rejects_too_many_columns():
    tn = pattern_cuda.TILE_N[torch.float32]
    assert pattern_cuda.spmm_grid(torch.float32, 256, 50176, 1) == (
        256 // pattern_cuda.WARPS,
        math.ceil(50176 / tn),
        1,
    )
    assert pattern_cuda.spmm_grid(torch.float64, 17, 1, 3) == (3, 1, 3)
    with pytest.raises(ValueError, match="exceed one launch"):
        pattern_cuda.spmm_grid(torch.float32, 8, 65536 * tn, 1)


def test_row_tiled_grid_has_a_block_per_warps_times_rows_per_warp_rows():
    rw32 = pattern_cuda.ROWS_PER_WARP[torch.float32]
    rw64 = pattern_cuda.ROWS_PER_WARP[torch.float64]
    w = pattern_cuda.WARPS
    assert pattern_cuda.spmm_grid(torch.float32, 256, 50176, 1, "row_tiled")[0] == math.ceil(
        256 / (w * rw32)
    )
    assert pattern_cuda.spmm_grid(torch.float64, w * rw64 + 1, 7, 2, "row_tiled") == (2, 1, 2)
    assert pattern_cuda.spmm_grid(torch.float32, 256, 50176, 1, "pipelined") == (
        pattern_cuda.spmm_grid(torch.float32, 256, 50176, 1, "row_tiled")
    )
    with pytest.raises(
        ValueError, match="unknown spmm path 'tiled'; valid: row_tiled, warp_row, pipelined"
    ):
        pattern_cuda.spmm_grid(torch.float32, 8, 8, 1, "tiled")


def test_spmm_variants_prefer_row_tiled_within_its_32_bit_offsets():
    # the automatic choice: the proven kernels; every kernel runs when named
    assert pattern_cuda.spmm_variants(torch.float32, 1152) == ("row_tiled", "warp_row")
    assert pattern_cuda.spmm_kernels(torch.float32, 1152) == pattern_cuda.SPMM_VARIANTS
    assert "pipelined" in pattern_cuda.SPMM_UNPROVEN
    # A warp's rows hold at most RW * K nonzeros: offsets up to RW * K - 1, plus a lane (31).
    rw = pattern_cuda.ROWS_PER_WARP[torch.float64]
    too_long = -(-(2**31 - 32) // rw)  # the first K with RW * K >= 2^31 - 32
    assert rw * (too_long - 1) - 1 + 31 <= 2**31 - 1  # the largest K taken: offsets fit
    assert pattern_cuda.spmm_variants(torch.float64, too_long - 1)[0] == "row_tiled"
    assert pattern_cuda.spmm_variants(torch.float64, too_long) == ("warp_row",)
    assert pattern_cuda.spmm_kernels(torch.float64, too_long) == ("warp_row",)


def test_implicit_conv_refuses_a_column_offset_past_32_bits(monkeypatch):
    # A tiny image with a dilation so large that c*H*W + r*dh*W overflows int32: the kernels
    # would read from a wrapped offset, so the launcher refuses before launching anything.
    monkeypatch.setattr(device_check, "require_cuda", lambda op, public, *t, sources=(): 0)
    monkeypatch.setattr(loader, "launch", lambda *a, **k: pytest.fail("launched"))
    x = torch.zeros(1, 2, 4, 4)
    row_ptr, col_ind = torch.tensor([0, 1]), torch.tensor([5])  # c = 1, r = 2, s = 0
    values = torch.ones(1)
    dh = 2**29  # (r - 1) * dh * W = 2^31
    args = (x, (1, 2, 3, 1), values, row_ptr, col_ind, None, (1, 1), (dh, 0), (dh, 1))
    with pytest.raises(ValueError, match="32-bit range"):
        pattern_cuda._conv_implicit(*args)
    ok = (x, (1, 2, 3, 1), values, row_ptr, col_ind, None, (1, 1), (1, 0), (1, 1))
    monkeypatch.setattr(pattern_cuda, "_pick", lambda op, problem, cands, run, out: cands[0])
    launched = []
    monkeypatch.setattr(loader, "launch", lambda *a, **k: launched.append(a[1]))
    pattern_cuda._conv_implicit(*ok)  # the same problem at dilation 1 goes on to launch
    assert launched


@pytest.fixture
def timing_allowed(monkeypatch):
    """The ops' choice as on a GPU: timing allowed, a fresh cache, fake timings by path."""
    monkeypatch.setattr(timed_choice, "_CHOICE", {})
    monkeypatch.setattr(timed_choice, "_TIMES", {})
    monkeypatch.setattr(timed_choice, "can_time", lambda t: True)
    ms = {"row_tiled": 2.0, "warp_row": 1.0, "sddmm": 3.0, "dense": 1.0, "spmm": 4.0}
    ms.update(implicit_tiled=2.0, implicit=1.0, fused=1.0, three_pass=2.0)
    monkeypatch.setattr(timed_choice, "cuda_ms", lambda fn, device=None: ms[fn()])
    return ms


@pytest.mark.parametrize("benchmark_mode", [False, True], ids=["cudnn-fixed", "cudnn-benchmark"])
def test_pick_times_same_bit_kernels_always_and_gradient_paths_with_cudnn(
    timing_allowed, monkeypatch, benchmark_mode
):
    """SpMM and conv kernels (same bits) are timed wherever timing is allowed; the gradient paths
    (different summation orders) only under cudnn.benchmark, else the default runs."""
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", benchmark_mode)
    monkeypatch.setattr(timed_choice, "_USES", collections.Counter())
    like = torch.zeros(1)
    auto = pattern_cuda.spmm_variants(torch.float32, 1152)  # what _spmm offers the choice
    spmm = pattern_cuda._pick("spmm", "p", auto, lambda p: p, like)
    assert spmm == "warp_row"
    conv = pattern_cuda._pick(
        "conv_forward", "p", ("implicit_tiled", "implicit"), lambda p: p, like
    )
    assert conv == "implicit"
    wgrad = pattern_cuda._pick("weight_grad", "p", ("sddmm", "dense"), lambda p: p, like)
    igrad = pattern_cuda._pick("input_grad", "p", ("spmm", "dense"), lambda p: p, like)
    assert (wgrad, igrad) == (("dense", "dense") if benchmark_mode else ("sddmm", "spmm"))
    assert timed_choice.uses() == {
        "conv_forward implicit": 1,
        "spmm warp_row": 1,
        f"weight_grad {wgrad}": 1,
        f"input_grad {igrad}": 1,
    }, "every pick is counted"
    with pattern_cuda.forced_path("weight_grad", "sddmm"):
        assert pattern_cuda._pick("weight_grad", "q", ("sddmm", "dense"), lambda p: p, like) == (
            "sddmm"
        )
    with pattern_cuda.forced_path("spmm", "row_tiled"):  # not possible here: the first runs
        assert pattern_cuda._pick("spmm", "q", ("warp_row",), lambda p: p, like) == "warp_row"


def test_forced_path_names_the_valid_ops_and_paths():
    with pytest.raises(ValueError, match="unknown op 'conv'; valid: .*spmm, weight_grad"):
        pattern_cuda.forced_path("conv", "dense")
    with pytest.raises(ValueError, match="unknown weight_grad path 'cusparse'; valid: sddmm"):
        pattern_cuda.forced_path("weight_grad", "cusparse")


@pytest.mark.parametrize(
    "case",
    [(256, 50176, 1, 132, 4), (64, 1024, 128, 132, 4), (7, 29, 3, 108, 1), (1, 5, 1, 132, 2)],
    ids=["paper", "conv-batch", "odd", "tiny"],
)
def test_sddmm_split_covers_every_column_and_batch(case):
    n_rows, n_cols, batch, sms, vec = case
    n_chunk, b_group, gy, gz = pattern_cuda.sddmm_split(n_rows, n_cols, batch, sms, vec)
    assert n_chunk % vec == 0 and n_chunk >= 1 and b_group >= 1
    assert gy * n_chunk >= n_cols and (gy - 1) * n_chunk < n_cols
    assert gz * b_group >= batch and (gz - 1) * b_group < batch
    assert gy <= 65535 and gz <= 65535


@pytest.mark.parametrize("case", CONV_FAKE, ids=CONV_FAKE_IDS)
def test_conv_output_size_matches_torch(case):
    xs, ws, stride, padding, dilation = case
    st, pad, dil = (pattern_cuda._pair(v) for v in (stride, padding, dilation))
    got = pattern_cuda.conv_output_size(xs[2], xs[3], ws[2], ws[3], st, pad, dil)
    ref = F.conv2d(
        torch.empty(xs, device="meta"),
        torch.empty(ws, device="meta"),
        None,
        stride,
        padding,
        dilation,
    ).shape[2:]
    assert got == tuple(ref)


NM_VIEW_CASES = [
    ((4, 6, 5, 7), 1, False),
    ((4, 6, 5, 7), 1, True),
    ((3, 4, 12, 5), 2, False),
    ((6, 9, 3, 3), 0, False),
    ((5, 37), 1, False),
    ((41,), 0, False),
    ((2, 1, 8, 1), 2, False),
]
NM_VIEW_IDS = ["nchw", "channels_last", "dim2", "dim0", "2d", "1d", "size1-dims"]


@pytest.mark.parametrize("rescale", ["plane", "channel"], ids=["plane", "channel"])
@pytest.mark.parametrize("case", NM_VIEW_CASES, ids=NM_VIEW_IDS)
def test_nm_view_addresses_the_tensor_and_groups_the_rescale_like_the_reference(case, rescale):
    shape, dim, channels_last = case
    x = torch.randn(shape, dtype=torch.float64)
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    v = nm_cuda.nm_view(x.shape, x.stride(), dim, rescale)
    assert v is not None
    # the kernel's address o*so + c*sc + i*si is element (o, c, i) of the logical [O, C, I]
    strided = x.as_strided((v.O, v.C, v.I), (v.so, v.sc, v.si), x.storage_offset())
    assert torch.equal(strided, x.reshape(v.O, v.C, v.I))
    # the rescale sums of the reference, per (batch, channel), from the view's nb and o2
    nd = x.dim()
    if rescale == "plane" and dim != 0 and nd > 1:
        red = [d for d in range(nd) if d not in (0, dim)]
        ref = x.abs().sum(dim=red) if red else x.abs()
        ref = ref.reshape(v.nb, v.C)
    else:
        red = [d for d in range(nd) if d != dim]
        ref = (x.abs().sum(dim=red) if red else x.abs()).reshape(1, v.C)
    ours = strided.abs().reshape(v.nb, v.o2, v.C, v.I).sum(dim=(1, 3))
    assert torch.allclose(ours, ref, rtol=1e-12, atol=0)


def test_nm_view_refuses_layouts_that_do_not_merge():
    x = torch.randn(4, 6, 10, 7)[:, :, ::2]
    assert nm_cuda.nm_view(x.shape, x.stride(), 1) is None
    y = torch.randn(4, 6, 5, 7).permute(2, 1, 0, 3)  # dims before dim 1 fine, after not
    assert nm_cuda.nm_view(y.shape, y.stride(), 1) is None


@pytest.mark.parametrize(
    "case",
    [(1, 1), (2, 2), (3, 4), (4, 4), (5, 8), (16, 16), (17, 32), (32, 32)],
    ids=["1", "2", "3", "4", "5", "16", "17", "32"],
)
def test_sub_warp_width_is_the_next_power_of_two(case):
    m, w = case
    assert nm_cuda.sub_warp_width(m) == w


def test_sub_warp_width_rejects_m_over_32():
    with pytest.raises(ValueError, match="1 <= m <= 32"):
        nm_cuda.sub_warp_width(33)


def test_stats_groups_per_block():
    nchw = nm_cuda.nm_view((8, 64, 4, 4), (1024, 16, 4, 1), 1)
    cl = nm_cuda.nm_view((8, 64, 4, 4), (1024, 1, 256, 64), 1)
    small = nm_cuda.nm_view((8, 8, 4, 4), (128, 1, 32, 8), 1)
    assert nm_cuda.stats_groups_per_block(nchw, 4) == 1
    assert nm_cuda.stats_groups_per_block(cl, 4) == 8  # 8 groups x 4 lanes = one warp
    assert nm_cuda.stats_groups_per_block(cl, 32) == 1
    assert nm_cuda.stats_groups_per_block(small, 4) == 2  # only 2 groups exist


@pytest.mark.parametrize(
    "bad",
    [
        dict(n=3, m=2),
        dict(n=1, m=33),
        dict(n=0, m=4),
        dict(method="top"),
        dict(rescale="global"),
        dict(dim=4),
        dict(x=torch.zeros(2, 4, dtype=torch.int32)),
    ],
    ids=["n>m", "m>32", "n=0", "method", "rescale", "dim", "int-dtype"],
)
def test_nm_prune_cuda_rejects_bad_arguments_before_touching_a_device(bad):
    args = dict(x=torch.randn(2, 8, 3, 3), n=2, m=4, method="rescaled", dim=1, rescale="plane")
    args.update(bad)
    with pytest.raises(ValueError):
        nm_cuda.nm_prune_cuda(**args)


def _emulated_keep(scores: torch.Tensor, n: int, m: int) -> torch.Tensor:
    """The kernels' rank rule in torch: element k of a group is kept when fewer than n of the
    group's elements sort before it (greater score, NaN greatest, or equal and lower index)."""
    c = scores.shape[-1]
    g = -(-c // m)
    s = F.pad(scores, (0, g * m - c), value=float("nan")).reshape(-1, g, m)
    valid = F.pad(torch.ones(c, dtype=torch.bool), (0, g * m - c)).reshape(g, m)
    a, b = s.unsqueeze(-1), s.unsqueeze(-2)  # a: element k, b: element j
    gt = (b > a) | (b.isnan() & ~a.isnan())
    eq = ~((a > b) | (a.isnan() & ~b.isnan())) & ~gt
    j_lt_k = torch.arange(m).view(1, m) < torch.arange(m).view(m, 1)
    before = (gt | (eq & j_lt_k)) & valid.unsqueeze(-2)
    keep = (before.sum(-1) < n) & valid
    return keep.reshape(-1, g * m)[:, :c].reshape(scores.shape)


@pytest.mark.parametrize(
    "nm", [(2, 4), (1, 3), (5, 8), (3, 7), (16, 32)], ids=["2:4", "1:3", "5:8", "3:7", "16:32"]
)
def test_kernel_rank_rule_equals_the_reference_tie_rule(nm):
    n, m = nm
    x = torch.randint(-3, 4, (6, 37), dtype=torch.float32) * 0.5  # many ties and zeros
    x[0, 3] = float("nan")
    x[1, :5] = float("nan")
    x[2, 7] = float("inf")
    x[3, 9] = -0.0
    ref = nm_prune_ref(x, n, m, "magnitude", dim=1)
    keep = _emulated_keep(x.abs(), n, m)
    emulated = torch.where(keep, x, torch.zeros((), dtype=x.dtype))
    assert torch.equal(emulated.view(torch.int32), ref.view(torch.int32))


# -- pack references --------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(1,), (7, 11), (3, 5, 3, 3)], ids=["1", "7x11", "conv"])
def test_pack_reference_round_trip(shape):
    mask = torch.rand(shape) < 0.4
    g = torch.randn(shape)
    idx = pack_cuda.mask_index(mask)
    assert idx.dtype == torch.int32 and idx.numel() == int(mask.sum())
    buf = pack_cuda.grad_pack(g, idx)
    assert torch.equal(buf, g[mask])
    assert torch.equal(pack_cuda.grad_unpack(buf, idx, shape), g * mask)


def test_pack_dispatch_errors():
    g, i = torch.randn(5), torch.tensor([1, 3])
    with pytest.raises(ValueError, match="unknown impl 'gpu'"):
        pack_cuda.grad_pack(g, i, impl="gpu")
    with pytest.raises(ValueError, match="int32 or int64"):
        pack_cuda.grad_pack(g, i.float())
    with pytest.raises(ValueError, match="int32 or int64"):
        pack_cuda.mask_index(g > 0, torch.int16)


@pytest.mark.parametrize(
    ("op", "index", "buffer", "message"),
    [
        ("pack", [0, -1], None, r"index must lie in \[0, 6\).*got -1"),
        ("pack", [0, 6], None, r"index must lie in \[0, 6\).*got 6"),
        ("unpack", [1, -2], [1.0, 2.0], r"index must lie in \[0, 6\).*got -2"),
        ("unpack", [1, 7], [1.0, 2.0], r"index must lie in \[0, 6\).*got 7"),
        ("unpack", [1, 1], [1.0, 2.0], "must not repeat a position"),
        ("unpack", [0, 2, 4], [1.0], r"buffer \(1,\) must match index \(3,\)"),
        ("unpack", [0, 2], [[1.0, 2.0]], r"buffer \(1, 2\) must match index \(2,\)"),
    ],
    ids=["pack-negative", "pack-past-end", "unpack-negative", "unpack-past-end",
         "unpack-duplicate", "unpack-broadcast-buffer", "unpack-2d-buffer"],
)  # fmt: skip
def test_pack_references_refuse_what_the_kernels_cannot_take(op, index, buffer, message):
    # The CUDA kernels trust their index (a negative or past-the-end position reads or writes
    # out of bounds, a repeated one races): the references, which define the ops, refuse them
    # instead of wrapping, broadcasting or picking a winner.
    idx = torch.tensor(index, dtype=torch.int32)
    with pytest.raises(ValueError, match=message):
        if op == "pack":
            pack_cuda.grad_pack(torch.randn(2, 3), idx, impl="ref")
        else:
            pack_cuda.grad_unpack(torch.tensor(buffer), idx, (2, 3), impl="ref")
    ok = torch.tensor([0, 5], dtype=torch.int64)  # the range's two edges pass
    assert torch.equal(
        pack_cuda.grad_pack(torch.arange(6.0).view(2, 3), ok), torch.tensor([0.0, 5.0])
    )


# =============================================================================================
# Emulated on the CPU: the real kernels, compiled by g++ against pdt_host_emulation.cuh
# =============================================================================================
# The ops run unchanged (grids, vector choice, argument lists, custom ops, autograd); only
# loader.launch is replaced by a call into the host build of the kernel, which also checks
# that every argument has the kernel's exact type (scalars) or element size (pointers).

_SIG_RE = re.compile(r'extern "C"\s+void\s+(pdt_\w+)\s*\(([^)]*)\)\s*\{')
_SCALAR = {
    "int": (np.int32, ctypes.c_int),
    "i64": (np.int64, ctypes.c_longlong),
    "double": (np.float64, ctypes.c_double),
}
_POINTEE = {
    "float": 4,
    "double": 8,
    "i64": 8,
    "int": 4,
    "u16": 2,
    "u32": 4,
    "u64": 8,
    "unsigned char": 1,
    "TraitF32::T": 4,
    "TraitF64::T": 8,
    "TraitF16::T": 2,
    "TraitBF16::T": 2,
    "TraitF32::A": 4,
    "TraitF64::A": 8,
    "TraitF16::A": 4,
    "TraitBF16::A": 4,
}


_SANITIZE = [
    "-g",
    "-fno-omit-frame-pointer",
    "-fsanitize=address,undefined",
    "-fno-sanitize-recover=undefined",
]


#: The kernels as the race checker builds them (pdt_host_emulation.cuh: every emulated
#: thread a ThreadSanitizer fiber, ordered only by the barriers the GPU guarantees).
_RACECHECK = ["-g", "-fsanitize=thread"]


def _emu_flags() -> list[str]:
    flags = ["-std=c++17", f"-I{loader.KERNEL_DIR}", *loader.compile_options()[1:]]
    sanitize = os.environ.get("PDT_EMU_SANITIZE")  # set by the sanitizer runs below
    if sanitize == "1":
        flags += _SANITIZE
    elif sanitize == "thread":
        flags += _RACECHECK
    return flags


def _emu_signatures(gxx: str) -> dict[str, tuple[str, list[tuple[str, str]]]]:
    """{kernel: (source, [(type, name)])} from the preprocessed sources."""
    sigs = {}
    shim = str(loader.KERNEL_DIR / "pdt_host_emulation.cuh")
    for src in loader.SOURCES:
        text = subprocess.run(
            [
                gxx,
                "-E",
                "-P",
                "-include",
                shim,
                *_emu_flags(),
                "-x",
                "c++",
                str(loader.KERNEL_DIR / src),
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for name, params in _SIG_RE.findall(text):
            plist = []
            for prm in (q.strip() for q in params.split(",") if q.strip()):
                pname = re.findall(r"\w+", prm)[-1]
                plist.append((prm[: prm.rfind(pname)].strip(), pname))
            sigs[name] = (src, plist)
    return sigs


@contextlib.contextmanager
def _emu_build_dir(request, tmp_path_factory, text: str, cmd: list[str]):
    """Where the emulation library is built, held under a lock: (folder, already built).

    Under pytest-xdist the workers of one session share it (the session's temporary root),
    so g++ runs once, not once per worker; the folder is named by a hash of the generated
    source, the command and the kernel sources, so only an identical build is shared. In one
    process it is a fresh folder of this session's own."""
    if not hasattr(request.config, "workerinput"):  # not a pytest-xdist worker
        yield tmp_path_factory.mktemp("emu"), False
        return
    import fcntl
    import hashlib

    digest = hashlib.sha256("\0".join([text, *cmd]).encode())
    for src in sorted(loader.KERNEL_DIR.glob("*.cu*")):
        digest.update(src.name.encode() + b"\0" + src.read_bytes())
    root = tmp_path_factory.getbasetemp().parent / f"emu-{digest.hexdigest()[:16]}"
    root.mkdir(exist_ok=True)
    with open(root / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the first worker builds; the others wait for it
        yield root, (root / "libemu.so").is_file()


@pytest.fixture(scope="module")
def emulator(request, tmp_path_factory):
    """Build the host emulation of every kernel once: (ctypes library, signatures)."""
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ is not on the PATH: the kernels' CPU emulation needs it")
    sigs = _emu_signatures(gxx)
    lines = [
        '#include "pdt_host_emulation.cuh"',
        *(f'#include "{s}"' for s in loader.SOURCES),
        'extern "C" const char* pdt_emu_error() { return pdt_emu::st().error; }',
    ]
    for name, (_, params) in sigs.items():
        decl = ", ".join(f"{t} {n}" for t, n in params)
        call = ", ".join(n for _, n in params)
        lines.append(
            f'extern "C" int emu_{name}(unsigned gx, unsigned gy, unsigned gz, unsigned bx, '
            f"unsigned by, unsigned bz, unsigned long smem, {decl}) {{ return pdt_emu::launch("
            f"gx, gy, gz, bx, by, bz, [=] {{ {name}({call}); }}, smem); }}"
        )
    text = "\n".join(lines) + "\n"
    cmd = [gxx, "-O1", "-fPIC", "-shared", "-ffp-contract=off", *_emu_flags()]
    with _emu_build_dir(request, tmp_path_factory, text, cmd) as (root, built):
        if not built:
            (root / "emu.cpp").write_text(text)
            res = subprocess.run(
                [*cmd, str(root / "emu.cpp"), "-o", str(root / "libemu.so.part")],
                capture_output=True,
                text=True,
            )
            assert res.returncode == 0, res.stderr[-5000:]
            (root / "libemu.so.part").rename(root / "libemu.so")
    lib = ctypes.CDLL(str(root / "libemu.so"))
    lib.pdt_emu_error.restype = ctypes.c_char_p
    return lib, sigs


@pytest.fixture
def emulated(emulator, monkeypatch):
    """Route the ops' kernel launches, for CPU tensors, into the host build of the kernels."""
    lib, sigs = emulator
    launched: list[str] = []

    def launch(source, name, grid, block, args, device=None, shared_mem=0):
        assert name in sigs, f"no kernel {name}"
        launched.append(name)
        src, params = sigs[name]
        assert src == source, f"{name} is in {src}, launched from {source}"
        assert len(args) == len(params), f"{name}: {len(args)} arguments for {len(params)}"
        cargs = []
        for (typ, pname), a in zip(params, args):
            if "*" in typ:
                pointee = typ.replace("const", "").replace("*", "").strip()
                if a is None:
                    cargs.append(ctypes.c_void_p(0))
                    continue
                assert isinstance(a, torch.Tensor) and a.device.type == "cpu", (name, pname)
                assert a.element_size() == _POINTEE[pointee], (name, pname, a.dtype, typ)
                cargs.append(ctypes.c_void_p(a.data_ptr()))
            else:
                np_type, c_type = _SCALAR[typ]
                assert type(a) is np_type, f"{name}: {pname} is {typ}, got {type(a).__name__}"
                cargs.append(c_type(a.item()))
        assert all(g >= 1 for g in grid) and all(b >= 1 for b in block), (name, grid, block)
        assert grid[1] <= 65535 and grid[2] <= 65535 and block[0] * block[1] * block[2] <= 1024
        fn = getattr(lib, f"emu_{name}")
        fn.restype = ctypes.c_int
        assert 0 <= shared_mem <= 227 * 1024, (name, shared_mem)
        smem = ctypes.c_ulong(shared_mem)
        rc = fn(*(ctypes.c_uint(v) for v in (*grid, *block)), smem, *cargs)
        assert rc == 0, f"{name}: {lib.pdt_emu_error().decode()}"
        loader._launches[name] += 1  # counted as loader.launch counts (PDT_KERNEL_LAUNCH_LOG)

    monkeypatch.setattr(loader, "launch", launch)
    monkeypatch.setattr(loader, "require_cuda", lambda op, *t, sources=(): 0)
    monkeypatch.setattr(device_check, "require_cuda", lambda op, public, *t, sources=(): 0)
    monkeypatch.setattr(device_check, "check_devices", lambda op, public, *t: None)
    monkeypatch.setattr(loader, "multiprocessor_count", lambda device=None: 2)
    monkeypatch.setattr(loader, "max_shared_per_block", lambda device=None: 227 * 1024)  # sm_90
    return launched


EMU_EMPTY_ROWS_CASE = (11, 40, 16, None, 0.05, False)  # every fourth row emptied
EMU_SPMM = [
    (9, 70, 37, None, 0.4, False),
    (9, 70, 64, 2, 0.3, False),
    (3, 5, 8, None, 1.0, False),
    EMU_EMPTY_ROWS_CASE,
    (5, 33, 12, None, 0.5, True),
]
EMU_SPMM_IDS = ["odd-scalar", "batched-vec", "dense", "empty-rows", "misaligned"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("case", EMU_SPMM, ids=EMU_SPMM_IDS)
def test_emulated_spmm_and_its_gradients_match_the_reference(emulated, case, dtype):
    f_out, k, n, batch, density, misaligned = case
    gen = torch.Generator().manual_seed(f_out * 1000 + k)
    mask = torch.rand(f_out, k, generator=gen) < density
    if case == EMU_EMPTY_ROWS_CASE:
        mask = _with_empty_rows(mask)
    idx = pattern_index(mask)
    shape = (k, n) if batch is None else (batch, k, n)
    b = torch.randn(*shape[:-1], n + int(misaligned), generator=gen, dtype=dtype)
    b = b[..., int(misaligned) :]
    vals = torch.randn(idx.col_ind.numel(), generator=gen, dtype=dtype)
    poisoned = torch.full((batch or 1, f_out, n), float("nan"), dtype=dtype)
    got = pattern_cuda._spmm(vals, idx.row_ptr, idx.col_ind, b, out=poisoned)
    assert torch.isfinite(poisoned).all(), "some outputs were not written"
    vec = n % (4 if dtype == torch.float32 else 2) == 0 and not misaligned
    assert emulated[-1].endswith("_vec" if vec else "_scalar"), emulated[-1]
    ref64 = pattern_spmm(vals.double(), idx.row_ptr, idx.col_ind, b.double(), impl="ref")
    same = pattern_spmm(vals, idx.row_ptr, idx.col_ind, b, impl="ref")
    bound = pattern_spmm(
        vals.abs().double(), idx.row_ptr, idx.col_ind, b.abs().double(), impl="ref"
    )
    assert_within_tolerance(got, ref64, same, bound, k, dtype, "emulated spmm")
    # gradients through the custom op: SDDMM and the transposed SpMM
    v = vals.clone().requires_grad_(True)
    bb = b.clone().requires_grad_(True)
    out = pattern_cuda.pattern_spmm_cuda(v, idx.row_ptr, idx.col_ind, bb, index=idx)
    g = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    gv, gb = torch.autograd.grad(out, (v, bb), g.to(dtype))
    v64 = vals.double().requires_grad_(True)
    b64 = b.double().requires_grad_(True)
    r = pattern_spmm(v64, idx.row_ptr, idx.col_ind, b64, impl="ref", index=idx)
    rv, rb = torch.autograd.grad(r, (v64, b64), g)
    assert torch.allclose(
        gv.double(),
        rv,
        rtol=1e-4 if dtype == torch.float32 else 1e-12,
        atol=1e-4 if dtype == torch.float32 else 1e-12,
    )
    assert torch.allclose(
        gb.double(),
        rb,
        rtol=1e-4 if dtype == torch.float32 else 1e-12,
        atol=1e-4 if dtype == torch.float32 else 1e-12,
    )


@pytest.mark.parametrize("batched", [False, True], ids=["2d", "batched"])
def test_emulated_spmm_dense_gradient_paths_match_the_reference(emulated, batched):
    """pattern_spmm's dense gradient paths (cuBLAS dA at the kept positions; A^T @ grad with
    A dense) give the reference's gradients and launch no sparse kernel in backward."""
    gen = torch.Generator().manual_seed(21)
    mask = torch.rand(13, 30, generator=gen) < 0.4
    idx = pattern_index(mask)
    shape = (3, 30, 9) if batched else (30, 9)
    b = torch.randn(shape, generator=gen, dtype=torch.float64, requires_grad=True)
    v = torch.randn(idx.col_ind.numel(), generator=gen, dtype=torch.float64, requires_grad=True)
    out = pattern_cuda.pattern_spmm_cuda(v, idx.row_ptr, idx.col_ind, b, index=idx)
    g = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    launched = len(emulated)
    with (
        pattern_cuda.forced_path("weight_grad", "dense"),
        pattern_cuda.forced_path("input_grad", "dense"),
    ):
        gv, gb = torch.autograd.grad(out, (v, b), g)
    assert not [k for k in emulated[launched:] if k.startswith(("pdt_sddmm", "pdt_spmm"))]
    v64 = v.detach().clone().requires_grad_(True)
    b64 = b.detach().clone().requires_grad_(True)
    r = pattern_spmm(v64, idx.row_ptr, idx.col_ind, b64, impl="ref", index=idx)
    rv, rb = torch.autograd.grad(r, (v64, b64), g)
    assert torch.allclose(gv, rv, rtol=1e-12, atol=1e-12)
    assert torch.allclose(gb, rb, rtol=1e-12, atol=1e-12)


def test_emulated_spmm_without_an_index_builds_the_transpose_in_the_backward(emulated, monkeypatch):
    """pattern_spmm_cuda without an index builds no transpose in its forward (on a GPU it
    cost an argsort and a device-to-host copy on every call); the backward builds it when
    dense_b's gradient is asked for, and the gradients equal those with the index."""
    built = []
    transpose = pattern_cuda.csr_transpose
    monkeypatch.setattr(pattern_cuda, "csr_transpose", lambda *a: built.append(1) or transpose(*a))
    gen = torch.Generator().manual_seed(22)
    idx = pattern_index(torch.rand(13, 30, generator=gen) < 0.4)
    b = torch.randn(30, 9, generator=gen, dtype=torch.float64, requires_grad=True)
    v = torch.randn(idx.col_ind.numel(), generator=gen, dtype=torch.float64, requires_grad=True)
    with torch.no_grad():
        pattern_cuda.pattern_spmm_cuda(v, idx.row_ptr, idx.col_ind, b)
    out = pattern_cuda.pattern_spmm_cuda(v, idx.row_ptr, idx.col_ind, b)
    assert built == []
    g = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    got = torch.autograd.grad(out, (v, b), g)
    assert built == [1]
    with_index = pattern_cuda.pattern_spmm_cuda(v, idx.row_ptr, idx.col_ind, b, index=idx)
    want = torch.autograd.grad(with_index, (v, b), g)
    assert built == [1]
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


EMU_VARIANT = [
    (
        70,
        70,
        37,
        None,
        0.4,
    ),  # several row-tiled blocks (2 for f32, 3 for f64), the last partly empty
    (9, 70, 64, 2, 0.3),
    (66, 33, 12, None, 1.0),  # every column of every K-step
    (11, 96, 16, None, 0.05),  # mostly empty K-steps and rows
]
EMU_VARIANT_IDS = ["multi-block-odd", "batched-vec", "dense", "sparse"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("case", EMU_VARIANT, ids=EMU_VARIANT_IDS)
def test_emulated_spmm_variants_give_the_same_bits(emulated, case, dtype):
    """warp_row, row_tiled and pipelined sum each row in the same order: equal to the last
    bit, and within the reference's tolerance."""
    f_out, k, n, batch, density = case
    gen = torch.Generator().manual_seed(f_out * 31 + k)
    mask = torch.rand(f_out, k, generator=gen) < density
    mask[f_out // 2] = False  # one empty row
    idx = pattern_index(mask)
    shape = (k, n) if batch is None else (batch, k, n)
    b = torch.randn(shape, generator=gen, dtype=dtype)
    vals = torch.randn(idx.col_ind.numel(), generator=gen, dtype=dtype)
    outs = {}
    for variant in pattern_cuda.SPMM_VARIANTS:
        poisoned = torch.full((batch or 1, f_out, n), float("nan"), dtype=dtype)
        outs[variant] = pattern_cuda._spmm(
            vals, idx.row_ptr, idx.col_ind, b, out=poisoned, variant=variant
        )
        assert torch.isfinite(poisoned).all(), f"{variant}: some outputs were not written"
    suf = "f32" if dtype == torch.float32 else "f64"
    kind = "vec" if n % (4 if dtype == torch.float32 else 2) == 0 else "scalar"
    assert emulated == [
        f"pdt_spmm_tiled_{suf}_{kind}",
        f"pdt_spmm_{suf}_{kind}",
        f"pdt_spmm_piped_{suf}_{kind}",
    ]
    assert torch.equal(outs["warp_row"], outs["row_tiled"])
    assert torch.equal(outs["pipelined"], outs["row_tiled"])
    ref64 = pattern_spmm(vals.double(), idx.row_ptr, idx.col_ind, b.double(), impl="ref")
    same = pattern_spmm(vals, idx.row_ptr, idx.col_ind, b, impl="ref")
    bound = pattern_spmm(
        vals.abs().double(), idx.row_ptr, idx.col_ind, b.abs().double(), impl="ref"
    )
    assert_within_tolerance(outs["row_tiled"], ref64, same, bound, k, dtype, "row-tiled spmm")


EMU_SDDMM = [
    (19, 300, 37, None, 0.4, 0),  # 3 row blocks (f32), 3 column chunks (the last partial)
    (9, 40, 2500, 8, 0.5, 0),  # 2 batches and 3 segments per split, 4 splits
    (9, 70, 64, 3, 1.0, 0),  # every column of every row
    (11, 96, 16, None, 0.05, 0),  # mostly empty rows, chunks and row blocks
    (6, 33, 12, 2, 0.5, 1),  # misaligned: the scalar kernels
    (5, 40, 2100, None, 0.5, 0),  # the columns split over 3 blocks (nlo > 0)
]
EMU_SDDMM_IDS = [
    "multi-block-odd",
    "segments-splits",
    "dense",
    "sparse",
    "misaligned",
    "column-splits",
]


def test_emulated_sddmm_cases_split_the_columns_and_the_batches():
    """The emulated cases (2 SMs) cover splits along both axes of the reduction, where a
    block's columns or batches start past 0, and several row blocks."""
    splits = []
    for f_out, _k, n, batch, _, offset in EMU_SDDMM:
        vec = 1 if offset or n % 4 else 4
        blocks = pattern_cuda.sddmm_row_blocks(torch.float32, f_out)
        splits.append((blocks, *pattern_cuda.sddmm_split(blocks, n, batch or 1, 2, vec)[2:]))
    assert max(gy for _, gy, _ in splits) > 1, splits
    assert max(gz for _, _, gz in splits) > 1, splits
    assert max(blocks for blocks, _, _ in splits) > 1, splits


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("case", EMU_SDDMM, ids=EMU_SDDMM_IDS)
def test_emulated_sddmm_variants_give_the_same_bits(emulated, case, dtype):
    """block_row and row_tiled SDDMM: every partial sum written, equal to the last bit (the
    same split and order), and within the reference's tolerance of sum_z G[z] B[z]^T at the
    kept positions."""
    f_out, k, n, batch, density, offset = case
    gen = torch.Generator().manual_seed(f_out * 17 + n)
    mask = torch.rand(f_out, k, generator=gen) < density
    mask[f_out // 2] = False  # an empty row
    idx = pattern_index(mask)
    lead = () if batch is None else (batch,)
    g = torch.randn(*lead, f_out, n + offset, generator=gen, dtype=dtype)[..., offset:]
    b = torch.randn(*lead, k, n + offset, generator=gen, dtype=dtype)[..., offset:]
    _sddmm_check(g, b, idx.row_ptr, idx.col_ind, mask, dtype, f"emulated sddmm {case}")
    suf = "f32" if dtype == torch.float32 else "f64"
    kind = "scalar" if offset or n % pattern_cuda._VEC[dtype] else "vec"
    assert emulated == [f"pdt_sddmm_tiled_{suf}_{kind}", f"pdt_sddmm_{suf}_{kind}"]


def test_emulated_sddmm_prefers_row_tiled_and_runs_the_forced_variant(emulated):
    gen = torch.Generator().manual_seed(5)
    idx = pattern_index(torch.rand(10, 20, generator=gen) < 0.5)
    g, b = torch.randn(10, 7, generator=gen), torch.randn(20, 7, generator=gen)
    first = pattern_cuda._sddmm(idx.row_ptr, idx.col_ind, g, b)  # untimed off a GPU
    with pattern_cuda.forced_path("sddmm", "block_row"):
        forced = pattern_cuda._sddmm(idx.row_ptr, idx.col_ind, g, b)
    assert emulated == ["pdt_sddmm_tiled_f32_scalar", "pdt_sddmm_f32_scalar"]
    assert torch.equal(first, forced)
    with pytest.raises(ValueError, match="unknown sddmm path 'tiled'; valid: row_tiled, block_row"):
        pattern_cuda._sddmm(idx.row_ptr, idx.col_ind, g, b, variant="tiled")
    nnz = idx.col_ind.numel()
    for bad in (torch.empty(2, 3), torch.empty(1, nnz, dtype=torch.float64)):
        with pytest.raises(
            ValueError, match=r"partial must be a contiguous \[1, \d+\] torch.float32"
        ):
            pattern_cuda._sddmm(idx.row_ptr, idx.col_ind, g, b, partial=bad)


def test_emulated_spmm_runs_the_forced_variant_and_prefers_row_tiled(emulated):
    gen = torch.Generator().manual_seed(3)
    idx = pattern_index(torch.rand(10, 20, generator=gen) < 0.5)
    b = torch.randn(20, 5, generator=gen)
    vals = torch.randn(idx.col_ind.numel(), generator=gen)
    pattern_cuda._spmm(vals, idx.row_ptr, idx.col_ind, b)  # untimed off a GPU: first choice
    with pattern_cuda.forced_path("spmm", "warp_row"):
        pattern_cuda._spmm(vals, idx.row_ptr, idx.col_ind, b)
        with pattern_cuda.forced_path("spmm", "row_tiled"):
            pattern_cuda._spmm(vals, idx.row_ptr, idx.col_ind, b)
        pattern_cuda._spmm(vals, idx.row_ptr, idx.col_ind, b)
    with pattern_cuda.forced_path("spmm", "pipelined"):  # unproven: runs only when forced
        pattern_cuda._spmm(vals, idx.row_ptr, idx.col_ind, b)
    assert emulated == [
        "pdt_spmm_tiled_f32_scalar",
        "pdt_spmm_f32_scalar",
        "pdt_spmm_tiled_f32_scalar",
        "pdt_spmm_f32_scalar",
        "pdt_spmm_piped_f32_scalar",
    ]
    with pytest.raises(ValueError, match="valid: row_tiled, warp_row, pipelined"):
        pattern_cuda.forced_path("spmm", "fastest")


def test_emulated_forced_unproven_spmm_falls_back_where_it_cannot_run(emulated, monkeypatch):
    """A forced pipelined kernel runs only where it can take the problem: where K would
    overflow its 32-bit offsets (faked: only warp_row can run) the choice falls back."""
    gen = torch.Generator().manual_seed(3)
    idx = pattern_index(torch.rand(10, 20, generator=gen) < 0.5)
    b = torch.randn(20, 5, generator=gen)
    vals = torch.randn(idx.col_ind.numel(), generator=gen)
    monkeypatch.setattr(pattern_cuda, "spmm_kernels", lambda dtype, k: ("warp_row",))
    with pattern_cuda.forced_path("spmm", "pipelined"):
        pattern_cuda._spmm(vals, idx.row_ptr, idx.col_ind, b)
    assert emulated == ["pdt_spmm_f32_scalar"]


@pytest.mark.parametrize("batched", [False, True], ids=["2d", "batched"])
@pytest.mark.parametrize("impl", ["ref", "cuda"])
def test_spmm_output_is_a_contiguous_tensor_of_its_own(emulated, impl, batched):
    """Both paths return a contiguous product that is no view, so that an in-place edit
    under autograd works on either (it was refused for the CUDA path's [1, F, N] slice and
    for the reference's permuted batch) and its gradient flows through the edit."""
    gen = torch.Generator().manual_seed(12)
    idx = pattern_index(torch.rand(5, 8, generator=gen) < 0.5)
    vals = torch.randn(idx.col_ind.numel(), generator=gen, dtype=torch.float64)
    vals.requires_grad_(True)
    b = torch.randn((3, 8, 6) if batched else (8, 6), generator=gen, dtype=torch.float64)
    if impl == "ref":
        out = pattern_spmm(vals, idx.row_ptr, idx.col_ind, b, impl="ref")
    else:
        out = pattern_cuda.pattern_spmm_cuda(vals, idx.row_ptr, idx.col_ind, b)
    assert out.is_contiguous() and out._base is None
    out.mul_(2.0).sum().backward()
    expected = torch.autograd.grad(2 * pattern_spmm(vals, idx.row_ptr, idx.col_ind, b).sum(), vals)
    torch.testing.assert_close(vals.grad, expected[0], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("b", "f"), [(1, 4), (2, 1), (2, 4)], ids=["b1", "f1", "b2f4"])
def test_reference_pattern_conv_output_takes_an_in_place_edit(b, f):
    gen = torch.Generator().manual_seed(3)
    idx = pattern_index(torch.rand(f, 3, 3, 3, generator=gen) < 0.6)
    x = torch.randn(b, 3, 6, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    w = torch.randn(f, 3, 3, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    out = pattern_conv2d(x, w, idx, padding=1, impl="ref")
    assert out._base is None
    out.relu_().sum().backward()
    assert x.grad is not None and w.grad is not None


def test_emulated_pattern_csr_gather_and_scatter_are_exact(emulated):
    gen = torch.Generator().manual_seed(8)
    mask = torch.rand(9, 40, generator=gen) < 0.4
    row_ptr, col_ind = pattern_positions(mask)
    dense = torch.randn(9, 40, generator=gen, requires_grad=True)
    vals = pattern_cuda.pattern_csr_cuda(dense, row_ptr, col_ind)
    assert torch.equal(vals, dense.detach()[mask])
    w = torch.randn(vals.shape, generator=gen)
    (vals * w).sum().backward()
    expected = torch.zeros(9, 40)
    expected[mask] = w
    assert torch.equal(dense.grad, expected)


def test_emulated_nm_takes_a_strided_input_and_launches_nothing_for_an_empty_one(emulated):
    """A tensor the [O, C, I] view cannot take in place (every other channel of a batch) is
    pruned as its dense copy is, into a result of its own shape; an empty one returns at once
    (a launch of a zero-sized grid is an error on a GPU)."""
    gen = torch.Generator().manual_seed(31)
    x = torch.randn(2, 16, 4, 4, generator=gen)[:, ::2]
    assert not x.is_contiguous()
    got = nm_cuda.nm_prune_cuda(x, 2, 4, method="magnitude")
    assert got.shape == x.shape and emulated
    assert torch.equal(got, nm_prune_ref(x.contiguous(), 2, 4, method="magnitude"))
    emulated.clear()
    empty = torch.empty(0, 8, 4, 4)
    assert nm_cuda.nm_prune_cuda(empty, 2, 4).shape == empty.shape and emulated == []


def test_emulated_spmm_takes_operands_of_any_strides_and_an_empty_matrix(emulated):
    """The dense operand transposed (no unit stride along its rows), or in a batch whose
    stride is not a whole 16 bytes (read element by element: a vector load would be
    misaligned), gives the reference's product; a matrix with no kept entry writes zeros
    over whatever the output held."""
    gen = torch.Generator().manual_seed(32)
    idx = pattern_index(torch.rand(6, 2, 3, 3, generator=gen) < 0.5)
    vals = torch.randn(idx.col_ind.numel(), generator=gen, dtype=torch.float64)
    bt = torch.randn(8, 18, generator=gen, dtype=torch.float64).t()
    assert bt.stride(-1) != 1
    got = pattern_cuda._spmm(vals, idx.row_ptr, idx.col_ind, bt)
    want = pattern_spmm(vals, idx.row_ptr, idx.col_ind, bt, impl="ref")
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    flat = torch.randn(3 * (18 * 8 + 1), generator=gen, dtype=torch.float64)
    b3 = flat.as_strided((3, 18, 8), (18 * 8 + 1, 8, 1))  # rows aligned, batches not
    emulated.clear()
    got = pattern_cuda._spmm(vals, idx.row_ptr, idx.col_ind, b3)
    assert emulated and all(name.endswith("_scalar") for name in emulated), emulated
    want = pattern_spmm(vals, idx.row_ptr, idx.col_ind, b3.contiguous(), impl="ref")
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    none = pattern_index(torch.zeros(6, 2, 3, 3, dtype=torch.bool))
    out = torch.full((1, 6, 8), float("nan"), dtype=torch.float64)
    pattern_cuda._spmm(torch.empty(0, dtype=torch.float64), none.row_ptr, none.col_ind, bt, out=out)
    assert torch.equal(out, torch.zeros_like(out))


def test_emulated_pattern_ops_refuse_what_they_cannot_read(emulated):
    """Called directly (not through the dispatching ops): a row_ptr of another length than
    the dense matrix's rows, values of another dtype than the dense operand, and an index
    built for another structure are refused before any launch."""
    gen = torch.Generator().manual_seed(33)
    mask = torch.rand(6, 2, 3, 3, generator=gen) < 0.5
    idx = pattern_index(mask)
    w = torch.randn(6, 2, 3, 3, generator=gen)
    with pytest.raises(ValueError, match="row_ptr must have 7 entries, got 6"):
        pattern_cuda.pattern_csr_cuda(w, idx.row_ptr[:-1], idx.col_ind)
    vals = torch.randn(idx.col_ind.numel(), generator=gen, dtype=torch.float64)
    with pytest.raises(ValueError, match="values torch.float64 and dense_b torch.float32 differ"):
        pattern_cuda._spmm(vals, idx.row_ptr, idx.col_ind, torch.randn(18, 4))
    other = pattern_index(~mask)
    with pytest.raises(ValueError, match="differs from the"):
        pattern_cuda.pattern_spmm_cuda(
            vals.float(), idx.row_ptr, idx.col_ind, torch.randn(18, 4), index=other
        )
    assert emulated == []


def test_emulated_pattern_conv_takes_a_channels_last_input(emulated):
    gen = torch.Generator().manual_seed(34)
    idx = pattern_index(torch.rand(5, 3, 3, 3, generator=gen) < 0.5)
    w = torch.randn(5, 3, 3, 3, generator=gen, dtype=torch.float64)
    x = torch.randn(2, 3, 7, 6, generator=gen, dtype=torch.float64)
    got = pattern_cuda.pattern_conv2d_cuda(
        x.to(memory_format=torch.channels_last), w, idx, padding=1
    )
    want = pattern_conv2d(x, w, idx, padding=1, impl="ref")
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


EMU_CONV = [
    ((2, 3, 7, 9), 5, (3, 3), 1, 1, 1),
    ((2, 5, 11, 11), 7, (3, 3), 2, 1, 2),
    ((1, 4, 8, 8), 6, (1, 1), 1, 0, 1),
    ((2, 4, 9, 7), 6, (5, 3), (2, 1), (2, 1), 1),
    ((0, 3, 7, 9), 5, (3, 3), 1, 1, 1),
]
EMU_CONV_IDS = ["odd", "stride2-dil2", "1x1", "rect", "batch0"]


@pytest.mark.parametrize("implicit", [True, False], ids=["implicit", "explicit"])
@pytest.mark.parametrize("case", EMU_CONV, ids=EMU_CONV_IDS)
@pytest.mark.parametrize("grads", ["sparse", "dense"], ids=["sparse-grads", "dense-grads"])
def test_emulated_pattern_conv2d_forward_and_backward(emulated, case, implicit, grads):
    """Forward and both gradient paths (transposed SpMM + SDDMM, or cuDNN's dense backward
    with pruned weights as zeros and its weight gradient kept at the pattern) match the
    masked dense conv; pruned weights get no gradient either way."""
    xs, f_out, (r, s), stride, padding, dilation = case
    gen = torch.Generator().manual_seed(9)
    mask = torch.rand(f_out, xs[1], r, s, generator=gen) < 0.5
    idx = pattern_index(mask)
    x = torch.randn(xs, generator=gen, dtype=torch.float64, requires_grad=True)
    w = torch.randn(f_out, xs[1], r, s, generator=gen, dtype=torch.float64)
    w.requires_grad_(True)  # pruned positions hold nonzero values: the op must ignore them
    bias = torch.randn(f_out, generator=gen, dtype=torch.float64, requires_grad=True)
    out = pattern_cuda.pattern_conv2d_cuda(
        x, w, idx, bias, stride, padding, dilation, implicit=implicit
    )
    ref = F.conv2d(x, w * mask, bias, stride, padding, dilation)
    g = torch.randn(ref.shape, generator=gen, dtype=torch.float64)
    forward_launches = len(emulated)
    with contextlib.ExitStack() as paths:
        if grads == "dense":
            paths.enter_context(pattern_cuda.forced_path("input_grad", "dense"))
            paths.enter_context(pattern_cuda.forced_path("weight_grad", "dense"))
        got = torch.autograd.grad(out, (x, w, bias), g)
    backward = emulated[forward_launches:]
    sparse_kernels = [k for k in backward if k.startswith(("pdt_sddmm", "pdt_spmm"))]
    # at batch 0 nothing is multiplied: no sparse product launches on either path
    assert bool(sparse_kernels) == (grads == "sparse" and xs[0] > 0), backward
    exp = torch.autograd.grad(ref, (x, w, bias), g)
    assert torch.allclose(out, ref, rtol=1e-12, atol=1e-12)
    for a, e in zip(got, exp):
        assert torch.allclose(a, e, rtol=1e-12, atol=1e-12)
    assert (got[1][~mask] == 0).all()


@pytest.mark.parametrize("grads", ["sparse", "dense"], ids=["sparse-grads", "dense-grads"])
@pytest.mark.parametrize("op", ["spmm", "conv"])
def test_emulated_pattern_ops_backward_called_inside_autocast(emulated, op, grads):
    """A backward called inside autocast runs the CUDA ops' gradients in float32, as the
    references do: the dense paths' cuBLAS/cuDNN products stay float32 (a bf16 product would
    reach ``pattern_csr`` and be refused) and equal the gradients outside autocast."""
    gen = torch.Generator().manual_seed(13)
    mask = torch.rand(6, 4, 3, 3, generator=gen) < 0.5
    idx = pattern_index(mask if op == "conv" else mask.reshape(6, -1))
    x = torch.randn((2, 4, 7, 7) if op == "conv" else (36, 11), generator=gen)
    w = torch.randn(mask.shape if op == "conv" else (idx.col_ind.numel(),), generator=gen)

    def gradients(autocast: bool) -> tuple[torch.Tensor, ...]:
        xs, ws = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
        if op == "conv":
            out = pattern_cuda.pattern_conv2d_cuda(xs, ws, idx, None, 1, 1, 1)
        else:
            out = pattern_cuda.pattern_spmm_cuda(ws, idx.row_ptr, idx.col_ind, xs, index=idx)
        with contextlib.ExitStack() as stack:
            if grads == "dense":
                stack.enter_context(pattern_cuda.forced_path("input_grad", "dense"))
                stack.enter_context(pattern_cuda.forced_path("weight_grad", "dense"))
            if autocast:
                stack.enter_context(torch.autocast("cpu", dtype=torch.bfloat16))
            return torch.autograd.grad(out.square().sum(), (xs, ws))

    inside, outside = gradients(autocast=True), gradients(autocast=False)
    for a, b in zip(inside, outside):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("implicit", [True, False], ids=["implicit", "explicit"])
def test_emulated_pattern_conv2d_refuses_operands_the_kernels_would_misread(emulated, implicit):
    """The kernels read every operand in the input's dtype and one bias value per filter,
    unchecked: a weight or bias of another dtype, or a short bias, is an error before any
    launch (a float64 weight under a float32 input read 3.3e38 for outputs near 12)."""
    mask = torch.rand(4, 3, 3, 3) < 0.5
    idx = pattern_index(mask)
    x32, w32, b32 = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3), torch.randn(4)
    bad = [
        ((x32, w32.double(), None), "input torch.float32 and weight torch.float64 differ"),
        ((x32.double(), w32, None), "input torch.float64 and weight torch.float32 differ"),
        ((x32, w32, b32.half()), "input torch.float32 and bias torch.float16 differ"),
        ((x32, w32, b32[:2]), r"bias \(2,\) is not one value per filter \(4\)"),
    ]
    for (x, w, b), message in bad:
        with pytest.raises(ValueError, match=message):
            pattern_cuda.pattern_conv2d_cuda(x, w, idx, b, padding=1, implicit=implicit)
    assert emulated == []  # nothing was launched
    with pytest.raises(ValueError, match="is not one value per filter"):  # the op itself too
        torch.ops.pdtbench.pattern_conv2d(x32, w32, idx.row_ptr, idx.col_ind, idx.t_row_ptr,
                                          idx.t_col_ind, idx.t_perm, b32[:2], [1, 1], [1, 1],
                                          [1, 1])  # fmt: skip
    for x in (torch.randn(2, 4, 8, 8), torch.randn(2, 2, 8, 8)):  # the weight's 3 channels not
        with pytest.raises(ValueError, match="for a weight of 3 input channels"):
            torch.ops.pdtbench.pattern_conv2d(x, w32, idx.row_ptr, idx.col_ind, idx.t_row_ptr,
                                              idx.t_col_ind, idx.t_perm, None, [1, 1], [1, 1],
                                              [1, 1])  # fmt: skip
    with pytest.raises(ValueError, match="grad torch.float32 and dense_b torch.float64 differ"):
        torch.ops.pdtbench.sddmm(idx.row_ptr, idx.col_ind, torch.randn(4, 5),
                                 torch.randn(27, 5, dtype=torch.float64))  # fmt: skip
    out = pattern_cuda.pattern_conv2d_cuda(x32, w32, idx, b32, padding=1, implicit=implicit)
    ref = F.conv2d(x32, w32 * mask, b32, padding=1)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


EMU_CONV_VARIANT = [
    ((2, 3, 7, 9), 70, (3, 3), 1, 1, 1),  # two row-tiled blocks (f32), partly empty
    ((1, 4, 9, 7), 9, (5, 3), (2, 1), (2, 1), 1),
    ((2, 5, 6, 6), 12, (3, 3), 1, 2, 2),
]
EMU_CONV_VARIANT_IDS = ["multi-block", "rect-stride2", "dilated"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("case", EMU_CONV_VARIANT, ids=EMU_CONV_VARIANT_IDS)
def test_emulated_implicit_conv_kernels_give_the_same_bits(emulated, case, dtype):
    """The one-filter-per-warp and row-tiled implicit convs: every output written, equal to
    the last bit, and within the masked dense conv's tolerance."""
    xs, f_out, (r, s), stride, padding, dilation = case
    gen = torch.Generator().manual_seed(f_out + r)
    mask = torch.rand(f_out, xs[1], r, s, generator=gen) < 0.45
    mask[f_out // 3] = False  # an empty filter
    idx = pattern_index(mask)
    x = torch.randn(xs, generator=gen, dtype=dtype)
    w = torch.randn(f_out, xs[1], r, s, generator=gen, dtype=dtype) * mask
    bias = torch.randn(f_out, generator=gen, dtype=dtype)
    vals = w[mask]
    st, pad, dil = (pattern_cuda._pair(v) for v in (stride, padding, dilation))
    ref = F.conv2d(x, w, bias, st, pad, dil)
    outs = []
    for variant in pattern_cuda.PATHS["conv_forward"]:
        out = torch.full(ref.shape, float("nan"), dtype=dtype)
        pattern_cuda._conv_implicit(
            x, w.shape, vals, idx.row_ptr, idx.col_ind, bias, st, pad, dil, out, variant
        )
        assert torch.isfinite(out).all(), f"{variant}: some outputs were not written"
        outs.append(out)
    suf = "f32" if dtype == torch.float32 else "f64"
    assert emulated == [f"pdt_conv_implicit_tiled_{suf}", f"pdt_conv_implicit_{suf}"]
    assert torch.equal(outs[0], outs[1])
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    assert torch.allclose(outs[0], ref, rtol=tol, atol=tol)
    with pytest.raises(ValueError, match="unknown conv_forward path 'tiled'"):
        pattern_cuda._conv_implicit(
            x, w.shape, vals, idx.row_ptr, idx.col_ind, bias, st, pad, dil, variant="tiled"
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_emulated_implicit_convs_split_a_grid_past_its_limit_into_launches(
    emulated, monkeypatch, dtype
):
    """More output tiles than a grid's y dimension takes (65,535) go in several launches, each
    told its first tile: with the limit lowered to 2, a conv of 5 tiles launches 3 times per
    kernel and gives the bits of one launch."""
    gen = torch.Generator().manual_seed(7)
    mask = torch.rand(6, 3, 3, 3, generator=gen) < 0.5
    idx = pattern_index(mask)
    x = torch.randn(3, 3, 15, 13, generator=gen, dtype=dtype)  # 3*15*13 = 585: 5 tiles of 128
    w = torch.randn(6, 3, 3, 3, generator=gen, dtype=dtype) * mask
    bias = torch.randn(6, generator=gen, dtype=dtype)
    one = (1, 1)
    assert math.ceil(3 * 15 * 13 / pattern_cuda.CONV_TILE) == 5

    def conv(variant):
        out = torch.full((3, 6, 15, 13), float("nan"), dtype=dtype)
        pattern_cuda._conv_implicit(
            x, w.shape, w[mask], idx.row_ptr, idx.col_ind, bias, one, one, one, out, variant
        )
        return out

    whole = {v: conv(v) for v in pattern_cuda.PATHS["conv_forward"]}
    emulated.clear()
    monkeypatch.setattr(pattern_cuda, "_MAX_GRID_YZ", 2)
    for variant, expected in whole.items():
        got = conv(variant)
        assert torch.isfinite(got).all(), f"{variant}: some outputs were not written"
        assert torch.equal(got, expected), variant
    suf = "f32" if dtype == torch.float32 else "f64"
    assert emulated == [f"pdt_conv_implicit_tiled_{suf}"] * 3 + [f"pdt_conv_implicit_{suf}"] * 3


def test_emulated_implicit_convs_never_read_a_pixel_behind_a_pruned_weight(emulated):
    """An infinity in the input where no kept weight looks stays out of both implicit convs'
    outputs, as out of the masked dense product's: a kernel that multiplies a pixel by a
    pruned weight's zero (or by an unused lane's) gives NaN there."""
    mask = torch.zeros(5, 2, 3, 3, dtype=torch.bool)
    mask[:, 1, 1, 1] = True  # each filter keeps only the centre of channel 1
    mask[2, 1, 0, 2] = True
    idx = pattern_index(mask)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(2, 2, 6, 7, generator=gen, dtype=torch.float64)
    x[:, 0] = float("inf")  # channel 0: no kept weight reads it
    w = torch.randn(5, 2, 3, 3, generator=gen, dtype=torch.float64) * mask
    ref = F.conv2d(x[:, 1:], w[:, 1:], None, 1, 1)
    for variant in pattern_cuda.PATHS["conv_forward"]:
        out = torch.full(ref.shape, float("nan"), dtype=torch.float64)
        pattern_cuda._conv_implicit(
            x,
            w.shape,
            w[mask],
            idx.row_ptr,
            idx.col_ind,
            None,
            (1, 1),
            (1, 1),
            (1, 1),
            out,
            variant,
        )
        assert torch.allclose(out, ref, rtol=1e-12, atol=1e-12), variant


EMU_NM = [
    ((4, 8, 5, 7), 1),
    ((3, 10, 6, 6), 1),
    ((5, 37), 1),
    ((41,), 0),
    ((3, 4, 12, 5), 2),
    ((6, 9, 3, 3), 0),
]
EMU_NM_IDS = ["nchw", "C10-partial", "2d", "1d", "dim2", "dim0-copied"]
EMU_NM_NM = [(2, 4), (3, 7), (8, 32), (1, 1)]
EMU_NM_NM_IDS = ["2:4", "3:7", "8:32", "1:1"]


@pytest.mark.parametrize("nm", EMU_NM_NM, ids=EMU_NM_NM_IDS)
@pytest.mark.parametrize("case", EMU_NM, ids=EMU_NM_IDS)
def test_emulated_nm_magnitude_bit_exact_and_rescaled_within_tolerance(emulated, case, nm):
    shape, dim = case
    n, m = nm
    gen = torch.Generator().manual_seed(10)
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        for fmt in ("nchw", "channels_last") if len(shape) == 4 else ("nchw",):
            x = torch.randint(-3, 4, shape, generator=gen).to(dtype) * 0.5  # ties
            flat = x.view(-1)
            flat[0], flat[3], flat[5] = float("nan"), float("inf"), -0.0
            y = torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)
            if fmt == "channels_last":
                x = x.to(memory_format=torch.channels_last)
                y = y.to(memory_format=torch.channels_last)
            got = nm_cuda.nm_prune_cuda(x, n, m, "magnitude", dim)
            ref = nm_prune_ref(x, n, m, "magnitude", dim)
            assert _bits_equal(got, ref), f"magnitude {dtype} {fmt}"
            for rule in ("plane", "channel"):
                got = nm_cuda.nm_prune_cuda(y, n, m, "rescaled", dim, rule)
                ref = nm_prune_ref(y, n, m, "rescaled", dim, rule)
                oracle = nm_prune_ref(y.double(), n, m, "rescaled", dim, rule)
                assert got.stride() == ref.stride()
                assert torch.equal(got == 0, ref == 0), f"rescaled {dtype} {fmt} {rule}"
                err = (got.double() - oracle).abs().max().item()
                base = (ref.double() - oracle).abs().max().item()
                # the GPU tests' bound: 4 eps of the largest output for the kernels' own
                # summation order (float64: the reference is the oracle, base = 0; the thread
                # path's sums came to 2.02 eps on the partial 8:32 case)
                floor = 4 * torch.finfo(dtype).eps * oracle.abs().max().item()
                assert err <= 2 * base + floor, f"rescaled {dtype} {fmt} {rule}: {err} {base}"


EMU_FUSED = [
    ((3, 8, 5, 7), 1, (2, 4)),
    ((2, 10, 6, 6), 1, (3, 7)),  # a partial last group
    ((2, 64, 3, 4), 1, (8, 32)),
    ((2, 20, 9), 1, (5, 16)),
    ((4, 3, 6, 2), 2, (2, 4)),  # grouping along H: the plane is (N, C) x W
    ((1, 8, 4, 8), 1, (2, 4)),  # batch 1, positions loaded as vectors
]
EMU_FUSED_IDS = ["2:4", "3:7-partial", "8:32", "5:16-3d", "dim2", "batch1-vec"]


@pytest.mark.parametrize("case", EMU_FUSED, ids=EMU_FUSED_IDS)
def test_emulated_nm_rescaled_fused_gives_the_three_kernels_bits(emulated, case):
    """The fused rescaled kernel (one read of x) equals statistics + ratio + selection to the
    last bit, NaN, inf, -0 and ties included, in every dtype and both layouts; it runs
    exactly where fused_shared_bytes says it applies (never for the channel rule); both
    zero what the reference zeroes, NaN planes included."""
    shape, dim, (n, m) = case
    gen = torch.Generator().manual_seed(len(shape) * 7 + m)
    formats = [torch.contiguous_format] + ([torch.channels_last] if len(shape) == 4 else [])
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        for fmt in formats:
            x = (torch.randint(-3, 4, shape, generator=gen) * 0.5).to(dtype)  # ties
            noise = torch.randn(shape, generator=gen) * (torch.rand(shape, generator=gen) < 0.5)
            x += noise.to(dtype)
            flat = x.view(-1)
            flat[0], flat[3], flat[5], flat[-1] = float("nan"), float("inf"), -0.0, float("-inf")
            x = x.to(memory_format=fmt)
            view = nm_cuda.nm_view(x.shape, x.stride(), dim, "plane")
            if view is None:  # a layout the op copies to contiguous first
                view = nm_cuda.nm_view(x.shape, x.contiguous().stride(), dim, "plane")
            fusable = nm_cuda.fused_shared_bytes(view, m, x.element_size()) is not None
            outs = {}
            for path in nm_cuda.RESCALED_PATHS:
                start = len(emulated)
                with timed_choice.forced("nm_rescaled", path):
                    outs[path] = nm_cuda.nm_prune_cuda(x, n, m, "rescaled", dim, "plane")
                fused_ran = any("fused" in k for k in emulated[start:])
                assert fused_ran == (path == "fused" and fusable), (path, fmt, emulated[start:])
            assert _bits_equal(outs["fused"], outs["three_pass"]), (dtype, fmt)
            ref = nm_prune_ref(x, n, m, "rescaled", dim, "plane")
            got = outs["fused"]
            assert torch.equal(got == 0, ref == 0) and torch.equal(got.isnan(), ref.isnan())
    start = len(emulated)
    nm_cuda.nm_prune_cuda(x, n, m, "rescaled", dim, "channel")
    assert not [k for k in emulated[start:] if "fused" in k], "the channel rule is not fused"


EMU_SELECT = [  # (shape, dim, the vector modes some dtype, layout and n:m take)
    ((2, 8, 4, 8), 1, {0, 1, 2}),  # NCHW aligned: positions; channels-last: whole groups
    ((3, 10, 5, 3), 1, {0, 2}),  # a partial last group (C = 10); I = 15; 1:1 whole groups
    ((2, 64, 2, 4), 1, {0, 1, 2}),
    ((4, 12), 1, {0, 2}),  # contiguous groups (I = 1)
    ((3, 4, 16, 2), 2, {0, 1}),  # I = 2: one vector of float64 positions only
    ((1, 8, 4, 8), 1, {0, 1, 2}),  # batch 1: the batch stride is never used, not a bar
    ((16, 12), 0, {0, 1}),  # a weight grouped along its rows: O = 1 as well
]
EMU_SELECT_IDS = ["nchw-vec", "partial", "C64", "2d", "dim2", "batch1", "dim0-rows"]


@pytest.mark.parametrize("case", EMU_SELECT, ids=EMU_SELECT_IDS)
def test_emulated_nm_select_paths_give_the_same_bits(emulated, case):
    """The thread-per-group selection equals the sub-warp one to the last bit in every mode
    (the random draw included), dtype, layout and group size, ties, NaN, inf and -0
    included, where it loads vectors and where it cannot; each path launches its own
    kernel, and groups wider than 8 take the sub-warp kernel whichever is asked for."""
    shape, dim, vec = case
    gen = torch.Generator().manual_seed(sum(shape))
    formats = [torch.contiguous_format] + ([torch.channels_last] if len(shape) == 4 else [])
    vec_seen = set()
    for n, m in [(2, 4), (3, 7), (5, 16), (8, 32), (1, 1)]:
        w = nm_cuda.sub_warp_width(m)
        for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
            x = (torch.randint(-3, 4, shape, generator=gen) * 0.5).to(dtype)  # ties
            x += (torch.randn(shape, generator=gen) * (torch.rand(shape, generator=gen) < 0.5)).to(
                dtype
            )
            flat = x.view(-1)
            flat[0], flat[3], flat[-1] = float("nan"), float("inf"), -0.0
            for fmt in formats:
                xf = x.to(memory_format=fmt)
                view = nm_cuda.nm_view(xf.shape, xf.stride(), dim, "plane")
                src = xf if view is not None else xf.contiguous()  # as the op copies
                view = nm_cuda.nm_view(src.shape, src.stride(), dim, "plane")
                vec_seen.add(nm_cuda.vector_loads(view, src.element_size(), m, src))
                for method, rule in [
                    ("magnitude", "plane"),
                    ("random", "plane"),
                    ("rescaled", "plane"),
                    ("rescaled", "channel"),
                ]:
                    outs = []
                    thread = "gselect" if w <= nm_cuda.THREAD_MAX_WIDTH else "select"
                    for path, kernel in [("thread", thread), ("subwarp", "select")]:
                        start = len(emulated)
                        with (
                            timed_choice.forced("nm_select", path),
                            timed_choice.forced("nm_rescaled", "three_pass"),
                        ):
                            outs.append(
                                nm_cuda.nm_prune_cuda(
                                    xf,
                                    n,
                                    m,
                                    method,
                                    dim,
                                    rule,
                                    generator=torch.Generator().manual_seed(7),
                                )
                            )
                        assert emulated[-1] == f"pdt_nm_{kernel}_{nm_cuda._SUFFIX[dtype]}_w{w}", (
                            emulated[start:]
                        )
                    assert _bits_equal(outs[0], outs[1]), (n, m, dtype, fmt, method, rule)
    assert vec_seen == vec, vec_seen


def test_positions_per_thread_fill_a_vector_within_the_register_budget():
    """16 bytes of elements per thread, halved while a group's elements would pass 32
    values or 128 bytes (the kernel's pdt_nm_positions)."""
    got = {
        (size, w): nm_cuda.positions_per_thread(size, w)
        for size in (2, 4, 8)
        for w in nm_cuda.WIDTHS
    }
    assert got == {
        (2, 1): 8, (2, 2): 8, (2, 4): 8, (2, 8): 4, (2, 16): 2, (2, 32): 1,
        (4, 1): 4, (4, 2): 4, (4, 4): 4, (4, 8): 4, (4, 16): 2, (4, 32): 1,
        (8, 1): 2, (8, 2): 2, (8, 4): 2, (8, 8): 2, (8, 16): 1, (8, 32): 1,
    }  # fmt: skip


def test_vector_loads_only_where_aligned_positions_or_whole_groups_are():
    x = torch.zeros(2, 8, 4, 8)
    nchw = nm_cuda.nm_view(x.shape, x.stride(), 1)
    assert nm_cuda.vector_loads(nchw, 4, 4, x, x) == 1
    one = torch.zeros(1, 8, 4, 8)  # batch 1: nm_view's batch stride is 1, and never read
    assert nm_cuda.vector_loads(nm_cuda.nm_view(one.shape, one.stride(), 1), 4, 4, one) == 1
    shifted = torch.zeros(x.numel() + 1)[1:].view(x.shape)  # 4 bytes past an aligned start
    assert shifted.data_ptr() % 16 == 4
    assert nm_cuda.vector_loads(nchw, 4, 4, shifted, x) == 0
    odd = torch.zeros(2, 8, 3, 5)
    assert nm_cuda.vector_loads(nm_cuda.nm_view(odd.shape, odd.stride(), 1), 4, 4, odd) == 0
    half = torch.zeros(2, 8, 2, 4, dtype=torch.float16)  # I = 8: one 16-byte vector of f16
    hv = nm_cuda.nm_view(half.shape, half.stride(), 1)
    assert nm_cuda.vector_loads(hv, 2, 4, half) == 1
    assert nm_cuda.vector_loads(hv._replace(I=4), 2, 4, half) == 0
    # channels-last: a whole group of 2:4 (16 bytes of float32) is one vector
    last = x.to(memory_format=torch.channels_last)
    lv = nm_cuda.nm_view(last.shape, last.stride(), 1)
    assert nm_cuda.vector_loads(lv, 4, 4, last) == 2
    assert nm_cuda.vector_loads(lv, 8, 4, last) == 0  # 32 bytes: wider than a vector
    assert nm_cuda.vector_loads(lv, 4, 3, last) == 0  # not a power of two
    assert nm_cuda.vector_loads(lv._replace(C=10), 4, 4, last) == 0  # a partial group
    assert nm_cuda.vector_loads(lv, 4, 4, shifted) == 0  # 4-byte aligned, not 16
    two = torch.zeros(3, 12)  # groups along the last dim: I = 1
    assert nm_cuda.vector_loads(nm_cuda.nm_view(two.shape, two.stride(), 1), 4, 4, two) == 2
    # rows 258 floats apart (a slice of a wider matrix): a row's start is 8 bytes off 16
    rows = torch.zeros(2, 258)[:, :256].unflatten(1, (8, 4, 8))
    rv = nm_cuda.nm_view(rows.shape, rows.stride(), 1)
    assert rv.O == 2 and rv.so % 4 != 0
    assert nm_cuda.vector_loads(rv, 4, 4, rows) == 0


def test_emulated_nm_takes_more_groups_per_row_than_a_grid_dimension(emulated):
    """65,536 groups along the pruned dimension (a Linear layer's gradient, say): the
    selection kernel's grid is one-dimensional and takes them; the rescaled mode runs its
    three passes (the fused kernel's grid.y is one group each); only a strided rescale
    needing more than 65,535 statistics blocks per row is refused, before any launch."""
    gen = torch.Generator().manual_seed(23)
    x = torch.randn(1, 4 * 65536, generator=gen)
    for method in ("magnitude", "rescaled"):
        with timed_choice.forced("nm_rescaled", "fused"):  # not possible here: three passes run
            got = nm_cuda.nm_prune_cuda(x, 2, 4, method, dim=1)
        ref = nm_prune_ref(x, 2, 4, method, 1)
        assert torch.equal(got == 0, ref == 0), method
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=0)
    assert not [k for k in emulated if "fused" in k]
    # 2^19 contiguous groups: 16,384 blocks of 32 groups for the statistics, within a launch
    wide = torch.randn(1, 2**21, generator=gen)
    got = nm_cuda.nm_prune_cuda(wide, 2, 4, "rescaled", dim=1)
    torch.testing.assert_close(got, nm_prune_ref(wide, 2, 4, "rescaled", 1), rtol=1e-5, atol=0)
    launched = len(emulated)
    strided = torch.zeros(1, 4 * 65536, 2)
    with pytest.raises(ValueError, match="needs 65536 blocks per row, over a launch's 65535"):
        nm_cuda.nm_prune_cuda(strided, 2, 4, "rescaled", dim=1)
    assert len(emulated) == launched


@pytest.mark.parametrize("path", ["fused", "three_pass"], ids=["fused", "three-pass"])
@pytest.mark.parametrize("rule", ["plane", "channel"], ids=["plane", "channel"])
def test_emulated_nm_rescaled_zero_and_nan_planes_follow_the_reference(emulated, path, rule):
    """A plane with nothing nonzero kept gets factor 0 (not 0/0 = NaN at eps = 0) and a plane
    holding a NaN gets factor 0, as the reference's torch.where(sy > 0, ...): the kernels
    zero what the reference zeroes and are NaN where it is."""
    gen = torch.Generator().manual_seed(17)
    x = torch.randn(3, 8, 4, 5, generator=gen)
    x[0, 4:8] = 0.0  # plane (0, c) for c in the second group: all zero
    x[1, 2, 1, 3] = float("nan")
    for eps in (0.0, 1e-4):
        with timed_choice.forced("nm_rescaled", path):
            got = nm_cuda.nm_prune_cuda(x, 2, 4, "rescaled", 1, rule, eps=eps)
        ref = nm_prune_ref(x, 2, 4, "rescaled", 1, rule, eps=eps)
        assert torch.equal(got.isnan(), ref.isnan()), (eps, rule)
        assert torch.equal(got == 0, ref == 0), (eps, rule)
        fin = ~ref.isnan()
        assert torch.allclose(got[fin], ref[fin], rtol=1e-5, atol=0), (eps, rule)


def test_fused_shared_bytes_is_a_group_of_planes_and_only_where_it_applies():
    nchw = nm_cuda.nm_view((128, 256, 56, 56), (256 * 3136, 3136, 56, 1), 1, "plane")
    assert nm_cuda.fused_shared_bytes(nchw, 4, 4) == 3136 * 4 * 4  # 49 KiB: needs the opt-in
    assert nm_cuda.fused_shared_bytes(nchw, 3, 2) == 3136 * 4 * 2  # W = 4 columns for m = 3
    odd = nchw._replace(I=3135)  # rounded up to whole units of V = 4 (float32) / 8 (float16)
    assert nm_cuda.fused_shared_bytes(odd, 4, 4) == 784 * 4 * 4 * 4
    assert nm_cuda.fused_shared_bytes(odd, 4, 2) == 392 * 8 * 4 * 2
    assert nm_cuda.fused_shared_bytes(nchw, 8, 4) is not None
    assert nm_cuda.fused_shared_bytes(nchw, 9, 4) is None  # W = 16: no fused kernel
    chan = nm_cuda.nm_view((128, 256, 56, 56), (256 * 3136, 3136, 56, 1), 1, "channel")
    assert nm_cuda.fused_shared_bytes(chan, 4, 4) is None
    last = nm_cuda.nm_view((128, 256, 56, 56), (256 * 3136, 1, 56 * 256, 256), 1, "plane")
    assert nm_cuda.fused_shared_bytes(last, 4, 4) is None


def test_emulated_nm_random_partial_groups_keep_n_of_their_own_channels(emulated):
    """Lanes past a partial group's channels never outrank its own (their keys are zeroed):
    2:4 over 7 channels keeps 2 of channels 0-3 and 2 of channels 4-6 in every row, each of
    the last three about equally often."""
    x = torch.ones(3000, 7)
    keep = nm_cuda.nm_prune_cuda(x, 2, 4, "random", 1, generator=torch.Generator().manual_seed(5))
    kept = keep != 0
    assert (kept[:, :4].sum(1) == 2).all() and (kept[:, 4:].sum(1) == 2).all()
    share = kept[:, 4:].float().mean(0)  # each of 3 channels: 2/3 of the rows
    assert ((share - 2 / 3).abs() < 0.05).all(), share.tolist()


def test_emulated_nm_random_is_uniform_reproducible_and_layout_independent(emulated):
    x = torch.ones(3000, 4)
    keep = nm_cuda.nm_prune_cuda(x, 2, 4, "random", 1, generator=torch.Generator().manual_seed(1))
    code = ((keep != 0).long() * torch.tensor([1, 2, 4, 8])).sum(1)
    counts = torch.bincount(code, minlength=16)
    subsets = [3, 5, 6, 9, 10, 12]
    assert int(counts[subsets].sum()) == 3000
    sd = math.sqrt(3000 * (1 / 6) * (5 / 6))
    assert ((counts[subsets] - 500).abs() < 5 * sd).all(), counts[subsets].tolist()
    z = torch.randn(2, 12, 3, 5).abs() + 0.1
    a = nm_cuda.nm_prune_cuda(z, 2, 4, "random", generator=torch.Generator().manual_seed(3))
    b = nm_cuda.nm_prune_cuda(
        z.to(memory_format=torch.channels_last),
        2,
        4,
        "random",
        generator=torch.Generator().manual_seed(3),
    )
    assert torch.equal(a, b.contiguous())
    assert ((a != 0).reshape(2, 3, 4, 3, 5).sum(2) == 2).all()


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=["i32", "i64"])
def test_emulated_pack_unpack_round_trip(emulated, index_dtype):
    gen = torch.Generator().manual_seed(11)
    g = torch.randn(1000, generator=gen) * 50
    mask = torch.rand(1000, generator=gen) < 0.3
    idx = pack_cuda.mask_index(mask, index_dtype)
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.uint8):
        gd = g.to(dtype)
        buf = pack_cuda.grad_pack(gd, idx, impl="cuda")
        assert torch.equal(buf.view(torch.uint8), gd[mask].view(torch.uint8))
        back = pack_cuda.grad_unpack(buf, idx, (10, 100), impl="cuda")
        assert torch.equal(back.view(-1), torch.where(mask, gd, torch.zeros((), dtype=dtype)))
        out = torch.full((1000,), 3, dtype=dtype)
        pack_cuda.unpack(buf, idx, out)
        assert torch.equal(out[~mask], torch.full_like(out[~mask], 3))


def _compile_emulated(directory, name: str, text: str, *flags: str):
    """g++ builds ``text`` (C++ against pdt_host_emulation.cuh) with the emulation's flags and
    ``flags`` into ``directory / name``: (the compiler's run, that path). Skips without g++."""
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ is not on the PATH: the kernels' CPU emulation needs it")
    source, out = directory / f"{name}.cpp", directory / name
    source.write_text(text)
    cmd = [gxx, "-O1", *_emu_flags(), *flags, str(source), "-o", str(out)]
    return subprocess.run(cmd, capture_output=True, text=True), out


def test_emulator_reports_a_divergent_barrier_instead_of_hanging(emulator, tmp_path):
    """The emulation's own check: a kernel whose lanes skip a shuffle must be reported."""
    built, library = _compile_emulated(
        tmp_path,
        "bad.so",
        '#include "pdt_host_emulation.cuh"\n'
        'extern "C" const char* err() { return pdt_emu::st().error; }\n'
        'extern "C" int run() { return pdt_emu::launch(1, 1, 1, 32, 1, 1, [] {\n'
        "  if (threadIdx.x < 16) (void)__shfl_sync(0xffffffffu, 1, 0); }); }\n",
        "-fPIC",
        "-shared",
    )
    assert built.returncode == 0, built.stderr[-3000:]
    lib = ctypes.CDLL(str(library))
    lib.err.restype = ctypes.c_char_p
    assert lib.run() == 1 and b"deadlock" in lib.err()


def test_emulator_runs_blocks_and_threads_last_first_under_reverse_order(tmp_path):
    """PDT_EMU_ORDER=reverse visits a launch's blocks, and a block's threads between two
    barriers, in the reverse of the usual order: a result that depends on either changes."""
    built, binary = _compile_emulated(
        tmp_path,
        "order",
        '#include "pdt_host_emulation.cuh"\n'
        "static int seen[6], next_block, last_thread;\n"
        "int main() {\n"
        "  const int rc = pdt_emu::launch(3, 2, 1, 64, 1, 1, [] {\n"
        "    last_thread = threadIdx.x;\n"
        "    __syncthreads();\n"
        "    if (threadIdx.x == 0) seen[blockIdx.x + 3 * blockIdx.y] = next_block++; });\n"
        '  printf("rc=%d last_thread=%d", rc, last_thread);\n'
        '  for (int b = 0; b < 6; ++b) printf(" %d", seen[b]);\n'
        "}\n",
    )
    assert built.returncode == 0, built.stderr[-3000:]
    runs = {}
    for order in ("", "reverse"):
        env = dict(os.environ, PDT_EMU_ORDER=order)
        runs[order] = subprocess.run([str(binary)], env=env, capture_output=True, text=True).stdout
    assert runs[""] == "rc=0 last_thread=63 0 1 2 3 4 5"
    assert runs["reverse"] == "rc=0 last_thread=0 5 4 3 2 1 0"


#: Small kernels for the race checker's own test: (kernel body, launch, a race expected).
#: Each runs in `blocks` blocks of `threads` threads; `out` has 256 floats, `word` one unsigned.
_RACE_CASES = {
    "shared-no-barrier": ("tile[t] = t; out[t] = tile[63 - t];", (1, 64), True),
    "shared-syncthreads": ("tile[t] = t; __syncthreads(); out[t] = tile[63 - t];", (1, 64), False),
    "warp-no-syncwarp": ("tile[t] = t; out[t] = tile[31 - t];", (1, 32), True),
    "warp-syncwarp": ("tile[t] = t; __syncwarp(); out[t] = tile[31 - t];", (1, 32), False),
    "warp-shuffle": (
        "tile[t] = t; (void)__shfl_sync(0xffffffffu, 0, 0); out[t] = tile[31 - t];",
        (1, 32),
        False,
    ),
    "syncwarp-across-warps": (
        "tile[t] = t; __syncwarp(); out[t] = tile[63 - t];",
        (1, 64),
        True,
    ),
    "global-same-element": ("out[0] = t;", (1, 32), True),
    "global-own-element": ("out[t] = t;", (1, 64), False),
    "atomic-or": ("atomicOr(word, 1u << (t & 31));", (1, 64), False),
    "second-writer-after-barrier": (
        "if (t == 0) out[0] = 1; __syncthreads(); if (t == 1) out[0] += 1;",
        (1, 64),
        False,
    ),
    "blocks-same-element": ("if (t == 0) out[0] = blockIdx.x;", (2, 64), False),
}


@pytest.fixture(scope="module")
def race_checker(tmp_path_factory):
    """The emulation built as a race checker (g++ -fsanitize=thread) around _RACE_CASES."""
    lines = ['#include "pdt_host_emulation.cuh"', "#include <string>"]
    calls = []
    for i, (name, (body, (blocks, threads), _)) in enumerate(_RACE_CASES.items()):
        lines.append(
            f"__global__ void k{i}(float* out, unsigned* word) {{\n"
            f"  __shared__ float tile[64];\n  const unsigned t = threadIdx.x;\n  {body}\n}}"
        )
        calls.append(
            f'  if (which == "{name}") rc = pdt_emu::launch({blocks}, 1, 1, {threads}, 1, 1, '
            f"[] {{ k{i}(out, &word); }});"
        )
    lines += [
        "static float out[256];",
        "static unsigned word;",
        "int main(int argc, char** argv) {",
        "  const std::string which = argv[1];",
        "  int rc = 2;",
        *calls,
        '  printf("rc=%d out0=%g word=%x\\n", rc, out[0], word);',
        "  return rc;",
        "}",
    ]
    text = "\n".join(lines) + "\n"
    res, binary = _compile_emulated(tmp_path_factory.mktemp("race"), "race", text, *_RACECHECK)
    if res.returncode != 0 and "tsan" in res.stderr.lower():
        pytest.skip(f"g++ cannot link ThreadSanitizer here: {res.stderr.strip()[-300:]}")
    assert res.returncode == 0, res.stderr[-3000:]
    return binary


@pytest.mark.parametrize("case", list(_RACE_CASES))
def test_race_checker_reports_exactly_the_accesses_no_gpu_barrier_orders(race_checker, case):
    """The emulation under ThreadSanitizer (the CPU counterpart of racecheck) reports two
    threads of a block touching one address, one writing, with no __syncthreads between them
    (or, within a warp, no __syncwarp or collective): and nothing where the GPU orders them,
    atomics, or between blocks (run one after another, as racecheck reports none there)."""
    expect_race = _RACE_CASES[case][2]
    env = dict(os.environ, TSAN_OPTIONS="halt_on_error=0:exitcode=66")
    res = subprocess.run([str(race_checker), case], capture_output=True, text=True, env=env)
    raced = "WARNING: ThreadSanitizer: data race" in res.stderr
    assert raced == expect_race, res.stderr[-3000:]
    assert res.returncode == (66 if expect_race else 0), (res.returncode, res.stderr[-2000:])
    assert "rc=0" in res.stdout  # every case ran to its end: no deadlock, no crash


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_emulated_kernels_under_address_and_undefined_behaviour_sanitizers():
    """The CPU counterpart of compute-sanitizer memcheck: the emulated tests again, with the
    kernels built with ASan and UBSan (LD_PRELOADed, so torch's tensors get red zones: a read
    or write past a tensor fails). Opt-in: it takes minutes (PDT_EMU_ASAN=1)."""
    if os.environ.get("PDT_EMU_SANITIZE") == "1":
        pytest.skip("this is the sanitized run itself")
    if os.environ.get("PDT_EMU_ASAN") != "1":
        pytest.skip("opt-in, takes minutes: PDT_EMU_ASAN=1 runs the emulated tests under ASan")
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ is not on the PATH")
    libs = [
        subprocess.run(
            [gxx, f"-print-file-name={n}"], capture_output=True, text=True, check=True
        ).stdout.strip()
        for n in ("libasan.so", "libubsan.so")
    ]
    env = dict(
        os.environ,
        PDT_EMU_SANITIZE="1",
        LD_PRELOAD=" ".join(libs),
        ASAN_OPTIONS="detect_leaks=0:halt_on_error=1:detect_stack_use_after_return=0",
        UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1",
    )
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-x",
            "-p",
            "no:cacheprovider",
            __file__,
            "-k",
            "emulated and not sanitizers",
            "-o",
            "addopts=",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    tail = (res.stdout + res.stderr)[-6000:]
    assert res.returncode == 0 and "passed" in res.stdout, tail
    assert "ERROR: AddressSanitizer" not in tail and "runtime error" not in tail, tail


# =============================================================================================
# On a GPU
# =============================================================================================

#: PDT_EMU_GPU_TESTS=1 runs the GPU tests below on the CPU, against the kernels' emulation
#: (``PDT_EMU_GPU_TESTS=1 pytest tests/test_cuda_ops.py -m "not slow" -k <selection>``): their
#: own code (inputs, poisoning, references, tolerances, path pinning) is checked before a GPU
#: run. What the emulation cannot show (-ftz, FMA, the memory model) still needs the GPU.
EMULATE_GPU_TESTS = os.environ.get("PDT_EMU_GPU_TESTS") == "1"
GPU_DEV = "cpu" if EMULATE_GPU_TESTS else "cuda"
gpu = (lambda f: f) if EMULATE_GPU_TESTS else pytest.mark.gpu


def _run_tests_of_this_file(tmp_path, selection: str, env: dict):
    """This file's tests but the slow ones, chosen by ``selection`` (``-k``), in a process of
    their own with ``env`` added to the environment and temporary files under ``tmp_path``."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:benchmark"]
    cmd += ["-p", "no:cacheprovider", "-m", "not slow", "-k", selection]
    cmd += ["--basetemp", str(tmp_path / "run"), "tests/test_cuda_ops.py"]
    root = loader.KERNEL_DIR.parents[1]
    return subprocess.run(
        cmd, cwd=root, env=dict(os.environ, **env), capture_output=True, text=True
    )


def _racecheck_selection(tmp_path, also: str = "", env: dict | None = None):
    """Run the GPU tests scripts/gpu/kernels.sh hands to racecheck ($RACECHECK_K), ``and``
    the selection ``also``, in the kernels' CPU emulation with the launch log on; return the
    run and whether its log shows every kernel family with shared memory launched."""
    root = loader.KERNEL_DIR.parents[1]
    k = subprocess.run(
        ["bash", "-c", "eval \"$(sed -n '/^RACECHECK_K=/,/}$/p' scripts/gpu/kernels.sh)\"; "
         'printf %s "$RACECHECK_K"'],
        cwd=root, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "spmm" in k and "rescaled" in k
    log = tmp_path / "launches.jsonl"
    env = dict(env or {}, PDT_EMU_GPU_TESTS="1", PDT_KERNEL_LAUNCH_LOG=str(log))
    run = _run_tests_of_this_file(tmp_path, f"({k}) and not emulated {also}", env)
    sys.path.insert(0, str(root / "scripts" / "gpu"))
    import sanitizer_coverage as cov

    absent = tmp_path / "no-kernels.json"  # the families ptxas gives shared memory
    covered = (
        log.is_file() and cov.main([str(log), "--tool", "racecheck", "--kernels", str(absent)]) == 0
    )
    return run, covered


@pytest.mark.skipif(
    not EMULATE_GPU_TESTS,
    reason="runs the racecheck selection in the kernels' CPU emulation: needs PDT_EMU_GPU_TESTS=1 "
    "(make test-emulated)",
)
def test_racecheck_selection_launches_every_kernel_family_with_shared_memory(tmp_path):
    """The GPU tests that scripts/gpu/kernels.sh runs under racecheck ($RACECHECK_K) launch
    every kernel family that has shared memory (run here in the emulation, which launches what
    the GPU would): a family the selection misses is never checked for races."""
    run, covered = _racecheck_selection(tmp_path)
    assert run.returncode == 0, run.stdout[-2000:]
    assert covered


@pytest.mark.skipif(
    not EMULATE_GPU_TESTS,
    reason="runs the racecheck selection under the CPU race checker: needs PDT_EMU_GPU_TESTS=1 "
    "(make test-emulated)",
)
@pytest.mark.timeout(1800)
def test_racecheck_selection_shows_no_race_under_the_cpu_race_checker(tmp_path):
    """The CPU counterpart of the GPU's racecheck step: the same selection of GPU tests, run in
    the emulation built as a race checker (ThreadSanitizer preloaded, the emulated threads
    ordered only by __syncthreads, __syncwarp and the warp collectives), reports no race, and
    launches every kernel family with shared memory. Leaves out the one 64x576x1024 shape
    (four of its nine minutes on a 2-core machine); it launches no family the others miss."""
    gxx = shutil.which("g++")
    runtime = (
        gxx
        and subprocess.run(
            [gxx, "-print-file-name=libtsan.so"], capture_output=True, text=True
        ).stdout.strip()
    )
    if not runtime or not os.path.isabs(runtime):
        pytest.skip(
            "g++ has no ThreadSanitizer runtime here (libtsan.so): the race checker needs it"
        )
    reports = tmp_path / "tsan"
    env = {
        "PDT_EMU_SANITIZE": "thread",
        "LD_PRELOAD": runtime,
        # Only the kernels are instrumented: torch's and Python's own accesses are not checked.
        "TSAN_OPTIONS": f"ignore_noninstrumented_modules=1:halt_on_error=1:log_path={reports}",
        "OMP_NUM_THREADS": "1",
    }
    run, covered = _racecheck_selection(tmp_path, "and not 64x576x1024", env)
    found = {p.name: p.read_text()[:3000] for p in tmp_path.glob("tsan*")}
    assert not found, found
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    assert "passed" in run.stdout and covered


@pytest.mark.skipif(
    not EMULATE_GPU_TESTS,
    reason="reruns the emulated kernel tests with blocks and threads in reverse order: needs "
    "PDT_EMU_GPU_TESTS=1 (make test-emulated)",
)
@pytest.mark.timeout(1800)
def test_emulated_kernels_give_the_same_results_with_blocks_and_threads_in_reverse_order(tmp_path):
    """The emulated kernel tests again with PDT_EMU_ORDER=reverse: no kernel's result depends
    on the order its blocks run in, which the race checker (blocks ordered) cannot see."""
    env = dict(PDT_EMU_ORDER="reverse", PDT_EMU_GPU_TESTS="0", OMP_NUM_THREADS="1")
    run = _run_tests_of_this_file(
        tmp_path, "emulated and not sanitizers and not reverse_order", env
    )
    assert run.returncode == 0 and " passed" in run.stdout, (run.stdout + run.stderr)[-3000:]


# kernel error vs float64 reference <= K * (same-precision reference's error vs float64)
#                                       + FLOOR * eps(dtype) * sqrt(terms) * bound,
# bound = max of the sum of |products| of an output element (its magnitude scale).
TOLERANCE = {
    torch.float32: {"k": 4.0, "floor": 2.0},
    torch.float64: {"k": 4.0, "floor": 2.0},
}
DTYPES = [torch.float32, torch.float64]
DTYPE_IDS = ["f32", "f64"]


@pytest.fixture
def cuda_kernels(request, monkeypatch):
    """Fail (not skip) when a GPU is present but the kernels do not load: that is a bug.
    TF32 is off for the test (the float32 references) and restored after it. Under
    ``PDT_EMU_GPU_TESTS=1`` the device is the CPU and the kernels run in their CPU emulation
    (the ``emulated`` fixture; paths are "timed" by running them once)."""
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        if EMULATE_GPU_TESTS:
            request.getfixturevalue("emulated")
            monkeypatch.setattr(timed_choice, "can_time", lambda t: True)
            monkeypatch.setattr(
                timed_choice, "cuda_ms", lambda fn, reps=3, device=None: (fn(), 1.0)[1]
            )
            yield torch.device("cpu")
            return
        if not loader.has_cuda_kernels():
            pytest.fail(f"CUDA kernels failed to load: {loader.cuda_kernels_error()}")
        yield torch.device("cuda")
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def assert_within_tolerance(out, ref64, same_precision, bound, terms, dtype, what=""):
    tol = TOLERANCE[dtype]
    err = (out.double() - ref64).abs().max().item() if out.numel() else 0.0
    base = (same_precision.double() - ref64).abs().max().item() if out.numel() else 0.0
    floor = tol["floor"] * torch.finfo(dtype).eps * math.sqrt(max(terms, 1))
    floor *= bound.max().item() if bound.numel() else 0.0
    assert err <= tol["k"] * base + floor, (
        f"{what}: error {err:.3e} > {tol['k']} x reference error {base:.3e} + floor {floor:.3e}"
    )


def _mask(shape, density, gen, device):
    return torch.rand(shape, generator=gen, device=device) < density


def _pattern_mask(f_out, c, gen, device, kernel_keep=0.7):
    """ClickTrain-like: each 3x3 kernel keeps one of 8 four-entry patterns; 30% kernels cut."""
    pats = torch.zeros(8, 9, dtype=torch.bool)
    for p, pos in enumerate(list(combinations([0, 1, 2, 3, 5, 6, 7, 8], 3))[:8]):
        pats[p, 4] = True
        pats[p, list(pos)] = True
    choice = torch.randint(0, 8, (f_out, c), generator=gen, device=device)
    mask = pats.to(device)[choice].reshape(f_out, c, 3, 3)
    keep = torch.rand(f_out, c, 1, 1, generator=gen, device=device) < kernel_keep
    return mask & keep


#: The "empty-rows" case: every fourth row of its masks is emptied (:func:`_with_empty_rows`);
#: a random 33 x 70 mask at 5% would have no empty row about 40% of the time.
EMPTY_ROWS_CASE = (33, 70, 64, None, 0.05, False)
SPMM_CASES = [
    (1, 1, 1, None, 1.0, False),
    (7, 13, 29, None, 0.4, False),
    (31, 97, 257, None, 0.3, False),
    EMPTY_ROWS_CASE,
    (64, 576, 1024, None, 0.5, False),
    (17, 45, 100, 3, 0.35, False),
    (16, 144, 33, 2, 0.5, False),
    (24, 64, 128, None, 1.0, False),
    (12, 40, 64, None, 0.5, True),
]
SPMM_IDS = [
    "1x1x1",
    "7x13x29",
    "31x97x257",
    "empty-rows",
    "64x576x1024",
    "batch3",
    "batch2-odd",
    "dense",
    "misaligned",
]


def _with_empty_rows(mask: torch.Tensor) -> torch.Tensor:
    """``mask`` with every fourth row emptied (rows 0, 4, 8, ...): the kernels' empty-row
    paths run whatever the draw."""
    mask = mask.clone()
    mask[::4] = False
    assert (mask.sum(dim=1) == 0).any()
    return mask


def _spmm_inputs(case, dtype, device, gen):
    f_out, k, n, batch, density, misaligned = case
    mask = _mask((f_out, k), density, gen, device)
    if case == EMPTY_ROWS_CASE:
        mask = _with_empty_rows(mask)
    row_ptr, col_ind = pattern_positions(mask)
    values = torch.randn(col_ind.numel(), generator=gen, device=device, dtype=dtype)
    shape = (k, n) if batch is None else (batch, k, n)
    if misaligned:  # a view one element off 16-byte alignment: the scalar fallback runs
        big = torch.randn(*shape[:-1], n + 1, generator=gen, device=device, dtype=dtype)
        b = big[..., 1:]
    else:
        b = torch.randn(shape, generator=gen, device=device, dtype=dtype)
    return mask, row_ptr, col_ind, values, b


def _spmm_bound(values, row_ptr, col_ind, b):
    """|A| @ |B|: the magnitude scale of every output element."""
    return pattern_spmm(values.abs().double(), row_ptr, col_ind, b.abs().double(), impl="ref")


VARIANT_IDS = list(pattern_cuda.SPMM_VARIANTS)


@gpu
@pytest.mark.parametrize("variant", pattern_cuda.SPMM_VARIANTS, ids=VARIANT_IDS)
@pytest.mark.parametrize("case", SPMM_CASES, ids=SPMM_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_spmm_matches_reference_and_writes_every_output(cuda_kernels, case, dtype, variant):
    gen = torch.Generator(device=GPU_DEV).manual_seed(zlib.crc32(str(case).encode()))
    mask, row_ptr, col_ind, values, b = _spmm_inputs(case, dtype, cuda_kernels, gen)
    batched = b.dim() == 3
    out_shape = (b.shape[0] if batched else 1, mask.shape[0], b.shape[-1])
    out = torch.full(out_shape, float("nan"), dtype=dtype, device=cuda_kernels)
    got = pattern_cuda._spmm(values, row_ptr, col_ind, b, out=out, variant=variant)
    assert torch.isfinite(out).all(), "some output elements were not written"
    ref64 = pattern_spmm(values.double(), row_ptr, col_ind, b.double(), impl="ref")
    same = pattern_spmm(values, row_ptr, col_ind, b, impl="ref")
    bound = _spmm_bound(values, row_ptr, col_ind, b)
    assert got.shape == ref64.shape
    assert_within_tolerance(got, ref64, same, bound, mask.sum(1).max().item(), dtype, "spmm")


@gpu
@pytest.mark.slow
@pytest.mark.parametrize("density", [0.5, 0.35, 0.1, 0.05], ids=["50%", "65%", "90%", "95%"])
def test_spmm_paper_shape(cuda_kernels, density):
    """256 x 1152 filters times the 1152 x 50176 im2col matrix (Sec. 5.1-5.2), float32: each
    kernel within the reference's tolerance, both giving the same bits, and the timed choice
    (the default) recording which one it picked."""
    gen = torch.Generator(device=GPU_DEV).manual_seed(7)
    dtype = torch.float32
    mask = _mask((256, 1152), density, gen, cuda_kernels)
    row_ptr, col_ind = pattern_positions(mask)
    values = torch.randn(col_ind.numel(), generator=gen, device=cuda_kernels)
    b = torch.randn(1152, 50176, generator=gen, device=cuda_kernels)
    ref64 = pattern_spmm(values.double(), row_ptr, col_ind, b.double(), impl="ref")
    same = pattern_spmm(values, row_ptr, col_ind, b, impl="ref")
    bound = _spmm_bound(values, row_ptr, col_ind, b)
    outs = {}
    for variant in (*pattern_cuda.SPMM_VARIANTS, None):
        out = torch.full((1, 256, 50176), float("nan"), device=cuda_kernels)
        got = pattern_cuda._spmm(values, row_ptr, col_ind, b, out=out, variant=variant)
        assert torch.isfinite(out).all(), variant
        assert_within_tolerance(got, ref64, same, bound, 1152, dtype, f"spmm paper {variant}")
        outs[variant] = got
    assert torch.equal(outs["warp_row"], outs["row_tiled"])
    assert torch.equal(outs["pipelined"], outs["row_tiled"])
    assert torch.equal(outs[None], outs["warp_row"])
    nnz = col_ind.numel()
    choices = timed_choice.timed_choices().items()
    picked = [v for k, v in choices if k.startswith("spmm: ") and f"nnz {nnz} " in k]
    auto = pattern_cuda.spmm_variants(dtype, 1152)
    assert picked and picked[0]["path"] in auto
    assert set(picked[0]["ms"]) == set(auto)  # an unproven kernel is never timed for the choice


def _sddmm_check(g, b, row_ptr, col_ind, mask, dtype, what):
    """Both SDDMM kernels on (g, b): every partial sum written, the same bits, and within the
    reference's tolerance of sum_z g[z] b[z]^T at the kept positions. Returns the sums."""
    batch, n = (g.shape[0] if g.dim() == 3 else 1), g.shape[-1]
    vec = pattern_cuda.vector_ok(
        dtype,
        n,
        (g.stride(-2), g.stride(0), b.stride(-2), b.stride(0)),
        (g.data_ptr(), b.data_ptr()),
    )
    _, _, gy, gz = pattern_cuda.sddmm_split(
        pattern_cuda.sddmm_row_blocks(dtype, mask.shape[0]),
        n,
        batch,
        loader.multiprocessor_count(g.device),
        pattern_cuda._VEC[dtype] if vec else 1,
    )
    sums, parts = {}, {}
    for variant in pattern_cuda.SDDMM_VARIANTS:
        parts[variant] = torch.full(
            (gy * gz, col_ind.numel()), float("nan"), dtype=dtype, device=g.device
        )
        sums[variant] = pattern_cuda._sddmm(
            row_ptr, col_ind, g, b, partial=parts[variant], variant=variant
        )
        assert torch.isfinite(parts[variant]).all(), f"{what} {variant}: sums not written"
    assert torch.equal(parts["row_tiled"], parts["block_row"]), what
    assert torch.equal(sums["row_tiled"], sums["block_row"]), what
    g3, b3 = g.reshape(-1, *g.shape[-2:]), b.reshape(-1, *b.shape[-2:])
    ref64 = torch.einsum("zfn,zkn->fk", g3.double(), b3.double())[mask]
    same = torch.einsum("zfn,zkn->fk", g3, b3)[mask]
    bound = torch.einsum("zfn,zkn->fk", g3.double().abs(), b3.double().abs())[mask]
    assert_within_tolerance(sums["row_tiled"], ref64, same, bound, batch * n, dtype, what)
    return sums


SDDMM_CASES = [*SPMM_CASES, (37, 300, 4100, None, 0.3, False)]  # the last splits the columns
SDDMM_IDS = [*SPMM_IDS, "column-splits"]


@gpu
@pytest.mark.parametrize("case", SDDMM_CASES, ids=SDDMM_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_sddmm_kernels_give_the_same_bits_within_tolerance(cuda_kernels, case, dtype):
    """The weight gradient's SDDMM (block_row and row_tiled) on odd, batched, empty-row,
    dense and misaligned cases: every partial sum written, equal bits, reference tolerance."""
    gen = torch.Generator(device=GPU_DEV).manual_seed(3 + zlib.crc32(str(case).encode()))
    mask, row_ptr, col_ind, _, b = _spmm_inputs(case, dtype, cuda_kernels, gen)
    g_shape = (*b.shape[:-2], mask.shape[0], b.shape[-1] + 1)
    g = torch.randn(g_shape, generator=gen, device=cuda_kernels, dtype=dtype)
    g = g[..., 1:] if case[5] else g[..., :-1].contiguous()
    _sddmm_check(g, b, row_ptr, col_ind, mask, dtype, f"sddmm {case}")


@gpu
@pytest.mark.slow
@pytest.mark.parametrize("density", [0.4, 0.1], ids=["60%", "90%"])
def test_sddmm_paper_shape(cuda_kernels, density):
    """The weight gradient at the paper's shape (256 x 1152 kept positions of 256 x 50176
    times 1152 x 50176; ClickTrain Sec. 5.2), float32: both kernels, equal bits, within
    tolerance, and the timed choice (the default) recording which one it picked."""
    gen = torch.Generator(device=GPU_DEV).manual_seed(11)
    mask = _mask((256, 1152), density, gen, cuda_kernels)
    row_ptr, col_ind = pattern_positions(mask)
    g = torch.randn(256, 50176, generator=gen, device=cuda_kernels)
    b = torch.randn(1152, 50176, generator=gen, device=cuda_kernels)
    sums = _sddmm_check(g, b, row_ptr, col_ind, mask, torch.float32, "sddmm paper")
    default = pattern_cuda._sddmm(row_ptr, col_ind, g, b)
    assert torch.equal(default, sums["block_row"])
    nnz = col_ind.numel()
    choices = timed_choice.timed_choices().items()
    picked = [v for k, v in choices if k.startswith("sddmm: ") and f"nnz {nnz} " in k]
    assert picked and set(picked[0]["ms"]) == set(pattern_cuda.SDDMM_VARIANTS)


@contextlib.contextmanager
def grad_paths(grads: str):
    """Both gradient paths pinned to the sparse kernels or to the dense libraries, with TF32
    off (the dense paths follow torch's TF32 settings, as torch's own conv does)."""
    if grads not in ("sparse", "dense"):
        raise ValueError(f"grads must be 'sparse' or 'dense', got {grads!r}")
    sparse = grads == "sparse"
    with (
        torch.backends.cudnn.flags(enabled=True, allow_tf32=False),
        pattern_cuda.forced_path("input_grad", "spmm" if sparse else "dense"),
        pattern_cuda.forced_path("weight_grad", "sddmm" if sparse else "dense"),
    ):
        tf32 = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        try:
            yield
        finally:
            torch.backends.cuda.matmul.allow_tf32 = tf32


CONV_VARIANTS = list(pattern_cuda.PATHS["conv_forward"])
GRADS = ["sparse", "dense"]
GRADS_IDS = ["sparse-grads", "dense-grads"]


@gpu
@pytest.mark.parametrize("grads", GRADS, ids=GRADS_IDS)
@pytest.mark.parametrize("case", SPMM_CASES, ids=SPMM_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_spmm_gradients_match_reference(cuda_kernels, case, dtype, grads):
    gen = torch.Generator(device=GPU_DEV).manual_seed(1 + zlib.crc32(str(case).encode()))
    mask, row_ptr, col_ind, values, b = _spmm_inputs(case, dtype, cuda_kernels, gen)
    index = pattern_index(mask)

    batched = b.dim() == 3
    out_shape = (
        (*b.shape[:-2], mask.shape[0], b.shape[-1]) if batched else (mask.shape[0], b.shape[-1])
    )
    g64 = torch.randn(out_shape, generator=gen, device=cuda_kernels, dtype=torch.float64)

    def run_grads(impl, vals, bb, g):
        vals = vals.detach().clone().requires_grad_(True)
        if impl == "cuda" and bb.data_ptr() % 16:
            # keep the misaligned view (a clone would be aligned): the backward's scalar
            # fallbacks (SDDMM, transposed SpMM) must run on it too
            big = bb.new_empty(*bb.shape[:-1], bb.shape[-1] + 1)
            big[..., 1:].copy_(bb)
            bb = big[..., 1:].requires_grad_(True)
            assert bb.data_ptr() % 16 != 0
        else:
            bb = bb.detach().clone().requires_grad_(True)
        if impl == "cuda":
            out = pattern_cuda.pattern_spmm_cuda(vals, row_ptr, col_ind, bb, index=index)
            with grad_paths(grads):
                out.backward(g.to(out.dtype))
        else:
            out = pattern_spmm(vals, row_ptr, col_ind, bb, impl="ref", index=index)
            out.backward(g.to(out.dtype))
        return vals.grad, bb.grad

    # (named apart from the `grads` parameter, which grad_paths reads: "sparse" or "dense")
    before = timed_choice.uses()
    gv, gb = run_grads("cuda", values, b, g64)
    ran = {k for k, v in timed_choice.uses().items() if v > before.get(k, 0)}
    paths = ("spmm", "sddmm") if grads == "sparse" else ("dense", "dense")
    if values.numel():  # the pinned gradient paths really ran
        assert {f"input_grad {paths[0]}", f"weight_grad {paths[1]}"} <= ran, ran
    rv, rb = run_grads("ref", values.double(), b.double(), g64)
    sv, sb = run_grads("ref", values, b, g64)
    bv, bb = run_grads("ref", values.abs().double(), b.abs().double(), g64.abs())  # bounds
    n_terms = b.shape[-1] * (b.shape[0] if batched else 1)
    assert_within_tolerance(gv, rv, sv, bv, n_terms, dtype, f"spmm grad values ({grads})")
    assert_within_tolerance(gb, rb, sb, bb, mask.shape[0], dtype, f"spmm grad B ({grads})")


# ClickTrain's CSR conversion at the paper's reference shape (a 256 x 1152 filter matrix:
# 256 filters of a 128-channel 3x3 conv, the shape of its Sec. 5.1 timings), a quarter kept.
PAPER_CSR_CASE = (256, 1152, 1, None, 0.25, False)


@gpu
@pytest.mark.parametrize(
    "case", [*SPMM_CASES[:6], PAPER_CSR_CASE], ids=[*SPMM_IDS[:6], "256x1152-paper"]
)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_pattern_csr_is_an_exact_gather_and_its_gradient_an_exact_scatter(
    cuda_kernels, case, dtype
):
    gen = torch.Generator(device=GPU_DEV).manual_seed(2)
    f_out, k = case[0], case[1]
    mask = _mask((f_out, k), case[4], gen, cuda_kernels)
    if case == EMPTY_ROWS_CASE:
        mask = _with_empty_rows(mask)
    row_ptr, col_ind = pattern_positions(mask)
    dense = torch.randn(f_out, k, generator=gen, device=cuda_kernels, dtype=dtype)
    out = torch.full((col_ind.numel(),), float("nan"), dtype=dtype, device=cuda_kernels)
    got = pattern_cuda._csr_gather(dense, row_ptr, col_ind, out=out)
    assert torch.equal(got, pattern_csr(dense, row_ptr, col_ind, impl="ref"))
    d = dense.clone().requires_grad_(True)
    vals = pattern_cuda.pattern_csr_cuda(d, row_ptr, col_ind)
    w = torch.randn(vals.shape, generator=gen, device=cuda_kernels, dtype=dtype)
    (vals * w).sum().backward()
    expected = torch.zeros_like(dense)
    expected[mask] = w
    assert torch.equal(d.grad, expected)


CONV_CASES = [
    ((2, 3, 7, 9), 5, (3, 3), 1, 1, 1, 0.5),
    ((3, 5, 11, 11), 7, (3, 3), 2, 1, 2, 0.4),
    ((2, 4, 8, 8), 6, (1, 1), 1, 0, 1, 0.7),
    ((4, 16, 13, 13), 8, (5, 3), (2, 1), (2, 1), 1, 0.3),
    ((8, 64, 32, 32), 64, (3, 3), 1, 1, 1, "pattern"),
]
CONV_IDS = ["odd", "stride2-dil2", "1x1", "rect", "resnet-pattern"]


def _conv_inputs(case, dtype, device, gen):
    xs, f_out, (r, s), stride, padding, dilation, density = case
    c = xs[1]
    if density == "pattern":
        mask = _pattern_mask(f_out, c, gen, device)
    else:
        mask = _mask((f_out, c, r, s), density, gen, device)
    x = torch.randn(xs, generator=gen, device=device, dtype=dtype)
    w = torch.randn(f_out, c, r, s, generator=gen, device=device, dtype=dtype) * mask
    bias = torch.randn(f_out, generator=gen, device=device, dtype=dtype)
    return mask, x, w, bias, stride, padding, dilation


def _conv_run(fn, x, w, bias, g, grads=None):
    """(output, grad x, grad w, grad bias) of ``fn``; the backward under
    :func:`grad_paths` when ``grads`` is given."""
    x = x.detach().clone().requires_grad_(True)
    w = w.detach().clone().requires_grad_(True)
    bias = bias.detach().clone().requires_grad_(True)
    out = fn(x, w, bias)
    with grad_paths(grads) if grads else contextlib.nullcontext():
        out.backward(g.to(out.dtype))
    return out.detach(), x.grad, w.grad, bias.grad


@gpu
@pytest.mark.parametrize("grads", GRADS, ids=GRADS_IDS)
@pytest.mark.parametrize("implicit", [True, False], ids=["implicit", "explicit"])
@pytest.mark.parametrize("case", CONV_CASES, ids=CONV_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_pattern_conv2d_forward_and_backward_match_reference(
    cuda_kernels, case, dtype, implicit, grads
):
    gen = torch.Generator(device=GPU_DEV).manual_seed(3)
    mask, x, w, bias, stride, padding, dilation = _conv_inputs(case, dtype, cuda_kernels, gen)
    index = pattern_index(mask)

    def cuda_fn(xx, ww, bb):
        return pattern_cuda.pattern_conv2d_cuda(
            xx, ww, index, bb, stride, padding, dilation, implicit=implicit
        )

    def ref_fn(xx, ww, bb):
        return pattern_conv2d(xx, ww, index, bb, stride, padding, dilation, impl="ref")

    out_shape = F.conv2d(x, w, bias, stride, padding, dilation).shape
    g = torch.randn(out_shape, generator=gen, device=cuda_kernels, dtype=torch.float64)
    got = _conv_run(cuda_fn, x, w, bias, g, grads)
    ref = _conv_run(ref_fn, x.double(), w.double(), bias.double(), g)
    same = _conv_run(ref_fn, x, w, bias, g)
    bounds = _conv_run(ref_fn, x.abs().double(), w.abs().double(), bias.abs().double(), g.abs())
    terms = int(mask.reshape(mask.shape[0], -1).sum(1).max())
    names = ["output", "grad x", "grad weight", "grad bias"]
    n_out = out_shape[0] * out_shape[2] * out_shape[3]
    for name, a, r, s, bd, t in zip(
        names, got, ref, same, bounds, [terms, out_shape[1] * terms, n_out, n_out]
    ):
        assert_within_tolerance(a, r, s, bd, t, dtype, f"conv {name}")
    assert (got[2][~mask] == 0).all(), "weight gradient must be exactly zero off the pattern"


@gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("variant", CONV_VARIANTS, ids=CONV_VARIANTS)
def test_implicit_conv_writes_every_output(cuda_kernels, dtype, variant):
    gen = torch.Generator(device=GPU_DEV).manual_seed(4)
    mask, x, w, bias, stride, padding, dilation = _conv_inputs(
        CONV_CASES[1], dtype, cuda_kernels, gen
    )
    index = pattern_index(mask)
    vals = pattern_csr(w, index.row_ptr, index.col_ind, impl="ref")
    shape = F.conv2d(x, w, bias, stride, padding, dilation).shape
    out = torch.full(shape, float("nan"), dtype=dtype, device=cuda_kernels)
    st, pad, dil = (pattern_cuda._pair(v) for v in (stride, padding, dilation))
    pattern_cuda._conv_implicit(
        x, w.shape, vals, index.row_ptr, index.col_ind, bias, st, pad, dil, out=out, variant=variant
    )
    assert torch.isfinite(out).all()


@gpu
@pytest.mark.slow
def test_implicit_conv_paper_layer(cuda_kernels):
    """128 x 224 x 224 input, 256 x 128 x 3 x 3 pattern filters (the layer of Sec. 5.1): each
    kernel within the reference's tolerance and both giving the same bits."""
    gen = torch.Generator(device=GPU_DEV).manual_seed(5)
    mask = _pattern_mask(256, 128, gen, cuda_kernels)
    x = torch.randn(1, 128, 224, 224, generator=gen, device=cuda_kernels)
    w = torch.randn(256, 128, 3, 3, generator=gen, device=cuda_kernels) * mask
    index = pattern_index(mask)
    ref64 = F.conv2d(x.double(), w.double(), None, 1, 1)
    same = pattern_conv2d(x, w, index, None, 1, 1, impl="ref")
    bound = F.conv2d(x.abs().double(), w.abs().double(), None, 1, 1)
    outs = []
    for variant in CONV_VARIANTS:
        with pattern_cuda.forced_path("conv_forward", variant):
            got = pattern_cuda.pattern_conv2d_cuda(x, w, index, None, 1, 1)
        assert_within_tolerance(got, ref64, same, bound, 1152, torch.float32, variant)
        outs.append(got)
    assert torch.equal(outs[0], outs[1])


# -- N:M pruning ------------------------------------------------------------------------------

NM_SHAPES = [
    ((4, 8, 5, 7), 1),
    ((3, 10, 6, 6), 1),
    ((2, 64, 14, 14), 1),
    ((5, 37), 1),
    ((41,), 0),
    ((3, 4, 12, 5), 2),
    ((6, 9, 3, 3), 0),
]
NM_SHAPE_IDS = ["4x8x5x7", "C10-partial", "2x64x14x14", "2d", "1d", "dim2", "dim0"]
NM_NM = [(2, 4), (1, 2), (2, 8), (5, 16), (8, 32), (3, 7), (1, 1), (4, 4)]
NM_NM_IDS = ["2:4", "1:2", "2:8", "5:16", "8:32", "3:7", "1:1", "4:4"]
NM_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
NM_DTYPE_IDS = ["f32", "f64", "f16", "bf16"]
_BITS = {
    torch.float32: torch.int32,
    torch.float64: torch.int64,
    torch.float16: torch.int16,
    torch.bfloat16: torch.int16,
}


def _nm_input(shape, dtype, gen, ties: bool, special: bool):
    if ties:  # few distinct magnitudes: ties everywhere
        x = torch.randint(-3, 4, shape, generator=gen, device=GPU_DEV).to(dtype) * 0.5
    else:
        x = torch.randn(shape, generator=gen, device=GPU_DEV, dtype=torch.float64).to(dtype)
    if special and x.numel() > 8:
        flat = x.view(-1)
        flat[0], flat[3], flat[5], flat[7] = float("nan"), float("inf"), -float("inf"), -0.0
    return x


def _formats(shape):
    return ["nchw", "channels_last"] if len(shape) == 4 else ["nchw"]


def _bits_equal(a, b):
    return a.stride() == b.stride() and torch.equal(
        a.contiguous().view(_BITS[a.dtype]), b.contiguous().view(_BITS[b.dtype])
    )


@gpu
@pytest.mark.parametrize("dtype", NM_DTYPES, ids=NM_DTYPE_IDS)
@pytest.mark.parametrize("nm", NM_NM, ids=NM_NM_IDS)
@pytest.mark.parametrize("case", NM_SHAPES, ids=NM_SHAPE_IDS)
def test_nm_magnitude_is_bit_exact(cuda_kernels, case, nm, dtype):
    shape, dim = case
    n, m = nm
    gen = torch.Generator(device=GPU_DEV).manual_seed(11)
    for fmt in _formats(shape):
        for ties, special in ((True, True), (False, False)):
            x = _nm_input(shape, dtype, gen, ties, special)
            if fmt == "channels_last":
                x = x.to(memory_format=torch.channels_last)
            out = torch.full_like(x, float("nan"))
            got = nm_cuda._nm_launch(
                x, n, m, nm_cuda.METHODS["magnitude"], dim, "plane", None, 1e-4, out=out
            )
            ref = nm_prune_ref(x, n, m, "magnitude", dim)
            assert _bits_equal(got, ref), f"{fmt} ties={ties} special={special}"


@gpu
@pytest.mark.parametrize("dtype", NM_DTYPES, ids=NM_DTYPE_IDS)
@pytest.mark.parametrize("nm", [(2, 4), (4, 8), (3, 7), (8, 32)], ids=["2:4", "4:8", "3:7", "8:32"])
@pytest.mark.parametrize("case", NM_SHAPES, ids=NM_SHAPE_IDS)
def test_nm_select_paths_give_the_same_bits_on_gpu(cuda_kernels, case, nm, dtype):
    """The thread-per-group and sub-warp selections write every output (poisoned first) with
    the same bits in the three modes, vector loads or not; magnitude equals the reference."""
    shape, dim = case
    n, m = nm
    gen = torch.Generator(device=GPU_DEV).manual_seed(14)
    for fmt in _formats(shape):
        x = _nm_input(shape, dtype, gen, ties=True, special=True)
        if fmt == "channels_last":
            x = x.to(memory_format=torch.channels_last)
        for method in ("magnitude", "random", "rescaled"):
            mode = nm_cuda.METHODS[method]
            seed = torch.tensor([12345, 678], dtype=torch.int64, device=GPU_DEV)
            outs = []
            for path in nm_cuda.SELECT_PATHS:
                out = torch.full_like(x, float("nan"))
                with (
                    timed_choice.forced("nm_select", path),
                    timed_choice.forced("nm_rescaled", "three_pass"),
                ):
                    outs.append(nm_cuda._nm_launch(x, n, m, mode, dim, "plane", seed, 1e-4, out))
            assert _bits_equal(outs[0], outs[1]), (fmt, method)
            if method == "magnitude":
                assert _bits_equal(outs[0], nm_prune_ref(x, n, m, "magnitude", dim)), fmt


@gpu
@pytest.mark.parametrize("rescale", ["plane", "channel"], ids=["plane", "channel"])
@pytest.mark.parametrize("dtype", NM_DTYPES, ids=NM_DTYPE_IDS)
@pytest.mark.parametrize("nm", [(2, 4), (5, 16), (3, 7), (4, 4)], ids=["2:4", "5:16", "3:7", "4:4"])
@pytest.mark.parametrize("case", NM_SHAPES, ids=NM_SHAPE_IDS)
def test_nm_rescaled_keeps_the_same_positions_and_is_within_tolerance(
    cuda_kernels, case, nm, dtype, rescale
):
    shape, dim = case
    n, m = nm
    gen = torch.Generator(device=GPU_DEV).manual_seed(12)
    for fmt in _formats(shape):
        for ties in (True, False):
            x = _nm_input(shape, dtype, gen, ties, special=False)
            if fmt == "channels_last":
                x = x.to(memory_format=torch.channels_last)
            out = torch.full_like(x, float("nan"))
            got = nm_cuda._nm_launch(
                x, n, m, nm_cuda.METHODS["rescaled"], dim, rescale, None, 1e-4, out=out
            )
            assert torch.isfinite(got).all(), "some outputs were not written"
            ref = nm_prune_ref(x, n, m, "rescaled", dim, rescale)
            oracle = nm_prune_ref(x.double(), n, m, "rescaled", dim, rescale)
            assert got.stride() == ref.stride()
            assert torch.equal(got == 0, ref == 0), "kept positions differ"
            eps = torch.finfo(dtype).eps
            err = (got.double() - oracle).abs().max().item()
            base = (ref.double() - oracle).abs().max().item()
            # 4 eps of the largest output: the kernel sums each group's statistics in its own
            # order, which for float64 (where the reference is the oracle, base = 0) is the
            # whole difference (2.7 eps measured with the emulated kernel)
            floor = 4 * eps * oracle.abs().max().item()
            assert err <= 2 * base + floor, f"{fmt}: {err:.3e} vs ref {base:.3e} + {floor:.3e}"


@gpu
@pytest.mark.parametrize("nm", [(2, 4), (1, 3), (5, 8), (7, 32)], ids=["2:4", "1:3", "5:8", "7:32"])
def test_nm_random_keeps_n_per_group_reproducibly_and_layout_independently(cuda_kernels, nm):
    n, m = nm
    x = torch.randn(6, 37, 5, 4, device=GPU_DEV).abs() + 0.1  # no zeros: kept == nonzero
    g1 = torch.Generator(device=GPU_DEV).manual_seed(21)
    a = nm_cuda.nm_prune_cuda(x, n, m, "random", generator=g1)
    g2 = torch.Generator(device=GPU_DEV).manual_seed(21)
    b = nm_cuda.nm_prune_cuda(x.to(memory_format=torch.channels_last), n, m, "random", generator=g2)
    c = nm_cuda.nm_prune_cuda(x, n, m, "random", generator=g1)  # generator advanced
    assert torch.equal(a, b.contiguous()), "the draw must not depend on the memory format"
    assert not torch.equal(a, c), "a second draw from the generator must differ"
    kept = a != 0
    assert torch.equal(a[kept], x[kept])
    full, r = divmod(37, m)
    counts = F.pad(kept.movedim(1, -1), (0, -37 % m)).reshape(6, 5, 4, -1, m).sum(-1)
    assert (counts[..., :full] == n).all()
    if r:
        assert (counts[..., full] == min(n, r)).all()


@gpu
def test_nm_random_draws_every_subset_uniformly(cuda_kernels):
    x = torch.ones(60000, 4, device=GPU_DEV)
    gen = torch.Generator(device=GPU_DEV).manual_seed(5)
    keep = nm_cuda.nm_prune_cuda(x, 2, 4, "random", dim=1, generator=gen) != 0
    code = (keep.long() * torch.tensor([1, 2, 4, 8], device=GPU_DEV)).sum(1)
    counts = torch.bincount(code, minlength=16)
    subsets = [sum(1 << i for i in s) for s in combinations(range(4), 2)]
    assert int(counts.sum()) == int(counts[subsets].sum()) == 60000
    expected = 10000
    sd = math.sqrt(60000 * (1 / 6) * (5 / 6))
    assert ((counts[subsets] - expected).abs() < 6 * sd).all(), counts[subsets].tolist()


@gpu
@pytest.mark.slow
def test_nm_magnitude_and_rescaled_on_a_64_mb_gradient(cuda_kernels):
    gen = torch.Generator(device=GPU_DEV).manual_seed(13)
    x = torch.randn(64, 256, 32, 32, generator=gen, device=GPU_DEV)  # 64 MiB float32
    for fmt in ("nchw", "channels_last"):
        xf = x if fmt == "nchw" else x.to(memory_format=torch.channels_last)
        got = nm_cuda.nm_prune_cuda(xf, 2, 4, "magnitude")
        assert _bits_equal(got, nm_prune_ref(xf, 2, 4, "magnitude"))
        got = nm_cuda.nm_prune_cuda(xf, 2, 4, "rescaled")
        ref = nm_prune_ref(xf, 2, 4, "rescaled")
        assert torch.equal(got == 0, ref == 0)
        # the same bound as the other rescaled tests: within twice the reference's own error
        # against float64, plus 4 eps of the largest output (the kernel's summation order:
        # channels-last sums 128 elements per thread serially, 4.6 eps element-wise, measured
        # with the emulated kernel)
        oracle = nm_prune_ref(xf.double(), 2, 4, "rescaled")
        eps = torch.finfo(torch.float32).eps
        err = (got.double() - oracle).abs().max().item()
        base = (ref.double() - oracle).abs().max().item()
        assert err <= 2 * base + 4 * eps * oracle.abs().max().item(), (fmt, err, base)


@gpu
@pytest.mark.parametrize("nm", [(2, 4), (4, 8), (8, 16), (3, 7)], ids=["2:4", "4:8", "8:16", "3:7"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_nm_rescaled_fused_gives_the_three_kernels_bits_on_gpu(cuda_kernels, nm, dtype):
    """At 56 x 56 planes (49 KiB to 196 KiB of shared memory per group) the fused kernel runs
    where its group fits the device's shared memory (227 KiB on sm_90, 163 KiB on sm_80) and
    is at most 8 wide, equals statistics + ratio + selection bit for bit, and the timed
    choice records both times; elsewhere the three kernels run."""
    n, m = nm
    gen = torch.Generator(device=GPU_DEV).manual_seed(31 + m)
    x = torch.randn(4, 64, 56, 56, generator=gen, device=GPU_DEV, dtype=dtype)
    x[1, 5, 7, 9] = float("nan")
    view = nm_cuda.nm_view(x.shape, x.stride(), 1, "plane")
    smem = nm_cuda.fused_shared_bytes(view, m, x.element_size())
    fits = smem is not None and smem + nm_cuda._FUSED_STATIC_SMEM <= loader.max_shared_per_block(0)
    outs = {}
    for path in nm_cuda.RESCALED_PATHS:
        ran = path if fits else "three_pass"
        before = timed_choice.uses().get(f"nm_rescaled {ran}", 0)
        with timed_choice.forced("nm_rescaled", path):
            outs[path] = nm_cuda.nm_prune_cuda(x, n, m, "rescaled")
        assert timed_choice.uses().get(f"nm_rescaled {ran}", 0) == before + 1, path
    assert _bits_equal(outs["fused"], outs["three_pass"])
    timed = nm_cuda.nm_prune_cuda(x, n, m, "rescaled")
    assert _bits_equal(timed, outs["fused"])
    if fits:
        problem = f"I{56 * 56} {n}:{m} strides {64 * 3136},3136,1 "
        picked = [
            v
            for k, v in timed_choice.timed_choices().items()
            if k.startswith("nm_rescaled: ") and problem in k
        ]
        assert picked and set(picked[0]["ms"]) == set(nm_cuda.RESCALED_PATHS)


# -- pack / unpack ----------------------------------------------------------------------------

PACK_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.uint8]
PACK_DTYPE_IDS = ["f32", "f64", "f16", "bf16", "u8"]


@gpu
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=["i32", "i64"])
@pytest.mark.parametrize("dtype", PACK_DTYPES, ids=PACK_DTYPE_IDS)
@pytest.mark.parametrize(
    "shape", [(1,), (37,), (64, 3, 3, 3), (1000003,)], ids=["1", "37", "conv", "1000003"]
)
def test_pack_unpack_exact_and_round_trip(cuda_kernels, shape, dtype, index_dtype):
    gen = torch.Generator(device=GPU_DEV).manual_seed(6)
    g = (torch.randn(shape, generator=gen, device=GPU_DEV) * 50).to(dtype)
    mask = torch.rand(shape, generator=gen, device=GPU_DEV) < 0.3
    mask.view(-1)[0] = True
    idx = pack_cuda.mask_index(mask, index_dtype)
    out = torch.full((idx.numel(),), 7, dtype=dtype, device=GPU_DEV)
    if dtype.is_floating_point:
        out.fill_(float("nan"))
    buf = pack_cuda._pack(g, idx, out=out)
    assert torch.equal(buf.view(torch.uint8), pack_cuda.grad_pack_ref(g, idx).view(torch.uint8))
    back = pack_cuda.grad_unpack(buf, idx, shape, impl="cuda")
    expected = pack_cuda.grad_unpack_ref(buf, idx, shape)
    assert torch.equal(back.view(torch.uint8), expected.view(torch.uint8))
    assert torch.equal(back, torch.where(mask, g, torch.zeros((), dtype=dtype, device=GPU_DEV)))
    flat = torch.full((g.numel(),), 3, dtype=dtype, device=GPU_DEV)
    pack_cuda.unpack(buf, idx, flat)  # in place: off-index elements untouched
    assert torch.equal(flat[~mask.view(-1)], torch.full_like(flat[~mask.view(-1)], 3))
    assert torch.equal(flat[mask.view(-1)], g.view(-1)[mask.view(-1)])


@gpu
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=["i32", "i64"])
@pytest.mark.parametrize("dtype", PACK_DTYPES, ids=PACK_DTYPE_IDS)
@pytest.mark.parametrize(
    "case",
    ["random", "none-kept", "all-kept", "pruned-filters", "one-past-a-tile", "strided-tables"],
)
def test_expand_writes_values_and_zeros_in_one_pass(cuda_kernels, case, dtype, index_dtype):
    """expand writes every element of a poisoned bucket: the values at the kept positions and
    zeros elsewhere, as zeroing and scattering would; long runs of pruned positions (whole
    filters), nothing kept, everything kept, a bucket one element past a whole number of
    tiles, and an index and tile table given as strided views included."""
    gen = torch.Generator(device=GPU_DEV).manual_seed(8)
    numel = 3 * pack_cuda.EXPAND_TILE + 1 if case == "one-past-a-tile" else 64 * 3 * 3 * 3 + 5
    mask = torch.rand(numel, generator=gen, device=GPU_DEV) < 0.4
    if case == "none-kept":
        mask[:] = False
    elif case == "all-kept":
        mask[:] = True
    elif case == "pruned-filters":  # 27-element filters, two of every three pruned whole
        mask[: 64 * 27].view(64, 27)[torch.arange(64, device=GPU_DEV) % 3 != 0] = False
    idx = pack_cuda.mask_index(mask, index_dtype)
    values = (torch.randn(idx.numel(), generator=gen, device=GPU_DEV) * 50).to(dtype)
    starts = pack_cuda.expand_starts(idx, numel)
    if case == "strided-tables":  # every other element of a twice-as-long tensor
        idx = torch.stack([idx, torch.full_like(idx, -1)], 1)[:, 0]
        starts = torch.stack([starts, torch.full_like(starts, -1)], 1)[:, 0]
        assert not idx.is_contiguous() and not starts.is_contiguous()
    out = torch.full((numel,), 7, dtype=dtype, device=GPU_DEV)
    if dtype.is_floating_point:
        out.fill_(float("nan"))
    assert pack_cuda.expand(values, idx, starts, out) is out
    expected = pack_cuda.grad_unpack_ref(values, idx, (numel,))
    assert torch.equal(out.view(torch.uint8), expected.view(torch.uint8))


@gpu
def test_comm_unpack_expands_on_the_gpu_with_the_buckets_tile_table(cuda_kernels):
    """The sparse Allreduce's unpack takes the one-pass expand where the kernels load and a
    tile table is given, and gives what zeroing and scattering give."""
    from impl import comm

    if EMULATE_GPU_TESTS:
        pytest.skip("impl.comm takes the kernels for CUDA tensors only, not the emulation's")
    gen = torch.Generator(device=GPU_DEV).manual_seed(9)
    numel = 2 * pack_cuda.EXPAND_TILE + 77
    idx = pack_cuda.mask_index(torch.rand(numel, generator=gen, device=GPU_DEV) < 0.5, torch.int64)
    packed = torch.randn(idx.numel(), generator=gen, device=GPU_DEV)
    want = comm.unpack(packed, idx, torch.full((numel,), float("nan"), device=GPU_DEV), "ref")
    before = loader.launched().get("pdt_expand_b4_i64", 0)
    got = comm.unpack(
        packed,
        idx,
        torch.full((numel,), float("nan"), device=GPU_DEV),
        "cuda",
        starts=pack_cuda.expand_starts(idx, numel),
    )
    assert loader.launched().get("pdt_expand_b4_i64", 0) == before + 1
    assert torch.equal(got, want)


@gpu
@pytest.mark.slow
def test_pack_unpack_64_mb(cuda_kernels):
    g = torch.randn(16 * 2**20, device=GPU_DEV)  # 64 MiB float32
    mask = torch.rand(g.shape, device=GPU_DEV) < 0.5
    idx = pack_cuda.mask_index(mask)
    buf = pack_cuda.grad_pack(g, idx)
    assert torch.equal(buf, g[mask])
    assert torch.equal(pack_cuda.grad_unpack(buf, idx, g.shape), g * mask)


def test_launch_opts_a_kernel_in_to_its_dynamic_shared_memory_once_per_size(monkeypatch):
    """A kernel is opted in to its dynamic shared memory (max_dynamic_shared_size_bytes)
    before the launch, once per larger size: also below 48 KiB, where static plus dynamic
    may still pass the default limit."""
    import types

    class Kernel:
        def __init__(self):
            self.max_dynamic_shared_size_bytes = 0
            self.attribute_sets = []
            self.launches = []

        def __setattr__(self, key, value):
            if key == "max_dynamic_shared_size_bytes" and hasattr(self, "attribute_sets"):
                self.attribute_sets.append(value)
            object.__setattr__(self, key, value)

        def __call__(self, grid, block, args, shared_mem=0):
            self.launches.append(shared_mem)

    kernel = Kernel()
    fake = types.ModuleType("cupy")
    fake.cuda = types.SimpleNamespace(Device=lambda index: contextlib.nullcontext())
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(loader, "get_function", lambda source, name, index: kernel)
    monkeypatch.setattr(loader, "kernel_args", lambda args, index, name: tuple(args))
    monkeypatch.setattr(loader, "torch_stream", lambda index: contextlib.nullcontext())
    monkeypatch.setattr(loader, "_device_index", lambda device: 0)
    monkeypatch.setattr(loader, "_dynamic_smem_set", {})
    for smem in (0, 40 * 1024, 100 * 1024, 100 * 1024, 60 * 1024, 200 * 1024):
        loader.launch("nm_prune.cu", "pdt_nm_fused_f32_w8", (1, 1, 1), (32, 1, 1), [], 0, smem)
    assert kernel.launches == [0, 40 * 1024, 100 * 1024, 100 * 1024, 60 * 1024, 200 * 1024]
    assert kernel.attribute_sets == [40 * 1024, 100 * 1024, 200 * 1024]


def test_emulated_tiled_kernels_refuse_sizes_past_their_32_bit_offsets(emulated, monkeypatch):
    """An explicit row-tiled variant where a warp's nonzeros could pass 2^31 is an error, not
    a silent overflow (the sizes are faked: RW made huge)."""
    monkeypatch.setitem(pattern_cuda.ROWS_PER_WARP, torch.float32, 2**31)
    idx = pattern_index(torch.ones(4, 9, dtype=torch.bool))
    vals = torch.ones(36)
    for tiled in ("row_tiled", "pipelined"):
        with pytest.raises(ValueError, match=f"the {tiled} kernel cannot take K = 9"):
            pattern_cuda._spmm(vals, idx.row_ptr, idx.col_ind, torch.ones(9, 5), variant=tiled)
    assert pattern_cuda.spmm_variants(torch.float32, 9) == ("warp_row",)
    x = torch.ones(1, 1, 4, 4)
    with pytest.raises(ValueError, match="the implicit_tiled kernel cannot take C\\*R\\*S = 9"):
        pattern_cuda._conv_implicit(
            x,
            (4, 1, 3, 3),
            vals,
            idx.row_ptr,
            idx.col_ind,
            None,
            [1, 1],
            [1, 1],
            [1, 1],
            variant="implicit_tiled",
        )
    out = pattern_cuda._conv_implicit(
        x, (4, 1, 3, 3), vals, idx.row_ptr, idx.col_ind, None, [1, 1], [1, 1], [1, 1]
    )
    assert emulated == ["pdt_conv_implicit_f32"] and out[0, 0, 1, 1] == 9.0


def test_emulated_benchmark_rows_find_the_timings_of_the_ops_problems(
    emulated, timing_allowed, monkeypatch
):
    """The benchmark's problem names match the ones the ops time under (real op calls), so
    a row carries the path each op ran and that timing's milliseconds."""
    from bench import cases

    def fake_ms(fn, device=None):  # by the kernels the candidate launched: tiled/fused fast
        start = len(emulated)
        fn()
        fast = any("tiled" in k or "fused" in k for k in emulated[start:])
        return 1.0 if fast else 2.0

    monkeypatch.setattr(timed_choice, "cuda_ms", fake_ms)
    gen = torch.Generator().manual_seed(41)
    idx = pattern_index(torch.rand(7, 20, generator=gen) < 0.5)
    nnz = idx.col_ind.numel()
    vals = torch.randn(nnz, generator=gen)
    spmm_impl = cases.implementations("spmm", "gpu")["pattern_spmm[cuda]@cuda"]
    before = cases._path_uses()
    pattern_cuda._spmm(vals, idx.row_ptr, idx.col_ind, torch.randn(20, 5, generator=gen))
    cols = cases._path_columns(spmm_impl, f" 7x20x5 batch 1 nnz {nnz} ", cases._uses_since(before))
    assert cols == {
        "path_spmm": "timed: row_tiled",
        "path_spmm_ms_row_tiled": 1.0,
        "path_spmm_ms_warp_row": 2.0,
    }

    mask = torch.rand(6, 2, 3, 3, generator=gen) < 0.5
    cidx = pattern_index(mask)
    w = torch.randn(6, 2, 3, 3, generator=gen) * mask
    conv_impl = cases.implementations("conv", "gpu")["pattern_conv2d[cuda]@cuda"]
    before = cases._path_uses()
    x = torch.randn(1, 2, 5, 5, generator=gen)
    ones = [1, 1]
    pattern_cuda._conv_implicit(
        x, w.shape, w[mask], cidx.row_ptr, cidx.col_ind, None, ones, ones, ones
    )
    parts = cases._conv_problem_parts([1, 2, 5, 5], [6, 2, 3, 3], int(mask.sum()), 25)
    cols = cases._path_columns(conv_impl, parts, cases._uses_since(before))
    assert cols["path_conv_forward"] == "timed: implicit_tiled"
    assert cols["path_conv_forward_ms_implicit"] == 2.0
    # the backward's SDDMM (on the im2col matrix) is found by the conv's second part
    wq = w.clone().requires_grad_(True)
    before = cases._path_uses()
    with pattern_cuda.forced_path("weight_grad", "sddmm"):
        out = pattern_cuda.pattern_conv2d_cuda(x, wq, cidx, None, 1, 1, 1)
        out.sum().backward()
    cols = cases._path_columns(conv_impl, parts, cases._uses_since(before))
    assert cols["path_weight_grad"] == "forced: sddmm"
    assert cols["path_sddmm"] == "timed: row_tiled"
    assert (cols["path_sddmm_ms_row_tiled"], cols["path_sddmm_ms_block_row"]) == (1.0, 2.0)

    nm_impl = cases.implementations("nm_prune", "gpu")["nm_prune[cuda]@cuda"]
    before = cases._path_uses()
    nm_cuda.nm_prune_cuda(torch.randn(2, 8, 3, 3, generator=gen), 2, 4, "rescaled")
    part = cases._nm_problem_part(torch.zeros(2, 8, 3, 3), 1, 2, 4, "rescaled")
    cols = cases._path_columns(nm_impl, part, cases._uses_since(before))
    assert cols["path_nm_rescaled"] == "timed: fused"
    assert cols["path_nm_rescaled_ms_three_pass"] == 2.0


def test_emulated_benchmark_rows_take_their_own_problems_timings_not_a_lookalikes(
    emulated, timing_allowed, monkeypatch
):
    """Two problems whose names share the part a row searched for: the 4:8 row took the 2:4
    timing of the same tensor, and a conv row's input-gradient SpMM the SpMM suite's
    filters x C*R*S problem. Each row now finds its own op's own problem."""
    from bench import cases

    calls = iter(range(1000))
    monkeypatch.setattr(timed_choice, "cuda_ms", lambda fn, device=None: (fn(), next(calls))[1])
    gen = torch.Generator().manual_seed(43)
    nm_impl = cases.implementations("nm_prune", "gpu")["nm_prune[cuda]@cuda"]
    x = torch.randn(2, 8, 3, 3, generator=gen)
    nm_cuda.nm_prune_cuda(x, 2, 4, "rescaled")  # timed first: the lookalike
    before = cases._path_uses()
    nm_cuda.nm_prune_cuda(x, 4, 8, "rescaled")
    part = cases._nm_problem_part(x, 1, 4, 8, "rescaled")
    cols = cases._path_columns(nm_impl, part, cases._uses_since(before))

    def own_choice(op: str, needle: str) -> dict:
        (choice,) = [
            c
            for k, c in timed_choice.timed_choices().items()
            if k.startswith(f"{op}: ") and needle in k
        ]
        return choice

    own = own_choice("nm_rescaled", " 4:8 ")
    assert {k: v for k, v in cols.items() if "_ms_" in k} == {
        f"path_nm_rescaled_ms_{p}": ms for p, ms in own["ms"].items()
    }
    # The selection: a rescaled case times it too (mode 2) before the magnitude case of the
    # same tensor (mode 0), and an NCHW case comes before the channels-last one of its sizes.
    y = torch.randn(2, 8, 4, 4, generator=gen)
    nm_cuda.nm_prune_cuda(y, 2, 4, "rescaled")
    for z, strides in ((y, "128,16,1"), (y.to(memory_format=torch.channels_last), "128,1,8")):
        before = cases._path_uses()
        nm_cuda.nm_prune_cuda(z, 2, 4, "magnitude")
        part = cases._nm_problem_part(z, 1, 2, 4, "magnitude")
        cols = cases._path_columns(nm_impl, part, cases._uses_since(before))
        own = own_choice("nm_select", f" 2:4 strides {strides} mode 0 ")
        got = {k: v for k, v in cols.items() if k.startswith("path_nm_select_ms_")}
        assert got == {f"path_nm_select_ms_{p}": ms for p, ms in own["ms"].items()}, strides

    mask = torch.rand(6, 2, 3, 3, generator=gen) < 0.5
    cidx = pattern_index(mask)
    k, positions = 2 * 9, 25
    sidx = pattern_index(mask.reshape(6, k))
    vals = torch.randn(sidx.col_ind.numel(), generator=gen)
    # the SpMM suite's forward problem, 6 x 18 x 25 (its part " 6x18x25 batch 1 nnz N ")
    pattern_cuda._spmm(vals, sidx.row_ptr, sidx.col_ind, torch.randn(k, positions, generator=gen))
    conv_impl = cases.implementations("conv", "gpu")["pattern_conv2d[cuda]@cuda"]
    x = torch.randn(1, 2, 5, 5, generator=gen, requires_grad=True)
    wq = (torch.randn(6, 2, 3, 3, generator=gen) * mask).requires_grad_(True)
    before = cases._path_uses()
    with pattern_cuda.forced_path("input_grad", "spmm"):
        pattern_cuda.pattern_conv2d_cuda(x, wq, cidx, None, 1, 1, 1).sum().backward()
    parts = cases._conv_problem_parts([1, 2, 5, 5], [6, 2, 3, 3], int(mask.sum()), positions)
    cols = cases._path_columns(conv_impl, parts, cases._uses_since(before))
    (own,) = [c for key, c in timed_choice.timed_choices().items()
              if key.startswith("spmm: ") and f" {k}x6x{positions} " in key]  # fmt: skip
    assert {key: v for key, v in cols.items() if key.startswith("path_spmm_ms_")} == {
        f"path_spmm_ms_{p}": ms for p, ms in own["ms"].items()
    }


@pytest.mark.parametrize("source", ["attributes", "properties", "runtime", "none"], ids=str)
def test_max_shared_per_block_asks_cupy_three_ways_then_assumes_48_kib(monkeypatch, source):
    import types

    def fail(*a):
        raise AttributeError("not in this CuPy")

    value = 232448  # sm_90's opt-in limit
    device = types.SimpleNamespace(attributes={"MaxSharedMemoryPerBlockOptin": value})
    runtime = types.SimpleNamespace(
        getDeviceProperties=lambda d: {"sharedMemPerBlockOptin": value},
        deviceGetAttribute=lambda attr, d: value if attr == 97 else 0,
    )
    if source != "attributes":
        device = types.SimpleNamespace(attributes={})
    if source not in ("attributes", "properties"):
        runtime.getDeviceProperties = fail
    if source == "none":
        runtime.deviceGetAttribute = fail
    fake = types.ModuleType("cupy")
    fake.cuda = types.SimpleNamespace(Device=lambda d: device, runtime=runtime)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    loader.max_shared_per_block.cache_clear()
    try:
        expected = 48 * 1024 if source == "none" else value
        assert loader.max_shared_per_block(0) == expected
    finally:
        loader.max_shared_per_block.cache_clear()


def test_preflight_fails_on_a_gpu_the_kernels_cannot_use(monkeypatch, capsys):
    """make bench-gpu / gpu-check stop at once, saying why, where a GPU is visible and CuPy
    is missing; a machine without a GPU passes (its commands refuse the gpu scale)."""
    from impl.cuda import preflight

    monkeypatch.setattr(preflight.torch.cuda, "is_available", lambda: False)
    assert preflight.main(["bench-gpu"]) == 0
    monkeypatch.setattr(preflight.torch.cuda, "is_available", lambda: True)
    no_cupy = "CuPy could not be imported"
    monkeypatch.setattr(preflight, "kernels_environment_error", lambda: no_cupy)
    assert preflight.main(["bench-gpu"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("bench-gpu: the CUDA kernels cannot run here: CuPy could not be imported")
    assert "EXTRAS=dev,cuda make setup" in err
    monkeypatch.setattr(preflight, "kernels_environment_error", lambda: None)
    assert preflight.main([]) == 0


def test_the_device_check_names_the_op_and_hands_the_kernels_sources_to_the_loader(monkeypatch):
    """Each error starts with the op's name and names each device once; meta tensors pass,
    and the loader is then asked for the op's kernels (``sources``) on the tensors given,
    never for CPU tensors."""
    on = types.SimpleNamespace  # only .device is read: no GPU needed
    cpu, gpu = on(device=torch.device("cpu")), on(device=torch.device("cuda", 1))
    match = r"^grad_pack: the CUDA implementation needs CUDA tensors, got cpu; use impl='ref'"
    with pytest.raises(RuntimeError, match=match + r" \(or 'auto'\) of impl\.ops\.grad_pack, "):
        device_check.check_devices("grad_pack", "impl.ops.grad_pack", cpu, cpu)
    with pytest.raises(RuntimeError, match=r"^nm_prune: .* on the GPU, got cpu, cuda:1; move"):
        device_check.check_devices("nm_prune", "impl.ops.nm_prune", cpu, gpu, cpu)
    asked = []

    def require_cuda(op, *tensors, sources):
        asked.append((op, tensors, tuple(sources)))
        return 3

    monkeypatch.setattr(loader, "require_cuda", require_cuda)
    meta = torch.empty(2, device="meta")
    got = device_check.require_cuda(
        "grad_pack", "impl.ops.grad_pack", meta, meta, sources=("pack.cu",)
    )
    assert got == 3 and asked == [("grad_pack", (meta, meta), ("pack.cu",))]
    with pytest.raises(RuntimeError, match="^grad_pack: .* needs CUDA tensors, got cpu;"):
        device_check.require_cuda(
            "grad_pack", "impl.ops.grad_pack", torch.zeros(2), sources=("pack.cu",)
        )
    assert len(asked) == 1  # CPU tensors: the loader is not asked
