"""Tests of ``impl.ops.nm.nm_prune`` against a plainly written reference (Python loops)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from torch import nn

from impl.methods.sdgp import SDGP, SDGPConfig, SDGPConv2d, data_grad_density
from impl.ops import nm_cpu
from impl.ops.nm import nm_keep_mask, nm_prune, nm_prune_ref

EPS = 1e-4


# ---------------------------------------------------------------------------------------------
# the independent reference: loops over every group, no vectorisation, no torch.sort
# ---------------------------------------------------------------------------------------------
def loop_keep(x: torch.Tensor, n: int, m: int) -> torch.Tensor:
    """Mask of NCHW ``x``: in every run of m channels at one (b, h, w) keep the n largest |x|.

    Ties go to the lower channel; a partial last group of r channels keeps min(n, r).
    """
    vals = x.tolist()
    nb, nc, nh, nw = x.shape
    keep = [[[[False] * nw for _ in range(nh)] for _ in range(nc)] for _ in range(nb)]
    for b in range(nb):
        for h in range(nh):
            for w in range(nw):
                for start in range(0, nc, m):
                    chans = list(range(start, min(start + m, nc)))
                    ranked = sorted(chans, key=lambda c: (-abs(vals[b][c][h][w]), c))  # noqa: B023
                    for c in ranked[:n]:
                        keep[b][c][h][w] = True
    return torch.tensor(keep)


def loop_rescale(x: torch.Tensor, y: torch.Tensor, rule: str, eps: float = EPS) -> torch.Tensor:
    """Rescale the pruned NCHW ``y`` so its L1 norm matches x's, per plane or per channel."""
    out = y.clone()
    nb, nc = x.shape[:2]
    if rule == "plane":
        for b in range(nb):
            for c in range(nc):
                sx = sum(abs(v) for v in x[b, c].flatten().tolist())
                sy = sum(abs(v) for v in y[b, c].flatten().tolist())
                out[b, c] = y[b, c] * (sx / (sy + eps))
    else:
        for c in range(nc):
            sx = sum(abs(v) for v in x[:, c].flatten().tolist())
            sy = sum(abs(v) for v in y[:, c].flatten().tolist())
            out[:, c] = y[:, c] * (sx / (sy + eps))
    return out


def loop_prune(x: torch.Tensor, n: int, m: int, method: str, rescale: str = "plane"):
    y = torch.where(loop_keep(x, n, m), x, torch.zeros((), dtype=x.dtype))
    if method == "rescaled":
        y = loop_rescale(x, y, rescale)
    return y


SHAPE_CASES = [
    ((3, 12, 5, 7), 2, 4),
    ((3, 12, 5, 7), 2, 6),
    ((3, 12, 5, 7), 3, 6),
    ((2, 16, 3, 5), 2, 8),
    ((2, 32, 3, 3), 4, 32),
    ((2, 16, 3, 5), 1, 16),
    ((2, 13, 3, 5), 2, 4),  # partial last group of 1 channel: keeps min(2, 1) = 1
    ((2, 10, 3, 5), 3, 4),  # partial last group of 2 channels: keeps 2
    ((1, 7, 2, 3), 1, 4),
    ((2, 5, 2, 2), 2, 32),  # one partial group only
]
SHAPE_IDS = [f"{'x'.join(map(str, s))}-{n}of{m}" for s, n, m in SHAPE_CASES]


@pytest.mark.parametrize(("shape", "n", "m"), SHAPE_CASES, ids=SHAPE_IDS)
def test_magnitude_kept_set_matches_loop_reference(shape, n, m):
    x = torch.randn(shape)
    got = nm_prune(x, n, m, "magnitude")
    want = loop_prune(x, n, m, "magnitude")
    assert torch.equal(got, want)
    # at most n nonzeros in every group of m channels
    nc = shape[1]
    for start in range(0, nc, m):
        count = (got[:, start : start + m] != 0).sum(dim=1)
        assert int(count.max()) == min(n, min(start + m, nc) - start)


@pytest.mark.parametrize(("shape", "n", "m"), SHAPE_CASES, ids=SHAPE_IDS)
@pytest.mark.parametrize("rule", ["plane", "channel"], ids=["plane", "channel"])
def test_rescaled_matches_loop_reference(shape, n, m, rule):
    x = torch.randn(shape, dtype=torch.float64)
    got = nm_prune(x, n, m, "rescaled", rescale=rule)
    want = loop_prune(x, n, m, "rescaled", rule)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)
    # the float32 path agrees with the float64 loop to float32 accuracy
    got32 = nm_prune(x.float(), n, m, "rescaled", rescale=rule)
    torch.testing.assert_close(got32.double(), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("n", "m"),
    [(2, 4), (2, 8), (4, 32), (1, 16), (3, 6)],
    ids=["2of4", "2of8", "4of32", "1of16", "3of6"],
)
def test_plane_rescale_l1_identity(n, m):
    # Authors' rule: per (sample, channel) plane, sum|y| = sum|x| * S / (S + 1e-4), S = the
    # magnitude-pruned plane's L1; with eps = 0 the L1 norm is preserved exactly.
    x = torch.randn(3, 32, 5, 7, dtype=torch.float64)
    mag = nm_prune(x, n, m, "magnitude")
    s = mag.abs().sum(dim=(2, 3))
    y = nm_prune(x, n, m, "rescaled", rescale="plane")
    lhs = y.abs().sum(dim=(2, 3))
    torch.testing.assert_close(lhs, x.abs().sum(dim=(2, 3)) * s / (s + EPS), rtol=1e-12, atol=0)
    y0 = nm_prune(x, n, m, "rescaled", rescale="plane", eps=0.0)
    # (a plane where nothing was kept stays zero rather than 0/0)
    want0 = torch.where(s > 0, x.abs().sum(dim=(2, 3)), torch.zeros(()).double())
    torch.testing.assert_close(y0.abs().sum(dim=(2, 3)), want0)
    assert not torch.isnan(y0).any()
    # kept positions are exactly those of magnitude pruning
    assert torch.equal(y != 0, mag != 0)


