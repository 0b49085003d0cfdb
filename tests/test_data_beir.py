"""BEIR / NanoBEIR folders: general retrieval over title + text, test-split queries with a relevant doc."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tuner.data import load_benchmark
from tuner.data.beir import load_beir

FIXTURE = Path(__file__).parent / "fixtures" / "beir_mini"


def test_a_beir_folder_loads_as_general_retrieval():
    dataset = load_beir(FIXTURE)
    assert dataset.name == "beir:beir_mini"
    assert dataset.groups == {} and dataset.group_order == ()
    assert dataset.corpus == {
        "doc1": "Aspirin Aspirin is used to reduce fever and pain.",
        "doc2": "Ibuprofen is a nonsteroidal anti-inflammatory drug.",
        "doc3": "Paracetamol Paracetamol treats mild pain.",
    }


def test_only_queries_with_a_relevant_test_judgement_are_kept():
    dataset = load_beir(FIXTURE)
    assert dataset.queries == {"1": "what reduces fever", "2": "nsaid drugs"}
    assert dataset.qrels == {"1": {"doc1": 1, "doc3": 0}, "2": {"doc2": 2}}


def test_titles_can_be_left_out():
    assert load_beir(FIXTURE, include_title=False).corpus["doc1"] == "Aspirin is used to reduce fever and pain."


def test_a_missing_split_is_explained():
    with pytest.raises(FileNotFoundError, match="qrels/dev.tsv"):
        load_beir(FIXTURE, split="dev")


def test_registry_prefix_and_autodetection():
    assert load_benchmark(f"beir:{FIXTURE}").fingerprint() == load_benchmark(str(FIXTURE)).fingerprint()


@pytest.fixture()
def folder(tmp_path: Path) -> Path:
    copy = tmp_path / "beir"
    shutil.copytree(FIXTURE, copy)
    return copy


def append(path: Path, line: str) -> None:
    path.write_text(path.read_text(encoding="utf-8") + line + "\n", encoding="utf-8")


@pytest.mark.parametrize("file", ["queries.jsonl", "corpus.jsonl"])
def test_an_id_given_twice_is_refused_naming_both_lines(folder: Path, file: str) -> None:
    """As the JSONL loader does: the second record silently replaced the first query's text."""
    first = folder / file
    record = json.loads(first.read_text(encoding="utf-8").splitlines()[0])
    append(first, json.dumps({**record, "text": "another text"}))
    kind = "query" if file == "queries.jsonl" else "document"
    with pytest.raises(ValueError, match=rf"{file}:\d: {kind} id '{record['_id']}' appears twice \(first on line 1"):
        load_beir(folder)


@pytest.mark.parametrize(
    ("file", "key"), [("queries.jsonl", "text"), ("corpus.jsonl", "text"), ("corpus.jsonl", "title")]
)
def test_a_text_or_title_that_is_not_a_string_is_refused(folder: Path, file: str, key: str) -> None:
    """A list was encoded as its Python repr "['w1', 'w2']"."""
    path = folder / file
    lines = path.read_text(encoding="utf-8").splitlines()
    lines[0] = json.dumps({**json.loads(lines[0]), key: ["w1", "w2"]})
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=rf"{file}:1: '{key}' must be a string, got list \['w1', 'w2'\]"):
        load_beir(folder)


def test_files_that_start_with_a_byte_order_mark_read_as_without_it(folder: Path) -> None:
    """A qrels.tsv saved by a Windows editor named its first query '\\ufeffquery-id…' (or, headerless, '\\ufeff1')."""
    for path in (folder / "qrels" / "test.tsv", folder / "queries.jsonl", folder / "corpus.jsonl"):
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".tsv":
            text = text.split("\n", 1)[1]  # no header: the first line is a judgement
        path.write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))
    dataset = load_beir(folder)
    assert dataset.qrels == load_beir(FIXTURE).qrels and dataset.queries == load_beir(FIXTURE).queries
    assert dataset.corpus == load_beir(FIXTURE).corpus
