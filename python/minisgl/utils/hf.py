"""Hugging Face helpers."""

from __future__ import annotations

import glob
import os

from .logger import init_logger

logger = init_logger(__name__)

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def load_tokenizer(model_dir: str):
    """The model's fast tokenizer, or None when the directory ships none (token-id-only use)."""
    from transformers import AutoTokenizer

    if not any(glob.glob(os.path.join(model_dir, name)) for name in _TOKENIZER_FILES):
        logger.warning("%s has no tokenizer: only token-id prompts will work", model_dir)
        return None
    return AutoTokenizer.from_pretrained(model_dir)
