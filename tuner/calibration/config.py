"""What to calibrate and how: the paper's knobs as one validated, serialisable object.

`CalibrationConfig` is what users write (variant, λ, layers, basket size, ...); `ResolvedCalibration`
is what the engine runs with once the layer spec is resolved against a concrete model depth and the
variant preset is expanded into one policy per isolated token.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tuner.common.messages import shown
from tuner.common.options import PaddingSide, Pooling  # the command line's vocabulary, importable without torch

Variant = Literal["uniform", "cls_soft", "cls_hard"]
Policy = Literal["equal", "original", "fixed"]
Role = Literal["first", "last"]
BasketShares = Literal["equal", "by_size"]

VARIANTS: tuple[str, ...] = ("uniform", "cls_soft", "cls_hard")
BASKET_SHARES: tuple[str, ...] = ("equal", "by_size")

# Which special positions sit in baskets of their own (paper Table 4; for mean pooling both ends are sinks).
DEFAULT_ISOLATION: dict[str, tuple[Role, ...]] = {
    "cls": ("first",),
    "last": ("first", "last"),
    "mean": ("first", "last"),
}
# The token whose self-mass CLS-Hard fixes at w: the pooled one, or the [CLS] sink for mean pooling.
POOLED_ROLE: dict[str, Role] = {"cls": "first", "last": "last", "mean": "first"}

_LAST_K = re.compile(r"^last(?::(\d+))?$")
_PERCENT = re.compile(r"^(\d+(?:\.\d+)?)%$")


class ConfigError(ValueError):
    """A calibration setting is out of range; the message names the field and what is allowed."""


LayerSpec = Annotated[
    list[int] | str | float,
    Field(
        description="explicit 0-based layer indices, 'last' / 'last:k' for the last k layers, "
        "or a fraction of depth in (0, 1] (also written '50%')"
    ),
]


class CalibrationConfig(BaseModel):
    """The calibration knobs of §3, validated: what a user writes, and what an exported config's `calibration`
    section holds.

    The defaults are the paper's default calibration (CLS-Soft, λ 0.5 on the last half of the layers, baskets of
    128 tokens). `resolve` turns it into what the engine runs for a model of a given depth.

    Attributes:
        variant: `uniform`, `cls_soft` (the pooled token keeps its own attention) or `cls_hard` (its self-mass
            fixed at `weight`).
        strength: λ, from 0 (uncalibrated) to 1 (fully equalised).
        layers: Explicit 0-based layer indices, `last` or `last:k` for the last k layers, or a fraction of the
            depth in (0, 1] (also written `50%`).
        basket_size: Content tokens per basket.
        weight: w, the fixed self-mass of CLS-Hard, in (0, 1).
        pooling: How the model pools its vectors (`cls`, `last`, `mean`); it must be the model's own.
        padding_side: Where the model's tokenizer pads (`left`, `right`).
        isolate: The tokens that sit in baskets of their own (`first`, `last`); by default the pooling's.
        policies: Per isolated token, a policy (`equal`, `original`, `fixed`) overriding the variant's.
        basket_shares: How content baskets split what the isolated tokens leave: `equal` (the paper, §3: one
            share per basket, a partial last basket included) or `by_size` (in proportion to the content tokens
            of each basket the row sees).

    Raises:
        ConfigError: A value is out of range or of the wrong type, naming each bad field and what it allows.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    variant: Variant = "cls_soft"
    strength: float = Field(0.5, ge=0.0, le=1.0, description="λ: 0 = uncalibrated, 1 = fully equalised")
    layers: LayerSpec = 0.5
    basket_size: int = Field(128, ge=1, description="content tokens per basket")
    weight: float = Field(0.3, gt=0.0, lt=1.0, description="w: fixed self-mass of CLS-Hard")
    pooling: Pooling = "cls"
    padding_side: PaddingSide = "right"
    isolate: tuple[Role, ...] | None = Field(None, description="isolated tokens; default by pooling")
    policies: dict[Role, Policy] | None = Field(None, description="per-token policies overriding the variant")
    basket_shares: BasketShares = Field(
        "equal",
        description="how content baskets split what the isolated tokens leave: 'equal' (the paper, §3: one share "
        "per basket, a partial last basket included) or 'by_size' (in proportion to the content tokens of each "
        "basket the row sees, so a partial basket gets a partial share)",
    )

    @field_validator("strength", "basket_size", "weight", "layers", mode="before")
    @classmethod
    def _no_booleans(cls, value: object) -> object:
        """YAML reads `true` as a boolean and pydantic would take it as 1 (all layers, basket size 1): refused."""
        if isinstance(value, bool) or (isinstance(value, list) and any(isinstance(v, bool) for v in value)):
            raise ValueError(f"{value!r} is a boolean; write a number")
        return value

    @field_validator("layers")
    @classmethod
    def _check_layers(cls, value: list[int] | str | float) -> list[int] | str | float:
        if isinstance(value, list):
            if not value:
                raise ValueError("no layer given: list at least one layer index, or use 'last' or a fraction")
            if any(i < 0 for i in value):
                raise ValueError(f"layer indices must be >= 0 (0-based), got {value}")
            return sorted(set(value))
        if isinstance(value, str):
            match = _LAST_K.match(value.strip())
            if match and (match.group(1) is None or int(match.group(1)) >= 1):
                return value.strip()
            percent = _PERCENT.match(value.strip())
            if percent:
                return _check_fraction(float(percent.group(1)) / 100)
            raise ValueError(f"{value!r} is not a layer spec: use 'last', 'last:k' (k >= 1), '50%' or [i, j]")
        return _check_fraction(float(value))

    @model_validator(mode="after")
    def _check_isolation(self) -> CalibrationConfig:
        isolated = self.isolated_roles()
        if len(set(isolated)) != len(isolated):
            raise ValueError(f"isolate lists a token twice: {isolated}")
        extra = set(self.policies or {}) - set(isolated)
        if extra:
            raise ValueError(f"policies given for tokens that are not isolated: {sorted(extra)}")
        return self

    def __init__(self, **values: object) -> None:
        """Validate; errors come out as one `ConfigError` naming each bad field and its allowed range."""
        try:
            super().__init__(**values)
        except ValidationError as error:
            raise ConfigError(_describe(error)) from None

    def isolated_roles(self) -> tuple[Role, ...]:
        return self.isolate if self.isolate is not None else DEFAULT_ISOLATION[self.pooling]

    def role_policies(self) -> dict[Role, Policy]:
        """Expand the variant preset into one policy per isolated token, then apply explicit overrides."""
        pooled = POOLED_ROLE[self.pooling]
        preset: dict[str, Policy] = {
            "uniform": "equal",
            "cls_soft": "original",
            "cls_hard": "equal",
        }
        policies: dict[Role, Policy] = {role: preset[self.variant] for role in self.isolated_roles()}
        if self.variant == "cls_hard" and pooled in policies:
            policies[pooled] = "fixed"
        policies.update(self.policies or {})
        return policies

    def resolve_layers(self, num_layers: int) -> tuple[int, ...]:
        """Turn the layer spec into explicit 0-based indices for a model with `num_layers` layers."""
        spec = self.layers
        if isinstance(spec, list):
            beyond = [i for i in spec if i >= num_layers]
            if beyond:
                raise ConfigError(f"layers: {beyond} beyond the model's depth; allowed indices are 0..{num_layers - 1}")
            return tuple(spec)
        if isinstance(spec, str):
            match = _LAST_K.match(spec)
            count = int(match.group(1) or 1) if match else 0
            if count > num_layers:
                raise ConfigError(f"layers: {spec!r} asks for {count} layers; the model has {num_layers}")
        else:
            count = depth_to_layer_count(spec, num_layers)
        return tuple(range(num_layers - count, num_layers))

    def resolve(self, num_layers: int) -> ResolvedCalibration:
        return ResolvedCalibration(
            layers=frozenset(self.resolve_layers(num_layers)),
            strength=self.strength,
            basket_size=self.basket_size,
            weight=self.weight,
            pooling=self.pooling,
            policies=tuple(sorted(self.role_policies().items())),
            basket_shares=self.basket_shares,
            config=self,
        )


