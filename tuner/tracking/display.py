"""What MLflow shows of a study: metric names on the console's scale, run names and descriptions, the experiment's
note and run-list view, parameters and tags cut to what MLflow stores."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping

from mlflow.entities import Metric, Param, RunTag

from objectives.constraint import CONSTRAINTS
from objectives.selection import RULES, describe_selection_rule

MAX_PARAM_LENGTH = 6000
MAX_TAG_LENGTH = 5000

KIND_TAG = "mlflow.experimentKind"  # MLflow 3 opens an experiment without it in the GenAI view
TRAINING_KIND = "custom_model_development"  # the model-training view (runs, charts, models)
NOTE = "mlflow.note.content"  # the description MLflow shows on a run or experiment page
# A run-list view stored on the experiment: MLflow 3.17's UI applies an experiment tag
# `mlflow.sharedViewState.KEY` (JSON of its view state) when the address carries `viewStateShareKey=KEY`
# (its "share view" feature). It is how a first visit sees the useful columns: the column choice otherwise
# lives in each browser's local storage.
VIEW_KEY = "posfair"
VIEW_TAG = f"mlflow.sharedViewState.{VIEW_KEY}"
RUN_LIST_COLUMNS = (
    "worst_structure_psi",
    "psi",
    "hm_x100",
    "feasible",
    "ndcg10_change_vs_uncalibrated_x100",
    "heldout_winner_change_hm_x100",
    "heldout_winner_change_psi",
)
RUN_LIST_VIEW = json.dumps({"selectedColumns": [f"metrics.`{name}`" for name in RUN_LIST_COLUMNS]})


def experiment_note() -> str:
    """The experiment's description: the rule every study applies, built from the constraint list
    (`objectives.constraint.CONSTRAINTS`) and the selection rules (`objectives.selection`), with each study's own
    limits and rule on its parent run."""
    rules = "\n".join(f"- {r.title} ({r.option}): {r.rule}" for r in CONSTRAINTS)
    selection = "\n".join(
        f"- {rule}{' (the default)' if rule == RULES[0] else ''}: {describe_selection_rule(rule)}" for rule in RULES
    )
    return f"""posfair tunes attention calibration (Michail et al., 2026) per model with Optuna.
One parent run per study (its rule and limits, the winner, held-out figures with 95% bootstrap intervals, plots,
the exported YAML), one nested run per trial (its config, figures and attention profile).

Objective: minimise **worst_structure_psi**, the worst PSI over the tuning structures (the tuning passages as
they are and rebuilt otherwise: crops, openings, packed passages, or length halves; the tuning passages alone
with --no-structures). PSI (Position Sensitivity Index) = 1 - min/max of nDCG@10 over the position groups
(0 = position-fair); HM = their harmonic mean. Subject to these constraints, each where its option is set:
{rules}

The winner (--selection) is not simply the lowest objective: the tuning split is small, and a lower value
within its noise is as likely luck as merit. It is
{selection}

