"""Position-aware retrieval metrics and the constrained tuning objective (no model code here)."""

from objectives.bootstrap import Interval, PairedBootstrap, paired_bootstrap
from objectives.constraint import Constraints, HmFloor
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
    "Aggregates",
    "Candidate",
    "Constraints",
    "HmFloor",
    "Interval",
    "PairedBootstrap",
    "PerQuery",
    "PositionReport",
    "Run",
    "StratumReport",
    "aggregate",
    "evaluate",
    "exact_search",
    "harmonic_mean",
    "paired_bootstrap",
    "position_sensitivity",
    "RULES",
    "Selection",
    "select",
    "score_queries",
]
