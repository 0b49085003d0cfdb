"""BEIR / NanoBEIR folders: general retrieval over title + text, test-split queries with a relevant doc."""

from __future__ import annotations

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
