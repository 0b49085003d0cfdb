"""The Optuna side: a persistent, resumable, seeded study with constraints, and its winner.

The study calls an objective and knows nothing of models, MLflow or YAML. Constraints are Optuna's
own: the objective stores each trial's values (≤ 0 is feasible) where every sampler (TPE, GP, NSGA-II)
reads them to prefer feasible regions (`tuner.tuning.trial.record.set_constraints`). Trials of a killed worker are failed by the heartbeat check and re-queued once, so the
study still ends with the requested number of complete trials.
"""

from __future__ import annotations

import datetime
import logging
import math
import os
import signal
import socket
import time
import warnings
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, Literal

import numpy as np
import optuna
from optuna.exceptions import ExperimentalWarning
from optuna.trial import FrozenTrial, TrialState

from objectives import Candidate, Constraints, Selection, select
from objectives.constraint import describe_aim
from objectives.selection import chosen
from tuner.common.budget import budget_ended
from tuner.common.files import JOURNAL, sqlite_file, storage_file
from tuner.common.options import HEARTBEAT_SECONDS, SAMPLERS, env_seconds
from tuner.common.trials import (
    DUPLICATE_ATTR,
    NOT_RUN_ATTR,
    NotRun,
    ScreenFigures,
    complete_trials,
    constraints_of,
    counted,
    finished,
    never_ran,
    objective_resamples,
)
from tuner.tuning.bisection import withdraw_queued
from tuner.tuning.optuna_access import (
    HeartbeatStorage,
    set_study_system_attr,
    set_trial_state,
    storage_of,
    stored_trial,
    study_system_attrs,
)
from tuner.tuning.sampler import make_sampler
from tuner.tuning.storage import grace_seconds, machine_fault, make_storage

log = logging.getLogger(__name__)


class StudyMismatchError(ValueError):
    """A stored study of this name was made for another model, dataset or objective."""


WINNER_ATTR = "winner"  # the study attribute naming the exported winner: first among the study's attributes
DASHBOARD_BEST_ATTR = "best trial in optuna-dashboard"
DASHBOARD_BEST = (
    "optuna-dashboard's 'Best Trial' is the lowest value (worst-case PSI) of all complete trials, feasible or not (it does not read "
    "constraints there, nor the one-SE rule); the exported winner is `winner` above, each trial's `feasible` says yes "
    "or NO and why, and infeasible trials are grey in the dashboard's plots"
)


def mark_winner_first(study: optuna.Study) -> None:
    """Give a study its `winner` attribute and the note on the dashboard's Best Trial before any other: the
    dashboard lists a study's attributes in the order they were created, and the conclusion only updates them."""
    attrs = study.user_attrs
    for key, value in ((WINNER_ATTR, "none yet: the study is running"), (DASHBOARD_BEST_ATTR, DASHBOARD_BEST)):
        if attrs.get(key) is None or (key == DASHBOARD_BEST_ATTR and attrs[key] != value):
            study.set_user_attr(key, value)


def describe_study(study: optuna.Study, pareto: bool, constraints: Constraints, checked: Sequence[str], structures: bool) -> None:
    """Name the objectives and explain the study for optuna-dashboard (user attributes are shown there): its aim and
    each constraint in force (`checked`) with its limit, from the constraint list (`objectives.constraint`)."""
    with warnings.catch_warnings():  # "experimental" since Optuna 3.2, and what optuna-dashboard reads
        warnings.simplefilter("ignore", ExperimentalWarning)
        psi = "worst-case PSI" if structures else "PSI"  # the objective, as the dashboard's plots and Best Trial name it
        study.set_metric_names([psi, "HM"] if pareto else [psi])
    explanations = {
        "objective": describe_aim(pareto, structures) + " subject to the constraints; PSI = 1 - min/max of nDCG@10 over the "
        "position groups (0 = position-fair), HM = their harmonic mean (0-1)",
        "constraints": "; ".join(constraints.rule(name) for name in checked)
        + "; a trial is feasible when it meets every one (each trial's `feasible` says how)",
        "reference_trials": "trial 0 = baseline (no calibration, λ 0), trial 1 = the paper's default "
        "(CLS-Soft, λ 0.5, last 50% of layers, baskets of 128)",
        "parameters": "strength = λ (0 = uncalibrated, 1 = fully equalised); depth = calibrated layers; basket_size = "
        "content tokens per basket; variant = uniform | cls_soft | cls_hard; weight = w, CLS-Hard only",
    }
    for key, value in explanations.items():
        if study.user_attrs.get(key) != value:
            study.set_user_attr(key, value)


