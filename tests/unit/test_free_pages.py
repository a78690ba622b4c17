"""The free-page list (``scheduler/free_pages.py``): freed chunks are reused newest first, a take
spans chunks and the fresh pages, and nothing is lost or handed out twice."""

from __future__ import annotations

import pytest
import torch

from minisgl.scheduler.free_pages import FreePages


def test_takes_newest_freed_first_then_fresh_pages():
    free = FreePages(torch.arange(1, 11, dtype=torch.int32))
    first = free.take(4)
    assert first.tolist() == [1, 2, 3, 4] and len(free) == 6
    free.put(torch.tensor([2, 3]))
    free.put(torch.tensor([1], dtype=torch.int64))  # any integer dtype; stored as int32
    assert len(free) == 9
    assert free.take(1).tolist() == [1]
    taken = free.take(4)  # the rest of the freed chunk, then fresh pages
    assert taken.tolist() == [2, 3, 5, 6] and taken.dtype == torch.int32
    assert sorted(free.all().tolist()) == [7, 8, 9, 10] and len(free) == 4
    assert free.take(0).tolist() == []


def test_a_take_past_a_chunk_splits_it_and_an_overdraw_raises():
    free = FreePages(torch.arange(1, 4, dtype=torch.int32))
    free.take(3)
    free.put(torch.tensor([1, 2, 3], dtype=torch.int32))
    assert free.take(2).tolist() == [2, 3] and free.all().tolist() == [1]
    with pytest.raises(RuntimeError, match="need 2, have 1"):
        free.take(2)
    assert len(free) == 1
