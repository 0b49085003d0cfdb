"""The ETA learns from the trials' own durations, not from the time since the study started."""

from __future__ import annotations

from datetime import datetime, timedelta

import optuna
from optuna.distributions import FloatDistribution

from tuner.tracking.progress import StudyProgress


def add(study: optuna.Study, strength: float, seconds: float) -> None:
    trial = optuna.trial.create_trial(params={"strength": strength}, distributions={"strength": FloatDistribution(0, 1)}, value=0.1)
    trial.datetime_start = datetime(2026, 1, 1)
    trial.datetime_complete = trial.datetime_start + timedelta(seconds=seconds)
    study.add_trial(trial)


def test_the_eta_is_the_remaining_trials_at_the_calibrating_trials_mean_duration() -> None:
    study = optuna.create_study()
    progress = StudyProgress(16, 0, bar=False)
    add(study, 0.0, 2)  # the baseline: cached vectors, seconds
    assert progress.status(study).endswith("ETA after the first calibrating trial")
    add(study, 0.5, 60)
    add(study, 0.8, 120)
    assert progress.status(study).endswith("ETA 19m30s"), "13 trials left at 90 s"
    assert StudyProgress(16, 0, bar=False, workers=2).status(study).endswith("ETA 9m45s")
