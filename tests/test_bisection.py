"""Specification of λ bisection: over-correction grows with λ, so an over-correcting config's fair neighbour is
the same config weaker, and the family's boundary is found by halving the gap between what is known feasible
and what is known to over-correct, down to one step of the λ grid."""

from __future__ import annotations

import logging

import optuna
import pytest
from mlflow.tracking import MlflowClient

from tuner.common.trials import BISECT_ATTR, NOT_RUN_ATTR, never_ran
from tuner.tuning.bisection import DRIFT_EXPONENTS, Probe, drift_ceiling, next_strength, queue_next

STEP = 0.05

pytestmark = pytest.mark.usefixtures("module_cache")  # the study run here, its disk cache not in the checkout


def ok(strength: float) -> Probe:
    return Probe(strength, feasible=True)


def over(strength: float) -> Probe:
    return Probe(strength, feasible=False, missed=("reversal",))


def neither(strength: float) -> Probe:  # pruned on PSI, or below the HM floor only
    return Probe(strength, feasible=False)


def test_with_nothing_feasible_known_the_search_gallops_down_2_4_8_grid_steps():
    """Down from the top in small steps first: an over-correcting probe is cheap (pruned at the first rung), a
    feasible one costs a full trial; the steps double, so a boundary far down costs a few probes, not a walk."""
    assert next_strength([over(0.8)], STEP)[:4] == (0.7, None, 0.8, None)
    assert next_strength([over(0.8), over(0.7)], STEP)[:4] == (
        0.5,
        None,
        0.7,
        None,
    )  # from the weakest over-correcting λ
    assert next_strength([over(0.95), over(0.85), over(0.65)], STEP)[:4] == (0.25, None, 0.65, None)
    assert next_strength([over(0.7), over(0.6), over(0.4)], STEP) is None  # 0.4 - 8 steps: λ 0, no calibration
    assert next_strength([over(0.1)], STEP) is None


def test_a_queued_trial_says_why_it_runs() -> None:
    from tuner.tuning.bisection import describe_queued

    assert describe_queued({"of": 4, "feasible": 0.55, "too_strong": 0.7, "because": "reverses the bias"}) == (
        "queued by λ bisection after trial 4: the same config, between λ 0.55, feasible, and λ 0.7, "
        "which reverses the bias"
    )
    assert describe_queued(
        {"of": 2, "feasible": None, "too_strong": 1.0, "because": "is over the drift limit", "drift_ceiling": 0.5442}
    ) == (
        "queued by λ bisection after trial 2: the same config, below λ 1, which is over the drift limit; "
        "the drift measured puts every λ above 0.544 over the drift limit"
    )


