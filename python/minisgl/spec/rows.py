"""A verify step as one-token decode rows, so that it replays the decode CUDA graphs.

A request verifying k drafts feeds k + 1 tokens (its last one, then the drafts) at positions
``L-1 .. L+k-1``. Each of them can be a decode row of its own: a row attends over its request's
page-table row up to and including its own position, which is the verify step's causal mask, and
every layer stores the whole batch's K/V before any row attends, so row j sees the drafts before
it. A step in which every request decodes or verifies is then a decode batch of ``sum(k_i + 1)``
rows, which replays the decode graph of that many rows (``engine/graph.py``) instead of running
the layers eagerly or piecewise. Each row is computed as the plain decode step of its token
would be, so greedy output keeps to the output without speculation.

The rows read their input tokens from the token pool, as decode rows do: the drafts are written
there first (``Batch.draft_tokens``, ``Engine.prepare``). Row j samples the token after its
position and the sampler (or the graph's greedy kernel) writes it to the pool one position on,
over draft j + 1: after the verdict the pool holds the accepted run and, at the position the next
step feeds, the corrected (or bonus) token, which is what that step reads.

Not for hybrid (recurrent) models: every row of a request would read and update the same state
slot; they verify in the prefill part of the batch (``spec/decoder.py``). A step that also
prefills keeps that layout too: its attention metadata varies step to step.
"""

from __future__ import annotations

from dataclasses import dataclass

from minisgl.core import Batch, Req, SamplingParams


@dataclass(eq=False)
class DraftRow:
    """Position ``device_len - 1`` of ``req``, fed as a one-token decode row: the fields the engine
    and the attention backends read of a decoding request."""

    req: Req
    device_len: int
    draft_len: int = 0  # a row samples one token

    @property
    def table_idx(self) -> int:
        return self.req.table_idx

    @property
    def cached_len(self) -> int:
        return self.device_len - 1

    @property
    def extend_len(self) -> int:
        return 1

    @property
    def sampling_params(self) -> SamplingParams:
        return self.req.sampling_params


def as_decode_rows(batch: Batch) -> Batch | None:
    """``batch`` (decode requests, then requests verifying drafts) as a decode batch of rows, in
    the order of its sampled requests; None when a prefill chunk is in it."""
    reqs = batch.reqs
    if any(not req.draft_len for req in reqs[batch.num_decode_rows:]):
        return None
    rows: list[DraftRow] = []
    drafts: list[list[int]] = [[], [], []]  # page-table rows, positions, tokens
    for req in reqs:
        k = req.draft_len
        first = req.device_len - k  # one past the last real token's position
        rows += [DraftRow(req, first + j) for j in range(k + 1)]
        if k:
            drafts[0] += [req.table_idx] * k
            drafts[1] += range(first, first + k)
            drafts[2] += req.input_ids[first:]
    return Batch(rows, "decode", row_reqs=list(reqs), draft_tokens=drafts)
