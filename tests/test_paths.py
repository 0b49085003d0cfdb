"""Every real path end to end, as users run it: the `tune` command line, the registry's aliases, a Hugging Face
cache in the hub's own layout, and benchmarks in their real layouts (all built by tests/hub.py, offline).

Each run's figures are checked against numbers computed here without posfair's encoder, retrieval or
metrics: vectors from transformers' own SDPA one text at a time (and, for calibrated documents, from the
plain full-matrix oracle `tuner/calibration/reference.py`), ranks from a dot product, nDCG@10 = 1/log2(rank+1)
for the one relevant document, groups and strata as the fixtures were built. The tiny models are random,
so the ranking is whatever they give, and these computations make it known.
"""

from __future__ import annotations

import functools
import json
import math
import random
from pathlib import Path

import numpy as np
import optuna
import pytest
import torch
import yaml
from mlflow.tracking import MlflowClient
from transformers import AutoTokenizer

from tests.hub import (
    BGE_M3,
    CUSTOM_CODE,
    GTE_NATIVE,
    MPNET,
    QWEN3_EMBEDDING,
    FakeHub,
    Passage,
    add_repo,
    fineweb_posq_rows,
    passages,
    run_tune,
    tune_here,
    use_in_this_process,
    write_beir,
    write_fineweb_posq,
    write_posir,
)
from tests.tiny import PLAIN, WORDS, load_as, save_custom_code, save_tiny
from tuner.calibration import CalibrationConfig, calibrating
from tuner.calibration.reference import register_reference
from tuner.common.trials import named_constraints

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: threads only contend

# Qwen3-Embedding's model card: queries carry this instruction, documents nothing.
QWEN3_QUERY = "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:"
# PosIR's eval.py (github.com/Ziyang1060/PosIR) puts this before every query, for every model: note the space.
POSIR_QUERY = "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery: "
THIRDS = ("begin", "middle", "end")


# ------------------------------------------------------------------------------------- reference figures


@functools.cache
def reference(snapshot: Path, pooling: str) -> Reference:
    return Reference(snapshot, pooling)


class Reference:
    """One model's vectors without posfair: plain SDPA (or the oracle, for a calibration), one text at a time."""

    def __init__(self, snapshot: Path, pooling: str) -> None:
        self.tokenizer = AutoTokenizer.from_pretrained(snapshot)
        self.plain = load_as(snapshot, PLAIN)
        self.oracle = load_as(snapshot, register_reference())
        self.pooling = pooling

    def encode(self, texts: list[str], config: CalibrationConfig | None = None, prompt: str = "") -> np.ndarray:
        return np.stack([self.vector(text, config.model_dump_json() if config else None, prompt) for text in texts])

    @functools.cache  # noqa: B019 - one oracle per module, kept for the whole run on purpose
    def vector(self, text: str, config_json: str | None, prompt: str) -> np.ndarray:
        batch = self.tokenizer([prompt + text], return_tensors="pt")
        with torch.inference_mode():
            if config_json is None:
                hidden = self.plain(**batch).last_hidden_state[0]
            else:
                config = CalibrationConfig.model_validate_json(config_json)
                with calibrating(config.resolve(self.plain.config.num_hidden_layers)):
                    hidden = self.oracle(**batch).last_hidden_state[0]
        # no padding: the last token is the last row, and every row is a real token
        pooled = {"cls": hidden[0], "last": hidden[-1], "mean": hidden.mean(0)}[self.pooling]
        return torch.nn.functional.normalize(pooled.double(), dim=-1).numpy()


def ndcg10(queries: np.ndarray, documents: np.ndarray, doc_ids: list[str], relevant: list[str]) -> list[float]:
    """nDCG@10 of each query's one relevant document: 1/log2(rank + 1) within the top 10, else 0.

    The relevant document's score must stand clear of every other (1e-5, far above the 1e-6 the engine may
    differ from the oracle by), so that the rank is a fact of the fixture and not of rounding.
    """
    scores = queries @ documents.T
    gains = []
    for row, doc in zip(scores, relevant):
        target = row[doc_ids.index(doc)]
        others = np.delete(row, doc_ids.index(doc))
        assert np.abs(others - target).min() > 1e-5, "a near-tie in the fixture: change its seed"
        rank = 1 + int((others > target).sum())
        gains.append(1 / math.log2(rank + 1) if rank <= 10 else 0.0)
    return gains


