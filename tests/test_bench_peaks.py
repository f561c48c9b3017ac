"""Tests of bench.peaks: the table of GPU peaks, its sources, and the error on an unknown GPU."""

from __future__ import annotations

import pytest

from bench import peaks


@pytest.mark.parametrize(
    ("nvml_name", "key"),
    [
        ("NVIDIA H100 80GB HBM3", "H100-SXM5"),
        ("NVIDIA H100 PCIe", "H100-PCIe"),
        ("NVIDIA H100 NVL", "H100-NVL"),
        ("NVIDIA H200", "H200-SXM"),
        ("NVIDIA H200 NVL", "H200-NVL"),
        ("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB"),
        ("NVIDIA A100-SXM4-40GB", "A100-SXM4-40GB"),
        ("NVIDIA A100 80GB PCIe", "A100-PCIe-80GB"),
        ("NVIDIA A100-PCIE-40GB", "A100-PCIe-40GB"),
        ("Quadro RTX 5000", "Quadro-RTX-5000"),
    ],
    ids=[
        "h100-sxm",
        "h100-pcie",
        "h100-nvl",
        "h200",
        "h200-nvl",
        "a100-sxm-80",
        "a100-sxm-40",
        "a100-pcie-80",
        "a100-pcie-40",
        "rtx5000",
    ],
)
def test_lookup_matches_nvml_names(nvml_name, key):
    assert peaks.lookup(nvml_name).key == key


@pytest.mark.parametrize(
    "name",
    ["NVIDIA GH200 480GB", "NVIDIA H100", "NVIDIA GeForce RTX 4090", "Tesla V100-SXM2-16GB", ""],
    ids=["gh200", "h100-ambiguous", "rtx4090", "v100", "empty"],
)
def test_unknown_gpu_raises_naming_the_known_ones(name):
    with pytest.raises(peaks.UnknownGPUError, match="H100-SXM5"):
        peaks.lookup(name)


def test_unknown_gpu_error_is_a_value_error():
    with pytest.raises(ValueError):
        peaks.peak_tflops("NVIDIA B200")


def test_every_row_has_a_source_and_positive_numbers():
    keys = set()
    for row in peaks.TABLE:
        keys.add(row.key)
        assert "https://" in row.source
        assert row.fp32_tflops > 0 and row.mem_gbps > 0
        for math in peaks.MATHS:
            value = getattr(row, f"{math}_tflops")
            assert value is None or value >= row.fp32_tflops
    assert len(keys) == len(peaks.TABLE)


def test_peak_values_of_the_h100_sxm():
    assert peaks.peak_tflops("NVIDIA H100 80GB HBM3", "fp32") == 67.0
    assert peaks.peak_tflops("NVIDIA H100 80GB HBM3", "tf32") == 494.5
    assert peaks.peak_bandwidth_gbps("NVIDIA H100 80GB HBM3") == 3350.0
    assert peaks.peak_bandwidth_gbps("NVIDIA H200") == 4800.0


def test_missing_unit_and_unknown_math_raise():
    with pytest.raises(ValueError, match="no tf32 unit"):
        peaks.peak_tflops("Quadro RTX 5000", "tf32")
    with pytest.raises(ValueError, match="valid: fp32"):
        peaks.peak_tflops("NVIDIA H200", "fp64")


@pytest.mark.parametrize(
    "name", ["NVIDIA H100 80GB HBM3 MIG 1g.10gb", "NVIDIA H200 MIG 3g.71gb"], ids=["h100", "h200"]
)
def test_a_mig_slice_has_no_peaks_of_its_own(name):
    with pytest.raises(peaks.UnknownGPUError, match="MIG slice"):
        peaks.lookup(name)
    assert peaks.lookup(name.split(" MIG")[0]).key.startswith("H")  # the whole GPU matches


