"""Disk caches: reused across evaluators, invalidated by any change, corruption detected, nothing unpickled."""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import tuner
from tests.test_prefix import BATCH, scratch, tiny_dataset
from tuner.engine.models import LoadedModel, load_model
from tuner.evaluation import store as cache_module
from tuner.evaluation.evaluator import Evaluator
from tuner.evaluation.store import DiskCache, as_bytes, from_bytes

LAYERS = (1, 2)


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def bert(tiny_model_dir) -> LoadedModel:
    return load_model(str(tiny_model_dir("bert")), pooling="cls")


def trial(model: LoadedModel):
    return model.default_config(strength=0.8, basket_size=8, layers="last")  # starts at layer 2


def study(
    model: LoadedModel, folder: Path, dataset=None, **options
) -> tuple[Evaluator, np.ndarray, np.ndarray, np.ndarray]:
    """What a study does first: the baseline, the queries, then a trial."""
    evaluator = Evaluator(model, dataset or tiny_dataset(), BATCH, cache_dir=folder, prefix_layers=LAYERS, **options)
    baseline, _ = evaluator.baseline_vectors()
    queries = evaluator.query_vectors()
    vectors, _ = evaluator.document_vectors(trial(model))
    return evaluator, baseline, queries, vectors


def events(evaluator: Evaluator) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for name, event in evaluator.cache.disk.events:
        found.setdefault(name, []).append(event)
    return found


def entry(evaluator: Evaluator, name: str) -> Path:
    suffix = ".bin" if name.startswith("layer-input") else ".npy"
    return evaluator.cache.disk.folder / f"{name}{suffix}"


def test_a_second_study_reuses_queries_baseline_and_layer_inputs(bert: LoadedModel, tmp_path: Path) -> None:
    first, baseline, queries, vectors = study(bert, tmp_path)
    assert first.counts.full == 1 and first.counts.resumed == {2: 1}
    again, baseline2, queries2, vectors2 = study(bert, tmp_path)
    assert again.counts.full == 0 and again.counts.recorded == 0  # no forward pass over the corpus at all
    assert (
        again.counts.baseline_from_disk == 1 and again.counts.queries_from_disk == 1 and again.counts.resumed == {2: 1}
    )
    assert (
        np.array_equal(baseline, baseline2) and np.array_equal(queries, queries2) and np.array_equal(vectors, vectors2)
    )
    assert np.abs(vectors2 - scratch(bert, tiny_dataset(), trial(bert))).max() <= 1e-6
    assert set(events(again)) == {"queries", "baseline", "layer-input-001", "layer-input-002"}
    assert all(e == ["hit"] for e in events(again).values())


def test_a_held_out_evaluator_keeps_each_configs_vectors_for_the_next_study(bert: LoadedModel, tmp_path: Path) -> None:
    """`keep_on_disk`: a second study scoring the same config (the paper default on a held-out set) runs no pass
    at all and gets the same vectors; another config, or an evaluator without it, is encoded as before."""
    first, *_, vectors = study(bert, tmp_path, keep_on_disk=True)
    again, *_, vectors2 = study(bert, tmp_path, keep_on_disk=True)
    assert first.counts.resumed == {2: 1} and again.counts.resumed == {} and again.counts.full == 0
    assert again.counts.layer_tokens == 0 and np.array_equal(vectors, vectors2)
    other = bert.default_config(strength=0.4, basket_size=8, layers="last")
    again.document_vectors(other)
    assert again.counts.resumed == {2: 1}  # not on disk: encoded
    plain, *_ = study(bert, tmp_path)
    assert plain.counts.resumed == {2: 1}  # the tuning evaluators keep only what every trial shares


def test_a_held_out_evaluator_resumes_from_layer_inputs_it_does_not_leave_in_the_cache(
    bert: LoadedModel, tmp_path: Path
) -> None:
    """`keep_layer_inputs=False`: a held-out set scores two or three configs once per study, so its layer inputs
    live only as long as its evaluator; its vectors stay for the next study, which records the inputs again only
    for a config it has not scored."""
    first, baseline, _, vectors = study(bert, tmp_path, keep_on_disk=True, keep_layer_inputs=False)
    assert first.counts.full == 1 and first.counts.resumed == {2: 1}
    assert not list(tmp_path.rglob("layer-input-*")) and list(tmp_path.rglob("baseline.npy"))
    assert np.abs(vectors - scratch(bert, tiny_dataset(), trial(bert))).max() <= 1e-6
    again, baseline2, _, vectors2 = study(bert, tmp_path, keep_on_disk=True, keep_layer_inputs=False)
    assert again.counts.layer_tokens == 0 and np.array_equal(vectors, vectors2) and np.array_equal(baseline, baseline2)
    again.document_vectors(bert.default_config(strength=0.4, basket_size=8, layers="last"))
    assert again.counts.full == 0 and again.counts.recorded == 1 and again.counts.resumed == {2: 1}
    assert not list(tmp_path.rglob("layer-input-*"))


