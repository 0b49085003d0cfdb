"""What the Benchmarks page says of WikiPos-tuned winners on natural questions is what the numbers beside it say."""

from __future__ import annotations

from benchmarks.figures.natural import natural_reading


def cell(psi_minus_reference: float, se: float) -> dict[str, float]:
    return {"psi_minus_reference": psi_minus_reference, "psi_minus_reference_se": se}


def test_a_winner_is_called_fairer_than_the_paper_default_only_beyond_one_se_of_their_difference():
    record = {
        "winners": {"winner, seed 0": {}, "winner, seed 1": {}, "winner, seed 2": {}},
        "scores": {
            "squad-test": {
                "winner, seed 0": cell(-0.001, 0.007),  # within noise
                "winner, seed 1": cell(-0.025, 0.006),  # fairer by four SEs
                "winner, seed 2": cell(+0.044, 0.020),  # less fair
            }
        },
    }
    said = natural_reading(record, "squad-test")
    assert "the winner of seed 1 is fairer than the paper default by more than one SE" in said
    assert "the winners of seeds 0 and 2 are not fairer than the paper default beyond one SE" in said


def test_when_every_winner_is_within_noise_no_winner_is_called_fairer():
    record = {"winners": {"winner, seed 0": {}}, "scores": {"squad-test": {"winner, seed 0": cell(-0.005, 0.006)}}}
    said = natural_reading(record, "squad-test")
    assert "fairer than the paper default by more than one SE" not in said
    assert "the winner of seed 0 is not fairer than the paper default beyond one SE" in said
