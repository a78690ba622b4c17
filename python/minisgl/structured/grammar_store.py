"""Compiled grammars kept in the kernel cache, so that a restart does not compile again what the
server compiled before: a deployment's tool schemas and response formats come back with it.

A schema never seen costs its compilation on its first request (the token masks of its states
over the whole vocabulary: tens of milliseconds for a tool's arguments); xgrammar's compiled
grammar serializes to JSON and reads back in a fraction of that. Entries live under
``DIR/compiled-grammars/<tables key>/`` (the tokenizer tables' key, ``tables.py``: the tokenizer's
files, the stop ids and xgrammar's version), one file per grammar named by a digest of its kind
and text; a file is written whole or not at all, on a thread of its own after the request got its
grammar; the least recently used beyond ``LIMIT`` go. A damaged entry is compiled anew.
"""

from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from minisgl.utils import init_logger

logger = init_logger(__name__)

# bumped when an entry's contents change meaning (e.g. how a JSON schema becomes a grammar)
_FORMAT = 1
LIMIT = 512  # entries per tokenizer: a few tens of kB to a few MB each


class GrammarStore:
    """The compiled grammars of one tokenizer (``key``, whose xgrammar tables are ``info``)
    under the cache directory ``root``."""

    def __init__(self, root: str, key: str, info: Any) -> None:
        self.dir = os.path.join(root, "compiled-grammars", key)
        self.info = info
        self._writer: ThreadPoolExecutor | None = None
        self._last: Future | None = None

    def path(self, kind: str, source: str) -> str:
        digest = hashlib.sha256(json.dumps([_FORMAT, kind, source]).encode()).hexdigest()
        return os.path.join(self.dir, f"{digest[:24]}.json")

    def load(self, kind: str, source: str) -> Any | None:
        """The grammar compiled earlier (None: none kept, or a damaged entry)."""
        from .tables import _xgr

        path = self.path(kind, source)
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError:
            return None
        try:
            compiled = _xgr().CompiledGrammar.deserialize_json(text, self.info)
        except Exception as e:  # noqa: BLE001 - damaged, or another xgrammar's format
            logger.warning("compiled grammar: ignoring %s (%s: %s)", path, type(e).__name__, e)
            return None
        try:
            os.utime(path)  # recently used: the last to go
        except OSError:
            pass
        return compiled

    def save_later(self, kind: str, source: str, compiled: Any) -> None:
        """Write ``compiled`` on the store's own thread (xgrammar's serialization releases the
        interpreter: nothing waits for it)."""
        if self._writer is None:
            self._writer = ThreadPoolExecutor(1, thread_name_prefix="grammar-store")
        self._last = self._writer.submit(self._save, self.path(kind, source), compiled)

    def flush(self) -> None:
        """Wait for the writes asked so far."""
        if self._last is not None:
            self._last.result()

    def _save(self, path: str, compiled: Any) -> None:
        try:
            os.makedirs(self.dir, exist_ok=True)
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(compiled.serialize_json())
            os.replace(tmp, path)
            self._evict()
        except OSError as e:  # a full or read-only disk: the grammar still serves this process
            logger.warning("compiled grammar: cannot keep %s (%s)", path, e)

    def _evict(self) -> None:
        entries = [e for e in os.scandir(self.dir) if e.name.endswith(".json")]
        if len(entries) <= LIMIT:
            return
        entries.sort(key=lambda e: e.stat().st_mtime)
        for entry in entries[: len(entries) - LIMIT]:
            try:
                os.remove(entry.path)
            except OSError:
                pass
