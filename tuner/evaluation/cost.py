"""What a tuning run will cost on this device, estimated before it starts from one timed probe.

A forward pass costs about in proportion to its padded tokens times the layers it runs: a calibrated trial
resumes at its first calibrated layer from the inputs the baseline pass cached, so it runs only its own
layers (docs/benchmarks.md, *Trial cost*). The estimate counts a study's layer-tokens as its trials and
parent run do (`cost/layer_tokens`) and prices them by a probe: a forward pass of the first few (longest)
passages, uncalibrated. Attention adds a term in the square of the length, so a rate measured on the
longest passages overstates shorter ones; cls and last-token calibration recompute one row per layer and so
cost about what a plain pass does, while mean pooling calibrates every row and costs more (docs/benchmarks.md,
*Engine cost*, measures both).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tuner.common.options import WIKIPOS_TUNING_SET
from tuner.engine.batching import Batches, to_device
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
    """Encode work of a tuning run in layer-tokens (padded tokens × layers run), priced by a probe.

    corpus_tokens     padded tokens of one encode of the tuning corpus (its batches): the baseline, and each trial
    per_trial_tokens  what a calibrated trial encodes beside the corpus, resuming like it (a general set, the
                      tuning passages' other structures)
    once_tokens       encoded once through every layer: queries, the baselines of the other sets
    layers            the model's depth: a token through every layer is `layers` layer-tokens
    structure_tokens  the part of `per_trial_tokens` a pruned trial skips (the later rungs: other structures)
    screen_tokens     at most what the pooled screen encodes per trial (0: no screen), before the corpus
    profile_tokens    the attention-profile passages every complete trial encodes through every layer
    trial_layers      the layers a calibrated trial runs, averaged over the depths it may draw (None: every layer,
                      no cached inputs to resume from)
    heldout_tokens    held-out scoring after the study: one pass over each held-out corpus of its own; it is scored
                      uncalibrated through every layer, then with the paper default and the winner, resumed like a
                      trial; counted apart, as the parent run does
    heldout_queries   the held-out sets' queries, through every layer
    first_rung_tokens, first_rung  the cheapest corpus a trial scores (the tuning passages or one of their other
                      structures), the least a trial pruned without a screen spends: the rungs go least biased
                      first, which only the baseline tells, so the pruned study's figure is a floor
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
    profile_tokens: int = 0
    trial_layers: float | None = None
    heldout_tokens: int = 0
    heldout_queries: int = 0
    first_rung_tokens: int = 0
    first_rung: str = "the tuning split"
    budget_layer_tokens: float | None = None  # `--budget` in layer-tokens: the study stops there whatever --trials says

    def seconds(self, layer_tokens: float) -> float:
        """The probe's rate: it timed tokens through every layer."""
        return layer_tokens / self.layers * self.probe.seconds_per_token

    @property
    def calibrated_layers(self) -> float:
        return self.layers if self.trial_layers is None else self.trial_layers

    @property
    def first_corpus_tokens(self) -> int:
        """The first corpus rung's tokens (the tuning corpus when no cheaper structure was named)."""
        return self.first_rung_tokens or self.corpus_tokens

    @property
    def trial_layer_tokens(self) -> float:
        """One complete calibrated trial: the screen, the corpus and the rungs at its depth, then its profile."""
        passes = self.screen_tokens + self.corpus_tokens + self.per_trial_tokens
        return self.calibrated_layers * passes + self.layers * self.profile_tokens

    @property
    def trial_seconds(self) -> float:
        return self.seconds(self.trial_layer_tokens)

    @property
    def setup_layer_tokens(self) -> float:
        """The baselines and queries: what a study encodes before its first trial (nothing the disk cache holds)."""
        return self.layers * (self.once_tokens + self.corpus_tokens)

    @property
    def heldout_layer_tokens(self) -> float:
        """Held-out scoring: queries and the uncalibrated pass through every layer, the paper default and the winner
        resumed."""
        return (
            self.layers * (self.heldout_queries + self.heldout_tokens)
            + 2 * self.calibrated_layers * self.heldout_tokens
        )

    def layer_tokens(self, trials: int, pruned: bool = False) -> float:
        """The study's layer-tokens as its parent run counts them (held-out scoring apart): the baseline pass
        and what is encoded once, the baseline trial's profile, and `trials` − 1 calibrated trials; `pruned`:
        every trial but the two references stopped after one rung (the screen, else the cheapest corpus: a floor),
        with no profile."""
        total = (
            self.setup_layer_tokens + self.layers * self.profile_tokens + max(trials - 1, 0) * self.trial_layer_tokens
        )
        if pruned:
            stopped = self.calibrated_layers * (self.screen_tokens or self.first_corpus_tokens)
            total -= max(trials - 2, 0) * (self.trial_layer_tokens - stopped)
        return total

    def study_seconds(self, trials: int, pruned: bool = False) -> float:
        """The baseline, the trials, and the held-out scoring."""
        return self.seconds(self.layer_tokens(trials, pruned) + self.heldout_layer_tokens)

    def budgeted_seconds(self, trials: int) -> float:
        """The study as its budget, if any, ends it: at most the budget, and the held-out scoring."""
        spent = self.layer_tokens(trials)
        if self.budget_layer_tokens is not None:
            spent = min(spent, self.budget_layer_tokens)
        return self.seconds(spent + self.heldout_layer_tokens)

    def describe(self, trials: int, default_trials: int) -> list[str]:
        """Lines for the log: the probe, one encode, one trial, this study and the default one, in time and
        layer-tokens."""
        p = self.probe
        lines = [
            f"cost estimate on {p.device}, encoding only (priced by the longest passages, so shorter ones cost a "
            f"little less; tracking and plots add seconds per trial): a probe of {p.rows} passages × {p.length:,} "
            f"tokens took {p.seconds:.2f} s ({1e6 * p.seconds_per_token:,.0f} µs per token)",
            f"corpus: {self.passages:,} passages, {self.corpus_tokens:,} padded tokens"
            + (f" ({self.truncated:,} truncated at {self.max_length:,} tokens)" if self.truncated else "")
            + f"; one encode ≈ {duration(self.seconds(self.layers * self.corpus_tokens))}",
            f"one calibrated trial ≈ {duration(self.trial_seconds)}"
            + (
                f" (it runs {self.calibrated_layers:.3g} of {self.layers} layers on average)"
                if self.trial_layers is not None
                else ""
            )
            + f"; this study ({'at most ' if self.budget_layer_tokens is not None else ''}{trials} trials"
            + (" within its budget" if self.budget_layer_tokens is not None else "")
            + f", with the baseline and the held-out scoring) ≈ {duration(self.budgeted_seconds(trials))}"
            + (
                f"; the default {default_trials} trials ≈ {duration(self.study_seconds(default_trials))}"
                if trials != default_trials
                else ""
            ),
        ]
        full = round(self.layer_tokens(trials))
        setup = (
            f", of which ≈ {round(self.setup_layer_tokens):,} are the baselines and queries "
            "(none that the disk cache holds)"
        )
        held = (
            f"; held-out scoring ≈ {round(self.heldout_layer_tokens):,} more"
            if self.heldout_tokens or self.heldout_queries
            else ""
        )
        if (self.screen_tokens or self.structure_tokens) and trials > 2:  # the two references are never pruned
            floor = round(self.layer_tokens(trials, pruned=True))
            after = (
                f"the pooled screen of ≈ {self.screen_tokens:,} tokens"
                if self.screen_tokens
                else f"one rung (a floor: the cheapest, {self.first_rung}, ≈ {self.first_corpus_tokens:,} tokens; "
                "the rungs go least biased first, which the baseline decides)"
            )
            lines.append(
                f"layer-tokens (padded tokens × layers run): ≈ {full:,} unpruned "
                f"(≈ {duration(self.study_seconds(trials))} in all){setup}; "
                f"≈ {floor:,} (≈ {duration(self.study_seconds(trials, pruned=True))}) "
                f"if every trial but the references stops after {after}{held}"
            )
        else:
            lines.append(f"layer-tokens (padded tokens × layers run): ≈ {full:,}{setup}{held}")
        if self.budget_layer_tokens is not None and self.budget_layer_tokens < full:
            lines[-1] += (
                f"; the budget ends the study at ≈ {round(self.budget_layer_tokens):,} "
                f"(≈ {duration(self.budgeted_seconds(trials))} in all)"
            )
        if self.budgeted_seconds(trials) > SLOW_STUDY_SECONDS:
            lines.append(
                f"that is long on {p.device}: stop now (Ctrl-C; the same command resumes) and run it on a GPU, "
                f"with fewer --trials, or on --dataset {WIKIPOS_TUNING_SET}"
            )
        return lines


def duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s" if seconds >= 1 else f"{seconds:.1f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
