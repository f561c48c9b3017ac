#!/usr/bin/env bash
# GPU evidence of the CUDA kernels: what `make gpu-check` writes, and more.
#
#   bash scripts/gpu/kernels.sh          # on the device: run(command="bash scripts/gpu/kernels.sh",
#                                        #   carry=[".whl", ".gpu"], timeout_s=600)
#   DRY_RUN=1 bash scripts/gpu/kernels.sh   # here: the CPU steps only, GPU steps "skipped"
#
# Steps (each under a time limit, in order of value; a failure is recorded and the next runs):
#   compile      NVRTC compile of impl/cuda/*.cu through the loader, per-kernel registers and
#                local memory -> reports/gpu/kernels.json
#   sass         the same sources compiled by the same libnvrtc for this GPU's architecture
#                (both read from kernels.json),
#                their machine code scanned for the shared-memory hazard racecheck found on the
#                H200 (impl/cuda/sass_hazards.py; about 20 s, on the CPU)
#                -> reports/gpu/sass-hazards.json
#   tests        pytest -m gpu tests/test_cuda_ops.py (slow ones too) -> reports/gpu/tests.{xml,log}
#   kernel-bench bench.run --scale gpu, suites spmm, nm_prune and pack (with calibration; the rows
#                carry host_bound) -> reports/gpu/kernel-bench/ (bench.sh leaves these suites out);
#                then the conv cases of $KERNEL_BENCH_CONV_CASES, if any -> kernel-bench/conv/
#   tests-other  the other GPU tests of tests/ but SDGP's (sdgp_semi.sh runs those)
#                -> reports/gpu/tests-other.{xml,log}
#   racecheck    compute-sanitizer racecheck on the SpMM/SDDMM/implicit-conv tests and part
#                of the rescaled N:M tests ($RACECHECK_K, 86 tests) -> racecheck.log
#   memcheck     compute-sanitizer memcheck on every fast non-N:M GPU test and the N:M tests
#                of 2:4, 3:7, 8:32 in float32, float64, bfloat16 ($MEMCHECK_K, 445 of the 842 fast ones;
#                MEMCHECK_K="" takes them all) -> memcheck.log; it runs
#                last and gets what the budget leaves: a cut log says how far it got, and
#                the step reads "cut", not a failure (a sanitizer report in its log still
#                fails it, cut or not)
# After each sanitizer run, scripts/gpu/sanitizer_coverage.py reads the kernels its tests
# launched (PDT_KERNEL_LAUNCH_LOG, tests/conftest.py) -> <tool>-coverage.json: the step fails
# when a kernel family it must check never ran (memcheck: every one; racecheck: those with
# shared memory).
# The sanitizer steps run pytest in one process (compute-sanitizer follows the process it
# starts; pytest-xdist's workers talk to it through pipes, a path not tried here), with
# --report-api-errors no (torch probes the driver with calls that fail by design) and
# --kernel-name kns=pdt_ (only the project's kernels, all extern "C" pdt_*, are instrumented;
# torch's and cuBLAS's run at full speed). SAN_KERNELS= checks every kernel.
# Everything comes back as $OUT/kernels.tar.gz (paths from the repository root), plus
# $OUT/kernels.log and $OUT/kernels-steps.tsv. See docs/gpu-session.md.
NAME=kernels
REPORT=reports/gpu
DEFAULT_BUDGET_S=480
PREFLIGHT="impl.cuda.loader impl.cuda.nvrtc impl.cuda.sass_hazards impl.ops.pattern_cuda \
impl.ops.nm_cuda impl.ops.pack_cuda pytest"
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"

XDIST=$(xdist_args 8)
CS=$("$PY" -c "import sys; sys.path.insert(0, 'scripts/gpu'); import env_report as e; \
print(e.find_tool('compute-sanitizer', e.SANITIZER_GLOBS) or '')" 2>/dev/null)
export XDIST CS
PYTEST="\"$PY\" -m pytest -p no:cacheprovider"
SAN_TESTS="-m 'gpu and not slow' tests/test_cuda_ops.py --maxfail=5 -v"
# (dense-gradient tests: their forward kernels are checked by other tests, and besides them they
# launch only the gather and scatter kernels; the tests step runs them)
MEMCHECK_K=${MEMCHECK_K-"(not nm_ or ((2:4 or 3:7 or 8:32) and (f32 or f64 or bf16))) \
and not dense-grads"}
# racecheck: the SpMM and SDDMM tests in float32 (float64 instantiates the same code), the
# implicit conv, the rescaled N:M tests at 2:4 (the fused kernel's test runs the three
# others too; channels-last inputs the contiguous groups' statistics) and one at 5:16 in
# float32 (the sub-warp statistics of wide groups), and the float32 int32 expand: 86 tests,
# so that every family with shared memory is reached well inside the step's limit (the first
# H200 run, over 135 tests, was cut before the last three families)
RACECHECK_K=${RACECHECK_K-"(((spmm or sddmm) and f32) or implicit_conv_writes \
or (rescaled and 2:4 and (f32 or bf16)) or (4x8x5x7-5:16-f32-plane) \
or (expand_writes and f32 and i32)) and not dense-grads"}
# compute-sanitizer's kernel filter (--kernel-name, key kns: a substring of the mangled name)
SAN_KERNELS=${SAN_KERNELS-pdt_}
SAN_FLAGS="--error-exitcode 1 --report-api-errors no${SAN_KERNELS:+ --kernel-name kns=$SAN_KERNELS}"
export MEMCHECK_K RACECHECK_K SAN_FLAGS
# Both sanitizers run until their limit at most: cut there, a step reads "cut" (common.sh), not
# failed. Each stops its sanitizer SAN_STOP_S before the step's limit (STEP_LIMIT, exported by
# `step`), so that `covered` still counts what the cut run launched (the test session logs its
# launches test by test) and the step ends with timeout's 124.
CUT_OK_STEPS="racecheck memcheck"
SAN_STOP_S=15
SAN_TIMEOUT="timeout -k 5 \$(( STEP_LIMIT > 2 * SAN_STOP_S ? STEP_LIMIT - SAN_STOP_S : STEP_LIMIT / 2 ))"
export SAN_STOP_S
# the kernel-bench suites (bench.sh's rows part times csr; make gpu-check adds it here)
KERNEL_BENCH_SUITES=${KERNEL_BENCH_SUITES:-"spmm nm_prune pack"}
KERNEL_BENCH_ARGS=$(for s in $KERNEL_BENCH_SUITES; do printf -- '--suite %s ' "$s"; done)
# conv cases timed after those suites, into kernel-bench/conv (make gpu-check names two at the
# paper's shape, so that the implicit-im2col conv and the SDDMM / transposed-SpMM gradients
# are timed against cuDNN too; bench.sh times the whole conv suite in a session)
KERNEL_BENCH_CONV_CASES=${KERNEL_BENCH_CONV_CASES:-}
KERNEL_BENCH_CONV_ARGS=$(for c in $KERNEL_BENCH_CONV_CASES; do printf -- '--case %s ' "$c"; done)
need_cs='[ -n "$CS" ] || { echo "compute-sanitizer not found (PATH, /usr/local/cuda*)"; exit 3; }'

