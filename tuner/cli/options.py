"""The options several `tune` commands share, the help panels they are listed under, and commands whose options are
the fields of a record."""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from tuner.common.messages import shown
from tuner.common.options import PaddingSide, Pooling

# Help panels (`Command` lists each command's options under them), in the order `tune run -h` shows them.
MODEL = "Model"
DATA = "Data"
SEARCH = "Search"
CONSTRAINTS = "Constraints"
CONFIGS = "Configs"
SELECTION = "Selection and report"
SCORING = "Scoring"
STORES = "Stores"
OUTPUT = "Output"
RESOURCES = "Resources"
WORKERS = "Workers"


def _options_file(ctx: typer.Context, value: Path | None) -> Path | None:
    """Values from a YAML options file become the defaults; flags still win."""
    if value is None:
        return None
    from tuner.common.safe_yaml import YamlError, load_file

    try:
        data = load_file(value) or {}
    except YamlError as error:
        raise typer.BadParameter(str(error)) from None
    if not isinstance(data, dict):
        raise typer.BadParameter(f"{value}: expected a mapping of option: value")
    params = {p.name: p for p in ctx.command.params}
    normalised: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    for key, option in data.items():
        name = str(key).replace("-", "_")
        if name in spelled:
            raise typer.BadParameter(
                f"{value}: {shown(spelled[name])} and {shown(str(key))} are one option "
                f"(--{name.replace('_', '-')}); keep one"
            )
        normalised[name], spelled[name] = option, str(key)
    unknown = sorted(set(normalised) - set(params))
    if unknown:
        known = sorted(set(params) - {"options"})
        raise typer.BadParameter(f"{value}: unknown option(s) {shown(unknown)}; known: {known}")
    for key, option in normalised.items():  # click would read `true` as 1 for a number
        if isinstance(option, bool) and not getattr(params[key], "is_flag", False):
            raise typer.BadParameter(
                f"{value}: {key} is {option!r}, a boolean; write a value (see --{key.replace('_', '-')} in --help)"
            )
    ctx.default_map = {**(ctx.default_map or {}), **normalised}
    return value


OptionsFile = Annotated[
    Path | None,
    typer.Option(
        "--options",
        help="YAML file of options (keys as the long flags); flags override it.",
        is_eager=True,
        callback=_options_file,
        exists=True,
        dir_okay=False,
    ),
]
Model = Annotated[
    str,
    typer.Option(
        help="Registry alias (minilm, bge-m3, qwen3-embedding-0.6b, ...) or a local folder.", rich_help_panel=MODEL
    ),
]
# What loads any model, on every command that takes --model (a registry alias knows its own).
PoolingOption = Annotated[
    Pooling | None,
    typer.Option("--pooling", help="How a model outside the registry pools its vectors.", rich_help_panel=MODEL),
]
PaddingSideOption = Annotated[
    PaddingSide | None,
    typer.Option(
        "--padding-side",
        help="Where its tokenizer pads; default: the registry's, else left for last pooling, right otherwise.",
        rich_help_panel=MODEL,
    ),
]
TrustRemoteCode = Annotated[
    bool,
    typer.Option(
        "--trust-remote-code",
        help="Allow a model's own code from its hub repository to run.",
        rich_help_panel=MODEL,
    ),
]
AllowModelMismatch = Annotated[
    bool,
    typer.Option(
        "--allow-model-mismatch",
        help="Use a config even where its pooling, padding or weights differ from the model it names "
        "(refused by default).",
        rich_help_panel=MODEL,
    ),
]
Dataset = Annotated[
    str,
    typer.Option(
        help="wikipos-dev, wikipos-test, wikipos-general, squad-tune, squad-test, fineweb-posq, or posir:PATH, "
        "jsonl:PATH, beir:PATH, squad:PATH (a file in SQuAD's format), probe:PATH (a probe built from a JSONL or "
        "BEIR folder).",
        rich_help_panel=DATA,
    ),
]
TrackingUri = Annotated[
    str | None,
    typer.Option(help="MLflow tracking server; default: a SQLite store under ./mlruns.", rich_help_panel=STORES),
]
Storage = Annotated[
    str | None,
    typer.Option(
        help="Optuna storage: a database URL (postgresql://USER:PASS@HOST/DB, mysql+pymysql://..., sqlite:///PATH) "
        "or journal:PATH (a journal file, for workers on a shared file system without a database server); "
        "default: sqlite:///mlruns/optuna.db.",
        rich_help_panel=STORES,
    ),
]
Force = Annotated[
    bool,
    typer.Option(
        "--force",
        help="Replace an existing output that posfair did not write, or a read-only one (never an input, a store, "
        "a database, a folder or a device).",
        rich_help_panel=OUTPUT,
    ),
]
BatchSize = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="Documents per forward pass; default: chosen from the device's free memory.",
        rich_help_panel=RESOURCES,
    ),
]
BatchTokens = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="Padded tokens per forward pass (rows × longest text); default for long-passage models: chosen from "
        "the device's free memory.",
        rich_help_panel=RESOURCES,
    ),
]
MAX_SEED = 2**32 - 1
Resamples = Annotated[int, typer.Option(min=1, help="Bootstrap resamples for the intervals.", rich_help_panel=SCORING)]

Record = TypeVar("Record")


def takes(record: type[Record]) -> Callable[[Callable[[Record], None]], Callable[..., None]]:
    """A command that receives its options as one `record` (a dataclass): typer reads a command's options from its
    signature, so the command's signature is made from the record's fields (each an `Annotated[type,
    typer.Option(...)]` with its default), and the options are written once, in the record."""
    hints = typing.get_type_hints(record, include_extras=True)
    fields = dataclasses.fields(record)  # type: ignore[arg-type]
    signature = inspect.Signature(
        [
            inspect.Parameter(
                f.name,
                inspect.Parameter.KEYWORD_ONLY,
                default=inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default,
                annotation=hints[f.name],
            )
            for f in fields
        ]
    )

    def command_of(body: Callable[[Record], None]) -> Callable[..., None]:
        def command(**values: Any) -> None:
            body(record(**values))

        command.__name__, command.__qualname__, command.__doc__ = body.__name__, body.__qualname__, body.__doc__
        command.__module__ = body.__module__
        command.__signature__ = signature  # type: ignore[attr-defined]
        command.__annotations__ = {f.name: hints[f.name] for f in fields}
        return command

    return command_of
