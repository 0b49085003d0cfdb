"""What a tuning run will cost on this device, estimated before it starts from one timed probe.

A forward pass costs about in proportion to its padded tokens; attention adds a term in the square of the
length, so a rate measured on the longest passages overstates shorter ones, and trials that resume from a
cached layer cost less than a full encode: the estimate is an upper bound. The probe is a forward pass of
the first few (longest) passages, uncalibrated; cls and last-token calibration recompute one row per layer
and cost what a plain pass does (README, *Engine cost*), mean pooling up to ~1.5× that.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tuner.engine.encoder import Batches, to_device
from tuner.engine.models import LoadedModel

PROBE_ROWS = 4  # on CPU: enough to fill the cores, few enough to cost seconds even for bge-m3
WARMUP_TOKENS = 32  # a CPU warm-up pass: kernels and allocator touched, at a fraction of the probe's cost
SLOW_STUDY_SECONDS = 3600.0  # beyond this the estimate comes with advice


@dataclass(frozen=True)
class Probe:
    """One timed forward pass on this device."""

    device: str
    rows: int
    length: int
    seconds: float

    @property
    def tokens(self) -> int:
        return self.rows * self.length

    @property
    def seconds_per_token(self) -> float:
        return self.seconds / self.tokens


def probe(model: LoadedModel, batches: Batches) -> Probe:
    """Time a plain forward of the first (longest) batch's first `probe_rows` passages, after an untimed warm-up.

    The warm-up takes what only a first call pays (kernel selection, library start-up, the allocator's first
    growth) out of the rate; on a GPU it is the probe itself, since the allocator grows to the batch's size,
    and the timed pass is bracketed by synchronisations, so it counts the device's work and not the launches.
    """
    first = batches.inputs[0]
    rows = probe_rows(model.device, int(first["input_ids"].shape[0]))
    inputs = {k: to_device(v[:rows], model.device) for k, v in first.items()}
    cuda = model.device.type == "cuda"
    warm_up = inputs if cuda else {k: v[:, :WARMUP_TOKENS] for k, v in inputs.items()}
    with torch.inference_mode():
        model.model(**warm_up)
        if cuda:
            torch.cuda.synchronize(model.device)
        start = time.perf_counter()
        model.model(**inputs)
        if cuda:
            torch.cuda.synchronize(model.device)
        seconds = time.perf_counter() - start
    return Probe(str(model.device), rows, int(inputs["input_ids"].shape[1]), seconds)


def probe_rows(device: torch.device, batch_rows: int) -> int:
    """Passages in the probe: on a GPU the whole first batch (a few rows leave most of its cores idle and would
    price a token several times too high), on CPU `PROBE_ROWS`."""
    return batch_rows if device.type == "cuda" else min(PROBE_ROWS, batch_rows)


def padded_tokens(model: LoadedModel, texts: Sequence[str]) -> int:
    """Tokens of `texts` as encoded (truncated at the model's maximum length), without padding."""
    if not texts:
        return 0
    lengths = model.tokenizer(list(texts), add_special_tokens=True, truncation=False)["input_ids"]
    return sum(min(len(ids), model.max_length) for ids in lengths)


@dataclass(frozen=True)
class StudyCost:
    """Encode work of a tuning run, in tokens, priced by a probe.

    corpus_tokens     padded tokens of one encode of the tuning corpus (its batches): the baseline, and each trial
    per_trial_tokens  what a trial encodes besides the corpus (attention-profile passages, a general set, the
                      tuning passages' other structures)
    once_tokens       encoded once: queries, a general set's baseline, held-out scoring on another corpus
    layers            the model's depth: a token through every layer is `layers` layer-tokens
    structure_tokens  the part of `per_trial_tokens` a pruned trial skips (the later rungs: other structures)
    screen_tokens     at most what the pooled screen encodes per trial (0: no screen), before the corpus
    """

    probe: Probe
    passages: int
    corpus_tokens: int
    truncated: int
    max_length: int
    per_trial_tokens: int
    once_tokens: int
    layers: int = 1
    structure_tokens: int = 0
    screen_tokens: int = 0

    def seconds(self, tokens: float) -> float:
        return tokens * self.probe.seconds_per_token

    @property
    def trial_seconds(self) -> float:
        return self.seconds(self.corpus_tokens + self.per_trial_tokens)

    def study_seconds(self, trials: int) -> float:
        """The baseline, the trials, and what is encoded once."""
        return self.seconds(self.once_tokens + self.corpus_tokens) + trials * self.trial_seconds

    def describe(self, trials: int, default_trials: int) -> list[str]:
        """Lines for the log: the probe, one encode, one trial, this study and the default one."""
        p = self.probe
        lines = [
            f"cost estimate on {p.device}, encoding only (an upper bound for it; tracking and plots add seconds per "
            f"trial): a probe of {p.rows} passages × {p.length:,} tokens took {p.seconds:.2f} s "
            f"({1e6 * p.seconds_per_token:,.0f} µs per token)",
            f"corpus: {self.passages:,} passages, {self.corpus_tokens:,} padded tokens"
            + (f" ({self.truncated:,} truncated at {self.max_length:,} tokens)" if self.truncated else "")
            + f"; one encode ≈ {duration(self.seconds(self.corpus_tokens))}",
            f"one trial ≈ {duration(self.trial_seconds)}; this study ({trials} trials, with the baseline and the final "
            f"scoring) ≈ {duration(self.study_seconds(trials))}"
            + (
                f"; the default {default_trials} trials ≈ {duration(self.study_seconds(default_trials))}"
                if trials != default_trials
                else ""
            ),
        ]
        full = self.layers * (self.once_tokens + self.corpus_tokens + trials * (self.corpus_tokens + self.per_trial_tokens))
        if self.screen_tokens:
            # the references (2 trials) always run every rung; a pruned trial can stop after the screen
            full += self.layers * trials * self.screen_tokens
            floor = full - self.layers * max(trials - 2, 0) * (self.corpus_tokens + self.per_trial_tokens)
            lines.append(
                f"layer-tokens (padded tokens × layers, resumed passes cost less): unpruned ≤ {full:,}; "
                f"pruned ≥ {floor:,} (every trial but the references stopped after the pooled screen of "
                f"≈ {self.screen_tokens:,} tokens; ≈ {duration(self.seconds(floor / self.layers))})"
            )
        elif self.structure_tokens:
            # the references (2 trials) always run every rung; a pruned trial stops after the tuning split
            floor = full - self.layers * max(trials - 2, 0) * self.structure_tokens
            lines.append(
                f"layer-tokens (padded tokens × layers, resumed passes cost less): unpruned ≤ {full:,}; "
                f"pruned ≥ {floor:,} (every trial but the references stopped after the tuning split; "
                f"≈ {duration(self.seconds(floor / self.layers))})"
            )
        else:
            lines.append(f"layer-tokens (padded tokens × layers, resumed passes cost less): ≤ {full:,}")
        if self.study_seconds(trials) > SLOW_STUDY_SECONDS:
            lines.append(
                f"that is long on {p.device}: stop now (Ctrl-C; the same command resumes) and run it on a GPU, "
                "with fewer --trials, or on --dataset wikipos-dev"
            )
        return lines


def duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s" if seconds >= 1 else f"{seconds:.1f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
