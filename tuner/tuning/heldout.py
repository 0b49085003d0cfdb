"""The summary's rows: no calibration, the paper's default and the winner, each scored on the tuning split and on
every held-out set, with its change against no calibration there."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

import optuna

from objectives import PairedBootstrap, PositionProfile, PositionReport, paired_bootstrap, position_profile
from tuner.calibration import CalibrationConfig
from tuner.data import PositionalDataset
from tuner.engine.models import LoadedModel
from tuner.engine.prefix import starting_layers
from tuner.evaluation.evaluator import Evaluation, Evaluator
from tuner.tracking.progress import Phase
from tuner.tuning.search_space import PAPER_DEFAULT_PARAMS, is_reference_trial, trial_config
from tuner.tuning.settings import TuneSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HeldOut:
    """A config on one held-out set, and its change against no calibration there (None for the baseline)."""

    report: PositionReport
    delta: PairedBootstrap | None
    layer_tokens: int = 0  # what scoring it cost (`Batches.layer_tokens`)
    profile: PositionProfile | None = None  # nDCG@10 per position group and the tilt, with intervals


@dataclass(frozen=True)
class SummaryRow:
    """One line of the summary: a config's tuning-split report and its comparison on each held-out set."""

    label: str
    trial: int | None
    config: CalibrationConfig | None
    tuning: PositionReport
    heldout: dict[str, HeldOut] = field(default_factory=dict)

    @property
    def heldout_layer_tokens(self) -> int:
        return sum(held.layer_tokens for held in self.heldout.values())


def config_of(trial: optuna.trial.FrozenTrial, model: LoadedModel) -> CalibrationConfig:
    return trial_config(trial, model.spec.pooling, model.spec.padding_side)


def trial_with(study: optuna.Study, reference: dict[str, object]) -> optuna.trial.FrozenTrial | None:
    return next((t for t in study.trials if is_reference_trial(t, reference) and "hm" in t.user_attrs), None)


def summary_rows(
    study: optuna.Study,
    best: optuna.trial.FrozenTrial,
    evaluator: Evaluator,
    heldout: list[PositionalDataset],
    settings: TuneSettings,
) -> list[SummaryRow]:
    """No calibration, the paper's default, and the winner; held-out figures with bootstrap intervals."""
    model = evaluator.model
    entries: list[tuple[str, optuna.trial.FrozenTrial | None]] = [("No calibration", None)]
    default = trial_with(study, PAPER_DEFAULT_PARAMS)
    if default is not None and default.number != best.number:
        entries.append(("Paper default", default))
    entries.append((f"Winner (trial {best.number})", best))
    configs = [(label, trial, config_of(trial, model) if trial is not None else None) for label, trial in entries]
    starts = starting_layers((c for _, _, c in configs), model.num_layers)
    held: dict[str, dict[str, HeldOut]] = {label: {} for label, _, _ in configs}
    for number, dataset in enumerate(heldout, 1):
        with Phase(
            f"held-out {number}/{len(heldout)}: scoring {len(configs)} configs on {dataset.name} "
            f"({len(dataset.corpus)} documents, {len(dataset.queries)} queries)"
        ):
            scorer = _held_out_scorer(evaluator, dataset, starts, settings)
            baseline = scorer(None)
            for label, _, config in configs:
                result = scorer(config) if config is not None else baseline
                delta = (
                    paired_bootstrap(baseline.per_query, result.per_query, settings.bootstrap, settings.seed)
                    if config
                    else None
                )
                held[label][dataset.name] = HeldOut(
                    result.report,
                    delta,
                    result.layer_tokens if config is not None else baseline.layer_tokens,
                    position_profile(result.per_query, settings.bootstrap, settings.seed),
                )
                log.info(
                    "held-out %s: %s scored (%s)",
                    dataset.name,
                    label,
                    delta.summary() if delta else f"nDCG@10 {100 * result.report.ndcg10:.2f}",
                )
    return [
        SummaryRow(label, trial.number if trial else None, config, evaluator.run(config).report, held[label])
        for label, trial, config in configs
    ]


def _held_out_scorer(
    evaluator: Evaluator, dataset: PositionalDataset, starts: Sequence[int], settings: TuneSettings
) -> Callable[[CalibrationConfig | None], Evaluation]:
    """Scores on a held-out set. A held-out part of the tuning corpus (FineWeb-PosQ's) reuses the tuning
    vectors; another corpus gets its own evaluator, whose baseline pass records the inputs of the layers
    where the configs start calibrating, so each config resumes there. Those inputs are gone with the evaluator:
    each study scores a held-out set with a few configs once, and the vectors it keeps serve the next."""
    if dataset.corpus == evaluator.dataset.corpus:
        scorer = Evaluator(
            evaluator.model, dataset, evaluator.batch_size, batch_tokens=settings.batch_tokens, cache_budget=0
        )
        return partial(scorer.run_over, evaluator)
    own = Evaluator(
        evaluator.model,
        dataset,
        settings.batch_size,
        show_progress=sys.stderr.isatty(),
        batch_tokens=settings.batch_tokens,
        prefix_layers=starts,
        keep_on_disk=True,
        keep_layer_inputs=False,
    )
    return own.run
