"""Every file posfair writes is written whole or not at all, and its default places live in one module."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.common.files import replacing, write_atomically


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "best.yaml"
    target.write_text("old", encoding="utf-8")
    with pytest.raises(RuntimeError, match="disk full"), replacing(target) as temporary:
        temporary.write_text("half of the new", encoding="utf-8")
        assert target.read_text(encoding="utf-8") == "old"  # nothing visible before the block completes
        raise RuntimeError("disk full")
    assert target.read_text(encoding="utf-8") == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.yaml"]


def test_a_completed_write_replaces_the_file(tmp_path: Path) -> None:
    target = tmp_path / "vectors.bin"
    assert write_atomically(target, b"\x00\x01") == target and target.read_bytes() == b"\x00\x01"
    write_atomically(target, "é")
    assert target.read_bytes() == "é".encode() and sorted(p.name for p in tmp_path.iterdir()) == ["vectors.bin"]


def test_default_places_are_under_mlruns_in_the_working_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The study store, MLflow's store and the cache default to ./mlruns (README, `tune --help`); naming them
    creates nothing (a failed start leaves no store behind). MLflow's URI is relative, so a moved mlruns/ works."""
    from tuner.common.files import default_cache_dir
    from tuner.tracking.store import default_tracking_uri
    from tuner.tuning.storage import default_storage

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("POSFAIR_CACHE_DIR", raising=False)
    assert default_storage() == f"sqlite:///{tmp_path}/mlruns/optuna.db"
    assert default_tracking_uri() == "sqlite:///mlruns/mlflow.db"
    assert default_cache_dir() == Path("mlruns/cache")
    assert not (tmp_path / "mlruns").exists()
