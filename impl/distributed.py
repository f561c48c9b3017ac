"""Data-parallel training on ``torch.distributed``: process groups, launch, sharding, DDP.

How a run is distributed (docs/distributed.md has the long form):

- **Launch.** ``pdtbench train ... --nproc N`` starts ``torchrun --standalone
  --nproc-per-node N -m impl.cli train ...`` (:func:`launch`); ``torchrun ... -m impl.cli
  train ...`` works directly, on one node or several. Each worker joins the default process
  group (:func:`init_from_env`): NCCL when it trains on a GPU (``cuda:LOCAL_RANK``), gloo on
  the CPU, with a collective timeout (:func:`timeout_seconds`).
- **Batches.** ``--batch-size`` is the *global* batch: every rank's loader draws the same
  shuffle and augmentation (they depend only on (seed, epoch)) and loads only this rank's
  contiguous share of each global batch (:meth:`impl.data.Loader.set_shard`,
  :func:`impl.data.shard_bounds`; shares differ by at most one sample). So a config means the
  same training whatever the number of processes, the learning rate needs no rescaling, and
  no rank reads or augments images another rank trains on.
- **Same result as one process**, up to the order of floating-point reductions:
  batch-norm statistics are computed over the global batch (:func:`sync_batchnorm`), the loss
  value a method sees is the global batch's mean, and with unequal shares each rank's
  cross-entropy gradient is weighted by its share (:meth:`DataParallel.backward_loss`).
- **Methods** see the plain module as ``ctx.model``; the DDP wrapper exists only for forward
  and backward. When a method changes the parameters (PruneTrain's reconfiguration shrinks
  them; a method may replace modules), the wrapper is rebuilt on every rank, which DDP checks
  to be identical in shapes.
- **Files.** Only rank 0 writes the run directory.
- **Failures.** Every collective has a timeout; a rank that dies or hangs makes the others
  fail within it, with a :class:`DistributedError` naming the rank and the cause.
"""

from __future__ import annotations

import datetime
import gc
import inspect
import math
import os
import socket
import subprocess
import sys
import types
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from impl import comm
from impl.data import shard_bounds

#: Environment variable holding the collective timeout in seconds.
TIMEOUT_ENV = "PDTBENCH_DIST_TIMEOUT"
#: Collective timeout when neither the caller nor ``PDTBENCH_DIST_TIMEOUT`` sets one (s).
DEFAULT_TIMEOUT_S = 300.0
#: Environment variable that turns the timing of collectives off ("0").
COMM_TIMING_ENV = "PDTBENCH_COMM_TIMING"
#: Exit status of a worker whose run failed in its own work (an error it raised).
EXIT_DIST_FAILURE = 3
#: Exit status of a worker stopped because a peer failed (a collective found the peer's
#: connection closed, or timed out): the launcher then names the peer, not this survivor.
EXIT_PEER_STOPPED = 4
#: Set to "1" in the workers :func:`launch` starts: the launching process says how a stopped
#: job can be resumed, so a worker stopped by a signal leaves without a word.
LAUNCHED_ENV = "PDTBENCH_LAUNCHED"


#: The timeout the default group was created with here (None: created elsewhere).
_GROUP_TIMEOUT_S: float | None = None


class DistributedError(RuntimeError):
    """A distributed run failed: a peer died, a collective timed out, or ranks disagreed."""


