"""A position probe built from a user's own retrieval set: each query's relevant passage packed at the beginning, in
the middle or at the end of a window of other passages from the same corpus.

Why: a user's data has no position labels, so whether a calibration helps there cannot be measured as it is. When
its relevant passages are short, they can be moved: packed among passages that are not relevant to the query, at a
known place, the way WikiPos's packed structure re-packs its summaries. The questions stay the user's, the text
stays the corpus's; only where the answer sits is set.

Input: a JSONL folder (`tuner.data.jsonl`) or a BEIR folder (`tuner.data.beir`). Construction (seeded, `seed=0`):

1. **Usable queries**: those with exactly one relevant passage (relevance > 0; others: `several_relevant`) that is
   short: at most `max_share` (a third) of the window's `CONTENT_TOKENS` all-MiniLM-L6-v2 tokens (others:
   `long_relevant`), so it can sit in one third of a window. Their passages are the **asked** passages.
2. **Distractor pool**: every other passage of the corpus, except those whose text equals an asked passage's. When
   the pool is smaller than the asked set (a QA set where every passage has questions), a seeded selection of
   (asked + pool) // 2 passages stays asked and the rest join the pool; their queries are left out (`pooled`).
3. **Packing**: for each asked passage, up to `DRAWS` pool passages drawn at random (never one twice in a window;
   one may serve several windows) join while the window stays within `CONTENT_TOKENS` (512 with [CLS] and [SEP],
   so MiniLM and MPNet read it whole); passages are joined by a blank line. A window with fewer than
   `MIN_DISTRACTORS` distractors is dropped with its queries (`unpacked`).
4. **Groups**: the asked passage can go first, last, or into the slot with a distractor on each side that puts its
   midpoint nearest the window's (in the drawn order or its reverse); each arrangement's group is the third holding
   the passage's character midpoint (`span_third`, as WikiPos labels). The windows, those with most queries first
   (ties in a seeded order), each take the group with the fewest queries so far among those they can make, so the
   groups' sizes differ by at most one window's queries. A query's position is that midpoint.

The probe is refused with the reason and the fix (`ProbeError`) when no query has a short relevant passage, when
the pool is smaller than `MIN_POOL`, or when a group holds fewer than `min_group_queries` queries. A built probe is
cached in posfair's data home (`$POSFAIR_DATA_DIR`, `probes/`) under a fingerprint of its source files and options,
written whole or not at all; changing a file or an option builds a new one.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import random
import statistics
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from tuner.common.cache_home import data_home
from tuner.common.files import write_atomically
from tuner.common.messages import UserError
from tuner.data.dataset import THIRDS, PositionalDataset, span_midpoint, span_third
from tuner.data.tokens import MAX_TOKENS, SPECIAL_TOKENS, TOKENIZER, Tokenize, minilm_token_counter

SEPARATOR = "\n\n"
MAX_SHARE = 1 / 3
"""The most of a window's content tokens an asked passage may take: a third, so it fits one position group."""
MIN_DISTRACTORS = 2
"""A window holds at least this many other passages, so the middle has one on each side."""
MIN_POOL = 20
"""Distractor passages a probe needs at the least, so windows do not all repeat the same few."""
MIN_GROUP_QUERIES = 30
"""Queries each group needs at the least: with fewer, a group's nDCG@10 moves by tens of points with one query."""
DRAWS = 64
"""Pool passages tried per window: enough to fill it, few enough that a large corpus is not read whole."""
VERSION = 1
"""The construction's version: part of the fingerprint, so a cached probe of an older construction is rebuilt."""


class ProbeError(UserError, ValueError):
    """The retrieval set cannot make a probe; the message says why and what to change."""


@dataclass(frozen=True)
class ProbeCard:
    """What the probe holds and what was left out, step by step (module docstring)."""

    name: str
    seed: int
    max_tokens: int
    tokenizer: str
    passages: int  # in the source's corpus
    queries: int  # in the source
    short_tokens: int  # the most an asked passage may have
    several_relevant: int
    long_relevant: int
    pooled: int
    unpacked: int
    kept: int
    asked_passages: int
    pool_passages: int
    groups: dict[str, int] = field(default_factory=dict)
    tokens_min: int = 0  # per window, [CLS] and [SEP] included
    tokens_median: float = 0
    tokens_max: int = 0
    distractors_min: int = 0
    distractors_median: float = 0
    distractors_max: int = 0


