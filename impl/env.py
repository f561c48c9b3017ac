"""What ran where: commit, library versions, CPU, GPU (through NVML), clocks, TF32 flags.

``collect()`` returns a flat, JSON-serialisable dict recorded with every run and benchmark;
``format_env(info)`` renders it as a two-column table (``pdtbench env``). Nothing here
touches the GPU at import; ``collect()`` reads the GPU through NVML (no CUDA context) and
never raises: a field it cannot fill is None, with the reason in ``nvml_error`` (GPU) or
left as None (versions of packages that are not installed). Where NVML cannot be used
(``pynvml`` not installed, or NVML failing), the GPU fields come from ``nvidia-smi`` and
then from ``torch.cuda`` (which creates a CUDA context, so only when torch sees a GPU);
``gpu_source`` says which one filled them.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = [
    "REPO_ROOT",
    "collect",
    "format_env",
    "git_state",
    "gpu_info",
    "gpu_info_nvidia_smi",
    "gpu_info_torch",
    "python_executable",
    "tf32_enabled",
]

#: The checkout this package was imported from (its parent of ``impl/``).
REPO_ROOT = Path(__file__).resolve().parent.parent

_GPU_FIELDS = (
    "gpu_name",
    "gpu_driver",
    "gpu_memory_mib",
    "gpu_sm_clock_mhz",
    "gpu_mem_clock_mhz",
    "gpu_sm_clock_max_mhz",
    "gpu_mem_clock_max_mhz",
    "gpu_power_limit_w",
)


#: git pathspecs of what ``dirty`` leaves out: results, not code (:func:`git_state`).
_NOT_CODE = (":(exclude)reports",)

#: Environment variables recorded with every result where set: the GPUs and threads a run
#: sees, those that change float32 math or memory behind torch's flags, and which N:M
#: pruning path runs on the CPU (impl.ops.nm_cpu).
RECORDED_ENV_VARS: tuple[str, ...] = (
    "CUDA_VISIBLE_DEVICES",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "NVIDIA_TF32_OVERRIDE",
    "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE",
    "CUBLAS_WORKSPACE_CONFIG",
    "PYTORCH_NO_CUDA_MEMORY_CACHING",
    "PDT_CPU_KERNELS",
    "CC",
)


def git_state(root: str | Path = REPO_ROOT) -> tuple[str | None, bool | None]:
    """(commit, dirty) of the git checkout at ``root``; outside a checkout (None, None), or
    (``$PDTBENCH_COMMIT``, None) where that variable names the commit a copy was made at.

    ``commit`` is the 40-hex SHA of HEAD; ``dirty`` is True when tracked files differ from
    HEAD (untracked files do not count, nor the published results under ``reports/``: the
    runs rewrite those, and a GPU session unpacks each part's results into its tree before
    the next part runs, so committed results there must not mark the next ones dirty).
    """

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(
                ["git", "-C", str(root), *args],
                capture_output=True,
                text=True,
                timeout=10,
                check=True,
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip()

    commit = git("rev-parse", "HEAD")
    if not commit:
        # A copy of the tree without git (a lent GPU machine): the commit it was copied at,
        # where the copy says (PDTBENCH_COMMIT; scripts/gpu set it from .gpu/commit.txt);
        # whether it differs from that commit is unknown.
        named = os.environ.get("PDTBENCH_COMMIT", "").strip()
        return (named or None), None
    status = git("status", "--porcelain", "--untracked-files=no", "--", ".", *_NOT_CODE)
    return commit, (None if status is None else bool(status))


def _version(*dists: str) -> str | None:
    """Installed version of the first of ``dists`` found, from package metadata (no import)."""
    for dist in dists:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def _cupy_version() -> str | None:
    # CuPy ships as cupy-cudaXXx wheels; read the metadata rather than importing it (an
    # import can be slow or fail on a mismatched CUDA).
    try:
        names = sorted(
            d.metadata["Name"]
            for d in metadata.distributions()
            if (d.metadata["Name"] or "").lower().startswith("cupy")
        )
    except Exception:  # a broken environment must not break a run
        names = []
    return _version(*names) if names else None


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _visible_gpu_selector(gpu: int = 0) -> str | None:
    """How NVML and nvidia-smi name the GPU CUDA calls ``gpu`` in this process: entry
    ``gpu`` of CUDA_VISIBLE_DEVICES (an index, or a ``GPU-``/``MIG-`` UUID), ``str(gpu)``
    where it is unset, and None where CUDA sees no such GPU: set empty, a negative index, or
    an entry CUDA cannot read at or before that one (CUDA stops at such an entry, so with the
    first it sees no GPU: Slurm's ``NoDevFiles`` for a job given none, say)."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return str(gpu)
    readable = []
    for entry in (e.strip() for e in value.split(",")):
        if not (entry.isdigit() or entry.startswith(("GPU-", "MIG-"))):
            break
        readable.append(entry)
    return readable[gpu] if gpu < len(readable) else None


_CUDA_UUID_RE = re.compile(r"[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}")


def _torch_gpu_uuid(gpu: int) -> str | None:
    """NVML's name (``GPU-<uuid>``) of the GPU CUDA calls ``gpu``, read from torch where torch
    has already set CUDA up (so no context is created) and the GPU is known by an index; else
    None.

    An index can name another card: CUDA puts the fastest GPU first unless
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, NVML goes by PCI bus, so on a node of mixed GPUs CUDA's
    ``cuda:N`` need not be NVML's GPU N; a UUID names one card in both. A ``GPU-``/``MIG-``
    entry of ``CUDA_VISIBLE_DEVICES`` names it already (a MIG slice by its own UUID), and is
    kept. torch writes the UUID as 8-4-4-4-12 hex digits; anything else (or a failing query)
    gives None."""
    selector = _visible_gpu_selector(gpu)
    if selector is None or not selector.isdigit():
        return None
    torch = sys.modules.get("torch")
    try:
        if torch is None or not torch.cuda.is_initialized():
            return None
        text = str(torch.cuda.get_device_properties(gpu).uuid).lower()
    except Exception:  # metadata must never break a run
        return None
    return f"GPU-{text}" if _CUDA_UUID_RE.fullmatch(text) else None


def current_gpu() -> int:
    """The CUDA index of this process's current GPU where torch has set CUDA up (a run or a
    benchmark chose its GPU), else 0; creates no CUDA context and imports nothing."""
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            return int(torch.cuda.current_device())
    except Exception:  # metadata must never break a run
        pass
    return 0


def _decode(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


def gpu_info(gpu: int | None = None) -> dict[str, Any]:
    """GPU fields of ``collect()`` for the GPU CUDA calls ``gpu`` in this process (None: the
    current one, :func:`current_gpu`): NVML, else nvidia-smi, else torch. The card is found by
    its UUID where torch has set CUDA up (CUDA and NVML may number GPUs differently), else by
    its ``CUDA_VISIBLE_DEVICES`` entry.

    Keys: ``gpu_name``, ``gpu_driver``, ``gpu_memory_mib`` (total, MiB),
    ``gpu_sm_clock_mhz`` / ``gpu_mem_clock_mhz`` (current clocks, MHz),
    ``gpu_sm_clock_max_mhz`` / ``gpu_mem_clock_max_mhz`` (maximum clocks, MHz),
    ``gpu_power_limit_w`` (enforced power limit, W), ``gpu_count`` (all GPUs seen),
    ``gpus`` (a name per GPU), ``nvml_error`` (None, or why NVML could not be used) and
    ``gpu_source`` (``"nvml"``, ``"nvidia-smi"``, ``"torch"`` or None when no GPU was found).
    When NVML fails, :func:`gpu_info_nvidia_smi` and then :func:`gpu_info_torch` fill what
    they can (torch knows no clocks, power limit or driver version: those stay None).
    """
    gpu = current_gpu() if gpu is None else gpu
    info = _gpu_info_nvml(gpu)
    if info["gpu_name"] is not None:
        info["gpu_source"] = "nvml"
        return info
    for source, fallback in (("nvidia-smi", gpu_info_nvidia_smi), ("torch", gpu_info_torch)):
        try:
            found = fallback(gpu=gpu)
        except Exception:  # metadata must never break a run
            found = None
        if found and found.get("gpu_name"):
            for key, value in found.items():
                if value is not None or key not in info:
                    info[key] = value
            info["gpu_source"] = source
            return info
    return info


def _to_number(text: str, kind: type) -> Any:
    text = text.strip()
    try:
        return kind(float(text))
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None


#: The nvidia-smi query of :func:`gpu_info_nvidia_smi`, in the order of its columns.
_SMI_QUERY = (
    "name",
    "driver_version",
    "memory.total",
    "clocks.sm",
    "clocks.mem",
    "clocks.max.sm",
    "clocks.max.mem",
    "power.limit",
)


def gpu_info_nvidia_smi(timeout_s: float = 20.0, gpu: int = 0) -> dict[str, Any] | None:
    """GPU fields read from ``nvidia-smi --query-gpu=... --format=csv,noheader,nounits``.

    The GPU CUDA calls ``gpu`` (its ``CUDA_VISIBLE_DEVICES`` entry, an index or a UUID) gives
    the fields; ``gpu_count`` and ``gpus`` list every GPU nvidia-smi sees. Memory in MiB,
    clocks in MHz, power in W. None when nvidia-smi is missing, fails or lists no GPU.
    """
    base = ["nvidia-smi", f"--query-gpu={','.join(_SMI_QUERY)}", "--format=csv,noheader,nounits"]

    def query(*extra: str) -> list[list[str]] | None:
        try:
            out = subprocess.run(
                [*base, *extra], capture_output=True, text=True, timeout=timeout_s, check=True
            )
        except (OSError, subprocess.SubprocessError):
            return None
        rows = [[c.strip() for c in line.split(",")] for line in out.stdout.splitlines()]
        return [r for r in rows if len(r) == len(_SMI_QUERY)] or None

    selector = _visible_gpu_selector(gpu)
    every = query() if selector is not None else None
    if not every:
        return None
    uuid = _torch_gpu_uuid(gpu)  # the card torch runs on, where CUDA numbers GPUs otherwise
    chosen = (query("-i", uuid) if uuid is not None else None) or query("-i", selector)
    if not chosen and selector.isdigit():
        return None  # an index past the last GPU: CUDA sees none
    chosen = chosen or every  # a UUID nvidia-smi does not take (MIG): the first it lists
    row = dict(zip(_SMI_QUERY, chosen[0]))
    return {
        "gpu_name": row["name"] or None,
        "gpu_driver": row["driver_version"] or None,
        "gpu_memory_mib": _to_number(row["memory.total"], int),
        "gpu_sm_clock_mhz": _to_number(row["clocks.sm"], int),
        "gpu_mem_clock_mhz": _to_number(row["clocks.mem"], int),
        "gpu_sm_clock_max_mhz": _to_number(row["clocks.max.sm"], int),
        "gpu_mem_clock_max_mhz": _to_number(row["clocks.max.mem"], int),
        "gpu_power_limit_w": _to_number(row["power.limit"], float),
        "gpu_count": len(every),
        "gpus": [r[0] for r in every],
    }


def gpu_info_torch(gpu: int | None = None) -> dict[str, Any] | None:
    """GPU fields from ``torch.cuda`` (name, total memory in MiB, count) for GPU ``gpu``
    (None: the current device).

    Only where ``torch.cuda.is_available()``: reading the properties creates a CUDA context.
    Also ``gpu_cuda_runtime`` (``torch.version.cuda``). None without a usable GPU.
    """
    try:
        import torch
    except ImportError:
        return None
    if torch.version.cuda is None or not torch.cuda.is_available():
        return None
    count = torch.cuda.device_count()
    index = torch.cuda.current_device() if gpu is None else gpu
    props = torch.cuda.get_device_properties(index)
    return {
        "gpu_name": torch.cuda.get_device_name(index),
        "gpu_memory_mib": int(props.total_memory) // 2**20,
        "gpu_count": count,
        "gpus": [torch.cuda.get_device_name(i) for i in range(count)],
        "gpu_cuda_runtime": torch.version.cuda,
    }


def _gpu_info_nvml(gpu: int = 0) -> dict[str, Any]:
    """The GPU fields of the GPU CUDA calls ``gpu``, read through NVML (``pynvml``); None
    fields and ``nvml_error`` if not."""
    info: dict[str, Any] = dict.fromkeys(_GPU_FIELDS)
    info.update(gpu_count=None, gpus=None, nvml_error=None, gpu_source=None)
    try:
        import pynvml
    except ImportError as exc:
        info["nvml_error"] = f"pynvml (nvidia-ml-py) not importable: {exc}"
        return info
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError subclasses, OSError from the loader
        info["nvml_error"] = f"NVML unavailable: {type(exc).__name__}: {exc}"
        return info
    try:
        count = pynvml.nvmlDeviceGetCount()
        info["gpu_count"] = count
        info["gpus"] = [
            _decode(pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i)))
            for i in range(count)
        ]
        info["gpu_driver"] = _decode(pynvml.nvmlSystemGetDriverVersion())
        if count == 0:
            info["nvml_error"] = "NVML sees no GPU"
            return info
        # The card torch runs on, by UUID; else (no CUDA set up yet, a UUID NVML does not
        # find) the process's CUDA_VISIBLE_DEVICES entry, an index taken as NVML's.
        handle = _nvml_handle_by_uuid(pynvml, _torch_gpu_uuid(gpu))
        if handle is None:
            handle = _nvml_handle_visible(pynvml, gpu, count, info)
            if handle is None:
                return info
        info["gpu_name"] = _decode(pynvml.nvmlDeviceGetName(handle))
        info["gpu_memory_mib"] = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total) // 2**20
        for key, query, clock in (
            ("gpu_sm_clock_mhz", pynvml.nvmlDeviceGetClockInfo, pynvml.NVML_CLOCK_SM),
            ("gpu_mem_clock_mhz", pynvml.nvmlDeviceGetClockInfo, pynvml.NVML_CLOCK_MEM),
            ("gpu_sm_clock_max_mhz", pynvml.nvmlDeviceGetMaxClockInfo, pynvml.NVML_CLOCK_SM),
            ("gpu_mem_clock_max_mhz", pynvml.nvmlDeviceGetMaxClockInfo, pynvml.NVML_CLOCK_MEM),
        ):
            try:
                info[key] = int(query(handle, clock))
            except Exception:  # some GPUs (MIG, vGPU) refuse clock queries
                info[key] = None
        try:
            info["gpu_power_limit_w"] = pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0
        except Exception:
            info["gpu_power_limit_w"] = None
    except Exception as exc:  # report, never crash a run over metadata
        info["nvml_error"] = f"NVML query failed: {type(exc).__name__}: {exc}"
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
    return info