def load_stored_study(name: str, storage: str) -> optuna.Study:
    """Load a study that `tune` ran, to read or export it.

    A missing SQLite file or journal is refused by name, never created, as opening it would.

    Args:
        name: The study's name (`--study-name`; the tune output and `tune ui` show it).
        storage: Its storage's URL, as `make_storage` takes it.

    Returns:
        The study, with the sampler Optuna gives a loaded study (it draws no trial here).

    Raises:
        ValueError: No study store or journal at the path, no study of that name in it, or a storage
            `make_storage` refuses.
    """
    database = sqlite_file(storage)
    if database is not None and not database.is_file():
        raise ValueError(
            f"no study store at {database.resolve()}, so no study {name!r}: run `tune` here first, change to the folder "
            "that holds mlruns/, or pass --storage sqlite:///PATH/mlruns/optuna.db"
        )
    journal = storage_file(storage) if storage.startswith(JOURNAL) else None
    if journal is not None and not journal.is_file():
        raise ValueError(f"no journal at {journal}, so no study {name!r}: check the path after journal: (the file `tune` was given)")
    try:
        return optuna.load_study(study_name=name, storage=make_storage(storage))
    except KeyError:
        raise ValueError(f"no study {name!r} in {storage}; see the study names in `tune ui` or the tune output") from None


def open_study(
    name: str,
    storage: str,
    *,
    seed: int,
    pareto: bool,
    identity: dict[str, object],
    heartbeat: int = HEARTBEAT_SECONDS,
    worker: str = "0",
    grid: Mapping[str, Sequence[object]] | None = None,
    sampler_name: str = SAMPLERS[0],
) -> optuna.Study:
    """Create a study, or resume it with the settings it was created with.

    Args:
        name: The study's name.
        storage: Its storage's URL, as `make_storage` takes it.
        seed: The study's seed; each process seeds its sampler from it and its `worker` identity
            (`sampler_seed`), so no two processes draw the same trials.
        pareto: Search PSI and HM together (NSGA-II, two objectives) instead of PSI alone.
        identity: What the study is of (model, dataset, floor, space, ...): stored on creation, and compared on
            resume.
        heartbeat: Seconds between a running trial's heartbeats.
        worker: This process's identity among the study's processes (`0`: the coordinator).
        grid: Configs to run exactly, with Optuna's `GridSampler`, instead of drawing them.
        sampler_name: The single-objective sampler (`tuner.tuning.sampler.make_sampler`): by default TPE that
            weighs each depth by its cost under a budget.

    Returns:
        The study, its sampler seeded for this process.

    Raises:
        StudyMismatchError: The study exists, has run trials, and was created with another `identity`.
        ValueError: A storage `make_storage` refuses.
    """
    seed = sampler_seed(seed, worker)
    sampler: optuna.samplers.BaseSampler
    directions: list[Literal["minimize", "maximize"]]
    if grid is not None:
        sampler = optuna.samplers.GridSampler(dict(grid), seed=seed)  # type: ignore[arg-type]
        directions = ["minimize", "maximize"] if pareto else ["minimize"]
    elif pareto:
        sampler = optuna.samplers.NSGAIISampler(seed=seed, population_size=8)
        directions = ["minimize", "maximize"]  # PSI down, HM up
    else:
        sampler = make_sampler(sampler_name, seed)
        directions = ["minimize"]  # PSI, subject to HM >= floor
    study = optuna.create_study(
        study_name=name, storage=make_storage(storage, heartbeat), sampler=sampler, directions=directions, load_if_exists=True
    )
    # Trials first, then the attributes in one read: a process creating this study at the same moment writes
    # its identity key by key before it queues any trial, so once a trial is seen the identity is whole.
    started = any(t.state != TrialState.FAIL for t in study.get_trials(deepcopy=False))
    attrs = study.user_attrs
    stored = {k: attrs[k] for k in identity if k in attrs}
    changed = sorted(k for k in identity if stored.get(k) != identity[k])  # a key an older posfair did not store: None
    if changed and stored and started:
        raise StudyMismatchError(
            f"study {name!r} in {storage} was created with other settings ({', '.join(changed)}); "
            "resume it with the same options or choose another --study-name"
        )
    mark_winner_first(study)
    for key in changed:  # a new study, or one whose start failed before any trial ran: no evidence is at stake
        study.set_user_attr(key, identity[key])
    return study


