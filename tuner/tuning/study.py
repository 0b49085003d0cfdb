"""Opening the study: created, or resumed with the settings it was created with, and described for optuna-dashboard.

The study calls an objective and knows nothing of models, MLflow or YAML. Constraints are Optuna's own: the
objective stores each trial's values (≤ 0 is feasible) where every sampler (TPE, GP, NSGA-II) reads them to prefer
feasible regions (`tuner.tuning.trial.record.set_constraints`). The trial loop is `tuner.tuning.study_loop`; the
trials selection reads, and the winner, are `tuner.tuning.candidates`.
"""

from __future__ import annotations

import warnings
import zlib
from collections.abc import Mapping, Sequence
from typing import Literal

import numpy as np
import optuna
from optuna.exceptions import ExperimentalWarning
from optuna.trial import FrozenTrial, TrialState

from objectives import Constraints
from objectives.constraint import describe_aim
from tuner.common.files import JOURNAL, sqlite_file, storage_file
from tuner.common.options import HEARTBEAT_SECONDS, SAMPLERS
from tuner.tuning.sampler import make_sampler
from tuner.tuning.storage import make_storage


class StudyMismatchError(ValueError):
    """A stored study of this name was made for another model, dataset or objective."""


WINNER_ATTR = "winner"  # the study attribute naming the exported winner: first among the study's attributes
DASHBOARD_BEST_ATTR = "best trial in optuna-dashboard"
DASHBOARD_BEST = (
    "optuna-dashboard's 'Best Trial' is the lowest value (worst-case PSI) of all complete trials, feasible or not "
    "(it does not read constraints there, nor the one-SE rule); the exported winner is `winner` above, each trial's "
    "`feasible` says yes or NO and why, and infeasible trials are grey in the dashboard's plots"
)


def mark_winner_first(study: optuna.Study) -> None:
    """Give a study its `winner` attribute and the note on the dashboard's Best Trial before any other: the
    dashboard lists a study's attributes in the order they were created, and the conclusion only updates them."""
    attrs = study.user_attrs
    for key, value in ((WINNER_ATTR, "none yet: the study is running"), (DASHBOARD_BEST_ATTR, DASHBOARD_BEST)):
        if attrs.get(key) is None or (key == DASHBOARD_BEST_ATTR and attrs[key] != value):
            study.set_user_attr(key, value)


def describe_study(
    study: optuna.Study, pareto: bool, constraints: Constraints, checked: Sequence[str], structures: bool
) -> None:
    """Name the objectives and explain the study for optuna-dashboard (user attributes are shown there): its aim and
    each constraint in force (`checked`) with its limit, from the constraint list (`objectives.constraint`)."""
    with warnings.catch_warnings():  # "experimental" since Optuna 3.2, and what optuna-dashboard reads
        warnings.simplefilter("ignore", ExperimentalWarning)
        # the objective, as the dashboard's plots and Best Trial name it
        psi = "worst-case PSI" if structures else "PSI"
        study.set_metric_names([psi, "HM"] if pareto else [psi])
    explanations = {
        "objective": describe_aim(pareto, structures)
        + " subject to the constraints; PSI = 1 - min/max of nDCG@10 over the "
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
            f"no study store at {database.resolve()}, so no study {name!r}: run `tune` here first, change to the "
            "folder that holds mlruns/, or pass --storage sqlite:///PATH/mlruns/optuna.db"
        )
    journal = storage_file(storage) if storage.startswith(JOURNAL) else None
    if journal is not None and not journal.is_file():
        raise ValueError(
            f"no journal at {journal}, so no study {name!r}: check the path after journal: (the file `tune` was given)"
        )
    try:
        return optuna.load_study(study_name=name, storage=make_storage(storage))
    except KeyError:
        raise ValueError(
            f"no study {name!r} in {storage}; see the study names in `tune ui` or the tune output"
        ) from None


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
        study_name=name,
        storage=make_storage(storage, heartbeat),
        sampler=sampler,
        directions=directions,
        load_if_exists=True,
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
        fixed_params(t) == params and all(t.user_attrs.get(k) == v for k, v in attrs.items())
        for t in study.get_trials(deepcopy=False)
    ):
        study.enqueue_trial(params, user_attrs=attrs or None)


def fixed_params(trial: FrozenTrial) -> dict[str, object]:
    """The parameters a trial runs with: its fixed ones while it waits in the queue, else those it drew."""
    return trial.system_attrs.get("fixed_params") or trial.params


def sampler_seed(seed: int, worker: str) -> int:
    """The seed of one process's sampler: the study seed itself for the coordinator (worker "0"), and for
    every other worker a seed derived from the study seed and the worker's identity, so that workers draw
    different trials (reproducibly, for local workers numbered 1, 2, ...)."""
    if worker == "0":
        return seed
    return int(np.random.SeedSequence([seed, zlib.crc32(worker.encode())]).generate_state(1)[0])
