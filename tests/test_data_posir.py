"""PosIR: thirds by span midpoint within token-length quartiles, strata for PSI, configurable layout."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tuner.data import load_benchmark
from tuner.data.posir import length_quartile, load_posir

FIXTURE = Path(__file__).parent / "fixtures" / "posir"


def rows(name: str) -> list[dict]:
    return [json.loads(line) for line in (FIXTURE / f"{name}.jsonl").read_text(encoding="utf-8").splitlines()]


def write(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(records), path)


@pytest.fixture()
def domain(tmp_path) -> Path:
    """One PosIR <language>/<domain> folder, laid out as the benchmark ships it."""
    folder = tmp_path / "eng-Latn" / "demo"
    write(folder / "queries.parquet", rows("queries"))
    write(folder / "corpus.parquet", rows("corpus"))
    write(folder / "qrels" / "test.parquet", rows("qrels"))
    return folder


@pytest.mark.parametrize(("tokens", "quartile"), [(1, "Q1"), (512, "Q1"), (513, "Q2"), (1024, "Q2"),
                                                  (1536, "Q3"), (1537, "Q4"), (8000, "Q4")])
def test_length_quartiles_are_posir_buckets_closed_on_the_right(tokens, quartile):
    assert length_quartile(tokens) == quartile


def test_queries_are_grouped_by_third_within_their_quartile(domain):
    with pytest.warns(UserWarning, match="dropped 1 queries without a relevant document"):
        dataset = load_posir(domain)
    assert dataset.name == "posir:eng-Latn/demo"
    assert dataset.groups == {
        "q1": ("Q1/begin",), "q2": ("Q1/middle",), "q3": ("Q1/end",),
        "q4": ("Q4/begin",), "q5": ("Q4/end",), "q6": ("Q2/begin",),
    }
    assert dataset.strata == {"q1": "Q1", "q2": "Q1", "q3": "Q1", "q4": "Q4", "q5": "Q4", "q6": "Q2"}
    assert dataset.group_order == ("Q1/begin", "Q1/middle", "Q1/end", "Q2/begin", "Q4/begin", "Q4/end")


def test_unplaceable_queries_count_for_aggregate_ndcg_only(domain):
    with pytest.warns(UserWarning):
        dataset = load_posir(domain)
    assert "q7" in dataset.queries and "q7" not in dataset.groups and "q7" not in dataset.strata
    assert "q8" not in dataset.queries, "no judgement: dropped"
    assert "other" in dataset.corpus and "q99" not in dataset.qrels, "qrels of unknown queries are ignored"


def test_column_and_file_names_can_be_overridden(tmp_path):
    folder = tmp_path / "custom"
    renamed = [{"qid": r["_id"], "query": r["text"], "span": r["pos_char_span"], "tokens": r["pos_token_length"],
                "doc": {"q1": "short", "q4": "long"}.get(r["_id"])} for r in rows("queries")]
    write(folder / "q.parquet", [r for r in renamed if r["doc"]])
    write(folder / "corpus.parquet", [{"_id": "short", "text": "x" * 400}, {"_id": "long", "text": "y" * 9000}])
    dataset = load_benchmark(
        f"posir:{folder}", queries_file="q.parquet", query_id="qid", query_text="query", span="span",
        token_length="tokens", char_length=None, relevant_doc="doc",
    )
    assert dataset.qrels == {"q1": {"short": 1}, "q4": {"long": 1}}, "no qrels file: the doc column is used"
    assert dataset.groups == {"q1": ("Q1/begin",), "q4": ("Q4/begin",)}, "char_length=None measures the doc"


def test_a_missing_column_names_the_file_and_the_option_to_set(domain):
    with pytest.raises(ValueError, match=r"queries\.parquet has no column 'pos_tokens'.*token_length="):
        load_posir(domain, token_length="pos_tokens")


def test_unknown_options_and_missing_files_are_explained(domain, tmp_path):
    with pytest.raises(ValueError, match="unknown PosIR option"):
        load_posir(domain, token_lenght="x")
    shutil.rmtree(domain / "qrels")
    with pytest.raises(ValueError, match="no column 'corpus-id'"):
        load_posir(domain)  # neither a qrels file nor a relevant-doc column
    with pytest.raises(FileNotFoundError, match="not a folder"):
        load_posir(tmp_path / "nowhere")


def test_a_folder_with_queries_parquet_is_detected_as_posir(domain):
    with pytest.warns(UserWarning):
        assert load_benchmark(str(domain)).name == "posir:eng-Latn/demo"
