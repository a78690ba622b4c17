"""The class transformers' ``AutoTokenizer`` picks for a tokenizer, kept so that a restart imports
that class alone.

``AutoTokenizer`` decides a tokenizer's class from its files (``tokenizer_config.json``'s
``tokenizer_class``, ``config.json``'s model type, the directory's name, whether
``tokenizer.json`` is byte-level) and imports transformers' auto machinery to do so: every
configuration class, the auto factory and the generation utilities, and through them torch (and
scikit-learn where it is installed). A process that only tokenizes (the server's tokenizer
workers, the launcher's token texts) spends most of its start there; the tokenizer's own module
and files load in about a second. Every branch of ``AutoTokenizer.from_pretrained`` ends in the
chosen class's ``from_pretrained`` on the same directory (remote code aside), so once that class
is known the same call gives the same tokenizer.

The choice is kept in the kernel cache (``minisgl.warmup.cache``), one small JSON per tokenizer::

    DIR/tokenizers/<key>.json     {"module": ..., "name": ...}

keyed by the directory's real path, the tokenizer's and model's files and transformers' version:
a change to any of them is a new key (decided by ``AutoTokenizer`` again). Tokenizers with remote
code (an ``auto_map``) and classes outside transformers are never kept. A damaged entry, or a
class that no longer imports, falls back to ``AutoTokenizer``.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
from typing import Any

from .logger import init_logger
from .tokenizer_files import TOKENIZER_FILES, digest_files

logger = init_logger(__name__)

# what AutoTokenizer reads to choose (config.json: the model type, a tokenizer_class), and the
# files the tokenizer is made of
_FILES = ("config.json", *TOKENIZER_FILES)
# bumped when an entry's contents change meaning
_FORMAT = 1


class TokenizerClassEntry:
    """The kept choice of ``model_dir``'s tokenizer class under the cache directory ``root``."""

    def __init__(self, model_dir: str, root: str) -> None:
        self.model_dir = model_dir
        self.path = os.path.join(root, "tokenizers", f"{_key(model_dir)}.json")

    def load_class(self) -> type | None:
        """The class kept for this tokenizer, imported (None: none kept, or it failed)."""
        if not os.path.isfile(self.path):
            return None
        try:
            with open(self.path, encoding="utf-8") as f:
                entry = json.load(f)
            cls = getattr(importlib.import_module(entry["module"]), entry["name"])
        except Exception as e:  # noqa: BLE001 - damaged, or transformers moved the class
            logger.warning("tokenizer class: ignoring %s (%s: %s)", self.path, type(e).__name__, e)
            return None
        return cls if isinstance(cls, type) else None

    def save(self, tokenizer: Any) -> None:
        """Keep ``tokenizer``'s class (what ``AutoTokenizer`` chose), unless it comes from
        remote code; a cache directory that cannot be written is left as it is."""
        cls = type(tokenizer)
        if not cls.__module__.startswith("transformers.") or _has_remote_code(self.model_dir):
            return
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            tmp = f"{self.path}.{os.getpid()}.tmp"  # written whole or not at all (a rename)
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump({"module": cls.__module__, "name": cls.__qualname__}, f)
            os.replace(tmp, self.path)
        except OSError as e:  # a read-only image, say: the next start decides again
            logger.debug("tokenizer class: not kept in %s (%s)", self.path, e)


def _key(model_dir: str) -> str:
    from importlib.metadata import version

    digest = hashlib.sha256(json.dumps(
        [_FORMAT, version("transformers"), os.path.realpath(model_dir)]).encode())
    digest_files(digest, model_dir, _FILES)
    return digest.hexdigest()[:24]


def _has_remote_code(model_dir: str) -> bool:
    path = os.path.join(model_dir, "tokenizer_config.json")
    if not os.path.isfile(path):
        return False
    with open(path, encoding="utf-8") as f:
        return "auto_map" in json.load(f)