@pytest.mark.parametrize(
    ("n", "m"), [(2, 4), (2, 8), (4, 32), (1, 16)], ids=["2of4", "2of8", "4of32", "1of16"]
)
def test_channel_rescale_l1_identity(n, m):
    # Paper text: per channel over batch and spatial dims.
    x = torch.randn(3, 32, 5, 7, dtype=torch.float64)
    mag = nm_prune(x, n, m, "magnitude")
    s = mag.abs().sum(dim=(0, 2, 3))
    y = nm_prune(x, n, m, "rescaled", rescale="channel")
    want = x.abs().sum(dim=(0, 2, 3)) * s / (s + EPS)
    torch.testing.assert_close(y.abs().sum(dim=(0, 2, 3)), want, rtol=1e-12, atol=0)
    # and the per-plane L1 is NOT preserved by the channel rule (the two rules differ)
    assert not torch.allclose(y.abs().sum(dim=(2, 3)), x.abs().sum(dim=(2, 3)), rtol=1e-3)


def test_paper_example_group():
    # Sec. III-B: [1, 7, -3, 2] with n=2 becomes [0, 7, -3, 0].
    x = torch.tensor([[1.0, 7.0, -3.0, 2.0]])
    assert torch.equal(nm_prune(x, 2, 4, "magnitude", dim=1), torch.tensor([[0.0, 7.0, -3.0, 0.0]]))


@pytest.mark.parametrize(
    ("values", "n", "kept"),
    [
        ([1.0, 1.0, 1.0, 1.0], 2, [0, 1]),
        ([1.0, 2.0, -2.0, 1.0], 1, [1]),
        ([-3.0, 3.0, 3.0, -3.0], 3, [0, 1, 2]),
        ([0.5, 2.0, 0.5, 0.5], 2, [1, 0]),
        ([0.0, -0.0, 0.0, 0.0], 2, [0, 1]),
    ],
    ids=["all-equal", "pair-tie", "sign-tie", "tie-after-max", "zeros"],
)
def test_ties_keep_lowest_index(values, n, kept):
    x = torch.tensor(values)
    mask = nm_keep_mask(x.abs(), n, 4, dim=0)
    assert sorted(torch.nonzero(mask).flatten().tolist()) == sorted(kept)
    y = nm_prune(x, n, 4, "magnitude", dim=0)
    assert torch.equal(y != 0, mask & (x != 0))


@pytest.mark.parametrize(
    "method", ["random", "magnitude", "rescaled"], ids=["random", "magnitude", "rescaled"]
)
@pytest.mark.parametrize("rule", ["plane", "channel"], ids=["plane", "channel"])
def test_channels_last_equals_nchw(method, rule):
    x = torch.randn(3, 24, 5, 7)
    xl = x.contiguous(memory_format=torch.channels_last)
    g1 = torch.Generator().manual_seed(11)
    g2 = torch.Generator().manual_seed(11)
    y = nm_prune(x, 2, 8, method, rescale=rule, generator=g1)
    yl = nm_prune(xl, 2, 8, method, rescale=rule, generator=g2)
    assert yl.is_contiguous(memory_format=torch.channels_last)
    assert y.is_contiguous()
    assert torch.equal(yl, y)  # bit for bit, rescaled included (nm_prune's docstring)


LAYOUT_CASES = [
    ((3, 13, 7, 5), 1, torch.float32),
    ((8, 64, 16, 16), 1, torch.float32),
    ((2, 6, 1, 9), 1, torch.float64),
    ((5, 12, 3, 3), 2, torch.float32),
    ((4, 9, 5, 2), 0, torch.float16),
    ((3, 16, 4, 4), 3, torch.bfloat16),
]
LAYOUT_IDS = ["odd-f32", "resnet-f32", "1xW-f64", "dim2-f32", "dim0-f16", "dim3-bf16"]


@pytest.mark.parametrize(("shape", "dim", "dtype"), LAYOUT_CASES, ids=LAYOUT_IDS)
@pytest.mark.parametrize("rule", ["plane", "channel"], ids=["plane", "channel"])
def test_rescaled_is_bit_identical_across_layouts(shape, dim, dtype, rule):
    """The rescale factors' sums do not depend on the memory format: NCHW, channels-last and
    a transposed view give the same tensor bit for bit (the mask, and the values)."""
    gen = torch.Generator().manual_seed(sum(shape) + dim)
    x = torch.randn(shape, generator=gen).to(dtype)
    y = nm_prune(x, 3, 4, "rescaled", dim=dim, rescale=rule)
    cl = nm_prune(x.contiguous(memory_format=torch.channels_last), 3, 4, dim=dim, rescale=rule)
    strided = x.transpose(1, 3).contiguous().transpose(1, 3)  # same values, other strides
    st = nm_prune(strided, 3, 4, "rescaled", dim=dim, rescale=rule)
    assert torch.equal(cl, y) and torch.equal(st, y)
    assert cl.is_contiguous(memory_format=torch.channels_last)
    assert st.stride() == strided.stride()


