"""Tests of SDGP's semi-structured (2:4 sparse tensor core) backend, ``impl.methods.sdgp_semi``.

Without a GPU every backward takes the reference path: the tests check that it does, with its
reason, bit for bit equal to the reference ``SDGPConv2d``; and every piece of the sparse path
that needs no sparse tensor core (pruning in GEMM layout, the fold algebra, the support rules,
padding) against ``nm_prune`` and ``torch.nn.grad.conv2d_input`` in float64. The ``gpu`` tests
run the sparse product itself against a float64 reference.
"""

from __future__ import annotations

import logging
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import impl.methods.sdgp_semi as semi
import impl.models
from impl.flops import FlopCounts, LayerDensity
from impl.methods.sdgp import SDGPConv2d, nm_prune, sdgp_convert, sdgp_plan
from impl.methods.sdgp_semi import (
    SDGPSemiConv2d,
    assemble_data_grad,
    conv_output_hw,
    data_grad_from_rows,
    grad_rows,
    prune_rows,
    resolve_backend,
    rows_to_nchw,
    sdgp_semi_convert,
    semi_matmul,
    semi_modules,
    semi_summary,
    shape_constraints,
    unsupported_reason,
)

METHODS = ["magnitude", "rescaled", "random"]
RESCALES = ["plane", "channel"]
# (N, K, Ho, Wo): odd sizes, a partial last group (K = 10), one pixel, and a real layer4 shape.
PRUNE_SHAPES = [(3, 8, 5, 7), (2, 10, 3, 3), (5, 12, 1, 1), (2, 512, 7, 7)]
PRUNE_IDS = ["3x8x5x7", "K10-partial", "1x1-pixels", "layer4-512x7x7"]


# --------------------------------------------------------------------------------------------
# pruning in GEMM layout
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", PRUNE_SHAPES, ids=PRUNE_IDS)
@pytest.mark.parametrize("rescale", RESCALES, ids=RESCALES)
@pytest.mark.parametrize("method", METHODS, ids=METHODS)
def test_prune_rows_equals_nm_prune_on_nchw(shape, method, rescale):
    g = torch.randn(shape, dtype=torch.float64)
    gen_a = torch.Generator().manual_seed(7)
    gen_b = torch.Generator().manual_seed(7)
    ref = grad_rows(nm_prune(g, 2, 4, method, 1, rescale, gen_a, impl="ref"))
    got = prune_rows(grad_rows(g), 2, 4, method, rescale, gen_b, impl="ref")
    assert got.shape == (shape[0], shape[2] * shape[3], shape[1])
    if method == "rescaled":  # the same sums, accumulated in another order
        torch.testing.assert_close(got, ref, rtol=1e-13, atol=1e-15)
    else:  # the same mask (random: the same draw), hence the same values
        assert torch.equal(got, ref)
    assert torch.equal(got != 0, ref != 0)  # the same kept positions, rescaled included


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_prune_rows_low_precision_same_mask(dtype):
    g = torch.randn(4, 64, 6, 5).to(dtype)
    ref = grad_rows(nm_prune(g, 2, 4, "magnitude", 1, impl="ref"))
    got = prune_rows(grad_rows(g), 2, 4, "magnitude", impl="ref")
    assert torch.equal(got, ref)
    kept = (got.reshape(-1, 4) != 0).sum(-1)
    assert int(kept.max()) <= 2


def test_grad_rows_contiguous_view_for_channels_last_strided_for_nchw():
    g = torch.randn(2, 16, 5, 3)
    cl = g.contiguous(memory_format=torch.channels_last)
    rows_cl = grad_rows(cl)
    assert rows_cl.data_ptr() == cl.data_ptr() and rows_cl.is_contiguous()  # GEMM-ready
    rows = grad_rows(g)
    assert rows.data_ptr() == g.data_ptr() and not rows.is_contiguous()  # K is the slow dim
    assert torch.equal(rows, rows_cl)
    assert torch.equal(rows[1, 3 * 3 + 2], g[1, :, 3, 2])  # pixel (3, 2) of sample 1
    assert torch.equal(rows_to_nchw(rows, (5, 3)), g)


def test_prune_rows_rejects_bad_arguments():
    rows = torch.randn(2, 3, 8)
    with pytest.raises(ValueError, match="N, L, K"):
        prune_rows(rows[0], 2, 4)
    with pytest.raises(ValueError, match="prune impl"):
        prune_rows(rows, 2, 4, impl="triton")
    with pytest.raises(ValueError, match="n <= m"):
        prune_rows(rows, 5, 4)
    with pytest.raises(RuntimeError, match="not available"):
        prune_rows(rows, 2, 4, impl="cuda")


# --------------------------------------------------------------------------------------------
# the fold / unfold algebra of the data gradient (float64, dense math of the sparse path)
# --------------------------------------------------------------------------------------------
# (C, K, kernel, stride, padding, dilation, (H, W))
FOLD_CASES = [
    (6, 8, (3, 3), (1, 1), (1, 1), (1, 1), (11, 9)),
    (5, 8, (3, 3), (2, 2), (1, 1), (1, 1), (11, 9)),
    (4, 12, (3, 3), (2, 2), (1, 1), (1, 1), (8, 8)),
    (7, 8, (3, 3), (3, 3), (0, 0), (1, 1), (10, 13)),
    (5, 8, (5, 5), (1, 1), (4, 4), (2, 2), (9, 7)),
    (6, 4, (1, 3), (1, 2), (0, 1), (1, 1), (5, 9)),
    (3, 16, (7, 7), (2, 2), (3, 3), (1, 1), (13, 11)),
    (6, 8, (1, 1), (1, 1), (0, 0), (1, 1), (7, 5)),
    (6, 8, (1, 1), (2, 2), (0, 0), (1, 1), (7, 9)),
    (6, 8, (1, 1), (2, 2), (0, 0), (1, 1), (8, 8)),
    (5, 8, (1, 1), (1, 1), (1, 1), (1, 1), (4, 6)),
    (64, 64, (3, 3), (1, 1), (1, 1), (1, 1), (14, 14)),
]
FOLD_IDS = [
    "3x3-s1-odd",
    "3x3-s2-odd",
    "3x3-s2-even",
    "3x3-s3-remainder",
    "5x5-dil2",
    "1x3-s1x2",
    "7x7-s2-stem",
    "1x1-s1",
    "1x1-s2-odd",
    "1x1-s2-even",
    "1x1-pad1-fold",
    "resnet-64x64-3x3",
]


@pytest.mark.parametrize(
    ("c", "k", "kernel", "stride", "padding", "dilation", "hw"), FOLD_CASES, ids=FOLD_IDS
)
@pytest.mark.parametrize("layout", ["nchw", "channels_last"], ids=["nchw", "cl"])
def test_data_grad_algebra_equals_conv2d_input(c, k, kernel, stride, padding, dilation, hw, layout):
    n = 3
    w = torch.randn(k, c, *kernel, dtype=torch.float64)
    ho, wo = conv_output_hw(hw, kernel, stride, padding, dilation)
    g = torch.randn(n, k, ho, wo, dtype=torch.float64)
    assert tuple(
        F.conv2d(
            torch.zeros(n, c, *hw, dtype=torch.float64), w, None, stride, padding, dilation
        ).shape
    ) == tuple(g.shape)
    if layout == "channels_last":
        g = g.contiguous(memory_format=torch.channels_last)
    pruned = prune_rows(grad_rows(g), 2, 4, "magnitude", impl="ref")  # the pruned dL/dO
    got = data_grad_from_rows(pruned.reshape(-1, k), w, (n, c, *hw), stride, padding, dilation)
    ref = torch.nn.grad.conv2d_input(
        (n, c, *hw), w, rows_to_nchw(pruned, (ho, wo)), stride, padding, dilation
    )
    assert got.shape == ref.shape == (n, c, *hw)
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)


def test_assemble_1x1_stride_leaves_zeros_off_grid():
    col = torch.randn(2 * 4 * 5, 3, dtype=torch.float64)
    out = assemble_data_grad(col, (2, 3, 7, 9), (1, 1), (2, 2), (0, 0), (1, 1))
    assert out.shape == (2, 3, 7, 9)
    mask = torch.zeros(7, 9, dtype=torch.bool)
    mask[::2, ::2] = True
    assert torch.count_nonzero(out[:, :, ~mask]) == 0
    assert torch.equal(out[:, :, ::2, ::2], col.reshape(2, 4, 5, 3).permute(0, 3, 1, 2))


def test_assemble_rejects_wrong_col_shape():
    with pytest.raises(ValueError, match="col must be"):
        assemble_data_grad(torch.zeros(10, 9), (1, 1, 4, 4), (3, 3), (1, 1), (1, 1), (1, 1))


def test_assemble_rejects_a_transposed_col_of_the_right_size():
    """A col with the right number of elements but not (N*Ho*Wo, C*R*S) is refused."""
    col = torch.zeros(9, 16)  # (C*R*S, N*Ho*Wo) for N=1, C=1, 3x3 kernel, 4x4 output
    with pytest.raises(ValueError, match=r"col must be \(16, 9\)"):
        assemble_data_grad(col, (1, 1, 4, 4), (3, 3), (1, 1), (1, 1), (1, 1))


def test_semi_matmul_pads_and_slices_dense_operand():
    # A dense stand-in for the compressed operand checks the padding and slicing logic
    # (the sparse product itself needs a GPU: see the gpu tests).
    a = torch.randn(40, 16, dtype=torch.float64)
    b = torch.randn(16, 13, dtype=torch.float64)  # 13 columns: padded to 16, sliced back
    sa = torch.cat([a, torch.zeros(8, 16, dtype=torch.float64)])  # rows padded as compress does
    sa.BACKEND = "cusparselt"
    out = semi_matmul(sa, b, 40)
    assert out.shape == (40, 13)
    torch.testing.assert_close(out, a @ b, rtol=1e-14, atol=1e-14)


@pytest.mark.parametrize(
    ("backend", "rows_out"), [("cusparselt", 128), ("cutlass", 64)], ids=["cslt", "cutlass"]
)
def test_compress_pads_rows_to_the_backend_multiple(monkeypatch, backend, rows_out):
    class Identity:  # stands in for the library class: returns what it is given
        @staticmethod
        def from_dense(a):
            return a

    monkeypatch.setattr(semi, "_semi_class", lambda name: Identity)
    a = torch.randn(40, 64, dtype=torch.bfloat16)
    out = semi.compress(a, backend)
    assert out.shape == (rows_out, 64) and out.is_contiguous()
    assert torch.equal(out[:40], a) and torch.count_nonzero(out[40:]) == 0
    if backend == "cusparselt":  # a multiple of 128 rows is kept as it is
        assert semi.compress(torch.randn(256, 64, dtype=torch.bfloat16), backend).shape[0] == 256


# --------------------------------------------------------------------------------------------
# support rules
# --------------------------------------------------------------------------------------------
CUDA = torch.device("cuda")  # a device object only: nothing is queried
OK = dict(
    n=2,
    m=4,
    device=CUDA,
    dtype=torch.bfloat16,
    groups=1,
    out_channels=64,
    rows=802816,
    cols=576,
    backend="auto",
    capability=(9, 0),
    hip=False,
    api=True,
    cusparselt=True,
)
REASON_CASES = [
    ({}, ""),
    ({"dtype": torch.float16, "capability": (8, 0)}, ""),
    ({"backend": "cutlass", "out_channels": 128, "capability": (8, 0)}, ""),
    ({"backend": "cutlass", "out_channels": 128}, "CUTLASS 2:4 kernels run on sm_8x only"),
    ({"cusparselt": False, "out_channels": 128}, "sm_90: torch's CUTLASS"),
    ({"n": 2, "m": 8}, "n:m=2:8 is not 2:4"),
    ({"n": 1, "m": 4}, "n:m=1:4"),
    ({"api": False}, "no torch.sparse.SparseSemiStructuredTensor"),
    ({"device": torch.device("cpu")}, "device cpu"),
    ({"hip": True}, "ROCm"),
    ({"capability": (7, 5)}, "sm_75 < sm_80"),
    ({"dtype": torch.float32}, "dtype float32"),
    ({"dtype": torch.float64}, "dtype float64"),
    ({"groups": 2}, "groups=2"),
    ({"backend": "cusparselt", "cusparselt": False}, "no cuSPARSELt"),
    ({"out_channels": 40}, "K=40 is not a positive multiple of 16"),
    ({"out_channels": 8}, "K=8"),
    (
        {"backend": "cutlass", "out_channels": 96, "capability": (8, 6)},
        "K=96 is not a positive multiple of 64",
    ),
    ({"cusparselt": False, "out_channels": 32, "capability": (8, 9)}, "cutlass's minimum"),
    ({"rows": 2**22, "cols": 2**10}, "exceeds 2**31 - 1"),
    ({"rows": 2**22, "out_channels": 1024, "cols": 64}, "exceeds 2**31 - 1"),
    ({"out_channels": 0}, "K=0"),
]
REASON_IDS = [
    "supported",
    "fp16-sm80",
    "cutlass-128-sm80",
    "cutlass-on-hopper",
    "auto-to-cutlass-on-hopper",
    "2of8",
    "1of4",
    "no-api",
    "cpu",
    "rocm",
    "turing",
    "fp32",
    "fp64",
    "grouped",
    "no-cusparselt",
    "K40",
    "K8",
    "cutlass-K96",
    "auto-to-cutlass-K32",
    "too-large",
    "too-large-grad-operand",
    "K0",
]


@pytest.mark.parametrize(("change", "expected"), REASON_CASES, ids=REASON_IDS)
def test_unsupported_reason(change, expected):
    reason = unsupported_reason(**{**OK, **change})
    if expected:
        assert expected in reason
    else:
        assert reason == ""


