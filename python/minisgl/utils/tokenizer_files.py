"""What a tokenizer is made of, and a digest of those files: the key of what the kernel cache keeps
per tokenizer (its class, ``tokenizer_class.py``; the grammar compiler's tables,
``minisgl.structured.tables``)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from typing import Any

# the files transformers reads for a tokenizer: a change to any of them is another tokenizer
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "added_tokens.json", "vocab.json", "merges.txt", "tokenizer.model")


def digest_files(digest: Any, folder: str, names: Iterable[str]) -> bool:
    """Feed ``digest`` (a hashlib object) each of ``names`` that ``folder`` holds, in order: its
    name, then its bytes' SHA-256. Whether any was there."""
    found = False
    for name in names:
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            found = True
            digest.update(name.encode() + b"\0")
            with open(path, "rb") as f:
                digest.update(hashlib.sha256(f.read()).digest())
    return found
