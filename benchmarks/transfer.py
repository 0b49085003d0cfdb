"""Does a calibration chosen on WikiPos-dev hold up on passages built differently? (MiniLM)

Run from the repository root:

    .venv/bin/python -m benchmarks.transfer                      # the configs below (~1-2 h on 2 idle cores)
    .venv/bin/python -m benchmarks.transfer --configs L2-B128-1.0 L1-B256-0.5

Every config (CLS-Soft; `L<k>` = the last k layers, `B` = basket size, then λ) is scored side by side
on the tuning split (`wikipos-dev`), its crops (`wikipos-dev-crops`: the same passages re-cut shorter,
what the crops constraint sees) and the four held-out sets selection never sees: `wikipos-test` (dev's
construction, other passages) and the transfer sets `sentences` (fifths), `mixed` (slot thirds) and
`lengths` (96-510 tokens). Per set: PSI as a ratio to the uncalibrated PSI on the same set, and the
change of HM and of aggregate nDCG@10 in points (×100). Then the columns selection would use (dev PSI,
its bootstrap standard error, drift, crops ratio, nDCG change) and which config each rule picks from
this grid: `lowest` (lowest dev PSI, HM floor and nDCG constraints), `one-se` without the crops
constraint, and `one-se` with it (posfair's default).
"""

from __future__ import annotations

import argparse
import sys

SETS = ("wikipos-dev", "wikipos-dev-crops", "wikipos-test", "wikipos-sentences", "wikipos-mixed", "wikipos-lengths")
CONFIGS = (
    "L1-B256-0.5",
    "L1-B128-0.5",
    "L2-B128-0.5",
    "L3-B128-0.5",
    "L1-B256-0.75",
    "L2-B256-0.75",
    "L1-B128-0.75",
    "L2-B128-0.75",
    "L1-B256-1.0",
    "L1-B128-1.0",
    "L2-B128-1.0",
    "L2-B256-1.0",
    "L3-B256-1.0",
    "L6-B256-1.0",
)


def config_of(key: str, pooling: str):
    from tuner.calibration import CalibrationConfig

    depth, basket, strength = key.split("-")
    return CalibrationConfig(
        variant="cls_soft",
        strength=float(strength),
        layers=f"last:{depth[1:]}",
        basket_size=int(basket[1:]),
        pooling=pooling,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS))
    args = parser.parse_args(argv)

    from objectives import Candidate, Constraints, HmFloor, select
    from objectives.evidence import trial_evidence
    from tuner.data import load_benchmark
    from tuner.engine.models import load_model
    from tuner.evaluation.evaluator import Evaluator

    model = load_model("minilm")
    evaluators = {
        name: Evaluator(model, load_benchmark(name), prefix_layers=range(1, model.num_layers)) for name in SETS
    }
    baseline = {name: ev.run(None) for name, ev in evaluators.items()}
    dev = baseline["wikipos-dev"]
    floor = HmFloor.parse("significant")
    constraints = Constraints(floor.resolve(dev.report.hm), floor.conservative)
    rows, candidates = [], {"plain": [], "crops": []}
    print(
        f"{'config':14}"
        + "".join(f"{name.removeprefix('wikipos-'):>22}" for name in SETS)
        + "   dev PSI ± SE  drift  feasible",
        flush=True,
    )
    for number, key in enumerate(args.configs, start=1):
        config = config_of(key, model.spec.pooling)
        runs = {name: ev.run(config) for name, ev in evaluators.items()}
        cells = []
        for name in SETS:
            base, run = baseline[name].report, runs[name].report
            cells.append(
                f"{run.psi / base.psi:5.2f}x {100 * (run.hm - base.hm):+5.2f} {100 * (run.ndcg10 - base.ndcg10):+5.2f}"
            )
        evidence = trial_evidence(dev.per_query, runs["wikipos-dev"].per_query, seed=number)
        crops = (runs["wikipos-dev-crops"].report.psi, baseline["wikipos-dev-crops"].report.psi)
        values = constraints.values(evidence.hm, evidence.hm_low, evidence.ndcg_delta, crops_psi=crops)
        plain = tuple(v for k, v in values.items() if k != "crops_psi")
        drift = runs["wikipos-dev"].drift
        candidates["plain"].append(
            Candidate(number, runs["wikipos-dev"].report.psi, evidence.objective_se, drift, plain, evidence.hm)
        )
        candidates["crops"].append(
            Candidate(
                number,
                runs["wikipos-dev"].report.psi,
                evidence.objective_se,
                drift,
                tuple(values.values()),
                evidence.hm,
            )
        )
        feasible = ",".join(k for k, v in values.items() if v <= 0)
        print(
            f"{key:14}"
            + "".join(f"{c:>22}" for c in cells)
            + f"   {runs['wikipos-dev'].report.psi:.3f} ± {evidence.objective_se:.3f}  {drift:.4f}  {feasible}",
            flush=True,
        )
        rows.append(key)
    print(
        "\ncells: PSI ratio to uncalibrated, ΔHM, ΔnDCG@10 (points); uncalibrated PSI per set: "
        + ", ".join(f"{name.removeprefix('wikipos-')} {baseline[name].report.psi:.3f}" for name in SETS)
    )
    for label, rule, pool in (
        ("lowest PSI (HM floor, nDCG)", "lowest", "plain"),
        ("one-se (HM floor, nDCG)", "one-se", "plain"),
        ("one-se + crops (default)", "one-se", "crops"),
    ):
        chosen = select(candidates[pool], rule)  # type: ignore[arg-type]
        print(f"{label:30} → {rows[chosen.winner.trial_number - 1] if chosen else 'nothing feasible'}")


if __name__ == "__main__":
    sys.exit(main())
