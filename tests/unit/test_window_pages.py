"""The sliding layers' own pages (``scheduler/window.py``) through the cache coordinator, no model:
pages are allocated with the full layers' and come back once every later query's window has
passed them; admission sees the smaller of the two pools; a release returns everything."""

from __future__ import annotations

import pytest
import torch

from minisgl.core import Req, SamplingParams
from minisgl.kvcache import NaivePrefixCache, RadixPrefixCache
from minisgl.kvcache.window_radix import WindowRadixCache
from minisgl.scheduler.cache import CacheCoordinator
from minisgl.scheduler.full_attention import FullAttentionManager
from minisgl.scheduler.window import SlidingWindowManager


def make(page: int, window: int, full_pages: int = 64, window_pages: int = 9):
    table = torch.zeros(3, 256, dtype=torch.int32)
    pages = SlidingWindowManager(window_pages, page, window, torch.zeros_like(table))
    full = FullAttentionManager(full_pages, page, table, NaivePrefixCache(page))
    return CacheCoordinator(full, [pages]), pages


def request(row: int) -> Req:
    return Req(uid=row, input_ids=list(range(200)), prompt_len=200,
               sampling_params=SamplingParams(), max_device_len=250, table_idx=row)


@pytest.mark.parametrize("page", [1, 4])
def test_pages_come_back_past_the_window(page):
    cache, pages = make(page, window=8, full_pages=200 // page + 2,
                        window_pages=(8 + 4) // page + 3)  # the engine's least
    req = request(0)
    for step in range(40):  # 4-token chunks, then it holds only its window
        new = req.device_len + 4
        cache.trim([req])
        assert 4 <= cache.available_tokens
        cache.allocate(req, new)
        req.cached_len, req.device_len = req.device_len, new
        cache.check_integrity([req])
        held = pages.num_tokens - pages.free_tokens
        # the window before the next query, this chunk, and the pages they straddle
        assert held <= 8 + 4 + 2 * page, (step, held)
    assert cache.num_tokens - cache.free_tokens == 160  # full layers keep theirs
    cache.release(req)
    assert pages.free_tokens == pages.num_tokens
    cache.check_integrity([])


def test_admission_counts_the_smaller_pool():
    cache, pages = make(1, window=8, window_pages=5)
    assert cache.available_tokens == 4  # the sliding pool (4 usable slots), not the full one
    with pytest.raises(RuntimeError, match="sliding-window"):
        cache.allocate(request(1), 5)


def test_no_prefix_sharing_with_a_window_pool():
    """Only a radix cache that keeps sliding pages (``WindowRadixCache``) shares prefixes with a
    window pool."""

    class Engine:  # what ``SlidingWindowManager.create`` reads of one
        window_pages, window_page_table = 8, torch.zeros(2, 16, dtype=torch.int32)
        cache_spec = type("Spec", (), {"max_window": 4})

    with pytest.raises(ValueError, match="naive"):
        SlidingWindowManager.create(Engine, RadixPrefixCache(1), 1)
    made = SlidingWindowManager.create(Engine, WindowRadixCache(1, "cpu", 4), 1)
    assert made is not None and made.tree is not None
