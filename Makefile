# Two commands from a fresh clone: `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
SCALE ?= cpu
STAMP := $(VENV)/.pdtbench-installed
# Test processes for `make test` (pytest-xdist); 0 runs the suite in one process.
TEST_JOBS ?= 2

.PHONY: demo test test-slow test-all test-emulated lint format setup clean bench-asv-smoke \
	bench-gpu gpu-check

$(STAMP): pyproject.toml scripts/bootstrap.sh
	VENV=$(VENV) bash scripts/bootstrap.sh
	touch $(STAMP)

setup: $(STAMP)

## The main job on the embedded default data (digits).
demo: $(STAMP)
	$(PY) -m impl.cli demo --scale $(SCALE)

## Lint, format check and the test suite but its slow tests (GPU tests skip without a GPU).
test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m pytest -q -n $(TEST_JOBS) --dist loadgroup -p no:benchmark --durations=10 -m "not slow" tests
	PDTBENCH_BENCH_SMALL=1 $(PY) -m pytest -q -p no:cacheprovider bench --benchmark-disable

## The slow tests (marked `slow`: a case over about 5 s on a 2-core machine): whole trainings in
## processes of their own stopped by signals, distributed jobs, the GPU scripts' dry runs, the
## smoke-scale reproduction in a browser, nvcc for sm_75, sm_80 and sm_90. CI runs them after `test`.
test-slow: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_JOBS) --dist loadgroup -p no:benchmark --durations=10 -m slow tests

## Everything CI runs, in its order.
test-all: test test-slow test-emulated

## The kernels' GPU tests against their CPU emulation (impl/cuda/pdt_host_emulation.cuh): their
## inputs, references, tolerances and path choices, checked on any machine before a GPU run;
## racecheck's selection of them under the emulation built as a race checker (ThreadSanitizer,
## when g++ has it); and the emulated kernel tests with blocks and threads run last first.
test-emulated: $(STAMP)
	PDT_EMU_GPU_TESTS=1 $(PY) -m pytest -q -n $(TEST_JOBS) -p no:benchmark -m "not slow" tests/test_cuda_ops.py

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

clean:
	rm -rf $(VENV) runs .pytest_cache

## asv at the smoke sizes on any machine, its results and list of benchmarks under
## .asv/scratch (bench/asv_scratch.py): the tracked reports/asv/results keep the GPU history.
bench-asv-smoke: $(STAMP)
	@cfg=$$($(PY) -m bench.asv_scratch) && $(VENV)/bin/asv --config $$cfg machine --yes && \
	PDTBENCH_BENCH_SMALL=1 $(VENV)/bin/asv --config $$cfg run --python=same --quick --show-stderr

## Benchmarks on one GPU: tidy rows, pytest-benchmark JSON, asv results and HTML.
## asv --quick runs each benchmark once: a time_op value is one call (after one untimed call
## in setup), not a median; the track_ values are medians over many calls (bench.measure, CUDA
## events), and so are the tidy rows of bench.run: read those for the figures. (Without
## --quick asv samples each of the gpu grid's 335 time pairs for up to 20 s.)
## The iteration rows go where ClickTrain Fig. 11's gpu scale reads them (bench.sh's layout).
## Every step runs even where one before it failed (a kernel's error row must not cost the
## pytest and asv results); the target fails at the end if one did, and stops at once on a
## signal (Ctrl-C: exit status 128 or more).
## Both GPU targets first check, on a machine with a GPU, that the hand-written kernels can
## run (CuPy: `EXTRAS=dev,cuda make setup`), rather than skip every kernel row.
GPU_PREFLIGHT = $(PY) -m impl.cuda.preflight $@
bench-gpu: $(STAMP)
	@$(GPU_PREFLIGHT)
	@rc=0; head=$$(git rev-parse HEAD); \
	step() { echo "+ $$*"; "$$@" || { r=$$?; [ $$r -lt 128 ] || exit $$r; rc=1; }; }; \
	step env PDTBENCH_BENCH_SCALE=gpu $(PY) -m bench.run --scale gpu --out reports/bench/gpu --suite calibration --suite csr --suite spmm --suite conv --suite nm_prune --suite pack; \
	step env PDTBENCH_BENCH_SCALE=gpu $(PY) -m bench.run --scale gpu --out reports/bench/gpu/iteration --suite iteration; \
	step env PDTBENCH_BENCH_SCALE=gpu $(PY) -m pytest -q -p no:cacheprovider bench --benchmark-only -k "not iteration" --benchmark-json reports/bench/gpu/pytest-benchmark.json; \
	step $(VENV)/bin/asv machine --yes; \
	step env PDTBENCH_BENCH_SCALE=gpu $(VENV)/bin/asv run -E existing:same --quick --set-commit-hash $$head; \
	step $(VENV)/bin/asv publish; \
	echo "bench-gpu: every step ran (exit $$rc: 1 if one failed)"; exit $$rc

## GPU evidence of the CUDA kernels: compile report, GPU tests, racecheck and memcheck (each
## with the kernel families it launched), and a short benchmark of each kernel against its
## baselines -> reports/gpu/ (scripts/gpu/kernels.sh, the device runs' script, with this
## Python and no wheels; every step runs, and the target fails if one failed).
## GPU_CHECK_INTO: where the results are unpacked (default: here).
GPU_CHECK_BUDGET_S ?= 570
## The conv cases (at the paper's 128 x 224 x 224 input, 90% sparsity) that time the implicit
## conv and the SDDMM / transposed-SpMM gradients against cuDNN.
GPU_CHECK_CONV_CASES ?= paper-1x128x224x224-fwd-s90 paper-1x128x224x224-fwdbwd-s90
GPU_CHECK_INTO ?= .
gpu-check: $(STAMP)
	@$(GPU_PREFLIGHT)
	@out=$$(mktemp -d); rc=0; \
	OUT=$$out PY=$(PY) WHEELS=0 BUDGET_S=$(GPU_CHECK_BUDGET_S) \
	  KERNEL_BENCH_SUITES="csr spmm nm_prune pack" \
	  KERNEL_BENCH_CONV_CASES="$(GPU_CHECK_CONV_CASES)" bash scripts/gpu/kernels.sh || rc=$$?; \
	mkdir -p $(GPU_CHECK_INTO) && tar -xzf $$out/kernels.tar.gz -C $(GPU_CHECK_INTO) || rc=1; \
	echo "gpu-check: results in $(GPU_CHECK_INTO)/reports/gpu/ (exit $$rc)"; rm -rf $$out; exit $$rc
