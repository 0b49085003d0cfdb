"""A fake Hugging Face hub for end-to-end tests: tiny models under the real ids, benchmarks in their real layouts.

Nothing here talks to the network. Models and datasets are written into a local cache laid out as the hub
client writes it (https://huggingface.co/docs/hub/local-cache and huggingface_hub's "Understand caching"
guide), so `snapshot_download(..., local_files_only=True)`, `HF_HUB_OFFLINE=1` and posfair's own loading
code find them exactly where a real `hf download` would have put them:

    <HF_HUB_CACHE>/models--BAAI--bge-m3/
        blobs/<sha256 of the file>             the file's bytes
        refs/main                               the commit hash the `main` branch points at
        snapshots/<commit>/<path in the repo>   relative symlink to ../../blobs/<sha256>
    <HF_HUB_CACHE>/datasets--NovaSearch--FineWeb-PosQ/   the same, for a dataset repository

The models are the tiny randomly initialised ones of `tests.tiny`, under the registry's hub ids:
bge-m3 as XLM-R (CLS pooling, right padding), Qwen3-Embedding-0.6B as Qwen3 (last-token pooling, left
padding, grouped-query attention), gte-multilingual-base as transformers' native GTE under the converted
checkpoint's id, MPNet (mean pooling), and a model that brings its own code under a neutral id.

Dataset layouts, and where they come from:
- FineWeb-PosQ: the columns of the dataset card (huggingface.co/datasets/NovaSearch/FineWeb-PosQ_raw,
  README `dataset_info`: question, content, content_summary, answer, question_level, span (int32
  sequence), span_class (string sequence)); one row per question, rows without a question add their
  passage to the corpus only (the authors' exp_FineWeb-PosQ.py, NovaSearch-Team/position-bias-in-IR).
  The file name inside the repository is not documented there; posfair reads every parquet file of the
  snapshot, so any name works.
- PosIR: one `<language>/<domain>/` folder of the benchmark (infgrad/PosIR-Benchmark-v1) with
  queries.parquet (_id, text, pos_char_span, pos_char_length, pos_token_length), corpus.parquet
  (_id, text) and qrels/test.parquet (query-id, corpus-id, score), as the authors' eval.sh and eval.py
  (github.com/Ziyang1060/PosIR) read them.
- BEIR: corpus.jsonl, queries.jsonl, qrels/test.tsv with a header line.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tests.tiny import WORDS, save_custom_code, save_tiny

BGE_M3 = "BAAI/bge-m3"
QWEN3_EMBEDDING = "Qwen/Qwen3-Embedding-0.6B"
GTE_NATIVE = "alibaba-nlp-community/gte-multilingual-base"
MPNET = "sentence-transformers/all-mpnet-base-v2"
CUSTOM_CODE = "example-org/custom-code-embedder"
FINEWEB_POSQ = "NovaSearch/FineWeb-PosQ"
THIRD_CLASSES = ("beginning", "middle", "end")  # FineWeb-PosQ's span_class values


def repo_folder(cache: Path, repo_id: str, repo_type: str = "model") -> Path:
    """`models--ORG--NAME` (or `datasets--ORG--NAME`) under the hub cache."""
    return cache / f"{repo_type}s--{repo_id.replace('/', '--')}"


def add_repo(cache: Path, repo_id: str, source: Path, repo_type: str = "model") -> tuple[Path, str]:
    """Put every file under `source` into the cache as one commit of `repo_id`; returns (snapshot, commit).

    The commit hash is derived from the content, so the same files give the same revision.
    """
    files = sorted(p for p in source.rglob("*") if p.is_file())
    digests = {p.relative_to(source).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}
    commit = hashlib.sha1(json.dumps(digests, sort_keys=True).encode()).hexdigest()
    root = repo_folder(cache, repo_id, repo_type)
    snapshot = root / "snapshots" / commit
    for path in files:
        name = path.relative_to(source).as_posix()
        blob = root / "blobs" / digests[name]
        blob.parent.mkdir(parents=True, exist_ok=True)
        if not blob.exists():
            shutil.copyfile(path, blob)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / "main").write_text(commit, encoding="utf-8")  # the hub client writes no newline
    return snapshot, commit


def add_tiny_model(
    cache: Path,
    repo_id: str,
    kind: str,
    *,
    max_length: int = 256,
    layers: int = 3,
    remote_code: bool = False,
    initializer_range: float = 0.5,
) -> tuple[Path, str]:
    """A tiny model of `kind` (tests.tiny) as `repo_id` in the cache; `remote_code`: the custom-code XLM-R instead.

    Weights are drawn wider than transformers' default so different texts get clearly different vectors:
    rankings are then decided by margins far above float rounding, and can be recomputed exactly.
    """
    with tempfile.TemporaryDirectory(prefix="tiny-hub-model-") as scratch:
        build = save_custom_code if remote_code else functools.partial(save_tiny, kind)
        folder = build(
            Path(scratch) / "model", layers=layers, max_length=max_length, initializer_range=initializer_range
        )
        return add_repo(cache, repo_id, folder)


# ------------------------------------------------------------------------------------------------ texts


def words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(count))


@dataclass
class Passage:
    """A passage cut into three word-equal thirds, and one question per third (its first words)."""

    text: str
    thirds: tuple[str, str, str]
    questions: tuple[str, str, str]

    def span(self, third: int) -> tuple[int, int]:
        """The character span [start, end) of a third within the passage text."""
        start = len(" ".join(self.thirds[:third])) + (1 if third else 0)
        return start, start + len(self.thirds[third])


def passages(count: int, low: int, high: int, seed: int = 0, question_words: int = 6) -> list[Passage]:
    """`count` passages of `low`..`high` words (one tiny-tokenizer token each), distinct by construction."""
    rng = random.Random(seed)
    made = []
    for _ in range(count):
        size = rng.randint(low, high) // 3
        thirds = tuple(words(rng, size) for _ in range(3))
        questions = tuple(" ".join(t.split()[:question_words]) for t in thirds)
        made.append(Passage(" ".join(thirds), thirds, questions))  # type: ignore[arg-type]
    return made


# ----------------------------------------------------------------------------------------- FineWeb-PosQ


def fineweb_posq_rows(corpus: list[Passage], distractors: list[str] = ()) -> list[dict]:
    """One row per (passage, third) question in the card's columns, plus question-less corpus-only rows."""
    rows = []
    for passage in corpus:
        for third, (question, label) in enumerate(zip(passage.questions, THIRD_CLASSES)):
            rows.append(
                {
                    "question": question,
                    "content": passage.text,
                    "content_summary": " ".join(passage.text.split()[:8]),
                    "answer": question,
                    "question_level": "local",
                    "span": list(passage.span(third)),
                    "span_class": [label],
                }
            )
    for text in distractors:
        rows.append(
            {
                "question": None,
                "content": text,
                "content_summary": None,
                "answer": None,
                "question_level": None,
                "span": None,
                "span_class": None,
            }
        )
    return rows