@pytest.mark.parametrize(
    ("hip", "rocm"), [("6.2.41133", True), (None, False)], ids=["rocm", "cuda"]
)
def test_unsupported_reason_reads_a_rocm_build_from_torch(monkeypatch, hip, rocm):
    """Left to read the build itself (``hip=None``), a ROCm torch is refused, a CUDA one not."""
    monkeypatch.setattr(torch.version, "hip", hip)
    reason = unsupported_reason(**{**OK, "hip": None})
    assert ("ROCm" in reason) is rocm and (reason == "") is not rocm


@pytest.mark.parametrize(
    ("rows", "too_large"), [(2**27, True), (2**27 - 1, False)], ids=["2^31", "below"]
)
def test_unsupported_reason_limit_is_2_to_the_31_minus_1_elements(rows, too_large):
    """A (rows x 16) operand of 2**31 elements is refused, one row fewer is not."""
    reason = unsupported_reason(**{**OK, "rows": rows, "out_channels": 16, "cols": 8})
    assert ("exceeds 2**31 - 1" in reason) is too_large and (reason == "") is not too_large


def test_unsupported_reason_checks_pattern_before_device():
    # On this CPU machine every rule that needs no GPU answers without touching one.
    kw = {**OK, "device": torch.device("cpu"), "capability": None, "hip": None, "api": None}
    assert "n:m=2:8" in unsupported_reason(**{**kw, "m": 8})
    assert "device cpu" in unsupported_reason(**kw)


def test_shape_constraints_follow_torch_tables():
    assert shape_constraints("cusparselt", torch.bfloat16) == (16, 16, 8, 8)
    assert shape_constraints("cutlass", torch.float16) == (32, 64, 8, 8)
    assert shape_constraints("cutlass", torch.float64) == (32, 64, 8, 8)  # default row
    with pytest.raises(ValueError, match="valid: auto, cusparselt, cutlass"):
        shape_constraints("cublas", torch.float16)


@pytest.mark.parametrize(
    ("backend", "expected"),
    [("cusparselt", (16, 16, 8, 8)), ("cutlass", (32, 64, 8, 8))],
    ids=["cslt", "cutlass"],
)
def test_shape_constraints_default_per_backend_without_a_table(monkeypatch, backend, expected):
    """Without torch's table (no API, or a dtype it lacks) each backend has its own minimums:
    cuSPARSELt 16, 16, 8, 8; CUTLASS 32, 64, 8, 8."""
    assert shape_constraints(backend, torch.float64) == expected
    monkeypatch.setattr(semi, "has_semi_structured_api", lambda: False)
    assert shape_constraints(backend, torch.bfloat16) == expected


def test_shape_constraints_follow_a_torch_whose_table_changes(monkeypatch):
    """A torch whose class lists other minimums for a dtype is followed; a dtype it does not
    list keeps the backend's default (cuSPARSELt 16, 16, 8, 8)."""
    table = {torch.bfloat16: (32, 32, 16, 16)}
    monkeypatch.setattr(semi, "has_semi_structured_api", lambda: True)
    monkeypatch.setattr(
        semi, "_semi_class", lambda backend: SimpleNamespace(_DTYPE_SHAPE_CONSTRAINTS=table)
    )
    assert shape_constraints("cusparselt", torch.bfloat16) == (32, 32, 16, 16)
    assert shape_constraints("cusparselt", torch.float16) == (16, 16, 8, 8)


@pytest.mark.parametrize("shipped", [True, False], ids=["cslt", "no-cslt"])
def test_auto_backend_is_cusparselt_where_torch_ships_it(monkeypatch, shipped):
    monkeypatch.setattr(semi, "cusparselt_available", lambda: shipped)
    assert resolve_backend("auto") == ("cusparselt" if shipped else "cutlass")


def test_semi_matmul_hands_the_product_a_dense_operand_of_whole_column_multiples(monkeypatch):
    """13 columns reach the product as 16 (the dense operand's multiple of 8 for 16-bit
    types), zero in the 3 added, so that no torch version pads it its own way."""
    seen = []
    mm = torch.mm

    def recording_mm(x, y):
        seen.append(y.clone())
        return mm(x, y)

    monkeypatch.setattr(torch, "mm", recording_mm)
    a = torch.randn(40, 16, dtype=torch.bfloat16)
    b = torch.randn(16, 13, dtype=torch.bfloat16)
    sa = torch.cat([a, torch.zeros(88, 16, dtype=torch.bfloat16)])
    sa.BACKEND = "cusparselt"
    out = semi_matmul(sa, b, 40)
    (dense,) = seen
    assert dense.shape == (16, 16) and torch.equal(dense[:, :13], b)
    assert not dense[:, 13:].any() and out.shape == (40, 13)


def test_device_capability_asks_the_devices_own_gpu(monkeypatch):
    """A device with an index is asked for its own capability; one without, the current GPU's."""
    monkeypatch.setattr(semi, "_capability", lambda index: (index, 7))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 2)
    assert semi.device_capability(torch.device("cuda", 3)) == (3, 7)
    assert semi.device_capability(torch.device("cuda", 0)) == (0, 7)
    assert semi.device_capability(torch.device("cuda")) == (2, 7)


@pytest.mark.parametrize("available", [True, False], ids=["cslt", "no-cslt"])
def test_library_status_reports_the_cusparselt_version_where_it_ships(monkeypatch, available):
    """The cuSPARSELt version is read only where cuSPARSELt is available (None otherwise)."""
    monkeypatch.setattr(semi, "cusparselt_available", lambda: available)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    fake = SimpleNamespace(version=lambda: 602, is_available=lambda: available)
    monkeypatch.setattr(torch.backends, "cusparselt", fake, raising=False)
    status = semi.library_status()
    assert status["cusparselt_available"] is available
    assert status["cusparselt_version"] == (602 if available else None)
    assert status["gpu_name"] is None and status["gpu_capability"] is None


def test_resolve_backend():
    assert resolve_backend("cutlass") == "cutlass"
    assert resolve_backend("cusparselt") == "cusparselt"
    expected = "cusparselt" if semi.cusparselt_available() else "cutlass"
    assert resolve_backend("auto") == expected
    with pytest.raises(ValueError, match="unknown sparse backend"):
        resolve_backend("sputnik")


def test_the_api_needs_every_semi_structured_class(monkeypatch):
    """The semi-structured API counts as present only with the base class and both backends'."""
    for name in (
        "SparseSemiStructuredTensor",
        "SparseSemiStructuredTensorCUSPARSELT",
        "SparseSemiStructuredTensorCUTLASS",
    ):
        monkeypatch.setattr(torch.sparse, name, object, raising=False)
    assert semi.has_semi_structured_api()
    monkeypatch.delattr(torch.sparse, "SparseSemiStructuredTensorCUTLASS")
    assert not semi.has_semi_structured_api()


def _raises():
    raise RuntimeError("broken build")


@pytest.mark.parametrize(
    ("module", "expected"),
    [
        (None, False),
        (SimpleNamespace(is_available=lambda: True), True),
        (SimpleNamespace(is_available=lambda: False), False),
        (SimpleNamespace(is_available=_raises), False),
    ],
    ids=["no-module", "available", "unavailable", "broken"],
)
def test_cusparselt_is_available_only_where_torch_says_so(monkeypatch, module, expected):
    """No ``torch.backends.cusparselt`` or an ``is_available`` that raises reads as absent."""
    semi.cusparselt_available.cache_clear()
    try:
        with monkeypatch.context() as patch:
            patch.setattr(torch.backends, "cusparselt", module, raising=False)
            assert semi.cusparselt_available() is expected
    finally:
        semi.cusparselt_available.cache_clear()


# --------------------------------------------------------------------------------------------
# the module on this CPU machine: every call falls back, equal to the reference
# --------------------------------------------------------------------------------------------
def _grads(module: nn.Module, x: torch.Tensor, g: torch.Tensor):
    module.zero_grad(set_to_none=True)
    xi = x.clone().requires_grad_(True)
    out = module(xi)
    out.backward(g)
    bias = None if module.bias is None else module.bias.grad.clone()
    return out.detach(), xi.grad, module.weight.grad.clone(), bias


@pytest.mark.parametrize("method", METHODS, ids=METHODS)
@pytest.mark.parametrize(
    ("kernel", "stride", "padding_mode"),
    [(3, 1, "zeros"), (3, 2, "zeros"), (1, 2, "zeros"), (3, 1, "reflect")],
    ids=["3x3", "3x3-s2", "1x1-s2", "3x3-reflect"],
)
def test_cpu_falls_back_to_reference_bit_identical(method, kernel, stride, padding_mode, caplog):
    conv = nn.Conv2d(
        6, 16, kernel, stride=stride, padding=kernel // 2, bias=True, padding_mode=padding_mode
    )
    x = torch.randn(3, 6, 9, 7)
    with torch.no_grad():
        g = torch.randn_like(conv(x))
    gen_ref = torch.Generator().manual_seed(3)
    gen_semi = torch.Generator().manual_seed(3)
    ref = SDGPConv2d.from_conv(conv, 2, 4, method, generator=gen_ref)
    mod = SDGPSemiConv2d.from_conv(conv, 2, 4, method, generator=gen_semi, name="layer1.0.conv1")
    assert mod.weight is conv.weight and mod.bias is conv.bias
    with caplog.at_level(logging.WARNING, logger="impl.methods.sdgp_semi"):
        for _ in range(2):  # two backwards: the reason is logged once
            out_r, gx_r, gw_r, gb_r = _grads(ref, x, g)
            out_s, gx_s, gw_s, gb_s = _grads(mod, x, g)
            assert torch.equal(out_s, out_r)
            assert torch.equal(gx_s, gx_r)
            assert torch.equal(gw_s, gw_r)
            assert torch.equal(gb_s, gb_r)
    assert mod.semi_calls == 0 and mod.fallback_calls == 2
    assert mod.fallback_reasons == ["device cpu: semi-structured sparsity needs a CUDA GPU"]
    logged = [r for r in caplog.records if "layer1.0.conv1" in r.getMessage()]
    assert len(logged) == 1 and "device cpu" in logged[0].getMessage()
    assert mod.l1_ratio() == ref.l1_ratio()
    with torch.no_grad():
        assert torch.equal(mod(x), conv(x))  # no grad: the plain conv


def test_cpu_autocast_bf16_falls_back_equal_to_reference():
    conv = nn.Conv2d(8, 16, 3, padding=1, bias=False)
    x = torch.randn(2, 8, 6, 5)
    ref = SDGPConv2d.from_conv(conv, 2, 4, "rescaled")
    mod = SDGPSemiConv2d.from_conv(conv, 2, 4, "rescaled")
    results = []
    for module in (ref, mod):
        xi = x.clone().requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = module(xi)
        assert out.dtype == torch.bfloat16
        out.float().square().sum().backward()
        results.append((xi.grad.clone(), conv.weight.grad.clone()))
        conv.weight.grad = None
    assert results[0][0].dtype == torch.float32
    assert torch.equal(results[0][0], results[1][0])
    assert torch.equal(results[0][1], results[1][1])
    assert mod.fallback_reasons == ["device cpu: semi-structured sparsity needs a CUDA GPU"]


def test_non_24_pattern_falls_back_with_its_reason():
    conv = nn.Conv2d(8, 16, 3, padding=1)
    mod = SDGPSemiConv2d.from_conv(conv, 2, 8, "magnitude")
    ref = SDGPConv2d.from_conv(conv, 2, 8, "magnitude")
    x = torch.randn(2, 8, 5, 5)
    g = torch.randn(2, 16, 5, 5)
    assert torch.equal(_grads(mod, x, g)[1], _grads(ref, x, g)[1])
    assert mod.fallback_reasons == ["n:m=2:8 is not 2:4, the only pattern sparse tensor cores run"]


def test_library_error_falls_back_once_and_keeps_pruning_once(monkeypatch):
    # Pretend the rules pass on this CPU machine: the real library then raises (CPU tensor),
    # the layer records the error, takes the reference math with the rows it already pruned,
    # and skips the library for that shape afterwards.
    monkeypatch.setattr(semi, "unsupported_reason", lambda **kw: "")
    tried = []
    library = semi.sparse_data_grad

    def counted(*args, **kwargs):
        tried.append(1)
        return library(*args, **kwargs)

    monkeypatch.setattr(semi, "sparse_data_grad", counted)
    conv = nn.Conv2d(8, 16, 3, padding=1, bias=False).double()
    mod = SDGPSemiConv2d.from_conv(conv, 2, 4, "magnitude", name="blk")
    ref = SDGPConv2d.from_conv(conv, 2, 4, "magnitude")
    x = torch.randn(2, 8, 5, 7, dtype=torch.float64)
    g = torch.randn(2, 16, 5, 7, dtype=torch.float64)
    for _ in range(3):
        gx = _grads(mod, x, g)[1]
        torch.testing.assert_close(gx, _grads(ref, x, g)[1], rtol=1e-13, atol=1e-13)
    assert len(tried) == 1  # the failed shape is not tried again
    assert mod.semi_calls == 0 and mod.fallback_calls == 3
    assert len(mod.fallback_reasons) == 1
    assert mod.fallback_reasons[0].startswith("library error")
    assert mod.prune_calls == 3  # one pruning per backward, never two
    # each pruning counted under its path, the first one (rows for the library) too
    assert sum(mod.prune_paths.values()) == 3
    assert set(mod.prune_paths) <= {"reference", "cpu kernel"}


