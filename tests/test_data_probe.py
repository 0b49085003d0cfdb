"""The probe built from a user's retrieval set: each query's passage packed first, in the middle or last among passages
not relevant to it, groups balanced, seeded, cached under a fingerprint of its files, refused with the reason when the
set cannot make one; and the natural SQuAD set and a probe through `tune run` and `tune evaluate`, end to end.

Fixtures are written here (never the real data); what a window holds, where the passage sits and its group are read
off the window's text by the test, not taken from the builder.
"""

from __future__ import annotations

import errno
import gzip
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests import forkserver
from tests.hub import tune_here, write_beir
from tests.test_data_squad import write_squad
from tests.test_paths import assert_figures, figures, ndcg10, reference
from tests.tiny import WORDS, save_tiny
from tuner.calibration import CalibrationConfig
from tuner.common.files import DiskFullError
from tuner.common.messages import UserError
from tuner.data import load_benchmark
from tuner.data import probe as probe_module
from tuner.data.dataset import PositionalDataset
from tuner.data.probe import ProbeError, ProbeOptions, build_probe

ROOT = Path(__file__).resolve().parents[1]
THIRDS = ("begin", "middle", "end")
WINDOW = ProbeOptions(max_tokens=102, min_group_queries=3)  # 100 words of content: an asked passage holds <= 33


def words(texts: list[str]) -> list[int]:
    return [len(text.split()) for text in texts]


def text(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))


def retrieval_set(asked: int, free: int, *, seed: int = 0, per_passage: tuple[int, int] = (1, 1), long: int = 0):
    """`asked` passages of 10-30 words, each relevant to `per_passage` queries; `free` passages of 5-40 words relevant
    to none; `long` passages of 40-60 words with a query each (too long to pack in `WINDOW`)."""
    rng = random.Random(seed)
    corpus, queries, qrels = {}, {}, {}
    for d in range(asked + long):
        corpus[f"d{d}"] = text(rng, 10, 30) if d < asked else text(rng, 40, 60)
        for k in range(rng.randint(*per_passage) if d < asked else 1):
            queries[f"q{d}-{k}"] = " ".join(corpus[f"d{d}"].split()[k : k + 4])
            qrels[f"q{d}-{k}"] = {f"d{d}": 1}
    for f in range(free):
        corpus[f"f{f}"] = text(rng, 5, 40)
    return PositionalDataset("mine", corpus, queries, qrels)


def third(position: float) -> str:
    return "begin" if position < 1 / 3 else "middle" if position < 2 / 3 else "end"


def check_windows(source: PositionalDataset, probe: PositionalDataset) -> None:
    """Every query's window: its own passage once, between at least two distinct passages of the corpus that are
    neither relevant to it nor asked, within 100 words; its position and group read off the window."""
    asked = {source.corpus[next(iter(source.qrels[q]))] for q in probe.queries}
    for q in probe.queries:
        [window] = probe.qrels[q]
        segments = probe.corpus[window].split("\n\n")
        own = source.corpus[next(iter(source.qrels[q]))]
        others = [s for s in segments if s != own]
        assert segments.count(own) == 1 and len(others) == len(segments) - 1 >= 2
        assert len(set(others)) == len(others) and not set(others) & asked
        relevant_to_q = {source.corpus[d] for d, grade in source.qrels[q].items() if grade > 0}
        assert set(others) <= set(source.corpus.values()) - relevant_to_q
        assert len(probe.corpus[window].split()) <= 100
        slot = segments.index(own)
        start = len("\n\n".join(segments[:slot])) + (2 if slot else 0)
        position = (start + len(own) / 2) / len(probe.corpus[window])
        assert probe.positions[q] == pytest.approx(position) and probe.groups[q] == (third(position),)
        expected_slot = {"begin": [0], "end": [len(segments) - 1]}.get(probe.groups[q][0], range(1, len(segments) - 1))
        assert slot in expected_slot, (q, probe.groups[q], slot, len(segments))


def test_each_querys_passage_is_packed_among_passages_not_relevant_to_it() -> None:
    source = retrieval_set(60, 80)
    probe = build_probe(source, "mine", WINDOW, words)
    check_windows(source, probe.dataset)
    assert probe.dataset.group_sizes() == {"begin": 20, "middle": 20, "end": 20}
    assert probe.card.kept == 60 and probe.card.asked_passages == 60 and probe.card.pool_passages == 80


