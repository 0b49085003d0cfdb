"""One model on one benchmark: encode documents with a config, retrieve, score by position.

What does not change between trials is computed once and reused:
- query vectors (queries are never calibrated) and the uncalibrated baseline document vectors, kept
  in memory and on disk (`tuner.cache`), so every study on the same model, revision and dataset
  reuses them;
- the hidden states entering the layers where the search space's depths start calibrating
  (`prefix_layers`), recorded during the baseline pass within `cache_budget` bytes: a trial whose
  calibration starts at or after a cached layer runs only the layers from there on
  (`tuner.prefix`);
- the baseline vectors of the batches a config cannot change (no passage in them fills one basket:
  calibration leaves such passages alone), copied instead of encoded;
- the last few configs' document vectors, keyed by the resolved calibration (two configs that mean
  the same layers and weights share them), so re-scoring a study's winner costs nothing;
- the tokenised, length-sorted batches.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from objectives import PerQuery, PositionReport, evaluate, exact_search
from tuner.cache import (
    DEFAULT_BUDGET,
    DEFAULT_CACHE_DIR,
    DiskCache,
    LayerInputs,
    LayerInputStore,
    default_ram_limit,
    engine_identity,
    model_identity,
    slug,
    texts_digest,
)
from tuner.calibration import CalibrationConfig, ResolvedCalibration
from tuner.calibration.attention import FirstLayerSums
from tuner.data import PositionalDataset
from tuner.encoder import CalibratedEncoder, choose_batching
from tuner.models import LoadedModel
from tuner.prefix import Batches, LayerStack, ResumeUnsupportedError, encode_batches, prefix_layers_for

log = logging.getLogger(__name__)

RECENT_CONFIGS = 8
CACHE_DIR_ENV = "POSFAIR_CACHE_DIR"


def default_cache_dir() -> Path:
    """`$POSFAIR_CACHE_DIR`, else `mlruns/cache` under the working directory (next to the study store)."""
    return Path(os.environ.get(CACHE_DIR_ENV) or DEFAULT_CACHE_DIR)


@dataclass(frozen=True)
class Evaluation:
    """What one configuration scored, what it cost, and how far it moved the document vectors (`drift`:
    the mean 1 − cosine to the uncalibrated vectors; 0 for no calibration)."""

    report: PositionReport
    per_query: PerQuery
    encode_seconds: float
    truncated: int
    drift: float = 0.0


@dataclass
class PassCounts:
    """How document vectors were obtained: for tests, logs and the trial-cost benchmark."""

    full: int = 0  # full forward passes over the corpus
    resumed: dict[int, int] = field(default_factory=dict)  # layer → passes resumed from it
    recorded: int = 0  # passes that only recorded layer inputs (stopped early)
    baseline_from_disk: int = 0
    queries_from_disk: int = 0


class Evaluator:
    """Scores calibration configs of one model on one dataset, reusing what does not change.

    batch_size, batch_tokens  passages and padded tokens per batch (None: `encoder.choose_batching`)
    cache_dir     where query vectors, baseline vectors and layer inputs persist between runs;
                  None: `default_cache_dir()`
    disk_cache    False keeps everything in memory (layer inputs then go to a temporary folder)
    cache_budget  bytes of layer inputs to cache at most (None: `tuner.cache.DEFAULT_BUDGET`, also
                  capped by free disk space; 0: none, every trial runs the full forward)
    prefix_layers the layers worth caching (None: those of the default search space,
                  `prefix_layers_for(SearchSpace(), num_layers)`)
    ram_limit     bytes of layer inputs held in RAM; the rest are memory-mapped (None: half the
                  available memory)
    reuse_baseline  copy baseline vectors for batches a config cannot change instead of encoding them
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
        prefix_layers: Sequence[int] | None = None,
        ram_limit: int | None = None,
        reuse_baseline: bool = True,
    ) -> None:
        self.model = model
        self.dataset = dataset
        self.batch_size, self.batch_tokens = choose_batching(model, batch_size, batch_tokens)
        if batch_tokens is None and self.batch_tokens is not None:
            log.info("batches of up to %d tokens (%d passages of %s's %d), chosen from the free memory of %s",
                     self.batch_tokens, self.batch_tokens // model.max_length, model.spec.alias, model.max_length,
                     model.device)
        elif batch_size is None and self.batch_tokens is None:
            log.info("batch size %d, chosen from the free memory of %s", self.batch_size, model.device)
        self.show_progress = show_progress
        self.doc_ids = list(dataset.corpus)
        self.query_ids = list(dataset.queries)
        self.cache_budget = cache_budget
        if prefix_layers is None:
            from tuner.search_space import SearchSpace

            prefix_layers = prefix_layers_for(SearchSpace(), model.num_layers)
        self.prefix_layers = tuple(sorted({int(x) for x in prefix_layers if 0 < int(x) < model.num_layers}))
        self.ram_limit = ram_limit
        self.reuse_baseline = reuse_baseline
        self.counts = PassCounts()
        self._queries: np.ndarray | None = None
        self._baseline: tuple[np.ndarray, int] | None = None
        self._documents: OrderedDict[ResolvedCalibration, tuple[np.ndarray, int]] = OrderedDict()  # → vectors, truncated
        self._batches: Batches | None = None
        self._stack: LayerStack | None = None
        self._store: LayerInputStore | None = None
        self._inputs: dict[int, LayerInputs] = {}
        self._sums: FirstLayerSums | None = None
        self._missing: list[int] = []
        self._inputs_planned = False
        self._temporary: tempfile.TemporaryDirectory[str] | None = None

        self.cache_dir = (cache_dir or default_cache_dir()) if disk_cache else None
        fingerprint = dataset.fingerprint()
        if self.cache_dir is not None:
            # one folder per dataset content: a changed or shuffled copy never evicts the original's entries
            folder = self.cache_dir / slug(model.spec.source) / f"{slug(dataset.name)}-{fingerprint[:12]}"
        else:
            self._temporary = tempfile.TemporaryDirectory(prefix=f"posfair-layer-inputs-{os.getpid()}-")  # tuner.scratch cleans it if killed
            folder = Path(self._temporary.name)
        self.disk = DiskCache(folder)
        self._doc_texts = [dataset.corpus[d] for d in self.doc_ids]
        base = {"engine": engine_identity(), "model": model_identity(model),
                "dataset": {"name": dataset.name, "fingerprint": fingerprint}, "batch_size": self.batch_size,
                **({"batch_tokens": self.batch_tokens} if self.batch_tokens is not None else {})}
        prompt = model.spec.query_prompt
        self._query_key = {**base, "kind": "queries", "prompt": prompt,
                           "texts": texts_digest(self.query_ids, [dataset.queries[q] for q in self.query_ids])}
        self._document_key = {**base, "kind": "documents", "texts": texts_digest(self.doc_ids, self._doc_texts)}

    @property
    def dimension(self) -> int:
        return int(self.model.model.config.hidden_size)

    # ------------------------------------------------------------------------------------- queries

    def query_vectors(self) -> np.ndarray:
        if self._queries is None:
            shape = (len(self.query_ids), self.dimension)
            loaded = self.disk.load_array("queries", self._query_key, shape) if self.cache_dir else None
            if loaded is not None:
                self._queries = loaded[0]
                self.counts.queries_from_disk += 1
            else:
                encoder = CalibratedEncoder(self.model)
                self._queries = encoder.encode_query(
                    [self.dataset.queries[q] for q in self.query_ids], batch_size=self.batch_size,
                    batch_tokens=self.batch_tokens,
                    show_progress_bar=self.show_progress,
                )
                if self.cache_dir:
                    self.disk.save_array("queries", self._query_key, self._queries)
        return self._queries

    # ----------------------------------------------------------------------------------- documents

    def batches(self) -> Batches:
        """The corpus tokenised once, in `CalibratedEncoder`'s length-sorted batches."""
        if self._batches is None:
            self._batches = Batches.build(self.model, self._doc_texts, self.batch_size, self.batch_tokens)
            if self.batch_tokens is not None:
                sizes = [rows for rows, _ in self._batches.shapes]
                log.info("%s: %d passages in %d batch(es) of <= %d padded tokens (%d-%d passages each)", self.dataset.name,
                         self._batches.count, len(sizes), self.batch_tokens, min(sizes, default=0), max(sizes, default=0))
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
        if spec in self._documents:
            self._documents.move_to_end(spec)
            return self._documents[spec]
        batches = self.batches()
        baseline = self._baseline[0] if self.reuse_baseline and self._baseline is not None else None
        start = self.resume_layer(min(spec.layers))
        if start is None:
            vectors = encode_batches(self.model, batches, spec, baseline=baseline, first_layer=self._first_layer_sums(),
                                     show_progress=self.show_progress)
            self.counts.full += 1
        else:
            inputs = self._inputs[start]
            vectors = encode_batches(self.model, batches, spec, stack=self._stack, resume=(start, inputs.batch),
                                     baseline=baseline, first_layer=self._first_layer_sums(),
                                     show_progress=self.show_progress)
            self.counts.resumed[start] = self.counts.resumed.get(start, 0) + 1
        assert vectors is not None
        self._documents[spec] = (vectors, batches.truncated)
        while len(self._documents) > RECENT_CONFIGS:
            self._documents.popitem(last=False)
        return vectors, batches.truncated

    def baseline_vectors(self) -> tuple[np.ndarray, int]:
        """Uncalibrated document vectors: from memory, from disk, or one full pass that also records layer inputs."""
        if self._baseline is None and not (self.cache_dir and self._baseline_on_disk()):
            self._plan_layer_inputs()
            batches = self.batches()
            vectors = self._recording_pass(record_only=False)
            assert vectors is not None
            self._baseline = (vectors, batches.truncated)
            if self.cache_dir:
                self.disk.save_array("baseline", self._document_key, vectors, truncated=batches.truncated)
        assert self._baseline is not None
        return self._baseline

    def _first_layer_sums(self) -> FirstLayerSums | None:
        """Sums shared by trials with the same first calibrated layer (mean pooling), held in RAM within
        what the cache budget and the RAM limit leave after the layer inputs; none without caching."""
        if self.cache_budget == 0:
            return None
        if self._sums is None:
            self._plan_layer_inputs()
            store = self._store
            budget = DEFAULT_BUDGET if self.cache_budget is None else self.cache_budget
            if store is not None:
                budget, ram = budget - store.layer_bytes * len(self._inputs), store.ram_left
            else:
                ram = default_ram_limit(self.ram_limit)
            self._sums = FirstLayerSums(max(0, min(budget, ram)))
        return self._sums

    def resume_layer(self, first_calibrated: int) -> int | None:
        """The deepest cached layer at or before the first calibrated one (recording it if needed)."""
        if first_calibrated <= 0 or not any(layer <= first_calibrated for layer in self.prefix_layers):
            return None
        self._plan_layer_inputs()
        if self._missing:
            if self._baseline is None and not (self.cache_dir and self._baseline_on_disk()):
                self.baseline_vectors()  # one full pass: the baseline, recording the inputs on the way
            else:
                self._recording_pass(record_only=True)
        usable = [layer for layer in self._inputs if layer <= first_calibrated]
        return max(usable) if usable else None

    def cached_layers(self) -> tuple[int, ...]:
        """The layers whose inputs are cached (or will be recorded by the next pass over the corpus)."""
        self._plan_layer_inputs()
        return tuple(sorted({*self._inputs, *self._missing}))

    def _baseline_on_disk(self) -> bool:
        """Load valid baseline vectors from the disk cache, if there are any."""
        loaded = self.disk.load_array("baseline", self._document_key, (len(self.doc_ids), self.dimension))
        if loaded is not None:
            self._baseline = (loaded[0], int(loaded[1].get("truncated", 0)))
            self.counts.baseline_from_disk += 1
        return loaded is not None

    def _plan_layer_inputs(self) -> None:
        """Once: choose the layers to cache within the budget, check they can be resumed, load valid ones."""
        if self._inputs_planned:
            return
        self._inputs_planned = True
        if not self.prefix_layers or self.cache_budget == 0:
            return
        try:
            self._stack = LayerStack(self.model)
        except ResumeUnsupportedError as error:
            log.warning("%s: %s; every trial runs the full forward pass", self.model.spec.alias, error)
            return
        batches = self.batches()
        dtype = self.model.model.dtype
        self._store = LayerInputStore(self.disk, self._document_key, batches.shapes, self.dimension, dtype, self.ram_limit)
        chosen = self._store.budget_layers(self.prefix_layers, self.cache_budget)
        if len(chosen) < len(self.prefix_layers):
            log.info("cache budget holds %d of %d layer inputs (%.0f MiB each): caching layers %s",
                     len(chosen), len(self.prefix_layers), self._store.layer_bytes / 2**20, list(chosen))
        chosen = self._stack.resumable(chosen) if chosen else []
        for layer in chosen:
            if self._store.load(layer) is not None:
                self._inputs[layer] = self._store.loaded[layer]
            else:
                self._missing.append(layer)

    def _recording_pass(self, record_only: bool) -> np.ndarray | None:
        """A plain pass over the corpus recording the missing layer inputs (stopping early if `record_only`)."""
        store, missing = self._store, list(self._missing)
        batches = self.batches()
        if store is None or not missing:
            self.counts.full += 1
            return encode_batches(self.model, batches, None, show_progress=self.show_progress)
        store.begin(missing)
        ok = False
        try:
            vectors = encode_batches(self.model, batches, None, stack=self._stack, record=(missing, store.record),
                                     record_only=record_only, show_progress=self.show_progress)
            ok = True
        finally:
            store.finish(ok)
        if record_only:
            self.counts.recorded += 1
        else:
            self.counts.full += 1
        self._missing = []
        for layer in missing:
            if store.load(layer) is not None:
                self._inputs[layer] = store.loaded[layer]
            else:
                log.warning("layer %d: the recorded inputs did not read back; trials from it run the full pass", layer)
        return vectors

    # ------------------------------------------------------------------------------------- scoring

    def run(self, config: CalibrationConfig | None) -> Evaluation:
        queries = self.query_vectors()
        start = time.perf_counter()
        documents, truncated = self.document_vectors(config)
        seconds = time.perf_counter() - start
        evaluation = self.score(documents, queries, seconds, truncated)
        baseline = self.baseline_vectors()[0]
        if documents is baseline:
            return evaluation
        drift = float(np.mean(1.0 - np.einsum("ij,ij->i", documents, baseline, dtype=np.float64)))
        return replace(evaluation, drift=max(drift, 0.0))

    def score(self, documents: np.ndarray, queries: np.ndarray | None = None, seconds: float = 0.0, truncated: int = 0) -> Evaluation:
        """Exact top-100 by inner product, then per-position nDCG@10 / Recall@10 with ir-measures."""
        queries = self.query_vectors() if queries is None else queries
        run = exact_search(queries, documents, self.query_ids, self.doc_ids, k=100)
        report, per_query = evaluate(run, self.dataset)
        return Evaluation(report, per_query, seconds, truncated)
