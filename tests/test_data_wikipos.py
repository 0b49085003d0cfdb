"""WikiPos: the packaged files are what the builder makes, and every passage is a fair position test."""

from __future__ import annotations

import gzip
import itertools
import json
from importlib import resources
from pathlib import Path

import pytest

from tests.ci import require
from tuner.data.build_wikipos import (
    DEFAULT_SOURCE,
    MAX_SUMMARIES,
    MAX_TOKENS,
    MIN_SUMMARIES,
    SEPARATOR,
    build,
    minilm_token_counter,
)
from tuner.data.dataset import THIRDS, span_third
from tuner.data.wikipos import SPLITS, TRANSFER_SPLITS, load_wikipos, read_records, split_filename

PACKAGED = Path(str(resources.files("tuner.data").joinpath("wikipos")))


def require_source() -> Path:
    """The raw summaries sit in ../shared beside the checkout: CI has them there, a bare clone may not."""
    require(
        DEFAULT_SOURCE.is_file(),
        f"WikiPos source {DEFAULT_SOURCE} is absent (the shared data folder beside the checkout)",
    )
    return DEFAULT_SOURCE


def files_under(folder: Path) -> set[Path]:
    return {
        path.relative_to(folder) for path in folder.rglob("*") if path.is_file() and "__pycache__" not in path.parts
    }


def records(split: str) -> list[dict]:
    return list(read_records((PACKAGED / split_filename(split)).read_bytes()))


@pytest.fixture(scope="module")
def count_tokens():
    return minilm_token_counter()


@pytest.fixture(scope="module")
def source() -> dict[str, dict]:
    with gzip.open(require_source(), "rt", encoding="utf-8") as handle:
        return json.load(handle)


def test_splits_load_as_positional_datasets_of_the_planned_size():
    dev, test, general = (load_wikipos(split) for split in ("dev", "test", "general"))
    assert (dev.name, test.name, general.name) == ("wikipos-dev", "wikipos-test", "wikipos-general")
    assert (len(dev.corpus), len(test.corpus), len(general.corpus)) == (300, 400, 500)
    for positional in (dev, test):
        assert positional.group_order == THIRDS
        assert set(positional.groups) == set(positional.queries)
        assert min(positional.group_sizes().values()) >= 300  # enough queries per third for a stable nDCG
    assert general.groups == {} and general.group_order == () and len(general.queries) == 500


def test_an_unknown_split_lists_the_valid_ones():
    with pytest.raises(ValueError, match="dev, test, general"):
        load_wikipos("train")


def test_every_document_fits_minilm_without_truncation(count_tokens):
    for split in SPLITS:
        texts = [r["text"] for r in records(split)]
        assert max(count_tokens(texts)) + 2 <= MAX_TOKENS, split  # + [CLS] and [SEP]


@pytest.mark.parametrize("split", ["dev", "test"])
def test_passages_join_3_to_5_summaries_of_one_topic_and_groups_follow_the_midpoint(split):
    for record in records(split):
        segments = record["segments"]
        assert MIN_SUMMARIES <= len(segments) <= MAX_SUMMARIES
        pieces = [record["text"][start:end] for start, end in (s["span"] for s in segments)]
        assert SEPARATOR.join(pieces) == record["text"]
        for segment in segments:
            if segment["query"]:
                start, end = segment["span"]
                assert segment["query"]["group"] == span_third(start, end, len(record["text"]))


def test_each_query_is_the_description_of_a_summary_in_its_relevant_passage(source):
    for split in SPLITS:  # (the transfer sets' segments may be a summary's opening sentence: test_data_transfer)
        dataset = load_wikipos(split)
        for record in records(split):
            for segment in record["segments"]:
                article = source[segment["title"]]
                start, end = segment["span"]
                summary, piece = " ".join(article["extract"].split()), record["text"][start:end]
                assert piece == summary if split not in TRANSFER_SPLITS else summary.startswith(piece)
                assert article["topic"] == record["topic"]
                if segment["query"]:
                    qid = segment["query"]["id"]
                    assert dataset.queries[qid] == " ".join(article["description"].split())
                    assert dataset.qrels[qid] == {record["id"]: 1}


