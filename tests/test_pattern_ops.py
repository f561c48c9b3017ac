"""Reference pattern ops (impl.ops.pattern) against dense torch computations, in float64."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from impl.ops import (
    PatternConv2d,
    PatternIndex,
    check_csr,
    csr_transpose,
    pattern_conv2d,
    pattern_csr,
    pattern_index,
    pattern_positions,
    pattern_spmm,
)
from impl.ops.pattern import conv_output_size, csr_rows, im2col

F64 = torch.float64


def _random_mask(shape, density: float, gen: torch.Generator) -> torch.Tensor:
    return torch.rand(shape, generator=gen, dtype=F64) < density


def _conv_case(size: int, batch: int = 2):
    """A seeded 4x3x3x3 weight at half density and a [batch, 3, size, size] input."""
    gen = torch.Generator().manual_seed(3)
    weight = torch.randn(4, 3, 3, 3, generator=gen)
    mask = _random_mask(weight.shape, 0.5, gen)
    x = torch.randn(batch, 3, size, size, generator=gen)
    return gen, weight, mask, x


def _csr_to_dense(values, row_ptr, col_ind, n_cols):
    dense = torch.zeros(row_ptr.numel() - 1, n_cols, dtype=values.dtype)
    for f in range(row_ptr.numel() - 1):
        for j in range(int(row_ptr[f]), int(row_ptr[f + 1])):
            dense[f, int(col_ind[j])] = values[j]
    return dense


def test_pattern_positions_small_known_mask():
    mask = torch.tensor([[0, 1, 0, 1], [0, 0, 0, 0], [1, 1, 1, 0]], dtype=torch.bool)
    row_ptr, col_ind = pattern_positions(mask)
    assert row_ptr.tolist() == [0, 2, 2, 5]
    assert col_ind.tolist() == [1, 3, 0, 1, 2]
    assert row_ptr.dtype == torch.int64 and col_ind.dtype == torch.int64


def test_pattern_positions_conv_shape_uses_im2col_order():
    mask = torch.zeros(2, 3, 3, 3, dtype=torch.bool)
    mask[0, 1, 2, 0] = True  # column 1*9 + 2*3 + 0 = 15
    mask[1, 2, 0, 1] = True  # column 2*9 + 0*3 + 1 = 19
    row_ptr, col_ind = pattern_positions(mask)
    assert row_ptr.tolist() == [0, 1, 2]
    assert col_ind.tolist() == [15, 19]


SHAPES = [(1, 1), (5, 7), (13, 29), (16, 144)]
SHAPE_IDS = ["1x1", "5x7", "13x29", "16x144"]


@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_pattern_csr_gathers_values_in_row_order(shape):
    gen = torch.Generator().manual_seed(1)
    dense = torch.randn(shape, generator=gen, dtype=F64)
    mask = _random_mask(shape, 0.4, gen)
    row_ptr, col_ind = pattern_positions(mask)
    values = pattern_csr(dense, row_ptr, col_ind)
    assert torch.equal(values, dense[mask])
    assert torch.equal(_csr_to_dense(values, row_ptr, col_ind, shape[1]), dense * mask)


def test_pattern_csr_with_its_index_reads_the_positions_checked_once(monkeypatch):
    """With the pattern's index the positions were checked when it was built: the same values,
    no per-call check of every position (what ClickTrain's conversion does not pay), and an
    index of another structure refused."""
    from impl.ops import pattern as P

    gen = torch.Generator().manual_seed(3)
    dense = torch.randn(13, 29, generator=gen, dtype=F64)
    mask = _random_mask((13, 29), 0.4, gen)
    idx = pattern_index(mask)
    expected = pattern_csr(dense, idx.row_ptr, idx.col_ind)

    def no_check(*args, **kwargs):
        raise AssertionError("the positions were checked again")

    monkeypatch.setattr(P, "check_csr", no_check)
    assert torch.equal(pattern_csr(dense, idx.row_ptr, idx.col_ind, index=idx), expected)
    other = pattern_index(_random_mask((13, 29), 0.6, gen))
    with pytest.raises(ValueError, match="index.row_ptr differs from the row_ptr passed"):
        pattern_csr(dense, other.row_ptr.clone(), other.col_ind, index=idx)


def test_pattern_csr_gradient_only_at_positions():
    gen = torch.Generator().manual_seed(2)
    dense = torch.randn(7, 11, generator=gen, dtype=F64, requires_grad=True)
    mask = _random_mask((7, 11), 0.3, gen)
    row_ptr, col_ind = pattern_positions(mask)
    values = pattern_csr(dense, row_ptr, col_ind)
    weights = torch.randn(values.shape, generator=gen, dtype=F64)
    (values * weights).sum().backward()
    expected = torch.zeros(7, 11, dtype=F64)
    expected[mask] = weights
    assert torch.equal(dense.grad, expected)


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
@pytest.mark.parametrize("shape", [(5, 7), (13, 29), (16, 144)], ids=["5x7", "13x29", "16x144"])
def test_csr_transpose_matches_dense_transpose(shape):
    gen = torch.Generator().manual_seed(3)
    dense = torch.randn(shape, generator=gen, dtype=F64) * _random_mask(shape, 0.35, gen)
    row_ptr, col_ind = pattern_positions(dense)
    values = pattern_csr(dense, row_ptr, col_ind)
    row_ptr_t, col_ind_t, perm = csr_transpose(row_ptr, col_ind, shape[1])
    rebuilt = _csr_to_dense(values[perm], row_ptr_t, col_ind_t, shape[0])
    assert torch.equal(rebuilt, dense.t())
    # The same CSR as torch's, entry for entry: each transposed row's columns ascending (the
    # order check_csr asks of every structure the kernels read).
    expected = dense.t().contiguous().to_sparse_csr()
    assert torch.equal(row_ptr_t, expected.crow_indices())
    assert torch.equal(col_ind_t, expected.col_indices())
    assert torch.equal(values[perm], expected.values())
    check_csr(row_ptr_t, col_ind_t, shape[1], shape[0])


SPMM_CASES = [
    (1, 1, 1, None),
    (5, 7, 3, None),
    (13, 29, 31, None),
    (17, 9, 23, 3),
    (16, 144, 64, 2),
]
SPMM_IDS = ["1x1x1", "5x7x3", "13x29x31", "17x9x23_b3", "16x144x64_b2"]


@pytest.mark.parametrize(("rows", "k", "n", "batch"), SPMM_CASES, ids=SPMM_IDS)
def test_pattern_spmm_matches_dense_matmul(rows, k, n, batch):
    gen = torch.Generator().manual_seed(4)
    mask = _random_mask((rows, k), 0.3, gen)
    mask[0] = False  # an empty row
    dense = torch.randn(rows, k, generator=gen, dtype=F64) * mask
    shape_b = (k, n) if batch is None else (batch, k, n)
    b = torch.randn(shape_b, generator=gen, dtype=F64)
    row_ptr, col_ind = pattern_positions(mask)
    values = pattern_csr(dense, row_ptr, col_ind)
    out = pattern_spmm(values, row_ptr, col_ind, b)
    torch.testing.assert_close(out, dense @ b, rtol=1e-12, atol=1e-12)


def test_pattern_spmm_all_zero_matrix():
    mask = torch.zeros(4, 6, dtype=torch.bool)
    row_ptr, col_ind = pattern_positions(mask)
    values = torch.zeros(0, dtype=F64)
    out = pattern_spmm(values, row_ptr, col_ind, torch.randn(6, 5, dtype=F64))
    assert out.shape == (4, 5) and torch.count_nonzero(out) == 0


@pytest.mark.parametrize("batch", [None, 2], ids=["2d", "batched"])
def test_pattern_spmm_gradients_match_dense(batch):
    gen = torch.Generator().manual_seed(5)
    mask = _random_mask((7, 13), 0.4, gen)
    dense = torch.randn(7, 13, generator=gen, dtype=F64) * mask
    shape_b = (13, 11) if batch is None else (batch, 13, 11)
    b = torch.randn(shape_b, generator=gen, dtype=F64)
    grad_out = torch.randn((7, 11) if batch is None else (batch, 7, 11), generator=gen, dtype=F64)
    row_ptr, col_ind = pattern_positions(mask)
    values = pattern_csr(dense, row_ptr, col_ind).requires_grad_(True)
    b1 = b.clone().requires_grad_(True)
    pattern_spmm(values, row_ptr, col_ind, b1).backward(grad_out)
    dense2 = dense.clone().requires_grad_(True)
    b2 = b.clone().requires_grad_(True)
    (dense2 @ b2).backward(grad_out)
    torch.testing.assert_close(b1.grad, b2.grad, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(values.grad, dense2.grad[mask], rtol=1e-12, atol=1e-12)


def test_pattern_spmm_gradcheck():
    gen = torch.Generator().manual_seed(6)
    mask = _random_mask((5, 7), 0.5, gen)
    row_ptr, col_ind = pattern_positions(mask)
    values = torch.randn(col_ind.numel(), generator=gen, dtype=F64, requires_grad=True)
    b = torch.randn(2, 7, 3, generator=gen, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda v, x: pattern_spmm(v, row_ptr, col_ind, x), (values, b))


CONV_CASES = [
    # batch, c_in, c_out, h, w, kernel, stride, padding, dilation, bias
    (1, 1, 1, 5, 5, (3, 3), 1, 1, 1, False),
    (3, 5, 7, 11, 13, (3, 3), 1, 1, 1, True),
    (2, 3, 4, 9, 7, (3, 3), 2, 1, 1, False),
    (2, 4, 3, 10, 10, (3, 3), 1, 0, 2, True),
    (2, 3, 5, 8, 9, (1, 3), (1, 2), (0, 1), 1, False),
    (2, 16, 16, 8, 8, (3, 3), 1, 1, 1, False),
]
CONV_IDS = ["tiny", "odd_bias", "stride2", "dil2_nopad", "1x3_mixed", "resnet_block"]


@pytest.mark.parametrize(
    ("batch", "c_in", "c_out", "h", "w", "kernel", "stride", "padding", "dilation", "bias"),
    CONV_CASES,
    ids=CONV_IDS,
)
def test_pattern_conv2d_matches_masked_dense_conv(
    batch, c_in, c_out, h, w, kernel, stride, padding, dilation, bias
):
    gen = torch.Generator().manual_seed(7)
    wshape = (c_out, c_in, *kernel)
    mask = _random_mask(wshape, 0.4, gen)
    weight = torch.randn(wshape, generator=gen, dtype=F64)
    x = torch.randn(batch, c_in, h, w, generator=gen, dtype=F64)
    b = torch.randn(c_out, generator=gen, dtype=F64) if bias else None
    kwargs = {"stride": stride, "padding": padding, "dilation": dilation}

    x1, w1 = x.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    out1 = pattern_conv2d(x1, w1, pattern_index(mask), b, **kwargs)
    x2, w2 = x.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    out2 = F.conv2d(x2, w2 * mask, b, **kwargs)
    torch.testing.assert_close(out1, out2, rtol=1e-12, atol=1e-12)

    grad_out = torch.randn(out2.shape, generator=gen, dtype=F64)
    out1.backward(grad_out)
    out2.backward(grad_out)
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(w1.grad[mask], w2.grad[mask], rtol=1e-12, atol=1e-12)
    assert torch.count_nonzero(w1.grad[~mask]) == 0


def test_pattern_conv2d_accepts_mask_directly():
    gen = torch.Generator().manual_seed(8)
    mask = _random_mask((4, 3, 3, 3), 0.5, gen)
    weight = torch.randn(4, 3, 3, 3, generator=gen, dtype=F64)
    x = torch.randn(2, 3, 6, 6, generator=gen, dtype=F64)
    out = pattern_conv2d(x, weight, mask, padding=1)
    torch.testing.assert_close(out, F.conv2d(x, weight * mask, padding=1), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_pattern_conv2d_low_precision_close_to_float64(dtype):
    gen = torch.Generator().manual_seed(9)
    mask = _random_mask((8, 5, 3, 3), 0.4, gen)
    weight = torch.randn(8, 5, 3, 3, generator=gen, dtype=F64)
    x = torch.randn(2, 5, 7, 7, generator=gen, dtype=F64)
    ref = F.conv2d(x, weight * mask, padding=1)
    out = pattern_conv2d(x.to(dtype), weight.to(dtype), pattern_index(mask), padding=1)
    assert out.dtype == dtype
    # judged against the same-precision dense conv's own error
    base = F.conv2d(x.to(dtype), (weight * mask).to(dtype), padding=1)
    err = (out.double() - ref).abs().max()
    base_err = (base.double() - ref).abs().max()
    assert err <= 4 * base_err + 1e-6


def test_pattern_conv2d_module_from_conv():
    gen = torch.Generator().manual_seed(10)
    conv = nn.Conv2d(5, 6, 3, stride=2, padding=1, bias=True).double()
    mask = _random_mask(conv.weight.shape, 0.3, gen)
    dense_masked = conv.weight.detach() * mask
    module = PatternConv2d.from_conv(conv, mask)
    assert module.weight is conv.weight  # shared, so an optimizer's state stays valid
    assert isinstance(module, nn.Conv2d)  # still found by code that counts convolutions
    assert [n for n, _ in module.named_parameters()] == ["weight", "bias"]
    assert torch.equal(module.weight.detach(), dense_masked)  # zero outside the mask
    x = torch.randn(3, 5, 9, 9, generator=gen, dtype=F64)
    expected = F.conv2d(x, dense_masked, conv.bias, stride=2, padding=1)
    torch.testing.assert_close(module(x), expected, rtol=1e-12, atol=1e-12)
    density = int(mask.sum()) / mask.numel()
    assert module.density() == pytest.approx(density)
    executed = module.executed_density()
    assert (executed.forward, executed.data_grad, executed.weight_grad) == pytest.approx(
        (density, density, density)
    )
    assert module.nnz() == int(mask.sum())
    assert {"weight", "bias", "mask", "row_ptr", "col_ind"} <= set(module.state_dict())


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({torch.float32: torch.int32, F64: torch.int64}[t.dtype])


def _spmm_then_reshape(module: PatternConv2d, x: torch.Tensor) -> torch.Tensor:
    """The composition the pattern conv computes: im2col, pattern_spmm, reshape, bias."""
    from impl.ops.pattern import im2col

    cols = im2col(x, module.kernel_size, module.stride, module.padding, module.dilation)
    index = module.index()
    values = pattern_csr(module.weight, index.row_ptr, index.col_ind)
    out = pattern_spmm(values, index.row_ptr, index.col_ind, cols, index=index)
    reach = module.dilation[0] * (module.kernel_size[0] - 1)
    ho = (x.shape[2] + 2 * module.padding[0] - reach - 1) // module.stride[0] + 1
    out = out.reshape(module.out_channels, x.shape[0], ho, -1).transpose(0, 1).contiguous()
    return out if module.bias is None else out + module.bias.view(1, -1, 1, 1)


@pytest.mark.parametrize(
    ("batch", "c_in", "c_out", "hw", "stride", "bias", "dtype"),
    [
        (4, 6, 5, 9, 1, True, torch.float32),
        (3, 8, 7, 11, 2, False, torch.float32),
        (5, 3, 4, 7, 1, True, F64),
        (1, 4, 6, 8, 1, False, torch.float32),  # batch 1: the product's reshape is a view
    ],
    ids=["f32-bias", "f32-stride2", "f64", "batch1"],
)
def test_pattern_conv2d_module_bit_equal_to_im2col_then_spmm(
    batch, c_in, c_out, hw, stride, bias, dtype
):
    # The module's reference path runs one fused autograd function with reused buffers: its
    # output and all gradients must be those of im2col -> pattern_spmm -> reshape, bit for
    # bit, and the output strides the same, step after step.
    gen = torch.Generator().manual_seed(batch + c_in)
    conv = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=bias).to(dtype)
    module = PatternConv2d.from_conv(conv, _random_mask(conv.weight.shape, 0.35, gen), "ref")
    params = [p for p in (module.weight, module.bias) if p is not None]
    for _ in range(3):
        x = torch.randn(batch, c_in, hw, hw, generator=gen, dtype=dtype, requires_grad=True)
        out = module(x)
        want = _spmm_then_reshape(module, x)
        g = torch.randn(out.shape, generator=gen, dtype=dtype)
        got_grads = torch.autograd.grad(out, [x, *params], g)
        want_grads = torch.autograd.grad(want, [x, *params], g)
        assert torch.equal(_bits(out), _bits(want)) and out.stride() == want.stride()
        for a, b in zip(got_grads, want_grads, strict=True):
            assert torch.equal(_bits(a), _bits(b)) and a.stride() == b.stride()


def test_pattern_conv2d_module_buffers_are_not_reused_while_a_graph_needs_them():
    # Two forwards before one backward (and a no-grad forward in between): the second must
    # not overwrite the first one's saved im2col matrix. Once a graph is gone its buffer is
    # reused (the point of keeping it).
    import copy

    gen = torch.Generator().manual_seed(12)
    conv = nn.Conv2d(4, 6, 3, padding=1, bias=False)
    module = PatternConv2d.from_conv(conv, _random_mask(conv.weight.shape, 0.4, gen))
    x1 = torch.randn(3, 4, 8, 8, generator=gen, requires_grad=True)
    x2 = torch.randn(3, 4, 8, 8, generator=gen, requires_grad=True)
    out1 = module(x1)
    with torch.no_grad():
        module(x2)
    out2 = module(x2)
    (out1.sum() + 2 * out2.square().sum()).backward()
    w1 = module.weight.detach().clone().requires_grad_(True)
    want = F.conv2d(x1.detach(), w1, padding=1).sum()
    want = want + 2 * F.conv2d(x2.detach(), w1, padding=1).square().sum()
    want.backward()
    mask = module.mask
    torch.testing.assert_close(module.weight.grad[mask], w1.grad[mask], rtol=1e-5, atol=1e-5)
    assert torch.count_nonzero(module.weight.grad[~mask]) == 0
    # graphs gone: the next forward writes into the buffer the last one used
    del out1, out2
    kept = module._workspace._cols
    module(x1).sum().backward()
    assert module._workspace._cols is kept
    # copies of the module start with an empty workspace
    twin = copy.deepcopy(module)
    assert twin._workspace._cols is None
    assert torch.equal(twin(x1.detach()), module(x1.detach()))


def test_spmm_into_a_buffer_equals_sparse_mm():
    from impl.ops.pattern import _spmm_2d

    gen = torch.Generator().manual_seed(13)
    for dtype in (torch.float32, F64):
        mask = _random_mask((7, 30), 0.3, gen)
        row_ptr, col_ind = pattern_positions(mask)
        values = torch.randn(col_ind.numel(), generator=gen, dtype=dtype)
        b = torch.randn(30, 101, generator=gen, dtype=dtype)
        buf = torch.full((7, 101), float("nan"), dtype=dtype)  # contents are ignored
        got = _spmm_2d(values, row_ptr, col_ind, (7, 30), b, out=buf)
        assert got.data_ptr() == buf.data_ptr()
        assert torch.equal(_bits(got), _bits(_spmm_2d(values, row_ptr, col_ind, (7, 30), b)))


def test_pattern_conv2d_module_rejects_groups():
    conv = nn.Conv2d(4, 4, 3, groups=2)
    with pytest.raises(ValueError, match="groups"):
        PatternConv2d.from_conv(conv, torch.ones_like(conv.weight, dtype=torch.bool))


def test_impl_cuda_raises_clear_error_and_unknown_impl_is_valueerror():
    mask = torch.ones(2, 3, dtype=torch.bool)
    row_ptr, col_ind = pattern_positions(mask)
    dense = torch.randn(2, 3)
    with pytest.raises(RuntimeError, match="CUDA kernels not available"):
        pattern_csr(dense, row_ptr, col_ind, impl="cuda")
    with pytest.raises(RuntimeError, match="CUDA kernels not available"):
        pattern_spmm(torch.ones(6), row_ptr, col_ind, torch.randn(3, 2), impl="cuda")
    with pytest.raises(ValueError, match="auto, ref, cuda"):
        pattern_csr(dense, row_ptr, col_ind, impl="fast")
    assert torch.equal(pattern_csr(dense, row_ptr, col_ind, impl="ref"), dense.flatten())


def test_bad_csr_inputs_raise_valueerror():
    mask = torch.ones(2, 3, dtype=torch.bool)
    row_ptr, col_ind = pattern_positions(mask)
    with pytest.raises(ValueError, match="entries"):
        pattern_csr(torch.randn(3, 3), row_ptr, col_ind)
    with pytest.raises(ValueError, match="row_ptr"):
        pattern_csr(torch.randn(2, 3), row_ptr, col_ind[:-1])
    with pytest.raises(ValueError, match="width"):
        pattern_csr(torch.randn(2, 2), row_ptr, col_ind)
    with pytest.raises(ValueError, match="rows of dense_b"):
        pattern_spmm(torch.ones(6), row_ptr, col_ind, torch.randn(2, 4))
    for values in (torch.ones(7), torch.ones(6, 1)):  # one value too many; a column of them
        with pytest.raises(ValueError, match=r"values \(.*\) must match col_ind \(6,\)"):
            pattern_spmm(values, row_ptr, col_ind, torch.randn(3, 4))
    with pytest.raises(ValueError, match="channels"):
        pattern_conv2d(torch.randn(1, 2, 5, 5), torch.randn(2, 3, 3, 3), torch.ones(2, 3, 3, 3))
    with pytest.raises(ValueError, match=r"\[B, C, H, W\]"):
        pattern_conv2d(torch.randn(2, 5, 5), torch.randn(2, 2, 3, 3), torch.ones(2, 2, 3, 3))
    with pytest.raises(ValueError, match="filter matrix"):  # a mask for 4 filters, weight has 2
        pattern_conv2d(torch.randn(1, 2, 5, 5), torch.randn(2, 2, 3, 3), torch.ones(4, 2, 3, 3))
    with pytest.raises(ValueError, match="smaller than the kernel"):
        pattern_conv2d(torch.randn(1, 2, 2, 2), torch.randn(2, 2, 3, 3), torch.ones(2, 2, 3, 3))


@pytest.mark.parametrize(
    ("hw", "kernel", "stride", "padding", "dilation"),
    [((32, 32), (3, 3), 1, 1, 1), ((7, 11), (3, 3), 2, 0, 1), ((13, 5), (3, 1), 1, 2, 2)],
    ids=["32px_same", "7x11_stride2", "13x5_dilated"],
)
def test_conv_output_size_is_torchs(hw, kernel, stride, padding, dilation):
    conv = nn.Conv2d(1, 1, kernel, stride=stride, padding=padding, dilation=dilation)
    want = conv(torch.zeros(1, 1, *hw)).shape[2:]
    got = conv_output_size(*hw, *kernel, (stride,) * 2, (padding,) * 2, (dilation,) * 2)
    assert got == tuple(want)


@pytest.mark.gpu
def test_pattern_conv2d_reference_on_gpu_matches_dense():
    gen = torch.Generator().manual_seed(11)
    mask = _random_mask((8, 5, 3, 3), 0.4, gen)
    weight = torch.randn(8, 5, 3, 3, generator=gen, dtype=F64)
    x = torch.randn(2, 5, 7, 7, generator=gen, dtype=F64)
    w1 = weight.cuda().requires_grad_(True)
    out = pattern_conv2d(x.cuda(), w1, pattern_index(mask.cuda()), padding=1, impl="ref")
    out.sum().backward()
    w2 = weight.clone().requires_grad_(True)
    ref = F.conv2d(x, w2 * mask, padding=1)
    ref.sum().backward()
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(w1.grad.cpu(), w2.grad * mask, rtol=1e-10, atol=1e-10)


class _Operand:
    """Stands in for a tensor in the dispatch rule: only ``is_cuda``, ``dtype`` and
    ``device`` are read."""

    def __init__(self, is_cuda: bool, dtype: torch.dtype = torch.float32, index: int = 0) -> None:
        self.is_cuda, self.dtype = is_cuda, dtype
        self.device = torch.device("cuda", index) if is_cuda else torch.device("cpu")


@pytest.mark.parametrize(
    "impl, operands, loads, expected",
    [
        ("auto", [_Operand(True), _Operand(True)], True, "cuda"),
        ("auto", [_Operand(True), _Operand(False)], True, "ref"),
        ("auto", [_Operand(True, torch.float16)], True, "ref"),
        ("auto", [_Operand(True)], False, "ref"),
        ("ref", [_Operand(True)], True, "ref"),
        ("cuda", [_Operand(True, torch.float64)], True, "cuda"),
        ("auto", [_Operand(True), _Operand(True, torch.float64)], True, "ref"),
    ],
    ids=[
        "auto-gpu",
        "auto-mixed",
        "auto-fp16",
        "auto-noload",
        "ref",
        "cuda-f64",
        "auto-two-dtypes",
    ],  # fmt: skip
)
def test_dispatch_rule_picks_cuda_only_where_it_runs(monkeypatch, impl, operands, loads, expected):
    from impl.ops import pattern as pattern_mod

    monkeypatch.setattr(pattern_mod, "has_cuda_kernels", lambda device=None: loads)
    assert pattern_mod._resolve_impl(impl, *operands) == expected


def test_dispatch_asks_whether_the_kernels_load_on_the_operands_gpu(monkeypatch):
    # It asked about the current GPU: on a machine of several GPUs, "auto" then took the
    # reference where the operands' GPU runs the kernels, or the kernels where it does not.
    from impl.ops import pattern as pattern_mod

    asked = []
    monkeypatch.setattr(
        pattern_mod, "has_cuda_kernels", lambda device=None: asked.append(device) or True
    )
    assert pattern_mod._resolve_impl("auto", _Operand(True, index=3), _Operand(True, index=3))
    assert asked == [torch.device("cuda", 3)]


def test_the_conv_dispatch_weighs_the_bias_too(monkeypatch):
    """A bias of another dtype than input and weight must send the conv to the reference
    (the kernels read the bias in the input's dtype)."""
    from impl.ops import pattern as pattern_mod

    seen = []

    def record(impl, *operands):
        seen.append(operands)
        return "ref"

    monkeypatch.setattr(pattern_mod, "resolve_conv_impl", record)
    x, w, b = torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3), torch.randn(3)
    pattern_mod.pattern_conv2d(x, w, torch.ones_like(w, dtype=torch.bool), b)
    assert len(seen) == 1 and seen[0][2] is b
    pattern_mod.pattern_conv2d(x, w, torch.ones_like(w, dtype=torch.bool))
    assert len(seen[1]) == 2  # no bias, nothing more to weigh


def test_forced_cuda_without_kernels_names_the_reason(monkeypatch):
    from impl.ops import pattern as pattern_mod

    monkeypatch.setattr(pattern_mod, "has_cuda_kernels", lambda device=None: False)
    with pytest.raises(RuntimeError, match="CUDA kernels not available"):
        pattern_mod._resolve_impl("cuda", _Operand(True))
    monkeypatch.setattr(pattern_mod, "has_cuda_kernels", lambda device=None: True)
    with pytest.raises(RuntimeError, match="not CUDA tensors of one dtype"):
        pattern_mod._resolve_impl("cuda", _Operand(True), _Operand(True, torch.float64))


# -- index validation of the reference path ---------------------------------------------------

I64 = torch.int64

# (row_ptr, col_ind, message) for a 3 x 7 matrix (odd sizes); each breaks one rule.
BAD_INDEX = [
    ([0, 1, 2, 3], [-1, 0, 1], r"col_ind must lie in \[0, 7\).*col_ind\[0\] = -1"),
    ([0, 1, 2, 3], [0, 7, 1], r"col_ind must lie in \[0, 7\).*col_ind\[1\] = 7"),
    ([0, 2, 2, 3], [4, 4, 0], r"strictly increase.*row 0 has col_ind\[1\] = 4 after"),
    ([0, 2, 3, 5], [1, 0, 6, 3, 2], r"strictly increase.*row 0 has col_ind\[1\] = 0"),
    ([0, 1, 2, 5], [6, 0, 1, 5, 3], r"strictly increase.*row 2 has col_ind\[4\] = 3"),
    ([0, 2, 1, 3], [0, 1, 2], r"non-decreasing.*row_ptr\[1\] = 2 > row_ptr\[2\] = 1"),
    ([1, 1, 2, 3], [0, 1, 2], r"row_ptr\[0\] must be 0, got 1"),
    ([0, 1, 2, 4], [0, 1, 2], r"row_ptr\[-1\] = 4 must equal the number of entries"),
    ([0, 1, 2, 2], [0, 1, 2], r"row_ptr\[-1\] = 2 must equal the number of entries"),
    ([0, 0, 1, 3], [5, 3, 3], r"strictly increase.*row 2 has col_ind\[2\] = 3 after"),
]
BAD_IDS = [
    "negative-col",
    "col-equals-width",
    "duplicate-col",
    "unsorted-row0",
    "unsorted-last-row",
    "decreasing-row-ptr",
    "row-ptr-not-from-0",
    "row-ptr-past-nnz",
    "row-ptr-short-of-nnz",
    "duplicate-at-the-end-after-an-empty-first-row",
]


@pytest.mark.parametrize("impl", ["ref", "auto"], ids=["ref", "auto-on-cpu"])
@pytest.mark.parametrize(("row_ptr", "col_ind", "message"), BAD_INDEX, ids=BAD_IDS)
def test_reference_path_refuses_bad_index_contents(row_ptr, col_ind, message, impl):
    rp, ci = torch.tensor(row_ptr, dtype=I64), torch.tensor(col_ind, dtype=I64)
    with pytest.raises(ValueError, match=message):
        pattern_csr(torch.randn(3, 7), rp, ci, impl=impl)
    width = message.replace("the matrix's width", "the rows of dense_b")
    with pytest.raises(ValueError, match=width):
        pattern_spmm(torch.ones(ci.numel()), rp, ci, torch.randn(7, 5), impl=impl)
    with pytest.raises(ValueError, match=message):
        csr_transpose(rp, ci, 7)
    with pytest.raises(ValueError, match=message):
        check_csr(rp, ci, 3, 7)


@pytest.mark.parametrize(("row_ptr", "col_ind", "message"), BAD_INDEX, ids=BAD_IDS)
def test_pattern_conv2d_refuses_a_bad_pattern_index(row_ptr, col_ind, message):
    weight = torch.randn(3, 1, 1, 7)  # K = C*R*S = 7, as the cases above
    rp, ci = torch.tensor(row_ptr, dtype=I64), torch.tensor(col_ind, dtype=I64)
    empty = torch.zeros(0, dtype=I64)
    index = PatternIndex(rp, ci, torch.zeros(8, dtype=I64), empty, empty, (3, 7))
    message = message.replace("0, 7\\)", "0, 7\\) \\(C\\*R\\*S\\)")  # names K
    with pytest.raises(ValueError, match=message):
        pattern_conv2d(torch.randn(2, 1, 5, 9), weight, index, impl="ref")


@pytest.mark.parametrize(
    ("row_ptr", "col_ind", "message"),
    [
        (torch.tensor([0.0, 1.0, 2.0, 3.0]), torch.tensor([0, 1, 2]), "row_ptr must be an int64"),
        (torch.tensor([0, 1, 2, 3]), torch.tensor([0, 1, 2], dtype=torch.int32), "col_ind must"),
        (torch.tensor([0, 1, 2, 3]), torch.tensor([0.0, 1.0, 2.0]), "col_ind must be an int64"),
        (torch.tensor([[0, 1, 2, 3]]), torch.tensor([0, 1, 2]), "row_ptr must be 1-D"),
        (torch.tensor([0, 1, 3]), torch.tensor([0, 1, 2]), r"row_ptr must have 4 entries"),
        ([0, 1, 2, 3], torch.tensor([0, 1, 2]), "row_ptr must be a 1-D int64 tensor, got list"),
    ],
    ids=["float-row-ptr", "int32-col-ind", "float-col-ind", "2d-row-ptr", "short-row-ptr", "list"],
)
def test_reference_path_refuses_bad_index_types(row_ptr, col_ind, message):
    with pytest.raises(ValueError, match=message):
        pattern_csr(torch.randn(3, 7), row_ptr, col_ind, impl="ref")


@pytest.mark.parametrize(
    ("shape", "density"),
    [((1, 1), 1.0), ((5, 7), 0.4), ((13, 29), 0.0), ((16, 144), 0.1), ((3, 97), 1.0)],
    ids=["1x1", "5x7", "13x29-empty", "16x144", "3x97-dense"],
)
def test_check_csr_accepts_every_structure_pattern_positions_builds(shape, density):
    gen = torch.Generator().manual_seed(sum(shape))
    mask = _random_mask(shape, density, gen)
    mask[0, -1] = density > 0  # the last column of the first row: the range's edge
    row_ptr, col_ind = pattern_positions(mask)
    check_csr(row_ptr, col_ind, shape[0], shape[1])
    dense = torch.randn(shape, dtype=F64, generator=gen)
    assert torch.equal(pattern_csr(dense, row_ptr, col_ind, impl="ref"), dense[mask])


def test_pattern_conv2d_module_checks_its_structure_once_and_again_after_a_write(monkeypatch):
    import impl.ops.pattern as pattern_mod

    calls = []
    real = pattern_mod.check_csr
    monkeypatch.setattr(pattern_mod, "check_csr", lambda *a, **k: calls.append(1) or real(*a, **k))
    gen = torch.Generator().manual_seed(5)
    conv = nn.Conv2d(3, 5, 3, padding=1).double()
    layer = PatternConv2d.from_conv(conv, _random_mask(conv.weight.shape, 0.5, gen), impl="ref")
    x = torch.randn(2, 3, 7, 7, dtype=F64, generator=gen)
    layer(x)
    layer(x)
    assert len(calls) == 1
    with torch.no_grad():
        layer.col_ind[0] = -1  # an in-place write: the structure is checked again
    with pytest.raises(ValueError, match=r"col_ind must lie in \[0, 27\) \(C\*R\*S\)"):
        layer(x)
    assert len(calls) == 2


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
def test_pattern_spmm_without_an_index_builds_the_transpose_only_for_the_input_gradient(
    monkeypatch,
):
    """Without an index, the transpose is built in the backward and only there: a forward, or
    a backward asking for the values' gradient alone, builds none (it cost 2.5 ms of a 10-ms
    call at 256 x 1152 x 1024 on the 2-core machine), and the gradients equal the index's."""
    import impl.ops.pattern as pattern_mod

    built = []
    transpose = pattern_mod._transpose
    monkeypatch.setattr(pattern_mod, "_transpose", lambda *a: built.append(1) or transpose(*a))
    gen = torch.Generator().manual_seed(8)
    mask = _random_mask((9, 21), 0.4, gen)
    idx = pattern_index(mask)
    built.clear()
    vals = torch.randn(idx.col_ind.numel(), generator=gen, dtype=F64)
    b = torch.randn(3, 21, 5, generator=gen, dtype=F64)
    out = pattern_spmm(vals, idx.row_ptr, idx.col_ind, b)
    assert built == []
    v = vals.clone().requires_grad_(True)
    pattern_spmm(v, idx.row_ptr, idx.col_ind, b).sum().backward()
    assert built == []
    bb = b.clone().requires_grad_(True)
    g = torch.randn(out.shape, generator=gen, dtype=F64)
    got = torch.autograd.grad(pattern_spmm(v, idx.row_ptr, idx.col_ind, bb), (v, bb), g)
    assert built == [1]
    want = torch.autograd.grad(pattern_spmm(v, idx.row_ptr, idx.col_ind, bb, index=idx), (v, bb), g)
    assert built == [1]
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    dense = torch.zeros(9, 21, dtype=F64).index_put_(
        (csr_rows(idx.row_ptr, idx.col_ind.numel()), idx.col_ind), vals
    )
    assert torch.allclose(got[1], torch.einsum("fk,bfn->bkn", dense, g))


def test_csr_rows_with_its_size_given_reads_no_row_pointer():
    """``csr_rows(row_ptr, nnz)`` equals ``csr_rows(row_ptr)``; with ``nnz`` the result is
    sized without reading ``row_ptr`` (a meta tensor has no contents to read)."""
    row_ptr = torch.tensor([0, 2, 2, 5, 6])
    assert torch.equal(csr_rows(row_ptr, 6), torch.tensor([0, 0, 2, 2, 2, 3]))
    assert torch.equal(csr_rows(row_ptr), csr_rows(row_ptr, 6))
    assert csr_rows(row_ptr.to("meta"), 6).shape == (6,)
    with pytest.raises(RuntimeError):
        csr_rows(row_ptr.to("meta"))


def test_cuda_path_reads_no_index_contents(monkeypatch):
    """impl="cuda" hands the index to the kernels unchecked (a check would sync with the GPU)."""
    import impl.ops.pattern as pattern_mod
    import impl.ops.pattern_cuda as pattern_cuda

    def refuse(*args, **kwargs):
        raise AssertionError("check_csr called on the CUDA path")

    monkeypatch.setattr(pattern_mod, "check_csr", refuse)
    got = {}
    monkeypatch.setattr(pattern_mod, "_resolve_impl", lambda impl, *t: "cuda")
    monkeypatch.setattr(
        pattern_cuda, "pattern_csr_cuda", lambda d, rp, ci: got.setdefault("csr", ci)
    )
    bad = torch.tensor([-1, 0, 1])
    assert pattern_csr(torch.randn(3, 4), torch.tensor([0, 1, 2, 3]), bad, impl="cuda") is bad
    # The SpMM's transpose is built without the check (here the op then refuses CPU tensors).
    with pytest.raises(RuntimeError, match="needs CUDA tensors"):
        pattern_cuda.pattern_spmm_cuda(
            torch.ones(2), torch.tensor([0, 1, 2]), torch.tensor([1, 0]), torch.randn(3, 4)
        )


def test_the_on_a_cpu_examples_of_docs_kernels_run(capsys):
    """Every ``python`` block of docs/kernels.md's "On a CPU" section runs as printed."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "kernels.md").read_text()
    section = text.split("## On a CPU\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 4  # pattern_csr + pattern_spmm, conv, nm_prune, pack/unpack
    for number, code in enumerate(blocks, 1):
        exec(compile(code, f"docs/kernels.md (On a CPU, block {number})", "exec"), {})
    assert "col_ind must lie in [0, 7) (the matrix's width); col_ind[0] = 7" in (
        capsys.readouterr().out
    )


def test_check_csr_reads_no_contents_off_the_cpu():
    # On a GPU the contents would be copied to the host on every call (a stall that a
    # benchmark of the reference path would time); elsewhere only dtypes and lengths count.
    # Meta tensors stand in for device tensors: they have no contents to read at all.
    bad_cols = torch.tensor([5, 0])  # out of range and unsorted: refused on the CPU
    ptr = torch.tensor([0, 2])
    with pytest.raises(ValueError, match="col_ind must lie in"):
        check_csr(ptr, bad_cols, 1, 4)
    check_csr(ptr.to("meta"), bad_cols.to("meta"), 1, 4)  # no contents read, no error
    with pytest.raises(ValueError, match="row_ptr must have 3 entries"):
        check_csr(ptr.to("meta"), bad_cols.to("meta"), 2, 4)  # lengths still count
    with pytest.raises(ValueError, match="int64"):
        check_csr(ptr.to("meta", torch.int32), bad_cols.to("meta"), 1, 4)
    with pytest.raises(ValueError, match="col_ind must lie in"):
        check_csr(ptr, bad_cols, 1, 4, contents=True)


def test_a_kernel_the_size_of_the_input_gives_one_output_pixel_and_one_less_is_refused():
    gen = torch.Generator().manual_seed(12)
    mask = _random_mask((4, 2, 3, 3), 0.5, gen)
    weight = torch.randn(4, 2, 3, 3, generator=gen, dtype=F64)
    x = torch.randn(2, 2, 3, 3, generator=gen, dtype=F64)
    out = pattern_conv2d(x, weight, mask, impl="ref")  # stride 1, no padding: the defaults
    assert out.shape == (2, 4, 1, 1)
    torch.testing.assert_close(out, F.conv2d(x, weight * mask), rtol=1e-12, atol=1e-12)
    assert torch.equal(im2col(x, (3, 3)), F.unfold(x, (3, 3)).transpose(0, 1).reshape(18, 2))
    with pytest.raises(ValueError, match="smaller than the kernel"):
        pattern_conv2d(x[:, :, :2], weight, mask, impl="ref")
    with pytest.raises(ValueError, match="smaller than the kernel"):
        im2col(x[:, :, :, :2], (3, 3))


def test_pattern_conv2d_module_defaults_are_a_plain_conv():
    gen = torch.Generator().manual_seed(13)
    weight = nn.Parameter(torch.randn(3, 2, 3, 3, generator=gen, dtype=F64))
    mask = _random_mask(weight.shape, 0.5, gen)
    x = torch.randn(1, 2, 5, 6, generator=gen, dtype=F64)
    module = PatternConv2d(weight, mask, impl="ref")
    assert (module.stride, module.padding, module.dilation) == ((1, 1), (0, 0), (1, 1))
    torch.testing.assert_close(module(x), F.conv2d(x, weight * mask), rtol=1e-12, atol=1e-12)


def test_check_csr_of_no_rows():
    empty = torch.zeros(0, dtype=torch.long)
    check_csr(torch.zeros(1, dtype=torch.long), empty, 0, 5)  # 0 rows: row_ptr = [0]
    with pytest.raises(ValueError, match="rows \\+ 1 >= 1 entries, got 0"):
        check_csr(empty, empty, None, 5)


def test_check_csr_accepts_empty_rows_first_and_last():
    # Rows 0 and 3 empty (a start of 0 and a start equal to nnz): nothing to compare there.
    check_csr(torch.tensor([0, 0, 2, 3, 3], dtype=I64), torch.tensor([1, 4, 4], dtype=I64), 4, 7)


@pytest.mark.parametrize("path", ["ref", "cuda-argument-checks"])
@pytest.mark.parametrize(
    "mismatch", ["other-structure", "other-length", "other-width"], ids=lambda s: s
)
def test_pattern_spmm_refuses_an_index_of_another_structure(path, mismatch):
    # The product is taken with the index's structure and the gradients with its transpose:
    # an index built for another (row_ptr, col_ind) would give a wrong product silently.
    import impl.ops.pattern_cuda as pattern_cuda

    gen = torch.Generator().manual_seed(8)
    mask = _random_mask((4, 9), 0.5, gen)
    row_ptr, col_ind = pattern_positions(mask)
    other = mask.clone()
    if mismatch == "other-structure":  # same number of entries, one moved
        (r, c) = next((r, c) for r in range(4) for c in range(9) if mask[r, c] and not mask[r, -1])
        other[r, c], other[r, -1] = False, True
    elif mismatch == "other-length":
        other[0] = ~other[0]
    index = pattern_index(other)
    width = 10 if mismatch == "other-width" else 9
    values = torch.randn(col_ind.numel(), generator=gen)
    b = torch.randn(width, 3, generator=gen)
    message = "index is for a" if mismatch == "other-width" else "index.(row_ptr|col_ind) differs"
    if path == "ref":
        with pytest.raises(ValueError, match=message):
            pattern_spmm(values, row_ptr, col_ind, b, impl="ref", index=index)
    else:  # the CUDA path checks before it reaches a kernel
        with pytest.raises(ValueError, match=message):
            pattern_cuda.pattern_spmm_cuda(values, row_ptr, col_ind, b, index=index)
    # The index of this very structure passes, as its own tensors or as equal copies.
    own = pattern_index(mask)
    if path == "ref" and mismatch == "other-structure":
        want = (values.new_zeros(4, 9).index_put_((csr_rows(row_ptr), col_ind), values)) @ b[:9]
        for rp, ci in ((own.row_ptr, own.col_ind), (row_ptr.clone(), col_ind.clone())):
            got = pattern_spmm(values, rp, ci, b[:9], impl="ref", index=own)
            torch.testing.assert_close(got, want)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"stride": 0}, r"stride must be at least 1 in both dims, got \(0, 0\)"),
        ({"stride": (1, 0)}, r"stride must be at least 1 in both dims, got \(1, 0\)"),
        ({"padding": -1}, r"padding must be at least 0 in both dims, got \(-1, -1\)"),
        ({"dilation": 0}, r"dilation must be at least 1 in both dims, got \(0, 0\)"),
        ({"padding": "same"}, "padding must be an int or two ints, got 'same'"),
        ({"stride": (1, 2, 3)}, r"stride must be an int or two ints, got \(1, 2, 3\)"),
        ({"dilation": 1.5}, "dilation must be an int or two ints, got 1.5"),
        ({"stride": True}, "stride must be an int or two ints, got True"),
    ],
    ids=["stride-0", "stride-pair-0", "padding-neg", "dilation-0", "padding-same",
         "three-strides", "float-dilation", "bool-stride"],
)  # fmt: skip
def test_pattern_conv2d_refuses_the_geometry_conv2d_refuses(kwargs, message):
    # conv2d refuses these (or, for strings, computes "same" padding, which the pattern conv
    # does not): the pattern conv must not return a tensor or fail with a bare arithmetic error.
    gen = torch.Generator().manual_seed(2)
    weight = torch.randn(4, 3, 3, 3, generator=gen)
    mask = _random_mask(weight.shape, 0.5, gen)
    x = torch.randn(2, 3, 8, 8, generator=gen)
    for call in (
        lambda: pattern_conv2d(x, weight, mask, impl="ref", **kwargs),
        lambda: PatternConv2d(weight, mask, **kwargs),
    ):
        with pytest.raises(ValueError, match=message):
            call()
    # numpy and torch integers are integers; the result is conv2d's.
    got = pattern_conv2d(x, weight, mask, stride=np.int64(2), padding=(torch.tensor(1), 1))
    torch.testing.assert_close(got, F.conv2d(x, weight * mask, stride=2, padding=1))


@pytest.mark.parametrize("shape", [(3,), (4, 1), (1,)], ids=str)
def test_pattern_conv2d_refuses_a_bias_conv2d_refuses(shape):
    """A bias of another shape was broadcast into the output ([4, 1]: silently)."""
    gen, weight, mask, x = _conv_case(size=6)
    with pytest.raises(ValueError, match=r"bias must be \[F\] = \(4,\)"):
        pattern_conv2d(x, weight, mask, torch.randn(shape, generator=gen))


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int64, torch.bool], ids=str)
def test_integer_operands_are_refused_not_rounded(dtype):
    # conv2d refuses an integer input; the pattern ops computed in float32 and cast the
    # result back into the integer dtype (wrapped uint8 values, truncated int64 ones)
    gen, weight, mask, x = _conv_case(size=5, batch=1)
    with pytest.raises(ValueError, match=rf"x \({dtype}\)"):
        pattern_conv2d(x.to(dtype), weight, mask)
    with pytest.raises(ValueError, match="bias"):
        pattern_conv2d(x, weight, mask, bias=torch.zeros(4, dtype=dtype))
    flat = mask.reshape(4, -1)
    row_ptr, col_ind = pattern_positions(flat)
    values = weight.reshape(4, -1)[flat]
    with pytest.raises(ValueError, match=rf"dense_b \({dtype}\)"):
        pattern_spmm(values, row_ptr, col_ind, torch.ones(27, 2, dtype=dtype))


def test_empty_filters_and_an_empty_batch_give_empty_results_not_reshape_errors():
    row_ptr, col_ind = pattern_positions(torch.ones(0, 27))
    assert row_ptr.tolist() == [0] and col_ind.numel() == 0
    row_ptr, col_ind = pattern_positions(torch.ones(4, 27))
    values = torch.randn(108, requires_grad=True)
    b = torch.randn(0, 27, 5, requires_grad=True)
    out = pattern_spmm(values, row_ptr, col_ind, b)
    assert out.shape == (0, 4, 5)
    out.sum().backward()
    assert b.grad.shape == (0, 27, 5) and not values.grad.any()


def test_meta_operands_give_the_results_shape():
    """Shape inference on the meta device ran into autocast's 'unknown device type'."""
    gen = torch.Generator().manual_seed(4)
    weight = torch.randn(4, 3, 3, 3, generator=gen)
    mask = _random_mask(weight.shape, 0.5, gen)
    x, bias = torch.randn(2, 3, 8, 8, generator=gen), torch.randn(4, generator=gen)
    want = F.conv2d(x, weight, bias, stride=2, padding=1).shape
    got = pattern_conv2d(x.to("meta"), weight.to("meta"), mask.to("meta"), bias.to("meta"),
                         stride=2, padding=1)  # fmt: skip
    assert got.device.type == "meta" and got.shape == want
    module = PatternConv2d(nn.Parameter(weight.clone()), mask, padding=1).to("meta")
    assert module(x.to("meta")).shape == (2, 4, 8, 8)
    with pytest.raises(ValueError, match="channels"):
        pattern_conv2d(torch.randn(2, 5, 8, 8, device="meta"), weight.to("meta"), mask)
    idx = pattern_index(mask.reshape(4, 27))
    vals = torch.randn(idx.col_ind.numel(), generator=gen)
    for b, shape in (((27, 10), (4, 10)), ((3, 27, 10), (3, 4, 10))):
        out = pattern_spmm(vals.to("meta"), idx.row_ptr, idx.col_ind, torch.empty(b, device="meta"))
        assert out.device.type == "meta" and out.shape == shape


def test_a_one_dim_mask_is_refused():
    # a mask is [F, K] or [F, C, R, S]: a vector names no filters
    with pytest.raises(ValueError, match="got 1 dims"):
        pattern_positions(torch.ones(4))


def test_check_csr_refuses_a_row_pointer_that_starts_below_zero():
    # [-1, 0, 1] ends at nnz = 1 and never decreases, but claims 2 entries in 2 rows
    with pytest.raises(ValueError, match=r"row_ptr\[0\] must be 0, got -1"):
        check_csr(torch.tensor([-1, 0, 1]), torch.tensor([0]), 2, 4)


def test_check_csr_reads_no_contents_unless_both_indices_are_on_the_cpu():
    # one index off the CPU (meta standing in for a GPU): no contents are read, as the
    # docstring says; bad contents pass unnoticed and no copy to the host is tried
    ptr, bad_cols = torch.tensor([0, 2]), torch.tensor([5, 0])
    check_csr(ptr, bad_cols.to("meta"), 1, 4)
    check_csr(ptr.to("meta"), bad_cols, 1, 4)


@pytest.mark.parametrize("needs", ["values", "dense_b"])
def test_pattern_spmm_gives_each_operand_its_gradient_alone(needs):
    """Only one operand requires a gradient: it gets the dense product's, sampled at the
    stored positions for ``values`` (the SDDMM), ``A^T @ grad`` for ``dense_b``."""
    gen = torch.Generator().manual_seed(13)
    mask = _random_mask((6, 9), 0.4, gen)
    dense = torch.randn(6, 9, generator=gen, dtype=F64) * mask
    b = torch.randn(9, 4, generator=gen, dtype=F64)
    grad_out = torch.randn(6, 4, generator=gen, dtype=F64)
    row_ptr, col_ind = pattern_positions(mask)
    values = pattern_csr(dense, row_ptr, col_ind).requires_grad_(needs == "values")
    b1 = b.clone().requires_grad_(needs == "dense_b")
    pattern_spmm(values, row_ptr, col_ind, b1, impl="ref").backward(grad_out)
    if needs == "values":
        assert b1.grad is None
        torch.testing.assert_close(values.grad, (grad_out @ b.T)[mask], rtol=1e-12, atol=1e-12)
    else:
        assert values.grad is None
        torch.testing.assert_close(b1.grad, dense.T @ grad_out, rtol=1e-12, atol=1e-12)


def test_pattern_conv2d_with_unequal_dilations_matches_conv2d():
    # dilation 1 down the rows and 2 across the columns: each dimension its own reach
    gen = torch.Generator().manual_seed(14)
    mask = _random_mask((4, 3, 3, 3), 0.5, gen)
    weight = torch.randn(4, 3, 3, 3, generator=gen, dtype=F64)
    x = torch.randn(2, 3, 7, 9, generator=gen, dtype=F64)
    x1, x2 = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    out1 = pattern_conv2d(x1, weight, mask, dilation=(1, 2), impl="ref")
    out2 = F.conv2d(x2, weight * mask, dilation=(1, 2))
    assert out1.shape == out2.shape == (2, 4, 5, 5)
    torch.testing.assert_close(out1, out2, rtol=1e-12, atol=1e-12)
    grad_out = torch.randn(out2.shape, generator=gen, dtype=F64)
    out1.backward(grad_out)
    out2.backward(grad_out)
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-12, atol=1e-12)


