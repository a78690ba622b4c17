"""The batches a draft head runs on the engine's paged pool (``head.py``): a feed per request,
its positions' K/V at the slots of its page-table row, as the target's layers store theirs; and
the page-table entries of the chain's positions, lent to scratch slots while the chain runs."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch

from minisgl.core import Batch, Feed, Phase, Req
from minisgl.utils.transfer import to_device


def head_batch(feeds: list[Feed], phase: Phase, page_table: torch.Tensor,
               out_loc: torch.Tensor | None = None) -> Batch:
    """The head over positions ``cached_len .. device_len - 1`` of each feed's row (attending over
    the row's K/V before them): positions, and where the K/V go (``out_loc``, or else the row's
    own slots of those positions)."""
    positions = [p for f in feeds for p in range(f.cached_len, f.device_len)]
    rows = [f.table_idx for f in feeds for _ in range(f.extend_len)]
    pos, row = to_device([positions, rows], torch.int64, page_table.device)
    if out_loc is None:
        out_loc = page_table[row, pos]
    return Batch(feeds, phase, positions=pos, out_loc=out_loc)


@contextmanager
def lent_slots(page_table: torch.Tensor, reqs: list[Req], lens: list[int],
               slots: torch.Tensor) -> Iterator[torch.Tensor]:
    """Lend the page-table entries of each request's chain positions (``n - 1 .. n + k - 3``: n
    its known tokens, k its drafts) to scratch ``slots`` while the chain runs; yields them as
    ``[len(reqs), max(lens) - 1]`` (the step that drafts j + 2 writes column j). The entries are
    the request's next positions, not allocated yet or not written yet (the scheduler's flush or
    a decode graph writes them after the plan): they are given back as they were."""
    width = max(lens) - 1
    assert len(reqs) * width <= slots.numel(), "more chain positions than Engine.draft_slots"
    scratch = slots[: len(reqs) * width].view(len(reqs), width)
    rows, cols, lent = [], [], []
    for i, (req, k) in enumerate(zip(reqs, lens)):
        n = len(req.input_ids)
        for j in range(k - 1):
            rows.append(req.table_idx)
            cols.append(n - 1 + j)
            lent.append(i * width + j)
    if not rows:
        yield scratch
        return
    row, col, index = to_device([rows, cols, lent], torch.int64, page_table.device)
    saved = page_table[row, col]
    page_table[row, col] = slots[index]
    try:
        yield scratch
    finally:
        page_table[row, col] = saved