@pytest.mark.parametrize(
    "error",
    [torch.cuda.OutOfMemoryError("CUDA out of memory"), RuntimeError("CUDA error: out of memory")],
    ids=["OutOfMemoryError", "out-of-memory-message"],
)
def test_out_of_memory_is_raised_not_a_fallback(monkeypatch, error):
    # Running out of memory is not a library limitation: falling back would hide it and make
    # the shape skip the sparse path for good, so it is raised and nothing is recorded.
    monkeypatch.setattr(semi, "unsupported_reason", lambda **kw: "")

    def oom(*args, **kwargs):
        raise error

    monkeypatch.setattr(semi, "sparse_data_grad", oom)
    conv = nn.Conv2d(8, 16, 3, padding=1, bias=False)
    mod = SDGPSemiConv2d.from_conv(conv, 2, 4, "magnitude")
    x = torch.randn(2, 8, 5, 7)
    with pytest.raises(type(error), match="out of memory"):
        _grads(mod, x, torch.randn(2, 16, 5, 7))
    assert mod.fallback_reasons == [] and mod.fallback_calls == 0 and not mod._failed


def test_a_library_error_without_a_message_falls_back_too(monkeypatch):
    # RuntimeError() has no first line: the fallback reason must not fail on it
    monkeypatch.setattr(semi, "unsupported_reason", lambda **kw: "")

    def fails(*args, **kwargs):
        raise RuntimeError()

    monkeypatch.setattr(semi, "sparse_data_grad", fails)
    conv = nn.Conv2d(8, 16, 3, padding=1, bias=False).double()
    mod = SDGPSemiConv2d.from_conv(conv, 2, 4, "magnitude")
    ref = SDGPConv2d.from_conv(conv, 2, 4, "magnitude")
    x, g = torch.randn(2, 8, 5, 5, dtype=torch.float64), torch.randn(2, 16, 5, 5).double()
    torch.testing.assert_close(_grads(mod, x, g)[1], _grads(ref, x, g)[1])
    assert mod.fallback_reasons == ["library error RuntimeError: "]
    # a long message with advice after it: its first line, cut to 200 characters
    long = "cuSPARSELt: " + "y" * 300

    def fails_long(*args, **kwargs):
        raise RuntimeError(long + "\nsee the documentation")

    monkeypatch.setattr(semi, "sparse_data_grad", fails_long)
    mod = SDGPSemiConv2d.from_conv(conv, 2, 4, "magnitude")
    _grads(mod, x, g)
    assert mod.fallback_reasons == ["library error RuntimeError: " + long[:200]]


def test_the_sparse_paths_data_gradient_is_laid_out_as_its_input(monkeypatch):
    # a channels-last input gets a channels-last dL/dD, as the reference's conv backward gives
    monkeypatch.setattr(semi, "unsupported_reason", lambda **kw: "")

    def library(rows, weight, input_shape, stride, padding, dilation, backend="auto"):
        grad = rows_to_nchw(rows, (5, 7)).contiguous()
        return torch.nn.grad.conv2d_input(input_shape, weight, grad, stride, padding, dilation)

    monkeypatch.setattr(semi, "sparse_data_grad", library)
    conv = nn.Conv2d(8, 16, 3, padding=1, bias=False).double()
    mod = SDGPSemiConv2d.from_conv(conv, 2, 4, "magnitude")
    x = torch.randn(2, 8, 5, 7, dtype=torch.float64).to(memory_format=torch.channels_last)
    g = torch.randn(2, 16, 5, 7, dtype=torch.float64)
    w = conv.weight.detach()
    gx = mod.data_grad(g, x, w, ((1, 1), (1, 1), (1, 1), 1))
    assert gx.is_contiguous(memory_format=torch.channels_last) and not gx.is_contiguous()
    want = torch.nn.grad.conv2d_input(x.shape, w, nm_prune(g, 2, 4, "magnitude", 1), 1, 1)
    torch.testing.assert_close(gx, want, rtol=1e-12, atol=1e-12)
    assert mod.semi_calls == 1
    assert mod.prune_paths == {"reference": 1}  # the run's summary counts the sparse path's pruning


def test_running_out_of_host_memory_is_raised_not_a_fallback(monkeypatch):
    # MemoryError usually has no message: its type alone says what happened
    monkeypatch.setattr(semi, "unsupported_reason", lambda **kw: "")

    def oom(*args, **kwargs):
        raise MemoryError()

    monkeypatch.setattr(semi, "sparse_data_grad", oom)
    mod = SDGPSemiConv2d.from_conv(nn.Conv2d(8, 16, 3, padding=1, bias=False), 2, 4)
    with pytest.raises(MemoryError):
        _grads(mod, torch.randn(2, 8, 5, 7), torch.randn(2, 16, 5, 7))
    assert mod.fallback_calls == 0 and not mod._failed


def test_an_out_of_memory_message_in_any_case_is_raised(monkeypatch):
    monkeypatch.setattr(semi, "unsupported_reason", lambda **kw: "")

    def oom(*args, **kwargs):
        raise RuntimeError("Out of memory while allocating the workspace")

    monkeypatch.setattr(semi, "sparse_data_grad", oom)
    mod = SDGPSemiConv2d.from_conv(nn.Conv2d(8, 16, 3, padding=1, bias=False), 2, 4)
    with pytest.raises(RuntimeError, match="Out of memory"):
        _grads(mod, torch.randn(2, 8, 5, 7), torch.randn(2, 16, 5, 7))
    assert mod.fallback_calls == 0


def test_support_is_asked_with_the_gemms_sizes(monkeypatch):
    # rows = N*Ho*Wo, K output channels, cols = C*R*S (the column matrix, not C)
    seen = {}

    def spy(**kwargs):
        seen.update(kwargs)
        return "not here"

    monkeypatch.setattr(semi, "unsupported_reason", spy)
    conv = nn.Conv2d(8, 16, 3, padding=1, stride=2, bias=False)
    mod = SDGPSemiConv2d.from_conv(conv, 2, 4, "magnitude")
    mod(torch.randn(2, 8, 9, 7, requires_grad=True)).sum().backward()
    assert (seen["rows"], seen["out_channels"], seen["cols"]) == (2 * 5 * 4, 16, 72)


def test_a_failed_shape_is_remembered_by_its_input_shape(monkeypatch):
    # 9x9 and 10x10 inputs of a stride-2 conv both give 5x5 outputs: a failure of one must
    # not send the other to the reference path untried
    monkeypatch.setattr(semi, "unsupported_reason", lambda **kw: "")
    tried = []

    def fails(rows, weight, input_shape, *args, **kwargs):
        tried.append(input_shape[-1])
        raise RuntimeError("not this shape")

    monkeypatch.setattr(semi, "sparse_data_grad", fails)
    conv = nn.Conv2d(8, 16, 3, padding=1, stride=2, bias=False)
    mod = SDGPSemiConv2d.from_conv(conv, 2, 4, "magnitude")
    for size in (9, 10, 9, 10):
        mod(torch.randn(2, 8, size, size, requires_grad=True)).sum().backward()
    assert tried == [9, 10]


@pytest.mark.parametrize("method", ["rescaled", "random"])
def test_the_sparse_path_prunes_with_the_layers_eps_generator_and_prune_impl(monkeypatch, method):
    # The rows the library multiplies are the layer's own pruning of dL/dO: nm_prune with its
    # eps (which matters at this gradient scale) and, for "random", its generator's draw.
    monkeypatch.setattr(semi, "unsupported_reason", lambda **kw: "")
    impls, multiplied = [], []
    pruning = semi.prune_rows

    def spy_prune(*args, **kwargs):
        impls.append(kwargs.get("impl"))
        return pruning(*args, **kwargs)

    def library(rows, weight, input_shape, stride, padding, dilation, backend="auto"):
        multiplied.append(rows.clone())
        grad = rows_to_nchw(rows, (5, 7))
        return torch.nn.grad.conv2d_input(input_shape, weight, grad, stride, padding, dilation)

    monkeypatch.setattr(semi, "prune_rows", spy_prune)
    monkeypatch.setattr(semi, "sparse_data_grad", library)
    conv = nn.Conv2d(8, 16, 3, padding=1, bias=False).double()
    gen = torch.Generator().manual_seed(3)
    mod = SDGPSemiConv2d.from_conv(conv, 2, 4, method, "plane", gen, 0.5, prune_impl="ref")
    x = torch.randn(2, 8, 5, 7, dtype=torch.float64)
    g = torch.randn(2, 16, 5, 7, dtype=torch.float64) * 1e-2
    torch.manual_seed(0)  # the global generator draws otherwise than the layer's
    gx = _grads(mod, x, g)[1]
    want = nm_prune(g, 2, 4, method, 1, "plane", torch.Generator().manual_seed(3), eps=0.5)
    torch.testing.assert_close(multiplied[0], grad_rows(want), rtol=1e-12, atol=0)
    dense = torch.nn.grad.conv2d_input(x.shape, conv.weight.detach(), want, 1, 1, 1)
    torch.testing.assert_close(gx, dense, rtol=1e-12, atol=1e-12)
    assert impls == ["ref"] and mod.semi_calls == 1 and mod.fallback_calls == 0


def test_setting_the_backend_again_retries_a_failed_shape(monkeypatch):
    """A shape the library failed on is skipped until the backend is set again."""
    monkeypatch.setattr(semi, "unsupported_reason", lambda **kw: "")
    tried = []

    def fails(*args, **kwargs):
        tried.append(1)
        raise RuntimeError("not this shape")

    monkeypatch.setattr(semi, "sparse_data_grad", fails)
    mod = SDGPSemiConv2d.from_conv(nn.Conv2d(8, 16, 3, padding=1, bias=False), 2, 4, "magnitude")
    x = torch.randn(2, 8, 5, 5, requires_grad=True)
    for _ in range(2):
        mod(x).sum().backward()
    assert len(tried) == 1
    mod.set_backend("auto")
    mod(x).sum().backward()
    assert len(tried) == 2


def test_reset_stats_logs_a_reason_again_and_state_is_a_copy(caplog):
    """After ``reset_semi_stats`` a reason met again is logged again; the reasons that
    ``semi_state`` returns do not change with later calls or edits of the copy."""
    mod = SDGPSemiConv2d.from_conv(nn.Conv2d(8, 16, 3, padding=1), 2, 4, "magnitude", name="c")
    x = torch.randn(2, 8, 5, 5, requires_grad=True)
    with caplog.at_level(logging.WARNING, logger="impl.methods.sdgp_semi"):
        mod(x).sum().backward()
        state = mod.semi_state()
        state["fallback_reasons"].append("edited")
        assert mod.fallback_reasons == [state["fallback_reasons"][0]]
        mod.reset_semi_stats()
        assert mod.semi_state() == {"semi_calls": 0, "fallback_calls": 0, "fallback_reasons": []}
        mod(x).sum().backward()
    assert sum("layer c" in r.getMessage() for r in caplog.records) == 2


def test_sparse_rows_prune_with_the_configured_eps():
    g = torch.randn(2, 8, 3, 3, dtype=torch.float64) * 1e-2
    rows = prune_rows(grad_rows(g), 2, 4, "rescaled", "plane", eps=0.5, impl="ref")
    want = grad_rows(nm_prune(g, 2, 4, "rescaled", 1, "plane", eps=0.5, impl="ref"))
    torch.testing.assert_close(rows, want, rtol=1e-12, atol=0)
    default = prune_rows(grad_rows(g), 2, 4, "rescaled", "plane", impl="ref")
    assert not torch.allclose(rows, default)  # eps matters at this scale


def test_summary_names_the_sparse_backend_of_the_layers():
    model = nn.Sequential(nn.Conv2d(8, 16, 3))
    sdgp_semi_convert(model, 2, 4, "magnitude", sparse_backend="cutlass")
    assert semi_summary(model)["sdgp_semi_backend"] == ["cutlass"]
    assert "semi_structured=cutlass" in repr(model[0])


def test_assemble_1x1_with_unequal_strides_is_the_conv_input_gradient():
    col = torch.randn(2 * 5 * 3, 4, dtype=torch.float64)
    got = assemble_data_grad(col, (2, 4, 5, 6), (1, 1), (1, 2), (0, 0), (1, 1))
    grad_out = col.reshape(2, 5, 3, 4).permute(0, 3, 1, 2)
    eye = torch.eye(4, dtype=torch.float64).reshape(4, 4, 1, 1)
    want = torch.nn.grad.conv2d_input((2, 4, 5, 6), eye, grad_out, (1, 2))
    assert got.shape == (2, 4, 5, 6)
    torch.testing.assert_close(got, want)


def test_executed_flops_count_the_sparse_calls_at_half_the_data_gradient(monkeypatch):
    """The data gradient of a call on sparse tensor cores executes half of the dense conv's
    multiply-adds, a reference call all of them; before any backward the layer counts as the
    reference (it was counted dense whichever path ran)."""
    from impl.flops import training_flops

    conv = nn.Conv2d(8, 16, 3, padding=1, bias=False)
    model = nn.Sequential(nn.Conv2d(8, 8, 1, bias=False), SDGPSemiConv2d.from_conv(conv, 2, 4))
    layer = model[1]

    def executed() -> FlopCounts:
        (row,) = [r for r in training_flops(model, (8, 6, 6)).layers if r.name == "1"]
        return row.executed

    dense = executed()
    assert layer.executed_density().data_grad == 1.0 and dense.data_grad > 0
    assert dense == FlopCounts(dense.forward, dense.forward, dense.forward)  # 1 of each
    layer.semi_calls, layer.fallback_calls = 3, 1
    assert layer.executed_density() == LayerDensity(1.0, 0.625, 1.0)
    layer.fallback_calls = 0
    counted = executed()
    assert counted == FlopCounts(dense.forward, dense.data_grad / 2, dense.weight_grad)


def test_set_backend_rejects_unknown_names():
    conv = nn.Conv2d(8, 16, 3)
    with pytest.raises(ValueError, match="unknown sparse backend"):
        SDGPSemiConv2d.from_conv(conv, 2, 4, sparse_backend="cublas")
    with pytest.raises(ValueError, match="unknown prune impl"):
        SDGPSemiConv2d.from_conv(conv, 2, 4, prune_impl="numpy")