@dataclass(frozen=True)
class DistInfo:
    """Where this process stands in the job.

    Args:
        rank: global rank (0 is the main process, the only one that writes files).
        world_size: number of processes.
        local_rank: rank within the node (selects the GPU).
        backend: "nccl", "gloo", or "none" for a single process.
        timeout_s: the collective timeout in seconds (None for a single process).
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str = "none"
    timeout_s: float | None = None

    @property
    def active(self) -> bool:
        """True when more than one process trains together."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """True on rank 0."""
        return self.rank == 0


# ----------------------------------------------------------------------------- process group
def timeout_seconds(value: float | None = None) -> float:
    """The collective timeout in seconds: ``value``, else ``$PDTBENCH_DIST_TIMEOUT``, else
    :data:`DEFAULT_TIMEOUT_S`. Raises ``ValueError`` unless it is a positive number."""
    if value is None:
        text = os.environ.get(TIMEOUT_ENV)
        try:
            value = float(text) if text else DEFAULT_TIMEOUT_S
        except ValueError as err:
            raise ValueError(f"{TIMEOUT_ENV} must be a number of seconds, got {text!r}") from err
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"the distributed timeout must be > 0 seconds, got {value}")
    return float(value)


def env_world() -> tuple[int, int, int] | None:
    """``(rank, world_size, local_rank)`` from the variables torchrun sets, or None."""
    if "WORLD_SIZE" not in os.environ or "RANK" not in os.environ:
        return None
    try:
        rank = int(os.environ["RANK"])
        world = int(os.environ["WORLD_SIZE"])
        local = int(os.environ.get("LOCAL_RANK", rank))
    except ValueError as err:
        raise ValueError(f"RANK/WORLD_SIZE/LOCAL_RANK must be integers: {err}") from err
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"RANK={rank} is outside WORLD_SIZE={world}")
    return rank, world, local


def backend_for(device: str | torch.device) -> str:
    """``"nccl"`` for a CUDA device (or "auto" with CUDA present), else ``"gloo"``."""
    if str(device) == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def init_process_group(
    rank: int,
    world_size: int,
    *,
    device: str = "auto",
    init_method: str | None = None,
    timeout_s: float | None = None,
    local_rank: int | None = None,
) -> DistInfo:
    """Join the default process group (NCCL for GPU training, gloo for CPU) and return this
    process's :class:`DistInfo`.

    ``init_method`` defaults to ``env://`` (MASTER_ADDR / MASTER_PORT, as torchrun sets).
    The timeout bounds every collective: gloo raises when one exceeds it; for NCCL,
    ``TORCH_NCCL_ASYNC_ERROR_HANDLING`` is set to 3 unless set already (PyTorch's watchdog
    then takes the process down on a timeout or NCCL error instead of hanging).
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside world_size {world_size}")
    timeout = timeout_seconds(timeout_s)
    backend = backend_for(device)
    local = rank if local_rank is None else local_rank
    if backend == "nccl":
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3")
        torch.cuda.set_device(local_gpu(local))
    global _GROUP_TIMEOUT_S
    if not dist.is_initialized():
        _GROUP_TIMEOUT_S = timeout
        dist.init_process_group(
            backend,
            init_method=init_method or "env://",
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=timeout),
        )
        # Every rank has joined before any goes on: a rank that fails at once (say, every rank
        # finding the same bad configuration) otherwise closes its connections while a slower
        # peer is still connecting, whose gloo setup then dies with a traceback ("Connection
        # closed by peer" in connectFullMesh) instead of the one line of the failure.
        dist.barrier()
    return DistInfo(rank, world_size, local, backend, timeout)


def init_from_env(device: str = "auto", timeout_s: float | None = None) -> DistInfo:
    """Join the process group torchrun describes in the environment; a single process (no
    torchrun variables, or WORLD_SIZE=1) gets an inactive :class:`DistInfo`."""
    world = env_world()
    if world is None or world[1] == 1:
        return DistInfo()
    rank, size, local = world
    return init_process_group(rank, size, device=device, timeout_s=timeout_s, local_rank=local)


def current() -> DistInfo:
    """This process's :class:`DistInfo` from the initialised default group (inactive if none)."""
    if not (dist.is_available() and dist.is_initialized()):
        return DistInfo()
    world = env_world()
    local = world[2] if world else dist.get_rank()
    return DistInfo(
        dist.get_rank(), dist.get_world_size(), local, dist.get_backend(), _GROUP_TIMEOUT_S
    )


def shutdown() -> None:
    """Leave the default process group (no-op when there is none)."""
    global _GROUP_TIMEOUT_S
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    _GROUP_TIMEOUT_S = None


def local_gpu(local_rank: int) -> int:
    """The CUDA index of the GPU of local rank ``local_rank``: the rank modulo the GPUs this
    process sees (a scheduler that gives each process one GPU of its own, through
    ``CUDA_VISIBLE_DEVICES`` per task, leaves every local rank with one, index 0)."""
    return local_rank % max(torch.cuda.device_count(), 1)


