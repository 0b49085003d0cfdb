"""Segment Embed Average and sentence shuffling on a tiny model (tiny vocabulary: words w0..w199)."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest

from tests.tiny import random_texts
from tuner.data import PositionalDataset
from tuner.engine.encoder import CalibratedEncoder
from tuner.engine.models import LoadedModel, load_model
from tuner.report.baselines import (
    ModelChunker,
    segment_embed_average,
    shuffle_corpus,
    shuffle_sentences,
    split_sentences,
)

CHUNK_TOKENS = 12


def punctuated(sentences: int, seed: int) -> str:
    """`sentences` sentences of 4-8 words each, ending in a full stop."""
    rng = random.Random(seed)
    return " ".join(
        " ".join(rng.choice(["w1", "w2", "w3", "w4", "w5", "w6", "w7"]) for _ in range(rng.randint(4, 8))) + "."
        for _ in range(sentences)
    )


LONG = punctuated(14, seed=0)  # ~95 tokens: several chunks
UNPUNCTUATED = random_texts(1, 40, 40, seed=3)[0]  # one "sentence" longer than the cap
SHORT = "w1 w2 w3."  # one chunk


@pytest.fixture(scope="module")
def tiny(tiny_model_dir) -> LoadedModel:
    return load_model(str(tiny_model_dir("bert")), pooling="mean")


def token_count(model: LoadedModel, text: str) -> int:
    return len(model.tokenizer(text, add_special_tokens=False)["input_ids"])


@pytest.mark.parametrize("text", [LONG, UNPUNCTUATED, SHORT, ""])
def test_chunks_cover_the_whole_text_within_the_cap(tiny: LoadedModel, text: str) -> None:
    chunks = ModelChunker(tiny, chunk_tokens=CHUNK_TOKENS).chunk(text)
    assert "".join(chunks) == text
    assert all(token_count(tiny, chunk) <= CHUNK_TOKENS for chunk in chunks)
    assert len(chunks) >= (token_count(tiny, text) + CHUNK_TOKENS - 1) // CHUNK_TOKENS


def plain_mean_pooled(model: LoadedModel, text: str) -> np.ndarray:
    """The text's embedding straight from the transformer (no posfair encoder): mean over its tokens, L2-normalised."""
    import torch

    with torch.no_grad():
        hidden = model.model(**model.tokenizer(text, return_tensors="pt")).last_hidden_state[0].double()
    mean = hidden.mean(dim=0).numpy()
    return mean / np.linalg.norm(mean)


def words(first: int, count: int) -> str:
    return " ".join(f"w{i}" for i in range(first, first + count))


# Three sentences of 12, 12 and 7 tokens (the full stop is one token): no two fit one 12-token chunk,
# so whatever the semantic chunker decides, the chunks are exactly the sentences.
SENTENCES = [words(1, 11) + ". ", words(20, 11) + ". ", words(40, 6) + "."]


def test_sea_is_the_normalised_mean_of_the_plain_chunk_vectors(tiny: LoadedModel) -> None:
    assert [token_count(tiny, s) for s in SENTENCES] == [12, 12, 7]
    vectors, truncated = segment_embed_average(
        tiny, ["".join(SENTENCES), SHORT], chunk_tokens=CHUNK_TOKENS, batch_size=4
    )
    mean = np.mean([plain_mean_pooled(tiny, sentence) for sentence in SENTENCES], axis=0)
    assert truncated == 0
    assert np.abs(vectors[0] - mean / np.linalg.norm(mean)).max() < 1e-5
    assert np.abs(vectors[1] - plain_mean_pooled(tiny, SHORT)).max() < 1e-5  # one chunk: the text's own vector


def test_sea_vectors_are_normalised_aligned_and_differ_for_long_documents(tiny: LoadedModel) -> None:
    texts = [LONG, SHORT, UNPUNCTUATED]
    vectors, _ = segment_embed_average(tiny, texts, chunk_tokens=CHUNK_TOKENS, batch_size=2)
    reversed_vectors, _ = segment_embed_average(tiny, texts[::-1], chunk_tokens=CHUNK_TOKENS, batch_size=2)
    plain = CalibratedEncoder(tiny).encode(texts)
    assert vectors.dtype == np.float32 and vectors.shape == plain.shape
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert np.abs(vectors - reversed_vectors[::-1]).max() < 1e-5  # row i belongs to text i
    assert np.abs(vectors[1] - plain[1]).max() < 1e-5  # one chunk: the plain embedding
    assert np.abs(vectors[0] - plain[0]).max() > 1e-3
    assert np.abs(vectors[2] - plain[2]).max() > 1e-3


def test_sentences_split_at_delimiters_and_join_back() -> None:
    text = "The first sentence is here. Is this the second one? Yes!\nA new paragraph starts here."
    sentences = split_sentences(text)
    assert "".join(sentences) == text
    assert [s.strip() for s in sentences] == [
        "The first sentence is here.",
        "Is this the second one? Yes!",
        "A new paragraph starts here.",
    ]  # "Yes!" is shorter than Chonkie's minimum sentence length and stays with its neighbour


def test_shuffling_is_seeded_and_keeps_the_sentences() -> None:
    def stripped(text: str) -> Counter[str]:
        return Counter(s.strip() for s in split_sentences(text))

    first = shuffle_sentences(LONG, random.Random(7))
    assert first == shuffle_sentences(LONG, random.Random(7))
    assert stripped(first) == stripped(LONG)
    orders = {shuffle_sentences(LONG, random.Random(seed)) for seed in range(5)}
    assert len(orders) > 1 and LONG not in orders
    assert shuffle_sentences(SHORT, random.Random(0)) == SHORT


def test_shuffle_corpus_is_per_document_and_independent_of_corpus_order() -> None:
    corpus = {"a": LONG, "b": punctuated(6, seed=1), "c": SHORT}
    dataset = PositionalDataset("toy", corpus, {"q": "w1"}, {"q": {"a": 1}})
    shuffled = shuffle_corpus(dataset, seed=3)
    alone = shuffle_corpus(PositionalDataset("toy", {"b": corpus["b"]}, {"q": "w1"}, {"q": {"b": 1}}), seed=3)
    assert list(shuffled.corpus) == list(corpus) and shuffled.queries == dataset.queries
    assert shuffled.corpus == shuffle_corpus(dataset, seed=3).corpus
    assert shuffled.corpus["b"] == alone.corpus["b"]
    assert shuffled.corpus != shuffle_corpus(dataset, seed=4).corpus
