"""Texts to encode (`tune encode --input`): JSON Lines with a 'text' per line, or plain text, one per line.

JSON Lines are told by the name (`.jsonl`, `.ndjson`, in any case, optionally `.gz`); any other name is plain
text, and so is standard input (`-`), unless `--input-format` says otherwise. Nothing is guessed from content: a
nameless input whose lines are JSON objects with a 'text' is refused with the option to pass, never encoded as
raw JSON. A named pipe is read like a file. Errors name the file (`<stdin>` for standard input) and line.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from tuner.common.messages import shown
from tuner.data.jsonl import lines_of, parse_json_line, read_text

JSONL_SUFFIXES = (".jsonl", ".ndjson")
STDIN = Path("-")
STDIN_FILE = Path("/dev/stdin")  # standard input as a file (a pipe, a terminal, or the file it was redirected from)
FORMATS = ("auto", "jsonl", "text")


def is_jsonl(path: Path) -> bool:
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] == ".gz":
        suffixes = suffixes[:-1]
    return bool(suffixes) and suffixes[-1] in JSONL_SUFFIXES


def read_texts(path: Path, input_format: str = "auto") -> list[str]:
    """The texts of `path` (`STDIN`: standard input) in order, one per output row; an empty input, a folder, a
    line without a string 'text' is an error. Plain text is split on "\n" only (`lines_of`), and a blank line is
    refused, never dropped: row k of the output is line k. In JSON Lines a blank line is no record and is skipped."""
    if input_format not in FORMATS:
        raise ValueError(f"--input-format {shown(input_format)}: write one of {', '.join(FORMATS)}")
    standard = path == STDIN
    label = Path("<stdin>") if standard else path
    _check_readable(path)
    jsonl = input_format == "jsonl" or (input_format == "auto" and is_jsonl(path))
    lines = lines_of(read_text(STDIN_FILE if standard else path))
    if not any(line.strip() for line in lines):
        raise ValueError(f"--input {'- (standard input)' if standard else path} holds no texts")
    if standard and input_format == "auto":
        _refuse_unnamed_json_lines(lines)
    texts = []
    for number, line in enumerate(lines, 1):
        if not jsonl:
            if not line.strip():
                raise ValueError(
                    f"{label}:{number}: a blank line; each line is one text (row {number} of the output), so "
                    'remove it, or write JSON Lines ({"text": ""}) to encode an empty text on purpose'
                )
            texts.append(line)
            continue
        if not line.strip():
            continue
        record = parse_json_line(line, label, number)
        text = record.get("text") if isinstance(record, dict) else None
        if not isinstance(text, str):
            got = shown(record) if not isinstance(record, dict) else f"'text' {shown(text)}"
            raise ValueError(f"{label}:{number}: expected a JSON object with a string 'text' field, got {got}")
        texts.append(text)
    return texts


def _check_readable(path: Path) -> None:
    """A file or a named pipe (standard input too); never a folder, a device or nothing, and never a terminal
    left waiting for texts the user meant to pipe in."""
    if path == STDIN:
        if os.isatty(0):
            raise ValueError(
                "--input - reads standard input, which is a terminal here; pipe the texts in, "
                "e.g. `cat docs.txt | tune encode --input - ...`"
            )
        return
    if path.is_dir():
        raise ValueError(f'--input {path} is a folder; give a .jsonl file ({{"text": ...}} per line) or a .txt file')
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise FileNotFoundError(f"--input {path}: no such file") from None
    if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode)):
        raise ValueError(
            f"--input {path} is not a file or a named pipe; give a .jsonl or .txt file, or - for standard input"
        )


def _refuse_unnamed_json_lines(lines: list[str]) -> None:
    """Standard input is plain text by default: its first text being a JSON object with a 'text' field means the
    user piped JSON Lines, which would be encoded as raw JSON."""
    first = next(line for line in lines if line.strip())
    try:
        record = json.loads(first)
    except ValueError:
        return
    if isinstance(record, dict) and "text" in record:
        raise ValueError(
            "standard input holds JSON Lines (its first line is an object with a 'text' field), but is read as plain "
            "text unless told: pass --input-format jsonl, or --input-format text to encode the lines as they are"
        )