def test_groups_are_balanced_by_queries_and_the_build_is_seeded() -> None:
    source = retrieval_set(45, 80, per_passage=(1, 4), long=5)
    probe = build_probe(source, "mine", WINDOW, words)
    sizes = probe.dataset.group_sizes()
    assert max(sizes.values()) - min(sizes.values()) <= 4, sizes  # at most one passage's queries apart
    assert probe.card.long_relevant == 5 and probe.card.kept == len(source.queries) - 5
    again = build_probe(source, "mine", WINDOW, words)
    other = build_probe(source, "mine", ProbeOptions(seed=1, max_tokens=102, min_group_queries=3), words)
    assert again.dataset.fingerprint() == probe.dataset.fingerprint() != other.dataset.fingerprint()
    check_windows(source, other.dataset)


def test_a_qa_set_whose_every_passage_is_asked_keeps_half_of_them_for_distractors() -> None:
    source = retrieval_set(80, 0, per_passage=(1, 2))
    probe = build_probe(source, "mine", WINDOW, words)
    check_windows(source, probe.dataset)
    assert probe.card.asked_passages == probe.card.pool_passages == 40
    asked = {d for judged in probe.dataset.qrels.values() for d in judged}
    assert len(asked) == 40 and probe.card.pooled == len(source.queries) - probe.card.kept


# ------------------------------------------------------------------------------------- the refusals


def test_no_short_relevant_passage_is_refused_with_the_fix() -> None:
    source = retrieval_set(0, 50, long=40)
    with pytest.raises(ProbeError) as caught:
        build_probe(source, "mine", WINDOW, words)
    message = str(caught.value)
    assert isinstance(caught.value, UserError) and "no relevant passage is short enough to pack" in message
    lengths = words(list(source.corpus.values())[:40])
    assert "at most 33 (a third of the window)" in message and f"have {min(lengths)}-{max(lengths)} " in message
    assert "split the documents into paragraphs and judge the paragraph that answers each query" in message


def test_too_few_queries_per_group_is_refused_with_the_counts() -> None:
    source = retrieval_set(8, 60, long=30)
    with pytest.raises(ProbeError) as caught:
        build_probe(source, "mine", ProbeOptions(max_tokens=102, min_group_queries=4), words)
    message = str(caught.value)
    assert "queries in group" in message and "each group needs at least 4" in message
    assert "30 have a relevant passage over 33 tokens" in message
    assert "add queries whose one relevant passage is short" in message


def test_a_corpus_too_small_for_distractors_is_refused_with_the_fix() -> None:
    source = retrieval_set(20, 5)
    with pytest.raises(ProbeError) as caught:
        build_probe(source, "mine", WINDOW, words)
    message = str(caught.value)
    assert "only 13 passages of the corpus can be distractors" in message  # 5 free, and 8 of the 20 asked
    assert "add passages to the corpus" in message


# ------------------------------------------------------------------------------ files, formats, cache


