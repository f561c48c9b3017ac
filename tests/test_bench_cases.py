"""Tests of bench.cases: the scale switch, the grids, rows with provenance, derived columns."""

from __future__ import annotations

import math

import pytest
import torch

from bench import Unavailable, cases, measure


@pytest.fixture(autouse=True)
def _no_scale_env(monkeypatch):
    monkeypatch.delenv(cases.ENV_SMALL, raising=False)
    monkeypatch.delenv(cases.ENV_SCALE, raising=False)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"PDTBENCH_BENCH_SMALL": "1"}, "smoke"),
        ({"PDTBENCH_BENCH_SMALL": "yes"}, "smoke"),
        ({"PDTBENCH_BENCH_SCALE": "cpu"}, "cpu"),
        ({"PDTBENCH_BENCH_SCALE": "gpu"}, "gpu"),
        ({"PDTBENCH_BENCH_SMALL": "1", "PDTBENCH_BENCH_SCALE": "gpu"}, "smoke"),
        ({"PDTBENCH_BENCH_SMALL": "0", "PDTBENCH_BENCH_SCALE": "cpu"}, "cpu"),
        ({"PDTBENCH_BENCH_SMALL": "on"}, "smoke"),
        ({"PDTBENCH_BENCH_SMALL": " TRUE "}, "smoke"),
    ],
    ids=[
        "small",
        "small-yes",
        "scale-cpu",
        "scale-gpu",
        "small-wins",
        "small-off",
        "small-on",
        "small-padded",
    ],
)
def test_small_switch_and_scale_env(monkeypatch, env, expected):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert cases.resolve_scale() == expected


def test_explicit_scale_and_default(monkeypatch):
    assert cases.resolve_scale("cpu") == "cpu"
    monkeypatch.setattr(cases, "_gpu_visible", lambda: False)
    assert cases.resolve_scale() == "cpu"
    monkeypatch.setattr(cases, "_gpu_visible", lambda: True)
    assert cases.resolve_scale() == "gpu"
    monkeypatch.setenv(cases.ENV_SCALE, "huge")
    with pytest.raises(ValueError, match="valid: smoke, cpu, gpu"):
        cases.resolve_scale()


def test_small_sizes_are_smaller():
    smoke, gpu = cases.SCALE_CONFIGS["smoke"], cases.SCALE_CONFIGS["gpu"]
    assert smoke.spmm_n < gpu.spmm_n and math.prod(smoke.nm_shape) < math.prod(gpu.nm_shape)
    assert math.prod(smoke.conv_input) < math.prod(gpu.conv_input)
    assert len(cases.pairs("csr", "smoke")) < len(cases.pairs("csr", "gpu"))


@pytest.mark.parametrize("scale", cases.SCALES, ids=list(cases.SCALES))
@pytest.mark.parametrize("suite", cases.SUITES, ids=list(cases.SUITES))
def test_case_names_unique_and_pairs_apply(suite, scale):
    grid = cases.grid(suite, scale)
    assert grid, f"{suite} has no case at {scale}"
    names = [c.name for c in grid]
    assert len(names) == len(set(names))
    for case, impl in cases.pairs(suite, scale):
        assert impl.accepts(case) and case.suite == suite
        assert impl.device in cases.SCALE_CONFIGS[scale].devices or suite == "allreduce"
    assert cases.pairs(suite, scale), f"{suite} has no (case, implementation) at {scale}"


def test_paper_grids_at_gpu_scale():
    spmm = cases.grid("spmm", "gpu")
    paper = [c for c in spmm if c.params["source"] == "paper"]
    assert sorted(c.params["sparsity"] for c in paper) == [0.0, 0.5, 0.65, 0.75, 0.8, 0.9, 0.95]
    assert {(c.params["weight_shape"][0], c.params["n"]) for c in paper} == {(256, 50176)}
    conv = cases.grid("conv", "gpu")
    assert {tuple(c.params["input_shape"]) for c in conv} == {(1, 128, 224, 224)}
    assert {c.params["pass"] for c in conv} == {"forward", "forward+backward"}
    csr = cases.grid("csr", "gpu")
    paper_csr = {c.params["sparsity"] for c in csr if c.params["source"] == "paper"}
    assert paper_csr == {0.5, 0.65, 0.75, 0.8, 0.9, 0.95}
    sources = "+".join(c.params["source"] for c in csr).split("+")
    assert set(sources) >= {"paper", "resnet18", "resnet50", "vgg16"}
    paper_shapes = {tuple(c.params["weight_shape"]) for c in csr if c.params["source"] == "paper"}
    assert paper_shapes == {(256, 128, 3, 3)}
    nm = [
        tuple(c.params[k] for k in ("method", "m", "layout")) for c in cases.grid("nm_prune", "gpu")
    ]
    assert nm == [
        (method, m, "nchw") for method in ("rescaled", "magnitude") for m in (4, 8, 16, 32)
    ] + [("rescaled", 4, "channels_last"), ("magnitude", 4, "channels_last")]
    it = {
        (c.params["model"], c.params["resolution"], c.params["batch"])
        for c in cases.grid("iteration", "gpu")
    }
    for model in ("resnet18", "resnet34", "resnet50", "vgg16"):
        assert {(model, 32, 128), (model, 224, 64)} <= it


def test_implementations_per_device():
    gpu = cases.implementations("spmm", "gpu")
    assert set(gpu) == {
        "pattern_spmm[ref]@cuda",
        "pattern_spmm[cuda]@cuda",
        "pattern_spmm[cuda,warp_row]@cuda",
        "pattern_spmm[cuda,row_tiled]@cuda",
        "pattern_spmm[cuda,pipelined]@cuda",
        "torch_csr_spmm@cuda",
        "cublas_fp32@cuda",
        "cublas_tf32@cuda",
    }
    assert gpu["cublas_tf32@cuda"].math == "tf32" and gpu["cublas_tf32@cuda"].options["tf32"]
    for v in ("warp_row", "row_tiled", "pipelined"):  # each pinned row times its own kernel
        assert gpu[f"pattern_spmm[cuda,{v}]@cuda"].options["paths"] == {"spmm": v}
    cpu = cases.implementations("csr", "smoke")
    assert "scipy_csr@cpu" in cpu and "cusparse_dense2csr@cuda" in cpu
    allreduce = cases.implementations("allreduce", "gpu")  # counted on the CPU at every scale
    assert allreduce and all(i.device == "cpu" for i in allreduce.values())
    assert len(cases.pairs("allreduce", "gpu")) == 5 * len(cases.grid("allreduce", "gpu"))
    with pytest.raises(ValueError, match="valid: calibration"):
        cases.implementations("sorting", "cpu")


def test_conv_shapes_of_resnet18():
    shapes = dict(cases.conv_shapes("resnet18"))
    assert (256, 128, 3, 3) in shapes and (512, 256, 1, 1) in shapes
    assert all(c > 3 for (_, c, _, _) in shapes)


def test_find_errors_name_the_valid_ones():
    with pytest.raises(ValueError, match="no case"):
        cases.find("csr", "nope", "copy@cpu", "smoke")
    name = cases.grid("csr", "smoke")[0].name
    with pytest.raises(ValueError, match="valid: "):
        cases.find("csr", name, "nope@cpu", "smoke")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the skip on machines without GPU")
def test_cuda_implementation_is_unavailable_without_gpu():
    case, impl = cases.find(
        "spmm", cases.grid("spmm", "smoke")[0].name, "cublas_fp32@cuda", "smoke"
    )
    with pytest.raises(Unavailable, match="needs a CUDA GPU"):
        cases.prepare(case, impl, "smoke")
    row = cases.run_pair(case, impl, "smoke")
    assert row["status"] == "skipped" and "CUDA" in row["reason"]
    assert isinstance(Unavailable("x"), NotImplementedError)  # asv's skip


PROVENANCE = (
    "commit",
    "dirty",
    "date",
    "gpu_name",
    "gpu_driver",
    "cuda",
    "cudnn",
    "torch",
    "cupy",
    "numpy",
    "python",
    "scale",
)


def test_row_of_a_smoke_spmm_case_has_provenance_and_derived_columns():
    case = next(c for c in cases.grid("spmm", "smoke") if c.name.startswith("37x117x101-s75"))
    _, impl = cases.find("spmm", case.name, "torch_mm@cpu", "smoke")
    row = cases.run_pair(case, impl, "smoke")
    assert row["status"] == "ok", row["reason"]
    for key in PROVENANCE:
        assert key in row
    assert row["scale"] == "smoke" and row["dtype"] == "float32"
    assert row["tf32_matmul"] is False and row["tf32_cudnn"] is False
    assert row["flops"] == 2.0 * 37 * 117 * 101  # dense GEMM executes every multiply-add
    assert row["flops_nominal"] == 2.0 * row["nnz"] * 101 < row["flops"]
    assert row["tflops"] == pytest.approx(row["flops"] / (row["median_ms"] * 1e-3) / 1e12)
    assert row["bytes"] > 0  # GB/s: bytes per second over 1e9, the time in ms
    assert row["gbps"] == pytest.approx(row["bytes"] / (row["median_ms"] * 1e-3) / 1e9)
    assert row["weight_shape"] == "37x13x3x3" and row["sparsity"] == 0.75


