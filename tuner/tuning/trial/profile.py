"""The attention profile of a complete trial: the pooled row's attention by layer on a few tuning passages.

A diagnostic only (selection never reads it), logged with the trial's MLflow run; what it encodes counts towards
the trial's cost.
"""

from __future__ import annotations

import json
import random
import warnings
from pathlib import Path

from tuner.calibration import CalibrationConfig
from tuner.engine.encoder import Batches, CalibratedEncoder, ShortDocumentsWarning
from tuner.evaluation.evaluator import Evaluator
from tuner.evaluation.profile import AttentionProfile, plot_profile


class TrialProfile:
    """Profiles `docs` passages of the tuning set (the same ones for every trial) and writes the figures under
    `staging`."""

    def __init__(self, evaluator: Evaluator, docs: int, staging: Path) -> None:
        self.evaluator = evaluator
        self.staging = staging
        ids = sorted(evaluator.dataset.corpus)
        random.Random(0).shuffle(ids)
        self.texts = [evaluator.dataset.corpus[d] for d in ids[:docs]]
        self._batches: Batches | None = None

    def cost(self) -> int:
        """What profiling a trial encodes: its passages through every layer."""
        if self._batches is None:
            model = self.evaluator.model
            texts = model.documents(self.texts)  # as `encode_document` reads them
            self._batches = Batches.build(model, texts, self.evaluator.batch_size, self.evaluator.batch_tokens)
        return self._batches.layer_tokens(range(len(self._batches)), self.evaluator.model.num_layers)

    def run(self, number: int, config: CalibrationConfig, metrics: dict[str, float]) -> list[Path]:
        """Profile trial `number`'s config: its summary joins `metrics` (with what it encoded, under
        `cost/layer_tokens`); returns the figures to log (JSON and PNG)."""
        profile = AttentionProfile()
        encoder = CalibratedEncoder(self.evaluator.model, config)
        with warnings.catch_warnings():  # a short profile passage is a diagnostic's, not the user's
            warnings.simplefilter("ignore", ShortDocumentsWarning)
            encoder.encode(
                self.texts,
                batch_size=self.evaluator.batch_size,
                batch_tokens=self.evaluator.batch_tokens,
                observer=profile,
            )
        metrics.update(profile.summary())
        metrics["cost/layer_tokens"] += encoder.layer_tokens
        folder = self.staging / f"trial-{number}"
        folder.mkdir(parents=True, exist_ok=True)
        data = profile.as_dict()
        json_path = folder / "attention_profile.json"
        json_path.write_text(json.dumps(data, indent=1), encoding="utf-8")
        image = plot_profile(data, folder / "attention_profile.png", f"trial {number}: pooled-row attention by layer")
        return [json_path, image]
