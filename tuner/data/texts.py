"""Texts to encode (`tune encode --input`): JSON Lines with a 'text' per line, or plain text, one per line.

JSON Lines are told by the name (`.jsonl`, `.ndjson`, in any case, optionally `.gz`); any other name is
plain text. Errors name the file and line; nothing is guessed from content.
"""

from __future__ import annotations

import json
from pathlib import Path

from tuner.common.messages import shown
from tuner.data.jsonl import read_text

JSONL_SUFFIXES = (".jsonl", ".ndjson")


def is_jsonl(path: Path) -> bool:
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] == ".gz":
        suffixes = suffixes[:-1]
    return bool(suffixes) and suffixes[-1] in JSONL_SUFFIXES


def read_texts(path: Path) -> list[str]:
    """The texts of `path` in order; an empty file, a folder, a line without a string 'text' is an error."""
    if path.is_dir():
        raise ValueError(f"--input {path} is a folder; give a .jsonl file ({{\"text\": ...}} per line) or a .txt file")
    if not path.is_file():
        raise FileNotFoundError(f"--input {path}: no such file")
    lines = read_text(path).splitlines()
    if not is_jsonl(path):
        texts = [line for line in lines if line.strip()]
    else:
        texts = []
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                raise ValueError(f"{path}:{number}: not valid JSON; write one JSON object with a 'text' field per line") from None
            text = record.get("text") if isinstance(record, dict) else None
            if not isinstance(text, str):
                got = shown(record) if not isinstance(record, dict) else f"'text' {shown(text)}"
                raise ValueError(f"{path}:{number}: expected a JSON object with a string 'text' field, got {got}")
            texts.append(text)
    if not texts:
        raise ValueError(f"--input {path} holds no texts")
    return texts
