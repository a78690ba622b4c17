"""What the proposers that draft with a one-layer head fed by the target's hidden states share
(``mtp``: the checkpoint's MTP head; ``eagle3``: an EAGLE-3 draft model).

Each forward hands back per-position rows of the target (``ForwardOutput.hidden``); ``record``
keeps, per request, the rows of the positions the target computed and kept (a verify step's
rejected positions are dropped). ``propose_many`` drafts for a step's requests together, one
batch per head step:

1. the catch-up: the head runs over every request's recorded positions (position p takes the
   target's row at p and the token at p + 1, now known) as one prefill-like batch, a feed per
   request attending over the head's K/V of its earlier positions;
2. the chain, from the head's output at the last known position n - 2 (n: the request's known
   tokens): step j feeds draft j at position n - 2 + j, with the previous step's output as its
   hidden input, and its argmax is draft j + 1; one decode-like batch per step over the requests
   that draft that far (the longest first, so a step runs a prefix of them).

The head's K/V is a KV layer of the engine's paged pool (the model's ``CacheSpec.draft``),
addressed through each request's page-table row like the target's layers, and attended by the
engine's attention backend::

    position   0 .............. n-2 | n-1  n  ...  n+k-3
               the request's slots   | scratch slots (Engine.draft_slots), lent for the chain

The chain's positions are not the request's yet (its verify feed allocates them after the
drafts), so their page-table entries are lent to scratch slots while the chain runs and given
back after (``head_batch.lent_slots``): drafted K/V never land in a request's slots. The positions
the verification keeps are recorded and caught up at the next call. One host sync per call: the
drafts' copy. With the engine's decode CUDA graphs on, a chained step replays a graph of the head's
step (``engine/head_graph.py``), padded to a captured size; a step of more rows runs eagerly, and
so does the catch-up (its batches' shapes vary); a replayed step drafts what the eager one does.

Positions the request never computed (a prefix-cache hit) hold the head K/V the slots have: the
request that computed them wrote them (the same tokens, so the same K/V, except at the hit's last
position when the next token differs), or nobody did (zeros, or a stale entry): the drafts may be
worse there, never wrong (verification decides every token).
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from minisgl.core import Batch, Feed, Req
from minisgl.engine.head_graph import HeadGraphRunner, chain_sizes
from minisgl.utils.transfer import to_device

from .head_batch import head_batch, lent_slots
from .proposer import Proposer

if TYPE_CHECKING:
    from minisgl.engine import Engine

_MAX_PENDING = 64  # recorded positions a request keeps before they are fed to the head


@dataclass
class HeadState:
    """A request's recorded rows not yet fed to the head (positions ``start ..``, contiguous),
    and the head's output at the last position fed."""

    start: int = 0
    pending: list[torch.Tensor] = field(default_factory=list)
    last: tuple[int, torch.Tensor] | None = None  # (position, the head's output row there)

    @property
    def num_pending(self) -> int:
        return sum(len(rows) for rows in self.pending)

    def add(self, start: int, rows: torch.Tensor) -> None:
        """Rows of positions from ``start``: a re-fed position (retraction) replaces what waits
        from it on; after a gap (positions recorded by nobody: a forward read back while its
        request was retracted) what waits before it is dropped, as the K/V it leaves unwritten
        costs draft quality only."""
        end = self.start + self.num_pending
        if self.pending and self.start < start <= end:
            kept = torch.cat(self.pending)[: start - self.start]
            self.pending = [kept]
        else:
            self.start, self.pending = start, []
        self.pending.append(rows)

    def take(self, count: int) -> tuple[int, torch.Tensor]:
        """The first ``count`` pending positions (their first, their rows), the rest kept."""
        rows, start = torch.cat(self.pending), self.start
        self.pending = [rows[count:]] if count < len(rows) else []
        self.start = start + count
        return start, rows[:count]