def test_pattern_csr_values_match_torch_csr():
    case = next(c for c in cases.grid("csr", "smoke") if c.name == "37x13x3x3-s95")
    got = {}
    for name in ("pattern_csr[ref]@cpu", "torch_to_sparse_csr@cpu"):
        _, impl = cases.find("csr", case.name, name, "smoke")
        prepared = cases.prepare(case, impl, "smoke")
        fn = prepared.phases[0][1]
        out = fn(0)
        got[name] = out if name.startswith("pattern") else out.values()
    assert torch.equal(got["pattern_csr[ref]@cpu"], got["torch_to_sparse_csr@cpu"])


def test_csr_copy_baseline_rotates_its_own_bytes(monkeypatch):
    # The copy of the kept values rotates through copies sized by what it reads (nnz values),
    # not by the dense matrix the conversions read: 16x fewer bytes at 95% sparsity.
    monkeypatch.setattr(measure, "ROTATE_BYTES_CPU", 2**20)
    case = next(c for c in cases.grid("csr", "smoke") if c.name == "37x13x3x3-s95")
    _, copy = cases.find("csr", case.name, "copy@cpu", "smoke")
    prepared = cases.prepare(case, copy, "smoke")
    nnz = prepared.info["nnz"]
    sets = measure.rotation_sets(nnz * 4, "cpu")
    assert sets > measure.rotation_sets(37 * 13 * 9 * 4, "cpu")
    assert prepared.info["rotated_mib"] == measure.rotated_mib(nnz * 4, sets)
    fn = prepared.phases[0][1]
    outs = [fn(i).clone() for i in range(sets + 1)]
    assert all(o.shape == (nnz,) for o in outs)
    assert len({tuple(o.tolist()) for o in outs}) == sets  # every copy once, then the first
    assert torch.equal(outs[0], outs[sets])
    _, dense = cases.find("csr", case.name, "pattern_csr[ref]@cpu", "smoke")
    info = cases.prepare(case, dense, "smoke").info
    assert info["rotated_mib"] == measure.rotated_mib(
        37 * 13 * 9 * 4, measure.rotation_sets(37 * 13 * 9 * 4, "cpu")
    )


@pytest.mark.parametrize(
    "suite, name", [("csr", "copy@cpu"), ("csr", "copy_moved@cpu"), ("nm_prune", "copy@cpu")]
)
def test_copy_baselines_write_a_fresh_output_each_call(monkeypatch, suite, name):
    # A copy writing every call into one buffer finds it in the cache: on this project's CPU
    # it read 1.2-2.2x the calibration copy's bandwidth. Outputs rotate with the inputs, and
    # are touched before timing (an untouched output times page faults).
    monkeypatch.setattr(measure, "ROTATE_BYTES_CPU", 2**20)
    small = {"csr": "37x13x3x3-s95"}  # few kept values: many rotated copies
    case = next(c for c in cases.grid(suite, "smoke") if c.name == small.get(suite, c.name))
    _, copy = cases.find(suite, case.name, name, "smoke")
    prepared = cases.prepare(case, copy, "smoke")
    fn = prepared.phases[0][1]
    ptrs = [fn(i).data_ptr() for i in range(4)]
    assert len(set(ptrs)) == 4
    if suite == "csr":  # the span they rotate through is their own copies'
        out = fn(0)
        sets = measure.rotation_sets(out.numel() * 4, "cpu")
        assert prepared.info["rotated_mib"] == measure.rotated_mib(out.numel() * 4, sets)


def test_channels_last_nm_cases_prune_channels_last_gradients():
    """The -nhwc cases hand nm_prune (and the copy) channels-last tensors, grouped along the
    channels as in NCHW: the same problem sizes, the other memory layout."""
    case = next(c for c in cases.grid("nm_prune", "smoke") if c.name.endswith("2of4-nhwc"))
    _, ref = cases.find("nm_prune", case.name, "nm_prune[ref]@cpu", "smoke")
    out = cases.prepare(case, ref, "smoke").phases[0][1](0)
    assert out.is_contiguous(memory_format=torch.channels_last) and not out.is_contiguous()
    kept = (out != 0).movedim(1, -1).reshape(-1, 4).sum(-1)
    assert int(kept.max()) <= 2
    _, copy = cases.find("nm_prune", case.name, "copy@cpu", "smoke")
    assert (
        cases.prepare(case, copy, "smoke")
        .phases[0][1](0)
        .is_contiguous(memory_format=torch.channels_last)
    )


def test_pattern_csr_rotates_its_positions_by_their_own_size(monkeypatch):
    """The gather reads the positions as well as the matrix: they rotate through copies of
    their own (int64 row pointers and columns), each passed with its own index, so a cached
    index does not flatter the conversion; the values stay those of the one mask."""
    from impl.ops import pattern_csr

    monkeypatch.setattr(measure, "ROTATE_BYTES_CPU", 2**16)
    case = next(c for c in cases.grid("csr", "smoke") if c.name == "37x13x3x3-s95")
    _, impl = cases.find("csr", case.name, "pattern_csr[ref]@cpu", "smoke")
    seen = []

    def spy(dense, row_ptr, col_ind, impl="auto", *, index=None):
        assert index is not None and index.row_ptr is row_ptr and index.col_ind is col_ind
        seen.append(col_ind.data_ptr())
        return pattern_csr(dense, row_ptr, col_ind, impl, index=index)

    monkeypatch.setattr("impl.ops.pattern_csr", spy)
    prepared = cases.prepare(case, impl, "smoke")
    nnz = prepared.info["nnz"]
    sets = measure.rotation_sets((nnz + 37 + 1) * 8, "cpu")
    assert sets > 1 and prepared.info["rotated_index_mib"] == measure.rotated_mib(
        (nnz + 38) * 8, sets
    )
    fn = prepared.phases[0][1]
    outs = [fn(i) for i in range(sets + 1)]
    assert len(set(seen[:sets])) == sets and seen[sets] == seen[0]
    assert all(o.shape == (nnz,) for o in outs)