`feasible` = 1 when a trial meets every constraint it was checked on; its description names each one and how
close it came. A pruned trial stopped after the rungs (structures) that showed it cannot win: its run says
`pruned`, its figures are all under `pruned/` (a worst case over fewer structures is a lower bound, not a result;
`pruned/structure/...` per structure scored), and it is never a candidate. nDCG@10, HM and
recall are x100 (points, as the console prints them); PSI and drift are 0-1; λ is the parameter `lambda_strength`.
Run names mark the baseline (trial 0, no calibration), the paper default (trial 1), infeasible and pruned trials, and
the winner first of all (`winner · trial-N`), which is registered as the model posfair-MODEL with the alias
`champion`."""


EXPERIMENT_NOTE = experiment_note()

# --- metric names: the code's 0-1 names → names that say what they are, on the console's scale ----------

_POINTS = 100.0
METRIC_NAMES: dict[str, tuple[str, float]] = {
    "psi": ("psi", 1.0),
    "psi_se": ("psi_std_error", 1.0),
    "hm": ("hm_x100", _POINTS),
    "hm_low": ("hm_lower_bound_x100", _POINTS),
    "hm_floor": ("hm_floor_x100", _POINTS),
    "ndcg10": ("ndcg10_x100", _POINTS),
    "recall10": ("recall10_x100", _POINTS),
    "n_queries": ("queries", 1.0),
    "ndcg10_delta": ("ndcg10_change_vs_uncalibrated_x100", _POINTS),
    "general_ndcg10_delta": ("general_ndcg10_change_vs_uncalibrated_x100", _POINTS),
    "ndcg10_delta_high": ("ndcg10_change_upper_bound_x100", _POINTS),
    # Optuna's constraints are <= 0 when met; as margins they read the other way round: >= 0 is met
    "constraint_hm_floor": ("hm_margin_over_floor_x100", -_POINTS),
    "constraint_ndcg_drop": ("ndcg10_drop_allowance_left_x100", -_POINTS),
    "constraint_general_drop": ("general_ndcg10_drop_allowance_left_x100", -_POINTS),
    "constraint_reversal": ("tilt_reversal_allowance_left_x100", -_POINTS),
    "constraint_structure_ndcg": ("structure_ndcg10_drop_allowance_left_x100", -_POINTS),
    "constraint_drift": ("drift_allowance_left_x_paper_default", -1.0),
    "robust_psi": ("worst_structure_psi", 1.0),
    "robust_psi_se": ("worst_structure_psi_std_error", 1.0),
    "reversal": ("tilt_reversal_x100", _POINTS),
    "drift": ("drift_from_uncalibrated_vectors", 1.0),
    "feasible": ("feasible", 1.0),
    "encode_seconds": ("encode_seconds", 1.0),
    "truncated_documents": ("truncated_documents", 1.0),
    "psi_fifths": ("psi_over_fifths", 1.0),
    "tilt": ("tilt_x100", _POINTS),
    "profile_first_bin_mass": ("last_layer_attention_on_first_tenth_pct", _POINTS),
    "profile_last_bin_mass": ("last_layer_attention_on_last_tenth_pct", _POINTS),
}


def metric_name(name: str) -> tuple[str, float]:
    """(display name, factor) of one 0-1 metric; per-group nDCG@10, query counts and token masses by pattern."""
    prefix, _, tail = name.rpartition("/")
    if prefix:
        shown, factor = metric_name(tail)
        return f"{prefix}/{shown}", factor
    if name in METRIC_NAMES:
        return METRIC_NAMES[name]
    if name.startswith("ndcg10_"):
        return f"{name}_x100", _POINTS
    if name.startswith("n_"):
        return f"queries_{name[2:]}", 1.0
    if name.startswith("profile_") and name.endswith("_token_mass"):
        return f"last_layer_attention_on_{name.removeprefix('profile_').removesuffix('_mass')}_pct", _POINTS
    return name, 1.0


SHOWN_DIGITS = 4
"""Significant digits of a metric as MLflow stores and shows it: beyond the console's (PSI 0.265, HM 57.17) and
below the noise of any figure posfair logs; whole numbers (passages, layer-tokens) keep every digit."""


def significant(value: float) -> float:
    """`value` to `SHOWN_DIGITS` significant digits, never fewer than its integer part: MLflow's run list and
    charts print a stored float whole (57.171079012…), so the store holds what is worth reading."""
    if value == 0 or not math.isfinite(value):
        return value
    return round(value, max(0, SHOWN_DIGITS - 1 - math.floor(math.log10(abs(value)))))


REFUSED_IN_NAMES = re.compile(r"[^\w\-. :/]")
"""What MLflow refuses in a metric's name (it takes letters, digits, `_ - . : /` and spaces): a dataset's name, which
reaches metric names (`structure/<name>/psi`), may hold more (`wikipos-dev+titles`, a path)."""


def stored_metrics(metrics: Mapping[str, float], timestamp: int) -> list[Metric]:
    """Display-named metrics as MLflow gets them: each to `significant` digits, all at one time, every character
    MLflow refuses in a name stored as `_` (one refused name would drop the whole batch)."""
    return [
        Metric(REFUSED_IN_NAMES.sub("_", name), significant(float(value)), timestamp, 0)
        for name, value in metrics.items()
    ]


def display_metrics(values: Mapping[str, float], prefix: str = "") -> dict[str, float]:
    """0-1 metrics as MLflow shows them: self-explanatory names, on the console's scale."""
    shown = {}
    for name, value in values.items():
        key, factor = metric_name(name)
        shown[prefix + key] = float(value) * factor
    return shown


