"""Bad input, as a user meets it on the command line: a clear message, a non-zero exit, no partial file.

Each test is one row of the bad-input table (docs/bad-input.md).
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import optuna
import pytest
import yaml
from typer.testing import CliRunner

from tests.ci import require
from tests.test_study import write_dataset
from tests.tiny import export_of, save_custom_code, tiny_tune_options
from tuner.cli.app import app
from tuner.data import load_benchmark
from tuner.engine.exported import write_exported
from tuner.engine.models import load_model

runner = CliRunner()


def tune(*args: str):
    """Run the command line; it must fail with a message and a non-zero exit, never a traceback."""
    result = runner.invoke(app, list(args))
    assert result.exit_code != 0, result.output
    assert isinstance(result.exception, SystemExit), (
        f"traceback instead of a message: {result.exception!r}\n{result.output}"
    )
    return " ".join(result.output.split())  # rich wraps long lines


def succeeds(*args: str) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, f"{result.exception!r}\n{result.output}"
    return " ".join(result.output.split())


@pytest.fixture(autouse=True)
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)  # mlruns/ and outputs land here
    return tmp_path


@pytest.fixture(scope="module")
def exported_yaml(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir) -> dict:
    loaded = load_model(str(tiny_model_dir("bert")), pooling="cls")
    exported = export_of(loaded)
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
        (
            "calibration__variant",
            "cls_medium",
            "calibration.variant: Input should be 'uniform', 'cls_soft' or 'cls_hard'",
        ),
        ("calibration__weight", 1.0, "calibration.weight: Input should be less than 1"),
        ("calibration__basket_shares", "by_chance", "calibration.basket_shares: Input should be 'equal' or 'by_size'"),
        ("calibration__colour", "red", "calibration.colour: Extra inputs are not permitted"),
        ("calibration__strength", "strong", "calibration.strength: Input should be a valid number"),
        ("model__source", "BAAI/bge-m3", "this config was made for another model"),
        ("model__max_length", 100, "model: its fields were edited after the export (they no longer match model.digest"),
        ("model__pooling", "mean", "model.pooling: the config says 'mean', but it was exported with 'cls' (edited"),
        ("model__pooling+calibration__pooling", "mean", "model.pooling: the config says 'mean', but it was exported"),
        ("model__pooling+calibration__pooling", "last", "calibration.pooling: the config says 'last', but it was"),
        ("calibration__padding_side", "left", "calibration.padding_side: the config says 'left', but it was exported"),
    ],
)
def test_an_invalid_or_foreign_config_is_refused_naming_the_field(
    exported_yaml: dict, in_tmp: Path, field: str, value: object, message: str
) -> None:
    """`a+b` edits both fields: a plain transformers folder (no modules.json) tuned with --pooling cls, its config
    edited to another pooling in both sections, loaded without a word and moved every vector."""
    assert message in encode_with(write_config(in_tmp, exported_yaml, **dict.fromkeys(field.split("+"), value)), in_tmp)
    assert not (in_tmp / "out.npy").exists()


def test_a_tokenizer_changed_after_the_export_is_refused(tiny_model_dir, in_tmp: Path) -> None:
    """A tokenizer changed after the export (here two words trade ids) moved every vector without a word: the
    fingerprint covered the weights only."""
    folder = Path(shutil.copytree(tiny_model_dir("bert"), in_tmp / "bert"))
    config = write_exported(export_of(load_model(str(folder), pooling="cls")), in_tmp / "cal.yaml")
    tokenizer = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = tokenizer["model"]["vocab"]
    vocab["w1"], vocab["w2"] = vocab["w2"], vocab["w1"]
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer), encoding="utf-8")
    said = encode_with(config, in_tmp)
    changed = f"the tokenizer files in {folder} differ from those the config was exported with (tokenizer.json changed)"
    assert f"model.tokenizer: {changed}" in said
    assert not (in_tmp / "out.npy").exists()


def test_a_python_tag_in_a_config_is_never_executed(in_tmp: Path) -> None:
    marker = in_tmp / "pwned"
    path = in_tmp / "evil.yaml"
    path.write_text(f"schema: !!python/object/apply:os.system ['touch {marker}']\n", encoding="utf-8")
    assert "never loads (such as !!python/object)" in encode_with(path, in_tmp)
    assert not marker.exists()


def test_unknown_model_alias() -> None:
    assert "unknown model 'bge-m4'. Known aliases: minilm, mpnet, embeddinggemma, bge-m3" in tune(
        "--model", "bge-m4", "--trials", "1"
    )


def test_a_model_not_available_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    assert "hf download BAAI/bge-m3" in tune("--model", "bge-m3", "--trials", "1")


def test_remote_code_runs_only_with_the_flag(tmp_path: Path) -> None:
    folder = save_custom_code(tmp_path / "custom")
    assert "Pass --trust-remote-code" in tune(
        "--model", str(folder), "--pooling", "cls", "--output", str(tmp_path / "out.yaml")
    )
    assert not (tmp_path / "out.yaml").exists()


def test_trials_must_be_positive() -> None:
    assert "--trials must be at least 1, got 0" in tune("--trials", "0")


def test_a_malformed_hm_floor() -> None:
    assert "accepted" in tune("--hm-floor", "52").lower()


def test_a_malformed_storage_url() -> None:
    assert "cannot open study storage 'nosuchdb://x'" in tune("--storage", "nosuchdb://x", "--trials", "1")


def test_a_journal_storage_on_a_file_that_is_no_journal_leaves_it_as_it_was(in_tmp: Path) -> None:
    """Optuna's journal replays a one-line file it cannot read as an empty journal and appends to it."""
    notes = in_tmp / "notes.txt"
    notes.write_text("my notes\n", encoding="utf-8")
    output = tune("--storage", f"journal:{notes}", "--trials", "1")
    assert f"cannot open study storage 'journal:{notes}': {notes} is not an Optuna journal" in output
    assert notes.read_text(encoding="utf-8") == "my notes\n" and not (in_tmp / "mlruns").exists()


def test_a_storage_error_without_a_message_is_still_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """The storage message took the cause's first line with `splitlines()[0]`: an empty message raised IndexError."""
    import sqlalchemy

    from tuner.tuning.storage import check_storage_url

    def fails(url: str) -> None:
        raise sqlalchemy.exc.ArgumentError("")

    monkeypatch.setattr(sqlalchemy.engine, "make_url", fails)
    with pytest.raises(ValueError, match=r"^cannot open study storage 'sqlite:///x\.db'\. Use e\.g\. sqlite:///"):
        check_storage_url("sqlite:///x.db")


def test_an_unknown_dataset() -> None:
    assert "unknown benchmark 'wikipos-train'" in tune("--dataset", "wikipos-train", "--trials", "1")


def test_a_dataset_missing_a_required_column(in_tmp: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"question": ["q"], "content": ["c"]}), in_tmp / "posq.parquet")
    assert "span_class" in tune(
        "evaluate", "--dataset", f"fineweb-posq:{in_tmp / 'posq.parquet'}", "--no-sea", "--general", ""
    )


def write_jsonl(folder: Path, corpus: list[dict], queries: list[dict]) -> Path:
    folder.mkdir(exist_ok=True)
    (folder / "corpus.jsonl").write_text("\n".join(json.dumps(d) for d in corpus), encoding="utf-8")
    (folder / "queries.jsonl").write_text("\n".join(json.dumps(q) for q in queries), encoding="utf-8")
    return folder


def test_a_query_whose_relevant_document_is_missing(in_tmp: Path) -> None:
    folder = write_jsonl(
        in_tmp / "d", [{"id": "d1", "text": "a b"}], [{"id": "q1", "text": "a", "relevant": ["d9"], "group": "end"}]
    )
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
    docs.write_text(
        json.dumps({"text": " ".join(["w1"] * 400)}) + "\n" + json.dumps({"text": "w2 w3"}) + "\n", encoding="utf-8"
    )
    result = runner.invoke(
        app, ["encode", "--config", str(config), "--input", str(docs), "--output", str(in_tmp / "e.npy")]
    )
    assert result.exit_code == 0, result.output
    assert "1 truncated at 256 tokens" in " ".join(result.output.split())


