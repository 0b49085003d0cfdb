"""What an evaluator keeps between trials, where, and how much of it: the cache policy.

`tuner.evaluation.store` and `tuner.evaluation.layer_inputs` hold the mechanisms (checked files on disk, layer-input
stores); this module decides what goes in them for one model on one dataset, and keeps what lives in RAM only:

- query vectors and the uncalibrated baseline document vectors, on disk (`DiskCache`), so every study on
  the same model, revision and dataset reuses them;
- the inputs of the layers where the search space's depths start calibrating (`prefix_layers`), within
  `cache_budget` bytes, checked resumable on this model (`tuner.engine.prefix.LayerStack`);
- the first calibrated layer's sums (mean pooling; `FirstLayerSums`), in what the budget and the RAM limit
  leave after the layer inputs;
- the last few configs' document vectors, keyed by the resolved calibration.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tuner.calibration import ResolvedCalibration
from tuner.calibration.mean_pooling import RowSums
from tuner.common.files import default_cache_dir
from tuner.data import PositionalDataset
from tuner.engine.batching import Batches, BatchScope
from tuner.engine.models import LoadedModel
from tuner.engine.prefix import LayerStack, ResumeUnsupportedError, Sink, resume_point, resumed_from
from tuner.evaluation.layer_inputs import (
    DEFAULT_BUDGET,
    LayerInputs,
    LayerInputStore,
    RamAllowance,
    layer_inputs_ram,
    ram_allowance,
)
from tuner.evaluation.store import DiskCache, engine_identity, model_identity, slug, texts_digest

log = logging.getLogger(__name__)

RECENT_CONFIGS = 8


@dataclass
class FirstLayerSums:
    """`RowSums` of the first calibrated layer, per batch, kept in RAM (up to `budget` bytes, within `ram`) for
    later trials.

    The first calibrated layer's input is the uncalibrated model's whatever the trial, and its `RowSums`
    depend only on that input, on where baskets are cut and on `basket_shares`: trials that share the first
    calibrated layer, basket size and basket_shares (a TPE study draws many) reuse them, and that layer's
    attention costs only the blend. Reused sums are the very tensors a recomputation would give.
    The engine sees one batch's share of them at a time (`for_batch`).
    """

    budget: int
    ram: RamAllowance | None = None  # where the sums' RAM comes from (None: the budget alone bounds them)
    used: int = 0
    hits: int = 0
    entries: dict[tuple[object, ...], RowSums] = field(default_factory=dict)

    def for_batch(self, batch: int) -> BatchSums:
        return BatchSums(self, batch)


@dataclass(frozen=True)
class BatchSums:
    """One batch's view of `FirstLayerSums`: what `calibration.mean_pooling.SharedSums` asks for."""

    owner: FirstLayerSums
    batch: int

    def lookup(self, key: tuple[object, ...]) -> RowSums | None:
        found = self.owner.entries.get((self.batch, *key))
        self.owner.hits += found is not None
        return found

    def offer(self, key: tuple[object, ...], sums: RowSums) -> None:
        """Keep `sums` if they fit in what is left of the budget (first come, first kept)."""
        owner = self.owner
        if owner.used + sums.nbytes <= owner.budget and (owner.ram is None or owner.ram.take(owner, sums.nbytes)):
            owner.entries[(self.batch, *key)] = sums
            owner.used += sums.nbytes


@dataclass(frozen=True)
class LayerRecording:
    """What one pass over the corpus records (`CachePolicy.recording`): the layers whose inputs it hands to
    `sink`, hooked on `stack` (`tuner.engine.prefix.recorded_into`, `record_layer_inputs`)."""

    stack: LayerStack
    layers: list[int]
    sink: Sink


