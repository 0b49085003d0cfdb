"""Position-aware retrieval metrics and the constrained tuning objective (no model code here)."""

from objectives.bootstrap import Interval, PairedBootstrap, PositionProfile, paired_bootstrap, position_profile
from objectives.constraint import CONSTRAINTS, Constraints, HmFloor, describe_rule
from objectives.metrics import (
    Aggregates,
    PerQuery,
    PositionReport,
    StratumReport,
    aggregate,
    evaluate,
    harmonic_mean,
    position_sensitivity,
    score_queries,
)
from objectives.retrieval import Run, exact_search
from objectives.selection import RULES, Candidate, Selection, select

__all__ = [
    "CONSTRAINTS",
    "Aggregates",
    "Candidate",
    "Constraints",
    "HmFloor",
    "Interval",
    "PairedBootstrap",
    "PerQuery",
    "PositionProfile",
    "PositionReport",
    "Run",
    "StratumReport",
    "aggregate",
    "describe_rule",
    "evaluate",
    "exact_search",
    "harmonic_mean",
    "paired_bootstrap",
    "position_profile",
    "position_sensitivity",
    "RULES",
    "Selection",
    "select",
    "score_queries",
]
