"""What the overhead benchmark runs: its methods and calibration, the processes' settings, one measuring
process's case and the table's columns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

METHODS = ("sdpa", "eager", "oracle", "engine")
# The paper's CLS-Soft setting of §5.2: λ 0.5, basket 128, last 50% of layers.
CALIBRATION = {"variant": "cls_soft", "strength": 0.5, "basket_size": 128, "layers": 0.5}
CHILD_ENV = {
    "MALLOC_MMAP_THRESHOLD_": "65536",
    "MALLOC_ARENA_MAX": "2",
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_VERBOSITY": "error",
}
WARMUP_TOKENS = 32
KIB = 1024


@dataclass(frozen=True)
class Shape:
    """A randomly initialised XLM-R encoder (bge-m3's architecture)."""

    hidden: int
    heads: int
    intermediate: int
    vocab: int
    max_positions: int


SHAPES = {
    # bge-m3's width; the vocabulary is cut from 250,002 to 8,192 rows (only the embedding lookup sees it).
    "xlmr": Shape(hidden=1024, heads=16, intermediate=4096, vocab=8192, max_positions=8194),
    "tiny": Shape(hidden=32, heads=4, intermediate=64, vocab=64, max_positions=514),
}


@dataclass(frozen=True)
class Case:
    """One process: one model, pooling, length, batch and method."""

    model: str  # "xlmr" | "tiny" (random XLM-R) | "minilm" (the real all-MiniLM-L6-v2)
    method: str  # one of METHODS
    length: int
    batch: int
    pooling: str = "cls"
    layers: int = 2  # random XLM-R only
    repeats: int = 3
    basket: int = CALIBRATION["basket_size"]
    pad_one: bool = False  # the last item holds 3/4 of `length` real tokens, the rest is padding
    run: int = 1  # 2 for the noise-floor repeat of sdpa
    call_repeats: int = 3  # engine only: timed pairs of one calibrated layer's attention call
    threads: int = 0  # torch threads; 0 leaves torch's default


PLAIN = ("sdpa", "eager", "sdpa#2")  # uncalibrated: independent of the pooling


@dataclass
class Column:
    """One configuration measured with every method: a column of the final table."""

    model: str
    pooling: str
    length: int
    batch: int
    layers: int
    repeats: int
    pad_one: bool
    threads: int = 0
    plain_from: Column | None = None  # a column with the same forward pass whose plain processes are reused
    results: dict[str, dict[str, Any]] = field(default_factory=dict)  # "sdpa", "sdpa#2", "eager", ...
    errors: dict[str, str] = field(default_factory=dict)

    @property
    def title(self) -> str:
        name = {"xlmr": "XLM-R", "tiny": "tiny XLM-R", "minilm": "MiniLM"}[self.model]
        return f"{name} {self.pooling} {self.length}×{self.batch}"

    def case(self, method: str, run: int = 1) -> Case:
        return Case(
            self.model,
            method,
            self.length,
            self.batch,
            self.pooling,
            self.layers,
            self.repeats,
            pad_one=self.pad_one,
            run=run,
            call_repeats=5 if self.length <= 1024 else 3,
            threads=self.threads,
        )

    def same_forward(self, other: Column) -> bool:
        keys = ("model", "length", "batch", "layers", "repeats", "pad_one", "threads")
        return all(getattr(self, k) == getattr(other, k) for k in keys)
