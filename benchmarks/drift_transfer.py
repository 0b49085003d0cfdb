"""Does a config's drift on WikiPos-dev tell how it transfers? The evidence behind `--max-drift` (MiniLM).

Run from the repository root:

    .venv/bin/python -m benchmarks.drift_transfer                        # dev and every held-out set below
    .venv/bin/python -m benchmarks.drift_transfer --sets wikipos-lengths   # dev and one (30 min beside 3 other jobs)

Each config is scored side by side on `wikipos-dev` (where its drift is measured: the mean 1 − cosine between
its document vectors and the uncalibrated ones, as a multiple of the paper default's there, which is what
`--max-drift` limits) and on held-out sets selection never sees. Per set: PSI as a ratio to the uncalibrated
PSI with its 95% paired-bootstrap interval, and the changes of HM and of aggregate nDCG@10 in points with
theirs. The configs are the winners of the default studies of seeds 0-4 and of the paper grid, the paper
default, and configs of the space at several drifts (CLS-Hard with a large w re-embeds the passages most).
The last lines give, per held-out set, Spearman's rank correlation of the dev drift ratio with ΔHM and ΔnDCG@10.
"""

from __future__ import annotations

import argparse
from typing import Any

SETS = ("wikipos-lengths", "wikipos-test", "wikipos-sentences", "wikipos-mixed")


def _soft(strength: float, layers: Any, basket: int, variant: str = "cls_soft") -> dict[str, Any]:
    return {"variant": variant, "strength": strength, "layers": layers, "basket_size": basket}


def _hard(weight: float, strength: float, layers: Any, basket: int) -> dict[str, Any]:
    return {**_soft(strength, layers, basket, "cls_hard"), "weight": weight}


# `layers`: a fraction of the layers (0.5: the last 50%) or the last k as "last:k"
CONFIGS: dict[str, dict[str, Any]] = {
    "paper default: CLS-Soft λ0.5 50% B128": _soft(0.5, 0.5, 128),
    "grid winner: CLS-Soft λ0.5 L1 B128": _soft(0.5, "last:1", 128),
    "CLS-Soft λ0.55 L1 B128": _soft(0.55, "last:1", 128),
    "CLS-Soft λ0.65 L2 B128": _soft(0.65, "last:2", 128),
    "CLS-Soft λ0.55 L2 B256": _soft(0.55, "last:2", 256),
    "CLS-Hard w0.1 λ0.5 L1 B128": _hard(0.1, 0.5, "last:1", 128),
    "CLS-Hard w0.45 λ0.55 L2 B256": _hard(0.45, 0.55, "last:2", 256),
    "CLS-Hard w0.45 λ0.4 L2 B256": _hard(0.45, 0.4, "last:2", 256),
    "CLS-Hard w0.45 λ0.55 L1 B128": _hard(0.45, 0.55, "last:1", 128),
    "CLS-Hard w0.3 λ0.5 L1 B128": _hard(0.3, 0.5, "last:1", 128),
    "CLS-Hard w0.3 λ0.5 50% B256": _hard(0.3, 0.5, 0.5, 256),
    "CLS-Hard w0.3 λ1 L1 B128": _hard(0.3, 1.0, "last:1", 128),
    "CLS-Hard w0.25 λ0.5 L2 B128": _hard(0.25, 0.5, "last:2", 128),
    "CLS-Soft λ1 L2 B128": _soft(1.0, "last:2", 128),
    "Uniform λ0.5 L1 B128": _soft(0.5, "last:1", 128, "uniform"),
    "CLS-Soft λ0.8 50% B256": _soft(0.8, 0.5, 256),
}
REFERENCE = "paper default: CLS-Soft λ0.5 50% B128"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sets", nargs="+", default=list(SETS), help="held-out sets (wikipos-dev is always scored first)"
    )
    args = parser.parse_args(argv)

    from objectives.bootstrap import paired_bootstrap
    from tuner.calibration import CalibrationConfig
    from tuner.data import load_benchmark
    from tuner.engine.models import load_model
    from tuner.evaluation.evaluator import Evaluator

    model = load_model("minilm")
    configs = {label: CalibrationConfig(pooling=model.spec.pooling, **knobs) for label, knobs in CONFIGS.items()}
    ratios: dict[str, float] = {}
    changes: dict[str, dict[str, tuple[float, float]]] = {}
    for name in ["wikipos-dev", *args.sets]:
        evaluator = Evaluator(model, load_benchmark(name), prefix_layers=range(1, model.num_layers))
        baseline = evaluator.run(None)
        psi = baseline.report.psi
        assert psi is not None
        print(f"{name}: uncalibrated PSI {psi:.3f}, HM {100 * (baseline.report.hm or 0.0):.2f}", flush=True)
        for label, config in configs.items():
            run = evaluator.run(config)
            interval = paired_bootstrap(baseline.per_query, run.per_query)
            assert interval.psi is not None and interval.hm is not None
            if name == "wikipos-dev":
                ratios[label] = run.drift
            changes.setdefault(name, {})[label] = (interval.hm.estimate, interval.ndcg10.estimate)
            print(
                f"  {label:38} drift {run.drift:.4f} | PSI {(psi + interval.psi.estimate) / psi:.2f}x "
                f"[{(psi + interval.psi.low) / psi:.2f}, {(psi + interval.psi.high) / psi:.2f}] | "
                f"ΔHM {interval.hm.format()} | ΔnDCG@10 {interval.ndcg10.format()}",
                flush=True,
            )
        if name == "wikipos-dev":
            reference = ratios[REFERENCE]
            ratios = {label: drift / reference for label, drift in ratios.items()}
            print(
                "  dev drift as a multiple of the paper default's: "
                + ", ".join(f"{k} {v:.1f}x" for k, v in ratios.items()),
                flush=True,
            )
    order = list(configs)
    for name in args.sets:
        drift = [ratios[label] for label in order]
        hm = spearman(drift, [changes[name][label][0] for label in order])
        ndcg = spearman(drift, [changes[name][label][1] for label in order])
        print(
            f"{name}: Spearman ρ of dev drift ratio with ΔHM {hm:+.2f}, "
            f"with ΔnDCG@10 {ndcg:+.2f} ({len(order)} configs)"
        )


def spearman(x: list[float], y: list[float]) -> float:
    """Spearman's ρ: the correlation of the ranks (measured figures: no ties)."""
    import numpy as np

    return float(np.corrcoef(np.argsort(np.argsort(x)), np.argsort(np.argsort(y)))[0, 1])


if __name__ == "__main__":
    main()