def test_a_lambda_that_only_missed_the_drift_limit_is_said_to_be_over_it_not_to_over_correct(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Seed 0's trial 4 (λ 0.4): crops tilt −17.4, not reversed, nDCG@10 within noise, over the drift limit only."""
    caplog.set_level(logging.INFO, logger="tuner.tuning.bisection")
    study = optuna.create_study()
    trial = study.ask()
    for name, value in {"strength": 0.4, "depth": "last", "basket_size": 128, "variant": "cls_soft"}.items():
        trial.suggest_categorical(name, [value])
    trial.set_user_attr("basket_shares", "equal")
    values = {"hm_floor": -0.01, "ndcg_drop": -0.003, "reversal": -0.17, "structure_ndcg": -0.001, "drift": 0.4}
    assert queue_next(study, trial, values, complete=False, step=STEP, worst_psi=0.07, best=0.167) == pytest.approx(0.3)
    (queued,) = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    assert queued.user_attrs[BISECT_ATTR]["because"] == "is over the drift limit"
    from tuner.tuning.bisection import describe_queued

    said = [r.getMessage() for r in caplog.records if r.name == "tuner.tuning.bisection"]
    for text in (*said, describe_queued(queued.user_attrs[BISECT_ATTR])):
        assert "which is over the drift limit" in text and "over-correct" not in text, text


def test_between_a_feasible_and_an_over_correcting_lambda_the_midpoint_on_the_grid_is_next():
    assert next_strength([ok(0.5), over(0.8)], STEP)[:4] == (0.65, 0.5, 0.8, None)
    assert next_strength([ok(0.55), over(0.7)], STEP)[:4] == (0.6, 0.55, 0.7, None)  # 0.625 rounded down to the grid
    assert next_strength([ok(0.55), over(0.65)], STEP)[:4] == (0.6, 0.55, 0.65, None)
    assert next_strength([ok(0.6), over(0.65)], STEP) is None  # one step apart: the boundary is found


def test_no_over_correction_no_bisection_and_what_tells_nothing_is_not_tried_again():
    assert next_strength([ok(0.5), ok(0.9), neither(0.3)], STEP) is None
    assert next_strength([ok(0.9), over(0.6)], STEP) is None  # stronger is fair: no boundary above the feasible λ
    assert next_strength([ok(0.5), neither(0.65), over(0.8)], STEP) is None  # the midpoint ran (pruned on PSI)


def test_drift_grows_as_a_power_of_lambda_so_the_probes_measured_bound_where_it_is_over_the_limit():
    """Up from a probe within the limit the drift grows at least as λ^1.75; down from one over it, it falls at most as
    λ^3.25. Seed 4's CLS-Hard family: λ 0.3 drifted 0.0189 on the openings (limit 0.0244), λ 1.0 0.1618 on the
    crops (limit 0.0224)."""
    assert DRIFT_EXPONENTS == (1.75, 3.25)
    up = drift_ceiling([Probe(0.3, True, (), {"openings": 0.0189})], {"openings": 0.0244})
    assert up == pytest.approx(0.34714, abs=1e-4)  # 0.3 · 1.29101^(1/1.75) = 0.3 · 1.15715
    assert 0.0189 * (up / 0.3) ** 2 > 0.0244  # a quadratic law is over the limit there, as any steeper one
    down = drift_ceiling([Probe(1.0, False, ("drift",), {"crops": 0.1618})], {"crops": 0.0224})
    assert down == pytest.approx(0.54420, abs=1e-4)  # 0.13844^(1/3.25)
    both = [Probe(0.3, True, (), {"openings": 0.0189}), Probe(1.0, False, ("drift",), {"crops": 0.1618})]
    assert drift_ceiling(both, {"openings": 0.0244, "crops": 0.0224}) == pytest.approx(up)  # the lowest bound
    assert drift_ceiling(both, {"dev": 0.02}) is None  # no drift measured where a limit is


def test_a_lambda_the_drift_puts_over_the_limit_is_never_probed():
    """Seed 4's family again: without the drift ceiling λ 0.3 feasible and 0.7 over-correcting queue 0.5 (then 0.4 and
    0.35, all over the drift limit); with it, the boundary is found. Galloping from λ 1.0 lands at once below where
    the drift falls within the limit (0.5), not at 0.9."""
    limits = {"openings": 0.0244, "crops": 0.0224}
    family = [Probe(0.3, True, (), {"openings": 0.0189, "crops": 0.0098}), over(0.7)]
    assert next_strength(family, STEP)[:4] == (0.5, 0.3, 0.7, None)
    assert next_strength(family, STEP, limits) is None
    assert next_strength([Probe(1.0, False, ("drift",), {"crops": 0.1618})], STEP, limits)[:4] == pytest.approx(
        (0.5, None, 1.0, 0.54420), abs=1e-4
    )
    assert next_strength([Probe(0.9, False, ("drift",), {"crops": 0.0224 * 1.1})], STEP, limits)[:4] == (
        0.8,
        None,
        0.9,
        None,
    )  # the gallop is lower


@pytest.mark.parametrize("exponent", [1.9, 2.2, 2.8])
@pytest.mark.parametrize("limit", [0.004, 0.011, 0.02, 0.05])
def test_bisection_with_the_drift_ceiling_finds_the_same_boundary_in_no_more_probes(
    exponent: float, limit: float
) -> None:
    """A family whose only over-correction is its drift, c · λ^p with p in the measured range (1.88-2.83), from λ 1:
    the search that knows the law ends at the strongest λ of the grid within the limit, in no more probes than the
    plain one, which ends there too unless its gallop overshoots λ 0 and gives the family up (a limit far down)."""
    grid = [round(STEP * k, 2) for k in range(1, 21)]
    boundary = max((x for x in grid if 0.06 * x**exponent <= limit), default=None)

    def search(limits: dict[str, float] | None) -> tuple[float | None, int]:
        probes = [Probe(1.0, False, ("drift",), {"dev": 0.06})]
        while (found := next_strength(probes, STEP, limits)) is not None:
            drift = 0.06 * found.strength**exponent
            probes.append(Probe(found.strength, drift <= limit, ("drift",) if drift > limit else (), {"dev": drift}))
        return max((p.strength for p in probes if p.feasible), default=None), len(probes)

    plain, plain_probes = search(None)
    known, known_probes = search({"dev": limit})
    assert known == boundary
    assert plain in (boundary, None)
    assert known_probes <= plain_probes or plain is None


def test_an_over_correcting_trial_queues_its_own_config_weaker_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="tuner.tuning.bisection")
    study = optuna.create_study()
    params = {"strength": 0.8, "depth": "last", "basket_size": 128, "variant": "cls_soft"}
    trial = study.ask()
    for name, value in params.items():
        trial.suggest_categorical(name, [value])
    trial.set_user_attr("basket_shares", "equal")
    assert (
        queue_next(study, trial, {"reversal": 0.02}, complete=False, step=STEP, worst_psi=0.21, best=0.2) is None
    )  # weaker: less fair
    assert queue_next(
        study, trial, {"hm_floor": -0.01, "reversal": 0.02}, False, STEP, worst_psi=0.15, best=0.2
    ) == pytest.approx(0.7)
    said = [r.getMessage() for r in caplog.records if r.name == "tuner.tuning.bisection"]
    assert said == [
        "trial 0: λ bisection stops: worst-case PSI 0.210 is above the best trial's 0.200 already, "
        "and weaker is less fair",
        "trial 0: λ bisection queued the same config at λ 0.7 (below λ 0.8, which reverses the bias)",
    ]
    waiting = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    assert len(waiting) == 1 and waiting[0].system_attrs["fixed_params"] == params | {"strength": 0.7}
    record = {"of": 0, "feasible": None, "too_strong": 0.8, "because": "reverses the bias"}
    assert waiting[0].user_attrs == {BISECT_ATTR: record, "basket_shares": "equal"}
    assert (
        queue_next(study, trial, {"reversal": 0.02}, False, STEP, worst_psi=0.15, best=None) is None
    )  # queued already: not twice
    assert (
        queue_next(study, trial, {"hm_floor": 0.01, "reversal": -0.1}, True, STEP, worst_psi=0.15, best=None) is None
    )  # not over-correcting