def test_out_of_memory_is_a_value_and_errors_are_rows(monkeypatch):
    case, impl = cases.find(
        "nm_prune", cases.grid("nm_prune", "smoke")[0].name, "copy@cpu", "smoke"
    )

    def oom(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")

    monkeypatch.setattr(cases, "prepare", oom)
    row = cases.run_pair(case, impl, "smoke")
    assert row["status"] == "oom" and "out of memory" in row["reason"]

    def broken(*args, **kwargs):
        raise KeyError("weight")

    monkeypatch.setattr(cases, "prepare", broken)
    row = cases.run_pair(case, impl, "smoke")
    assert row["status"] == "error" and "KeyError" in row["reason"]


def _row(suite, case, impl, ms, device="cpu", baseline=False, **extra):
    return {
        "suite": suite,
        "case": case,
        "impl": f"{impl}@{device}",
        "device": device,
        "status": "ok",
        "median_ms": ms,
        "baseline": baseline,
        "math": "fp32",
        **extra,
    }


def test_add_derived_speedups_and_measured_fractions():
    rows = [
        _row("calibration", "copy", "copy", 1.0, kind="copy", gbps=10.0),
        _row("calibration", "gemm", "torch_mm", 1.0, kind="gemm", tflops=0.2),
        _row("spmm", "a", "torch_mm", 6.0, baseline=True, tflops=0.1, gbps=1.0),
        _row("spmm", "a", "pattern", 2.0, tflops=0.05, gbps=5.0),
        _row("spmm", "a", "torch_mm", 3.0, device="cuda", baseline=True),
        _row("spmm", "b", "pattern", 4.0),
        {**_row("spmm", "a", "broken", 0.5), "status": "skipped"},
    ]
    cases.add_derived(rows)
    assert rows[3]["speedup_vs_torch_mm"] == pytest.approx(3.0)  # same case, same device
    assert rows[2]["speedup_vs_torch_mm"] == pytest.approx(1.0)
    assert "speedup_vs_torch_mm" not in rows[5]  # another case has no baseline
    assert rows[3]["frac_bw_measured"] == pytest.approx(0.5)
    assert rows[3]["frac_peak_measured"] == pytest.approx(0.25)
    assert "frac_bw_measured" not in rows[4]  # no calibration on that device
    # nor where the device has none at all (its copy skipped, say): no fraction, no error
    lone = [_row("pack", "p", "grad_pack[ref]", 2.0, gbps=5.0, gbps_sectors=7.0, tflops=0.1)]
    assert not {"frac_bw_measured", "frac_bw_measured_sectors", "frac_peak_measured"} & set(
        cases.add_derived(lone)[0]
    )
    assert "speedup_vs_torch_mm" not in rows[6]


def test_iteration_rows_report_forward_and_backward_apart():
    case = cases.grid("iteration", "smoke")[0]
    _, impl = cases.find("iteration", case.name, "dense@cpu", "smoke")
    prepared = cases.prepare(case, impl, "smoke")
    timings = {
        p: measure.summarize([v], "perf_counter")
        for p, v in (("forward", 2.0), ("backward", 3.0), ("step", 1.0))
    }
    row = cases.fill_row(cases.base_row(case, impl, "smoke"), prepared, timings, impl)
    assert row["median_ms"] == 5.0 and row["timed_phases"] == "forward+backward"
    assert row["forward_ms"] == 2.0 and row["step_ms"] == 1.0
    assert row["iteration_ms"] == 6.0  # the step (a method's per-step work) included
    fwd = prepared.phase_flops["forward"]
    assert row["forward_tflops"] == pytest.approx(fwd / 2e-3 / 1e12)
    assert prepared.phase_flops["backward"] > fwd  # data + weight gradient


def test_iteration_rows_count_gradients_that_ran_dense(monkeypatch):
    # On a GPU a pattern layer's gradient may be timed onto cuBLAS / cuDNN (dense FLOPs) while
    # impl.flops counts it sparse: the row says how many gradient calls ran dense.
    ran = {"weight_grad dense": 3, "weight_grad sddmm": 5, "input_grad dense": 2, "spmm x": 9}
    assert cases._dense_gradient_calls(ran) == 5
    assert cases._dense_gradient_calls({"input_grad spmm": 4}) == 0
    monkeypatch.setattr(cases, "_uses_since", lambda before: dict(ran))
    case = cases.grid("iteration", "smoke")[0]
    _, impl = cases.find("iteration", case.name, "dense@cpu", "smoke")
    prepared = cases.prepare(case, impl, "smoke")
    for _, phase in prepared.phases:
        phase(0)
    assert prepared.info["dense_gradient_calls"] == 5
    assert "weight_grad dense x3" in prepared.info["paths_per_iteration"]
    # some weight gradients dense, others sparse: which layers is not known, nor the work
    assert prepared.flops is None and "backward" not in prepared.phase_flops
    assert "ran dense and others sparse" in prepared.info["flops_unknown"]


def test_iteration_rows_count_every_pattern_layers_dense_gradients_as_dense(monkeypatch):
    # every input gradient of ClickTrain's pattern layers ran on cuDNN, every weight gradient
    # on the SDDMM: the row's executed FLOPs add each layer's dense data gradient less its
    # sparse one, and nothing for the weight gradients
    from bench import method_states
    from impl.flops import training_flops
    from impl.ops import PatternConv2d

    built = []
    real = method_states.build_state
    monkeypatch.setattr(
        method_states, "build_state", lambda *a, **k: built.append(real(*a, **k)) or built[-1]
    )
    case = cases.grid("iteration", "smoke")[0]
    _, impl = cases.find("iteration", case.name, "clicktrain@cpu", "smoke")
    prepared = cases.prepare(case, impl, "smoke")
    model = built[0].model
    size = case.params["resolution"]
    report = training_flops(model, (3, size, size), built[0].cost or None)
    sparse_total, sparse_backward = prepared.flops, prepared.phase_flops["backward"]
    layers = {n for n, m in model.named_modules() if isinstance(m, PatternConv2d)}
    assert len(layers) > 0
    ran = {"input_grad dense": len(layers), "weight_grad sddmm": len(layers)}
    monkeypatch.setattr(cases, "_uses_since", lambda before: dict(ran))
    for _, phase in prepared.phases:
        phase(0)
    extra = sum(
        layer.dense.data_grad - layer.executed.data_grad
        for layer in report.layers
        if layer.name in layers
    )
    assert extra > 0
    batch = case.params["batch"]
    assert prepared.flops == pytest.approx(sparse_total + extra * batch)
    assert prepared.phase_flops["backward"] == pytest.approx(sparse_backward + extra * batch)
    assert "flops_unknown" not in prepared.info
    assert cases.dense_gradient_flops(report, layers, {"input_grad spmm": 3}) == 0.0


def test_iteration_speedups_cover_the_step_and_the_whole_iteration():
    # A method as fast as dense in forward and backward but slower in its step (Campfire's
    # masking) is no faster per iteration: iteration_speedup_vs_dense says so.
    base = {"suite": "iteration", "case": "c", "device": "cpu", "status": "ok", "math": "fp32"}
    rows = [
        base | {"impl": "dense@cpu", "baseline": True, "median_ms": 5.0, "forward_ms": 2.0,
                "backward_ms": 3.0, "step_ms": 1.0, "iteration_ms": 6.0},
        base | {"impl": "campfire@cpu", "median_ms": 5.0, "forward_ms": 2.0,
                "backward_ms": 3.0, "step_ms": 4.0, "iteration_ms": 9.0},
    ]  # fmt: skip
    cases.add_derived(rows)
    method = rows[1]
    assert method["speedup_vs_dense"] == 1.0
    assert method["step_speedup_vs_dense"] == pytest.approx(0.25)
    assert method["iteration_speedup_vs_dense"] == pytest.approx(6.0 / 9.0)


def test_iteration_peak_memory_is_measured_on_a_gpu_only():
    case = cases.grid("iteration", "smoke")[0]
    _, impl = cases.find("iteration", case.name, "dense@cpu", "smoke")
    prepared = cases.prepare(case, impl, "smoke")
    cases.measure_prepared(prepared, "smoke")
    assert "peak_memory_mib" not in prepared.info  # no allocator statistics for the CPU


@pytest.mark.gpu
def test_iteration_rows_on_a_gpu_carry_the_peak_memory():
    case = cases.grid("iteration", "smoke")[0]
    _, impl = cases.find("iteration", case.name, "dense@cuda", "smoke")
    row = cases.run_pair(case, impl, "smoke")
    assert row["status"] == "ok"
    import impl.models

    p = case.params
    model = impl.models.create(p["model"], num_classes=p["num_classes"], stem=p["stem"])
    params = sum(t.numel() for t in model.parameters())
    # at least the fp32 weights, their gradients and the SGD momentum
    assert row["peak_memory_mib"] > 3 * params * 4 / 2**20


def test_allreduce_rows_are_deterministic_values():
    case = cases.grid("allreduce", "smoke")[0]
    rows = {}
    for name in ("dense@cpu", "clicktrain@cpu"):
        _, impl = cases.find("allreduce", case.name, name, "smoke")
        rows[name] = cases.run_pair(case, impl, "smoke")
    dense, click = rows["dense@cpu"], rows["clicktrain@cpu"]
    assert dense["status"] == click["status"] == "ok"
    assert dense["payload_bytes"] == dense["dense_bytes"] and dense["payload_fraction"] == 1.0
    assert click["payload_bytes"] < dense["payload_bytes"]
    assert click["payload_bytes_unit"] == "bytes"
    again = cases.run_pair(
        case, cases.find("allreduce", case.name, "clicktrain@cpu", "smoke")[1], "smoke"
    )
    assert again["payload_bytes"] == click["payload_bytes"]


def test_allreduce_payload_agrees_with_impl_comm():
    comm = pytest.importorskip("impl.comm")
    if not hasattr(comm, "payload_bytes"):
        pytest.skip("impl.comm has no payload_bytes in this build")
    case = cases.grid("allreduce", "smoke")[0]
    for name in ("clicktrain@cpu", "campfire@cpu"):
        row = cases.run_pair(case, cases.find("allreduce", case.name, name, "smoke")[1], "smoke")
        assert row["comm_payload_bytes"] == row["payload_bytes"]


@pytest.fixture
def fresh_choices(monkeypatch):
    import collections

    from impl.ops import timed_choice

    monkeypatch.setattr(timed_choice, "_CHOICE", {})
    monkeypatch.setattr(timed_choice, "_TIMES", {})
    monkeypatch.setattr(timed_choice, "_USES", collections.Counter())
    monkeypatch.setattr(timed_choice, "_HOW", {})
    return timed_choice


def test_pattern_rows_name_the_cuda_paths_they_ran(fresh_choices):
    """The columns name the path each op ran in the call and how it was chosen, with the
    timing's milliseconds where a timing of this problem chose it."""
    tc = fresh_choices
    problem = "torch.float32 256x1152x50176 batch 1 nnz 117964 vec cuda:0"
    tc.choose_timed(
        "spmm", problem, ("row_tiled", "warp_row"), {"row_tiled": 1.0, "warp_row": 2.0}.get
    )
    impls = cases.implementations("spmm", "gpu")
    part = " 256x1152x50176 batch 1 nnz 117964 "
    before = cases._path_uses()
    tc.record_use("spmm", "row_tiled", "timed")
    ran = cases._uses_since(before)
    assert ran == {"spmm row_tiled": 1}
    assert cases._path_columns(impls["pattern_spmm[cuda]@cuda"], part, ran) == {
        "path_spmm": "timed: row_tiled",
        "path_spmm_ms_row_tiled": 1.0,
        "path_spmm_ms_warp_row": 2.0,
    }
    assert cases._path_columns(impls["pattern_spmm[cuda]@cuda"], " 1x1x1 ", ran) == {
        "path_spmm": "timed: row_tiled"
    }, "no timing of this problem: no milliseconds"
    before = cases._path_uses()
    tc.record_use("spmm", "warp_row", "forced")
    tc.record_use("weight_grad", "sddmm", "fallback")
    ran = cases._uses_since(before)
    cols = cases._path_columns(impls["pattern_spmm[cuda,warp_row]@cuda"], part, ran)
    assert cols == {"path_spmm": "forced: warp_row", "path_weight_grad": "fallback: sddmm"}
    assert cases._path_columns(impls["pattern_spmm[ref]@cuda"], part, {}) == {}
    with cases._forced_paths({"spmm": "warp_row", "weight_grad": "dense"}):
        assert tc.forced_path("spmm") == "warp_row"
        assert tc.forced_path("weight_grad") == "dense"
    assert tc.forced_path("spmm") is None
    with cases._forced_paths(None):
        assert tc.forced_path("spmm") is None
    with pytest.raises(ValueError, match="unknown op .cusparse."):
        cases._forced_paths({"cusparse": "dense"})


def test_sparse_gradient_conv_rows_only_where_there_is_a_backward():
    impls = cases.implementations("conv", "gpu")
    pinned = impls["pattern_conv2d[cuda,sparse_grads]@cuda"]
    kinds = {c.params["pass"]: c for c in cases.grid("conv", "gpu")}
    assert pinned.accepts(kinds["forward+backward"]) and not pinned.accepts(kinds["forward"])
    assert pinned.options["paths"] == {"input_grad": "spmm", "weight_grad": "sddmm"}


def test_conv_rows_name_only_the_ops_their_call_ran(fresh_choices):
    """A forward-only row does not take the gradient paths an earlier backward row of the same
    shape timed; each op's label is how it was chosen."""
    tc = fresh_choices
    fwd = "torch.float32 x[1, 128, 224, 224] w[256, 128, 3, 3] nnz 117964 stride [1, 1]"
    grad = "pattern_conv2d torch.float32 x[1, 128, 224, 224] w[256, 128, 3, 3] nnz 117964 s"
    tc.choose_timed(
        "conv_forward",
        fwd,
        ("implicit_tiled", "implicit"),
        {"implicit_tiled": 1.0, "implicit": 3.0}.get,
    )
    tc.choose_timed("weight_grad", grad, ("sddmm", "dense"), {"sddmm": 5.0, "dense": 2.0}.get)
    part = "x[1, 128, 224, 224] w[256, 128, 3, 3] nnz 117964 "
    timed = cases.implementations("conv", "gpu")["pattern_conv2d[cuda]@cuda"]
    forward_only = {"conv_forward implicit_tiled": 1}
    tc.record_use("conv_forward", "implicit_tiled", "timed")
    assert cases._path_columns(timed, part, forward_only) == {
        "path_conv_forward": "timed: implicit_tiled",
        "path_conv_forward_ms_implicit_tiled": 1.0,
        "path_conv_forward_ms_implicit": 3.0,
    }
    pinned = cases.implementations("conv", "gpu")["pattern_conv2d[cuda,sparse_grads]@cuda"]
    tc.record_use("weight_grad", "sddmm", "forced")
    tc.record_use("input_grad", "spmm", "forced")
    tc.record_use("spmm", "row_tiled", "default")
    ran = {"conv_forward implicit_tiled": 1, "weight_grad sddmm": 1, "input_grad spmm": 1}
    ran["spmm row_tiled"] = 1
    cols = cases._path_columns(pinned, part, ran)
    assert cols["path_weight_grad"] == "forced: sddmm"
    assert cols["path_input_grad"] == "forced: spmm"
    assert cols["path_spmm"] == "default: row_tiled"
    assert "path_weight_grad_ms_dense" not in cols, "a forced path carries no timing"


def test_uses_since_is_the_picks_between_two_readings(fresh_choices):
    tc = fresh_choices
    tc.record_use("spmm", "warp_row")
    before = cases._path_uses()
    for _ in range(3):
        tc.record_use("conv_forward", "implicit_tiled")
    tc.record_use("weight_grad", "sddmm")
    assert cases._uses_since(before) == {"conv_forward implicit_tiled": 3, "weight_grad sddmm": 1}
    assert cases._uses_since(cases._path_uses()) == {}


def test_pack_suite_packs_and_unpacks_a_large_gradient_at_the_gpu_scale():
    grid = cases.grid("pack", "gpu")
    assert {(c.params["kind"], c.params["sparsity"]) for c in grid} == {
        (op, s) for op in ("pack", "unpack") for s in (0.5, 0.75)
    }
    numel = math.prod(grid[0].params["weight_shape"])
    assert numel * 4 >= 64 * 2**20, "the issue's target is for tensors of 64 MB or more"
    impls = cases.implementations("pack", "gpu")
    assert set(impls) == {
        f"grad_{op}[{i}]@cuda" for op in ("pack", "unpack") for i in ("ref", "cuda")
    } | {"grad_unpack[cuda,scatter]@cuda"}
    by_kind = {c.params["kind"]: c for c in grid}
    for name in ("grad_unpack[cuda]@cuda", "grad_unpack[cuda,scatter]@cuda"):
        assert impls[name].accepts(by_kind["unpack"])
        assert not impls[name].accepts(by_kind["pack"])


@pytest.mark.parametrize("op", ["pack", "unpack"], ids=["pack", "unpack"])
def test_pack_rows_rotate_the_positions_and_the_bucket_by_their_own_size(monkeypatch, op):
    """Every operand of the pack suite rotates: the positions (int32 for pack, the int64 copy
    torch's scatter_ reads for the reference unpack) and the unpack's bucket, not only the
    gradients and buffers; one index of 18.9 MB would stay in a GPU's 50 MB L2."""
    monkeypatch.setattr(measure, "ROTATE_BYTES_CPU", 2**20)
    case = next(c for c in cases.grid("pack", "smoke") if c.params["kind"] == op)
    impl = cases.implementations("pack", "smoke")[f"grad_{op}[ref]@cpu"]
    prepared = cases.prepare(case, impl, "smoke")
    nnz, numel = prepared.info["nnz"], prepared.info["numel"]
    itemsize = 4 if op == "pack" else 8
    sets = measure.rotation_sets(nnz * itemsize, "cpu")
    assert sets > 1
    assert prepared.info["rotated_index_mib"] == measure.rotated_mib(nnz * itemsize, sets)
    if op == "unpack":
        out_sets = measure.rotation_sets(numel * 4, "cpu")
        assert prepared.info["rotated_out_mib"] == measure.rotated_mib(numel * 4, out_sets)
        fn = prepared.phases[0][1]
        ptrs = [fn(i).data_ptr() for i in range(out_sets + 1)]
        assert len(set(ptrs[:out_sets])) == out_sets > 1 and ptrs[out_sets] == ptrs[0]


@pytest.mark.parametrize(
    ("op", "method"), [("pack", "index_select"), ("unpack", "scatter_")], ids=["pack", "unpack"]
)
def test_pack_reference_rows_read_each_rotated_copy_of_the_positions(monkeypatch, op, method):
    # The rows said the positions rotate (rotated_index_mib); torch's index_select and
    # scatter_ must be handed those copies, not one index that stays in the cache.
    monkeypatch.setattr(measure, "ROTATE_BYTES_CPU", 2**20)
    case = next(c for c in cases.grid("pack", "smoke") if c.params["kind"] == op)
    prepared = cases.prepare(
        case, cases.implementations("pack", "smoke")[f"grad_{op}[ref]@cpu"], "smoke"
    )
    sets = measure.rotation_sets(prepared.info["nnz"] * (4 if op == "pack" else 8), "cpu")
    seen = []
    real = getattr(torch.Tensor, method)

    def spy(self, dim, index, *rest):
        seen.append(index.data_ptr())
        return real(self, dim, index, *rest)

    monkeypatch.setattr(torch.Tensor, method, spy)
    for i in range(sets):
        prepared.phases[0][1](i)
    assert len(set(seen)) == sets > 1


def test_gather_rows_count_their_value_reads_in_whole_sectors():
    """pattern_csr and pack rows carry bytes_sectors: the bytes counted, with the value reads
    as the distinct 32-byte sectors they touch (a gather reads whole sectors), counted here
    from the case's mask; gbps_sectors divides it by the time."""
    for suite, name, kind in (("csr", "pattern_csr[ref]@cpu", None), ("pack", None, "pack")):
        case = next(
            c for c in cases.grid(suite, "smoke") if kind is None or c.params["kind"] == kind
        )
        impl = cases.implementations(suite, "smoke")[name or "grad_pack[ref]@cpu"]
        prepared = cases.prepare(case, impl, "smoke")
        nnz, counted = prepared.info["nnz"], prepared.bytes
        sectors = prepared.info["bytes_sectors"]
        p = case.params
        mask = cases._masked_weight(p["weight_shape"], p["sparsity"], torch.device("cpu"), 0)[1]
        kept = [i for i, m in enumerate(mask.flatten().tolist()) if m]
        assert len(kept) == nnz
        # on the CPU, 64-byte cache lines: 16 float32 values a line
        exact = counted - 4 * nnz + 64 * len({i // 16 for i in kept})
        assert sectors == exact and counted < sectors, (suite, counted, sectors, exact)
        row = cases.run_pair(case, impl, "smoke")
        assert row["status"] == "ok" and row["bytes_sectors"] == sectors
        assert row["gbps_sectors"] == pytest.approx(sectors / (row["median_ms"] * 1e-3) / 1e9)
    timed = _row("pack", "p", "grad_pack[ref]", 2.0, gbps=5.0, bytes_sectors=3e7)
    timed["gbps_sectors"] = 3e7 / 2e-3 / 1e9
    rows = cases.add_derived(
        [_row("calibration", "copy", "copy", 1.0, kind="copy", gbps=30.0), timed]
    )
    assert rows[1]["frac_bw_measured_sectors"] == pytest.approx(0.5)


@pytest.mark.parametrize(
    "suite, name", [("csr", "pattern_csr[ref]@cpu"), ("pack", "grad_pack[ref]@cpu")]
)
def test_gathers_write_a_fresh_output_each_call(monkeypatch, suite, name):
    # Their result was freed at once and the next call got the same block back, found in the
    # cache, while the copy baselines they are read against rotate their outputs: the last
    # results are now held, so each call writes memory of its own.
    monkeypatch.setattr(measure, "ROTATE_BYTES_CPU", 2**16)
    case = next(
        c
        for c in cases.grid(suite, "smoke")
        if (c.name == "37x13x3x3-s95" if suite == "csr" else c.params["kind"] == "pack")
    )
    prepared = cases.prepare(case, cases.implementations(suite, "smoke")[name], "smoke")
    nnz = prepared.info["nnz"]
    sets = measure.rotation_sets(nnz * 4, "cpu")
    assert sets > 1
    assert prepared.info["rotated_out_mib"] == measure.rotated_mib(nnz * 4, sets)
    fn = prepared.phases[0][1]
    ptrs = [fn(i).data_ptr() for i in range(2 * sets + 1)]
    assert len(set(ptrs[: sets + 1])) == sets + 1  # no block reused while it is held


def test_a_gather_reads_sectors_on_a_gpu_and_cache_lines_on_a_cpu():
    assert measure.fetch_bytes("cuda") == measure.fetch_bytes(torch.device("cuda", 1)) == 32
    assert measure.fetch_bytes("cpu") == 64


def test_sector_bytes_counts_each_touched_sector_once():
    assert measure.sector_bytes(torch.tensor([0, 1, 7, 8, 40]), 4) == 3 * 32.0  # sectors 0, 1, 5
    assert measure.sector_bytes(torch.tensor([0, 4]), 8) == 2 * 32.0
    assert measure.sector_bytes(torch.tensor([], dtype=torch.int64), 4) == 0.0
    with pytest.raises(ValueError, match="ascending"):
        measure.sector_bytes(torch.tensor([8, 0]), 4)


def test_sector_bytes_accepts_a_repeated_position_and_counts_its_sector_once():
    """A gather may read one element twice: the positions are still in order (only an
    unsorted index is an error) and the sector is read once; 64-byte lines on a CPU."""
    assert measure.sector_bytes(torch.tensor([3, 3, 3]), 4) == 32.0
    assert measure.sector_bytes(torch.tensor([0, 0, 20, 20]), 4, 64) == 2 * 64.0  # lines 0, 1


def test_csr_rows_count_the_bytes_each_moves_and_the_sparsity_made():
    """pattern_csr reads a value and a column and writes a value per kept position (4 + 8 +
    4 bytes) and reads the row pointers (8 each); torch's to_sparse_csr reads the whole
    dense matrix too; the copy reads and writes the kept values."""
    case = next(c for c in cases.grid("csr", "smoke") if c.name == "37x13x3x3-s95")
    impls = cases.implementations("csr", "smoke")
    f, k = 37, 13 * 9
    info = cases.prepare(case, impls["pattern_csr[ref]@cpu"], "smoke").info
    nnz = info["nnz"]
    assert info["sparsity_actual"] == pytest.approx(1 - nnz / (f * k), abs=1e-4)
    assert info["sparsity_actual"] > 0.9  # the case's 95%, not its density
    expected = {
        "pattern_csr[ref]@cpu": nnz * 16 + (f + 1) * 8,
        "torch_to_sparse_csr@cpu": f * k * 4 + nnz * 12 + (f + 1) * 8,
        "copy@cpu": 2 * nnz * 4,
        "scipy_csr@cpu": f * k * 4 + nnz * 8 + (f + 1) * 4,  # int32 columns and row pointers
    }
    for name, nbytes in expected.items():
        assert cases.prepare(case, impls[name], "smoke").bytes == nbytes, name


def test_csr_copy_moved_baseline_copies_the_bytes_pattern_csr_moves():
    case = next(c for c in cases.grid("csr", "smoke") if c.name == "37x13x3x3-s95")
    impls = cases.implementations("csr", "smoke")
    moved = cases.prepare(case, impls["pattern_csr[ref]@cpu"], "smoke").bytes
    prepared = cases.prepare(case, impls["copy_moved@cpu"], "smoke")
    assert moved <= prepared.bytes < moved + 8
    assert prepared.phases[0][1](0).numel() * 8 == prepared.bytes


def test_a_skipped_row_carries_the_flags_it_would_have_run_under():
    case, impl = cases.find("conv", cases.grid("conv", "smoke")[0].name, "cudnn_tf32@cuda", "smoke")
    row = cases.run_pair(case, impl, "smoke")
    assert row["status"] == "skipped"
    assert row["tf32_matmul"] is True and row["tf32_cudnn"] is True
    assert row["cudnn_benchmark"] is True


@pytest.mark.parametrize("suite", ["conv", "iteration"])
@pytest.mark.slow
def test_rows_not_run_say_cudnn_benchmark_only_for_the_gpu_rows_of_its_suites(monkeypatch, suite):
    """A row skipped or failed before its preparation pinned the flags still says what it
    would have run under: cuDNN's benchmark mode on for the GPU rows of conv and iteration,
    off for their CPU rows (nothing of cuDNN runs there)."""

    def refused(*args, **kwargs):
        raise Unavailable("not here")

    monkeypatch.setattr(cases, "prepare", refused)
    case = cases.grid(suite, "smoke")[0]
    impls = cases.implementations(suite, "smoke")
    assert {i.device for i in impls.values()} == {"cpu", "cuda"}
    for impl in impls.values():
        row = cases.run_pair(case, impl, "smoke")
        assert row["status"] == "skipped", impl.name
        assert row["cudnn_benchmark"] is (impl.device == "cuda"), impl.name


@pytest.mark.parametrize("method", ["clicktrain", "sdgp"])
def test_a_cpu_iteration_row_needs_no_cuda_kernels(monkeypatch, method):
    # The methods' layers run the torch reference on the CPU: their rows there are timed
    # whether or not a GPU's kernels load.
    _kernels_state(monkeypatch, loads=False, environment=None)
    case = cases.grid("iteration", "smoke")[0]
    prepared = cases.prepare(
        case, cases.implementations("iteration", "smoke")[f"{method}@cpu"], "smoke"
    )
    assert prepared.device == torch.device("cpu") and prepared.phases


@pytest.mark.parametrize("op", ["pack", "unpack"], ids=["pack", "unpack"])
def test_pack_reference_rows_move_the_kept_values(monkeypatch, op):
    """On the CPU (smoke sizes) the reference pair runs: pack returns the kept values in
    mask order, unpack zeroes the bucket and writes them back (the sparse Allreduce's
    unpack). The rows name the positions each reads: torch's index_select takes the kernels'
    int32 ones, its scatter_ int64 only, and the bytes count the index each reads (pack, per
    kept value: 4 read + 4 of index + 4 written; unpack: 4 read + 8 of index per kept value,
    and 4 written per element of the bucket)."""
    monkeypatch.setattr(measure, "ROTATE_BYTES_CPU", 1)  # one bucket: the second call reuses it
    case = next(c for c in cases.grid("pack", "smoke") if c.params["kind"] == op)
    impl = cases.implementations("pack", "smoke")[f"grad_{op}[ref]@cpu"]
    prepared = cases.prepare(case, impl, "smoke")
    out = prepared.phases[0][1](0)
    nnz = prepared.info["nnz"]
    numel = prepared.info["numel"]
    assert prepared.bytes == (12.0 * nnz if op == "pack" else 12.0 * nnz + 4.0 * numel)
    assert prepared.info["index_dtype"] == ("torch.int32" if op == "pack" else "torch.int64")
    if op == "pack":
        assert out.shape == (nnz,)
    else:
        assert out.shape == tuple(case.params["weight_shape"]) and int((out != 0).sum()) == nnz
        out.fill_(float("nan"))  # the next call zeroes what is not kept: nothing left over
        out = prepared.phases[0][1](1)
        assert not out.isnan().any() and int((out != 0).sum()) == nnz
    assert 0.2 * prepared.info["numel"] < nnz < 0.55 * prepared.info["numel"]


def _kernels_state(monkeypatch, loads: bool, environment: str | None):
    import impl.cuda

    monkeypatch.setattr(impl.cuda, "has_cuda_kernels", lambda sources=None: loads)
    monkeypatch.setattr(impl.cuda, "kernels_environment_error", lambda: environment)
    monkeypatch.setattr(impl.cuda, "cuda_kernels_error", lambda: "nvrtc: error: bad token")


def test_a_kernel_that_fails_to_build_on_a_gpu_is_an_error_not_a_skipped_row(monkeypatch):
    """With a GPU and CuPy there, a kernel source that fails to compile fails its rows, with
    the compiler's reason; only a machine that runs no kernel at all skips them."""
    impl = cases.Impl("x@cuda", "x", "cuda", options={"impl": "cuda"})
    _kernels_state(monkeypatch, loads=False, environment=None)
    with pytest.raises(RuntimeError, match=r"pack\.cu fail to load: nvrtc: error: bad token"):
        cases._cuda_kernels_check(impl, "pack.cu")
    _kernels_state(monkeypatch, loads=False, environment="CuPy could not be imported")
    with pytest.raises(Unavailable, match="cannot run here: CuPy could not be imported"):
        cases._cuda_kernels_check(impl, "pack.cu")
    _kernels_state(monkeypatch, loads=True, environment=None)
    cases._cuda_kernels_check(impl, "pack.cu")  # loads: nothing to refuse
    _kernels_state(monkeypatch, loads=False, environment=None)
    cases._cuda_kernels_check(cases.Impl("y@cuda", "y", "cuda", options={"impl": "ref"}), "pack.cu")


@pytest.mark.parametrize(("method", "source"), [("clicktrain", "pattern"), ("sdgp", "nm_prune")])
def test_a_gpu_iteration_row_refuses_to_time_the_reference_under_a_methods_name(
    monkeypatch, method, source
):
    """On a GPU whose kernels do not load, ClickTrain's pattern convs and SDGP's pruning would
    fall back to the torch reference ("auto"): the row fails (or skips where no kernel can run
    at all) rather than time the reference as the method."""
    case = cases.grid("iteration", "smoke")[0]
    impl = cases.Impl(f"{method}@cuda", method, "cuda", options={"method": method})
    monkeypatch.setattr(cases, "_device", lambda impl: torch.device("cuda"))
    _kernels_state(monkeypatch, loads=False, environment=None)
    with pytest.raises(RuntimeError, match=rf"{source}\.cu fail to load"):
        cases.prepare(case, impl, "smoke")
    _kernels_state(monkeypatch, loads=False, environment="CuPy could not be imported")
    with pytest.raises(Unavailable, match="cannot run here"):
        cases.prepare(case, impl, "smoke")


def test_measure_prepared_notes_flags_that_read_back_otherwise(monkeypatch):
    # A row records the flags it asked for; where torch reads back others inside the pinned
    # block, the row says which.
    import contextlib

    flags = {"tf32_cudnn": True}
    prepared = cases.Prepared([("op", lambda i: None)], torch.device("cpu"), flags=flags)
    cases.measure_prepared(prepared, "smoke")
    assert "flags_read_back" not in prepared.info  # the CPU honours what was asked

    @contextlib.contextmanager
    def stuck(**requested):
        yield {"tf32_matmul": True, "tf32_cudnn": True, "cudnn_benchmark": False}

    monkeypatch.setattr(measure, "pinned_flags", stuck)
    cases.measure_prepared(prepared, "smoke")
    assert prepared.info["flags_read_back"] == '{"tf32_matmul": true}'


def test_conv_rows_count_a_dense_gradient_path_as_dense_flops(monkeypatch):
    # Where the timed choice computes a gradient densely (cuBLAS / cuDNN), the row's executed
    # FLOPs (and so its TFLOP/s) count that pass as dense, the other two as sparse.
    case = next(c for c in cases.grid("conv", "smoke") if c.name.endswith("fwdbwd-s75"))
    impls = cases.implementations("conv", "smoke")
    dense = cases.prepare(case, impls["torch_conv2d@cpu"], "smoke").flops
    prepared = cases.prepare(case, impls["pattern_conv2d[ref]@cpu"], "smoke")
    sparse = prepared.flops
    assert sparse == prepared.flops_nominal < dense
    prepared.phases[0][1](0)  # the CPU reference runs no CUDA path: the count stays sparse
    assert prepared.flops == sparse
    ran = {"path_weight_grad": "timed: dense", "path_input_grad": "default: spmm"}
    monkeypatch.setattr(cases, "_path_columns", lambda impl, problem, uses: dict(ran))
    prepared.phases[0][1](0)
    assert prepared.flops == pytest.approx((2 * sparse + dense) / 3)
    assert prepared.info["path_weight_grad"] == "timed: dense"


def test_the_share_of_peak_divides_by_the_gemm_of_the_same_arithmetic():
    def row(suite, case, math_, tflops, **more):
        return {"status": "ok", "suite": suite, "case": case, "device": "cuda", "math": math_,
                "tflops": tflops, "impl": "x", **more}  # fmt: skip

    rows = [row("calibration", "g32", "fp32", 50.0, kind="gemm"),
            row("calibration", "g16", "bf16", 500.0, kind="gemm"),
            row("spmm", "c", "fp32", 25.0), row("spmm", "c", "bf16", 250.0)]  # fmt: skip
    cases.add_derived(rows)
    assert [r["frac_peak_measured"] for r in rows[2:]] == [pytest.approx(0.5)] * 2


@pytest.mark.parametrize(("math", "peak"), [("fp32", 67.0), ("tf32", 494.5), ("bf16", 989.5)])
def test_a_gpu_rows_fractions_are_of_its_own_arithmetics_peak_and_the_bandwidth(math, peak):
    """``frac_peak_spec`` divides the row's TFLOP/s by the data-sheet peak of the arithmetic
    it ran (an H100 SXM5 here), ``frac_bw_spec`` its GB/s by the DRAM bandwidth; a CPU row
    gets neither."""
    impl = cases.Impl("x@cuda", "x", "cuda", math=math)
    row = {"gpu_name": "NVIDIA H100 80GB HBM3", "tflops": 49.45, "gbps": 335.0}
    cases._peak_columns(row, impl)
    assert row["frac_peak_spec"] == pytest.approx(49.45 / peak)
    assert row["frac_bw_spec"] == pytest.approx(0.1)
    cpu = {"tflops": 1.0, "gbps": 1.0}
    cases._peak_columns(cpu, cases.Impl("x@cpu", "x", "cpu", math=math))
    assert cpu["frac_peak_spec"] is None and cpu["frac_bw_spec"] is None


def test_launch_calibration_times_each_level_of_a_short_call():
    """The launch case: torch's own launch on every device, the three levels of the project's
    CUDA path (raw CuPy, the loader, the whole op) on a GPU only."""
    (launch,) = [c for c in cases.grid("calibration", "gpu") if c.params["kind"] == "launch"]
    gpu = {
        n: i for n, i in cases.implementations("calibration", "gpu").items() if i.accepts(launch)
    }
    assert set(gpu) == {f"{level}@cuda" for level in cases.LAUNCH_LEVELS}
    assert all(i.options["level"] == n.split("@")[0] for n, i in gpu.items())
    assert not gpu["pattern_csr_op@cuda"].accepts(cases.grid("calibration", "gpu")[0])  # copy
    cpu = cases.implementations("calibration", "cpu")
    on_cpu = [n for n, i in cpu.items() if i.accepts(launch) and i.device == "cpu"]
    assert on_cpu == ["torch_launch@cpu"]  # the CUDA levels have no CPU twin
    prepared = cases.prepare(launch, cpu["torch_launch@cpu"], "cpu")
    ((name, fn),) = prepared.phases
    assert name == "op" and prepared.info == {"level": "torch_launch"}
    assert prepared.bytes == 8.0  # one float32 read and written
    impls = cases.implementations("calibration", "gpu")
    assert all(impls[f"{lv}@cuda"].math == "memory" for lv in cases.LAUNCH_LEVELS)
    assert [float(fn(i)) for i in range(3)] == [1.0, 2.0, 3.0]  # one add_ per call


@pytest.mark.gpu
@pytest.mark.parametrize("level", [lv for lv in cases.LAUNCH_LEVELS if lv != "torch_launch"])
def test_launch_levels_run_the_gather_kernel_on_a_gpu(level):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU; none is present on this machine")
    (launch,) = [c for c in cases.grid("calibration", "gpu") if c.params["kind"] == "launch"]
    impl = cases.implementations("calibration", "gpu")[f"{level}@cuda"]
    ((_, fn),) = cases.prepare(launch, impl, "gpu").phases
    out = fn(0)
    torch.cuda.synchronize()
    w = cases._randn((1, 1, 3, 3), torch.device("cuda"), 0)
    assert torch.equal(out.cpu(), w.reshape(-1).cpu())  # the kernel gathered all nine values


def test_smoke_case_names_and_parameters():
    """The names say the sizes: the calibration copy in MiB, the GEMM's n, SpMM's F x K x N,
    the paper's shapes prefixed ``paper-``, the sparsity in percent on two digits."""
    calib = cases.grid("calibration", "smoke")
    assert [c.name for c in calib] == ["copy-16MiB", "gemm-256", "launch-1x9"]
    assert calib[0].params == {"kind": "copy", "bytes": 16 * 2**20}
    assert calib[1].params == {"kind": "gemm", "n": 256}
    assert [c.name for c in cases.grid("spmm", "smoke")] == [
        f"{shape}-s{s}"
        for shape in ("paper-256x1152x196", "37x117x101")
        for s in ("00", "75", "95")
    ]
    assert [c.name for c in cases.grid("csr", "smoke")] == [
        "paper-256x128x3x3-s50", "paper-256x128x3x3-s95", "37x13x3x3-s50", "37x13x3x3-s95"
    ]  # fmt: skip
    conv = cases.grid("conv", "smoke")
    assert conv[0].name == "paper-1x128x14x14-fwd-s00"
    assert {(c.params["padding"], c.params["stride"]) for c in conv} == {(1, 1)}


def test_gpu_csr_grid_keeps_six_sparsities_for_the_paper_and_95_percent_for_layers():
    csr = cases.grid("csr", "gpu")
    paper = [c.params["sparsity"] for c in csr if c.params["source"] == "paper"]
    assert paper == [0.5, 0.65, 0.75, 0.8, 0.9, 0.95]
    assert {c.params["sparsity"] for c in csr if c.params["source"] != "paper"} == {0.95}


def test_iteration_cases_have_the_classes_of_their_stem():
    got = {(c.params["stem"], c.params["num_classes"]) for c in cases.grid("iteration", "gpu")}
    assert got == {("cifar", 10), ("imagenet", 1000)}


@pytest.mark.parametrize(
    ("suite", "expected"),
    [
        ("calibration", set()),
        ("csr", {"torch_to_sparse_csr", "copy", "copy_moved", "scipy_csr", "cusparse_dense2csr"}),
        ("spmm", {"torch_csr_spmm", "torch_mm", "cublas_fp32", "cublas_tf32"}),
        ("conv", {"torch_conv2d", "cudnn_fp32", "cudnn_tf32"}),
        ("nm_prune", {"nm_prune[ref]", "copy"}),
        ("pack", {"grad_pack[ref]", "grad_unpack[ref]"}),
        ("iteration", {"dense"}),
        ("allreduce", {"dense"}),
    ],
)
def test_the_baselines_of_each_suite(suite, expected):
    """The library (or reference, or copy) rows the others get a ``speedup_vs_`` column of."""
    impls = cases.implementations(suite, "smoke")
    assert {n.split("@")[0] for n, i in impls.items() if i.baseline} == expected


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the skip on machines without GPU")
@pytest.mark.parametrize(
    ("name", "tf32"), [("cublas_fp32@cuda", False), ("cublas_tf32@cuda", True)]
)
def test_skipped_cublas_rows_carry_their_tf32_flag_and_no_cudnn_benchmark(name, tf32):
    case, impl = cases.find("spmm", cases.grid("spmm", "smoke")[0].name, name, "smoke")
    row = cases.run_pair(case, impl, "smoke")
    assert row["status"] == "skipped" and row["reason"]
    assert row["tf32_matmul"] is tf32 and row["tf32_cudnn"] is tf32
    assert row["cudnn_benchmark"] is False  # spmm runs no cuDNN


def test_a_row_names_the_device_it_ran_on(monkeypatch):
    prov = {"gpu_name": "Some GPU", "cpu_model": "Some CPU", "scale": "smoke"}
    monkeypatch.setattr(cases, "provenance", lambda scale=None: dict(prov))
    case = cases.grid("spmm", "smoke")[0]
    impls = cases.implementations("spmm", "smoke")
    assert cases.base_row(case, impls["torch_mm@cpu"], "smoke")["device_name"] == "Some CPU"
    assert cases.base_row(case, impls["cublas_fp32@cuda"], "smoke")["device_name"] == "Some GPU"
    assert cases.base_row(case, impls["torch_csr_spmm@cpu"], "smoke")["baseline"] is True


def test_calibration_rows_count_the_copy_bytes_and_the_gemm_flops():
    """The copy reads and writes its 16 MiB; an n x n GEMM executes 2 n^3 FLOPs and moves
    three n x n float32 matrices."""
    impls = cases.implementations("calibration", "smoke")
    copy, gemm, _ = cases.grid("calibration", "smoke")
    assert cases.prepare(copy, impls["copy@cpu"], "smoke").bytes == 2 * 16 * 2**20
    prepared = cases.prepare(gemm, impls["torch_mm@cpu"], "smoke")
    assert prepared.flops == prepared.flops_nominal == 2 * 256**3
    assert prepared.bytes == 3 * 256 * 256 * 4


def test_spmm_rows_count_flops_and_bytes_of_what_each_executes():
    """F x K sparse times K x N dense: the dense GEMM executes 2 F K N FLOPs and reads the
    whole filter matrix; the sparse ones 2 nnz N and read the kept values (4), their columns
    (8) and the row pointers (8 each); every one reads B and writes the F x N result."""
    f, k, n = 37, 117, 101
    case = next(c for c in cases.grid("spmm", "smoke") if c.name == "37x117x101-s75")
    impls = cases.implementations("spmm", "smoke")
    io = (k * n + f * n) * 4
    dense = cases.prepare(case, impls["torch_mm@cpu"], "smoke")
    nnz = dense.info["nnz"]
    assert dense.flops == 2 * f * k * n and dense.bytes == io + f * k * 4
    for name in ("torch_csr_spmm@cpu", "pattern_spmm[ref]@cpu"):
        prepared = cases.prepare(case, impls[name], "smoke")
        assert prepared.flops == 2 * nnz * n, name
        assert prepared.bytes == io + nnz * 12 + (f + 1) * 8, name
        assert prepared.flops_nominal == dense.flops_nominal == 2 * nnz * n


@pytest.mark.parametrize(("which", "passes"), [("fwd", 1), ("fwdbwd", 3)])
def test_conv_rows_count_the_flops_of_a_padded_3x3_conv(which, passes):
    """1 x 128 x 14 x 14 input, 256 filters 3x3, padding 1: a 14 x 14 output; dense FLOPs
    2 B P Q F C R S, sparse 2 B P Q nnz; forward plus backward three times that."""
    case = next(c for c in cases.grid("conv", "smoke") if c.name.endswith(f"-{which}-s75"))
    impls = cases.implementations("conv", "smoke")
    dense = cases.prepare(case, impls["torch_conv2d@cpu"], "smoke")
    assert dense.flops == 2 * 14 * 14 * 256 * 128 * 9 * passes
    sparse = cases.prepare(case, impls["pattern_conv2d[ref]@cpu"], "smoke")
    nnz = sparse.info["nnz"]
    assert sparse.flops == dense.flops_nominal == 2 * 14 * 14 * nnz * passes
    assert sparse.info["sparsity_actual"] == pytest.approx(1 - nnz / (256 * 128 * 9), abs=1e-4)
    assert sparse.info["sparsity_actual"] > 0.7


@pytest.mark.parametrize("name", ["nm_prune[ref]@cpu", "copy@cpu"])
def test_nm_rows_count_the_gradient_read_and_written(name):
    case = cases.grid("nm_prune", "smoke")[0]
    prepared = cases.prepare(case, cases.implementations("nm_prune", "smoke")[name], "smoke")
    numel = 4 * 64 * 8 * 8
    assert prepared.info["numel"] == numel and prepared.bytes == 2 * numel * 4


def _timing(median, p20, p80, **more):
    return measure.Timing(median, p20, p80, p20, 7, "perf_counter", **more)


def test_fill_row_keeps_percentiles_apart_and_rates_over_the_timed_phases():
    """p20 and p80 go to their own columns; an iteration row's TFLOP/s counts the FLOPs of
    the timed phases (forward and backward) over their summed median, not the step's."""
    impl = cases.Impl("x@cpu", "x", "cpu")
    op = cases.Prepared([("op", None)], torch.device("cpu"), flops=4e9, bytes=2e6)
    row = cases.fill_row({}, op, {"op": _timing(2.0, 1.0, 3.0)}, impl)
    assert (row["median_ms"], row["p20_ms"], row["p80_ms"]) == (2.0, 1.0, 3.0)
    assert row["tflops"] == pytest.approx(2.0) and row["gbps"] == pytest.approx(1.0)
    assert "host_bound" not in row  # CPU timings have no host columns
    phases = cases.Prepared(
        [("forward", None), ("backward", None), ("step", None)],
        torch.device("cpu"),
        flops=9e9,
        phase_flops={"forward": 1e9, "backward": 2e9, "step": 6e9},
        timed_phases=("forward", "backward"),
    )
    timings = {
        "forward": _timing(1.0, 0.5, 1.5),
        "backward": _timing(2.0, 1.5, 2.5),
        "step": _timing(3.0, 2.0, 4.0),
    }
    row = cases.fill_row({}, phases, timings, impl)
    assert row["median_ms"] == 3.0 and row["iteration_ms"] == 6.0
    assert (row["backward_p20_ms"], row["backward_p80_ms"]) == (1.5, 2.5)
    assert row["tflops"] == pytest.approx(1.0)  # 3e9 FLOPs in 3 ms


def test_fill_row_keeps_the_host_columns_of_a_gpu_timing_that_is_not_host_bound():
    impl = cases.Impl("x@cpu", "x", "cpu")
    t = _timing(2.0, 1.0, 3.0, host_ms=2.5, amortized_ms=1.9, issue_ms=0.01, host_bound=False)
    row = cases.fill_row({}, cases.Prepared([("op", None)], torch.device("cpu")), {"op": t}, impl)
    assert row["host_bound"] is False
    assert (row["host_ms"], row["amortized_ms"], row["issue_ms"]) == (2.5, 1.9, 0.01)


def test_calibration_rows_are_not_fractions_of_themselves():
    rows = [
        _row("calibration", "copy", "copy", 1.0, kind="copy", gbps=10.0, tflops=None),
        _row("calibration", "gemm", "torch_mm", 1.0, kind="gemm", tflops=0.2, gbps=2.0),
    ]
    cases.add_derived(rows)
    assert not any(k.startswith("frac_") for r in rows for k in r)


@pytest.mark.parametrize(
    ("scale", "expected"),
    [("smoke", (1, 3, 0.0, None)), ("cpu", (1, 5, 0.25, 50))],
)
def test_cpu_kernels_are_timed_with_the_scales_budget(monkeypatch, scale, expected):
    got = {}

    def cpu_timing(fn, warmup, repeats, min_time_s, max_repeats):
        got["args"] = (warmup, repeats, min_time_s, max_repeats)
        return _timing(1.0, 1.0, 1.0)

    monkeypatch.setattr(measure, "cpu_timing", cpu_timing)
    prepared = cases.Prepared([("op", lambda i: None)], torch.device("cpu"))
    assert set(cases.measure_prepared(prepared, scale)) == {"op"}
    assert got["args"] == expected


def test_iteration_phases_are_timed_with_the_scales_iterations(monkeypatch):
    got = {}

    def phase_timing(phases, device, warmup, repeats, after_warmup=None):
        got["args"] = (warmup, repeats, after_warmup)
        return {}

    monkeypatch.setattr(measure, "phase_timing", phase_timing)
    phases = [("forward", lambda i: None), ("backward", lambda i: None)]
    cases.measure_prepared(cases.Prepared(phases, torch.device("cpu")), "smoke")
    assert got["args"] == (1, 2, None)  # smoke: one warm-up, two timed; no CUDA peak reset
    cases.measure_prepared(cases.Prepared(phases, torch.device("cpu")), "gpu")
    assert got["args"] == (3, 10, None)


def test_run_suites_reports_each_row_and_returns_them_with_speedups(monkeypatch):
    def pair(case, impl, scale=None):
        ms = 4.0 if impl.baseline else 2.0
        return _row(case.suite, case.name, impl.name.split("@")[0], ms, impl.device,
                    impl.baseline)  # fmt: skip

    monkeypatch.setattr(cases, "run_pair", pair)
    seen = []
    rows = cases.run_suites(
        ["nm_prune"], "smoke", case_names=["4x64x8x8-2of4"], progress=seen.append
    )
    assert [r["impl"] for r in seen] == [r["impl"] for r in rows]
    assert len(rows) == len(cases.implementations("nm_prune", "smoke"))
    kernel = next(r for r in rows if r["impl"] == "nm_prune[cpu]@cpu")
    assert kernel["speedup_vs_copy"] == 2.0 and kernel["speedup_vs_nm_prune[ref]"] == 2.0


@pytest.mark.parametrize(
    ("match", "impls"),
    [
        ("scipy", {"scipy_csr@cpu"}),
        ("csr/37x13x3x3-s95/copy", {"copy@cpu", "copy_moved@cpu", "copy@cuda", "copy_moved@cuda"}),
        ("@cuda", None),
    ],
    ids=["impl", "suite-case-impl", "device"],
)
def test_match_is_tested_against_suite_case_and_impl(match, impls):
    """``match`` is a substring of ``<suite>/<case>/<impl>``: an implementation's name, a
    device, or the whole path select pairs."""
    got = cases.select_pairs("csr", "smoke", match=match)
    assert got
    if impls is not None:
        assert {i.name for _, i in got} == impls
        if "/" in match:
            assert {c.name for c, _ in got} == {"37x13x3x3-s95"}
    else:
        assert all(i.device == "cuda" for _, i in got)
        assert len(got) == len([p for p in cases.pairs("csr", "smoke") if p[1].device == "cuda"])


def test_a_cpu_row_gets_no_gpu_data_sheet_figures_even_where_a_gpu_is_named():
    row = {"gpu_name": "NVIDIA H100 80GB HBM3", "tflops": 1.0, "gbps": 10.0}
    cases._peak_columns(row, cases.Impl("x@cpu", "x", "cpu"))
    assert row == {"gpu_name": "NVIDIA H100 80GB HBM3", "tflops": 1.0, "gbps": 10.0,
                   "frac_peak_spec": None, "frac_bw_spec": None}  # fmt: skip


def _sizes(scale):
    """The sizes docs/benchmarks.md's scale table lists, read off the grid's cases."""
    spmm = {c.name.rsplit("-", 1)[0] for c in cases.grid("spmm", scale)}
    conv = {tuple(c.params["input_shape"]) for c in cases.grid("conv", scale)}
    nm = {tuple(c.params["shape"]) for c in cases.grid("nm_prune", scale)}
    pack = {tuple(c.params["weight_shape"]) for c in cases.grid("pack", scale)}
    return spmm, conv, nm, pack


@pytest.mark.parametrize(
    ("scale", "spmm", "conv", "nm", "pack"),
    [
        ("smoke", "paper-256x1152x196", (1, 128, 14, 14), (4, 64, 8, 8), (64, 32, 3, 3)),
        ("cpu", "paper-256x1152x3136", (1, 128, 56, 56), (16, 256, 28, 28), (512, 256, 3, 3)),
        (
            "gpu",
            "paper-256x1152x50176",
            (1, 128, 224, 224),
            (128, 256, 56, 56),
            (1024, 2048, 3, 3),
        ),
    ],
    ids=["smoke", "cpu", "gpu"],
)
def test_each_scale_has_the_documented_kernel_sizes(scale, spmm, conv, nm, pack):
    """docs/benchmarks.md: SpMM's dense operand 1152 x 196 / 3136 / 50176 (= 56 * 56 and the
    paper's 224 * 224), the conv input, the N:M gradient and the packed gradient per scale."""
    got_spmm, got_conv, got_nm, got_pack = _sizes(scale)
    assert spmm in got_spmm
    assert (got_conv, got_nm, got_pack) == ({conv}, {nm}, {pack})


def test_gpu_sizes_are_the_documented_bytes():
    """The N:M gradient of the gpu scale is 411 MB and the packed one 72 MiB of float32; the
    calibration copy is 1 GiB there and 64 MiB at the cpu scale."""
    _, _, (nm,), (pack,) = _sizes("gpu")
    assert round(math.prod(nm) * 4 / 1e6) == 411
    assert math.prod(pack) * 4 == 72 * 2**20
    copy = {s: cases.grid("calibration", s)[0] for s in ("cpu", "gpu")}
    assert copy["gpu"].params["bytes"] == 2**30 and copy["gpu"].name == "copy-1024MiB"
    assert copy["cpu"].params["bytes"] == 64 * 2**20 and copy["cpu"].name == "copy-64MiB"


def test_cpu_iteration_cases_are_the_documented_models_resolutions_and_batches():
    """ResNet-18/34 and VGG-16 at 32 px, ResNet-50 at 64 px (ImageNet head), batch 4-8."""
    got = {
        (c.params["model"], c.params["stem"], c.params["resolution"])
        for c in cases.grid("iteration", "cpu")
    }
    assert got == {
        ("resnet18", "cifar", 32),
        ("resnet34", "cifar", 32),
        ("vgg16", "cifar", 32),
        ("resnet50", "imagenet", 64),
    }
    assert {c.params["batch"] for c in cases.grid("iteration", "cpu")} <= set(range(4, 9))
    (smoke,) = cases.grid("iteration", "smoke")
    assert smoke.name == "resnet20-cifar32-b4"


def test_gpu_iteration_grid_holds_every_case_clicktrain_fig11_reads():
    from reproductions.clicktrain.fig11 import GPU_CASES

    names = {c.name for c in cases.grid("iteration", "gpu")}
    assert set(GPU_CASES.values()) <= names
    assert {"resnet18-cifar32-b128", "vgg16-imagenet224-b64"} <= names


@pytest.mark.parametrize("scale", ["cpu", "gpu"])
def test_allreduce_counts_four_models_with_cifar_and_imagenet_heads(scale):
    got = {
        (c.params["model"], c.params["stem"], c.params["num_classes"])
        for c in cases.grid("allreduce", scale)
    }
    assert got == {
        (m, stem, classes)
        for m in ("resnet18", "resnet34", "resnet50", "vgg16")
        for stem, classes in (("cifar", 10), ("imagenet", 1000))
    }
    assert "resnet50-imagenet-c1000" in {c.name for c in cases.grid("allreduce", scale)}


def test_nm_cases_keep_half_of_each_group_along_the_channels():
    """n:m = 2:4, 4:8, 8:16, 16:32 grouped along dim 1 (channels) of the NCHW gradient; the
    channels-last cases at 2:4; names ``<shape>-<n>of<m>[-magnitude][-nhwc]``."""
    grid = cases.grid("nm_prune", "smoke")
    assert [c.name for c in grid] == [
        "4x64x8x8-2of4", "4x64x8x8-4of8", "4x64x8x8-8of16", "4x64x8x8-16of32",
        "4x64x8x8-2of4-magnitude", "4x64x8x8-4of8-magnitude", "4x64x8x8-8of16-magnitude",
        "4x64x8x8-16of32-magnitude", "4x64x8x8-2of4-nhwc", "4x64x8x8-2of4-magnitude-nhwc",
    ]  # fmt: skip
    assert {(c.params["n"], c.params["m"]) for c in grid} == {(2, 4), (4, 8), (8, 16), (16, 32)}
    assert {c.params["dim"] for c in grid} == {1}


def test_pack_cases_are_named_by_op_shape_and_sparsity():
    assert [c.name for c in cases.grid("pack", "smoke")] == [
        "pack-64x32x3x3-s50", "pack-64x32x3x3-s75", "unpack-64x32x3x3-s50", "unpack-64x32x3x3-s75",
    ]  # fmt: skip


def test_layer_shapes_equal_to_the_papers_join_the_csr_grid_only_as_the_paper():
    """ResNet-18 and VGG-16 both have a 256 x 128 x 3 x 3 conv: its cases are the paper's."""
    csr = cases.grid("csr", "gpu")
    assert [c.name for c in csr if c.params["weight_shape"] == [256, 128, 3, 3]] == [
        f"paper-256x128x3x3-s{p}" for p in (50, 65, 75, 80, 90, 95)
    ]
    assert [c.name for c in csr if c.params["weight_shape"] == [512, 512, 3, 3]] == [
        "512x512x3x3-s95"
    ]
    # docs/gpu-session.md: 174 pairs, the paper's shape at six sparsities and the layer
    # shapes of ResNet-18/50 and VGG-16 at 95%
    assert len(cases.pairs("csr", "gpu")) == 174


@pytest.mark.parametrize("scale", ["cpu", "gpu"])
def test_gpu_kernels_are_timed_with_about_25_ms_of_warmup_and_100_ms_of_calls(scale):
    cfg = cases.SCALE_CONFIGS[scale]
    assert (cfg.cuda_warmup_ms, cfg.cuda_rep_ms) == (25.0, 100.0)


def test_conv_cases_are_the_papers_padded_stride_one_layer_at_every_scale():
    for scale in cases.SCALES:
        for c in cases.grid("conv", scale):
            assert (c.params["padding"], c.params["stride"]) == (1, 1)
            assert c.params["weight_shape"] == [256, 128, 3, 3]


def test_the_compiled_cpu_conv_row_skips_with_the_reason_where_it_cannot_build(monkeypatch):
    from impl.ops import pattern_cpu

    case = next(c for c in cases.grid("conv", "smoke") if c.name.endswith("fwd-s75"))
    impl = cases.implementations("conv", "smoke")["pattern_conv2d[cpu]@cpu"]
    assert impl.options["impl"] == "cpu"
    monkeypatch.setattr(pattern_cpu, "unavailable_reason", lambda: "no C compiler")
    with pytest.raises(Unavailable, match="compiled CPU pattern conv.*no C compiler"):
        cases.prepare(case, impl, "smoke")
