"""Print (and save as JSON) what a GPU run ran on, and check that the modules it needs import.

    python scripts/gpu/env_report.py [--json PATH] [--import MODULE ...] [--quiet]

Reports the Python, torch (CUDA, cuDNN, cuSPARSELt, the GPU's name, capability, SMs and
memory), CuPy (CUDA runtime, driver, NVRTC, the -arch option its RawModule passes to NVRTC),
the versions of the packages the device scripts use, the tools (nvidia-smi, nvcc,
compute-sanitizer, ncu, git) and the commit. Nothing here fails for want of a GPU or CuPy: each
missing piece is reported as such. Exit status 1 when a module named by ``--import`` fails to
import (the script's later steps would fail the same way), else 0. Used by every
``scripts/gpu/*.sh`` as its first step (docs/gpu-session.md).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: Distributions whose versions are reported (absent ones as None).
PACKAGES: tuple[str, ...] = (
    "torch",
    "cupy-cuda13x",
    "cupy-cuda12x",
    "triton",
    "numpy",
    "pandas",
    "scipy",
    "scikit-learn",
    "matplotlib",
    "seaborn",
    "jinja2",
    "pytest",
    "pytest-benchmark",
    "pytest-xdist",
    "pytest-timeout",
    "asv",
    "asv-runner",
    "mlxtend",
    "nvidia-ml-py",
    "setuptools",
)
#: Where compute-sanitizer lives when it is not on the PATH (CUDA toolkit layouts).
SANITIZER_GLOBS: tuple[str, ...] = (
    "/usr/local/cuda/bin/compute-sanitizer",
    "/usr/local/cuda-*/bin/compute-sanitizer",
    "/usr/local/cuda*/compute-sanitizer/compute-sanitizer",
    "/opt/nvidia/*/compute-sanitizer",
)


def find_tool(name: str, globs: Sequence[str] = ()) -> str | None:
    """The path of executable ``name``: the PATH first, then the first match of ``globs``."""
    found = shutil.which(name)
    if found:
        return found
    import glob

    for pattern in globs:
        for path in sorted(glob.glob(pattern)):
            if os.access(path, os.X_OK):
                return path
    return None


def _run(cmd: Sequence[str], timeout: float = 20.0) -> str | None:
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError) as err:
        return f"({type(err).__name__}: {err})"
    return (res.stdout + res.stderr).strip()


def versions(packages: Sequence[str] = PACKAGES) -> dict[str, str | None]:
    """``{distribution: version or None}`` as installed for this interpreter (and PYTHONPATH)."""
    out: dict[str, str | None] = {}
    for name in packages:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def torch_info() -> dict[str, Any]:
    """torch's build and, where CUDA is usable, the GPU it sees (initialises CUDA then)."""
    try:
        import torch
    except Exception as err:  # noqa: BLE001 - reported, not raised
        return {"error": f"{type(err).__name__}: {err}"}
    info: dict[str, Any] = {
        "version": torch.__version__,
        "cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
    }
    lt = getattr(torch.backends, "cusparselt", None)
    try:
        info["cusparselt"] = lt.version() if lt is not None and lt.is_available() else None
    except Exception as err:  # noqa: BLE001
        info["cusparselt"] = f"({type(err).__name__}: {err})"
    if info["cuda_available"]:
        props = torch.cuda.get_device_properties(0)
        info.update(
            device_count=torch.cuda.device_count(),
            name=props.name,
            capability=f"{props.major}.{props.minor}",
            multiprocessors=props.multi_processor_count,
            memory_gib=round(props.total_memory / 2**30, 1),
            l2_mib=round(getattr(props, "L2_cache_size", 0) / 2**20, 1) or None,
        )
    return info


def cupy_info(gpu: bool) -> dict[str, Any]:
    """CuPy's version and CUDA libraries; with ``gpu``, the NVRTC -arch option it would use."""
    try:
        import cupy
    except Exception as err:  # noqa: BLE001
        return {"error": f"{type(err).__name__}: {err}"}
    info: dict[str, Any] = {"version": cupy.__version__}
    try:
        from cupy.cuda import nvrtc, runtime

        info["nvrtc"] = ".".join(map(str, nvrtc.getVersion()))
        info["runtime"] = runtime.runtimeGetVersion()
        if gpu:
            info["driver"] = runtime.driverGetVersion()
            from cupy.cuda import compiler

            info["nvrtc_arch_option"] = compiler._get_arch_for_options_for_nvrtc()[0]
    except Exception as err:  # noqa: BLE001
        info["error"] = f"{type(err).__name__}: {err}"
    return info


def tools() -> dict[str, Any]:
    """Paths and version lines of nvidia-smi, nvcc, compute-sanitizer, ncu and git."""
    out: dict[str, Any] = {}
    for name, args, globs in (
        ("nvidia-smi", ["--version"], ()),
        ("nvcc", ["--version"], ("/usr/local/cuda/bin/nvcc",)),
        ("compute-sanitizer", ["--version"], SANITIZER_GLOBS),
        ("ncu", ["--version"], ("/usr/local/cuda/bin/ncu", "/opt/nvidia/nsight-compute/*/ncu")),
        ("git", ["--version"], ()),
    ):
        path = find_tool(name, globs)
        text = _run([path, *args]) if path else None
        out[name] = {"path": path, "version": text.splitlines()[-1] if text else None}
    return out


def check_imports(modules: Sequence[str]) -> dict[str, str]:
    """``{module: "ok" or the error}`` after importing each of ``modules``."""
    out = {}
    for mod in modules:
        try:
            importlib.import_module(mod)
        except Exception as err:  # noqa: BLE001 - every failure is reported
            out[mod] = f"{type(err).__name__}: {err}"
        else:
            out[mod] = "ok"
    return out


def collect(imports: Sequence[str] = (), full: bool = True) -> dict[str, Any]:
    """Everything this module reports, as one JSON-able dict."""
    info: dict[str, Any] = {
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": platform.node(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "cwd": os.getcwd(),
        "env": {
            k: os.environ.get(k)
            for k in ("PYTHONPATH", "ASV_PYTHONPATH", "CUDA_VISIBLE_DEVICES", "DRY_RUN", "OUT")
        },
    }
    if full:
        info["packages"] = versions()
        info["torch"] = torch_info()
        info["cupy"] = cupy_info(bool(info["torch"].get("cuda_available")))
        info["tools"] = tools()
        info["git_commit"] = _run(["git", "rev-parse", "HEAD"]) if shutil.which("git") else None
        smi = find_tool("nvidia-smi")
        info["nvidia_smi"] = _run([smi]) if smi else None
    info["imports"] = check_imports(imports)
    return info


def main(argv: Sequence[str] | None = None) -> int:
    """Command line; returns 1 when an import failed, else 0."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", type=Path, help="also write the report here")
    p.add_argument("--import", dest="imports", nargs="*", default=[], help="modules to import")
    p.add_argument("--quiet", action="store_true", help="only the import check")
    args = p.parse_args(argv)
    info = collect(args.imports, full=not args.quiet)
    if not args.quiet:
        if info.get("nvidia_smi"):
            print(info["nvidia_smi"])
        shown = {k: v for k, v in info.items() if k not in ("nvidia_smi", "imports")}
        print(json.dumps(shown, indent=1, default=str))
    for mod, status in info["imports"].items():
        print(f"import {mod}: {status}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(info, indent=1, default=str) + "\n")
    return 0 if all(s == "ok" for s in info["imports"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
