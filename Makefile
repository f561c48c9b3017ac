# Two commands from a fresh clone: `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
SCALE ?= cpu
STAMP := $(VENV)/.pdtbench-installed
# Test processes for `make test` (pytest-xdist); 0 runs the suite in one process.
TEST_JOBS ?= 2

.PHONY: demo test lint format setup clean bench-gpu gpu-check

$(STAMP): pyproject.toml scripts/bootstrap.sh
	VENV=$(VENV) bash scripts/bootstrap.sh
	touch $(STAMP)

setup: $(STAMP)

## The main job on the embedded default data (digits).
demo: $(STAMP)
	$(PY) -m impl.cli demo --scale $(SCALE)

## Lint, format check and the test suite (GPU tests skip without a GPU).
test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m pytest -q -n $(TEST_JOBS) --dist loadgroup -p no:benchmark tests
	PDTBENCH_BENCH_SMALL=1 $(PY) -m pytest -q -p no:cacheprovider bench --benchmark-disable

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

clean:
	rm -rf $(VENV) runs .pytest_cache

## Benchmarks on one GPU: tidy rows, pytest-benchmark JSON, asv results and HTML.
bench-gpu: $(STAMP)
	PDTBENCH_BENCH_SCALE=gpu $(PY) -m bench.run --scale gpu --out reports/bench/gpu --suite calibration --suite csr --suite spmm --suite conv --suite nm_prune --suite pack --suite iteration
	PDTBENCH_BENCH_SCALE=gpu $(PY) -m pytest -q -p no:cacheprovider bench --benchmark-only -k "not iteration" --benchmark-json reports/bench/gpu/pytest-benchmark.json
	$(VENV)/bin/asv machine --yes
	PDTBENCH_BENCH_SCALE=gpu $(VENV)/bin/asv run -E existing:same --quick --set-commit-hash $$(git rev-parse HEAD)
	$(VENV)/bin/asv publish

## GPU evidence of the CUDA kernels: GPU tests, sanitizers and a short benchmark of each
## kernel against its baselines -> reports/gpu/
gpu-check: $(STAMP)
	mkdir -p reports/gpu
	$(PY) -m pytest -q -m gpu tests/test_cuda_ops.py --junitxml=reports/gpu/tests.xml 2>&1 | tee reports/gpu/tests.log
	PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck --error-exitcode 1 --report-api-errors no --kernel-name kns=pdt_ $(PY) -m pytest -q -x -m "gpu and not slow" tests/test_cuda_ops.py 2>&1 | tee reports/gpu/memcheck.log
	PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool racecheck --error-exitcode 1 --report-api-errors no --kernel-name kns=pdt_ $(PY) -m pytest -q -x -m "gpu and not slow" tests/test_cuda_ops.py -k "spmm or sddmm or rescaled" 2>&1 | tee reports/gpu/racecheck.log
	PDTBENCH_BENCH_SCALE=gpu $(PY) -m bench.run --scale gpu --out reports/gpu/kernel-bench --suite calibration --suite csr --suite spmm --suite nm_prune --suite pack
