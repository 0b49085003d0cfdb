"""FineWeb-PosQ (Zeng et al., 2025): the benchmark the paper selects its configuration on.

13,902 FineWeb-edu passages of 500-1,024 words, each cut into beginning / middle / end segments, with
GPT-4o-mini questions written for one segment (`span_class`). This loader follows the authors' evaluation
script (NovaSearch-Team/position-bias-in-IR, exp_FineWeb-PosQ.py) so numbers stay comparable:

- corpus: every distinct `content`, with ids d00000... in sorted-text order (the script's passage2id); rows
  without a question add their content to the corpus only;
- a question's relevant passage is its row's `content` (a question repeated in several rows keeps the
  content of its last row, as the script's dict does); one query per distinct question;
- groups: `span_class` values containing "beginning" / "middle" / "end" map to begin / middle / end (the
  script tests by substring, so a multi-segment label puts its query in several groups);
- `sample_per_group=1000` (default) is the script's `--query_sampling`: shuffle the (question, span_class)
  rows with `random.seed(42)`, take the first 1,000 per group, drop repeated questions. `None` keeps every
  question (25,775; slow to encode on a CPU).

Query ids are `q` + 12 hex digits of the question's SHA-1, so a question keeps its id across samples.

Tuning and reporting on the same queries overstates a configuration, so `part="tune"` / `"heldout"` splits
the selected queries BY PASSAGE (queries follow their passage, as in WikiPos): a seeded shuffle of the
relevant passages puts round(holdout_fraction * n) of them in the held-out part. Both parts search the full
corpus.

Source: the Hub id (default) or a local copy, a file or folder of parquet / jsonl / csv files, e.g. made
with `hf download NovaSearch/FineWeb-PosQ --repo-type dataset --local-dir DIR`. Offline without a local
copy the loader fails at once with instructions rather than retrying the network.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import random
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from tuner.data.dataset import DatasetUnavailableError, PositionalDataset

if TYPE_CHECKING:
    import datasets

HUB_ID = "NovaSearch/FineWeb-PosQ"
REQUIRED_COLUMNS: tuple[str, ...] = ("question", "content", "span_class")
SPAN_GROUPS: tuple[tuple[str, str], ...] = (("beginning", "begin"), ("middle", "middle"), ("end", "end"))
PARTS: tuple[str, ...] = ("all", "tune", "heldout")
BUILDERS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".csv": "csv"}

DOWNLOAD_HINT = (
    "Download it where the Hub is reachable:\n"
    "    hf download NovaSearch/FineWeb-PosQ --repo-type dataset\n"
    "into the Hugging Face cache (copy ~/.cache/huggingface/hub here; `fineweb-posq` then finds it), or\n"
    "    hf download NovaSearch/FineWeb-PosQ --repo-type dataset --local-dir ./FineWeb-PosQ\n"
    "and pass the folder: --dataset fineweb-posq:./FineWeb-PosQ (load_benchmark('fineweb-posq:./FineWeb-PosQ')). "
    "Older huggingface_hub: `huggingface-cli download` with the same arguments."
)


def load_fineweb_posq(
    source: str | Path | None = None,
    *,
    sample_per_group: int | None = 1000,
    seed: int = 42,
    part: str = "all",
    holdout_fraction: float = 0.5,
    holdout_seed: int = 0,
    cache_dir: str | None = None,
    name: str | None = None,
) -> PositionalDataset:
    """Load FineWeb-PosQ from the Hub or a local copy; see the module docstring for every option."""
    if part not in PARTS:
        raise ValueError(f"unknown part {part!r}; valid parts: {', '.join(PARTS)}")
    if part != "all" and not 0.0 < holdout_fraction < 1.0:
        raise ValueError(f"holdout_fraction must be between 0 and 1 (exclusive) to split, got {holdout_fraction}")
    if sample_per_group is not None and sample_per_group < 1:
        raise ValueError(f"sample_per_group must be a positive number or None (all queries), got {sample_per_group}")

    where = str(source or HUB_ID)
    rows = read_rows(source, cache_dir)
    missing = [column for column in REQUIRED_COLUMNS if column not in rows.column_names]
    if missing:
        raise ValueError(
            f"FineWeb-PosQ source {where} lacks required column(s) {missing} (columns: {rows.column_names}); "
            f"it must have {', '.join(REQUIRED_COLUMNS)}"
        )
    table = rows.select_columns(list(REQUIRED_COLUMNS)).to_dict()
    dataset = assemble(table["question"], table["content"], table["span_class"], sample_per_group, seed, where)
    if part != "all":
        dataset = split_by_passage(dataset, part, holdout_fraction, holdout_seed)
    return dataset if name is None else dataclasses.replace(dataset, name=name)


def assemble(
    questions: list[Any],
    contents: list[str],
    span_classes: list[Any],
    sample_per_group: int | None,
    seed: int,
    where: str,
) -> PositionalDataset:
    """The dataset from the three columns, with the authors' corpus ids, relevance and query sampling."""
    passages = sorted(set(contents))
    width = len(str(max(len(passages) - 1, 0)))
    doc_ids = {text: f"d{index:0{width}d}" for index, text in enumerate(passages)}
    relevant: dict[str, str] = {}
    pairs: list[tuple[str, str]] = []
    for question, content, span_class in zip(questions, contents, span_classes, strict=True):
        if question:
            relevant[question] = content
            pairs.append((question, span_class or ""))

    if sample_per_group is not None:
        shuffled = list(pairs)
        random.Random(seed).shuffle(shuffled)
        pairs = [p for keyword, _ in SPAN_GROUPS for p in [q for q in shuffled if keyword in q[1]][:sample_per_group]]
    selected: dict[str, str] = {}
    for question, span_class in pairs:
        selected.setdefault(question, span_class)  # a repeated question keeps its first (sampled) row

    queries: dict[str, str] = {}
    qrels: dict[str, dict[str, int]] = {}
    groups: dict[str, tuple[str, ...]] = {}
    for question, span_class in selected.items():
        labels = tuple(group for keyword, group in SPAN_GROUPS if keyword in span_class)
        if not labels:
            raise ValueError(
                f"FineWeb-PosQ source {where}: span_class {span_class!r} of question {question[:60]!r} names none "
                "of beginning / middle / end"
            )
        qid = "q" + hashlib.sha1(question.encode("utf-8")).hexdigest()[:12]
        queries[qid] = question
        qrels[qid] = {doc_ids[relevant[question]]: 1}
        groups[qid] = labels
    return PositionalDataset(
        name="fineweb-posq",
        corpus={doc_id: text for text, doc_id in doc_ids.items()},
        queries=queries,
        qrels=qrels,
        groups=groups,
        group_order=tuple(group for _, group in SPAN_GROUPS),
    )