# --------------------------------------------------------------------------------------------
# conversion of a model and the summary
# --------------------------------------------------------------------------------------------
def test_convert_model_trains_and_reports_fallbacks():
    torch.manual_seed(0)
    model = impl.models.create("resnet20", num_classes=10, in_channels=1)
    reference = impl.models.create("resnet20", num_classes=10, in_channels=1)
    reference.load_state_dict(model.state_dict())
    params = list(model.parameters())
    sdgp_semi_convert(model, 2, 4, "rescaled")
    sdgp_convert(reference, 2, 4, "rescaled")
    assert list(model.parameters()) == params  # the same Parameter objects
    mods = semi_modules(model)
    assert isinstance(model.conv1, nn.Conv2d) and not isinstance(model.conv1, SDGPConv2d)  # stem
    assert set(mods) == {n for n, m in reference.named_modules() if isinstance(m, SDGPConv2d)}
    assert all(m.layer_name == name for name, m in mods.items())
    x = torch.randn(4, 1, 16, 16)
    y = torch.tensor([0, 1, 2, 3])
    for net in (model, reference):
        F.cross_entropy(net(x), y).backward()
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad)
    s = semi_summary(model)
    assert s["sdgp_semi_layers"] == len(mods)
    assert s["sdgp_semi_calls"] == 0
    assert s["sdgp_semi_fallback_calls"] == len(mods)
    assert {r["layer"] for r in s["sdgp_semi_fallback_reasons"]} == set(mods)
    assert all("device cpu" in r["reason"] for r in s["sdgp_semi_fallback_reasons"])
    assert s["sdgp_semi_library"]["torch"] == torch.__version__


def test_convert_replaces_reference_layers_and_reconfigures():
    model = nn.Sequential(nn.Conv2d(8, 16, 3), nn.ReLU(), nn.Conv2d(16, 16, 1))
    sdgp_convert(model, 2, 4, "magnitude")
    assert type(model[0]) is SDGPConv2d
    sdgp_semi_convert(model, 2, 4, "magnitude", sparse_backend="cutlass")
    assert isinstance(model[0], SDGPSemiConv2d) and model[0].sparse_backend == "cutlass"
    first = model[0]
    sdgp_semi_convert(model, 2, 8, "random", seed=5)
    assert model[0] is first  # reconfigured in place
    assert (first.n, first.m, first.prune_method) == (2, 8, "random")
    assert first.sparse_backend == "auto" and first.generator is not None
    with pytest.raises(ValueError, match="unknown sparse backend"):
        sdgp_semi_convert(model, sparse_backend="x")


def test_convert_gives_each_new_layer_its_eps_prune_impl_and_seeded_generator():
    model = nn.Sequential(nn.Conv2d(8, 16, 3), nn.ReLU(), nn.Conv2d(16, 16, 1))
    sdgp_semi_convert(model, 2, 4, "random", seed=5, eps=0.5, prune_impl="ref")
    for layer in (model[0], model[2]):
        assert isinstance(layer, SDGPSemiConv2d)
        assert (layer.eps, layer.prune_impl) == (0.5, "ref")
    assert model[0].generator is model[2].generator  # one generator, seeded with the seed
    want = torch.rand(8, generator=torch.Generator().manual_seed(5))
    assert torch.equal(torch.rand(8, generator=model[0].generator), want)


@pytest.mark.parametrize(
    "bad",
    [{"eps": -1.0}, {"sparse_backend": "x"}, {"prune_impl": "x"}],
    ids=["eps", "sparse-backend", "prune-impl"],
)
def test_convert_refuses_a_bad_setting_even_where_no_layer_is_converted(bad):
    model = nn.Sequential(nn.Conv2d(3, 16, 3))  # 3 input channels: the plan leaves it dense
    with pytest.raises(ValueError, match="eps|sparse backend|prune impl"):
        sdgp_semi_convert(model, 2, 4, **bad)
    assert type(model[0]) is nn.Conv2d


def test_convert_refuses_a_model_that_is_itself_a_conv():
    with pytest.raises(ValueError, match="wrap it in a module"):
        sdgp_semi_convert(nn.Conv2d(8, 16, 3), 2, 4)


def test_semi_modules_are_the_semi_structured_layers_only():
    # a reference SDGPConv2d next to a semi-structured one: only the latter is the backend's
    model = nn.Sequential(
        SDGPConv2d.from_conv(nn.Conv2d(8, 16, 3), 2, 4, "magnitude"),
        SDGPSemiConv2d.from_conv(nn.Conv2d(16, 16, 1), 2, 4, "magnitude", name="1"),
    )
    assert list(semi_modules(model)) == ["1"]
    assert semi_summary(model)["sdgp_semi_layers"] == 1


def test_summary_lists_every_distinct_reason_of_every_layer():
    model = nn.Sequential(nn.Conv2d(8, 16, 3), nn.Conv2d(16, 16, 1))
    sdgp_semi_convert(model, 2, 4, "magnitude")
    first, second = semi_modules(model).values()
    first.load_semi_state({"fallback_calls": 3, "fallback_reasons": ["device cpu", "groups=2"]})
    second.load_semi_state({"fallback_calls": 1, "fallback_reasons": ["device cpu"]})
    s = semi_summary(model)
    assert s["sdgp_semi_fallback_calls"] == 4
    assert s["sdgp_semi_fallback_reasons"] == [
        {"layer": "0", "reason": "device cpu"},
        {"layer": "0", "reason": "groups=2"},
        {"layer": "1", "reason": "device cpu"},
    ]


def test_eval_mode_is_the_plain_conv():
    conv = nn.Conv2d(8, 8, 3, padding=1)
    model = sdgp_semi_convert(nn.Sequential(conv), 2, 4, "magnitude").eval()
    x = torch.randn(2, 8, 6, 6, requires_grad=True)
    model(x).square().sum().backward()
    assert model[0].prune_calls == 0 and model[0].fallback_calls == 0
    model.train()
    model(x).square().sum().backward()
    assert model[0].prune_calls + model[0].fallback_calls >= 1


@pytest.mark.parametrize("before", ["reference", "semi"])
def test_convert_again_leaves_a_layer_dense_where_the_plan_now_does(before):
    # 10 output channels: padded to 12 under "pad", left dense under "dense"
    model = nn.Sequential(nn.Conv2d(8, 10, 3, padding=1), nn.Conv2d(10, 8, 3, padding=1))
    weight = model[0].weight
    if before == "reference":
        sdgp_convert(model, 2, 4, "magnitude", nondivisible="pad")
    else:
        sdgp_semi_convert(model, 2, 4, "magnitude", nondivisible="pad")
    assert isinstance(model[0], SDGPConv2d)
    sdgp_semi_convert(model, 2, 4, "magnitude", nondivisible="dense")
    assert type(model[0]) is nn.Conv2d and model[0].weight is weight  # shared, not copied
    assert isinstance(model[1], SDGPSemiConv2d)
    assert [p.sparse for p in sdgp_plan(model, 2, 4, "dense")] == [False, True]


# --------------------------------------------------------------------------------------------
# GPU: the sparse product against float64 (skipped cleanly without a GPU)
# --------------------------------------------------------------------------------------------
#: Tolerance table (docs/sdgp_semi.md):
#: max |error vs float64| of the sparse path must be within k times
#: that of the same-precision dense computation. ``gemm``: the same algebra with a dense
#: ``torch.mm`` (only the product differs); ``cudnn``: the reference ``conv2d_input``, which
#: rounds once where the column path rounds each column before the fold.
TOL_K = {
    torch.bfloat16: {"gemm": 2.0, "cudnn": 8.0},
    torch.float16: {"gemm": 2.0, "cudnn": 8.0},
}
#: (N, C, K, kernel, stride, (H, W)): ResNet shapes, odd batches (rows not a multiple of 16
#: or 32: the compress pads them), 1x1 strided, K = 64 (CUTLASS's minimum).
GPU_CASES = [
    (3, 64, 64, 3, 1, (14, 14)),
    (5, 64, 128, 3, 2, (15, 13)),
    (3, 128, 64, 1, 1, (7, 7)),
    (4, 64, 256, 1, 2, (14, 14)),
    (2, 32, 64, 3, 1, (7, 9)),
]
GPU_IDS = ["3x3-64", "3x3-s2-odd", "1x1-147rows", "1x1-s2-256", "3x3-C32"]


def _max_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    return float((a.double() - ref).abs().max())


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cusparselt", "cutlass"], ids=["cusparselt", "cutlass"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize(("n", "c", "k", "kernel", "stride", "hw"), GPU_CASES, ids=GPU_IDS)
@pytest.mark.parametrize("layout", ["nchw", "channels_last"], ids=["nchw", "cl"])
@pytest.mark.parametrize("method", ["magnitude", "rescaled"], ids=["magnitude", "rescaled"])
def test_gpu_sparse_data_grad_vs_float64(
    n, c, k, kernel, stride, hw, dtype, backend, layout, method
):
    if backend == "cusparselt" and not semi.cusparselt_available():
        pytest.skip("this torch build has no cuSPARSELt")
    if backend == "cutlass" and torch.cuda.get_device_capability()[0] != 8:
        pytest.skip("torch's CUTLASS 2:4 kernels run on sm_8x only (the fallback is tested below)")
    dev = torch.device("cuda")
    fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
    conv = nn.Conv2d(c, k, kernel, stride=stride, padding=kernel // 2, bias=False)
    conv = conv.to(dev, dtype).to(memory_format=fmt)
    x = torch.randn(n, c, *hw, device=dev, dtype=dtype).contiguous(memory_format=fmt)
    with torch.no_grad():
        g = torch.randn_like(conv(x))
    # The pruning's reference on both sides, so that the float64 product below multiplies
    # the very values the sparse GEMM did (the kernel's rescaled values may differ in the last
    # bits, docs/kernels.md): what is measured is the sparse product's error alone.
    mod = SDGPSemiConv2d.from_conv(conv, 2, 4, method, sparse_backend=backend, prune_impl="ref")
    gx = _grads(mod, x, g)[1]
    assert mod.fallback_reasons == [] and mod.semi_calls == 1  # the sparse path really ran
    assert gx.dtype == dtype and gx.shape == x.shape
    assert torch.isfinite(gx).all()
    pruned = prune_rows(grad_rows(g), 2, 4, method, impl="ref")
    w64 = conv.weight.detach().double()
    ref64 = torch.nn.grad.conv2d_input(
        x.shape, w64, rows_to_nchw(pruned, g.shape[2:]).double(), conv.stride, conv.padding
    )
    ref_cudnn = torch.nn.grad.conv2d_input(
        x.shape, conv.weight.detach(), rows_to_nchw(pruned, g.shape[2:]), conv.stride, conv.padding
    )
    ref_gemm = data_grad_from_rows(
        pruned.reshape(-1, k),
        conv.weight.detach(),
        tuple(x.shape),
        conv.stride,
        conv.padding,
        conv.dilation,
    )
    err = _max_err(gx, ref64)
    floor = torch.finfo(dtype).eps * float(ref64.abs().max()) * 0.5
    assert err <= TOL_K[dtype]["gemm"] * _max_err(ref_gemm, ref64) + floor
    assert err <= TOL_K[dtype]["cudnn"] * _max_err(ref_cudnn, ref64) + floor


@pytest.mark.gpu
def test_gpu_fallback_path_prunes_with_the_chosen_prune_impl(monkeypatch):
    # A call that falls back (float32 here) prunes through SDGPConv2d.prune_grad: it must use
    # the pruning implementation the layer was given, not nm_prune's own choice.
    import impl.ops.nm_cuda as nm_cuda

    conv = nn.Conv2d(8, 16, 3, padding=1, bias=False).cuda()
    mod = SDGPSemiConv2d.from_conv(conv, 2, 4, "magnitude", prune_impl="ref")
    monkeypatch.setattr(nm_cuda, "nm_prune_cuda", lambda *a, **k: pytest.fail("the kernel ran"))
    x = torch.randn(2, 8, 6, 6, device="cuda", requires_grad=True)
    mod(x).sum().backward()
    assert mod.fallback_calls == 1 and mod.semi_calls == 0
    assert any("dtype float32" in r for r in mod.fallback_reasons), mod.fallback_reasons
    assert mod.prune_calls == 1


@pytest.mark.gpu
def test_gpu_rescaled_model_step_uses_sparse_cores_under_autocast():
    if not semi.cusparselt_available() and torch.cuda.get_device_capability()[0] != 8:
        pytest.skip("no 2:4 backend runs on this GPU (no cuSPARSELt, CUTLASS needs sm_8x)")
    dev = torch.device("cuda")
    torch.manual_seed(0)
    model = (
        impl.models.create("resnet20", num_classes=10).to(dev).to(memory_format=torch.channels_last)
    )
    reference = (
        impl.models.create("resnet20", num_classes=10).to(dev).to(memory_format=torch.channels_last)
    )
    reference.load_state_dict(model.state_dict())
    sdgp_semi_convert(model, 2, 4, "rescaled")
    sdgp_convert(reference, 2, 4, "rescaled")
    x = torch.randn(8, 3, 32, 32, device=dev).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (8,), device=dev)
    for net in (model, reference):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            F.cross_entropy(net(x), y).backward()
    s = semi_summary(model)
    assert s["sdgp_semi_calls"] > 0
    # resnet20 has 16, 32 and 64 channels: with cuSPARSELt (K % 16) every layer runs sparse
    if semi.cusparselt_available():
        assert s["sdgp_semi_fallback_calls"] == 0, s["sdgp_semi_fallback_reasons"]
    for name, p in model.named_parameters():
        assert torch.isfinite(p.grad).all(), name
    # Compared only where one sparse data gradient at most separates the two: further back,
    # a one-ulp bf16 difference between cuSPARSELt and cuDNN flips near-tied 2:4 choices of
    # the next layer and batch norm amplifies it (relative differences of 0.15-1.3 in layer1
    # and layer2 with a dense bf16 product standing in for the sparse one, on a CPU; the bf16
    # reference differs from the fp32 one as much). Each layer's sparse data gradient is
    # checked on its own against float64 in test_gpu_sparse_data_grad_vs_float64.
    near = ("fc.", "layer3.2.")
    checked = 0
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        if name.startswith(near):
            rel = float((p.grad - q.grad).norm() / q.grad.norm().clamp_min(1e-30))
            assert rel < 0.05, (name, rel)
            checked += 1
    assert checked >= 4


