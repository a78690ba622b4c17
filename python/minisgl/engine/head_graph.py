"""CUDA graphs for a draft head's chained step (``speculative/head.py``): one graph per batch size,
replayed with a padded batch, as the decode graphs are (``graph.py``).

A chained step of an MTP head or an EAGLE-3 draft is one small decoder layer over a few rows,
which costs what its few dozen kernel launches cost; replaying a graph of it removes them. The
graph of ``bs`` rows reads static inputs::

    tokens   [bs] int64               the drafts the step feeds (the previous step's predictions)
    hidden   [bs, H]                  the previous step's output rows (the model's dtype)
    inputs   [2 + m, bs] int32        row 0: page-table row; row 1: position;
                                      rows 2 ..: the attention backend's (m = graph_metadata_rows)

and leaves the head's output rows ``[bs, H]`` and their predictions ``[bs]`` in static outputs.
The graph gathers each row's K/V slot from the page table at its position: the chain's positions
are lent to scratch slots while it runs (``head_batch.lent_slots``), so that entry is the slot
the eager step writes. Padding rows are the dummy request (the page table's last row) at position
0, whose entry is slot 0 of the scratch page, as in the decode graphs; their tokens and hidden rows
are what an earlier step left there (rows are computed independently; nobody reads theirs).

The graphs share the attention backend's graph state with the decode graphs (``init_cuda_graph``
ran for the engine's largest size, and the sizes here are among the engine's), so they exist only
where the decode graphs do. They belong to the engine (``Engine.head_graphs``, closed with it):
the first proposer captures them, and one made again (``SpecDecoder.reset``) replays them, since
they hold the head's weights and the static buffers, nothing of a proposer's.
"""

from __future__ import annotations

import gc
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch

from minisgl.core import Batch, Feed
from minisgl.utils import init_logger

if TYPE_CHECKING:
    from minisgl.context import Context

logger = init_logger(__name__)

# (tokens, hidden, positions) -> (the head's output rows, their predicted token ids), the batch
# bound to the context
Step = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def chain_sizes(decode_sizes: Sequence[int], max_rows: int) -> list[int]:
    """The decode graphs' batch sizes a chain step captures: those up to the first that holds
    ``max_rows`` (the most requests a step drafts for), or all of them."""
    sizes: list[int] = []
    for size in sorted(decode_sizes):
        sizes.append(size)
        if size >= max_rows:
            break
    return sizes


def locate(page_table: torch.Tensor, inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows' positions (int64) and K/V slots (``page_table[row, position]``), from the first
    two static input rows."""
    positions = inputs[1].long()
    return positions, page_table[inputs[0].long(), positions]


class HeadGraphRunner:
    """The chain-step graphs for batches of ``sizes`` rows (ascending) of a head whose rows are
    ``hidden_size`` wide in ``dtype``, on ``ctx`` (page table, KV pool, attention backend) and
    the engine's ``dummy_row``."""

    def __init__(self, ctx: Context, hidden_size: int, dtype: torch.dtype, sizes: list[int],
                 dummy_row: int) -> None:
        self.ctx, self.sizes, self.dummy_row = ctx, sizes, dummy_row
        self.max_bs = sizes[-1]
        device = ctx.page_table.device
        self.rows = 2 + ctx.attn_backend.graph_metadata_rows
        # one flat buffer: a size's rows are one contiguous copy (graph.py says why)
        self.inputs = torch.zeros(self.rows * self.max_bs, dtype=torch.int32, device=device)
        self.tokens = torch.zeros(self.max_bs, dtype=torch.int64, device=device)
        self.hidden = torch.zeros(self.max_bs, hidden_size, dtype=dtype, device=device)
        self.outputs: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.graphs: dict[int, Any] = {}
        self.pool = None

    def fits(self, rows: int) -> bool:
        return rows <= self.max_bs

    def padded(self, rows: int) -> int:
        """The smallest captured size that holds ``rows``."""
        return next(s for s in self.sizes if s >= rows)

    def host_inputs(self, batch: Batch, padded: int) -> list[list[int]]:
        """The static input rows of a decode-like step ``batch`` (one new position a feed, its
        ``cached_len``), padded to ``padded`` rows with the dummy request."""
        pad = padded - batch.size
        meta = self.ctx.attn_backend.replay_metadata(batch, padded)
        return [[f.table_idx for f in batch.feeds] + [self.dummy_row] * pad,
                [f.cached_len for f in batch.feeds] + [0] * pad, *meta]

    @torch.inference_mode()
    def capture(self, step: Step) -> None:
        """Capture ``step`` at every size, largest first (smaller graphs reuse its memory pool),
        on the dummy request: only slot 0 of the scratch page is written."""
        # NOTE: collecting a CUDA graph while another captures is illegal (graph.py)
        gc.collect()
        gc.disable()
        try:
            for bs in reversed(self.sizes):
                self.graphs[bs] = self._capture_one(self._dummy_batch(bs), step)
        finally:
            gc.enable()
        logger.info("captured CUDA graphs for the draft head's chain step, batch sizes %s",
                    self.sizes)

    def _dummy_batch(self, bs: int) -> Batch:
        from .graph import dummy_decode_batch  # imports the decode graphs' Triton kernels

        batch = dummy_decode_batch(self.dummy_row, bs)
        inputs = self._inputs(bs)
        inputs.copy_(torch.tensor(self.host_inputs(batch, bs), dtype=torch.int32))
        self.ctx.attn_backend.prepare_for_capture(batch, inputs[2:])
        return batch

    def _capture_one(self, batch: Batch, step: Step) -> Any:
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            self._run(batch, step)  # loads every kernel (and plans FlashInfer) before the capture
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool, stream=stream):
                self.outputs[batch.size] = self._run(batch, step)
        torch.cuda.current_stream().wait_stream(stream)
        self.pool = graph.pool()
        return graph

    def _run(self, batch: Batch, step: Step) -> tuple[torch.Tensor, torch.Tensor]:
        """The captured step: positions and slots from the static rows, then the head."""
        bs = batch.size
        batch.positions, batch.out_loc = locate(self.ctx.page_table, self._inputs(bs))
        with self.ctx.forward_batch(batch):
            return step(self.tokens[:bs], self.hidden[:bs], batch.positions)

    def replay(self, feeds: list[Feed], tokens: torch.Tensor, hidden: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """One chain step over ``feeds`` (each one new position, at ``cached_len``) fed
        ``tokens`` ``[m]`` and ``hidden`` ``[m, H]``: the head's output rows and their
        predictions, views of static outputs, valid until the next replay."""
        m, batch = len(feeds), Batch(feeds, "decode")
        bs = self.padded(m)
        inputs = self._inputs(bs)
        host = torch.tensor(self.host_inputs(batch, bs), dtype=torch.int32,
                            pin_memory=inputs.is_cuda)
        inputs.copy_(host, non_blocking=True)
        self.tokens[:m].copy_(tokens)
        self.hidden[:m].copy_(hidden)
        self.ctx.attn_backend.plan_replay(batch, bs)
        self.graphs[bs].replay()
        out, predicted = self.outputs[bs]
        return out[:m], predicted[:m]

    def _inputs(self, bs: int) -> torch.Tensor:
        return self.inputs[: self.rows * bs].view(self.rows, bs)

    def close(self) -> None:
        """Free the graphs (before the TP group: ``GraphRunner.close``)."""
        if self.inputs.is_cuda:
            torch.cuda.synchronize(self.inputs.device)
        for graph in self.graphs.values():
            graph.reset()
        self.graphs.clear()
        self.outputs.clear()
        self.pool = None
