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
# uv installs into the venv (pip took ~2 min of every fresh setup here, uv ~20 s: parallel downloads, no
# resolver backtracking). It reads no pip configuration, so a pip find-links folder (where a machine keeps its
# torch wheels) is handed over through UV_FIND_LINKS; both are the user's to override.
UV_INSTALL = $(BIN)/python -m uv pip install --python $(BIN)/python
export UV_FIND_LINKS ?= $(PIP_FIND_LINKS)
# Test workers: the slow tests wait on heartbeats, servers and subprocess imports, so 3 beat 2 even on 2 cores.
# --dist loadgroup keeps each module marked in tests/conftest.py (a shared `tune` run as its fixture) on one worker.
TEST_WORKERS ?= 3

.PHONY: setup tune test lint ruff benchmarks
setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet uv
	$(BIN)/python -c "import torch" 2>/dev/null || $(UV_INSTALL) $(TORCH_SPEC)
	$(UV_INSTALL) --quiet -e '.[test]'
	touch $@

tune: setup
	$(BIN)/tune $(ARGS)

# make test: ruff (check and format), then the suite with mypy beside it (a cold mypy takes ~1 min of one core,
# which the suite's workers, waiting on subprocesses and servers, partly leave free). Each one's exit status
# counts: a pytest failure, an error, or no test collected at all (exit 5) fails the target, and so does a mypy error,
# whose report is printed after the suite's.
test: setup ruff
	@$(BIN)/mypy >$(VENV)/mypy.log 2>&1 & types=$$!; \
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS); tests=$$?; \
	wait $$types; typed=$$?; echo "mypy:"; cat $(VENV)/mypy.log; \
	if [ $$tests -ne 0 ]; then exit $$tests; fi; exit $$typed

lint: ruff
	$(BIN)/mypy

ruff: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

benchmarks: setup
	$(BIN)/python -m benchmarks.overhead
	$(BIN)/python -m benchmarks.trial_cost
