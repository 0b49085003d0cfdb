"""run_evaluation and its renderings on a tiny model and a hand-made positional dataset."""

from __future__ import annotations

import json
import random

import pytest
from rich.console import Console

from tuner.data import PositionalDataset
from tuner.engine.models import LoadedModel, load_model
from tuner.report.tables import (
    BASELINE,
    SEA,
    EvaluationTable,
    ScoringOptions,
    render,
    run_evaluation,
    to_dict,
    to_markdown,
)

GROUPS = ("begin", "middle", "end")

pytestmark = pytest.mark.usefixtures(
    "module_cache"
)  # run_evaluation caches as `tune evaluate` does: not in the checkout


def passage(seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(" ".join(f"w{rng.randrange(200)}" for _ in range(rng.randint(4, 8))) + "." for _ in range(9))


def positional() -> PositionalDataset:
    """Nine passages; each query copies a sentence from the begin, middle or end third of its passage."""
    corpus = {f"d{i}": passage(i) for i in range(9)}
    queries, qrels, groups = {}, {}, {}
    for i, doc in enumerate(corpus):
        group = GROUPS[i % 3]
        sentences = corpus[doc].split(". ")
        queries[f"q{i}"] = sentences[{"begin": 1, "middle": 4, "end": 7}[group]]
        qrels[f"q{i}"] = {doc: 1}
        groups[f"q{i}"] = (group,)
    return PositionalDataset("toy-positional", corpus, queries, qrels, groups, GROUPS)


def general() -> PositionalDataset:
    corpus = {f"g{i}": passage(100 + i) for i in range(6)}
    queries = {f"p{i}": corpus[f"g{i}"].split(". ")[2] for i in range(6)}
    return PositionalDataset("toy-general", corpus, queries, {f"p{i}": {f"g{i}": 1} for i in range(6)})


@pytest.fixture(scope="module")
def tiny(tiny_model_dir) -> LoadedModel:
    return load_model(str(tiny_model_dir("bert")), pooling="cls")


@pytest.fixture(scope="module")
def table(tiny: LoadedModel) -> EvaluationTable:
    configs = [("λ0", tiny.default_config(strength=0.0)), ("λ1 B8", tiny.default_config(strength=1.0, basket_size=8))]
    return run_evaluation(tiny, positional(), configs, ScoringOptions(n_resamples=50, batch_size=4))


def test_rows_baseline_configs_then_sea(table: EvaluationTable) -> None:
    assert [row.name for row in table.rows] == [BASELINE, "λ0", "λ1 B8", SEA]
    assert table.rows[0].deltas is None
    assert all(row.deltas is not None and row.deltas.hm is not None for row in table.rows[1:])
    assert all(row.report.n_queries == 9 and set(row.report.group_ndcg10) == set(GROUPS) for row in table.rows)
    assert all(row.truncated == 0 for row in table.rows)


def test_uncalibrated_config_has_exactly_zero_deltas(table: EvaluationTable) -> None:
    baseline, zero = table.rows[0], table.rows[1]
    assert zero.report == baseline.report
    deltas = zero.deltas
    assert deltas is not None and deltas.hm is not None and deltas.psi is not None
    for interval in (deltas.ndcg10, deltas.hm, deltas.psi, *deltas.groups.values()):
        assert (interval.estimate, interval.low, interval.high) == (0.0, 0.0, 0.0)


def test_without_general_the_shuffle_check_reuses_the_positional_scores(table: EvaluationTable) -> None:
    check = table.general
    assert check is not None and check.dataset == "toy-positional"
    assert [row.name for row in check.rows] == [BASELINE, "λ0", "λ1 B8"]
    by_name = {row.name: row.report for row in table.rows}
    for row in check.rows:
        assert row.original is by_name[row.name]
        assert row.shuffled is not None and row.shuffled.n_queries == 9
    assert check.rows[1].shuffled == check.rows[0].shuffled  # λ 0 is the baseline on shuffled text too


def test_general_set_without_shuffling(tiny: LoadedModel) -> None:
    result = run_evaluation(
        tiny,
        positional(),
        [("λ1", tiny.default_config(strength=1.0, basket_size=8))],
        ScoringOptions(sea=False, general=general(), shuffled=False, n_resamples=20, batch_size=4),
    )
    assert [row.name for row in result.rows] == [BASELINE, "λ1"]
    assert result.general is not None and result.general.dataset == "toy-general"
    assert all(row.shuffled is None and row.original.hm is None for row in result.general.rows)
    markdown = to_markdown(result)
    assert "| Indexing method | nDCG@10 Original | Recall@10 Original |" in markdown
    assert "Shuffled" not in markdown


def test_row_names_must_be_unique(tiny: LoadedModel) -> None:
    config = tiny.default_config()
    with pytest.raises(ValueError, match="unique"):
        run_evaluation(tiny, positional(), [("a", config), ("a", config)], ScoringOptions(sea=False, shuffled=False))
    with pytest.raises(ValueError, match="unique"):
        run_evaluation(tiny, positional(), [(SEA, config)], ScoringOptions(shuffled=False))


def test_markdown_has_the_paper_columns_and_every_row(table: EvaluationTable) -> None:
    markdown = to_markdown(table)
    assert (
        "| Indexing method | begin | middle | end | HM | PSI ↓ | nDCG@10 | Recall@10 | ΔHM | ΔPSI | ΔnDCG@10 | "
        "truncated |" in markdown
    )
    assert "| nDCG@10 Original | nDCG@10 Shuffled | Recall@10 Original | Recall@10 Shuffled |" in markdown
    assert "| λ0 |" in markdown and f"| {SEA} |" in markdown
    assert "+0.00 [+0.00, +0.00]" in markdown and "+0.000 [+0.000, +0.000]" in markdown
    baseline = table.rows[0].report
    assert f"| {BASELINE} | {baseline.group_ndcg10['begin'] * 100:.2f} |" in markdown


def test_render_and_dict(table: EvaluationTable) -> None:
    console = Console(record=True, width=400)
    render(table, console)
    text = console.export_text()
    assert "nDCG@10 on toy-positional by answer position" in text and SEA in text
    data = json.loads(json.dumps(to_dict(table)))
    assert [row["name"] for row in data["rows"]] == [BASELINE, "λ0", "λ1 B8", SEA]
    assert data["rows"][0]["deltas"] is None
    assert data["rows"][1]["deltas"]["hm"] == {"estimate": 0.0, "low": 0.0, "high": 0.0}
    assert data["rows"][0]["metrics"]["hm"] == table.rows[0].report.hm
    assert data["general"]["rows"][0]["shuffled"]["ndcg10"] == table.general.rows[0].shuffled.ndcg10


def test_redirected_output_gets_tables_wide_enough_to_read(monkeypatch) -> None:
    """Rich assumes 80 columns off a terminal, which cut `tune evaluate`'s table to '…' in files and logs."""
    import io

    from tuner.cli.console import PIPED_WIDTH, make_console

    monkeypatch.setattr("sys.stdout", io.StringIO())
    assert make_console().width == PIPED_WIDTH


def test_a_narrow_terminal_gets_the_table_in_parts_with_every_name_and_figure_whole(table: EvaluationTable) -> None:
    """At 100 columns the Δ columns do not fit beside the figures: they follow in a second table, each part with the
    method names, rather than 'No calibrat…' and cut intervals."""
    console = Console(record=True, width=100)
    render(table, console)
    text = console.export_text()
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 100
    assert text.count("┏") >= 3 and text.count("┃ Indexing method") == text.count("┏"), "every part names the methods"
    for row in table.rows:
        assert text.count(f"│ {row.name} ") >= 2, row.name  # the main table in two parts at least
        if row.deltas is not None:
            assert row.deltas.hm is not None and row.deltas.hm.format() in text


def test_segment_embed_average_says_how_far_it_has_got(tiny: LoadedModel, caplog: pytest.LogCaptureFixture) -> None:
    """Its semantic chunking runs the model over every sentence (505 s on WikiPos-test for MiniLM): a line per tenth."""
    from tuner.report.baselines import segment_embed_average

    texts = [passage(seed) for seed in range(20)]
    with caplog.at_level("INFO", logger="tuner"):
        vectors, _ = segment_embed_average(tiny, texts, batch_size=4)
    said = [r.getMessage() for r in caplog.records]
    assert vectors.shape[0] == 20
    assert said[0] == "Segment Embed Average: chunking 20 documents semantically (the model embeds their sentences) ..."
    progress = [m for m in said if m.startswith("Segment Embed Average: ") and " of 20 documents chunked" in m]
    assert [int(m.split(": ")[1].split(" of ")[0]) for m in progress] == [2, 4, 6, 8, 10, 12, 14, 16, 18]
    assert any(m.startswith("Segment Embed Average: encoding ") and ": done in" in m for m in said)
