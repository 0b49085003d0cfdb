"""WikiPos transfer sets: passages built unlike dev's, from summaries dev never saw, with their own groups."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from importlib import resources
from pathlib import Path

import pytest

from tests.ci import require
from tuner.data.build_wikipos import MAX_TOKENS, MIN_SEGMENTS, SEPARATOR
from tuner.data.dataset import FIFTHS, SLOT_THIRDS, THIRDS, slot_third, span_midpoint
from tuner.data.wikipos import TRANSFER_SPLITS, load_wikipos, opening_sentence, read_records, split_filename

PACKAGED = Path(str(resources.files("tuner.data").joinpath("wikipos")))
SOURCE = Path(__file__).resolve().parents[2] / "shared" / "data" / "wikipedia-vital-summaries-en.json.gz"


def records(split: str) -> list[dict]:
    return list(read_records((PACKAGED / split_filename(split)).read_bytes()))


def test_fifths_follow_the_character_midpoint_of_each_sentence():
    for record in records("sentences"):
        assert len(record["segments"]) >= MIN_SEGMENTS["sentences"]
        for segment in record["segments"]:
            if segment["query"]:
                start, end = segment["span"]
                midpoint = (start + end) / 2 / len(record["text"])
                assert segment["query"]["group"] == f"fifth-{min(int(midpoint * 5), 4) + 1}"


def test_mixed_groups_are_thirds_of_the_slot_order_not_of_the_characters():
    disagree = 0
    for record in records("mixed"):
        segments = record["segments"]
        assert len(segments) >= MIN_SEGMENTS["mixed"]
        for slot, segment in enumerate(segments):
            if segment["query"]:
                centre = (slot + 0.5) / len(segments)
                expected = "early" if centre < 1 / 3 else "central" if centre < 2 / 3 else "late"
                assert segment["query"]["group"] == expected
                start, end = segment["span"]
                disagree += ["begin", "middle", "end"][min(int(3 * (start + end) / 2 / len(record["text"])), 2)] != {
                    "early": "begin",
                    "central": "middle",
                    "late": "end",
                }[expected]
    assert disagree > 50, "slot thirds should differ from character thirds for a fair share of queries"


def test_slot_third_by_hand():
    # centres .125 .375 .625 .875
    assert [slot_third(i, 4) for i in range(4)] == [
        "early",
        "central",
        "central",
        "late",
    ]
    assert [slot_third(i, 3) for i in range(3)] == ["early", "central", "late"]
    with pytest.raises(ValueError, match="segment 5 does not exist among 5"):
        slot_third(5, 5)


def test_transfer_sets_load_with_their_groups_and_positions():
    sentences, mixed, lengths = (load_wikipos(split) for split in TRANSFER_SPLITS)
    assert (sentences.group_order, mixed.group_order, lengths.group_order) == (FIFTHS, SLOT_THIRDS, THIRDS)
    for dataset in (sentences, mixed, lengths):
        assert set(dataset.positions) == set(dataset.queries) == set(dataset.groups)
        assert min(dataset.group_sizes().values()) >= 250, "enough queries per group for a stable nDCG"
    record = records("sentences")[0]
    segment = next(s for s in record["segments"] if s["query"])
    assert sentences.positions[segment["query"]["id"]] == span_midpoint(*segment["span"], len(record["text"]))


def test_sentences_and_mixed_fill_dev_s_budget_and_lengths_spread_over_it():
    import statistics

    from tuner.data.build_wikipos import LENGTH_RANGE, minilm_token_counter

    count = minilm_token_counter()
    tokens = {split: [n + 2 for n in count([r["text"] for r in records(split)])] for split in TRANSFER_SPLITS}
    assert max(max(t) for t in tokens.values()) <= MAX_TOKENS
    for split in ("sentences", "mixed"):
        assert statistics.median(tokens[split]) >= 480, f"{split}: as long as dev's passages, so as position-biased"
    quartiles = statistics.quantiles(tokens["lengths"], n=4)
    assert LENGTH_RANGE[0] <= min(tokens["lengths"])
    assert quartiles[0] < 260 and quartiles[2] > 380, "a quarter of the passages below 260 tokens, a quarter above 380"


def test_segments_are_whole_summaries_or_their_opening_sentence_of_unused_articles():
    require(
        SOURCE.is_file(), f"the WikiPos source {SOURCE} is absent (../shared beside the checkout, as .ci/run has it)"
    )
    with gzip.open(SOURCE, "rt", encoding="utf-8") as handle:
        source = json.load(handle)
    dev_titles = {s["title"] for split in ("dev", "test", "general") for r in records(split) for s in r["segments"]}
    kinds = Counter()
    for split in TRANSFER_SPLITS:
        for record in records(split):
            pieces = [record["text"][a:b] for a, b in (s["span"] for s in record["segments"])]
            assert SEPARATOR.join(pieces) == record["text"]
            for segment, piece in zip(record["segments"], pieces):
                assert segment["title"] not in dev_titles
                summary = " ".join(source[segment["title"]]["extract"].split())
                assert piece in (summary, opening_sentence(summary))
                kinds[split, piece == summary] += 1
    # opening sentences (a one-sentence summary is both)
    assert kinds["sentences", True] < kinds["sentences", False] / 5
    assert kinds["mixed", True] > 200 and kinds["mixed", False] > 200
    assert kinds["lengths", False] == 0, "lengths keeps whole summaries"


@pytest.mark.parametrize(
    ("text", "first"),
    [
        ("Rome is the capital city of Italy. It is also the capital of Lazio.", "Rome is the capital city of Italy."),
        (
            "J. R. R. Tolkien was an English writer and philologist. He wrote The Hobbit.",
            "J. R. R. Tolkien was an English writer and philologist.",
        ),
        (
            "The city lies on the river c. 30 km from the sea. It was founded in 1200.",
            "The city lies on the river c. 30 km from the sea.",
        ),
        (
            "It is short. But this sentence makes the opening long enough to count.",
            "It is short. But this sentence makes the opening long enough to count.",
        ),
        ("No full stop at all", "No full stop at all"),
    ],
)
def test_opening_sentence_skips_initials_abbreviations_and_too_short_openings(text, first):
    assert opening_sentence(text) == first
