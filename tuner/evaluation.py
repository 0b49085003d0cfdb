"""One model on one benchmark: encode documents with a config, retrieve, score by position.

Queries are never calibrated, so their vectors are computed once per evaluator; so are the
uncalibrated document vectors, which every λ = 0 trial reuses. The last few configs' document
vectors are kept too, so re-scoring a study's winner costs nothing.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from objectives import PerQuery, PositionReport, evaluate, exact_search
from tuner.calibration import CalibrationConfig
from tuner.data import PositionalDataset
from tuner.encoder import CalibratedEncoder
from tuner.models import LoadedModel

RECENT_CONFIGS = 8


@dataclass(frozen=True)
class Evaluation:
    """What one configuration scored, and what it cost."""

    report: PositionReport
    per_query: PerQuery
    encode_seconds: float
    truncated: int


class Evaluator:
    """Scores calibration configs of one model on one dataset, reusing what does not change."""

    def __init__(self, model: LoadedModel, dataset: PositionalDataset, batch_size: int = 16, show_progress: bool = False) -> None:
        self.model = model
        self.dataset = dataset
        self.batch_size = batch_size
        self.show_progress = show_progress
        self.doc_ids = list(dataset.corpus)
        self.query_ids = list(dataset.queries)
        self._queries: np.ndarray | None = None
        self._documents: OrderedDict[str, tuple[np.ndarray, int]] = OrderedDict()  # config key → vectors, truncated

    def query_vectors(self) -> np.ndarray:
        if self._queries is None:
            encoder = CalibratedEncoder(self.model)
            self._queries = encoder.encode_query(
                [self.dataset.queries[q] for q in self.query_ids], batch_size=self.batch_size, show_progress_bar=self.show_progress
            )
        return self._queries

    def document_vectors(self, config: CalibrationConfig | None) -> tuple[np.ndarray, int]:
        """Calibrated document vectors and how many documents were truncated; λ = 0 is the baseline."""
        key = "baseline" if config is None or config.strength == 0.0 else config.model_dump_json()
        if key in self._documents:
            self._documents.move_to_end(key)
            return self._documents[key]
        encoder = CalibratedEncoder(self.model, config)
        vectors = encoder.encode([self.dataset.corpus[d] for d in self.doc_ids], batch_size=self.batch_size,
                                 show_progress_bar=self.show_progress)
        self._documents[key] = (vectors, encoder.truncated)
        while len(self._documents) > RECENT_CONFIGS + 1:
            oldest = next(k for k in self._documents if k != "baseline")
            del self._documents[oldest]
        return vectors, encoder.truncated

    def run(self, config: CalibrationConfig | None) -> Evaluation:
        queries = self.query_vectors()
        start = time.perf_counter()
        documents, truncated = self.document_vectors(config)
        seconds = time.perf_counter() - start
        return self.score(documents, queries, seconds, truncated)

    def score(self, documents: np.ndarray, queries: np.ndarray | None = None, seconds: float = 0.0, truncated: int = 0) -> Evaluation:
        """Exact top-100 by inner product, then per-position nDCG@10 / Recall@10 with ir-measures."""
        queries = self.query_vectors() if queries is None else queries
        run = exact_search(queries, documents, self.query_ids, self.doc_ids, k=100)
        report, per_query = evaluate(run, self.dataset)
        return Evaluation(report, per_query, seconds, truncated)
