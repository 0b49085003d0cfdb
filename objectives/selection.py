"""Which trial wins: a noise-aware choice among the feasible trials.

The tuning split is small, so two configs whose objective differs by less than its sampling noise are
not told apart by it; the lower value is then as likely luck as merit. The default rule is the
one-standard-error rule (Breiman et al., 1984; Hastie et al., *Elements of Statistical Learning* §7.10):
among the feasible trials whose objective is within one bootstrap standard error of the best one, take
the one that changes the model least, measured by how far it moves the document vectors away from the
uncalibrated ones (`drift`). A milder calibration that is as fair on the tuning split is the one that
over-corrects least on passages built differently.

"Within one standard error" is judged pair by pair where the trials carry their objective on the common
query resamples (every trial is scored on the same resampled queries, `objectives.evidence`): a candidate is
eligible when its objective exceeds the best one's by at most the standard deviation of the difference
between the two over those resamples. Two configs scored on the same queries share most of their noise
(which queries are hard, which passages are long), so the noise *between* them is smaller than either
one's own, which would admit clearly worse trials as "indistinguishable". Trials recorded without resamples fall
back to the best one's own standard error.

Within that band the rules differ only in their tie-break: `one-se` takes the mildest (least drift),
`one-se-fairest` the fairest on the mean over the tuning structures (the objective is their worst case, so the
mean is the evidence the objective leaves unused), `one-se-hm` the most accurate (highest HM). `lowest` takes
the lowest objective with no band. `benchmarks/selection_rules.py` scores each rule's choices held out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

import numpy as np

Rule = Literal["one-se", "one-se-fairest", "one-se-hm", "lowest"]
RULES: tuple[str, ...] = ("one-se", "one-se-fairest", "one-se-hm", "lowest")


@dataclass(frozen=True)
class Candidate:
    """One finished trial as selection sees it.

    `objective` is what the study minimises and `objective_se` its bootstrap standard error over the
    tuning queries; `drift` is the mean 1 − cosine between the trial's document vectors and the
    uncalibrated ones (0 for no calibration); `constraints` follow Optuna's convention (≤ 0 satisfied);
    `hm` breaks what ties remain. `resamples` is the objective on each common query resample (None: not
    recorded), from which selection takes the noise between two candidates. `mean_psi` is the mean PSI over the
    tuning structures (NaN: not recorded; the objective stands in for it).
    """

    trial_number: int
    objective: float
    objective_se: float
    drift: float
    constraints: tuple[float, ...]
    hm: float = 0.0
    resamples: tuple[float, ...] | None = None
    mean_psi: float = float("nan")

    @property
    def fairness_on_average(self) -> float:
        """The mean PSI over the tuning structures, or the objective where that was not recorded."""
        return self.mean_psi if math.isfinite(self.mean_psi) else self.objective

    @property
    def feasible(self) -> bool:
        return all(value <= 0 for value in self.constraints)


@dataclass(frozen=True)
class Selection:
    """The winner, and enough of the reasoning to report it: the rule, the best trial and the threshold.

    `threshold` is the best objective plus its own standard error: the bound of the unpaired rule. Pairing can
    admit a little above it (the spread of a difference is at most the sum of the two spreads), so pruning,
    which compares a trial less its own standard error with it, never stops a trial pairing would admit.
    `paired` says whether eligibility was judged pair by pair.
    """

    rule: str
    winner: Candidate
    best: Candidate
    threshold: float
    eligible: tuple[int, ...]
    paired: bool = False

    def describe(self) -> str:
        """One sentence for logs, MLflow and the exported YAML: 'trial 2: the mildest …'."""
        return f"trial {self.winner.trial_number}: {self.reason()}"

    def reason(self) -> str:
        """Why the winner won, without naming it (for a sentence that already does)."""
        if self.rule == "chosen":
            return "chosen by the user (tune export --trial), not by a selection rule"
        if self.rule == "lowest":
            return f"the feasible trial with the lowest objective ({self.winner.objective:.4f})"
        figure = {
            "one-se": self.winner.drift,
            "one-se-fairest": self.winner.fairness_on_average,
            "one-se-hm": self.winner.hm,
        }
        chosen_as, measure, _ = TIE_BREAK_WORDS[self.rule]
        mildest = f"{chosen_as} ({measure} {figure[self.rule]:.4f}) of the feasible trials {list(self.eligible)}"
        if self.paired:
            return (
                f"{mildest} whose objective is within one paired standard error of the best "
                f"(trial {self.best.trial_number}: {self.best.objective:.4f}; "
                "the spread of each trial's difference from it over the common query resamples)"
            )
        return (
            f"{mildest} whose objective is within one standard error of the best "
            f"(trial {self.best.trial_number}: {self.best.objective:.4f} + {self.best.objective_se:.4f} "
            f"= {self.threshold:.4f})"
        )


def chosen(candidate: Candidate) -> Selection:
    """A trial the user named, exported as it is: the record says no rule picked it."""
    return Selection("chosen", candidate, candidate, candidate.objective, (candidate.trial_number,))


def select(candidates: Iterable[Candidate], rule: Rule = "one-se") -> Selection | None:
    """The winning candidate under `rule`; None when no candidate is feasible (keep the model uncalibrated).

    `lowest`: the lowest objective (ties: lower drift, higher HM, then the earlier trial). Among the candidates
    within one standard error of the lowest objective (the paired one, `paired_se`, where both candidates carry
    resamples): `one-se` the lowest drift, `one-se-fairest` the lowest mean PSI over the structures, `one-se-hm`
    the highest HM (ties: lower drift, lower objective, then the earlier trial). A candidate with a non-finite
    objective never wins.
    """
    if rule not in RULES:
        raise ValueError(f"unknown selection rule {rule!r}; choose one of {', '.join(RULES)}")
    feasible = [c for c in candidates if c.feasible and math.isfinite(c.objective)]
    if not feasible:
        return None
    best = min(feasible, key=lambda c: (c.objective, c.drift, -c.hm, c.trial_number))
    if rule == "lowest":
        return Selection(rule, best, best, best.objective, (best.trial_number,))
    se = best.objective_se if math.isfinite(best.objective_se) else 0.0
    threshold = best.objective + se
    between = {c.trial_number: paired_se(c, best) for c in feasible}
    paired = all(value is not None for value in between.values())

    def margin(candidate: Candidate) -> float:
        value = between[candidate.trial_number]
        return se if value is None else value

    eligible = sorted((c for c in feasible if c.objective - best.objective <= margin(c)), key=lambda c: c.trial_number)
    winner = min(eligible, key=TIE_BREAKS[rule])
    return Selection(rule, winner, best, threshold, tuple(c.trial_number for c in eligible), paired)


TIE_BREAK_WORDS: dict[str, tuple[str, str, str]] = {
    "one-se": ("the mildest", "drift", "the least drift of the document vectors from the uncalibrated ones"),
    "one-se-fairest": (
        "the fairest on average over the structures",
        "mean PSI",
        "the lowest mean PSI over the tuning structures",
    ),
    "one-se-hm": ("the most accurate", "HM", "the highest HM"),
}
"""Each one-SE rule's winner in words, the figure `TIE_BREAKS` orders it by, and that order in words: what
`Selection.reason` says of a winner and `describe_selection_rule` of the rule."""


def describe_selection_rule(rule: str) -> str:
    """The rule itself in one sentence, without a study's numbers: for the places that explain it before any winner
    exists (MLflow's experiment description)."""
    if rule == "lowest":
        return "the feasible trial with the lowest objective"
    chosen_as, _, order = TIE_BREAK_WORDS[rule]
    return (
        "among the feasible trials whose objective is within one standard error of the lowest "
        f"(the paired one, over the common query resamples), {chosen_as}: {order}"
    )


TIE_BREAKS: dict[str, Callable[[Candidate], tuple[float, ...]]] = {
    "one-se": lambda c: (c.drift, c.objective, -c.hm, c.trial_number),
    "one-se-fairest": lambda c: (c.fairness_on_average, c.drift, c.objective, c.trial_number),
    "one-se-hm": lambda c: (-c.hm, c.drift, c.objective, c.trial_number),
}
"""How each one-SE rule orders the candidates within the band (the first wins)."""


def paired_se(candidate: Candidate, best: Candidate) -> float | None:
    """The standard deviation of candidate − best over the common resamples both carry (None: either lacks them,
    or fewer than two resamples are defined for both). 0 for a candidate against itself."""
    if candidate.resamples is None or best.resamples is None or len(candidate.resamples) != len(best.resamples):
        return None
    difference = np.asarray(candidate.resamples, dtype=float) - np.asarray(best.resamples, dtype=float)
    difference = difference[np.isfinite(difference)]
    return float(np.std(difference)) if difference.size >= 2 else None
