"""Shared fixtures: tiny randomly initialised models and tokenizers, built from configs (no hub)."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
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

from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import mlflow_template
from tests.tiny import export_of, save_tiny

POOLING = {
    "bert-cls": ("bert", "cls"),
    "bert-mean": ("bert", "mean"),
    "xlmr-cls": ("xlmr", "cls"),
    "qwen3-last": ("qwen3", "last"),
    "mpnet-mean": ("mpnet", "mean"),  # attention routed by an adapter, with a relative position bias
    "gte-cls": ("gte", "cls"),
}


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory):
    """Folder of a tiny model of the given kind, built once per session."""
    made: dict[str, Path] = {}

    def make(kind: str) -> Path:
        if kind not in made:
            made[kind] = save_tiny(kind, tmp_path_factory.mktemp(f"tiny-{kind}"))
        return made[kind]

    return make


@pytest.fixture(scope="module")
def module_cache(tmp_path_factory: pytest.TempPathFactory):
    """The evaluator's disk cache in a temporary folder for the module, for modules that run `tune` or the
    evaluator in this process without a working folder of their own (the default is ./mlruns/cache)."""
    folder = tmp_path_factory.mktemp("posfair-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("POSFAIR_CACHE_DIR", str(folder))
        yield folder


@dataclass(frozen=True)
class TinyExport:
    """A tiny model in a folder of its own (which a test may spoil without harming others) and a config exported for
    it."""

    model: Path
    config: Path


@pytest.fixture(scope="module")
def tiny_export(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir) -> TinyExport:
    from tuner.engine.exported import write_exported
    from tuner.engine.models import load_model

    model = Path(shutil.copytree(tiny_model_dir("bert"), tmp_path_factory.mktemp("model") / "tiny-bert"))
    loaded = load_model(str(model), pooling="cls")
    exported = export_of(loaded)
    return TinyExport(model, write_exported(exported, tmp_path_factory.mktemp("config") / "cal.yaml"))


@pytest.fixture(autouse=True, scope="session")
def _mlflow_store_template(tmp_path_factory: pytest.TempPathFactory) -> None:
    """New SQLite MLflow stores in this process start as a copy of a migrated one (tests/mlflow_template.py)."""
    mlflow_template.install(tmp_path_factory.mktemp("mlflow-template"))


@pytest.fixture(autouse=True)
def _no_tracking_uri_left_behind():
    """A test that points MLflow at its own store with `mlflow.set_tracking_uri` would leave it there for the next
    test in the same worker, and that global URI outranks the next test's `MLFLOW_TRACKING_URI`."""
    yield
    mlflow = sys.modules.get("mlflow")
    if mlflow is not None:
        mlflow.set_tracking_uri(None)


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
SHARED_RUNS = (
    "default_run",
    "server_run",
    "workspace",
    "headline_run",
    "bge_m3_run",
    "qwen3_run",
    "budgeted",
    "readme_project",
)


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
    "tests.test_job_array",
    "tests.test_grid",
)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        module = getattr(item, "module", None)
        return (
            SLOW_FIRST.index(module.__name__)
            if module is not None and module.__name__ in SLOW_FIRST
            else len(SLOW_FIRST)
        )

    items.sort(key=rank)  # stable: each module keeps its own order
    for item in items:
        shared = sorted(set(getattr(item, "fixturenames", ())) & set(SHARED_RUNS))
        if shared:  # fixturenames is the closure: a test that uses `client` (built on default_run) counts too
            item.add_marker(pytest.mark.xdist_group(f"{item.module.__name__}::{'+'.join(shared)}"))  # type: ignore[attr-defined]


# The checkout's own store: `tune` and the evaluator write `mlruns/` (and its cache) under the working directory, so a
# test that runs them without a folder of its own would leave files in the repository.
CHECKOUT_STORE = Path(__file__).resolve().parents[1] / "mlruns"
_STORE_BEFORE = pytest.StashKey[set[Path]]()
_STORE_WRITTEN = pytest.StashKey[list[Path]]()


def _checkout_store_files() -> set[Path]:
    return {path for path in CHECKOUT_STORE.rglob("*") if not path.is_dir()}


def pytest_sessionstart(session: pytest.Session) -> None:
    if not hasattr(session.config, "workerinput"):  # the controller sees the whole run; xdist's workers do not
        session.config.stash[_STORE_BEFORE] = _checkout_store_files()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Fail the run when a test wrote under the checkout's mlruns/ (files there before the run are left alone)."""
    if _STORE_BEFORE not in session.config.stash:
        return
    written = sorted(_checkout_store_files() - session.config.stash[_STORE_BEFORE])
    if written:
        session.config.stash[_STORE_WRITTEN] = written
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    written = config.stash.get(_STORE_WRITTEN, [])
    if written:
        terminalreporter.write_sep("=", f"{len(written)} files written under the checkout's mlruns/", red=True)
        terminalreporter.write_line(
            f"e.g. {written[0]}: a test that runs posfair must give it a folder of its own "
            "(tmp_path: chdir, POSFAIR_CACHE_DIR, --storage)"
        )
