"""Where a study's runs live, and the checks a store or server passes before anything is logged to it.

The default store is `./mlruns`: a SQLite file (`mlruns/mlflow.db`) and an artifact folder
(`mlruns/artifacts`) that the store records by a path *relative* to the folder holding `mlruns/`, so a
copied or moved `mlruns/` keeps its artifacts (`tune ui` serves it from there). `--tracking-uri` points
at a server instead (whose artifacts are proxied, `mlflow-artifacts:`, and so portable too).
"""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tuner.common.files import ARTIFACTS, MLFLOW_DB
from tuner.common.messages import UserError
from tuner.common.stores import MLFLOW, is_database, require_own_database, schema_version

DEFAULT_TRACKING_URI = f"sqlite:///{MLFLOW_DB}"  # relative: the store moves with its folder


class TrackingUnavailableError(UserError, RuntimeError):
    """The tracking server or store cannot be used; the message names it and the fix."""


def default_tracking_uri() -> str:
    """The default store, relative to the working folder (nothing is created here)."""
    return DEFAULT_TRACKING_URI


def local_store(uri: str) -> Path | None:
    """The SQLite file of a local tracking URI, None for a server."""
    return Path(uri.removeprefix("sqlite:///")) if uri.startswith("sqlite:///") else None


def describe_store(uri: str) -> str:
    """Where a tracking URI's runs live, for people: the absolute folder of a local store."""
    path = local_store(uri)
    if path is None:
        return uri
    state = "" if path.exists() else ", created when the first trial starts"
    return f"{uri}  ({path.resolve()}{state})"


def check_store_schema(uri: str) -> None:
    """A database store must be MLflow's (`require_own_database`) and have the schema this MLflow reads: on any
    other, MLflow's server starts and then fails on every page, and MLflow's own message advises
    `mlflow db upgrade` even for a store a newer MLflow wrote, which no upgrade can take back."""
    import mlflow
    from alembic.script import ScriptDirectory
    from mlflow.store.db.utils import _get_alembic_config

    if not is_database(uri):
        return
    require_own_database(uri, MLFLOW)
    version = schema_version(uri)
    if version is None:  # a new store: MLflow makes its tables
        return
    migrations = ScriptDirectory.from_config(_get_alembic_config(uri))
    head = migrations.get_current_head()
    if version == head:
        return
    where = f"the MLflow store {describe_store(uri)}"
    if version in {revision.revision for revision in migrations.walk_revisions()}:
        raise TrackingUnavailableError(
            f"{where} was written by an older MLflow (schema {version}; MLflow {mlflow.__version__} reads {head}): "
            f"back it up, then upgrade it: mlflow db upgrade {uri}"
        )
    raise TrackingUnavailableError(
        f"{where} has schema {version}, unknown to this MLflow ({mlflow.__version__}): a newer MLflow wrote it, and "
        "no command takes a store back. Read it with that MLflow (pip install -U mlflow in this environment), or "
        "give another --tracking-uri"
    )


def artifacts_beside_store(uri: str, store: Path, experiment_id: str) -> None:
    """Keep a SQLite store's artifacts in `artifacts/` beside it, recorded relative to the working folder
    when the store was given relatively (the default `mlruns/`).

    MLflow resolves a relative artifact location to an absolute one when it creates an experiment (and
    without one uses `./mlruns` of whatever folder the run started in), which ties every artifact to that
    folder. Runs and logged models inherit their experiment's location, so one entry, written right after
    creation, makes the default store relocatable: `tune ui` (and `mlflow server` started beside `mlruns/`)
    resolves it where it now is.
    """
    import sqlalchemy

    folder = store.parent / ARTIFACTS.name / experiment_id
    location = folder.as_uri() if store.is_absolute() else folder.as_posix()
    engine = sqlalchemy.create_engine(uri)
    try:
        with engine.begin() as connection:
            connection.execute(
                sqlalchemy.text("UPDATE experiments SET artifact_location = :location WHERE experiment_id = :id"),
                {"location": location, "id": int(experiment_id)},
            )
    finally:
        engine.dispose()


@contextmanager
def store_lock(uri: str) -> Iterator[None]:
    """An exclusive file lock beside a SQLite store while it is opened (and maybe created)."""
    store = local_store(uri)
    if store is None:
        yield
        return
    lock_path = Path(f"{store}.lock")
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def check_server(uri: str) -> None:
    """Fail fast, before any work, when the tracking server does not answer."""
    import requests

    try:
        requests.get(uri.rstrip("/") + "/health", timeout=5).raise_for_status()
    except requests.RequestException as error:
        raise TrackingUnavailableError(
            f"the MLflow tracking server {uri} does not answer ({error.__class__.__name__}). "
            "Start it (e.g. `mlflow server --host 127.0.0.1 --port 5000`) or fix --tracking-uri."
        ) from None
