"""What CI provides that a developer's machine may not: tests that need it skip elsewhere but fail in CI.

`.ci/run` exports POSFAIR_CI=1 after starting PostgreSQL and an MLflow server (POSFAIR_TEST_POSTGRES,
POSFAIR_TEST_MLFLOW), with the shared data folder beside the checkout and the suite running as a
non-root user. A test that silently skipped there would never run at all.
"""

from __future__ import annotations

import os

import pytest

IN_CI = os.environ.get("POSFAIR_CI") == "1"
POSTGRES = os.environ.get("POSFAIR_TEST_POSTGRES")
MLFLOW = os.environ.get("POSFAIR_TEST_MLFLOW")


def require(available: bool, reason: str) -> None:
    """Skip with `reason` when something the test needs is absent, unless this is CI, where it is a failure."""
    if available:
        return
    if IN_CI:
        pytest.fail(f"{reason}; .ci/run is meant to provide it, so this test must run in CI", pytrace=False)
    pytest.skip(reason)


def require_postgres() -> str:
    """The URL of the CI PostgreSQL server (database `optuna`, user `posfair`, trust authentication)."""
    require(bool(POSTGRES), "needs the PostgreSQL server .ci/run starts (POSFAIR_TEST_POSTGRES)")
    assert POSTGRES is not None
    return POSTGRES


def require_mlflow_server() -> str:
    """The URL of the MLflow tracking server .ci/run starts (backed by that PostgreSQL)."""
    require(bool(MLFLOW), "needs the MLflow tracking server .ci/run starts (POSFAIR_TEST_MLFLOW)")
    assert MLFLOW is not None
    return MLFLOW