@pytest.mark.parametrize("problem", ["missing", "read-only"])
def test_an_export_path_that_cannot_be_written_leaves_no_partial_file(
    exported_yaml: dict, in_tmp: Path, problem: str
) -> None:
    from tuner.engine.exported import ExportedConfig

    folder = in_tmp / "out"
    if problem == "read-only":
        folder.mkdir()
        folder.chmod(0o500)
    with pytest.raises(ValueError, match="does not exist" if problem == "missing" else "not writable"):
        write_exported(ExportedConfig.model_validate(exported_yaml), folder / "best.yaml")
    assert not folder.exists() or list(folder.iterdir()) == []


def test_a_write_that_fails_midway_leaves_neither_the_file_nor_a_temporary(
    exported_yaml: dict, in_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tuner.engine.exported import ExportedConfig

    def disk_full(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", disk_full)
    with pytest.raises(OSError, match="No space left"):
        write_exported(ExportedConfig.model_validate(exported_yaml), in_tmp / "best.yaml")
    assert list(in_tmp.iterdir()) == []


def test_a_malformed_cache_budget() -> None:
    assert "--cache-budget 'lots': write a size like 4GB" in tune("--cache-budget", "lots", "--trials", "1")


@pytest.mark.parametrize("budget", ["-1", "-4GB", "-0.5MiB"])
def test_a_negative_cache_budget(budget: str) -> None:
    assert f"--cache-budget must not be negative, got '{budget}'" in tune("--cache-budget", budget, "--trials", "1")


def test_a_malformed_study_budget_names_the_forms_it_takes() -> None:
    said = tune("--budget", "a third", "--trials", "1")
    assert (
        "--budget 'a third': write e.g. grid/3 (a third of the paper grid's layer-tokens), 5M (layer-tokens) or none"
        in said
    )


def test_a_bug_is_not_reported_as_bad_input(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only posfair's own errors become one-line messages: a RuntimeError from deep inside keeps its traceback."""
    import tuner.tuning.run

    def broken(settings: object) -> None:
        raise RuntimeError("index 3 is out of bounds")

    monkeypatch.setattr(tuner.tuning.run, "tune", broken)
    result = runner.invoke(app, ["--trials", "1"])
    assert isinstance(result.exception, RuntimeError) and not isinstance(result.exception, SystemExit)
    assert "error: index 3" not in result.output


def test_a_missing_model_is_reported_as_bad_input(monkeypatch: pytest.MonkeyPatch) -> None:
    """posfair's RuntimeErrors that the user can fix (here: a model that is not downloaded) stay one line."""
    import tuner.tuning.run
    from tuner.engine.specs import ModelUnavailableError

    def unavailable(settings: object) -> None:
        raise ModelUnavailableError("minilm is not in the Hugging Face cache; download it with ...")

    monkeypatch.setattr(tuner.tuning.run, "tune", unavailable)
    assert "error: minilm is not in the Hugging Face cache" in tune("--trials", "1")


def test_a_malformed_inline_calibration() -> None:
    assert "write field=value pairs" in tune("evaluate", "--calibration", "strength", "--no-sea", "--general", "")
    assert "calibration config" in tune("evaluate", "--calibration", "strength=2", "--no-sea", "--general", "")


# ---------------------------------------------------------------------------------------------------------------
# Issue 13: hostile input. Each test reproduces one case of the issue through the command line (or the public
# function the command calls); the case number is in the test's docstring.


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """12 documents of three parts, 36 queries, one per part: begin, middle, end."""
    return write_dataset(tmp_path_factory.mktemp("hostile") / "tiny")


def copy_of(folder: Path, name: str) -> Path:
    """A fresh copy of a JSONL dataset folder, to break."""
    copy = folder.parent / f"{folder.name}-{name}-{len(list(folder.parent.iterdir()))}"
    shutil.copytree(folder, copy)
    return copy


def edit_jsonl(path: Path, change) -> None:
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    path.write_text("\n".join(json.dumps(r) for r in change(records)), encoding="utf-8")


def tiny_run(model: Path, data: Path, *extra: str) -> list[str]:
    return ["run", *tiny_tune_options(model, data), *extra]


@pytest.mark.parametrize("value", ["-1", "0"])
def test_encode_refuses_a_batch_size_below_one(exported_yaml: dict, in_tmp: Path, value: str) -> None:
    """Case 1: `--batch-size -1` saved uninitialised memory; 0 silently meant "auto"."""
    config = write_config(in_tmp, exported_yaml)
    (in_tmp / "docs.txt").write_text("w1 w2 w3\nw4 w5\n", encoding="utf-8")
    output = tune(
        "encode",
        "--config",
        str(config),
        "--input",
        str(in_tmp / "docs.txt"),
        "--output",
        str(in_tmp / "out.npy"),
        "--batch-size",
        value,
    )
    assert "Invalid value for '--batch-size': Input should be greater than or equal to 1" in output
    assert not (in_tmp / "out.npy").exists()


def test_evaluate_refuses_a_batch_size_below_one(tiny_data: Path) -> None:
    """Case 1: `tune evaluate --batch-size -1` printed a made-up Table 1."""
    output = tune(
        "evaluate",
        "--dataset",
        f"jsonl:{tiny_data}",
        "--batch-size",
        "-1",
        "--no-sea",
        "--general",
        "",
        "--no-shuffled",
        "--bootstrap",
        "10",
    )
    assert "--batch-size" in output


def test_evaluate_refuses_a_config_made_under_another_pooling_before_it_scores(
    exported_yaml: dict, in_tmp: Path, tiny_model_dir, tiny_data: Path
) -> None:
    """`tune evaluate --model FOLDER --pooling mean --config cls.yaml`: the config was exported for the folder pooled
    with cls, so under mean pooling its calibration would be scored on another model than it was tuned on. Refused
    once the model loads, before anything is scored."""
    config = write_config(in_tmp, exported_yaml)
    output = tune(
        "evaluate",
        *("--model", str(tiny_model_dir("bert")), "--pooling", "mean", "--config", str(config)),
        *("--dataset", f"jsonl:{tiny_data}", "--no-sea", "--general", "", "--no-shuffled", "--bootstrap", "10"),
    )
    assert "this config was made for another model: model.pooling: config says 'cls', model has 'mean'" in output
    assert "No calibration" not in output


def test_the_encoder_refuses_a_batch_size_below_one_in_the_library_too(tiny_model_dir) -> None:
    from tuner.engine.encoder import CalibratedEncoder

    encoder = CalibratedEncoder(load_model(str(tiny_model_dir("bert")), pooling="cls"))
    with pytest.raises(ValueError, match="--batch-size must be at least 1, got -1"):
        encoder.encode_document(["w1 w2"], batch_size=-1)


def test_a_document_id_given_twice_is_refused_naming_both_lines(tiny_data: Path) -> None:
    """Case 2: the later text silently replaced the earlier one."""
    copy = copy_of(tiny_data, "dup")
    edit_jsonl(copy / "corpus.jsonl", lambda docs: [*docs, {"id": docs[0]["id"], "text": "w9 w9 w9"}])
    with pytest.raises(ValueError, match=r"corpus\.jsonl:13: document id 'd0' appears twice \(first on line 1"):
        load_benchmark(f"jsonl:{copy}")


def test_ids_1_and_the_string_1_are_not_merged_silently(tiny_data: Path) -> None:
    """Case 2: ids 1 and "1" were merged into one document."""
    copy = copy_of(tiny_data, "ids")
    edit_jsonl(copy / "corpus.jsonl", lambda docs: [*docs, {"id": 1, "text": "w1 w2"}, {"id": "1", "text": "w3 w4"}])
    with pytest.raises(
        ValueError, match=r"corpus\.jsonl:14: document id '1' appears twice \(first on line 13; 1 and \"1\""
    ):
        load_benchmark(f"jsonl:{copy}")


def test_a_dataset_with_one_position_group_is_refused_before_the_model_loads(
    tiny_model_dir, tiny_data: Path, in_tmp: Path
) -> None:
    """Case 6: with every query in group "all", PSI was 0 for every config and the uncalibrated model won."""
    copy = copy_of(tiny_data, "all")
    edit_jsonl(copy / "queries.jsonl", lambda queries: [{**q, "group": "all"} for q in queries])
    output = tune(*tiny_run(tiny_model_dir("bert"), copy))
    assert "every query is in the one position group 'all', so PSI would be 0" in output
    assert not (in_tmp / "mlruns").exists()  # refused before any store was made


def test_a_group_name_typo_is_refused_naming_the_line(tiny_data: Path) -> None:
    """Case 6: "Begin" became a fourth one-query group and moved PSI from 0.300 to 0.396."""
    copy = copy_of(tiny_data, "typo")
    edit_jsonl(
        copy / "queries.jsonl",
        lambda queries: [{**q, "group": "Begin"} if i == 3 else q for i, q in enumerate(queries)],
    )
    with pytest.raises(ValueError, match=r"queries\.jsonl:4: group 'Begin' is not one of begin, middle, end"):
        load_benchmark(f"jsonl:{copy}")


def test_labels_of_ones_own_that_differ_only_in_case_are_refused(tiny_data: Path) -> None:
    copy = copy_of(tiny_data, "own")
    edit_jsonl(
        copy / "queries.jsonl", lambda qs: [{**q, "group": ["Top", "top", "bottom"][i % 3]} for i, q in enumerate(qs)]
    )
    with pytest.raises(ValueError, match=r"queries\.jsonl:2: group 'top' differs from 'Top' only in case"):
        load_benchmark(f"jsonl:{copy}")


@pytest.mark.parametrize("name", ["docs.ndjson", "docs.JSONL", "docs.jsonl.gz"])
def test_encode_reads_json_lines_by_any_usual_name(exported_yaml: dict, in_tmp: Path, name: str) -> None:
    """Case 7: a .ndjson or .JSONL file was embedded line by line as raw JSON text."""
    config = write_config(in_tmp, exported_yaml)
    lines = "\n".join(json.dumps({"text": t}) for t in ["w1 w2 w3", "w4 w5 w6 w7"]) + "\n"
    (in_tmp / "docs.txt").write_text("w1 w2 w3\nw4 w5 w6 w7\n", encoding="utf-8")
    data = lines.encode("utf-8")
    (in_tmp / name).write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    succeeds(
        "encode", "--config", str(config), "--input", str(in_tmp / "docs.txt"), "--output", str(in_tmp / "plain.npy")
    )
    succeeds("encode", "--config", str(config), "--input", str(in_tmp / name), "--output", str(in_tmp / "lines.npy"))
    np.testing.assert_array_equal(np.load(in_tmp / "lines.npy"), np.load(in_tmp / "plain.npy"))


@pytest.mark.parametrize(
    ("line", "got"),
    [('["a", "b"]', "got ['a', 'b']"), ('{"text": null}', "got 'text' None"), ('{"text": 7}', "got 'text' 7")],
)
def test_encode_refuses_a_json_line_without_a_text_string(
    exported_yaml: dict, in_tmp: Path, line: str, got: str
) -> None:
    """Case 7 and 12: a list line was embedded as its Python repr; null or a number ended in a traceback."""
    config = write_config(in_tmp, exported_yaml)
    (in_tmp / "docs.jsonl").write_text('{"text": "w1"}\n' + line + "\n", encoding="utf-8")
    output = tune(
        "encode", "--config", str(config), "--input", str(in_tmp / "docs.jsonl"), "--output", str(in_tmp / "o.npy")
    )
    assert f"docs.jsonl:2: expected a JSON object with a string 'text' field, {got}" in output


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("calibration__layers", True, "calibration.layers: True is a boolean; write a number"),
        ("calibration__basket_size", True, "calibration.basket_size: True is a boolean; write a number"),
        ("calibration__strength", True, "calibration.strength: True is a boolean; write a number"),
    ],
)
def test_a_boolean_where_a_number_is_meant_is_refused(
    exported_yaml: dict, in_tmp: Path, key: str, value: object, message: str
) -> None:
    """Case 10: `layers: true` calibrated all layers and `basket_size: true` meant 1."""
    assert message in encode_with(write_config(in_tmp, exported_yaml, **{key: value}), in_tmp)


def test_a_duplicated_yaml_key_is_refused(exported_yaml: dict, in_tmp: Path) -> None:
    """Case 10: the last of two equal keys won silently."""
    path = write_config(in_tmp, exported_yaml)
    text = path.read_text(encoding="utf-8").replace("  strength: 0.5\n", "  strength: 0.5\n  strength: 0.9\n")
    path.write_text(text, encoding="utf-8")
    line = text.splitlines().index("  strength: 0.9") + 1
    assert (
        f"config.yaml:{line}: key 'strength' appears twice in one mapping (first on line {line - 1}); keep one"
        in encode_with(path, in_tmp)
    )


def test_a_basket_no_passage_can_fill_is_refused(exported_yaml: dict, in_tmp: Path) -> None:
    """Case 10: `basket_size: 1000000000` gave uncalibrated vectors without a word."""
    output = encode_with(write_config(in_tmp, exported_yaml, calibration__basket_size=1_000_000_000), in_tmp)
    assert "basket_size: 1000000000 is more than the 256 tokens" in output and "nothing would be calibrated" in output


@pytest.mark.parametrize("name", ["../../x", "a/b", ".hidden", "x" * 201, "with space"])
def test_a_study_name_outside_the_safe_characters_is_refused(name: str, in_tmp: Path) -> None:
    """Case 10: `--study-name ../../x` wrote the export outside mlruns/."""
    assert "--study-name" in tune("--study-name", name, "--trials", "1")
    assert not (in_tmp / "mlruns").exists()


def test_exports_and_vectors_are_written_with_the_users_umask(exported_yaml: dict, in_tmp: Path) -> None:
    """Case 10: exports and .npy files were 0600 whatever the umask."""
    from tuner.engine.exported import ExportedConfig

    previous = os.umask(0o022)
    try:
        path = write_exported(ExportedConfig.model_validate(exported_yaml), in_tmp / "best.yaml")
        (in_tmp / "docs.txt").write_text("w1 w2\n", encoding="utf-8")
        succeeds(
            "encode", "--config", str(path), "--input", str(in_tmp / "docs.txt"), "--output", str(in_tmp / "v.npy")
        )
    finally:
        os.umask(previous)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert stat.S_IMODE((in_tmp / "v.npy").stat().st_mode) == 0o644


def test_a_yaml_alias_bomb_is_refused_at_once(exported_yaml: dict, in_tmp: Path) -> None:
    """Case 8: a 1 KB alias bomb under an unknown key ran 201 s, then died with MemoryError."""
    import time

    path = write_config(in_tmp, exported_yaml)
    bomb = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    bomb += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 8)]  # 9**8: 43 million values
    path.write_text(
        path.read_text(encoding="utf-8") + "bomb:\n" + "\n".join("  " + b for b in bomb) + "\n", encoding="utf-8"
    )
    start = time.monotonic()
    output = encode_with(path, in_tmp)
    assert "expands to more than 100,000 values through its aliases" in output
    assert time.monotonic() - start < 30


