"""load_benchmark: one entry point for names, prefixed paths and folders."""

from __future__ import annotations

import pytest

from tuner.data import PositionalDataset, known_benchmarks, load_benchmark


@pytest.mark.parametrize("name", ["wikipos-dev", "wikipos-test", "wikipos-general"])
def test_embedded_benchmarks_load_by_name(name):
    dataset = load_benchmark(name)
    assert isinstance(dataset, PositionalDataset) and dataset.name == name


def test_an_unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown benchmark 'nanobeir'.*wikipos-dev.*fineweb-posq.*posir:PATH"):
        load_benchmark("nanobeir")


def test_options_are_refused_where_a_name_fixes_everything():
    with pytest.raises(ValueError, match="wikipos-dev takes no options"):
        load_benchmark("wikipos-dev", split="test")


def test_a_prefix_needs_a_path():
    with pytest.raises(ValueError, match="names no path"):
        load_benchmark("posir:")


def test_a_folder_of_unknown_layout_asks_for_a_prefix(tmp_path):
    with pytest.raises(ValueError, match="matches no known layout"):
        load_benchmark(str(tmp_path))


def test_every_form_is_listed_for_help_texts():
    assert {"wikipos-dev", "fineweb-posq", "posir:PATH", "jsonl:PATH", "beir:PATH"} <= set(known_benchmarks())
