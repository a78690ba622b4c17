"""Stored responses of the Responses API (``store: true``), for ``previous_response_id``, ``GET``,
``cancel`` and ``DELETE``.

The store lives in the API server's memory: it is lost when the server stops and is not shared
between servers. It holds at most ``MAX_ENTRIES`` responses, each for at most ``TTL_S`` seconds
after it was last written or read; beyond that the least recently used go first. A response that
is still generating is stored as ``in_progress`` with its run, so that ``cancel`` can stop it.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

MAX_ENTRIES = 1024  # an agent's history is a few hundred kB: the store stays under ~1 GB
TTL_S = 3600.0  # an agent session's turns come minutes apart, not hours


@dataclass
class Stored:
    """One response: its object as the API returns it, and the chat messages of the whole
    conversation up to and including its output (what a continuation starts from)."""

    response: dict
    messages: list[dict] = field(default_factory=list)
    run: Any = None  # the ChatRun while it generates
    at: float = field(default_factory=time.monotonic)


class ResponseStore:
    def __init__(self, max_entries: int = MAX_ENTRIES, ttl_s: float = TTL_S) -> None:
        self.max_entries, self.ttl_s = max_entries, ttl_s
        self._entries: OrderedDict[str, Stored] = OrderedDict()

    def put(self, rid: str, entry: Stored) -> None:
        entry.at = time.monotonic()
        self._entries[rid] = entry
        self._entries.move_to_end(rid)
        self._expire()

    def get(self, rid: str) -> Stored | None:
        self._expire()
        entry = self._entries.get(rid)
        if entry is not None:
            entry.at = time.monotonic()
            self._entries.move_to_end(rid)
        return entry

    def delete(self, rid: str) -> bool:
        return self._entries.pop(rid, None) is not None

    def __len__(self) -> int:
        return len(self._entries)

    def _expire(self) -> None:
        deadline = time.monotonic() - self.ttl_s
        while self._entries:
            oldest = next(iter(self._entries.values()))
            if len(self._entries) <= self.max_entries and oldest.at >= deadline:
                return
            self._entries.popitem(last=False)
