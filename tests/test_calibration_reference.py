"""The oracle (reference.py) itself: the paper's definitions, worked by hand, and its independence.

The engine is checked against the oracle everywhere else, so the oracle is checked here against
numbers written out from §3 and Table 4, not against anything the engine computes.
"""

from __future__ import annotations

import pytest
import torch

from tuner.calibration import CalibrationConfig
from tuner.calibration.reference import (
    reference_attention,
    reference_calibrate,
    reference_layers,
    reference_policies,
)


def one_row(weights: list[float]) -> torch.Tensor:
    return torch.tensor(weights, dtype=torch.float64)[None, None, None, :]  # (B=1, H=1, Q=1, K)


@pytest.mark.parametrize(
    ("fields", "policies"),
    [
        ({"pooling": "cls", "variant": "uniform"}, {"first": "equal"}),
        ({"pooling": "cls", "variant": "cls_soft"}, {"first": "original"}),
        ({"pooling": "cls", "variant": "cls_hard"}, {"first": "fixed"}),
        ({"pooling": "last", "variant": "cls_hard"}, {"first": "equal", "last": "fixed"}),
        ({"pooling": "last", "variant": "cls_soft"}, {"first": "original", "last": "original"}),
        ({"pooling": "mean", "variant": "cls_hard"}, {"first": "fixed", "last": "equal"}),
        ({"pooling": "mean", "variant": "cls_soft", "isolate": []}, {}),
        ({"pooling": "cls", "variant": "cls_hard", "isolate": ["last"]}, {"last": "equal"}),
        (
            {"pooling": "last", "variant": "cls_soft", "policies": {"last": "equal"}},
            {"first": "original", "last": "equal"},
        ),
    ],
)
def test_isolated_tokens_and_policies_follow_table_4_and_the_variants(fields: dict, policies: dict) -> None:
    """Table 4 (which tokens are isolated), §3.1/§3.3 (what each variant gives them), explicit overrides."""
    config = CalibrationConfig(**fields)
    assert reference_policies(config) == policies
    assert dict(config.resolve(1).policies) == policies  # the engine's resolution agrees


@pytest.mark.parametrize(
    ("layers", "depth", "want"),
    [
        ([1, 3], 6, {1, 3}),
        ("last", 6, {5}),
        ("last:2", 6, {4, 5}),
        (0.5, 6, {3, 4, 5}),
        ("50%", 24, set(range(12, 24))),
        (0.25, 6, {4, 5}),
        (0.01, 6, {5}),
        (1.0, 3, {0, 1, 2}),
    ],
)
def test_calibrated_layers(layers: object, depth: int, want: set[int]) -> None:
    """Explicit indices, the last k, or the final round(f · depth) layers (halves up, at least one)."""
    config = CalibrationConfig(layers=layers)
    assert reference_layers(config, depth) == want
    assert set(config.resolve(depth).layers) == want


def test_uniform_cls_soft_and_cls_hard_by_hand() -> None:
    """[CLS] + 4 content keys, basket 2: two content baskets. Worked from §3.1 and §3.3 at λ = 1."""
    a = one_row([0.4, 0.1, 0.3, 0.15, 0.05])
    config = CalibrationConfig(pooling="cls", basket_size=2, strength=1.0, weight=0.2, layers=[0])
    rows = torch.tensor([[True, False, False, False, False]])
    allowed = torch.ones(1, 1, 1, 5, dtype=torch.bool)

    def calibrated(variant: str) -> list[float]:
        config_ = config.model_copy(update={"variant": variant})
        return reference_calibrate(a, allowed[:, 0, 0], allowed, rows, config_)[0, 0, 0].tolist()

    # uniform: three baskets ([CLS], {1, 2}, {3, 4}) of 1/3, proportions kept inside each
    assert calibrated("uniform") == pytest.approx([1 / 3, 1 / 3 * 0.25, 1 / 3 * 0.75, 1 / 3 * 0.75, 1 / 3 * 0.25])
    # cls_soft: [CLS] keeps 0.4, the content baskets split 0.6
    assert calibrated("cls_soft") == pytest.approx([0.4, 0.3 * 0.25, 0.3 * 0.75, 0.3 * 0.75, 0.3 * 0.25])
    # cls_hard: [CLS] gets w = 0.2, the content baskets split 0.8
    assert calibrated("cls_hard") == pytest.approx([0.2, 0.4 * 0.25, 0.4 * 0.75, 0.4 * 0.75, 0.4 * 0.25])
    # λ blends linearly (§3.2)
    half = reference_calibrate(
        a, allowed[:, 0, 0], allowed, rows, config.model_copy(update={"variant": "uniform", "strength": 0.5})
    )
    assert half[0, 0, 0].tolist() == pytest.approx(
        [(x + y) / 2 for x, y in zip(calibrated("uniform"), a.flatten().tolist())]
    )


