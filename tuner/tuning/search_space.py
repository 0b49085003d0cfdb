"""The knobs Optuna searches, and how a trial's parameters become a `CalibrationConfig`."""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from tuner.calibration import CalibrationConfig, ConfigError
from tuner.calibration.config import BASKET_SHARES, VARIANTS, PaddingSide, Pooling
from tuner.common.messages import shown
from tuner.common.safe_yaml import YamlError, load_file
from tuner.engine.prefix import starting_layers

DEPTHS: dict[str, str | float] = {"last": "last", "25%": 0.25, "50%": 0.5, "75%": 0.75, "100%": 1.0}

# Enqueued first in every study so the uncalibrated model and the paper's default stand side by side
# (`SearchSpace.reference_trial` turns them into Optuna parameters). The paper gives every content basket
# an equal share (§3), so its default pins `basket_shares: equal` whatever the space draws for other
# trials; the baseline (λ 0) calibrates nothing and needs no shares.
BASELINE_PARAMS: dict[str, object] = {"strength": 0.0, "depth": "last", "basket_size": 128, "variant": "cls_soft"}
PAPER_DEFAULT_PARAMS: dict[str, object] = {
    "strength": 0.5,
    "depth": "50%",
    "basket_size": 128,
    "variant": "cls_soft",
    "basket_shares": "equal",
}
# Queued after the paper's default unless `--no-paper-siblings`, with the role their trials are marked with: the
# same config at the cheaper depths of the default space. Every seed starts from them, so a study spends its
# first draws where the paper points, running a third and two thirds of the default's layers on a six-layer model,
# instead of on random configs (docs/search.md). Unlike the references they are drawn trials in all but their
# choice: priced against the budget, limited by the drift yardstick, pruned.
PAPER_SIBLINGS: tuple[tuple[dict[str, object], str], ...] = (
    ({**PAPER_DEFAULT_PARAMS, "depth": "last"}, "paper default, last layer"),
    ({**PAPER_DEFAULT_PARAMS, "depth": "25%"}, "paper default, last 25%"),
)
# The paper's own grid (§4): λ ∈ {0.5, 1}, the last layer or the last 50%, baskets of 128 or 256, the three
# variants (CLS-Hard with w 0.3): 24 configs, `tune --grid paper`, the yardstick of the search's cost.
PAPER_GRID: dict[str, list[object]] = {
    "strength": [0.5, 1.0],
    "depth": ["last", "50%"],
    "basket_size": [128, 256],
    "variant": list(VARIANTS),
    "weight": [0.3],
}
GRIDS = {"paper": PAPER_GRID}


def grid_points(grid: Mapping[str, Sequence[object]]) -> list[dict[str, object]]:
    """Every config of a grid as trial parameters (w only for CLS-Hard: the other variants' copies are one)."""
    points = [dict(zip(grid, values, strict=True)) for values in itertools.product(*grid.values())]
    distinct = {
        json.dumps({k: v for k, v in p.items() if k != "weight" or p.get("variant") == "cls_hard"}, sort_keys=True)
        for p in points
    }
    return [json.loads(point) for point in sorted(distinct)]


def depth_layers(depth: str, num_layers: int) -> tuple[int, ...]:
    """The layers a depth of the space (`DEPTHS`) calibrates on a model with `num_layers` layers."""
    return CalibrationConfig(layers=DEPTHS[depth]).resolve_layers(num_layers)


def grid_size(grid: Mapping[str, Sequence[object]]) -> int:
    """Configs in a grid: its product, less the repeats a conditional parameter makes (w only for CLS-Hard)."""
    return len(grid_points(grid))


# The trial user attribute that records (or, on an enqueued trial, pins) a basket_shares the space fixes.
SHARES_ATTR = "basket_shares"


