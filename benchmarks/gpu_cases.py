"""The GPU check's cases: what a run measures on each device, and the seeded random models, inputs and calibration
of each case."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel


@dataclass(frozen=True)
class Case:
    """One model, pooling and length; `batch` passages of `length` tokens, the last one padded to 3/4."""

    model: str  # "xlmr" | "qwen3"
    pooling: str
    length: int
    batch: int

    @property
    def title(self) -> str:
        return f"{self.model} {self.pooling} {self.length}×{self.batch}"


@dataclass(frozen=True)
class Plan:
    """What one run measures, on which device."""

    device: str
    dtype: torch.dtype
    width: str  # "bge-m3" | "tiny": XLM-R's width
    cases: tuple[Case, ...]
    pairs: int
    warmups: int
    basket: int
    oracle_length: int
    pinned: SDPBackend  # SDPA's kernel in the comparable path: the one the engine's mean-pooling path calls itself
    threads: int = 0  # torch threads (0: torch's default)


def plan_for(device: str, pairs: int | None = None) -> Plan:
    """The CUDA plan, or its reduced CPU form."""
    if device == "cuda":
        lengths, per_batch = (512, 2048, 8192), 32768
        cases = tuple(
            Case(model, pooling, n, per_batch // n)
            for model, pooling in (("xlmr", "cls"), ("xlmr", "mean"), ("qwen3", "last"))
            for n in lengths
        )
        return Plan("cuda", torch.bfloat16, "bge-m3", cases, pairs or 10, 3, 128, 512, SDPBackend.EFFICIENT_ATTENTION)
    cases = tuple(
        Case(model, pooling, n, 2)
        for model, pooling in (("xlmr", "cls"), ("xlmr", "mean"), ("qwen3", "last"))
        for n in (64, 128)
    )
    # tiny: threads only contend
    return Plan("cpu", torch.float32, "tiny", cases, pairs or 3, 1, 16, 64, SDPBackend.FLASH_ATTENTION, threads=1)


WIDTHS = {  # XLM-R: hidden, heads, intermediate, layers
    "bge-m3": (1024, 16, 4096, 24),
    "tiny": (32, 4, 64, 4),
}


def build_model(case: Case, plan: Plan) -> torch.nn.Module:
    """Random weights (seeded), the posfair attention function, eval mode, on the plan's device and dtype."""
    from transformers import Qwen3Config, Qwen3Model, XLMRobertaConfig, XLMRobertaModel

    from tuner.calibration import ATTENTION_NAME, register

    register()
    torch.manual_seed(0)
    if case.model == "xlmr":
        hidden, heads, intermediate, layers = WIDTHS[plan.width]
        config = XLMRobertaConfig(
            vocab_size=8192,
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            intermediate_size=intermediate,
            max_position_embeddings=8194,
            type_vocab_size=1,
            pad_token_id=1,
            bos_token_id=0,
            eos_token_id=2,
        )
        model = XLMRobertaModel(config, add_pooling_layer=False)
    else:
        config = Qwen3Config(
            vocab_size=8192,
            hidden_size=128,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            intermediate_size=256,
            max_position_embeddings=8192,
            pad_token_id=0,
            bos_token_id=2,
            eos_token_id=3,
        )
        model = Qwen3Model(config)
    model.set_attn_implementation(ATTENTION_NAME)
    return model.to(device=plan.device, dtype=plan.dtype).eval()


def inputs_for(case: Case, device: str) -> dict[str, torch.Tensor]:
    """Random token ids between the model's start and end tokens; the last item padded to 3/4 of the length,
    on the right for XLM-R and on the left for Qwen3 (as Qwen3-Embedding pads)."""
    generator = torch.Generator().manual_seed(1)
    start, end, pad = (0, 2, 1) if case.model == "xlmr" else (2, 3, 0)
    ids = torch.randint(4, 8192, (case.batch, case.length), generator=generator)
    mask = torch.ones_like(ids)
    ids[:, 0], ids[:, -1] = start, end
    real = max(2, case.length * 3 // 4)
    if case.model == "xlmr":
        ids[-1, real - 1], ids[-1, real:], mask[-1, real:] = end, pad, 0
    else:
        cut = case.length - real
        ids[-1, :cut], ids[-1, cut], mask[-1, :cut] = pad, start, 0
    return {"input_ids": ids.to(device), "attention_mask": mask.to(device)}


def spec_for(case: Case, plan: Plan, model: torch.nn.Module, **overrides: object) -> Any:
    from tuner.calibration import CalibrationConfig

    values = {
        "variant": "cls_soft",
        "strength": 0.5,
        "basket_size": plan.basket,
        "layers": 0.5,
        "pooling": case.pooling,
        "padding_side": "left" if case.model == "qwen3" else "right",
        **overrides,
    }
    return CalibrationConfig(**values).resolve(model.config.num_hidden_layers)


@contextlib.contextmanager
def kernels(path: str, plan: Plan) -> Iterator[None]:
    """SDPA as torch picks it ("default") or pinned to the plan's kernel ("pinned")."""
    with sdpa_kernel(plan.pinned) if path == "pinned" else contextlib.nullcontext():
        yield


PATHS = ("pinned", "default")