def test_no_isolated_token_means_every_key_is_content() -> None:
    """isolate: [] (the reference implementation's mean-pooling default): [CLS] is the first content key."""
    a = one_row([0.4, 0.1, 0.3, 0.2])
    config = CalibrationConfig(pooling="mean", isolate=[], basket_size=2, strength=1.0, layers=[0])
    every = torch.ones(1, 1, 1, 4, dtype=torch.bool)
    got = reference_calibrate(a, every[:, 0, 0], every, torch.ones(1, 1, dtype=torch.bool), config)
    assert got[0, 0, 0].tolist() == pytest.approx([0.5 * 0.8, 0.5 * 0.2, 0.5 * 0.6, 0.5 * 0.4])


def test_a_causal_row_is_calibrated_over_the_baskets_it_sees() -> None:
    """[CLS] c1..c5 [SEP], basket 2 → baskets {c1, c2}, {c3, c4}, {c5}; uniform, λ = 1, causal mask.

    Row 3 sees [CLS], c1, c2, c3: two of the three baskets and one of the two isolated tokens, so
    [CLS] and each seen basket get 1/3, and c4, c5 and [SEP] (unseen) stay 0. Row 0 sees only [CLS]:
    no content basket, nothing to redistribute, the row is left as it is. Row 6 ([SEP]) sees all:
    five baskets of 1/5.
    """
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 7, 4, generator=generator, dtype=torch.float64) for _ in range(3))
    allowed = torch.ones(1, 1, 7, 7, dtype=torch.bool).tril()
    config = CalibrationConfig(pooling="mean", variant="uniform", basket_size=2, strength=1.0, layers=[0])
    attn = (q @ k.transpose(-1, -2) * 0.5).masked_fill(~allowed, float("-inf")).softmax(-1)
    got = reference_calibrate(attn, allowed[:, 0, -1], allowed, torch.ones(1, 7, dtype=torch.bool), config)
    assert not got.isnan().any()
    assert torch.allclose(got.sum(-1), torch.ones(1, 2, 7, dtype=torch.float64))
    row = got[0, :, 3]
    third = torch.full((2,), 1 / 3, dtype=torch.float64)
    assert torch.allclose(row[:, 0], third)
    assert torch.allclose(row[:, 1] + row[:, 2], third)
    assert torch.allclose(row[:, 1] / row[:, 2], attn[0, :, 3, 1] / attn[0, :, 3, 2])
    assert torch.allclose(row[:, 3], third)
    assert torch.equal(row[:, 4:], torch.zeros(2, 3, dtype=torch.float64))
    assert torch.equal(got[0, :, 0], attn[0, :, 0])
    last = got[0, :, 6]
    fifth = torch.full((2,), 1 / 5, dtype=torch.float64)
    assert torch.allclose(last[:, 0], fifth) and torch.allclose(last[:, 6], fifth)
    assert torch.allclose(last[:, 1] + last[:, 2], fifth) and torch.allclose(last[:, 5], fifth)
    # through the attention function: no NaN reaches the output either
    assert not reference_attention(q, k, v, allowed, 0.5, config).isnan().any()