def test_missing_layer_inputs_are_recorded_without_a_full_pass(bert: LoadedModel, tmp_path: Path) -> None:
    study(bert, tmp_path)
    for path in tmp_path.rglob("layer-input-*"):
        path.unlink()
    again, *_ = study(bert, tmp_path)
    assert again.counts.full == 0 and again.counts.recorded == 1  # a pass stopped at layer 2's input


@pytest.mark.parametrize(
    "change", ["revision", "dataset", "document order", "engine version", "cache format", "local weights"]
)
def test_a_changed_model_dataset_or_engine_invalidates_every_entry(
    bert: LoadedModel, tmp_path: Path, change: str, monkeypatch: pytest.MonkeyPatch, tiny_model_dir
) -> None:
    model, dataset = bert, tiny_dataset()
    if change == "local weights":  # a private copy of the model folder, to re-save
        model = load_model(str(shutil.copytree(tiny_model_dir("bert"), tmp_path / "model")), pooling="cls")
    study(model, tmp_path, dataset)
    if change == "revision":
        model = dataclasses.replace(bert, revision="another-commit")
    elif change == "dataset":
        corpus = dict(dataset.corpus)
        corpus["d3"] = corpus["d3"] + " w1"
        dataset = dataclasses.replace(dataset, corpus=corpus)
    elif change == "document order":  # same fingerprint (it ignores order), other batches
        dataset = dataclasses.replace(dataset, corpus=dict(reversed(dataset.corpus.items())))
    elif change == "engine version":
        monkeypatch.setattr(tuner, "__version__", "9.9.9")
    elif change == "cache format":
        monkeypatch.setattr(cache_module, "CACHE_FORMAT", cache_module.CACHE_FORMAT + 1)
    else:
        os.utime(tmp_path / "model" / "config.json", ns=(1, 1))  # a re-saved local model: new mtime
    again, baseline, queries, vectors = study(model, tmp_path, dataset)
    found = events(again)
    was = "missing" if change == "dataset" else "stale"  # another dataset content has a folder of its own
    assert found["baseline"] == [was, "written"]
    assert found["queries"] == (["hit"] if change == "document order" else [was, "written"])  # queries keep
    assert found["layer-input-002"] == [was, "written", "hit"]  # written, then read back verified
    assert again.counts.full == 1 and again.counts.baseline_from_disk == 0
    assert np.abs(vectors - scratch(model, dataset, trial(model))).max() <= 1e-6


