"""ClickTrain Fig. 11: forward and backward time per iteration of dense training and of
ClickTrain after hard pruning (pattern-sparse convolutions), per model, on CIFAR and ImageNet
shapes.

Scales: smoke and cpu read the Trainer's median times of the last epoch of the Table 1 runs
(ResNet-20, digits; ClickTrain is in its sparse stage then); gpu times one training iteration
(forward, backward) of dense and of ClickTrain after hard pruning in the state the benchmark
suite builds without training (:mod:`bench.method_states`: pattern-sparse 3x3 convolutions,
84.4% of their weights pruned), for ResNet-18/34/50 and VGG-16 at 32 x 32 (batch 128) and
224 x 224 (batch 64, 1000 classes): the rows of ``bench.run --suite iteration`` when a GPU
run of it is in the tree (``reports/bench/gpu/iteration/rows.json``), else measured here
with the same code; paper trains each model for 4 epochs on synthetic inputs (12 steps an
epoch, hard pruning after the third, at its Table 2 compression) and reads the last epoch's
times, as smoke and cpu do.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from reproductions.clicktrain import clicktrain_options, method_rows
from reproductions.common import Row, Target, described, panels_vs_paper, reproduce

SHORT_CLICKTRAIN = {"dense_epochs": 1, "pool_epochs": 1, "finalize_epochs": 1,
                    "hard_prune_epoch": 3}  # fmt: skip


#: The benchmark suite's per-iteration rows of a GPU run, read instead of measuring again.
BENCH_ROWS = Path("reports/bench/gpu/iteration/rows.json")
MEASURE = "reproductions.clicktrain.fig11:iteration_times"
#: (dataset, model) -> the benchmark's iteration case: the paper's Fig. 11 models at CIFAR
#: and ImageNet shapes (its ResNet-101 has no case in the suite: it stays a paper-only row).
GPU_CASES: dict[tuple[str, str], str] = {
    ("cifar10", "resnet18"): "resnet18-cifar32-b128",
    ("cifar10", "resnet34"): "resnet34-cifar32-b128",
    ("cifar10", "resnet50"): "resnet50-cifar32-b128",
    ("cifar10", "vgg16"): "vgg16-cifar32-b128",
    ("imagenet", "resnet34"): "resnet34-imagenet224-b64",
    ("imagenet", "resnet50"): "resnet50-imagenet224-b64",
    ("imagenet", "vgg16"): "vgg16-imagenet224-b64",
}
_METHOD_KEYS = ("fwd_ms", "bwd_ms", "iter_ms")


def _phases(row: dict[str, Any]) -> dict[str, float] | None:
    if row.get("status") != "ok" or row.get("forward_ms") is None:
        return None
    fwd, bwd = float(row["forward_ms"]), float(row["backward_ms"])
    return {"fwd_ms": fwd, "bwd_ms": bwd, "iter_ms": fwd + bwd}


def iteration_times(
    scale: str, context: dict, case: str, rows_path: str | None = None
) -> dict[str, Any]:
    """Forward and backward time per iteration (ms, medians) of dense and of ClickTrain after
    hard pruning for the benchmark's iteration ``case``, and ClickTrain's speedups (dense time
    / ClickTrain time, Fig. 11's y axis). Read from the benchmark rows at ``rows_path``
    (default :data:`BENCH_ROWS`) when both rows are there and ok, else measured now with
    :func:`bench.cases.run_pair` (the same code). ``source`` says which, ``device`` where.
    Raises RuntimeError naming the reason when either cannot be timed here (no GPU, out of
    memory), so that nothing is saved for a later run to reuse."""
    from bench import cases

    device = "cuda" if scale in ("gpu", "paper") else "cpu"
    names = {"dense": f"dense@{device}", "clicktrain": f"clicktrain@{device}"}
    path = Path(rows_path) if rows_path else BENCH_ROWS
    found: dict[str, dict[str, Any]] = {}
    source = f"measured by reproductions.clicktrain.fig11 ({case})"
    if path.exists():
        saved = json.loads(path.read_text())
        for r in saved.get("rows", []):
            for method, impl in names.items():
                if (
                    r.get("suite") == "iteration"
                    and r.get("case") == case
                    and r.get("impl") == impl
                ):
                    found[method] = r
        commit = (saved.get("provenance") or {}).get("commit", "?")
        if all(_phases(found.get(m, {})) for m in names):
            source = f"bench.run iteration rows in {path} (commit {str(commit)[:7]})"
        else:
            found = {}
    if not found:
        for method, impl in names.items():
            c, i = cases.find("iteration", case, impl, scale)
            found[method] = cases.run_pair(c, i, scale)
    missing = [f"{impl}: {found[m].get('status')} ({found[m].get('reason', '')})"
               for m, impl in names.items() if _phases(found[m]) is None]  # fmt: skip
    if missing:  # not saved: a later run on a machine that can measure it tries again
        raise RuntimeError(f"{case}: " + "; ".join(missing))
    out: dict[str, Any] = {"case": case, "source": source}
    for method, row in found.items():
        out.update({f"{method}_{k}": v for k, v in _phases(row).items()})  # type: ignore[union-attr]
        out["device"] = row.get("device_name") or row.get("device") or device
    # the CUDA paths ClickTrain's pattern ops took in one iteration (impl.ops.timed_choice)
    out["clicktrain_paths"] = found["clicktrain"].get("paths_per_iteration") or ""
    out["forward_speedup"] = out["dense_fwd_ms"] / out["clicktrain_fwd_ms"]
    out["backward_speedup"] = out["dense_bwd_ms"] / out["clicktrain_bwd_ms"]
    return out


def iteration_note(result: Any) -> str:
    """Fig. 11's note for a row: where its times come from (gpu: the benchmark rows' file and
    commit, or a measurement now, and the device; with the CUDA paths ClickTrain's pattern ops
    took), or the memory layout each trained run used (smoke, cpu, paper)."""
    m = result.measured
    if m:
        note = f"{m.get('source', '?')}, on {m.get('device', '?')}"
        paths = m.get("clicktrain_paths")
        if paths and result.row.label.endswith("ClickTrain"):
            note += (
                f"; ClickTrain's pattern ops ran {paths} (each the faster path timed under "
                "cuDNN's benchmark mode; 'dense': cuDNN on the masked weights)"
            )
        return note
    layouts = sorted({str(r.summary["memory_format"]) for r in result.runs
                      if r.summary.get("memory_format")})  # fmt: skip
    return f"trained in the {' and '.join(layouts)} layout" if layouts else ""


def rows(scale: str) -> list[Row]:
    """Dense and ClickTrain rows whose fwd/bwd times are compared."""
    if scale in ("smoke", "cpu"):
        rs = [r for r in method_rows(scale, "resnet50", "cifar10")
              if r.method == "dense" or "higher" in r.label]  # fmt: skip
        for r in rs:  # the scale's model stands for ResNet-50 on CIFAR
            if r.method == "clicktrain":
                r.paper = {"model": "resnet50", "dataset": "cifar10", "method": "clicktrain"}
        return rs
    if scale == "paper":
        return _trained_rows()
    out = []
    for (dataset, model), case in GPU_CASES.items():
        params = {"case": case}
        out.append(
            Row(f"{model} {dataset} dense", measure=MEASURE, params=params,
                measure_keys={k: f"dense_{k}" for k in _METHOD_KEYS},
                metrics=("fwd_ms", "bwd_ms"))
        )  # fmt: skip
        out.append(
            Row(f"{model} {dataset} ClickTrain", measure=MEASURE, params=params,
                measure_keys={k: f"clicktrain_{k}" for k in _METHOD_KEYS},
                paper={"model": model, "dataset": dataset, "method": "clicktrain"})
        )  # fmt: skip
    return out


def _synthetic(model: str, imagenet: bool) -> dict[str, Any]:
    size, classes, batch = (224, 1000, 64) if imagenet else (32, 10, 128)
    return {"model": model, "data": "synthetic", "stem": "imagenet" if imagenet else "cifar",
            "data_options": {"image_size": size, "in_channels": 3, "num_classes": classes,
                             "train_size": batch * 12, "test_size": batch},
            "epochs": 4, "schedule": "constant", "batch_size": batch, "eval_batch_size": batch,
            "max_steps_per_epoch": 12}  # fmt: skip


def _trained_rows() -> list[Row]:
    """Paper scale: dense and ClickTrain trained (4 short epochs on synthetic inputs,
    ClickTrain hard-pruning at the start of the fourth), their last epoch's medians."""
    out = []
    for dataset, models in (
        ("cifar10", ("resnet18", "resnet34", "resnet50", "vgg16")),
        ("imagenet", ("resnet34", "resnet50", "resnet101", "vgg16")),
    ):
        for model in models:
            train = _synthetic(model, dataset == "imagenet")
            # "The sparsity (i.e., compression ratio) for each model can be found in Table 2"
            # (Sec. 6.3): ImageNet's compressions, for the CIFAR shapes too
            ct = clicktrain_options("paper", train, "higher compression", model, "imagenet")
            dense = f"{model} {dataset} dense"
            out.append(Row(dense, "dense", train=train))
            out.append(
                Row(f"{model} {dataset} ClickTrain", "clicktrain",
                    options={**ct, **SHORT_CLICKTRAIN},
                    train=train, baseline=dense,
                    paper={"model": model, "dataset": dataset, "method": "clicktrain"})
            )  # fmt: skip
    return out


