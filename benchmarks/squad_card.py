"""The cards of the natural SQuAD sets and of a probe built from SQuAD's paragraphs: what each holds, what was left out
and why, and whether every passage fits the models it is sized for.

Run from the repository root (the SQuAD 2.0 dev set is fetched on first use; a minute of CPU):

    .venv/bin/python -m benchmarks.squad_card            # → docs/results/squad-card.json

1. `squad-tune` and `squad-test` (`tuner.data.squad`): articles, paragraphs, windows, questions kept and left out
   (unanswerable, in a paragraph too long for a window, answer not at its offset, ambiguous), per third and fifth,
   tokens per window.
2. The probe (`tuner.data.probe`) built from SQuAD's paragraphs as a user's retrieval set: each answerable question
   judged relevant to its own paragraph, written as a BEIR folder by `examples/squad/squad_to_beir.py`, exactly as
   docs/probe.md walks a user through it.
3. Every window of both, counted with all-mpnet-base-v2's own tokenizer too (when its packages are installed: `make
   mpnet`), to check the claim that a window sized in MiniLM tokens fits MPNet's 512 positions as well.
"""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks import record

CONVERTER = record.ROOT / "examples" / "squad" / "squad_to_beir.py"
PROBE_FOLDER = "squad-paragraphs"


def mpnet_longest(texts: list[str]) -> int | None:
    """The most all-mpnet-base-v2 tokens ([CLS] and [SEP] included) of any text, or None without its packages."""
    from transformers import AutoTokenizer

    from tuner.engine.packaged import MPNET

    folder = MPNET.folder()
    if folder is None:
        return None
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    return max(len(ids) for ids in tokenizer(texts, verbose=False)["input_ids"])


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, default=record.RESULTS / "squad-card.json", help="where the record goes")
    args = parser.parse_args(argv)

    from tuner.data.beir import load_beir
    from tuner.data.probe import load_probe_card
    from tuner.data.registry import dataset_files
    from tuner.data.squad import DIGEST, MEMBER, NAMES, PACKAGE, VERSION, build_squad, squad_file

    source = squad_file()
    splits = {name: build_squad(source, part=part, name=name) for name, part in NAMES.items()}
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch) / PROBE_FOLDER
        command = [sys.executable, str(CONVERTER), str(source), str(folder)]
        converted = subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip()
        probe = load_probe_card(folder, partial(load_beir, folder), dataset_files(str(folder)))
    texts = {name: list(built.dataset.corpus.values()) for name, built in splits.items()}
    texts["probe"] = list(probe.dataset.corpus.values())
    results: dict[str, Any] = {
        "source": {"package": f"{PACKAGE}=={VERSION}", "member": MEMBER, "sha256": DIGEST},
        "splits": {name: dataclasses.asdict(built.card) for name, built in splits.items()},
        "probe": dataclasses.asdict(probe.card) | {"converter": converted.replace(str(folder), PROBE_FOLDER)},
        "mpnet_tokens_max": {name: mpnet_longest(passages) for name, passages in texts.items()},
    }
    command = " ".join([".venv/bin/python -m benchmarks.squad_card", *(sys.argv[1:] if argv is None else argv)])
    record.write(args.json, "squad_card", command, results)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
