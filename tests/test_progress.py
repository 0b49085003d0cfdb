"""The ETA learns from the trials' own durations, not from the time since the study started."""

from __future__ import annotations

from datetime import datetime, timedelta

import optuna
from optuna.distributions import FloatDistribution

from tuner.tracking.progress import StudyProgress


def add(study: optuna.Study, strength: float, seconds: float, layer_tokens: int = 0) -> None:
    trial = optuna.trial.create_trial(
        params={"strength": strength},
        distributions={"strength": FloatDistribution(0, 1)},
        value=0.1,
        user_attrs={"layer_tokens": layer_tokens},
    )
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


def test_with_a_budget_the_eta_counts_only_the_trials_its_rest_buys_and_the_line_says_what_is_spent() -> None:
    study = optuna.create_study()
    add(study, 0.0, 2, layer_tokens=0)
    add(study, 0.5, 60, layer_tokens=1_000_000)
    add(study, 0.8, 120, layer_tokens=3_000_000)
    # 4M of 10M spent; 2M a calibrating trial: 3 more trials (not the 13 that --trials 16 leaves) at 90 s
    status = StudyProgress(16, 0, bar=False, budget=10_000_000).status(study)
    assert " · 4.00M of the trials' budget of 10.00M layer-tokens (40%) · " in status
    assert status.endswith("ETA 4m30s")