def enqueue_once(study: optuna.Study, params: dict[str, object], user_attrs: dict[str, object] | None = None) -> None:
    """Queue fixed parameters (and user attributes) unless a trial with exactly these already exists.

    A queued trial keeps its parameters in the `fixed_params` system attribute until it runs (its `params`
    are empty until then), so both are compared: a second `tune` on the study never queues them again.
    """
    attrs = user_attrs or {}
    if not any(
        _fixed_params(t) == params and all(t.user_attrs.get(k) == v for k, v in attrs.items()) for t in study.get_trials(deepcopy=False)
    ):
        study.enqueue_trial(params, user_attrs=attrs or None)


def _fixed_params(trial: FrozenTrial) -> dict[str, object]:
    return trial.system_attrs.get("fixed_params") or trial.params


def sampler_seed(seed: int, worker: str) -> int:
    """The seed of one process's sampler: the study seed itself for the coordinator (worker "0"), and for
    every other worker a seed derived from the study seed and the worker's identity, so that workers draw
    different trials (reproducibly, for local workers numbered 1, 2, ...)."""
    if worker == "0":
        return seed
    return int(np.random.SeedSequence([seed, zlib.crc32(worker.encode())]).generate_state(1)[0])


TrialCallback = Callable[[optuna.Study, FrozenTrial], None]
OWNER_ATTR = "owner"  # host, pid and number of the process running a trial: a dead local owner is found at once


@dataclass(frozen=True)
class TrialsEnd:
    """How `run_trials` ended: the complete trials against the target, and why it stopped short (if it did)."""

    complete: int
    target: int
    stopped: str | None = None  # None, "interrupted" (Ctrl-C), "terminated" (SIGTERM) or "failures"
    failures: int = 0  # trials of this run that failed
    requeued: int | None = None  # a trial interrupted mid-way and queued to run again
    budget_spent: bool = False  # ended at `--budget`: as complete as the study will be

    @property
    def short(self) -> bool:
        return self.complete < self.target and not self.budget_spent


def _owner() -> dict[str, object]:
    return {"host": socket.gethostname(), "pid": os.getpid()}


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def fail_dead_trials(study: optuna.Study) -> list[int]:
    """RUNNING trials whose process is known to be gone, failed now and re-queued (like a stale heartbeat,
    without waiting for one); returns their numbers. Known gone: its owner is a process of this machine that
    has ended, or it has no owner mark a grace period after it started (`_orphaned`). Trials of live processes
    and of other machines' owners are left to the heartbeat check."""
    here = socket.gethostname()
    failed = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        owner = trial.user_attrs.get(OWNER_ATTR)
        if owner is None:
            if not _orphaned(study, trial):
                continue
        elif owner.get("host") != here or owner.get("trial") != trial.number or owner.get("pid") == os.getpid():
            continue
        elif _process_alive(int(owner["pid"])):
            continue
        try:
            if set_trial_state(study, trial, TrialState.FAIL):
                failed.append(trial)
        except optuna.exceptions.UpdateFinishedTrialError:
            pass  # another process got there first
    _requeue(study, failed)
    for trial in failed:
        owner = trial.user_attrs.get(OWNER_ATTR)
        log.warning(
            "trial %d was left RUNNING by %s, which is gone; it is re-run",
            trial.number,
            f"process {owner['pid']}" if owner else "a process that stopped as it began the trial",
        )
    return [t.number for t in failed]


