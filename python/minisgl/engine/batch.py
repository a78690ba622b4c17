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
    for feed in batch.feeds:
        positions += range(feed.cached_len, feed.device_len)
        rows += [feed.table_idx] * feed.extend_len
        last_rows.append(len(rows) - 1)
    # a feed samples its last ``samples`` positions; each token goes to the pool one position on
    sample_loc = ([f.table_idx for f in batch.feeds for _ in range(f.samples)],
                  [p for f in batch.feeds
                   for p in range(f.device_len - f.samples + 1, f.device_len + 1)])
    if batch.is_decode:
        batch.positions, row_ids, *loc = to_device([positions, rows, *sample_loc], torch.int64,
                                                   device)
        batch.input_ids = token_pool[row_ids, batch.positions].long()
        batch.logits_idx = torch.arange(batch.size, device=device)
    else:
        n_dec = batch.num_decode_rows  # one token each: rows 0 .. n_dec-1
        # NOTE: a decode row's input_ids may lag its counters (overlap): its token is in the pool
        ids: list[int] = [0] * n_dec
        for feed in batch.feeds[n_dec:]:
            ids += feed.tokens()
        pad = -len(ids) % pad_multiple
        if pad:  # the dummy request: the page table's last row, whose slot 0 is scratch
            ids += [0] * pad
            positions += [0] * pad
            rows += [page_table.shape[0] - 1] * pad
        logits_idx = [j for f, i in zip(batch.feeds, last_rows)
                      for j in range(i - f.samples + 1, i + 1)]
        batch.positions, row_ids, batch.input_ids, batch.logits_idx, *loc = to_device(
            [positions, rows, ids, logits_idx, *sample_loc], torch.int64, device)
        if n_dec:
            batch.input_ids[:n_dec] = token_pool[row_ids[:n_dec], batch.positions[:n_dec]]
    batch.out_loc = page_table[row_ids, batch.positions]
    if window_table is not None:
        batch.window_out_loc = window_table[row_ids, batch.positions]
    batch.sample_loc = (loc[0], loc[1])


def write_drafts(token_pool: torch.Tensor, batch: Batch) -> None:
    """A decode batch's rows that feed drafts (a verify step as rows, ``Feed.as_rows``) read them
    from the token pool, as every decode row reads its token: write them there first; on a GPU
    one copy and one kernel."""
    drafts = [[f.table_idx, f.cached_len, f.drafts[0]] for f in batch.feeds if f.drafts]
    if not drafts:
        return
    columns = list(map(list, zip(*drafts)))  # page-table rows, positions, tokens
    if token_pool.is_cuda:
        from minisgl.kernel.triton.scatter import scatter_2d_  # needs triton

        host = torch.tensor(columns, dtype=torch.int32, pin_memory=True)
        scatter_2d_(token_pool, host.to(token_pool.device, non_blocking=True))
    else:
        rows, positions, tokens = (torch.tensor(x, dtype=torch.int64) for x in columns)
        token_pool[rows, positions] = tokens.to(token_pool.dtype)
