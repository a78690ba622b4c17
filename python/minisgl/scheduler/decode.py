"""Running requests and decode batches: one new token each, retracting requests when KV runs out.

Memory is not reserved for a request's whole ``max_tokens`` up front; instead, when the pool cannot
hold one more token for every running request, the most recently admitted ones are retracted: their
KV is released (its prefix offered to the prefix cache) and they wait again with the tokens they
have, to be re-fed later. Greedy outputs are unchanged by this.
"""

from __future__ import annotations

from typing import Callable

from minisgl.core import Feed, Req

from .cache import CacheCoordinator


class DecodeManager:
    def __init__(self, cache: CacheCoordinator, retract: Callable[[Req], None]) -> None:
        self.cache, self.retract = cache, retract
        self.running: list[Req] = []

    def __len__(self) -> int:
        return len(self.running)

    def add(self, req: Req) -> None:
        self.running.append(req)

    def remove(self, req: Req) -> None:
        self.running.remove(req)

    def schedulable(self) -> list[Req]:
        """Running requests that still need a forward. Under overlap scheduling a request whose
        last token is being computed right now is still running, but needs no further step."""
        return [req for req in self.running if req.device_len + 1 < req.max_device_len]

    def tokens_needed(self) -> int:
        """KV tokens the next decode step allocates."""
        return self.cache.tokens_for_one_more(self.schedulable())

    def schedule(self) -> list[Feed]:
        """A one-token feed for every running request, retracting the newest ones to make room."""
        self.cache.trim(self.running)
        while self.running and self.tokens_needed() > self.cache.available_tokens:
            self.retract(self.running.pop())
        reqs = self.schedulable()
        self.cache.allocate_many(reqs, [req.device_len + 1 for req in reqs])
        feeds = []
        for req in reqs:
            req.cached_len = req.device_len  # computed by an earlier (launched) forward
            req.device_len += 1
            feeds.append(Feed(req, req.cached_len, req.device_len))
        return feeds
