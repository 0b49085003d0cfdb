"""Exact inner-product search: the retrieval step between encoding and scoring a calibration."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

Run = dict[str, dict[str, float]]

# Rows of scores materialised at once: 1,024 queries x 265k documents x float32 is about 1 GiB.
_QUERY_CHUNK = 1024


def exact_search(
    query_vectors: np.ndarray,
    doc_vectors: np.ndarray,
    query_ids: Sequence[str],
    doc_ids: Sequence[str],
    k: int = 100,
) -> Run:
    """Top-k documents per query by inner product (cosine for L2-normalised vectors), as a run.

    Brute force so that a change in nDCG is due to the calibration and never to an approximate index.
    Ties are broken towards the document listed first in `doc_ids`, also at the top-k boundary, so
    the same vectors always give the same run. (ir-measures, like trec_eval, re-orders tied scores
    by descending doc id when it scores the run; this rule decides which tied documents make the cut.)
    """
    queries = np.asarray(query_vectors, dtype=np.float32)
    docs = np.asarray(doc_vectors, dtype=np.float32)
    if queries.ndim != 2 or docs.ndim != 2 or queries.shape[1] != docs.shape[1]:
        raise ValueError(
            f"expected 2-D query and document matrices of equal width, got {queries.shape} and {docs.shape}"
        )
    if len(query_ids) != len(queries) or len(doc_ids) != len(docs):
        raise ValueError(
            f"{len(query_ids)} query ids for {len(queries)} query vectors, "
            f"{len(doc_ids)} doc ids for {len(docs)} document vectors"
        )
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    k = min(k, len(docs))
    if k == 0:
        return {qid: {} for qid in query_ids}
    run: Run = {}
    for start in range(0, len(queries), _QUERY_CHUNK):
        scores = queries[start : start + _QUERY_CHUNK] @ docs.T
        top = _top_k_indices(scores, k)
        top_scores = np.take_along_axis(scores, top, axis=1)
        for offset, (indices, values) in enumerate(zip(top.tolist(), top_scores.tolist())):
            run[query_ids[start + offset]] = {doc_ids[i]: s for i, s in zip(indices, values)}
    return run


def _top_k_indices(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k best scores per row, best first, ties to the lower index.

    `argpartition` is O(n) but picks arbitrarily among scores tied with the k-th best; the rows where
    that matters are redone exactly, which is rare for float32 embeddings.
    """
    top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    top_scores = np.take_along_axis(scores, top, axis=1)
    kth = top_scores.min(axis=1, keepdims=True)
    tied_in_row = (scores == kth).sum(axis=1)
    tied_in_top = (top_scores == kth).sum(axis=1)
    for row in np.flatnonzero(tied_in_row > tied_in_top):
        above = np.flatnonzero(scores[row] > kth[row])
        tied = np.flatnonzero(scores[row] == kth[row])[: k - len(above)]
        top[row] = np.concatenate([above, tied])
    top_scores = np.take_along_axis(scores, top, axis=1)
    order = np.lexsort((top, -top_scores), axis=1)
    return np.take_along_axis(top, order, axis=1)