def rank_device(device: torch.device, info: DistInfo) -> torch.device:
    """The device of this rank: ``cuda`` without an index becomes ``cuda:K``, ``K`` the
    :func:`local_gpu` of its local rank (the one :func:`init_process_group` selected).

    Raises:
        ValueError: ``cuda:N`` names another GPU than that one in an NCCL job of several
            processes on this node (torchrun's ``LOCAL_WORLD_SIZE``): every one of them
            would train on GPU N, and NCCL refuses two ranks on one GPU. One process per
            node may name its GPU.
    """
    if not (info.active and device.type == "cuda"):
        return device
    own = torch.device("cuda", local_gpu(info.local_rank))
    if device.index is None:
        return own
    if device != own and info.backend == "nccl" and _local_world_size() > 1:
        raise ValueError(
            f"--device {device} on local rank {info.local_rank}, whose GPU is {own}: with "
            "several processes on a node give --device cuda (each takes its local rank's "
            "GPU), or choose the GPUs with CUDA_VISIBLE_DEVICES"
        )
    return device


def _local_world_size() -> int:
    """The processes of this node, as torchrun says (``LOCAL_WORLD_SIZE``); 1 when unsaid."""
    try:
        return int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    except ValueError:
        return 1


def gpu_shortage(processes: int, device: str | torch.device) -> str | None:
    """Why ``processes`` processes of one node cannot each have a GPU of their own for
    ``device`` (NCCL needs one per process; two ranks on one GPU fail in NCCL's setup), or
    None: the device is not CUDA (gloo) or the node shows enough GPUs."""
    if backend_for(device) != "nccl":
        return None
    count = torch.cuda.device_count()
    if processes <= count:
        return None
    return (
        f"{processes} processes on this node need a CUDA GPU each (NCCL) and it shows "
        f"{count}: run at most {count} per node, or train on the CPU (--device cpu, gloo)"
    )


def describe_failure(err: BaseException, info: DistInfo) -> str:
    """One line saying which rank failed, why, and what that usually means."""
    text = f"{type(err).__name__}: {err}".strip().splitlines()
    first = text[0] if text else type(err).__name__
    where = f"rank {info.rank} of {info.world_size}"
    if isinstance(err, dist.DistError) or _looks_like_comm_failure(str(err)):
        return (
            f"distributed training stopped on {where} because a peer process exited or hung "
            "(collectives fail when a peer's connection closes, or after the "
            f"{info.timeout_s or timeout_seconds():g} s timeout): {first}"
        )
    return f"distributed training failed on {where}: {first}"


def _looks_like_comm_failure(message: str) -> bool:
    m = message.lower()
    keys = ("connection closed", "connection reset", "timed out", "timeout", "gloo", "nccl")
    return any(k in m for k in keys)


# ----------------------------------------------------------------------------- launching
def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (for a local rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun_command(
    argv: Sequence[str], nproc: int, *, module: str = "impl.cli", port: int | None = None
) -> list[str]:
    """The command line of ``torchrun --standalone --nproc-per-node N -m module argv...``
    (torchrun's agent as :mod:`impl.launch_agent` runs it: stopped by a signal, it exits
    with 128 + the signal's number and no traceback)."""
    if not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"nproc must be an int >= 1, got {nproc!r}")
    cmd = [sys.executable, "-m", "impl.launch_agent", f"--nproc-per-node={nproc}"]
    if port is None:
        cmd.append("--standalone")
    else:
        cmd += ["--nnodes=1", "--master-addr=127.0.0.1", f"--master-port={port}"]
    # "--" ends torchrun's own options, so that ours (--nproc, --r) are not read as
    # abbreviations of its --nproc-per-node, --rdzv-... and passed on untouched.
    return cmd + ["-m", module, "--", *argv]


def launch(
    argv: Sequence[str],
    nproc: int,
    *,
    module: str = "impl.cli",
    env: dict[str, str] | None = None,
    threads: int | None = None,
    timeout_s: float | None = None,
) -> int:
    """Run ``python -m module argv...`` in ``nproc`` processes through torchrun; return its
    exit status (0 when every worker succeeded; torchrun stops the others when one fails).

    ``threads`` sets OMP_NUM_THREADS of each worker (default: the cores shared out, at least
    1, on CPU-only machines unless already set, so N workers do not oversubscribe the
    cores). ``timeout_s`` bounds the whole job: past it torchrun and its workers are killed
    and :class:`DistributedError` is raised.
    """
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    full_env[LAUNCHED_ENV] = "1"  # a worker stopped by a signal leaves the words to our caller
    if threads is not None:
        full_env["OMP_NUM_THREADS"] = str(threads)
    elif "OMP_NUM_THREADS" not in full_env and not torch.cuda.is_available():
        full_env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or nproc) // nproc))
    cmd = torchrun_command(argv, nproc, module=module, port=free_port())
    # A session of its own, so that the whole job (agent and workers) can be stopped at once;
    # on Linux the agent is also told to stop (SIGTERM, which it passes on to its workers) when
    # this process dies without stopping it (SIGKILL, a crash), so no job trains on unwatched.
    proc = subprocess.Popen(
        cmd, env=full_env, start_new_session=True, preexec_fn=_stop_with_parent(os.getpid())
    )
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_job(proc)
        raise DistributedError(
            f"the {nproc}-process job did not finish within {timeout_s:g} s and was killed"
        ) from None
    except BaseException:
        _kill_job(proc)
        raise


