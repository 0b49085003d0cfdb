"""A study prepared: model and data there and loaded, storage and tracking opened, the study created or resumed
(the data is `tuner.tuning.study_data`'s, the study `tuner.tuning.session_study`'s).

Both the coordinating `tune` and every worker start from the same `Session` (`prepare`); what they do
with it is `tuner.tuning.coordinator`'s and `tuner.tuning.worker`'s.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import optuna

from objectives import Constraints
from tuner.common.scratch import clean_orphans
from tuner.data import PositionalDataset, is_crops
from tuner.engine.models import LoadedModel, load_model
from tuner.evaluation.cost import StudyCost
from tuner.evaluation.evaluator import Evaluator
from tuner.tracking.runs import Tracker
from tuner.tuning.estimate import estimate_study
from tuner.tuning.search_space import GRIDS, SearchSpace
from tuner.tuning.session_study import open_session_study, study_identity
from tuner.tuning.settings import EXPERIMENT, TuneSettings
from tuner.tuning.storage import check_storage_url, default_storage
from tuner.tuning.study_data import (
    check_available,
    load_datasets,
    require_groups,
    split_datasets,
    tuning_structures,
    within_model_reach,
)

log = logging.getLogger(__name__)


def _fitting_space(space: SearchSpace, evaluator: Evaluator) -> SearchSpace:
    """Drop basket sizes that no passage of the tuning data fills (trials that could only repeat the baseline)."""
    longest = evaluator.longest_content()
    fitting = space.fitting(longest)
    if fitting != space:
        dropped = sorted(set(space.basket_sizes) - set(fitting.basket_sizes))
        log.info("basket sizes %s dropped from the search: the longest passage has %d content tokens", dropped, longest)
    return fitting


@dataclass(frozen=True)
class Session:
    """Everything a study's coordinator and its workers share, prepared once per process."""

    settings: TuneSettings
    tracker: Tracker
    storage: str
    model: LoadedModel
    tuning: PositionalDataset
    heldout: list[PositionalDataset]
    evaluator: Evaluator
    space: SearchSpace
    general: PositionalDataset | None
    structures: list[PositionalDataset]  # the tuning passages in other structures: every trial's later rungs
    name: str
    identity: dict[str, object]
    study: optuna.Study
    cost: StudyCost | None = None  # the estimate printed before the study (the coordinator's; a worker has none)

    def in_force(self, constraints: Constraints) -> tuple[str, ...]:
        """The constraints this study checks (`Constraints.in_force`), given the structures and sets it scores."""
        return constraints.in_force(
            structures=bool(self.structures),
            crops=any(is_crops(s) for s in self.structures),
            general=self.general is not None,
        )


def prepare(settings: TuneSettings) -> Session:
    """Check, load and open what a study needs; a missing model or dataset, an unreachable tracking server
    or a malformed storage URL fails here, before any work."""
    check_available(settings)  # a missing model or dataset fails here, before anything is loaded or written
    tuning, heldout, general = load_datasets(settings)  # so does a broken dataset (read before the model loads)
    tracker = Tracker(settings.tracking_uri, EXPERIMENT)  # an unreachable server fails here; a store is made later
    storage = settings.storage or default_storage()
    check_storage_url(storage)  # a malformed URL fails here too; the database is created with the study
    clean_orphans()  # temporary folders of killed runs
    model = _load_model(settings)
    tuning, heldout = within_model_reach(tuning, heldout, model)
    require_groups(tuning, heldout)  # again: queries past the model's reach are gone, and no store exists yet
    evaluator = Evaluator(
        model,
        tuning,
        settings.batch_size,
        show_progress=sys.stderr.isatty() and not settings.worker,
        batch_tokens=settings.batch_tokens,
        cache_budget=settings.cache_budget,
        prefix_layers=settings.space.starting_layers(model.num_layers),
    )
    space = _fitting_space(settings.space, evaluator)
    if settings.grid is not None:
        # a basket no passage fills was dropped: the grid cannot run as the paper's
        space.check_grid(GRIDS[settings.grid])
    structures = tuning_structures(settings, tuning, model)
    budget, cost = (
        (None, None) if settings.worker else estimate_study(settings, evaluator, heldout, general, structures, space)
    )
    name = settings.study_name_for(model)
    identity = study_identity(settings, model, tuning, general, structures, space)
    study = open_session_study(settings, name, storage, identity, budget)
    return Session(
        settings,
        tracker,
        storage,
        model,
        tuning,
        heldout,
        evaluator,
        space,
        general,
        structures,
        name,
        identity,
        study,
        cost,
    )


def reload_tuned(
    settings: TuneSettings, attrs: Mapping[str, Any]
) -> tuple[LoadedModel, PositionalDataset, list[PositionalDataset]]:
    """The model and the tuning and held-out sets of a stored study (its attributes `attrs`, its `settings`), loaded as
    `tune` loaded them: the recorded revision, each set within the model's reach; one that changed since is named."""
    model = _load_model(settings)
    if model.revision != attrs["revision"]:
        raise ValueError(
            f"study {settings.study_name!r} tuned {attrs['model']} at revision {attrs['revision']}, "
            f"but {model.revision} loaded; restore that revision locally to re-export"
        )
    tuning, heldout = split_datasets(settings)
    tuning, heldout = within_model_reach(tuning, heldout, model)  # as `tune` scored them
    if tuning.fingerprint() != attrs["dataset_fingerprint"]:
        raise ValueError(
            f"dataset {settings.dataset!r} changed since study {settings.study_name!r} ran (fingerprint differs)"
        )
    return model, tuning, heldout


def _load_model(settings: TuneSettings) -> LoadedModel:
    """The model as the settings name it (its revision, pooling and padding side, remote code if allowed)."""
    return load_model(
        settings.model,
        revision=settings.revision,
        trust_remote_code=settings.trust_remote_code,
        pooling=settings.pooling,  # type: ignore[arg-type]
        padding_side=settings.padding_side,  # type: ignore[arg-type]
    )
