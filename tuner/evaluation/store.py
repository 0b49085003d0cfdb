"""Disk caches for what every trial of a study shares: query vectors, baseline vectors, layer inputs.

Layout: `ROOT/<model>/<dataset>-<fingerprint>/<name>.{npy,bin}` plus `<name>.json`, the metadata.
ROOT defaults to `mlruns/cache` (next to the study and tracking stores). Each entry's metadata holds its full key —
model (source, revision, weights fingerprint for local folders, dtype, pooling, maximum length),
dataset (name, fingerprint, digest of the ordered texts), batch size, the engine version
(`tuner.__version__`, `CACHE_FORMAT`, torch and transformers) — plus the data file's size and
checksum. An entry whose key differs is stale, one whose size or checksum differs is corrupt: both
are rebuilt and overwritten, never used (a changed dataset gets a folder of its own; the whole
ROOT can be deleted at any time). Nothing is unpickled: vectors are `.npy` read with
`allow_pickle=False`, layer inputs raw bytes in the model's dtype, metadata JSON.

Writes go to a temporary file renamed into place (data first, metadata last), so a reader sees a
whole old or a whole new file, and a torn pair fails its checksum.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
import shutil
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np
import torch

import tuner
from tuner.common.files import TEMPORARY_SUFFIX, temporary_beside, write_atomically
from tuner.common.options import DEFAULT_CACHE_BYTES

log = logging.getLogger(__name__)

CACHE_FORMAT = 1
DEFAULT_BUDGET = DEFAULT_CACHE_BYTES  # bytes of cached layer inputs, at most; also capped by free disk space
# The share of the available memory a process may fill with the shared first-layer sums (and, with
# LAYER_INPUTS_IN_RAM, copies of the cached layer inputs). Nothing by default: layer inputs are memory-mapped from their
# files, which the OS page cache keeps hot, and sums are recomputed; with either held in RAM a first `tune` took
# more than twice the memory and more time (`benchmarks/footprint.py`, docs/benchmarks.md). A cache on a disk slower
# than this machine's, or a study that reuses one first layer and basket size often, may want them.
RAM_FRACTION = 0.0
LAYER_INPUTS_IN_RAM = False
CHUNK = 16 * 2**20
STALE_TEMPORARY_S = 3600

try:
    import xxhash
except ImportError:  # pragma: no cover - xxhash comes with `datasets`
    HAS_XXHASH = False
else:
    HAS_XXHASH = True
CHECKSUM = "xxh3_128" if HAS_XXHASH else "blake2b"


def _hasher(algorithm: str) -> Any:
    if algorithm == "xxh3_128" and HAS_XXHASH:
        return xxhash.xxh3_128()
    if algorithm == "blake2b":
        return hashlib.blake2b(digest_size=16)
    raise ValueError(f"unknown checksum {algorithm!r}")


def checksum(data: bytes | memoryview | np.ndarray, algorithm: str = CHECKSUM) -> str:
    hasher = _hasher(algorithm)
    if isinstance(data, np.ndarray):
        view = np.ascontiguousarray(data).reshape(-1).view(np.uint8).data  # the array's bytes, as a memoryview
    else:
        view = memoryview(data).cast("B")
    for start in range(0, len(view), CHUNK):
        hasher.update(view[start : start + CHUNK])
    return hasher.hexdigest()


def engine_identity() -> dict[str, object]:
    import transformers

    return {"format": CACHE_FORMAT, "posfair": tuner.__version__, "torch": torch.__version__, "transformers": transformers.__version__}


def model_identity(model: Any) -> dict[str, object]:
    """What decides a loaded model's outputs (a `LoadedModel`): with its sentence-transformers pipeline where that
    changes its vectors (prompts, Dense modules), so vectors cached without them are never taken for its own."""
    net = model.model
    pipeline = model.pipeline
    return {
        **({"pipeline": pipeline.record()} if pipeline.changes_vectors() else {}),
        "source": model.spec.source,
        "revision": model.revision,
        "weights": _folder_fingerprint(getattr(net, "name_or_path", "")),
        "pooling": model.spec.pooling,
        "padding_side": model.spec.padding_side,
        "max_length": model.max_length,
        "dtype": str(net.dtype).removeprefix("torch."),
        "device": model.device.type,
        "attention": getattr(net.config, "_attn_implementation", None),
    }


def texts_digest(ids: Sequence[str], texts: Sequence[str]) -> str:
    """Order-sensitive digest of (id, text) pairs: a dataset fingerprint ignores order, batches do not."""
    hasher = hashlib.sha256()
    for key, text in zip(ids, texts, strict=True):
        for part in (key, text):
            encoded = part.encode("utf-8")
            hasher.update(len(encoded).to_bytes(8, "little"))
            hasher.update(encoded)
    return hasher.hexdigest()[:32]


def _folder_fingerprint(path: str) -> str | None:
    """For a local model folder: names, sizes and modification times of its files (a hub commit covers the rest)."""
    folder = Path(path) if path else None
    if folder is None or not folder.is_dir():
        return None
    hasher = hashlib.sha256()
    for file in sorted(p for p in folder.rglob("*") if p.is_file()):
        stat = file.stat()
        hasher.update(f"{file.relative_to(folder)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return hasher.hexdigest()[:32]


def slug(text: str, keep: int = 48) -> str:
    """A readable, file-name-safe label with a short hash, so different sources never share a folder."""
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_.")[-keep:] or "x"
    return f"{readable}-{hashlib.sha256(text.encode('utf-8')).hexdigest()[:8]}"


def _differences(want: object, got: object, path: str = "") -> list[str]:
    """Dotted names of the key fields that differ (e.g. `model.revision`)."""
    if isinstance(want, dict) and isinstance(got, dict):
        return [
            d
            for k in sorted(set(want) | set(got), key=str)
            for d in _differences(want.get(k), got.get(k), f"{path}.{k}" if path else str(k))
        ]
    return [] if want == got else [path or "key"]


@dataclass
class DiskCache:
    """One folder of entries: `<name>` data file plus `<name>.json` metadata with the key and checksum.

    `events` records what happened to each entry (hit, missing, stale, corrupt, written), for logs and tests.
    """

    folder: Path
    events: list[tuple[str, str]] = field(default_factory=list)

    def _meta_path(self, name: str) -> Path:
        return self.folder / f"{name}.json"

    def _note(self, name: str, event: str, detail: str = "") -> None:
        self.events.append((name, event))
        if event in ("stale", "corrupt"):
            log.warning("cache %s/%s is %s%s; rebuilding it", self.folder, name, event, f" ({detail})" if detail else "")
        else:
            log.debug("cache %s/%s: %s %s", self.folder, name, event, detail)

    def _metadata(self, name: str, key: dict) -> dict | None:
        """The entry's metadata if it exists and its key matches; None (and an event) otherwise."""
        path = self._meta_path(name)
        if not path.exists():
            self._note(name, "missing")
            return None
        try:
            meta = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(meta, dict):
                raise ValueError("not a JSON object")
        except (OSError, ValueError) as error:
            self._note(name, "corrupt", f"metadata unreadable: {error}")
            return None
        if meta.get("format") != CACHE_FORMAT:
            self._note(name, "stale", f"cache format {meta.get('format')!r}, this engine writes {CACHE_FORMAT}")
            return None
        changed = _differences(key, meta.get("key"))
        if changed:
            self._note(name, "stale", "changed: " + ", ".join(changed))
            return None
        return meta

    def _verify(self, name: str, meta: dict, data: bytes | np.ndarray) -> bool:
        size = data.nbytes if isinstance(data, np.ndarray) else len(data)
        if size != meta.get("bytes"):
            self._note(name, "corrupt", f"{size} bytes, expected {meta.get('bytes')}")
            return False
        try:
            ok = checksum(data, meta["checksum"]["algorithm"]) == meta["checksum"]["value"]
        except (KeyError, TypeError, ValueError):
            ok = False
        if not ok:
            self._note(name, "corrupt", "checksum mismatch")
        return ok

    def _commit(self, name: str, data_name: str, temporary: Path, key: dict, size: int, digest: str, extra: dict) -> None:
        os.replace(temporary, self.folder / data_name)
        meta = {
            "format": CACHE_FORMAT,
            "key": key,
            "file": data_name,
            "bytes": size,
            "checksum": {"algorithm": CHECKSUM, "value": digest},
            **extra,
        }
        write_atomically(self._meta_path(name), json.dumps(meta, indent=1), in_store=True)
        self._note(name, "written")

    # -- arrays (.npy) --------------------------------------------------------------------------------

    def load_array(
        self, name: str, key: dict, shape: tuple[int, ...] | None = None, dtype: str = "float32"
    ) -> tuple[np.ndarray, dict] | None:
        """The verified array (with its metadata), or None when missing, stale or corrupt."""
        meta = self._metadata(name, key)
        if meta is None:
            return None
        try:
            data = (self.folder / f"{name}.npy").read_bytes()
        except OSError as error:
            self._note(name, "corrupt", str(error))
            return None
        if not self._verify(name, meta, data):
            return None
        try:
            array = np.load(io.BytesIO(data), allow_pickle=False)
        except ValueError as error:  # an object array (pickle) or a broken header
            self._note(name, "corrupt", str(error))
            return None
        if array.dtype != np.dtype(dtype) or (shape is not None and array.shape != shape):
            self._note(name, "corrupt", f"{array.dtype} {array.shape}, expected {dtype} {shape}")
            return None
        self._note(name, "hit")
        return array, meta

    def save_array(self, name: str, key: dict, array: np.ndarray, **extra: object) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        buffer = io.BytesIO()
        np.save(buffer, np.ascontiguousarray(array), allow_pickle=False)
        data = buffer.getvalue()
        temporary = _temporary(self.folder, f"{name}.npy")
        temporary.write_bytes(data)
        self._commit(name, f"{name}.npy", temporary, key, len(data), checksum(data), extra)

    # -- raw tensors (.bin), memory-mapped or in RAM -------------------------------------------------------

    def open_raw(self, name: str, key: dict, expected_bytes: int, in_memory: bool) -> tuple[np.ndarray, dict] | None:
        """A verified byte array of the entry (read into RAM, or memory-mapped read-only), with its metadata."""
        meta = self._metadata(name, key)
        if meta is None:
            return None
        path = self.folder / f"{name}.bin"
        try:
            size = path.stat().st_size
            if size != meta.get("bytes") or size != expected_bytes:
                self._note(name, "corrupt", f"{size} bytes, expected {meta.get('bytes')} / {expected_bytes}")
                return None
            data = np.fromfile(path, dtype=np.uint8) if in_memory else np.memmap(path, dtype=np.uint8, mode="r")
        except (OSError, ValueError) as error:
            self._note(name, "corrupt", str(error))
            return None
        if not self._verify(name, meta, data):
            return None
        self._note(name, "hit", "in memory" if in_memory else "memory-mapped")
        return data, meta

    def raw_writer(self, name: str, key: dict) -> RawWriter:
        self.folder.mkdir(parents=True, exist_ok=True)
        return RawWriter(self, name, key)


