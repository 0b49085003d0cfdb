"""Where each model's bias points before calibration: PSI and tilt, with their noise, on every tuning structure.

The tuner's rules read the uncalibrated model: the rungs go least biased first, and the no-reversal rule
measures a trial's tilt against the uncalibrated direction on each structure, where that direction is beyond
noise (`objectives.robustness.DIRECTION_Z`). This benchmark shows, model by model, what those rules see:

    .venv/bin/python -m benchmarks.baseline_direction                      # MiniLM and MPNet on WikiPos-dev
    .venv/bin/python -m benchmarks.baseline_direction --models minilm      # one model

MPNet needs its weights (`make mpnet`). Vectors come from the disk cache a study leaves (`$POSFAIR_CACHE_DIR`, else
`mlruns/cache`), so run it where the studies ran to reuse their baselines. Writes docs/results/baseline-direction.json.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks import record
from objectives.evidence import trial_evidence
from objectives.robustness import DIRECTION_Z

DEFAULT_MODELS = ("minilm", "mpnet")


@dataclass(frozen=True)
class Direction:
    """One model on one structure, uncalibrated: PSI and HM (0–1), the tilt (the fitted change from the first to
    the last character as a fraction of mean nDCG@10; < 0: the beginning favoured) with standard errors."""

    structure: str
    psi: float
    psi_se: float
    hm: float
    tilt: float | None
    tilt_se: float

    @property
    def beyond_noise(self) -> bool:
        """Whether the tilt clears zero by `DIRECTION_Z` standard errors: the structure has a direction to reverse."""
        return self.tilt is not None and abs(self.tilt) >= DIRECTION_Z * self.tilt_se


def directions(model_name: str, dataset_name: str) -> list[Direction]:
    """The uncalibrated model on the tuning passages and on each of their other structures."""
    from tuner.data import load_benchmark, load_structures
    from tuner.engine.models import load_model
    from tuner.evaluation.evaluator import Evaluator
    from tuner.evaluation.visible import within_reach

    model = load_model(model_name)
    tuning = within_reach(load_benchmark(dataset_name), model)
    found = []
    for dataset in [tuning, *(within_reach(s, model) for s in load_structures(dataset_name, tuning))]:
        per_query = Evaluator(model, dataset).run(None).per_query
        e = trial_evidence(per_query, per_query)
        found.append(Direction(dataset.name, e.objective, e.objective_se, e.hm, e.tilt, e.tilt_se))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS), help="registry aliases or model folders")
    parser.add_argument("--dataset", default="wikipos-dev", help="the tuning passages (default: %(default)s)")
    parser.add_argument("--json", default=str(record.RESULTS / "baseline-direction.json"), help="where the record goes")
    args = parser.parse_args(argv)
    results = {
        "dataset": args.dataset,
        "direction_z": DIRECTION_Z,
        "models": {
            name: [asdict(d) | {"beyond_noise": d.beyond_noise} for d in directions(name, args.dataset)]
            for name in args.models
        },
    }
    command = "python -m benchmarks.baseline_direction " + " ".join(sys.argv[1:] if argv is None else argv)
    record.write(Path(args.json), "baseline_direction", command.strip(), results)
    for name, rows in results["models"].items():
        for row in rows:
            tilt = "n/a" if row["tilt"] is None else f"{row['tilt']:+.3f} ± {row['tilt_se']:.3f}"
            print(
                f"{name:>8} {row['structure']:<28} PSI {row['psi']:.3f} ± {row['psi_se']:.3f}  "
                f"tilt {tilt}  {row['beyond_noise']}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