def _stop_with_parent(parent: int) -> Any:
    """A ``preexec_fn`` asking Linux to send SIGTERM to the child when ``parent`` (the thread
    that started it) dies (``prctl(PR_SET_PDEATHSIG)``); None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None

    def set_death_signal() -> None:
        import ctypes
        import signal

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before the request: stop now
            os.kill(os.getpid(), signal.SIGTERM)

    return set_death_signal


def _kill_job(proc: subprocess.Popen) -> None:
    import signal

    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


# ----------------------------------------------------------------------------- sharding
def shard(x: torch.Tensor, y: torch.Tensor, info: DistInfo) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's share of the global batch ``(x, y)`` (along dim 0)."""
    if not info.active:
        return x, y
    start, stop = shard_bounds(x.shape[0], info.rank, info.world_size)
    return x[start:stop], y[start:stop]


# ----------------------------------------------------------------------------- collectives
def sum_over_ranks(
    values: Sequence[float], info: DistInfo | None = None, device: torch.device | None = None
) -> list[float]:
    """Sums of ``values`` over the ranks of the job (float64; every rank must call it), as
    they are in one process. ``info``: the job (default :func:`current`); ``device``: where
    an NCCL job reduces (default this process's current GPU)."""
    info = current() if info is None else info
    if not info.active:
        return [float(v) for v in values]
    t = torch.tensor([float(v) for v in values], dtype=torch.float64)
    if info.backend == "nccl":
        t = t.to(
            device if device is not None else torch.device("cuda", torch.cuda.current_device())
        )
    dist.all_reduce(t)
    return [float(v) for v in t.cpu()]


