#!/usr/bin/env bash
# The benchmark suites at the papers' sizes on one GPU (issue: benchmarks): what
# `make bench-gpu` makes, without .venv and split into parts that fit a device call.
#
#   bash scripts/gpu/bench.sh [PART ...]       # PART: rows iteration pytest asv (default: all,
#                                              # in that order)
#   DRY_RUN=1 bash scripts/gpu/bench.sh        # here: the CPU steps only
#
# Parts (each a step under a time limit; a failure is recorded and the next part runs):
#   rows       bench.run --scale gpu, every suite but iteration -> reports/bench/gpu/rows.{csv,json},
#              summary.md (calibration, csr, spmm, conv, nm_prune, allreduce)
#   iteration  bench.run --scale gpu --suite iteration -> reports/bench/gpu/iteration/
#   pytest     pytest-benchmark on the paper-shape kernel cases ($PYTEST_K) ->
#              reports/bench/gpu/pytest-benchmark.json
#   asv        asv machine + asv run --python=same --quick on $ASV_BENCH + asv publish ->
#              reports/asv/results/<machine>/, reports/asv/html/ (needs git: the git step
#              restores it from .gpu/repo.bundle)
# Results come back as $OUT/bench-<parts>.tar.gz (paths from the repository root), with
# bench-<parts>.log and bench-<parts>-steps.tsv. See docs/gpu-session.md.
NAME=bench
REPORT=reports/bench/gpu
DEFAULT_BUDGET_S=450
PARTS=("$@")
[ ${#PARTS[@]} -gt 0 ] || PARTS=(rows iteration pytest asv)
for p in "${PARTS[@]}"; do
  case $p in
    rows | iteration | pytest | asv) ;;
    *) echo "unknown part '$p'; valid: rows iteration pytest asv" >&2; exit 2 ;;
  esac
done
RUN_TAG="bench-$(IFS=-; echo "${PARTS[*]}")"
PREFLIGHT="bench.run bench.cases pytest_benchmark"  # run_asv checks asv, asv imports bench.asv_*
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"

# The pytest-benchmark selection (27 pairs): the calibration, the 90%-sparse paper shapes of
# csr, spmm and conv (forward, forward+backward) and two N:M groupings, every implementation.
PYTEST_K=${PYTEST_K:-"not iteration and not allreduce and (test_calibration or s90 or 2of4 or 16of32)"}
# The asv selection (50 of the 1,760 benchmark-parameter pairs of the gpu scale): one case per
# kernel suite with every implementation, ResNet-18 (CIFAR shape) iterations and the Allreduce
# bytes of ResNet-18. asv forks a process per pair, each initialising CUDA: the whole grid
# would take far longer than a device call.
ASV_BENCH=${ASV_BENCH:-"^asv_kernels\.Calibration(Copy|Gemm)\.|^asv_kernels\.(CSRConversion|SpMM|Conv2d|NMPrune)\.(time_op|track_tflops|track_gbps)\('(paper-256x128x3x3-s90|paper-256x1152x50176-s90|paper-1x128x224x224-fwdbwd-s90|128x256x56x56-2of4)'|^asv_iteration\.Iteration\.time_iteration\('resnet18-cifar32-b128'|^asv_comm\.AllreduceBytes\.track_payload_bytes\('resnet18-cifar-c10'"}
export PYTEST_K ASV_BENCH

run_asv() {
  "$PY" -c "import asv, asv_runner" || { echo "asv is not importable: carry .whl"; return 3; }
  local commit
  commit=$(git rev-parse HEAD 2>/dev/null) || { echo "no git repository (see the git step)"; return 3; }
  "$PY" -m asv machine --yes --machine "$DEVICE_SLUG" || return 1
  local rc=0
  PDTBENCH_BENCH_SCALE=gpu "$PY" -m asv run --python=same --quick --show-stderr \
    --set-commit-hash "$commit" --machine "$DEVICE_SLUG" -b "$ASV_BENCH" || rc=1
  "$PY" -m asv publish || rc=1
  mkdir -p "$STAGE/reports/asv"
  for d in results html; do
    [ -d "reports/asv/$d" ] && cp -r "reports/asv/$d" "$STAGE/reports/asv/"
  done
  return $rc
}
export -f run_asv

common_steps
for p in "${PARTS[@]}"; do
  case $p in
    rows)
      step rows gpu 270 "PDTBENCH_BENCH_SCALE=gpu \"$PY\" -m bench.run --scale gpu \
        --suite calibration --suite csr --suite spmm --suite conv --suite nm_prune \
        --suite allreduce --out \"$DEST\"" ;;
    iteration)
      step iteration gpu 240 "PDTBENCH_BENCH_SCALE=gpu \"$PY\" -m bench.run --scale gpu \
        --suite iteration --out \"$DEST/iteration\"" ;;
    pytest)
      step pytest gpu 150 "PDTBENCH_BENCH_SCALE=gpu \"$PY\" -m pytest -q -p no:cacheprovider \
        bench --benchmark-only -k \"\$PYTEST_K\" --benchmark-json \"$DEST/pytest-benchmark.json\"" ;;
    asv)
      step asv gpu 240 run_asv ;;
  esac
done
