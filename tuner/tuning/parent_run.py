"""The study's MLflow parent run as every process that runs trials opens it: the study's identity and HM floor as its
parameters, its description the trials, budget and rule."""

from __future__ import annotations

from objectives import Constraints
from objectives.constraint import describe_rule
from tuner.common.budget import StudyBudget
from tuner.tuning.hm_floor import FLOOR_ATTR
from tuner.tuning.session import Session


def start_parent_run(session: Session, constraints: Constraints, budget: StudyBudget | None) -> None:
    """Open the study's MLflow parent run, described by its trials, budget and rule."""
    settings, model, tuning, name = session.settings, session.model, session.tuning, session.name
    within = f" within a budget of {budget.spec}" if budget else ""
    rule = describe_rule(constraints, session.in_force(constraints), settings.pareto, bool(session.structures))
    session.tracker.start_study(
        name,
        params={
            **session.identity,
            FLOOR_ATTR: constraints.hm_floor,
            "trials": settings.trials,
            "storage": session.storage,
            **({"budget": budget.spec} if budget else {}),
        },
        tags={"posfair.model": model.spec.alias, "posfair.dataset": tuning.name},
        description=f"Study {name}: {'at most ' if budget else ''}{settings.trials} trials{within} tuning "
        f"{model.spec.alias} on {tuning.name}: {rule} (--hm-floor {settings.hm_floor}).",
    )