def test_the_oracle_does_not_use_the_engines_resolution(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug in `CalibrationConfig.resolve()` and its helpers cannot hide in the oracle too."""
    config = CalibrationConfig(pooling="last", variant="cls_hard", basket_size=2, strength=0.7, layers="last:2")
    for name in ("resolve", "role_policies", "resolve_layers", "isolated_roles"):
        monkeypatch.setattr(
            CalibrationConfig, name, lambda *args, **kwargs: pytest.fail("the oracle used the engine's resolution")
        )
    assert reference_policies(config) == {"first": "equal", "last": "fixed"}
    assert reference_layers(config, 4) == {2, 3}
    generator = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 2, 9, 4, generator=generator, dtype=torch.float64) for _ in range(3))
    allowed = torch.ones(2, 1, 9, 9, dtype=torch.bool).tril()
    allowed[1, ..., :3] = False  # left padding
    assert not reference_attention(q, k, v, allowed, 0.5, config).isnan().any()


def test_by_size_shares_by_hand() -> None:
    """basket_shares: by_size. [CLS] + 7 content keys, basket 3 → baskets of 3, 3 and 1 tokens, which split
    what [CLS] leaves 3/7, 3/7, 1/7 (equal: 1/3 each), proportions kept inside each. λ = 1, w = 0.3."""
    a = one_row([0.3, 0.1, 0.05, 0.05, 0.2, 0.1, 0.1, 0.1])  # basket masses 0.2, 0.4, 0.1
    every = torch.ones(1, 1, 1, 8, dtype=torch.bool)
    rows = torch.tensor([[True] + [False] * 7])

    def calibrated(variant: str, shares: str = "by_size") -> list[float]:
        config = CalibrationConfig(
            pooling="cls", variant=variant, basket_size=3, strength=1.0, weight=0.3, layers=[0], basket_shares=shares
        )
        return reference_calibrate(a, every[:, 0, 0], every, rows, config)[0, 0, 0].tolist()

    def spread(cls: float, baskets: list[float]) -> list[float]:
        inside = [0.5, 0.25, 0.25, 0.5, 0.25, 0.25, 1.0]  # each key's part of its basket's mass
        return [cls, *(baskets[i // 3] * inside[i] for i in range(7))]

    # uniform: [CLS] keeps its equal policy, 1/n_baskets = 1/4 (three content baskets and itself)
    assert calibrated("uniform") == pytest.approx(spread(1 / 4, [3 / 4 * 3 / 7, 3 / 4 * 3 / 7, 3 / 4 * 1 / 7]))
    assert calibrated("cls_soft") == pytest.approx(spread(0.3, [0.7 * 3 / 7, 0.7 * 3 / 7, 0.7 * 1 / 7]))
    assert calibrated("cls_hard") == pytest.approx(spread(0.3, [0.3, 0.3, 0.1]))
    assert calibrated("cls_soft", "equal") == pytest.approx(spread(0.3, [0.7 / 3] * 3))  # the paper's


def test_by_size_shares_a_causal_row_by_what_it_sees_by_hand() -> None:
    """[CLS] c1..c5 [SEP], basket 2 → baskets {c1, c2}, {c3, c4}, {c5}; uniform, λ = 1, causal, by_size.

    Row 3 sees [CLS], c1, c2, c3: two tokens of the first basket, one of the second. [CLS] keeps the equal
    policy, 1/3 (two baskets seen and itself); the baskets split 2/3 as 2:1, so c3 alone holds 2/9.
    Row 6 sees everything: [CLS] and [SEP] get 1/5 each (three baskets and both), the baskets split 3/5
    as 2:2:1.
    """
    generator = torch.Generator().manual_seed(2)
    attn = torch.rand(1, 1, 7, 7, generator=generator, dtype=torch.float64)
    allowed = torch.ones(1, 1, 7, 7, dtype=torch.bool).tril()
    attn = attn.masked_fill(~allowed, 0.0)
    attn = attn / attn.sum(-1, keepdim=True)
    config = CalibrationConfig(
        pooling="mean", variant="uniform", basket_size=2, strength=1.0, layers=[0], basket_shares="by_size"
    )
    got = reference_calibrate(attn, allowed[:, 0, -1], allowed, torch.ones(1, 7, dtype=torch.bool), config)[0, 0]
    row = got[3].tolist()
    assert row[0] == pytest.approx(1 / 3)
    assert row[1] + row[2] == pytest.approx(4 / 9)
    assert row[3] == pytest.approx(2 / 9)
    assert row[4:] == [0.0, 0.0, 0.0]
    last = got[6].tolist()
    assert [last[0], last[6]] == pytest.approx([1 / 5, 1 / 5])
    assert [last[1] + last[2], last[3] + last[4], last[5]] == pytest.approx([0.6 * 2 / 5, 0.6 * 2 / 5, 0.6 / 5])