def test_splits_share_no_passage_and_no_summary():
    titles = {split: {s["title"] for r in records(split) for s in r["segments"]} for split in SPLITS}
    assert titles["dev"].isdisjoint(titles["test"])
    assert titles["general"].isdisjoint(titles["dev"] | titles["test"])
    for one, other in itertools.combinations(SPLITS, 2):
        if {one, other} <= set(TRANSFER_SPLITS) and "lengths" in (one, other):
            continue  # lengths is drawn again from every unused summary (build_wikipos, step 8)
        assert titles[one].isdisjoint(titles[other]), f"{one} and {other} share a summary"
    queries = [q for split in SPLITS if split != "lengths" for q in load_wikipos(split).queries.values()]
    assert len(queries) == len(set(q.casefold() for q in queries)), "every query text is unique"


def test_packaged_files_are_small_and_reproducible_gzip():
    total = 0
    for split in SPLITS:
        data = (PACKAGED / split_filename(split)).read_bytes()
        assert data[4:8] == b"\0\0\0\0", "gzip mtime must be 0 so rebuilds are byte-identical"
        total += len(data)
    assert total < 2_000_000  # the package stays small: dev, test, general and the three transfer sets
    assert "CC BY-SA 4.0" in (PACKAGED / "ATTRIBUTION.md").read_text(encoding="utf-8")


def test_packaged_files_match_a_fresh_build(tmp_path, count_tokens):
    """Every file the builder writes is packaged with the same content, and nothing packaged is left over."""
    build(require_source(), tmp_path, count_tokens)
    built = files_under(tmp_path)
    assert {Path(split_filename(s)) for s in SPLITS} | {Path("ATTRIBUTION.md")} <= built
    for name in sorted(built):
        assert (PACKAGED / name).is_file(), (
            f"{name} is built but not packaged; run `python -m tuner.data.build_wikipos`"
        )
        fresh, packaged = (tmp_path / name).read_bytes(), (PACKAGED / name).read_bytes()
        if name.suffix == ".gz":  # compare content: another zlib may compress the same text differently
            fresh, packaged = gzip.decompress(fresh), gzip.decompress(packaged)
        assert fresh == packaged, f"{name} differs from a fresh build; run `python -m tuner.data.build_wikipos`"
    assert files_under(PACKAGED) - {Path("__init__.py")} == built, "packaged files the builder no longer makes"


def test_with_titles_every_summary_is_asked_for_by_its_title_too_grouped_by_where_it_sits():
    records = list(read_records((PACKAGED / split_filename("dev")).read_bytes()))
    plain, titled = load_wikipos("dev"), load_wikipos("dev", titles=True)
    assert titled.name == "wikipos-dev+titles"
    # the descriptions are unchanged: the titled set is the plain set plus one query per summary
    assert {q: titled.queries[q] for q in plain.queries} == plain.queries
    assert all(titled.qrels[q] == plain.qrels[q] and titled.groups[q] == plain.groups[q] for q in plain.queries)
    expected = {}
    for record in records:
        for slot, segment in enumerate(record["segments"]):
            start, end = segment["span"]
            middle = (start + end) / 2 / len(record["text"])
            third = "begin" if middle < 1 / 3 else "middle" if middle < 2 / 3 else "end"
            expected[f"{record['id']}/t{slot}"] = (segment["title"], record["id"], third)
    titles = {
        q: (titled.queries[q], *titled.qrels[q], titled.groups[q][0]) for q in titled.queries if q not in plain.queries
    }
    assert titles == expected


def test_the_titled_tuning_set_is_scored_in_the_same_structures_over_the_same_passages():
    from tuner.data import load_benchmark, load_structures
    from tuner.tuning.study_data import AUTO_HELDOUT

    plain, titled = load_structures("wikipos-dev"), load_structures("wikipos-dev+titles")
    assert [s.name for s in titled] == [f"wikipos-dev+titles-{s.name.rsplit('-', 1)[1]}" for s in plain]
    for a, b in zip(plain, titled):
        assert a.corpus == b.corpus and set(a.queries) < set(b.queries)
    assert load_benchmark("wikipos-dev+titles").corpus == load_benchmark("wikipos-dev").corpus
    assert AUTO_HELDOUT["wikipos-dev+titles"] == AUTO_HELDOUT["wikipos-dev"]
