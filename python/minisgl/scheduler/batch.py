"""Turn a scheduled batch into the tensors of one forward (a small pure helper, host side)."""

from __future__ import annotations

import torch

from minisgl.core import Batch


def _to(device: torch.device, values: list[int], dtype=torch.int64) -> torch.Tensor:
    host = torch.tensor(values, dtype=dtype, pin_memory=device.type == "cuda")
    return host.to(device, non_blocking=True)


def prepare_batch(batch: Batch, page_table: torch.Tensor) -> None:
    """Fill ``input_ids``, ``positions``, ``out_loc`` and ``logits_idx`` of ``batch``."""
    device = page_table.device
    ids: list[int] = []
    positions: list[int] = []
    rows: list[int] = []
    last_rows: list[int] = []
    for req in batch.reqs:
        ids += req.input_ids[req.cached_len : req.device_len]
        positions += range(req.cached_len, req.device_len)
        rows += [req.table_idx] * req.extend_len
        if req.device_len == len(req.input_ids):
            last_rows.append(len(ids) - 1)
    batch.input_ids = _to(device, ids)
    batch.positions = _to(device, positions)
    batch.out_loc = page_table[_to(device, rows), batch.positions]
    batch.logits_idx = _to(device, last_rows)
