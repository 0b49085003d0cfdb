"""Shared fixtures: tiny randomly initialised models and tokenizers, built from configs (no hub)."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# MLflow's telemetry thread sets and pops _MLFLOW_TELEMETRY_SESSION_ID in os.environ, racing any thread that walks
# os.environ (urllib's proxy lookup, on every request): one suite run here failed a log-batch with
# KeyError('_MLFLOW_TELEMETRY_SESSION_ID').
# The suite's processes have no internet to send it to anyway.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
# One intra-op thread for torch here and in every process the tests start (set before torch is imported, so the
# fork server's children inherit it): the suite runs three workers and their `tune` processes on two cores, where
# a second thread only spins against the other processes. A tiny tune run took 11.3 s with one thread against
# 14.3 s with two beside two busy loops, and 6.9 s against 6.5 s on an idle machine.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
if "POSFAIR_TEST_STORE_LOCKS" not in os.environ:  # set once, by the first pytest process: its workers inherit it
    os.environ["POSFAIR_TEST_STORE_LOCKS"] = tempfile.mkdtemp(prefix="store-locks-")
    atexit.register(shutil.rmtree, os.environ["POSFAIR_TEST_STORE_LOCKS"], ignore_errors=True)

from pathlib import Path

import pytest

from tests import mlflow_template
from tests.tiny import save_tiny

POOLING = {"bert-cls": ("bert", "cls"), "bert-mean": ("bert", "mean"), "xlmr-cls": ("xlmr", "cls"), "qwen3-last": ("qwen3", "last")}


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory):
    """Folder of a tiny model of the given kind, built once per session."""
    made: dict[str, Path] = {}

    def make(kind: str) -> Path:
        if kind not in made:
            made[kind] = save_tiny(kind, tmp_path_factory.mktemp(f"tiny-{kind}"))
        return made[kind]

    return make


@pytest.fixture(autouse=True, scope="session")
def _mlflow_store_template(tmp_path_factory: pytest.TempPathFactory) -> None:
    """New SQLite MLflow stores in this process start as a copy of a migrated one (tests/mlflow_template.py)."""
    mlflow_template.install(tmp_path_factory.mktemp("mlflow-template"))


@pytest.fixture(autouse=True, scope="session")
def _quiet_transformers() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models gain nothing from threads, and on a busy machine they lose a lot to contention."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# Module-scoped fixtures that run whole `tune` studies (or an MLflow server behind one). Under `make test`'s
# `--dist loadgroup` the tests that use one of them run on one worker, so the study runs once instead of once per
# worker that drew one of its tests; a module's other tests, and its other shared runs, spread over the workers
# (grouping whole modules put test_paths' two studies and test_tracking's two behind each other on one worker).
SHARED_RUNS = ("default_run", "server_run", "workspace", "headline_run", "bge_m3_run", "qwen3_run", "budgeted", "readme_project")


# The modules whose tests (or shared runs) take longest, started first: a long one drawn last would leave the
# other workers idle at the end of the suite (the slowest tests, from `--durations`, are theirs).
SLOW_FIRST = (
    "tests.test_tracking",
    "tests.test_study",
    "tests.test_headline",
    "tests.test_paths",
    "tests.test_accounting",
    "tests.test_workers",
    "tests.test_ui",
    "tests.test_faults",
    "tests.test_grid",
)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        module = getattr(item, "module", None)
        return SLOW_FIRST.index(module.__name__) if module is not None and module.__name__ in SLOW_FIRST else len(SLOW_FIRST)

    items.sort(key=rank)  # stable: each module keeps its own order
    for item in items:
        shared = sorted(set(getattr(item, "fixturenames", ())) & set(SHARED_RUNS))
        if shared:  # fixturenames is the closure: a test that uses `client` (built on default_run) counts too
            item.add_marker(pytest.mark.xdist_group(f"{item.module.__name__}::{'+'.join(shared)}"))  # type: ignore[attr-defined]
