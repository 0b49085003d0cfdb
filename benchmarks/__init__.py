"""Benchmarks (not shipped with the package): run them from the repository root with `python -m benchmarks.<name>`."""