def test_a_yaml_of_too_many_written_out_values_is_not_called_an_alias_bomb(in_tmp: Path) -> None:
    """A `--space` of 200,000 written-out values was said to expand "through its aliases", which it has none of."""
    (in_tmp / "space.yaml").write_text(f"basket_sizes: [{', '.join(['64'] * 200_000)}]\n", encoding="utf-8")
    output = tune("--space", str(in_tmp / "space.yaml"), "--trials", "1")
    assert (
        f"--space {in_tmp / 'space.yaml'}: holds more than 100,000 values, far more than any file posfair reads"
        in output
    )
    assert "alias" not in output


def test_a_huge_value_is_shown_shortened_in_the_error(exported_yaml: dict, in_tmp: Path) -> None:
    """Case 8: a 50 MB unknown value was echoed in full on stderr."""
    path = write_config(in_tmp, exported_yaml)
    path.write_text(path.read_text(encoding="utf-8") + "junk: " + "y" * 1_000_000 + "\n", encoding="utf-8")
    output = encode_with(path, in_tmp)
    assert "junk: Extra inputs are not permitted" in output and len(output) < 2000


def test_answers_past_the_truncation_point_are_dropped_with_a_count(in_tmp: Path, tiny_data: Path) -> None:
    """Case 14: a 200,000-character document was truncated, but its queries stayed grouped by offsets in the
    full text, at positions the model never sees. MiniLM reads 512 tokens: the middle and end queries of a
    200,000-character document lie far past that."""
    copy = copy_of(tiny_data, "long")
    long_text = " ".join(["alpha"] * 40_000)  # 239,999 characters
    edit_jsonl(copy / "corpus.jsonl", lambda docs: [*docs, {"id": "long", "text": long_text}])
    extra = [
        {"id": f"long-{group}", "text": "alpha", "relevant": ["long"], "span": [start, start + 5]}
        for group, start in (("begin", 6), ("middle", 120_000), ("end", 239_990))
    ]
    edit_jsonl(copy / "queries.jsonl", lambda queries: [*queries, *extra])
    result = runner.invoke(
        app,
        [
            "evaluate",
            "--dataset",
            f"jsonl:{copy}",
            "--no-sea",
            "--general",
            "",
            "--no-shuffled",
            "--bootstrap",
            "10",
            "--no-paper-default",
            "--json",
            str(in_tmp / "t.json"),
        ],
    )
    assert result.exit_code == 0, result.output
    baseline = json.loads((in_tmp / "t.json").read_text())["rows"][0]["metrics"]
    assert baseline["n_queries"] == 36 + 1  # the begin query stays; middle and end are dropped
    assert (baseline["n_begin"], baseline["n_middle"], baseline["n_end"]) == (13, 12, 12)
    assert "2 of 39 queries dropped: their answer lies past the 512 tokens" in " ".join(result.output.split())


