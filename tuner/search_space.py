"""The knobs Optuna searches, and how a trial's parameters become a `CalibrationConfig`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path

import optuna
import yaml

from tuner.calibration import CalibrationConfig, ConfigError
from tuner.calibration.config import VARIANTS, PaddingSide, Pooling

DEPTHS: dict[str, str | float] = {"last": "last", "25%": 0.25, "50%": 0.5, "75%": 0.75, "100%": 1.0}

# Enqueued first in every study so the uncalibrated model and the paper's default stand side by side.
BASELINE_PARAMS: dict[str, object] = {"strength": 0.0, "depth": "last", "basket_size": 128, "variant": "cls_soft"}
PAPER_DEFAULT_PARAMS: dict[str, object] = {"strength": 0.5, "depth": "50%", "basket_size": 128, "variant": "cls_soft"}


@dataclass(frozen=True)
class SearchSpace:
    """λ on a grid, calibrated depth, basket size, variant, and w for CLS-Hard only."""

    strength_step: float = 0.05
    depths: tuple[str, ...] = tuple(DEPTHS)
    basket_sizes: tuple[int, ...] = (64, 128, 256, 512)
    variants: tuple[str, ...] = VARIANTS
    weight_low: float = 0.1
    weight_high: float = 0.5

    def __post_init__(self) -> None:
        problems = []
        if not 0 < self.strength_step <= 1:
            problems.append(f"strength_step must be in (0, 1], got {self.strength_step}")
        if not self.depths or set(self.depths) - set(DEPTHS):
            problems.append(f"depths must be a non-empty subset of {list(DEPTHS)}, got {list(self.depths)}")
        if not self.basket_sizes or any(int(b) < 1 for b in self.basket_sizes):
            problems.append(f"basket_sizes must be integers >= 1, got {list(self.basket_sizes)}")
        if not self.variants or set(self.variants) - set(VARIANTS):
            problems.append(f"variants must be a non-empty subset of {list(VARIANTS)}, got {list(self.variants)}")
        if not 0 < self.weight_low <= self.weight_high < 1:
            problems.append(f"need 0 < weight_low <= weight_high < 1, got {self.weight_low}, {self.weight_high}")
        if problems:
            raise ConfigError("invalid search space: " + "; ".join(problems))

    @classmethod
    def from_yaml(cls, path: str | Path) -> SearchSpace:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise ConfigError(f"{path}: unknown search-space keys {sorted(unknown)}; known: {sorted(cls.__dataclass_fields__)}")
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})

    def as_dict(self) -> dict[str, object]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    def suggest(self, trial: optuna.Trial, pooling: Pooling, padding_side: PaddingSide) -> CalibrationConfig:
        """Draw one configuration; w is only a parameter when the variant is CLS-Hard."""
        strength = round(trial.suggest_float("strength", 0.0, 1.0, step=self.strength_step), 6)
        depth = trial.suggest_categorical("depth", list(self.depths))
        basket = trial.suggest_categorical("basket_size", [int(b) for b in self.basket_sizes])
        variant = trial.suggest_categorical("variant", list(self.variants))
        extra = {}
        if variant == "cls_hard":
            extra["weight"] = round(trial.suggest_float("weight", self.weight_low, self.weight_high, step=0.05), 6)
        return CalibrationConfig(
            variant=variant,
            strength=strength,
            layers=DEPTHS[depth],
            basket_size=basket,
            pooling=pooling,
            padding_side=padding_side,
            **extra,
        )

    def fitting(self, longest_content: int) -> SearchSpace:
        """This space without the basket sizes no passage can fill: they would leave every passage
        uncalibrated (§3), so each such trial would only repeat the baseline."""
        kept = tuple(b for b in self.basket_sizes if b <= longest_content)
        if not kept:
            raise ConfigError(
                f"basket_sizes {list(self.basket_sizes)}: none fits the longest passage ({longest_content} content "
                f"tokens), so no trial could calibrate anything; use basket sizes <= {longest_content}"
            )
        return replace(self, basket_sizes=kept)

    def admits(self, params: dict[str, object]) -> bool:
        """Whether fixed parameters (the enqueued reference trials) lie inside this space."""
        return (
            params["depth"] in self.depths
            and params["basket_size"] in self.basket_sizes
            and params["variant"] in self.variants
        )