def figures(gains: dict[str, float], groups: dict[str, str], strata: dict[str, str] | None = None) -> dict[str, float]:
    """What PositionReport.as_dict should say: per-group nDCG@10 and counts, HM and PSI (means over strata)."""

    def within(qids: list[str]) -> tuple[dict[str, float], dict[str, int]]:
        members = {g: [gains[q] for q in qids if groups.get(q) == g] for g in THIRDS}
        return {g: sum(v) / len(v) for g, v in members.items()}, {g: len(v) for g, v in members.items()}

    placed = [q for q in gains if q in groups]
    pooled, counts = within(placed)
    out = {"ndcg10": sum(gains.values()) / len(gains), "n_queries": len(gains)}
    out |= {f"ndcg10_{g}": pooled[g] for g in THIRDS} | {f"n_{g}": counts[g] for g in THIRDS}
    hms, psis = [], []
    for stratum in sorted(set((strata or {}).values())) or [None]:
        means, counts = within([q for q in placed if strata is None or strata.get(q) == stratum])
        hm = 3 / sum(1 / v if v else math.inf for v in means.values())
        psi = 1 - min(means.values()) / max(means.values())
        hms.append(hm)
        psis.append(psi)
        if stratum is not None:
            out |= {f"{stratum}/hm": hm, f"{stratum}/psi": psi} | {f"{stratum}/n_{g}": counts[g] for g in THIRDS}
    return out | {"hm": sum(hms) / len(hms), "psi": sum(psis) / len(psis)}


def assert_figures(logged: dict[str, float], expected: dict[str, float], what: str) -> None:
    wrong = {k: (logged.get(k), v) for k, v in expected.items() if logged.get(k) is None or abs(logged[k] - v) > 1e-6}
    assert not wrong, f"{what}: logged vs expected {wrong}"


def succeeded(result) -> str:
    assert result.returncode == 0, (
        f"exit {result.returncode}\nstdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-6000:]}"
    )
    return " ".join((result.stdout + result.stderr).split())


def space_file(folder: Path, name: str, **values: object) -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump(values), encoding="utf-8")
    return path


# ------------------------------------------------------------------------------------------------ the hub


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> FakeHub:
    hub = FakeHub(tmp_path_factory.mktemp("paths"))
    hub.add_model(BGE_M3, "xlmr")
    hub.add_model(QWEN3_EMBEDDING, "qwen3")
    hub.add_model(GTE_NATIVE, "gte")
    hub.add_model(MPNET, "mpnet")
    hub.add_model(CUSTOM_CODE, "xlmr", remote_code=True)
    return hub


@pytest.fixture(scope="module")
def general_set(hub: FakeHub) -> tuple[Path, dict[str, str], dict[str, tuple[str, str]]]:
    """A small BEIR folder: short documents, each asked for by its first words."""
    rng = random.Random(5)
    corpus = {f"g{i}": " ".join(rng.choice(WORDS) for _ in range(rng.randint(12, 20))) for i in range(8)}
    queries = {f"gq{i}": (" ".join(text.split()[:4]), doc) for i, (doc, text) in enumerate(corpus.items())}
    return write_beir(hub.root / "beir-general", corpus, queries), corpus, queries