def _nvml_handle_visible(pynvml: Any, gpu: int, count: int, info: dict[str, Any]) -> Any:
    """NVML's handle of CUDA's GPU ``gpu`` through its ``CUDA_VISIBLE_DEVICES`` entry (an index
    is taken as NVML's); None, with the reason in ``info["nvml_error"]``, where CUDA sees none."""
    selector = _visible_gpu_selector(gpu)
    if selector is None:
        info["nvml_error"] = (
            "CUDA_VISIBLE_DEVICES hides every GPU from this process"
            if _visible_gpu_selector(0) is None
            else f"CUDA_VISIBLE_DEVICES shows this process no GPU {gpu}"
        )
        return None
    if selector.isdigit() and int(selector) >= count:
        info["nvml_error"] = (
            f"CUDA_VISIBLE_DEVICES names GPU {selector} and NVML sees {count}: CUDA sees none"
        )
        return None
    if selector.isdigit():
        return pynvml.nvmlDeviceGetHandleByIndex(int(selector))
    return pynvml.nvmlDeviceGetHandleByUUID(selector.encode())


def _nvml_handle_by_uuid(pynvml: Any, uuid: str | None) -> Any:
    """NVML's handle of the GPU of UUID ``uuid``; None for None or a UUID NVML does not find."""
    if uuid is None:
        return None
    try:
        return pynvml.nvmlDeviceGetHandleByUUID(uuid.encode())
    except Exception:  # NVMLError_NotFound: a MIG instance's UUID, say
        return None


