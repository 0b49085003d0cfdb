"""One truth for feasibility: every sentence about the constraints (the study's rule, a trial's feasibility, the
console line, the nothing-feasible message, the PSI–HM scatter) is built from the constraint list in force, names each
constraint checked and no other, and states figures that are the constraint values' own."""

from __future__ import annotations

import itertools
import logging

import optuna
import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState

from objectives import Constraints
from objectives.constraint import CONSTRAINTS, REQUIREMENTS, describe_rule, outcome
from tuner.tracking.display import display_metrics, experiment_note
from tuner.tracking.plots import scatter_points
from tuner.tracking.progress import StudyProgress
from tuner.tuning.progress_log import log_trial

FLOOR, HM, HM_LOW = 0.5531, 0.5552, 0.5395  # point HM above the floor, lower bound below


def named(sentence: str) -> set[str]:
    """The constraints a sentence names: by title ('the drift limit') or by the outcome of missing it."""
    return {r.name for r in CONSTRAINTS if r.title in sentence or r.missed in sentence}


def test_each_constraint_has_words_no_other_constraint_s_words_contain() -> None:
    """What `named` relies on: a title or outcome is never part of another constraint's."""
    for a, b in itertools.permutations(CONSTRAINTS, 2):
        for mine in (a.title, a.missed):
            assert mine not in b.title and mine not in b.missed, (a.name, b.name)


def trial_metrics(constraints: Constraints, hm: float, hm_low: float, ndcg_delta: float) -> dict[str, float]:
    """A trial's metrics as `TrialRecorder` records them."""
    values = constraints.values(hm, hm_low, ndcg_delta)
    return {
        "psi": 0.063,
        "robust_psi": 0.063,
        "hm": hm,
        "hm_low": hm_low,
        "hm_floor": constraints.hm_floor,
        "ndcg10_delta": ndcg_delta,
        **{f"constraint_{k}": v for k, v in values.items()},
        "feasible": float(all(v <= 0 for v in values.values())),
    }


def study_with(constraints: Constraints, metrics: dict[str, float]) -> optuna.Study:
    study = optuna.create_study()
    values = {k.removeprefix("constraint_"): v for k, v in metrics.items() if k.startswith("constraint_")}
    system = {f"constraints:{n}": v for n, v in values.items()} | {"constraints": list(values.values())}
    feasible = "yes" if metrics["feasible"] else "NO"
    study.add_trial(
        optuna.trial.create_trial(
            params={"strength": 0.5},
            distributions={"strength": FloatDistribution(0, 1)},
            value=metrics["psi"],
            system_attrs=system,
            user_attrs={
                "psi": metrics["psi"],
                "hm": metrics["hm"],
                "metrics": metrics,
                "layers": [5],
                "feasible": f"{feasible}: {'; '.join(constraints.clauses(values))}",
            },
            state=TrialState.COMPLETE,
        )
    )
    return study


def test_a_trial_above_the_floor_by_its_point_hm_but_not_its_lower_bound_is_said_and_drawn_to_miss_it(caplog) -> None:
    constraints = Constraints(FLOOR)
    metrics = trial_metrics(constraints, HM, HM_LOW, 0.001)
    assert metrics["feasible"] == 0.0, "the default rule compares the lower bound"
    values = constraints.values(HM, HM_LOW, 0.001)

    assert constraints.explain(values) == (
        "infeasible: misses the HM floor (HM lower bound 53.95 < 55.31); "
        "the tuning passages' nDCG@10 limit met (nDCG@10 +0.10 vs uncalibrated, ≥ +0.00 allowed)"
    )
    study = study_with(constraints, metrics)
    (point,) = scatter_points(study, FLOOR)
    assert point.hm > FLOOR, "the point HM is drawn above the floor line"
    assert point.compared == pytest.approx(HM_LOW) and point.compared < FLOOR, "what is compared is drawn below it"
    assert point.missed == ("hm_floor",)

    with caplog.at_level(logging.INFO):
        log_trial(study, study.trials[0], StudyProgress(4, 0, bar=False), num_layers=6)
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("trial 0:"))
    assert "infeasible: misses the HM floor (HM lower bound 53.95 < 55.31)" in line
    assert "CLS" not in line and "λ 0.50 on layers [5] of 6" in line, "the config, in the MLflow description's words"
    progress = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("after trial"))
    assert progress.startswith("after trial 0: 1 of 4 trials done · "), "Optuna's number, then the count"