def depth_to_layer_count(fraction: float, num_layers: int) -> int:
    """A fraction of depth as a number of final layers: rounded half up, at least one."""
    return max(1, min(num_layers, math.floor(fraction * num_layers + 0.5)))


@dataclass(frozen=True)
class ResolvedCalibration:
    """The engine's view: explicit layer set and one policy per isolated token."""

    layers: frozenset[int]
    strength: float
    basket_size: int
    weight: float
    pooling: Pooling
    policies: tuple[tuple[Role, Policy], ...]
    basket_shares: BasketShares = "equal"
    # What a user wrote, for the test oracle (which derives everything above itself); not part of the
    # identity: two configs that resolve alike calibrate alike.
    config: CalibrationConfig | None = field(default=None, compare=False, repr=False)

    def policy(self, role: Role) -> Policy:
        """The policy of an isolated token in `role`; a role without one means a geometry built for another
        calibration."""
        policies = dict(self.policies)
        if role not in policies:
            raise ValueError(f"no policy for the isolated {role!r} token: this calibration isolates {sorted(policies)}")
        return policies[role]


def _check_fraction(value: float) -> float:
    if not (0.0 < value <= 1.0) or math.isnan(value):
        raise ValueError(f"a depth fraction must be in (0, 1], got {value}")
    return value


_ALLOWED = {
    "strength": "λ in [0, 1]",
    "basket_size": "an integer >= 1",
    "weight": "w in (0, 1)",
    "layers": "[i, j, ...], 'last', 'last:k' or a fraction in (0, 1]",
    "variant": "one of " + ", ".join(VARIANTS),
    "basket_shares": "one of " + ", ".join(BASKET_SHARES),
}


def _describe(error: ValidationError) -> str:
    lines = []
    for item in error.errors():
        field = str(item["loc"][0]) if item["loc"] else "config"
        message = item["msg"].removeprefix("Value error, ")
        allowed = f"; allowed: {_ALLOWED[field]}" if field in _ALLOWED else ""
        lines.append(f"{field}: {message} (got {shown(item.get('input'))}{allowed})")
    return "invalid calibration config:\n  " + "\n  ".join(lines)
