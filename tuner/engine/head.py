"""The modules a sentence-transformers folder applies after pooling (`tuner.engine.pipeline`): Dense layers and
normalisation, built from the folder's own files as sentence-transformers builds them, in float32 on the model's
device. A model without them has no head: its pooled vectors are its embeddings."""

from __future__ import annotations

import importlib
from pathlib import Path

import torch

from tuner.engine.pipeline import Dense, Pipeline, UnsupportedPipelineError


class Normalize(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.normalize(x, p=2, dim=-1)


class DenseLayer(torch.nn.Module):
    """sentence-transformers' Dense: `activation(linear(x))`, its state saved as `linear.weight` / `linear.bias`."""

    def __init__(self, dense: Dense) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(dense.in_features, dense.out_features, bias=dense.bias)
        self.activation = activation(dense)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.activation(self.linear(x))


def load_head(pipeline: Pipeline, device: torch.device) -> torch.nn.Sequential | None:
    """The pipeline's modules after pooling, weights loaded, in eval mode; None when it has none."""
    layers: list[torch.nn.Module] = []
    for module in pipeline.head:
        if module.dense is None:
            layers.append(Normalize())
            continue
        layer = DenseLayer(module.dense)
        _load_linear(layer.linear, module.dense, (pipeline.folder or Path()) / module.dense.path)
        layers.append(layer)
    if not layers:
        return None
    return torch.nn.Sequential(*layers).to(device=device, dtype=torch.float32).eval()


def _load_linear(linear: torch.nn.Linear, dense: Dense, folder: Path) -> None:
    """The Dense module's weights into `linear`, refused unless they have the shapes its config.json gives."""
    state = _state(folder / dense.weights)
    shapes: dict[str, tuple[int, ...]] = {"linear.weight": (dense.out_features, dense.in_features)}
    if dense.bias:
        shapes["linear.bias"] = (dense.out_features,)
    wrong = [
        f"{name} {'missing' if name not in state else tuple(state[name].shape)}"
        for name, shape in shapes.items()
        if name not in state or tuple(state[name].shape) != shape
    ]
    if wrong:
        raise UnsupportedPipelineError(
            f"{folder / dense.weights} does not hold the weights its config.json describes ({dense.in_features} → "
            f"{dense.out_features}, bias {str(dense.bias).lower()}): {', '.join(wrong)}"
        )
    with torch.no_grad():
        linear.weight.copy_(state["linear.weight"])
        if dense.bias:
            linear.bias.copy_(state["linear.bias"])


def activation(dense: Dense) -> torch.nn.Module:
    """The activation by its dotted name (e.g. `torch.nn.modules.activation.Tanh`), built without arguments."""
    module_name, _, class_name = dense.activation.rpartition(".")
    try:
        found = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError, ValueError):
        found = None
    if not (isinstance(found, type) and issubclass(found, torch.nn.Module)):
        foreign = f"its activation {dense.activation!r} is no torch.nn module"
        raise UnsupportedPipelineError(f"Dense module {dense.path}: {foreign}")
    return found()


def _state(path: Path) -> dict[str, torch.Tensor]:
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path))
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 - safetensors and torch raise their own kinds for a damaged file
        raise UnsupportedPipelineError(f"{path} cannot be read as Dense weights ({error})") from None
