"""Turn a scheduled batch into the tensors of one forward (a small pure helper, host side).

Decode inputs are gathered on the device from the token pool, where the previous forward wrote the
tokens it sampled: the host need not know them yet, so the next forward can be launched before the
previous one is read back (overlap scheduling).
"""

from __future__ import annotations

import torch

from minisgl.core import Batch


def _to(device: torch.device, values: list[int], dtype=torch.int64) -> torch.Tensor:
    host = torch.tensor(values, dtype=dtype, pin_memory=device.type == "cuda")
    return host.to(device, non_blocking=True)


def prepare_batch(batch: Batch, page_table: torch.Tensor, token_pool: torch.Tensor) -> None:
    """Fill ``input_ids``, ``positions``, ``out_loc``, ``logits_idx`` and ``sample_loc``."""
    device = page_table.device
    positions: list[int] = []
    rows: list[int] = []
    last_rows: list[int] = []
    for req in batch.reqs:
        positions += range(req.cached_len, req.device_len)
        rows += [req.table_idx] * req.extend_len
        last_rows.append(len(rows) - 1)
    batch.positions = _to(device, positions)
    row_ids = _to(device, rows)
    batch.out_loc = page_table[row_ids, batch.positions]
    if batch.is_decode:
        batch.input_ids = token_pool[row_ids, batch.positions].long()
        batch.logits_idx = torch.arange(batch.size, device=device)
    else:
        ids: list[int] = []
        for req in batch.reqs:
            ids += req.input_ids[req.cached_len : req.device_len]
        batch.input_ids = _to(device, ids)
        sampled = {id(r) for r in batch.sampled_reqs}
        batch.logits_idx = _to(device, [i for r, i in zip(batch.reqs, last_rows) if id(r) in sampled])
    sampled = batch.sampled_reqs
    batch.sample_loc = (_to(device, [r.table_idx for r in sampled]),
                        _to(device, [r.device_len for r in sampled]))
