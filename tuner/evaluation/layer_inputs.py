"""Cached layer inputs of one (model, dataset, batching): which layers to keep within a disk budget, read back
memory-mapped or into RAM, recorded batch by batch; and the RAM they and the shared first-layer sums may fill."""

from __future__ import annotations

import shutil
import threading
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import combinations

import numpy as np
import torch

from tuner.common.options import DEFAULT_CACHE_BYTES
from tuner.evaluation.store import DiskCache, RawWriter, from_bytes

DEFAULT_BUDGET = DEFAULT_CACHE_BYTES  # bytes of cached layer inputs, at most; also capped by free disk space
# The share of the available memory a process may fill with the shared first-layer sums (and, with
# LAYER_INPUTS_IN_RAM, copies of the cached layer inputs). Nothing by default: layer inputs are memory-mapped from their
# files, which the OS page cache keeps hot, and sums are recomputed; with either held in RAM a first `tune` took
# more than twice the memory and more time (`benchmarks/footprint.py`, docs/benchmarks.md). A cache on a disk slower
# than this machine's, or a study that reuses one first layer and basket size often, may want them.
RAM_FRACTION = 0.0
LAYER_INPUTS_IN_RAM = False


def choose_layers(candidates: Sequence[int], layer_bytes: int, budget: int) -> tuple[int, ...]:
    """The candidate layers to cache within `budget` bytes (each costs `layer_bytes`).

    A trial whose calibration starts at layer f resumes from the deepest cached layer ≤ f and skips
    that many layers. With every candidate start equally likely, pick the subset that skips the most
    layers in total; ties go to the shallower sets (fewer bytes are never worse).
    """
    candidates = sorted({c for c in candidates if c > 0})
    fits = min(len(candidates), budget // layer_bytes) if layer_bytes > 0 else len(candidates)
    if fits <= 0:
        return ()
    if fits == len(candidates):
        return tuple(candidates)

    def skipped(chosen: tuple[int, ...]) -> int:
        return sum(max((c for c in chosen if c <= start), default=0) for start in candidates)

    return max(combinations(candidates, fits), key=skipped)


@dataclass
class LayerInputs:
    """The hidden states entering one layer for every batch of a corpus, in the model's dtype."""

    layer: int
    data: np.ndarray  # bytes: in RAM or memory-mapped
    dtype: torch.dtype
    shapes: list[tuple[int, int, int]]
    offsets: list[int]

    @property
    def in_memory(self) -> bool:
        return not isinstance(self.data, np.memmap)

    def batch(self, index: int) -> torch.Tensor:
        start = self.offsets[index]
        shape = self.shapes[index]
        size = int(np.prod(shape)) * torch.empty((), dtype=self.dtype).element_size()
        return from_bytes(self.data[start : start + size], self.dtype, shape)


class RamAllowance:
    """Bytes of RAM that cached layer inputs and shared sums may fill. What a holder took comes back when the
    holder is garbage-collected, so a study's finished evaluators leave room for the next."""

    def __init__(self, limit: int) -> None:
        self.left = limit
        self._lock = threading.Lock()

    def take(self, holder: object, nbytes: int) -> weakref.finalize | None:
        """Reserve `nbytes` for `holder` if they fit (None: they are to be memory-mapped or not kept). Calling
        the reservation gives them back before the holder goes."""
        with self._lock:
            if nbytes > self.left:
                return None
            self.left -= nbytes
        return weakref.finalize(holder, self._give, nbytes)

    def _give(self, nbytes: int) -> None:
        with self._lock:
            self.left += nbytes


_PROCESS_RAM: RamAllowance | None = None


def ram_allowance(limit: int | None) -> RamAllowance:
    """An allowance of `limit` bytes of its own, or by default the process's: RAM_FRACTION of the memory
    available when it is first asked, shared by every store, since a study holds one evaluator per structure
    and held-out set and a share of the memory each would be several times what there is."""
    global _PROCESS_RAM
    if limit is not None:
        return RamAllowance(limit)
    if _PROCESS_RAM is None:
        import psutil

        _PROCESS_RAM = RamAllowance(int(psutil.virtual_memory().available * RAM_FRACTION))
    return _PROCESS_RAM


def layer_inputs_ram(limit: int | None, allowance: RamAllowance) -> RamAllowance | None:
    """What cached layer inputs may fill in RAM: an evaluator's `allowance` where it was given a `limit`, or with
    `LAYER_INPUTS_IN_RAM`; else nothing, and they are memory-mapped."""
    return allowance if limit is not None or LAYER_INPUTS_IN_RAM else None


class LayerInputStore:
    """Cached layer inputs of one (model, dataset, batching): chosen within a budget, verified on load.

    Layers are memory-mapped from their files, or, given a `ram` allowance, loaded into RAM while they fit in it.
    """

    def __init__(
        self,
        cache: DiskCache,
        key: dict,
        shapes: Sequence[tuple[int, int]],
        hidden: int,
        dtype: torch.dtype,
        ram: RamAllowance | None = None,
    ) -> None:
        self.cache, self.key, self.dtype = cache, key, dtype
        self.shapes = [(rows, length, hidden) for rows, length in shapes]
        itemsize = torch.empty((), dtype=dtype).element_size()
        self.offsets = list(np.cumsum([0] + [int(np.prod(s)) * itemsize for s in self.shapes])[:-1].tolist())
        self.layer_bytes = sum(int(np.prod(s)) for s in self.shapes) * itemsize
        self.ram = ram
        self.loaded: dict[int, LayerInputs] = {}
        self._writers: dict[int, RawWriter] = {}

    def budget_layers(self, candidates: Sequence[int], budget: int | None) -> tuple[int, ...]:
        budget = DEFAULT_BUDGET if budget is None else budget
        try:
            self.cache.folder.mkdir(parents=True, exist_ok=True)
            free = shutil.disk_usage(self.cache.folder).free
        except OSError:
            free = 0
        reusable = sum(self.layer_bytes for c in candidates if self._file_size(c) == self.layer_bytes)
        return choose_layers(candidates, self.layer_bytes, min(budget, int(0.9 * free) + reusable))

    def _file_size(self, layer: int) -> int | None:
        path = self.cache.folder / f"{self.name(layer)}.bin"
        return path.stat().st_size if path.exists() else None

    def layer_key(self, layer: int) -> dict:
        return {
            **self.key,
            "layer": layer,
            "dtype": str(self.dtype).removeprefix("torch."),
            "shapes": [list(s) for s in self.shapes],
        }

    @staticmethod
    def name(layer: int) -> str:
        return f"layer-input-{layer:03d}"

    def load(self, layer: int) -> LayerInputs | None:
        reserved = self.ram.take(self, self.layer_bytes) if self.ram is not None else None
        opened = self.cache.open_raw(self.name(layer), self.layer_key(layer), self.layer_bytes, reserved is not None)
        if opened is None:
            if reserved is not None:
                reserved()
            return None
        self.loaded[layer] = LayerInputs(layer, opened[0], self.dtype, self.shapes, self.offsets)
        return self.loaded[layer]

    # recording: one writer per layer, fed batch by batch in order
    @contextmanager
    def recording(self, layers: Sequence[int]) -> Iterator[None]:
        """Record `layers` (through `record`) inside this block: committed if it completes, else discarded."""
        self.begin(layers)
        ok = False
        try:
            yield
            ok = True
        finally:
            self.finish(ok)

    def begin(self, layers: Sequence[int]) -> None:
        self._writers = {layer: self.cache.raw_writer(self.name(layer), self.layer_key(layer)) for layer in layers}
        self._next = {layer: 0 for layer in layers}

    def record(self, batch: int, layer: int, states: torch.Tensor) -> None:
        if batch != self._next[layer] or tuple(states.shape) != self.shapes[batch] or states.dtype != self.dtype:
            raise RuntimeError(
                f"layer {layer}: unexpected states {tuple(states.shape)} {states.dtype} for batch {batch}"
            )
        self._writers[layer].write(states)
        self._next[layer] += 1

    def finish(self, ok: bool) -> None:
        writers, self._writers = self._writers, {}
        for layer, writer in writers.items():
            if ok and self._next[layer] == len(self.shapes):
                writer.commit(layer=layer)
            else:
                writer.abort()
