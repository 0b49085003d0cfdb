"""Position-aware retrieval metrics and the constrained tuning objective (no model code here)."""

from objectives.bootstrap import Interval, PairedBootstrap, paired_bootstrap
from objectives.constraint import Candidate, HmFloor, constraint_value, constraint_values, pick_winner
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

__all__ = [
    "Aggregates",
    "Candidate",
    "HmFloor",
    "Interval",
    "PairedBootstrap",
    "PerQuery",
    "PositionReport",
    "Run",
    "StratumReport",
    "aggregate",
    "constraint_value",
    "constraint_values",
    "evaluate",
    "exact_search",
    "harmonic_mean",
    "paired_bootstrap",
    "pick_winner",
    "position_sensitivity",
    "score_queries",
]