@pytest.fixture()
def this_process_on_the_hub(hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> FakeHub:
    return use_in_this_process(hub, monkeypatch)


def test_a_hub_model_records_its_commit_and_truncates_at_its_own_positions(this_process_on_the_hub: FakeHub) -> None:
    from tuner.engine.encoder import CalibratedEncoder
    from tuner.engine.models import load_model

    loaded = load_model("bge-m3")
    assert loaded.revision == this_process_on_the_hub.revisions[BGE_M3], "the snapshot's commit, not 'local'"
    assert loaded.max_length == 256, "a table of 258 positions, of which XLM-R's numbering skips the first two"
    encoder = CalibratedEncoder(loaded)
    encoder.encode([" ".join(WORDS[:40] * 10)])  # 400 words: would index past the table without truncation
    assert encoder.truncated == 1


# --------------------------------------------------------------------- bge-m3 on FineWeb-PosQ, then encode


@pytest.fixture(scope="module")
def bge_m3_run(hub: FakeHub, general_set) -> dict:
    """`tune --model bge-m3 --dataset fineweb-posq:<local copy> --trials 3`, with --general and no drop limit."""
    corpus = passages(16, 90, 150, seed=1)
    distractors = [p.text for p in passages(3, 90, 150, seed=2)]
    local = write_fineweb_posq(hub.root / "FineWeb-PosQ", fineweb_posq_rows(corpus, distractors))
    work = hub.root / "bge-m3"
    space = space_file(hub.root, "bge-space.yaml", basket_sizes=[32, 64])
    result = run_tune(
        hub,
        "--model",
        "bge-m3",
        "--dataset",
        f"fineweb-posq:{local}",
        "--trials",
        "3",
        "--general",
        f"beir:{general_set[0]}",
        "--hm-floor=-50%",
        # a random model over-corrects at random; λ bisection would spend these few trials on it
        # (tests/test_bisection.py)
        "--no-bisect",
        "--space",
        str(space),
        "--bootstrap",
        "50",
        "--no-prune",  # every trial complete, with all it logs (pruning: tests/test_pruning.py)
        "--output",
        str(work / "best.yaml"),
        "--tracking-uri",
        hub.tracking_uri,
        cwd=work,
    )
    return {"result": result, "work": work, "corpus": corpus, "distractors": distractors, "local": local}


def test_tune_bge_m3_on_fineweb_posq_scores_as_computed_independently(hub: FakeHub, bge_m3_run: dict) -> None:
    from tuner.data import load_benchmark

    output = succeeded(bge_m3_run["result"])
    exported = yaml.safe_load((bge_m3_run["work"] / "best.yaml").read_text(encoding="utf-8"))
    assert exported["model"]["source"] == BGE_M3 and exported["model"]["revision"] == hub.revisions[BGE_M3]
    assert exported["provenance"]["dataset"] == "fineweb-posq-tune" and "exported config" in output

    model = reference(hub.snapshot(BGE_M3), "cls")
    corpus = bge_m3_run["corpus"]
    texts = sorted({p.text for p in corpus} | set(bge_m3_run["distractors"]))  # the authors' passage ids: sorted text
    doc_ids = [f"d{i:02d}" for i in range(len(texts))]
    of_question = {q: (p.text, third) for p in corpus for q, third in zip(p.questions, THIRDS)}
    calibration = CalibrationConfig(**exported["calibration"])
    assert calibration.strength > 0, "the fixture should make a calibrated config win; else the oracle check is void"
    documents = {None: model.encode(texts), "winner": model.encode(texts, calibration)}
    for part, metrics, baseline in (
        ("tune", "tuning", "tuning_baseline"),
        ("heldout", "heldout/fineweb-posq-heldout", "heldout_baseline/fineweb-posq-heldout"),
    ):
        dataset = load_benchmark(
            f"fineweb-posq:{bge_m3_run['local']}",
            part=part,  # which passages: the loader's split
            cache_dir=str(hub.root / "datasets-cache"),
        )
        questions = list(dataset.queries.values())
        assert len(questions) == 24, "8 of 16 passages per part, 3 questions each"
        queries = model.encode(questions)
        relevant = [doc_ids[texts.index(of_question[q][0])] for q in questions]
        groups = {q: of_question[q][1] for q in questions}
        for key, docs in documents.items():
            gains = dict(zip(questions, ndcg10(queries, docs, doc_ids, relevant)))
            expected = figures(gains, groups) | {"n_begin": 8, "n_middle": 8, "n_end": 8}
            assert_figures(exported["metrics"][metrics if key else baseline], expected, f"{metrics} {key}")


def test_general_alone_is_a_reported_check_not_a_constraint(hub: FakeHub, bge_m3_run: dict, general_set) -> None:
    """`--general X` without `--max-general-drop`: trials log the general nDCG@10 change; only the HM floor
    constrains."""
    succeeded(bge_m3_run["result"])
    work = bge_m3_run["work"]
    study = optuna.load_study(
        study_name=optuna.get_all_study_names(f"sqlite:///{work / 'mlruns/optuna.db'}")[0],
        storage=f"sqlite:///{work / 'mlruns/optuna.db'}",
    )
    trials = study.trials
    assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE] * 3
    assert all(
        list(named_constraints(t)) == ["hm_floor", "ndcg_drop", "reversal", "structure_ndcg"] for t in trials
    )  # no general_drop
    client = MlflowClient(hub.tracking_uri)
    runs = client.search_runs(
        [client.get_experiment_by_name("posfair").experiment_id],
        f"tags.`posfair.role` = 'trial' and tags.`posfair.study` = '{study.study_name}'",
    )
    assert len(runs) == 3 and all(
        math.isfinite(r.data.metrics["general_ndcg10_change_vs_uncalibrated_x100"]) for r in runs
    )


def test_tune_encode_and_from_yaml_give_the_oracle_calibrated_vectors(
    this_process_on_the_hub: FakeHub, bge_m3_run: dict
) -> None:
    from tuner.engine.encoder import CalibratedEncoder

    hub = this_process_on_the_hub
    succeeded(bge_m3_run["result"])
    work, texts = bge_m3_run["work"], [p.text for p in bge_m3_run["corpus"]]
    (work / "docs.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    tune_here(
        "encode",
        "--config",
        str(work / "best.yaml"),
        "--input",
        str(work / "docs.jsonl"),
        "--output",
        str(work / "docs.npy"),
    )
    from_cli = np.load(work / "docs.npy")

    encoder = CalibratedEncoder.from_yaml(work / "best.yaml")
    assert encoder.model.revision == hub.revisions[BGE_M3]
    assert np.array_equal(encoder.encode(texts), from_cli)
    exported = yaml.safe_load((work / "best.yaml").read_text(encoding="utf-8"))
    oracle = reference(hub.snapshot(BGE_M3), "cls").encode(texts, CalibrationConfig(**exported["calibration"]))
    assert np.abs(from_cli - oracle).max() < 1e-5
    assert np.abs(from_cli - reference(hub.snapshot(BGE_M3), "cls").encode(texts)).max() > 1e-4, "calibration acted"


