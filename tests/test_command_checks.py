"""What a command checks before it works, what it reads, and what it says when it stops: names before the settings
table, every check before the model loads and before any store is made, nothing created when there is nothing to
do; `tune export` by the study's own selection rule; `tune encode` from standard input or a named pipe; a stopped
study's words made from its state."""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import optuna
import pytest
from optuna.trial import TrialState, create_trial
from typer.testing import CliRunner

from tests.conftest import TinyExport
from tests.test_study import write_dataset
from tests.tiny import WORDS, tiny_tune_options
from tuner.cli.app import app
from tuner.engine.exported import load_exported

runner = CliRunner()


def invoke(*args: str, input: str | None = None) -> tuple[int, str]:
    result = runner.invoke(app, list(args), input=input)
    assert isinstance(result.exception, SystemExit | None), (
        f"traceback instead of a message: {result.exception!r}\n{result.output}"
    )
    return result.exit_code, " ".join(result.output.split())


@pytest.fixture(autouse=True)
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_export_names_the_winner_by_the_rule_the_study_ran_with(tiny_model_dir, tmp_path: Path) -> None:
    """`tune export` re-exported with the one-SE rule whatever --selection the study was run with."""
    data = write_dataset(tmp_path / "data")
    code, said = invoke(
        "run", *tiny_tune_options(tiny_model_dir("bert"), data, trials=1), "--selection", "lowest", "--study-name", "s"
    )
    assert code == 0, said
    assert load_exported(tmp_path / "mlruns" / "exports" / "s.yaml").provenance.selection_rule == "lowest"
    code, said = invoke("export", "--study-name", "s", "--output", "again.yaml")
    assert code == 0, said
    assert load_exported(tmp_path / "again.yaml").provenance.selection_rule == "lowest"
    with sqlite3.connect(tmp_path / "mlruns" / "optuna.db") as store:  # a study run before the rule was recorded
        store.execute("DELETE FROM study_user_attributes WHERE key = 'selection'")
    code, said = invoke("export", "--study-name", "s", "--output", "older.yaml")
    assert code == 0 and "study s records no selection rule (an older posfair ran it): one-se, tune's default" in said
    assert load_exported(tmp_path / "older.yaml").provenance.selection_rule == "one-se"


def test_export_in_a_folder_without_a_store_creates_none(tmp_path: Path) -> None:
    """`tune export --study-name X` in a folder without mlruns/ said `no study`, and left a new mlruns/optuna.db."""
    code, said = invoke("export", "--study-name", "nothing-here")
    assert code == 2 and f"no study store at {tmp_path / 'mlruns' / 'optuna.db'}, so no study 'nothing-here'" in said
    assert not (tmp_path / "mlruns").exists()


def stratified_data(folder: Path) -> Path:
    """Two strata of three documents, each with a begin, a middle and an end query placed by its span: the short
    stratum's documents fit the tiny model's 256 tokens, the long one's run to ~450, so its end answers lie past
    what the model reads and are dropped once its tokenizer is known."""
    folder.mkdir()
    corpus, queries = [], []
    for number, (stratum, words) in enumerate([("short", 20)] * 3 + [("long", 150)] * 3):
        parts = [
            " ".join(WORDS[(number * 7 + third * 13 + i) % len(WORDS)] for i in range(words)) for third in range(3)
        ]
        text = " ".join(parts)
        corpus.append({"id": f"d{number}", "text": text})
        start = 0
        for third, part in enumerate(parts):
            span = [start, start + len(part)]
            queries.append(
                {
                    "id": f"q{number}-{third}",
                    "text": " ".join(part.split()[:4]),
                    "relevant": [f"d{number}"],
                    "span": span,
                    "stratum": stratum,
                }
            )
            start += len(part) + 1
    (folder / "corpus.jsonl").write_text("\n".join(json.dumps(d) for d in corpus), encoding="utf-8")
    (folder / "queries.jsonl").write_text("\n".join(json.dumps(q) for q in queries), encoding="utf-8")
    return folder


def test_a_stratum_emptied_by_the_models_reach_is_refused_before_any_store(tiny_model_dir, tmp_path: Path) -> None:
    """A stratum check that failed once the model had loaded (its queries past the model's reach dropped) left
    mlruns/optuna.db behind."""
    code, said = invoke("run", *tiny_tune_options(tiny_model_dir("bert"), stratified_data(tmp_path / "strata")))
    assert code == 2 and "stratum 'long' has 3 queries in group 'begin', 3 in 'middle', 0 in 'end'" in said
    assert not (tmp_path / "mlruns").exists()


def test_a_dataset_typo_lists_only_the_names_a_user_gives() -> None:
    """A --dataset typo listed 19 names, the WikiPos structure views (…-crops, …-openings, …-packed) among them."""
    code, said = invoke("--dataset", "wikipos-dve")
    assert code == 2 and "unknown benchmark 'wikipos-dve'; known: wikipos-dev, wikipos-test," in said
    assert not any(view in said for view in ("-crops", "-openings", "-packed"))


def test_a_model_or_dataset_typo_is_reported_before_the_settings_table() -> None:
    """A --model typo was reported after the 40-line settings table (and seconds of imports: see test_cli_speed)."""
    for args, message in (
        (["--model", "minlm"], "unknown model 'minlm'"),
        (["--dataset", "jsonl:nowhere"], "no file or folder nowhere"),
    ):
        code, said = invoke(*args)
        assert code == 2 and message in said
        assert "tune: settings" not in said


