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
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

import tuner
from tuner.common.files import TEMPORARY_SUFFIX, temporary_beside, write_atomically

log = logging.getLogger(__name__)

CACHE_FORMAT = 1
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

    return {
        "format": CACHE_FORMAT,
        "posfair": tuner.__version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


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
            log.warning(
                "cache %s/%s is %s%s; rebuilding it", self.folder, name, event, f" ({detail})" if detail else ""
            )
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

    def _commit(
        self, name: str, data_name: str, temporary: Path, key: dict, size: int, digest: str, extra: dict
    ) -> None:
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
        data = as_bytes(tensor)
        self.file.write(data)
        self.hasher.update(data)
        self.size += data.nbytes

    def commit(self, **extra: object) -> None:
        self.file.close()
        self.cache._commit(
            self.name, f"{self.name}.bin", self.path, self.key, self.size, self.hasher.hexdigest(), extra
        )

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


def as_bytes(tensor: torch.Tensor) -> memoryview:
    """A CPU tensor's raw bytes in its own dtype (bfloat16 included, which numpy lacks)."""
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    return flat.view(_INT_OF_SIZE[flat.element_size()]).numpy().data.cast("B")


def from_bytes(data: np.ndarray, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """The inverse of `as_bytes` for a slice of a verified byte array (copied: memmaps stay read-only)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    as_int = np.array(data).view(_NUMPY_INT_OF_SIZE[itemsize])
    return torch.from_numpy(as_int).view(dtype).reshape(shape)
