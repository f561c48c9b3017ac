#!/usr/bin/env bash
# The benchmark suites at the papers' sizes on one GPU: what
# `make bench-gpu` makes, without .venv and split into parts that fit a device call.
#
#   bash scripts/gpu/bench.sh [PART ...]       # PART: iteration rows pytest asv (default: all,
#                                              # in that order: the order of value)
#   DRY_RUN=1 bash scripts/gpu/bench.sh        # here: the CPU steps only
#
# Parts (each a step under a time limit; a failure is recorded and the next part runs; a step
# cut by its limit keeps the rows it measured, marked "complete": false, see bench/run.py):
#   iteration  bench.run --scale gpu --suite iteration, the cases in $ITER_CASES' order (the
#              CIFAR shapes first, VGG-16 at 224 px last) -> reports/bench/gpu/iteration/
#   rows       bench.run --scale gpu, suites calibration, csr, conv -> reports/bench/gpu/rows.{csv,
#              json}, summary.md (spmm, nm_prune and pack: kernels.sh's kernel-bench step writes them
#              to reports/gpu/kernel-bench/; allreduce is deterministic byte counts, measured
#              once on the CPU: reports/bench/cpu/)
#   pytest     pytest-benchmark on the paper-shape kernel cases ($PYTEST_K) ->
#              reports/bench/gpu/pytest-benchmark.json (a cut keeps the benchmarks that
#              ended, "pdtbench_run": {"complete": false}; .partial.jsonl: a line per benchmark)
#   asv        asv machine + asv run -E existing:same --quick on $ASV_BENCH + asv publish ->
#              reports/asv/results/<machine>/, reports/asv/html/ (needs git: the git step
#              restores it from .gpu/repo.bundle)
# Results come back as $OUT/bench-<parts>.tar.gz (paths from the repository root), with
# bench-<parts>.log and bench-<parts>-steps.tsv. See docs/gpu-session.md.
NAME=bench
REPORT=reports/bench/gpu
DEFAULT_BUDGET_S=480
PARTS=("$@")
[ ${#PARTS[@]} -gt 0 ] || PARTS=(iteration rows pytest asv)
for p in "${PARTS[@]}"; do
  case $p in
    iteration | rows | pytest | asv) ;;
    *) echo "unknown part '$p'; valid: iteration rows pytest asv" >&2; exit 2 ;;
  esac
done
RUN_TAG="bench-$(IFS=-; echo "${PARTS[*]}")"
PREFLIGHT="bench.run bench.cases pytest_benchmark"  # run_asv checks asv, asv imports bench.asv_*
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"

# The pytest-benchmark selection (30 pairs): the calibration, the 90%-sparse paper shapes of
# csr, spmm and conv (forward, forward+backward) and two N:M groupings, every implementation.
PYTEST_K=${PYTEST_K:-"not iteration and not allreduce and (test_calibration or s90 or 2of4 or 16of32)"}
# The asv selection (28 of the benchmark-parameter pairs of the gpu scale): time_op of one case
# per kernel suite with every implementation, and ResNet-18 (CIFAR shape) iterations. asv forks
# a process per pair, each initialising CUDA (seconds each): the whole grid, or the track_*
# twins of these pairs, would take far longer than a device call; bench.run's rows carry the
# rates.
ASV_BENCH=${ASV_BENCH:-"^asv_kernels\.Calibration(Copy|Gemm)\.time_op|^asv_kernels\.(CSRConversion|SpMM|Conv2d|NMPrune)\.time_op\('(paper-256x128x3x3-s90|paper-256x1152x50176-s90|paper-1x128x224x224-fwdbwd-s90|128x256x56x56-2of4)'|^asv_iteration\.Iteration\.time_iteration\('resnet18-cifar32-b128'"}
# The iteration cases in order of value (a time limit cuts the last): every model at the CIFAR
# shape (batch 128), then the ImageNet shape (224 px, batch 64), VGG-16's the dearest.
ITER_CASES=${ITER_CASES:-"resnet18-cifar32-b128 resnet34-cifar32-b128 resnet50-cifar32-b128 \
vgg16-cifar32-b128 resnet18-imagenet224-b64 resnet50-imagenet224-b64 resnet34-imagenet224-b64 \
vgg16-imagenet224-b64"}
ITER_ARGS=$(for c in $ITER_CASES; do printf -- '--case %s ' "$c"; done)
export PYTEST_K ASV_BENCH

