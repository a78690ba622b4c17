"""The waiting queue and prefill batches: admit requests under a token budget, chunking long
prompts.

A request stays in the queue until all its known tokens are fed; a prompt longer than the budget is
fed over several forwards (chunked prefill). Each batch is a prefix of the queue in the admission
policy's order (``policy.py``: the half-fed request keeps its place), so at most its last request is
left half-fed, and it is first in line next time.

A prompt that must be chunked yields half of the step to a shorter prompt waiting behind it
(``_yields``): a short request that arrives while a long prompt is being fed gets its first token
within a few steps instead of after every chunk of the long one, as shortest-remaining-first would
(``benchmark/results/cpu/short_behind_long.md``). Alone, or behind prompts at least as long, a
prompt takes the whole budget.

A model whose image tokens attend to each other both ways (Gemma) needs each image's tokens in
one forward: a chunk never ends inside an image (``whole_images``); the step's first chunk runs
to the image's end rather than stopping short of it, past the budget if it must.

A request that starts like one being prefilled right now (the same first tokens: ``n`` > 1, a
shared system prompt) and finds nothing cached waits until its twin's prefix enters the prefix
cache, instead of computing the same prefix a second time in the same batch.
"""

from __future__ import annotations

from collections import deque
from typing import Callable, Iterable

from minisgl.core import Feed, Req

from .cache import CacheCoordinator
from .policy import AdmissionPolicy
from .table import TableManager

_SHARED_HEAD = 32  # requests whose first this-many tokens agree are assumed to share a prefix


def whole_images(req: Req, chunk: int, first: bool) -> int:
    """``chunk`` (positions from ``req.device_len``) shortened to end before the image it would
    cut, or, for the step's ``first`` chunk, stretched to that image's end when nothing would be
    left."""
    start = req.device_len
    end = start + chunk
    for image in req.mm.images if req.mm is not None else ():
        if image.offset < end < image.end:
            if image.offset > start:
                return image.offset - start
            return image.end - start if first else 0
    return chunk


def _head(req: Req) -> tuple[int, ...] | None:
    return tuple(req.cache_ids(_SHARED_HEAD)) if len(req.input_ids) > _SHARED_HEAD else None


class PrefillManager:
    def __init__(self, cache: CacheCoordinator, table: TableManager, max_prefill_tokens: int,
                 policy: AdmissionPolicy | None = None, yield_to_shorter: bool = True,
                 keep_images_whole: bool = False,
                 may_sample: Callable[[Req], bool] = lambda req: True) -> None:
        self.cache, self.table, self.budget = cache, table, max_prefill_tokens
        self.keep_images_whole = keep_images_whole  # a chunk never cuts an image
        # False while what the request's first token needs still compiles (its grammar): its
        # prompt is fed up to its last token, which waits
        self.may_sample = may_sample
        self.yield_to_shorter = yield_to_shorter  # off: ``--disable-prefill-yield`` (ablation)
        self.policy = policy or AdmissionPolicy("fcfs", 0, cache.hit_len)
        self.waiting: deque[Req] = deque()
        self.fed_tokens = 0  # tokens of every prefill chunk scheduled so far (the live log's rate)

    def __len__(self) -> int:
        return len(self.waiting)

    def add(self, req: Req) -> None:
        self.waiting.append(req)
        self.policy.arrive(req)

    def add_front(self, reqs: Iterable[Req]) -> None:
        reqs = list(reqs)
        self.waiting.extendleft(reversed(reqs))
        for req in reqs:
            self.policy.arrive(req)

    def remove(self, req: Req) -> None:
        self.waiting.remove(req)
        self.policy.forget(req)

    def admitted(self) -> list[Req]:
        """Waiting requests that hold a page-table row (and KV pages)."""
        return [req for req in self.waiting if req.table_idx >= 0]

    def schedule(self, decode_reserve: int, budget: int | None = None) -> list[Feed]:
        """Take as many waiting tokens as the budget (``max_prefill_tokens`` unless a smaller one is
        given: what a mixed step has left) and memory allow.

        ``decode_reserve`` tokens stay free so that running requests can make progress (a heuristic
        that keeps retractions rare; correctness does not depend on it).
        """
        self.policy.tick()
        budget = self.budget if budget is None else min(budget, self.budget)
        if budget <= 0 or not self.waiting:
            return []
        feeds: list[Feed] = []
        computing: set[tuple[int, ...] | None] = set()  # heads whose prefill is under way
        order = self.policy.order(self.waiting)
        for i, req in enumerate(order):
            if budget <= 0:
                break
            head = _head(req)
            hold = 0 if self.may_sample(req) else 1  # its last token waits until it may sample
            if req.pending_len <= hold:
                computing.add(head)
                continue  # its last chunk is in flight (overlap): it moves to decode when read back
            newly_admitted = req.table_idx < 0
            if newly_admitted:
                if (head is not None and head in computing and self.cache.shares_prefixes
                        and self.cache.hit_len(req) < _SHARED_HEAD):
                    continue  # wait for the twin's prefix to be cached instead of recomputing it
                if self.table.num_free == 0:
                    break
                req.table_idx = self.table.allocate()
                self.cache.match(req)
            else:
                self.cache.before_chunk(req)
            pending = req.pending_len - hold  # after the match: a prefix hit is not fed
            if pending <= 0:  # the prefix cache holds all but its held last token
                computing.add(head)
                continue
            chunk = min(budget, pending)
            if 1 < chunk < pending and self._yields(req, order[i + 1:], chunk + decode_reserve):
                chunk //= 2
            if req.snapshot_at > req.device_len:  # stop at the branch point (hybrid models)
                chunk = min(chunk, req.snapshot_at - req.device_len)
            if self.keep_images_whole:
                chunk = whole_images(req, chunk, first=not feeds)
            self.cache.trim([req])
            needed = self.cache.tokens_needed(req, req.device_len + chunk)
            if chunk == 0 or needed + decode_reserve > self.cache.available_tokens:
                if newly_admitted:
                    self.release(req)
                break
            self.cache.allocate(req, req.device_len + chunk)
            req.cached_len = req.device_len  # earlier chunks: computed by launched forwards
            req.device_len += chunk
            budget -= chunk
            self.fed_tokens += chunk
            feeds.append(Feed.of(req))
            computing.add(head)
        return feeds

    def _yields(self, req: Req, behind: list[Req], reserved: int) -> bool:
        """Whether a shorter prompt that could be fed this step waits behind ``req``: a row for
        it, and room for its whole prompt beside ``reserved`` tokens. NOTE: never with a
        sliding-window pool (``--sliding-pool-ratio``): sized for the running requests' windows,
        it stalled in a loop of admissions and releases when the long prompt yielded
        (``test_sliding_pool_smaller_than_the_requests``)."""
        if self.cache.window is not None or not self.yield_to_shorter:
            return False
        room = self.cache.available_tokens - reserved
        return any(0 < r.pending_len < req.pending_len and r.pending_len <= room
                   and (r.table_idx >= 0 or self.table.num_free > 0) for r in behind)

    def release(self, req: Req) -> None:
        """Give back a request's row and KV; it keeps its tokens and may be admitted again."""
        self.cache.release(req)
        self.table.free(req.table_idx)
        req.table_idx, req.cached_len, req.device_len = -1, 0, 0
