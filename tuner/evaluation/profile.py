"""The attention profile of a trial: where the pooling row's attention goes, layer by layer.

For every layer, the pooled row's attention mass per relative-position bin of the content (before and
after calibration), and the mass on each isolated token (the self / sink mass of the paper's
Figure 2), averaged over heads and a fixed sample of documents. For mean pooling the "pooled row" is
the average of all real rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

import numpy as np
import torch

from tuner.calibration.rows import BasketGeometry


class ProfileData(TypedDict):
    """`AttentionProfile.as_dict`: per layer (in the order of `layers`), the mean mass per bin and per isolated
    token."""

    bins: int
    isolated_tokens: list[str]
    layers: list[int]
    before_bins: list[list[float]]
    after_bins: list[list[float]]
    before_isolated: list[list[float]]
    after_isolated: list[list[float]]


@dataclass
class AttentionProfile:
    """An `AttentionObserver` that accumulates binned attention mass per layer."""

    bins: int = 10
    _sums: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)
    _items: dict[int, int] = field(default_factory=dict)
    roles: tuple[str, ...] = ()

    def __call__(self, layer: int, before: torch.Tensor, after: torch.Tensor, geometry: BasketGeometry) -> None:
        self.roles = geometry.roles
        bin_of = self._bin_index(geometry)  # (B, K): bin of each content key, `bins` elsewhere
        totals = self._sums.setdefault(layer, {})
        for name, rows in (("before", before), ("after", after)):
            mass = rows.float().mean(1).cpu()  # average over heads → (B, K)
            binned = torch.zeros(mass.shape[0], self.bins + 1).scatter_add_(1, bin_of, mass)[:, : self.bins]
            isolated = mass.gather(1, geometry.isolated.cpu()) if geometry.roles else mass[:, :0]
            for key, value in ((f"{name}_bins", binned), (f"{name}_isolated", isolated)):
                totals[key] = totals.get(key, 0) + value.sum(0).numpy()
        self._items[layer] = self._items.get(layer, 0) + before.shape[0]

    def _bin_index(self, geometry: BasketGeometry) -> torch.Tensor:
        content = geometry.key_content.cpu()
        start = torch.where(content, torch.arange(content.shape[1]), content.shape[1]).amin(-1, keepdim=True)
        length = content.sum(-1, keepdim=True).clamp_min(1)
        relative = (torch.arange(content.shape[1]) - start).clamp_min(0) * self.bins // length
        return torch.where(content, relative.clamp_max(self.bins - 1), self.bins)

    def as_dict(self) -> ProfileData:
        """JSON-ready: per layer, mean mass per bin before/after and per isolated token."""
        layers = sorted(self._sums)

        def per_layer(key: str) -> list[list[float]]:
            return [(self._sums[layer][key] / self._items[layer]).round(6).tolist() for layer in layers]

        return ProfileData(
            bins=self.bins,
            isolated_tokens=list(self.roles),
            layers=layers,
            before_bins=per_layer("before_bins"),
            after_bins=per_layer("after_bins"),
            before_isolated=per_layer("before_isolated"),
            after_isolated=per_layer("after_isolated"),
        )

    def summary(self) -> dict[str, float]:
        """A few scalars to chart across trials: last layer's first/last bin and isolated mass after calibration."""
        profile = self.as_dict()
        last_bins = profile["after_bins"][-1]
        summary = {"profile_first_bin_mass": float(last_bins[0]), "profile_last_bin_mass": float(last_bins[-1])}
        for role, mass in zip(self.roles, profile["after_isolated"][-1]):
            summary[f"profile_{role}_token_mass"] = float(mass)
        return summary


def plot_profile(profile: ProfileData, path: Path, title: str) -> Path:
    """Heatmaps of mass per bin (layers × bins) before and after calibration, and isolated mass per layer."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    before, after = np.array(profile["before_bins"]), np.array(profile["after_bins"])
    layers = profile["layers"]
    # Fixed margins rather than a layout engine: constrained layout is slow, and every trial draws this plot.
    figure, axes = plt.subplots(1, 3, figsize=(14, 4), gridspec_kw={"width_ratios": [4, 4, 3]})
    figure.subplots_adjust(left=0.04, right=0.99, bottom=0.13, top=0.84, wspace=0.25)
    vmax = max(before.max(), after.max())
    for axis, data, name in ((axes[0], before, "before"), (axes[1], after, "after")):
        image = axis.imshow(data, aspect="auto", cmap="viridis", vmin=0, vmax=vmax, origin="lower")
        axis.set(title=f"content mass per position bin, {name}", xlabel="relative position (tenths of the content)")
        axis.set_yticks(range(len(layers)), labels=[str(layer) for layer in layers])
        axis.set_ylabel("layer")
    figure.colorbar(image, ax=axes[1], label="attention mass")
    isolated_before, isolated_after = np.array(profile["before_isolated"]), np.array(profile["after_isolated"])
    for column, role in enumerate(profile["isolated_tokens"]):
        axes[2].plot(isolated_before[:, column], marker="o", label=f"{role} token, before")
        axes[2].plot(isolated_after[:, column], marker="x", linestyle="--", label=f"{role} token, after")
    axes[2].set(title="isolated-token (self/sink) mass", xlabel="layer", ylim=(0, 1))
    axes[2].set_xticks(range(len(layers)), labels=[str(layer) for layer in layers])
    axes[2].legend(fontsize=7)
    figure.suptitle(title)
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return path