@dataclass(frozen=True)
class SearchSpace:
    """λ on a grid, calibrated depth, basket size, variant, w for CLS-Hard only, and basket shares.

    `basket_shares` defaults to the paper's `equal` alone: a fixed setting, not an Optuna parameter (trials
    keep the parameter names they always had); with several values it is suggested like the variant.
    (`by_size` is the milder rule: on WikiPos it removes most of the correction along with the partial
    basket's boost (docs/engine.md, *Basket shares*); search it with `basket_shares: [equal, by_size]`.)

    `depths` defaults to the paper's range, the last layer up to the last 50% (its §4 grid calibrates the
    last layer or the last half). Deeper calibration reached the lowest PSI on the tuning split but
    transferred worst (all-layer winners lost HM and nDCG@10 on WikiPos-lengths), and each deep trial costs up
    to six last-layer trials. '75%' and '100%' stay available.
    """

    strength_step: float = 0.05
    depths: tuple[str, ...] = ("last", "25%", "50%")
    basket_sizes: tuple[int, ...] = (64, 128, 256, 512)
    variants: tuple[str, ...] = VARIANTS
    weight_low: float = 0.1
    weight_high: float = 0.5
    basket_shares: tuple[str, ...] = ("equal",)

    def __post_init__(self) -> None:
        problems = []
        if not 0 < self.strength_step <= 1:
            problems.append(f"strength_step must be in (0, 1], got {self.strength_step}")
        elif abs(1 / self.strength_step - round(1 / self.strength_step)) > 1e-6:
            problems.append(
                f"strength_step {self.strength_step} does not divide 1, so the grid of λ would stop short of 1; "
                "use e.g. 0.05, 0.1, 0.125 or 0.25"
            )
        for key in ("depths", "basket_sizes", "variants"):
            values = list(getattr(self, key))
            twice = next((v for i, v in enumerate(values) if v in values[:i]), None)
            if twice is not None:
                problems.append(f"{key} lists {shown(twice)} twice; list each value once")
        if not self.depths or set(self.depths) - set(DEPTHS):
            problems.append(f"depths must be a non-empty subset of {list(DEPTHS)}, got {list(self.depths)}")
        if not self.basket_sizes or any(int(b) < 1 for b in self.basket_sizes):
            problems.append(f"basket_sizes must be integers >= 1, got {list(self.basket_sizes)}")
        if not self.variants or set(self.variants) - set(VARIANTS):
            problems.append(f"variants must be a non-empty subset of {list(VARIANTS)}, got {list(self.variants)}")
        shares = self.basket_shares
        if not shares or set(shares) - set(BASKET_SHARES) or len(set(shares)) != len(shares):
            problems.append(f"basket_shares must be distinct values of {list(BASKET_SHARES)}, got {list(shares)}")
        if not 0 < self.weight_low <= self.weight_high < 1:
            problems.append(f"need 0 < weight_low <= weight_high < 1, got {self.weight_low}, {self.weight_high}")
        if problems:
            raise ConfigError("invalid search space: " + "; ".join(problems))

    @classmethod
    def from_yaml(cls, path: str | Path) -> SearchSpace:
        """A space file (YAML, read by `tuner.common.safe_yaml`): each key checked for its type before any value is
        used."""
        try:
            data = load_file(path) or {}
        except YamlError as error:
            raise ConfigError(f"--space {error}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"--space {path}: expected a mapping of setting: value, e.g. basket_sizes: [64, 128]")
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise ConfigError(
                f"--space {path}: unknown search-space keys {sorted(map(str, unknown))}; "
                f"known: {sorted(cls.__dataclass_fields__)}"
            )
        problems = [problem for key, value in data.items() if (problem := _type_problem(key, value))]
        if problems:
            raise ConfigError(f"--space {path}: " + "; ".join(problems))
        fields: dict[str, Any] = {
            k: tuple(v) if isinstance(v, list) else v for k, v in data.items()
        }  # types checked above
        return cls(**fields)

    def as_dict(self) -> dict[str, object]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    def suggest(self, trial: optuna.Trial, pooling: Pooling, padding_side: PaddingSide) -> CalibrationConfig:
        """Draw one configuration; w is only a parameter when the variant is CLS-Hard."""
        params: dict[str, object] = {
            "strength": trial.suggest_float("strength", 0.0, 1.0, step=self.strength_step),
            "depth": trial.suggest_categorical("depth", list(self.depths)),
            "basket_size": trial.suggest_categorical("basket_size", [int(b) for b in self.basket_sizes]),
            "variant": trial.suggest_categorical("variant", list(self.variants)),
        }
        if params["variant"] == "cls_hard":
            params["weight"] = trial.suggest_float("weight", self.weight_low, self.weight_high, step=0.05)
        return config_of(params, self._basket_shares(trial), pooling, padding_side)

    def _basket_shares(self, trial: optuna.Trial) -> str:
        """A parameter when the space offers several values. Otherwise fixed and no parameter: recorded
        as the trial's user attribute (`trial_basket_shares` reads it back), unless the trial was enqueued
        with a value pinned there (the paper's default: `equal`), which wins over the space's value."""
        if len(self.basket_shares) > 1:
            return str(trial.suggest_categorical(SHARES_ATTR, list(self.basket_shares)))
        shares = str(trial.user_attrs.get(SHARES_ATTR, self.basket_shares[0]))
        trial.set_user_attr(SHARES_ATTR, shares)
        return shares

    def reference_trial(self, reference: Mapping[str, object]) -> tuple[dict[str, object], dict[str, object]]:
        """A reference config (`BASELINE_PARAMS`, `PAPER_DEFAULT_PARAMS`) as an enqueued trial: its
        Optuna parameters and user attributes, for `study.enqueue_trial`.

        The parameters are the dimensions this space suggests, so the reference trials carry the same
        parameter names as every other trial (the four knobs, as ever, in the default space). A
        basket_shares the space fixes is no parameter: the reference's own value is pinned as a user
        attribute instead, which `suggest` honours; so the paper's default calibrates with `equal` even
        in a space that fixes by_size. (The sampler sees that one trial under its four parameters
        only: one observation among many, and the paper's default is worth having as a trial and a
        candidate.) Where the space suggests basket_shares, a reference without one (the baseline: λ 0
        calibrates nothing) takes the space's first value.
        """
        params = {k: v for k, v in reference.items() if k != SHARES_ATTR}
        shares = reference.get(SHARES_ATTR)
        if len(self.basket_shares) > 1:
            return {**params, SHARES_ATTR: shares if shares is not None else self.basket_shares[0]}, {}
        return params, ({SHARES_ATTR: shares} if shares is not None else {})

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

    def starting_layers(self, num_layers: int) -> tuple[int, ...]:
        """The layers where this space's depths start calibrating: the ones worth caching for its trials."""
        return starting_layers((CalibrationConfig(layers=DEPTHS[d]) for d in self.depths), num_layers)

    def check_grid(self, grid: Mapping[str, list[object]]) -> None:
        """Refuse a grid this space cannot draw (a basket size no passage fills, say), naming the value."""
        outside = [
            f"{name}={value!r}" for name, values in grid.items() for value in values if not self._draws(name, value)
        ]
        if outside:
            raise ConfigError(f"--grid: {', '.join(outside)} lie outside the search space ({self.as_dict()})")

    def _draws(self, name: str, value: object) -> bool:
        if name == "strength":
            strength = float(value)  # type: ignore[arg-type]
            return (
                0 <= strength <= 1 and abs(round(strength / self.strength_step) * self.strength_step - strength) < 1e-9
            )
        if name == "weight":
            return self.weight_low <= float(value) <= self.weight_high  # type: ignore[arg-type]
        return value in {"depth": self.depths, "basket_size": self.basket_sizes, "variant": self.variants}.get(name, ())

    def admits(self, params: Mapping[str, object]) -> bool:
        """Whether fixed parameters (the enqueued reference trials) lie inside this space. basket_shares
        never rules one out: a space offering several values offers both, and a fixed one lets the
        reference pin its own (`reference_trial`)."""
        return not self.outside(params)

    def outside(self, params: Mapping[str, object]) -> str:
        """Why fixed parameters lie outside this space ("" when they lie inside): what a user is told when
        the paper's default cannot be run as a reference trial."""
        strength = float(params["strength"])  # type: ignore[arg-type]
        steps = strength / self.strength_step
        reasons = [
            f"strength_step {self.strength_step:g} skips λ {strength:g}" if abs(steps - round(steps)) > 1e-6 else "",
            f"depths {list(self.depths)} lack {params['depth']}" if params["depth"] not in self.depths else "",
            f"basket sizes {list(self.basket_sizes)} lack {params['basket_size']}"
            if params["basket_size"] not in self.basket_sizes
            else "",
            f"variants {list(self.variants)} lack {params['variant']}"
            if params["variant"] not in self.variants
            else "",
        ]
        return "; ".join(reason for reason in reasons if reason)


def config_of(
    params: Mapping[str, object],
    basket_shares: str,
    pooling: Pooling,
    padding_side: PaddingSide,
    layers: list[int] | None = None,
) -> CalibrationConfig:
    """A trial's parameters as a config: the one place they become one, for a trial being run (`suggest`)
    and for a finished one (`trial_config`). λ and w are rounded to 6 decimals (Optuna's grid steps carry
    float noise); `layers` (the indices a trial resolved) replaces the depth's fraction when given."""
    extra = {"weight": round(float(params["weight"]), 6)} if "weight" in params else {}  # type: ignore[arg-type]
    return CalibrationConfig(
        variant=params["variant"],
        strength=round(float(params["strength"]), 6),  # type: ignore[arg-type]
        layers=layers if layers is not None else DEPTHS[str(params["depth"])],
        basket_size=int(params["basket_size"]),  # type: ignore[call-overload]
        pooling=pooling,
        padding_side=padding_side,
        basket_shares=basket_shares,
        **extra,
    )


def trial_config(trial: FrozenTrial, pooling: Pooling, padding_side: PaddingSide) -> CalibrationConfig:
    """The config a finished trial calibrated with, its layers as the trial resolved them (explicit indices)."""
    return config_of(trial.params, trial_basket_shares(trial), pooling, padding_side, layers=trial.user_attrs["layers"])


_LISTS = {"depths": str, "basket_sizes": int, "variants": str, "basket_shares": str}
_NUMBERS = ("strength_step", "weight_low", "weight_high")


def _type_problem(key: str, value: object) -> str | None:
    """What is wrong with the type of one space setting (None: nothing); ranges are `SearchSpace`'s to check."""
    if key in _NUMBERS:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"{key} must be a number, e.g. {key}: {getattr(SearchSpace, key)}; got {shown(value)}"
        return None
    kind = _LISTS[key]
    example = list(getattr(SearchSpace, key))[:2]
    if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, kind) for v in value):
        kinds = "integers" if kind is int else "names"
        return f"{key} must be a list of {kinds}, e.g. {key}: {example}; got {shown(value)}"
    return None


def trial_basket_shares(trial: FrozenTrial | optuna.Trial) -> str:
    """The basket_shares a trial calibrated with: its parameter, else its user attribute; `equal` for
    a trial that records neither (it calibrated as the paper does)."""
    return str(trial.params.get(SHARES_ATTR, trial.user_attrs.get(SHARES_ATTR, "equal")))


def is_reference_trial(trial: FrozenTrial, reference: Mapping[str, object]) -> bool:
    """Whether `trial` ran `reference`: the same knobs, and the reference's basket_shares if it names one
    (whether the space made it a parameter or pinned it). Needs no search space, so a study's reference
    trials are found whatever space it ran with."""
    knobs = {k: v for k, v in trial.params.items() if k != SHARES_ATTR}
    wanted = {k: v for k, v in reference.items() if k != SHARES_ATTR}
    shares = trial_basket_shares(trial)
    return knobs == wanted and reference.get(SHARES_ATTR, shares) == shares