def test_run_options_out_of_range_are_refused_before_any_work(in_tmp: Path) -> None:
    """Case 11: these were found only after minutes of work (or every trial failed with the wrong advice)."""
    assert "--bootstrap must be at least 1" in tune("--bootstrap", "-5")
    assert "--profile-docs must be at least 1" in tune("--profile-docs", "0")
    assert "--max-general-drop must be between 0 and 1" in tune(
        "--general", "wikipos-general", "--max-general-drop", "-1"
    )
    assert "Invalid value for '--seed': Input should be greater than or equal to 0" in tune("--seed", "-1")
    assert not (in_tmp / "mlruns").exists()


def test_a_run_output_in_a_missing_folder_is_refused_before_any_work(in_tmp: Path) -> None:
    """Case 11: `--output` in a missing folder failed only after the whole study."""
    assert "--output nowhere/best.yaml: folder nowhere does not exist" in tune("--output", "nowhere/best.yaml")
    assert not (in_tmp / "mlruns").exists()


def test_a_run_output_in_a_read_only_folder_is_refused_before_any_work(in_tmp: Path) -> None:
    (in_tmp / "ro").mkdir()
    (in_tmp / "ro").chmod(0o500)
    assert "folder ro is not writable" in tune("--output", "ro/best.yaml")


@pytest.mark.parametrize("target", ["folder", "."])
def test_encode_to_a_folder_is_refused_before_encoding(exported_yaml: dict, in_tmp: Path, target: str) -> None:
    """Case 11 and 12: `tune encode --output DIR` failed only after encoding."""
    config = write_config(in_tmp, exported_yaml)
    (in_tmp / "folder").mkdir()
    (in_tmp / "docs.txt").write_text("w1\n", encoding="utf-8")
    output = tune("encode", "--config", str(config), "--input", str(in_tmp / "docs.txt"), "--output", target)
    assert f"--output {target} is a folder; give a file name in it" in output


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("basket_sizes: [64\n", "space.yaml:2: not valid YAML"),
        ("basket_sizes: 64\n", "basket_sizes must be a list of integers, e.g. basket_sizes: [64, 128]; got 64"),
        ("strength_step: fine\n", "strength_step must be a number, e.g. strength_step: 0.05; got 'fine'"),
        ("strength_step: true\n", "strength_step must be a number"),
        ("basket_sizes: [64, 64.5]\n", "basket_sizes must be a list of integers"),
    ],
)
def test_a_bad_search_space_file_is_one_line_not_a_traceback(in_tmp: Path, text: str, message: str) -> None:
    """Case 12: an unparsable --space file, `basket_sizes: 64` and `strength_step: fine` ended in tracebacks."""
    (in_tmp / "space.yaml").write_text(text, encoding="utf-8")
    assert message in tune("--space", str(in_tmp / "space.yaml"), "--trials", "1")


def test_a_dataset_without_groups_is_refused_before_the_model_loads(
    tiny_model_dir, tiny_data: Path, in_tmp: Path
) -> None:
    """Case 12: a TypeError in the plots, with the MLflow parent run left RUNNING."""
    copy = copy_of(tiny_data, "nogroups")
    edit_jsonl(copy / "queries.jsonl", lambda queries: [{k: v for k, v in q.items() if k != "group"} for q in queries])
    assert "no query has a position group, so PSI cannot be computed" in tune(*tiny_run(tiny_model_dir("bert"), copy))
    assert not (in_tmp / "mlruns").exists()


def test_a_heldout_set_without_groups_is_refused_before_any_work(tiny_model_dir, tiny_data: Path, in_tmp: Path) -> None:
    """Case 12: `--heldout` on a set without groups failed after exporting, exit 1."""
    copy = copy_of(tiny_data, "heldout")
    edit_jsonl(copy / "queries.jsonl", lambda queries: [{k: v for k, v in q.items() if k != "group"} for q in queries])
    args = tiny_run(tiny_model_dir("bert"), tiny_data)
    args[args.index("--heldout") + 1] = f"jsonl:{copy}"
    assert "--heldout jsonl:" in tune(*args) and not (in_tmp / "mlruns").exists()


def test_a_corrupt_gzip_dataset_is_one_line(tiny_data: Path) -> None:
    """Case 12: a corrupt .gz dataset ended in a traceback."""
    copy = copy_of(tiny_data, "gz")
    (copy / "corpus.jsonl.gz").write_bytes(gzip.compress((copy / "corpus.jsonl").read_bytes())[:200])
    (copy / "corpus.jsonl").unlink()
    assert "is not a readable gzip file" in tune("evaluate", "--dataset", f"jsonl:{copy}", "--no-sea", "--general", "")


@pytest.mark.parametrize("problem", ["empty", "input-folder", "config-folder"])
def test_encode_with_an_empty_or_folder_input_is_one_line(exported_yaml: dict, in_tmp: Path, problem: str) -> None:
    """Case 12: an empty .txt, or --input/--config pointing at a folder, ended in tracebacks."""
    config = write_config(in_tmp, exported_yaml)
    (in_tmp / "docs.txt").write_text("\n\n", encoding="utf-8")
    (in_tmp / "dir").mkdir()
    inputs = {
        "empty": (config, in_tmp / "docs.txt"),
        "input-folder": (config, in_tmp / "dir"),
        "config-folder": (in_tmp / "dir", in_tmp / "docs.txt"),
    }[problem]
    if problem == "config-folder":
        (in_tmp / "docs.txt").write_text("w1\n", encoding="utf-8")
    output = tune("encode", "--config", str(inputs[0]), "--input", str(inputs[1]), "--output", str(in_tmp / "o.npy"))
    assert {"empty": "holds no texts", "input-folder": "is a folder", "config-folder": "is a folder; give a YAML file"}[
        problem
    ] in output


def test_exporting_a_study_tune_did_not_make_is_one_line(in_tmp: Path) -> None:
    """Case 12: `tune export` of a plain Optuna study raised KeyError: 'model_name'."""
    import optuna

    storage = f"sqlite:///{in_tmp / 'plain.db'}"
    optuna.create_study(study_name="plain", storage=storage).optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=1)
    assert "study 'plain' in" in (out := tune("export", "--study-name", "plain", "--storage", storage))
    assert "was not made by `tune` (it lacks model_name" in out


def test_the_ui_refuses_a_port_out_of_range_and_a_bad_tracking_uri() -> None:
    """Case 12: `tune ui --port 99999` raised OverflowError and exited 0; `--tracking-uri notaurl://x` a traceback."""
    assert "Invalid value for '--port': Input should be less than or equal to 65535" in tune("ui", "--port", "99999")
    assert "--tracking-uri 'notaurl://x': MLflow cannot use a 'notaurl' store" in tune(
        "ui", "--tracking-uri", "notaurl://x"
    )


def test_a_bad_tracking_uri_is_refused_before_a_run_starts(in_tmp: Path) -> None:
    assert "MLflow cannot use a 'notaurl' store" in tune("--tracking-uri", "notaurl://x", "--trials", "1")


def test_error_text_keeps_its_brackets(tiny_data: Path) -> None:
    """Case 13: rich markup ate "[start, end]" out of the message."""
    copy = copy_of(tiny_data, "span")
    edit_jsonl(copy / "queries.jsonl", lambda queries: [{**queries[0], "span": "0-5"}, *queries[1:]])
    assert "'span' must be [start, end] character offsets, got '0-5'" in tune(
        "evaluate", "--dataset", f"jsonl:{copy}", "--no-sea", "--general", ""
    )