# ----------------------------------------------------------------------------- Qwen3-Embedding on PosIR


def posir_fixture(folder: Path) -> tuple[Path, dict[str, str], list[dict]]:
    """Twelve documents whose lengths make batches of two both unpadded (equal lengths) and padded.

    Word counts (one token each, plus Qwen3's end-of-text) sorted long first, in pairs: (60, 60) (54, 48)
    (48, 42) (36, 36) (30, 27) (24, 24). The first six documents are declared 300 tokens long (PosIR
    quartile Q1), the others 800 (Q2); every document gets a question for each third but one, so both
    quartiles hold all three thirds; one query has no span (aggregate nDCG only).
    """
    rng = random.Random(7)
    sizes = [60, 60, 54, 48, 48, 42, 36, 36, 30, 27, 24, 24]
    corpus, queries = {}, []
    for d, size in enumerate(sizes):
        third = size // 3
        parts = [
            " ".join(rng.choice(WORDS) for _ in range(third + (size - 3 * third if i == 2 else 0))) for i in range(3)
        ]
        passage = Passage(" ".join(parts), tuple(parts), tuple(" ".join(p.split()[:5]) for p in parts))  # type: ignore[arg-type]
        doc = f"doc{d}"
        corpus[doc] = passage.text
        for t, label in enumerate(THIRDS):
            if (d + t) % 4 == 3:
                continue
            queries.append(
                {
                    "_id": f"{doc}-{label}",
                    "text": passage.questions[t],
                    "doc": doc,
                    "span": passage.span(t),
                    "token_length": 300 if d < 6 else 800,
                    "group": label,
                }
            )
    queries.append(
        {
            "_id": "nospan",
            "text": " ".join(corpus["doc5"].split()[3:8]),
            "doc": "doc5",
            "span": None,
            "token_length": 300,
            "group": None,
        }
    )
    return write_posir(folder, corpus, queries), corpus, queries


@pytest.fixture(scope="module")
def qwen3_run(hub: FakeHub) -> dict:
    folder, corpus, queries = posir_fixture(hub.root / "PosIR-Benchmark-v1" / "eng-Latn" / "demo")
    work = hub.root / "qwen3"
    space = space_file(hub.root, "qwen-space.yaml", basket_sizes=[8, 16])
    result = run_tune(
        hub,
        "--model",
        "qwen3-embedding-0.6b",
        "--dataset",
        f"posir:{folder}",
        "--trials",
        "3",
        "--batch-size",
        "2",
        "--hm-floor=-50%",
        # a random model over-corrects at random; λ bisection would spend these few trials on it
        # (tests/test_bisection.py)
        "--no-bisect",
        "--space",
        str(space),
        "--output",
        str(work / "best.yaml"),
        # a random model's nDCG@10 change and tilt are noise: this run tests the path, not selection
        "--max-ndcg-drop",
        "none",
        "--max-reversal",
        "none",
        "--tracking-uri",
        hub.tracking_uri,
        cwd=work,
    )
    return {"result": result, "work": work, "folder": folder, "corpus": corpus, "queries": queries}


def qwen3_expected(hub: FakeHub, run: dict, config: CalibrationConfig | None) -> dict[str, float]:
    model = reference(hub.snapshot(QWEN3_EMBEDDING), "last")
    doc_ids = list(run["corpus"])
    documents = model.encode(list(run["corpus"].values()), config)
    queries = run["queries"]
    vectors = model.encode([q["text"] for q in queries], prompt=QWEN3_QUERY)
    gains = dict(zip([q["_id"] for q in queries], ndcg10(vectors, documents, doc_ids, [q["doc"] for q in queries])))
    groups = {q["_id"]: q["group"] for q in queries if q["group"]}
    strata = {q["_id"]: "Q1" if q["token_length"] == 300 else "Q2" for q in queries if q["group"]}
    return figures(gains, groups, strata)


def test_tune_qwen3_on_posir_with_padded_and_unpadded_batches(hub: FakeHub, qwen3_run: dict) -> None:
    succeeded(qwen3_run["result"])
    exported = yaml.safe_load((qwen3_run["work"] / "best.yaml").read_text(encoding="utf-8"))
    assert exported["model"]["source"] == QWEN3_EMBEDDING and exported["model"]["padding_side"] == "left"
    winner = CalibrationConfig(**exported["calibration"])
    assert winner.strength > 0 and winner.pooling == "last"
    baseline = qwen3_expected(hub, qwen3_run, None)
    assert {k: baseline[k] for k in ("n_begin", "n_middle", "n_end", "Q1/n_begin", "Q2/n_end")} == {
        "n_begin": 9,
        "n_middle": 9,
        "n_end": 9,
        "Q1/n_begin": 5,
        "Q2/n_end": 5,
    }
    assert baseline["n_queries"] == 28, "27 placed queries and one without a span"
    assert_figures(exported["metrics"]["tuning_baseline"], baseline, "baseline")
    assert_figures(exported["metrics"]["tuning"], qwen3_expected(hub, qwen3_run, winner), "winner (oracle)")


