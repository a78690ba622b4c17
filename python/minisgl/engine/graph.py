"""CUDA graphs for decode: one graph per captured batch size, replayed with a padded batch.

A decode step of a small model is dominated by kernel-launch overhead; replaying a captured graph
removes it. Everything the graph of ``bs`` requests reads from the host lives in one static int32
buffer, ``[6 + m, bs]``::

    row 0                            page-table row of each request (rows >= batch size: padding)
    row 1                            position of its new token
    row 2                            position of the token it samples
    row 3                            [3, 0]: 1 for a plain greedy batch
    row 4                            the new token's KV slot (``batch.out_slots``; -1: in the table)
    row 5                            its rotary shift: Qwen's M-RoPE delta (0 for a text request)
    rows 6 ..                        the attention backend's metadata (m = graph_metadata_rows)

Each size reads the first ``(6 + m) * bs`` entries of one flat buffer, so that a step sends all of
it in one contiguous copy (the columns of a ``[6 + m, max_bs]`` buffer are strided, and torch
copies into them through a device copy kernel).

The graph gathers the rest itself (``kernel/triton/decode_step.py``), as ``prepare_batch`` would:
the input token from the token pool (where the previous step's sampler wrote it) and, for a model
with M-RoPE (``mrope``), the rotary position ``index + delta``: the three M-RoPE positions of a
decode token are equal, so the rotary of that one position is M-RoPE's
(``tests/unit/test_mrope_decode.py``) and a request with images replays the same graph as text;
it also writes the new slots into the page table, which the scheduler's flush then leaves out (one
copy and one kernel fewer a step): preparing the batch outside the graph would take eight launches
(a copy, gathers, a cast, copies into the buffers), each a few microseconds of a one-token step.

A plain greedy batch is also sampled inside the graph: the argmax is written to ``tokens`` and to
the token pool, and only ``tokens`` goes back to the host, so the GPU waits only for that copy
between two graphs.

With a speculative draft head (``keep``: MTP, EAGLE-3) the graph also leaves the rows the head
reads in a static output: the hidden states (MTP), or the captured aux states of
``model.split_aux`` (EAGLE-3); ``replay`` hands them back as the eager forward does.

Padding rows are the dummy request: token 0 at position 0, writing its K/V to slot 0 of the scratch
page (page 0, never handed to a request) and attending over that one slot.

With the sliding layers in a pool of their own (``--sliding-pool-ratio``), their slots come from
their own page table, a static buffer the scheduler's flush updates before the replay; the graph
gathers the new tokens' slots from it. Pages freed past the window are stale entries there that
the window's mask keeps every kernel from using. A hybrid model's state
slot is the page-table row (``kvcache/state_pool.py``), so row 0 is also the slots the
linear-attention kernels update in place; padding rows update the dummy row's scratch slot.
"""

from __future__ import annotations

import gc
import time
from typing import TYPE_CHECKING

import torch

from minisgl.core import Batch, Feed, Req, SamplingParams
from minisgl.kernel.triton.decode_step import gather_inputs, greedy_to_pool
from minisgl.kvcache.state_metadata import StateMetadata
from minisgl.utils import init_logger

if TYPE_CHECKING:
    from minisgl.context import Context
    from minisgl.models import BaseLLMModel

logger = init_logger(__name__)


def dummy_decode_batch(dummy_row: int, batch_size: int) -> Batch:
    """A decode batch of ``batch_size`` copies of the dummy request (what graphs are captured
    on)."""
    dummy = Req(uid=-1, input_ids=[0, 0], prompt_len=1, sampling_params=SamplingParams(),
                max_device_len=2, table_idx=dummy_row, cached_len=0, device_len=1)
    return Batch([Feed(dummy, 0, 1)] * batch_size, "decode")


