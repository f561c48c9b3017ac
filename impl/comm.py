"""Gradient communication of data-parallel training: DDP hooks, sparse Allreduce, byte counts.

Every DDP model of the Trainer runs :func:`allreduce_hook`. It hands DDP's gradient buckets
to ``all_reduce`` and records, per iteration, the bytes of each buffer it hands over and the
time the collective took (waited on). Those are the numbers in metrics.jsonl
(``comm_bytes_per_iter``, ``comm_ms``).

**Sparse Allreduce** (ClickTrain Sec. 5.3, "we do not need to send the corresponding
gradients [of weights that remain zero] to other computing nodes"): once a method's masks
are fixed it publishes them as ``ctx.extra["comm_masks"]`` (``{parameter name: bool mask}``,
``True`` = kept, see :meth:`CommState.set_masks`). From then on the hook packs, per bucket,
only the gradient entries at kept positions into one contiguous buffer, all-reduces that,
and unpacks it into the bucket with zeros elsewhere. Every rank holds the same masks, so
only values travel, no indices; the masks are checked to be identical on all ranks when they
change.

Units: bytes (``numel * element_size`` of the buffer handed to ``all_reduce``: the payload
``S`` of the Allreduce; a ring sends ``2 (p - 1) / p * S`` of it per rank, see
:mod:`impl.comm_model`), milliseconds.

Pack and unpack run the CUDA kernels of ``impl/cuda/pack.cu`` (through
``impl.ops.pack_cuda``) when the tensors are on a GPU and the kernels load, torch's
``index_select`` / ``scatter_`` otherwise (``impl="auto"``; ``"ref"`` and ``"cuda"`` force one).
"""

from __future__ import annotations

import hashlib
import statistics
import time
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

IMPLS: tuple[str, ...] = ("auto", "ref", "cuda")


# ----------------------------------------------------------------------------- pack / unpack
def _cuda_pack_module(device: torch.device) -> Any | None:
    """``impl.ops.pack_cuda`` when its kernels load on GPU ``device``, else None (never
    raises)."""
    try:
        from impl.cuda import loader

        if not loader.has_cuda_kernels(device, sources=("pack.cu",)):
            return None
        from impl.ops import pack_cuda
    except (ImportError, AttributeError, RuntimeError, OSError):
        return None
    return pack_cuda


def _check_impl(impl: str) -> None:
    if impl not in IMPLS:
        raise ValueError(f"unknown impl {impl!r}; valid: {', '.join(IMPLS)}")


def _use_cuda(t: torch.Tensor, impl: str) -> Any | None:
    _check_impl(impl)
    if impl == "ref" or t.device.type != "cuda":
        if impl == "cuda":
            raise ValueError("impl='cuda' needs tensors on a CUDA device")
        return None
    mod = _cuda_pack_module(t.device)
    if mod is None and impl == "cuda":
        raise RuntimeError("impl='cuda' asked for, but the CUDA pack kernels do not load here")
    return mod


def pack(flat: torch.Tensor, index: torch.Tensor, impl: str = "auto") -> torch.Tensor:
    """``flat[index]``: the entries of the 1-D tensor ``flat`` at the int64 positions ``index``,
    as a new contiguous tensor of ``len(index)`` elements (ClickTrain Sec. 5.3 packing)."""
    if flat.dim() != 1 or index.dim() != 1:
        raise ValueError(
            f"pack needs 1-D tensors, got flat {tuple(flat.shape)}, index {tuple(index.shape)}"
        )
    mod = _use_cuda(flat, impl)
    if mod is not None:
        return mod.pack(flat, index)
    return flat.index_select(0, index)


def unpack(
    packed: torch.Tensor,
    index: torch.Tensor,
    out: torch.Tensor,
    impl: str = "auto",
    starts: torch.Tensor | None = None,
) -> torch.Tensor:
    """Zero the 1-D tensor ``out`` and write ``packed[j]`` to ``out[index[j]]``; returns ``out``.

    The inverse of :func:`pack` on the kept positions. ``index`` must hold unique positions
    in range: it is trusted, not checked, since the gradient hook calls this for every
    bucket of every iteration with the positions it built from the masks (a repeated
    position keeps one of its values). A ``packed`` of another dtype or device than ``out``
    is refused before ``out`` is touched. ``starts``: where the CUDA kernels run, the tile
    table of a strictly ascending ``index`` (:func:`impl.ops.pack_cuda.expand_starts`, which
    :meth:`CommState.bucket_starts` keeps per bucket): ``out`` is then written once, values
    and zeros in one pass, instead of zeroed and scattered into.
    """
    if packed.dim() != 1 or index.dim() != 1 or out.dim() != 1:
        raise ValueError("unpack needs 1-D packed, index and out tensors")
    if packed.numel() != index.numel():
        raise ValueError(f"packed has {packed.numel()} elements, index {index.numel()}")
    if packed.dtype != out.dtype or packed.device != out.device:  # before out is zeroed
        raise ValueError(
            f"packed ({packed.dtype}, {packed.device}) and out ({out.dtype}, {out.device}) "
            "must have one dtype and device"
        )
    mod = _use_cuda(out, impl)
    if mod is not None and starts is not None:
        return mod.expand(packed, index, starts, out)
    out.zero_()
    if mod is not None:
        mod.unpack(packed, index, out)
        return out
    out.scatter_(0, index, packed)  # unique positions: one write each, as index_copy_, faster
    return out


