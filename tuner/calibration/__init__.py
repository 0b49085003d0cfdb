"""Attention calibration (paper §3): config, row math, and the transformers attention function."""

from .attention import ATTENTION_NAME, AttentionObserver, calibrating, register
from .config import CalibrationConfig, ConfigError, ResolvedCalibration

register()

__all__ = [
    "ATTENTION_NAME",
    "AttentionObserver",
    "CalibrationConfig",
    "ConfigError",
    "ResolvedCalibration",
    "calibrating",
    "register",
]
