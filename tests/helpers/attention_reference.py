"""Float64 attention over paged K/V: the reference of the window, sink and image-block kernel
tests (tests/kernels/test_window_sinks.py, test_image_blocks.py)."""

from __future__ import annotations

import torch


def reference(q, k_cache, v_cache, slots_of, cached, scale, window=0, sinks=None, limits=None):
    """Each request's new tokens (``q``: one tensor per request) over its context slots, a
    window and sinks as specified. ``limits``: per new token (all requests in order), the last
    key it sees (an image's last token); by default its own position."""
    outs, t = [], 0
    for qb, slots, c in zip(q, slots_of, cached):
        qb = qb.double()
        group = qb.shape[1] // k_cache.shape[1]
        k = k_cache[slots].double().repeat_interleave(group, 1)
        v = v_cache[slots].double().repeat_interleave(group, 1)
        s = torch.einsum("thd,shd->hts", qb, k) * scale
        qpos = c + torch.arange(qb.shape[0])
        qlim = qpos if limits is None else torch.tensor(limits[t: t + qb.shape[0]])
        t += qb.shape[0]
        kpos = torch.arange(len(slots))
        seen = kpos[None, :] <= qlim[:, None]
        if window:
            seen &= kpos[None, :] > qpos[:, None] - window
        s = s.masked_fill(~seen.to(s.device), float("-inf"))
        if sinks is not None:
            sink = sinks.double().view(-1, 1, 1).expand(-1, s.shape[1], 1)
            p = torch.cat([s, sink], -1).softmax(-1)[..., :-1]
        else:
            p = s.softmax(-1)
        outs.append(torch.einsum("hts,shd->thd", p, v))
    return torch.cat(outs)