def test_the_point_rule_compares_the_point_hm_and_the_ndcg_limit_is_named() -> None:
    constraints = Constraints(FLOOR, conservative=False, max_ndcg_drop=0.0)
    values = constraints.values(HM, HM_LOW, -0.004)
    assert constraints.explain(values) == (
        "infeasible: loses nDCG@10 on the tuning passages (nDCG@10 -0.40 vs uncalibrated, < +0.00 allowed); "
        "the HM floor met (HM 55.52 ≥ 55.31)"
    )
    (point,) = scatter_points(study_with(constraints, trial_metrics(constraints, HM, HM_LOW, -0.004)), FLOOR)
    assert point.compared == pytest.approx(HM) and point.missed == ("ndcg_drop",)


# --- each wording against the numbers it states -----------------------------------------------------------------

LIMITS = Constraints(
    FLOOR, max_ndcg_drop=0.005, max_general_drop=0.01, max_crops_psi=1.0, max_reversal=0.02, max_drift=2.0
)


@pytest.mark.parametrize(
    ("name", "measured", "where", "said"),
    [
        ("hm_floor", {"hm": 0.5752, "hm_low": 0.5655}, None, "the HM floor met (HM lower bound 56.55 ≥ 55.31)"),
        (
            "ndcg_drop",
            {"ndcg_delta": -0.008},
            None,
            "loses nDCG@10 on the tuning passages (nDCG@10 -0.80 vs uncalibrated, < -0.50 allowed)",
        ),
        (
            "ndcg_drop",
            {"ndcg_delta": 0.0092},
            None,
            "the tuning passages' nDCG@10 limit met (nDCG@10 +0.92 vs uncalibrated, ≥ -0.50 allowed)",
        ),
        (
            "structure_ndcg",
            {"structure_ndcg_loss": 0.018},  # the favourable end of the crops' interval: -1.80 points
            "crops",
            "loses nDCG@10 beyond noise on another structure (crops: nDCG@10 change at best -1.80, < -0.50 allowed)",
        ),
        (
            "structure_ndcg",
            {"structure_ndcg_loss": -0.001},
            "packed",
            "the other structures' nDCG@10 limit met (closest: packed, nDCG@10 change at best +0.10, ≥ -0.50 allowed)",
        ),
        # `reversal` comes as its constraint value (`RobustEvidence.reversal(allowance)`): the largest reversal less
        # 0.02
        (
            "reversal",
            {"reversal": 0.035 - 0.02},
            "openings",
            "reverses the bias (openings: 3.50 tilt points the other way, 2.00 allowed)",
        ),
        (
            "reversal",
            {"reversal": 0.0141 - 0.02},
            "crops",
            "the no-reversal rule met (closest: crops, 0.59 tilt points short of the limit)",
        ),
        (
            "drift",
            {"drift_ratio": 3.1},
            "crops",
            "is over the drift limit (crops: 3.10× the paper default's drift, > 2×)",
        ),
        (
            "drift",
            {"drift_ratio": 1.43},
            "openings",
            "the drift limit met (closest: openings, 1.43× the paper default's drift, ≤ 2×)",
        ),
        (
            "crops_psi",
            {"crops_psi": (0.20, 0.161)},
            None,
            "is less fair on the crops than the crops PSI limit allows (crops PSI 0.039 over 1× the uncalibrated PSI "
            "there)",
        ),
        (
            "general_drop",
            {"general_delta": -0.004},
            None,
            "the general nDCG@10 limit met (general nDCG@10 -0.40 vs uncalibrated, ≥ -1.00 allowed)",
        ),
    ],
)
def test_each_constraint_is_said_with_the_figures_it_compared(
    name: str, measured: dict, where: str | None, said: str
) -> None:
    """The figures in each sentence are the measured ones and the limit (chosen here by hand), read back from the
    value."""
    evidence = {"hm": 0.56, "hm_low": 0.56, "ndcg_delta": 0.0, "general_delta": 0.0} | measured
    values = LIMITS.values(
        evidence.pop("hm"),
        evidence.pop("hm_low"),
        evidence.pop("ndcg_delta"),
        evidence.pop("general_delta"),
        **evidence,
    )
    assert LIMITS.clause(name, values[name], where) == said
    assert (values[name] > 0) == said.startswith(REQUIREMENTS[name].missed), "met or missed, as the value says"


# --- no sentence names a constraint that is not in force, or omits one that is ----------------------------------

OPTIONAL = {
    "max_ndcg_drop": (None, 0.005),
    "max_reversal": (None, 0.0),
    "max_drift": (None, 2.0),
    "max_crops_psi": (None, 1.0),
    "max_general_drop": (None, 0.005),
}