def corrupt(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "flipped bytes":
        middle = len(data) // 2
        data[middle : middle + 64] = bytes(b ^ 0x5A for b in data[middle : middle + 64])
        path.write_bytes(data)
    elif how == "appended":
        path.write_bytes(data + b"\0" * 16)
    else:  # bad metadata
        path.with_suffix(".json").write_text("{not json", encoding="utf-8")


@pytest.mark.parametrize("name", ["baseline", "queries", "layer-input-002"])
@pytest.mark.parametrize("how", ["truncated", "flipped bytes", "appended", "bad metadata"])
def test_a_corrupt_entry_is_detected_rebuilt_and_never_used(
    bert: LoadedModel, tmp_path: Path, name: str, how: str
) -> None:
    first, baseline, queries, vectors = study(bert, tmp_path)
    corrupt(entry(first, name), how)
    again, baseline2, queries2, vectors2 = study(bert, tmp_path)
    assert events(again)[name][:2] == ["corrupt", "written"]
    assert (
        np.array_equal(baseline, baseline2) and np.array_equal(queries, queries2) and np.array_equal(vectors, vectors2)
    )
    third, *_ = study(bert, tmp_path)  # the rebuilt entry is whole again
    assert events(third)[name] == ["hit"]


def test_layer_inputs_corrupted_after_planning_are_never_used(bert: LoadedModel, tmp_path: Path) -> None:
    """Huge values written into the cached states would change the vectors if they were ever read."""
    first, *_ = study(bert, tmp_path)
    path = entry(first, "layer-input-002")
    states = np.fromfile(path, dtype=np.float32)
    states[:] = 1e4
    states.tofile(path)  # same size, wrong checksum
    again, _, _, vectors = study(bert, tmp_path)
    assert events(again)["layer-input-002"][:2] == ["corrupt", "written"]
    assert np.abs(vectors - scratch(bert, tiny_dataset(), trial(bert))).max() <= 1e-6


class _Payload:
    """Unpickling this would create a file: the test checks it never exists."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_nothing_is_ever_unpickled(bert: LoadedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first, baseline, *_ = study(bert, tmp_path)
    # a pickle-bearing .npy with metadata whose size and checksum match it exactly
    marker = tmp_path / "unpickled"
    path = entry(first, "baseline")
    evil = np.empty(1, dtype=object)
    evil[0] = _Payload(marker)
    np.save(path, evil, allow_pickle=True)
    meta_path = path.with_suffix(".json")
    meta = json.loads(meta_path.read_text())
    data = path.read_bytes()
    meta.update(bytes=len(data), checksum={"algorithm": cache_module.CHECKSUM, "value": cache_module.checksum(data)})
    meta_path.write_text(json.dumps(meta))

    loads: list[object] = []
    real_load = np.load

    def spy(*args, **kwargs):
        loads.append(kwargs.get("allow_pickle"))
        return real_load(*args, **kwargs)

    def refuse(*args, **kwargs):
        raise AssertionError("something was unpickled")

    monkeypatch.setattr(np, "load", spy)
    for name in ("load", "loads"):
        monkeypatch.setattr(pickle, name, refuse)
    monkeypatch.setattr(pickle, "Unpickler", refuse)
    again, baseline2, *_ = study(bert, tmp_path)
    assert not marker.exists()
    assert events(again)["baseline"][:2] == ["corrupt", "written"]
    assert np.array_equal(baseline, baseline2)
    assert loads and all(flag is False for flag in loads)


def test_disk_caching_can_be_switched_off(bert: LoadedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    evaluator = Evaluator(bert, tiny_dataset(), BATCH, disk_cache=False, prefix_layers=LAYERS)
    vectors, _ = evaluator.document_vectors(trial(bert))
    evaluator.query_vectors()
    assert evaluator.counts.resumed == {2: 1}  # layer inputs still help, from a temporary folder
    assert not (tmp_path / "mlruns").exists()
    assert np.abs(vectors - scratch(bert, tiny_dataset(), trial(bert))).max() <= 1e-6


def test_the_default_location_is_under_the_run_folder(
    bert: LoadedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("POSFAIR_CACHE_DIR", raising=False)
    evaluator = Evaluator(bert, tiny_dataset(), BATCH, prefix_layers=())
    evaluator.query_vectors()
    assert (
        evaluator.cache.disk.folder.is_relative_to(Path("mlruns") / "cache")
        and (evaluator.cache.disk.folder / "queries.npy").exists()
    )
    monkeypatch.setenv("POSFAIR_CACHE_DIR", str(tmp_path / "elsewhere"))
    assert Evaluator(bert, tiny_dataset(), BATCH).cache.disk.folder.is_relative_to(tmp_path / "elsewhere")


def test_writes_leave_no_temporary_files(bert: LoadedModel, tmp_path: Path) -> None:
    study(bert, tmp_path)
    folder = next(tmp_path.rglob("baseline.npy")).parent
    left = folder / ".baseline.npy.killed-writer.tmp"
    left.write_bytes(b"half a file")
    os.utime(left, (1, 1))
    for path in folder.glob("baseline*"):
        path.unlink()
    study(bert, tmp_path)  # rewrites the baseline, sweeping the old leftover
    names = sorted(p.name for p in next(tmp_path.rglob("baseline.npy")).parent.iterdir())
    assert names == [
        "baseline.json",
        "baseline.npy",
        "layer-input-001.bin",
        "layer-input-001.json",
        "layer-input-002.bin",
        "layer-input-002.json",
        "queries.json",
        "queries.npy",
    ]
    meta = json.loads(next(tmp_path.rglob("layer-input-002.json")).read_text())
    assert meta["key"]["model"]["revision"] == bert.revision and meta["key"]["engine"]["posfair"] == tuner.__version__


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_raw_bytes_round_trip_in_the_models_dtype(dtype: torch.dtype) -> None:
    tensor = torch.randn(2, 5, 3).to(dtype)
    data = np.frombuffer(as_bytes(tensor), dtype=np.uint8)
    assert data.nbytes == tensor.numel() * tensor.element_size()
    assert torch.equal(from_bytes(data, dtype, (2, 5, 3)), tensor)


def test_a_missing_entry_is_just_missing(tmp_path: Path) -> None:
    disk = DiskCache(tmp_path)
    assert disk.load_array("nothing", {"k": 1}) is None and disk.events == [("nothing", "missing")]
