"""The row math (rows.py) against the plain full-matrix oracle (reference.py), and the §3 equations."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tuner.calibration.config import CalibrationConfig
from tuner.calibration.reference import reference_calibrate, reference_isolated
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
        isolate=draw(st.none() | st.lists(st.sampled_from(["first", "last"]), unique=True, max_size=2)),
        basket_shares=draw(st.sampled_from(["equal", "by_size"])),
        layers=[0],
    )
    if draw(st.booleans()):  # explicit per-token policies instead of the preset
        config = config.model_copy(update={"policies": {r: draw(POLICIES) for r in reference_isolated(config)}})
    roles = reference_isolated(config)
    # item 0 has exactly `target_baskets` baskets; others anything from none (too short) up to that
    counts = [target_baskets] + [draw(st.integers(0, target_baskets)) for _ in range(batch - 1)]
    contents = [
        draw(st.integers(max(1, basket * (n - 1) + 1), basket * n)) if n else draw(st.integers(0, basket - 1))
        for n in counts
    ]
    lengths = [max(1, c + len(roles)) for c in contents]
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
    seen = visibility(draw(st.sampled_from(["all", "causal", "random"])), key_valid, rows, seed)
    return config, key_valid, seen, seed


def visibility(kind: str, key_valid: torch.Tensor, rows: int, seed: int) -> torch.Tensor:
    """(B, R, K): the keys each row may see. All real keys; a causal row's prefix (a random row position);
    or any random subset of the real keys (a row may then see no content basket, or nothing)."""
    seen = key_valid[:, None, :].expand(-1, rows, -1)
    generator = torch.Generator().manual_seed(seed + 1)
    if kind == "causal":
        cut = torch.randint(0, key_valid.shape[1], (key_valid.shape[0], rows, 1), generator=generator)
        seen = seen & (torch.arange(key_valid.shape[1]) <= cut)
    elif kind == "random":
        seen = seen & (torch.rand(seen.shape, generator=generator) < 0.6)
    return seen.contiguous()


def softmax_rows(seen: torch.Tensor, seed: int, scale: float = 3.0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(seen.shape, generator=generator) * scale
    return logits.masked_fill(~seen, float("-inf")).softmax(-1).nan_to_num(0.0)  # a row that sees nothing: 0


def engine(
    attn: torch.Tensor, key_valid: torch.Tensor, config: CalibrationConfig, seen: torch.Tensor | None = None
) -> torch.Tensor:
    spec = config.resolve(1)
    geometry = BasketGeometry.from_key_mask(key_valid, config.basket_size, tuple(r for r, _ in spec.policies))
    seen = key_valid[:, None, :] if seen is None else seen
    return calibrate_rows(attn.clone(), geometry, spec, seen)


def oracle(attn: torch.Tensor, key_valid: torch.Tensor, config: CalibrationConfig, seen: torch.Tensor) -> torch.Tensor:
    """Each of the R rows as a one-row head of the oracle's (B, H, Q, K) matrix."""
    rows = torch.ones(attn.shape[0], 1, dtype=torch.bool)
    return reference_calibrate(attn.double()[:, :, None, :], key_valid, seen[:, :, None, :], rows, config)[:, :, 0, :]


@settings(max_examples=300, deadline=None)
@given(cases())
def test_engine_matches_oracle_in_float32(case: tuple) -> None:
    config, key_valid, seen, seed = case
    attn = softmax_rows(seen, seed)
    got = engine(attn, key_valid, config, seen)
    assert torch.allclose(got.double(), oracle(attn, key_valid, config, seen), atol=1e-6, rtol=0)


@settings(max_examples=100, deadline=None)
@given(cases())
def test_unseen_keys_stay_zero_and_rows_sum_to_one(case: tuple) -> None:
    """Padding, and keys a row may not see, get nothing; a row that sees anything still sums to 1."""
    config, key_valid, seen, seed = case
    got = engine(softmax_rows(seen, seed), key_valid, config, seen)
    assert torch.all(got[~seen] == 0)
    sees = seen.any(-1)
    assert torch.allclose(got.sum(-1)[sees], torch.ones_like(got.sum(-1)[sees]), atol=1e-5)


