"""CUDA graphs for decode: one graph per captured batch size, replayed with a padded batch.

A decode step of a small model is dominated by kernel-launch overhead; replaying a captured graph
removes it. Every input of the graph lives in a static buffer::

    inputs [3, max_bs] int64         page-table row, position of the new token, position of the
                                     token it samples (rows >= batch size are padding)
    attention metadata               owned by the backend (``init_cuda_graph``)

The graph gathers the rest itself, as ``prepare_batch`` would: the input token from the token pool
(where the previous step's sampler wrote it) and the KV slot from the page table. A step sends
these rows in one copy (and the backend its metadata in another) where the batch's preparation
outside the graph took eight launches (a copy, gathers, a cast, copies into the buffers), each a
few microseconds of a one-token step. On an H100, batch 1, old and new code alternating in one
call (``benchmark/results/s17_2026-11-25``): Qwen3-0.6B 0.98 against 1.07 ms per token (medians
of ten), Qwen3-8B with FP8 weights 3.36 against 3.38; on another machine ``bench.py``'s batch-1
runs gave Qwen3-0.6B 0.94 / 0.96 against 0.96 / 0.96. The graph alone costs 6-10 us more with
the gathers inside.

Padding rows are the dummy request: token 0 at position 0, writing its K/V to slot 0 of the scratch
page (page 0, never handed to a request) and attending over that one slot.
"""

from __future__ import annotations

import gc
from typing import TYPE_CHECKING

import torch

from minisgl.core import Batch, Req, SamplingParams
from minisgl.utils import init_logger

if TYPE_CHECKING:
    from .engine import Engine

logger = init_logger(__name__)


def dummy_decode_batch(dummy_row: int, batch_size: int) -> Batch:
    """A decode batch of ``batch_size`` copies of the dummy request (what graphs are captured on)."""
    dummy = Req(uid=-1, input_ids=[0, 0], prompt_len=1, sampling_params=SamplingParams(),
                max_device_len=2, table_idx=dummy_row, cached_len=0, device_len=1)
    return Batch([dummy] * batch_size, "decode")


def capture_sizes(max_bs: int) -> list[int]:
    sizes = [1, 2, 4, 8] + list(range(16, max_bs + 1, 16))
    return sorted({s for s in sizes if s <= max_bs} | {max_bs})


class GraphRunner:
    def __init__(self, engine: Engine, max_bs: int) -> None:
        self.engine = engine
        self.sizes = capture_sizes(max_bs)
        self.max_bs = self.sizes[-1]
        self.inputs = torch.zeros(3, self.max_bs, dtype=torch.int64, device=engine.device)
        self.inputs[0].fill_(engine.dummy_row)
        self.logits: dict[int, torch.Tensor] = {}
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.pool = None
        engine.attn_backend.init_cuda_graph(self.max_bs)
        self._capture_all()

    def can_run(self, batch: Batch) -> bool:
        """Pure decode batches only: a mixed batch's attention metadata varies from step to step,
        so it replays piecewise graphs (``piecewise.py``) or runs eagerly."""
        return batch.is_decode and batch.size <= self.max_bs

    @torch.inference_mode()
    def _capture_all(self) -> None:
        # NOTE: a garbage-collected CUDA graph (e.g. of an engine dropped earlier) frees itself in
        # its destructor, which is illegal while another graph is capturing: collect first, and
        # keep the collector off until every graph is captured.
        gc.collect()
        gc.disable()
        try:
            self._capture_sizes()
        finally:
            gc.enable()

    def _capture_sizes(self) -> None:
        engine = self.engine
        stream = torch.cuda.Stream()
        for bs in reversed(self.sizes):  # largest first: smaller graphs reuse its memory pool
            batch = dummy_decode_batch(engine.dummy_row, bs)
            engine.attn_backend.prepare_for_capture(batch)
            with torch.cuda.stream(stream):
                self._run(batch)  # warm-up: compiles every kernel variant before capture
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self.pool, stream=stream):
                    self.logits[bs] = self._run(batch)
            torch.cuda.current_stream().wait_stream(stream)
            self.pool = graph.pool()
            self.graphs[bs] = graph
        logger.info("captured CUDA graphs for decode batch sizes %s", self.sizes)

    def _run(self, batch: Batch) -> torch.Tensor:
        """The captured forward: the batch's inputs gathered from the static rows, then the model."""
        engine = self.engine
        rows, positions = self.inputs[0, : batch.size], self.inputs[1, : batch.size]
        batch.input_ids = engine.token_pool[rows, positions]
        batch.positions = positions
        batch.out_loc = engine.page_table[rows, positions]
        with engine.ctx.forward_batch(batch):
            hidden = engine.model(batch.input_ids, batch.positions, engine.ctx)
        return engine.model.compute_logits(hidden)

    def replay(self, batch: Batch) -> torch.Tensor:
        """Logits of a live decode batch; sets ``batch.sample_loc`` (views of the static rows, valid
        until the next replay's copy, which the stream orders after this step's sampling)."""
        bs = batch.size
        padded = next(s for s in self.sizes if s >= bs)
        pad = padded - bs
        rows = [req.table_idx for req in batch.reqs] + [self.engine.dummy_row] * pad
        new = [req.device_len - 1 for req in batch.reqs]  # decode: cached_len == device_len - 1
        host = torch.tensor([rows, new + [0] * pad, [p + 1 for p in new] + [0] * pad],
                            dtype=torch.int64, pin_memory=True)
        self.inputs[:, :padded].copy_(host, non_blocking=True)
        self.engine.attn_backend.prepare_for_replay(batch, padded)
        self.graphs[padded].replay()
        batch.sample_loc = (self.inputs[0, :bs], self.inputs[2, :bs])
        return self.logits[padded][:bs]

    def close(self) -> None:
        """Free the graphs. NCCL will not destroy a communicator while a graph that captured one of
        its collectives exists (destroying the TP group would hang): this must come first."""
        torch.cuda.synchronize(self.engine.device)
        for graph in self.graphs.values():
            graph.reset()
        self.graphs.clear()
        self.logits.clear()
        self.pool = None