@pytest.mark.gpu
def test_gpu_float32_falls_back_with_dtype_reason(monkeypatch):
    # torch.equal of two cuDNN data gradients: only with cuDNN's deterministic algorithms
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
    dev = torch.device("cuda")
    conv = nn.Conv2d(64, 64, 3, padding=1, bias=False).to(dev)
    mod = SDGPSemiConv2d.from_conv(conv, 2, 4, "magnitude")
    ref = SDGPConv2d.from_conv(conv, 2, 4, "magnitude")
    x = torch.randn(2, 64, 8, 8, device=dev)
    g = torch.randn(2, 64, 8, 8, device=dev)
    assert torch.equal(_grads(mod, x, g)[1], _grads(ref, x, g)[1])
    assert mod.fallback_reasons == ["dtype float32 (sparse path runs float16, bfloat16)"]
    status = semi.library_status()
    assert status["gpu_capability"] is not None


# --------------------------------------------------------------------------------------------
# the benchmark script (bench/sdgp_semi.py): its pipeline on the CPU, its formulas
# --------------------------------------------------------------------------------------------
def test_bench_iterations_per_epoch():
    from bench import sdgp_semi as bs

    assert bs.iterations_per_epoch(256) == 5005  # ceil(1,281,167 / 256)
    assert bs.iterations_per_epoch(1) == 1_281_167


@pytest.mark.parametrize(
    ("model", "convs", "first"),
    [("resnet18", 19, (256, 64, 56, 56)), ("resnet50", 52, (256, 64, 56, 56))],
    ids=["resnet18", "resnet50"],
)
def test_bench_model_layers_cover_every_pruned_conv(model, convs, first):
    from bench import sdgp_semi as bs

    layers = bs.model_layers(model, 256, 224)
    assert sum(layer.count for layer in layers) == convs  # every conv but the stem
    assert layers[0].input_shape == first
    assert len({(la.input_shape, la.out_channels, la.kernel, la.stride) for la in layers}) == len(
        layers
    )
    assert all("conv1" != la.names[0] for la in layers)


def test_bench_derived_columns_and_slower_sentence():
    from bench import sdgp_semi as bs

    row = {"status": "ok", "dense_dgrad_ms": 4.0, "sparse_dgrad_ms": 5.0, "flops": 8e9}
    row.update(dense_mm_ms=2.0, spmm_ms=1.0)
    bs._derive(row)
    assert row["est_sparse_ms"] == 2.0 and row["est_saved_ms"] == 2.0
    assert row["measured_saved_ms"] == -1.0 and row["speedup"] == 0.8
    assert row["sparse_faster"] is False and row["gemm_speedup"] == 2.0
    assert row["dense_tflops"] == pytest.approx(2.0)
    assert row["sparse_tflops_equiv"] == pytest.approx(1.6)  # dense FLOPs in the sparse time
    fallback = {"status": "fallback", "dense_dgrad_ms": 4.0, "sparse_dgrad_ms": None, "flops": 1}
    bs._derive(fallback)
    assert fallback["speedup"] is None and fallback["measured_saved_ms"] is None


def _summary_meta():
    return {
        "provenance": {"commit": "abc", "dirty": False, "date": "d", "gpu_name": "H100"},
        "library": {"torch": "2.11", "cusparselt_available": False},
        "device": "cuda:0",
        "config": {"batch": 256, "resolution": 224, "memory_format": "nchw",
                   "prune_method": "rescaled"},
        "wall_seconds": 1,
    }  # fmt: skip


def test_bench_summary_says_which_layers_and_totals_are_slower():
    # The issue asks the summary to say where sparse is slower than dense: the sentence names
    # the slower layers, and a negative saving reads "slower by", never "saves -3".
    from bench import sdgp_semi as bs

    def layer(name, dense, sparse):
        row = {"kind": "layer", "model": "resnet18", "dtype": "bf16", "layer": name, "count": 1}
        row.update(C=64, K=64, kernel="3x3", stride=1, H=56, W=56, status="ok", flops=1e9)
        row.update(dense_dgrad_ms=dense, sparse_dgrad_ms=sparse, dense_mm_ms=1.0, spmm_ms=0.6)
        bs._derive(row)
        return row

    it = {"kind": "iteration", "model": "resnet18", "dtype": "bf16", "convs": 2}
    it.update(convs_sparse=2, convs_fallback=0, iterations_per_epoch=5005)
    it.update(dense_dgrad_ms=6.0, est_sparse_ms=3.0, est_saved_ms=3.0)
    it.update(semi_backend_dgrad_ms=9.0, measured_saved_ms=-3.0, reference_ms=7.0)
    rows = [layer("layer1.0.conv1", 4.0, 2.5), layer("layer1.0.conv2", 2.0, 6.5), it]
    meta = _summary_meta()
    text = bs.summary(rows, meta)
    assert "Sparse slower than dense on 1 of 2 distinct layers: layer1.0.conv2." in text
    assert bs.phase_verdict([r for r in rows if r["kind"] == "layer"]) is None  # no phases
    # layer 0 (dense 4.0, dense GEMM 1.0): prune longer, compression equal (not longer);
    # layer 1 (dense 2.0): GEMM 1.5 > 1.0, pruning 1.5 under the data gradient (but over the
    # dense GEMM), compression 3.0 longer
    rows[0].update(prune_ms=5.0, compress_ms=4.0)
    rows[1].update(prune_ms=1.5, compress_ms=3.0, spmm_ms=1.5)
    assert (
        "Phase by phase: the sparse GEMM alone is slower than a dense GEMM of its shape on 1 of "
        "2 layers; pruning alone takes longer than the whole dense data gradient on 1 of 2, "
        "compression alone on 1 of 2." in bs.summary(rows, meta)
    )
    rows[1]["compress_ms"] = None  # a layer without every phase time is not counted
    assert (
        "on 0 of 1 layers; pruning alone takes longer than the whole dense data gradient on 1 "
        "of 1, compression alone on 0 of 1." in bs.summary(rows, meta)
    )
    assert "semi-structured backend 9 ms (slower by 3; 0 convs" in text
    assert "paper's estimate 3 ms (saves 3)" in text and "saves -" not in text


@pytest.mark.slow
def test_bench_smoke_pipeline_on_cpu(tmp_path, capsys):
    from bench import sdgp_semi as bs

    cfg = bs.BenchConfig(models=("resnet18",), dtypes=("bf16",), batch=1, resolution=32)
    cfg = bs.BenchConfig(**{**cfg.__dict__, "iteration": False, "small": True})
    rows, meta = bs.run(cfg, torch.device("cpu"))
    layers = [r for r in rows if r["kind"] == "layer"]
    printed = [line for line in capsys.readouterr().out.splitlines() if " fallback " in line]
    assert len(printed) == len(layers) and "device cpu" in printed[0]  # a line per layer
    assert all(line.endswith("(same reason)") for line in printed[1:])  # the reason said once
    (it,) = [r for r in rows if r["kind"] == "iteration"]
    assert sum(r["count"] for r in layers) == 19
    for r in layers:  # a fallback is never a sparse timing
        assert r["status"] == "fallback" and "device cpu" in r["reason"]
        assert r.get("sparse_dgrad_ms") is None and r.get("spmm_ms") is None
        assert r["dense_dgrad_ms"] > 0 and r["fallback_ms"] == r["reference_ms"] > 0
        assert r["est_sparse_ms"] == pytest.approx(r["dense_dgrad_ms"] / 2)
        assert r["commit"] == meta["provenance"]["commit"] and r["scale"] == "smoke"
    assert it["status"] == "fallback" and it["convs_sparse"] == 0
    assert it.get("measured_saved_ms") is None
    total = sum(r["count"] * r["dense_dgrad_ms"] for r in layers)
    assert it["dense_dgrad_ms"] == pytest.approx(total)
    assert it["dense_dgrad_epoch_s"] == pytest.approx(total * bs.iterations_per_epoch(1) / 1e3)
    bs.write(rows, meta, tmp_path)
    text = (tmp_path / "summary.md").read_text()
    assert "CPU only" in text and "every conv took the reference path" in text
    assert (tmp_path / "rows.csv").read_text().count("\n") == len(rows) + 1
    assert len(__import__("json").loads((tmp_path / "rows.json").read_text())["rows"]) == len(rows)


def test_bench_sparse_row_is_checked_against_cudnn_before_it_is_timed(monkeypatch):
    # The library stood in by its dense algebra (so the sparse phases run on a CPU): a right
    # product is timed, a wrong one (rows out of order) is an error row with no sparse time.
    from bench import sdgp_semi as bs

    cfg = bs.BenchConfig(models=("resnet18",), dtypes=("bf16",), batch=2, resolution=32, small=True)
    layer = bs.LayerShape(("conv",), (2, 16, 6, 6), 16, (3, 3), (1, 1), (1, 1), (1, 1), 1)
    monkeypatch.setattr(semi, "unsupported_reason", lambda **kwargs: "")
    monkeypatch.setattr(semi, "compress", lambda a, backend="auto": a.contiguous())
    monkeypatch.setattr(semi, "semi_matmul", lambda sa, b, rows: torch.mm(sa, b)[:rows])
    row = bs.measure_layer(layer, "bf16", torch.device("cpu"), cfg)
    assert row["status"] == "ok", row.get("reason")
    assert row["check_rel_max_err"] < bs.CHECK_REL_TOL and row["sparse_dgrad_ms"] > 0
    monkeypatch.setattr(semi, "semi_matmul", lambda sa, b, rows: torch.mm(sa.flip(0), b)[:rows])
    row = bs.measure_layer(layer, "bf16", torch.device("cpu"), cfg)
    assert row["status"] == "error" and "differs from cuDNN" in row["reason"]
    assert row["check_rel_max_err"] > bs.CHECK_REL_TOL
    assert row.get("sparse_dgrad_ms") is None and row.get("spmm_ms") is None
    assert row["speedup"] is None


def test_bench_training_iteration_semi_variant_on_cpu():
    from bench import sdgp_semi as bs

    cfg = bs.BenchConfig(models=("resnet18",), dtypes=("bf16",), batch=2, resolution=32, small=True)
    out = bs.training_iteration_times("resnet18", "sdgp_semi", "bf16", torch.device("cpu"), cfg)
    assert out["sdgp_semi_iter_ms"] > 0
    assert out["semi_calls"] == 0 and out["semi_fallback_calls"] > 0
    assert "device cpu" in out["semi_fallback_reasons"]
    with pytest.raises(ValueError, match="unknown variant"):
        bs.training_iteration_times("resnet18", "sparse", "bf16", torch.device("cpu"), cfg)


def _layer(status, count, dense, sparse=None, reference=None, reason=""):
    return {"status": status, "count": count, "reason": reason, "dense_dgrad_ms": dense,
            "est_sparse_ms": dense / 2, "est_saved_ms": dense / 2, "reference_ms": reference,
            "sparse_dgrad_ms": sparse}  # fmt: skip


def test_bench_iteration_row_counts_no_saving_where_a_fallback_layer_has_no_timing():
    """The backend's time is the sparse layers' plus the fallback layers' reference time; a
    fallback layer whose reference timing failed leaves it unknown, not counted as 0 ms."""
    from bench import sdgp_semi as bs

    cfg = bs.BenchConfig(models=("resnet18",), dtypes=("bf16",), batch=2, resolution=32, small=True)
    cfg = bs.BenchConfig(**{**cfg.__dict__, "iteration": False})
    sparse = _layer("ok", 2, dense=1.0, sparse=0.4, reference=1.2)
    timed = _layer("fallback", 1, dense=0.5, reference=0.9, reason="stride")
    row = bs.iteration_row("resnet18", "bf16", [sparse, timed], torch.device("cpu"), cfg)
    assert row["semi_backend_dgrad_ms"] == pytest.approx(2 * 0.4 + 0.9)
    assert row["measured_saved_ms"] == pytest.approx(2 * 1.0 + 0.5 - (2 * 0.4 + 0.9))
    untimed = _layer("fallback", 1, dense=0.5, reference=None, reason="stride")
    row = bs.iteration_row("resnet18", "bf16", [sparse, untimed], torch.device("cpu"), cfg)
    assert row["semi_backend_dgrad_ms"] is None and "measured_saved_ms" not in row
    row = bs.iteration_row("resnet18", "bf16", [timed], torch.device("cpu"), cfg)
    assert row["semi_backend_dgrad_ms"] == pytest.approx(0.9)  # every layer falls back


def test_bench_iteration_row_keeps_every_variants_errors(monkeypatch):
    from bench import sdgp_semi as bs

    def fails(model_name, variant, dtype_name, device, cfg):
        if variant == "sdgp_reference":
            return {f"{variant}_iter_ms": 3.0}
        return {f"{variant}_iter_ms": None, "errors": [f"{variant}_iter: error: boom"]}

    monkeypatch.setattr(bs, "training_iteration_times", fails)
    cfg = bs.BenchConfig(models=("resnet18",), dtypes=("bf16",), batch=2, resolution=32, small=True)
    layer = _layer("ok", 1, dense=1.0, sparse=0.4)
    row = bs.iteration_row("resnet18", "bf16", [layer], torch.device("cpu"), cfg)
    assert row["errors"] == "dense_iter: error: boom | sdgp_semi_iter: error: boom"
    assert row["sdgp_reference_iter_ms"] == 3.0