def _orphaned(study: optuna.Study, trial: FrozenTrial) -> bool:
    """Whether an ownerless RUNNING trial is a dead process's. A live posfair process marks its trial's owner
    within milliseconds of Optuna creating it (`run_trials`), and Optuna records no heartbeat before then, so
    a process killed in between leaves a trial that Optuna's stale check never fails. Its start is its last
    sign of life: older than the grace period, it is as stale as a heartbeat that old."""
    grace = grace_seconds(storage_of(study))
    if grace is None or trial.datetime_start is None:
        return False
    return datetime.datetime.now() - trial.datetime_start > datetime.timedelta(seconds=grace)


EXPORT_ATTR = "posfair:export"  # a study system attribute: {"trials", "export", "owner"} of its last export


def _export_mark(study: optuna.Study) -> str:
    """The name of the marker of an export of `study` as it stands (`~` is outside study names' characters)."""
    return f"{study.study_name}~export~{len(complete_trials(study))}"


def _exported(study: optuna.Study) -> dict[str, object] | None:
    """The study's export as it stands ({"export": path, OWNER_ATTR: who}), if one was written (`record_export`)."""
    done = study_system_attrs(study).get(EXPORT_ATTR)
    return done if done is not None and done.get("trials") == len(complete_trials(study)) else None


def claim_export(study: optuna.Study) -> dict[str, object] | None:
    """Elect the one process that exports `study` with its current complete trials: None if it is this one,
    else what the elected one recorded (its `owner`, and `export`, the path, once written).

    Processes that finish a study together all reach its conclusion; the election is the creation of a
    marker study named after the study and its trial count, which the storage every process shares lets
    exactly one of them create. The marker lives only while the export is written (`record_export` moves what it
    says onto the study itself and deletes it), so optuna-dashboard lists no study beside the real one once it is
    done. A marker whose exporter died on this machine before it finished is taken over.
    """
    storage, mark = storage_of(study), _export_mark(study)
    while True:
        if (done := _exported(study)) is not None:
            return done
        try:
            mark_id = storage.create_new_study([optuna.study.StudyDirection.MINIMIZE], mark)
        except optuna.exceptions.DuplicatedStudyError:
            try:
                mark_id = storage.get_study_id_from_name(mark)
                attrs = storage.get_study_user_attrs(mark_id)
            except KeyError:  # deleted by a process taking over, or by the exporter as it finished: look again
                continue
            owner = attrs.get(OWNER_ATTR) or {}
            if owner.get("host") != socket.gethostname() or _process_alive(int(owner.get("pid", os.getpid()))):
                return attrs
            log.warning("the export of study %s by process %s did not finish (it is gone); it is done here", study.study_name, owner["pid"])
            try:
                storage.delete_study(mark_id)
            except KeyError:
                pass
            continue
        if (done := _exported(study)) is not None:  # written, and its marker deleted, between the two looks above
            storage.delete_study(mark_id)
            return done
        storage.set_study_user_attr(mark_id, OWNER_ATTR, _owner())
        return None


def record_export(study: optuna.Study, path: Path) -> None:
    """Mark the elected export as written (`claim_export`) on the study (later runs say where it is instead of
    exporting again), then remove the marker: written first, so a process that looks between the two finds one."""
    record: dict[str, Any] = {"trials": len(complete_trials(study)), "export": str(path), OWNER_ATTR: _owner()}
    set_study_system_attr(study, EXPORT_ATTR, record)
    storage = storage_of(study)
    try:
        storage.delete_study(storage.get_study_id_from_name(_export_mark(study)))
    except KeyError:
        pass