def encode_args(config: Path, source: str, *extra: str) -> list[str]:
    return ["encode", "--config", str(config), "--input", source, "--output", "v.npy", *extra]


@contextmanager
def standard_input(data: bytes | None) -> Iterator[None]:
    """The process's standard input (file descriptor 0) as a shell gives it: a pipe holding `data`, or (None) a
    terminal."""
    if data is None:
        writer, reader = os.openpty()
    else:
        reader, writer = os.pipe()
        os.write(writer, data)
        os.close(writer)
    saved = os.dup(0)
    os.dup2(reader, 0)
    try:
        yield
    finally:
        os.dup2(saved, 0)
        os.close(saved)
        os.close(reader)
        if data is None:
            os.close(writer)


def test_encode_reads_standard_input(tiny_export: TinyExport) -> None:
    """`tune encode --input -` (or /dev/stdin) said "no such file"."""
    Path("docs.txt").write_text("w1 w2 w3\nw4 w5\n", encoding="utf-8")
    assert invoke(*encode_args(tiny_export.config, "docs.txt"))[0] == 0
    expected = np.load("v.npy")
    with standard_input(b"w1 w2 w3\nw4 w5\n"):
        code, said = invoke(*encode_args(tiny_export.config, "-"))
    assert code == 0, said
    np.testing.assert_array_equal(np.load("v.npy"), expected)


def test_standard_input_holding_json_lines_asks_for_the_format(tiny_export: TinyExport) -> None:
    lines = b'{"text": "w1 w2 w3"}\n{"text": "w4 w5"}\n'
    with standard_input(lines):
        code, said = invoke(*encode_args(tiny_export.config, "-"))
    assert code == 2 and "standard input holds JSON Lines" in said and "pass --input-format jsonl" in said
    assert not Path("v.npy").exists()
    with standard_input(lines):
        code, said = invoke(*encode_args(tiny_export.config, "-", "--input-format", "jsonl"))
    assert code == 0 and np.load("v.npy").shape == (2, 32), said


def test_a_terminal_as_standard_input_is_refused(tiny_export: TinyExport) -> None:
    """A terminal would wait for texts the user meant to pipe in."""
    with standard_input(None):
        code, said = invoke(*encode_args(tiny_export.config, "-"))
    assert code == 2 and "reads standard input, which is a terminal here; pipe the texts in" in said


def test_encode_reads_a_named_pipe(tiny_export: TinyExport) -> None:
    """A FIFO as --input said "no such file"."""
    os.mkfifo("docs.jsonl")

    def feed() -> None:
        with open("docs.jsonl", "w", encoding="utf-8") as pipe:
            pipe.write('{"text": "w1 w2 w3"}\n{"text": "w4"}\n')

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    code, said = invoke(*encode_args(tiny_export.config, "docs.jsonl"))
    writer.join(timeout=30)
    assert code == 0, said
    assert np.load("v.npy").shape == (2, 32)


def stop_short(complete: list[dict[str, float]], target: int = 16) -> str:
    """What `tune` prints when SIGTERM stops a study with these complete trials (user attrs, or constraints)."""
    from tuner.tuning.stopped_early import StoppedEarlyError, stop_short
    from tuner.tuning.study_loop import TrialsEnd

    study = optuna.create_study(study_name="s")
    for attrs in complete:
        study.add_trial(
            create_trial(
                state=TrialState.COMPLETE,
                value=attrs["psi"],
                user_attrs={"psi": attrs["psi"], "hm": 0.5},
                constraints={"hm_floor": attrs["floor"]},
            )
        )
    session = SimpleNamespace(
        name="s",
        study=study,
        settings=SimpleNamespace(worker=False, selection="one-se"),
        tracker=SimpleNamespace(finish_study=lambda *a, **k: None),
    )
    with pytest.raises(StoppedEarlyError) as stopped:
        stop_short(TrialsEnd(len(complete), target, "terminated"), session)  # type: ignore[arg-type]
    return f"{stopped.value.label}: {stopped.value}"


def test_a_stop_before_any_trial_finished_says_so_once_and_offers_no_export() -> None:
    """SIGTERM before any trial finished printed `stopped early: stopped early (terminated by SIGTERM): 0 of 16
    trials complete; … or tune export … to export the winner so far`: doubled words, and an export of nothing."""
    assert (
        stop_short([])
        == "stopped early: terminated by SIGTERM; 0 of 16 trials complete; nothing exported. Run the same command "
        "again to resume"
    )
    infeasible = stop_short([{"psi": 0.2, "floor": 0.1}])
    assert (
        "1 of 16 trials complete" in infeasible
        and "no complete trial meets the constraints yet, so there is no winner to export" in infeasible
    )
    assert "tune export" not in infeasible
    assert stop_short([{"psi": 0.3, "floor": 0.1}, {"psi": 0.2, "floor": -0.1}]).endswith(
        "Run the same command again to resume, or `tune export --study-name s` to export the winner so far (trial 1)"
    )


def test_a_missing_model_folder_is_reported_before_the_settings_table(tmp_path: Path) -> None:
    code, said = invoke("--model", str(tmp_path / "no-such-model"), "--pooling", "cls")
    assert code == 2 and f"no model folder at {tmp_path / 'no-such-model'}" in said and "tune: settings" not in said
