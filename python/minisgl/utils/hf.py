"""Hugging Face helpers."""

from __future__ import annotations

import glob
import os

from .logger import init_logger

logger = init_logger(__name__)

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


_NO_LIMIT = 1 << 62


def has_tokenizer(model_dir: str) -> bool:
    """Whether ``load_tokenizer`` finds one (a repo id: assumed so)."""
    return not os.path.isdir(model_dir) or any(
        glob.glob(os.path.join(model_dir, name)) for name in _TOKENIZER_FILES)


def load_tokenizer(model_dir: str, revision: str | None = None, chat_template: str | None = None):
    """The fast tokenizer of a directory (None when it ships none: token-id-only use) or of a
    Hugging Face repo id at ``revision``; ``chat_template`` (Jinja text) replaces its template
    and must render a one-message chat (else ``ValueError`` naming chat_template)."""
    from transformers import AutoTokenizer

    if not has_tokenizer(model_dir):
        logger.warning("%s has no tokenizer: only token-id prompts will work", model_dir)
        return None
    tokenizer = AutoTokenizer.from_pretrained(model_dir, revision=revision)
    # NOTE: the scheduler enforces the context window (a 400 giving both lengths); the tokenizer's
    # own limit would only log "sequence length is longer than the specified maximum" for every
    # long prompt, and nothing here truncates to it
    tokenizer.model_max_length = _NO_LIMIT
    if chat_template is not None:
        tokenizer.chat_template = chat_template
        try:
            tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                          add_generation_prompt=True)
        except Exception as e:
            raise ValueError(f"chat_template: does not render a chat ({type(e).__name__}: "
                             f"{str(e).strip().splitlines()[0] if str(e).strip() else ''})") from e
    return tokenizer