def _requeue(study: optuna.Study, trials: Sequence[FrozenTrial]) -> None:
    """Queue failed trials again with what they had drawn (the storage's retry callback, as for stale ones)."""
    storage = storage_of(study)  # a storage with heartbeats (`make_storage`; RDB: in Optuna's cache, which passes them on)
    retry = storage.get_heartbeat_stale_trial_callback() if isinstance(storage, HeartbeatStorage) else None
    for trial in trials:
        if retry is not None:
            retry(study, stored_trial(study, trial))


def run_trials(
    study: optuna.Study,
    objective: Callable[[optuna.Trial], float | Sequence[float]],
    n_complete: int,
    callbacks: Sequence[TrialCallback] = (),
    poll_seconds: float = 2.0,
    allowance: int | None = None,
) -> TrialsEnd:
    """Run until `n_complete` trials are finished (complete, or pruned between rungs); failed trials are
    recorded and do not count, nor do repeats of a calibration the study already ran.

    At start, trials left RUNNING by a dead process of this machine are failed and re-queued, so they run
    before new ones. Trials RUNNING elsewhere are waited for: they complete, or the heartbeat check fails and
    re-queues them, and then they run here. With the trials' `allowance` (layer-tokens) the study also ends at the
    first trial drawn that it has no room for (`TrialPricing.reserve`). The stop rule counts only the failures of
    this run (a study's old failures are history). Ctrl-C or SIGTERM stops after the current trial; a second signal (or, after
    SIGTERM, the grace period's end) aborts it and queues it again. The result says whether the target was reached, and if not, why.
    """
    fail_dead_trials(study)
    loop = _TrialLoop(study, objective, n_complete, allowance)
    requeued = None
    with _stop_after_current_trial(study) as interrupted:
        try:
            loop.run(interrupted, callbacks, poll_seconds)
        except KeyboardInterrupt:  # a second signal or the grace period's end: the trial is aborted and queued again
            requeued = _abort(study, loop.current[0]) if loop.current else None
            stopped: str | None = interrupted() or "interrupted"
        else:
            stopped = interrupted() or ("failures" if loop.too_many_failures else None)
    complete, spent = len(finished(study)), budget_ended(study, allowance)
    if complete >= n_complete or spent:  # an interrupted study keeps its queue for the resume
        withdraw_queued(study)
    return TrialsEnd(complete, n_complete, stopped if complete < n_complete and not spent else None, len(loop.failed_here), requeued, spent)