def test_a_real_study_runs_the_queued_weaker_config_next_and_counts_it(
    tiny_model_dir, tmp_path, monkeypatch, caplog
) -> None:
    """Through `tune`: the paper default (trial 1, λ 0.5) misses a constraint counted as over-correction here (the
    HM floor, set out of reach), so trial 2 is the same config at λ 0.4, queued by trial 1, run and counted. The
    console says trial 1's result first, then what it queued, then the study's progress."""
    import tuner.tuning.bisection
    from tests.test_pruning import tiny_study
    from tests.test_study import write_dataset
    from tuner.common.trials import counted
    from tuner.tuning.run import NoFeasibleTrialError, tune
    from tuner.tuning.search_space import PAPER_DEFAULT_PARAMS

    monkeypatch.setattr(tuner.tuning.bisection, "OVER_CORRECTION", ("hm_floor",))
    settings = tiny_study(
        tiny_model_dir("bert"),
        write_dataset(tmp_path / "data"),
        tmp_path,
        "bisect",
        trials=3,
        hm_floor="+50%",
        budget=None,
        prune=False,
    )
    with pytest.raises(NoFeasibleTrialError), caplog.at_level("INFO", logger="tuner"):  # nothing reaches the floor
        tune(settings)
    said = [r.getMessage() for r in caplog.records]
    result = next(i for i, line in enumerate(said) if line.startswith("trial 1: "))
    queued = next(
        i for i, line in enumerate(said) if line.startswith("trial 1: λ bisection queued the same config at λ 0.4")
    )
    progress = next(i for i, line in enumerate(said) if line.startswith("after trial 1: "))
    assert result < queued < progress, said[result - 1 : progress + 1]
    trials = optuna.load_study(study_name="bisect", storage=settings.storage).trials
    assert [t.params["strength"] for t in trials[:3]] == [0.0, 0.5, 0.4]
    knobs = {k: v for k, v in PAPER_DEFAULT_PARAMS.items() if k != "basket_shares"}
    assert trials[2].params == knobs | {"strength": 0.4} and trials[2].user_attrs[BISECT_ATTR]["of"] == 1
    assert sum(counted(t) for t in trials) == 3 and trials[2].state == optuna.trial.TrialState.COMPLETE
    client = MlflowClient(settings.tracking_uri)
    experiment = client.get_experiment_by_name("posfair")
    (run,) = client.search_runs(
        [experiment.experiment_id], "tags.`posfair.trial` = '2' and tags.`posfair.role` = 'trial'"
    )
    assert (
        run.data.tags["posfair.bisect"]
        == "queued by λ bisection after trial 1: the same config, below λ 0.5, which misses the HM floor"
    )
    # trial 2 queued λ 0.2 as well (galloping: 4 steps below 0.4), which the study ended before running: withdrawn,
    # nothing is left waiting
    assert [t.state for t in trials[3:]] == [optuna.trial.TrialState.FAIL] and never_ran(
        trials[3]
    )  # not a pruned trial
    assert (
        trials[3].system_attrs["fixed_params"]["strength"] == pytest.approx(0.2)
        and trials[3].user_attrs[BISECT_ATTR]["of"] == 2
    )