class RawWriter:
    """Streams tensors' bytes to a temporary file, hashing as it goes; `commit` renames it into place."""

    def __init__(self, cache: DiskCache, name: str, key: dict) -> None:
        self.cache, self.name, self.key = cache, name, key
        self.path = _temporary(cache.folder, f"{name}.bin")
        self.file = self.path.open("wb")
        self.hasher = _hasher(CHECKSUM)
        self.size = 0

    def write(self, tensor: torch.Tensor) -> None:
        data = _as_bytes(tensor)
        self.file.write(data)
        self.hasher.update(data)
        self.size += data.nbytes

    def commit(self, **extra: object) -> None:
        self.file.close()
        self.cache._commit(self.name, f"{self.name}.bin", self.path, self.key, self.size, self.hasher.hexdigest(), extra)

    def abort(self) -> None:
        self.file.close()
        self.path.unlink(missing_ok=True)


def _temporary(folder: Path, name: str) -> Path:
    _sweep(folder)
    return temporary_beside(folder / name)


def _sweep(folder: Path) -> None:
    """Remove temporary files a killed writer left behind (an hour old: no live writer takes that long)."""
    cutoff = time.time() - STALE_TEMPORARY_S
    for leftover in folder.glob(f".*{TEMPORARY_SUFFIX}"):
        try:
            if leftover.stat().st_mtime < cutoff:
                leftover.unlink()
        except OSError:
            pass


