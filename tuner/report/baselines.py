"""Baselines and perturbations the calibration is compared against (paper §4.4 and §7).

Segment Embed Average (SEA) asks whether simply cutting a passage into pieces and averaging their
embeddings removes position bias without touching the model: every piece is encoded from its own
start, so no part of the passage sits "late". Sentence shuffling destroys a document's positional
structure to check how much a method depends on where content sits (Table 3, "Shuffled").

Chunking choice. The paper chunks with Chonkie's semantic chunker, whose default embedding model
(minishlab/potion-base-32M) has to be downloaded and cannot be here. We keep the semantic chunker and
give it the evaluated model itself, uncalibrated, as its embedding model: boundaries then fall where
*this* model sees the topic change, no second model is needed, and the run stays offline. The other
semantic-chunking settings are Chonkie's defaults. Chunks are capped at `chunk_tokens` of the model's
own tokenizer (default 128: the paper does not state SEA's chunk size; this matches its basket size). A chunk
still over the cap (one very long sentence, or a text with too few sentences for the semantic chunker
to split) is cut at token boundaries using the tokenizer's character offsets, so pieces are exact
slices of the text: no chunk is truncated by the encoder and the chunks always join back to the text.
(Chonkie's token and recursive chunkers decode tokens at that level, which loses case and characters.)
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Sequence
from dataclasses import replace
from functools import cache
from typing import Any

import numpy as np
from chonkie import BaseEmbeddings, SemanticChunker, SentenceChunker

from tuner.data import PositionalDataset
from tuner.engine.encoder import CalibratedEncoder
from tuner.engine.models import LoadedModel
from tuner.tracking.progress import Phase, clock

log = logging.getLogger(__name__)


class ModelEmbeddings(BaseEmbeddings):
    """A loaded model, uncalibrated, behind Chonkie's embedding interface (for semantic chunking)."""

    def __init__(self, model: LoadedModel, batch_size: int | None = None) -> None:
        super().__init__()
        self._model = model
        self._encoder = CalibratedEncoder(model)
        self._batch_size = batch_size

    def embed(self, text: str) -> np.ndarray:
        return self.embed_batch([text])[0]

    def embed_batch(self, texts: list[str]) -> list[np.ndarray]:
        return list(self._encoder.encode(texts, batch_size=self._batch_size, show_progress_bar=False))

    @property
    def dimension(self) -> int:
        return self._model.dimension

    def get_tokenizer(self) -> Any:
        return self._model.tokenizer


class ModelChunker:
    """Semantic chunks of at most `chunk_tokens` model tokens that, joined, give back the text."""

    def __init__(self, model: LoadedModel, chunk_tokens: int = 128, batch_size: int | None = None) -> None:
        if chunk_tokens < 1:
            raise ValueError(f"chunk_tokens must be at least 1, got {chunk_tokens}")
        self.chunk_tokens = chunk_tokens
        self._tokenizer = model.tokenizer
        self._semantic = SemanticChunker(embedding_model=ModelEmbeddings(model, batch_size), chunk_size=chunk_tokens)

    def chunk(self, text: str) -> list[str]:
        """The text's chunks in order; a blank text is its own single chunk, so every document gets a vector."""
        chunks = [chunk.text for chunk in self._semantic.chunk(text)] or [text]
        offsets = self._tokenizer(chunks, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        pieces: list[str] = []
        for chunk, spans in zip(chunks, offsets):
            cuts = [0, *(spans[i][0] for i in range(self.chunk_tokens, len(spans), self.chunk_tokens)), len(chunk)]
            pieces.extend(chunk[start:end] for start, end in zip(cuts, cuts[1:]))
        return pieces


def segment_embed_average(
    model: LoadedModel, texts: Sequence[str], chunk_tokens: int = 128, batch_size: int | None = None
) -> tuple[np.ndarray, int]:
    """SEA document vectors (float32, L2-normalised, one row per text) and how many chunks were truncated.

    Each text is chunked (see module docstring), every chunk is encoded without calibration, and a
    document's vector is the normalised mean of its chunk vectors.
    """
    chunker = ModelChunker(model, chunk_tokens, batch_size)
    chunks: list[list[str]] = []
    with Phase(
        f"Segment Embed Average: chunking {len(texts)} documents semantically (the model embeds their sentences)"
    ):
        started, step = time.monotonic(), max(1, len(texts) // 10)
        for done, text in enumerate(texts, 1):
            chunks.append(chunker.chunk(text))
            if done % step == 0 and done < len(texts):
                elapsed = time.monotonic() - started
                log.info(
                    "Segment Embed Average: %d of %d documents chunked · elapsed %s · ETA %s",
                    done,
                    len(texts),
                    clock(elapsed),
                    clock(elapsed / done * (len(texts) - done)),
                )
    pieces = [c for doc in chunks for c in doc]
    encoder = CalibratedEncoder(model)
    with Phase(f"Segment Embed Average: encoding {len(pieces)} chunks"):
        vectors = encoder.encode(pieces, batch_size=batch_size)
    owner = np.repeat(np.arange(len(texts)), [len(doc) for doc in chunks])
    sums = np.zeros((len(texts), vectors.shape[1]), dtype=np.float64)
    np.add.at(sums, owner, vectors)
    norms = np.linalg.norm(sums, axis=1, keepdims=True)
    return (sums / np.maximum(norms, 1e-12)).astype(np.float32), encoder.truncated


@cache
def _sentence_splitter() -> SentenceChunker:
    # chunk_size 1 with at least one sentence per chunk: every chunk is exactly one sentence, split at
    # the same delimiters the semantic chunker uses (". ", "! ", "? ", newline).
    return SentenceChunker(tokenizer="character", chunk_size=1)


def split_sentences(text: str) -> list[str]:
    """The text's sentences in order, each with its trailing delimiter and whitespace; they join back to `text`."""
    return [chunk.text for chunk in _sentence_splitter().chunk(text)]


def shuffle_sentences(text: str, rng: random.Random) -> str:
    """The text's sentences in a random order, joined by single spaces (paragraph breaks are not kept)."""
    sentences = [s.strip() for s in split_sentences(text)]
    sentences = [s for s in sentences if s]
    rng.shuffle(sentences)
    return " ".join(sentences)


def shuffle_corpus(dataset: PositionalDataset, seed: int = 0) -> PositionalDataset:
    """The dataset with every document's sentences shuffled.

    Each document gets its own generator seeded by (seed, doc id), so its shuffle does not depend on
    corpus order or on which other documents are present.
    """
    corpus = {
        doc_id: shuffle_sentences(text, random.Random(f"{seed}:{doc_id}")) for doc_id, text in dataset.corpus.items()
    }
    return replace(dataset, name=f"{dataset.name} (shuffled)", corpus=corpus)