def test_a_queued_trial_a_worker_has_taken_is_not_withdrawn(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="tuner.tuning.bisection")
    from tuner.tuning.bisection import withdraw_queued

    study = optuna.create_study()
    study.enqueue_trial({"strength": 0.7}, user_attrs={BISECT_ATTR: {"of": 0}})
    study.enqueue_trial({"strength": 0.6}, user_attrs={BISECT_ATTR: {"of": 1}})
    study.enqueue_trial({"strength": 0.5})  # queued by something else (a re-queued failure, a reference): kept
    taken = study.ask()  # a worker pops the first
    assert withdraw_queued(study) == [1]
    assert [r.getMessage() for r in caplog.records if r.name == "tuner.tuning.bisection"] == [
        "the study ended before queued trial(s) [1] ran; withdrawn (not run)"
    ]
    states = [t.state for t in study.get_trials()]
    assert states == [optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.FAIL, optuna.trial.TrialState.WAITING]
    assert (
        taken.number == 0
        and study.get_trials()[1].user_attrs[NOT_RUN_ATTR] == "the study ended before this queued trial ran"
    )


def test_a_surplus_draw_that_never_ran_is_no_probe_so_a_resume_can_queue_it_again() -> None:
    from optuna.distributions import FloatDistribution

    from tuner.tuning.bisection import probe_of

    def pruned(strength: float, **attrs: object) -> optuna.trial.FrozenTrial:
        return optuna.trial.create_trial(
            state=optuna.trial.TrialState.PRUNED,
            params={"strength": strength},
            distributions={"strength": FloatDistribution(0.0, 1.0, step=STEP)},
            user_attrs=attrs,
            system_attrs={"constraints:reversal": 0.1},
        )

    assert probe_of(pruned(0.7)) == over(0.7)  # pruned on a reversal the rungs decided
    assert probe_of(pruned(0.6, **{NOT_RUN_ATTR: "the budget is spent"})) is None
    assert probe_of(pruned(0.6, surplus=True)) is None  # as a study stored before marked one


