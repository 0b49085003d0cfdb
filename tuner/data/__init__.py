"""Benchmarks for position-fair retrieval: one loader per format, all returning a `PositionalDataset`."""

from tuner.data.dataset import DatasetUnavailableError, PositionalDataset, require_position_groups
from tuner.data.registry import (
    check_available,
    check_name,
    dataset_files,
    is_crops,
    known_benchmarks,
    load_benchmark,
    load_crops,
    load_structures,
)

__all__ = [
    "DatasetUnavailableError",
    "PositionalDataset",
    "check_available",
    "check_name",
    "dataset_files",
    "is_crops",
    "known_benchmarks",
    "load_benchmark",
    "load_crops",
    "load_structures",
    "require_position_groups",
]
