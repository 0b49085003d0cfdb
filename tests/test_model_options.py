"""Every command that takes --model takes what `tune run` takes to load any model (--pooling, --padding-side,
--trust-remote-code), and no command's error tells the user to pass an option that command does not have.

The messages are enumerated per command: each case is a command line that makes the command refuse, and the
options its message names (outside `backticks`, which quote other programs' command lines) must be among the
command's own.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest
import typer
import yaml
from typer.testing import CliRunner

from tests.ci import require
from tests.tiny import export_of, save_custom_code
from tuner.cli.app import app

MODEL_OPTIONS = ("--pooling", "--padding-side", "--trust-remote-code")
OTHER_PROGRAMS = {"--repo-type", "--local-dir"}  # `hf download`'s, in FineWeb-PosQ's download hint


def commands() -> dict[str, object]:
    group = typer.main.get_command(app)
    return dict(group.commands)  # type: ignore[attr-defined]


def options_of(command: str) -> set[str]:
    names = set()
    for param in commands()[command].params:  # type: ignore[attr-defined]
        names |= {name for name in [*param.opts, *param.secondary_opts] if name.startswith("--")}
    return names


def named_options(output: str) -> set[str]:
    """The options a message names, leaving out those inside `backticks` (another program's command line)."""
    prose = re.sub(r"`[^`]*`", "", output)
    return set(re.findall(r"(?<![\w-])--[a-z][a-z-]*[a-z]", prose))


def test_every_command_that_takes_a_model_takes_the_options_that_load_any_model() -> None:
    with_model = sorted(name for name in commands() if "--model" in options_of(name))
    assert with_model == ["diagnose", "evaluate", "run"]
    runner = CliRunner(env={"COLUMNS": "200"})
    for name in with_model:
        assert set(MODEL_OPTIONS) <= options_of(name), name
        shown = runner.invoke(app, [name, "-h"]).output
        assert all(option in shown for option in MODEL_OPTIONS), name


def test_the_commands_that_load_a_recorded_model_take_remote_code_consent() -> None:
    """export and encode load the model a study or a YAML recorded (its pooling and padding side with it)."""
    for name in ("export", "encode"):
        assert "--trust-remote-code" in options_of(name) and "--model" not in options_of(name)


# ------------------------------------------------------------------------------ the messages, command by command


@pytest.fixture()
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "empty-hub-cache"))
    return tmp_path


def read_only(path: Path, text: str = "keep me\n") -> Path:
    path.write_text(text, encoding="utf-8")
    path.chmod(stat.S_IREAD)
    return path


def exported_config(folder: Path, tiny_model_dir, model_folder: str | None = None, **model: str) -> Path:
    """A valid exported YAML for the tiny BERT (or the model in `model_folder`, its own code trusted), with its
    model section changed as given."""
    from tuner.engine.models import load_model

    loaded = load_model(
        model_folder or str(tiny_model_dir("bert")), pooling="cls", trust_remote_code=model_folder is not None
    )
    exported = export_of(loaded).model_dump(mode="json", by_alias=True)
    exported["model"].update(model)
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(exported), encoding="utf-8")
    return path


def stored_study(folder: Path) -> str:
    """A study with the attributes `tune` stores, so `tune export` reads it."""
    storage = f"sqlite:///{folder / 'optuna.db'}"
    study = optuna.create_study(study_name="s", storage=storage)
    attrs = {
        "model_name": "minilm",
        "pooling": "mean",
        "dataset_name": "wikipos-dev",
        "seed": 0,
        "hm_floor": "significant",
        "pareto": False,
        "revision": "r",
        "dataset_fingerprint": "f",
    }
    for key, value in attrs.items():
        study.set_user_attr(key, value)
    return storage


def refusal(*args: str) -> str:
    result = CliRunner(env={"COLUMNS": "200"}).invoke(app, list(args))
    assert result.exit_code != 0, result.output
    assert isinstance(result.exception, SystemExit), (
        f"a traceback instead of a message: {result.exception!r}\n{result.output}"
    )
    return result.output


NOT_CACHED = "someone/not-in-this-cache"
EVALUATE_QUICK = ("--no-sea", "--general", "", "--no-shuffled", "--no-paper-default", "--bootstrap", "10")