def test_every_row_is_its_data_sheets_dense_figures():
    """The table typed a second time from the data sheets it cites (TFLOP/s fp32, tf32,
    bf16, fp16 dense; GB/s): an edit of one figure must be made in both places. On the tensor
    cores of these GPUs bf16 and fp16 run at twice tf32's rate (dense; the data sheets'
    with-sparsity figures are twice that again)."""
    sheets = {
        "H100-NVL": (60.0, 417.5, 835.5, 835.5, 3900.0),
        "H100-PCIe": (51.0, 378.0, 756.5, 756.5, 2000.0),
        "H100-SXM5": (67.0, 494.5, 989.5, 989.5, 3350.0),
        "H200-NVL": (60.0, 417.5, 835.5, 835.5, 4800.0),
        "H200-SXM": (67.0, 494.5, 989.5, 989.5, 4800.0),
        "A100-SXM4-80GB": (19.5, 156.0, 312.0, 312.0, 2039.0),
        "A100-SXM4-40GB": (19.5, 156.0, 312.0, 312.0, 1555.0),
        "A100-PCIe-80GB": (19.5, 156.0, 312.0, 312.0, 1935.0),
        "A100-PCIe-40GB": (19.5, 156.0, 312.0, 312.0, 1555.0),
        "Quadro-RTX-5000": (11.2, None, None, 89.2, 448.0),
    }
    table = {
        r.key: (r.fp32_tflops, r.tf32_tflops, r.bf16_tflops, r.fp16_tflops, r.mem_gbps)
        for r in peaks.TABLE
    }
    assert table == sheets
    for r in peaks.TABLE:
        if r.tf32_tflops is not None:
            assert r.bf16_tflops == r.fp16_tflops == pytest.approx(2 * r.tf32_tflops, rel=1e-3)


def test_a_gpu_without_bf16_tensor_cores_says_so_for_bf16_too():
    """The Quadro RTX 5000 (Turing) has fp16 tensor cores but neither TF32 nor BF16 ones."""
    for math in ("tf32", "bf16"):
        with pytest.raises(ValueError, match=f"no {math} unit"):
            peaks.peak_tflops("Quadro RTX 5000", math)
    assert peaks.peak_tflops("Quadro RTX 5000", "fp16") == 89.2


def test_peak_tflops_defaults_to_fp32_on_the_cuda_cores():
    """Without a math named, the peak is the FP32 CUDA-core figure (67 TFLOP/s on an H100
    SXM5), not a tensor-core one."""
    assert peaks.peak_tflops("NVIDIA H100 80GB HBM3") == 67.0
    assert peaks.peak_tflops("NVIDIA A100-SXM4-40GB") == 19.5


def test_a_name_spelled_with_underscores_matches_as_with_spaces():
    assert peaks.lookup("NVIDIA_H100_PCIe").key == "H100-PCIe"
    assert peaks.lookup("NVIDIA_A100_80GB_PCIe").key == "A100-PCIe-80GB"


@pytest.mark.parametrize("name", ["   ", "\t"], ids=["spaces", "tab"])
def test_a_blank_gpu_name_is_said_to_be_missing(name):
    with pytest.raises(peaks.UnknownGPUError, match="no GPU name given"):
        peaks.lookup(name)


def test_an_a100_named_without_its_form_factor_is_not_guessed():
    """The 80 GB A100 comes as SXM4 (2039 GB/s) and as PCIe (1935 GB/s): a name that says
    neither matches no row."""
    with pytest.raises(peaks.UnknownGPUError):
        peaks.lookup("NVIDIA A100 80GB")


def test_only_the_hopper_rows_say_their_tensor_figures_were_halved():
    """The H100 and H200 data sheets print tensor-core figures with sparsity only; the A100's
    prints the dense figures beside them, and Turing (Quadro RTX 5000) has no sparsity."""
    for row in peaks.TABLE:
        halved = "halved" in row.source
        assert halved == row.key.startswith(("H100", "H200")), row.key
