"""A one-layer paged KV pool holding requests at given (cached, extend) lengths, the attention
backends' test scene (tests/kernels/test_triton_attention.py, test_fi_attention.py)."""

from __future__ import annotations

import torch

from minisgl.core import Req, SamplingParams
from minisgl.kvcache.mha_pool import MHAKVCache


class PagedScene:
    """Random K/V in a one-layer pool; each request's pages handed out at random (page 0 is
    scratch; the page table's last row is the dummy request). ``free``: the pages left over
    (``spare_pages`` of them, and one more)."""

    def __init__(self, cached, extend, hq, hkv, dim, dtype, page_size=1, seed=0, device="cpu",
                 spare_pages=0):
        gen = torch.Generator().manual_seed(seed)
        self.hq, self.hkv, self.dim, self.dtype = hq, hkv, dim, dtype
        self.gen, self.page_size = gen, page_size
        total = [c + e for c, e in zip(cached, extend)]
        pages_per = [-(-t // page_size) for t in total]
        num_pages = sum(pages_per) + 2 + spare_pages
        self.pool = MHAKVCache(1, hkv, dim, num_pages, page_size, dtype, device)
        for buf in (self.pool.k_cache(0), self.pool.v_cache(0)):
            buf.copy_(torch.randn(buf.shape, generator=gen).to(dtype))
        nrows = len(total) + 4
        self.page_table = torch.zeros(nrows, max(total) + 8, dtype=torch.int32, device=device)
        pages = (torch.randperm(num_pages - 1, generator=gen) + 1).tolist()
        table_rows = torch.randperm(nrows - 1, generator=gen).tolist()
        self.reqs = []
        for i, (c, t) in enumerate(zip(cached, total)):
            mine = [pages.pop() for _ in range(pages_per[i])]
            slots = torch.tensor([p * page_size + o for p in mine for o in range(page_size)])[:t]
            self.page_table[table_rows[i], :t] = slots.to(torch.int32).to(device)
            self.reqs.append(Req(uid=i, input_ids=[5] * (t + 1), prompt_len=t + 1,
                                 sampling_params=SamplingParams(), max_device_len=t + 8,
                                 table_idx=table_rows[i], cached_len=c, device_len=t))
        self.free = pages