def test_tune_evaluate_qwen3_on_posir(this_process_on_the_hub: FakeHub, qwen3_run: dict) -> None:
    hub = this_process_on_the_hub
    succeeded(qwen3_run["result"])
    work = qwen3_run["work"]
    output = tune_here(
        "evaluate",
        "--model",
        "qwen3-embedding-0.6b",
        "--dataset",
        f"posir:{qwen3_run['folder']}",
        "--config",
        str(work / "best.yaml"),
        "--no-sea",
        "--general",
        "",
        "--no-shuffled",
        "--bootstrap",
        "20",
        "--json",
        str(work / "evaluate.json"),
    )
    assert "No calibration" in output
    table = json.loads((work / "evaluate.json").read_text(encoding="utf-8"))
    rows = {row["name"]: row["metrics"] for row in table["rows"]}
    assert table["group_order"] == list(THIRDS)
    assert_figures(rows["No calibration"], qwen3_expected(hub, qwen3_run, None), "evaluate: no calibration")
    winner = CalibrationConfig(**yaml.safe_load((work / "best.yaml").read_text(encoding="utf-8"))["calibration"])
    exported_row = next(name for name in rows if name.startswith("best.yaml"))
    assert_figures(rows[exported_row], qwen3_expected(hub, qwen3_run, winner), "evaluate: exported config")


# ------------------------------------------------------------------------------- tune evaluate: beir, jsonl


