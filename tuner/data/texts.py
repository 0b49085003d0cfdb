"""Texts to encode (`tune encode --input`): JSON Lines with a 'text' per line, or plain text, one per line.

JSON Lines are told by the name (`.jsonl`, `.ndjson`, in any case, optionally `.gz`); any other name is
plain text. Errors name the file and line; nothing is guessed from content.
"""

from __future__ import annotations

from pathlib import Path

from tuner.common.messages import shown
from tuner.data.jsonl import lines_of, parse_json_line, read_text

JSONL_SUFFIXES = (".jsonl", ".ndjson")


def is_jsonl(path: Path) -> bool:
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] == ".gz":
        suffixes = suffixes[:-1]
    return bool(suffixes) and suffixes[-1] in JSONL_SUFFIXES


def read_texts(path: Path) -> list[str]:
    """The texts of `path` in order, one per output row; an empty file, a folder, a line without a string
    'text' is an error. Plain text is split on "\n" only (`lines_of`), and a blank line is refused, never
    dropped: row k of the output is line k. In JSON Lines a blank line is no record and is skipped."""
    if path.is_dir():
        raise ValueError(f'--input {path} is a folder; give a .jsonl file ({{"text": ...}} per line) or a .txt file')
    if not path.is_file():
        raise FileNotFoundError(f"--input {path}: no such file")
    lines = lines_of(read_text(path))
    if not any(line.strip() for line in lines):
        raise ValueError(f"--input {path} holds no texts")
    texts = []
    for number, line in enumerate(lines, 1):
        if not is_jsonl(path):
            if not line.strip():
                raise ValueError(
                    f"{path}:{number}: a blank line; each line is one text (row {number} of the output), so "
                    'remove it, or write JSON Lines ({"text": ""}) to encode an empty text on purpose'
                )
            texts.append(line)
            continue
        if not line.strip():
            continue
        record = parse_json_line(line, path, number)
        text = record.get("text") if isinstance(record, dict) else None
        if not isinstance(text, str):
            got = shown(record) if not isinstance(record, dict) else f"'text' {shown(text)}"
            raise ValueError(f"{path}:{number}: expected a JSON object with a string 'text' field, got {got}")
        texts.append(text)
    return texts
