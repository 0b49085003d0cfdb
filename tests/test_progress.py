"""The ETA learns from the trials' own durations, not from the time since the study started."""

from __future__ import annotations

from datetime import datetime, timedelta

import optuna
from optuna.distributions import FloatDistribution

from tuner.tracking.progress import StudyProgress, clock


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
    status = StudyProgress(16, 0, bar=False, allowance=10_000_000).status(study)
    assert " · 4.00M of the trials' budget of 10.00M layer-tokens (40%) · " in status
    assert status.endswith("ETA 4m30s")


def test_with_the_estimate_the_eta_adds_the_held_out_scoring_at_the_pace_the_trials_measured() -> None:
    """The estimate priced a trial at 33 s and the held-out scoring at 9M layer-tokens; the trials ran at 45 s per M
    layer-tokens (60 s and 120 s for 1M and 3M), so the held-out scoring comes at that pace, not the estimate's."""
    from tuner.evaluation.cost import Probe, StudyCost

    # 1 µs per token through the model's 6 layers; one trial: the 33M-token corpus through them, 33 s
    estimate = StudyCost(
        Probe("cpu", 1, 1_000_000, 1.0), 300, 33_000_000, 0, 512, 0, 0, layers=6, heldout_tokens=500_000
    )
    assert round(estimate.trial_seconds) == 33 and estimate.heldout_layer_tokens == 3_000_000 + 2 * 6 * 500_000
    study = optuna.create_study()
    add(study, 0.0, 2, layer_tokens=0)
    add(study, 0.5, 60, layer_tokens=1_000_000)
    add(study, 0.8, 120, layer_tokens=3_000_000)
    held = estimate.heldout_layer_tokens * 180 / 4_000_000  # 9M layer-tokens at 45 s per M
    status = StudyProgress(4, 0, bar=False, estimate=estimate).status(study)
    # one trial left at 90 s, then the held-out scoring
    assert status.endswith(
        f"ETA {clock(90 + held)} with held-out scoring (≈ {clock(held)}), at the pace measured so far "
        "(1m30s per complete trial, estimated ≈ 33 s)"
    ), status
    assert (
        StudyProgress(3, 0, bar=False, estimate=estimate)
        .status(study)
        .endswith(f"trials done; held-out scoring ≈ {clock(held)}")
    )
