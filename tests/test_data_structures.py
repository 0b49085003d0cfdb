"""The tuning passages in other structures (crops, openings, packed): tuning data, built deterministically from the
split's own articles, passage-disjoint from every held-out set, with groups by the thirds of the new passage."""

from __future__ import annotations

import statistics
from collections import Counter
from importlib import resources
from pathlib import Path
from typing import Any

from tuner.data import load_structures
from tuner.data.build_wikipos import SEPARATOR
from tuner.data.dataset import THIRDS
from tuner.data.wikipos import (
    OPENINGS_CHARACTERS,
    OPENINGS_MIN_SEGMENTS,
    PACKED_CHARACTERS,
    crop_records,
    load_wikipos,
    openings_records,
    packed_records,
    read_records,
    split_filename,
)

PACKAGED = Path(str(resources.files("tuner.data").joinpath("wikipos")))
HELD_OUT = ("test", "sentences", "mixed", "lengths", "general")


def split_records(split: str) -> list[dict]:
    return list(read_records((PACKAGED / split_filename(split)).read_bytes()))


def titles(split: str) -> set[str]:
    return {s["title"] for r in split_records(split) for s in r["segments"]}


def test_dev_has_crops_openings_and_packed_passages_and_they_are_built_the_same_every_time():
    first, again = load_structures("wikipos-dev"), load_structures("wikipos-dev")
    assert [s.name for s in first] == ["wikipos-dev-crops", "wikipos-dev-openings", "wikipos-dev-packed"]
    for a, b in zip(first, again):
        assert a.fingerprint() == b.fingerprint() and a.corpus == b.corpus and a.groups == b.groups
    assert load_structures("jsonl:/some/folder") == [] and load_structures("fineweb-posq") == []


def test_structures_hold_only_dev_s_articles_and_queries_so_no_held_out_passage():
    dev = load_structures("wikipos-dev")
    dev_titles, dev_records = titles("dev"), split_records("dev")
    descriptions = {s["query"]["text"] for r in dev_records for s in r["segments"] if s["query"]}
    for structure in dev:
        assert set(structure.queries.values()) <= descriptions  # the split's own queries, asked again
    held_titles = set().union(*(titles(h) for h in HELD_OUT))
    assert not dev_titles & held_titles
    for build in (
        crop_records,
        openings_records,
        packed_records,
    ):  # every segment of every structure is one of dev's articles
        assert {s["title"] for r in build(iter(dev_records)) for s in r["segments"]} <= dev_titles
    openings = dev[1]
    assert openings.corpus and all(len(text) <= OPENINGS_CHARACTERS for text in openings.corpus.values())


def test_openings_cut_each_summary_to_its_first_sentence_and_group_by_the_new_thirds():
    openings = load_structures("wikipos-dev")[1]
    dev_records = split_records("dev")
    summaries = {s["title"]: r["text"][s["span"][0] : s["span"][1]] for r in dev_records for s in r["segments"]}
    records = list(openings_records(iter(dev_records)))
    assert [r["text"] for r in records] == list(openings.corpus.values())
    for record in records:
        assert len(record["segments"]) >= OPENINGS_MIN_SEGMENTS
        for segment in record["segments"]:
            start, end = segment["span"]
            piece = record["text"][start:end]
            assert summaries[segment["title"]].startswith(piece) and len(piece) <= len(summaries[segment["title"]])
            if segment["query"]:
                midpoint = (start + end) / 2 / len(record["text"])
                assert segment["query"]["group"] == (
                    "begin" if midpoint < 1 / 3 else "middle" if midpoint < 2 / 3 else "end"
                )
    mean_segments = sum(len(r["segments"]) for r in records) / len(records)
    assert mean_segments > 2 * 4.2  # more and shorter segments than dev's 3-5 summaries per passage


def summaries_of(topic: str, count: int) -> dict[str, Any]:
    """A passage of `count` summaries of `topic`, each asked for, whose opening sentences are far shorter than a
    re-packed passage may be."""
    pieces = [f"Article {i} of {topic} is told in this summary. It goes on." for i in range(count)]
    segments, offset = [], 0
    for i, piece in enumerate(pieces):
        query = {"id": f"{topic}-q{i}", "text": f"article {i}", "group": "begin"}
        segments.append({"title": f"{topic}-{i}", "span": [offset, offset + len(piece)], "query": query})
        offset += len(piece) + len(SEPARATOR)
    return {"id": f"{topic}-p", "topic": topic, "text": SEPARATOR.join(pieces), "segments": segments}


def test_a_topic_with_as_many_openings_as_a_passage_needs_makes_one_and_a_topic_with_one_fewer_none():
    enough, too_few = summaries_of("a", OPENINGS_MIN_SEGMENTS), summaries_of("b", OPENINGS_MIN_SEGMENTS - 1)
    (passage,) = openings_records(iter([enough, too_few]))
    assert passage["topic"] == "a" and len(passage["segments"]) == OPENINGS_MIN_SEGMENTS
    assert {passage["text"][a:b] for a, b in (s["span"] for s in passage["segments"])} == {
        f"Article {i} of a is told in this summary." for i in range(OPENINGS_MIN_SEGMENTS)
    }


