"""The radix cache with the sliding layers' own pages (``kvcache/window_radix.py``) through the
cache manager, no model: a finished request leaves its last window of sliding pages in the tree, a
hit resumes only where they cover the window (cut back otherwise), the resumed request never frees
the tree's pages, and under sliding-pool pressure the tree drops its pages, least recent first.
Every step checks that free + owned + cached == total on both pools."""

from __future__ import annotations

import pytest
import torch

from minisgl.core import Feed, Req, SamplingParams
from minisgl.kvcache import create_prefix_cache
from minisgl.kvcache.window_radix import WindowRadixCache
from minisgl.scheduler.cache import CacheCoordinator
from minisgl.scheduler.full_attention import FullAttentionManager
from minisgl.scheduler.window import SlidingWindowManager

WINDOW = 8


def make(page: int, full_pages: int = 128, window_pages: int = 40):
    table = torch.zeros(4, 256, dtype=torch.int32)
    tree = create_prefix_cache("radix", page, "cpu", window=WINDOW)
    assert isinstance(tree, WindowRadixCache)
    pages = SlidingWindowManager(window_pages, page, WINDOW, torch.zeros_like(table), tree)
    full = FullAttentionManager(full_pages, page, table, tree)
    return CacheCoordinator(full, [pages]), pages, tree


def request(row: int, ids: list[int]) -> Req:
    return Req(uid=row, input_ids=list(ids), prompt_len=len(ids),
               sampling_params=SamplingParams(), max_device_len=len(ids) + 50, table_idx=row)


def run(cache: CacheCoordinator, req: Req, upto: int, live: list[Req], chunk: int = 4) -> None:
    """Feed ``req`` to ``upto`` tokens in chunks, checking both pools after every step."""
    while req.device_len < upto:
        new = min(req.device_len + chunk, upto)
        cache.trim([req])
        cache.allocate(req, new)
        req.cached_len, req.device_len = req.device_len, new
        cache.check_integrity(live)


def test_resumable_len_needs_the_whole_window():
    tree = WindowRadixCache(2, "cpu", WINDOW)
    held = torch.tensor([-1] * 8 + list(range(10, 18)) + [-1] * 4, dtype=torch.int32)
    # pages [8, 16) held: n = 16 needs pages from page_floor(16 - 7) = 8: yes; n = 18: no
    assert tree.resumable_len(held) == 16
    assert tree.resumable_len(torch.full((20,), -1, dtype=torch.int32)) == 0
    assert tree.resumable_len(torch.arange(6, dtype=torch.int32)) == 6  # shorter than the window


@pytest.mark.parametrize("page", [1, 4, 16])
def test_a_conversation_resumes_where_its_last_turn_ended(page):
    cache, pages, tree = make(page)
    first = request(0, range(100, 137))
    cache.match(first)
    run(cache, first, 37, [first])
    cache.release(first)
    cache.check_integrity([])
    end = 37 // page * page
    assert tree.window_size > 0 and pages.free_tokens < pages.num_tokens  # kept in the tree
    second = request(1, list(range(100, 137)) + list(range(7, 30)))
    cache.match(second)
    assert second.cached_len == end
    shared = pages.shared[1]
    assert shared == end and pages.start[1] == max(0, (end - WINDOW + 1)) // page * page
    run(cache, second, 60, [second])  # trims past the window, never the tree's pages
    held = tree.window_size
    cache.release(second)
    cache.check_integrity([])
    assert tree.window_size >= held
    # a third turn resumes from the second's end
    third = request(2, second.input_ids + [1, 2, 3])
    cache.match(third)
    assert third.cached_len == 60 // page * page
    cache.release(third)
    cache.check_integrity([])


def test_a_shared_prefix_whose_window_was_freed_is_cut_back():
    cache, pages, tree = make(1)
    first = request(0, range(100, 140))
    cache.match(first)
    run(cache, first, 40, [first])
    cache.release(first)
    other = request(1, list(range(100, 130)) + [5, 6, 7])  # shares 30 tokens; window at 33..40
    assert cache.hit_len(other) == 0
    cache.match(other)
    assert other.cached_len == 0
    run(cache, other, 33, [other])
    cache.release(other)
    cache.check_integrity([])


def test_the_tree_gives_its_sliding_pages_back_under_pressure():
    cache, pages, tree = make(1, window_pages=20)  # 19 usable: one window and a chunk
    for row, base in enumerate((100, 300, 500)):
        req = request(row, range(base, base + 30))
        assert cache.available_tokens >= 4
        cache.match(req)
        run(cache, req, 30, [req])
        cache.release(req)
        cache.check_integrity([])
    # the last request's window is cached; the earlier ones' were dropped to make room
    last = request(3, list(range(500, 530)) + [1])
    cache.match(last)
    assert last.cached_len == 30
    cache.release(last)
    cache.flush_prefix_cache()
    cache.check_integrity([])
    assert pages.free_tokens == pages.num_tokens and tree.window_size == 0


@pytest.mark.parametrize("page", [1, 4])
def test_a_step_commits_all_its_verify_feeds_at_once(page):
    """``commit_many`` (one call for a step's verify feeds) leaves every row where ``commit``
    one at a time would: the same lengths, the same pages kept, the rest free."""
    (one, _, _), (many, _, _) = make(page), make(page)
    kept = [30, 37, 40]  # cut inside a page, at one's end, nothing rejected
    rows = {}
    for cache in (one, many):
        reqs = [request(row, range(100 * row, 100 * row + 40)) for row in range(3)]
        for req in reqs:
            cache.match(req)
            run(cache, req, 40, reqs)
        feeds = [(req, n, Feed(req, 29, 40, 11, list(range(10)))) for req, n in zip(reqs, kept)]
        if cache is one:
            for req, n, feed in feeds:
                one.commit(req, n, feed)
        else:
            many.commit_many(feeds)
        cache.check_integrity(reqs)
        assert [req.device_len for req in reqs] == kept
        rows[cache is one] = [cache.full.pages.host_table[req.table_idx, :cache.alloc_len(req)]
                              .tolist() for req in reqs]
        assert [cache.alloc_len(req) for req in reqs] == [-(-n // page) * page for n in kept]
    assert rows[True] == rows[False]
    assert one.free_tokens == many.free_tokens


@pytest.mark.parametrize("page", [1, 4])
def test_rejected_drafts_give_back_their_sliding_pages(page):
    """``commit`` (what a verify step kept of its drafts) frees the sliding pages past the kept
    length as it frees the full ones."""
    cache, pages, _ = make(page)
    req = request(0, range(100, 160))
    cache.match(req)
    run(cache, req, 40, [req])
    cache.commit(req, 30, Feed(req, 29, 40, 11, list(range(10))))
    assert req.device_len == req.cached_len == 30
    cache.check_integrity([req])
    run(cache, req, 44, [req])
    cache.release(req)
    cache.check_integrity([])