def texts(here: Path) -> str:
    (here / "docs.txt").write_text("w1 w2\n", encoding="utf-8")
    return str(here / "docs.txt")


def custom_code(here: Path) -> str:
    """A model folder that brings its own code: it loads only with --trust-remote-code."""
    folder = here / "custom-code"
    return str(folder if folder.is_dir() else save_custom_code(folder))


def read_only_output(here: Path, name: str) -> str:
    """A read-only file where a command is told to write; root may write it anyway, so this needs another user."""
    require(os.geteuid() != 0, "root writes read-only files anyway; run the tests as another user (.ci/run does)")
    return str(read_only(here / name))


# name → (command, a function of the test's folder and model maker giving arguments that make the command refuse)
CASES: dict[str, tuple[str, Callable[[Path, Callable[[str], Path]], list[str]]]] = {
    "run: an unknown model": ("run", lambda here, tiny: ["--model", "bge-m4"]),
    "run: a model outside the cache": (
        "run",
        lambda here, tiny: ["--model", NOT_CACHED, "--pooling", "cls", "--dataset", "wikipos-dev"],
    ),
    "run: remote code without consent": (
        "run",
        lambda here, tiny: ["--model", custom_code(here), "--pooling", "cls", "--dataset", "wikipos-dev"],
    ),
    "run: a read-only output": ("run", lambda here, tiny: ["--output", read_only_output(here, "run.yaml")]),
    "evaluate: an unknown model": ("evaluate", lambda here, tiny: ["--model", "bge-m4", *EVALUATE_QUICK]),
    "evaluate: remote code without consent": (
        "evaluate",
        lambda here, tiny: ["--model", custom_code(here), "--pooling", "cls", *EVALUATE_QUICK],
    ),
    "evaluate: a read-only --json": (
        "evaluate",
        lambda here, tiny: ["--json", read_only_output(here, "table.json"), *EVALUATE_QUICK],
    ),
    "evaluate: PosIR's instruction without its scoring": (
        "evaluate",
        lambda here, tiny: ["--posir-instruction", *EVALUATE_QUICK],
    ),
    "evaluate: PosIR's scoring with nothing to shuffle": (
        "evaluate",
        lambda here, tiny: ["--scoring", "posir", "--general", ""],
    ),
    "export: a read-only output": (
        "export",
        lambda here, tiny: [
            "--study-name",
            "s",
            "--storage",
            stored_study(here),
            "--output",
            read_only_output(here, "export.yaml"),
        ],
    ),
    "encode: a read-only output": (
        "encode",
        lambda here, tiny: [
            *("--config", str(exported_config(here, tiny)), "--input", texts(here)),
            *("--output", read_only_output(here, "out.npy")),
        ],
    ),
    "encode: remote code without consent": (
        "encode",
        lambda here, tiny: [
            *("--config", str(exported_config(here, tiny, custom_code(here)))),
            *("--input", texts(here), "--output", str(here / "vectors.npy")),
        ],
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_a_refusal_names_only_options_its_command_has(case: str, here: Path, tiny_model_dir) -> None:
    command, arguments = CASES[case]
    output = refusal(command, *arguments(here, tiny_model_dir))
    named = named_options(output) - OTHER_PROGRAMS
    assert named, f"{case}: the message names no option, so this case checks nothing:\n{output}"
    assert named <= options_of(command), (
        f"{case}: names {sorted(named - options_of(command))}, which `tune {command}` lacks:\n{output}"
    )


def test_encode_of_a_model_outside_the_cache_names_only_its_own_options(here: Path, tiny_model_dir) -> None:
    config = exported_config(here, tiny_model_dir, name=NOT_CACHED, source=NOT_CACHED)
    output = refusal("encode", "--config", str(config), "--input", texts(here), "--output", str(here / "v.npy"))
    assert "not in the local Hugging Face cache" in " ".join(output.split())
    assert named_options(output) <= options_of("encode"), output


def test_the_message_reader_sees_options_in_prose_and_skips_quoted_commands() -> None:
    text = "pass --force to replace it; run `hf download x --repo-type dataset` or give --model with --pooling."
    assert named_options(text) == {"--force", "--model", "--pooling"}
    assert json.dumps(sorted(named_options("--max-ndcg-drop 0.005, --no-sea"))) == '["--max-ndcg-drop", "--no-sea"]'