_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_NUMPY_INT_OF_SIZE = {1: np.uint8, 2: np.int16, 4: np.int32, 8: np.int64}


def _as_bytes(tensor: torch.Tensor) -> memoryview:
    """A CPU tensor's raw bytes in its own dtype (bfloat16 included, which numpy lacks)."""
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    return flat.view(_INT_OF_SIZE[flat.element_size()]).numpy().data.cast("B")


def _from_bytes(data: np.ndarray, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """The inverse of `_as_bytes` for a slice of a verified byte array (copied: memmaps stay read-only)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    as_int = np.array(data).view(_NUMPY_INT_OF_SIZE[itemsize])
    return torch.from_numpy(as_int).view(dtype).reshape(shape)


# --------------------------------------------------------------------------------------- layer inputs


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
        return _from_bytes(self.data[start : start + size], self.dtype, shape)


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
        return {**self.key, "layer": layer, "dtype": str(self.dtype).removeprefix("torch."), "shapes": [list(s) for s in self.shapes]}

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
            raise RuntimeError(f"layer {layer}: unexpected states {tuple(states.shape)} {states.dtype} for batch {batch}")
        self._writers[layer].write(states)
        self._next[layer] += 1

    def finish(self, ok: bool) -> None:
        writers, self._writers = self._writers, {}
        for layer, writer in writers.items():
            if ok and self._next[layer] == len(self.shapes):
                writer.commit(layer=layer)
            else:
                writer.abort()