class _TrialLoop:
    """One process's trial loop over `study` (`run_trials`): Optuna's `optimize`, stopped by the callbacks here."""

    def __init__(
        self, study: optuna.Study, objective: Callable[[optuna.Trial], float | Sequence[float]], n_complete: int, allowance: int | None
    ) -> None:
        self.study, self.objective, self.n_complete, self.allowance = study, objective, n_complete, allowance
        self.failures_allowed = max(3, n_complete)
        self.failed_here: list[int] = []
        self.current: list[optuna.Trial] = []  # the trial this process runs (the last one it started)
        self.failing_store: list[BaseException] = []

    @property
    def too_many_failures(self) -> bool:
        return len(self.failed_here) >= self.failures_allowed

    def run(self, interrupted: Callable[[], str | None], callbacks: Sequence[TrialCallback], poll_seconds: float) -> None:
        """Optimize until the study has its trials (here or elsewhere), its allowance ended it, a stop was asked, or
        too many trials of this run failed."""
        study, waiting_said = self.study, False

        def stop_if_interrupted(study: optuna.Study, trial: FrozenTrial) -> None:
            if interrupted():
                study.stop()

        stops = [self.stop_on_a_failing_store, self.enough, self.stop_on_too_many_failures, stop_if_interrupted]
        while (
            len(finished(study)) < self.n_complete
            and not budget_ended(study, self.allowance)
            and not interrupted()
            and not self.too_many_failures
        ):
            if not self.room(study):  # the rest are running elsewhere: wait until they complete or are found dead
                wait_for_other_processes(study, poll_seconds, announce=not waiting_said)
                waiting_said = True
                continue
            try:
                study.optimize(self.reserved, n_trials=None, catch=(Exception,), callbacks=[*stops, *callbacks], gc_after_trial=False)
            except (ValueError, AssertionError):  # optuna#5470: Optuna cannot tell a trial failed by another process
                if not (self.current and _failed_elsewhere(study, self.current[0])):
                    raise
                log.warning(
                    "trial %d was declared dead by another worker (missed heartbeats); it is re-run as a new trial and this worker goes on",
                    self.current[0].number,
                )

    def room(self, study: optuna.Study) -> bool:
        return sum(counted(t) for t in study.get_trials(deepcopy=False)) < self.n_complete and not budget_ended(study, self.allowance)

    def enough(self, study: optuna.Study, trial: FrozenTrial) -> None:
        """Stop once complete + running trials (of every worker) reach the target."""
        if not self.room(study):
            study.stop()

    def reserved(self, trial: optuna.Trial) -> float | Sequence[float]:
        """Own the trial, leave it unrun if it is surplus (`_surplus_reason`, `NotRun`), else run the objective. A write the study
        database refused for want of space or a lock ends the study (`stop_on_a_failing_store`): every later
        trial would fail the same way."""
        self.current[:] = [trial]
        try:
            trial.set_user_attr(OWNER_ATTR, {**_owner(), "trial": trial.number})
            reason = _surplus_reason(self.study, trial, self.n_complete)
            if reason is not None:
                trial.set_user_attr(NOT_RUN_ATTR, reason)
                raise NotRun(reason)
            return self.objective(trial)
        except Exception as error:
            if machine_fault(error):
                self.failing_store.append(error)
            raise

    def stop_on_a_failing_store(self, study: optuna.Study, trial: FrozenTrial) -> None:
        if self.failing_store:
            raise self.failing_store[0]

    def stop_on_too_many_failures(self, study: optuna.Study, trial: FrozenTrial) -> None:
        if trial.state == TrialState.FAIL and not never_ran(trial):
            self.failed_here.append(trial.number)
            if self.too_many_failures:
                log.error("%d trials of this run failed; stopping the study", len(self.failed_here))
                study.stop()


def _surplus_reason(study: optuna.Study, trial: optuna.Trial, n_complete: int) -> str | None:
    """Why `trial`, just started, must not run (the reason it is not run for, `NotRun`), or None to run it.

    It is surplus when the trials before it already count `n_complete` (a worker that lost the race for the
    last slot), or when it is a queued trial whose fixed parameters an earlier trial, neither failed nor
    pruned, already holds (two `tune` processes that queued the same reference). A trial re-queued after a
    failure (`failed_trial`) is a retry, never a repeat, and earlier retries do not make it one either.
    """
    ahead = [t for t in study.get_trials(deepcopy=False) if t.number < trial.number]
    if sum(counted(t) for t in ahead) >= n_complete:
        return f"the study already has {n_complete} trials"
    system = stored_trial(study, trial).system_attrs
    fixed = system.get("fixed_params")
    if (
        fixed
        and "failed_trial" not in system
        and any(
            "failed_trial" not in t.system_attrs and t.state not in (TrialState.FAIL, TrialState.PRUNED) and _fixed_params(t) == fixed
            for t in ahead
        )
    ):
        return "these fixed parameters are already queued in an earlier trial"
    return None


def wait_for_other_processes(study: optuna.Study, poll_seconds: float, announce: bool) -> None:
    """One wait for the trials running in other processes (saying so first when `announce`): sleep a poll, then
    fail and re-queue those whose process is gone here (`fail_dead_trials`) or whose heartbeat stopped."""
    if announce:
        log.info(
            "waiting for %d trial(s) running in other processes",
            len(study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))),
        )
    time.sleep(poll_seconds)
    fail_dead_trials(study)
    with warnings.catch_warnings():  # marked experimental; Optuna's own trial loop calls it the same way
        warnings.simplefilter("ignore", ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)


def _abort(study: optuna.Study, trial: optuna.Trial) -> int | None:
    """Fail an aborted trial (if Optuna has not) and queue it again; its number, or None if it had finished."""
    try:
        set_trial_state(study, trial, TrialState.FAIL)
    except optuna.exceptions.UpdateFinishedTrialError:
        pass
    frozen = stored_trial(study, trial)
    if frozen.state != TrialState.FAIL or never_ran(frozen):
        return None
    _requeue(study, [frozen])
    return trial.number