def test_tune_evaluate_on_a_jsonl_folder_and_a_beir_general_set(this_process_on_the_hub: FakeHub, general_set) -> None:
    """Positions from character spans (jsonl) and general retrieval (BEIR), with bge-m3."""
    hub = this_process_on_the_hub
    rng = random.Random(11)
    folder = hub.root / "own-jsonl"
    folder.mkdir()
    corpus, queries = {}, []
    for d in range(6):
        made = passages(1, 30, 45, seed=100 + d)[0]
        corpus[f"p{d}"] = made.text
        for t, label in enumerate(THIRDS):
            queries.append(
                {"id": f"p{d}-{label}", "text": made.questions[t], "relevant": [f"p{d}"], "span": list(made.span(t))}
            )
    rng.shuffle(queries)
    (folder / "corpus.jsonl").write_text("".join(json.dumps({"id": k, "text": v}) + "\n" for k, v in corpus.items()))
    (folder / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    work = hub.root / "evaluate"
    work.mkdir()
    tune_here(
        "evaluate",
        "--model",
        "bge-m3",
        "--dataset",
        f"jsonl:{folder}",
        "--general",
        f"beir:{general_set[0]}",
        "--no-sea",
        "--no-shuffled",
        "--bootstrap",
        "20",
        "--json",
        str(work / "evaluate.json"),
    )
    table = json.loads((work / "evaluate.json").read_text(encoding="utf-8"))
    model = reference(hub.snapshot(BGE_M3), "cls")
    documents = model.encode(list(corpus.values()))
    vectors = model.encode([q["text"] for q in queries])
    gains = dict(
        zip([q["id"] for q in queries], ndcg10(vectors, documents, list(corpus), [q["relevant"][0] for q in queries]))
    )
    expected = figures(gains, {q["id"]: q["id"].split("-")[1] for q in queries}) | {
        "n_begin": 6,
        "n_middle": 6,
        "n_end": 6,
    }
    assert_figures(table["rows"][0]["metrics"], expected, "jsonl: no calibration")

    _, general_corpus, general_queries = general_set
    general_docs = model.encode(list(general_corpus.values()))
    general_gains = ndcg10(
        model.encode([t for t, _ in general_queries.values()]),
        general_docs,
        list(general_corpus),
        [d for _, d in general_queries.values()],
    )
    assert table["general"]["dataset"] == "beir:beir-general"
    assert table["general"]["rows"][0]["original"]["ndcg10"] == pytest.approx(sum(general_gains) / 8, abs=1e-6)


# -------------------------------------------------------------- tune evaluate: a model folder, PosIR's scoring


def jsonl_with_spans(folder: Path, documents: int, seed: int) -> tuple[dict[str, str], list[dict]]:
    """A JSONL folder: passages of three thirds, one query per third with its character span."""
    folder.mkdir()
    corpus, queries = {}, []
    for d in range(documents):
        made = passages(1, 30, 45, seed=seed + d)[0]
        corpus[f"p{d}"] = made.text
        for t, label in enumerate(THIRDS):
            queries.append(
                {"id": f"p{d}-{label}", "text": made.questions[t], "relevant": [f"p{d}"], "span": list(made.span(t))}
            )
    random.Random(seed).shuffle(queries)
    (folder / "corpus.jsonl").write_text("".join(json.dumps({"id": k, "text": v}) + "\n" for k, v in corpus.items()))
    (folder / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    return corpus, queries


def test_tune_evaluate_loads_a_local_model_folder_with_the_pooling_and_padding_given(
    this_process_on_the_hub: FakeHub,
) -> None:
    """Models outside the registry, given as `tune run` takes them: a BERT folder pooled by the mean, and a Qwen3
    folder pooled by its last token but padded on the right (its default there would be the left)."""
    hub = this_process_on_the_hub
    corpus, queries = jsonl_with_spans(hub.root / "local-data", documents=6, seed=200)
    groups = {q["id"]: q["id"].split("-")[1] for q in queries}
    work = hub.root / "local-evaluate"
    work.mkdir()
    calibrated = {"strength": 0.5, "layers": "last", "basket_size": 16}
    for kind, pooling, padding in (("bert", "mean", []), ("qwen3", "last", ["--padding-side", "right"])):
        folder = save_tiny(kind, hub.root / f"local-{kind}", initializer_range=0.5)
        tune_here(
            "evaluate",
            *("--model", str(folder), "--pooling", pooling, *padding, "--dataset", f"jsonl:{hub.root / 'local-data'}"),
            *("--calibration", "strength=0.5,layers=last,basket_size=16", "--no-paper-default", "--no-sea"),
            *("--general", "", "--no-shuffled", "--bootstrap", "20", "--json", str(work / f"{kind}.json")),
        )
        table = json.loads((work / f"{kind}.json").read_text(encoding="utf-8"))
        assert (table["model"], table["pooling"], table["padding_side"]) == (str(folder), pooling, "right")
        model = reference(folder, pooling)
        vectors = model.encode([q["text"] for q in queries])
        for row, config in zip(table["rows"], (None, CalibrationConfig(pooling=pooling, **calibrated)), strict=True):
            documents = model.encode(list(corpus.values()), config)
            gains = dict(
                zip(
                    [q["id"] for q in queries],
                    ndcg10(vectors, documents, list(corpus), [q["relevant"][0] for q in queries]),
                )
            )
            assert_figures(
                row["metrics"],
                figures(gains, groups) | {"n_begin": 6, "n_middle": 6, "n_end": 6},
                f"{kind}: {row['name']}",
            )


def posir_language(root: Path) -> dict[str, tuple[dict[str, str], list[dict]]]:
    """A PosIR <language> folder of two domains, each with its own corpus. Declared token lengths put queries in
    Q1, Q2 and Q4 (none in Q3) and one at 0 (no bucket); one query has no span (nDCG@10 only)."""
    domains = {}
    rng = random.Random(3)
    for name, seed in (("alpha", 300), ("beta", 400)):
        corpus, queries = {}, []
        for d, made in enumerate(passages(5, 24, 40, seed=seed)):
            corpus[f"{name}{d}"] = made.text
            for t in range(3):
                tokens = rng.choice([300, 512, 513, 900, 2000, 0])
                queries.append(
                    {
                        "_id": f"{name}{d}-{t}",
                        "text": made.questions[t],
                        "doc": f"{name}{d}",
                        "span": made.span(t),
                        "token_length": tokens,
                    }
                )
        queries[0]["span"] = None
        write_posir(root / name, corpus, queries)
        domains[name] = (corpus, queries)
    return domains


def posir_by_hand(records: list[tuple[tuple[int, int] | None, int, int, float]]) -> dict[str, float | None]:
    """PosIR's figures following its analysis step by step: (span, characters, tokens, nDCG@10) per query."""
    cells: dict[tuple[str | None, int], list[float]] = {}
    for span, characters, tokens, gain in records:
        if span is None or characters <= 0 or (span[0] + span[1]) / 2 < 0:
            continue
        relative = min((span[0] + span[1]) / 2, characters) / characters
        position = next(k for k in range(1, 21) if relative <= k / 20)  # (k-1)/20 < x <= k/20; 0 in the first
        bucket = (
            None
            if tokens <= 0
            else "Q1"
            if tokens <= 512
            else "Q2"
            if tokens <= 1024
            else "Q3"
            if tokens <= 1536
            else "Q4"
        )
        cells.setdefault((bucket, position), []).append(gain)
    means = {cell: sum(v) / len(v) for cell, v in cells.items()}
    pooled: dict[int, list[float]] = {}
    for (_, position), gains in cells.items():
        pooled.setdefault(position, []).extend(gains)
    pooled_means = [sum(v) / len(v) for v in pooled.values()]
    out: dict[str, float | None] = {
        "ndcg10": sum(r[3] for r in records) / len(records),
        "psi": 1 - min(pooled_means) / max(pooled_means),
    }
    for bucket in ("Q1", "Q2", "Q3", "Q4"):
        ys = [m for (b, _), m in means.items() if b == bucket]
        out[f"{bucket}/ndcg10"] = sum(ys) / len(ys) if ys else None
        out[f"{bucket}/psi"] = 1 - min(ys) / max(ys) if ys else None
    return out


def test_tune_evaluate_scores_posir_as_posir_scores_itself(this_process_on_the_hub: FakeHub) -> None:
    """Two domains, each retrieved over its own corpus, every query prefixed with PosIR's instruction, their
    queries pooled into 20 bins within token-length buckets."""
    hub = this_process_on_the_hub
    domains = posir_language(hub.root / "PosIR-lang" / "eng-Latn")
    work = hub.root / "posir-scoring"
    work.mkdir()
    output = tune_here(
        "evaluate",
        *("--model", "bge-m3", "--scoring", "posir", "--dataset", f"posir:{hub.root / 'PosIR-lang' / 'eng-Latn'}"),
        *("--calibration", "strength=0.5,layers=last,basket_size=16", "--no-paper-default", "--no-sea"),
        *("--general", "", "--no-shuffled", "--bootstrap", "20", "--json", str(work / "posir.json")),
    )
    assert "PosIR's figures on posir:eng-Latn (2 domains;" in output and "prefixed with PosIR's instruction" in output
    table = json.loads((work / "posir.json").read_text(encoding="utf-8"))
    assert table["domains"] == ["posir:eng-Latn/alpha", "posir:eng-Latn/beta"] and table["query_prompt"] == POSIR_QUERY
    model = reference(hub.snapshot(BGE_M3), "cls")
    calibrated = CalibrationConfig(pooling="cls", strength=0.5, layers="last", basket_size=16)
    for row, config in zip(table["rows"], (None, calibrated), strict=True):
        records = []
        for corpus, queries in domains.values():
            vectors = model.encode([q["text"] for q in queries], prompt=POSIR_QUERY)
            documents = model.encode(list(corpus.values()), config)
            gains = ndcg10(vectors, documents, list(corpus), [q["doc"] for q in queries])
            records += [(q["span"], len(corpus[q["doc"]]), q["token_length"], g) for q, g in zip(queries, gains)]
        expected = posir_by_hand(records)
        assert expected["Q3/ndcg10"] is None and expected["Q1/psi"] is not None, "the fixture covers an empty bucket"
        metrics = row["metrics"]
        assert metrics["n_queries"] == 30 and metrics["n_placed"] == 28
        for key, value in expected.items():
            assert metrics[key] == (None if value is None else pytest.approx(value, abs=1e-6)), (row["name"], key)
    assert table["rows"][1]["deltas"]["ndcg10"]["estimate"] == pytest.approx(
        table["rows"][1]["metrics"]["ndcg10"] - table["rows"][0]["metrics"]["ndcg10"]
    )


# ------------------------------------------------------------------ tune export: revision, remote code, MLflow


def test_tune_export_restores_revision_and_remote_code_and_logs_where_asked(this_process_on_the_hub: FakeHub) -> None:
    """A study of a model that brings its own code, re-exported after the hub moved on."""
    hub = this_process_on_the_hub
    from tests.test_study import write_dataset

    data = write_dataset(hub.root / "custom-data", docs=8)
    work = hub.root / "custom"
    tuned_revision = hub.revisions[CUSTOM_CODE]
    storage = f"sqlite:///{work / 'optuna.db'}"
    succeeded(
        run_tune(
            hub,
            "--model",
            CUSTOM_CODE,
            "--pooling",
            "cls",
            "--trust-remote-code",
            # the tokenizer's own (another is refused): the study records it, the re-export loads it so
            "--padding-side",
            "right",
            "--dataset",
            f"jsonl:{data}",
            "--trials",
            "2",
            "--hm-floor=-50%",
            # a random model over-corrects at random; λ bisection would spend these few trials on it
            # (tests/test_bisection.py)
            "--no-bisect",
            "--max-ndcg-drop",
            "none",
            "--space",
            str(space_file(hub.root, "gte-space.yaml", basket_sizes=[16, 32])),
            "--storage",
            storage,
            "--tracking-uri",
            hub.tracking_uri,
            "--study-name",
            "gte",
            "--output",
            str(work / "tuned.yaml"),
            cwd=work,
        )
    )
    # The hub moves on: a new commit on main, which a re-export must not pick up.
    moved = save_custom_code(hub.root / "custom-next", layers=3, initializer_range=0.5)
    (moved / "README.md").write_text("a newer revision\n", encoding="utf-8")
    add_repo(hub.cache, CUSTOM_CODE, moved)

    output = tune_here(
        "export",
        "--study-name",
        "gte",
        "--storage",
        storage,
        "--tracking-uri",
        f"sqlite:///{work / 'exports.db'}",
        "--output",
        str(work / "again.yaml"),
    )
    again = yaml.safe_load((work / "again.yaml").read_text(encoding="utf-8"))
    tuned = yaml.safe_load((work / "tuned.yaml").read_text(encoding="utf-8"))
    assert again["model"]["revision"] == tuned_revision and again["calibration"] == tuned["calibration"]
    assert tuned["model"]["padding_side"] == again["model"]["padding_side"] == "right"
    assert again["metrics"]["tuning"] == pytest.approx(tuned["metrics"]["tuning"]), "the same weights, re-scored"
    assert str(work / "again.yaml") in output
    assert (
        f"study gte was tuned with --trust-remote-code, so {CUSTOM_CODE} runs its own code from its repository here too"
        in output
    )
    client = MlflowClient(f"sqlite:///{work / 'exports.db'}")
    experiment = client.get_experiment_by_name("posfair")
    assert experiment is not None, "the export is logged to the store given by --tracking-uri"
    [run] = client.search_runs([experiment.experiment_id], "tags.`posfair.study` = 'gte'")
    assert run.data.tags["posfair.export"] == str(work / "again.yaml")
    assert "again.yaml" in {a.path for a in client.list_artifacts(run.info.run_id)}


# ------------------------------------------------ gte-multilingual-base (native GTE) and MPNet (adapter) end to end


@pytest.mark.parametrize(
    ("typed", "repo", "pooling", "options"),
    [
        (
            "Alibaba-NLP/gte-multilingual-base",
            GTE_NATIVE,
            "cls",
            [],
        ),  # the id a user types; the registry's native checkpoint
        (MPNET, MPNET, "mean", ["--pooling", "mean"]),  # the hub id as any model: attention through its adapter
    ],
    ids=["gte-native", "mpnet"],
)
def test_tune_and_evaluate_gte_and_mpnet_score_as_computed_independently(
    this_process_on_the_hub: FakeHub, typed: str, repo: str, pooling: str, options: list[str]
) -> None:
    """`tune` then `tune evaluate` on the winner: every figure as the oracle-calibrated vectors give it."""
    hub = this_process_on_the_hub
    from tests.test_study import write_dataset

    name = repo.split("/")[1]
    data = write_dataset(hub.root / f"{name}-data", docs=8, words=20)
    work = hub.root / name
    succeeded(
        run_tune(
            hub,
            "--model",
            typed,
            *options,
            "--dataset",
            f"jsonl:{data}",
            "--heldout",
            "",
            "--trials",
            "2",
            "--hm-floor=-50%",
            "--no-bisect",  # a random model over-corrects at random; λ bisection would spend these few trials on it
            "--max-ndcg-drop",
            "none",
            "--max-drift",
            "none",
            "--no-prune",
            "--space",
            str(space_file(hub.root, f"{name}-space.yaml", basket_sizes=[16, 32])),
            "--bootstrap",
            "20",
            "--output",
            str(work / "best.yaml"),
            "--tracking-uri",
            hub.tracking_uri,
            cwd=work,
        )
    )
    exported = yaml.safe_load((work / "best.yaml").read_text(encoding="utf-8"))
    assert exported["model"]["source"] == repo and exported["model"]["revision"] == hub.revisions[repo]
    winner = CalibrationConfig(**exported["calibration"])
    assert winner.strength > 0, "the winner must be calibrated, else the oracle check is void"

    corpus = [json.loads(line) for line in (data / "corpus.jsonl").read_text(encoding="utf-8").splitlines()]
    queries = [json.loads(line) for line in (data / "queries.jsonl").read_text(encoding="utf-8").splitlines()]
    model = reference(hub.snapshot(repo), pooling)
    query_vectors = model.encode([q["text"] for q in queries])
    doc_ids = [d["id"] for d in corpus]
    relevant = [q["relevant"][0] for q in queries]
    groups = {q["id"]: q["group"] for q in queries}

    def expected(config: CalibrationConfig | None) -> dict[str, float]:
        documents = model.encode([d["text"] for d in corpus], config)
        gains = dict(zip([q["id"] for q in queries], ndcg10(query_vectors, documents, doc_ids, relevant)))
        return figures(gains, groups) | {"n_begin": 8, "n_middle": 8, "n_end": 8}

    assert_figures(exported["metrics"]["tuning"], expected(winner), "tune: the winner")
    assert_figures(exported["metrics"]["tuning_baseline"], expected(None), "tune: no calibration")
    tune_here(
        "evaluate",
        "--model",
        typed,
        *options,
        "--dataset",
        f"jsonl:{data}",
        "--config",
        str(work / "best.yaml"),
        "--no-paper-default",
        "--no-sea",
        "--no-shuffled",
        "--general",
        "",
        "--bootstrap",
        "20",
        "--json",
        str(work / "evaluate.json"),
    )
    rows = {
        row["name"]: row["metrics"] for row in json.loads((work / "evaluate.json").read_text(encoding="utf-8"))["rows"]
    }
    assert_figures(rows["No calibration"], expected(None), "evaluate: no calibration")
    assert_figures(rows[next(n for n in rows if n.startswith("best.yaml"))], expected(winner), "evaluate: the winner")
