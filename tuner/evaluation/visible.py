"""Position groups on the text the model sees: a query whose answer lies past the truncation point is dropped.

A loader places a query by its answer's character span in the full document. A document longer than
the model's maximum is truncated, so an answer past the cut is at a position the model never sees: its
query would be scored as a retrieval failure of that group and bias PSI. Such queries leave the dataset
with a counted warning; the documents stay (other queries may retrieve them).
"""

from __future__ import annotations

import logging

from tuner.data import PositionalDataset
from tuner.engine.models import LoadedModel

log = logging.getLogger(__name__)


def seen_characters(model: LoadedModel, texts: list[str]) -> list[int]:
    """Characters of each text that survive truncation at the model's maximum length (its last token's end)."""
    tokenizer = model.tokenizer
    encoded = tokenizer(texts, truncation=True, max_length=model.max_length, return_offsets_mapping=True)
    return [max((end for _, end in offsets), default=0) for offsets in encoded["offset_mapping"]]


def within_reach(dataset: PositionalDataset, model: LoadedModel) -> PositionalDataset:
    """`dataset` without the queries whose answer (their span's midpoint, `positions`) lies beyond what the
    model reads of their one relevant document."""
    placed = {}
    for qid, position in dataset.positions.items():
        relevant = [doc for doc, grade in dataset.qrels[qid].items() if grade > 0]
        if len(relevant) == 1:
            placed[qid] = (relevant[0], position)
    documents = sorted({doc for doc, _ in placed.values()})
    if not documents:
        return dataset
    if not model.tokenizer.is_fast:
        log.warning(
            "%s: a slow tokenizer gives no character offsets; queries are not checked against truncation",
            model.spec.alias,
        )
        return dataset
    seen = dict(zip(documents, seen_characters(model, [dataset.corpus[d] for d in documents])))
    beyond = [
        qid
        for qid, (doc, position) in placed.items()
        if seen[doc] < len(dataset.corpus[doc].rstrip()) and position * len(dataset.corpus[doc]) >= seen[doc]
    ]
    if not beyond:
        return dataset
    log.warning(
        "%s: %d of %d queries dropped: their answer lies past the %d tokens %s reads of their document (e.g. %s)",
        dataset.name,
        len(beyond),
        len(dataset.queries),
        model.max_length,
        model.spec.alias,
        beyond[0],
    )
    dropped = set(beyond)
    keep = [qid for qid in dataset.queries if qid not in dropped]
    if not keep:
        raise ValueError(
            f"{dataset.name}: every query's answer lies past the {model.max_length} tokens "
            f"{model.spec.alias} reads; use shorter passages or a model with a longer maximum"
        )
    return dataset.subset(keep)
