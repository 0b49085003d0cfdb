"""The one rule for every file posfair writes (`tuner.common.files`), as users meet it on the command line.

An output replaces only posfair's own artefact of its kind, or anything with --force; never, even with --force,
an input of the command, a store, a database, a device or a pipe; through a symbolic link it writes the target;
read-only is read from the mode bits, so the suite (which runs as root here) sees the refusals a user would.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import stat
from pathlib import Path

import numpy as np
import optuna
import pytest
from typer.testing import CliRunner

from tests.conftest import TinyExport
from tests.test_study import write_dataset
from tests.tiny import tiny_tune_options
from tuner.cli.app import app
from tuner.common.files import EXPORTED_CONFIG, VECTORS, OutputRefusedError, check_output, write_atomically

runner = CliRunner()


def refused(*args: str) -> str:
    """The command fails with a message (no traceback); its output, on one line."""
    result = runner.invoke(app, list(args))
    assert result.exit_code != 0, result.output
    assert isinstance(result.exception, SystemExit), (
        f"traceback instead of a message: {result.exception!r}\n{result.output}"
    )
    return " ".join(result.output.split())


def succeeds(*args: str) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, f"{result.exception!r}\n{result.output}"
    return " ".join(result.output.split())


@pytest.fixture(autouse=True)
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture(scope="module")
def model_copy(tiny_export: TinyExport) -> Path:
    return tiny_export.model


@pytest.fixture(scope="module")
def config(tiny_export: TinyExport) -> Path:
    return tiny_export.config


def encode(config: Path, output: Path | str, *extra: str, texts: str = "w1 w2 w3\n") -> list[str]:
    Path("docs.txt").write_text(texts, encoding="utf-8")
    return ["encode", "--config", str(config), "--input", "docs.txt", "--output", str(output), *extra]


@pytest.fixture
def data(tmp_path: Path) -> Path:
    """A tuning set of the test's own, which a failing test may spoil without harming others."""
    return write_dataset(tmp_path / "victim")


def run_args(model: Path, data: Path, *extra: str) -> list[str]:
    return ["run", *tiny_tune_options(model, data, trials=1), *extra]


@pytest.mark.parametrize("force", [[], ["--force"]])
def test_run_never_writes_its_output_over_its_tuning_corpus(
    tiny_model_dir, data: Path, in_tmp: Path, force: list[str]
) -> None:
    """`tune run --dataset jsonl:data/victim --output data/victim/corpus.jsonl` ran the study, then replaced the
    tuning corpus with the YAML (exit 0)."""
    corpus = (data / "corpus.jsonl").read_bytes()
    said = refused(*run_args(tiny_model_dir("bert"), data, "--output", str(data / "corpus.jsonl"), *force))
    assert (
        f"--output {data / 'corpus.jsonl'} is {data / 'corpus.jsonl'} (--dataset jsonl:{data}), "
        "an input of this command" in said
    )
    assert "never writes over its inputs, even with --force" in said
    assert (data / "corpus.jsonl").read_bytes() == corpus
    assert not (in_tmp / "mlruns").exists()  # refused before any work


@pytest.mark.parametrize(
    ("output", "what"),
    [
        ("mlruns/optuna.db", "the study store (--storage)"),
        ("mlruns/mlflow.db", "the MLflow store (--tracking-uri)"),
        ("mlruns/artifacts/best.yaml", "MLflow's artifacts"),
        ("mlruns/cache/best.yaml", "the cache of layer inputs"),
    ],
)
def test_run_never_writes_its_output_over_a_store(
    tiny_model_dir, data: Path, in_tmp: Path, output: str, what: str
) -> None:
    """`tune run --output mlruns/optuna.db` replaced the study database with the YAML, then ended in a traceback:
    every study in that store was lost."""
    (in_tmp / "mlruns" / "artifacts").mkdir(parents=True)
    (in_tmp / "mlruns" / "cache").mkdir()
    said = refused(*run_args(tiny_model_dir("bert"), data, "--output", output))
    assert f"--output {output} " in said and f"({what}), a store of this run; posfair never writes over a store" in said
    assert sorted(p.name for p in (in_tmp / "mlruns").iterdir()) == ["artifacts", "cache"]  # no store was made


