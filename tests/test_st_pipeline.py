"""A sentence-transformers folder is encoded as sentence-transformers encodes it: its prompts, its pooling, its Dense
and Normalize modules, on every path posfair makes a vector by (the encoder, the evaluation with full and resumed
passes, `tune encode`, the pyfunc, `load_sentence_transformer`, a whole `tune` run and `tune evaluate`). What posfair
cannot apply is refused naming it; the exported config records the pipeline, and a folder changed since is refused.

The expected vectors come from sentence-transformers itself (`SentenceTransformer(folder).encode_document` /
`encode_query`), never from posfair's code; the folders are built and saved by sentence-transformers too.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from sentence_transformers import SentenceTransformer
from sentence_transformers.base.modules import Dense, Normalize, Transformer
from sentence_transformers.sentence_transformer.modules import Pooling
from typer.testing import CliRunner

from tests.test_study import write_dataset
from tests.tiny import export_of, random_texts, save_tiny
from tuner.cli.app import app
from tuner.data import load_benchmark
from tuner.engine.encoder import CalibratedEncoder
from tuner.engine.exported import ExportError, load_exported, write_exported
from tuner.engine.integration import load_sentence_transformer
from tuner.engine.models import load_model
from tuner.engine.pipeline import UnsupportedPipelineError
from tuner.engine.specs import resolve_spec
from tuner.evaluation.evaluator import Evaluator

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: threads only contend

QUERY_PROMPT, DOCUMENT_PROMPT = "w5 w6 ", "w7 w8 w9 "
TEXTS = [*random_texts(5, 3, 30, seed=3), "w1"]
runner = CliRunner()


def save_st_model(
    folder: Path,
    pooling: str = "mean",
    dense: tuple[tuple[int, bool, torch.nn.Module], ...] = ((48, True, torch.nn.GELU()), (24, False, torch.nn.Tanh())),
    normalize: bool = True,
    prompts: dict[str, str] | None = None,
) -> Path:
    """A tiny random BERT under sentence-transformers' own modules (Transformer, Pooling, each Dense given as
    (out_features, bias, activation), Normalize), saved by sentence-transformers."""
    base = save_tiny("bert", folder.with_name(folder.name + "-bert"), initializer_range=0.2)
    torch.manual_seed(1)
    modules: list[torch.nn.Module] = [transformer := Transformer(str(base))]
    modules.append(Pooling(width := transformer.get_embedding_dimension(), pooling_mode=pooling))
    for out, bias, activation in dense:
        modules.append(Dense(width, out, bias=bias, activation_function=activation))
        width = out
    if normalize:
        modules.append(Normalize())
    SentenceTransformer(modules=modules, prompts=prompts).save(str(folder))
    return folder


@pytest.fixture(scope="module")
def st_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Mean pooling, Dense 32 → 48 (bias, GELU) → 24 (no bias, Tanh), Normalize, a query and a document prompt."""
    prompts = {"query": QUERY_PROMPT, "document": DOCUMENT_PROMPT}
    return save_st_model(tmp_path_factory.mktemp("st") / "model", prompts=prompts)


