"""The exported YAML carries `basket_shares`; a YAML written before the option existed loads as `equal`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.tiny import random_texts
from tuner.encoder import CalibratedEncoder
from tuner.export import build_export, load_exported, write_exported
from tuner.models import LoadedModel, load_model


@pytest.fixture(scope="module")
def tiny(tiny_model_dir) -> LoadedModel:
    return load_model(str(tiny_model_dir("bert")), pooling="mean")


def export(tiny: LoadedModel, path: Path, **config: object) -> Path:
    exported = build_export(tiny, tiny.default_config(basket_size=8, strength=0.9, **config), {"tuning": {"hm": 0.5}},
                            study="s", trial=0, storage="sqlite://", dataset="d", dataset_fingerprint="f", seed=0)
    return write_exported(exported, path)


def test_the_yaml_carries_basket_shares_and_encodes_with_it(tiny: LoadedModel, tmp_path: Path) -> None:
    path = export(tiny, tmp_path / "by_size.yaml", basket_shares="by_size")
    assert yaml.safe_load(path.read_text(encoding="utf-8"))["calibration"]["basket_shares"] == "by_size"
    assert load_exported(path).calibration.basket_shares == "by_size"
    texts = random_texts(6, 10, 40, seed=2)
    config = tiny.default_config(basket_size=8, strength=0.9, layers=[1, 2], basket_shares="by_size")
    assert np.abs(CalibratedEncoder.from_yaml(path).encode(texts) - CalibratedEncoder(tiny, config).encode(texts)).max() < 1e-6


def test_a_yaml_from_before_the_option_calibrates_as_the_paper(tiny: LoadedModel, tmp_path: Path) -> None:
    data = yaml.safe_load(export(tiny, tmp_path / "new.yaml").read_text(encoding="utf-8"))
    assert data["calibration"].pop("basket_shares") == "equal"  # the config default: the paper's
    old = tmp_path / "old.yaml"
    old.write_text(yaml.safe_dump(data), encoding="utf-8")
    assert load_exported(old).calibration.basket_shares == "equal"
