"""The drift-transfer benchmark's configs are real configs and its yardstick is the paper default."""

from __future__ import annotations

import pytest

from benchmarks.drift_transfer import CONFIGS, REFERENCE, spearman
from tuner.calibration import CalibrationConfig


def test_every_config_is_valid_and_the_yardstick_is_the_paper_default() -> None:
    configs = {label: CalibrationConfig(pooling="mean", **knobs) for label, knobs in CONFIGS.items()}
    paper = configs[REFERENCE]  # §4: CLS-Soft, λ 0.5, the last 50% of the layers, baskets of 128
    assert (paper.variant, paper.strength, paper.resolve_layers(6), paper.basket_size) == (
        "cls_soft",
        0.5,
        (3, 4, 5),
        128,
    )
    assert len({c.model_dump_json() for c in configs.values()}) == len(configs)  # no config twice


def test_spearman_is_the_correlation_of_the_ranks() -> None:
    assert spearman([0.1, 0.5, 0.3], [1.0, 30.0, 2.0]) == pytest.approx(1.0)
    assert spearman([0.1, 0.5, 0.3], [3.0, -1.0, 0.0]) == pytest.approx(-1.0)
    assert spearman([1.0, 2.0, 3.0, 4.0], [1.0, 3.0, 2.0, 4.0]) == pytest.approx(0.8)  # 1 − 6·2 / (4·15)