def split_by_passage(dataset: PositionalDataset, part: str, holdout_fraction: float, seed: int) -> PositionalDataset:
    """The tune or held-out part: a seeded share of the relevant passages, with all of their queries."""
    passages = sorted({doc for judged in dataset.qrels.values() for doc in judged})
    random.Random(seed).shuffle(passages)
    heldout = set(passages[: round(holdout_fraction * len(passages))])
    qids = [qid for qid, judged in dataset.qrels.items() if (not heldout.isdisjoint(judged)) == (part == "heldout")]
    return dataset.subset(qids, name=f"{dataset.name}-{part}")


def check_available(source: str | Path | None = None) -> None:
    """Fail at once, reading nothing, when FineWeb-PosQ cannot be had from here (a local copy, the local Hugging
    Face cache, or a reachable Hub), so a run that needs it stops before any other work."""
    if source is not None and str(source) != HUB_ID:
        if not Path(source).exists():
            raise FileNotFoundError(
                f"FineWeb-PosQ source {source} does not exist; pass a local file or folder, or no source for the Hub"
            )
        return
    if cached_snapshot(HUB_ID) is None and (offline_mode() or not hub_reachable()):
        raise DatasetUnavailableError(
            f"dataset {HUB_ID!r} is not in the local Hugging Face cache and the hub cannot be reached from here. "
            f"{DOWNLOAD_HINT}"
        )


