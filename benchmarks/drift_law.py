"""How a family's drift grows with λ: the exponent p of drift ∝ λ^p, from stored studies.

Run from the repository root, on studies `tune` has run:

    .venv/bin/python -m benchmarks.drift_law /tmp/seed0/mlruns/optuna.db /tmp/grid/mlruns/optuna.db

Every trial stores its drift (mean 1 − cos of its document vectors to the uncalibrated ones) on each structure it
was scored on, pruned trials included. Within a family (every knob but λ) and a structure, each pair of λ gives
p = log(drift₂ / drift₁) / log(λ₂ / λ₁). λ bisection (`tuner.tuning.bisection.DRIFT_EXPONENTS`) relies on every
such p lying within its bounds: a λ its drift law puts over the limit is never probed. The report gives the
range of p, its median and how many pairs fall outside the bounds (0 is what the bisection assumes).
"""

from __future__ import annotations

import argparse
import itertools
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import optuna
from optuna.trial import FrozenTrial

from tuner.tuning.bisection import DRIFT_EXPONENTS, family, probe_of


@dataclass(frozen=True)
class Pair:
    """Two λ of one family on one structure and the exponent between their drifts."""

    family: str
    structure: str
    low: float
    high: float
    exponent: float


def pairs(trials: Iterable[FrozenTrial]) -> list[Pair]:
    """Every pair of distinct λ within a family (`tuner.tuning.bisection.family`) and structure that both measured a
    drift > 0 (λ 0, the baseline, and a surplus draw that never ran are no probes; a config met twice counts once)."""
    drifts: dict[tuple[str, str], dict[float, float]] = defaultdict(dict)
    for trial in trials:
        probe = probe_of(trial)  # reads the structures' rows as λ bisection does
        if probe is None:
            continue
        for structure, drift in probe.drift.items():
            if drift > 0:
                drifts[(family(trial), structure)][round(probe.strength, 6)] = drift
    found = []
    for (kin, structure), by_strength in sorted(drifts.items()):
        for (low, first), (high, second) in itertools.combinations(sorted(by_strength.items()), 2):
            found.append(Pair(kin, structure, low, high, math.log(second / first) / math.log(high / low)))
    return found


def report(found: Sequence[Pair], bounds: tuple[float, float] = DRIFT_EXPONENTS) -> str:
    """The range and median of the exponents, and the pairs outside `bounds`."""
    if not found:
        return "no family has drift measured at two λ"
    exponents = sorted(p.exponent for p in found)
    outside = [p for p in found if not bounds[0] <= p.exponent <= bounds[1]]
    lines = [
        f"{len(found)} pairs of λ in {len({p.family for p in found})} families, "
        f"{len({p.structure for p in found})} structures: "
        f"p from {exponents[0]:.2f} to {exponents[-1]:.2f}, median {statistics.median(exponents):.2f}; "
        f"{len(outside)} outside the bisection's bounds [{bounds[0]}, {bounds[1]}]",
    ]
    lines += [f"  outside: {p.structure} λ {p.low:g} → {p.high:g}: p {p.exponent:.2f}  {p.family}" for p in outside]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("storages", nargs="+", help="optuna.db files (or storage URLs) of studies to read")
    args = parser.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    trials: list[FrozenTrial] = []
    for storage in args.storages:
        url = storage if "://" in storage else f"sqlite:///{storage}"
        for name in optuna.get_all_study_names(url):
            trials += optuna.load_study(study_name=name, storage=url).get_trials(deepcopy=False)
    print(report(pairs(trials)))


if __name__ == "__main__":
    main()