@dataclass(frozen=True)
class Probe:
    """A built probe and its card."""

    dataset: PositionalDataset
    card: ProbeCard


@dataclass(frozen=True)
class ProbeOptions:
    """What a probe is built with: part of its fingerprint."""

    seed: int = 0
    max_tokens: int = MAX_TOKENS
    max_share: float = MAX_SHARE
    min_group_queries: int = MIN_GROUP_QUERIES

    @property
    def budget(self) -> int:
        return self.max_tokens - SPECIAL_TOKENS

    @property
    def short(self) -> int:
        """The most tokens an asked passage may have."""
        return int(self.budget * self.max_share)


# ------------------------------------------------------------------------------------------------ building


def build_probe(
    source: PositionalDataset, name: str, options: ProbeOptions = ProbeOptions(), count_tokens: Tokenize | None = None
) -> Probe:
    """The probe of a retrieval set (module docstring); `count_tokens` defaults to all-MiniLM-L6-v2's."""
    count = _memo(count_tokens or minilm_token_counter())
    rng = random.Random(options.seed)
    relevant_to = {q: [d for d, grade in source.qrels[q].items() if grade > 0] for q in source.queries}
    single = {q: docs[0] for q, docs in relevant_to.items() if len(docs) == 1}
    if not single:
        raise ProbeError(
            f"{name}: no query has exactly one relevant passage, so no answer has one place to be moved to; a probe "
            "needs queries judged relevant to one short passage each (qrels with one relevance > 0 per query)"
        )
    relevant = sorted(set(single.values()))
    tokens = dict(zip(relevant, count([source.corpus[d] for d in relevant])))
    short = {q: d for q, d in single.items() if tokens[d] <= options.short}
    if not short:
        lengths = sorted(tokens.values())
        raise ProbeError(
            f"{name}: no relevant passage is short enough to pack: a probe moves a query's passage within a window of "
            f"{options.max_tokens} tokens, so it may hold at most {options.short} (a third of the window); the "
            f"{len(lengths)} relevant passages have {lengths[0]}-{lengths[-1]} all-MiniLM-L6-v2 tokens (median "
            f"{statistics.median(lengths):g}). Judge shorter passages: split the documents into paragraphs and judge "
            "the paragraph that answers each query"
        )
    asked = sorted(set(short.values()))
    asked_texts = {source.corpus[d] for d in asked}
    pool = [d for d in source.corpus if source.corpus[d] not in asked_texts]  # never an asked passage, nor its twin
    if len(pool) < len(asked):  # step 2: a seeded half stays asked
        rng.shuffle(asked)
        keep = (len(asked) + len(pool)) // 2
        pool += asked[keep:]
        asked = sorted(asked[:keep])
    if len(pool) < MIN_POOL:
        raise ProbeError(
            f"{name}: only {len(pool)} passages of the corpus can be distractors (the others are the queries' own); a "
            f"probe packs each relevant passage among at least {MIN_DISTRACTORS} others drawn from at least "
            f"{MIN_POOL}: "
            "add passages to the corpus (any that answer none of these queries)"
        )
    kept_asked = set(asked)
    by_passage: dict[str, list[str]] = {}
    for q, d in short.items():
        by_passage.setdefault(d, []).append(q)
    windows: dict[str, dict[str, tuple[str, int]]] = {}
    distractor_counts = []
    for d in asked:
        chosen = _draw(rng, pool, count, source.corpus, options.budget - tokens[d])
        if len(chosen) >= MIN_DISTRACTORS:
            windows[d] = _arrangements(source.corpus[d], [source.corpus[x] for x in chosen])
            distractor_counts.append(len(chosen))

    corpus: dict[str, str] = {}
    queries: dict[str, str] = {}
    qrels: dict[str, dict[str, int]] = {}
    groups: dict[str, tuple[str, ...]] = {}
    positions: dict[str, float] = {}
    filled = dict.fromkeys(THIRDS, 0)
    for d in sorted(windows, key=lambda d: (-len(by_passage[d]), rng.random())):  # step 3: most queries first
        group = min(windows[d], key=lambda g: (filled[g], THIRDS.index(g)))
        text, start = windows[d][group]
        filled[group] += len(by_passage[d])
        corpus[f"pack:{d}"] = text
        for q in by_passage[d]:
            queries[q], qrels[q], groups[q] = source.queries[q], {f"pack:{d}": 1}, (group,)
            positions[q] = span_midpoint(start, start + len(source.corpus[d]), len(text))
    window_tokens = [n + SPECIAL_TOKENS for n in count(list(corpus.values()))]
    if any(n > options.max_tokens for n in window_tokens):  # counts that do not add up over joined passages
        raise AssertionError(f"probe windows over {options.max_tokens} tokens: {max(window_tokens)}")
    sizes = Counter(label for (label,) in groups.values())
    card = ProbeCard(
        name=name,
        seed=options.seed,
        max_tokens=options.max_tokens,
        tokenizer=TOKENIZER if count_tokens is None else "given",
        passages=len(source.corpus),
        queries=len(source.queries),
        short_tokens=options.short,
        several_relevant=len(source.queries) - len(single),
        long_relevant=len(single) - len(short),
        pooled=sum(len(qs) for d, qs in by_passage.items() if d not in kept_asked),
        unpacked=sum(len(by_passage[d]) for d in asked if d not in windows),
        kept=len(queries),
        asked_passages=len(corpus),
        pool_passages=len(pool),
        groups={g: sizes[g] for g in THIRDS},
        tokens_min=min(window_tokens, default=0),
        tokens_median=statistics.median(window_tokens) if window_tokens else 0,
        tokens_max=max(window_tokens, default=0),
        distractors_min=min(distractor_counts, default=0),
        distractors_median=statistics.median(distractor_counts) if distractor_counts else 0,
        distractors_max=max(distractor_counts, default=0),
    )
    fewest = min(THIRDS, key=lambda g: sizes[g])
    if sizes[fewest] < options.min_group_queries:
        raise ProbeError(
            f"{name}: the probe holds {sizes[fewest]} queries in group {fewest!r} "
            f"({', '.join(f'{g} {sizes[g]}' for g in THIRDS)}); each group needs at least {options.min_group_queries} "
            f"for its nDCG@10 to mean something. Of {card.queries} queries, {card.long_relevant} have a relevant "
            "passage "
            f"over {options.short} tokens, {card.several_relevant} more or fewer than one relevant passage, "
            f"{card.pooled + card.unpacked} found no room: add queries whose one relevant passage is short"
        )
    dataset = PositionalDataset(name, corpus, queries, qrels, groups, THIRDS, positions=positions)
    return Probe(dataset, card)


