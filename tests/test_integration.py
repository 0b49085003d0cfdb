"""sentence-transformers integration: one changed line, the same vectors as posfair's own encoder."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.tiny import export_of
from tuner.engine.encoder import CalibratedEncoder
from tuner.engine.exported import write_exported
from tuner.engine.integration import load_sentence_transformer
from tuner.engine.models import load_model

LONG = " ".join(["The lighthouse keeper logged every ship that passed the northern cape in winter."] * 30)


@pytest.fixture(scope="module")
def minilm_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    loaded = load_model("minilm")
    exported = export_of(
        loaded, loaded.default_config(strength=1.0, layers="last", basket_size=64), metrics={"tuning": {}}
    )
    return write_exported(exported, tmp_path_factory.mktemp("st") / "best.yaml")


def test_documents_are_calibrated_like_posfair_and_queries_are_not(minilm_config: Path) -> None:
    model = load_sentence_transformer(minilm_config)
    ours = CalibratedEncoder.from_yaml(minilm_config)
    texts = [LONG, "a short note"]
    documents = model.encode(texts, normalize_embeddings=True)
    assert np.abs(documents - ours.encode(texts)).max() < 1e-5
    assert np.abs(model.encode_document(texts, normalize_embeddings=True) - documents).max() < 1e-6
    queries = model.encode_query([LONG], normalize_embeddings=True)
    assert np.abs(queries - ours.encode_query([LONG])).max() < 1e-5
    assert 1 - float(queries[0] @ documents[0]) > 1e-4  # the query path really skipped calibration


def test_one_text_per_batch_gives_the_same_vectors(minilm_config: Path) -> None:
    """sentence-transformers keeps one calibration context across its batches: every batch of another shape
    or mask must get its own basket geometry (batch_size=1 makes every batch differ from the one before)."""
    model = load_sentence_transformer(minilm_config)
    texts = [LONG, "a short note", " ".join(LONG.split()[:120])]
    expected = CalibratedEncoder.from_yaml(minilm_config).encode(texts)
    one_by_one = model.encode(texts, batch_size=1, normalize_embeddings=True)
    assert np.abs(one_by_one - expected).max() < 1e-5