def test_a_reversed_span_is_called_reversed(tiny_data: Path) -> None:
    """Case 13: a reversed span was called "outside its document"."""
    copy = copy_of(tiny_data, "rev")
    edit_jsonl(
        copy / "queries.jsonl",
        lambda queries: [
            {**{k: v for k, v in q.items() if k != "group"}, "span": [9, 2]} if i == 0 else q
            for i, q in enumerate(queries)
        ],
    )
    with pytest.raises(ValueError, match=r"queries\.jsonl:1: span \[9, 2\] ends before it starts"):
        load_benchmark(f"jsonl:{copy}")


@pytest.mark.parametrize(
    ("relevant", "message"),
    [
        ({"d0": "high"}, r"queries\.jsonl:1: document 'd0': relevance 'high' is not a whole number"),
        ({"d0": 0.5}, r"queries\.jsonl:1: document 'd0': relevance 0.5 is not a whole number"),
    ],
)
def test_a_grade_that_is_not_a_whole_number_is_refused_naming_the_line(
    tiny_data: Path, relevant: dict, message: str
) -> None:
    """Case 13: grade "high" gave a bare `invalid literal for int()`; 0.5 became 0."""
    copy = copy_of(tiny_data, "grade")
    edit_jsonl(copy / "queries.jsonl", lambda queries: [{**queries[0], "relevant": relevant}, *queries[1:]])
    with pytest.raises(ValueError, match=message):
        load_benchmark(f"jsonl:{copy}")


def test_a_fractional_grade_in_a_qrels_file_is_refused(tiny_data: Path) -> None:
    copy = copy_of(tiny_data, "tsvgrade")
    (copy / "qrels.tsv").write_text("q0-begin\td0\t0.5\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"qrels\.tsv:1: relevance 0.5 is not a whole number"):
        load_benchmark(f"jsonl:{copy}")


def test_a_missing_local_model_folder_is_not_sent_to_the_hub(in_tmp: Path) -> None:
    """Case 13: a missing local folder was told to `hf download /that/path`."""
    output = tune("--model", str(in_tmp / "no-such-model"), "--pooling", "cls", "--trials", "1")
    assert f"no model folder at {in_tmp / 'no-such-model'}" in output and "hf download" not in output


def test_an_inline_layer_list_is_read_whole() -> None:
    """Case 13: inline `layers=[4,5]` was told "write field=value pairs"."""
    from tuner.cli.evaluate import parse_inline

    assert parse_inline("strength=0.5,layers=[4,5]") == {"strength": 0.5, "layers": [4, 5]}
    assert parse_inline("layers=last:2,basket_size=64") == {"layers": "last:2", "basket_size": 64}
    with pytest.raises(ValueError, match="write field=value pairs"):
        parse_inline("layers=[4,5")


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--max-ndcg-drop", "half", "--max-ndcg-drop 'half': write a number such as 0.005"),
        ("--max-ndcg-drop", "2", "--max-ndcg-drop must be a number from 0 to 1"),
        ("--max-crops-psi", "-1", "--max-crops-psi must be a number from 0 to inf"),
        ("--max-crops-psi", "nan", "--max-crops-psi must be a number from 0 to inf"),
    ],
)
def test_a_constraint_limit_out_of_range_is_refused_before_any_work(flag: str, value: str, message: str) -> None:
    assert message in tune("run", "--dataset", "wikipos-dev", flag, value)


def encode_args(config: Path, source: Path, output: Path | str, *extra: str) -> list[str]:
    return ["encode", "--config", str(config), "--input", str(source), "--output", str(output), *extra]


@pytest.mark.parametrize("which", ["input", "input by another name", "config"])
def test_encode_refuses_an_output_that_is_one_of_its_inputs(exported_yaml: dict, in_tmp: Path, which: str) -> None:
    """Issue 24: `--output` equal to `--input` replaced the input text with the .npy, exit 0."""
    config = write_config(in_tmp, exported_yaml)
    docs = in_tmp / "docs.txt"
    docs.write_text("w1 w2\n", encoding="utf-8")
    target = {"input": docs, "config": config, "input by another name": in_tmp / "link.npy"}[which]
    if which == "input by another name":
        os.link(docs, target)
    before = target.read_bytes()
    output = tune(*encode_args(config, docs, target, "--force"))
    assert "an input of this command; posfair never writes over its inputs, even with --force" in output
    assert target.read_bytes() == before


def test_encode_never_replaces_something_that_is_not_a_regular_file(exported_yaml: dict, in_tmp: Path) -> None:
    """Issue 24: `--output` on a character device replaced the node with a regular file (as root, /dev/null
    would go); a named pipe stands in for the device here, so the old code cannot harm this machine."""
    from tuner.common.files import check_replaceable

    config = write_config(in_tmp, exported_yaml)
    (in_tmp / "docs.txt").write_text("w1 w2\n", encoding="utf-8")
    os.mkfifo(in_tmp / "pipe")
    assert "is a named pipe, not a file posfair may replace" in tune(
        *encode_args(config, in_tmp / "docs.txt", in_tmp / "pipe")
    )
    assert stat.S_ISFIFO((in_tmp / "pipe").stat().st_mode)
    with pytest.raises(ValueError, match="/dev/null is a character device"):
        check_replaceable(Path("/dev/null"), "--output")


def test_a_replaced_file_keeps_its_mode(exported_yaml: dict, in_tmp: Path) -> None:
    """Issue 24: a replaced export or .npy came back with the umask's mode (0644), opening a private file to all."""
    from tuner.engine.exported import ExportedConfig

    config = write_config(in_tmp, exported_yaml)
    (in_tmp / "docs.txt").write_text("w1 w2\n", encoding="utf-8")
    np.save(in_tmp / "v.npy", np.zeros((2, 32), dtype=np.float32))  # earlier outputs of posfair's own, made private
    write_exported(ExportedConfig.model_validate(exported_yaml), in_tmp / "best.yaml")
    for target in (in_tmp / "v.npy", in_tmp / "best.yaml"):
        target.chmod(0o600)
    succeeds(*encode_args(config, in_tmp / "docs.txt", in_tmp / "v.npy"))
    write_exported(ExportedConfig.model_validate(exported_yaml), in_tmp / "best.yaml")
    assert [stat.S_IMODE((in_tmp / n).stat().st_mode) for n in ("v.npy", "best.yaml")] == [0o600, 0o600]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("w1 w2\n\nw3\n", "docs.txt:2: a blank line"),
        ("w1 w2\n   \nw3\n", "docs.txt:2: a blank line"),
    ],
)
def test_encode_refuses_blank_lines_instead_of_dropping_rows(in_tmp: Path, content: str, message: str) -> None:
    """Issue 24: blank and whitespace-only lines were dropped, so row k of the .npy was not line k."""
    from tuner.data.texts import read_texts

    (in_tmp / "docs.txt").write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        read_texts(in_tmp / "docs.txt")