def capture_sizes(max_bs: int, sizes: tuple[int, ...] = ()) -> list[int]:
    """The decode batch sizes to capture: ``sizes`` (``--cuda-graph-bs``) up to ``max_bs``, else
    1, 2, 4, 8, the multiples of 16 and ``max_bs``. A batch replays the smallest graph that holds
    it, its rows padded."""
    if sizes:
        return sorted({s for s in sizes if s <= max_bs}) or [max_bs]
    sizes = (1, 2, 4, 8, *range(16, max_bs + 1, 16))
    return sorted({s for s in sizes if s <= max_bs} | {max_bs})


class GraphRunner:
    """The decode graphs of one engine: its model, forward context (page table, KV pool, attention
    backend), token pool and dummy row (the page table's last), captured for batches up to
    ``max_bs`` (the ``sizes`` among them, if given); ``pdl``: the graph's own kernels launch with
    programmatic dependent launch; ``window_table``: the sliding layers' own page table, if they
    have a pool of their own; ``mrope``: the rotary positions are shifted by row 5 (Qwen's
    M-RoPE deltas); ``keep``: the graphs keep the rows a draft head reads (module docstring)."""

    def __init__(self, model: BaseLLMModel, ctx: Context, token_pool: torch.Tensor,
                 dummy_row: int, max_bs: int, pdl: bool,
                 window_table: torch.Tensor | None = None, sizes: tuple[int, ...] = (),
                 mrope: bool = False, keep: bool = False) -> None:
        self.model, self.ctx, self.token_pool = model, ctx, token_pool
        self.window_table, self.keep = window_table, keep
        self.dummy_row, self.pdl, self.mrope = dummy_row, pdl, mrope
        self.device = token_pool.device
        self.sizes = capture_sizes(max_bs, sizes)
        self.max_bs = self.sizes[-1]
        self.rows = 6 + ctx.attn_backend.graph_metadata_rows
        self.inputs = torch.zeros(self.rows * self.max_bs, dtype=torch.int32, device=self.device)
        self.tokens = torch.zeros(self.max_bs, dtype=torch.int64, device=self.device)
        self.logits: dict[int, torch.Tensor] = {}
        self.kept: dict[int, torch.Tensor] = {}  # the rows a draft head reads (``keep``)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.pool = None
        ctx.attn_backend.init_cuda_graph(self.max_bs)

    def dummy_batch(self, bs: int) -> Batch:
        """The batch the graph of ``bs`` requests is captured on, its static inputs set."""
        batch = dummy_decode_batch(self.dummy_row, bs)
        inputs = self._inputs(bs)
        inputs.copy_(self._host_inputs(batch, bs, False, None, pin=False))  # the dummy request
        self.ctx.attn_backend.prepare_for_capture(batch, inputs[6:])
        return batch

    def run_eager(self, bs: int) -> torch.Tensor:
        """What the graph of ``bs`` requests runs, run once without capturing it (a shadow run
        records its kernels this way: ``minisgl.warmup``)."""
        return self._run(self.dummy_batch(bs))

    def can_run(self, batch: Batch) -> bool:
        """Pure decode batches only: a mixed batch's attention metadata varies from step to step,
        so it replays piecewise graphs (``piecewise.py``) or runs eagerly."""
        return batch.is_decode and batch.size <= self.max_bs

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every size's graph (once; their kernels are compiled first by the warm-up,
        ``minisgl.warmup``, or else by the eager run before each capture)."""
        # NOTE: a garbage-collected CUDA graph (e.g. of an engine dropped earlier) frees itself in
        # its destructor, which is illegal while another graph is capturing: collect first, and
        # keep the collector off until every graph is captured.
        start = time.perf_counter()
        gc.collect()
        gc.disable()
        try:
            self._capture_sizes()
        finally:
            gc.enable()
        logger.info("captured CUDA graphs for decode batch sizes %s in %.1f s", self.sizes,
                    time.perf_counter() - start)

    def _capture_sizes(self) -> None:
        stream = torch.cuda.Stream()
        for bs in reversed(self.sizes):  # largest first: smaller graphs reuse its memory pool
            batch = self.dummy_batch(bs)
            with torch.cuda.stream(stream):
                self._run(batch)  # loads (or compiles) every kernel variant before the capture
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self.pool, stream=stream):
                    self.logits[bs] = self._run(batch)
            torch.cuda.current_stream().wait_stream(stream)
            self.pool = graph.pool()
            self.graphs[bs] = graph

    def _run(self, batch: Batch) -> torch.Tensor:
        """The captured forward: the batch's inputs gathered from the static rows, the model, and
        (flag set) the greedy tokens; with ``keep``, the draft head's rows in ``kept``."""
        ctx = self.ctx
        inputs = self._inputs(batch.size)
        batch.input_ids, batch.positions, batch.out_loc, rope = gather_inputs(
            inputs[0], inputs[1], inputs[4], self.token_pool, ctx.page_table,
            inputs[5] if self.mrope else None)
        if self.window_table is not None:  # the sliding layers' slots (flushed before the replay)
            batch.window_out_loc = self.window_table[inputs[0].long(), batch.positions]
        if ctx.linear_attn is not None:  # a hybrid model's state slots are the page-table rows
            batch.state_metadata = StateMetadata.for_decode(inputs[0])
        with ctx.forward_batch(batch):
            hidden = self.model(batch.input_ids, rope, ctx)
        hidden, aux = self.model.split_aux(hidden)
        if self.keep:
            self.kept[batch.size] = hidden if aux is None else aux
        logits = self.model.compute_logits(hidden)
        greedy_to_pool(logits, inputs[3], inputs[0], inputs[2], self.token_pool,
                       self.tokens[: batch.size], pdl=self.pdl)
        return logits

    def replay(self, batch: Batch, greedy: bool, shifts: list[int] | None = None
               ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Logits of a live decode batch; with ``greedy`` (a plain greedy batch), its tokens,
        already in the token pool (else None); with ``keep``, the draft head's rows (else None);
        ``shifts``: each request's rotary shift (M-RoPE delta; None: all 0). Sets
        ``batch.sample_loc``. All are views of static buffers, valid until the next replay (the
        stream orders its copy after this step's sampling and host copies)."""
        bs = batch.size
        padded = next(s for s in self.sizes if s >= bs)
        inputs = self._inputs(padded)
        inputs.copy_(self._host_inputs(batch, padded, greedy, shifts, pin=True),
                     non_blocking=True)
        self.ctx.attn_backend.plan_replay(batch, padded)
        self.graphs[padded].replay()
        batch.sample_loc = (inputs[0, :bs], inputs[2, :bs])
        kept = self.kept[padded][:bs] if self.keep else None
        return self.logits[padded][:bs], self.tokens[:bs] if greedy else None, kept

    def _inputs(self, bs: int) -> torch.Tensor:
        """The static inputs of the graph of ``bs`` requests (module docstring)."""
        return self.inputs[: self.rows * bs].view(self.rows, bs)

    def _host_inputs(self, batch: Batch, padded: int, greedy: bool, shifts: list[int] | None,
                     pin: bool) -> torch.Tensor:
        pad = padded - batch.size
        rows = [feed.table_idx for feed in batch.feeds] + [self.dummy_row] * pad
        new = [feed.device_len - 1 for feed in batch.feeds]  # decode: one token each
        slots = batch.out_slots if batch.out_slots is not None else [-1] * batch.size
        meta = self.ctx.attn_backend.replay_metadata(batch, padded)
        # padding rows: the dummy request's slot 0 of the scratch page
        shifts = shifts if shifts is not None else [0] * batch.size
        return torch.tensor([rows, new + [0] * pad, [p + 1 for p in new] + [0] * pad,
                             [int(greedy)] + [0] * (padded - 1), slots + [0] * pad,
                             shifts + [0] * pad, *meta],
                            dtype=torch.int32, pin_memory=pin)

    def close(self) -> None:
        """Free the graphs. NCCL will not destroy a communicator while a graph that captured one of
        its collectives exists (destroying the TP group would hang): this must come first."""
        torch.cuda.synchronize(self.device)
        for graph in self.graphs.values():
            graph.reset()
        self.graphs.clear()
        self.logits.clear()
        self.kept.clear()
        self.pool = None
