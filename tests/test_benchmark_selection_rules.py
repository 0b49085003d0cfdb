"""The selection-rules benchmark's verdict: what the tuner promises of its winners held out, set by set."""

from __future__ import annotations

from typing import Any

from benchmarks.selection_rules import NONE, PAPER, exported, judge, narrowing, verdicts


def cell(
    psi: float,
    vs_paper: float,
    se: float,
    hm: float = 2.0,
    ndcg: float = 1.0,
    reversed_: bool = False,
    gap: tuple[float, float, float] = (4.0, 2.0, 6.0),
) -> dict[str, Any]:
    """A held-out cell as `HeldOutCell.as_dict` writes it: PSI, its difference from the paper default's and the SE
    of that difference, ΔHM and ΔnDCG@10 (estimate, low, high) against no calibration, and how far the
    begin-to-end gap moved against no calibration's (estimate, low, high)."""
    return {
        "psi": psi,
        "psi_se": 0.02,
        "psi_minus_reference": vs_paper,
        "psi_minus_reference_se": se,
        "hm_delta": (hm, hm - 0.8, hm + 0.8),
        "ndcg_delta": (ndcg, ndcg - 0.6, ndcg + 0.6),
        "reversed": reversed_,
        "gap_delta": gap,
    }


PAPER_CELL = cell(0.27, 0.0, 0.0)  # ΔHM 2.0 [1.2, 2.8], ΔnDCG@10 1.0 [0.4, 1.6]
BEGINNING_FAVOURED = {"end_minus_begin": (-12.0, -15.0, -9.0)}  # no calibration's own gap: the end found less


def test_a_winner_beats_the_paper_default_only_beyond_the_se_of_their_difference() -> None:
    row = {PAPER: PAPER_CELL, "clear": cell(0.23, -0.04, 0.01), "within noise": cell(0.26, -0.01, 0.02)}
    assert judge(["clear"], row)["beat_paper"] == 1
    assert judge(["within noise"], row)["beat_paper"] == 0
    assert judge(["clear", "within noise", "clear"], row)["beat_paper"] == 2


def test_a_fairer_winner_that_loses_accuracy_beyond_the_paper_defaults_interval_does_not_beat_it() -> None:
    # ΔHM 1.1 < the paper default's low end 1.2; ΔnDCG@10 0.3 < its low end 0.4
    row = {
        PAPER: PAPER_CELL,
        "less accurate": cell(0.2, -0.07, 0.01, hm=1.1),
        "fewer hits": cell(0.2, -0.07, 0.01, ndcg=0.3),
    }
    assert judge(["less accurate"], row)["beat_paper"] == 0
    assert judge(["fewer hits"], row)["beat_paper"] == 0


def test_seeds_agree_when_their_psi_spreads_no_wider_than_one_bootstrap_se() -> None:
    row = {
        PAPER: PAPER_CELL,
        "a": cell(0.230, -0.04, 0.01),
        "b": cell(0.245, -0.025, 0.01),
        "c": cell(0.26, -0.01, 0.01),
    }
    close, far = judge(["a", "b"], row), judge(["a", "c"], row)
    assert close["agree"] and round(close["psi_spread"], 6) == 0.015
    assert not far["agree"] and round(far["psi_spread"], 6) == 0.03


def test_reversals_are_counted_per_seed() -> None:
    row = {PAPER: PAPER_CELL, "flipped": cell(0.2, -0.07, 0.01, reversed_=True), "level": cell(0.2, -0.07, 0.01)}
    assert judge(["flipped", "level", "flipped"], row)["reversed"] == 2