FINEWEB_SCHEMA = pa.schema(
    [
        ("question", pa.string()),
        ("content", pa.string()),
        ("content_summary", pa.string()),
        ("answer", pa.string()),
        ("question_level", pa.string()),
        ("span", pa.list_(pa.int32())),
        ("span_class", pa.list_(pa.string())),
    ]
)


def write_fineweb_posq(folder: Path, rows: list[dict]) -> Path:
    """A local copy as `hf download NovaSearch/FineWeb-PosQ --repo-type dataset --local-dir FOLDER` leaves it."""
    (folder / "data").mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=FINEWEB_SCHEMA), folder / "data" / "train-00000-of-00001.parquet")
    (folder / "README.md").write_text("---\npretty_name: FineWeb-PosQ\n---\n", encoding="utf-8")
    return folder


def add_fineweb_posq(cache: Path, rows: list[dict]) -> tuple[Path, str]:
    """FineWeb-PosQ in the hub cache, as `hf download NovaSearch/FineWeb-PosQ --repo-type dataset` stores it."""
    with tempfile.TemporaryDirectory(prefix="tiny-hub-data-") as scratch:
        return add_repo(cache, FINEWEB_POSQ, write_fineweb_posq(Path(scratch), rows), repo_type="dataset")


# ------------------------------------------------------------------------------------------------ PosIR


def write_posir(folder: Path, corpus: dict[str, str], queries: list[dict]) -> Path:
    """One PosIR `<language>/<domain>/` folder. Each query dict: _id, text, doc, span, token_length."""
    (folder / "qrels").mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist([{"_id": d, "text": t} for d, t in corpus.items()]), folder / "corpus.parquet")
    pq.write_table(
        pa.Table.from_pylist(
            [
                {
                    "_id": q["_id"],
                    "text": q["text"],
                    "pos_char_span": list(q["span"]) if q["span"] else None,
                    "pos_char_length": len(corpus[q["doc"]]),
                    "pos_token_length": q["token_length"],
                }
                for q in queries
            ],
            schema=pa.schema(
                [
                    ("_id", pa.string()),
                    ("text", pa.string()),
                    ("pos_char_span", pa.list_(pa.int64())),
                    ("pos_char_length", pa.int64()),
                    ("pos_token_length", pa.int64()),
                ]
            ),
        ),
        folder / "queries.parquet",
    )
    pq.write_table(
        pa.Table.from_pylist([{"query-id": q["_id"], "corpus-id": q["doc"], "score": 1} for q in queries]),
        folder / "qrels" / "test.parquet",
    )
    return folder