def tf32_enabled() -> tuple[bool, bool]:
    """Whether float32 matmuls (cuBLAS) and cuDNN convolutions may run in TF32: torch's
    ``allow_tf32`` flags, or, where the process set torch's per-backend ``fp32_precision``
    instead (after which reading the old flag raises), that setting being ``"tf32"``."""
    import torch

    try:
        matmul = bool(torch.backends.cuda.matmul.allow_tf32)
    except RuntimeError:
        matmul = torch.backends.cuda.matmul.fp32_precision == "tf32"
    try:
        conv = bool(torch.backends.cudnn.allow_tf32)
    except RuntimeError:
        conv = torch.backends.cudnn.conv.fp32_precision == "tf32"
    return matmul, conv


def _torch_info() -> dict[str, Any]:
    try:
        import torch
    except ImportError as exc:
        return {"torch": None, "torch_error": str(exc)}
    cudnn = None
    try:
        cudnn = torch.backends.cudnn.version()
    except Exception:
        cudnn = None
    try:  # the vector ISA torch's CPU kernels dispatch to; it can change float rounding
        cpu_capability = torch.backends.cpu.get_cpu_capability()
    except Exception:
        cpu_capability = None
    tf32_matmul, tf32_cudnn = tf32_enabled()
    return {
        "torch": torch.__version__,
        "cpu_capability": cpu_capability,
        "cuda": torch.version.cuda,
        "cudnn": cudnn,
        "torch_threads": torch.get_num_threads(),
        "tf32_matmul": tf32_matmul,
        "tf32_cudnn": tf32_cudnn,
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
    }


