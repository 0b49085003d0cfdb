"""Texts → length-sorted token batches, sized to what the device holds, and which of them calibration can change."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass

import numpy as np
import torch

from tuner.calibration import ResolvedCalibration
from tuner.calibration.rows import fills_a_basket
from tuner.engine.models import LoadedModel

log = logging.getLogger(__name__)

# On CPU a forward pass gains no throughput from more than this many passages per batch (MiniLM on
# WikiPos here: 8, 16, 32 and 64 encode equally fast within noise), so bigger batches only cost RAM.
CPU_BATCH_CAP = 16
GPU_BATCH_CAP = 256

BatchScope = Callable[[int], AbstractContextManager[object]]  # batch index → what to hold open around its forward


@dataclass(frozen=True)
class Batches:
    """Texts tokenised once into length-sorted batches: the one batching the encoder and the caches share."""

    inputs: tuple[dict[str, torch.Tensor], ...]  # per batch, on CPU
    rows: tuple[np.ndarray, ...]  # per batch: the document indices of its rows
    count: int
    truncated: int

    @classmethod
    def build(cls, model: LoadedModel, texts: Sequence[str], batch_size: int, max_tokens: int | None = None) -> Batches:
        """At most `batch_size` texts per batch and, with `max_tokens`, at most that many padded tokens (rows ×
        the batch's longest text): batches of short passages then hold more of them than batches of long ones,
        and memory stays bounded by tokens. A text longer than the budget gets a batch of its own."""
        tokenizer, max_length = model.tokenizer, model.max_length
        if not texts:  # no batch: the tokenizer raises IndexError on an empty list
            return cls((), (), 0, 0)
        lengths = [len(ids) for ids in tokenizer(list(texts), add_special_tokens=True, truncation=False)["input_ids"]]
        truncated = sum(n > max_length for n in lengths)
        if truncated:
            log.warning("%d of %d texts exceed %d tokens and are truncated", truncated, len(texts), max_length)
        order = np.argsort([-n for n in lengths], kind="stable")  # long first: little padding per batch
        inputs, rows = [], []
        start = 0
        while start < len(texts):
            size = batch_size
            if max_tokens is not None:  # the first text is the batch's longest: it sets the padded length
                size = min(size, max(1, max_tokens // min(lengths[order[start]], max_length)))
            index = order[start : start + size]
            batch = tokenizer(
                [texts[i] for i in index], padding=True, truncation=True, max_length=max_length, return_tensors="pt"
            )
            inputs.append(dict(batch))
            rows.append(index)
            start += size
        return cls(tuple(inputs), tuple(rows), len(texts), truncated)

    @property
    def shapes(self) -> list[tuple[int, int]]:
        """(rows, padded length) of every batch: the layout of a cached layer's hidden states."""
        return [tuple(b["input_ids"].shape) for b in self.inputs]  # type: ignore[misc]

    def layer_tokens(self, indices: Sequence[int], layers: int) -> int:
        """The cost of running `layers` transformer layers over the batches `indices`: padded tokens × layers.

        A hardware-independent unit: what a study costs here in layer-tokens it costs on a GPU, so CPU runs
        and GPU runs can be compared by it (attention's quadratic part aside)."""
        return layers * sum(int(self.inputs[i]["input_ids"].numel()) for i in indices)

    @property
    def longest(self) -> int:
        """Tokens in the longest text (after truncation): batches are long first, padded to their longest."""
        return max((t for _, t in self.shapes), default=0)

    def tokens(self) -> int:
        """Padded tokens over all batches: what one layer's hidden states hold."""
        return sum(r * t for r, t in self.shapes)

    def __len__(self) -> int:
        return len(self.inputs)

    def changed_by(self, spec: ResolvedCalibration | None) -> list[int]:
        """The batches `spec` can change (a passage in them fills a basket): those a pass that copies the
        baseline for the rest encodes (`forward`)."""
        return [i for i in range(len(self.inputs)) if can_change(spec, self.inputs[i]["attention_mask"])]


def choose_batching(
    model: LoadedModel, batch_size: int | None = None, batch_tokens: int | None = None
) -> tuple[int, int | None]:
    """(texts per batch, padded tokens per batch or None). Given values win. By default a long-passage model
    (`ModelSpec.long_passages`) is batched by tokens, within the memory `auto_batch_size` allows at its
    maximum length, so FineWeb-PosQ's ~1,300-token passages fill a batch six times as full as 8K ones would;
    other models get `auto_batch_size` texts (MiniLM: 16 on CPU, as always)."""
    for flag, value in (("--batch-size", batch_size), ("--batch-tokens", batch_tokens)):
        if value is not None and (isinstance(value, bool) or value < 1):
            raise ValueError(f"{flag} must be at least 1, got {value}")
    if batch_tokens is None and batch_size is None and model.spec.long_passages:
        batch_tokens = auto_batch_tokens(model)
    if batch_size is None:
        batch_size = GPU_BATCH_CAP if batch_tokens is not None else auto_batch_size(model)
    return batch_size, batch_tokens


def auto_batch_tokens(model: LoadedModel, fraction: float = 0.5) -> int:
    """Padded tokens per batch: as many as `auto_batch_size` texts of the model's maximum length. Memory per
    batch is then bounded as before: hidden states grow with tokens, and a batch's padding mask with
    tokens × its longest text, which is at most the maximum length."""
    return auto_batch_size(model, fraction) * model.max_length


def passage_bytes(model: LoadedModel) -> int:
    """The working set of one passage of the model's maximum length inside one layer, as SDPA runs it.

    SDPA's fused kernels (flash on CPU, memory-efficient on CUDA) never form the heads × tokens × tokens
    scores: what grows with the square of the length is transformers' boolean (tokens, tokens) padding mask
    and the additive copy of it in the model's dtype that SDPA makes. The rest is linear: the hidden states,
    Q/K/V, the attention output and the feed-forward intermediate in the model's dtype, and the engine's
    float32 rows (mean pooling: two basket sums and one basket's output, B×H×Q×D each; cls / last: a few
    heads × tokens rows).
    """
    config = model.model.config
    tokens = model.max_length
    itemsize = torch.finfo(model.model.dtype).bits // 8
    hidden = int(config.hidden_size)
    intermediate = int(getattr(config, "intermediate_size", 4 * hidden))
    heads = int(config.num_attention_heads)
    layer = tokens * (6 * hidden + 2 * intermediate) * itemsize
    mask = tokens**2 * (1 + itemsize)
    engine = 3 * tokens * hidden * 4 if model.spec.pooling == "mean" else 4 * heads * tokens * 4
    return layer + mask + engine


def auto_batch_size(model: LoadedModel, fraction: float = 0.5) -> int:
    """The largest power of two whose forward pass (`passage_bytes` per passage) fits in `fraction` of the
    device's free memory. Capped per device kind, so the choice (part of every cache key) does not move with
    the free memory of the moment unless memory is short."""
    if model.device.type == "cuda":
        free, cap = torch.cuda.mem_get_info(model.device)[0], GPU_BATCH_CAP
    else:
        import psutil

        free, cap = psutil.virtual_memory().available, CPU_BATCH_CAP
    fit = min(int(free * fraction // passage_bytes(model)), cap)
    size = 1
    while size * 2 <= fit:
        size *= 2
    return size


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`tensor` on `device`; to a GPU through pinned memory and without blocking the host, which can then queue
    the forward while the copy runs (torch keeps the pinned buffer until the copy is done)."""
    if device.type != "cuda" or tensor.device.type != "cpu":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


def too_short(batches: Batches, spec: ResolvedCalibration) -> int:
    """Texts whose content (real tokens less the isolated ones) fills no basket: calibration leaves them as they are."""
    return sum(
        int((~fills_a_basket(b["attention_mask"].sum(-1), spec.basket_size, len(spec.policies))).sum())
        for b in batches.inputs
    )


def can_change(spec: ResolvedCalibration | None, attention_mask: torch.Tensor) -> bool:
    """Whether calibrating this batch can change any of its vectors."""
    if spec is None or spec.strength == 0.0:
        return False
    return bool(fills_a_basket(attention_mask.sum(-1), spec.basket_size, len(spec.policies)).any())
