"""PosIR: thirds by span midpoint within token-length quartiles, strata for PSI, configurable layout."""

from __future__ import annotations

import json
import math
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


@pytest.mark.parametrize(
    ("tokens", "quartile"),
    [(1, "Q1"), (512, "Q1"), (513, "Q2"), (1024, "Q2"), (1536, "Q3"), (1537, "Q4"), (8000, "Q4")],
)
def test_length_quartiles_are_posir_buckets_closed_on_the_right(tokens, quartile):
    assert length_quartile(tokens) == quartile


def test_queries_are_grouped_by_third_and_stratified_by_quartile(domain):
    with pytest.warns(UserWarning) as warned:
        dataset = load_posir(domain)
    messages = " ".join(str(w.message) for w in warned)
    assert dataset.name == "posir:eng-Latn/demo"
    # Groups are the thirds; the length quartile is the stratum, so HM/PSI compare thirds within a quartile.
    assert dataset.groups == {"q1": ("begin",), "q2": ("middle",), "q3": ("end",)}
    assert dataset.strata == {"q1": "Q1", "q2": "Q1", "q3": "Q1"}
    assert dataset.group_order == ("begin", "middle", "end")
    # Q4 (q4 begin, q5 end) and Q2 (q6 begin) lack a third: positions cannot be compared within them.
    assert "Q2" in messages and "Q4" in messages and "dropped 1 queries without a relevant document" in messages
    assert {"q4", "q5", "q6"} <= set(dataset.queries), "they still count for aggregate nDCG"


def test_unplaceable_queries_count_for_aggregate_ndcg_only(domain):
    with pytest.warns(UserWarning):
        dataset = load_posir(domain)
    assert "q7" in dataset.queries and "q7" not in dataset.groups and "q7" not in dataset.strata
    assert "q8" not in dataset.queries, "no judgement: dropped"
    assert "other" in dataset.corpus and "q99" not in dataset.qrels, "qrels of unknown queries are ignored"


def test_column_and_file_names_can_be_overridden(tmp_path):
    folder = tmp_path / "custom"
    renamed = [
        {
            "qid": r["_id"],
            "query": r["text"],
            "span": r["pos_char_span"],
            "tokens": r["pos_token_length"],
            "doc": {"q1": "short", "q2": "short", "q3": "short", "q4": "long"}.get(r["_id"]),
        }
        for r in rows("queries")
    ]
    write(folder / "q.parquet", [r for r in renamed if r["doc"]])
    write(folder / "corpus.parquet", [{"_id": "short", "text": "x" * 400}, {"_id": "long", "text": "y" * 9000}])
    with pytest.warns(UserWarning, match="Q4"):  # q4 is alone in its quartile
        dataset = load_benchmark(
            f"posir:{folder}",
            queries_file="q.parquet",
            query_id="qid",
            query_text="query",
            span="span",
            token_length="tokens",
            char_length=None,
            relevant_doc="doc",
        )
    assert dataset.qrels == {"q1": {"short": 1}, "q2": {"short": 1}, "q3": {"short": 1}, "q4": {"long": 1}}, (
        "no qrels file: the doc column is used"
    )
    # char_length=None measures the relevant document: spans 0-40, 180-220, 360-400 of 400 characters.
    assert dataset.groups == {"q1": ("begin",), "q2": ("middle",), "q3": ("end",)}


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


# --- loader and metrics together ----------------------------------------------------------------


