"""Batches sized by tokens, the batch chooser, and the half-precision path: what a GPU run does, on CPU tensors.

No GPU was available to this project. The chooser is tested against a simulated CUDA device (its free
memory is what `torch.cuda.mem_get_info` reports, monkeypatched); bf16 and fp16 models run on CPU.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from transformers import XLMRobertaConfig

from tests.tiny import WORDS, load_as, random_texts, save_tiny
from tuner.calibration.reference import register_reference
from tuner.engine.batching import Batches, auto_batch_size, auto_batch_tokens, choose_batching, passage_bytes
from tuner.engine.encoder import CalibratedEncoder
from tuner.engine.models import LoadedModel, default_dtype, load_model
from tuner.engine.specs import REGISTRY
from tuner.evaluation.evaluator import Evaluator

pytestmark = pytest.mark.usefixtures("one_thread")
GiB = 2**30


def text(words: int) -> str:
    return " ".join(WORDS[i % len(WORDS)] for i in range(words))


@pytest.fixture(scope="module")
def xlmr(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    folder = save_tiny("xlmr", tmp_path_factory.mktemp("xlmr"), max_length=256, initializer_range=0.5)
    return load_model(str(folder), pooling="cls")


# --- token budgets ------------------------------------------------------------------------------


def test_a_token_budget_packs_short_passages_and_isolates_long_ones(xlmr: LoadedModel) -> None:
    # Tokens with [CLS] and [SEP]: 202, 152, 102, 102, 52, 52, 52, 22 (and 302, cut at 256).
    texts = [text(n) for n in (100, 50, 200, 300, 100, 50, 50, 20, 150)]
    batches = Batches.build(xlmr, texts, batch_size=256, max_tokens=400)
    # Long first; each batch holds as many as fit 400 tokens at its first (longest) text's length:
    # 256 → 1 row; 202 → 1; 152 → 2 (152, 102); 102 → 3 (102, 52, 52); 52 → 7 (52, 22).
    assert batches.shapes == [(1, 256), (1, 202), (2, 152), (3, 102), (2, 52)]
    assert all(rows * length <= 400 or rows == 1 for rows, length in batches.shapes)
    assert [list(r) for r in batches.rows] == [[3], [2], [8, 0], [4, 1, 5], [6, 7]]
    assert batches.truncated == 1 and batches.count == 9


def test_a_token_budget_leaves_the_vectors_as_they_were(xlmr: LoadedModel) -> None:
    texts = random_texts(12, 5, 120, seed=3)
    by_count = CalibratedEncoder(xlmr, xlmr.default_config(basket_size=8)).encode(texts, batch_size=4)
    by_tokens = CalibratedEncoder(xlmr, xlmr.default_config(basket_size=8)).encode(texts, batch_tokens=300)
    assert np.abs(by_count - by_tokens).max() < 1e-5  # padding differs, the masked maths does not


def test_long_passage_models_are_batched_by_tokens_and_minilm_as_before(xlmr: LoadedModel) -> None:
    assert {alias for alias, spec in REGISTRY.items() if spec.long_passages} == {
        "bge-m3",
        "gte-multilingual-base",
        "qwen3-embedding-0.6b",
        "qwen3-embedding-4b",
        "qwen3-embedding-8b",
    }
    assert not REGISTRY["minilm"].long_passages
    assert choose_batching(xlmr) == (auto_batch_size(xlmr), None), "a model outside the registry: passages, as before"
    long = dataclasses.replace(xlmr, spec=dataclasses.replace(xlmr.spec, long_passages=True))
    assert choose_batching(long) == (256, auto_batch_size(long) * 256)
    assert choose_batching(long, batch_size=8) == (8, None), "--batch-size alone: passages, as asked"
    assert choose_batching(long, batch_tokens=1000) == (256, 1000)


# --- the chooser on a simulated GPU -------------------------------------------------------------


def bge_m3_shaped(dtype: torch.dtype, device: str) -> LoadedModel:
    """bge-m3's published config (XLM-R large: hidden 1024, 16 heads, FFN 4096, 8,194 positions), no weights,
    placed on `device` as far as the chooser can tell."""

    class Placed(LoadedModel):
        @property
        def device(self) -> torch.device:
            return torch.device(device)

    config = XLMRobertaConfig(
        hidden_size=1024,
        num_attention_heads=16,
        intermediate_size=4096,
        num_hidden_layers=24,
        max_position_embeddings=8194,
        pad_token_id=1,
    )
    model = SimpleNamespace(config=config, dtype=dtype)
    placed = Placed(REGISTRY["bge-m3"], model, SimpleNamespace(model_max_length=8192), "test")  # type: ignore[arg-type]
    assert placed.max_length == 8192
    return placed


@pytest.mark.parametrize(("free_gib", "passages"), [(80, 64), (16, 16)])
def test_on_a_gpu_bge_m3_gets_as_many_8k_passages_as_fit_half_the_free_memory(
    monkeypatch, free_gib: int, passages: int
) -> None:
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free_gib * GiB, 141 * GiB))
    model = bge_m3_shaped(torch.bfloat16, "cuda")
    # One 8,192-token passage: hidden states and FFN of a layer in bf16, 8192 × (6·1024 + 2·4096) × 2 bytes; the
    # padding mask, boolean (1 byte) and SDPA's bf16 additive copy (2 bytes), 8192² × 3; the pooled row's float32
    # heads × tokens rows, 4 × 16 × 8192 × 4. No heads × tokens² score matrix: SDPA's kernels never form one.
    per_passage = 8192 * (6 * 1024 + 2 * 4096) * 2 + 8192**2 * 3 + 4 * 16 * 8192 * 4
    assert per_passage == 438_304_768
    fit = free_gib * GiB // 2 // per_passage  # 80 GiB: 97 → 64 (a power of two); 16 GiB: 19 → 16
    assert auto_batch_size(model) == passages and passages <= fit < 2 * passages
    assert auto_batch_tokens(model) == passages * 8192
    assert choose_batching(model) == (256, passages * 8192)


def test_on_a_cpu_the_chooser_caps_at_16_passages_whatever_the_memory(monkeypatch) -> None:
    import psutil

    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=24 * GiB))
    model = bge_m3_shaped(torch.float32, "cpu")
    per_passage = 8192 * (6 * 1024 + 2 * 4096) * 4 + 8192**2 * 5 + 4 * 16 * 8192 * 4  # float32 on CPU
    assert auto_batch_size(model) == 8 == 2 ** int(np.log2(12 * GiB // per_passage))
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=2000 * GiB))
    assert auto_batch_size(model) == 16


def test_mean_pooling_budgets_the_engines_float32_basket_sums(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (80 * GiB, 141 * GiB))
    model = bge_m3_shaped(torch.bfloat16, "cuda")
    mean = dataclasses.replace(model, spec=dataclasses.replace(model.spec, pooling="mean"))
    # two float32 basket sums and one basket's output, tokens × hidden each, instead of the pooled row's rows
    assert passage_bytes(mean) - passage_bytes(model) == 3 * 8192 * 1024 * 4 - 4 * 16 * 8192 * 4


def test_models_load_in_bf16_on_a_gpu_that_has_it_and_float32_elsewhere(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: True)
    assert default_dtype("cuda") == torch.bfloat16 and default_dtype("cuda:1") == torch.bfloat16
    assert default_dtype("cpu") == torch.float32
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: False)
    assert default_dtype("cuda") == torch.float32


# --- half precision, whole models on CPU --------------------------------------------------------

# Through a whole model every layer rounds its output to the half type, so the vectors of the engine and of
# the oracle (both running the model in that type) agree to a few roundings of 8 (bf16) or 11 (fp16) bits.
WHOLE_MODEL_TOLERANCE = {torch.bfloat16: 5e-2, torch.float16: 5e-3}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("kind", "pooling"), [("xlmr", "cls"), ("qwen3", "last")])
def test_half_precision_models_encode_and_resume_like_full_passes(
    tmp_path, dtype: torch.dtype, kind: str, pooling: str
) -> None:
    folder = save_tiny(kind, tmp_path / kind, initializer_range=0.5)
    model = load_model(str(folder), pooling=pooling, dtype=dtype, device="cpu")
    assert model.model.dtype == dtype
    texts = random_texts(9, 10, 60, seed=2)
    config = model.default_config(strength=0.8, basket_size=8, layers="last:2")
    got = CalibratedEncoder(model, config).encode(texts, batch_size=4)
    assert got.dtype == np.float32 and np.allclose(np.linalg.norm(got, axis=1), 1, atol=1e-5)
    oracle = dataclasses.replace(model, model=load_as(folder, register_reference(), dtype=dtype))
    assert (
        np.abs(got - CalibratedEncoder(oracle, config).encode(texts, batch_size=4)).max() < WHOLE_MODEL_TOLERANCE[dtype]
    )

    # A trial resumed from half-precision layer inputs cached by the baseline pass equals the full pass.
    from tuner.data import PositionalDataset

    dataset = PositionalDataset(
        "half", {f"d{i}": t for i, t in enumerate(texts)}, {"q": texts[0][:20]}, {"q": {"d0": 1}}
    )
    evaluator = Evaluator(model, dataset, batch_size=4, cache_dir=tmp_path / "cache", prefix_layers=[1, 2])
    evaluator.run(None)
    vectors, _ = evaluator.document_vectors(config)
    assert evaluator.counts.resumed, "the trial resumed from a cached layer"
    assert np.abs(vectors - got).max() < 1e-6


def test_copies_to_a_gpu_go_through_pinned_memory_without_blocking_the_host(monkeypatch) -> None:
    from tuner.engine.batching import to_device

    tokens = torch.ones(2, 3, dtype=torch.long)
    assert to_device(tokens, torch.device("cpu")) is tokens, "on CPU nothing is copied"
    copies = []
    monkeypatch.setattr(
        torch.Tensor,
        "pin_memory",
        lambda self: SimpleNamespace(
            to=lambda device, non_blocking=False: copies.append((device, non_blocking)) or "on the gpu"
        ),
    )
    assert to_device(tokens, torch.device("cuda", 1)) == "on the gpu"
    assert copies == [(torch.device("cuda", 1), True)]
