"""The drift limit's yardstick: the paper default's drift per structure, read from its trial in the study.

`--max-drift` bounds a trial's drift (mean 1 − cos to the uncalibrated document vectors) on each structure at a
multiple of the paper default's there. The paper default is queued before any drawn trial, so its trial is read
once it completes (another process may still be running it: it is waited for, as a repeat is), and the paper
default's own trial is its own yardstick.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

import optuna
from optuna.trial import TrialState

from objectives import Constraints
from objectives.robustness import RobustEvidence
from tuner.common.trials import DUPLICATE_ATTR
from tuner.tuning.owners import wait_for_other_processes
from tuner.tuning.search_space import PAPER_DEFAULT_PARAMS, is_reference_trial

log = logging.getLogger(__name__)


class DriftYardstick:
    """The paper default's drift per structure once it is known, and the drift `constraints` allow from it."""

    def __init__(self, constraints: Constraints, wait_seconds: float, poll_seconds: float) -> None:
        self.constraints = constraints
        self.wait_seconds = (
            wait_seconds  # the longest a trial waits for another process's paper default (as for a repeat)
        )
        self.poll_seconds = poll_seconds
        self.reference: dict[str, float] | None = None  # the paper default's drift per structure, once it is known
        self.own = False  # the trial running is the paper default: the yardstick is its own drift
        self._warned = False

    def of(self, robust: RobustEvidence) -> Mapping[str, float] | None:
        """The paper default's drift per structure (the trial's own when it is the paper default); None while
        unknown."""
        return robust.drifts() if self.own else self.reference

    def limits(self, robust: RobustEvidence) -> dict[str, float] | None:
        """The drift allowed per structure: `--max-drift` times the yardstick's; None without the limit or its
        yardstick."""
        reference = self.of(robust)
        if self.constraints.max_drift is None or reference is None:
            return None
        return {name: self.constraints.max_drift * value for name, value in reference.items() if value > 0}

    def await_reference(self, trial: optuna.Trial) -> None:
        """Read the paper default's drift per structure from its trial. It is queued before any drawn trial, so a
        drawn trial starts only once it has been taken: another process may still be running it, and is waited for
        as a repeat is. Without it (a space without the paper default, a reference that failed and waits to run
        again) this trial's drift is not limited, and the log says so once."""
        if self.constraints.max_drift is None or self.reference is not None:
            return
        study, deadline = trial.study, time.monotonic() + self.wait_seconds
        while True:
            references = [
                t
                for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.RUNNING))
                if t.number != trial.number
                and DUPLICATE_ATTR not in t.user_attrs
                and is_reference_trial(t, PAPER_DEFAULT_PARAMS)
            ]
            done = next(
                (t for t in references if t.state == TrialState.COMPLETE and "structures" in t.user_attrs), None
            )
            if done is not None:
                rows = done.user_attrs["structures"]
                self.reference = {name: float(row.get("drift", 0.0)) for name, row in rows.items()}
                return
            if not references or time.monotonic() >= deadline:
                if not self._warned:
                    log.warning(
                        "trial %d: the paper default has no complete trial in this study, so --max-drift (its "
                        "yardstick) is not applied to it, nor to later trials until the paper default completes",
                        trial.number,
                    )
                    self._warned = True
                return
            wait_for_other_processes(study, self.poll_seconds, announce=False)