def test_verdicts_judge_each_design_and_rule_on_its_own_seeds() -> None:
    studies = [
        {"design": "d0", "choices": {"one-se": {"config": "a"}, "lowest": {"config": "b"}}},
        {"design": "d0", "choices": {"one-se": {"config": "a"}, "lowest": {"config": "a"}}},
        {"design": "d1", "choices": {"one-se": {"config": "b"}}},
        {"design": "d1", "feasible": 0},  # a study with no feasible trial has no choices
    ]
    scores = {
        "set": {NONE: BEGINNING_FAVOURED, PAPER: PAPER_CELL, "a": cell(0.2, -0.07, 0.01), "b": cell(0.26, -0.01, 0.02)}
    }
    found = verdicts(studies, scores)
    assert found["d0"]["one-se"]["set"]["beat_paper"] == 2 and found["d0"]["one-se"]["set"]["seeds"] == 2
    assert found["d0"]["lowest"]["set"]["beat_paper"] == 1
    assert found["d1"]["one-se"]["set"] == {**judge(["b"], scores["set"]), **narrowing(["b"], scores["set"])}


def test_a_winner_narrows_the_gap_only_when_its_whole_interval_moves_towards_zero() -> None:
    row = {
        NONE: BEGINNING_FAVOURED,
        "clear": cell(0.2, -0.07, 0.01, gap=(4.0, 1.5, 6.5)),
        "within noise": cell(0.2, -0.07, 0.01, gap=(2.0, -0.5, 4.5)),
        "widened": cell(0.3, 0.03, 0.01, gap=(-3.0, -5.0, -1.0)),
        "overshot": cell(0.2, -0.07, 0.01, gap=(20.0, 16.0, 24.0), reversed_=True),
    }
    assert narrowing(["clear"], row)["narrowed"] == 1
    assert narrowing(["within noise", "widened", "overshot"], row)["narrowed"] == 0
    end_favoured = {**row, NONE: {"end_minus_begin": (6.0, 3.0, 9.0)}}  # here the gap narrows downwards
    assert narrowing(["clear"], end_favoured)["narrowed"] == 0
    assert narrowing(["widened"], end_favoured)["narrowed"] == 1


def test_a_winner_loses_ndcg_only_when_its_whole_interval_lies_below_zero() -> None:
    row = {
        NONE: BEGINNING_FAVOURED,
        "lost": cell(0.2, -0.07, 0.01, ndcg=-0.7),
        "level": cell(0.2, -0.07, 0.01, ndcg=-0.5),
    }
    assert (
        narrowing(["lost", "level", "lost"], row)["ndcg_lost"] == 2
    )  # ΔnDCG@10 −0.7 [−1.3, −0.1] and −0.5 [−1.1, +0.1]


def test_the_noise_table_counts_the_studies_whose_winner_the_tie_break_chose() -> None:
    from benchmarks.figures.rules import study_noise

    def study(seed: int, best: int, winner: int) -> dict[str, Any]:
        top = [
            {"trial": best, "config": "λ0.5 L[4,5]", "objective": 0.16, "gap": 0.0, "paired_se": 0.0},
            {"trial": 9, "config": "λ0.6 L[4,5]", "objective": 0.17, "gap": 0.01, "paired_se": 0.02},
        ]
        if winner != best:
            top.append({"trial": winner, "config": "λ0.5 L[5]", "objective": 0.18, "gap": 0.02, "paired_se": 0.03})
        return {
            "design": "wikipos-dev",
            "study": f"robust-third-seed{seed}",
            "feasible": 3,
            "best": best,
            "winner": winner,
            "tie_break_decided": winner != best,
            "top": top,
        }

    device = {"cpu": "c", "cores": 2, "memory_gib": 1, "gpu": None, "load_average": [1.0, 1.0, 1.0]}
    data = {"command": "x", "commit": "0" * 12, "device": device}
    data["results"] = {"studies": [study(0, 3, 2), study(1, 3, 3), {"design": "d", "study": "s-seed2", "feasible": 0}]}
    table = study_noise(data)
    assert "The tie-break chose the winner in 1 of 2 studies on `wikipos-dev`, 0 of 0 studies on `d`." in table
    seed0 = next(line for line in table.splitlines() if line.startswith("| `wikipos-dev` | 0 |"))
    assert "| λ0.5 L[5] | +0.020 ± 0.030 | +0.010 ± 0.020 | yes |" in seed0


