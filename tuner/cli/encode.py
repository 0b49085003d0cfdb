"""`tune encode`: texts → a .npy matrix of vectors with an exported config (documents calibrated, queries plain)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from tuner.cli.console import console, friendly_errors, quiet_libraries, setup_logging
from tuner.cli.options import MODEL, OUTPUT, AllowModelMismatch, BatchSize, Force, TrustRemoteCode

if TYPE_CHECKING:
    import numpy as np

INPUT = "Input"


def encode(
    config: Annotated[Path, typer.Option(help="Exported YAML config.", rich_help_panel=MODEL)],
    input: Annotated[
        Path,
        typer.Option(
            help="JSONL with a 'text' field per line, or a text file with one text per line; '-' for standard input. "
            "A named pipe works too.",
            rich_help_panel=INPUT,
        ),
    ],
    output: Annotated[
        Path,
        typer.Option(help="Where to write the float32 .npy matrix (one row per input line).", rich_help_panel=OUTPUT),
    ],
    input_format: Annotated[
        str,
        typer.Option(
            help="'jsonl' or 'text'; default 'auto': by the name (.jsonl, .ndjson: JSON Lines; standard input: text).",
            rich_help_panel=INPUT,
        ),
    ] = "auto",
    queries: Annotated[
        bool, typer.Option("--queries", help="Encode as queries (never calibrated).", rich_help_panel=INPUT)
    ] = False,
    batch_size: BatchSize = None,
    trust_remote_code: TrustRemoteCode = False,
    allow_model_mismatch: AllowModelMismatch = False,
    force: Force = False,
) -> None:
    """Encode documents (calibrated) or queries (plain) with an exported config.

    Example: tune encode --config best.yaml --input docs.jsonl --output emb.npy"""
    setup_logging()
    with friendly_errors():
        from tuner.common.files import VECTORS, Protected, check_output, stores
        from tuner.data.texts import STDIN, read_texts
        from tuner.engine.exported import check_model_files, load_exported

        # a broken config fails before the model loads, and so does one that does not fit it
        exported = load_exported(config)
        check_model_files(exported, config, allow_mismatch=allow_model_mismatch)
        read = [
            Protected(config, "--config"),
            Protected(exported.model.files(), "the model --config names"),
            *stores(None, None),
        ]
        if input != STDIN:
            read.append(Protected(input, "--input"))
        check_output(output, "--output", VECTORS, protected=read, force=force)
        texts = read_texts(input, input_format)
        import warnings

        from tuner.engine.encoder import CalibratedEncoder, ShortDocumentsWarning

        quiet_libraries()
        encoder = CalibratedEncoder.from_exported(exported, trust_remote_code=trust_remote_code)
        method = encoder.encode_query if queries else encoder.encode_document
        with warnings.catch_warnings():  # the line printed below counts them
            warnings.simplefilter("ignore", ShortDocumentsWarning)
            vectors = method(texts, batch_size=batch_size, show_progress_bar=True)
        _save_atomically(vectors, output, force=force)
    short = (
        f"; {encoder.too_short} shorter than one basket ({encoder.config.basket_size} tokens of content), "
        "left uncalibrated"
        if encoder.too_short and encoder.config is not None and encoder.config.strength > 0
        else ""
    )
    truncated = f"; {encoder.truncated} truncated at {encoder.model.max_length} tokens" if encoder.truncated else ""
    kind = "queries" if queries else "documents"
    console.print(f"{len(texts)} {kind} → {escape(str(output))} {vectors.shape}{truncated}{short}")


def _save_atomically(vectors: np.ndarray, path: Path, force: bool = False) -> None:
    import numpy as np

    from tuner.common.files import VECTORS, replacing

    with replacing(path, kind=VECTORS, force=force, flag="--output") as temporary, temporary.open("wb") as stream:
        np.save(stream, vectors)