def test_a_family_is_left_once_a_probe_is_no_fairer_than_the_best_trial_though_within_one_se_of_it() -> None:
    """Seed 2's numbers: the paper default (worst-case PSI 0.194 ± 0.037) is the best feasible trial; a Uniform
    B 64 probe at λ 0.35 loses nDCG@10 on a structure with a worst case of 0.219 so far. That is within one SE of
    the best (0.231), but a weaker λ is less fair still, so the descent ends there."""
    from tuner.tuning.candidates import best_objective, selection_threshold

    study = optuna.create_study()
    for psi, se, floor_gap in ((0.299, 0.033, 0.0), (0.194, 0.037, -0.009)):  # the baseline, the paper default
        attrs = {"psi": psi, "psi_se": se, "hm": 0.57}
        study.add_trial(
            optuna.trial.create_trial(value=psi, user_attrs=attrs, system_attrs={"constraints:hm_floor": floor_gap})
        )
    assert best_objective(study) == pytest.approx(0.194) and selection_threshold(study, "one-se") == pytest.approx(
        0.231
    )
    trial = study.ask()
    for name, value in {"strength": 0.35, "depth": "50%", "basket_size": 64, "variant": "uniform"}.items():
        trial.suggest_categorical(name, [value])
    trial.set_user_attr("basket_shares", "equal")
    assert (
        queue_next(study, trial, {"structure_ndcg": 0.007}, False, STEP, worst_psi=0.219, best=best_objective(study))
        is None
    )
    assert (
        queue_next(study, trial, {"structure_ndcg": 0.007}, False, STEP, worst_psi=0.180, best=best_objective(study))
        == 0.25
    )


SEED4_FAMILY = {"strength": 0.3, "depth": "25%", "basket_size": 256, "variant": "cls_hard"}


def seed4_family(rows: dict[str, dict[str, float]]) -> tuple[optuna.Study, optuna.Trial]:
    """A study holding seed 4's CLS-Hard probe at λ 0.3 (feasible, its structures' rows stored as a finished trial's)
    and the same config at λ 0.7 being finished."""
    from optuna.distributions import CategoricalDistribution

    study = optuna.create_study()
    study.add_trial(
        optuna.trial.create_trial(
            value=0.2031,
            params=SEED4_FAMILY,
            distributions={k: CategoricalDistribution([v]) for k, v in SEED4_FAMILY.items()},
            user_attrs={"structures": rows, "basket_shares": "equal", "psi": 0.2031, "hm": 0.57},
            system_attrs={"constraints:drift": -0.2},
        )
    )
    trial = study.ask()
    for name, value in (SEED4_FAMILY | {"strength": 0.7}).items():
        trial.suggest_categorical(name, [value])
    trial.set_user_attr("basket_shares", "equal")
    return study, trial


def test_a_stored_probe_s_drift_rows_end_its_family_s_bisection(caplog: pytest.LogCaptureFixture) -> None:
    """Through the study: trial 0 (λ 0.3, feasible) stored its structures' drift as a finished trial does; trial 1
    (λ 0.7) over-corrects. Without a drift limit λ 0.5 is queued; with seed 4's limits nothing is, and the log says
    why."""
    from tuner.tuning.bisection import probe_of

    caplog.set_level(logging.INFO, logger="tuner.tuning.bisection")
    study, trial = seed4_family({"openings": {"psi": 0.13, "drift": 0.0189}, "crops": {"psi": 0.12, "drift": 0.0098}})
    assert probe_of(study.trials[0]) == Probe(0.3, True, (), {"openings": 0.0189, "crops": 0.0098})
    limits = {"openings": 0.0244, "crops": 0.0224}
    assert queue_next(study, trial, {"drift": 1.3}, False, STEP, 0.07, 0.2, {"crops": 0.0699}, limits) is None
    assert [r.getMessage() for r in caplog.records if r.name == "tuner.tuning.bisection"] == [
        "trial 1: λ bisection ends: the drift measured in this family puts every λ above 0.347 over the drift limit"
    ]
    assert queue_next(study, trial, {"drift": 1.3}, False, STEP, 0.07, 0.2, {"crops": 0.0699}) == pytest.approx(0.5)