def test_bench_main_needs_gpu_for_full_sizes(monkeypatch, tmp_path):
    from bench import sdgp_semi as bs

    monkeypatch.delenv(bs.ENV_SMALL, raising=False)
    assert bs.main(["--out", str(tmp_path / "x"), "--device", "cpu"]) == 2
    assert not (tmp_path / "x").exists()


def test_method_backend_semi_structured_falls_back_on_cpu_with_reasons(tmp_path):
    from impl.config import resolve
    from impl.methods.sdgp_semi import SDGPSemiConv2d
    from impl.train import load_trained_model, train

    cfg = resolve(
        "smoke",
        method="sdgp",
        method_options={"backend": "semi_structured", "profile": False},
        out=str(tmp_path / "run"),
        threads=1,
        epochs=1,
    )
    summary = train(cfg, progress=False)
    assert summary["sdgp_backend"] == "semi_structured"
    assert summary["sdgp_semi_layers"] > 0
    assert summary["sdgp_semi_calls"] == 0  # no sparse tensor cores on a CPU
    assert summary["sdgp_semi_fallback_calls"] > 0
    assert summary["sdgp_semi_fallback_reasons"]
    model, _ = load_trained_model(tmp_path / "run")
    assert any(isinstance(m, SDGPSemiConv2d) for m in model.modules())


def test_unknown_backend_is_rejected():
    from impl.methods import create_method
    from impl.methods.sdgp import sdgp_convert

    with pytest.raises(ValueError, match="valid: reference, semi_structured"):
        sdgp_convert(torch.nn.Sequential(torch.nn.Conv2d(8, 8, 3)), backend="sparse24")
    with pytest.raises(ValueError, match="backend"):
        create_method("sdgp", {"backend": "sparse24"}).validate(None)


@pytest.mark.gpu
def test_gpu_cutlass_off_sm8x_falls_back_with_its_reason():
    if torch.cuda.get_device_capability()[0] == 8:
        pytest.skip("an sm_8x GPU runs CUTLASS 2:4: the sparse path is tested above")
    dev = torch.device("cuda")
    conv = nn.Conv2d(64, 64, 3, padding=1, bias=False).to(dev, torch.bfloat16)
    x = torch.randn(2, 64, 8, 8, device=dev, dtype=torch.bfloat16)
    with torch.no_grad():
        g = torch.randn_like(conv(x))
    mod = SDGPSemiConv2d.from_conv(conv, 2, 4, "magnitude", sparse_backend="cutlass")
    gx = _grads(mod, x, g)[1]
    assert mod.semi_calls == 0 and mod.fallback_calls == 1
    assert any("sm_8x only" in r for r in mod.fallback_reasons)
    assert torch.isfinite(gx).all()


@pytest.mark.parametrize(
    ("method", "rescale"),
    [("magnitude", "plane"), ("rescaled", "plane"), ("rescaled", "channel")],
    ids=["magnitude", "rescaled-plane", "rescaled-channel"],
)
def test_rows_pruned_along_channels_of_the_transposed_view_are_the_same(method, rescale):
    # prune_rows hands the N:M kernel the (N, K, L) view grouped along dim 1 rather than the
    # (N, L, K) rows along dim 2: the same groups of 4 channels and the same per-(sample,
    # channel) or per-channel sums, checked here with the reference on odd sizes.
    from impl.methods.sdgp import nm_prune_ref

    rows = torch.randn(3, 37, 12, dtype=torch.float64)
    direct = nm_prune_ref(rows, 2, 4, method, 2, rescale)
    via_t = nm_prune_ref(rows.transpose(1, 2), 2, 4, method, 1, rescale).transpose(1, 2)
    assert torch.equal(direct != 0, via_t != 0)
    assert torch.allclose(direct, via_t, rtol=1e-12, atol=0)


