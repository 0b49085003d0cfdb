"""The row math (rows.py) against the plain full-matrix oracle (reference.py), and the §3 equations."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tuner.calibration.config import CalibrationConfig
from tuner.calibration.reference import reference_calibrate
from tuner.calibration.rows import BasketGeometry, calibrate_rows

POLICIES = st.sampled_from(["equal", "original", "fixed"])


@st.composite
def cases(draw: st.DrawFn) -> tuple:
    pooling = draw(st.sampled_from(["cls", "last", "mean"]))
    basket = draw(st.integers(1, 6))
    target_baskets = draw(st.integers(1, 46))
    batch = draw(st.integers(1, 8))
    config = CalibrationConfig(
        variant=draw(st.sampled_from(["uniform", "cls_soft", "cls_hard"])),
        strength=draw(st.floats(0.0, 1.0)),
        basket_size=basket,
        weight=draw(st.floats(0.05, 0.95)),
        pooling=pooling,
        layers=[0],
    )
    if draw(st.booleans()):  # explicit per-token policies instead of the preset
        config = config.model_copy(update={"policies": {r: draw(POLICIES) for r in config.isolated_roles()}})
    roles = config.isolated_roles()
    # item 0 has exactly `target_baskets` baskets; others anything from none (too short) up to that
    counts = [target_baskets] + [draw(st.integers(0, target_baskets)) for _ in range(batch - 1)]
    contents = [draw(st.integers(max(1, basket * (n - 1) + 1), basket * n)) if n else draw(st.integers(0, basket - 1)) for n in counts]
    lengths = [c + len(roles) for c in contents]
    keys = max(lengths) + draw(st.integers(0, 3))
    left = draw(st.booleans())
    key_valid = torch.zeros(batch, keys, dtype=torch.bool)
    for b, length in enumerate(lengths):
        if left:
            key_valid[b, keys - length :] = True
        else:
            key_valid[b, :length] = True
    rows = draw(st.integers(1, 3))
    seed = draw(st.integers(0, 2**16))
    return config, key_valid, rows, seed


def softmax_rows(key_valid: torch.Tensor, rows: int, seed: int, scale: float = 3.0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(key_valid.shape[0], rows, key_valid.shape[1], generator=generator) * scale
    return logits.masked_fill(~key_valid[:, None, :], float("-inf")).softmax(-1)


def engine(attn: torch.Tensor, key_valid: torch.Tensor, config: CalibrationConfig) -> torch.Tensor:
    spec = config.resolve(1)
    geometry = BasketGeometry.from_key_mask(key_valid, config.basket_size, tuple(r for r, _ in spec.policies))
    return calibrate_rows(attn.clone(), geometry, spec)


def oracle(attn: torch.Tensor, key_valid: torch.Tensor, config: CalibrationConfig) -> torch.Tensor:
    spec = config.resolve(1)
    rows = torch.ones(attn.shape[0], 1, dtype=torch.bool)
    roles = tuple(r for r, _ in spec.policies)
    return reference_calibrate(attn.double()[:, :, None, :], key_valid, rows, spec, roles)[:, :, 0, :]


@settings(max_examples=300, deadline=None)
@given(cases())
def test_engine_matches_oracle_in_float32(case: tuple) -> None:
    config, key_valid, rows, seed = case
    attn = softmax_rows(key_valid, rows, seed)
    got = engine(attn, key_valid, config)
    assert torch.allclose(got.double(), oracle(attn, key_valid, config), atol=1e-6, rtol=0)


@settings(max_examples=100, deadline=None)
@given(cases())
def test_padded_keys_stay_zero_and_rows_sum_to_one(case: tuple) -> None:
    config, key_valid, rows, seed = case
    got = engine(softmax_rows(key_valid, rows, seed), key_valid, config)
    assert torch.all(got[~key_valid[:, None, :].expand_as(got)] == 0)
    assert torch.allclose(got.sum(-1), torch.ones_like(got.sum(-1)), atol=1e-5)


@settings(max_examples=60, deadline=None)
@given(cases())
def test_strength_zero_and_short_documents_are_untouched(case: tuple) -> None:
    config, key_valid, rows, seed = case
    attn = softmax_rows(key_valid, rows, seed)
    assert torch.equal(engine(attn, key_valid, config.model_copy(update={"strength": 0.0})), attn)
    roles = config.isolated_roles()
    short = key_valid.sum(-1) - len(roles) < config.basket_size
    assert torch.equal(engine(attn, key_valid, config)[short], attn[short])


def basket_masses(row: torch.Tensor, start: int, content: int, size: int) -> torch.Tensor:
    return torch.stack([row[start + i : start + min(i + size, content)].sum() for i in range(0, content, size)])


def test_uniform_full_strength_gives_every_basket_an_equal_share() -> None:
    """a_cal_k = a_k / Σ_{j∈b(k)} a_j · 1/n_baskets, the [CLS] basket included (§3.1)."""
    key_valid = torch.ones(1, 11, dtype=torch.bool)  # [CLS] + 10 content keys, baskets of 4 → 3 + 1 = 4 baskets
    attn = softmax_rows(key_valid, 1, 0)
    got = engine(attn, key_valid, CalibrationConfig(variant="uniform", strength=1.0, basket_size=4, pooling="cls", layers=[0]))[0, 0]
    assert torch.allclose(got[0], torch.tensor(0.25))
    assert torch.allclose(basket_masses(got, 1, 10, 4), torch.full((3,), 0.25))
    within = got[1:5] / got[1:5].sum()
    assert torch.allclose(within, attn[0, 0, 1:5] / attn[0, 0, 1:5].sum())  # proportions kept inside a basket


def test_cls_soft_keeps_the_self_mass_and_shares_the_rest() -> None:
    """a_cal_s = a_s; content baskets split 1 − a_s equally (§3.3)."""
    key_valid = torch.ones(1, 9, dtype=torch.bool)
    attn = softmax_rows(key_valid, 1, 1)
    got = engine(attn, key_valid, CalibrationConfig(variant="cls_soft", strength=1.0, basket_size=4, pooling="cls", layers=[0]))[0, 0]
    self_mass = attn[0, 0, 0]
    assert torch.equal(got[0], self_mass)
    assert torch.allclose(basket_masses(got, 1, 8, 4), ((1 - self_mass) / 2).expand(2))


def test_cls_hard_fixes_the_self_mass_at_w() -> None:
    """a_cal_s = w; content baskets split 1 − w equally (§3.3)."""
    key_valid = torch.ones(1, 9, dtype=torch.bool)
    got = engine(softmax_rows(key_valid, 1, 2), key_valid, CalibrationConfig(variant="cls_hard", weight=0.3, strength=1.0, basket_size=4, pooling="cls", layers=[0]))[0, 0]
    assert torch.allclose(got[0], torch.tensor(0.3))
    assert torch.allclose(basket_masses(got, 1, 8, 4), torch.full((2,), 0.35))


def test_strength_blends_linearly() -> None:
    """â = λ·a_cal + (1 − λ)·a (§3.2)."""
    key_valid = torch.ones(2, 13, dtype=torch.bool)
    attn = softmax_rows(key_valid, 2, 3)
    full = engine(attn, key_valid, CalibrationConfig(strength=1.0, basket_size=3, layers=[0]))
    half = engine(attn, key_valid, CalibrationConfig(strength=0.4, basket_size=3, layers=[0]))
    assert torch.allclose(half, 0.4 * full + 0.6 * attn, atol=1e-7)


def test_last_token_pooling_isolates_both_ends_under_left_padding() -> None:
    """Reference-code defaults for last pooling: first token keeps its mass, final token gets an equal share."""
    key_valid = torch.tensor([[False, False] + [True] * 10])  # 2 pads, first, 8 content, last
    attn = softmax_rows(key_valid, 1, 4)
    config = CalibrationConfig(pooling="last", padding_side="left", strength=1.0, basket_size=4, layers=[0], policies={"first": "original", "last": "equal"})
    got = engine(attn, key_valid, config)[0, 0]
    assert torch.equal(got[:2], torch.zeros(2))
    assert torch.equal(got[2], attn[0, 0, 2])
    assert torch.allclose(got[11], torch.tensor(1 / 4))  # equal: 1/n_total, 2 content baskets + 2 isolated
    assert torch.allclose(basket_masses(got, 3, 8, 4), ((1 - attn[0, 0, 2] - 1 / 4) / 2).expand(2))