def test_im2col_with_unequal_paddings_is_unfold():
    # padding 0 down the rows and 1 across the columns: 5 x 8 outputs of a 3x3 kernel on 7x6
    x = torch.randn(2, 3, 7, 6, dtype=F64)
    cols = im2col(x, (3, 3), padding=(0, 1))
    want = F.unfold(x, (3, 3), padding=(0, 1)).permute(1, 0, 2).reshape(27, 2 * 5 * 6)
    assert torch.equal(cols, want)


def test_an_input_narrower_than_the_kernel_is_refused():
    # tall enough (3 rows for 3) but 2 columns wide for a 3-column kernel
    weight, mask = torch.randn(4, 2, 3, 3), torch.ones(4, 2, 3, 3)
    with pytest.raises(ValueError, match="smaller than the kernel"):
        pattern_conv2d(torch.randn(2, 2, 3, 2), weight, mask, impl="ref")


@pytest.mark.parametrize(("batch", "filters"), [(1, 4), (3, 1)], ids=["batch1", "filter1"])
def test_the_result_of_a_pattern_conv_can_be_edited_in_place(batch, filters):
    """A batch or a filter count of 1 makes the product's reshape a view: the result is a
    tensor of its own all the same, so an in-place ReLU is allowed and its gradient right."""
    gen = torch.Generator().manual_seed(15)
    weight = torch.randn(filters, 2, 3, 3, generator=gen, dtype=F64)
    mask = _random_mask(weight.shape, 0.5, gen)
    x = torch.randn(batch, 2, 5, 5, generator=gen, dtype=F64)
    x1, x2 = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    out1 = pattern_conv2d(x1, weight, mask, padding=1, impl="ref").relu_()
    out2 = F.conv2d(x2, weight * mask, padding=1).relu_()
    torch.testing.assert_close(out1, out2, rtol=1e-12, atol=1e-12)
    out1.sum().backward()
    out2.sum().backward()
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-12, atol=1e-12)


def test_pattern_conv2d_module_keeps_every_nonzero_position_of_a_valued_mask():
    # a mask given by values (negative ones too): nonzero = kept, as pattern_positions reads it
    gen = torch.Generator().manual_seed(16)
    weight = torch.randn(3, 2, 3, 3, generator=gen, dtype=F64)
    mask = torch.randn(3, 2, 3, 3, generator=gen, dtype=F64) * _random_mask(weight.shape, 0.6, gen)
    kept = mask != 0
    module = PatternConv2d(nn.Parameter(weight.clone()), mask, padding=1)
    assert torch.equal(module.mask, kept)
    assert torch.equal(module.weight.detach(), weight * kept)
    x = torch.randn(2, 2, 5, 5, generator=gen, dtype=F64)
    expected = F.conv2d(x, weight * kept, padding=1)
    torch.testing.assert_close(module(x), expected, rtol=1e-12, atol=1e-12)
