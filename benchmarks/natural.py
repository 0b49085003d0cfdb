"""Do configs tuned on WikiPos's built passages carry over to real questions over whole articles, and back?

Run from the repository root (the natural SQuAD sets are fetched on first use):

    .venv/bin/python -m benchmarks.natural --model minilm --json docs/results/natural-minilm.json
    .venv/bin/python -m benchmarks.natural --model mpnet --json docs/results/natural-mpnet.json

1. **WikiPos-tuned configs on natural questions**: no calibration, the paper default, and the default studies'
   winners (seeds 0-2, read from `docs/results/search-cost-MODEL.json`, which ran them) scored side by side on
   the natural SQuAD held-out split and on a probe built from SQuAD's paragraphs (each question's own paragraph
   packed at the beginning, middle or end among other paragraphs), with 95% paired-bootstrap intervals and
   end − begin (`benchmarks.heldout_scoring`).
2. **The reverse**: a default study (`tune`, seed 0) tuned on the natural SQuAD tuning split, its winner scored
   on WikiPos-test and the three transfer sets beside the paper default (read from the study's own held-out
   summary, as `benchmarks.search_cost` reads it).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks import record
from benchmarks.heldout_scoring import score

NATURAL_TEST = "squad-test"
NATURAL_TUNE = "squad-tune"
WIKIPOS_HELDOUT = "wikipos-test,wikipos-sentences,wikipos-mixed,wikipos-lengths"
PAPER = "paper default"
NONE = "no calibration"


def recorded_winners(model: str, seeds: list[int]) -> dict[str, dict[str, Any]]:
    """seed → the default study's winner config, as `benchmarks.search_cost` recorded it."""
    data = record.read(record.RESULTS / f"search-cost-{model}.json")
    studies = {s["seed"]: s for s in data["results"]["studies"] if s["arm"] == "robust-third"}
    return {f"winner, seed {seed}": studies[seed]["config"] for seed in seeds if seed in studies}


def reverse_study(args: argparse.Namespace, keep: Path) -> dict[str, Any]:
    """A default study tuned on the natural tuning split, its winner held out on WikiPos (search_cost's arm)."""
    from benchmarks import search_cost
    from tuner.tuning.library_logs import quiet_libraries

    quiet_libraries()  # the log as `tune` keeps it: a trial the budget cannot pay for is no traceback
    search_args = search_cost.parse([
        "--model", args.model, "--dataset", args.natural_tune, "--heldout", WIKIPOS_HELDOUT,
        "--arms", "robust-third", "--seeds", "0", "--keep", str(keep),
    ])  # fmt: skip
    return search_cost.run_arm("robust-third", 0, search_args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--natural-test", default=NATURAL_TEST)
    parser.add_argument("--natural-tune", default=NATURAL_TUNE)
    parser.add_argument("--probe", help="the probe built from SQuAD's paragraphs, as a --dataset value")
    parser.add_argument("--keep", type=Path, help="keep the reverse study's stores here")
    parser.add_argument("--skip-study", action="store_true", help="only part 1 (the configs on natural questions)")
    parser.add_argument("--study-only", action="store_true", help="only part 2, added to the part 1 that --json holds")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    from tuner.calibration import CalibrationConfig
    from tuner.engine.models import load_model

    if args.study_only:
        earlier = record.read(args.json)
        with tempfile.TemporaryDirectory() as scratch:
            reverse = reverse_study(args, args.keep or Path(scratch))
        command = f"{earlier['command']}; python -m benchmarks.natural " + " ".join(argv or sys.argv[1:])
        record.write(args.json, "natural", command, {**earlier["results"], "reverse": reverse})
        return 0
    model = load_model(args.model)
    winners = recorded_winners(args.model, args.seeds)
    configs: dict[str, Any] = {NONE: None, PAPER: model.default_config()}
    for label, knobs in winners.items():
        configs[label] = None if not knobs["strength"] else CalibrationConfig(**knobs, pooling=model.spec.pooling)
    table = score(model, [args.natural_test, args.probe], configs, PAPER)
    results: dict[str, Any] = {
        "model": args.model,
        "sets": [args.natural_test, args.probe],
        "winners": winners,
        "scores": {name: {label: cell.as_dict() for label, cell in row.items()} for name, row in table.items()},
    }
    if not args.skip_study:
        with tempfile.TemporaryDirectory() as scratch:
            results["reverse"] = reverse_study(args, args.keep or Path(scratch))
    if args.json:
        record.write(args.json, "natural", "python -m benchmarks.natural " + " ".join(argv or sys.argv[1:]), results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
