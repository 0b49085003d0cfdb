"""The study a session opens: its identity (what a resumed study must match), the study created or resumed with it,
and what the coordinator records on it for the run (the budget, the selection rule, the sampler)."""

from __future__ import annotations

import optuna

from tuner.common.budget import StudyBudget, store_study_budget
from tuner.common.trials import SAMPLER_ATTR, SELECTION_ATTR
from tuner.data import PositionalDataset
from tuner.engine.models import LoadedModel
from tuner.tuning.search_space import GRIDS, SearchSpace
from tuner.tuning.settings import TuneSettings, process_identity
from tuner.tuning.study import open_study


def study_identity(
    settings: TuneSettings,
    model: LoadedModel,
    tuning: PositionalDataset,
    general: PositionalDataset | None,
    structures: list[PositionalDataset],
    space: SearchSpace,
) -> dict[str, object]:
    """What a resumed study must match (`open_study`): the model, the data, the constraints, the space."""
    return {
        "model_name": settings.model,
        "pooling": model.spec.pooling,
        # as given (None: the model's own), so studies made without it still resume
        "padding_side": settings.padding_side,
        "dataset_name": settings.dataset,
        "model": model.spec.source,
        "revision": model.revision,
        "dataset": tuning.name,
        "dataset_fingerprint": tuning.fingerprint(),
        "hm_floor": settings.hm_floor,
        "max_ndcg_drop": settings.max_ndcg_drop,
        "max_crops_psi": settings.max_crops_psi,
        "max_reversal": settings.max_reversal,
        "max_drift": settings.max_drift,
        "structures": [s.name for s in structures],
        "general": settings.general,
        "general_fingerprint": general.fingerprint() if general is not None else None,
        "max_general_drop": settings.max_general_drop,
        "space": space.as_dict(),
        "pareto": settings.pareto,
        "seed": settings.seed,
        "grid": settings.grid,
        "prune": settings.prune,
        "bisect": settings.bisect,
        "screen_queries": settings.screen_queries,
    }


def open_session_study(
    settings: TuneSettings, name: str, storage: str, identity: dict[str, object], budget: StudyBudget | None
) -> optuna.Study:
    """Create or resume the study (`open_study`) with this process's sampler seed, and, on the coordinator, record the
    run's budget, selection rule and sampler on it."""
    study = open_study(
        name,
        storage,
        seed=settings.seed,
        pareto=settings.pareto,
        identity=identity,
        heartbeat=settings.heartbeat,
        worker=process_identity(settings),
        grid=GRIDS[settings.grid] if settings.grid else None,
        sampler_name=settings.sampler,
    )
    if not settings.worker:  # workers read it from the study: a resume without --budget lifts it
        store_study_budget(study, budget)
        study.set_user_attr(SELECTION_ATTR, settings.selection)  # the rule `tune export` names the winner by
        study.set_user_attr(SAMPLER_ATTR, settings.sampler)  # how the latest session drew its trials
    return study