@pytest.mark.parametrize(
    "method", ["random", "magnitude", "rescaled"], ids=["random", "magnitude", "rescaled"]
)
def test_input_never_modified_and_shape_dtype_kept(method):
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        x = torch.randn(2, 12, 3, 5).to(dtype).contiguous(memory_format=torch.channels_last)
        before = x.clone()
        y = nm_prune(x, 2, 4, method, generator=torch.Generator().manual_seed(0))
        assert torch.equal(x, before)
        assert y.shape == x.shape and y.dtype == dtype and y.data_ptr() != x.data_ptr()
        assert int((y != 0).sum()) <= x.numel() // 2


def test_other_dims_and_ranks():
    # dim=-1 of a 2-D tensor (rows = batch): groups run along the last axis only
    x = torch.randn(5, 12)
    y = nm_prune(x, 1, 4, "magnitude", dim=-1)
    want = loop_prune(x.T.reshape(1, 12, 5, 1), 1, 4, "magnitude").reshape(12, 5).T
    assert torch.equal(y, want)
    # groups never span another axis: moving the grouped axis moves the result with it
    x4 = torch.randn(2, 3, 8, 5)
    y4 = nm_prune(x4, 2, 4, "magnitude", dim=2)
    assert torch.equal(y4.movedim(2, 1), nm_prune(x4.movedim(2, 1), 2, 4, "magnitude", dim=1))


def test_empty_tensor():
    x = torch.randn(0, 8, 3, 3)
    assert nm_prune(x, 2, 4).shape == x.shape


def test_n_equal_m_keeps_everything():
    x = torch.randn(2, 8, 3, 3)
    assert torch.equal(nm_prune(x, 4, 4, "magnitude"), x)
    assert torch.equal(nm_prune(x, 4, 4, "random"), x)


# ---------------------------------------------------------------------------------------------
# random pruning
# ---------------------------------------------------------------------------------------------
CHI2_5DOF_P001 = 20.515  # chi-square critical value, 5 degrees of freedom, p = 0.001


def _chi2(counts: np.ndarray) -> float:
    expected = counts.sum() / len(counts)
    return float(((counts - expected) ** 2 / expected).sum())


def _subset_counts(masks: torch.Tensor) -> np.ndarray:
    subsets = list(itertools.combinations(range(4), 2))
    code = (masks.long() * torch.tensor([1, 2, 4, 8])).sum(dim=1)
    return np.array([int((code == (1 << a) + (1 << b)).sum()) for a, b in subsets])


def _authors_shuffle_kept(draws: int, rng: np.random.Generator) -> torch.Tensor:
    """Kept masks of the authors' kernel: for pos in 0..m-1 swap idx[pos] with idx[floor(u*m)].

    This naive swap-with-any-position shuffle has m**m equally likely paths onto m! orders, so
    it is biased: for 2 of 4 the kept pair {1, 2} has probability 48/256 and {0, 3} 37/256
    instead of 1/6 each.
    """
    idx = np.tile(np.arange(4), (draws, 1))
    rows = np.arange(draws)
    for pos in range(4):
        r = np.minimum((rng.random(draws) * 4).astype(int), 3)
        a, b = idx[rows, pos].copy(), idx[rows, r].copy()
        idx[rows, pos], idx[rows, r] = b, a
    keep = np.zeros((draws, 4), dtype=bool)
    keep[rows, idx[:, 0]] = True
    keep[rows, idx[:, 1]] = True
    return torch.from_numpy(keep)


def test_random_is_unbiased_chi_square():
    # Every 2-subset of a group of 4 must be equally likely. 24,000 draws of one group: the
    # authors' biased shuffle gives an expected statistic of ~210 against the threshold of
    # 20.5 (p = 0.001); checked below on the same number of draws.
    draws = 24_000
    x = torch.randn(1, 4).expand(draws, 4).contiguous()  # the same group, drawn many times
    y = nm_prune(x, 2, 4, "random", dim=1, generator=torch.Generator().manual_seed(1234))
    counts = _subset_counts(y != 0)
    assert counts.sum() == draws
    assert _chi2(counts) < CHI2_5DOF_P001, counts
    biased = _subset_counts(_authors_shuffle_kept(draws, np.random.default_rng(1234)))
    assert _chi2(biased) > CHI2_5DOF_P001, biased


def test_random_unbiased_for_large_group():
    # 4 of 32: each position kept with probability 1/8 (chi-square over 32 positions, 31 dof,
    # p = 0.001 critical value 61.1), and each group keeps exactly 4.
    draws = 8_000
    x = torch.randn(draws, 32)
    y = nm_prune(x, 4, 32, "random", dim=1, generator=torch.Generator().manual_seed(7))
    kept = (y != 0).sum(dim=0).numpy()
    assert int((y != 0).sum(dim=1).max()) == 4 and int((y != 0).sum(dim=1).min()) == 4
    assert _chi2(kept) < 61.1, kept
    # values are copied unchanged where kept (no rescale for random)
    assert torch.equal(y[y != 0], x[y != 0])


