"""MLflow logging: one parent run per study, one nested run per trial.

The default store is a SQLite file and an artifact folder under `./mlruns`, so no server is needed;
`--tracking-uri` points at a server instead. A trial is logged once (its run carries the study and
trial number, so a resumed study skips what is already there). If the server goes away mid-study the
trial's payload is kept and retried before the next log call and at the end: finished trials are
never lost to a logging failure.
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from tuner.files import ARTIFACTS, MLFLOW_DB

log = logging.getLogger(__name__)

MAX_PARAM_LENGTH = 6000


class TrackingUnavailableError(RuntimeError):
    """The tracking server cannot be reached before the study starts."""


TRACKING_SCHEMES = ("file", "sqlite", "postgresql", "mysql", "mssql", "http", "https", "databricks")


def check_tracking_uri(uri: str) -> None:
    """A tracking URI MLflow can use: a folder, or one of `TRACKING_SCHEMES` (with a driver, e.g. postgresql+psycopg)."""
    scheme, colon, _ = uri.partition("://")
    if colon and scheme.split("+")[0].lower() not in TRACKING_SCHEMES:
        raise ValueError(
            f"--tracking-uri {uri[:80]!r}: MLflow cannot use a {scheme[:20]!r} store; use e.g. http://127.0.0.1:5000, "
            "sqlite:///mlruns/mlflow.db, postgresql://user:pass@host/db or a folder"
        )


def default_tracking_uri(database: Path = MLFLOW_DB) -> str:
    database.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{database.resolve()}"


def default_artifact_root(folder: Path = ARTIFACTS) -> str:
    return folder.resolve().as_uri()


@dataclass
class TrialRecord:
    """Everything one trial logs; kept until MLflow has accepted it."""

    number: int
    state: str
    params: dict[str, object]
    metrics: dict[str, float]
    tags: dict[str, str] = field(default_factory=dict)
    artifacts: list[Path] = field(default_factory=list)


class Tracker:
    """Logs a study and its trials to MLflow through the client API (no global fluent state)."""

    def __init__(self, tracking_uri: str | None, experiment: str) -> None:
        self.uri = tracking_uri or default_tracking_uri()
        check_tracking_uri(self.uri)
        if self.uri.startswith(("http://", "https://")):
            # A lost server must cost a trial seconds, not MLflow's default minutes of retries.
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "15")
            _check_server(self.uri)
        self._pending: list[Callable[[], None]] = []
        try:
            with _store_lock(self.uri):  # processes starting together must not race to create a new store
                self.client = MlflowClient(self.uri)
                found = self.client.get_experiment_by_name(experiment)
                self.experiment_id = found.experiment_id if found else self._create_experiment(experiment, tracking_uri is None)
        except Exception as error:  # noqa: BLE001 - any failure here means the store is unusable
            raise TrackingUnavailableError(
                f"cannot use the MLflow tracking store {self.uri!r} ({error.__class__.__name__}: "
                f"{str(error).splitlines()[0] if str(error) else ''}). Start the server or fix --tracking-uri."
            ) from None
        self.parent_id: str | None = None

    def _create_experiment(self, name: str, local: bool) -> str:
        """Create the experiment; if another worker just did, use theirs."""
        try:
            return self.client.create_experiment(name, artifact_location=default_artifact_root() if local else None)
        except Exception as error:  # noqa: BLE001 - MlflowException over REST, IntegrityError locally
            found = self.client.get_experiment_by_name(name)
            if found is None or "already exists" not in str(error).lower():
                raise
            return found.experiment_id

    def start_study(self, study: str, params: dict[str, object], tags: dict[str, str]) -> str:
        """Open (or, on resume, reopen) the study's parent run."""
        existing = self.client.search_runs(
            [self.experiment_id], f"tags.`posfair.study` = '{study}' and tags.`posfair.role` = 'study'", max_results=1
        )
        if existing:
            self.parent_id = existing[0].info.run_id
            self.client.update_run(self.parent_id, status="RUNNING")
        else:
            run = self.client.create_run(
                self.experiment_id, run_name=study, tags={"posfair.study": study, "posfair.role": "study", **tags}
            )
            self.parent_id = run.info.run_id
            self.client.log_batch(self.parent_id, params=_params(params))
        return self.parent_id

    def log_trial(self, study: str, record: TrialRecord) -> None:
        """Log one trial as a nested run; on failure keep it for a later retry."""
        self._submit(lambda: self._log_trial(study, record))

    def _log_trial(self, study: str, record: TrialRecord) -> None:
        """Idempotent: a finished run for this trial is left alone, a half-written one is replaced."""
        assert self.parent_id is not None
        query = f"tags.`posfair.study` = '{study}' and tags.`posfair.trial` = '{record.number}'"
        for existing in self.client.search_runs([self.experiment_id], query):
            if existing.info.status in ("FINISHED", "FAILED"):
                return
            self.client.delete_run(existing.info.run_id)
        run = self.client.create_run(
            self.experiment_id,
            run_name=f"trial-{record.number}",
            tags={
                "mlflow.parentRunId": self.parent_id,
                "posfair.study": study,
                "posfair.role": "trial",
                "posfair.trial": str(record.number),
                "posfair.state": record.state,
                **record.tags,
            },
        )
        now = int(time.time() * 1000)
        self.client.log_batch(
            run.info.run_id,
            metrics=[Metric(k, float(v), now, 0) for k, v in record.metrics.items()],
            params=_params(record.params),
        )
        for path in record.artifacts:
            self.client.log_artifact(run.info.run_id, str(path))
        self.client.set_terminated(run.info.run_id, "FINISHED" if record.state == "COMPLETE" else "FAILED")

    def finish_study(self, metrics: dict[str, float], artifacts: list[Path], tags: dict[str, str], status: str = "FINISHED") -> None:
        def finish() -> None:
            assert self.parent_id is not None
            now = int(time.time() * 1000)
            self.client.log_batch(
                self.parent_id,
                metrics=[Metric(k, float(v), now, 0) for k, v in metrics.items()],
                tags=[RunTag(k, v) for k, v in tags.items()],
            )
            for path in artifacts:
                self.client.log_artifact(self.parent_id, str(path))
            self.client.set_terminated(self.parent_id, status)

        self._submit(finish)
        self.flush()

    def flush(self) -> bool:
        """Retry everything MLflow has not accepted yet; True when nothing is left pending."""
        while self._pending:
            try:
                self._pending[0]()
            except Exception as error:  # noqa: BLE001 - a dead server must not end the study
                log.warning("MLflow still unreachable (%s); %d log(s) kept for retry", error.__class__.__name__, len(self._pending))
                return False
            self._pending.pop(0)
        return True

    def _submit(self, action: Callable[[], None]) -> None:
        self._pending.append(action)
        self.flush()


@contextmanager
def _store_lock(uri: str) -> Iterator[None]:
    """An exclusive file lock beside a SQLite store while it is opened (and maybe created)."""
    if not uri.startswith("sqlite:///"):
        yield
        return
    lock_path = Path(uri.removeprefix("sqlite:///") + ".lock")
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _check_server(uri: str) -> None:
    """Fail fast, before any work, when the tracking server does not answer."""
    import requests

    try:
        requests.get(uri.rstrip("/") + "/health", timeout=5).raise_for_status()
    except requests.RequestException as error:
        raise TrackingUnavailableError(
            f"the MLflow tracking server {uri} does not answer ({error.__class__.__name__}). "
            "Start it (e.g. `mlflow server --host 127.0.0.1 --port 5000`) or fix --tracking-uri."
        ) from None


def _params(values: dict[str, object]) -> list[Param]:
    return [Param(k, str(v)[:MAX_PARAM_LENGTH]) for k, v in values.items()]