@pytest.fixture(scope="module")
def cls_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """CLS pooling written in the older form (one boolean per mode), one Dense (no bias, ReLU) and no Normalize; its
    documents' prompt is saved as `passage`, which sentence-transformers' `encode_document` does not reach."""
    folder = save_st_model(
        tmp_path_factory.mktemp("st") / "cls",
        pooling="cls",
        dense=((16, False, torch.nn.ReLU()),),
        normalize=False,
        prompts={"query": "w4 ", "passage": "w3 "},
    )
    modes = {"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False, "pooling_mode_max_tokens": False}
    write_json(folder / "1_Pooling" / "config.json", {"word_embedding_dimension": 32, **modes})
    return folder


def write_json(path: Path, data: object) -> None:
    path.write_text(json.dumps(data), encoding="utf-8")


def own(folder: Path, texts: list[str], kind: str = "document", **options: object) -> np.ndarray:
    """The folder's vectors as sentence-transformers itself encodes them."""
    model = SentenceTransformer(str(folder))
    encode = model.encode_document if kind == "document" else model.encode_query
    return np.asarray(encode(texts, convert_to_numpy=True, **options), dtype=np.float64)


def close(got: np.ndarray, want: np.ndarray, tolerance: float = 1e-5) -> bool:
    return got.shape == want.shape and float(np.abs(got - want).max()) < tolerance


# --------------------------------------------------------------------------------------------- the encoder


@pytest.mark.parametrize("name", ["st_folder", "cls_folder"])
def test_uncalibrated_vectors_are_sentence_transformers_own(name: str, request: pytest.FixtureRequest) -> None:
    folder: Path = request.getfixturevalue(name)
    encoder = CalibratedEncoder(load_model(str(folder)))  # no --pooling: the folder's own Pooling module names it
    for kind, encode in (("document", encoder.encode_document), ("query", encoder.encode_query)):
        want = own(folder, TEXTS, kind)
        assert close(encode(TEXTS, normalize_embeddings=False), want), kind
        assert close(encode(TEXTS), want / np.linalg.norm(want, axis=1, keepdims=True)), kind


def test_the_fixture_makes_every_part_of_the_pipeline_count(st_folder: Path) -> None:
    """The equality above holds only with the prompts and the Dense modules applied: without either the vectors
    move far beyond its tolerance (or change width)."""
    documents = own(st_folder, TEXTS)
    assert documents.shape[1] == 24 and load_model(str(st_folder)).model.config.hidden_size == 32
    assert np.abs(own(st_folder, TEXTS, prompt="") - documents).max() > 1e-2
    assert np.abs(own(st_folder, TEXTS, "query") - documents).max() > 1e-2
    assert resolve_spec(str(st_folder)).pooling == "mean"


def test_a_prompt_given_replaces_the_folder_s(st_folder: Path) -> None:
    encoder = CalibratedEncoder(load_model(str(st_folder)))
    assert close(encoder.encode_document(TEXTS, prompt=""), own(st_folder, TEXTS, prompt=""))
    assert close(encoder.encode_query(TEXTS, prompt="w1 "), own(st_folder, TEXTS, "query", prompt="w1 "))


# --------------------------------------------------------------------------------------------- refusals


def spoiled(folder: Path, target: Path, change: str) -> Path:
    """A copy of `folder` changed as `change` says."""
    copy = Path(shutil.copytree(folder, target))
    modules = json.loads((copy / "modules.json").read_text(encoding="utf-8"))
    pooling = copy / "1_Pooling" / "config.json"
    if change == "two modes":
        write_json(pooling, {"embedding_dimension": 32, "pooling_mode": ["mean", "cls"]})
    elif change == "two old modes":
        modes = {"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": True}
        write_json(pooling, {"word_embedding_dimension": 32, **modes})
    elif change == "max pooling":
        write_json(pooling, {"embedding_dimension": 32, "pooling_mode": "max"})
    elif change == "prompt left out":
        write_json(pooling, {"embedding_dimension": 32, "pooling_mode": "mean", "include_prompt": False})
    elif change in ("layer norm", "custom module"):
        name = "sentence_transformers.models.LayerNorm" if change == "layer norm" else "my_package.modules.Dense"
        modules.insert(2, {"idx": 2, "name": "2", "path": "2_Extra", "type": name})
    elif change == "dense without weights":
        (copy / "2_Dense" / "model.safetensors").unlink()
    elif change == "foreign activation":
        config = json.loads((copy / "2_Dense" / "config.json").read_text(encoding="utf-8"))
        write_json(copy / "2_Dense" / "config.json", {**config, "activation_function": "my_package.Swish"})
    write_json(copy / "modules.json", modules)
    return copy


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("two modes", "1_Pooling/config.json turns on 2 pooling modes (mean, cls), whose vectors are joined"),
        ("two old modes", "1_Pooling/config.json turns on 2 pooling modes (cls, mean), whose vectors are joined"),
        ("max pooling", "1_Pooling/config.json pools by 'max'; posfair pools by cls, mean or lasttoken"),
        ("prompt left out", "leaves the prompt out of the pooling (include_prompt: false)"),
        ("layer norm", "its module 'sentence_transformers.models.LayerNorm' (2_Extra) is not one posfair applies"),
        ("custom module", "its module 'my_package.modules.Dense' (2_Extra) is not one posfair applies"),
        ("dense without weights", "its Dense module 2_Dense has no weights (model.safetensors or pytorch_model.bin)"),
        (
            "foreign activation",
            "its Dense module 2_Dense activates by 'my_package.Swish'; posfair applies torch.nn modules only",
        ),
    ],
)
def test_what_posfair_cannot_apply_is_refused_naming_it(
    st_folder: Path,
    tmp_path: Path,
    change: str,
    message: str,
) -> None:
    """Each was encoded silently without it: a second pooling mode read as none (or its first), an unknown module
    dropped, and the vectors were not the model's."""
    folder = spoiled(st_folder, tmp_path / "model", change)
    for pooling in (None, "mean"):
        with pytest.raises(UnsupportedPipelineError) as refused:
            load_model(str(folder), pooling=pooling)  # type: ignore[arg-type]
        assert str(refused.value).startswith(f"{folder} is a sentence-transformers folder that posfair cannot encode")
        assert message in str(refused.value)
    result = runner.invoke(app, ["run", "--model", str(folder), "--pooling", "mean"])
    said = " ".join(result.output.split())
    assert result.exit_code == 2 and message in said and isinstance(result.exception, SystemExit), said