def every_study() -> list[tuple[Constraints, bool, bool, bool]]:
    """Every combination of the optional limits, with the tuning passages alone or in structures (crops among them)
    and with or without a general set, but those `tune` refuses (`TuneSettings`: --max-general-drop without --general,
    --max-crops-psi with --no-structures)."""
    combinations = []
    for limits in itertools.product(*OPTIONAL.values()):
        constraints = Constraints(FLOOR, **dict(zip(OPTIONAL, limits)))
        for structures, general in itertools.product((False, True), (False, True)):
            refused = (constraints.max_general_drop is not None and not general) or (
                constraints.max_crops_psi is not None and not structures
            )
            if not refused:
                combinations.append((constraints, structures, structures, general))
    return combinations


@pytest.mark.parametrize(("constraints", "structures", "crops", "general"), every_study())
def test_the_study_s_rule_and_every_trial_sentence_name_exactly_the_constraints_in_force(
    constraints: Constraints, structures: bool, crops: bool, general: bool
) -> None:
    checked = constraints.in_force(structures, crops, general)
    # what a complete trial of such a study is checked on: evidence for what the study scores, every constraint missed
    values = constraints.values(
        0.5,
        0.5,
        -0.01,
        -0.02 if general else None,
        (0.3, 0.1) if crops else None,
        reversal=0.01,
        structure_ndcg_loss=0.02 if structures else None,
        drift_ratio=3.0,
    )
    assert set(values) == set(checked), "what a trial is checked on is what the study says is in force"
    assert named(describe_rule(constraints, checked, pareto=False, structures=structures)) == set(checked)
    assert named(constraints.explain(values)) == set(checked), "a trial missing every one"
    met = {name: -0.001 for name in values}
    assert named(constraints.explain(met)) == set(checked), "a trial meeting every one"
    assert named(outcome(checked)) == set(checked)


def test_the_experiment_describes_every_constraint_posfair_has() -> None:
    note = experiment_note()
    assert named(note) == {r.name for r in CONSTRAINTS}
    assert "worst PSI over the tuning structures" in note and "lower end of its 95% paired-bootstrap interval" in note
    for requirement in CONSTRAINTS:
        assert requirement.option in note


def test_the_study_attributes_name_the_constraints_the_study_checks() -> None:
    from tuner.tuning.study import describe_study

    study = optuna.create_study()
    constraints = Constraints(FLOOR, max_drift=2.0)
    checked = constraints.in_force(structures=True)
    describe_study(study, False, constraints, checked, structures=True)
    assert named(study.user_attrs["constraints"]) == {"hm_floor", "ndcg_drop", "structure_ndcg", "reversal", "drift"}
    assert study.user_attrs["objective"].startswith("minimise the worst PSI over the tuning structures")


# --- the nDCG@10 limit on the other tuning structures (`structure_ndcg`), in the words users read -----------------

ALLOWANCE = 0.005  # --max-ndcg-drop 0.005: half a point


def structure_constraints(
    highs: dict[str, float], allowance: float = ALLOWANCE, dev_delta: float = 0.001
) -> dict[str, float]:
    """A trial's constraint values as `TrialScoring` computes them, for a tuning split (`dev`) that keeps nDCG@10
    and HM, and other structures whose 95% interval of the nDCG@10 change ends at `highs` (name → upper end)."""
    from objectives.evidence import TrialEvidence
    from objectives.robustness import RobustEvidence, StructureEvidence
    from tuner.tuning.trial.drift_yardstick import DriftYardstick
    from tuner.tuning.trial.scoring import TrialScoring

    def evidence(delta: float, high: float) -> TrialEvidence:
        return TrialEvidence(0.1, 0.02, 0.56, 0.555, delta, 0.565, high)

    dev = evidence(dev_delta, dev_delta + 0.004)
    robust = RobustEvidence(
        (
            StructureEvidence("dev", dev, tuning=True),
            *(StructureEvidence(n, evidence(h - 0.006, h)) for n, h in highs.items()),
        )
    )
    scoring = object.__new__(TrialScoring)  # only what the constraint values read
    scoring.constraints = Constraints(FLOOR, max_ndcg_drop=allowance)
    scoring.structures = []
    scoring.yardstick = DriftYardstick(
        scoring.constraints, 0.0, 0.0
    )  # no drift yardstick: the drift limit is not applied
    return scoring.constraint_values(dev, robust, None)


