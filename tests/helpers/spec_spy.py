"""Watch a draft-model proposer (MTP, EAGLE-3) inside a real engine: what it is handed and what it
drafts; and run a draft head on the engine's paged pool as one request."""

from __future__ import annotations

import torch

from minisgl.core import Feed, Req, SamplingParams
from minisgl.speculative.head_batch import head_batch


def spy_on_proposer(proposer, by_prefix: bool = False
                    ) -> tuple[dict, list[tuple[list[int], list[int]]]]:
    """Wrap ``proposer``'s ``record`` and ``propose_many``: returns the rows it is handed (copies,
    on their device), by position, or with ``by_prefix`` by the tokens up to the position (the
    hidden state of a position depends on them alone: a prefix-cache hit reads rows another
    request recorded), and every request's drafts as (its tokens, the drafts)."""
    rows: dict = {}
    calls: list[tuple[list[int], list[int]]] = []
    record, propose_many = proposer.record, proposer.propose_many

    def spy_record(req, start, hidden):
        for i, row in enumerate(hidden):
            p = start + i
            rows[tuple(req.input_ids[: p + 1]) if by_prefix else p] = row.clone()
        record(req, start, hidden)

    def spy_propose_many(reqs, max_lens):
        drafts = propose_many(reqs, max_lens)
        calls.extend((list(req.input_ids), d) for req, d in zip(reqs, drafts))
        return drafts

    proposer.record, proposer.propose_many = spy_record, spy_propose_many
    return rows, calls


def fake_request(engine, ids: list[int], computed: int) -> Req:
    """A request of ``ids`` in the idle engine's first page-table row, slots 1 .. len(ids) (page
    0 is the scratch page), its first ``computed`` positions computed."""
    n = len(ids)
    engine.page_table[0, :n] = torch.arange(1, n + 1, dtype=torch.int32)
    return Req(uid=-2, input_ids=ids, prompt_len=n, sampling_params=SamplingParams(),
               max_device_len=n + 8, table_idx=0, cached_len=computed, device_len=computed)


def run_head(engine, kv_layer: int, step, past_k: torch.Tensor, past_v: torch.Tensor,
             num_new: int):
    """One head step ``step(positions)`` on ``engine``'s pool: a request whose K/V of its first
    ``len(past_k)`` positions on ``kv_layer`` are ``past_k``/``past_v``, fed ``num_new`` more.
    Returns (the step's output, the new positions' K and V, read back from the pool)."""
    p, pool = len(past_k), engine.kv_pool
    req = fake_request(engine, [0] * (p + num_new + 1), p)
    slots = engine.page_table[0, : p + num_new].long()
    pool.store_kv(past_k, past_v, slots[:p], kv_layer)
    batch = head_batch([Feed(req, p, p + num_new, 0)], "prefill", engine.page_table)
    with engine.ctx.forward_batch(batch):
        engine.attn_backend.prepare_metadata(batch)
        out = step(batch.positions)
    k, v = pool.k_cache(kv_layer)[slots[p:]], pool.v_cache(kv_layer)[slots[p:]]
    engine.page_table[0].zero_()
    return out, k, v
