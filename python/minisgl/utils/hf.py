"""Hugging Face helpers."""

from __future__ import annotations

import glob
import json
import os
import threading

from .logger import init_logger

logger = init_logger(__name__)

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


_NO_LIMIT = 1 << 62
# transformers' lazy package is not safe to import from two threads at once (one of them gets
# "cannot import name 'AutoTokenizer'"): a scheduler loads a tokenizer for its EOS ids while its
# grammar tables build beside the engine's start-up, and xgrammar imports transformers too.
# Those imports hold this lock.
TRANSFORMERS_IMPORT_LOCK = threading.Lock()


def has_tokenizer(model_dir: str) -> bool:
    """Whether ``load_tokenizer`` finds one (a repo id: assumed so)."""
    return not os.path.isdir(model_dir) or any(
        glob.glob(os.path.join(model_dir, name)) for name in _TOKENIZER_FILES)


def load_tokenizer(model_dir: str, revision: str | None = None, chat_template: str | None = None,
                   cache_dir: str | None = None):
    """The fast tokenizer of a directory (None when it ships none: token-id-only use) or of a
    Hugging Face repo id at ``revision``; ``chat_template`` (Jinja text) replaces its template
    and must render a one-message chat (else ``ValueError`` naming chat_template).
    ``cache_dir``: the kernel cache, where the class ``AutoTokenizer`` chose for a directory is
    kept, so that a later load imports that class alone (``tokenizer_class.py``)."""
    if not has_tokenizer(model_dir):
        logger.warning("%s has no tokenizer: only token-id prompts will work", model_dir)
        return None
    entry = None
    if cache_dir and os.path.isdir(model_dir):
        from .tokenizer_class import TokenizerClassEntry

        entry = TokenizerClassEntry(model_dir, cache_dir)
    with TRANSFORMERS_IMPORT_LOCK:
        cls = entry.load_class() if entry is not None else None  # AutoTokenizer's last step
        chooses = cls is None
        if cls is None:
            from transformers import AutoTokenizer

            cls = AutoTokenizer
    tokenizer = cls.from_pretrained(model_dir, revision=revision)
    if chooses and entry is not None:
        entry.save(tokenizer)
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


def tokenizer_eos_ids(model_dir: str) -> tuple[int, ...] | None:
    """The tokenizer's EOS id read from its files, without transformers: the token that
    ``tokenizer_config.json`` (or ``special_tokens_map.json``) names, mapped by ``tokenizer.json``;
    ``()`` when they name none. None when the files do not settle it (no ``tokenizer.json``, the
    two files disagree, a token it does not map): then only loading the tokenizer tells."""
    path = os.path.join(model_dir, "tokenizer.json")
    if not os.path.isfile(path):
        return None
    named = []
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        file = os.path.join(model_dir, name)
        if os.path.isfile(file):
            with open(file, encoding="utf-8") as f:
                eos = json.load(f).get("eos_token", ...)
            if eos is not ...:
                named.append(eos.get("content") if isinstance(eos, dict) else eos)
    if len(set(named)) != 1:
        return None
    if named[0] is None:
        return ()
    from tokenizers import Tokenizer

    token_id = Tokenizer.from_file(path).token_to_id(named[0])
    return None if token_id is None else (token_id,)