def write_jsonl(folder: Path, source: PositionalDataset) -> Path:
    folder.mkdir(parents=True)
    passages = [{"id": d, "text": t} for d, t in source.corpus.items()]
    (folder / "corpus.jsonl").write_text("".join(json.dumps(passage) + "\n" for passage in passages))
    lines = [{"id": q, "text": t, "relevant": list(source.qrels[q])} for q, t in source.queries.items()]
    (folder / "queries.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return folder


def as_beir(folder: Path, source: PositionalDataset) -> Path:
    queries = {q: (t, next(iter(source.qrels[q]))) for q, t in source.queries.items()}
    return write_beir(folder, source.corpus, queries)


@pytest.fixture()
def data_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("POSFAIR_DATA_DIR", str(tmp_path / "data-home"))
    return tmp_path / "data-home" / "probes"


def test_a_beir_and_a_jsonl_folder_of_the_same_set_make_the_same_probe(tmp_path: Path, data_home: Path) -> None:
    source = retrieval_set(100, 120)
    beir = load_benchmark(f"probe:{as_beir(tmp_path / 'beir', source)}")
    jsonl = load_benchmark(f"probe:{write_jsonl(tmp_path / 'jsonl', source)}")
    assert (beir.name, jsonl.name) == ("probe:beir", "probe:jsonl")
    assert beir.corpus == jsonl.corpus and beir.queries == jsonl.queries
    assert beir.groups == jsonl.groups and beir.positions == jsonl.positions
    assert beir.group_sizes() == {"begin": 34, "middle": 33, "end": 33}


def test_the_probe_is_cached_under_a_fingerprint_of_its_files_and_written_whole(
    tmp_path: Path, data_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = write_jsonl(tmp_path / "mine", retrieval_set(100, 120))
    first = load_benchmark(f"probe:{folder}")
    [cached] = data_home.iterdir()
    assert cached.name.startswith("mine-") and cached.name.endswith(".json.gz")
    assert len(cached.name) == len("mine-") + 16 + len(".json.gz"), "16 hex digits of fingerprint"
    assert json.loads(gzip.decompress(cached.read_bytes()))["card"]["kept"] == len(first.queries)

    def no_build(*_: object, **__: object) -> None:
        raise AssertionError("built again although cached")

    with monkeypatch.context() as patch:
        patch.setattr(probe_module, "build_probe", no_build)
        assert load_benchmark(f"probe:{folder}").fingerprint() == first.fingerprint()

    with (folder / "corpus.jsonl").open("a") as corpus:
        corpus.write(json.dumps({"id": "extra", "text": "w1 w2 w3"}) + "\n")
    real = Path.write_bytes

    def half_then_full(self: Path, data: bytes) -> int:
        real(self, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with monkeypatch.context() as patch:
        patch.setattr(Path, "write_bytes", half_then_full)
        with pytest.raises(DiskFullError):
            load_benchmark(f"probe:{folder}")
    assert list(data_home.iterdir()) == [cached], "a changed file is a new probe; a failed write leaves nothing"
    second = load_benchmark(f"probe:{folder}")
    assert len(list(data_home.iterdir())) == 2 and second.corpus != first.corpus


def test_squad_paragraphs_converted_by_the_example_make_a_probe(tmp_path: Path, data_home: Path) -> None:
    """docs/probe.md's path: examples/squad/squad_to_beir.py, then probe:FOLDER; every query is a SQuAD question
    packed with its own paragraph."""
    rng = random.Random(3)
    paragraphs = [text(rng, 20, 40) for _ in range(200)]

    def asked(qid: str, paragraph: str) -> dict:
        return {"id": qid, "question": paragraph[:20], "answers": [{"text": paragraph[:5], "answer_start": 0}]}

    halves = [paragraphs[:100], paragraphs[100:]]
    articles = [(f"T{a}", [(p, [asked(f"a{a}p{i}", p)]) for i, p in enumerate(half)]) for a, half in enumerate(halves)]
    articles[0][1][0][1].append({"id": "impossible", "question": "none?", "answers": [], "is_impossible": True})
    squad = write_squad(tmp_path / "squad.json", articles)
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples/squad/squad_to_beir.py"), str(squad), str(tmp_path / "paragraphs")],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "200 passages, 200 queries" in done.stdout, "the unanswerable question is left out"
    probe = load_benchmark(f"probe:{tmp_path / 'paragraphs'}")
    assert set(probe.queries) <= {f"a{a}p{i}" for a in range(2) for i in range(100)} and len(probe.queries) == 100
    own = {f"a{a}p{i}": p for a, (_, chunk) in enumerate(articles) for i, (p, _) in enumerate(chunk)}
    assert all(own[q] in probe.corpus[next(iter(probe.qrels[q]))].split("\n\n") for q in probe.queries)


def test_a_folder_of_another_format_is_refused_for_a_probe(tmp_path: Path) -> None:
    (tmp_path / "queries.parquet").write_bytes(b"PAR1")
    with pytest.raises(ValueError, match=r"takes a retrieval set to build a probe from: a JSONL folder .* BEIR folder"):
        load_benchmark(f"probe:{tmp_path}")


# ------------------------------------------------------------------------------------ the whole path


@pytest.mark.usefixtures("one_thread")
def test_tune_on_natural_squad_held_out_on_a_probe_then_evaluate_scores_as_computed_independently(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`tune run --dataset squad:FILE --heldout probe:FOLDER` on a tiny model, then `tune evaluate --dataset
    probe:FOLDER`: each figure as plain transformers vectors and a dot product give it (tests/test_paths.py)."""
    rng = random.Random(8)
    model = save_tiny("bert", tmp_path / "tiny", max_length=512, initializer_range=0.5)
    articles = []
    for a in range(8):
        paragraphs = []
        for p in range(3):
            body = text(rng, 30, 45)
            tokens = body.split()
            qas = []
            for k in range(3):
                at = rng.randrange(len(tokens) - 4)
                start = len(" ".join(tokens[:at])) + (1 if at else 0)
                qas.append(
                    {
                        "id": f"a{a}p{p}q{k}",
                        "question": " ".join(tokens[at : at + 5]),
                        "answers": [{"text": " ".join(tokens[at : at + 3]), "answer_start": start}],
                    }
                )
            paragraphs.append((body, qas))
        articles.append((f"T{a}", paragraphs))
    squad = write_squad(tmp_path / "natural.json", articles)
    held = as_beir(tmp_path / "held", retrieval_set(96, 100, seed=9))
    work = tmp_path / "work"
    work.mkdir()
    (work / "space.yaml").write_text(yaml.safe_dump({"basket_sizes": [16, 32]}), encoding="utf-8")
    environment = {**os.environ, "POSFAIR_DATA_DIR": str(tmp_path / "data-home"), "COLUMNS": "200"}
    done = forkserver.run(
        [
            *forkserver.TUNE_COMMAND,
            *("run", "--model", str(model), "--pooling", "cls", "--dataset", f"squad:{squad}"),
            *("--heldout", f"probe:{held}", "--trials", "2", "--selection", "lowest", "--hm-floor=-90%"),
            *("--no-bisect", "--max-ndcg-drop", "none", "--max-drift", "none"),
            *("--max-reversal", "none", "--no-prune", "--budget", "none", "--profile-docs", "2", "--bootstrap", "20"),
            *("--space", str(work / "space.yaml"), "--output", str(work / "best.yaml")),
        ],
        cwd=work,
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    monkeypatch.setenv("POSFAIR_DATA_DIR", str(tmp_path / "data-home"))
    monkeypatch.setenv("POSFAIR_CACHE_DIR", str(work / "mlruns" / "cache"))
    natural, probe = load_benchmark(f"squad:{squad}"), load_benchmark(f"probe:{held}")
    assert len(list((tmp_path / "data-home" / "probes").iterdir())) == 1, "the run's probe, read here from its cache"
    oracle = reference(model, "cls")

    def expected(dataset: PositionalDataset, config: CalibrationConfig | None) -> dict[str, float]:
        doc_ids = list(dataset.corpus)
        documents = oracle.encode([dataset.corpus[d] for d in doc_ids], config)
        relevant = [next(iter(judged)) for judged in dataset.qrels.values()]
        gains = ndcg10(oracle.encode(list(dataset.queries.values())), documents, doc_ids, relevant)
        by_query = dict(zip(dataset.queries, gains))
        groups = {q: third(dataset.positions[q]) for q in dataset.queries}
        counts = {f"n_{g}": sum(label == g for label in groups.values()) for g in THIRDS}
        return figures(by_query, groups) | counts

    exported = yaml.safe_load((work / "best.yaml").read_text(encoding="utf-8"))
    assert exported["provenance"]["dataset"] == f"squad:{squad.name}"
    winner = CalibrationConfig(**exported["calibration"])
    assert winner.strength > 0, "the winner must be calibrated, else the oracle check of it is void"
    assert_figures(exported["metrics"]["tuning_baseline"], expected(natural, None), "tune: squad, no calibration")
    assert_figures(exported["metrics"]["tuning"], expected(natural, winner), "tune: squad, the winner")
    baseline = expected(probe, None)
    assert_figures(exported["metrics"][f"heldout_baseline/probe:{held.name}"], baseline, "tune: probe, no calibration")

    output = tune_here(
        *("evaluate", "--model", str(model), "--pooling", "cls", "--dataset", f"probe:{held}"),
        *("--config", str(work / "best.yaml"), "--no-paper-default", "--no-sea", "--general", "", "--no-shuffled"),
        *("--bootstrap", "20", "--json", str(work / "probe.json")),
    )
    table = json.loads((work / "probe.json").read_text(encoding="utf-8"))
    rows = {row["name"]: row["metrics"] for row in table["rows"]}
    assert_figures(rows["No calibration"], baseline, "evaluate: no calibration")
    cells = [f"{100 * baseline[key]:.2f}" for key in ("ndcg10_begin", "ndcg10_middle", "ndcg10_end", "hm")]
    printed = " │ ".join([*cells, f"{baseline['psi']:.3f}", f"{100 * baseline['ndcg10']:.2f}"])
    assert f"│ No calibration │ {printed} │" in output, output
    # The winner on the probe as the run scored it: an oracle's ranks of 96 windows of random words tie within 1e-5.
    held_out = exported["metrics"][f"heldout/probe:{held.name}"]
    assert_figures(rows[next(n for n in rows if n.startswith("best.yaml"))], held_out, "evaluate: the winner")


def test_what_the_docs_say_of_the_probe_is_what_the_code_and_the_record_hold() -> None:
    from benchmarks import record
    from tuner.data.probe import MIN_GROUP_QUERIES, MIN_POOL
    from tuner.data.tokens import CONTENT_TOKENS

    pages = [(ROOT / "docs" / page).read_text(encoding="utf-8") for page in ("datasets.md", "probe.md")]
    datasets, walk = (" ".join(text.split()) for text in pages)
    short = ProbeOptions().short
    assert f"at most a third of a window long: {short} all-MiniLM-L6-v2 tokens of the {CONTENT_TOKENS}" in datasets
    assert f"fewer than {MIN_POOL} passages are left" in datasets
    assert f"fewer than {MIN_GROUP_QUERIES} queries" in datasets
    assert f"at most {short} all-MiniLM-L6-v2 tokens" in walk and f"at least {MIN_GROUP_QUERIES} usable queries" in walk
    card = record.read(record.RESULTS / "squad-card.json")["results"]["probe"]
    assert card["long_relevant"] > 0 and card["pooled"] > 0, "probe.md: long paragraphs left out, half kept back"
    assert card["short_tokens"] == short and card["kept"] == sum(card["groups"].values())
