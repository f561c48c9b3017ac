"""Peak FLOP/s and memory bandwidth of the GPUs the benchmarks run on, every number with its source.

The figures are the vendor's data-sheet peaks (boost clock, dense: NVIDIA's Hopper and
Ampere data sheets print tensor-core figures "with sparsity", twice the dense figure, and
the dense figure is that number halved, as the data sheets' footnotes say). They bound what
a kernel can reach; the benchmarks also *measure* a copy bandwidth and a GEMM rate on the
machine (suite ``calibration`` of :mod:`bench.cases`) and report fractions of both.

:func:`lookup` matches the name NVML reports (``impl.env.gpu_info()["gpu_name"]``) and
raises :class:`UnknownGPUError` on a GPU that is not in the table, rather than guess.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MATHS: tuple[str, ...] = ("fp32", "tf32", "bf16", "fp16")


class UnknownGPUError(ValueError):
    """The GPU is not in the table of peaks (add a row with its source)."""


@dataclass(frozen=True)
class GPUPeaks:
    """Data-sheet peaks of one GPU model.

    Args:
        key: short name of the model (e.g. ``"H100-SXM5"``).
        pattern: regular expression (case-insensitive, searched) matching NVML names.
        fp32_tflops: FP32 on CUDA cores (no tensor cores), TFLOP/s.
        tf32_tflops: TF32 tensor cores, dense, TFLOP/s (None: no TF32 unit).
        bf16_tflops: BF16 tensor cores, dense, TFLOP/s (None: no BF16 unit).
        fp16_tflops: FP16 tensor cores, dense, TFLOP/s.
        mem_gbps: DRAM bandwidth, GB/s (1 GB = 1e9 bytes).
        source: where the numbers come from.
    """

    key: str
    pattern: str
    fp32_tflops: float
    tf32_tflops: float | None
    bf16_tflops: float | None
    fp16_tflops: float | None
    mem_gbps: float
    source: str

    def tflops(self, math: str) -> float:
        """Peak TFLOP/s for ``math`` (in :data:`MATHS`); ValueError if the GPU lacks the unit."""
        if math not in MATHS:
            raise ValueError(f"unknown math {math!r}; valid: {', '.join(MATHS)}")
        value = getattr(self, f"{math}_tflops")
        if value is None:
            raise ValueError(f"{self.key} has no {math} unit (source: {self.source})")
        return float(value)


_H100 = "NVIDIA H100 Tensor Core GPU data sheet, https://www.nvidia.com/en-us/data-center/h100/"
_H200 = "NVIDIA H200 Tensor Core GPU data sheet, https://www.nvidia.com/en-us/data-center/h200/"
_A100 = (
    "NVIDIA A100 Tensor Core GPU data sheet, https://www.nvidia.com/content/dam/en-zz/"
    "Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"
)
_RTX5000 = (
    "NVIDIA Quadro RTX 5000 data sheet, https://www.nvidia.com/content/dam/en-zz/Solutions/"
    "design-visualization/quadro-product-literature/quadro-rtx-5000-data-sheet-us-nvidia-704120-r4-web.pdf"
)
_HALVED = "; tensor-core figures are the data sheet's with-sparsity numbers halved"

#: Most specific patterns first: the first match wins.
TABLE: tuple[GPUPeaks, ...] = (
    GPUPeaks("H100-NVL", r"\bh100\b.*\bnvl\b", 60.0, 417.5, 835.5, 835.5, 3900.0, _H100 + _HALVED),
    GPUPeaks(
        "H100-PCIe",
        r"\bh100\b.*\bpcie\b",
        51.0,
        378.0,
        756.5,
        756.5,
        2000.0,
        _H100 + " (PCIe form factor)" + _HALVED,
    ),
    GPUPeaks(
        "H100-SXM5", r"\bh100\b.*(\bsxm|hbm3\b)", 67.0, 494.5, 989.5, 989.5, 3350.0, _H100 + _HALVED
    ),
    GPUPeaks("H200-NVL", r"\bh200\b.*\bnvl\b", 60.0, 417.5, 835.5, 835.5, 4800.0, _H200 + _HALVED),
    GPUPeaks("H200-SXM", r"\bh200\b", 67.0, 494.5, 989.5, 989.5, 4800.0, _H200 + _HALVED),
    GPUPeaks(
        "A100-SXM4-80GB", r"\ba100\b.*sxm4.*80\s*gb", 19.5, 156.0, 312.0, 312.0, 2039.0, _A100
    ),
    GPUPeaks(
        "A100-SXM4-40GB", r"\ba100\b.*sxm4.*40\s*gb", 19.5, 156.0, 312.0, 312.0, 1555.0, _A100
    ),
    GPUPeaks(
        "A100-PCIe-80GB", r"\ba100\b.*80\s*gb.*pcie", 19.5, 156.0, 312.0, 312.0, 1935.0, _A100
    ),
    GPUPeaks(
        "A100-PCIe-40GB", r"\ba100\b.*pcie.*40\s*gb", 19.5, 156.0, 312.0, 312.0, 1555.0, _A100
    ),
    GPUPeaks("Quadro-RTX-5000", r"\bquadro rtx 5000\b", 11.2, None, None, 89.2, 448.0, _RTX5000),
)


def lookup(gpu_name: str) -> GPUPeaks:
    """The :class:`GPUPeaks` row matching ``gpu_name``, an NVML name ("NVIDIA H100 80GB HBM3").

    Raises :class:`UnknownGPUError` naming the known models when nothing matches, and for a
    MIG slice (the data sheets give the whole GPU's peaks).
    """
    known = ", ".join(r.key for r in TABLE)
    if not isinstance(gpu_name, str) or not gpu_name.strip():
        raise UnknownGPUError(f"no GPU name given ({gpu_name!r}); known: {known}")
    name = gpu_name.strip().lower().replace("_", " ")
    if re.search(r"\bmig\b", name):  # "NVIDIA H100 80GB HBM3 MIG 1g.10gb": a slice of the chip
        raise UnknownGPUError(
            f"{gpu_name!r} is a MIG slice: its peaks are a fraction of the whole GPU's, and the "
            "data sheets give the whole GPU's only"
        )
    for row in TABLE:
        if re.search(row.pattern, name):
            return row
    raise UnknownGPUError(
        f"no peak figures for GPU {gpu_name!r}; known: {known}. Add a row to bench/peaks.py "
        "with the data sheet it comes from."
    )


def peak_tflops(gpu_name: str, math: str = "fp32") -> float:
    """Data-sheet peak of ``gpu_name`` in TFLOP/s for ``math`` ("fp32", "tf32", "bf16", "fp16")."""
    return lookup(gpu_name).tflops(math)


def peak_bandwidth_gbps(gpu_name: str) -> float:
    """Data-sheet DRAM bandwidth of ``gpu_name`` in GB/s (1e9 bytes per second)."""
    return lookup(gpu_name).mem_gbps
