"""Every model family posfair says it calibrates (tuner.engine.adapters: INTERFACE and ADAPTERS), on a tiny
random model of it, against the oracle: the engine's calibrated vectors equal the plain full-matrix oracle's,
and an uncalibrated pass equals the model as transformers runs it by default.
"""

from __future__ import annotations

import dataclasses
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoConfig, AutoModel

from tests.tiny import PLAIN, build_tokenizer, load_as, random_texts
from tuner.calibration.attention import calibrating
from tuner.calibration.reference import register_reference
from tuner.engine.adapters import ADAPTERS, INTERFACE, ROUTED, SUPPORTED
from tuner.engine.encoder import CalibratedEncoder
from tuner.engine.models import LoadedModel, load_model

SMALL = {
    "vocab_size": 204,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 64,
}
DECODERS = {"qwen3", "llama", "mistral", "gemma3_text", "eurobert"}
SHAPE = {  # what a family's config calls its sizes, where it differs from BERT's names
    "distilbert": {"dim": 32, "n_layers": 2, "n_heads": 4, "hidden_dim": 64},
    "electra": {"embedding_size": 32},
    **{family: {"num_key_value_heads": 2, "head_dim": 8} for family in DECODERS},
}
POOLING = {
    **{family: "last" for family in DECODERS - {"eurobert"}},
    "distilbert": "mean",
    "nomic_bert": "mean",
    "mpnet": "mean",
}
TEXTS = random_texts(5, 3, 40, seed=4)


def test_the_lists_do_not_overlap() -> None:
    assert not set(INTERFACE) & set(ADAPTERS)


def tiny_family(family: str, folder: Path, layers: int = 2) -> LoadedModel:
    """A tiny random model of `family` with `layers` layers, saved with a tokenizer and loaded as posfair loads it."""
    # weights wide enough that calibration moves the vectors, not so wide that a softmax underflows in float32
    config = AutoConfig.for_model(
        family,
        **(SMALL | {"num_hidden_layers": layers}),
        **(SHAPE.get(family, {}) | ({"n_layers": layers} if family == "distilbert" else {})),
        max_position_embeddings=66,
        pad_token_id=1,
        initializer_range=0.1,
    )
    torch.manual_seed(0)
    AutoModel.from_config(config).save_pretrained(folder)
    # decoders: text then the pooled end-of-text token; encoders: <s> 0, <pad> 1, </s> 2 (positions from 2 fit every
    # family)
    build_tokenizer("qwen3" if family in DECODERS else "xlmr", 64).save_pretrained(folder)
    return load_model(str(folder), pooling=POOLING.get(family, "cls"))


@pytest.mark.parametrize("family", sorted(SUPPORTED))
def test_a_tiny_model_of_every_supported_family_calibrates_as_the_oracle(family: str, tmp_path: Path) -> None:
    loaded = tiny_family(family, tmp_path)  # the probe: every layer reaches the attention function
    assert len(loaded.tokenizer(TEXTS[0])["input_ids"]) == len(TEXTS[0].split()) + (1 if family in DECODERS else 2)
    calibration = loaded.default_config(strength=0.9, basket_size=6, layers=1.0)
    oracle = dataclasses.replace(loaded, model=load_as(tmp_path, register_reference()))
    got = CalibratedEncoder(loaded, calibration).encode(TEXTS, batch_size=3)
    assert np.abs(got - CalibratedEncoder(oracle, calibration).encode(TEXTS, batch_size=3)).max() < 1e-5
    plain = CalibratedEncoder(dataclasses.replace(loaded, model=load_as(tmp_path, PLAIN))).encode(TEXTS, batch_size=3)
    uncalibrated = CalibratedEncoder(loaded).encode(TEXTS, batch_size=3)
    assert np.abs(uncalibrated - plain).max() < 1e-5
    assert np.abs(got - uncalibrated).max() > 1e-4, "calibration moved the vectors"


@pytest.mark.parametrize("family", sorted({*ADAPTERS, "bert"}))
def test_calibrating_layer_l_changes_the_hidden_states_from_transformers_layer_l_on(
    family: str,
    tmp_path: Path,
) -> None:
    """Layers are numbered from 0 in the order transformers runs them (`hidden_states[k + 1]` is layer k's output):
    calibrating layer L leaves every hidden state before layer L's output as it was and changes that one. The
    oracle of the test above reads the layer numbers the adapter gives, so it cannot tell a shifted numbering."""
    loaded = tiny_family(family, tmp_path, layers=3)
    batch = loaded.tokenizer(TEXTS, padding=True, return_tensors="pt")

    def hidden_states(layer: int | None) -> tuple[torch.Tensor, ...]:
        with torch.inference_mode(), ExitStack() as scope:
            if layer is not None:
                spec = loaded.default_config(strength=0.9, basket_size=6, layers=[layer]).resolve(loaded.num_layers)
                scope.enter_context(calibrating(spec))
            return loaded.model(**batch, output_hidden_states=True).hidden_states

    plain = hidden_states(None)
    assert len(plain) == 4, "the embeddings' output, then each of the three layers'"
    for layer in range(3):
        calibrated = hidden_states(layer)
        moved = [float((a - b).abs().max()) > 1e-5 for a, b in zip(plain, calibrated, strict=True)]
        assert moved[: layer + 1] == [False] * (layer + 1) and moved[layer + 1], (family, layer, moved)


def test_the_models_page_lists_exactly_the_supported_families() -> None:
    """docs/models.md's family table is a claim: each row is a family this file tests, with how it is reached."""
    page = (Path(__file__).parents[1] / "docs" / "models.md").read_text(encoding="utf-8")
    table = page.split("<!-- families:start -->")[1].split("<!-- families:end -->")[0]
    rows = dict(line.split("|")[1:3] for line in table.strip().splitlines()[2:])
    documented = {name.strip().strip("`"): how.strip() for name, how in rows.items()}
    assert set(documented) == SUPPORTED
    for family, how in documented.items():
        adapter = ADAPTERS.get(family)
        if adapter is None:
            assert how == "the attention interface", family
        elif adapter.forward is None:
            assert how == "the attention interface; an adapter numbers its layers", family
        else:
            assert how.startswith("an adapter routes its attention to the interface"), family


def test_the_readme_names_every_supported_family_and_how_it_is_reached() -> None:
    """The README's sentence on model families is a claim: the interface's families, then the adapters' own."""
    text = " ".join((Path(__file__).parents[1] / "README.md").read_text(encoding="utf-8").split())
    sentence = text.split("Model families, each tested against a full-matrix oracle: ")[1].split(" ([Models]")[0]
    interface, routed = sentence.removeprefix("through transformers' attention interface ").split(
        "; through an adapter of its own "
    )

    def names(part: str) -> set[str]:
        return {name.strip().strip("`") for name in part.split(",")}

    assert names(routed) == set(ROUTED)
    assert names(interface) == SUPPORTED - set(ROUTED)
