"""What a study will encode, priced before it starts: the estimate printed before a study, and its `--budget`.

The estimate is a probe on this device (`tuner.evaluation.cost`); `--budget` is resolved on it, as on a fresh machine
whatever the disk cache holds, and priced exactly once the coordinator has loaded its structures
(`tuner.tuning.trial.cost.TrialPricing`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace

from tuner.common.budget import StudyBudget, price_budget
from tuner.common.options import Budget
from tuner.data import PositionalDataset
from tuner.evaluation.cost import StudyCost, padded_tokens, probe
from tuner.evaluation.evaluator import Evaluator
from tuner.evaluation.pools import SCREEN_SHARE, most_passages
from tuner.tuning.search_space import GRIDS, PAPER_GRID, SearchSpace, depth_layers, grid_size
from tuner.tuning.settings import DEFAULT_TRIALS, TuneSettings

log = logging.getLogger(__name__)


def estimate_study(
    settings: TuneSettings,
    evaluator: Evaluator,
    heldout: list[PositionalDataset],
    general: PositionalDataset | None,
    structures: list[PositionalDataset],
    space: SearchSpace,
) -> tuple[StudyBudget | None, StudyCost]:
    """The coordinator's estimate of what the study will encode, and its `--budget` priced on it; both logged."""
    tuning = evaluator.dataset
    side = [general] if general is not None else []
    encoded = [s for s in structures if s.corpus != tuning.corpus]  # length halves reuse the tuning vectors
    screen = most_passages(tuning, settings.screen_queries) if settings.screens else 0
    cost = estimate_cost(
        evaluator,
        heldout,
        side,
        settings.profile_docs,
        encoded,
        settings.prune,
        screen if screen <= SCREEN_SHARE * len(tuning.corpus) else 0,
        [str(d) for d in GRIDS[settings.grid]["depth"]] if settings.grid else space.depths,
    )
    budget = resolve_budget(settings.budget, cost, evaluator)
    if budget is not None:
        cost = replace(cost, budget_layer_tokens=float(budget.study_allowance))
    for line in cost.describe(settings.trials, DEFAULT_TRIALS):
        log.info(line)
    return budget, cost


def estimate_cost(
    evaluator: Evaluator,
    heldout: list[PositionalDataset],
    side: list[PositionalDataset],
    profile_docs: int,
    structures: Sequence[PositionalDataset] = (),
    prune: bool = False,
    screen_passages: int = 0,
    depths: Sequence[str] = (),
) -> StudyCost:
    """What this run will encode, priced by a probe on this device (see `tuner.evaluation.cost`); a trial of
    one of `depths` resumes at the deepest cached layer at or before its first calibrated one."""
    model, batches = evaluator.model, evaluator.batches()
    tuning = evaluator.dataset
    once = padded_tokens(model, list(tuning.queries.values()))
    held = 0
    for h in heldout:  # uncalibrated, paper default and winner on each held-out corpus of its own
        if h.corpus != tuning.corpus:
            held += padded_tokens(model, list(h.corpus.values()))
    per_trial = rungs = 0
    first = (batches.tokens(), tuning.name)  # the cheapest corpus rung: the tuning passages or a structure
    for extra in [*side, *structures]:  # scored every trial beside the tuning split (general retrieval, structures)
        extra_tokens = padded_tokens(model, list(extra.corpus.values()))
        once += extra_tokens + padded_tokens(model, list(extra.queries.values()))
        per_trial += extra_tokens
        rungs += extra_tokens if prune and extra in structures else 0
        if extra in structures and extra_tokens < first[0]:
            first = (extra_tokens, extra.name)
    screen = batches.tokens() * screen_passages // max(len(tuning.corpus), 1)  # passages of average length
    return StudyCost(
        probe(model, batches),
        batches.count,
        batches.tokens(),
        batches.truncated,
        model.max_length,
        per_trial,
        once,
        model.num_layers,
        rungs,
        screen,
        profile_tokens=batches.tokens() * min(profile_docs, batches.count) // max(batches.count, 1),
        trial_layers=layers_run(evaluator, depths) if depths else None,
        heldout_tokens=held,
        heldout_queries=padded_tokens(model, [q for h in heldout for q in h.queries.values()]),
        first_rung_tokens=first[0],
        first_rung=first[1],
    )


def layers_run(evaluator: Evaluator, depths: Sequence[str]) -> float:
    """The layers a calibrated trial runs, averaged over `depths` (`Evaluator.layers_run`)."""
    total = evaluator.model.num_layers
    runs = [evaluator.layers_run(min(depth_layers(depth, total))) for depth in depths]
    return sum(runs) / len(runs)


def resolve_budget(budget: Budget | None, cost: StudyCost, evaluator: Evaluator) -> StudyBudget | None:
    """`--budget` in layer-tokens on this model and data, estimated before the baselines (`price_budget`; the
    coordinator prices it exactly once its structures are loaded, `TrialPricing.grid_cost`). A share of the grid
    is of the paper grid's study here: its 24 configs and the baseline, on every structure, unpruned, as
    `tune --grid paper` spends it."""
    if budget is None:
        return None
    grid_depths = [str(d) for d in PAPER_GRID["depth"]]
    grid = replace(cost, screen_tokens=0, trial_layers=layers_run(evaluator, grid_depths)).layer_tokens(
        1 + grid_size(PAPER_GRID)
    )
    return price_budget(budget, cost.setup_layer_tokens, grid - cost.setup_layer_tokens)
