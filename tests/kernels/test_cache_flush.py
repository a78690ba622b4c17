"""The page-table flush with a device table apart from the host's (``scheduler/cache.py``, as on
a GPU; here the "device" table is a second CPU tensor and the scatter kernel runs in Triton's
interpreter): after each step the device table holds every allocated slot, except the new
tokens' slots of a step that replays a decode graph (the graph writes those itself, and flush
hands them back)."""

from __future__ import annotations

import pytest
import torch

from helpers.interpreter import import_triton

import_triton()

from minisgl.core import Req, SamplingParams  # noqa: E402
from minisgl.kvcache import create_prefix_cache  # noqa: E402
from minisgl.scheduler.cache import CacheCoordinator  # noqa: E402
from minisgl.scheduler.full_attention import FullAttentionManager  # noqa: E402

pytestmark = pytest.mark.any_device
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _manager(page_size: int) -> CacheCoordinator:
    table = torch.zeros(4, 512, dtype=torch.int32, device=DEV)
    full = FullAttentionManager(200, page_size, table,
                                create_prefix_cache("radix", page_size, DEV))
    if not table.is_cuda:  # the host keeps its own table, as it does beside a GPU
        full.pages.host_table = torch.zeros_like(table)
    return CacheCoordinator(full)


def _req(row: int, n: int) -> Req:
    return Req(uid=row, input_ids=list(range(n)), prompt_len=n, sampling_params=SamplingParams(),
               max_device_len=500, table_idx=row)


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("many", [False, True], ids=["few", "many"])  # set lookups / tensor ops
def test_flush_leaves_out_the_graphs_own_slots(page_size, many):
    cache = _manager(page_size)
    reqs = [_req(0, 30 if many else 5), _req(1, 40 if many else 3)]
    cache.allocate_many(reqs, [r.prompt_len for r in reqs])
    assert cache.flush() is None
    for r in reqs:
        r.device_len = r.prompt_len
    assert torch.equal(cache.full.pages.page_table.cpu(), cache.full.pages.host_table)
    # a decode step (one new token each) plus drafts for the first request, replaying a graph
    cache.allocate_many(reqs, [r.device_len + 1 for r in reqs])
    for r in reqs:
        r.device_len += 1
    drafts = 80 if many else 3  # past _FEW dirty entries: the vectorised path
    cache.allocate(reqs[0], reqs[0].device_len + drafts)
    reqs[0].device_len += drafts
    slots = cache.flush(new_tokens_of=reqs)
    host = cache.full.pages.host_table
    assert slots == [int(host[r.table_idx, r.device_len - 1]) for r in reqs]
    device = cache.full.pages.page_table.cpu()
    for r in reqs:
        last = r.device_len - 1
        assert torch.equal(device[r.table_idx, :last], host[r.table_idx, :last])
        # left for the graph to write, unless its page was flushed whole before
        assert int(device[r.table_idx, last]) in {0, int(host[r.table_idx, last])}
        assert page_size > 1 or device[r.table_idx, last] == 0
    assert cache.flush() is None  # nothing left dirty