class CachePolicy:
    """What one evaluator (one model on one dataset, batched one way) keeps, where, and within what budget.

    cache_dir     where query vectors, baseline vectors and layer inputs persist between runs;
                  None: `default_cache_dir()`
    disk_cache    False keeps everything in memory (layer inputs then go to a temporary folder)
    cache_budget  bytes of layer inputs to cache at most (None: `tuner.evaluation.layer_inputs.DEFAULT_BUDGET`, also
                  capped by free disk space; 0: none, every trial runs the full forward)
    prefix_layers the layers worth caching, where the configs to come start calibrating
                  (`tuner.engine.prefix.starting_layers`); none by default
    ram_limit     bytes this policy may hold in RAM, layer inputs and shared sums together; the rest of the
                  layer inputs are memory-mapped and of the sums recomputed (None: the sums draw on the process's
                  `ram_allowance`, and the layer inputs are mapped: `layer_inputs_ram`)
    keep_on_disk  keep every calibration's document vectors in the disk cache too (`calibrated`, `encoded`)
    keep_layer_inputs  False: layer inputs go to a temporary folder that lives as long as this policy, for sets
                  that score a few configs once (the held-out sets), whose inputs would fill the cache for nothing
    """

    def __init__(
        self,
        model: LoadedModel,
        dataset: PositionalDataset,
        batch_size: int,
        batch_tokens: int | None,
        *,
        cache_dir: Path | None = None,
        disk_cache: bool = True,
        cache_budget: int | None = None,
        prefix_layers: Sequence[int] = (),
        ram_limit: int | None = None,
        keep_on_disk: bool = False,
        keep_layer_inputs: bool = True,
    ) -> None:
        self.model = model
        self.keep_on_disk = keep_on_disk
        self.keep_layer_inputs = keep_layer_inputs
        self.cache_budget = cache_budget
        self.prefix_layers = tuple(sorted({int(x) for x in prefix_layers if 0 < int(x) < model.num_layers}))
        self.ram_limit = ram_limit
        self.ram = ram_allowance(ram_limit)  # one allowance for the layer inputs and the sums
        self.stack: LayerStack | None = None
        self.store: LayerInputStore | None = None
        self.inputs: dict[int, LayerInputs] = {}  # layer → its recorded inputs, ready to resume from
        self.missing: list[int] = []  # layers planned but not recorded yet
        self._planned = False
        self._sums: FirstLayerSums | None = None
        self._recent: OrderedDict[ResolvedCalibration, tuple[np.ndarray, int]] = OrderedDict()  # → vectors, truncated
        self._temporary: tempfile.TemporaryDirectory[str] | None = None

        self.cache_dir = (cache_dir or default_cache_dir()) if disk_cache else None
        fingerprint = dataset.fingerprint()
        if self.cache_dir is not None:
            # one folder per dataset content: a changed or shuffled copy never evicts the original's entries
            folder = self.cache_dir / slug(model.spec.source) / f"{slug(dataset.name)}-{fingerprint[:12]}"
        else:
            folder = self._scratch()
        self.disk = DiskCache(folder)
        doc_ids, query_ids = list(dataset.corpus), list(dataset.queries)
        base = {
            "engine": engine_identity(),
            "model": model_identity(model),
            "dataset": {"name": dataset.name, "fingerprint": fingerprint},
            "batch_size": batch_size,
            **({"batch_tokens": batch_tokens} if batch_tokens is not None else {}),
        }
        prompt = model.query_prompt
        self._query_key = {
            **base,
            "kind": "queries",
            "prompt": prompt,
            "texts": texts_digest(query_ids, [dataset.queries[q] for q in query_ids]),
        }
        self._document_key = {
            **base,
            "kind": "documents",
            "texts": texts_digest(doc_ids, [dataset.corpus[d] for d in doc_ids]),
        }

    # --------------------------------------------------------------------------- vectors on disk

    def load_queries(self, shape: tuple[int, int]) -> np.ndarray | None:
        loaded = self.disk.load_array("queries", self._query_key, shape) if self.cache_dir else None
        return loaded[0] if loaded is not None else None

    def save_queries(self, vectors: np.ndarray) -> None:
        if self.cache_dir:
            self.disk.save_array("queries", self._query_key, vectors)

    def load_baseline(self, shape: tuple[int, int]) -> tuple[np.ndarray, int] | None:
        """Valid baseline vectors from disk, and how many documents were truncated; None if there are none."""
        loaded = self.disk.load_array("baseline", self._document_key, shape) if self.cache_dir else None
        return (loaded[0], int(loaded[1].get("truncated", 0))) if loaded is not None else None

    def save_baseline(self, vectors: np.ndarray, truncated: int) -> None:
        if self.cache_dir:
            self.disk.save_array("baseline", self._document_key, vectors, truncated=truncated)

    def load_calibrated(self, spec: ResolvedCalibration, shape: tuple[int, int]) -> tuple[np.ndarray, int] | None:
        """A calibration's document vectors from disk (`Evaluator(keep_on_disk=True)`), or None."""
        name, key = self._calibrated_entry(spec)
        loaded = self.disk.load_array(name, key, shape) if self.cache_dir else None
        return (loaded[0], int(loaded[1].get("truncated", 0))) if loaded is not None else None

    def save_calibrated(self, spec: ResolvedCalibration, vectors: np.ndarray, truncated: int) -> None:
        if self.cache_dir:
            name, key = self._calibrated_entry(spec)
            self.disk.save_array(name, key, vectors, truncated=truncated)

    def _calibrated_entry(self, spec: ResolvedCalibration) -> tuple[str, dict]:
        """The entry's file name and key: everything that makes two calibrations alike, and the documents'."""
        calibration = {
            "layers": sorted(spec.layers),
            "strength": spec.strength,
            "basket_size": spec.basket_size,
            "weight": spec.weight,
            "pooling": spec.pooling,
            "policies": [list(p) for p in spec.policies],
            "basket_shares": spec.basket_shares,
        }
        digest = hashlib.sha256(json.dumps(calibration, sort_keys=True).encode()).hexdigest()[:16]
        return f"calibrated-{digest}", {**self._document_key, "calibration": calibration}

    # ---------------------------------------------------------------------------- recent configs

    def recent(self, spec: ResolvedCalibration) -> tuple[np.ndarray, int] | None:
        """A recent config's document vectors (two configs that mean the same calibration share them)."""
        if spec in self._recent:
            self._recent.move_to_end(spec)
            return self._recent[spec]
        return None

    def keep(self, spec: ResolvedCalibration, vectors: np.ndarray, truncated: int) -> None:
        self._recent[spec] = (vectors, truncated)
        while len(self._recent) > RECENT_CONFIGS:
            self._recent.popitem(last=False)

    def calibrated(self, spec: ResolvedCalibration, shape: tuple[int, int]) -> tuple[np.ndarray, int] | None:
        """A calibration's document vectors if they are at hand (a recent config's, else with `keep_on_disk` the
        disk cache's, kept as recent from then on), and how many documents were truncated; None: encode them.
        Where vectors are looked for, and in what order, is this policy's to decide, not the evaluator's."""
        found = self.recent(spec)
        if found is None and self.keep_on_disk:
            found = self.load_calibrated(spec, shape)
            if found is not None:
                self.keep(spec, *found)
        return found

    def encoded(self, spec: ResolvedCalibration, vectors: np.ndarray, truncated: int) -> None:
        """Keep a calibration's freshly encoded vectors where `calibrated` will look: as recent, and with
        `keep_on_disk` in the disk cache too."""
        self.keep(spec, vectors, truncated)
        if self.keep_on_disk:
            self.save_calibrated(spec, vectors, truncated)

    # ------------------------------------------------------------------------------ layer inputs

    def _scratch(self) -> Path:
        """A temporary folder for this policy's life (`tuner.common.scratch` cleans it if the process is killed)."""
        if self._temporary is None:
            self._temporary = tempfile.TemporaryDirectory(prefix=f"posfair-layer-inputs-{os.getpid()}-")
        return Path(self._temporary.name)

    def _layer_disk(self) -> DiskCache:
        """Where layer inputs go: the disk cache, or a temporary folder (`keep_layer_inputs`)."""
        return self.disk if self.keep_layer_inputs or self.cache_dir is None else DiskCache(self._scratch())

    def plan_layer_inputs(self, batches: Batches) -> None:
        """Once: choose the layers to cache within the budget, check they can be resumed, load valid ones."""
        if self._planned:
            return
        self._planned = True
        if not self.prefix_layers or self.cache_budget == 0:
            return
        try:
            self.stack = LayerStack(self.model)
        except ResumeUnsupportedError as error:
            log.warning("%s: %s; every trial runs the full forward pass", self.model.spec.alias, error)
            return
        hidden = int(self.model.model.config.hidden_size)
        ram = layer_inputs_ram(self.ram_limit, self.ram)
        self.store = LayerInputStore(
            self._layer_disk(), self._document_key, batches.shapes, hidden, self.model.model.dtype, ram
        )
        chosen = self.store.budget_layers(self.prefix_layers, self.cache_budget)
        if len(chosen) < len(self.prefix_layers):
            log.info(
                "cache budget holds %d of %d layer inputs (%.0f MiB each): caching layers %s",
                len(chosen),
                len(self.prefix_layers),
                self.store.layer_bytes / 2**20,
                list(chosen),
            )
        resumable = self.stack.resumable(chosen) if chosen else []
        for layer in resumable:
            if self.store.load(layer) is not None:
                self.inputs[layer] = self.store.loaded[layer]
            else:
                self.missing.append(layer)

    def recorded(self, layers: Sequence[int]) -> None:
        """After a pass recorded `layers` into the store: read them back, ready to resume from."""
        assert self.store is not None
        self.missing = [layer for layer in self.missing if layer not in layers]
        for layer in layers:
            if self.store.load(layer) is not None:
                self.inputs[layer] = self.store.loaded[layer]
            else:
                log.warning("layer %d: the recorded inputs did not read back; trials from it run the full pass", layer)

    def needs_recording(self) -> bool:
        """Whether planned layer inputs are still unrecorded: the next pass over the corpus should record them
        (`recording`). False before `plan_layer_inputs`."""
        return self.store is not None and bool(self.missing)

    @contextmanager
    def recording(self) -> Iterator[LayerRecording]:
        """Record the missing layer inputs during the block, a pass over the corpus that hooks the yielded
        `LayerRecording`: if the block completes they are committed and read back, ready to resume from
        (`recorded`); if it raises they are discarded. The policy, not the pass, keeps the books of what is
        recorded. Only when `needs_recording`."""
        assert self.store is not None and self.stack is not None
        layers = list(self.missing)
        with self.store.recording(layers):
            yield LayerRecording(self.stack, layers, self.store.record)
        self.recorded(layers)

    def may_resume(self, first_calibrated: int) -> bool:
        """Whether a calibration whose first calibrated layer is `first_calibrated` could skip layers: a layer
        worth caching (`prefix_layers`) lies at or before it. Layer 0 has nothing before it. Asks no planning,
        so a config that cannot resume costs no pass."""
        return first_calibrated > 0 and any(layer <= first_calibrated for layer in self.prefix_layers)

    def resume_layer(self, first_calibrated: int) -> int | None:
        """The deepest layer at or before `first_calibrated` whose inputs are recorded: where the config's pass
        resumes; None: it runs the full forward."""
        return resume_point(self.inputs, first_calibrated)

    def resumed_from(self, layer: int) -> BatchScope:
        """For `encoder.forward`: each batch runs only the layers from `layer` on (a `resume_layer`), from its
        recorded inputs."""
        assert self.stack is not None
        return resumed_from(self.stack, layer, self.inputs[layer].batch)

    def cached_layers(self, batches: Batches) -> tuple[int, ...]:
        """The layers whose inputs are cached or will be recorded by the next pass over the corpus (planning
        them first if need be)."""
        self.plan_layer_inputs(batches)
        return tuple(sorted({*self.inputs, *self.missing}))

    def first_layer_sums(self, batches: Batches) -> FirstLayerSums | None:
        """Sums shared by trials with the same first calibrated layer (mean pooling), held in RAM within
        what the cache budget leaves after the layer inputs and what the RAM allowance has left; none without
        caching."""
        if self.cache_budget == 0:
            return None
        if self._sums is None:
            self.plan_layer_inputs(batches)
            store = self.store
            budget = DEFAULT_BUDGET if self.cache_budget is None else self.cache_budget
            if store is not None:
                budget -= store.layer_bytes * len(self.inputs)
            self._sums = FirstLayerSums(max(0, budget), self.ram)
        return self._sums