# ------------------------------------------------------------------------------------------------- BEIR


def write_beir(folder: Path, corpus: dict[str, str], queries: dict[str, tuple[str, str]]) -> Path:
    """A BEIR folder; `queries` maps a query id to (text, relevant doc id)."""
    (folder / "qrels").mkdir(parents=True, exist_ok=True)
    (folder / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": d, "title": "", "text": t}) + "\n" for d, t in corpus.items()), encoding="utf-8"
    )
    (folder / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": q, "text": t}) + "\n" for q, (t, _) in queries.items()), encoding="utf-8"
    )
    (folder / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t1\n" for q, (_, d) in queries.items()), encoding="utf-8"
    )
    return folder


# -------------------------------------------------------------------------------------- the command line


@dataclass
class FakeHub:
    """A hub cache folder and the environment a `tune` process needs to use it offline."""

    root: Path
    revisions: dict[str, str] = field(default_factory=dict)

    @property
    def home(self) -> Path:
        return self.root / "hf"

    @property
    def cache(self) -> Path:
        return self.home / "hub"

    @property
    def tracking_uri(self) -> str:
        """One MLflow store for the runs of a test module: a new store costs seconds of schema migrations."""
        return f"sqlite:///{self.root / 'mlflow.db'}"

    def snapshot(self, repo_id: str, repo_type: str = "model") -> Path:
        return repo_folder(self.cache, repo_id, repo_type) / "snapshots" / self.revisions[repo_id]

    def add_model(self, repo_id: str, kind: str, **options: object) -> Path:
        snapshot, self.revisions[repo_id] = add_tiny_model(self.cache, repo_id, kind, **options)  # type: ignore[arg-type]
        return snapshot

    def add_fineweb_posq(self, rows: list[dict]) -> Path:
        snapshot, self.revisions[FINEWEB_POSQ] = add_fineweb_posq(self.cache, rows)
        return snapshot

    def env(self, **extra: str) -> dict[str, str]:
        """This process's environment, pointed at the fake hub, offline, with caches under `root`."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_", "TRANSFORMERS_"))}
        env.update(
            HF_HOME=str(self.home),
            HF_HUB_CACHE=str(self.cache),
            HF_HUB_OFFLINE="1",
            HF_DATASETS_OFFLINE="1",
            POSFAIR_CACHE_DIR=str(self.root / "posfair-cache"),
            TOKENIZERS_PARALLELISM="false",
            OMP_NUM_THREADS="1",
            MKL_NUM_THREADS="1",  # tiny models: threads only add contention
            COLUMNS="200",
        )
        env.update(extra)
        return env


def tune_command() -> list[str]:
    """The installed `tune` console script next to this interpreter, else the same entry point as a module."""
    script = Path(sys.executable).with_name("tune")
    return [str(script)] if script.exists() else [sys.executable, "-m", "tuner.cli"]


def run_tune(hub: FakeHub, *args: str, cwd: Path, timeout: float = 600, **env: str) -> subprocess.CompletedProcess[str]:
    """`tune ARGS...` as a user runs it, in `cwd`, offline against the fake hub; output is text."""
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        [*tune_command(), *args],
        cwd=cwd,
        env=hub.env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def use_in_this_process(hub: FakeHub, monkeypatch) -> FakeHub:
    """Point this (already started) process at the fake hub, as HF_HUB_CACHE and HF_HOME do for a new one.

    Commands that need no fresh process then run here through typer's CliRunner with their real argv
    (`tune_here`), which saves a Python start (~10 s of imports) per command.
    """
    import huggingface_hub.constants
    import transformers.dynamic_module_utils

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hub.cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(transformers.dynamic_module_utils, "HF_MODULES_CACHE", str(hub.home / "modules"))  # remote code
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("POSFAIR_CACHE_DIR", str(hub.root / "posfair-cache"))
    return hub


def tune_here(*args: str, expect: int = 0) -> str:
    """`tune ARGS...` in this process (see `use_in_this_process`); its output, whitespace-folded."""
    from typer.testing import CliRunner

    from tuner.cli.app import app

    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == expect, f"exit {result.exit_code}\n{result.output[-6000:]}\n{result.exception!r}"
    return " ".join(result.output.split())
