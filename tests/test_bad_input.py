"""Bad input, as a user meets it on the command line: a clear message, a non-zero exit, no partial file.

Each test is one row of the README's bad-input table.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tests.ci import require
from tuner.cli import app
from tuner.export import ExportError, build_export, write_exported
from tuner.models import load_model

runner = CliRunner()


def tune(*args: str):
    result = runner.invoke(app, list(args))
    assert result.exit_code != 0, result.output
    return " ".join(result.output.split())  # rich wraps long lines


@pytest.fixture(autouse=True)
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)  # mlruns/ and outputs land here
    return tmp_path


@pytest.fixture(scope="module")
def exported_yaml(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir) -> dict:
    loaded = load_model(str(tiny_model_dir("bert")), pooling="cls")
    exported = build_export(loaded, loaded.default_config(basket_size=8), {"tuning": {"hm": 0.5}}, study="s", trial=0,
                            storage="sqlite://", dataset="d", dataset_fingerprint="f", seed=0)
    return exported.model_dump(mode="json", by_alias=True)


def write_config(folder: Path, data: dict, **changes: object) -> Path:
    data = json.loads(json.dumps(data))
    for dotted, value in changes.items():
        section, key = dotted.split("__")
        data[section][key] = value
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def encode_with(config: Path, folder: Path) -> str:
    docs = folder / "docs.txt"
    docs.write_text("w1 w2 w3\n", encoding="utf-8")
    return tune("encode", "--config", str(config), "--input", str(docs), "--output", str(folder / "out.npy"))


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("calibration__strength", 1.5, "calibration.strength: Input should be less than or equal to 1"),
        ("calibration__basket_size", 0, "calibration.basket_size: Input should be greater than or equal to 1"),
        ("calibration__layers", [], "calibration.layers: no layer given"),
        ("calibration__layers", [99], "layers: [99] beyond the model's depth; allowed indices are 0..2"),
        ("calibration__variant", "cls_medium", "calibration.variant: Input should be 'uniform', 'cls_soft' or 'cls_hard'"),
        ("calibration__weight", 1.0, "calibration.weight: Input should be less than 1"),
        ("calibration__basket_shares", "by_chance", "calibration.basket_shares: Input should be 'equal' or 'by_size'"),
        ("calibration__colour", "red", "calibration.colour: Extra inputs are not permitted"),
        ("calibration__strength", "strong", "calibration.strength: Input should be a valid number"),
        ("model__source", "BAAI/bge-m3", "this config was made for another model"),
    ],
)
def test_an_invalid_or_foreign_config_is_refused_naming_the_field(exported_yaml: dict, in_tmp: Path, field: str, value: object, message: str) -> None:
    assert message in encode_with(write_config(in_tmp, exported_yaml, **{field: value}), in_tmp)
    assert not (in_tmp / "out.npy").exists()


def test_a_python_tag_in_a_config_is_never_executed(in_tmp: Path) -> None:
    marker = in_tmp / "pwned"
    path = in_tmp / "evil.yaml"
    path.write_text(f"schema: !!python/object/apply:os.system ['touch {marker}']\n", encoding="utf-8")
    assert "never loads (such as !!python/object)" in encode_with(path, in_tmp)
    assert not marker.exists()


def test_unknown_model_alias() -> None:
    assert "unknown model 'bge-m4'. Known aliases: minilm, bge-m3" in tune("--model", "bge-m4", "--trials", "1")


def test_a_model_not_available_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    assert "hf download BAAI/bge-m3" in tune("--model", "bge-m3", "--trials", "1")


def test_remote_code_runs_only_with_the_flag() -> None:
    assert "Pass --trust-remote-code" in tune("--model", "gte-multilingual-base")


def test_trials_must_be_positive() -> None:
    assert "--trials must be at least 1, got 0" in tune("--trials", "0")


def test_a_malformed_hm_floor() -> None:
    assert "accepted" in tune("--hm-floor", "52").lower()


def test_a_malformed_storage_url() -> None:
    assert "cannot open study storage 'nosuchdb://x'" in tune("--storage", "nosuchdb://x", "--trials", "1")


def test_an_unknown_dataset() -> None:
    assert "unknown benchmark 'wikipos-train'" in tune("--dataset", "wikipos-train", "--trials", "1")


def test_a_dataset_missing_a_required_column(in_tmp: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"question": ["q"], "content": ["c"]}), in_tmp / "posq.parquet")
    assert "span_class" in tune("evaluate", "--dataset", f"fineweb-posq:{in_tmp / 'posq.parquet'}", "--no-sea", "--general", "")


def write_jsonl(folder: Path, corpus: list[dict], queries: list[dict]) -> Path:
    folder.mkdir(exist_ok=True)
    (folder / "corpus.jsonl").write_text("\n".join(json.dumps(d) for d in corpus), encoding="utf-8")
    (folder / "queries.jsonl").write_text("\n".join(json.dumps(q) for q in queries), encoding="utf-8")
    return folder


def test_a_query_whose_relevant_document_is_missing(in_tmp: Path) -> None:
    folder = write_jsonl(in_tmp / "d", [{"id": "d1", "text": "a b"}], [{"id": "q1", "text": "a", "relevant": ["d9"], "group": "end"}])
    output = tune("--dataset", f"jsonl:{folder}", "--trials", "1")
    assert "q1" in output and "d9" in output


def test_an_empty_corpus(in_tmp: Path) -> None:
    folder = write_jsonl(in_tmp / "e", [], [{"id": "q1", "text": "a", "relevant": ["d1"]}])
    assert "empty" in tune("--dataset", f"jsonl:{folder}", "--trials", "1").lower()


def test_a_non_utf8_input_file(exported_yaml: dict, in_tmp: Path) -> None:
    config = write_config(in_tmp, exported_yaml)
    docs = in_tmp / "latin1.txt"
    docs.write_bytes("café crème\n".encode("latin-1"))
    output = tune("encode", "--config", str(config), "--input", str(docs), "--output", str(in_tmp / "out.npy"))
    assert "not UTF-8" in output and not (in_tmp / "out.npy").exists()


def test_a_document_longer_than_the_model_is_warned_and_counted(exported_yaml: dict, in_tmp: Path) -> None:
    config = write_config(in_tmp, exported_yaml)
    docs = in_tmp / "docs.jsonl"
    docs.write_text(json.dumps({"text": " ".join(["w1"] * 400)}) + "\n" + json.dumps({"text": "w2 w3"}) + "\n", encoding="utf-8")
    result = runner.invoke(app, ["encode", "--config", str(config), "--input", str(docs), "--output", str(in_tmp / "e.npy")])
    assert result.exit_code == 0, result.output
    assert "1 truncated at 256 tokens" in " ".join(result.output.split())


@pytest.mark.parametrize("problem", ["missing", "read-only"])
def test_an_export_path_that_cannot_be_written_leaves_no_partial_file(exported_yaml: dict, in_tmp: Path, problem: str) -> None:
    from tuner.export import ExportedConfig

    folder = in_tmp / "out"
    if problem == "read-only":
        require(os.geteuid() != 0, "root writes into a read-only folder anyway; run the tests as another user (.ci/run does)")
        folder.mkdir()
        folder.chmod(0o500)
    with pytest.raises(ExportError, match="does not exist" if problem == "missing" else "not writable"):
        write_exported(ExportedConfig.model_validate(exported_yaml), folder / "best.yaml")
    assert not folder.exists() or list(folder.iterdir()) == []


def test_a_write_that_fails_midway_leaves_neither_the_file_nor_a_temporary(exported_yaml: dict, in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tuner.export import ExportedConfig

    def disk_full(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", disk_full)
    with pytest.raises(OSError, match="No space left"):
        write_exported(ExportedConfig.model_validate(exported_yaml), in_tmp / "best.yaml")
    assert list(in_tmp.iterdir()) == []


def test_a_malformed_cache_budget() -> None:
    assert "--cache-budget 'lots': write a size like 4GB" in tune("--cache-budget", "lots", "--trials", "1")


def test_a_malformed_inline_calibration() -> None:
    assert "write field=value pairs" in tune("evaluate", "--calibration", "strength", "--no-sea", "--general", "")
    assert "calibration config" in tune("evaluate", "--calibration", "strength=2", "--no-sea", "--general", "")
