"""One process's trial loop: Optuna's `optimize` until the study has its trials, its allowance is spent, a stop is
asked or too many trials fail. Trials of a killed worker are failed and queued again (`tuner.tuning.owners`), so
the study still ends with the requested number of complete trials."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.common.budget import budget_ended
from tuner.common.trials import NOT_RUN_ATTR, NotRun, counted, finished, never_ran
from tuner.tuning.bisection import withdraw_queued
from tuner.tuning.optuna_access import set_trial_state, stored_trial
from tuner.tuning.owners import OWNER_ATTR, fail_dead_trials, requeue, this_process, wait_for_other_processes
from tuner.tuning.stops import stop_after_current_trial
from tuner.tuning.storage import machine_fault
from tuner.tuning.study import fixed_params

log = logging.getLogger(__name__)

TrialCallback = Callable[[optuna.Study, FrozenTrial], None]


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
    this run (a study's old failures are history). Ctrl-C or SIGTERM stops after the current trial; a second signal
    (or, after SIGTERM, the grace period's end) aborts it and queues it again. The result says whether the target
    was reached, and if not, why.
    """
    fail_dead_trials(study)
    loop = _TrialLoop(study, objective, n_complete, allowance)
    requeued = None
    with stop_after_current_trial(study) as interrupted:
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
    return TrialsEnd(
        complete,
        n_complete,
        stopped if complete < n_complete and not spent else None,
        len(loop.failed_here),
        requeued,
        spent,
    )


class _TrialLoop:
    """One process's trial loop over `study` (`run_trials`): Optuna's `optimize`, stopped by the callbacks here."""

    def __init__(
        self,
        study: optuna.Study,
        objective: Callable[[optuna.Trial], float | Sequence[float]],
        n_complete: int,
        allowance: int | None,
    ) -> None:
        self.study, self.objective, self.n_complete, self.allowance = study, objective, n_complete, allowance
        self.failures_allowed = max(3, n_complete)
        self.failed_here: list[int] = []
        self.current: list[optuna.Trial] = []  # the trial this process runs (the last one it started)
        self.failing_store: list[BaseException] = []

    @property
    def too_many_failures(self) -> bool:
        return len(self.failed_here) >= self.failures_allowed

    def run(
        self, interrupted: Callable[[], str | None], callbacks: Sequence[TrialCallback], poll_seconds: float
    ) -> None:
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
                study.optimize(
                    self.reserved,
                    n_trials=None,
                    catch=(Exception,),
                    callbacks=[*stops, *callbacks],
                    gc_after_trial=False,
                )
            except (ValueError, AssertionError):  # optuna#5470: Optuna cannot tell a trial failed by another process
                if not (self.current and _failed_elsewhere(study, self.current[0])):
                    raise
                log.warning(
                    "trial %d was declared dead by another worker (missed heartbeats); it is re-run as a new trial "
                    "and this worker goes on",
                    self.current[0].number,
                )

    def room(self, study: optuna.Study) -> bool:
        counted_so_far = sum(counted(t) for t in study.get_trials(deepcopy=False))
        return counted_so_far < self.n_complete and not budget_ended(study, self.allowance)

    def enough(self, study: optuna.Study, trial: FrozenTrial) -> None:
        """Stop once complete + running trials (of every worker) reach the target."""
        if not self.room(study):
            study.stop()

    def reserved(self, trial: optuna.Trial) -> float | Sequence[float]:
        """Own the trial, leave it unrun if it is surplus (`_surplus_reason`, `NotRun`), else run the objective. A
        write the study database refused for want of space or a lock ends the study (`stop_on_a_failing_store`):
        every later trial would fail the same way."""
        self.current[:] = [trial]
        try:
            trial.set_user_attr(OWNER_ATTR, {**this_process(), "trial": trial.number})
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
            "failed_trial" not in t.system_attrs
            and t.state not in (TrialState.FAIL, TrialState.PRUNED)
            and fixed_params(t) == fixed
            for t in ahead
        )
    ):
        return "these fixed parameters are already queued in an earlier trial"
    return None


def _abort(study: optuna.Study, trial: optuna.Trial) -> int | None:
    """Fail an aborted trial (if Optuna has not) and queue it again; its number, or None if it had finished."""
    try:
        set_trial_state(study, trial, TrialState.FAIL)
    except optuna.exceptions.UpdateFinishedTrialError:
        pass
    frozen = stored_trial(study, trial)
    if frozen.state != TrialState.FAIL or never_ran(frozen):
        return None
    requeue(study, [frozen])
    return trial.number


def _failed_elsewhere(study: optuna.Study, trial: optuna.Trial) -> bool:
    """Whether `trial` was marked FAIL by another process's stale-trial check (it never reached our tell)."""
    return stored_trial(study, trial).state == TrialState.FAIL
