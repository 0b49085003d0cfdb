"""`tune encode` says how many texts were too short to calibrate, and the count is the texts it left alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import yaml
from typer.testing import CliRunner

from tests.tiny import export_of, random_texts
from tuner.cli.app import app
from tuner.engine.encoder import CalibratedEncoder
from tuner.engine.models import load_model


def test_encode_counts_the_texts_shorter_than_one_basket(tiny_model_dir, tmp_path: Path) -> None:
    loaded = load_model(str(tiny_model_dir("bert")), pooling="cls")
    config = loaded.default_config(basket_size=16, strength=1.0, layers="last")
    exported = export_of(loaded, config)
    (tmp_path / "best.yaml").write_text(
        yaml.safe_dump(exported.model_dump(mode="json", by_alias=True)), encoding="utf-8"
    )
    texts = random_texts(3, 2, 5, seed=1) + random_texts(3, 40, 60, seed=2)
    (tmp_path / "docs.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    result = CliRunner().invoke(
        app,
        [
            "encode",
            "--config",
            str(tmp_path / "best.yaml"),
            "--input",
            str(tmp_path / "docs.txt"),
            "--output",
            str(tmp_path / "emb.npy"),
        ],
    )
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    calibrated = np.load(tmp_path / "emb.npy")
    plain = CalibratedEncoder(loaded).encode(texts)
    untouched = int(np.isclose(calibrated, plain, atol=1e-6).all(axis=1).sum())
    assert untouched == 3, "the three short texts come out uncalibrated, the long ones do not"
    assert f"{untouched} shorter than one basket (16 tokens of content), left uncalibrated" in said, said


def test_python_encode_warns_once_when_documents_shorter_than_a_basket_stay_uncalibrated(tiny_model_dir) -> None:
    """What `tune encode` prints, Python's `encode()` warns: once per encoder, with the count of the call that met
    them."""
    import warnings

    from tuner.engine.encoder import ShortDocumentsWarning

    loaded = load_model(str(tiny_model_dir("bert")), pooling="cls")
    encoder = CalibratedEncoder(loaded, loaded.default_config(basket_size=16, strength=1.0, layers="last"))
    texts = random_texts(2, 2, 5, seed=1) + random_texts(3, 40, 60, seed=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        encoder.encode(texts)
        encoder.encode(texts)
        assert encoder.too_short == 2
        encoder.encode_query(texts)  # queries are never calibrated: nothing to say
    said = [str(w.message) for w in caught if issubclass(w.category, ShortDocumentsWarning)]
    assert said == [
        "2 of 5 documents are shorter than one basket (16 tokens of content), left uncalibrated "
        "(said once per encoder; `too_short` counts them per call)"
    ]
    with warnings.catch_warnings(record=True) as plain:
        warnings.simplefilter("always")
        CalibratedEncoder(loaded).encode(texts)  # no calibration: nothing left out
    assert not [w for w in plain if issubclass(w.category, ShortDocumentsWarning)]