def test_bench_layer_timings_rotate_their_inputs(monkeypatch):
    # Each timed call reads another copy of its operands: the dense data gradient, the
    # reference and the sparse GEMM see as many distinct inputs as the row's rotation_sets.
    from bench import sdgp_semi as bs
    from impl.methods import sdgp

    cfg = bs.BenchConfig(models=("resnet18",), dtypes=("bf16",), batch=2, resolution=32, small=True)
    layer = bs.LayerShape(("conv",), (2, 16, 6, 6), 16, (3, 3), (1, 1), (1, 1), (1, 1), 1)
    seen: dict[str, set[int]] = {"conv_grad": set(), "semi_matmul": set()}
    conv_grad = sdgp.conv_grad

    def spy_conv_grad(which, grad, x, weight, args):
        seen["conv_grad"].add(grad.data_ptr())
        return conv_grad(which, grad, x, weight, args)

    def spy_matmul(sa, b, rows):
        seen["semi_matmul"].add(sa.data_ptr())
        return torch.mm(sa, b)[:rows]

    def timed(fn, device, cfg, *, iteration=False):  # two rounds over every set
        seen["conv_grad"].clear(), seen["semi_matmul"].clear()
        for i in range(2 * bs.measure.MAX_SETS):
            fn(i)
        calls[len(calls)] = (len(seen["conv_grad"]), len(seen["semi_matmul"]))
        return bs.measure.summarize([1.0], "perf_counter")

    calls: dict[int, tuple[int, int]] = {}  # timing's order -> distinct inputs it saw
    monkeypatch.setattr(bs, "_timed", timed)
    monkeypatch.setattr(sdgp, "conv_grad", spy_conv_grad)
    monkeypatch.setattr(semi, "unsupported_reason", lambda **kwargs: "")
    monkeypatch.setattr(semi, "compress", lambda a, backend="auto": a.contiguous())
    monkeypatch.setattr(semi, "semi_matmul", spy_matmul)
    row = bs.measure_layer(layer, "bf16", torch.device("cpu"), cfg)
    assert row["status"] == "ok", row.get("reason")
    sets = row["rotation_sets"]
    assert sets == bs.measure.MAX_SETS > 1  # a small layer: as many copies as allowed
    assert calls[0] == (sets, 0)  # the dense data gradient: one output gradient per set
    assert calls[7] == (0, sets)  # the sparse GEMM alone: one compressed operand per set
    assert [t.shape for t in bs.rotated(lambda j: torch.zeros(3), count=2)] == [(3,), (3,)]
    big = bs.rotated(lambda j: torch.zeros(bs.measure.ROTATE_BYTES_CPU // 4))
    assert len(big) == 1  # one copy already spans the rotation bytes


def test_bench_rotation_copies_that_fail_leave_one_copy_and_a_note(monkeypatch):
    # Building the other copies of a phase's operands may fail (out of memory on a big
    # layer): the row keeps its timings on the first copy and says why, it is not lost.
    from bench import sdgp_semi as bs

    cfg = bs.BenchConfig(models=("resnet18",), dtypes=("bf16",), batch=2, resolution=32, small=True)
    layer = bs.LayerShape(("conv",), (2, 16, 6, 6), 16, (3, 3), (1, 1), (1, 1), (1, 1), 1)
    rotated = bs.rotated
    calls = {"rotated": 0}

    def failing_second(make, count=None):  # the gradients' copies, then the columns' fail
        calls["rotated"] += 1
        if calls["rotated"] == 2:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return rotated(make, count)

    monkeypatch.setattr(bs, "rotated", failing_second)
    monkeypatch.setattr(semi, "unsupported_reason", lambda **kwargs: "")
    monkeypatch.setattr(semi, "compress", lambda a, backend="auto": a.contiguous())
    monkeypatch.setattr(semi, "semi_matmul", lambda sa, b, rows: torch.mm(sa, b)[:rows])
    row = bs.measure_layer(layer, "bf16", torch.device("cpu"), cfg)
    assert row["status"] == "ok" and row["spmm_ms"] > 0 and row["assemble_ms"] > 0
    assert row["rotation_sets"] > 1 and row["rotation_sets_columns"] == 1
    assert "rotation copies: oom" in row["errors"]


@pytest.mark.slow
def test_a_resumed_run_reports_the_whole_runs_semi_structured_calls(tmp_path, caplog):
    # the counts lived only in the layers: a run resumed after its last checkpoint reported 0
    # fallback calls and no reasons, and weighed its executed FLOPs as if no call had run
    from impl.config import resolve
    from impl.rundir import SUMMARY_FILE
    from impl.train import resume, train

    def cfg(out):
        return resolve(
            "smoke",
            method="sdgp",
            method_options={"backend": "semi_structured", "profile": False},
            out=str(out),
            threads=1,
            epochs=2,
            max_steps_per_epoch=2,
        )

    keys = ("sdgp_semi_calls", "sdgp_semi_fallback_calls", "sdgp_semi_fallback_reasons")
    whole = train(cfg(tmp_path / "whole"), progress=False)
    assert whole["sdgp_semi_fallback_calls"] > 0 and whole["sdgp_semi_fallback_reasons"]
    train(cfg(tmp_path / "cut"), progress=False)
    (tmp_path / "cut" / SUMMARY_FILE).unlink()  # killed after its last checkpoint
    resumed = resume(tmp_path / "cut", progress=False)
    assert {k: resumed[k] for k in keys} == {k: whole[k] for k in keys}


def test_restored_counts_continue_and_a_restored_reason_is_logged_again(caplog):
    conv = nn.Conv2d(6, 8, 3, padding=1)
    x = torch.randn(2, 6, 5, 5)
    mod = SDGPSemiConv2d.from_conv(conv, 2, 4, "magnitude", name="layer2.conv")
    reason = "device cpu: semi-structured sparsity needs a CUDA GPU"
    mod.load_semi_state({"semi_calls": 3, "fallback_calls": 5, "fallback_reasons": [reason]})
    with caplog.at_level(logging.WARNING, logger="impl.methods.sdgp_semi"):
        for _ in range(2):
            mod(x.requires_grad_()).sum().backward()
    assert mod.semi_state() == {
        "semi_calls": 3,
        "fallback_calls": 7,
        "fallback_reasons": [reason],
    }
    assert mod.executed_density().data_grad == pytest.approx((3 * 0.5 + 7) / 10)
    assert sum("layer2.conv" in r.getMessage() for r in caplog.records) == 1


SMALL_BENCH = dict(models=("resnet18",), dtypes=("bf16",), batch=2, resolution=32, small=True)


@pytest.mark.parametrize(
    ("kernel", "stride", "padding", "path"),
    [((1, 1), (1, 1), (0, 0), "1x1"), ((1, 1), (2, 2), (0, 0), "1x1-strided"),
     ((3, 3), (1, 1), (1, 1), "fold")],
    ids=["1x1", "1x1-strided", "3x3"],
)  # fmt: skip
def test_bench_layer_row_names_its_path_and_counts_the_gemms_flops(kernel, stride, padding, path):
    from bench import sdgp_semi as bs

    cfg = bs.BenchConfig(**SMALL_BENCH, prune_method="magnitude")
    layer = bs.LayerShape(("c",), (2, 16, 6, 6), 16, kernel, stride, padding, (1, 1), 1)
    row = bs.measure_layer(layer, "bf16", torch.device("cpu"), cfg)  # a fallback row on a CPU
    assert row["path"] == path
    assert (row["gemm_k"], row["gemm_n"]) == (16, 16 * kernel[0] * kernel[1])
    assert row["flops"] == 2 * row["gemm_m"] * row["gemm_k"] * row["gemm_n"]
    assert row["rescale"] == ""  # a setting of rescaled pruning only


def _library_as_dense_algebra(monkeypatch, product=None):
    """The semi-structured library stood in by its dense algebra, so the sparse phases run on
    a CPU; ``product`` replaces the sparse product."""
    monkeypatch.setattr(semi, "unsupported_reason", lambda **kwargs: "")
    monkeypatch.setattr(semi, "compress", lambda a, backend="auto": a.contiguous())
    monkeypatch.setattr(
        semi, "semi_matmul", product or (lambda sa, b, rows: torch.mm(sa, b)[:rows])
    )


@pytest.mark.parametrize("wrong", ["nan", "ten-percent"])
def test_bench_a_sparse_product_off_by_nan_or_10_percent_is_an_error_row(monkeypatch, wrong):
    from bench import sdgp_semi as bs

    scale = math.nan if wrong == "nan" else 1.1
    _library_as_dense_algebra(monkeypatch, lambda sa, b, rows: scale * torch.mm(sa, b)[:rows])
    layer = bs.LayerShape(("conv",), (2, 16, 6, 6), 16, (3, 3), (1, 1), (1, 1), (1, 1), 1)
    row = bs.measure_layer(layer, "bf16", torch.device("cpu"), bs.BenchConfig(**SMALL_BENCH))
    assert row["status"] == "error" and "differs from cuDNN" in row["reason"]
    assert row.get("sparse_dgrad_ms") is None


def test_bench_a_failed_timed_sparse_call_is_an_error_row(monkeypatch):
    from bench import sdgp_semi as bs

    _library_as_dense_algebra(monkeypatch)

    def fails(*args, **kwargs):
        raise RuntimeError("kernel launch failed")

    monkeypatch.setattr(semi, "sparse_data_grad", fails)
    layer = bs.LayerShape(("conv",), (2, 16, 6, 6), 16, (3, 3), (1, 1), (1, 1), (1, 1), 1)
    row = bs.measure_layer(layer, "bf16", torch.device("cpu"), bs.BenchConfig(**SMALL_BENCH))
    assert row["status"] == "error" and "timed sparse call failed" in row["reason"]
    assert row["speedup"] is None


def test_bench_a_tile_pruning_error_without_a_message_is_a_note(monkeypatch):
    from bench import sdgp_semi as bs

    _library_as_dense_algebra(monkeypatch)

    def fails(a, backend):
        raise NotImplementedError()

    monkeypatch.setattr(bs, "_tile_prune_compress", fails)
    layer = bs.LayerShape(("conv",), (2, 16, 6, 6), 16, (3, 3), (1, 1), (1, 1), (1, 1), 1)
    row = bs.measure_layer(layer, "bf16", torch.device("cpu"), bs.BenchConfig(**SMALL_BENCH))
    assert row["status"] == "ok" and row["tile_reason"] == "NotImplementedError: "

    def fails_in_two_lines(a, backend):
        raise NotImplementedError("no tiles\nmore")

    monkeypatch.setattr(bs, "_tile_prune_compress", fails_in_two_lines)
    row = bs.measure_layer(layer, "bf16", torch.device("cpu"), bs.BenchConfig(**SMALL_BENCH))
    assert row["tile_reason"] == "NotImplementedError: no tiles"


def test_bench_a_timing_that_runs_out_of_memory_is_recorded_as_oom():
    from bench import sdgp_semi as bs

    def oom():
        raise torch.cuda.OutOfMemoryError("CUDA out of memory")

    row = {}
    assert bs._attempt(row, "spmm", oom) is False
    assert row["spmm_ms"] is None
    assert row["errors"][0].startswith("spmm: oom: OutOfMemoryError")


@pytest.mark.parametrize("semi_calls", [5, 0], ids=["some-sparse", "none-sparse"])
def test_bench_iteration_row_derives_the_whole_iterations_saving(monkeypatch, semi_calls):
    from bench import sdgp_semi as bs

    times = {"dense": 100.0, "sdgp_reference": 90.0, "sdgp_semi": 80.0}

    def measured(model_name, variant, dtype_name, device, cfg):
        out = {f"{variant}_iter_ms": times[variant]}
        if variant == "sdgp_semi":
            out.update(semi_calls=semi_calls, semi_fallback_calls=2)
        return out

    monkeypatch.setattr(bs, "training_iteration_times", measured)
    cfg = bs.BenchConfig(**SMALL_BENCH)
    layers = [_layer("ok", 2, 10.0, 4.0, 12.0), _layer("fallback", 3, 0.5, None, 0.9, "x")]
    row = bs.iteration_row("resnet18", "bf16", layers, torch.device("cpu"), cfg)
    assert (row["convs"], row["convs_sparse"], row["convs_fallback"]) == (5, 2, 3)
    saved = 2 * 5.0 + 3 * 0.25  # the paper's estimate: half of each data gradient
    assert row["est_iter_ms"] == pytest.approx(100.0 - saved)
    assert row["est_saved_fraction"] == pytest.approx(saved / 100.0)
    ipe = bs.iterations_per_epoch(cfg.batch)
    assert row["est_iter_epoch_s"] == pytest.approx((100.0 - saved) * ipe / 1e3)
    if semi_calls:
        assert row["measured_saved_fraction"] == pytest.approx(0.2)
        assert row["semi_iteration_note"].startswith("some convs")
    else:
        assert "measured_saved_fraction" not in row
        assert row["semi_iteration_note"] == "every conv took the reference path"


def test_bench_summary_counts_fallback_layers_neither_slower_nor_faster():
    from bench import sdgp_semi as bs

    def layer(name, dense, sparse, status="ok", reason=""):
        row = {"kind": "layer", "model": "resnet18", "dtype": "bf16", "layer": name, "count": 1}
        row.update(C=64, K=64, kernel="3x3", stride=1, H=56, W=56, status=status, flops=1e9)
        row.update(dense_dgrad_ms=dense, sparse_dgrad_ms=sparse, reason=reason)
        bs._derive(row)
        return row

    it = {"kind": "iteration", "model": "resnet18", "dtype": "bf16", "convs": 3}
    it.update(convs_sparse=2, convs_fallback=1, iterations_per_epoch=5005)
    meta = _summary_meta()
    rows = [layer("a", 4.0, 2.5), layer("b", 2.0, 6.5),
            layer("c", 1.0, None, "fallback", "groups=2: grouped"), it]  # fmt: skip
    text = bs.summary(rows, meta)
    assert "Sparse slower than dense on 1 of 2 distinct layers: b." in text
    assert "| fallback: groups=2: grouped |" in text


def test_bench_main_exits_1_when_a_row_is_an_error(monkeypatch, tmp_path):
    from bench import sdgp_semi as bs

    monkeypatch.setenv(bs.ENV_SMALL, "1")
    rows = [{"status": "ok"}, {"status": "fallback"}]
    monkeypatch.setattr(bs, "run", lambda cfg, device, out: (rows, {"wall_seconds": 0}))
    assert bs.main(["--out", str(tmp_path), "--device", "cpu"]) == 0
    rows.append({"status": "error"})
    assert bs.main(["--out", str(tmp_path), "--device", "cpu"]) == 1


def test_bench_main_makes_the_gpu_it_is_given_the_current_one(monkeypatch, tmp_path):
    # With --device cuda:3 the timing's events and synchronisations stayed on the current GPU
    # (0): they timed how long the host took to queue cuda:3's work.
    from bench import sdgp_semi as bs

    seen = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: seen.append(("current", d)))
    monkeypatch.setattr(
        bs,
        "run",
        lambda cfg, device, out: seen.append(("run", device)) or ([], {"wall_seconds": 0}),
    )
    assert bs.main(["--out", str(tmp_path), "--device", "cuda:3"]) == 0
    assert seen == [("current", torch.device("cuda:3")), ("run", torch.device("cuda:3"))]


@pytest.mark.parametrize(
    ("value", "small"),
    [(" Yes ", True), ("on", True), ("TRUE", True), ("1", True), ("0", False), ("", False)],
)
def test_bench_small_sizes_follow_the_environment(monkeypatch, value, small):
    from bench import sdgp_semi as bs

    monkeypatch.setenv(bs.ENV_SMALL, value)
    assert bs.small_enabled() is small
    cfg = bs.default_config()
    assert cfg.small is small
    assert (cfg.batch, cfg.resolution) == ((2, 32) if small else (256, 224))
    assert bs.default_config(small=True).small is True
    assert bs.default_config(small=False).batch == 256


def test_bench_cpu_timing_repeats_twice_at_small_sizes_and_three_times_otherwise():
    from bench import sdgp_semi as bs

    for small, timed in ((True, 2), (False, 3)):
        calls = []
        cfg = bs.BenchConfig(**{**SMALL_BENCH, "small": small})
        t = bs._timed(calls.append, torch.device("cpu"), cfg)
        assert t.n == timed and calls == list(range(1 + timed))  # one warm-up call first


def test_bench_attempt_records_the_time_host_time_clock_and_runs():
    from bench import sdgp_semi as bs

    t = bs.measure.Timing(2.0, 1.0, 3.0, 1.0, n=7, clock="cuda-events", host_ms=0.5)
    row = {}
    assert bs._attempt(row, "spmm", lambda: t) is True
    assert row == {"spmm_ms": 2.0, "spmm_host_ms": 0.5, "clock": "cuda-events", "n_runs": 7}
    later = bs.measure.Timing(4.0, 4.0, 4.0, 4.0, n=3, clock="perf_counter")
    assert bs._attempt(row, "prune", lambda: later) is True
    assert row["prune_ms"] == 4.0 and "prune_host_ms" not in row
    assert (row["clock"], row["n_runs"]) == ("cuda-events", 7)  # the row's first timing


def test_bench_memory_format_of_the_config():
    from bench import sdgp_semi as bs

    assert bs._memory_format(bs.BenchConfig()) is torch.channels_last
    cfg = bs.BenchConfig(memory_format="contiguous")
    assert bs._memory_format(cfg) is torch.contiguous_format


def test_bench_grouped_padded_1x1_layer_row_columns():
    from bench import sdgp_semi as bs

    # input 2x16x6x6, 8 outputs, 1x1 kernel, stride 2x1, padding 1, groups 2:
    # Ho = (6 + 2 - 1) // 2 + 1 = 4, Wo = (6 + 2 - 1) // 1 + 1 = 8
    layer = bs.LayerShape(("a", "b"), (2, 16, 6, 6), 8, (1, 1), (2, 1), (1, 1), (1, 1), 2)
    row = bs.measure_layer(layer, "bf16", torch.device("cpu"), bs.BenchConfig(**SMALL_BENCH))
    assert (row["layer"], row["layers"], row["count"]) == ("a", "a;b", 2)
    assert (row["Ho"], row["Wo"], row["stride"], row["padding"]) == (4, 8, "2x1", "1x1")
    assert row["path"] == "fold"  # padded: not the plain 1x1 path
    assert (row["gemm_m"], row["gemm_k"], row["gemm_n"]) == (2 * 4 * 8, 8, 16 // 2)
    assert row["flops"] == 2 * 64 * 8 * 8
    assert row["prune_impl"] == "reference (torch ops)"
    assert row["status"] == "fallback" and row["fallback_ms"] == row["reference_ms"] > 0
    assert "dense_mm_ms" not in row and "dense_gemm_ms" not in row  # grouped: no GEMM row


def test_bench_failed_timings_are_listed_in_order(monkeypatch):
    from bench import sdgp_semi as bs

    def no_timer(fn, device, cfg, *, iteration=False):
        raise RuntimeError("no timer")

    monkeypatch.setattr(bs, "_timed", no_timer)
    layer = bs.LayerShape(("conv",), (2, 16, 6, 6), 16, (3, 3), (1, 1), (1, 1), (1, 1), 1)
    row = bs.measure_layer(layer, "bf16", torch.device("cpu"), bs.BenchConfig(**SMALL_BENCH))
    keys = ("dense_dgrad", "reference", "dense_mm", "dense_gemm")
    assert row["errors"] == " | ".join(f"{k}: error: RuntimeError: no timer" for k in keys)
    assert row["dense_dgrad_ms"] is None and row["est_sparse_ms"] is None


def test_bench_sparse_row_times_every_phase(monkeypatch):
    from bench import sdgp_semi as bs

    _library_as_dense_algebra(monkeypatch)
    layer = bs.LayerShape(("conv",), (2, 16, 6, 6), 16, (3, 3), (1, 1), (1, 1), (1, 1), 1)
    row = bs.measure_layer(layer, "bf16", torch.device("cpu"), bs.BenchConfig(**SMALL_BENCH))
    assert row["status"] == "ok" and row["reason"] == ""
    for key in ("sparse_dgrad", "prune", "compress", "spmm", "assemble", "dense_mm"):
        assert row[f"{key}_ms"] > 0, key
    assert row["speedup"] == row["dense_dgrad_ms"] / row["sparse_dgrad_ms"]


@pytest.mark.parametrize("error", ["RuntimeError", "oom"])
def test_bench_a_library_failure_before_timing_is_the_rows_status(monkeypatch, error):
    from bench import sdgp_semi as bs

    _library_as_dense_algebra(monkeypatch)

    def fails(a, backend="auto"):
        if error == "oom":
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        raise RuntimeError("no compression here")

    monkeypatch.setattr(semi, "compress", fails)
    layer = bs.LayerShape(("conv",), (2, 16, 6, 6), 16, (3, 3), (1, 1), (1, 1), (1, 1), 1)
    row = bs.measure_layer(layer, "bf16", torch.device("cpu"), bs.BenchConfig(**SMALL_BENCH))
    if error == "oom":
        assert row["status"] == "oom" and row["reason"].startswith("OutOfMemoryError")
    else:
        assert (row["status"], row["reason"]) == ("error", "RuntimeError: no compression here")
    assert row.get("sparse_dgrad_ms") is None and row["dense_dgrad_ms"] > 0


def test_bench_derived_columns_of_an_even_and_a_failed_row():
    from bench import sdgp_semi as bs

    even = {"status": "ok", "dense_dgrad_ms": 2.0, "sparse_dgrad_ms": 2.0, "flops": 1}
    bs._derive(even)
    assert even["sparse_faster"] is False and even["speedup"] == 1.0  # a tie is not faster
    failed = {"status": "error", "dense_dgrad_ms": 2.0, "sparse_dgrad_ms": 1.0, "flops": 1}
    bs._derive(failed)  # a sparse time of a row that failed its check is not used
    assert failed["speedup"] is None and failed["sparse_tflops_equiv"] is None


def test_bench_iteration_row_of_sparse_error_and_fallback_layers():
    from bench import sdgp_semi as bs

    cfg = bs.BenchConfig(**{**SMALL_BENCH, "iteration": False})
    layers = [
        _layer("ok", 2, dense=1.0, sparse=0.4, reference=1.2),
        _layer("error", 1, dense=3.0, sparse=None, reference=2.0, reason="differs"),
        _layer("fallback", 1, dense=0.5, reference=0.9, reason="stride"),
        _layer("fallback", 3, dense=0.5, reference=0.9, reason="stride"),
    ]
    row = bs.iteration_row("resnet18", "bf16", layers, torch.device("cpu"), cfg)
    assert row["status"] == "partial" and row["reason"] == "differs; stride"
    assert (row["convs"], row["convs_sparse"], row["convs_fallback"]) == (7, 2, 5)
    assert row["sparse_dgrad_ms_sparse_layers"] == pytest.approx(0.8)
    assert row["dense_dgrad_ms_sparse_layers"] == pytest.approx(2.0)
    assert row["semi_backend_dgrad_ms"] == pytest.approx(0.8 + 2.0 + 4 * 0.9)
    only_fallback = bs.iteration_row("resnet18", "bf16", layers[2:], torch.device("cpu"), cfg)
    assert only_fallback["status"] == "fallback"
    assert only_fallback["sparse_dgrad_ms_sparse_layers"] is None


def test_bench_iteration_row_gives_each_whole_iteration_per_epoch(monkeypatch):
    from bench import sdgp_semi as bs

    times = {"dense": 100.0, "sdgp_reference": 90.0, "sdgp_semi": 80.0}
    monkeypatch.setattr(
        bs,
        "training_iteration_times",
        lambda model_name, variant, dtype_name, device, cfg: {f"{variant}_iter_ms": times[variant]},
    )
    cfg = bs.BenchConfig(**SMALL_BENCH)  # batch 2: 640,584 iterations per epoch
    row = bs.iteration_row(
        "resnet18", "bf16", [_layer("ok", 1, 1.0, 0.4)], torch.device("cpu"), cfg
    )
    for variant, ms in times.items():
        assert row[f"{variant}_iter_epoch_s"] == pytest.approx(ms * 640_584 / 1e3)
    assert "measured_saved_fraction" not in row  # no sparse call was counted


def test_bench_formats_of_the_summary():
    from bench import sdgp_semi as bs

    assert [bs._fmt(v) for v in (None, "", True, False, math.nan, math.inf)] == [
        "-", "-", "yes", "no", "-", "-"
    ]  # fmt: skip
    assert [bs._fmt(v) for v in (1234.5, 0.5, 3, "x")] == ["1.23e+03", "0.5", "3", "x"]
    assert [bs._saves(v) for v in (-2.0, 2.0, None)] == ["slower by 2", "saves 2", "saves -"]


def test_bench_phase_verdict_counts_an_equal_gemm_as_not_slower():
    from bench import sdgp_semi as bs

    row = {"spmm_ms": 1.0, "dense_mm_ms": 1.0, "prune_ms": 2.0, "compress_ms": 2.0}
    text = bs.phase_verdict([{**row, "dense_dgrad_ms": 2.0}])
    assert (
        "on 0 of 1 layers; pruning alone takes longer than the whole dense data gradient on 0 "
        "of 1, compression alone on 0 of 1." in text
    )


def test_bench_summary_says_cpu_only_from_the_gpu_seen_and_incomplete_only_if_cut():
    from bench import sdgp_semi as bs

    meta = _summary_meta()
    meta.pop("complete", None)
    text = bs.summary([], meta)
    assert "CPU only" not in text and "Incomplete" not in text  # an H100 named
    meta["provenance"]["gpu_available"] = False  # named, but not seen by this run
    assert "**CPU only**" in bs.summary([], meta)
    meta.update(complete=False, cut_at={"reason": "SIGTERM", "model": "resnet18"})
    assert "**Incomplete**: the run was cut (SIGTERM) at resnet18" in bs.summary([], meta)


def test_bench_write_leaves_missing_values_empty_in_csv_and_null_in_json(tmp_path):
    import json

    from bench import sdgp_semi as bs

    rows = [{"kind": "x", "status": "ok", "a": None, "b": math.nan, "c": 1.5}]
    bs.write(rows, _summary_meta(), tmp_path / "out")
    lines = (tmp_path / "out" / "rows.csv").read_text().splitlines()
    header = lines[0].split(",")
    values = dict(zip(header, lines[1].split(",")))
    assert values["a"] == "" and values["c"] == "1.5"
    saved = json.loads((tmp_path / "out" / "rows.json").read_text())["rows"][0]
    assert saved["b"] is None and saved["a"] is None and saved["c"] == 1.5


def test_bench_main_passes_its_options_to_the_run(monkeypatch, tmp_path):
    from bench import sdgp_semi as bs

    monkeypatch.setenv(bs.ENV_SMALL, "1")
    seen = []
    monkeypatch.setattr(
        bs,
        "run",
        lambda cfg, device, out: seen.append((cfg, device, out)) or ([], {"wall_seconds": 0}),
    )
    argv = ["--out", str(tmp_path), "--device", "cpu", "--no-iteration", "--batch", "4"]
    argv += ["--memory-format", "contiguous", "--prune-method", "magnitude", "--models", "vgg11"]
    assert bs.main(argv) == 0
    ((cfg, device, out),) = seen
    assert (cfg.iteration, cfg.batch, cfg.memory_format) == (False, 4, "contiguous")
    assert (cfg.prune_method, cfg.models, cfg.small) == ("magnitude", ("vgg11",), True)
    assert device == torch.device("cpu") and out == tmp_path


def test_bench_check_is_relative_to_the_largest_value(monkeypatch):
    # A product 3% off everywhere is within CHECK_REL_TOL (5%) of the largest value,
    # whatever that value's size (here of order 1, so the absolute error passes 0.05).
    from bench import sdgp_semi as bs

    _library_as_dense_algebra(monkeypatch, lambda sa, b, rows: 1.03 * torch.mm(sa, b)[:rows])
    layer = bs.LayerShape(("conv",), (2, 16, 6, 6), 16, (3, 3), (1, 1), (1, 1), (1, 1), 1)
    row = bs.measure_layer(layer, "bf16", torch.device("cpu"), bs.BenchConfig(**SMALL_BENCH))
    assert row["status"] == "ok", row.get("reason")
    assert 0.02 < row["check_rel_max_err"] < bs.CHECK_REL_TOL


def test_bench_defaults_are_the_papers_setup_and_small_sizes_run_bf16_only():
    # docs/sdgp_semi.md: ResNet-18 and ResNet-50, batch 256, 224 x 224, bf16 and fp16,
    # channels-last, rescaled pruning (plane rule), backend auto; the smoke run: bf16 only.
    from bench import sdgp_semi as bs

    cfg = bs.BenchConfig()
    assert (cfg.models, cfg.dtypes) == (("resnet18", "resnet50"), ("bf16", "fp16"))
    assert (cfg.batch, cfg.resolution, cfg.memory_format) == (256, 224, "channels_last")
    assert (cfg.prune_method, cfg.rescale, cfg.backend) == ("rescaled", "plane", "auto")
    assert cfg.iteration is True and cfg.small is False
    assert bs.default_config(small=True).dtypes == ("bf16",)


def test_bench_main_passes_resolution_dtypes_backend_and_rescale(monkeypatch, tmp_path):
    from bench import sdgp_semi as bs

    monkeypatch.setenv(bs.ENV_SMALL, "1")
    seen = []
    monkeypatch.setattr(
        bs, "run", lambda cfg, device, out: seen.append(cfg) or ([], {"wall_seconds": 0})
    )
    argv = ["--out", str(tmp_path), "--device", "cpu", "--resolution", "64", "--dtypes", "fp16"]
    argv += ["--backend", "cutlass", "--rescale", "channel"]
    assert bs.main(argv) == 0
    (cfg,) = seen
    assert (cfg.resolution, cfg.dtypes, cfg.backend, cfg.rescale) == (64, ("fp16",), "cutlass",
                                                                      "channel")  # fmt: skip
    assert cfg.batch == 2  # the smoke batch where --batch is not given


def test_bench_layer_row_names_its_configuration_and_input_sizes():
    from bench import sdgp_semi as bs

    cfg = bs.BenchConfig(**{**SMALL_BENCH, "memory_format": "contiguous", "prune_method": "random"})
    # a 6x8 input (height 6, width 8), 3x3 kernel, padding 1: the output keeps 6x8
    layer = bs.LayerShape(("c",), (2, 16, 6, 8), 16, (3, 3), (1, 1), (1, 1), (1, 1), 1)
    row = bs.measure_layer(layer, "fp16", torch.device("cpu"), cfg)
    assert (row["dtype"], row["memory_format"], row["prune_method"]) == (
        "fp16", "contiguous", "random"
    )  # fmt: skip
    assert (row["N"], row["C"], row["K"], row["H"], row["W"]) == (2, 16, 16, 6, 8)
    assert (row["Ho"], row["Wo"], row["gemm_m"]) == (6, 8, 2 * 6 * 8)


def test_bench_iteration_row_records_its_sizes_and_every_total_per_epoch():
    from bench import sdgp_semi as bs

    cfg = bs.BenchConfig(**{**SMALL_BENCH, "resolution": 48, "iteration": False})
    layers = [_layer("ok", 2, dense=1.0, sparse=0.4, reference=1.2),
              _layer("fallback", 3, dense=0.5, reference=0.9, reason="stride")]  # fmt: skip
    row = bs.iteration_row("resnet18", "bf16", layers, torch.device("cpu"), cfg)
    assert (row["batch"], row["resolution"], row["distinct_layers"]) == (2, 48, 2)
    ipe = 640_584  # ceil(1,281,167 / 2)
    assert row["dense_dgrad_epoch_s"] == pytest.approx((2 * 1.0 + 3 * 0.5) * ipe / 1e3)
    assert row["est_sparse_epoch_s"] == pytest.approx((2 * 0.5 + 3 * 0.25) * ipe / 1e3)
    assert row["semi_backend_dgrad_epoch_s"] == pytest.approx((2 * 0.4 + 3 * 0.9) * ipe / 1e3)


def test_bench_run_records_the_pattern_and_names_the_gpu_on_every_row(monkeypatch):
    from bench import sdgp_semi as bs

    layer = bs.LayerShape(("c",), (2, 16, 6, 6), 16, (1, 1), (1, 1), (0, 0), (1, 1), 1)
    monkeypatch.setattr(bs, "model_layers", lambda model, batch, resolution: [layer])
    prov = {"commit": "abc", "gpu_name": "NVIDIA H200", "cpu_model": "Xeon", "scale": "smoke"}
    monkeypatch.setattr(bs, "provenance", lambda scale: dict(prov))
    cfg = bs.BenchConfig(**{**SMALL_BENCH, "iteration": False})
    rows, meta = bs.run(cfg, torch.device("cpu"))
    assert (meta["n"], meta["m"], meta["complete"]) == (2, 4, True)  # 2:4 sparsity
    assert [r["kind"] for r in rows] == ["layer", "iteration"]
    assert all(r["device_name"] == "NVIDIA H200" and r["commit"] == "abc" for r in rows)


def test_bench_a_saving_of_zero_is_not_slower():
    from bench import sdgp_semi as bs

    assert bs._saves(0.0) == "saves 0" and bs._saves(0) == "saves 0"
    assert bs._saves(-0.5) == "slower by 0.5"


def _summary_layer(name, dense, sparse):
    row = {"kind": "layer", "model": "resnet50", "dtype": "fp16", "layer": name, "count": 3}
    row.update(C=256, K=64, kernel="1x1", stride="1x1", H=56, W=56, status="ok", flops=1e9)
    row.update(dense_dgrad_ms=dense, sparse_dgrad_ms=sparse)
    return row


def test_bench_summary_header_table_whole_iteration_and_epoch_lines():
    from bench import sdgp_semi as bs

    meta = _summary_meta()
    meta["library"].update(cusparselt_available=True, cusparselt_version=602)
    layer = _summary_layer("layer1.0.conv1", 4.0, 3.0)
    bs._derive(layer)  # est 2.0, speedup 1.33
    it = {"kind": "iteration", "model": "resnet50", "dtype": "fp16", "convs": 3}
    it.update(convs_sparse=3, convs_fallback=0, iterations_per_epoch=5005)
    it.update(dense_dgrad_ms=12.0, est_sparse_ms=6.0, est_saved_ms=6.0, reference_ms=13.0)
    it.update(semi_backend_dgrad_ms=9.0, measured_saved_ms=3.0)
    it.update(dense_iter_ms=100.0, est_iter_ms=94.0, sdgp_semi_iter_ms=97.0)
    it.update(sdgp_reference_iter_ms=110.0, semi_calls=48, semi_fallback_calls=0)
    it.update(dense_dgrad_epoch_s=60.1, est_sparse_epoch_s=30.0, semi_backend_dgrad_epoch_s=45.0)
    it.update(dense_iter_epoch_s=500.0, est_iter_epoch_s=470.0, sdgp_semi_iter_epoch_s=485.0)
    text = bs.summary([layer, it], meta)
    assert "cuSPARSELt 602; batch 256, 224x224, nchw, pruning rescaled; 1 s." in text
    assert "| layer1.0.conv1 | 3 | 256->64, 1x1, s1x1, 56x56 | 4 | 2 | 3 | 1.33 |" in text
    assert "\n|" + "---|" * 13 + "\n" in text  # a separator cell under each of 13 heads
    assert (
        "Whole training iteration: dense 100 ms, estimated SDGP 94 ms, SDGP semi-structured "
        "backend 97 ms (48 sparse calls, 0 reference-path calls), reference SDGP 110 ms."
    ) in text
    assert (
        "Per epoch (5005 iterations): dense data gradients 60.1 s, estimate 30 s, "
        "semi-structured backend 45 s; whole epoch dense 500 s, estimated 470 s, "
        "semi-structured backend 485 s."
    ) in text
    assert "semi-structured backend 9 ms (saves 3; 0 convs on the reference path)" in text


def test_bench_summary_says_when_a_blocks_iteration_row_is_missing():
    from bench import sdgp_semi as bs

    meta = {**_summary_meta(), "complete": False, "cut_at": {"reason": "SIGTERM"}}
    text = bs.summary([_summary_layer("layer1.0.conv1", 4.0, None)], meta)
    assert "## resnet50, fp16" in text
    assert "The run was cut before this model and dtype's iteration row." in text
    assert "Per epoch" not in text


def test_bench_summary_of_a_block_with_no_sparse_conv_gives_the_reason_and_no_sparse_time():
    from bench import sdgp_semi as bs

    it = {"kind": "iteration", "model": "resnet50", "dtype": "fp16", "convs": 3}
    it.update(convs_sparse=0, convs_fallback=3, iterations_per_epoch=5005, reason="device cpu")
    it.update(semi_backend_dgrad_ms=9.0)
    text = bs.summary([_summary_layer("layer1.0.conv1", 4.0, None), it], _summary_meta())
    assert (
        "semi-structured backend: every conv took the reference path (device cpu), so no "
        "sparse time" in text
    )
    assert "semi-structured backend 9 ms" not in text
