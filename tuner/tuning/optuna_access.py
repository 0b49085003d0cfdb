"""Every use of Optuna's private internals, each behind one small function that says why the public API does not do.

posfair runs one study from several processes over a shared storage, fails and re-queues the trials of dead
processes itself, and writes what optuna-dashboard and its own selection read beside Optuna's records: for that it
reads and writes a study's storage directly, by its ids. Optuna keeps those ids and the storage private, so an
Optuna upgrade that moves them breaks here, and only here (tests/test_optuna_access.py runs each function on a real
study).
"""

from __future__ import annotations

from typing import Any

import optuna
from optuna.samplers._tpe.parzen_estimator import _ParzenEstimator
from optuna.storages import BaseStorage
from optuna.storages._heartbeat import BaseHeartbeat
from optuna.study._constrained_optimization import _CONSTRAINTS_KEY
from optuna.trial import FrozenTrial, TrialState

ParzenEstimator = _ParzenEstimator
"""TPE's density estimator, the type of the arguments of `TPESampler._compute_acquisition_func` (which
`tuner.tuning.sampler` extends): Optuna does not export it."""

HeartbeatStorage = BaseHeartbeat
"""The storages that have heartbeats (RDB, and `tuner.tuning.storage.JournalWithHeartbeats`): Optuna does not export
the base class that says so."""

DASHBOARD_CONSTRAINTS_KEY = _CONSTRAINTS_KEY
"""The trial system attribute where samplers' `constraints_func` stores its values (`set_dashboard_constraints`)."""


def storage_of(study: optuna.Study) -> BaseStorage:
    """The storage a study reads and writes. `optuna.Study` keeps it private; posfair needs it to change other
    processes' trials (fail a dead one, withdraw a queued one), which no public method of a study does."""
    return study._storage


def trial_id(trial: optuna.Trial | FrozenTrial) -> int:
    """A trial's id in its storage (not its number): every storage method names a trial by it, and `Trial` and
    `FrozenTrial` keep it private."""
    return trial._trial_id


def stored_trial(study: optuna.Study, trial: optuna.Trial | FrozenTrial) -> FrozenTrial:
    """The trial as the storage holds it now, system attributes included: a running `optuna.Trial` shows neither
    its system attributes nor a state another process gave it."""
    return storage_of(study).get_trial(trial_id(trial))


def set_trial_state(study: optuna.Study, trial: optuna.Trial | FrozenTrial, state: TrialState) -> bool:
    """Move a trial of the study to `state` (False: it was not running or waiting). The public `Study.tell`
    finishes only a trial this process asked for, and never a waiting one; posfair fails other processes' dead
    trials and withdraws queued ones. Raises `optuna.exceptions.UpdateFinishedTrialError` for a finished trial."""
    return storage_of(study).set_trial_state_values(trial_id(trial), state=state)


def set_stored_trial_user_attr(study: optuna.Study, trial: FrozenTrial, key: str, value: Any) -> None:
    """Set a user attribute of a trial this process holds no `optuna.Trial` of (a queued one it withdraws): only
    `optuna.Trial` has a public setter."""
    storage_of(study).set_trial_user_attr(trial_id(trial), key, value)


def set_trial_system_attr(trial: optuna.Trial, key: str, value: Any) -> None:
    """Store a system attribute of a running trial (optuna-dashboard lists user attributes, and not these):
    `Trial.set_system_attr` is gone from Optuna's public API."""
    trial.storage.set_trial_system_attr(trial_id(trial), key, value)


def set_dashboard_constraints(trial: optuna.Trial, values: list[float]) -> None:
    """Store constraint values in the list optuna-dashboard reads (the system attribute samplers'
    `constraints_func` writes), which `Trial.set_constraint`'s named values do not reach; its key is private."""
    set_trial_system_attr(trial, DASHBOARD_CONSTRAINTS_KEY, values)


def study_system_attrs(study: optuna.Study) -> dict[str, Any]:
    """A study's system attributes (kept out of the dashboard's list of its user attributes): `Study.system_attrs`
    is gone from Optuna's public API."""
    return storage_of(study).get_study_system_attrs(study._study_id)


def set_study_system_attr(study: optuna.Study, key: str, value: Any) -> None:
    """Store a study system attribute (`study_system_attrs`): `Study.set_system_attr` is gone from Optuna's public
    API."""
    storage_of(study).set_study_system_attr(study._study_id, key, value)


def tpe_startup_trials(sampler: optuna.samplers.TPESampler) -> int:
    """The trials a TPE sampler draws at random before its model (`n_startup_trials`): the cost-cooled sampler
    weighs its own start-up draws by cost until then, and `TPESampler` keeps the number private."""
    return sampler._n_startup_trials


def save_trial_note(study: optuna.Study, trial: FrozenTrial, body: str) -> None:
    """optuna-dashboard's note (Markdown) on a finished trial. Its public `optuna_dashboard.save_note` takes a running
    `optuna.Trial`, which a finished trial has no more; a note is study system attributes either way, written here by
    the function `save_note` itself calls, which optuna-dashboard keeps private."""
    from optuna_dashboard._note import note_ver_key, save_note_with_version

    number = trial_id(trial)
    version = int(study_system_attrs(study).get(note_ver_key(number), 0)) + 1
    save_note_with_version(storage_of(study), study._study_id, number, version, body)