def test_the_nothing_feasible_message_names_the_closest_trial_to_a_constraint_every_trial_missed() -> None:
    from tuner.tuning.settings import TuneSettings
    from tuner.tuning.summary import nothing_feasible

    trials = [  # every trial loses nDCG@10 on a structure even at the favourable end of its interval
        {"crops": -0.0142, "openings": -0.003},  # 1.42 points at best
        {"crops": -0.0081, "openings": -0.0117},  # 1.17: the closest
        {"crops": -0.0126, "openings": 0.002},  # 1.26
    ]
    study = optuna.create_study()
    for highs in trials:
        trial = study.ask()
        for name, value in structure_constraints(highs).items():
            trial.set_constraint(name, value)
        study.tell(trial, 0.1)

    message = nothing_feasible(study, TuneSettings(max_ndcg_drop=ALLOWANCE), FLOOR)
    assert message.startswith("no trial met the constraints; nothing exported.")
    assert (
        "every trial loses nDCG@10 beyond noise on another structure (the closest, trial 1: "
        "nDCG@10 change at best -1.17, "
        "< -0.50 allowed)" in message
    )
    assert named(message) == {"structure_ndcg"}, "the HM floor and the tuning split's nDCG@10 were met"
    assert message.endswith("Relax --max-ndcg-drop, widen the search space, or run more --trials.")


def test_a_nothing_feasible_message_where_no_constraint_was_missed_by_every_trial_still_says_so() -> None:
    """One trial misses the HM floor, the other a structure's nDCG@10: no clause holds for every trial."""
    from tuner.tuning.settings import TuneSettings
    from tuner.tuning.summary import nothing_feasible

    study = optuna.create_study()
    for values in (
        {"hm_floor": 0.01, "ndcg_drop": -0.01, "structure_ndcg": -0.002},
        structure_constraints({"crops": -0.009}),
    ):
        trial = study.ask()
        for name, value in values.items():
            trial.set_constraint(name, value)
        study.tell(trial, 0.1)
    message = nothing_feasible(study, TuneSettings(max_ndcg_drop=ALLOWANCE), FLOOR)
    assert "no constraint was missed by every trial" in message and "every trial" not in message.replace(
        "every trial (", ""
    )
    assert message.endswith("Relax --hm-floor or --max-ndcg-drop, widen the search space, or run more --trials.")


@pytest.mark.parametrize("high", [-0.0075, -0.0051, -0.0049, -0.002, 0.001])
def test_the_verdict_names_the_other_structures_limit_exactly_when_a_loss_there_exceeds_it_beyond_noise(
    high: float,
) -> None:
    values = structure_constraints({"crops": high, "openings": 0.003})
    metrics = {f"constraint_{k}": v for k, v in values.items()}
    left = 100 * (
        ALLOWANCE - max(-high, -0.003)
    )  # the allowance left at the favourable end of the worst structure's interval
    assert display_metrics(metrics)["structure_ndcg10_drop_allowance_left_x100"] == pytest.approx(left), (
        "the figure MLflow shows"
    )
    sentence = Constraints(FLOOR, max_ndcg_drop=ALLOWANCE).explain(values, {"structure_ndcg": "crops"})
    missed = -high > ALLOWANCE  # even the favourable end loses more than the allowance
    assert (REQUIREMENTS["structure_ndcg"].missed in sentence) == missed
    assert sentence.startswith("feasible: ") != missed
    assert REQUIREMENTS["ndcg_drop"].missed not in sentence, "the tuning split's is met"


def test_a_loss_beyond_the_limit_on_the_tuning_split_itself_is_not_called_another_structure_s() -> None:
    values = structure_constraints(
        {"crops": 0.003}, dev_delta=-0.008
    )  # the tuning split: 0.8 points down, point estimate
    sentence = Constraints(FLOOR, max_ndcg_drop=ALLOWANCE).explain(values)
    assert REQUIREMENTS["ndcg_drop"].missed in sentence and REQUIREMENTS["structure_ndcg"].missed not in sentence


def test_a_study_s_own_limits_come_back_from_its_attributes() -> None:
    """The YAML's objective and a re-export read the limits the study ran under, not today's defaults."""
    from tuner.tuning.summary import study_constraints

    study = optuna.create_study()
    for key, value in {"hm_floor": "baseline", "max_ndcg_drop": 0.005, "max_reversal": None, "max_drift": 3.0}.items():
        study.set_user_attr(key, value)
    expected = Constraints(0.55, conservative=False, max_ndcg_drop=0.005, max_reversal=None, max_drift=3.0)
    assert study_constraints(study, 0.55) == expected
