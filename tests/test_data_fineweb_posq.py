"""FineWeb-PosQ: the authors' corpus, relevance, groups and query sampling; local copies; offline failure."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tuner.data import DatasetUnavailableError, fineweb_posq, load_benchmark
from tuner.data.fineweb_posq import load_fineweb_posq

ROWS = Path(__file__).parent / "fixtures" / "fineweb_posq" / "rows.jsonl"


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return [json.loads(line) for line in ROWS.read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def parquet_folder(tmp_path_factory, rows) -> Path:
    """The fixture as `hf download` leaves it: parquet under data/, plus a hidden cache folder to ignore."""
    folder = tmp_path_factory.mktemp("fineweb")
    (folder / "data").mkdir()
    pq.write_table(pa.Table.from_pylist(rows), folder / "data" / "train-00000-of-00001.parquet")
    (folder / ".cache").mkdir()
    (folder / ".cache" / "stale.jsonl").write_text('{"unrelated": 1}\n')
    return folder


@pytest.fixture()
def cache(tmp_path) -> str:
    return str(tmp_path / "hf-datasets")


def load(source, cache, **options):
    return load_fineweb_posq(source, cache_dir=cache, **options)


def test_full_evaluation_follows_the_authors_script(cache, rows):
    dataset = load(ROWS, cache, sample_per_group=None)
    contents = sorted({r["content"] for r in rows})
    assert list(dataset.corpus.values()) == contents, "every distinct content, in sorted order (passage2id)"
    assert list(dataset.corpus)[:2] == ["d0", "d1"]
    questions = [r["question"] for r in rows if r["question"]]
    assert sorted(dataset.queries.values()) == sorted(set(questions)), "one query per distinct question"
    by_text = {text: qid for qid, text in dataset.queries.items()}
    doc_of = {text: doc for doc, text in dataset.corpus.items()}
    glaciers = by_text["How are glaciers formed?"]  # asked of two passages: the last row wins
    assert dataset.qrels[glaciers] == {doc_of[rows[10]["content"]]: 1}
    assert dataset.groups[glaciers] == ("begin",)  # and the first row's span class
    assert dataset.groups[by_text["How long did the bridge take to build?"]] == ("begin", "middle")
    assert dataset.group_order == ("begin", "middle", "end")


def test_sampling_reproduces_the_authors_query_sampling(cache, rows):
    n = 2
    pairs = [[r["question"], r["span_class"]] for r in rows if r.get("question")]
    random.seed(42)  # the authors' --query_sampling, written out as in their script
    random.shuffle(pairs)
    expected = [p for span in ("beginning", "middle", "end") for p in [p for p in pairs if span in p[1]][:n]]
    expected_questions = list(dict.fromkeys(q for q, _ in expected))

    dataset = load(ROWS, cache, sample_per_group=n)
    assert list(dataset.queries.values()) == expected_questions
    assert len(dataset.corpus) == len({r["content"] for r in rows}), "sampling thins queries, never the corpus"


def test_a_question_keeps_its_id_across_samples(cache):
    full = load(ROWS, cache, sample_per_group=None)
    sample = load(ROWS, cache, sample_per_group=1)
    assert set(sample.queries) < set(full.queries)
    assert all(full.queries[qid] == text for qid, text in sample.queries.items())


def test_tune_and_heldout_split_by_passage_and_cover_all_queries(cache):
    full = load(ROWS, cache, sample_per_group=None)
    tune = load(ROWS, cache, sample_per_group=None, part="tune", holdout_fraction=0.4)
    heldout = load(ROWS, cache, sample_per_group=None, part="heldout", holdout_fraction=0.4)
    assert (tune.name, heldout.name) == ("fineweb-posq-tune", "fineweb-posq-heldout")
    assert set(tune.queries).isdisjoint(heldout.queries)
    assert set(tune.queries) | set(heldout.queries) == set(full.queries)
    passages = lambda d: {doc for judged in d.qrels.values() for doc in judged}  # noqa: E731
    assert passages(tune).isdisjoint(passages(heldout))
    assert tune.corpus == heldout.corpus == full.corpus
    again = load(ROWS, cache, sample_per_group=None, part="heldout", holdout_fraction=0.4)
    assert again.queries == heldout.queries, "the split is deterministic"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"part": "test"}, "valid parts: all, tune, heldout"),
        ({"part": "tune", "holdout_fraction": 1.0}, "between 0 and 1"),
        ({"sample_per_group": 0}, "positive number or None"),
    ],
)
def test_bad_options_are_rejected_before_loading(options, message):
    with pytest.raises(ValueError, match=message):
        load_fineweb_posq("/nonexistent", **options)


def test_a_local_parquet_folder_loads_like_the_jsonl_file(parquet_folder, cache):
    from_parquet = load_benchmark(f"fineweb-posq:{parquet_folder}", sample_per_group=None, cache_dir=cache)
    from_jsonl = load(ROWS, cache, sample_per_group=None)
    assert from_parquet.fingerprint() == from_jsonl.fingerprint()


def test_a_missing_column_names_the_column_and_the_file(tmp_path, rows, cache):
    broken = tmp_path / "broken.jsonl"
    broken.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "span_class"}) + "\n" for r in rows))
    with pytest.raises(ValueError, match=r"broken\.jsonl lacks required column\(s\) \['span_class'\]"):
        load(broken, cache)


def test_a_missing_local_path_is_reported():
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_fineweb_posq("/nonexistent/FineWeb-PosQ")


def test_offline_without_a_local_copy_fails_fast_with_download_instructions(monkeypatch):
    monkeypatch.setattr(fineweb_posq, "offline_mode", lambda: False)
    monkeypatch.setattr(fineweb_posq, "hub_reachable", lambda: False)
    monkeypatch.setattr(fineweb_posq, "cached_snapshot", lambda hub_id: None)
    started = time.monotonic()
    with pytest.raises(DatasetUnavailableError, match="hf download NovaSearch/FineWeb-PosQ --repo-type dataset"):
        load_benchmark("fineweb-posq")
    assert time.monotonic() - started < 5


def test_hub_errors_are_rethrown_with_download_instructions(monkeypatch):
    import datasets

    def unreachable(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'NovaSearch/FineWeb-PosQ' on the Hub (OfflineModeIsEnabled)")

    monkeypatch.setattr(fineweb_posq, "offline_mode", lambda: True)
    monkeypatch.setattr(fineweb_posq, "cached_snapshot", lambda hub_id: None)
    monkeypatch.setattr(datasets, "load_dataset", unreachable)
    with pytest.raises(DatasetUnavailableError, match="(?s)OfflineModeIsEnabled.*--local-dir") as error:
        load_fineweb_posq()
    assert isinstance(error.value.__cause__, ConnectionError)


def test_a_cached_snapshot_is_used_when_offline(monkeypatch, parquet_folder, cache):
    monkeypatch.setattr(fineweb_posq, "offline_mode", lambda: False)
    monkeypatch.setattr(fineweb_posq, "hub_reachable", lambda: False)
    monkeypatch.setattr(fineweb_posq, "cached_snapshot", lambda hub_id: parquet_folder)
    assert len(load_fineweb_posq(cache_dir=cache, sample_per_group=None).queries) == 9