# ----------------------------------------------------------------------------- masks
def resolve_masks(
    model: nn.Module, masks: dict[str, torch.Tensor] | None
) -> dict[int, torch.Tensor]:
    """``{id(parameter): flat bool mask}`` from ``{parameter name: mask}`` on ``model``, each
    flattened in its parameter's memory order (:func:`memory_order`).

    Raises ``ValueError`` for a name that is not a parameter of ``model`` or a mask whose
    shape differs from its parameter's.
    """
    out: dict[int, torch.Tensor] = {}
    if not masks:
        return out
    params = dict(model.named_parameters())
    for name, mask in masks.items():
        if name not in params:
            raise ValueError(f"comm mask names {name!r}, which is not a parameter of the model")
        p = params[name]
        if tuple(mask.shape) != tuple(p.shape):
            raise ValueError(
                f"comm mask of {name!r} has shape {tuple(mask.shape)}, parameter {tuple(p.shape)}"
            )
        out[id(p)] = memory_order(mask.detach().to(device=p.device, dtype=torch.bool), p)
    return out


def memory_order(mask: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """``mask`` (shaped as ``param``) flattened in the order ``param``'s elements lie in
    memory: the order of ``param``'s gradient in a DDP bucket, which lays out a dense
    parameter's gradient with the parameter's strides (channels_last weights: N, H, W, C).
    A parameter whose elements do not tile its memory in one order (overlapping or with
    gaps) has a contiguous gradient view, so its mask is flattened in logical order."""
    dims = sorted(range(param.dim()), key=lambda d: param.stride(d), reverse=True)
    if dims != list(range(param.dim())) and param.permute(dims).is_contiguous():
        return mask.permute(dims).reshape(-1)
    return mask.reshape(-1)


def payload_index(
    params: Iterable[torch.Tensor], masks: dict[int, torch.Tensor]
) -> torch.Tensor | None:
    """Flat int64 positions sent for a bucket holding ``params`` (in order, concatenated as
    DDP lays them out), or None when no parameter of the bucket has a mask (send all)."""
    params = list(params)
    if not any(id(p) in masks for p in params):
        return None
    parts = []
    offset = 0
    for p in params:
        n = p.numel()
        mask = masks.get(id(p))
        if mask is None:
            parts.append(torch.arange(offset, offset + n, device=p.device))
        else:
            parts.append(mask.nonzero().reshape(-1).to(p.device) + offset)
        offset += n
    return torch.cat(parts)  # empty where every position of the bucket is pruned


def payload_bytes(model: nn.Module, masks: dict[str, torch.Tensor] | None = None) -> int:
    """Bytes of gradients one rank hands to all_reduce per iteration (the hook's payload).

    Dense parameters count in full; a parameter with a mask counts its kept entries only.
    Computed, not measured: the Trainer uses it for single-process runs, where no hook runs.
    """
    by_id = resolve_masks(model, masks)
    total = 0
    for p in model.parameters():
        if not p.requires_grad:
            continue
        mask = by_id.get(id(p))
        n = p.numel() if mask is None else int(mask.sum())
        total += n * p.element_size()
    return total


# ----------------------------------------------------------------------------- accounting
class CommStats:
    """Bytes and seconds of communication per iteration, per epoch.

    ``grad`` counts the gradient buffers handed to all_reduce by the hook; ``aux`` counts the
    Trainer's other collectives (global loss value, batch-norm statistics, mask checks).
    """

    def __init__(self) -> None:
        self._iter_bytes = 0
        self._iter_aux = 0
        self._iter_seconds = 0.0
        self._iter_calls = 0
        self._iter_sparse = False
        self.reset_epoch()

    def reset_epoch(self) -> None:
        """Forget the per-iteration records of the epoch."""
        self.bytes: list[int] = []
        self.aux_bytes: list[int] = []
        self.seconds: list[float] = []
        self.calls: list[int] = []
        self.sparse: list[bool] = []

    def record(self, nbytes: int, seconds: float = 0.0, sparse: bool = False) -> None:
        """Count one gradient all_reduce of ``nbytes`` that took ``seconds`` (``sparse``: a
        packed payload)."""
        self._iter_bytes += int(nbytes)
        self._iter_seconds += float(seconds)
        self._iter_calls += 1
        self._iter_sparse |= bool(sparse)

    def record_aux(self, nbytes: int) -> None:
        """Count ``nbytes`` handed to a non-gradient collective."""
        self._iter_aux += int(nbytes)

    def end_iteration(self) -> None:
        """Close the current iteration's tally."""
        self.bytes.append(self._iter_bytes)
        self.aux_bytes.append(self._iter_aux)
        self.seconds.append(self._iter_seconds)
        self.calls.append(self._iter_calls)
        self.sparse.append(self._iter_sparse)
        self._iter_bytes = self._iter_aux = self._iter_calls = 0
        self._iter_seconds = 0.0
        self._iter_sparse = False

    def epoch_metrics(self, timed: bool = True) -> dict[str, Any]:
        """The epoch's ``comm_bytes_per_iter`` (mean over its iterations; an int when every
        iteration sent the same), ``comm_bytes_epoch``, its min and max,
        ``comm_aux_bytes_per_iter``, ``comm_ms`` (median per iteration; left out where the
        collectives were not ``timed``: no time was measured, which is not 0 ms),
        ``comm_calls_per_iter`` and ``comm_sparse_iters`` (iterations with a packed payload)."""
        if not self.bytes:
            return {}
        total = sum(self.bytes)
        n = len(self.bytes)
        same = min(self.bytes) == max(self.bytes)
        return {
            "comm_bytes_per_iter": self.bytes[0] if same else total / n,
            "comm_bytes_epoch": total,
            "comm_bytes_per_iter_min": min(self.bytes),
            "comm_bytes_per_iter_max": max(self.bytes),
            "comm_aux_bytes_per_iter": sum(self.aux_bytes) / n,
            **({"comm_ms": 1e3 * statistics.median(self.seconds)} if timed else {}),
            "comm_calls_per_iter": statistics.median(self.calls),
            "comm_sparse_iters": sum(self.sparse),
        }


# ----------------------------------------------------------------------------- the hook
#: What :meth:`CommState.forget_buckets` leaves as the masks' source: no key equals it, so the
#: next :meth:`CommState.set_masks` binds anew, whatever it is given.
_UNBOUND = object()


def _version(t: torch.Tensor) -> int | None:
    """``t``'s version counter, bumped by every in-place edit (None for a tensor made under
    ``torch.inference_mode``, which keeps none and cannot be edited outside it)."""
    return None if t.is_inference() else t._version


class CommState:
    """State of :func:`allreduce_hook`: process group, masks, statistics, timing.

    Args:
        group: process group (None: the default group).
        timing: wait for each collective inside the hook and time it (``comm_ms``). This
            takes the overlap of communication with the rest of the backward pass away, so
            ``bwd_ms`` then includes the communication; with False the hook returns DDP a
            future and only bytes are counted.
        impl: pack/unpack implementation ("auto", "ref", "cuda").
    """

    def __init__(self, group: Any = None, timing: bool = True, impl: str = "auto") -> None:
        _check_impl(impl)
        self.group = group
        self.timing = timing
        self.impl = impl
        self.stats = CommStats()
        self._masks: dict[int, torch.Tensor] = {}
        self._cache: dict[tuple[int, ...], torch.Tensor | None] = {}
        self._starts: dict[tuple[int, ...], torch.Tensor | None] = {}
        self._source: tuple[Any, ...] | object | None = None

    @property
    def world_size(self) -> int:
        """Ranks in the group."""
        return dist.get_world_size(self.group)

    @property
    def sparse(self) -> bool:
        """True when masks are in force (the hook packs)."""
        return bool(self._masks)

    def set_masks(self, model: nn.Module, masks: dict[str, torch.Tensor] | None) -> bool:
        """Use ``masks`` (``{parameter name of model: bool mask}``) from now on; None or {}:
        dense. Returns True when they changed. Cheap when called again with the same dict
        of the same tensors (the Trainer calls it every iteration); a mask edited in place
        since (its version counter moved) counts as changed."""
        key = (
            None
            if not masks
            else (
                id(model),
                tuple((n, id(m), m.data_ptr(), _version(m)) for n, m in masks.items()),
            )
        )
        if key == self._source:
            return False
        self._masks = resolve_masks(model, masks)
        self._source = key
        self._cache, self._starts = {}, {}
        return True

    def forget_buckets(self) -> None:
        """Drop the per-bucket index cache and the masks' binding to parameters (after the
        model's parameters changed): the next :meth:`set_masks` binds its masks anew, even
        when they are the same tensors."""
        self._cache, self._starts = {}, {}
        self._source = _UNBOUND  # unequal to every key, None's (dense from now on) included

    def bucket_index(self, params: list[torch.Tensor]) -> torch.Tensor | None:
        """Positions to send of a bucket holding ``params`` (None: the whole bucket)."""
        if not self._masks:
            return None
        key = tuple(id(p) for p in params)
        if key not in self._cache:
            self._cache[key] = payload_index(params, self._masks)
        return self._cache[key]

    def bucket_starts(self, params: list[torch.Tensor], numel: int) -> torch.Tensor | None:
        """The tile table of the bucket's index for :func:`unpack`'s one-pass expand
        (:func:`impl.ops.pack_cuda.expand_starts`, built once per bucket), where the index is
        on a GPU whose pack kernels load and the implementation may use them; else None
        (zero, then scatter). ``payload_index`` builds the index strictly ascending."""
        index = self.bucket_index(params)
        if index is None or self.impl == "ref" or not index.is_cuda:
            return None
        key = tuple(id(p) for p in params)
        if key not in self._starts:
            mod = _cuda_pack_module(index.device)
            self._starts[key] = None if mod is None else mod.expand_starts(index, numel)
        return self._starts[key]

    def mask_digest(self) -> torch.Tensor:
        """What two ranks compare to know they hold the same masks: int64 ``[masks, kept
        entries, digest]``, the digest 62 bits of a BLAKE2b hash of every mask's size and
        entries in order (two different masks agree with chance 2**-62; a count and a sum of
        kept positions, as compared before, agree for most pairs of 3x3 patterns)."""
        h = hashlib.blake2b(digest_size=8)
        kept = 0
        for m in self._masks.values():
            flat = m.detach().to("cpu", torch.bool).contiguous()
            h.update(flat.numel().to_bytes(8, "little"))
            h.update(flat.numpy().tobytes())
            kept += int(flat.sum())
        digest = int.from_bytes(h.digest(), "little") >> 2
        return torch.tensor([len(self._masks), kept, digest], dtype=torch.int64)


def _all_reduce_timed(state: CommState, payload: torch.Tensor) -> float:
    if payload.is_cuda:
        torch.cuda.synchronize(payload.device)
    t0 = time.perf_counter()
    dist.all_reduce(payload, group=state.group)
    if payload.is_cuda:
        torch.cuda.synchronize(payload.device)
    return time.perf_counter() - t0


def allreduce_hook(state: CommState, bucket: dist.GradBucket) -> torch.futures.Future:
    """DDP communication hook: sum the bucket's gradients over the ranks.

    Dense: the whole bucket buffer is the payload. With masks: the kept entries, packed
    (:func:`pack`), are the payload, and the result is unpacked with zeros at pruned
    positions. The sum is the global batch's mean gradient: each rank's backward already
    weighs its share by ``1 / n_global`` (:meth:`impl.distributed.DataParallel.backward_loss`),
    so no division by the world size follows, unlike DDP's default hook. Its bytes (and, when
    ``state.timing``, the collective's time) are recorded in ``state.stats``.
    """
    buf = bucket.buffer()
    params = list(bucket.parameters())
    index = state.bucket_index(params)
    payload = buf if index is None else pack(buf, index, state.impl)
    nbytes = payload.numel() * payload.element_size()

    def finish(reduced: torch.Tensor) -> torch.Tensor:
        if index is None:
            return reduced
        starts = state.bucket_starts(params, buf.numel())
        return unpack(reduced, index, buf, state.impl, starts=starts)

    if state.timing:
        seconds = _all_reduce_timed(state, payload)
        state.stats.record(nbytes, seconds, index is not None)
        fut: torch.futures.Future = torch.futures.Future()
        fut.set_result(finish(payload))
        return fut
    state.stats.record(nbytes, 0.0, index is not None)
    work = dist.all_reduce(payload, group=state.group, async_op=True)
    return work.get_future().then(lambda f: finish(f.value()[0]))


# DDP inspects the hook's annotations; with postponed evaluation they are strings.
allreduce_hook.__annotations__.update(
    state=CommState, bucket=dist.GradBucket, **{"return": torch.futures.Future[torch.Tensor]}
)


def register(ddp_model: nn.Module, state: CommState) -> None:
    """Install :func:`allreduce_hook` with ``state`` on a DistributedDataParallel model."""
    ddp_model.register_comm_hook(state, allreduce_hook)


__all__ = [
    "IMPLS",
    "CommState",
    "CommStats",
    "allreduce_hook",
    "pack",
    "payload_bytes",
    "payload_index",
    "register",
    "resolve_masks",
    "unpack",
]