def _failed_elsewhere(study: optuna.Study, trial: optuna.Trial) -> bool:
    """Whether `trial` was marked FAIL by another process's stale-trial check (it never reached our tell)."""
    return stored_trial(study, trial).state == TrialState.FAIL


STOP_GRACE_SECONDS = 20.0
"""After SIGTERM, how long the running trial may take to finish before it is aborted and queued again
(`POSFAIR_STOP_GRACE` overrides it): Slurm and Kubernetes send SIGKILL 30 s after SIGTERM by default."""


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler's stop) outside the trial loop: unwound like Ctrl-C, but named for what it was."""


def stop_grace() -> float:
    """The grace period after SIGTERM, in seconds (`POSFAIR_STOP_GRACE`, else `STOP_GRACE_SECONDS`)."""
    return env_seconds("POSFAIR_STOP_GRACE", STOP_GRACE_SECONDS)


DATABASE_MODULES = ("sqlalchemy", "psycopg", "psycopg2", "pymysql", "sqlite3", "alembic", "optuna.storages")
"""Code that a stop must not interrupt: an exception raised inside a write breaks it (CI, PostgreSQL: inside
psycopg's ping), and Optuna then records a failed trial with a traceback instead of an abort."""

STOP_RETRY_SECONDS = 0.05  # how soon a stop that arrived inside a database call is tried again


def _in_database_call(frame: FrameType | None) -> bool:
    """Whether the interrupted code is, at any depth, inside a database driver or Optuna's storage."""
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if any(module == name or module.startswith(f"{name}.") for name in DATABASE_MODULES):
            return True
        frame = frame.f_back
    return False


def _raise_outside_database(error: type[KeyboardInterrupt], frame: FrameType | None) -> None:
    """Raise `error` where the signal interrupted the process, unless that is inside a database call: then
    try again shortly (SIGALRM), so the call completes and the stop lands after it."""
    if _in_database_call(frame):
        signal.signal(signal.SIGALRM, lambda signum, later: _raise_outside_database(error, later))
        signal.setitimer(signal.ITIMER_REAL, STOP_RETRY_SECONDS)
        return
    raise error


def raise_terminated(signum: int, frame: FrameType | None) -> None:
    """A SIGTERM handler for the rest of a run: stop as Ctrl-C would (outside a database call)."""
    _raise_outside_database(Terminated, frame)


@contextmanager
def _stop_after_current_trial(study: optuna.Study) -> Iterator[Callable[[], str | None]]:
    """Ctrl-C or SIGTERM: finish the running trial, then stop. A second signal aborts the trial at once (once
    out of a database call), and after SIGTERM so does the end of the grace period (`stop_grace`), before the
    scheduler's SIGKILL. The callable says what was asked: None, "interrupted" (SIGINT) or "terminated" (SIGTERM)."""
    requested: str | None = None

    def abort(signum: int, frame: FrameType | None) -> None:
        _raise_outside_database(KeyboardInterrupt, frame)

    def handler(signum: int, frame: FrameType | None) -> None:
        nonlocal requested
        if requested:
            abort(signum, frame)
            return
        if signum == signal.SIGTERM:
            requested = "terminated"
            grace = stop_grace()
            log.warning(
                "SIGTERM: finishing the current trial within %g s, then stopping (after that it is aborted and queued to run again)", grace
            )
            signal.signal(signal.SIGALRM, abort)
            signal.setitimer(signal.ITIMER_REAL, max(grace, 1e-3))
        else:
            requested = "interrupted"
            log.warning("interrupt: finishing the current trial, then stopping (Ctrl-C again to abort now)")

    try:
        previous = {number: signal.signal(number, handler) for number in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:  # not the main thread: leave signals alone
        yield lambda: None
        return
    alarm = signal.getsignal(signal.SIGALRM)
    try:
        yield lambda: requested
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, alarm)
        for number, action in previous.items():
            signal.signal(number, action)


