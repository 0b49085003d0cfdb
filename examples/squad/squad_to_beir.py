"""Turn a SQuAD-format JSON file into a BEIR folder: each paragraph a passage, each answerable question a query judged
relevant to its own paragraph. The example of docs/probe.md: the shape a user's own retrieval set takes for
`tune ... --dataset probe:FOLDER`.

    python examples/squad/squad_to_beir.py SQUAD.json FOLDER

FOLDER gets corpus.jsonl ({"_id", "title", "text"}), queries.jsonl ({"_id", "text"}) and qrels/test.tsv
(query-id, corpus-id, score). Unanswerable questions (SQuAD 2.0's `is_impossible`) are left out: they have no
answer in their paragraph. Titles are left empty, so a passage is its paragraph as written. Nothing of posfair is
imported: this is the user's side of the format.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def convert(squad: Path, folder: Path) -> tuple[int, int]:
    """Write the BEIR folder; returns (passages, queries)."""
    articles = json.loads(squad.read_text(encoding="utf-8"))["data"]
    (folder / "qrels").mkdir(parents=True, exist_ok=True)
    passages = queries = 0
    with (
        (folder / "corpus.jsonl").open("w", encoding="utf-8") as corpus,
        (folder / "queries.jsonl").open("w", encoding="utf-8") as asked,
        (folder / "qrels" / "test.tsv").open("w", encoding="utf-8") as qrels,
    ):
        qrels.write("query-id\tcorpus-id\tscore\n")
        for a, article in enumerate(articles):
            for p, paragraph in enumerate(article["paragraphs"]):
                doc_id = f"a{a:03d}p{p:03d}"
                passage = {"_id": doc_id, "title": "", "text": paragraph["context"]}
                corpus.write(json.dumps(passage, ensure_ascii=False) + "\n")
                passages += 1
                for qa in paragraph["qas"]:
                    if qa.get("is_impossible") or not qa.get("answers"):
                        continue
                    asked.write(json.dumps({"_id": qa["id"], "text": qa["question"]}, ensure_ascii=False) + "\n")
                    qrels.write(f"{qa['id']}\t{doc_id}\t1\n")
                    queries += 1
    return passages, queries


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__.split("\n\n")[1])
    made = convert(Path(sys.argv[1]), Path(sys.argv[2]))
    print(f"{sys.argv[2]}: {made[0]} passages, {made[1]} queries")