TARGET = Target(
    key="clicktrain.fig11",
    title="ClickTrain Fig. 11: forward and backward time per iteration",
    description=described(__doc__),
    rows=rows,
    metrics=("fwd_ms", "bwd_ms", "forward_speedup", "backward_speedup"),
    figures=panels_vs_paper(
        ("fwd_ms", "Forward time per iteration", "ms"),
        ("bwd_ms", "Backward time per iteration", "ms"),
    ),
    row_note=iteration_note,
    notes=lambda scale: (
        [
            "Times are the Trainer's medians over the last epoch's iterations (ClickTrain in its "
            "sparse stage). Each run trains in the memory layout of its config (the row's note "
            "names it); at cpu scale memory_format 'auto' gives dense channels-last and "
            "ClickTrain, whose pattern ops are NCHW, NCHW, so there the speedups compare "
            "layouts as well as sparsity."
            if scale != "gpu"
            else "Times are medians of forward and backward "
            "of one training iteration, dense and ClickTrain after hard pruning in the state "
            "bench.method_states builds (not trained: pattern masks at 84.4% conv-weight "
            "sparsity); the row's note says whether a GPU run of the benchmark suite gave them "
            "(its file and commit) and which CUDA paths ClickTrain's pattern ops took. "
            "The paper ran each model at its Table 2 compression (4.1x for ResNet-50, 4.2x "
            "ResNet-18, 4.6x ResNet-101, 6.6x VGG-16 on ImageNet: 76-85% of the weights "
            "pruned). That state prunes the 3x3 convolutions only, so its conv compression "
            "is 5.9x for ResNet-18, 6.1x ResNet-34 and 6.4x VGG-16 (sparser than the "
            "paper's, which favours our speedups) but 1.7x for ResNet-50 and ResNet-101, "
            "whose 1x1 convolutions stay dense (far less sparse than the paper's, which "
            "disfavours them).",
            "The paper's speedups are per iteration on a Quadro RTX 5000.",
            "Paper rows hold one phase each (setting forward/backward); ours give both speedups.",
        ]
        + (
            []
            if scale in ("smoke", "cpu")
            else [
                "CIFAR-shape rows time the ImageNet networks on a CIFAR stem at 32 px (the "
                "benchmark suite's iteration cases), not the PruneTrain CIFAR networks that "
                "Table 1's accuracy rows train (reproductions.clicktrain.CIFAR_MODELS); at "
                "paper scale every row is pruned to its model's Table 2 (ImageNet) compression, "
                "where the paper says its sparsities are (Sec. 6.3); a model Table 2 lacks "
                "(ResNet-34) keeps the default connectivity. ImageNet ResNet-101 has no case "
                "in the benchmark suite: its paper numbers stand alone."
            ]
        )
    ),
)


def main(scale: str = "cpu", runs_root: str | Path = "runs/reproductions",
         reports_root: str | Path = "reports") -> Path:  # fmt: skip
    """Run ClickTrain Fig. 11 at ``scale``; return the report's path."""
    return reproduce(TARGET, scale, runs_root, reports_root)
