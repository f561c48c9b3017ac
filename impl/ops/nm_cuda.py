"""CUDA path of SDGP's N:M pruning (``impl.ops.nm.nm_prune``), as a torch custom op.

The kernels live in ``impl/cuda/nm_prune.cu``. :func:`nm_prune_cuda` takes the arguments of
:func:`impl.ops.nm.nm_prune_ref` (which defines the op) and returns what it returns:

* ``magnitude``: the same tensor, bit for bit (same tie rule: among equal magnitudes the
  lowest index is kept; NaN ranks above every number, as in torch's descending sort);
* ``rescaled``: the same kept positions bit for bit; the rescale factors ``sum|x| /
  (sum|y| + eps)`` are summed in the same precision (float32, float64 for float64) but in
  the kernel's fixed order, not torch's, so values may differ in the last bits (the GPU
  tests bound the difference by the reference's own error against float64);
* ``random``: a uniformly random n-subset of every group, drawn in the kernel (Philox) from
  a seed taken from ``generator``: reproducible from the generator's state and independent
  of the memory layout, but not the reference's draw (which sorts float64 uniforms).

Any ``1 <= n <= m <= 32``, any ``dim``, NCHW and channels-last (any layout whose dims
before and after ``dim`` each merge into one stride; other layouts are copied), float32,
float64, float16 and bfloat16. The output keeps the input's memory format.

Nothing here touches the GPU or CuPy at import time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch

from impl.cuda import loader
from impl.ops import device_check, eager, timed_choice
from impl.ops.nm import check_prune_args

_SRC = "nm_prune.cu"
_SUFFIX = {torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16"}
METHODS: dict[str, int] = {"magnitude": 0, "random": 1, "rescaled": 2}  # kernel modes
WIDTHS: tuple[int, ...] = (1, 2, 4, 8, 16, 32)  # sub-warp widths compiled (W >= m)
#: The widest group of the thread path (its selection, statistics and the fused kernel):
#: wider ones spill the statistics' sums and elements out of registers, and their unrolled
#: ranks more than doubled the kernels' compile time; the sub-warp kernels take them, unfused.
THREAD_MAX_WIDTH = 8
NM_BLOCK: int = loader.DEFINES["PDT_NM_BLOCK"]
_MAX_U31 = 2**31 - 1
_MAX_GRID_Y = 65535  # a launch's grid.y (and grid.z) limit
#: The rescaled mode's paths (:mod:`impl.ops.timed_choice`): ``fused`` reads x once (one block
#: per group keeps its elements in shared memory; the plane rule on strided groups, where they
#: fit), ``three_pass`` runs the statistics, ratio and selection kernels (every layout). Both
#: give the same bits, so they are timed once per problem on a GPU.
RESCALED_PATHS: tuple[str, ...] = timed_choice.register(
    "nm_rescaled", ("fused", "three_pass"), same_bits=True
)
#: The selection's paths: ``thread`` (one thread per group, a group's elements at a few
#: consecutive positions in registers, ranked without shuffles, vector loads where aligned)
#: and ``subwarp`` (one lane per element, a sub-warp per group, ranked by shuffles). Both give
#: the same bits, so they are timed once per problem on a GPU.
SELECT_PATHS: tuple[str, ...] = timed_choice.register(
    "nm_select", ("thread", "subwarp"), same_bits=True
)
#: Static shared memory of the fused kernel at most (its reduction arrays and ratios, float64),
#: plus the 1 KiB per block that sm_80 and later reserve (NVRTC 13 reports the kernels' shared
#: size with it): a problem within that much of the limit takes the three-pass path instead
#: of a launch the driver might refuse. Both give the same bits.
_FUSED_STATIC_SMEM = (NM_BLOCK // 32) * 2 * 32 * 8 + 2 * 32 * 8 + 32 * 8 + 1024


def _kernel_names() -> tuple[str, ...]:
    names = []
    for suf in _SUFFIX.values():
        for w in WIDTHS:
            names += [f"pdt_nm_select_{suf}_w{w}", f"pdt_nm_stats_{suf}_w{w}"]
            if w <= THREAD_MAX_WIDTH:
                names += [f"pdt_nm_gselect_{suf}_w{w}", f"pdt_nm_gstats_{suf}_w{w}"]
                names += [f"pdt_nm_cstats_{suf}_w{w}", f"pdt_nm_fused_{suf}_w{w}"]
    return (*names, "pdt_nm_ratio_f32", "pdt_nm_ratio_f64")


KERNELS: tuple[str, ...] = _kernel_names()  # every kernel this module may launch


def is_available(device: torch.device | int | None = None) -> bool:
    """Whether the N:M kernels load on GPU ``device`` (default: the current GPU; ``False``
    without GPU or CuPy)."""
    return loader.has_cuda_kernels(device, sources=(_SRC,))


# -- launch planning (pure functions of shapes; tested without a GPU) -------------------------


class NMView(NamedTuple):
    """A tensor seen as ``[O, C, I]`` around the grouping dim (sizes and element strides).

    Args:
        O: product of the sizes before ``dim``; C: the size of ``dim``; I: after ``dim``.
        so, sc, si: the element strides of the three merged dims.
        nb: the batch count of the rescale (``shape[0]`` for the plane rule, else 1).
        o2: how many consecutive ``o`` share one rescale factor (``O // nb``).
    """

    O: int
    C: int
    I: int
    so: int
    sc: int
    si: int
    nb: int
    o2: int


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _merge(sizes: Sequence[int], strides: Sequence[int]) -> tuple[int, int] | None:
    """(size, stride) of dims that merge into one strided dim, or ``None``."""
    dims = [(n, s) for n, s in zip(sizes, strides) if n != 1]
    size = math.prod(sizes)
    if not dims:
        return size, 1
    for (_, s_outer), (n_inner, s_inner) in zip(dims, dims[1:]):
        if s_outer != n_inner * s_inner:
            return None
    return size, dims[-1][1]


def nm_view(
    shape: Sequence[int], strides: Sequence[int], dim: int, rescale: str = "plane"
) -> NMView | None:
    """The ``[O, C, I]`` view of a tensor for grouping along ``dim``, or ``None`` when the
    dims before or after ``dim`` do not merge into one stride (the caller then copies).

    The rescale batch follows :func:`impl.ops.nm.nm_prune_ref`: the plane rule sums
    per (``shape[0]`` index, channel) when ``dim > 0`` and the tensor has more than one dim;
    otherwise (and for the channel rule) per channel over everything else.
    """
    nd = len(shape)
    before = _merge(shape[:dim], strides[:dim])
    after = _merge(shape[dim + 1 :], strides[dim + 1 :])
    if before is None or after is None:
        return None
    (o, so), (i, si) = before, after
    c, sc = shape[dim], strides[dim]
    if rescale == "plane" and dim != 0 and nd > 1:
        nb = shape[0]
    else:
        nb = 1
    o2 = o // nb if nb else 0
    return NMView(o, c, i, so, sc, si, nb, o2)


def check_counts(op: str, view: NMView, m: int, itemsize: int = 2) -> None:
    """Raise ``ValueError`` where the kernels' 32-bit counts cannot hold ``view``: the group
    count, each of ``O``, ``C``, ``I``, ``C + m - 1`` (the kernels round ``C`` up to whole
    groups in 32-bit arithmetic) and ``I + V - 1`` (the ``thread`` selection rounds ``I`` up to
    whole units of ``V`` positions, at most 16 bytes of elements of ``itemsize`` bytes)."""
    groups = view.O * _cdiv(view.C, m) * view.I
    units = view.I + 16 // itemsize - 1
    if max(groups, view.O, view.C + m - 1, view.I, units) > _MAX_U31:
        raise ValueError(f"{op}: {groups} groups of {m} exceed the kernels' 32-bit counts")


def sub_warp_width(m: int) -> int:
    """The kernel's sub-warp width for group size ``m``: the smallest power of two >= m."""
    if not 1 <= m <= 32:
        raise ValueError(f"need 1 <= m <= 32, got {m}")
    return 1 << (m - 1).bit_length()


def positions_per_thread(itemsize: int, w: int) -> int:
    """Consecutive positions a thread of the ``thread`` selection holds for sub-warp width
    ``w`` and elements of ``itemsize`` bytes (the kernel's ``pdt_nm_positions``): 16 bytes of
    elements, halved while a group there would exceed 32 values or 128 bytes."""
    v = 16 // itemsize
    while v > 1 and (w * v > 32 or w * v * itemsize > 128):
        v //= 2
    return v


def problem_key(dtype: torch.dtype, view: NMView, n: int, m: int) -> str:
    """The start of the op's problem names in :mod:`impl.ops.timed_choice` (``nm_select``
    adds the mode and the device, ``nm_rescaled`` the device): the dtype, the ``[O, C, I]``
    view the kernels address with its strides, and n:m. Benchmark rows find their own
    problem's path timings by it (``bench.cases``)."""
    return f"{dtype} O{view.O} C{view.C} I{view.I} {n}:{m} strides {view.so},{view.sc},{view.si} "


def vector_loads(view: NMView, itemsize: int, m: int, *tensors: torch.Tensor) -> int:
    """How the thread path may load a unit (the kernels' ``vec``): 1, each channel's
    positions as aligned 16-byte vectors (strided groups over unit-stride positions whose
    channel stride and length, and row stride where there is more than one row, are multiples
    of 16 bytes of elements); 2, each position's
    group as one aligned vector (contiguous groups, as channels-last has them: ``m`` a power
    of two dividing ``C``, ``m`` elements at most 16 bytes, position and row strides
    multiples of ``m``); 0, element by element. The tensors must be aligned to the vector."""
    per16 = 16 // itemsize
    contiguous = view.sc == 1 and view.C > 1
    if (
        not contiguous
        and view.si == 1
        and all(v % per16 == 0 for v in (view.I, view.sc))
        and (view.O == 1 or view.so % per16 == 0)
        and all(t.data_ptr() % 16 == 0 for t in tensors)
    ):
        return 1
    if (
        contiguous
        and m == sub_warp_width(m)
        and m * itemsize <= 16
        and view.C % m == 0
        and (view.I == 1 or view.si % m == 0)
        and (view.O == 1 or view.so % m == 0)
        and all(t.data_ptr() % (m * itemsize) == 0 for t in tensors)
    ):
        return 2
    return 0


def fused_shared_bytes(view: NMView, m: int, itemsize: int) -> int | None:
    """Dynamic shared memory (bytes) of the fused rescaled kernel for ``view``: a group's
    ``W x ceil(I / V) x V`` elements (``V``: :func:`positions_per_thread`); ``None`` where it
    does not apply (the channel rule or several planes per ratio, ``o2 != 1``; contiguous
    groups, which the statistics kernel reads several to a block; groups wider than
    ``THREAD_MAX_WIDTH``)."""
    w = sub_warp_width(m)
    if view.o2 != 1 or stats_groups_per_block(view, m) != 1 or w > THREAD_MAX_WIDTH:
        return None
    v = positions_per_thread(itemsize, w)
    return w * _cdiv(view.I, v) * v * itemsize


def stats_groups_per_block(view: NMView, m: int) -> int:
    """Groups per block of the statistics kernel (a power of two): 1 when a group is strided
    (NCHW), enough to cover 32 neighbouring channels when a group is contiguous."""
    if view.sc != 1 or view.C == 1:
        return 1
    w = sub_warp_width(m)
    groups = _cdiv(view.C, m)
    gt = 1
    while gt * 2 * w <= 32 and gt < groups:
        gt *= 2
    return gt


def _check_args(
    x: torch.Tensor,
    n: int,
    m: int,
    method: str,
    dim: int,
    rescale: str,
    eps: float,
    generator: torch.Generator | None,
) -> int:
    """``dim`` as a non-negative index after the checks :func:`impl.ops.nm.nm_prune` makes,
    and that ``x``'s dtype is one the kernels take; ``ValueError`` (``TypeError`` for the
    generator) before anything touches a device."""
    dim = check_prune_args(x, n, m, method, dim, rescale, eps, generator)
    if x.dtype not in _SUFFIX:
        raise ValueError(
            f"x must be float32, float64, float16 or bfloat16 for the CUDA kernel; got {x.dtype}"
        )
    return dim


# -- the kernels ------------------------------------------------------------------------------


def _nm_launch(
    x: torch.Tensor,
    n: int,
    m: int,
    mode: int,
    dim: int,
    rescale: str,
    seed: torch.Tensor | None,
    eps: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Run the kernels; ``out`` (tests poison it) must be ``torch.empty_like(x)``-shaped."""
    op = "nm_prune"
    if mode == METHODS["random"] and seed is None:  # the kernel reads the seed's one value
        raise ValueError(f"{op}: random pruning needs a seed tensor (draw_seed)")
    tensors = [x] + ([seed] if seed is not None else [])
    dev = device_check.require_cuda(op, "impl.ops.nm_prune", *tensors, sources=(_SRC,))
    if out is None:
        out = torch.empty_like(x)  # preserve_format: NCHW stays NCHW, channels-last stays so
    if x.numel() == 0:
        return out
    view = nm_view(x.shape, x.stride(), dim, rescale)
    src, dst = x, out
    if view is None or out.stride() != x.stride():  # a layout the [O, C, I] view cannot take
        src = x.contiguous()
        dst = torch.empty_like(src)
        view = nm_view(src.shape, src.stride(), dim, rescale)
        assert view is not None
    check_counts(op, view, m, x.element_size())
    groups = view.O * _cdiv(view.C, m) * view.I
    suf = _SUFFIX[x.dtype]
    w = sub_warp_width(m)
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    args = [*(np.int32(v) for v in (view.O, view.C, view.I))]
    args += [*(np.int64(v) for v in (view.so, view.sc, view.si))]

    # The thread path's loads (one check for every kernel of the call: the statistics read
    # only ``src``, but one mode for all keeps fused and three-pass on the same loads).
    vec = np.int32(vector_loads(view, x.element_size(), m, src, dst))
    select_args = [np.int32(n), np.int32(m), np.int32(mode), seed]
    ch_contig = np.int32(view.sc == 1 and view.C > 1)
    key = problem_key(x.dtype, view, n, m)
    select_problem = f"{key}mode {mode} {x.device}"

    def select(ratio: torch.Tensor | None) -> None:
        def run(path: str) -> None:
            tail = [ratio, np.int32(max(view.o2, 1)), ch_contig]
            if path == "thread":
                v = positions_per_thread(x.element_size(), w)
                units = view.O * _cdiv(view.C, m) * _cdiv(view.I, v)
                blocks = max(1, min(_cdiv(units, 256), loader.multiprocessor_count(dev) * 16))
                name, tail = f"pdt_nm_gselect_{suf}_w{w}", [*tail, vec]
            else:
                warps = _cdiv(groups, 32 // w)
                blocks = max(1, min(_cdiv(warps, 8), loader.multiprocessor_count(dev) * 32))
                name = f"pdt_nm_select_{suf}_w{w}"
            loader.launch(
                _SRC, name, (blocks, 1, 1), (256, 1, 1), [src, dst, *args, *select_args, *tail], dev
            )

        paths = SELECT_PATHS if w <= THREAD_MAX_WIDTH else ("subwarp",)
        run(timed_choice.pick("nm_select", select_problem, paths, run, src))

    def three_pass() -> None:
        sx = torch.empty(view.O, view.C, dtype=acc, device=x.device)
        sy = torch.empty_like(sx)
        gt = stats_groups_per_block(view, m)
        blocks_y = _cdiv(_cdiv(view.C, m), gt)
        if gt == 1 and w <= THREAD_MAX_WIDTH:  # strided: the fused kernel's sums, unit by unit
            name, tail = f"pdt_nm_gstats_{suf}_w{w}", [vec, sx, sy]
        elif w <= THREAD_MAX_WIDTH:  # contiguous: 32 neighbouring groups a block, a lane each
            name, tail = f"pdt_nm_cstats_{suf}_w{w}", [vec, sx, sy]
            blocks_y = _cdiv(_cdiv(view.C, m), 32)
        else:  # groups wider than 8, a sub-warp each
            name, tail = f"pdt_nm_stats_{suf}_w{w}", [np.int32(gt.bit_length() - 1), sx, sy]
        if blocks_y > _MAX_GRID_Y:  # the blocks the chosen kernel launches, not another's
            raise ValueError(
                f"{op}: rescaled {n}:{m} of {view.C} channels needs "
                f"{blocks_y} blocks per row, over a launch's {_MAX_GRID_Y}"
            )
        loader.launch(
            _SRC,
            name,
            (view.O, blocks_y, 1),
            (NM_BLOCK, 1, 1),
            [src, *args, np.int32(n), np.int32(m), *tail],
            dev,
        )
        ratio = torch.empty(view.nb, view.C, dtype=acc, device=x.device)
        loader.launch(
            _SRC,
            f"pdt_nm_ratio_{'f64' if acc == torch.float64 else 'f32'}",
            (max(1, min(_cdiv(view.nb * view.C, 256), 65535)), 1, 1),
            (256, 1, 1),
            [sx, sy, ratio, *(np.int32(v) for v in (view.nb, view.o2, view.C)), np.float64(eps)],
            dev,
        )
        select(ratio)

    if mode != METHODS["rescaled"]:
        select(None)
    else:
        smem = fused_shared_bytes(view, m, x.element_size())
        fits = (
            smem is not None
            and smem + _FUSED_STATIC_SMEM <= loader.max_shared_per_block(dev)
            and _cdiv(view.C, m) <= _MAX_GRID_Y  # the fused kernel's grid.y: one group each
        )
        candidates = RESCALED_PATHS if fits else ("three_pass",)

        def run(path: str) -> None:
            if path == "three_pass":
                three_pass()
                return
            loader.launch(
                _SRC,
                f"pdt_nm_fused_{suf}_w{w}",
                (view.O, _cdiv(view.C, m), 1),
                (NM_BLOCK, 1, 1),
                [
                    src,
                    dst,
                    *args,
                    np.int32(n),
                    np.int32(m),
                    vec,
                    np.float64(eps),
                ],
                dev,
                shared_mem=smem,
            )

        run(timed_choice.pick("nm_rescaled", f"{key}{x.device}", candidates, run, src))
    if dst is not out:
        out.copy_(dst)
    return out


def _nm_prune_impl(
    x: torch.Tensor,
    n: int,
    m: int,
    mode: int,
    dim: int,
    channel_rule: bool,
    seed: torch.Tensor | None,
    eps: float,
) -> torch.Tensor:
    """What the ``pdtbench::nm_prune`` op runs (its arguments, unchecked)."""
    return _nm_launch(x, n, m, mode, dim, "channel" if channel_rule else "plane", seed, eps)


_nm_prune_op = torch.library.custom_op("pdtbench::nm_prune", mutates_args=())(_nm_prune_impl)


@_nm_prune_op.register_fake
def _(x, n, m, mode, dim, channel_rule, seed, eps):
    return torch.empty_like(x)


def draw_seed(generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """Two int64 words for the kernel's Philox (key, stream), drawn from ``generator`` (torch's
    default generator of ``device`` when ``None``) on the device, without a host sync."""
    gen_device = generator.device if generator is not None else device
    seed = torch.randint(0, 2**62, (2,), dtype=torch.int64, generator=generator, device=gen_device)
    return seed.to(device, non_blocking=True)


def nm_prune_cuda(
    x: torch.Tensor,
    n: int,
    m: int,
    method: str = "rescaled",
    dim: int = 1,
    rescale: str = "plane",
    generator: torch.Generator | None = None,
    eps: float = 1e-4,
) -> torch.Tensor:
    """N:M-prune ``x`` along ``dim`` on the GPU (SDGP Sec. III-A/B; see the module docstring).

    The arguments and result of :func:`impl.ops.nm.nm_prune_ref`: of every ``m``
    consecutive elements along ``dim`` keep ``n`` (a partial last group of ``r`` keeps
    ``min(n, r)``); ``method`` ``"magnitude"``, ``"random"`` or ``"rescaled"``; ``rescale``
    ``"plane"`` (per sample and channel) or ``"channel"`` (per channel); ``eps`` the
    constant of the rescale denominator. Returns a new tensor of ``x``'s shape, dtype and
    memory format. Not differentiable (SDGP applies it to gradients).
    """
    dim = _check_args(x, n, m, method, dim, rescale, eps, generator)
    mode = METHODS[method]
    seed = draw_seed(generator, x.device) if mode == METHODS["random"] else None
    channel = rescale == "channel"
    return eager.call(
        torch.ops.pdtbench.nm_prune, _nm_prune_impl, x, n, m, mode, dim, channel, seed, float(eps)
    )


__all__ = [
    "KERNELS",
    "METHODS",
    "NMView",
    "draw_seed",
    "is_available",
    "nm_prune_cuda",
    "nm_view",
    "stats_groups_per_block",
    "fused_shared_bytes",
    "THREAD_MAX_WIDTH",
    "RESCALED_PATHS",
    "SELECT_PATHS",
    "positions_per_thread",
    "problem_key",
    "vector_loads",
    "sub_warp_width",
]