def test_a_probe_the_drift_ceiling_placed_says_so_in_its_record_and_the_log(caplog: pytest.LogCaptureFixture) -> None:
    """A looser openings limit (0.04): the ceiling 0.3 · (0.04/0.0189)^(1/1.75) = 0.4604 is below the over-correcting
    λ 0.7, so the midpoint is taken towards it: (0.3 + 0.4604) / 2 = 0.38, λ 0.35 on the grid."""
    caplog.set_level(logging.INFO, logger="tuner.tuning.bisection")
    study, trial = seed4_family({"openings": {"psi": 0.13, "drift": 0.0189}})
    assert queue_next(study, trial, {"drift": 1.3}, False, STEP, 0.07, 0.2, {}, {"openings": 0.04}) == pytest.approx(
        0.35
    )
    waiting = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    record = {
        "of": 1,
        "feasible": 0.3,
        "too_strong": 0.7,
        "because": "is over the drift limit",
        "drift_ceiling": 0.4604,
    }
    assert waiting[0].user_attrs[BISECT_ATTR] == record
    assert [r.getMessage() for r in caplog.records if r.name == "tuner.tuning.bisection"] == [
        "trial 1: λ bisection queued the same config at λ 0.35 (between λ 0.3, feasible, and λ 0.7, "
        "which is over the drift limit; "
        "the drift measured puts every λ above 0.46 over the drift limit)"
    ]


@pytest.mark.parametrize("max_drift", [2.0, None])
def test_a_trial_s_objective_hands_its_drift_and_the_paper_default_s_yardstick_to_the_bisection(
    max_drift: float | None,
) -> None:
    """The wiring in `TrialObjective`: the limits are --max-drift times the paper default's drift per structure (seed
    4's: 0.0122 on the openings, so 0.0244), and the trial's own drift per structure joins its family's probes."""
    from types import SimpleNamespace

    from objectives import Constraints
    from tuner.tuning.search_space import SearchSpace
    from tuner.tuning.trial.drift_yardstick import DriftYardstick
    from tuner.tuning.trial.objective import TrialObjective

    study, trial = seed4_family({"dev-openings": {"psi": 0.13, "drift": 0.0189}})
    made = object.__new__(TrialObjective)  # only what the bisection step reads
    made.bisect, made.space, made.yardstick = (
        True,
        SearchSpace(),
        DriftYardstick(Constraints(0.5, max_drift=max_drift), 0.0, 0.0),
    )
    made.said_after = {}
    made.yardstick.own, made.yardstick.reference = False, {"dev-openings": 0.0122, "dev-crops": 0.0112}

    def robust(drift: dict[str, float]) -> SimpleNamespace:  # the trial's evidence, as far as the bisection reads it
        return SimpleNamespace(drifts=lambda: dict(drift), objective=0.07)

    made._bisect(trial, {"drift": 2.1}, SimpleNamespace(robust=robust({"dev-crops": 0.0699})), complete=False)  # type: ignore[arg-type]
    queued = [
        t.system_attrs["fixed_params"]["strength"] for t in study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    ]
    assert queued == ([] if max_drift else [0.5])
    assert made.yardstick.limits(robust({"dev-crops": 0.0699})) == (  # type: ignore[arg-type]
        {"dev-openings": pytest.approx(0.0244), "dev-crops": pytest.approx(0.0224)} if max_drift else None
    )
    made.yardstick.own = True  # the paper default is its own yardstick
    assert made.yardstick.limits(robust({"dev-crops": 0.0112})) == (
        {"dev-crops": pytest.approx(0.0224)} if max_drift else None
    )  # type: ignore[arg-type]