run_asv() {
  local t0=$SECONDS
  "$PY" -c "import asv, asv_runner" || { echo "asv is not importable: carry .whl"; return 3; }
  local commit
  commit=$(git rev-parse HEAD 2>/dev/null) || { echo "no git repository (see the git step)"; return 3; }
  # the machine's full description (asv machine --yes would store the name alone)
  "$PY" -c "import sys; from asv.machine import Machine, MachineCollection
d = Machine.get_defaults(); d['machine'] = sys.argv[1]; MachineCollection.save(sys.argv[1], d)" \
    "$DEVICE_SLUG" || return 1
  # asv writes its results only when a run ends, and the step's timeout would kill publish
  # and the copy too: two runs (kernels, then iterations), each under its own limit inside
  # the step's, so that a cut loses one half and publish and the copy always run.
  # -E existing:same: the installed stack, with no matrix (the matrix would record torch's
  # pinned version, not the one installed).
  local kernels=${ASV_BENCH%%|^asv_iteration*} iterations="" rc=0
  [ "$kernels" != "$ASV_BENCH" ] && iterations=${ASV_BENCH#"$kernels|"}
  local room=$(( ${STEP_LIMIT:-120} - 25 ))
  [ "$room" -lt 20 ] && room=20
  local first=$room
  [ -n "$iterations" ] && first=$(( room * 2 / 3 ))
  # A half cut at its cap, or left no time, makes the step a timeout (124: the session reads
  # it "partial" where the budget shortened the part), not a failure.
  local part cap r cut=0
  for part in kernels iterations; do
    local regex=${!part}
    [ -n "$regex" ] || continue
    cap=$first
    [ "$part" = iterations ] && cap=$(( room - (SECONDS - t0) ))
    [ "$cap" -ge 10 ] || { echo "asv $part: no time left"; cut=1; continue; }
    PDTBENCH_BENCH_SCALE=gpu timeout -k 5 "$cap" "$PY" -m asv run -E existing:same --quick \
      --show-stderr --set-commit-hash "$commit" --machine "$DEVICE_SLUG" -b "$regex"
    r=$?
    case $r in
      0) ;;
      124 | 137) echo "asv $part: cut at its ${cap}s"; cut=1 ;;
      *) rc=1 ;;
    esac
  done
  "$PY" -m asv publish || rc=1
  mkdir -p "$STAGE/reports/asv"
  for d in results html; do
    [ -d "reports/asv/$d" ] && cp -r "reports/asv/$d" "$STAGE/reports/asv/"
  done
  [ "$rc" = 0 ] && [ "$cut" = 1 ] && return 124
  return $rc
}
export -f run_asv

common_steps
for p in "${PARTS[@]}"; do
  case $p in
    iteration)
      step iteration gpu 180 "PDTBENCH_BENCH_SCALE=gpu \"$PY\" -m bench.run --scale gpu \
        --suite iteration $ITER_ARGS--out \"$DEST/iteration\"" ;;
    rows)
      step rows gpu 120 "PDTBENCH_BENCH_SCALE=gpu \"$PY\" -m bench.run --scale gpu \
        --suite calibration --suite csr --suite conv --out \"$DEST\"" ;;
    pytest)
      step pytest gpu 90 "PDTBENCH_BENCH_SCALE=gpu \"$PY\" -m pytest -q -p no:cacheprovider \
        bench --benchmark-only -k \"\$PYTEST_K\" --benchmark-json \"$DEST/pytest-benchmark.json\"" ;;
    asv)
      step asv gpu 150 run_asv ;;
  esac
done