def python_executable(root: str | Path = REPO_ROOT) -> str:
    """The interpreter running this process: relative to the checkout ``root`` where it lives
    inside it (e.g. ``.venv/bin/python``), so that results carried between machines name no
    path of the machine that made them; the absolute path otherwise."""
    exe = Path(sys.executable)
    for base in (Path(root), Path(root).resolve()):
        if exe.is_relative_to(base):
            return exe.relative_to(base).as_posix()
    return str(exe)


def collect(gpu: int | None = None) -> dict[str, Any]:
    """The environment of this process, as a flat JSON-serialisable dict; its GPU fields
    describe the GPU CUDA calls ``gpu`` here (None: the current one, :func:`current_gpu`).

    Keys: ``commit`` (40-hex HEAD SHA or None), ``dirty`` (bool, None outside a checkout),
    ``date`` (UTC, ISO 8601), ``python``, ``torch``, ``cuda`` (``torch.version.cuda``),
    ``cudnn`` (int, e.g. 90100, or None), ``cupy``, ``numpy`` (versions or None),
    ``python_executable`` (:func:`python_executable`), ``platform``, ``cpu_model``,
    ``cpu_capability`` (the vector instruction set torch's CPU kernels use, e.g. ``"AVX2"`` or
    ``"AVX512"``: two CPUs of one model name can differ, and so can their float results),
    ``cpu_count`` (logical cores), ``cpu_affinity`` (cores this
    process may use), ``torch_threads``, ``tf32_matmul`` / ``tf32_cudnn`` (the
    ``allow_tf32`` flags), ``cudnn_benchmark``, ``float32_matmul_precision``, the GPU fields
    of ``gpu_info()``,
    and ``env_vars`` (the thread and device variables that change timings).
    """
    commit, dirty = git_state()
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = None
    info: dict[str, Any] = {
        "commit": commit,
        "dirty": dirty,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "python_executable": python_executable(),
    }
    info.update(_torch_info())
    info.update(
        {
            "cupy": _cupy_version(),
            "numpy": _version("numpy"),
            "platform": platform.platform(),
            "cpu_model": _cpu_model(),
            "cpu_count": os.cpu_count(),
            "cpu_affinity": affinity,
        }
    )
    info.update(gpu_info(gpu))
    info["env_vars"] = {k: os.environ[k] for k in RECORDED_ENV_VARS if k in os.environ}
    return info


def format_env(info: dict[str, Any]) -> str:
    """A two-column, human-readable table of ``info`` (as returned by ``collect()``)."""
    rows: list[tuple[str, str]] = []
    for key, value in info.items():
        if isinstance(value, dict):
            text = ", ".join(f"{k}={v}" for k, v in value.items()) or "-"
        elif isinstance(value, (list, tuple)):
            text = "; ".join(str(v) for v in value) or "-"
        elif value is None:
            text = "-"
        else:
            text = str(value)
        rows.append((key, text))
    width = max((len(k) for k, _ in rows), default=0)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)
