"""The trial objective a process runs, built from its session: the pooled screen, the tuning structures and the
general set beside the tuning split, each with its uncalibrated baseline measured here, and what its trials may
spend."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

from objectives import Constraints
from tuner.common.budget import StudyBudget, await_priced, describe_budget, price_budget, store_study_budget
from tuner.data import PositionalDataset
from tuner.engine.models import LoadedModel
from tuner.evaluation.evaluator import Evaluator
from tuner.evaluation.pools import SCREEN_SHARE, pool
from tuner.tracking.progress import Phase
from tuner.tuning.search_space import PAPER_GRID
from tuner.tuning.session import Session
from tuner.tuning.settings import TuneSettings
from tuner.tuning.trial.objective import TrialObjective
from tuner.tuning.trial.scoring import SideSet

log = logging.getLogger(__name__)


def build_objective(session: Session, constraints: Constraints, staging: Path) -> TrialObjective:
    """The trial objective of this process, its side sets' baselines measured."""
    settings, model, evaluator = session.settings, session.model, session.evaluator
    return TrialObjective(
        evaluator,
        session.space,
        constraints,
        session.tracker,
        session.name,
        staging,
        pareto=settings.pareto,
        general=_side_set(model, settings, session.general, cache_budget=0),  # short documents
        structures=_structure_sides(session),
        screen=_screen(session),
        profile_docs=settings.profile_docs,
        selection=settings.selection,
        prune=settings.prune,
        bisect=settings.bisect,
        repeat_limit=settings.trials,
    )


def _structure_sides(session: Session) -> list[SideSet]:
    """The tuning structures as rungs of every trial, each with its uncalibrated baseline measured here. A structure
    over a corpus of its own (crops, openings, packed passages) is encoded for it, which can take as long as a trial:
    a phase of its own, said as it starts and ends. One over the tuning corpus (a length half) encodes nothing."""
    settings, model, evaluator, tuning = session.settings, session.model, session.evaluator, session.tuning
    own = [s for s in session.structures if s.corpus != tuning.corpus]
    sides = []
    for structure in session.structures:
        if structure.corpus == tuning.corpus:
            sides.append(SideSet(_evaluator(model, settings, structure, cache_budget=0), shares=evaluator))
            continue
        number = next(i for i, s in enumerate(own, 1) if s is structure)
        with Phase(
            f"structure {number}/{len(own)}: encoding {structure.name} uncalibrated ({len(structure.corpus)} passages)"
        ):
            prefix, budget = evaluator.cache.prefix_layers, settings.cache_budget
            sides.append(SideSet(_evaluator(model, settings, structure, prefix_layers=prefix, cache_budget=budget)))
    return sides


def _screen(session: Session) -> SideSet | None:
    """The pooled screen of the tuning split (`tuner.evaluation.pools`), when the study prunes and the pool is
    at most `SCREEN_SHARE` of the corpus (a larger one would cost nearly what it saves). Built from the
    uncalibrated ranking, which every process measures alike, so workers and resumed runs share one pool."""
    settings, evaluator = session.settings, session.evaluator
    if not settings.screens:
        return None
    pooled = pool(session.tuning, [evaluator.run(None).run], per_group=settings.screen_queries)
    share = len(pooled.corpus) / len(session.tuning.corpus)
    if share > SCREEN_SHARE:
        if not settings.worker:
            log.info(
                "no pooled screen: a pool of %d queries would hold %.0f%% of %s's passages",
                len(pooled.queries),
                100 * share,
                session.tuning.name,
            )
        return None
    if not settings.worker:
        log.info(
            "pooled screen: %d queries over %d of %s's %d passages (%.0f%%), scored first in every trial",
            len(pooled.queries),
            len(pooled.corpus),
            session.tuning.name,
            len(session.tuning.corpus),
            100 * share,
        )
    return SideSet(
        _evaluator(
            session.model,
            settings,
            pooled,
            prefix_layers=evaluator.cache.prefix_layers,
            cache_budget=settings.cache_budget,
        )
    )


def _side_set(
    model: LoadedModel, settings: TuneSettings, dataset: PositionalDataset | None, **cache: Any
) -> SideSet | None:
    """A set scored beside the tuning split every trial, with its uncalibrated scores measured once."""
    if dataset is None:
        return None
    return SideSet(_evaluator(model, settings, dataset, **cache))


def _evaluator(model: LoadedModel, settings: TuneSettings, dataset: PositionalDataset, **cache: Any) -> Evaluator:
    return Evaluator(model, dataset, settings.batch_size, batch_tokens=settings.batch_tokens, **cache)


def trial_allowance(session: Session, objective: TrialObjective, budget: StudyBudget | None) -> int | None:
    """What the study's trials may spend (None: no budget). The coordinator prices its `--budget` exactly on its
    loaded structures, with each depth's cost, and stores it; a worker waits for that price."""
    settings, study = session.settings, session.study
    if budget and settings.budget is not None and not settings.worker:
        pricing = objective.pricing
        budget = replace(
            price_budget(settings.budget, budget.setup_cost, pricing.grid_cost(PAPER_GRID)),
            depth_costs=pricing.depth_costs(),
        )
        store_study_budget(study, budget)
        log.info(describe_budget(budget))
    elif budget:  # a worker: the coordinator's exact price, once it has set it
        budget = await_priced(study)
    return budget.trial_allowance if budget else None
