"""Your own data as JSON Lines: groups given or computed from spans, qrels inline or as TSV, clear errors."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import pytest

from tuner.data import load_benchmark
from tuner.data.dataset import THIRDS
from tuner.data.jsonl import load_jsonl

FIXTURE = Path(__file__).parent / "fixtures" / "own_jsonl"


@pytest.fixture()
def folder(tmp_path) -> Path:
    copy = tmp_path / "mine"
    shutil.copytree(FIXTURE, copy)
    return copy


def test_the_documented_format_loads():
    dataset = load_jsonl(FIXTURE)
    assert dataset.name == "jsonl:own_jsonl"
    assert dataset.corpus["3"] == "A document with a numeric id.", "ids are strings"
    assert "Café au lait" in dataset.corpus["d2"]
    assert dataset.group_order == THIRDS


def test_a_span_without_a_group_is_placed_by_its_midpoint():
    groups = load_jsonl(FIXTURE).groups
    assert groups["q-begin"] == ("begin",) and groups["q-end"] == ("end",)


def test_explicit_groups_and_strata_are_kept():
    dataset = load_jsonl(FIXTURE)
    assert dataset.groups["q-graded"] == ("middle",)
    assert dataset.groups["q-tsv"] == ("middle", "end")
    assert dataset.strata == {"q-tsv": "short"}
    assert "q-both" not in dataset.groups


def test_qrels_come_from_relevant_fields_and_the_tsv_together():
    qrels = load_jsonl(FIXTURE).qrels
    assert qrels["q-graded"] == {"d2": 2, "d1": 0}
    assert qrels["q-tsv"] == {"3": 1}
    assert qrels["q-both"] == {"d1": 1, "d2": 1}


def test_other_labels_keep_their_first_appearance_order_unless_given(folder):
    (folder / "qrels.tsv").unlink()
    (folder / "queries.jsonl").write_text(
        '{"id": "a", "text": "x", "relevant": ["d1"], "group": "late"}\n'
        '{"id": "b", "text": "y", "relevant": ["d1"], "group": "early"}\n'
    )
    assert load_jsonl(folder).group_order == ("late", "early")
    assert load_jsonl(folder, group_order=["early", "late"]).group_order == ("early", "late")


def test_gzipped_files_are_read_too(folder):
    for name in ("corpus.jsonl", "queries.jsonl"):
        path = folder / name
        (folder / f"{name}.gz").write_bytes(gzip.compress(path.read_bytes()))
        path.unlink()
    assert load_jsonl(folder).fingerprint() == load_jsonl(FIXTURE).fingerprint()


def test_non_utf8_input_names_the_file_and_the_fix(folder):
    (folder / "corpus.jsonl").write_bytes('{"id": "d1", "text": "caf\u00e9"}\n'.encode("latin-1"))
    with pytest.raises(ValueError, match=r"corpus\.jsonl is not UTF-8.*re-save it as UTF-8.*iconv"):
        load_jsonl(folder)


@pytest.mark.parametrize(
    ("queries", "message"),
    [
        ('{"id": "a", "relevant": ["d1"]}', r"queries\.jsonl:1: missing required field 'text'"),
        ('{"id": "a", "text": "x", "relevant": ["d1"]}\n{"id": "a", "text": "y"', r"queries\.jsonl:2: not valid JSON"),
        ('["a", "x"]', "expected a JSON object"),
        ('{"id": "a", "text": "x", "relevant": ["d1"]}\n{"id": "a", "text": "y", "relevant": ["d1"]}', "appears twice"),
        ('{"id": "a", "text": "x", "relevant": ["d1", "d2"], "span": [0, 4]}', "has a span but 2 relevant documents"),
        ('{"id": "a", "text": "x", "relevant": ["d1"], "span": [30, 90]}', "lies outside its document 'd1'"),
        ('{"id": "a", "text": "x", "relevant": ["d1"], "span": "0-4"}', "'span' must be"),
        ('{"id": "a", "text": "x", "relevant": ["d9"]}', "point at doc 'd9', which is not in the corpus"),
        ('{"id": "a", "text": "x"}', "query 'a' has no relevant document"),
    ],
)
def test_broken_queries_are_reported_with_file_line_and_fix(folder, queries, message):
    (folder / "qrels.tsv").unlink()
    (folder / "queries.jsonl").write_text(queries + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        load_jsonl(folder)


def test_a_malformed_tsv_line_is_reported(folder):
    (folder / "qrels.tsv").write_text("q-tsv\t3\n")
    with pytest.raises(ValueError, match=r"qrels\.tsv:1: expected 3 tab-separated columns"):
        load_jsonl(folder)


def test_a_folder_without_corpus_is_explained(tmp_path):
    with pytest.raises(FileNotFoundError, match="has no corpus.jsonl"):
        load_jsonl(tmp_path)


def test_registry_prefix_and_autodetection_load_the_same_data():
    assert load_benchmark(f"jsonl:{FIXTURE}").fingerprint() == load_benchmark(str(FIXTURE)).fingerprint()


@pytest.mark.parametrize(("tsv", "inline", "tsv_value"), [("q-both\td1\t0\n", 1, 0), ("q-graded\td2\t1\n", 2, 1)])
def test_a_qrels_tsv_that_contradicts_a_querys_relevant_field_is_refused(folder, tsv: str, inline: int, tsv_value: int):
    """`q0 d0 0` in qrels.tsv against `relevant: ["d0"]` overturned the query's only relevant document silently."""
    (folder / "qrels.tsv").write_text(tsv, encoding="utf-8")
    qid, doc = tsv.split("\t")[:2]
    with pytest.raises(
        ValueError,
        match=rf"qrels\.tsv:1: query '{qid}', document '{doc}': relevance {tsv_value} here, "
        rf"but {inline} in .*queries\.jsonl:\d ",
    ):
        load_jsonl(folder)


def test_a_qrels_tsv_that_repeats_a_relevant_field_agrees_with_it(folder):
    (folder / "qrels.tsv").write_text("q-graded\td2\t2\nq-both\td1\t1\nq-both\td2\t1\nq-tsv\t3\t1\n", encoding="utf-8")
    assert load_jsonl(folder).qrels["q-graded"] == {"d2": 2, "d1": 0}
    assert load_jsonl(folder).qrels["q-both"] == {"d1": 1, "d2": 1}


def test_files_that_start_with_a_byte_order_mark_read_as_without_it(folder):
    """qrels.tsv named its first query '\\ufeffq-tsv' (a judgement of no query); queries.jsonl was 'not valid JSON'."""
    for name in ("qrels.tsv", "queries.jsonl", "corpus.jsonl"):
        path = folder / name
        path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    loaded, plain = load_jsonl(folder), load_jsonl(FIXTURE)
    assert (loaded.qrels, loaded.queries, loaded.corpus) == (plain.qrels, plain.queries, plain.corpus)


def test_a_pair_judged_twice_in_qrels_tsv_with_two_relevances_is_refused(folder):
    """The later line silently won."""
    (folder / "qrels.tsv").write_text("q-tsv\t3\t1\nq-both\td2\t1\nq-tsv\t3\t0\n", encoding="utf-8")
    with pytest.raises(
        ValueError, match=r"qrels\.tsv:3: query 'q-tsv', document '3': relevance 0 here, but 1 on line 1"
    ):
        load_jsonl(folder)
