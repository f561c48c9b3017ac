# Two commands from a fresh clone: `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
SCALE ?= cpu
STAMP := $(VENV)/.pdtbench-installed

.PHONY: demo test lint format setup clean

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
	$(PY) -m pytest -q tests

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

clean:
	rm -rf $(VENV) runs .pytest_cache