@settings(max_examples=60, deadline=None)
@given(cases())
def test_strength_zero_and_short_documents_are_untouched(case: tuple) -> None:
    config, key_valid, seen, seed = case
    attn = softmax_rows(seen, seed)
    assert torch.equal(engine(attn, key_valid, config.model_copy(update={"strength": 0.0}), seen), attn)
    short = key_valid.sum(-1) - len(reference_isolated(config)) < config.basket_size
    assert torch.equal(engine(attn, key_valid, config, seen)[short], attn[short])


def basket_masses(row: torch.Tensor, start: int, content: int, size: int) -> torch.Tensor:
    return torch.stack([row[start + i : start + min(i + size, content)].sum() for i in range(0, content, size)])


def test_uniform_full_strength_gives_every_basket_an_equal_share() -> None:
    """a_cal_k = a_k / Σ_{j∈b(k)} a_j · 1/n_baskets, the [CLS] basket included (§3.1)."""
    key_valid = torch.ones(1, 11, dtype=torch.bool)  # [CLS] + 10 content keys, baskets of 4 → 3 + 1 = 4 baskets
    attn = softmax_rows(key_valid[:, None, :].expand(-1, 1, -1), 0)
    got = engine(
        attn, key_valid, CalibrationConfig(variant="uniform", strength=1.0, basket_size=4, pooling="cls", layers=[0])
    )[0, 0]
    assert torch.allclose(got[0], torch.tensor(0.25))
    assert torch.allclose(basket_masses(got, 1, 10, 4), torch.full((3,), 0.25))
    within = got[1:5] / got[1:5].sum()
    assert torch.allclose(within, attn[0, 0, 1:5] / attn[0, 0, 1:5].sum())  # proportions kept inside a basket


def test_cls_soft_keeps_the_self_mass_and_shares_the_rest() -> None:
    """a_cal_s = a_s; content baskets split 1 − a_s equally (§3.3)."""
    key_valid = torch.ones(1, 9, dtype=torch.bool)
    attn = softmax_rows(key_valid[:, None, :].expand(-1, 1, -1), 1)
    got = engine(
        attn, key_valid, CalibrationConfig(variant="cls_soft", strength=1.0, basket_size=4, pooling="cls", layers=[0])
    )[0, 0]
    self_mass = attn[0, 0, 0]
    assert torch.equal(got[0], self_mass)
    assert torch.allclose(basket_masses(got, 1, 8, 4), ((1 - self_mass) / 2).expand(2))


def test_cls_hard_fixes_the_self_mass_at_w() -> None:
    """a_cal_s = w; content baskets split 1 − w equally (§3.3)."""
    key_valid = torch.ones(1, 9, dtype=torch.bool)
    got = engine(
        softmax_rows(key_valid[:, None, :].expand(-1, 1, -1), 2),
        key_valid,
        CalibrationConfig(variant="cls_hard", weight=0.3, strength=1.0, basket_size=4, pooling="cls", layers=[0]),
    )[0, 0]
    assert torch.allclose(got[0], torch.tensor(0.3))
    assert torch.allclose(basket_masses(got, 1, 8, 4), torch.full((2,), 0.35))


def test_strength_blends_linearly() -> None:
    """â = λ·a_cal + (1 − λ)·a (§3.2)."""
    key_valid = torch.ones(2, 13, dtype=torch.bool)
    attn = softmax_rows(key_valid[:, None, :].expand(-1, 2, -1), 3)
    full = engine(attn, key_valid, CalibrationConfig(strength=1.0, basket_size=3, layers=[0]))
    half = engine(attn, key_valid, CalibrationConfig(strength=0.4, basket_size=3, layers=[0]))
    assert torch.allclose(half, 0.4 * full + 0.6 * attn, atol=1e-7)


def test_last_token_pooling_isolates_both_ends_under_left_padding() -> None:
    """Reference-code defaults for last pooling: first token keeps its mass, final token gets an equal share."""
    key_valid = torch.tensor([[False, False] + [True] * 10])  # 2 pads, first, 8 content, last
    attn = softmax_rows(key_valid[:, None, :].expand(-1, 1, -1), 4)
    config = CalibrationConfig(
        pooling="last",
        padding_side="left",
        strength=1.0,
        basket_size=4,
        layers=[0],
        policies={"first": "original", "last": "equal"},
    )
    got = engine(attn, key_valid, config)[0, 0]
    assert torch.equal(got[:2], torch.zeros(2))
    assert torch.equal(got[2], attn[0, 0, 2])
    assert torch.allclose(got[11], torch.tensor(1 / 4))  # equal: 1/n_total, 2 content baskets + 2 isolated
    assert torch.allclose(basket_masses(got, 3, 8, 4), ((1 - attn[0, 0, 2] - 1 / 4) / 2).expand(2))


