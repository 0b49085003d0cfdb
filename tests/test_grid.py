"""`tune --grid paper`: exactly the paper's 24 configs and the baseline, unpruned, through the same study."""

from __future__ import annotations

import itertools
import logging
import re
from pathlib import Path

import optuna
import pytest

from tests.test_study import write_dataset
from tests.tiny import save_tiny
from tuner.calibration import ConfigError
from tuner.common.trials import DUPLICATE_ATTR, counted
from tuner.tuning.accounts import study_layer_tokens
from tuner.tuning.run import TuneSettings, tune
from tuner.tuning.search_space import PAPER_GRID, SearchSpace, grid_size


def test_the_paper_grid_has_24_configs() -> None:
    # λ ∈ {0.5, 1} × {last layer, last 50%} × basket {128, 256} × {Uniform, CLS-Soft, CLS-Hard (w 0.3)}
    assert grid_size(PAPER_GRID) == 2 * 2 * 2 * 3 == 24
    with pytest.raises(ConfigError, match="basket_size=256"):
        SearchSpace(basket_sizes=(64, 128)).check_grid(PAPER_GRID)
    with pytest.raises(ConfigError, match="weight=0.3"):
        SearchSpace(weight_low=0.35).check_grid(PAPER_GRID)


def test_tune_grid_paper_runs_each_grid_config_once_and_the_baseline(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # the disk cache's default folder, mlruns/cache, is the working directory's
    model = save_tiny("bert", tmp_path / "tiny-bert0", max_length=512)  # reads 512 tokens: a basket of 256 can fill
    data = write_dataset(tmp_path / "data", docs=6, words=95)  # content past 256 tokens: every grid basket fills
    settings = TuneSettings(
        model=str(model),
        pooling="cls",
        dataset=f"jsonl:{data}",
        heldout=None,
        grid="paper",
        hm_floor="-90%",
        max_ndcg_drop=None,
        max_reversal=None,
        storage=f"sqlite:///{tmp_path / 'o.db'}",
        tracking_uri=f"sqlite:///{tmp_path / 'm.db'}",
        output=tmp_path / "best.yaml",
        profile_docs=1,
        bootstrap=10,
    )
    assert settings.trials == 25 and not settings.prune  # the baseline and 24 configs, each on every structure
    with caplog.at_level(logging.INFO, logger="tuner"):
        tune(settings)
    study = optuna.load_study(study_name=settings.study_name_from_alias("tiny-bert0"), storage=settings.storage)
    # the estimate printed before the study is what the study then counted (the profile passage's length aside)
    estimate = re.search(r"layer-tokens \(padded tokens × layers run\): ≈ ([\d,]+)", caplog.text)
    assert estimate, caplog.text[-2000:]
    assert int(estimate[1].replace(",", "")) == pytest.approx(study_layer_tokens(study), rel=0.02)
    assert all(t.state != optuna.trial.TrialState.PRUNED for t in study.trials)
    ran = [t for t in study.trials if counted(t)]
    assert len(ran) == 25
    drawn = {
        (t.params["strength"], t.params["depth"], t.params["basket_size"], t.params["variant"], t.params.get("weight"))
        for t in ran
        if t.params["strength"] > 0
    }
    expected = {
        (s, d, b, v, 0.3 if v == "cls_hard" else None)
        for s, d, b, v in itertools.product(*(PAPER_GRID[k] for k in ("strength", "depth", "basket_size", "variant")))
    }
    assert drawn == expected
    repeats = [
        t for t in study.trials if DUPLICATE_ATTR in t.user_attrs
    ]  # the enqueued paper default, drawn again by the grid
    assert [study.trials[t.user_attrs[DUPLICATE_ATTR]].user_attrs.get("role") for t in repeats] == ["paper default"]