def test_run_never_writes_over_its_space_or_options_file(tiny_model_dir, data: Path, in_tmp: Path) -> None:
    (in_tmp / "space.yaml").write_text("basket_sizes: [8, 16]\n", encoding="utf-8")
    (in_tmp / "options.yaml").write_text("trials: 1\n", encoding="utf-8")
    for target in ("space.yaml", "options.yaml"):
        said = refused(
            *run_args(
                tiny_model_dir("bert"),
                data,
                "--space",
                "space.yaml",
                "--options",
                "options.yaml",
                "--output",
                target,
                "--force",
            )
        )
        assert f"--output {target} is {target} (an options or --space file), an input of this command" in said


def test_an_existing_database_is_never_replaced_even_with_force(config: Path, in_tmp: Path) -> None:
    """A study store of another folder (or a hard link to one) is recognised by its content, whatever its name."""
    with sqlite3.connect(in_tmp / "studies.npy") as database:
        database.execute("CREATE TABLE studies (id INTEGER)")
    before = (in_tmp / "studies.npy").read_bytes()
    said = refused(*encode(config, in_tmp / "studies.npy", "--force"))
    assert (
        "is an SQLite database (a study or MLflow store?); posfair never writes over a database, even with --force"
        in said
    )
    assert (in_tmp / "studies.npy").read_bytes() == before


@pytest.mark.parametrize("force", [[], ["--force"]])
def test_encode_never_writes_into_the_model_its_config_names(config: Path, model_copy: Path, force: list[str]) -> None:
    """`tune encode --output <the model folder>/model.safetensors` replaced the weights with an .npy (exit 0), and
    every later load of the model failed."""
    weights = model_copy / "model.safetensors"
    before = weights.read_bytes()
    said = refused(*encode(config, weights, *force))
    assert f"--output {weights} is inside {model_copy} (the model --config names), an input of this command" in said
    assert weights.read_bytes() == before


def test_encode_keeps_a_read_only_npy_even_as_root(config: Path, in_tmp: Path) -> None:
    """A read-only .npy was replaced without --force when the user was root (CI, containers): the check asked
    `os.access`, which never refuses root."""
    target = in_tmp / "v.npy"
    np.save(target, np.zeros((1, 32), dtype=np.float32))
    target.chmod(0o444)
    before = target.read_bytes()
    assert f"--output {target} exists and is read-only; pass --force to replace it" in refused(*encode(config, target))
    assert target.read_bytes() == before
    succeeds(*encode(config, target, "--force"))
    assert np.load(target).shape == (1, 32) and stat.S_IMODE(target.stat().st_mode) == 0o444  # replaced, mode kept


def test_a_file_posfair_did_not_write_is_replaced_only_with_force(config: Path, in_tmp: Path) -> None:
    notes = in_tmp / "notes.npy"
    notes.write_text("my notes\n", encoding="utf-8")
    assert "--output notes.npy exists and is not an .npy matrix posfair wrote; pass --force to replace it" in refused(
        *encode(config, "notes.npy")
    )
    assert notes.read_text(encoding="utf-8") == "my notes\n"
    succeeds(*encode(config, "notes.npy", "--force"))
    assert np.load(notes).shape == (1, 32)


def test_posfairs_own_outputs_are_replaced_unasked(config: Path, in_tmp: Path) -> None:
    """A second `tune encode` onto its own .npy, and an export onto an exported config, just replace them."""
    succeeds(*encode(config, "v.npy"))
    succeeds(*encode(config, "v.npy", texts="w1\nw2\n"))
    assert np.load(in_tmp / "v.npy").shape == (2, 32)
    copy = in_tmp / "best.yaml"
    copy.write_bytes(config.read_bytes())
    check_output(copy, "--output", EXPORTED_CONFIG)  # recognised as posfair's own: no refusal