common_steps
step compile gpu 90 "\"$PY\" scripts/gpu/compile_kernels.py --json \"$DEST/kernels.json\""
step sass gpu 60 "\"$PY\" scripts/gpu/compile_kernels.py --sass \"$DEST/sass-hazards.json\" \
  --report \"$DEST/kernels.json\""
step tests gpu 150 "$PYTEST -q -m gpu tests/test_cuda_ops.py $XDIST \
  --junitxml=\"$DEST/tests.xml\" | tee \"$DEST/tests.log\""
# (140 s: the suites' 45-75 s, and up to 25 s per conv case; a session's part budget clamps it)
step kernel-bench gpu 140 "PDTBENCH_BENCH_SCALE=gpu \"$PY\" -m bench.run --scale gpu \
  $KERNEL_BENCH_ARGS--out \"$DEST/kernel-bench\"${KERNEL_BENCH_CONV_ARGS:+ && \
  PDTBENCH_BENCH_SCALE=gpu \"$PY\" -m bench.run --scale gpu --suite conv \
  $KERNEL_BENCH_CONV_ARGS--out \"$DEST/kernel-bench/conv\"}"
step tests-other gpu 120 "$PYTEST -q -m gpu tests --ignore=tests/test_cuda_ops.py \
  --ignore=tests/test_sdgp_semi.py --ignore=tests/test_sdgp.py --ignore=tests/test_sdgp_timing.py $XDIST \
  --junitxml=\"$DEST/tests-other.xml\" | tee \"$DEST/tests-other.log\""
# covered TOOL RC: after a sanitizer run, which kernel families it launched against those it
# must check, and the reports in its log (scripts/gpu/sanitizer_coverage.py) ->
# TOOL-coverage.json, appended to TOOL.log; exits 1 when the log holds a report (a run cut at
# its limit too: the sanitizer gives its error exit code only when it ends), else with the
# run's status RC, else the coverage's (1: a family it must check never ran).
covered() {
  "$PY" scripts/gpu/sanitizer_coverage.py "$DEST/$1-launches.jsonl" --tool "$1" \
    --kernels "$DEST/kernels.json" --kernels reports/gpu/kernels.json \
    --sanitizer-log "$DEST/$1.log" --json "$DEST/$1-coverage.json" | tee -a "$DEST/$1.log"
  local c=$?
  [ "$c" -eq 2 ] && return 1
  [ "$2" -ne 0 ] && return "$2"
  return $c
}
export -f covered
step racecheck gpu 150 "$need_cs; rm -f \"$DEST/racecheck-launches.jsonl\"; \
  PDT_KERNEL_LAUNCH_LOG=\"$DEST/racecheck-launches.jsonl\" PYTORCH_NO_CUDA_MEMORY_CACHING=1 \
  $SAN_TIMEOUT \"\$CS\" --tool racecheck \$SAN_FLAGS $PYTEST $SAN_TESTS \
  \${RACECHECK_K:+-k \"\$RACECHECK_K\"} | tee \"$DEST/racecheck.log\"; covered racecheck \$?"
step memcheck gpu 180 "$need_cs; rm -f \"$DEST/memcheck-launches.jsonl\"; \
  PDT_KERNEL_LAUNCH_LOG=\"$DEST/memcheck-launches.jsonl\" PYTORCH_NO_CUDA_MEMORY_CACHING=1 \
  $SAN_TIMEOUT \"\$CS\" --tool memcheck \$SAN_FLAGS --leak-check no $PYTEST $SAN_TESTS \
  \${MEMCHECK_K:+-k \"\$MEMCHECK_K\"} | tee \"$DEST/memcheck.log\"; covered memcheck \$?"
