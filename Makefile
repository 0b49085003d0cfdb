# posfair — `make tune` tunes the embedded default (MiniLM on WikiPos); `make test` runs the test suite.
# Both set up .venv on first use: torch first (a CPU build; an unpinned torch would pull a multi-GB
# CUDA build), then the project. On a GPU machine choose your build, e.g.
#   make tune TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu126"
# A venv that already has torch keeps it.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.posfair-installed

.PHONY: setup tune test benchmarks
setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install $(TORCH_SPEC)
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@

tune: setup
	$(BIN)/tune $(ARGS)

test: setup
	$(BIN)/pytest $(PYTEST_ARGS)

benchmarks: setup
	$(BIN)/python -m benchmarks.overhead
	$(BIN)/python -m benchmarks.trial_cost
