"""Turn a scheduled batch into the tensors of one forward (a small pure helper, host side).

Decode inputs are gathered on the device from the token pool, where the previous forward wrote the
tokens it sampled: the host need not know them yet, so the next forward can be launched before the
previous one is read back (overlap scheduling). A mixed batch does both::

    tokens : | decode rows (one each, from the token pool) | prefill chunks (from input_ids) | pad |

The padding (``pad_multiple``) rounds an eager forward's token count up: padding tokens are the
dummy request's (token 0 at position 0, its K/V written to the scratch slot 0), in no request's
attention metadata, and no logits row reads them. They exist for the host: cuBLAS chooses a GEMM
algorithm for every new shape it sees, and a mixed step's token count is new almost every step.
"""

from __future__ import annotations

import torch

from minisgl.core import Batch
from minisgl.utils.transfer import to_device


def prepare_batch(batch: Batch, page_table: torch.Tensor, token_pool: torch.Tensor,
                  pad_multiple: int = 1, window_table: torch.Tensor | None = None) -> None:
    """Fill ``input_ids``, ``positions``, ``out_loc``, ``logits_idx`` and ``sample_loc``; a prefill
    or mixed batch gets padding tokens up to a multiple of ``pad_multiple``. ``window_table``: the
    sliding layers' own page table, which gives ``window_out_loc``."""
    device = page_table.device
    positions: list[int] = []
    rows: list[int] = []
    last_rows: list[int] = []
    for req in batch.reqs:
        positions += range(req.cached_len, req.device_len)
        rows += [req.table_idx] * req.extend_len
        last_rows.append(len(rows) - 1)
    sampled = batch.sampled_reqs
    # a request verifying k drafts (``minisgl/spec/``) samples its last k + 1 positions
    sample_loc = ([r.table_idx for r in sampled for _ in range(r.draft_len + 1)],
                  [p for r in sampled for p in range(r.device_len - r.draft_len, r.device_len + 1)])
    if batch.is_decode:
        batch.positions, row_ids, *loc = to_device([positions, rows, *sample_loc], torch.int64,
                                                   device)
        batch.input_ids = token_pool[row_ids, batch.positions].long()
        batch.logits_idx = torch.arange(batch.size, device=device)
    else:
        n_dec = batch.num_decode_rows  # one token each: rows 0 .. n_dec-1
        # NOTE: a decode row's input_ids may lag its counters (overlap): its token is in the pool
        ids: list[int] = [0] * n_dec
        for req in batch.reqs[n_dec:]:
            ids += req.input_ids[req.cached_len : req.device_len]
        pad = -len(ids) % pad_multiple
        if pad:  # the dummy request: the page table's last row, whose slot 0 is scratch
            ids += [0] * pad
            positions += [0] * pad
            rows += [page_table.shape[0] - 1] * pad
        chosen = {id(r) for r in sampled}
        logits_idx = [j for r, i in zip(batch.reqs, last_rows) if id(r) in chosen
                      for j in range(i - r.draft_len, i + 1)]
        batch.positions, row_ids, batch.input_ids, batch.logits_idx, *loc = to_device(
            [positions, rows, ids, logits_idx, *sample_loc], torch.int64, device)
        if n_dec:
            batch.input_ids[:n_dec] = token_pool[row_ids[:n_dec], batch.positions[:n_dec]]
    batch.out_loc = page_table[row_ids, batch.positions]
    if window_table is not None:
        batch.window_out_loc = window_table[row_ids, batch.positions]
    batch.sample_loc = tuple(loc)


def write_drafts(token_pool: torch.Tensor, drafts: list[list[int]]) -> None:
    """``token_pool[rows[i], positions[i]] = tokens[i]`` for ``drafts = [rows, positions, tokens]``
    (a verify step fed as decode rows reads its drafts there, ``spec/rows.py``); on a GPU one copy
    and one kernel."""
    if token_pool.is_cuda:
        from minisgl.kernel.triton.scatter import scatter_2d_  # needs triton

        host = torch.tensor(drafts, dtype=torch.int32, pin_memory=True)
        scatter_2d_(token_pool, host.to(token_pool.device, non_blocking=True))
    else:
        rows, positions, tokens = (torch.tensor(x, dtype=torch.int64) for x in drafts)
        token_pool[rows, positions] = tokens.to(token_pool.dtype)