# ------------------------------------------------------------------------------------- the other paths


@pytest.fixture(scope="module")
def st_config(st_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A config exported for the folder whose baskets no text of `TEXTS` fills: its documents stay uncalibrated."""
    loaded = load_model(str(st_folder))
    exported = export_of(loaded, loaded.default_config(basket_size=64))
    return write_exported(exported, tmp_path_factory.mktemp("cfg") / "st.yaml")


def test_the_exported_config_records_the_pipeline(st_folder: Path, st_config: Path) -> None:
    pipeline = yaml.safe_load(st_config.read_text(encoding="utf-8"))["model"]["pipeline"]
    assert pipeline["query_prompt"] == QUERY_PROMPT and pipeline["document_prompt"] == DOCUMENT_PROMPT
    assert [(m["type"], m["path"]) for m in pipeline["modules"]] == [
        ("Transformer", ""),
        ("Pooling", "1_Pooling"),
        ("Dense", "2_Dense"),
        ("Dense", "3_Dense"),
        ("Normalize", "4_Normalize"),
    ]
    first, second = pipeline["modules"][2], pipeline["modules"][3]
    assert (first["in_features"], first["out_features"], first["bias"]) == (32, 48, True)
    assert first["activation"] == "torch.nn.modules.activation.GELU" and second["bias"] is False
    digest = hashlib.sha256((st_folder / "3_Dense" / "model.safetensors").read_bytes()).hexdigest()
    assert second["weights"] == {"model.safetensors": digest} and pipeline["modules"][1]["mode"] == "mean"


def test_tune_encode_gives_sentence_transformers_own_vectors(st_folder: Path, st_config: Path, tmp_path: Path) -> None:
    (tmp_path / "texts.txt").write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    for kind, extra in (("document", []), ("query", ["--queries"])):
        out = tmp_path / f"{kind}.npy"
        result = runner.invoke(
            app,
            [
                "encode",
                "--config",
                str(st_config),
                "--input",
                str(tmp_path / "texts.txt"),
                "--output",
                str(out),
                *extra,
            ],
        )
        assert result.exit_code == 0, result.output
        assert close(np.load(out), own(st_folder, TEXTS, kind)), kind


def test_the_pyfunc_gives_sentence_transformers_own_vectors(st_folder: Path, st_config: Path, tmp_path: Path) -> None:
    import mlflow

    from tuner.tracking.registry import save_pyfunc

    save_pyfunc(tmp_path / "model", st_config, CalibratedEncoder.from_yaml(st_config).model.dimension)
    model = mlflow.pyfunc.load_model(str(tmp_path / "model"))
    assert close(np.asarray(model.predict(TEXTS)), own(st_folder, TEXTS))
    assert close(np.asarray(model.predict(TEXTS, params={"kind": "query"})), own(st_folder, TEXTS, "query"))


def test_load_sentence_transformer_gives_the_folder_s_own_vectors(st_folder: Path, st_config: Path) -> None:
    model = load_sentence_transformer(st_config)
    assert close(np.asarray(model.encode_document(TEXTS)), own(st_folder, TEXTS))
    assert close(np.asarray(model.encode_query(TEXTS)), own(st_folder, TEXTS, "query"))


def test_load_sentence_transformer_pools_a_plain_folder_as_its_config_says(tiny_model_dir, tmp_path: Path) -> None:
    """A plain transformers folder tuned with --pooling cls was pooled by sentence-transformers' default (mean)."""
    loaded = load_model(str(tiny_model_dir("bert")), pooling="cls")
    config = write_exported(export_of(loaded, loaded.default_config(basket_size=4)), tmp_path / "cls.yaml")
    texts = random_texts(4, 10, 40, seed=5)
    want = CalibratedEncoder.from_yaml(config).encode_document(texts)
    assert close(np.asarray(load_sentence_transformer(config).encode_document(texts)), want)


def test_the_evaluation_scores_sentence_transformers_own_vectors(st_folder: Path, tmp_path: Path) -> None:
    """Queries, the uncalibrated documents, and a calibrated pass resumed from a cached layer input: the prompts
    and the modules after pooling apply on each, as in `encode_document` / `encode_query`."""
    dataset = load_benchmark(f"jsonl:{write_dataset(tmp_path / 'data', docs=6, words=12)}")
    model = load_model(str(st_folder))
    evaluator = Evaluator(model, dataset, batch_size=4, cache_dir=tmp_path / "cache", prefix_layers=(1,))
    documents = [dataset.corpus[d] for d in dataset.corpus]
    queries = [dataset.queries[q] for q in dataset.queries]
    assert close(evaluator.baseline_vectors()[0], own(st_folder, documents))
    assert close(evaluator.query_vectors(), own(st_folder, queries, "query"))
    config = model.default_config(layers=[1, 2], basket_size=8, strength=1.0)
    calibrated, _ = evaluator.document_vectors(config)
    assert evaluator.counts.resumed == {1: 1}, "the calibrated pass resumed from layer 1's cached inputs"
    assert close(calibrated, CalibratedEncoder(model, config).encode_document(documents, batch_size=4), 1e-6)
    assert np.abs(calibrated - evaluator.baseline_vectors()[0]).max() > 1e-3, "calibration acted"


def test_vectors_cached_without_the_pipeline_are_not_reused(tmp_path: Path) -> None:
    """An evaluator of the same folder without its prompts and modules (as posfair encoded it before) leaves its
    vectors in the cache; the evaluator with them must not take those for its own. Its Dense modules keep the
    hidden size, as EmbeddingGemma's do (768 → 3072 → 768), so the vectors' width cannot tell them apart."""
    from dataclasses import replace

    from tuner.engine.pipeline import NONE

    dense = ((48, True, torch.nn.GELU()), (32, False, torch.nn.Tanh()))
    prompts = {"query": QUERY_PROMPT, "document": DOCUMENT_PROMPT}
    folder = save_st_model(tmp_path / "model", dense=dense, prompts=prompts)
    dataset = load_benchmark(f"jsonl:{write_dataset(tmp_path / 'data', docs=4, words=10)}")
    model = load_model(str(folder))
    bare = replace(model, pipeline=NONE, head=None)
    assert bare.dimension == model.dimension
    Evaluator(bare, dataset, batch_size=4, cache_dir=tmp_path / "cache").baseline_vectors()
    evaluator = Evaluator(model, dataset, batch_size=4, cache_dir=tmp_path / "cache")
    assert close(evaluator.baseline_vectors()[0], own(folder, [dataset.corpus[d] for d in dataset.corpus]))
    assert evaluator.counts.baseline_from_disk == 0


# ------------------------------------------------------------------------------ checked when it loads


def changed(folder: Path, target: Path, change: str) -> Path:
    copy = Path(shutil.copytree(folder, target))
    if change == "prompt":
        config = json.loads((copy / "config_sentence_transformers.json").read_text(encoding="utf-8"))
        config["prompts"]["document"] = "w1 "
        (copy / "config_sentence_transformers.json").write_text(json.dumps(config), encoding="utf-8")
    elif change == "dense weights":
        torch.manual_seed(9)
        Dense(48, 24, bias=False, activation_function=torch.nn.Tanh()).save(str(copy / "3_Dense"))
    elif change == "module dropped":
        modules = json.loads((copy / "modules.json").read_text(encoding="utf-8"))
        write_json(copy / "modules.json", [m for m in modules if m["path"] != "4_Normalize"])
    return copy


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("prompt", "model.pipeline.document_prompt: the config says 'w7 w8 w9 ', but {folder} has 'w1 '"),
        ("dense weights", "model.pipeline.modules[3] (3_Dense): its weights differ (model.safetensors changed)"),
        (
            "module dropped",
            "model.pipeline.modules: the config lists Transformer (.) → Pooling (1_Pooling) → Dense (2_Dense) → "
            "Dense (3_Dense) → Normalize (4_Normalize), but {folder} has Transformer (.) → Pooling (1_Pooling) → "
            "Dense (2_Dense) → Dense (3_Dense)",
        ),
    ],
)
def test_a_folder_whose_pipeline_changed_since_the_export_is_refused(
    st_folder: Path,
    tmp_path: Path,
    change: str,
    message: str,
) -> None:
    folder = changed(st_folder, tmp_path / "model", change)
    loaded = load_model(str(st_folder))
    exported = export_of(loaded, loaded.default_config(basket_size=64))
    data = exported.model_dump(mode="json", by_alias=True)
    config = tmp_path / "cfg.yaml"
    config.write_text(
        yaml.safe_dump({**data, "model": {**data["model"], "name": str(folder), "source": str(folder)}}),
        encoding="utf-8",
    )
    with pytest.raises(ExportError) as refused:
        CalibratedEncoder.from_yaml(config)
    assert message.format(folder=folder) in " ".join(str(refused.value).split())