def candidates(study: optuna.Study) -> list[Candidate]:
    """Complete trials as selection sees them: the objective (the worst PSI over the tuning structures; the
    tuning PSI for a trial that recorded none over structures), its standard error, drift and constraint values.
    A repeat of an earlier trial is that trial, so it is not a candidate of its own."""
    return [
        Candidate(
            t.number,
            t.user_attrs.get("robust_psi", t.user_attrs["psi"]),
            t.user_attrs.get("robust_psi_se", t.user_attrs.get("psi_se", 0.0)),
            t.user_attrs.get("drift", 0.0),
            tuple(constraints_of(t)),
            t.user_attrs["hm"],
            objective_resamples(t),
            structure_mean_psi(t),
        )
        for t in complete_trials(study)
        if DUPLICATE_ATTR not in t.user_attrs
    ]


def structure_mean_psi(trial: FrozenTrial) -> float:
    """The mean PSI over the tuning structures the trial was scored on (NaN: it recorded none)."""
    values = [row["psi"] for row in trial.user_attrs.get("structures", {}).values() if math.isfinite(row.get("psi", math.nan))]
    return sum(values) / len(values) if values else math.nan


def selection_threshold(study: optuna.Study, rule: str) -> float | None:
    """The objective a trial must reach to be eligible under `rule` given the complete trials so far (one-SE:
    the best objective plus its standard error; lowest: the best objective); None while none is feasible."""
    selection = select(candidates(study), rule)  # type: ignore[arg-type]
    return None if selection is None else selection.threshold


def best_objective(study: optuna.Study) -> float | None:
    """The lowest objective of the feasible complete trials so far; None while none is feasible."""
    selection = select(candidates(study), "lowest")
    return None if selection is None else selection.best.objective


def screen_threshold(study: optuna.Study) -> float | None:
    """The screen PSI a trial must come within noise of to go past the pooled screen: the lowest screen PSI plus
    its standard error over the feasible complete trials that were screened; None while there is none."""
    trials = study.get_trials(deepcopy=False)
    screened = [ScreenFigures.of_trial(trials[c.trial_number]) for c in candidates(study) if c.feasible]
    return min((s.psi + s.psi_se for s in screened if s is not None), default=None)


def winner(study: optuna.Study, rule: str = "one-se") -> tuple[FrozenTrial, Selection] | None:
    """The winning trial under the selection rule (`objectives.selection`), with the reasoning; None when
    no complete trial is feasible."""
    selection = select(candidates(study), rule)  # type: ignore[arg-type]
    return (study.trials[selection.winner.trial_number], selection) if selection else None


def trial_by_number(study: optuna.Study, number: int) -> tuple[FrozenTrial, Selection]:
    """Trial `number` of the study, as a choice of the user's (`tune export --trial`): it must be complete."""
    found = {c.trial_number: c for c in candidates(study)}
    if number not in found:
        complete = sorted(found)
        raise ValueError(
            f"--trial {number}: study {study.study_name!r} has no complete trial {number}; "
            f"complete trials: {complete[:20]}{' …' if len(complete) > 20 else ''}"
        )
    if not found[number].feasible:
        log.warning("trial %d misses a constraint of the study; exported as asked", number)
    return study.trials[number], chosen(found[number])


def pareto_front(study: optuna.Study) -> list[FrozenTrial]:
    """Feasible, non-dominated trials in (PSI down, HM up), from each trial's recorded PSI and HM: a
    single-objective study has them too, where Optuna's `best_trials` is only the lowest PSI."""
    feasible = [t for t in complete_trials(study) if all(c <= 0 for c in constraints_of(t))]
    return [
        t
        for t in feasible
        if not any(
            o.user_attrs["psi"] <= t.user_attrs["psi"]
            and o.user_attrs["hm"] >= t.user_attrs["hm"]
            and (o.user_attrs["psi"], o.user_attrs["hm"]) != (t.user_attrs["psi"], t.user_attrs["hm"])
            for o in feasible
        )
    ]