def summary_metrics(
    prefix: str, report: Mapping[str, float | None], intervals: Mapping[str, tuple[float, float, float]] | None
) -> dict[str, float]:
    """A config's headline figures under `prefix/` and, with `intervals` (metric → estimate, low, high: the
    change against no calibration), `prefix/change_<metric>` with `_ci_low` / `_ci_high`."""
    headline = {k: v for k, v in report.items() if v is not None and "/" not in k and not k.startswith("n_")}
    shown = display_metrics(headline, f"{prefix}/")
    for metric, (estimate, low, high) in (intervals or {}).items():
        name, factor = metric_name(metric)
        shown |= {
            f"{prefix}/change_{name}": estimate * factor,
            f"{prefix}/change_{name}_ci_low": low * factor,
            f"{prefix}/change_{name}_ci_high": high * factor,
        }
    return shown


# --- descriptions ------------------------------------------------------------------------------------

VARIANTS = {"uniform": "Uniform", "cls_soft": "CLS-Soft", "cls_hard": "CLS-Hard"}


def describe_config(params: Mapping[str, object], num_layers: int | None = None) -> str:
    """A trial's config in words, e.g. 'CLS-Soft, λ 0.55 on layers [4, 5], baskets of 256 tokens (equal shares)'."""
    strength = float(params.get("strength", 0.0))  # type: ignore[arg-type]
    if strength == 0:
        return "no calibration (λ 0)"
    variant = VARIANTS.get(str(params.get("variant")), str(params.get("variant")))
    if params.get("variant") == "cls_hard" and "weight" in params:
        variant += f" (w {float(params['weight']):.2f})"  # type: ignore[arg-type]
    layers = params.get("layers")
    where = (
        f"layers {layers}" + (f" of {num_layers}" if num_layers else "")
        if layers is not None
        else f"depth {params.get('depth')}"
    )
    shares = f" ({params['basket_shares']} shares)" if params.get("basket_shares") else ""
    return f"{variant}, λ {strength:.2f} on {where}, baskets of {params.get('basket_size')} tokens{shares}"


def describe_outcome(metrics: Mapping[str, float], worst: str, feasibility: str) -> str:
    """What a complete trial scored and whether it is feasible, in the console's words and scale: its objective
    (the worst PSI over the tuning structures, and on which), the tuning passages' own PSI and HM, then
    `feasibility` (`Constraints.explain`: every constraint checked, how it was met or missed)."""
    return (
        f"worst-case PSI {metrics['robust_psi']:.3f} (on {worst}; lower is fairer), PSI {metrics['psi']:.3f} and "
        f"HM {100 * metrics['hm']:.2f} on the tuning passages; {feasibility}"
    )


RUN_STATUS = {"COMPLETE": "FINISHED", "PRUNED": "FINISHED", "FAIL": "FAILED"}
"""A trial's Optuna state → its MLflow run status. A pruned trial ran as far as it had to and ended as designed:
FINISHED, as Optuna's own MLflow callback and Ray Tune's log an early-stopped trial (MLflow's KILLED means "killed by
user", a red cross that users read as a crash); its name says `pruned` and the tag `posfair.state` PRUNED."""


def run_name(number: int, markers: list[str]) -> str:
    """'trial-6', or with its markers: 'trial-0 · baseline', 'trial-3 · infeasible'; the winner's starts with its role,
    'winner · trial-2 · paper default', so the run list, which cuts long names, shows it."""
    first = ["winner"] if "winner" in markers else []
    return " · ".join([*first, f"trial-{number}", *(m for m in markers if m != "winner")])


PARAM_NAMES = {"strength": "lambda_strength"}
"""Trial parameters MLflow shows under another name. Its compare view plots the first three parameters that differ
between the runs in alphabetical order (MLflow 3.17's parallel-coordinates panel): `lambda_strength` sorts among them
(after `basket_size` and `depth`), where `strength` sorted behind `layers`."""


def logged_params(values: dict[str, object]) -> list[Param]:
    return [Param(PARAM_NAMES.get(k, k), str(v)[:MAX_PARAM_LENGTH]) for k, v in values.items()]


def logged_tags(values: Mapping[str, str]) -> list[RunTag]:
    return [RunTag(k, v[:MAX_TAG_LENGTH]) for k, v in values.items()]