def test_a_config_exported_before_pipelines_were_recorded(st_folder: Path, tiny_model_dir, tmp_path: Path) -> None:
    """Refused (re-export) where the folder's prompts or Dense modules change its vectors: its calibration was chosen
    on posfair's vectors without them; loaded as before where they change nothing (a Pooling and a Normalize)."""
    plain = save_st_model(tmp_path / "plain", dense=(), prompts={})
    for folder, refused in ((st_folder, True), (plain, False)):
        loaded = load_model(str(folder))
        data = export_of(loaded, loaded.default_config(basket_size=64)).model_dump(mode="json", by_alias=True)
        for key in ("tokenizer", "pipeline", "digest"):
            del data["model"][key]
        config = tmp_path / f"old-{folder.name}.yaml"
        config.write_text(yaml.safe_dump(data), encoding="utf-8")
        if not refused:
            assert close(CalibratedEncoder.from_yaml(config).encode_document(TEXTS), own(folder, TEXTS))
            continue
        with pytest.raises(ExportError) as error:
            CalibratedEncoder.from_yaml(config)
        said = " ".join(str(error.value).split())
        assert (
            "model.pipeline: the config records none: it was exported before posfair applied "
            f"{folder}'s own sentence-transformers pipeline" in said
        )
        assert "(query prompt 'w5 w6 ', document prompt 'w7 w8 w9 ', Dense 2_Dense, Dense 3_Dense)" in said
        assert "Re-export the config for this model (`tune export --study-name s`)" in said


