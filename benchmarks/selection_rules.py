"""How noisy a study's objective is between its top trials, and which selection rule's winners hold up held out.

Run from the repository root, over the studies `benchmarks.search_cost --keep KEEP` left (one folder per study):

    .venv/bin/python -m benchmarks.selection_rules --model minilm --keep KEEP --json docs/results/selection-rules-minilm.json

Per study (read from its Optuna store, nothing re-tuned):

- **noise**: the feasible complete trials in order of objective (the worst PSI over the tuning structures), each
  with its gap to the best and the paired standard error of that gap over the common query resamples the study
  scored every trial on; whether the exported winner is the best objective or was picked by the rule's tie-break
  from the one-SE band.
- **rules**: the winner every rule in `objectives.selection.RULES` picks from the same trials.

Then every config any rule picked, the paper default and no calibration are scored side by side on the held-out
sets (`benchmarks.heldout_scoring`): PSI against the paper default's with the SE of their difference, ΔHM and
ΔnDCG@10 against no calibration with 95% intervals, end − begin, and whether the bias is reversed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from benchmarks import record
from benchmarks.heldout_scoring import score

HELDOUT = ("wikipos-test", "wikipos-sentences", "wikipos-mixed", "wikipos-lengths")
TOP = 5
PAPER = "paper default"
NONE = "no calibration"


def config_key(config: Any) -> str:
    """A config's label in the record: variant, λ, layers, basket."""
    return f"{config.variant} λ{config.strength:g} L{list(config.layers)} B{config.basket_size}"


def study_rows(folder: Path, model: Any) -> dict[str, Any]:
    """The noise and the rules' choices of the study kept in `folder`."""
    import optuna

    from objectives.selection import RULES, paired_se, select
    from tuner.tuning.search_space import trial_config
    from tuner.tuning.study import candidates

    storage = f"sqlite:///{folder / 'optuna.db'}"
    summary = max(optuna.get_all_study_summaries(storage), key=lambda s: s.n_trials)  # the study, not an export's
    study = optuna.load_study(study_name=summary.study_name, storage=storage)
    found = candidates(study)
    feasible = sorted((c for c in found if c.feasible), key=lambda c: (c.objective, c.trial_number))
    default = select(found, study.user_attrs.get("selection", "one-se"))
    if default is None:
        return {"study": folder.name, "feasible": 0}
    best = default.best

    def label(number: int) -> str:
        return config_key(trial_config(study.trials[number], model.spec.pooling, model.spec.padding_side))

    top = [
        {
            "trial": c.trial_number,
            "config": label(c.trial_number),
            "objective": c.objective,
            "gap": c.objective - best.objective,
            "paired_se": paired_se(c, best),
            "in_band": c.trial_number in default.eligible,
            "drift": c.drift,
            "hm": c.hm,
            "mean_psi": c.mean_psi,
        }
        for c in feasible[:TOP]
    ]
    choices = {rule: select(found, rule) for rule in RULES}  # type: ignore[arg-type]
    return {
        "study": folder.name,
        "feasible": len(feasible),
        "best": best.trial_number,
        "winner": default.winner.trial_number,
        "band": list(default.eligible),
        "tie_break_decided": default.winner.trial_number != best.trial_number,
        "top": top,
        "choices": {rule: {"trial": s.winner.trial_number, "config": label(s.winner.trial_number)} for rule, s in choices.items() if s},
        "configs": {
            label(s.winner.trial_number): trial_config(study.trials[s.winner.trial_number], model.spec.pooling, model.spec.padding_side)
            for s in choices.values()
            if s
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--keep", type=Path, required=True, help="the folder of kept studies (one subfolder per study)")
    parser.add_argument("--heldout", nargs="+", default=list(HELDOUT))
    parser.add_argument("--json", type=Path, help="write the record here (docs/results/…)")
    args = parser.parse_args(argv)

    from tuner.engine.models import load_model

    model = load_model(args.model)
    studies = [study_rows(folder, model) for folder in sorted(p for p in args.keep.iterdir() if (p / "optuna.db").is_file())]
    configs: dict[str, Any] = {NONE: None, PAPER: model.default_config()}
    for study in studies:
        configs.update(study.pop("configs", {}))
    for study in studies:
        print(json.dumps({k: v for k, v in study.items() if k != "top"}), flush=True)
    table = score(model, args.heldout, configs, PAPER)
    results = {
        "model": args.model,
        "heldout": args.heldout,
        "studies": studies,
        "scores": {name: {label: cell.as_dict() for label, cell in row.items()} for name, row in table.items()},
    }
    if args.json:
        record.write(args.json, "selection_rules", "python -m benchmarks.selection_rules " + " ".join(argv or sys.argv[1:]), results)
    else:
        print(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
