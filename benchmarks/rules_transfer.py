"""Do the rules the tuner took from one model hold on another? Read from each model's stored studies.

Run from the repository root on studies `tune` has run, e.g. those `benchmarks.search_cost --keep` leaves:

    .venv/bin/python -m benchmarks.rules_transfer \\
        --studies minilm /tmp/minilm/robust-third-seed*/optuna.db \\
        --studies mpnet /tmp/mpnet/robust-third-seed*/optuna.db

Per model, over its studies' trials (repeats and unrun draws left out):

- which constraint each trial missed, complete or pruned (the drift limit, the no-reversal rule, the HM floor,
  nDCG@10), and how many pruned trials missed none (stopped as worse beyond noise than the selection threshold);
- which structure set the objective (the highest PSI) of each complete calibrated trial, and the rung order the
  studies scored (the least biased structure first, read from the uncalibrated model);
- the drift law's exponents within each family (`benchmarks.drift_law`) against λ bisection's bounds;
- where the paper default (trial 1) stands: feasible or not, and its worst-case PSI over the uncalibrated one's;
- the winners.

Writes docs/results/rules-transfer.json with `--json`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial, TrialState

from benchmarks import record
from benchmarks.drift_law import pairs
from tuner.common.trials import PRUNED_ATTR, counted, named_constraints
from tuner.tuning.bisection import DRIFT_EXPONENTS, family


@dataclass(frozen=True)
class Exponents:
    """The drift law's exponents p (drift ∝ λ^p) over every pair of λ within a family and structure."""

    pairs: int
    low: float | None
    median: float | None
    high: float | None
    outside: int  # pairs outside λ bisection's bounds
    outside_where_feasible: int  # of those, pairs in a family with a feasible λ: only there can a ceiling cut it


@dataclass(frozen=True)
class ModelRules:
    """What one model's studies say of each rule."""

    model: str
    studies: int
    trials: int
    complete: int
    pruned: int
    missed: dict[str, int]  # constraint name → trials (complete or pruned) that missed it
    pruned_as_worse: int  # pruned trials that missed no constraint: worse beyond noise than the threshold
    feasible: int  # complete calibrated trials that met every constraint
    worst_structure: dict[str, int]  # structure → complete calibrated trials whose objective it set
    rung_order: list[str]
    exponents: Exponents
    paper_default_feasible: int  # studies whose trial 1 (the paper default) met every constraint
    paper_default_psi_ratio: list[float]  # per study: trial 1's worst-case PSI ÷ trial 0's (uncalibrated)
    winners: list[str]


def _worst(trial: FrozenTrial) -> str | None:
    rows = trial.user_attrs.get("structures") or {}
    return max(rows, key=lambda name: rows[name]["psi"]) if rows else None


def _winner(study: optuna.Study) -> str:
    """The study's winner attribute up to its first colon: 'trial 2, CLS-Soft, λ 0.55 on layers [5] of 6, …', or why
    none."""
    return str(study.user_attrs.get("winner", "none")).removeprefix("Winner: ").split(":")[0]


def rules(model: str, studies: Sequence[optuna.Study]) -> ModelRules:
    """Every figure of `ModelRules` for one model's studies."""
    trials = [t for s in studies for t in s.get_trials(deepcopy=False) if counted(t) and t.state != TrialState.RUNNING]
    calibrated = [t for t in trials if float(t.params.get("strength", 0.0)) > 0]
    missed: Counter[str] = Counter()
    worse = feasible_trials = 0
    feasible_families: set[str] = set()
    for t in calibrated:
        names = [name for name, value in named_constraints(t).items() if value > 0]
        missed.update(names)
        worse += t.state == TrialState.PRUNED and PRUNED_ATTR in t.user_attrs and not names
        if t.state == TrialState.COMPLETE and not names:
            feasible_trials += 1
            feasible_families.add(family(t))
    complete = [t for t in calibrated if t.state == TrialState.COMPLETE]
    worst = Counter(w for t in complete if (w := _worst(t)) is not None)
    order = next((list(t.user_attrs["structures"]) for t in complete if t.user_attrs.get("structures")), [])
    found = pairs(trials)
    exponents = sorted(p.exponent for p in found)
    low, high = DRIFT_EXPONENTS
    outside = [p for p in found if not low <= p.exponent <= high]
    ratios, feasible = [], 0
    for study in studies:
        by_number = {t.number: t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))}
        if 0 in by_number and 1 in by_number:
            ratios.append(by_number[1].values[0] / by_number[0].values[0])
            feasible += all(v <= 0 for v in named_constraints(by_number[1]).values())
    return ModelRules(
        model=model,
        studies=len(studies),
        trials=len(calibrated),
        complete=len(complete),
        pruned=sum(t.state == TrialState.PRUNED for t in calibrated),
        missed=dict(sorted(missed.items())),
        pruned_as_worse=worse,
        feasible=feasible_trials,
        worst_structure=dict(worst.most_common()),
        rung_order=order,
        exponents=Exponents(
            len(found),
            exponents[0] if exponents else None,
            statistics.median(exponents) if exponents else None,
            exponents[-1] if exponents else None,
            len(outside),
            sum(p.family in feasible_families for p in outside),
        ),
        paper_default_feasible=feasible,
        paper_default_psi_ratio=ratios,
        winners=[_winner(s) for s in studies],
    )


def load(paths: Sequence[str]) -> list[optuna.Study]:
    studies = []
    for path in paths:
        url = path if "://" in path else f"sqlite:///{path}"
        studies += [optuna.load_study(study_name=name, storage=url) for name in optuna.get_all_study_names(url)]
    return studies


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--studies",
        nargs="+",
        action="append",
        required=True,
        metavar="MODEL STORAGE",
        help="a model's name, then its studies",
    )
    parser.add_argument("--json", type=Path, help="write the record here (docs/results/rules-transfer.json)")
    args = parser.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    found = [rules(model, load(paths)) for model, *paths in args.studies]
    results = {"drift_exponent_bounds": list(DRIFT_EXPONENTS), "models": [asdict(r) for r in found]}
    for r in results["models"]:
        print(r)
    if args.json:
        record.write(
            args.json,
            "rules_transfer",
            "python -m benchmarks.rules_transfer " + " ".join(sys.argv[1:] if argv is None else argv),
            results,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