def test_plain_text_splits_on_newlines_only(in_tmp: Path) -> None:
    """Issue 24: form feed, U+0085 and U+2028 split a line (str.splitlines), so 3 lines gave 5 vectors."""
    from tuner.data.texts import read_texts

    (in_tmp / "docs.txt").write_bytes("a\x0cb\nc\u0085d\u2028e\r\nf\n".encode())
    assert read_texts(in_tmp / "docs.txt") == ["a\x0cb", "c\u0085d\u2028e", "f"]


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\u0085"])
def test_json_lines_accept_raw_separators_inside_strings(tiny_data: Path, in_tmp: Path, separator: str) -> None:
    """Issue 24: valid JSON Lines with a raw U+2028 or U+0085 inside a string were refused as invalid JSON."""
    from tuner.data.texts import read_texts

    (in_tmp / "docs.jsonl").write_text(
        json.dumps({"text": f"a{separator}b"}, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    assert read_texts(in_tmp / "docs.jsonl") == [f"a{separator}b"]
    copy = copy_of(tiny_data, "separator")
    edit_jsonl(copy / "corpus.jsonl", lambda docs: [{**docs[0], "text": docs[0]["text"] + separator + "x"}, *docs[1:]])
    (copy / "corpus.jsonl").write_text(
        (copy / "corpus.jsonl")
        .read_text(encoding="utf-8")
        .replace("\\u2028", "\u2028")
        .replace("\\u2029", "\u2029")
        .replace("\\u0085", "\u0085"),
        encoding="utf-8",
    )
    assert load_benchmark(f"jsonl:{copy}").corpus["d0"].endswith(separator + "x")


def test_a_lone_surrogate_is_refused_naming_file_line_and_id(tiny_data: Path, in_tmp: Path) -> None:
    """Issue 24: a lone surrogate (valid JSON, not encodable text) failed after the model loaded, naming nothing."""
    from tuner.data.texts import read_texts

    copy = copy_of(tiny_data, "surrogate")
    edit_jsonl(copy / "corpus.jsonl", lambda docs: [docs[0], {**docs[1], "text": "a\ud800b"}, *docs[2:]])
    with pytest.raises(ValueError, match=r"corpus\.jsonl:2: id 'd1': 'text' holds a lone surrogate \(U\+D800"):
        load_benchmark(f"jsonl:{copy}")
    (in_tmp / "docs.jsonl").write_text('{"text": "ok"}\n{"text": "a\\udc00"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"docs\.jsonl:2: 'text' holds a lone surrogate \(U\+DC00"):
        read_texts(in_tmp / "docs.jsonl")


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_a_nan_or_infinite_grade_is_refused_naming_the_line(tiny_data: Path, constant: str) -> None:
    """Issue 24: NaN / Infinity grades ended in a bare `cannot convert float NaN to integer` or an OverflowError
    traceback."""
    copy = copy_of(tiny_data, "nan")
    lines = (copy / "queries.jsonl").read_text(encoding="utf-8").splitlines()
    lines[1] = lines[1].replace('"relevant": ["d0"]', f'"relevant": {{"d0": {constant}}}')
    (copy / "queries.jsonl").write_text("\n".join(lines), encoding="utf-8")
    with pytest.raises(ValueError, match=rf"queries\.jsonl:2: {constant} is not a JSON number"):
        load_benchmark(f"jsonl:{copy}")
    (copy / "queries.jsonl").write_text("\n".join(lines[:1] + lines[2:]), encoding="utf-8")
    (copy / "qrels.tsv").write_text(f"q0-begin\td0\t{constant.lower()}\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"qrels\.tsv:1: relevance .* is not a whole number"):
        load_benchmark(f"jsonl:{copy}")


def test_a_span_on_an_empty_document_names_file_and_line(tiny_data: Path) -> None:
    """Issue 24: a span [0, 0] on an empty document ended in ZeroDivisionError, naming no file or line."""
    copy = copy_of(tiny_data, "emptyspan")
    edit_jsonl(copy / "corpus.jsonl", lambda docs: [{**docs[0], "text": ""}, *docs[1:]])
    edit_jsonl(
        copy / "queries.jsonl",
        lambda queries: [{**{k: v for k, v in queries[0].items() if k != "group"}, "span": [0, 0]}, *queries[1:]],
    )
    with pytest.raises(
        ValueError, match=r"queries\.jsonl:1: query 'q0-begin' has a span in document 'd0', which is empty"
    ):
        load_benchmark(f"jsonl:{copy}")


def test_the_pyfunc_refuses_none_and_non_strings_and_reads_the_text_column_by_name() -> None:
    """Issue 24: `predict([None])` embedded the word "None"; a DataFrame was read by position, not column."""
    import pandas as pd

    from tuner.tracking.registry import _texts

    with pytest.raises(ValueError, match=r"input 1 is None, not a string"):
        _texts(["a", None])
    with pytest.raises(ValueError, match=r"input 0 is an int \(7\), not a string"):
        _texts([7])
    assert _texts(pd.DataFrame({"id": ["x", "y"], "text": ["a", "b"]})) == ["a", "b"]
    assert _texts(pd.DataFrame({0: ["a"]})) == ["a"]
    with pytest.raises(ValueError, match=r"columns \['id', 'body'\]: give one column, or one named 'text'"):
        _texts(pd.DataFrame({"id": ["x"], "body": ["a"]}))


@pytest.fixture(scope="module")
def champion(exported_yaml: dict, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The pyfunc model `tune` registers, saved from a tiny model's YAML, loaded as MLflow clients load it."""
    import mlflow

    from tuner.engine.encoder import CalibratedEncoder
    from tuner.tracking.registry import save_pyfunc

    folder = tmp_path_factory.mktemp("champion")
    config = write_config(folder, exported_yaml)
    encoder = CalibratedEncoder.from_yaml(config)
    save_pyfunc(folder / "model", config, int(encoder.model.model.config.hidden_size))
    return {"model": mlflow.pyfunc.load_model(str(folder / "model")), "encoder": encoder}


PASSAGES = ["w1 w2 w3 w4 w5 w6 w7 w8 w9 w10 w11", "w3 w2 w1"]


def same_vectors(got: object, want: np.ndarray) -> bool:
    got = np.asarray(got)
    return got.dtype == np.float32 and got.shape == want.shape and float(np.abs(got - want).max(initial=0.0)) < 1e-6


def test_the_pyfunc_reads_a_frame_by_its_text_column_or_refuses_it(champion: dict) -> None:
    """MLflow enforced the logged signature (one unnamed string input) before the model's own column lookup:
    a frame with an `other` column before `text` embedded "zzz", and one without `text` its first column."""
    import pandas as pd

    model, encoder = champion["model"], champion["encoder"]
    want = encoder.encode_document(PASSAGES)
    assert same_vectors(model.predict(pd.DataFrame({"other": ["zzz", "yyy"], "text": PASSAGES})), want)
    assert same_vectors(model.predict(pd.DataFrame({"text": PASSAGES})), want)
    assert same_vectors(model.predict(PASSAGES), want)
    with pytest.raises(ValueError, match=r"input columns \['id', 'body'\]: give one column, or one named 'text'"):
        model.predict(pd.DataFrame({"id": ["x", "y"], "body": PASSAGES}))
    assert same_vectors(model.predict(PASSAGES, params={"kind": "query"}), encoder.encode_query(PASSAGES))


def test_the_pyfunc_reads_a_zero_dimensional_array_as_one_text(champion: dict) -> None:
    """`predict(np.array("text"))`, a 0-d array, raised a raw `TypeError: iteration over a 0-d array`."""
    model, encoder = champion["model"], champion["encoder"]
    assert same_vectors(model.predict(np.array(PASSAGES[0])), encoder.encode_document(PASSAGES[:1]))
    with pytest.raises(ValueError, match=r"input 0 is an int \(3\), not a string"):
        model.predict(np.array(3))


def test_the_pyfunc_answers_no_texts_with_no_rows(champion: dict) -> None:
    """`predict([])` raised MLflow's schema error, an empty `text` column an IndexError."""
    import pandas as pd

    width = int(champion["encoder"].model.model.config.hidden_size)
    for empty in ([], pd.DataFrame({"text": pd.Series([], dtype=object)}), {"text": []}):
        assert same_vectors(champion["model"].predict(empty), np.zeros((0, width), dtype=np.float32)), empty


def test_the_pyfunc_reads_the_dict_and_rest_forms_mlflow_clients_send(champion: dict) -> None:
    """`{"text": [...]}` in Python, and `inputs` / `dataframe_split` / `dataframe_records` through MLflow's
    scoring server (what `mlflow models serve` runs), each with `params`."""
    from fastapi.testclient import TestClient
    from mlflow.pyfunc import scoring_server

    model, encoder = champion["model"], champion["encoder"]
    documents, queries = encoder.encode_document(PASSAGES), encoder.encode_query(PASSAGES)
    assert same_vectors(model.predict({"text": PASSAGES}), documents)
    server = TestClient(scoring_server.init(model))
    for body in (
        {"inputs": PASSAGES},
        {"inputs": {"text": PASSAGES}},
        {"dataframe_split": {"columns": ["other", "text"], "data": [["zzz", text] for text in PASSAGES]}},
        {"dataframe_records": [{"text": text, "other": "zzz"} for text in PASSAGES]},
    ):
        for params, want in (({}, documents), ({"params": {"kind": "query"}}, queries)):
            answer = server.post("/invocations", json={**body, **params})
            assert answer.status_code == 200, (body, answer.text)
            assert np.abs(np.asarray(answer.json()["predictions"]) - want).max() < 1e-6, (body, params)
    refused = server.post("/invocations", json={"dataframe_split": {"columns": ["id", "body"], "data": [["x", "y"]]}})
    assert refused.status_code >= 400 and "give one column, or one named 'text'" in refused.text


def test_a_study_tuned_with_remote_code_registers_a_model_that_loads(tiny_data: Path, in_tmp: Path) -> None:
    """A `--trust-remote-code` study registered a pyfunc that could not be loaded: the pyfunc loaded its model without
    the remote code the study had allowed. It records the permission in its MLmodel, and loads."""
    import mlflow

    from tuner.engine.encoder import CalibratedEncoder
    from tuner.tracking.registry import registered_name

    folder = save_custom_code(in_tmp / "custom")
    succeeds(
        *tiny_run(folder, tiny_data, "--trust-remote-code", "--trials", "1", "--output", str(in_tmp / "best.yaml"))
    )
    mlflow.set_tracking_uri(f"sqlite:///{in_tmp / 'mlruns' / 'mlflow.db'}")  # reset after the test (conftest)
    champion = mlflow.pyfunc.load_model(f"models:/{registered_name(str(folder))}@champion")
    encoder = CalibratedEncoder.from_yaml(in_tmp / "best.yaml", trust_remote_code=True)
    assert same_vectors(champion.predict(PASSAGES), encoder.encode_document(PASSAGES))


@pytest.mark.parametrize("which", ["the same set", "a copy", "shared passages"])
def test_a_heldout_set_that_overlaps_the_tuning_data_is_refused(
    tiny_model_dir, tiny_data: Path, in_tmp: Path, which: str
) -> None:
    """Issue 24: `--heldout` equal to `--dataset` was accepted, and the tuning split reported and exported as held
    out."""
    held = tiny_data
    if which != "the same set":
        held = copy_of(tiny_data, "held")
        if which == "shared passages":  # one query of its own on one of the tuning passages, the rest new
            edit_jsonl(
                held / "queries.jsonl",
                lambda queries: [{**q, "id": f"h{q['id']}", "text": q["text"] + " x"} for q in queries],
            )
    args = tiny_run(tiny_model_dir("bert"), tiny_data)
    args[args.index("--heldout") + 1] = f"jsonl:{held}"
    output = tune(*args)
    assert "is not held out" in output and "relevant passages" in output or "is the tuning set itself" in output, output
    assert not (in_tmp / "mlruns").exists()


def test_a_stratum_with_too_few_queries_per_group_is_refused_before_the_model_loads(
    tiny_model_dir, tiny_data: Path, in_tmp: Path
) -> None:
    """Issue 24: a stratum of one query weighed as much as one of 107 (HM above every group's nDCG@10, PSI halved),
    without a warning; and the failed start left a study that refused the fixed rerun."""
    copy = copy_of(tiny_data, "stratum")
    edit_jsonl(
        copy / "queries.jsonl",
        lambda queries: [{**q, "stratum": "short" if i == 0 else "long"} for i, q in enumerate(queries)],
    )
    output = tune(*tiny_run(tiny_model_dir("bert"), copy))
    assert "stratum 'short' has 1 query in group 'begin', 0 in 'middle', 0 in 'end'" in output
    assert "at least 3 per group" in output
    assert not (in_tmp / "mlruns").exists()
    edit_jsonl(copy / "queries.jsonl", lambda queries: [{**q, "stratum": "long"} for q in queries])
    succeeds(*tiny_run(tiny_model_dir("bert"), copy, "--trials", "1"))


def test_a_stratum_on_some_queries_only_is_refused_before_the_model_loads_leaving_no_store(
    tiny_model_dir, tiny_data: Path, in_tmp: Path
) -> None:
    """A stratum that covered only part of the queries failed after the model loaded (the metrics refused it),
    and left mlruns/optuna.db behind."""
    copy = copy_of(tiny_data, "partial-stratum")
    edit_jsonl(
        copy / "queries.jsonl",
        lambda queries: [{**q, "stratum": "long"} if i < 18 else q for i, q in enumerate(queries)],
    )
    output = tune(*tiny_run(tiny_model_dir("bert"), copy))
    assert "18 of its 36 queries with a position group have no stratum (e.g. 'q6-begin')" in output
    assert "give each of them a 'stratum', or drop 'stratum' from every query" in output
    assert not (in_tmp / "mlruns").exists()


def test_resuming_a_study_with_its_constraints_or_side_sets_changed_is_refused(
    tiny_model_dir, tiny_data: Path, in_tmp: Path
) -> None:
    """Issue 24: a study resumed with `--general --max-general-drop` added kept its earlier trials, never scored on
    the general set, eligible to win."""
    general = write_dataset(in_tmp / "general", docs=6, seed=2)
    args = tiny_run(tiny_model_dir("bert"), tiny_data, "--trials", "1")
    succeeds(*args)
    output = tune(*args, "--trials", "2", "--general", f"jsonl:{general}", "--max-general-drop", "0.005")
    assert "was created with other settings (general, general_fingerprint, max_general_drop)" in output


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("basket_sizes: [64, 128, 64]\n", "basket_sizes lists 64 twice; list each value once"),
        ("depths: [last, last]\n", "depths lists 'last' twice"),
        ("variants: [uniform, uniform]\n", "variants lists 'uniform' twice"),
        ("strength_step: 0.3\n", "strength_step 0.3 does not divide 1"),
    ],
)
def test_a_search_space_with_duplicates_or_a_ragged_grid_is_refused(in_tmp: Path, text: str, message: str) -> None:
    """Issue 24: duplicate --space values and a step that does not divide [0, 1] were accepted, with raw Optuna
    warnings."""
    (in_tmp / "space.yaml").write_text(text, encoding="utf-8")
    assert message in tune("--space", str(in_tmp / "space.yaml"), "--trials", "1")
    assert not (in_tmp / "mlruns").exists()


def test_a_search_space_without_the_paper_default_says_so() -> None:
    """Issue 24: a strength_step that skips λ 0.5 dropped the paper-default trial without a word."""
    from tuner.tuning.search_space import PAPER_DEFAULT_PARAMS, SearchSpace

    space = SearchSpace(strength_step=0.2)
    assert not space.admits(PAPER_DEFAULT_PARAMS)
    assert "strength_step 0.2 skips λ 0.5" in space.outside(PAPER_DEFAULT_PARAMS)
    assert "basket sizes [64, 256] lack 128" in SearchSpace(basket_sizes=(64, 256)).outside(PAPER_DEFAULT_PARAMS)
    assert SearchSpace().outside(PAPER_DEFAULT_PARAMS) == ""


def test_an_options_file_with_two_spellings_of_one_key_is_refused(in_tmp: Path) -> None:
    """Issue 24: `hm-floor` and `hm_floor` in one options file: one silently won."""
    (in_tmp / "opts.yaml").write_text("hm-floor: baseline\nhm_floor: 0.52\n", encoding="utf-8")
    output = tune("--options", str(in_tmp / "opts.yaml"))
    assert "are one option (--hm-floor); keep one" in output and "'hm_floor'" in output


def test_a_study_name_derived_from_a_long_path_is_shortened_with_a_digest(in_tmp: Path) -> None:
    """Issue 24: a long dataset path made a 297-character default study name that failed with `File name too long`
    only after every trial had run."""
    from tuner.tuning.settings import STUDY_NAME, TuneSettings

    deep = "jsonl:" + "/".join(["a-rather-long-folder-name"] * 12)
    for end in ("one", "two"):
        (in_tmp / deep.removeprefix("jsonl:") / end).mkdir(parents=True)
    names = [TuneSettings(dataset=deep + end).study_name_from_alias("minilm") for end in ("/one", "/two")]
    assert all(STUDY_NAME.match(name) and len(name) <= 200 for name in names) and names[0] != names[1]
    assert names[0] == TuneSettings(dataset=deep + "/one").study_name_from_alias("minilm")  # stable: a rerun resumes it
    assert TuneSettings(dataset="wikipos-dev").study_name_from_alias("minilm") == "minilm--wikipos-dev--seed0"
    (in_tmp / names[0]).with_suffix(".yaml").write_text("fits", encoding="utf-8")


def test_a_full_disk_at_export_leaves_no_file_no_registry_version_and_a_failed_parent_run(
    tiny_model_dir, tiny_data: Path, in_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 24: ENOSPC at export ended in a traceback, left the parent run RUNNING and an orphan registry version."""
    import errno

    from mlflow.tracking import MlflowClient

    import tuner.engine.exported
    from tuner.common.files import replacing

    def full_disk(path: Path, data: str, **_: object) -> Path:
        with replacing(path) as temporary:
            temporary.write_text(data[:10], encoding="utf-8")
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tuner.engine.exported, "write_atomically", full_disk)
    output = tune(*tiny_run(tiny_model_dir("bert"), tiny_data, "--output", str(in_tmp / "best.yaml")))
    assert "No space left on device" in output and "nothing exported" in output
    assert [p.name for p in in_tmp.iterdir() if "best" in p.name] == []
    tracking = f"sqlite:///{in_tmp / 'mlruns' / 'mlflow.db'}"
    client = MlflowClient(tracking, registry_uri=tracking)
    assert client.search_model_versions() == []
    parent = client.search_runs(
        [client.get_experiment_by_name("posfair").experiment_id], "tags.`posfair.role` = 'study'"
    )[0]
    assert parent.info.status == "FAILED" and "No space left on device" in parent.data.tags["posfair.outcome"]
    # `tune export` of that study on the same full disk: the parent run it reopened is closed FAILED, not left RUNNING
    output = tune("export", "--study-name", parent.data.tags["posfair.study"], "--output", str(in_tmp / "again.yaml"))
    assert "No space left on device" in output and not (in_tmp / "again.yaml").exists()
    parent = client.get_run(parent.info.run_id)
    assert parent.info.status == "FAILED" and "No space left on device" in parent.data.tags["posfair.outcome"]


def tables(database: Path) -> set[str]:
    import sqlite3

    with sqlite3.connect(database) as connection:
        return {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


@pytest.mark.parametrize("crossed", ["--storage at MLflow's store", "--tracking-uri at the study database"])
def test_crossed_stores_are_recognised_before_anything_is_written(
    tiny_model_dir, tiny_data: Path, in_tmp: Path, crossed: str
) -> None:
    """`--storage` at `mlflow.db` (or `--tracking-uri` at `optuna.db`) ended in misleading errors and left the other
    tool's tables in the file."""
    import optuna
    from mlflow.tracking import MlflowClient

    database = in_tmp / "store.db"
    if crossed.startswith("--storage"):
        MlflowClient(f"sqlite:///{database}").search_experiments()  # MLflow makes its tables on first use
        flag, says = "--storage", "is an MLflow tracking store (it holds MLflow's tables"
    else:
        optuna.storages.RDBStorage(f"sqlite:///{database}")
        flag, says = "--tracking-uri", "is an Optuna study database (it holds Optuna's tables"
    before = tables(database)
    output = tune(*tiny_run(tiny_model_dir("bert"), tiny_data, flag, f"sqlite:///{database}"))
    assert f"{flag} sqlite:///{database} {says}" in output and "needs a database of its own" in output, output
    assert "tune: settings" not in output  # before the model loads
    assert tables(database) == before
    if crossed.startswith("--storage"):  # `tune export` opens the study database the same way
        assert says in tune("export", "--study-name", "s", "--storage", f"sqlite:///{database}")
        assert tables(database) == before


def test_one_database_for_both_stores_is_refused(in_tmp: Path) -> None:
    """`--storage` and `--tracking-uri` on one new file: Optuna made its tables there, then MLflow failed on them."""
    same = f"sqlite:///{in_tmp / 'both.db'}"
    output = tune("--storage", same, "--tracking-uri", same, "--trials", "1")
    assert f"--storage and --tracking-uri name one database ({same})" in output
    assert not (in_tmp / "both.db").exists()
    default_store = in_tmp / "mlruns" / "mlflow.db"  # the tracking store in force when none is given
    assert "name one database" in tune("--storage", f"sqlite:///{default_store}", "--trials", "1")


def test_a_full_disk_during_tune_encode_says_so_in_one_line_and_leaves_no_file(
    exported_yaml: dict, in_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSPC while the vectors were written ended in a full traceback."""
    import errno

    config = write_config(in_tmp, exported_yaml)
    (in_tmp / "docs.txt").write_text("w1 w2 w3\nw4 w5\n", encoding="utf-8")
    real_save = np.save

    def full_disk(stream: object, vectors: np.ndarray, *args: object, **kwargs: object) -> None:
        real_save(stream, vectors[:1], *args, **kwargs)  # part of the file, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(np, "save", full_disk)
    output = tune(
        "encode", "--config", str(config), "--input", str(in_tmp / "docs.txt"), "--output", str(in_tmp / "out.npy")
    )
    assert f"cannot write {in_tmp / 'out.npy'}: No space left on device; nothing written (no partial file)" in output
    assert "Free space on its disk" in output
    assert sorted(p.name for p in in_tmp.iterdir()) == ["config.yaml", "docs.txt"]


@contextmanager
def full_after_trials(count: int, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The study database's disk is full once `count` trials have finished: SQLite's own "database or disk is
    full" (SQLITE_FULL), as on a full disk, from every connection opened after that, since each may hold no more
    pages than the file has then (`PRAGMA max_page_count`)."""
    import sqlalchemy

    import tuner.tuning.worker

    real = tuner.tuning.worker.log_trial

    def capped(connection: object, _record: object) -> None:
        cursor = connection.cursor()  # type: ignore[attr-defined]
        cursor.execute(f"PRAGMA max_page_count = {cursor.execute('PRAGMA page_count').fetchone()[0]}")
        cursor.close()

    def log_then_fill(study, trial, progress, **options) -> None:  # noqa: ANN001 - log_trial's arguments
        real(study, trial, progress, **options)
        if len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))) == count:
            engine = study._storage._backend.engine
            sqlalchemy.event.listen(engine, "connect", capped)
            engine.dispose()

    monkeypatch.setattr(tuner.tuning.worker, "log_trial", log_then_fill)
    yield


def test_a_full_disk_under_the_study_database_mid_study_says_so_in_one_line_and_fails_the_parent_run(
    tiny_model_dir, tiny_data: Path, in_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three chained tracebacks ending `AssertionError: Should not reach.`, and the parent run left RUNNING."""
    from mlflow.tracking import MlflowClient

    database = in_tmp / "study.db"
    with full_after_trials(2, monkeypatch):
        output = tune(
            *tiny_run(tiny_model_dir("bert"), tiny_data, "--trials", "6", "--storage", f"sqlite:///{database}")
        )
    assert "Should not reach" not in output and "Traceback" not in output
    assert f"the study database {database} is on a full disk (database or disk is full)" in output, output[-2000:]
    assert "Free space on its disk, then run the same command again to resume" in output
    tracking = f"sqlite:///{in_tmp / 'mlruns' / 'mlflow.db'}"
    client = MlflowClient(tracking)
    parent = client.search_runs(
        [client.get_experiment_by_name("posfair").experiment_id], "tags.`posfair.role` = 'study'"
    )[0]
    assert parent.info.status == "FAILED" and "full disk" in parent.data.tags["posfair.outcome"]


def test_a_study_database_locked_by_another_process_is_said_within_seconds_and_given_up_on_at_the_limit(
    tiny_model_dir, tiny_data: Path, in_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A `sqlite3` shell holding a write transaction on the study database: `tune` waited 4 min 44 s without a word."""
    import sqlite3
    import subprocess
    import sys
    import time

    import optuna

    database = in_tmp / "study.db"
    optuna.storages.RDBStorage(f"sqlite:///{database}")
    hold = (
        "import sqlite3, sys, time; c = sqlite3.connect(sys.argv[1], isolation_level=None); "
        "c.execute('BEGIN EXCLUSIVE'); print('held', flush=True); time.sleep(60)"
    )
    holder = subprocess.Popen([sys.executable, "-c", hold, str(database)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        monkeypatch.setenv("POSFAIR_SQLITE_WAIT", "3")
        start = time.monotonic()
        output = tune(*tiny_run(tiny_model_dir("bert"), tiny_data, "--storage", f"sqlite:///{database}"))
        took = time.monotonic() - start
    finally:
        holder.kill()
        holder.wait()
    assert f"{database} is locked by another process: waited 1.5 s so far, giving up after 3 s" in output, output[
        -2000:
    ]
    assert f"the study database {database} stayed locked by another process for 3 s" in output
    assert f"fuser {database}" in output and took < 60
    with sqlite3.connect(database) as connection:  # nothing was written past the lock
        assert connection.execute("SELECT COUNT(*) FROM studies").fetchone() == (0,)


def test_a_read_only_study_database_is_named_as_the_cause(tiny_model_dir, tiny_data: Path, in_tmp: Path) -> None:
    """Issue 24: a read-only optuna.db gave Optuna's "invalid data ... exceeding max length" instead of the cause."""
    args = tiny_run(tiny_model_dir("bert"), tiny_data, "--trials", "1")
    succeeds(*args)
    database = in_tmp / "mlruns" / "optuna.db"
    database.chmod(0o444)
    if os.access(database, os.W_OK):
        require(False, "needs a non-root user (CI's posfair-ci) for a read-only file to be read-only")
    output = tune(*args, "--trials", "2")
    assert f"study storage {database} is read-only" in output and "chmod u+w" in output
