"""Benchmarks for position-fair retrieval: one loader per format, all returning a `PositionalDataset`."""

from tuner.data.dataset import DatasetUnavailableError, PositionalDataset
from tuner.data.registry import known_benchmarks, load_benchmark

__all__ = ["DatasetUnavailableError", "PositionalDataset", "known_benchmarks", "load_benchmark"]