class HeadProposer(Proposer):
    """A method supplies the head's step (``run``) and its token choice (``predict``); the
    engine's context (page table, KV pool, attention backend) and scratch slots come with it.

    ``hidden_size``: the width of the head's output rows; ``graph_rows``: the most requests one
    call drafts for (``SpecConfig.disable_by_batch_size``). Where the engine has decode CUDA
    graphs, the first proposer captures the chained step for batches up to that many rows
    (``Engine.head_graphs``), and every later one replays them; ``graphs`` None: eager."""

    def __init__(self, engine: Engine, hidden_size: int, graph_rows: int = 0) -> None:
        self.model, self.ctx, self.slots = engine.model, engine.ctx, engine.draft_slots
        self.states: dict[int, HeadState] = {}
        self.graphs = engine.head_graphs
        decode = engine.graph_runner
        if self.graphs is None and graph_rows > 0 and decode is not None:
            self.graphs = HeadGraphRunner(self.ctx, hidden_size, engine.config.dtype,
                                          chain_sizes(decode.sizes, graph_rows), engine.dummy_row)
            self.graphs.capture(self._step)
            engine.head_graphs = self.graphs

    @abstractmethod
    def run(self, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
            from_target: bool) -> torch.Tensor:
        """The head at ``positions`` given the tokens at p + 1 and ``hidden``: the target's rows
        (``from_target``) or the previous step's output; the batch is bound to ``self.ctx`` (its
        K/V go to ``batch.out_loc``). Returns its output rows."""

    @abstractmethod
    def predict(self, out: torch.Tensor) -> torch.Tensor:
        """The target token ids the head's output rows ``out`` ``[B, H]`` predict, ``[B]`` on the
        device (the chain feeds them on without reading them back)."""

    def record(self, req: Req, start: int, rows: torch.Tensor) -> None:
        """The target's rows of positions ``start .. start + len(rows) - 1``. A request that
        does not draft for a while (a large batch) has them fed to the head every
        ``_MAX_PENDING`` positions, so what waits stays small."""
        if len(rows):
            state = self.states.setdefault(req.uid, HeadState())
            state.add(start, rows)
            if state.num_pending >= _MAX_PENDING:
                with torch.inference_mode():
                    self._catch_up([req])

    def propose(self, req: Req, max_len: int) -> list[int]:
        return self.propose_many([req], [max_len])[0]

    @torch.inference_mode()
    def propose_many(self, reqs: list[Req], max_lens: list[int]) -> list[list[int]]:
        self._catch_up(reqs)
        found: list[list[int]] = [[] for _ in reqs]
        ready = []  # (index, request, drafts, the head's output at n - 2)
        for i, (req, k) in enumerate(zip(reqs, max_lens)):
            state = self.states.get(req.uid)
            last = state.last if state is not None else None
            if k >= 1 and last is not None and last[0] == len(req.input_ids) - 2:
                ready.append((i, req, k, last[1]))
        if ready:
            ready.sort(key=lambda item: -item[2])  # the longest chains first
            drafts = self._chain([r for _, r, _, _ in ready], [k for _, _, k, _ in ready],
                                 torch.stack([out for _, _, _, out in ready]))
            for (i, _, _, _), tokens in zip(ready, drafts):
                found[i] = tokens
        return found

    def _catch_up(self, reqs: list[Req]) -> None:
        """Feed the requests' recorded positions whose next tokens are known to the head, in one
        batch (a position whose next token is not known yet, just read back, waits)."""
        feeds: list[Feed] = []
        rows: list[torch.Tensor] = []
        for req in reqs:
            state = self.states.get(req.uid)
            if state is None:
                continue
            count = min(state.num_pending, len(req.input_ids) - 1 - state.start)
            if count > 0:
                start, hidden = state.take(count)
                feeds.append(Feed(req, start, start + count, 0))
                rows.append(hidden)
        if not feeds:
            return
        tokens, = to_device([[t for f in feeds for t in
                              f.req.input_ids[f.cached_len + 1 : f.device_len + 1]]],
                            torch.int64, self.ctx.page_table.device)
        batch = head_batch(feeds, "prefill", self.ctx.page_table)
        out = self._forward(batch, tokens, torch.cat(rows), True)
        end = 0
        for feed in feeds:
            end += feed.extend_len
            self.states[feed.uid].last = (feed.device_len - 1, out[end - 1])

    def _chain(self, reqs: list[Req], lens: list[int], out: torch.Tensor) -> list[list[int]]:
        """``lens[i]`` drafts of each request (``lens`` non-increasing) from the head's outputs
        ``out`` at their positions n - 2."""
        steps = [self.predict(out)]
        with lent_slots(self.ctx.page_table, reqs, lens, self.slots) as scratch:
            for j in range(1, lens[0]):
                m = sum(1 for k in lens if k > j)
                feeds = [Feed(req, len(req.input_ids) - 2 + j, len(req.input_ids) - 1 + j)
                         for req in reqs[:m]]
                if self.graphs is not None and self.graphs.fits(m):
                    # the graph writes its K/V at the lent entries, scratch[:m, j - 1]
                    out, predicted = self.graphs.replay(feeds, steps[-1][:m], out[:m])
                    steps.append(predicted.clone())  # the next replay overwrites it
                    continue
                batch = head_batch(feeds, "decode", self.ctx.page_table, scratch[:m, j - 1])
                out = self._forward(batch, steps[-1][:m], out[:m], False)
                steps.append(self.predict(out))
        flat = torch.cat(steps).tolist()  # step j holds the drafts j + 1 of its requests
        offsets = [0]
        for step in steps:
            offsets.append(offsets[-1] + len(step))
        return [[flat[offsets[j] + i] for j in range(k)] for i, k in enumerate(lens)]

    def _forward(self, batch: Batch, tokens: torch.Tensor, hidden: torch.Tensor,
                 from_target: bool) -> torch.Tensor:
        assert batch.positions is not None
        with self.ctx.forward_batch(batch):
            self.ctx.attn_backend.prepare_metadata(batch)
            return self.run(tokens, hidden, batch.positions, from_target)

    def _step(self, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """A chained step, the batch bound (what ``engine/head_graph.py`` captures)."""
        out = self.run(tokens, hidden, positions, False)
        return out, self.predict(out)

    def finished(self, req: Req, learn: bool = True) -> None:
        self.states.pop(req.uid, None)
