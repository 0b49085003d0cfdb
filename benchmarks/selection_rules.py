"""How noisy a study's objective is between its top trials, and which selection rule's winners hold up held out.

Run from the repository root, over the studies `benchmarks.search_cost --keep KEEP` left (one folder per study);
several KEEP folders (one per tuning design, named by the folder) are compared in one run:

    .venv/bin/python -m benchmarks.selection_rules --model minilm --keep KEEP [KEEP2 ...] \\
        --json docs/results/selection-rules-minilm.json

Per study (read from its Optuna store, nothing re-tuned):

- **noise**: the feasible complete trials in order of objective (the worst PSI over the tuning structures), each
  with its gap to the best and the paired standard error of that gap over the common query resamples the study
  scored every trial on; whether the exported winner is the best objective or was picked by the rule's tie-break
  from the one-SE band.
- **rules**: the winner every rule in `objectives.selection.RULES` picks from the same trials.

Then every config any rule picked, the paper default and no calibration are scored side by side on the held-out
sets (`benchmarks.heldout_scoring`): PSI against the paper default's with the SE of their difference, ΔHM and
ΔnDCG@10 against no calibration with 95% intervals, end − begin, and whether the bias is reversed.

**verdicts**: per design and rule, what the tuner promises of its winners held out, judged set by set: every
seed's winner is fairer than the paper default by more than the SE of their PSI difference, with ΔHM and
ΔnDCG@10 no lower than the paper default's 95% intervals allow; the seeds' winners agree (the spread of their
PSI is at most one bootstrap SE); no winner reverses the bias. Against no calibration: how many seeds' winners
narrow the begin-to-end gap beyond noise, and how many lose nDCG@10 beyond noise.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

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
    from tuner.tuning.candidates import candidates
    from tuner.tuning.search_space import trial_config

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
        "winner_config": label(default.winner.trial_number),
        "band": list(default.eligible),
        "tie_break_decided": default.winner.trial_number != best.trial_number,
        "top": top,
        "choices": {
            rule: {"trial": s.winner.trial_number, "config": label(s.winner.trial_number)}
            for rule, s in choices.items()
            if s
        },
        "configs": {
            label(s.winner.trial_number): trial_config(
                study.trials[s.winner.trial_number], model.spec.pooling, model.spec.padding_side
            )
            for s in [default, *choices.values()]
            if s
        },
    }


def verdicts(studies: list[dict[str, Any]], scores: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """design → rule → held-out set → the promise's three tests over the design's seeds (see the module docstring)."""
    out: dict[str, dict[str, Any]] = {}
    for design in dict.fromkeys(s["design"] for s in studies):
        seeds = [s for s in studies if s["design"] == design and s.get("choices")]
        out[design] = {}
        for rule in dict.fromkeys(r for s in seeds for r in s["choices"]):
            winners = [s["choices"][rule]["config"] for s in seeds if rule in s["choices"]]
            out[design][rule] = {
                name: {**judge(winners, row), **narrowing(winners, row)} for name, row in scores.items()
            }
    return out


def exported(studies: list[dict[str, Any]], scores: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """design → held-out set → the winners the studies exported against no calibration (`narrowing`)."""
    out: dict[str, dict[str, Any]] = {}
    for design in dict.fromkeys(s["design"] for s in studies):
        winners = [s["winner_config"] for s in studies if s["design"] == design and "winner_config" in s]
        out[design] = {
            name: {"seeds": len(winners), **narrowing(winners, row), "paper_default": narrowing([PAPER], row)}
            for name, row in scores.items()
        }
    return out


def judge(winners: list[str], row: dict[str, Any]) -> dict[str, Any]:
    """The seeds' winners on one held-out set against the paper default's cell there."""
    paper = row[PAPER]
    cells = [row[w] for w in winners]
    beats = [
        c["psi_minus_reference"] < -c["psi_minus_reference_se"]
        and c["hm_delta"][0] >= paper["hm_delta"][1]
        and c["ndcg_delta"][0] >= paper["ndcg_delta"][1]
        for c in cells
    ]
    psis = [c["psi"] for c in cells]
    se = max(c["psi_se"] for c in cells)
    return {
        "seeds": len(cells),
        "beat_paper": sum(beats),
        "psi_spread": max(psis) - min(psis),
        "psi_se": se,
        "agree": max(psis) - min(psis) <= se,
        "reversed": sum(c["reversed"] for c in cells),
        "mean_psi_minus_paper": sum(c["psi_minus_reference"] for c in cells) / len(cells),
    }


def narrowing(winners: list[str], row: dict[str, Any]) -> dict[str, int]:
    """The seeds' winners on one held-out set against no calibration: how many move the begin-to-end gap towards
    zero beyond noise (the paired 95% interval of the change wholly on that side, and no reversal), and how many
    lose nDCG@10 beyond noise (the whole interval of ΔnDCG@10 below zero)."""
    towards = -np.sign(row[NONE]["end_minus_begin"][0])  # a beginning-favoured model's gap narrows upwards
    cells = [row[w] for w in winners]
    return {
        "narrowed": sum(
            bool(towards * c["gap_delta"][1] > 0 and towards * c["gap_delta"][2] > 0 and not c["reversed"])
            for c in cells
        ),
        "ndcg_lost": sum(c["ndcg_delta"][2] < 0 for c in cells),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm")
    parser.add_argument(
        "--keep",
        type=Path,
        nargs="+",
        required=True,
        help="folders of kept studies (one subfolder per study), one per design",
    )
    parser.add_argument("--heldout", nargs="+", default=list(HELDOUT))
    parser.add_argument("--json", type=Path, help="write the record here (docs/results/…)")
    args = parser.parse_args(argv)

    from tuner.engine.models import load_model

    model = load_model(args.model)
    studies = [
        {"design": keep.name, **study_rows(folder, model)}
        for keep in args.keep
        for folder in sorted(p for p in keep.iterdir() if (p / "optuna.db").is_file())
    ]
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
    results["verdicts"] = verdicts(studies, results["scores"])
    results["exported"] = exported(studies, results["scores"])
    if args.json:
        record.write(
            args.json,
            "selection_rules",
            "python -m benchmarks.selection_rules " + " ".join(argv or sys.argv[1:]),
            results,
        )
    else:
        print(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