def test_a_run_output_that_is_not_a_posfair_config_is_refused_before_any_work(
    tiny_model_dir, data: Path, in_tmp: Path
) -> None:
    (in_tmp / "best.yaml").write_text("my: own settings\n", encoding="utf-8")
    said = refused(*run_args(tiny_model_dir("bert"), data, "--output", "best.yaml"))
    assert (
        "--output best.yaml exists and is not a posfair exported config posfair wrote; pass --force to replace it"
        in said
    )
    assert (
        not (in_tmp / "mlruns").exists() and (in_tmp / "best.yaml").read_text(encoding="utf-8") == "my: own settings\n"
    )


def test_evaluate_outputs_follow_the_same_rule(in_tmp: Path, data: Path) -> None:
    (in_tmp / "table.json").write_text(json.dumps({"mine": 1}), encoding="utf-8")
    said = refused("evaluate", "--dataset", f"jsonl:{data}", "--json", "table.json", "--no-sea", "--general", "")
    assert "--json table.json exists and is not a `tune evaluate --json` file posfair wrote; pass --force" in said
    said = refused(
        "evaluate", "--dataset", f"jsonl:{data}", "--markdown", str(data / "queries.jsonl"), "--no-sea", "--general", ""
    )
    assert f"(--dataset jsonl:{data}), an input of this command" in said


def test_an_output_through_a_symlink_writes_the_target_and_keeps_the_link(config: Path, in_tmp: Path) -> None:
    """`--output` through a symbolic link replaced the link with a file and left its target stale."""
    (in_tmp / "real").mkdir()
    target = in_tmp / "real" / "v.npy"
    np.save(target, np.zeros((5, 32), dtype=np.float32))
    (in_tmp / "link.npy").symlink_to(target)
    succeeds(*encode(config, "link.npy"))
    assert (in_tmp / "link.npy").is_symlink() and os.readlink(in_tmp / "link.npy") == str(target)
    assert np.load(target).shape == (1, 32)
    assert sorted(p.name for p in (in_tmp / "real").iterdir()) == ["v.npy"]  # no temporary left beside it


def test_a_link_into_an_input_is_refused(config: Path, model_copy: Path, in_tmp: Path) -> None:
    (in_tmp / "w.npy").symlink_to(model_copy / "model.safetensors")
    assert "is inside" in refused(*encode(config, "w.npy", "--force"))
    assert (in_tmp / "w.npy").is_symlink()


def test_a_read_only_folder_is_read_only_for_root_too(in_tmp: Path) -> None:
    """The folder check asked `os.access` too, which never refuses root: the write went through."""
    (in_tmp / "ro").mkdir()
    (in_tmp / "ro").chmod(0o555)
    with pytest.raises(OutputRefusedError, match="folder .*ro is not writable"):
        write_atomically(in_tmp / "ro" / "v.npy", b"x")
    assert list((in_tmp / "ro").iterdir()) == []


def test_the_write_itself_checks_again(in_tmp: Path) -> None:
    """A file that appeared at the output after the command's first check (during a study) is not replaced either."""
    (in_tmp / "best.yaml").write_text("written meanwhile\n", encoding="utf-8")
    with pytest.raises(OutputRefusedError, match="exists and is not a posfair exported config posfair wrote"):
        write_atomically(
            in_tmp / "best.yaml", "schema: posfair/calibration-config\n", kind=EXPORTED_CONFIG, flag="--output"
        )
    assert sorted(p.name for p in in_tmp.iterdir()) == ["best.yaml"] and "meanwhile" in (
        in_tmp / "best.yaml"
    ).read_text(encoding="utf-8")


# ---------------------------------------------------------------- stores recognised by what they are, wherever they are