# by_size: each content basket's share of what the isolated tokens leave is in proportion to the content
# tokens it holds (those the row sees). [CLS] + 7 content keys, baskets of 3 → baskets of 3, 3 and 1 tokens:
# shares 3/7, 3/7 and 1/7 of the remainder, where `equal` (§3) gives each 1/3.
SEVEN = torch.ones(1, 8, dtype=torch.bool)
BY_SIZE = torch.tensor([3 / 7, 3 / 7, 1 / 7])


@pytest.mark.parametrize(
    ("variant", "isolated", "remainder"),
    [
        ("uniform", lambda a_s: 1 / 4, lambda a_s: 3 / 4),  # equal policy: 1/n_baskets, 3 content + [CLS]
        ("cls_soft", lambda a_s: a_s, lambda a_s: 1 - a_s),  # [CLS] keeps its mass
        ("cls_hard", lambda a_s: 0.3, lambda a_s: 0.7),  # [CLS] fixed at w
    ],
)
def test_by_size_shares_the_remainder_by_basket_content(variant: str, isolated, remainder) -> None:
    attn = softmax_rows(SEVEN[:, None, :], 5)
    config = CalibrationConfig(
        variant=variant, weight=0.3, strength=1.0, basket_size=3, pooling="cls", layers=[0], basket_shares="by_size"
    )
    got = engine(attn, SEVEN, config)[0, 0]
    a_s = attn[0, 0, 0]
    assert torch.allclose(got[0], torch.as_tensor(isolated(a_s)))
    assert torch.allclose(basket_masses(got, 1, 7, 3), remainder(a_s) * BY_SIZE)
    for lo, hi in ((1, 4), (4, 7)):  # proportions kept inside a basket
        assert torch.allclose(got[lo:hi] / got[lo:hi].sum(), attn[0, 0, lo:hi] / attn[0, 0, lo:hi].sum())
    equal = engine(attn, SEVEN, config.model_copy(update={"basket_shares": "equal"}))[0, 0]
    # the paper's, for contrast
    assert torch.allclose(basket_masses(equal, 1, 7, 3), torch.as_tensor(remainder(a_s) / 3).expand(3))


def test_by_size_shares_a_causal_row_by_the_tokens_it_sees() -> None:
    """[CLS] c1..c7, baskets {c1..c3} {c4..c6} {c7}; a row that sees [CLS] and c1..c5 sees 3 and 2 tokens of the
    first two baskets and none of the third: uniform gives [CLS] 1/3 (two baskets seen + [CLS]), the baskets
    2/3 · 3/5 and 2/3 · 2/5, and c6, c7 nothing."""
    seen = (torch.arange(8) <= 5)[None, None, :]
    attn = softmax_rows(seen, 6)
    config = CalibrationConfig(
        variant="uniform", strength=1.0, basket_size=3, pooling="cls", layers=[0], basket_shares="by_size"
    )
    got = engine(attn, SEVEN, config, seen)[0, 0]
    assert torch.allclose(got[0], torch.tensor(1 / 3))
    assert torch.allclose(torch.stack([got[1:4].sum(), got[4:6].sum()]), torch.tensor([2 / 3 * 3 / 5, 2 / 3 * 2 / 5]))
    assert torch.equal(got[6:], torch.zeros(2))


@settings(max_examples=100, deadline=None)
@given(cases())
def test_by_size_is_equal_when_every_basket_is_full(case: tuple) -> None:
    """Content that fills its baskets exactly, every key seen: each basket holds B tokens, so by_size's shares
    are equal's (to float32 rounding: remainder / (n · B) · B against remainder / n)."""
    config, _, _, seed = case
    n = seed % 5 + 1
    roles = reference_isolated(config)
    key_valid = torch.ones(2, n * config.basket_size + len(roles), dtype=torch.bool)
    seen = key_valid[:, None, :].expand(-1, 3, -1)
    attn = softmax_rows(seen, seed)
    equal = engine(attn, key_valid, config.model_copy(update={"basket_shares": "equal"}), seen)
    by_size = engine(attn, key_valid, config.model_copy(update={"basket_shares": "by_size"}), seen)
    assert (by_size - equal).abs().max() <= 1e-6