def _memo(count: Tokenize) -> Tokenize:
    """`count` remembering each text's count, so a passage drawn for many windows is counted once."""
    known: dict[str, int] = {}

    def counted(texts: list[str]) -> list[int]:
        new = list(dict.fromkeys(t for t in texts if t not in known))
        known.update(zip(new, count(new)))
        return [known[t] for t in texts]

    return counted


def _draw(rng: random.Random, pool: list[str], count: Tokenize, corpus: dict[str, str], room: int) -> list[str]:
    """Distractors for one window, in the order drawn: up to `DRAWS` pool passages, each kept if it fits, and until
    `MIN_DISTRACTORS` are in, only if it leaves an equal share of the room to each one still missing."""
    candidates = rng.sample(pool, min(DRAWS, len(pool)))
    chosen: list[str] = []
    for doc, size in zip(candidates, count([corpus[c] for c in candidates])):
        if size <= room // max(MIN_DISTRACTORS - len(chosen), 1):
            chosen.append(doc)
            room -= size
    return chosen


def _arrangements(asked: str, others: list[str]) -> dict[str, tuple[str, int]]:
    """The windows the asked passage can make with `others` (step 4), by the group that holds its midpoint
    (`span_third`): label -> (the window's text, where the passage starts in it). First and last; and, of the slots
    with a distractor on each side, in the drawn order or its reverse, the one nearest the middle."""
    total = sum(map(len, others)) + len(asked) + len(SEPARATOR) * len(others)

    def start(order: list[str], slot: int) -> int:
        return sum(len(t) + len(SEPARATOR) for t in order[:slot])

    middle = [(order, slot) for order in (others, others[::-1]) for slot in range(1, len(others))]
    nearest = sorted(middle, key=lambda c: abs((start(*c) + len(asked) / 2) / total - 0.5))[:1]
    found: dict[str, tuple[str, int]] = {}
    for order, slot in [(others, 0), (others, len(others)), *nearest]:
        begins = start(order, slot)
        window = SEPARATOR.join([*order[:slot], asked, *order[slot:]])
        found.setdefault(span_third(begins, begins + len(asked), total), (window, begins))
    return found