def md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def other_project(tmp_path_factory: pytest.TempPathFactory, tiny_export: TinyExport) -> dict[str, Path]:
    """Another project's stores and model, each made by the tool that makes it (Optuna, MLflow, posfair's cache),
    far from this test's working folder: a file of each, by name."""
    from mlflow import MlflowClient

    from tuner.evaluation.store import DiskCache
    from tuner.tracking.registry import save_pyfunc

    root = tmp_path_factory.mktemp("other-project")
    journal = root / "study.journal"
    backend = optuna.storages.journal.JournalFileBackend(str(journal))
    optuna.create_study(study_name="s", storage=optuna.storages.JournalStorage(backend)).optimize(
        lambda trial: trial.suggest_float("x", 0, 1), n_trials=2
    )
    store = root / "mlruns"
    store.mkdir()
    client = MlflowClient(f"sqlite:///{store / 'mlflow.db'}")
    experiment = client.create_experiment("posfair", artifact_location=str(store / "artifacts"))
    run = client.create_run(experiment)
    client.log_artifact(run.info.run_id, str(tiny_export.config))
    logged = client.create_logged_model(experiment, name="posfair-tiny", source_run_id=run.info.run_id)
    save_pyfunc(root / "pyfunc", tiny_export.config, 32)
    client.log_model_artifacts(logged.model_id, str(root / "pyfunc"))
    cache = DiskCache(store / "cache" / "tiny-model" / "tiny-data")
    cache.save_array("baseline", {"model": "tiny"}, np.zeros((2, 32), dtype=np.float32))
    model = Path(shutil.copytree(tiny_export.model, root / "models" / "tiny-bert"))
    [pyfunc_yaml] = (store / "artifacts").glob("models/*/artifacts/data/*.yaml")
    [run_artifact] = (store / "artifacts").glob(f"{run.info.run_id}/artifacts/*.yaml")
    return {
        "an Optuna journal": journal,
        "a registered pyfunc's YAML": pyfunc_yaml,
        "a run's artifact": run_artifact,
        "a new file among a run's artifacts": run_artifact.parent / "new.npy",
        "a cache entry": cache.folder / "baseline.npy",
        "a cache entry's metadata": cache.folder / "baseline.json",
        "another model's weights": model / "model.safetensors",
    }


STORE_CASES = [
    "an Optuna journal",
    "a registered pyfunc's YAML",
    "a run's artifact",
    "a new file among a run's artifacts",
    "a cache entry",
    "a cache entry's metadata",
    "another model's weights",
]


@pytest.mark.parametrize("case", STORE_CASES)
def test_another_projects_stores_and_models_are_never_written_even_with_force(
    config: Path, other_project: dict[str, Path], in_tmp: Path, case: str
) -> None:
    """`tune export --output <another project's registered pyfunc YAML>` replaced it without --force (its champion
    then encoded with another study's trial), `tune encode --output <another project's cache>/baseline.npy` replaced
    the cache entry, and with --force an Optuna journal or another model's weights went too: the rule knew only
    SQLite files and the current folder's mlruns/. Each is recognised by what it holds, and no refusal advises
    --force."""
    target = other_project[case]
    before = md5(target) if target.exists() else None
    for force in ([], ["--force"]):
        said = refused(*encode(config, target, *force))
        assert f"--output {target} " in said and "posfair never writes" in said and "even with --force" in said, said
        assert "pass --force" not in said
    kind = EXPORTED_CONFIG if target.suffix == ".yaml" else VECTORS
    with pytest.raises(OutputRefusedError, match="posfair never writes") as error:
        check_output(target, "--output", kind)
    assert "pass --force" not in str(error.value)
    assert (md5(target) if target.exists() else None) == before


def test_a_journal_study_store_is_never_an_output_of_run_or_export(tiny_model_dir, data: Path, in_tmp: Path) -> None:
    """`tune run --storage journal:J --output J --force` (and `tune export … --output J --force`) replaced the whole
    study with the YAML, then appended journal lines to it; without --force the refusal told the user to pass
    --force."""
    journal = in_tmp / "study.journal"
    storage = f"journal:{journal}"
    succeeds(
        *run_args(tiny_model_dir("bert"), data, "--storage", storage, "--study-name", "s", "--output", "best.yaml")
    )
    before = md5(journal)
    for force in ([], ["--force"]):
        said = refused(
            *run_args(
                tiny_model_dir("bert"),
                data,
                "--storage",
                storage,
                "--study-name",
                "s",
                "--output",
                str(journal),
                *force,
            )
        )
        assert f"--output {journal} is {journal} (the study store (--storage)), a store of this run" in said, said
        said = refused("export", "--study-name", "s", "--storage", storage, "--output", str(journal), *force)
        assert (
            f"--output {journal} is {journal}" in said
            and "posfair never writes over a store, even with --force" in said
        ), said
        assert "pass --force" not in said
    assert md5(journal) == before