def test_the_reading_names_the_sets_where_a_rule_keeps_every_promise_and_where_none_does() -> None:
    from benchmarks.figures.rules import rules_reading

    def verdict(beat: int, agree: bool = True, reversed_: int = 0) -> dict[str, Any]:
        return {"seeds": 5, "beat_paper": beat, "agree": agree, "reversed": reversed_}

    results = {
        "heldout": ["wikipos-test", "squad-test", "wikipos-mixed"],
        "verdicts": {
            "d": {
                "one-se": {
                    "wikipos-test": verdict(5),
                    "squad-test": verdict(4),
                    "wikipos-mixed": verdict(5, agree=False),
                },
                "lowest": {
                    "wikipos-test": verdict(5),
                    "squad-test": verdict(5, reversed_=1),
                    "wikipos-mixed": verdict(2),
                },
            },
            "e": {"one-se": {"wikipos-test": verdict(3), "squad-test": verdict(0), "wikipos-mixed": verdict(5, False)}},
        },
    }
    assert rules_reading(results) == [
        "- On `d`, every seed's winner beats the paper default, the seeds agree and none reverses on WikiPos-test "
        "(`one-se`, `lowest`); no rule does on `squad-test`, `mixed`.",
        "- On `e`, no rule meets all three tests on any set.",
    ]


def test_the_gap_figure_shows_each_exported_winner_and_counts_what_it_did_to_the_gap_and_to_ndcg() -> None:
    from benchmarks.figures.rules import gaps_held_out

    studies = [
        {"design": "titles", "study": "robust-third-seed0", "winner_config": "a"},
        {"design": "titles", "study": "robust-third-seed1", "winner_config": "b"},
        {"design": "titles", "study": "robust-third-seed2", "feasible": 0},  # nothing feasible: nothing exported
        {"design": "titles", "study": "robust-third-seed3", "winner_config": "cls_soft λ0.5 L[3, 4, 5] B128"},
        {"design": "titles", "study": "robust-third-seed4", "winner_config": "cls_soft λ0.5 L[3, 4, 5] B128"},
    ]
    shown = {"psi_ratio": 0.5, "end_minus_begin": (-6.0, -8.0, -4.0)}
    row = {
        NONE: {
            **cell(0.3, 0.02, 0.01, ndcg=0.0, gap=(0.0, 0.0, 0.0)),
            **shown,
            "end_minus_begin": (-12.0, -15.0, -9.0),
        },
        PAPER: {**cell(0.27, 0.0, 0.0, ndcg=-0.9, gap=(1.0, -1.0, 3.0)), **shown},
        "a": {**cell(0.2, -0.07, 0.01, gap=(6.0, 4.0, 8.0)), **shown},
        "b": {**cell(0.2, -0.07, 0.01, ndcg=-0.7, gap=(6.0, 4.0, 8.0)), **shown},
    }
    row["cls_soft λ0.5 L[3, 4, 5] B128"] = row[PAPER]  # two seeds exported the paper default's config
    results = {"heldout": ["wikipos-test"], "studies": studies, "scores": {"wikipos-test": row}}
    results["exported"] = exported(studies, results["scores"])
    device = {"cpu": "c", "cores": 2, "memory_gib": 1, "gpu": None, "load_average": [1.0, 1.0, 1.0]}
    text = gaps_held_out({"command": "x", "commit": "0" * 12, "device": device, "results": results})
    assert "| `titles` seed 1: b | 0.50× | -6.0 [-8.0, -4.0] | +6.0 [+4.0, +8.0] | -0.7 [-1.3, -0.1] |" in text
    assert "seed 2" not in text
    assert "| `titles` seeds 3, 4: cls_soft λ0.5 L[3–5] B128 (the paper default) | 0.50× |" in text
    assert (
        "- WikiPos-test, `titles`: the winner narrows the gap beyond noise in 2 of 4 studies and loses nDCG@10 beyond "
        "noise in 3; the paper default does not narrow it beyond noise and loses nDCG@10 beyond noise."
    ) in text