def test_random_reproducible_from_generator():
    x = torch.randn(4, 16, 5, 5)
    a = nm_prune(x, 2, 4, "random", generator=torch.Generator().manual_seed(3))
    b = nm_prune(x, 2, 4, "random", generator=torch.Generator().manual_seed(3))
    c = nm_prune(x, 2, 4, "random", generator=torch.Generator().manual_seed(4))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    g = torch.Generator().manual_seed(3)
    first = nm_prune(x, 2, 4, "random", generator=g)
    second = nm_prune(x, 2, 4, "random", generator=g)  # the generator advanced
    assert torch.equal(first, a) and not torch.equal(second, a)


# ---------------------------------------------------------------------------------------------
# implementations and errors
# ---------------------------------------------------------------------------------------------
def test_auto_on_cpu_is_the_compiled_kernel_or_the_reference_and_cuda_raises(monkeypatch):
    x = torch.randn(2, 8, 3, 3)
    assert torch.equal(nm_prune(x, 2, 4, impl="ref"), nm_prune_ref(x, 2, 4))
    if nm_cpu.is_available():
        assert torch.equal(nm_prune(x, 2, 4, impl="auto"), nm_prune(x, 2, 4, impl="cpu"))
    monkeypatch.setenv("PDT_CPU_KERNELS", "0")
    assert torch.equal(nm_prune(x, 2, 4, impl="auto"), nm_prune_ref(x, 2, 4))
    with pytest.raises(RuntimeError, match="CUDA kernel of nm_prune is not available"):
        nm_prune(x, 2, 4, impl="cuda")


def test_rescale_is_validated_whatever_the_method():
    """nm_prune's docstring: ``rescale`` is used by "rescaled" only, but always validated."""
    x = torch.randn(2, 8, 3, 3)
    for method in ("random", "magnitude", "rescaled"):
        with pytest.raises(ValueError, match=r"unknown rescale rule 'foo'.*valid: plane, channel"):
            nm_prune(x, 2, 4, method, rescale="foo")
    gen = torch.Generator().manual_seed(3)
    plane = nm_prune(x, 2, 4, "magnitude", rescale="plane")
    assert torch.equal(nm_prune(x, 2, 4, "magnitude", rescale="channel"), plane)
    random = nm_prune(x, 2, 4, "random", rescale="channel", generator=gen)
    gen.manual_seed(3)
    assert torch.equal(nm_prune(x, 2, 4, "random", rescale="plane", generator=gen), random)


@pytest.mark.parametrize(
    "method", ["random", "magnitude", "rescaled"], ids=["random", "magnitude", "rescaled"]
)
@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float16], ids=["f32-fast-path", "f16-general-path"]
)
def test_a_tensor_that_requires_grad_gets_a_plain_error(method, dtype):
    x = torch.randn(3, 10, 5, 3).to(dtype).requires_grad_(True)
    with pytest.raises(ValueError, match=r"outside autograd.*pass x\.detach\(\)"):
        nm_prune(x, 2, 4, method)
    with pytest.raises(ValueError, match=r"outside autograd.*torch\.no_grad\(\)"):
        nm_prune_ref(x, 2, 4, method)
    gen = torch.Generator().manual_seed(1)
    expected = nm_prune(x.detach(), 2, 4, method, generator=gen)
    with torch.no_grad():  # where SDGP runs it: on gradients, outside the graph
        gen.manual_seed(1)
        y = nm_prune(x, 2, 4, method, generator=gen)
    assert torch.equal(y, expected) and not y.requires_grad


