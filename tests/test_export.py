"""The exported YAML carries `basket_shares`; a YAML written before the option existed loads as `equal`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.tiny import export_of, random_texts
from tuner.engine.encoder import CalibratedEncoder
from tuner.engine.exported import load_exported, write_exported
from tuner.engine.models import LoadedModel, load_model


@pytest.fixture(scope="module")
def tiny(tiny_model_dir) -> LoadedModel:
    return load_model(str(tiny_model_dir("bert")), pooling="mean")


def export(tiny: LoadedModel, path: Path, **config: object) -> Path:
    exported = export_of(tiny, tiny.default_config(basket_size=8, strength=0.9, **config))
    return write_exported(exported, path)


def test_the_yaml_carries_basket_shares_and_encodes_with_it(tiny: LoadedModel, tmp_path: Path) -> None:
    path = export(tiny, tmp_path / "by_size.yaml", basket_shares="by_size")
    assert yaml.safe_load(path.read_text(encoding="utf-8"))["calibration"]["basket_shares"] == "by_size"
    assert load_exported(path).calibration.basket_shares == "by_size"
    texts = random_texts(6, 10, 40, seed=2)
    config = tiny.default_config(basket_size=8, strength=0.9, layers=[1, 2], basket_shares="by_size")
    assert (
        np.abs(CalibratedEncoder.from_yaml(path).encode(texts) - CalibratedEncoder(tiny, config).encode(texts)).max()
        < 1e-6
    )


def test_a_yaml_from_before_the_option_calibrates_as_the_paper(tiny: LoadedModel, tmp_path: Path) -> None:
    data = yaml.safe_load(export(tiny, tmp_path / "new.yaml").read_text(encoding="utf-8"))
    assert data["calibration"].pop("basket_shares") == "equal"  # the config default: the paper's
    old = tmp_path / "old.yaml"
    old.write_text(yaml.safe_dump(data), encoding="utf-8")
    assert load_exported(old).calibration.basket_shares == "equal"


def test_w_is_written_only_for_cls_hard(tiny: LoadedModel, tmp_path: Path) -> None:
    """w is CLS-Hard's fixed self-mass; a YAML of another variant does not carry it (and loads with the default)."""
    soft = yaml.safe_load(export(tiny, tmp_path / "soft.yaml", variant="cls_soft").read_text(encoding="utf-8"))
    hard = yaml.safe_load(
        export(tiny, tmp_path / "hard.yaml", variant="cls_hard", weight=0.2).read_text(encoding="utf-8")
    )
    assert "weight" not in soft["calibration"] and hard["calibration"]["weight"] == 0.2
    assert load_exported(tmp_path / "hard.yaml").calibration.weight == 0.2


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_the_yaml_is_written_with_the_mode_open_would_give(tiny: LoadedModel, tmp_path: Path, umask: int) -> None:
    import os
    import stat

    previous = os.umask(umask)
    try:
        path = export(tiny, tmp_path / "best.yaml")
    finally:
        os.umask(previous)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask  # 0644 under the usual umask, not mkstemp's 0600


def test_the_provenance_names_versions_and_the_commit(tiny: LoadedModel, tmp_path: Path) -> None:
    import subprocess

    import torch
    import transformers

    from tuner import __version__

    provenance = load_exported(export(tiny, tmp_path / "p.yaml")).provenance
    assert provenance.versions == {
        "posfair": __version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True)
    if head.returncode == 0:  # a git checkout: the commit is recorded (marked if the source differs from it)
        assert provenance.git_commit is not None and provenance.git_commit.split()[0] == head.stdout.strip()
