"""One model on one benchmark: encode documents with a config, retrieve, score by position.

What does not change between trials is computed once and reused; what is kept, where and within what
budget is `tuner.evaluation.cache_policy`'s to decide. This module runs the passes:
- query vectors (queries are never calibrated) and the uncalibrated baseline document vectors, from the
  cache or one pass each; the baseline pass also records the inputs of the layers where the search
  space's depths start calibrating, so a trial whose calibration starts at or after a cached layer runs
  only the layers from there on (`tuner.engine.prefix`);
- the baseline vectors of the batches a config cannot change (no passage in them fills one basket:
  calibration leaves such passages alone), copied instead of encoded;
- the tokenised, length-sorted batches, built once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from objectives import PerQuery, PositionReport, Run, evaluate, exact_search
from tuner.calibration import CalibrationConfig
from tuner.data import PositionalDataset
from tuner.engine.batching import Batches, choose_batching
from tuner.engine.encoder import CalibratedEncoder, forward
from tuner.engine.models import LoadedModel
from tuner.engine.prefix import record_layer_inputs, recorded_into, resume_point
from tuner.evaluation.cache_policy import CachePolicy, FirstLayerSums

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Evaluation:
    """What one configuration scored, what it cost, and how far it moved the document vectors (`drift`:
    the mean 1 − cosine to the uncalibrated vectors; 0 for no calibration)."""

    report: PositionReport
    per_query: PerQuery
    encode_seconds: float
    truncated: int
    drift: float = 0.0
    layer_tokens: int = 0  # what this run's passes cost (`Batches.layer_tokens`): 0 when every vector was at hand
    run: Run = field(default_factory=dict, repr=False, compare=False)  # the top 100 per query it was scored from


@dataclass
class PassCounts:
    """How document vectors were obtained: for tests, logs and the trial-cost benchmark."""

    full: int = 0  # full forward passes over the corpus
    resumed: dict[int, int] = field(default_factory=dict)  # layer → passes resumed from it
    recorded: int = 0  # passes that only recorded layer inputs (stopped early)
    baseline_from_disk: int = 0
    queries_from_disk: int = 0
    layer_tokens: int = 0  # padded tokens × layers run by every pass, queries and recording passes included


class Evaluator:
    """Scores calibration configs of one model on one dataset, reusing what does not change.

    batch_size, batch_tokens  passages and padded tokens per batch (None: `encoder.choose_batching`)
    cache_dir, disk_cache, cache_budget, prefix_layers, ram_limit  what to keep and where (`CachePolicy`)
    reuse_baseline  copy baseline vectors for batches a config cannot change instead of encoding them
    keep_on_disk    keep every calibration's document vectors in the disk cache too, for sets that studies score
                    with the same configs (the held-out sets: the paper default, a re-exported winner)
    keep_layer_inputs  False: layer inputs only for this evaluator's life (`CachePolicy`)
    """

    def __init__(
        self,
        model: LoadedModel,
        dataset: PositionalDataset,
        batch_size: int | None = None,
        show_progress: bool = False,
        *,
        batch_tokens: int | None = None,
        cache_dir: Path | None = None,
        disk_cache: bool = True,
        cache_budget: int | None = None,
        prefix_layers: Sequence[int] = (),
        ram_limit: int | None = None,
        reuse_baseline: bool = True,
        keep_on_disk: bool = False,
        keep_layer_inputs: bool = True,
    ) -> None:
        self.model = model
        self.dataset = dataset
        self.batch_size, self.batch_tokens = choose_batching(model, batch_size, batch_tokens)
        if batch_tokens is None and self.batch_tokens is not None:
            log.info(
                "batches of up to %d tokens (%d passages of %s's %d), chosen from the free memory of %s",
                self.batch_tokens,
                self.batch_tokens // model.max_length,
                model.spec.alias,
                model.max_length,
                model.device,
            )
        elif batch_size is None and self.batch_tokens is None:
            log.info("batch size %d, chosen from the free memory of %s", self.batch_size, model.device)
        self.show_progress = show_progress
        self.doc_ids = list(dataset.corpus)
        self.query_ids = list(dataset.queries)
        self.reuse_baseline = reuse_baseline
        self.counts = PassCounts()
        self.cache = CachePolicy(
            model,
            dataset,
            self.batch_size,
            self.batch_tokens,
            cache_dir=cache_dir,
            disk_cache=disk_cache,
            cache_budget=cache_budget,
            prefix_layers=prefix_layers,
            ram_limit=ram_limit,
            keep_on_disk=keep_on_disk,
            keep_layer_inputs=keep_layer_inputs,
        )
        self._queries: np.ndarray | None = None
        self._baseline: tuple[np.ndarray, int] | None = None
        self._batches: Batches | None = None
        self._doc_texts = model.documents([dataset.corpus[d] for d in self.doc_ids])  # as `encode_document` reads them

    @property
    def dimension(self) -> int:
        return self.model.dimension

    # ------------------------------------------------------------------------------------- queries

    def query_vectors(self) -> np.ndarray:
        if self._queries is None:
            loaded = self.cache.load_queries((len(self.query_ids), self.dimension))
            if loaded is not None:
                self._queries = loaded
                self.counts.queries_from_disk += 1
            else:
                encoder = CalibratedEncoder(self.model)
                self._queries = encoder.encode_query(
                    [self.dataset.queries[q] for q in self.query_ids],
                    batch_size=self.batch_size,
                    batch_tokens=self.batch_tokens,
                    show_progress_bar=self.show_progress,
                )
                self.counts.layer_tokens += encoder.layer_tokens
                self.cache.save_queries(self._queries)
        return self._queries

    # ----------------------------------------------------------------------------------- documents

    def batches(self) -> Batches:
        """The corpus tokenised once, in `CalibratedEncoder`'s length-sorted batches."""
        if self._batches is None:
            self._batches = Batches.build(self.model, self._doc_texts, self.batch_size, self.batch_tokens)
            if self.batch_tokens is not None:
                sizes = [rows for rows, _ in self._batches.shapes]
                log.info(
                    "%s: %d passages in %d batch(es) of <= %d padded tokens (%d-%d passages each)",
                    self.dataset.name,
                    self._batches.count,
                    len(sizes),
                    self.batch_tokens,
                    min(sizes, default=0),
                    max(sizes, default=0),
                )
        return self._batches

    def longest_content(self) -> int:
        """Content tokens (less the isolated ones) of the longest passage: no larger basket can be filled."""
        return self.batches().longest - len(self.model.default_config().isolated_roles())

    def document_vectors(self, config: CalibrationConfig | None) -> tuple[np.ndarray, int]:
        """Calibrated document vectors and how many documents were truncated; λ = 0 is the baseline."""
        if config is None or config.strength == 0.0:
            return self.baseline_vectors()
        spec = CalibratedEncoder(self.model, config).spec  # validates pooling and layers
        assert spec is not None
        at_hand = self.cache.calibrated(spec, (len(self.doc_ids), self.dimension))
        if at_hand is not None:
            return at_hand
        batches = self.batches()
        baseline = self._baseline[0] if self.reuse_baseline and self._baseline is not None else None
        start = self.resume_layer(min(spec.layers))
        sums = self.first_layer_sums()
        first_layer = sums.for_batch if sums is not None else None
        ran: list[int] = []
        if start is None:
            vectors = forward(
                self.model,
                batches,
                spec,
                baseline=baseline,
                first_layer=first_layer,
                show_progress=self.show_progress,
                ran=ran,
            )
            self.counts.full += 1
        else:
            vectors = forward(
                self.model,
                batches,
                spec,
                baseline=baseline,
                first_layer=first_layer,
                around=self.cache.resumed_from(start),
                show_progress=self.show_progress,
                ran=ran,
            )
            self.counts.resumed[start] = self.counts.resumed.get(start, 0) + 1
        self.counts.layer_tokens += batches.layer_tokens(ran, self.model.num_layers - (start or 0))
        self.cache.encoded(spec, vectors, batches.truncated)
        return vectors, batches.truncated

    def pass_cost(self, config: CalibrationConfig) -> int:
        """What `run(config)` encodes at most, in layer-tokens: the batches it cannot copy from the baseline, from
        the layer its pass resumes at (0 when it finds the vectors at hand)."""
        spec = CalibratedEncoder(self.model, config).spec
        if spec is None:  # no calibration: the baseline's vectors
            return 0
        batches = self.batches()
        encoded = batches.changed_by(spec) if self.reuse_baseline else range(len(batches))
        return batches.layer_tokens(encoded, self.layers_run(min(spec.layers)))

    def layers_run(self, first_calibrated: int) -> int:
        """The layers a pass whose first calibrated layer is `first_calibrated` runs: from the deepest cached layer at
        or before it (`resume_point`, as `resume_layer` finds it), else all of them."""
        return self.model.num_layers - (resume_point(self.cached_layers(), first_calibrated) or 0)

    def baseline_vectors(self) -> tuple[np.ndarray, int]:
        """Uncalibrated document vectors: from memory, from disk, or one full pass that also records layer inputs."""
        if self._baseline is None and not self._baseline_on_disk():
            self.cache.plan_layer_inputs(self.batches())
            batches = self.batches()
            vectors = self._baseline_pass()
            self._baseline = (vectors, batches.truncated)
            self.cache.save_baseline(vectors, batches.truncated)
        assert self._baseline is not None
        return self._baseline

    def first_layer_sums(self) -> FirstLayerSums | None:
        """The study's shared first-layer sums (`CachePolicy.first_layer_sums`); None without caching."""
        return self.cache.first_layer_sums(self.batches())

    def resume_layer(self, first_calibrated: int) -> int | None:
        """The deepest cached layer at or before the first calibrated one (recording it if needed)."""
        if not self.cache.may_resume(first_calibrated):
            return None
        self.cache.plan_layer_inputs(self.batches())
        if self.cache.needs_recording():
            if self._baseline is None and not self._baseline_on_disk():
                self.baseline_vectors()  # one full pass: the baseline, recording the inputs on the way
            else:
                self._recording_pass()
        return self.cache.resume_layer(first_calibrated)

    def cached_layers(self) -> tuple[int, ...]:
        """The layers whose inputs are cached (or will be recorded by the next pass over the corpus)."""
        return self.cache.cached_layers(self.batches())

    def _baseline_on_disk(self) -> bool:
        """Load valid baseline vectors from the disk cache, if there are any."""
        loaded = self.cache.load_baseline((len(self.doc_ids), self.dimension))
        if loaded is not None:
            self._baseline = loaded
            self.counts.baseline_from_disk += 1
        return loaded is not None

    def _baseline_pass(self) -> np.ndarray:
        """A plain pass over the corpus, recording the missing layer inputs on the way."""
        batches = self.batches()
        self.counts.layer_tokens += batches.layer_tokens(range(len(batches)), self.model.num_layers)
        if not self.cache.needs_recording():
            vectors = forward(self.model, batches, None, show_progress=self.show_progress)
        else:
            with self.cache.recording() as recording:
                vectors = forward(
                    self.model,
                    batches,
                    None,
                    around=recorded_into(recording.stack, recording.layers, recording.sink),
                    show_progress=self.show_progress,
                )
        self.counts.full += 1
        return vectors

    def _recording_pass(self) -> None:
        """Record the missing layer inputs only (the baseline is known), stopping each batch at the deepest."""
        with self.cache.recording() as recording:
            record_layer_inputs(self.model, self.batches(), recording.stack, recording.layers, recording.sink)
        self.counts.recorded += 1
        deepest = max(recording.layers)  # layers 0..deepest-1 run
        self.counts.layer_tokens += self.batches().layer_tokens(range(len(self.batches())), deepest)

    # ------------------------------------------------------------------------------------- scoring

    def run(self, config: CalibrationConfig | None) -> Evaluation:
        spent = self.counts.layer_tokens
        queries = self.query_vectors()
        start = time.perf_counter()
        documents, truncated = self.document_vectors(config)
        seconds = time.perf_counter() - start
        evaluation = replace(
            self.score(documents, queries, seconds, truncated), layer_tokens=self.counts.layer_tokens - spent
        )
        return replace(evaluation, drift=self.drift(documents))

    def run_over(self, source: Evaluator, config: CalibrationConfig | None) -> Evaluation:
        """This evaluator's queries scored over `source`'s document vectors (one corpus: a length half, a held-out
        part of it), encoding only what `source` does not hold; the cost is what that encoding took."""
        if source.doc_ids != self.doc_ids:
            raise ValueError(f"{self.dataset.name} and {source.dataset.name} do not share one corpus in one order")
        spent = source.counts.layer_tokens + self.counts.layer_tokens
        documents, truncated = source.document_vectors(config)
        scored = self.score(documents, truncated=truncated)
        return replace(
            scored,
            layer_tokens=source.counts.layer_tokens + self.counts.layer_tokens - spent,
            drift=source.drift(documents),
        )

    def drift(self, documents: np.ndarray) -> float:
        """How far `documents` moved from the uncalibrated vectors: the mean 1 − cosine (0 for the baseline itself)."""
        baseline = self.baseline_vectors()[0]
        if documents is baseline:
            return 0.0
        return max(float(np.mean(1.0 - np.einsum("ij,ij->i", documents, baseline, dtype=np.float64))), 0.0)

    def score(
        self, documents: np.ndarray, queries: np.ndarray | None = None, seconds: float = 0.0, truncated: int = 0
    ) -> Evaluation:
        """Exact top-100 by inner product, then per-position nDCG@10 / Recall@10 with ir-measures."""
        queries = self.query_vectors() if queries is None else queries
        run = exact_search(queries, documents, self.query_ids, self.doc_ids, k=100)
        report, per_query = evaluate(run, self.dataset)
        return Evaluation(report, per_query, seconds, truncated, run=run)