def test_nm_prune_is_exported_by_impl_ops():
    import subprocess
    import sys

    import impl.methods.sdgp as sdgp
    import impl.ops

    assert impl.ops.nm_prune is sdgp.nm_prune and "nm_prune" in impl.ops.__all__
    code = (
        "import sys, torch, impl.ops; "
        "assert 'impl.methods.sdgp' not in sys.modules; "  # the op needs no method machinery
        "from impl.ops import nm_prune; "
        "assert nm_prune.__module__ == 'impl.ops.nm'; "
        "assert not torch.cuda.is_initialized()"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    with pytest.raises(AttributeError, match="no attribute 'nm_prune_fast'"):
        impl.ops.nm_prune_fast  # noqa: B018


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"n": 5, "m": 4}, r"1 <= n <= m <= 32"),
        ({"n": 2, "m": 33}, r"1 <= n <= m <= 32"),
        ({"n": 0, "m": 4}, r"1 <= n <= m <= 32"),
        ({"n": -1, "m": 4}, r"1 <= n <= m <= 32"),
        ({"n": 2.0, "m": 4}, r"1 <= n <= m <= 32"),
        ({"n": 2, "m": 4, "method": "topk"}, r"valid: random, magnitude, rescaled"),
        ({"n": 2, "m": 4, "rescale": "batch"}, r"valid: plane, channel"),
        ({"n": 2, "m": 4, "impl": "triton"}, r"valid: auto, ref, cuda"),
        ({"n": 2, "m": 4, "dim": 4}, r"dim must be an int in \[-4, 3\]"),
        ({"n": 2, "m": 4, "eps": -1e-4}, r"eps must be a finite number >= 0; got -0.0001"),
        ({"n": 2, "m": 4, "eps": math.nan}, r"eps must be a finite number >= 0; got nan"),
        ({"n": 2, "m": 4, "eps": math.inf}, r"eps must be a finite number >= 0; got inf"),
        ({"n": 2, "m": 4, "eps": "1e-4"}, r"eps must be a finite number >= 0; got '1e-4'"),
        ({"n": True, "m": 4}, r"n must be an int with 1 <= n <= m <= 32; got True"),
        ({"n": 1, "m": True}, r"m must be an int with 1 <= n <= m <= 32; got True"),
        ({"n": 2, "m": 4, "dim": -5}, r"dim must be an int in \[-4, 3\]"),
        ({"n": 2, "m": 4, "eps": True}, r"eps must be a finite number >= 0; got True"),
    ],
    ids=["n>m", "m>32", "n=0", "n<0", "float-n", "method", "rescale", "impl", "dim",
         "eps<0", "eps-nan", "eps-inf", "eps-str", "bool-n", "bool-m", "dim<-4", "bool-eps"],
)  # fmt: skip
def test_bad_arguments_raise_value_error(kwargs, match):
    # nm_prune, its reference and the SDGP conv refuse the same arguments (a NaN eps made
    # every rescaled value NaN; whatever the method: a bad eps fails before the method uses it).
    x = torch.randn(2, 8, 3, 3)
    with pytest.raises(ValueError, match=match):
        nm_prune(x, **kwargs)
    ref_kwargs = {k: v for k, v in kwargs.items() if k != "impl"}
    if "impl" not in kwargs:
        with pytest.raises(ValueError, match=match):
            nm_prune_ref(x, **ref_kwargs)
    if "eps" in kwargs:
        conv = nn.Conv2d(4, 8, 3)
        with pytest.raises(ValueError, match=match):
            SDGPConv2d.from_conv(conv, 2, 4, eps=kwargs["eps"])
        with pytest.raises(ValueError, match=match.replace("eps", "rescale_eps")):
            SDGP(SDGPConfig(rescale_eps=kwargs["eps"])).validate(None)


@pytest.mark.parametrize(
    "dtype", [torch.int64, torch.int32, torch.bool], ids=["int64", "int32", "bool"]
)
def test_non_floating_tensor_raises(dtype):
    x = torch.ones(2, 8, 3, 3, dtype=dtype)
    with pytest.raises(ValueError, match="floating-point"):
        nm_prune(x, 2, 4)


@pytest.mark.parametrize(
    ("channels", "n", "m", "density"),
    [(16, 2, 4, 0.5), (10, 2, 4, 0.6), (16, 4, 32, 0.25), (13, 1, 16, 1 / 13), (64, 4, 32, 0.125)],
    ids=["16-2of4", "10-2of4", "16-4of32", "13-1of16", "64-4of32"],
)
def test_data_grad_density(channels, n, m, density):
    assert math.isclose(data_grad_density(channels, n, m), density)
    x = torch.randn(1, channels, 1, 1) + 10.0  # no zeros: count what is kept
    kept = int((nm_prune(x, n, m, "magnitude") != 0).sum())
    assert math.isclose(kept / channels, density)


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["magnitude", "rescaled"], ids=["magnitude", "rescaled"])
def test_cuda_tensor_matches_cpu(method):
    x = torch.randn(4, 32, 7, 9)
    want = nm_prune(x, 2, 4, method)
    got = nm_prune(x.cuda(), 2, 4, method).cpu()
    assert torch.equal(got != 0, want != 0)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    g = torch.Generator(device="cuda").manual_seed(0)
    yr = nm_prune(x.cuda(), 2, 4, "random", generator=g)
    assert int((yr != 0).sum()) == x.numel() // 2


