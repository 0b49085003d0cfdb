"""PositionalDataset: the cross-checks every loader relies on, and the shared position rule."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tuner.data.dataset import THIRDS, PositionalDataset, span_third, third_of


def make(**changes) -> PositionalDataset:
    fields = dict(
        name="tiny",
        corpus={"d1": "first doc", "d2": "second doc"},
        queries={"q1": "one", "q2": "two"},
        qrels={"q1": {"d1": 1}, "q2": {"d2": 1, "d1": 0}},
        groups={"q1": ("begin",), "q2": ("middle", "end")},
        group_order=THIRDS,
        strata={"q1": "Q1"},
    )
    fields.update(changes)
    return PositionalDataset(**fields)


def test_a_consistent_dataset_is_accepted_and_frozen():
    dataset = make()
    assert dataset.group_sizes() == {"begin": 1, "middle": 1, "end": 1}
    with pytest.raises(dataclasses.FrozenInstanceError):
        dataset.name = "other"


def test_general_retrieval_sets_have_no_groups():
    dataset = make(groups={}, group_order=(), strata={})
    assert dataset.group_sizes() == {}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"corpus": {}}, "corpus is empty"),
        ({"queries": {}, "qrels": {}, "groups": {}, "strata": {}}, "no queries"),
        ({"qrels": {"q1": {"d1": 1}}}, "query 'q2' has no relevant document"),
        ({"qrels": {"q1": {"d1": 1}, "q2": {"d2": 0}}}, "query 'q2' has no relevant document"),
        ({"qrels": {"q1": {"d1": 1}, "q2": {"d9": 1}}}, "query 'q2' point at doc 'd9', which is not in the corpus"),
        ({"qrels": {"q1": {"d1": 1}, "q2": {"d2": 1}, "q3": {"d1": 1}}}, "judge query 'q3'"),
        ({"groups": {"q1": ("start",)}}, "group 'start', which is not in group_order"),
        ({"groups": {"q9": ("begin",)}}, "label query 'q9'"),
        ({"group_order": ("begin", "begin", "middle", "end")}, "repeats a label"),
        ({"strata": {"q9": "Q1"}}, "strata name query 'q9'"),
    ],
)
def test_inconsistent_datasets_fail_with_a_message_naming_problem_and_fix(changes, message):
    with pytest.raises(ValueError, match=message) as error:
        make(**changes)
    assert "dataset 'tiny'" in str(error.value)


def test_subset_keeps_the_corpus_and_only_the_chosen_queries():
    part = make().subset(["q2"], name="tiny-part")
    assert part.name == "tiny-part"
    assert part.corpus == make().corpus
    assert part.queries == {"q2": "two"} and part.qrels == {"q2": {"d2": 1, "d1": 0}}
    assert part.groups == {"q2": ("middle", "end")} and part.strata == {}
    with pytest.raises(ValueError, match="unknown queries"):
        make().subset(["q7"])


def test_within_keeps_the_queries_over_only_the_chosen_passages():
    part = make().subset(["q2"]).within(["d2"])
    assert part.corpus == {"d2": make().corpus["d2"]}
    assert part.qrels == {"q2": {"d2": 1}}  # the judgement of the dropped passage goes with it
    assert part.queries == {"q2": "two"} and part.groups == {"q2": ("middle", "end")}
    with pytest.raises(ValueError, match="no relevant document"):
        make().subset(["q2"]).within(["d1"])  # a query whose relevant passage is dropped cannot be scored


def test_fingerprint_tracks_content_not_name():
    assert make().fingerprint() == make(name="renamed").fingerprint()
    assert make().fingerprint() != make(queries={"q1": "one!", "q2": "two"}).fingerprint()


@pytest.mark.parametrize(
    ("position", "third"),
    [
        (0.0, "begin"),
        (0.333, "begin"),
        (1 / 3, "middle"),
        (0.5, "middle"),
        (2 / 3, "end"),
        (1.0, "end"),
        (-0.2, "begin"),
        (1.4, "end"),
    ],
)
def test_thirds_give_boundaries_to_the_later_third_and_clip(position, third):
    assert third_of(position) == third


@given(st.floats(0, 1), st.floats(0, 1))
def test_thirds_are_ordered_like_positions(a, b):
    low, high = sorted((a, b))
    assert THIRDS.index(third_of(low)) <= THIRDS.index(third_of(high))


def test_a_span_is_placed_by_its_midpoint():
    assert span_third(0, 90, 100) == "middle"  # starts at 0 but is centred at 45
    assert span_third(90, 100, 100) == "end"
    with pytest.raises(ValueError, match="length must be > 0"):
        span_third(0, 1, 0)
    with pytest.raises(ValueError, match="ends before it starts"):
        span_third(5, 1, 10)
