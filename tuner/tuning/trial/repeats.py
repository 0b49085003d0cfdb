"""Repeats: a trial that draws a calibration the study already ran is not run again.

It repeats that trial's values, is marked a duplicate and does not count towards `--trials`
(`tuner.common.trials.counted`). A calibration another process's trial is running is waited for, and repeated if
that trial completes (`RepeatCheck.repeat_of`).
"""

from __future__ import annotations

import logging
import time

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.common.trials import DUPLICATE_ATTR, named_constraints
from tuner.tuning.owners import wait_for_other_processes
from tuner.tuning.trial.record import TrialRecorder, set_constraints

log = logging.getLogger(__name__)

REPEAT_CHECK_ATTR = (
    "repeat_check"  # "runs" or "waits": what a trial decided about its calibration (`RepeatCheck.repeat_of`)
)
REPEAT_WAIT_SECONDS = 3600.0
"""The longest a trial waits for another process's trial that runs the same calibration
(`RepeatCheck.repeat_of`); then it runs the config itself."""
REPEAT_POLL_SECONDS = 2.0

REPEATED_ATTRS = ("psi", "hm", "psi_se", "drift", "robust_psi", "robust_psi_se", "worst_structure", "layers")
"""What a repeat copies of the trial it repeats, beside its constraints, feasibility and metrics."""


class RepeatCheck:
    """Finds the trial a drawn calibration repeats, waiting for one another process is running."""

    def __init__(
        self, repeat_limit: int, wait_seconds: float = REPEAT_WAIT_SECONDS, poll_seconds: float = REPEAT_POLL_SECONDS
    ) -> None:
        self.repeat_limit = repeat_limit  # repeats not counted at most (then the space is as good as exhausted)
        self.wait_seconds = wait_seconds
        self.poll_seconds = poll_seconds

    def repeat_of(self, trial: optuna.Trial, key: str) -> FrozenTrial | None:
        """The complete trial (not itself a repeat) that ran this calibration already, if any; None as well once
        the study holds `repeat_limit` repeats (a sampler that only draws known configs must still end).

        A calibration that another trial is running (in another process) is waited for, so that two trials
        that draw it at once do not both run it. Every trial records its calibration key before it looks and
        what it decided after (`REPEAT_CHECK_ATTR`: "runs" or "waits"), so of two such trials at least the
        later to look sees the other. A trial waits while a lower-numbered trial runs its calibration, or a
        higher-numbered one that decided to run it (having looked before this one's key was there); while a
        higher-numbered one has not decided yet it looks again. If the trial waited for completes, it is the
        trial repeated; if it fails or is pruned, or `wait_seconds` pass, None: this trial runs the config
        itself. It waits as the study loop waits for other processes (`wait_for_other_processes`), which fails
        the trials of dead processes, so a killed worker's trial is not waited for to the end."""
        deadline = time.monotonic() + self.wait_seconds
        decision = _Decision(trial)
        while True:
            trials = trial.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.RUNNING))
            if (
                sum(t.state == TrialState.COMPLETE and DUPLICATE_ATTR in t.user_attrs for t in trials)
                >= self.repeat_limit
            ):
                decision.record("runs")
                return None
            same = [
                t
                for t in trials
                if t.number != trial.number
                and DUPLICATE_ATTR not in t.user_attrs
                and t.user_attrs.get("calibration") == key
            ]
            ran = next((t for t in same if t.state == TrialState.COMPLETE), None)
            if ran is not None:
                return ran
            others = [t for t in same if t.state == TrialState.RUNNING]
            running = [
                t.number for t in others if t.number < trial.number or t.user_attrs.get(REPEAT_CHECK_ATTR) == "runs"
            ]
            undecided = [t.number for t in others if t.number > trial.number and REPEAT_CHECK_ATTR not in t.user_attrs]
            if not running and not undecided:
                decision.record("runs")
                return None
            if time.monotonic() >= deadline:
                log.warning(
                    "trial %d: trial %d still runs the same calibration after %.0f s; it is run here too",
                    trial.number,
                    (running or undecided)[0],
                    self.wait_seconds,
                )
                decision.record("runs")
                return None
            if running:
                if decision.recorded is None:
                    log.info(
                        "trial %d drew the calibration trial %d is running: waiting for it", trial.number, running[0]
                    )
                decision.record("waits")
            wait_for_other_processes(trial.study, self.poll_seconds, announce=False)


class _Decision:
    """What `REPEAT_CHECK_ATTR` says of a trial so far: written when it changes."""

    def __init__(self, trial: optuna.Trial) -> None:
        self.trial = trial
        self.recorded: str | None = None

    def record(self, decision: str) -> None:
        if self.recorded != decision:
            self.trial.set_user_attr(REPEAT_CHECK_ATTR, decision)
            self.recorded = decision


def repeat(
    trial: optuna.Trial, earlier: FrozenTrial, params: dict[str, object], recorder: TrialRecorder
) -> list[float]:
    """Tell Optuna what the earlier trial measured (the sampler learns the truth) without running it again; returns
    its values."""
    trial.set_user_attr(DUPLICATE_ATTR, earlier.number)
    for key in REPEATED_ATTRS:
        if key in earlier.user_attrs:
            trial.set_user_attr(key, earlier.user_attrs[key])
    trial.set_user_attr("layer_tokens", 0)
    set_constraints(trial, named_constraints(earlier))
    if "feasible" in earlier.user_attrs:
        trial.set_user_attr("feasible", earlier.user_attrs["feasible"])
    metrics = {**earlier.user_attrs.get("metrics", {}), "cost/layer_tokens": 0.0}  # at no cost
    recorder.repeated(trial, earlier, params, metrics)
    return list(earlier.values)
