"""benchmarks/baseline_direction.py: a structure has a direction to reverse only when the tilt clears its noise."""

from __future__ import annotations

from dataclasses import asdict

from benchmarks.baseline_direction import Direction
from benchmarks.figures.studies import baseline_direction
from objectives.robustness import DIRECTION_Z


def test_a_direction_is_beyond_noise_at_the_rule_s_standard_errors() -> None:
    assert Direction("openings", 0.05, 0.01, 0.6, -0.017, 0.02).beyond_noise is False  # 0.85 SE: level
    assert Direction("dev", 0.3, 0.03, 0.5, -0.475, 0.062).beyond_noise is True
    assert Direction("packed", 0.05, 0.01, 0.6, DIRECTION_Z * 0.03, 0.03).beyond_noise is True  # at the limit
    assert Direction("x", 0.05, 0.01, 0.6, None, 0.0).beyond_noise is False


def test_the_table_names_each_structure_s_bias_as_the_figures_show_it() -> None:
    rows = [
        Direction("dev", 0.3, 0.03, 0.5, -0.475, 0.062),
        Direction("crops", 0.06, 0.01, 0.6, 0.079, 0.03),
        Direction("openings", 0.05, 0.01, 0.6, -0.017, 0.02),
    ]
    device = {"gpu": None, "cores": 2, "cpu": "cpu", "memory_gib": 24, "load_average": [1.0, 1.0, 1.0]}
    data = {
        "command": "python -m benchmarks.baseline_direction",
        "commit": "0" * 40,
        "device": device,
        "results": {
            "direction_z": DIRECTION_Z,
            "models": {"m": [asdict(r) | {"beyond_noise": r.beyond_noise} for r in rows]},
        },
    }
    lines = baseline_direction(data).splitlines()
    assert lines[6] == "**m**, uncalibrated, of 3 structures: beginning favoured on 1, end favoured on 1, level on 1."
    assert lines[2] == "| m | dev | 0.300 ± 0.030 | -0.475 ± 0.062 | beginning favoured |"
    assert lines[3].endswith("| +0.079 ± 0.030 | end favoured |")
    assert lines[4].endswith("| level (within noise): no direction to reverse |")