# ------------------------------------------------------------------------------------------------ loading


def fingerprint(files: Sequence[Path], options: ProbeOptions) -> str:
    """A hash of the source files' names and bytes and of the build options (and the construction's version)."""
    digest = hashlib.sha256(json.dumps({"version": VERSION, **asdict(options)}, sort_keys=True).encode())
    found = [p for f in files for p in ([f] if f.is_file() else sorted(f.rglob("*")) if f.is_dir() else [])]
    for path in sorted(p for p in found if p.is_file()):
        digest.update(f"\0{path.name}\0".encode())
        with path.open("rb") as stream:
            while chunk := stream.read(2**20):
                digest.update(chunk)
    return digest.hexdigest()[:16]


def cache_path(folder: Path, files: Sequence[Path], options: ProbeOptions) -> Path:
    """Where the probe of `folder`'s files with `options` is kept."""
    return data_home() / "probes" / f"{folder.resolve().name}-{fingerprint(files, options)}.json.gz"


def load_probe(
    folder: Path,
    read: Callable[[], PositionalDataset],
    files: Sequence[Path],
    *,
    name: str | None = None,
    count_tokens: Tokenize | None = None,
    **options: Any,
) -> PositionalDataset:
    """`probe:PATH`: the probe of the retrieval set `read` loads from `folder` (whose files are `files`), from the
    cache when it was built before from the same bytes with the same options. `options`: `ProbeOptions`' fields."""
    return load_probe_card(folder, read, files, name=name, count_tokens=count_tokens, **options).dataset


def load_probe_card(
    folder: Path,
    read: Callable[[], PositionalDataset],
    files: Sequence[Path],
    *,
    name: str | None = None,
    count_tokens: Tokenize | None = None,
    **options: Any,
) -> Probe:
    """`load_probe`, with the probe's card."""
    unknown = sorted(set(options) - {f.name for f in fields(ProbeOptions)})
    if unknown:
        valid = ", ".join(f.name for f in fields(ProbeOptions))
        raise ValueError(f"probe options {unknown} are unknown; valid: {valid}")
    settings = ProbeOptions(**options)
    name = name or f"probe:{folder.resolve().name}"
    path = cache_path(folder, files, settings)
    cached = _read_cache(path, name) if count_tokens is None else None
    if cached is not None:
        return cached
    probe = build_probe(read(), name, settings, count_tokens)
    if count_tokens is None:  # a probe counted in other tokens is not the one the fingerprint names
        path.parent.mkdir(parents=True, exist_ok=True)
        payload = {"dataset": asdict(probe.dataset), "card": asdict(probe.card)}
        write_atomically(path, gzip.compress(json.dumps(payload, ensure_ascii=False).encode("utf-8"), mtime=0))
    return probe


def _read_cache(path: Path, name: str) -> Probe | None:
    """The cached probe at `path` under `name`, or None when there is none (or it cannot be read: it is rebuilt)."""
    try:
        payload = json.loads(gzip.decompress(path.read_bytes()))
        data = payload["dataset"]
        dataset = PositionalDataset(
            name=name,
            corpus=data["corpus"],
            queries=data["queries"],
            qrels=data["qrels"],
            groups={q: tuple(labels) for q, labels in data["groups"].items()},
            group_order=tuple(data["group_order"]),
            positions=data["positions"],
        )
        return Probe(dataset, ProbeCard(**{**payload["card"], "name": name}))
    except (OSError, EOFError, ValueError, KeyError, TypeError):  # none yet, or damaged: built again and replaced
        return None
