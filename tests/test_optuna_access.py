"""Each use of Optuna's internals (`tuner.tuning.optuna_access`) against real studies: an Optuna upgrade that moves
one fails here, by name."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import optuna
import pytest
from optuna.trial import TrialState

from tuner.tuning.optuna_access import (
    DASHBOARD_CONSTRAINTS_KEY,
    HeartbeatStorage,
    ParzenEstimator,
    set_dashboard_constraints,
    set_stored_trial_user_attr,
    set_study_system_attr,
    set_trial_state,
    set_trial_system_attr,
    storage_of,
    stored_trial,
    study_system_attrs,
    tpe_startup_trials,
    trial_id,
)
from tuner.tuning.storage import make_storage


@pytest.fixture(params=["memory", "sqlite"])
def study(request: pytest.FixtureRequest, tmp_path: Path) -> optuna.Study:
    storage = None if request.param == "memory" else f"sqlite:///{tmp_path / 'optuna.db'}"
    return optuna.create_study(study_name="access", storage=storage)


def reopened(study: optuna.Study) -> optuna.Study:
    """The study as another process sees it (the in-memory one is its own)."""
    storage = storage_of(study)
    return (
        study
        if isinstance(storage, optuna.storages.InMemoryStorage)
        else optuna.load_study(study_name="access", storage=storage)
    )


def test_storage_of_is_the_storage_the_study_writes_to(study: optuna.Study) -> None:
    storage = storage_of(study)
    assert isinstance(storage, optuna.storages.BaseStorage)
    study.set_user_attr("seen", 1)
    assert storage.get_study_user_attrs(storage.get_study_id_from_name("access")) == {"seen": 1}


def test_trial_id_names_the_trial_in_its_storage(study: optuna.Study) -> None:
    study.ask()
    trial = study.ask()
    assert storage_of(study).get_trial(trial_id(trial)).number == trial.number == 1
    assert trial_id(study.trials[1]) == trial_id(trial)


def test_stored_trial_shows_a_running_trial_s_system_attributes_and_a_state_set_elsewhere(study: optuna.Study) -> None:
    trial = study.ask()
    storage_of(study).set_trial_system_attr(trial_id(trial), "beat", 7)
    storage_of(study).set_trial_state_values(trial_id(trial), TrialState.FAIL)
    stored = stored_trial(study, trial)
    assert stored.number == trial.number and stored.system_attrs["beat"] == 7 and stored.state == TrialState.FAIL


def test_set_trial_state_fails_another_process_s_trial_and_only_a_running_or_waiting_one(study: optuna.Study) -> None:
    running = study.ask()
    assert set_trial_state(reopened(study), running, TrialState.FAIL)
    assert study.trials[running.number].state == TrialState.FAIL
    with pytest.raises(optuna.exceptions.UpdateFinishedTrialError):
        set_trial_state(study, running, TrialState.FAIL)
    study.enqueue_trial({"x": 1.0})
    waiting = study.get_trials(states=(TrialState.WAITING,))[0]
    assert set_trial_state(study, waiting, TrialState.RUNNING)
    assert not set_trial_state(study, waiting, TrialState.RUNNING), "taken once: a second process's claim fails"


def test_set_stored_trial_user_attr_marks_a_queued_trial(study: optuna.Study) -> None:
    study.enqueue_trial({"x": 1.0})
    waiting = study.get_trials(states=(TrialState.WAITING,))[0]
    set_stored_trial_user_attr(study, waiting, "surplus", True)
    assert reopened(study).trials[waiting.number].user_attrs == {"surplus": True}


def test_set_trial_system_attr_stores_out_of_the_user_attributes(study: optuna.Study) -> None:
    trial = study.ask()
    set_trial_system_attr(trial, "posfair:rows", [0.1, None])
    study.tell(trial, 0.5)
    stored = reopened(study).trials[trial.number]
    assert stored.system_attrs["posfair:rows"] == [0.1, None] and "posfair:rows" not in stored.user_attrs


def test_set_dashboard_constraints_is_what_optuna_reads_as_the_samplers_constraints(study: optuna.Study) -> None:
    from optuna.study._constrained_optimization import _get_feasible_trials

    feasible, infeasible = study.ask(), study.ask()
    set_dashboard_constraints(feasible, [-0.1, 0.0])
    set_dashboard_constraints(infeasible, [-0.1, 0.2])
    study.tell(feasible, 0.5)
    study.tell(infeasible, 0.1)
    trials = reopened(study).trials
    assert trials[0].system_attrs[DASHBOARD_CONSTRAINTS_KEY] == [-0.1, 0.0]
    assert [t.number for t in _get_feasible_trials(trials)] == [0]


def test_study_system_attrs_are_stored_apart_from_the_user_attributes(study: optuna.Study) -> None:
    assert "posfair:export" not in study_system_attrs(study)
    set_study_system_attr(study, "posfair:export", {"trials": 3})
    again = reopened(study)
    assert study_system_attrs(again)["posfair:export"] == {"trials": 3}
    assert "posfair:export" not in again.user_attrs


def test_a_storage_with_heartbeats_is_a_heartbeat_storage(tmp_path: Path) -> None:
    assert isinstance(make_storage(f"sqlite:///{tmp_path / 'optuna.db'}", heartbeat=5), HeartbeatStorage)
    assert isinstance(make_storage(f"journal:{tmp_path / 'study.journal'}", heartbeat=5), HeartbeatStorage)
    assert not isinstance(optuna.storages.InMemoryStorage(), HeartbeatStorage)


def test_tpe_hands_its_acquisition_parzen_estimators(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[object] = []
    real = optuna.samplers.TPESampler._compute_acquisition_func

    def recording(self, samples, mpe_below, mpe_above) -> np.ndarray:  # type: ignore[no-untyped-def]
        seen.extend([mpe_below, mpe_above])
        return real(self, samples, mpe_below, mpe_above)

    monkeypatch.setattr(optuna.samplers.TPESampler, "_compute_acquisition_func", recording)
    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=0, n_startup_trials=2))
    study.optimize(lambda trial: trial.suggest_float("x", 0, 1), n_trials=4)
    assert seen and all(isinstance(estimator, ParzenEstimator) for estimator in seen)


def test_tpe_startup_trials_is_the_number_the_sampler_was_made_with() -> None:
    assert tpe_startup_trials(optuna.samplers.TPESampler(n_startup_trials=7)) == 7
    assert tpe_startup_trials(optuna.samplers.TPESampler()) == 10  # Optuna's default