def read_rows(source: str | Path | None, cache_dir: str | None) -> datasets.Dataset:
    """The `train` rows of a local file or folder, or of the Hub dataset (a local path of that name wins)."""
    if source is not None and Path(source).exists():
        return read_local(Path(source), cache_dir)
    if source is None or str(source) == HUB_ID:
        return read_hub(HUB_ID, cache_dir)
    raise FileNotFoundError(
        f"FineWeb-PosQ source {source} does not exist; pass a local file or folder, or no source for the Hub"
    )


def read_local(path: Path, cache_dir: str | None) -> datasets.Dataset:
    """Rows of a parquet/jsonl/csv file, or of all such files under a folder (parquet preferred)."""
    import datasets

    files = [path] if path.is_file() else data_files(path)
    kinds = {BUILDERS.get(_suffix(f)) for f in files} - {None}
    if not kinds:
        raise FileNotFoundError(f"FineWeb-PosQ source {path} holds no .parquet, .jsonl, .json or .csv file")
    builder = next(kind for kind in ("parquet", "json", "csv") if kind in kinds)
    chosen = [str(f) for f in files if BUILDERS.get(_suffix(f)) == builder]
    return datasets.load_dataset(builder, data_files=chosen, split="train", cache_dir=cache_dir)


def data_files(folder: Path) -> list[Path]:
    """Data files under a folder, skipping hidden folders such as the `.cache` that `hf download` leaves."""
    return sorted(
        f
        for f in folder.rglob("*")
        if f.is_file() and _suffix(f) in BUILDERS and not any(p.startswith(".") for p in f.relative_to(folder).parts)
    )


def _suffix(path: Path) -> str:
    """The data suffix of a file, looking through a trailing .gz (rows.jsonl.gz -> .jsonl)."""
    suffixes = [s for s in path.suffixes if s != ".gz"]
    return suffixes[-1] if suffixes else ""


def read_hub(hub_id: str, cache_dir: str | None) -> datasets.Dataset:
    """The Hub dataset, or a previously downloaded snapshot when offline; never a slow retry loop."""
    import datasets

    offline = offline_mode()
    if offline or not hub_reachable():
        snapshot = cached_snapshot(hub_id)
        if snapshot is not None:
            return read_local(snapshot, cache_dir)
        if not offline:
            raise DatasetUnavailableError(f"FineWeb-PosQ: the Hugging Face Hub is not reachable. {DOWNLOAD_HINT}")
    try:
        return datasets.load_dataset(hub_id, split="train", cache_dir=cache_dir)
    except Exception as error:  # the Hub and datasets raise many kinds; all mean "not here"
        message = f"FineWeb-PosQ could not be loaded from {hub_id}: {error}. {DOWNLOAD_HINT}"
        raise DatasetUnavailableError(message) from error


def offline_mode() -> bool:
    """Whether HF_HUB_OFFLINE asks the Hub libraries to stay offline."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


def hub_reachable(timeout: float = 3.0) -> bool:
    """A quick TCP probe of the Hub endpoint, so an offline machine fails in seconds, not after retries."""
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True  # a proxy decides reachability; let the Hub client try
    endpoint = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        with socket.create_connection((endpoint.hostname or "huggingface.co", port), timeout=timeout):
            return True
    except OSError:
        return False


def cached_snapshot(hub_id: str) -> Path | None:
    """The folder of a snapshot already in the local Hugging Face cache, if any (no network)."""
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(hub_id, repo_type="dataset", local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached, or an unusable cache: the caller explains how to download
        return None