# ----------------------------------------------------------------------------------------- a whole run


def ndcg10(queries: np.ndarray, documents: np.ndarray, relevant: list[int]) -> float:
    """Mean nDCG@10 of each query's one relevant document: 1/log2(rank + 1) within the top 10."""
    scores = queries @ documents.T
    gains = []
    for row, doc in zip(scores, relevant):
        others = np.delete(row, doc)
        assert np.abs(others - row[doc]).min() > 1e-5, "a near-tie in the fixture: change its seed"
        rank = 1 + int((others > row[doc]).sum())
        gains.append(1 / math.log2(rank + 1) if rank <= 10 else 0.0)
    return sum(gains) / len(gains)


def test_tune_run_evaluate_and_every_loader_on_a_sentence_transformers_folder(
    st_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`tune` on the folder without --pooling, `tune evaluate` of its export to figures computed from
    sentence-transformers' own vectors, and the export's vectors alike through the encoder, `tune encode`, the
    registered pyfunc and `load_sentence_transformer`."""
    import mlflow

    monkeypatch.chdir(tmp_path)
    data = write_dataset(tmp_path / "data", docs=8, words=15)
    tracking = f"sqlite:///{tmp_path / 'mlflow.db'}"
    (tmp_path / "space.yaml").write_text("basket_sizes: [8, 16]\n", encoding="utf-8")
    options = ["--dataset", f"jsonl:{data}", "--heldout", "", "--trials", "3", "--hm-floor=-90%", "--profile-docs", "2"]
    options += ["--bootstrap", "20", "--no-prune", "--budget", "none", "--selection", "lowest", "--space", "space.yaml"]
    options += ["--output", "best.yaml", "--tracking-uri", tracking]
    result = runner.invoke(app, ["run", "--model", str(st_folder), *options])
    assert result.exit_code == 0, f"{result.output[-3000:]}\n{result.exception!r}"
    exported = load_exported(tmp_path / "best.yaml")
    assert exported.model.pooling == "mean" and exported.model.pipeline is not None
    assert exported.model.pipeline.document_prompt == DOCUMENT_PROMPT

    result = runner.invoke(
        app,
        [
            "evaluate",
            "--model",
            str(st_folder),
            "--dataset",
            f"jsonl:{data}",
            "--config",
            "best.yaml",
            "--no-paper-default",
        ]
        + ["--no-sea", "--general", "", "--no-shuffled", "--bootstrap", "20", "--json", "table.json"],
    )
    assert result.exit_code == 0, f"{result.output[-3000:]}\n{result.exception!r}"
    rows = json.loads((tmp_path / "table.json").read_text(encoding="utf-8"))["rows"]
    dataset = load_benchmark(f"jsonl:{data}")
    doc_ids, query_ids = list(dataset.corpus), list(dataset.queries)
    relevant = [doc_ids.index(next(iter(dataset.qrels[q]))) for q in query_ids]
    queries = own(st_folder, [dataset.queries[q] for q in query_ids], "query")
    texts = [dataset.corpus[d] for d in doc_ids]
    documents = {
        "plain": own(st_folder, texts),
        "winner": np.asarray(load_sentence_transformer("best.yaml").encode_document(texts)),
    }
    assert len(rows) == 2 and exported.calibration.strength > 0, [r["name"] for r in rows]
    for row, key in zip(rows, ("plain", "winner")):
        assert abs(row["metrics"]["ndcg10"] - ndcg10(queries, documents[key], relevant)) < 1e-9, row["name"]

    encoder = CalibratedEncoder.from_yaml("best.yaml")
    assert close(encoder.encode_query(TEXTS), own(st_folder, TEXTS, "query"))
    vectors = encoder.encode_document(TEXTS)
    assert close(np.asarray(load_sentence_transformer("best.yaml").encode_document(TEXTS)), vectors)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking)
    champion = mlflow.pyfunc.load_model(f"models:/{exported.provenance.registered_model}@champion")
    assert close(np.asarray(champion.predict(TEXTS)), vectors, 1e-6)
    assert close(np.asarray(champion.predict(TEXTS, params={"kind": "query"})), own(st_folder, TEXTS, "query"))