class _AllReduceSum(torch.autograd.Function):
    """Sum over the ranks; the gradient of a sum is the sum of the gradients."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor, stats: Any) -> torch.Tensor:
        out = t.clone()
        dist.all_reduce(out)
        ctx.stats = stats
        if stats is not None:
            stats.record_aux(out.numel() * out.element_size())
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        g = grad.contiguous().clone()
        dist.all_reduce(g)
        if ctx.stats is not None:
            ctx.stats.record_aux(g.numel() * g.element_size())
        return g, None


def all_reduce_sum(t: torch.Tensor, stats: comm.CommStats | None = None) -> torch.Tensor:
    """Differentiable sum of ``t`` over all ranks (bytes counted as ``aux`` in ``stats``)."""
    return _AllReduceSum.apply(t, stats)


# ----------------------------------------------------------------------------- batch norm
def sync_bn_aux_bytes(x: torch.Tensor, world: int) -> int:
    """Bytes of the collectives of one training step of torch's ``SyncBatchNorm`` on ``x``
    (the GPU path of global batch norm): forward all-gathers each rank's C means, C inverse
    standard deviations and its count (the gathered buffer: ``world * (2C + 1)`` values),
    backward all-reduces two sums of C values. The statistics are in float32 for half and
    bfloat16 inputs (``torch.batch_norm_stats`` accumulates in float), else in ``x``'s dtype.
    """
    c = x.shape[1]
    size = 4 if x.dtype in (torch.float16, torch.bfloat16) else x.element_size()
    return (world * (2 * c + 1) + 2 * c) * size


def _global_bn_forward(self: nn.modules.batchnorm._BatchNorm, x: torch.Tensor) -> torch.Tensor:
    """BatchNorm forward with statistics over the global batch (training, >1 rank)."""
    active = self.training and dist.is_available() and dist.is_initialized()
    if not active or dist.get_world_size() < 2:
        return type(self).forward(self, x)
    factor = 0.0 if self.momentum is None else self.momentum
    if self.track_running_stats and self.num_batches_tracked is not None:
        self.num_batches_tracked.add_(1)
        if self.momentum is None:
            factor = 1.0 / float(self.num_batches_tracked)
    running = self.track_running_stats and self.running_mean is not None
    stats = getattr(self, "_pdt_comm_stats", None)
    if x.is_cuda:
        from torch.nn.modules._functions import SyncBatchNorm as _SyncBN

        world = dist.get_world_size()
        if stats is not None:
            stats.record_aux(sync_bn_aux_bytes(x, world))
        return _SyncBN.apply(
            x,
            self.weight,
            self.bias,
            self.running_mean if running else None,
            self.running_var if running else None,
            self.eps,
            factor,
            dist.group.WORLD,
            world,
        )
    # CPU: two-pass statistics from all-reduced sums, in float64 (as precise as the fused
    # one-process kernel, which accumulates in double), differentiable through the sums.
    c = x.shape[1]
    dims = [0, *range(2, x.dim())]
    shape = [1, c] + [1] * (x.dim() - 2)
    xd = x.double()
    n_local = x.numel() // max(c, 1)
    s1 = torch.cat([xd.sum(dim=dims), xd.new_tensor([float(n_local)])])
    s1 = all_reduce_sum(s1, stats)
    count = s1[-1].detach()
    if float(count) < 2:
        raise ValueError(f"batch norm needs more than 1 value per channel, got {float(count)}")
    mean = s1[:-1] / count
    xc = xd - mean.view(shape)
    var = all_reduce_sum((xc * xc).sum(dim=dims), stats) / count
    out = xc * torch.rsqrt(var + self.eps).view(shape)
    if self.weight is not None:
        out = out * self.weight.double().view(shape)
    if self.bias is not None:
        out = out + self.bias.double().view(shape)
    if running:
        with torch.no_grad():
            unbiased = var.detach() * (count / (count - 1))
            rm, rv = self.running_mean, self.running_var
            rm.mul_(1 - factor).add_(mean.detach().to(rm.dtype), alpha=factor)
            rv.mul_(1 - factor).add_(unbiased.to(rv.dtype), alpha=factor)
    return out.to(x.dtype)


def sync_batchnorm(model: nn.Module, stats: comm.CommStats | None = None) -> int:
    """Make every BatchNorm of ``model`` compute training statistics over the global batch.

    The modules keep their class (so code that asks ``type(m) is nn.BatchNorm2d`` still
    works): their ``forward`` is replaced on the instance. On a GPU the fused kernels of
    ``torch.nn.SyncBatchNorm`` run; on the CPU the sums are all-reduced by torch ops (two
    small collectives forward, two backward). Returns the number of modules changed now
    (already-synchronised ones are skipped).
    """
    changed = 0
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m._pdt_comm_stats = stats
            if "forward" not in m.__dict__:
                m.forward = types.MethodType(_global_bn_forward, m)
                changed += 1
    return changed


def unsync_batchnorm(model: nn.Module) -> int:
    """Undo :func:`sync_batchnorm`; returns the number of modules restored."""
    restored = 0
    for m in model.modules():
        if "forward" in m.__dict__ and getattr(m.forward, "__func__", None) is _global_bn_forward:
            del m.forward
            m.__dict__.pop("_pdt_comm_stats", None)
            restored += 1
    return restored


# ----------------------------------------------------------------------------- the runtime
def _parameter_signature(model: nn.Module) -> tuple[Any, ...]:
    return (
        id(model),
        tuple((id(p), tuple(p.shape), p.requires_grad) for p in model.parameters()),
    )


def _ddp_buffer_kwargs() -> dict[str, Any]:
    # Buffers are not broadcast before every forward: with global batch-norm statistics
    # every rank's running statistics are the same already (and the broadcast would be
    # communication the hook does not see).
    params = inspect.signature(nn.parallel.DistributedDataParallel.__init__).parameters
    if "forward_sync_buffers" in params:
        return {"forward_sync_buffers": False}
    return {"broadcast_buffers": False}


class DataParallel:
    """What the Trainer does differently with more than one process; a no-op with one.

    Args:
        info: this process's place in the job (:func:`current`).
        device: this rank's device.
        timing: time each gradient collective (see :class:`impl.comm.CommState`); default
            from ``$PDTBENCH_COMM_TIMING`` (on unless "0").
    """

    def __init__(self, info: DistInfo, device: torch.device, timing: bool | None = None) -> None:
        self.info = info
        self.device = device
        if timing is None:
            timing = os.environ.get(COMM_TIMING_ENV, "1") != "0"
        self.state = comm.CommState(timing=timing)
        self.stats = self.state.stats
        self.rebuilds = 0
        self._ddp: nn.Module | None = None
        self._sig: tuple[Any, ...] | None = None
        self._n_local = 0
        self._n_global = 0
        self._masks: dict[str, torch.Tensor] | None = None
        self._computed: tuple[Any, int] | None = None

    @property
    def active(self) -> bool:
        """True with more than one process."""
        return self.info.active

    @property
    def is_main(self) -> bool:
        """True on the process that writes files (rank 0)."""
        return self.info.is_main

    # -- model ------------------------------------------------------------------------------
    def prepare(self, ctx: Any, method: Any = None) -> None:
        """Wrap ``ctx.model`` (after the optimizer is built) and take the method's masks."""
        if self.active:
            self._wrap(ctx.model)
        self.refresh(ctx, method)

    def _wrap(self, model: nn.Module) -> None:
        sync_batchnorm(model, self.stats)
        old, self._ddp = self._ddp, None
        if old is not None:
            # The old reducer must go first: it holds the parameters' gradient accumulators,
            # which remember the old shapes (a reshaped parameter would then fail in backward)
            # and carry its hooks. The caller may still hold the old wrapper, so drop the
            # reducer (and the logger that refers to it) explicitly.
            for attr in ("logger", "reducer"):
                if hasattr(old, attr):
                    delattr(old, attr)
            del old
        gc.collect()
        kwargs: dict[str, Any] = dict(_ddp_buffer_kwargs())
        if self.device.type == "cuda":
            kwargs["device_ids"] = [self.device.index]
        ddp = nn.parallel.DistributedDataParallel(model, **kwargs)
        comm.register(ddp, self.state)
        self._ddp = ddp
        self.state.forget_buckets()
        self._sig = _parameter_signature(model)
        self.rebuilds += 1

    def module(self, ctx: Any) -> nn.Module:
        """The module to run forward and backward through (the DDP wrapper, or the model)."""
        return self._ddp if self._ddp is not None else ctx.model

    def refresh(self, ctx: Any, method: Any = None) -> None:
        """Rebuild the wrapper when the model's parameters changed (identity or shape), and
        take the method's communication masks (:func:`comm_masks`). Call after every step
        and after ``on_epoch_end``; every rank must call it at the same points."""
        if not self.active:
            self._masks = comm_masks(ctx, method)
            return
        if _parameter_signature(ctx.model) != self._sig:
            self._wrap(ctx.model)
        self._masks = comm_masks(ctx, method)
        if self.state.set_masks(ctx.model, self._masks):
            self._check_masks()

    def _check_masks(self) -> None:
        local = self.state.mask_digest()
        if self.info.backend == "nccl":
            local = local.to(self.device)
        lo, hi = local.clone(), local.clone()
        dist.all_reduce(lo, op=dist.ReduceOp.MIN)
        dist.all_reduce(hi, op=dist.ReduceOp.MAX)
        self.stats.record_aux(2 * local.numel() * local.element_size())
        if not torch.equal(lo, hi):
            raise DistributedError(
                f"rank {self.info.rank}: the communication masks differ between ranks; "
                "sparse Allreduce needs the same kept positions on every rank"
            )

    def release(self, ctx: Any) -> None:
        """Drop the wrapper and restore the model's own batch norm (end of training)."""
        self._ddp = None
        if self.active:
            unsync_batchnorm(ctx.model)

    # -- batches and loss -------------------------------------------------------------------
    def shard(
        self, x: torch.Tensor, y: torch.Tensor, n_global: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's share of a global batch (its sizes remembered for this step's loss).

        Without ``n_global``, ``(x, y)`` is the whole global batch and this slices the share;
        with it, ``(x, y)`` is already this rank's share (a loader after
        :meth:`impl.data.Loader.set_shard`) of a global batch of ``n_global`` samples.
        """
        if n_global is None:
            self._n_global = int(x.shape[0])
            x, y = shard(x, y, self.info)
        else:
            if n_global < x.shape[0]:
                raise ValueError(f"a share of {x.shape[0]} samples exceeds its batch {n_global}")
            self._n_global = int(n_global)
        self._n_local = int(x.shape[0])
        return x, y

    def global_loss(self, local: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """The loss a method sees: the global batch's mean cross-entropy as value, this
        rank's ``local`` mean as gradient (one 8-byte all-reduce per step)."""
        if not self.active:
            return local
        if self._n_local == 0:  # an empty share: a zero that still reaches every parameter
            local = out.float().sum() * 0.0
        t = (local.detach().double() * self._n_local).reshape(1)
        dist.all_reduce(t)
        self.stats.record_aux(t.numel() * t.element_size())
        value = (t[0] / max(self._n_global, 1)).to(local.dtype)
        # value exactly (local - local is 0), gradient local's: `local + (value - local)`
        # rounds differently on each rank, and the methods decide from this value
        return value + (local - local.detach())

    def backward_loss(self, total: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
        """What this rank differentiates: ``total / world + (n_local / n_global - 1 / world)
        * local``. Its cross-entropy gradient is then this rank's samples' part of the global
        batch's mean, ``(1 / n_global) * grad(sum of local losses)``, the scale one process
        sees (what a backward hook sees, SDGP's pruning of dL/dO with its additive rescale
        eps among them), and a regulariser a method adds counts ``1 / world`` on each rank:
        the ranks' gradients are summed (:func:`impl.comm.allreduce_hook`) to the global
        batch's mean gradient with the regulariser's once. An empty share adds
        ``total / world``."""
        if not self.active or self._n_global == 0:
            return total
        world = self.info.world_size
        if self._n_local == 0:
            return total / world
        weight = self._n_local / self._n_global - 1.0 / world
        if weight == 0.0:  # equal shares
            return total / world
        return total / world + weight * local

    def end_iteration(self, ctx: Any) -> None:
        """Close this iteration's communication tally. With one process, count the bytes
        the hook would have handed to all_reduce (:func:`impl.comm.payload_bytes`)."""
        if not self.active:
            masks = self._masks
            key = (
                _parameter_signature(ctx.model),
                None if not masks else tuple((n, id(m)) for n, m in masks.items()),
            )
            if self._computed is None or self._computed[0] != key:
                self._computed = (key, comm.payload_bytes(ctx.model, masks))
            self.stats.record(self._computed[1], 0.0, bool(masks))
        self.stats.end_iteration()

    def reduce(self, values: Sequence[float]) -> list[float]:
        """Sums of ``values`` over the ranks (float64), e.g. correct predictions and counts."""
        return sum_over_ranks(values, self.info, self.device)

    def broadcast_flag(self, flag: bool) -> bool:
        """Rank 0's ``flag`` on every rank."""
        return bool(self.broadcast_int(1 if flag else 0))

    def broadcast_int(self, value: int) -> int:
        """Rank 0's ``value`` on every rank: a decision every rank must share (the batch
        size a method chose from memory each rank measured itself)."""
        if not self.active:
            return int(value)
        t = torch.tensor([int(value)], dtype=torch.int64)
        if self.info.backend == "nccl":
            t = t.to(self.device)
        dist.broadcast(t, src=0)
        return int(t.item())

    def barrier(self) -> None:
        """Return once every rank has called it (e.g. after rank 0 wrote a file that the
        others' exit would otherwise race)."""
        if self.active:
            self.reduce([0.0])

    # -- reporting --------------------------------------------------------------------------
    def epoch_metrics(self, ctx: Any) -> dict[str, Any]:
        """Communication metrics of the epoch just trained, then a fresh epoch tally.

        With several processes: measured in the hook (``comm_bytes_source`` "measured").
        With one: the bytes the hook would have handed to all_reduce, computed per
        iteration from the model and the method's masks in force ("computed").
        """
        row: dict[str, Any] = {"world_size": self.info.world_size}
        row.update(self.stats.epoch_metrics(timed=self.state.timing))
        if self.active:
            row["comm_bytes_source"] = "measured"
        else:
            for key in ("comm_ms", "comm_aux_bytes_per_iter", "comm_calls_per_iter"):
                row.pop(key, None)  # nothing was sent
            row["comm_bytes_source"] = "computed"
        self.stats.reset_epoch()
        return row

    def summary(self, last_row: dict[str, Any], ctx: Any) -> dict[str, Any]:
        """The communication fields of summary.json (from the last epoch's metrics)."""
        keys = (
            "comm_bytes_per_iter",
            "comm_bytes_source",
            "comm_ms",
            "comm_aux_bytes_per_iter",
            "comm_sparse_iters",
        )
        out = {k: last_row[k] for k in keys if k in last_row}
        if "comm_bytes_per_iter" not in out:
            out["comm_bytes_per_iter"] = comm.payload_bytes(ctx.model, self._masks)
            out["comm_bytes_source"] = "computed"
        out.update(
            world_size=self.info.world_size,
            distributed_backend=self.info.backend,
            global_batchnorm=self.active,
            comm_timing=self.state.timing if self.active else None,
            ddp_rebuilds=self.rebuilds,
        )
        return out


def comm_masks(ctx: Any, method: Any = None) -> dict[str, torch.Tensor] | None:
    """The method's fixed communication masks: ``method.comm_masks(ctx)`` when the method
    has that hook and it returns a dict, else ``ctx.extra["comm_masks"]``, else None."""
    hook = getattr(method, "comm_masks", None)
    masks = hook(ctx) if callable(hook) else None
    if masks is None:
        masks = getattr(ctx, "extra", {}).get("comm_masks")
    return masks or None


__all__ = [
    "COMM_TIMING_ENV",
    "DEFAULT_TIMEOUT_S",
    "EXIT_DIST_FAILURE",
    "EXIT_PEER_STOPPED",
    "LAUNCHED_ENV",
    "TIMEOUT_ENV",
    "DataParallel",
    "DistInfo",
    "DistributedError",
    "all_reduce_sum",
    "backend_for",
    "comm_masks",
    "current",
    "describe_failure",
    "env_world",
    "free_port",
    "init_from_env",
    "init_process_group",
    "launch",
    "rank_device",
    "local_gpu",
    "gpu_shortage",
    "run_worker",
    "shard",
    "shard_bounds",
    "shutdown",
    "sum_over_ranks",
    "sync_batchnorm",
    "sync_bn_aux_bytes",
    "timeout_seconds",
    "torchrun_command",
    "unsync_batchnorm",
    "write_stderr_line",
]


def write_stderr_line(line: str) -> None:
    """Write ``line`` and its newline to standard error in one write: the ranks and
    torchrun's agent write to the same pipe, and a line printed in two writes (text, then
    its newline) was cut by one of theirs. A standard error without a file descriptor (a
    captured one) is written as a stream."""
    sys.stderr.flush()
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # a stream without a descriptor (captured)
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
        return
    os.write(fd, (line + "\n").encode(errors="replace"))


def run_worker(
    fn: Any, device: str = "auto", timeout_s: float | None = None, prog: str = "pdtbench train"
) -> Any:
    """Run ``fn()`` in this torchrun worker's process group and return its result.

    Joins the group torchrun describes (a single process without torchrun just runs ``fn``).
    When ``fn`` raises in a distributed run, prints one line saying which rank failed and
    why (after the traceback, unless a peer's failure caused it) and ends the process at once,
    so that no rank waits on a dead peer at exit: with status :data:`EXIT_DIST_FAILURE`, or
    :data:`EXIT_PEER_STOPPED` where a peer's failure caused it.
    Stopped by a signal (a :class:`KeyboardInterrupt`: Ctrl-C, or SIGTERM where the caller
    raises one for it, its ``exit_code`` attribute then the status), a rank ends at once
    with that status (default 130): without a traceback, with one line naming the rank under
    a torchrun of the user's own, and silently under :func:`launch`, whose caller says what
    was kept.
    """
    info = init_from_env(device, timeout_s)
    if not info.active:
        return fn()
    try:
        result = fn()
    except KeyboardInterrupt as stop:
        code = int(getattr(stop, "exit_code", 130))
        if os.environ.get(LAUNCHED_ENV) != "1":
            how = "SIGTERM" if code == 143 else "Ctrl-C" if code == 130 else f"status {code}"
            write_stderr_line(f"{prog}: stopped ({how}) on rank {info.rank} of {info.world_size}")
        sys.stdout.flush()
        os._exit(code)
    except BaseException as err:  # noqa: BLE001 - every failure ends this rank the same way
        import traceback

        if getattr(err, "same_on_every_rank", False):  # one line, from rank 0 alone
            if info.is_main:
                write_stderr_line(f"{prog}: error: {err}")
            sys.stdout.flush()
            os._exit(EXIT_DIST_FAILURE)
        peer = isinstance(err, dist.DistError) or _looks_like_comm_failure(str(err))
        if not peer:
            traceback.print_exc()
        write_stderr_line(f"{prog}: error: {describe_failure(err, info)}")
        sys.stdout.flush()
        os._exit(EXIT_PEER_STOPPED if peer else EXIT_DIST_FAILURE)
    shutdown()
    return result
