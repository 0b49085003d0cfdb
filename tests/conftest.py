"""Shared fixtures: tiny randomly initialised models and tokenizers, built from configs (no hub)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
