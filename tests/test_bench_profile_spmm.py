"""bench.profile_spmm: the SpMM launch sequence a profiler reads, and its refusals."""

from __future__ import annotations

import re

import pytest
import torch

from bench import profile_spmm
from impl.ops import pattern_cuda


def test_launch_plan_orders_sparsity_then_variant_then_call():
    plan = profile_spmm.launch_plan([0.65, 0.95], ["row_tiled", "warp_row"], 2)
    assert plan == [
        (0.65, "row_tiled", 0),
        (0.65, "row_tiled", 1),
        (0.65, "warp_row", 0),
        (0.65, "warp_row", 1),
        (0.95, "row_tiled", 0),
        (0.95, "row_tiled", 1),
        (0.95, "warp_row", 0),
        (0.95, "warp_row", 1),
    ]


def test_spmm_kernel_names_each_variants_family_and_refuses_others():
    assert {v: pattern_cuda.spmm_kernel(v) for v in pattern_cuda.SPMM_VARIANTS} == {
        "row_tiled": "pdt_spmm_tiled",
        "warp_row": "pdt_spmm",
        "pipelined": "pdt_spmm_piped",
    }
    assert all(
        any(k.startswith(pattern_cuda.spmm_kernel(v) + "_f32") for k in pattern_cuda.KERNELS)
        for v in pattern_cuda.SPMM_VARIANTS
    )
    with pytest.raises(ValueError, match="tiled"):
        pattern_cuda.spmm_kernel("tiled")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--calls", "0"], "--calls and --n must be >= 1"),
        (["--sparsity", "1.0"], r"--sparsity must lie in \[0, 1\)"),
    ],
    ids=["no-calls", "sparsity-1"],
)
def test_bad_arguments_exit_2_with_the_reason(argv, message, capsys):
    assert profile_spmm.main(argv) == 2
    assert re.search(message, capsys.readouterr().err)


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU"
)
def test_without_a_gpu_it_exits_2_and_says_so(capsys):
    assert profile_spmm.main(["--calls", "1"]) == 2
    assert "no CUDA GPU" in capsys.readouterr().err


@pytest.mark.gpu
def test_on_a_gpu_it_launches_the_plan_and_names_each_launch(capsys):
    argv = ["--sparsity", "0.95", "--variants", "row_tiled", "warp_row", "--calls", "2"]
    assert profile_spmm.main([*argv, "--n", "512"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split("\t")[1:] for line in lines] == [
        ["row_tiled", "pdt_spmm_tiled", "call 0"],
        ["row_tiled", "pdt_spmm_tiled", "call 1"],
        ["warp_row", "pdt_spmm", "call 0"],
        ["warp_row", "pdt_spmm", "call 1"],
    ]
    assert all(line.startswith("sparsity 0.95 (pattern mask)") for line in lines)


def test_defaults_profile_the_papers_problem_with_every_variant():
    """256 filters of 128 3x3 kernels: the 256 x 1152 filter matrix of Sec. 5.2, times a
    1152 x 50176 (224 * 224) matrix; 65% and 95% sparsity, each variant 3 times."""
    f, c, r, s = profile_spmm.PAPER_SHAPE
    assert (f, c * r * s) == (256, 1152)
    args = profile_spmm._parser().parse_args([])
    assert args.sparsity == [0.65, 0.95]
    assert args.variants == ["row_tiled", "warp_row", "pipelined"]
    assert (args.calls, args.n) == (3, 224 * 224)


def test_an_unknown_variant_is_refused(capsys):
    with pytest.raises(SystemExit) as stop:
        profile_spmm.main(["--variants", "row_tiled", "tiled"])
    assert stop.value.code == 2 and "invalid choice: 'tiled'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--n", "0"], "--calls and --n must be >= 1"),
        (["--sparsity", "-0.1"], r"--sparsity must lie in \[0, 1\)"),
        (["--sparsity", "0.65", "1.0"], r"--sparsity must lie in \[0, 1\)"),
    ],
    ids=["no-columns", "negative-sparsity", "second-sparsity-1"],
)
def test_every_bad_argument_exits_2_with_the_reason(argv, message, capsys):
    assert profile_spmm.main(argv) == 2
    assert re.search(message, capsys.readouterr().err)