def test_a_set_without_segments_is_halved_by_passage_length_over_the_whole_corpus():
    from tuner.data import PositionalDataset

    corpus = {f"d{i}": "word " * (10 + 10 * i) for i in range(6)}  # lengths 50, 100, ..., 300 characters; median 200
    queries = {f"q{i}{g}": "q" for i in range(6) for g in "bme"}
    qrels = {q: {f"d{q[1]}": 1} for q in queries}
    groups = {q: ({"b": "begin", "m": "middle", "e": "end"}[q[2]],) for q in queries}
    dataset = PositionalDataset("jsonl:x", corpus, queries, qrels, groups, ("begin", "middle", "end"))
    shorter, longer = load_structures("jsonl:x", dataset)
    assert (shorter.name, longer.name) == ("jsonl:x-shorter", "jsonl:x-longer")
    # no extra encoding: the tuning vectors serve
    assert shorter.corpus is dataset.corpus and longer.corpus is dataset.corpus
    assert set(shorter.queries) == {q for q in queries if q[1] in "012"} and set(longer.queries) == {
        q for q in queries if q[1] in "345"
    }
    one_group = PositionalDataset(
        "jsonl:y",
        corpus,
        queries,
        qrels,
        {q: ("begin",) if q[1] in "012" else groups[q] for q in queries},
        ("begin", "middle", "end"),
    )
    assert load_structures("jsonl:y", one_group) == []  # a half with one group has no PSI: no halves at all


def test_packed_passages_are_whole_dev_summaries_of_one_topic_at_many_lengths_within_the_window():
    from tuner.data.build_wikipos import MAX_TOKENS, minilm_token_counter

    dev_records = split_records("dev")
    summaries = {
        s["title"]: (r["topic"], r["text"][s["span"][0] : s["span"][1]]) for r in dev_records for s in r["segments"]
    }
    records = list(packed_records(iter(dev_records)))
    packed = load_structures("wikipos-dev")[2]
    assert packed.name == "wikipos-dev-packed" and [r["text"] for r in records] == list(packed.corpus.values())
    for record in records:
        assert len(record["segments"]) >= 2 and len(record["text"]) <= PACKED_CHARACTERS[1]
        for segment in record["segments"]:
            topic, summary = summaries[segment["title"]]
            start, end = segment["span"]
            assert record["text"][start:end] == summary and topic == record["topic"]  # whole summaries, one topic
            if segment["query"]:
                midpoint = (start + end) / 2 / len(record["text"])
                assert segment["query"]["group"] == (
                    "begin" if midpoint < 1 / 3 else "middle" if midpoint < 2 / 3 else "end"
                )
    tokens = sorted(n + 2 for n in minilm_token_counter()(list(packed.corpus.values())))
    assert tokens[-1] <= MAX_TOKENS, "no passage is truncated"
    quartiles = statistics.quantiles(tokens, n=4)
    assert tokens[0] < 128 and quartiles[0] < 260 and quartiles[2] > 340, "short, middling and long passages alike"
    asked = {q.removesuffix("-packed") for q in packed.queries}
    dev_queries = {s["query"]["id"] for r in dev_records for s in r["segments"] if s["query"]}
    assert asked <= dev_queries and len(asked) >= 0.99 * len(dev_queries), (
        "dev's queries, each asked once (a topic's last summary may be left over)"
    )


def test_crops_are_windows_of_consecutive_dev_segments_regrouped_by_thirds():
    """Each crop is 2..n-1 consecutive segments of one dev passage, joined as the builder joins them; each
    query keeps its text and summary and is grouped by the thirds of its new midpoint."""
    dev = {r["id"]: r for r in split_records("dev")}
    crops = list(crop_records(iter(dev.values()), seed=0))
    assert len(crops) >= 0.9 * sum(len(r["segments"]) >= 3 for r in dev.values())
    sizes = Counter()
    for crop in crops:
        source = dev[crop["id"].removesuffix("-crop")]
        titles = [s["title"] for s in source["segments"]]
        window = [s["title"] for s in crop["segments"]]
        start = titles.index(window[0])
        assert titles[start : start + len(window)] == window and 2 <= len(window) <= len(titles) - 1
        sizes[len(window) == len(titles) - 1] += 1
        pieces = [source["text"][a:b] for a, b in (s["span"] for s in source["segments"][start : start + len(window)])]
        assert crop["text"] == SEPARATOR.join(pieces)
        for segment, piece, original in zip(crop["segments"], pieces, source["segments"][start:]):
            a, b = segment["span"]
            assert crop["text"][a:b] == piece
            if original["query"]:
                midpoint = (a + b) / 2 / len(crop["text"])
                assert segment["query"]["id"] == original["query"]["id"] + "-crop"
                assert segment["query"]["text"] == original["query"]["text"]
                assert segment["query"]["group"] == THIRDS[min(int(midpoint * 3), 2)]
    assert sizes[True] and sizes[False], "both the longest and shorter windows occur"
    again = list(crop_records(iter(dev.values()), seed=0))
    assert again == crops, "deterministic for a seed"
    other = list(crop_records(iter(dev.values()), seed=1))
    assert other != crops


def test_crops_load_by_name_for_the_thirds_splits_and_not_for_general_retrieval():
    from tuner.data import load_benchmark, load_crops

    crops = load_benchmark("wikipos-dev-crops")
    assert crops.group_order == THIRDS and crops.name == "wikipos-dev-crops"
    assert set(crops.queries) <= {q + "-crop" for q in load_wikipos("dev").queries}, "tuning data: dev's own queries"
    assert load_crops("wikipos-dev").fingerprint() == crops.fingerprint()
    assert load_crops("fineweb-posq") is None and load_crops("jsonl:/some/folder") is None
