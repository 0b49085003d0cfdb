"""MLflow logging: one parent run per study, one nested run per trial, in MLflow's model-training view.

A trial's run opens when the trial starts (so it shows as running, with its real duration) and closes
with the trial's state. Runs carry a one-sentence description (`mlflow.note.content`), and the baseline,
the paper default, infeasible trials and the winner are marked in run names and tags. Metrics are named
for what they mean and are on the console's scale (nDCG@10 and HM ×100, PSI 0–1); `METRIC_NAMES`
(`tuner.tracking.display`) maps the 0–1 names the code uses to them.

Every log is an action of its own (a trial's metrics, its tags, each artifact, the close of its run). If the
server goes away mid-study, or the store's disk fills up, the actions are kept and retried, in order, before
the next one and at the end: finished trials are never lost to a logging failure, and a retried run keeps its
real start and end times. An action MLflow refuses for good (`classify_failure`) is dropped alone, said once
per reason, and the rest go on: a refused artifact still leaves the trial's run closed with its metrics.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from mlflow.tracking import MlflowClient

from tuner.common.messages import database_locked, first_line
from tuner.common.options import check_tracking_uri
from tuner.tracking.display import (
    EXPERIMENT_NOTE,
    KIND_TAG,
    MAX_TAG_LENGTH,
    NOTE,
    RUN_LIST_VIEW,
    RUN_STATUS,
    TRAINING_KIND,
    VIEW_TAG,
    display_metrics,
    logged_params,
    logged_tags,
    run_name,
    stored_metrics,
)
from tuner.tracking.failures import classify_failure, full_file
from tuner.tracking.store import (
    TrackingUnavailableError,
    artifacts_beside_store,
    check_server,
    check_store_schema,
    default_tracking_uri,
    describe_store,
    local_store,
    store_lock,
)

log = logging.getLogger(__name__)

PARENT = "mlflow.parentRunId"


@dataclass
class TrialRecord:
    """Everything one trial logs at its end; kept until MLflow has accepted it."""

    number: int
    state: str  # COMPLETE, PRUNED or FAIL (Optuna's names; `RUN_STATUS` gives MLflow's)
    params: dict[str, object]
    metrics: dict[str, float]  # 0-1 names (`display_metrics` renames them)
    tags: dict[str, str] = field(default_factory=dict)
    artifacts: list[Path] = field(default_factory=list)
    description: str = ""
    markers: list[str] = field(default_factory=list)
    start_ms: int = 0
    end_ms: int = field(default_factory=lambda: int(time.time() * 1000))


class Tracker:
    """Logs a study and its trials to MLflow through the client API (no global fluent state).

    Nothing is created until the first write: a run that fails before its study starts leaves no
    store behind. A server is checked at once, so an unreachable one fails before any work, and so is a
    database store (`check_store_schema`): MLflow's client opens a store of another schema without a word,
    and its writes then fail one by one.
    """

    def __init__(self, tracking_uri: str | None, experiment: str) -> None:
        self.uri = tracking_uri or default_tracking_uri()
        check_tracking_uri(self.uri)
        check_store_schema(self.uri)  # a study database, or a store of another MLflow: before MLflow writes to it
        self.experiment_name = experiment
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # its bars would garble the log
        if self.uri.startswith(("http://", "https://")):
            # A lost server must cost a trial seconds, not MLflow's default minutes of retries.
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "15")
            check_server(self.uri)
        self._client: MlflowClient | None = None
        self._store_uri = self.uri
        self._pending: list[_Action] = []
        self._refusals: set[str] = set()  # the reasons of the refusals said so far: each is said once
        self._experiment_id: str | None = None
        self._trial_runs: dict[int, str] = {}
        self.parent_id: str | None = None

    @property
    def client(self) -> MlflowClient:
        """The MLflow client; the first use opens (or creates) the store and the experiment."""
        if self._client is None:
            _ = self.experiment_id
        assert self._client is not None
        return self._client

    @property
    def store_uri(self) -> str:
        """The URI the client opened: a local store by its absolute path. Whatever MLflow reaches through its
        global tracking URI must use this one, or a relative default would reach the folder that used it first."""
        _ = self.client
        return self._store_uri

    @property
    def experiment_id(self) -> str:
        """The experiment, created (in the model-training view) on first use."""
        if self._experiment_id is None:
            try:
                with store_lock(self.uri):  # processes starting together must not race to create a new store
                    store = local_store(self.uri)
                    if store is not None:
                        store.parent.mkdir(parents=True, exist_ok=True)
                    # a client with a registry URI creates the registry's tables at once: only under the lock.
                    # It opens the store by its absolute path: MLflow caches one store per URI string per
                    # process, so the relative default would reach whichever folder used it first.
                    self._store_uri = f"sqlite:///{store.resolve()}" if store is not None else self.uri
                    self._client = MlflowClient(self._store_uri, registry_uri=self._store_uri)
                    self._experiment_id = self._open_experiment()
            except Exception as error:  # noqa: BLE001 - any failure here means the store is unusable
                fix = (
                    "Another process keeps it locked: finish or close what holds it, then run the same command again."
                    if database_locked(error)
                    else "Start the server or fix --tracking-uri."
                )
                raise TrackingUnavailableError(
                    f"cannot use the MLflow tracking store {self.uri!r} "
                    f"({error.__class__.__name__}: {first_line(error)}). {fix}"
                ) from None
        return self._experiment_id

    def _open_experiment(self) -> str:
        store = local_store(self.uri)
        found = self.client.get_experiment_by_name(self.experiment_name)
        if found is None:
            try:
                experiment_id = self.client.create_experiment(
                    self.experiment_name, tags={KIND_TAG: TRAINING_KIND, NOTE: EXPERIMENT_NOTE, VIEW_TAG: RUN_LIST_VIEW}
                )
            except Exception as error:  # noqa: BLE001 - another worker just created it: use theirs
                found = self.client.get_experiment_by_name(self.experiment_name)
                if found is None or "already exists" not in str(error).lower():
                    raise
                return found.experiment_id
            if store is not None:
                artifacts_beside_store(self.uri, store, experiment_id)
            return experiment_id
        for key, value in {KIND_TAG: TRAINING_KIND, NOTE: EXPERIMENT_NOTE, VIEW_TAG: RUN_LIST_VIEW}.items():
            if found.tags.get(key) != value:  # a store made by an older posfair
                self.client.set_experiment_tag(found.experiment_id, key, value)
        return found.experiment_id

    # --- the study's parent run -------------------------------------------------------------------

    def start_study(self, study: str, params: dict[str, object], tags: dict[str, str], description: str = "") -> str:
        """Open (or, on resume, reopen) the study's parent run; processes starting together on a local store
        take its lock, so they share one parent run."""
        experiment_id = self.experiment_id  # opened first: the store lock below is not re-entrant
        with store_lock(self.uri):
            existing = self.client.search_runs(
                [experiment_id], f"tags.`posfair.study` = '{study}' and tags.`posfair.role` = 'study'", max_results=1
            )
            if existing:
                self.parent_id = existing[0].info.run_id
                self.client.update_run(self.parent_id, status="RUNNING")
            else:
                extra = {NOTE: description} if description else {}
                run = self.client.create_run(
                    experiment_id,
                    run_name=study,
                    tags={"posfair.study": study, "posfair.role": "study", **tags, **extra},
                )
                self.parent_id = run.info.run_id
                self.client.log_batch(self.parent_id, params=logged_params(params))
        return self.parent_id

    def finish_study(
        self, metrics: dict[str, float], artifacts: list[Path], tags: dict[str, str], status: str = "FINISHED"
    ) -> None:
        """Log the study's figures (already display-named), artifacts and tags, and close the parent run."""
        run = self.parent_id
        assert run is not None
        now = int(time.time() * 1000)
        self._submit("the study's figures", lambda: self.client.log_batch(run, metrics=stored_metrics(metrics, now)))
        self._submit("the study's tags", lambda: self.client.log_batch(run, tags=logged_tags(tags)))
        for path in artifacts:
            self._submit(f"the study's {path.name}", partial(self._log_artifact, run, path))
        self._submit(f"the close of the study's run ({status})", lambda: self.client.set_terminated(run, status))
        self.flush()

    # --- trial runs -------------------------------------------------------------------------------

    def start_trial(
        self,
        study: str,
        number: int,
        params: dict[str, object],
        description: str,
        markers: list[str],
        tags: dict[str, str] | None = None,
    ) -> str | None:
        """Open the trial's run now (shown as running); its id, or None while MLflow is unreachable."""
        start = int(time.time() * 1000)
        self._submit(
            f"trial {number}'s run",
            lambda: self._open_trial(study, number, params, description, markers, tags or {}, start),
        )
        return self._trial_runs.get(number)

    def finish_trial(self, study: str, record: TrialRecord) -> None:
        """Log a trial's outcome to its run and close it with the trial's state, one action per log (see the
        module's docstring). A run found closed already (a resumed study's) is left alone; one that was never
        opened (an outage, then a restart) is opened first, with the trial's own start."""
        number = record.number
        found: list[str] = []  # the trial's open run, once `find` has looked it up

        def find() -> None:
            run_id = self._trial_runs.get(number) or self._existing_trial_run(study, number)
            if run_id is None:
                self._open_trial(
                    study,
                    number,
                    record.params,
                    record.description,
                    record.markers,
                    {},
                    record.start_ms or record.end_ms,
                )
                run_id = self._trial_runs[number]
            elif self.client.get_run(run_id).info.status in ("FINISHED", "FAILED", "KILLED"):
                return
            found.append(run_id)

        def on_run(action: Callable[[str], object]) -> Callable[[], None]:
            def act() -> None:
                if found:
                    action(found[0])

            return act

        tags = {"posfair.state": record.state, NOTE: record.description, **record.tags}
        self._submit(f"trial {number}'s run", find)
        metrics = stored_metrics(display_metrics(record.metrics), record.end_ms)
        self._submit(f"trial {number}'s metrics", on_run(lambda run: self.client.log_batch(run, metrics=metrics)))
        self._submit(f"trial {number}'s tags", on_run(lambda run: self.client.log_batch(run, tags=logged_tags(tags))))
        self._submit(
            f"trial {number}'s name",
            on_run(lambda run: self.client.update_run(run, name=run_name(number, record.markers))),
        )
        for path in record.artifacts:
            self._submit(f"trial {number}'s {path.name}", on_run(partial(self._log_artifact, path=path)))
        status = RUN_STATUS.get(record.state, "FAILED")
        self._submit(
            f"the close of trial {number}'s run ({status})",
            on_run(lambda run: self.client.set_terminated(run, status, end_time=record.end_ms)),
        )

    def _log_artifact(self, run: str, path: Path) -> None:
        self.client.log_artifact(run, str(path))

    def trial_run_id(self, number: int) -> str | None:
        return self._trial_runs.get(number)

    def find_trial_run(self, study: str, number: int) -> str | None:
        """The run of `study`'s trial `number`, opened by this process or another (None: MLflow has none)."""
        return self._trial_runs.get(number) or self._existing_trial_run(study, number)

    def _open_trial(
        self,
        study: str,
        number: int,
        params: dict[str, object],
        description: str,
        markers: list[str],
        tags: dict[str, str],
        start: int,
    ) -> None:
        assert self.parent_id is not None
        run_id = self._existing_trial_run(study, number)
        if run_id is None:
            run = self.client.create_run(
                self.experiment_id,
                run_name=run_name(number, markers),
                start_time=start,
                tags={
                    PARENT: self.parent_id,
                    "posfair.study": study,
                    "posfair.role": "trial",
                    "posfair.trial": str(number),
                    "posfair.state": "RUNNING",
                    NOTE: description,
                    **tags,
                },
            )
            run_id = run.info.run_id
            self.client.log_batch(run_id, params=logged_params(params))
        elif not self.client.get_run(run_id).data.params:  # opened just before an outage cut off its params
            self.client.log_batch(run_id, params=logged_params(params))
        self._trial_runs[number] = run_id

    def _existing_trial_run(self, study: str, number: int) -> str | None:
        """The run of this study's trial `number` if one was opened (by this process or before a restart)."""
        query = f"tags.`posfair.study` = '{study}' and tags.`posfair.trial` = '{number}'"
        runs = self.client.search_runs([self.experiment_id], query)
        return runs[0].info.run_id if runs else None

    def mark_trial(self, study: str, number: int, markers: list[str], tags: dict[str, str], description: str) -> None:
        """Re-mark a closed trial's run (the winner, known only at the end)."""

        def mark() -> None:
            run_id = self._trial_runs.get(number) or self._existing_trial_run(study, number)
            if run_id is None:
                return
            self.client.update_run(run_id, name=run_name(number, markers))
            for key, value in {**tags, NOTE: description}.items():
                self.client.set_tag(run_id, key, value[:MAX_TAG_LENGTH])

        self._submit(f"trial {number}'s winner mark", mark)

    def close_stale_trials(self, study: str, failed: list[int]) -> None:
        """Close the runs of trials Optuna failed elsewhere (a killed worker's): they would show as running forever."""

        def close() -> None:
            for number in failed:
                run_id = self._trial_runs.get(number) or self._existing_trial_run(study, number)
                if run_id is not None and self.client.get_run(run_id).info.status == "RUNNING":
                    self.client.set_tag(run_id, "posfair.state", "FAIL")
                    self.client.set_tag(
                        run_id, NOTE, f"Trial {number} failed: its worker stopped answering (missed heartbeats)."
                    )
                    self.client.set_terminated(run_id, "KILLED")

        if failed:
            self._submit(f"the close of the runs of trials {failed} (failed elsewhere)", close)

    # --- retries ----------------------------------------------------------------------------------

    def flush(self) -> bool:
        """Retry everything MLflow has not accepted yet, in order; True when nothing is left pending.

        Only an outage or a full disk keeps an action (and those after it) for the next flush. An action MLflow
        refuses for any other reason would fail the same way forever and hold back every later log: it is
        dropped, its reason said once, and the rest go on.
        """
        while self._pending:
            action = self._pending[0]
            try:
                action.run()
            except TrackingUnavailableError:
                raise
            except Exception as error:  # noqa: BLE001 - neither a dead server nor a refused log may end the study
                failure = classify_failure(error)
                if failure == "outage" and database_locked(error):
                    log.warning(
                        "MLflow's store %s is locked by another process; %d log(s) kept for retry",
                        describe_store(self.uri),
                        len(self._pending),
                    )
                    return False
                if failure == "outage":
                    log.warning(
                        "MLflow still unreachable (%s); %d log(s) kept for retry",
                        error.__class__.__name__,
                        len(self._pending),
                    )
                    return False
                if failure == "disk full":
                    log.warning(
                        "MLflow cannot write %s: the disk is full (%s); %d log(s) kept and retried before each later "
                        "log and at the end: free space on that disk",
                        full_file(error) or describe_store(self.uri),
                        first_line(error),
                        len(self._pending),
                    )
                    return False
                reason = f"{error.__class__.__name__}: {first_line(error)}"
                if reason not in self._refusals:
                    self._refusals.add(reason)
                    log.warning(
                        "MLflow refused %s, dropped (%s); the other logs go on (later logs refused the same way are "
                        "dropped without repeating this)",
                        action.what,
                        reason,
                    )
            self._pending.pop(0)
        return True

    def _submit(self, what: str, action: Callable[[], object]) -> None:
        """Queue one log (`what` names it for people) and try everything pending."""
        self._pending.append(_Action(what, action))
        self.flush()


@dataclass(frozen=True)
class _Action:
    """One log call the tracker keeps until MLflow accepts or refuses it for good."""

    what: str  # e.g. "trial 3's metrics"
    run: Callable[[], object]