def test_posir_scores_by_third_within_each_quartile_as_computed_by_hand(tmp_path):
    """A PosIR folder in its real parquet layout through load_posir and evaluate, against hand-computed figures.

    Layout as the authors' eval.py reads it (github.com/Ziyang1060/PosIR; see tests/hub.py). The run is
    written by hand, so every query's rank, and so its nDCG@10 = 1 / log2(rank + 1), is known. Documents
    are 300 characters long; a span's third is the third holding its midpoint.
    """
    from objectives.metrics import evaluate
    from tests.hub import write_posir

    spans = {"begin": (0, 30), "middle": (140, 160), "end": (270, 300)}
    # query: (pos_token_length, third or None, rank of its relevant document)
    plan = {
        "a1": (300, "begin", 1),
        "a2": (300, "begin", 3),
        "a3": (300, "middle", 2),
        "a4": (300, "end", 4),  # Q1
        "b1": (1200, "begin", 2),
        "b2": (1200, "middle", 1),
        "b3": (1200, "end", 1),
        "b4": (1200, "end", 3),  # Q3
        "c1": (2000, "begin", 1),
        "c2": (2000, "end", 1),  # Q4 has no middle query: not comparable
        "u1": (300, None, 2),  # no span: aggregate only
    }
    corpus = {f"rel-{q}": "r" * 300 for q in plan} | {f"decoy{i}": "d" * 300 for i in range(3)}
    write_posir(
        tmp_path / "eng-Latn" / "demo",
        corpus,
        [
            {
                "_id": q,
                "text": f"query {q}",
                "doc": f"rel-{q}",
                "span": spans[third] if third else None,
                "token_length": tokens,
            }
            for q, (tokens, third, _) in plan.items()
        ],
    )
    with pytest.warns(UserWarning, match="Q4"):
        dataset = load_posir(tmp_path / "eng-Latn" / "demo")
    run = {}
    for q, (_, _, rank) in plan.items():
        order = [f"decoy{i}" for i in range(3)]
        order.insert(rank - 1, f"rel-{q}")
        run[q] = {doc: 10.0 - position for position, doc in enumerate(order)}

    report, _ = evaluate(run, dataset)

    gain = {rank: 1 / math.log2(rank + 1) for rank in (1, 2, 3, 4)}
    q1 = {"begin": (gain[1] + gain[3]) / 2, "middle": gain[2], "end": gain[4]}
    q3 = {"begin": gain[2], "middle": gain[1], "end": (gain[1] + gain[3]) / 2}
    hm = {"Q1": 3 / sum(1 / v for v in q1.values()), "Q3": 3 / sum(1 / v for v in q3.values())}
    psi = {"Q1": 1 - gain[4] / q1["begin"], "Q3": 1 - gain[2] / gain[1]}
    assert [s.name for s in report.strata] == ["Q1", "Q3"]
    by_name = {s.name: s for s in report.strata}
    assert by_name["Q1"].group_counts == {"begin": 2, "middle": 1, "end": 1}
    assert by_name["Q3"].group_counts == {"begin": 1, "middle": 1, "end": 2}
    assert by_name["Q1"].group_ndcg10 == pytest.approx(q1) and by_name["Q3"].group_ndcg10 == pytest.approx(q3)
    assert by_name["Q1"].psi == pytest.approx(psi["Q1"]) and by_name["Q3"].psi == pytest.approx(psi["Q3"])
    assert by_name["Q1"].hm == pytest.approx(hm["Q1"]) and by_name["Q3"].hm == pytest.approx(hm["Q3"])
    assert report.psi == pytest.approx((psi["Q1"] + psi["Q3"]) / 2)
    assert report.hm == pytest.approx((hm["Q1"] + hm["Q3"]) / 2)
    assert report.group_counts == {"begin": 3, "middle": 2, "end": 3}, "pooled over the comparable quartiles"
    assert report.group_ndcg10 == pytest.approx(
        {
            "begin": (gain[1] + gain[3] + gain[2]) / 3,
            "middle": (gain[2] + gain[1]) / 2,
            "end": (gain[4] + gain[1] + gain[3]) / 3,
        }
    )
    assert report.n_queries == 11
    assert report.ndcg10 == pytest.approx(sum(gain[rank] for _, _, rank in plan.values()) / 11), "every query counts"


def test_read_for_posirs_own_figures_keeps_every_span_as_the_file_gives_it(domain):
    """`read_posir` leaves placing to PosIR's analysis (`objectives.posir`): no thirds, no warning about them."""
    import warnings

    from tuner.data.posir import PosIRSpan, read_posir

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(UserWarning, match="dropped 1 queries without a relevant document"):
            read_posir(domain)
    with pytest.warns(UserWarning, match="dropped 1 queries") as warned:
        folder = read_posir(domain)
    assert len(warned) == 1, "only the dropped query: quartiles missing a third are posfair's thirds' concern"
    assert folder.dataset.name == "posir:eng-Latn/demo" and not folder.dataset.groups and not folder.dataset.strata
    assert set(folder.spans) == set(folder.dataset.queries) == {f"q{i}" for i in range(1, 8)}
    assert folder.spans["q6"] == PosIRSpan(span=(400, 420), char_length=4000, token_length=1024)
    assert folder.spans["q7"] == PosIRSpan(span=None, char_length=0, token_length=700)


def test_a_language_folder_is_read_domain_by_domain(domain, tmp_path):
    from tuner.data.registry import read_posir_domains

    shutil.copytree(domain, domain.parent / "other")
    (domain.parent / "not-a-domain").mkdir()
    with pytest.warns(UserWarning):
        folders = read_posir_domains(f"posir:{domain.parent}")
    assert [f.dataset.name for f in folders] == ["posir:eng-Latn/demo", "posir:eng-Latn/other"]
    with pytest.warns(UserWarning):
        assert [f.dataset.name for f in read_posir_domains(str(domain))] == ["posir:eng-Latn/demo"]
    for wrong in ("wikipos-test", f"jsonl:{domain}", str(tmp_path / "nowhere")):
        with pytest.raises(ValueError, match="is not a PosIR folder: .* give posir:PATH"):
            read_posir_domains(wrong)
    with pytest.raises(ValueError, match="neither a PosIR <language>/<domain> folder"):
        read_posir_domains(f"posir:{domain.parent / 'not-a-domain'}")