@pytest.mark.parametrize(
    "m", [2, 3, 4, 6, 8, 16, 32], ids=["m2", "m3", "m4", "m6", "m8", "m16", "m32"]
)
@pytest.mark.parametrize("descending", [True, False], ids=["desc", "asc"])
def test_pairwise_and_sort_rankings_agree(monkeypatch, m, descending):
    # Groups are ranked by pairwise comparisons, or by a stable sort (scores with a NaN, or
    # PAIRWISE_MAX_M lowered): the two must give the same mask, ties (many, from rounding)
    # and a partial last group included.
    import impl.ops.nm as nm_ops

    scores = torch.round(torch.randn(3, 4 * m + 1, 5) * 1.5)
    for n in range(1, m + 1):
        monkeypatch.setattr(nm_ops, "PAIRWISE_MAX_M", 32)
        pairwise = nm_keep_mask(scores, n, m, dim=1, descending=descending)
        monkeypatch.setattr(nm_ops, "PAIRWISE_MAX_M", 0)
        sorted_ = nm_keep_mask(scores, n, m, dim=1, descending=descending)
        assert torch.equal(pairwise, sorted_)
    # and the loop reference agrees on the descending magnitude order
    if descending:
        x = scores.unsqueeze(-1)
        assert torch.equal(nm_keep_mask(x.abs(), 2, m, dim=1), loop_keep(x, 2, m))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_infinities_of_both_signs_rank_like_the_sort(monkeypatch, dtype):
    # +inf and -inf together sum to NaN: the NaN pre-check must then look closer, find no NaN
    # and rank pairwise, with the sort's order (inf first, -inf last, ties to the lower index).
    import impl.ops.nm as nm_ops

    scores = torch.round(torch.randn(4, 13, 6, dtype=dtype) * 1.5)
    scores[:, ::3] = math.inf
    scores[:, 1::5] = -math.inf
    assert torch.isnan(scores.sum()) and not torch.isnan(scores).any()
    for n, m in [(2, 4), (3, 8), (5, 16)]:
        pairwise = nm_keep_mask(scores, n, m, dim=1)
        monkeypatch.setattr(nm_ops, "PAIRWISE_MAX_M", 0)
        sorted_ = nm_keep_mask(scores, n, m, dim=1)
        monkeypatch.undo()
        assert torch.equal(pairwise, sorted_)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The bits of a float tensor as integers: equal bits, equal tensors (-0.0 and NaN too)."""
    return t.contiguous().view({torch.float32: torch.int32, torch.float64: torch.int64}[t.dtype])


def _special_values(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """``x`` with about 1 in 8 entries set to 0.0, -0.0, +-0.5 (ties) or +-inf."""
    x = x.clone()
    flat = x.view(-1)
    idx = torch.randperm(flat.numel(), generator=gen)[: max(6, flat.numel() // 8)]
    for j, v in enumerate([0.0, -0.0, 0.5, -0.5, math.inf, -math.inf]):
        flat[idx[j::6]] = v
    return x


FAST_CASES = [
    ((3, 16, 5, 7), 2, 4),
    ((3, 16, 5, 7), 1, 4),
    ((2, 13, 3, 5), 2, 4),  # partial last group of 1 channel
    ((2, 24, 4, 4), 3, 8),
    ((2, 37, 3, 3), 5, 16),  # partial last group of 5 channels
    ((2, 64, 3, 2), 16, 32),
    ((2, 16, 3, 3), 4, 32),  # one partial group only
    ((2, 16, 3, 3), 16, 32),  # one partial group that keeps all (ResNet-20's layer1 at 16:32)
    ((3, 12, 5, 7), 3, 6),
    ((2, 8, 3, 3), 4, 4),  # n == m: every group keeps all
]
FAST_IDS = [f"{'x'.join(map(str, s))}-{n}of{m}" for s, n, m in FAST_CASES]


@pytest.mark.parametrize(("shape", "n", "m"), FAST_CASES, ids=FAST_IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("values", ["ties", "special"], ids=["ties", "special"])
@pytest.mark.parametrize("chunk", [1, 1000, None], ids=["chunk1", "chunk1000", "chunk-default"])
def test_fast_path_equals_general_path_bit_for_bit(monkeypatch, shape, n, m, dtype, values, chunk):
    # Contiguous float32/64 inputs take a fast path (integer ranking, bitwise masks, slices
    # of the batch, reused buffers); it must give the general path's result bit for bit,
    # -0.0 and infinities included, for every method, rescale rule and eps, whatever the
    # slice size, and its float64 L1 sums must be those of x.abs().sum(dtype=float64) and
    # y.abs().sum(dtype=float64) exactly.
    import impl.ops.nm as nm_ops

    if chunk is not None:
        monkeypatch.setattr(nm_ops, "CHUNK_ELEMENTS", chunk)

    gen = torch.Generator().manual_seed(sum(shape) + n + m)
    x = torch.randn(shape, generator=gen, dtype=torch.float64)
    x = torch.round(x * 1.5) if values == "ties" else _special_values(x, gen)
    x = x.to(dtype)
    cases = [("magnitude", "plane", EPS), ("random", "plane", EPS)]
    cases += [("rescaled", rule, eps) for rule in ("plane", "channel") for eps in (EPS, 0.0)]
    for method, rule, eps in cases:
        for dim in (1, 0, -1):
            args = (x, n, m, method, dim % x.dim(), rule)
            fast = nm_ops._prune_ref_fast(*args, torch.Generator().manual_seed(3), eps, stats=True)
            assert fast is not None  # the fast path ran
            y, l1_dense, l1_pruned = fast
            with monkeypatch.context() as mp:
                mp.setattr(nm_ops, "_prune_ref_fast", lambda *a, **k: None)
                want = nm_prune_ref(
                    x, n, m, method, dim, rule, torch.Generator().manual_seed(3), eps=eps
                )
            assert torch.equal(_bits(y), _bits(want)), (method, rule, eps, dim)
            if not torch.isnan(want).any():  # (0 * inf: NaN's sign bit may differ)
                assert torch.equal(l1_dense, x.abs().sum(dtype=torch.float64))
                assert torch.equal(l1_pruned, want.abs().sum(dtype=torch.float64))


def test_fast_path_declines_what_it_does_not_cover():
    import impl.ops.nm as nm_ops

    x = torch.randn(2, 8, 3, 3)
    args = (2, 4, "rescaled", 1, "plane", None, EPS)
    assert nm_ops._prune_ref_fast(x.transpose(2, 3), *args, stats=False) is None  # strided
    assert nm_ops._prune_ref_fast(x.half(), *args, stats=False) is None  # float16
    nan = x.clone()
    nan[0, 1, 2, 2] = math.nan
    assert nm_ops._prune_ref_fast(nan, *args, stats=False) is None  # NaN: ranked by sort
    # and the general path still gives the sort's answer for it
    y = nm_prune_ref(nan, 2, 4, "magnitude")
    assert torch.isnan(y[0, 1, 2, 2])


def test_fast_path_slices_only_on_the_cpu():
    # On the CPU the batch is cut into cache-sized slices; on a GPU one slice: slicing there
    # only multiplies launches and host syncs (a GPU reference 128 slices deep is no baseline).
    import impl.ops.nm as nm_ops

    plane = 256 * 56 * 56
    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    assert nm_ops._slice_rows(128, plane, True, cpu) == 1
    assert nm_ops._slice_rows(128, 1024, True, cpu) == nm_ops.CHUNK_ELEMENTS // 1024
    assert nm_ops._slice_rows(128, plane, True, gpu) == 128
    assert nm_ops._slice_rows(128, 1024, True, gpu) == 128
    assert nm_ops._slice_rows(128, 1024, False, cpu) == 128


def test_nan_ranks_first():
    x = torch.tensor([[1.0, float("nan"), 3.0, 2.0]])
    mask = nm_keep_mask(x.abs(), 2, 4, dim=1)
    assert mask.tolist() == [[False, True, True, False]]
    y = nm_prune(x, 2, 4, "magnitude", dim=1)
    assert torch.isnan(y[0, 1]) and y[0, 2] == 3.0 and y[0, 0] == 0.0 and y[0, 3] == 0.0


def test_nm_keep_mask_groups_the_last_dim_by_default():
    scores = torch.randn(3, 5, 8)
    assert torch.equal(nm_keep_mask(scores, 2, 4), nm_keep_mask(scores, 2, 4, dim=2))
    assert not torch.equal(nm_keep_mask(scores, 2, 4), nm_keep_mask(scores, 2, 4, dim=1))


def test_plane_rescale_without_a_batch_dim_is_the_channel_rule():
    # "plane" sums over every dim but the batch (0) and the grouped one; grouped along dim 0,
    # or on a 1-D tensor, there is no separate batch dim: the sums run over all other dims.
    x = torch.randn(8, 3, 5, dtype=torch.float64)
    assert torch.equal(
        nm_prune_ref(x, 2, 4, dim=0, rescale="plane"),
        nm_prune_ref(x, 2, 4, dim=0, rescale="channel"),
    )
    assert not torch.equal(
        nm_prune_ref(x, 2, 4, dim=1, rescale="plane"),
        nm_prune_ref(x, 2, 4, dim=1, rescale="channel"),
    )
    v = torch.randn(12, dtype=torch.float64)
    assert torch.equal(
        nm_prune_ref(v, 2, 4, dim=0, rescale="plane"),
        nm_prune_ref(v, 2, 4, dim=0, rescale="channel"),
    )


def test_an_empty_gradient_prunes_to_an_empty_tensor():
    for method in ("magnitude", "rescaled", "random"):
        y = nm_prune_ref(torch.empty(0, 8, 3, 3), 2, 4, method)
        assert y.shape == (0, 8, 3, 3)


def test_keep_mask_refuses_a_0d_tensor_and_density_zero_channels():
    from impl.methods.sdgp import data_grad_density

    with pytest.raises(ValueError, match="at least one dimension"):
        nm_keep_mask(torch.tensor(1.0), 2, 4)
    with pytest.raises(ValueError, match="channels must be >= 1"):
        data_grad_density(0, 2, 4)
    assert data_grad_density(6, 2, 4) == 4 / 6  # a partial group of 2 keeps both


@pytest.mark.parametrize(
    ("impl", "match"),
    [("gpu", "unknown prune_impl 'gpu'"), ("cuda", "prune_impl='cuda' needs CUDA tensors")],
)
def test_a_layers_prune_impl_it_cannot_use_is_refused_not_run_as_the_reference(impl, match):
    from torch import nn

    from impl.methods.sdgp import SDGPConv2d

    layer = SDGPConv2d.from_conv(nn.Conv2d(8, 8, 3), 2, 4)
    layer.prune_impl = impl
    x = torch.randn(1, 8, 5, 5, requires_grad=True)
    with pytest.raises(ValueError, match=match):
        layer(x).sum().backward()


def test_the_most_negative_dim_is_the_first():
    # dim = -x.dim() names dim 0 (as torch counts dims), not an error
    x = torch.randn(8, 3, 5)
    want = loop_prune(x.reshape(1, 8, 15, 1), 2, 4, "magnitude").reshape(8, 3, 5)
    assert torch.equal(nm_prune(x, 2, 4, "magnitude", dim=-3), want)
    assert torch.equal(nm_prune_ref(x, 2, 4, "magnitude", dim=-3), want)


def test_the_default_is_rescaled_by_the_plane_rule_with_the_authors_eps():
    # nm_prune(x, n, m) prunes dim 1 by magnitude and rescales each (sample, channel) plane
    # with eps = 1e-4: the rule of the authors' code (module docstring)
    x = torch.randn(2, 8, 3, 4, dtype=torch.float64)
    want = loop_prune(x, 2, 4, "rescaled", "plane")
    torch.testing.assert_close(nm_prune(x, 2, 4), want, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(nm_prune_ref(x, 2, 4), want, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float64, torch.float16], ids=["f32", "f64", "f16"]
)
@pytest.mark.parametrize("rule", ["plane", "channel"])
@pytest.mark.parametrize("impl", ["ref", "auto"])
def test_a_plane_with_nothing_kept_stays_zero_with_eps_zero(dtype, rule, impl):
    # Channel 1 is never among the 2 largest of its group of 4: its planes (and the channel)
    # keep nothing, so their rescale factor sum|x| / sum|y| would be x / 0; they stay zero,
    # and every other plane keeps its L1 norm exactly (eps = 0).
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(3, 8, 4, 5, generator=gen, dtype=torch.float64)
    x = x.sign() * (x.abs() + 10.0)
    x[:, 1] = torch.randn(3, 4, 5, generator=gen, dtype=torch.float64) * 1e-2
    x = x.to(dtype)
    y = nm_prune(x, 2, 4, "rescaled", rescale=rule, eps=0.0, impl=impl)
    assert not torch.isnan(y).any()
    assert torch.equal(y[:, 1], torch.zeros_like(y[:, 1]))
    sums = (2, 3) if rule == "plane" else (0, 2, 3)
    l1_x = x.double().abs().sum(dim=sums)
    l1_y = y.double().abs().sum(dim=sums)
    others = [c for c in range(8) if c != 1]
    rtol = {torch.float16: 1e-2, torch.float32: 1e-5, torch.float64: 1e-12}[dtype]
    torch.testing.assert_close(l1_y[..., others], l1_x[..., others], rtol=rtol, atol=0)


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float64, torch.float16], ids=["f32", "f64", "f16"]
)
@pytest.mark.parametrize("rule", ["plane", "channel"])
@pytest.mark.parametrize("impl", ["ref", "auto"])
def test_rescaled_1d_tensor_rescales_each_kept_element_by_itself(dtype, rule, impl):
    # Grouped along its only dim, each element is a plane (and a channel) of its own: a kept
    # x becomes x * |x| / (|x| + eps), the others 0.
    x = torch.tensor([1.0, -4.0, 2.0, 3.0, 0.5, -0.25, 8.0, 1.0, -2.0, 0.75], dtype=dtype)
    eps = 0.5
    y = nm_prune(x, 2, 4, "rescaled", dim=0, rescale=rule, eps=eps, impl=impl)
    kept = {1: -4.0, 3: 3.0, 6: 8.0, 7: 1.0, 8: -2.0, 9: 0.75}  # the last group: 2 of 2
    want = [kept[j] * abs(kept[j]) / (abs(kept[j]) + eps) if j in kept else 0.0 for j in range(10)]
    rtol = 1e-3 if dtype == torch.float16 else 1e-6
    torch.testing.assert_close(y, torch.tensor(want, dtype=dtype), rtol=rtol, atol=0)


@pytest.mark.parametrize(
    ("dtype", "ints", "one"),
    [(torch.float32, torch.int32, 0x3F800000), (torch.float64, torch.int64, 0x3FF0000000000000)],
    ids=["f32", "f64"],
)
@pytest.mark.parametrize("method", ["magnitude", "rescaled"])
def test_nans_tie_whatever_their_payload_and_the_lowest_index_wins(dtype, ints, one, method):
    # NaN ranks above every number as in torch.sort, where all NaNs are equal: of two NaNs
    # with different bits (a quiet NaN with payload 1, then one with payload 2 and the sign
    # set) the first is kept, whatever the magnitudes' bit patterns.
    quiet = torch.tensor(math.nan, dtype=dtype).view(ints).item()
    sign = -(2 ** (torch.iinfo(ints).bits - 1))
    bits = torch.tensor([quiet | 1, (quiet | 2) + sign, one, one + 1], dtype=ints)
    x = bits.view(dtype).view(1, 4, 1)
    assert bool(x.isnan()[0, :2].all())
    y = nm_prune(x, 1, 4, method)
    assert y.isnan().flatten().tolist() == [True, False, False, False]
    assert torch.equal(nm_prune_ref(x, 1, 4, method).isnan(), y.isnan())


@pytest.mark.parametrize("dim", [1, 2])
def test_random_keeps_the_largest_uniforms_drawn_along_the_grouped_dim_last(dim):
    # The documented draw: float64 uniforms of x.movedim(dim, -1)'s shape from the generator,
    # in that order; each group keeps the elements of its n largest draws.
    x = torch.randn(3, 12, 5, 8)
    u = torch.rand(
        x.movedim(dim, -1).shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64
    )
    u = u.movedim(-1, dim).movedim(dim, 1)  # the grouped dim second, as loop_keep groups
    keep = loop_keep(u, 2, 4).movedim(1, dim)
    want = torch.where(keep, x, torch.zeros(()))
    for impl in ("ref", "auto"):
        y = nm_prune(x, 2, 4, "random", dim, generator=torch.Generator().manual_seed(7), impl=impl)
        assert torch.equal(y, want)
