"""The engine never waits for the device inside a layer: the host syncs of one calibrated forward do not
grow with the number of baskets or of calibrated layers (on a GPU each one stalls the stream).

Counted on CPU with `benchmarks.gpu_counters.HostSyncs`, which sees every aten op whatever the device.
"""

from __future__ import annotations

import pytest
import torch

from benchmarks.gpu_counters import HostSyncs
from tuner.calibration import CalibrationConfig, calibrating
from tuner.engine.models import load_model


def test_the_counter_counts_each_kind_of_host_sync_and_nothing_else() -> None:
    x = torch.arange(6.0)
    with HostSyncs() as syncs:
        _ = x * 2 + x.sum()
        _ = x.masked_fill(x > 2, 0.0)
    assert syncs.total == 0
    for read_back in (
        lambda: bool((x > 2).any()),
        lambda: x.sum().item(),
        lambda: int(x.argmax()),
        lambda: x.tolist(),
        lambda: x[x > 2],
        lambda: torch.equal(x, x),
        lambda: x.nonzero(),
        lambda: x.numpy(),
    ):
        with HostSyncs() as syncs:
            read_back()
        assert syncs.total == 1, read_back


def syncs_of_one_forward(model, batch, config: CalibrationConfig) -> int:
    with torch.inference_mode(), calibrating(config.resolve(model.num_layers)), HostSyncs() as syncs:
        model.model(**batch)
    return syncs.total


@pytest.mark.parametrize(("kind", "pooling"), [("bert", "cls"), ("bert", "mean"), ("qwen3", "last"), ("qwen3", "mean")])
def test_host_syncs_do_not_grow_with_baskets_or_layers(tiny_model_dir, one_thread, kind: str, pooling: str) -> None:
    """Two padded passages of 120 and 90 tokens through a 3-layer model: 2 or 60 baskets, 1 or 3 calibrated
    layers; each forward syncs as often as the mildest."""
    model = load_model(str(tiny_model_dir(kind)), pooling=pooling)
    texts = [" ".join(f"w{i % 200}" for i in range(n)) for n in (118, 88)]
    batch = model.tokenizer(texts, padding=True, return_tensors="pt")
    counts = {
        (basket, layers): syncs_of_one_forward(
            model,
            batch,
            CalibrationConfig(
                pooling=pooling, padding_side=model.spec.padding_side, strength=0.7, basket_size=basket, layers=layers
            ),
        )
        for basket in (58, 2)
        for layers in ("last", 1.0)
    }
    assert len(set(counts.values())) == 1, counts
