"""posfair: tune attention calibration per model for position-fair dense retrieval."""

__version__ = "0.1.0"
