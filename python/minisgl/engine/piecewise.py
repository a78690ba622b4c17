"""Piecewise CUDA graphs for prefill and mixed forwards: everything but attention is replayed.

Besides attention, a forward launches about ten kernels per layer (norms, GEMMs, RoPE and the K/V
store, the MLP): for Qwen3-8B some 400 launches, whose host cost exceeds the device time of a
1024-token step (docs/performance.md, "Measurements behind the code"). Their shapes depend on the
token count alone, so they are captured once per token count. Attention depends on the requests (how
many decode, the lengths of chunks and contexts), so it runs eagerly between the graphs, on the
batch's own metadata::

    graph 0       embedding; layer 0 up to its attention (norms, QKV, RoPE, K/V store) -> q, k, v
    attention 0   eager, the backend:                                        q, k, v -> out
    graph 1       layer 0 after its attention (output projection, MLP); layer 1 up to its attention
    ...
    graph L       layer L-1 after its attention; the final norm                      -> hidden

A hybrid model's linear-attention layers are cut points too: their token mixer reads and writes
the requests' state slots, which differ from batch to batch, so it runs eagerly between graphs on
static qkv / a / b / out buffers of its own, as attention does.

Token counts are captured at the multiples of 64 up to 1,024, of 128 up to 2,048 and of 256 beyond,
up to ``max_tokens`` (``capture_sizes``; ``--piecewise-cuda-graph-tokens`` names others); a
forward's tokens are padded up to the smallest that holds them with the dummy request's (token 0 at
position 0, K/V into the scratch slot 0), as ``batch.py`` pads eager forwards. Past 1,024 tokens a
forward pads by under an eighth of its tokens, and half as many counts as every multiple of 64 take
half the start-up (each is an eager forward and a capture of every piece; what the offline benchmark
and a restart measured: docs/performance.md). q/k/v and the attention output are static buffers that
every layer and every size shares: each graph copies its layer's q/k/v there and the next reads
``out``. With the sliding layers in a pool of their own (``windowed``), their K/V store reads a
second static slot buffer, ``window_out_loc``, as the others read ``out_loc``. The backend must
accept padding rows (``supports_padding``), and every attention layer must have the same q/k/v
shapes (one set of buffers; the engine checks ``cache_spec``).
"""

from __future__ import annotations

import bisect
import gc
import time
from typing import TYPE_CHECKING, Any

import torch

from minisgl.context import Context
from minisgl.core import Batch
from minisgl.utils import init_logger

if TYPE_CHECKING:
    from minisgl.models import BaseLLMModel

    from .config import EngineConfig

logger = init_logger(__name__)

STEP = 64  # the smallest token count captured; the largest is a multiple of it
# (up to this many tokens, the step between captured counts): 64 up to 1,024, then 128, then 256
_STEPS = ((1024, STEP), (2048, 128))
_LAST_STEP = 256


def capture_sizes(max_tokens: int, sizes: tuple[int, ...] = ()) -> list[int]:
    """The token counts to capture: ``sizes`` up to ``max_tokens``, else the module docstring's;
    ``max_tokens`` always (every forward up to it replays)."""
    if not sizes:
        n, chosen = STEP, []
        while n <= max_tokens:
            chosen.append(n)
            n += next((step for end, step in _STEPS if n < end), _LAST_STEP)
        sizes = tuple(chosen)
    return sorted({s for s in sizes if s <= max_tokens} | {max_tokens})


def piecewise_runner(model: BaseLLMModel, ctx: Context, config: EngineConfig,
                     windowed: bool) -> PiecewiseRunner | None:
    """The engine's piecewise runner (not captured yet), or None when no forward fits its
    smallest size: the largest size is ``piecewise_cuda_graph_max_tokens``, but never above the
    largest forward (``max_forward_tokens``, rounded up to a multiple of ``STEP``)."""
    max_tokens = min(config.piecewise_cuda_graph_max_tokens,
                     -(-config.max_forward_tokens // STEP) * STEP)
    if max_tokens < STEP:
        return None
    return PiecewiseRunner(model, ctx, capture_sizes(max_tokens, config.piecewise_cuda_graph_sizes),
                           windowed)


class _Cut:
    """Stands in for the attention backend while a forward is warmed up or captured: it hands the
    layer's q/k/v to the static buffers and, when capturing, ends the current graph there and begins
    the next, which starts from ``out``. ``layers`` records each cut: ``(False, what the attention
    layer handed its backend)`` (its spec), or ``(True, the linear-attention layer)``
    (``_LinearCut``)."""

    def __init__(self, runner: PiecewiseRunner, capture: bool) -> None:
        self.runner, self.capture = runner, capture
        self.graphs: list[torch.cuda.CUDAGraph] = []
        self.layers: list[tuple[bool, Any]] = []

    def begin(self) -> None:
        if self.capture:
            self.graphs.append(torch.cuda.CUDAGraph())
            self.graphs[-1].capture_begin(pool=self.runner.pool)

    def end(self) -> None:
        if self.capture:
            self.graphs[-1].capture_end()

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: Any,
                batch: Batch, out: torch.Tensor | None = None) -> torch.Tensor:
        return self.cut(self.runner.buffers(q, k, v), (q, k, v), (False, spec))

    def cut(self, bufs: tuple[torch.Tensor, ...], inputs: tuple[torch.Tensor, ...], layer):
        n = inputs[0].shape[0]
        for buf, x in zip(bufs, inputs):
            buf[:n].copy_(x)
        self.end()
        self.layers.append(layer)
        self.begin()
        return bufs[-1][:n]


class _LinearCut:
    """Stands in for the linear-attention backend: a cut like attention's, on its own buffers."""

    def __init__(self, cut: _Cut) -> None:
        self._cut = cut

    def forward(self, layer, qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor, batch: Batch,
                out: torch.Tensor | None = None) -> torch.Tensor:
        bufs = self._cut.runner.linear_buffers(layer, qkv, a, b)
        return self._cut.cut(bufs, (qkv, a, b), (True, layer))


class PiecewiseRunner:
    """The graphs of every captured token count, their static inputs, and their replay: of one
    engine's model over its forward context ``ctx`` (page table, KV pool, attention backend)."""

    def __init__(self, model: BaseLLMModel, ctx: Context, sizes: list[int],
                 windowed: bool = False) -> None:
        assert sizes and sizes == sorted(sizes) and sizes[0] > 0, sizes
        self.model, self.ctx = model, ctx
        self.sizes = sizes
        self.max_tokens = sizes[-1]
        self.device = device = ctx.page_table.device
        self.input_ids = torch.zeros(self.max_tokens, dtype=torch.int64, device=device)
        self.positions = torch.zeros(self.max_tokens, dtype=torch.int64, device=device)
        self.out_loc = torch.zeros(self.max_tokens, dtype=torch.int32, device=device)
        self.window_out_loc = (torch.zeros(self.max_tokens, dtype=torch.int32, device=device)
                               if windowed else None)
        # q, k, v, out (and a hybrid model's qkv, a, b, out): made by the first warm-up
        self._bufs: tuple[torch.Tensor, ...] | None = None
        self._linear_bufs: tuple[torch.Tensor, ...] | None = None
        # token count -> (its graphs, what each cut ran, the hidden states' static buffer)
        self.pieces: dict[int, tuple[list[torch.cuda.CUDAGraph], list[tuple[bool, Any]],
                                     torch.Tensor]] = {}
        self.pool = None

    def can_run(self, batch: Batch) -> bool:
        ids = batch.input_ids  # padded: more than the feeds' tokens on CUDA
        return not batch.is_decode and ids is not None and ids.shape[0] <= self.max_tokens

    def size_for(self, n: int) -> int:
        """The captured token count a forward of ``n`` tokens pads to: the smallest that holds
        it."""
        return self.sizes[bisect.bisect_left(self.sizes, n)]

    def buffers(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
                ) -> tuple[torch.Tensor, ...]:
        """The static q, k, v and out buffers (allocated by the first warm-up, the largest size's,
        outside the graphs' pool)."""
        if self._bufs is None:
            rows = self.max_tokens
            self._bufs = tuple(torch.zeros(rows, *x.shape[1:], dtype=x.dtype, device=x.device)
                               for x in (q, k, v, q))
        return self._bufs

    def linear_buffers(self, layer, qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor
                       ) -> tuple[torch.Tensor, ...]:
        """The static qkv, a, b and out buffers of the linear-attention cuts (every such layer
        of a model has the same shapes)."""
        if self._linear_bufs is None:
            rows = self.max_tokens
            out = torch.zeros(rows, layer.num_v_heads, layer.v_dim, dtype=qkv.dtype,
                              device=qkv.device)
            self._linear_bufs = tuple(torch.zeros(rows, *x.shape[1:], dtype=x.dtype,
                                                  device=x.device) for x in (qkv, a, b)) + (out,)
        return self._linear_bufs

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every size's pieces (once)."""
        # NOTE: no graph may be garbage-collected while another captures (graph.py says why)
        start = time.perf_counter()
        self.pool = torch.cuda.graph_pool_handle()
        gc.collect()
        gc.disable()
        try:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for size in reversed(self.sizes):  # largest first: the rest reuse its memory
                    self._run_cut(size, capture=False)  # warm-up: compiles and tunes every kernel
                    self.pieces[size] = self._run_cut(size, capture=True)
            torch.cuda.current_stream().wait_stream(stream)
        finally:
            gc.enable()
        logger.info("captured piecewise CUDA graphs for prefill/mixed forwards of %d token counts "
                    "from %d to %d in %.1f s", len(self.sizes), self.sizes[0], self.max_tokens,
                    time.perf_counter() - start)

    def _run_cut(self, size: int, capture: bool):
        window_loc = self.window_out_loc[:size] if self.window_out_loc is not None else None
        batch = Batch([], "prefill", input_ids=self.input_ids[:size],
                      positions=self.positions[:size], out_loc=self.out_loc[:size],
                      window_out_loc=window_loc)
        cut = _Cut(self, capture)
        linear = _LinearCut(cut) if self.ctx.linear_attn is not None else None
        ctx = Context(self.ctx.page_table, self.ctx.kv_pool, cut,  # type: ignore[arg-type]
                      self.ctx.state_pool, linear)  # type: ignore[arg-type]
        cut.begin()
        with ctx.forward_batch(batch):
            hidden = self.model(batch.input_ids, batch.positions, ctx)
        cut.end()
        return cut.graphs, cut.layers, hidden

    def forward(self, batch: Batch) -> torch.Tensor:
        """The hidden states of a prefill or mixed batch, prepared (``prepare_batch``, attention
        metadata) and bound to the engine's context."""
        ids, positions, out_loc = batch.input_ids, batch.positions, batch.out_loc
        assert ids is not None and positions is not None and out_loc is not None  # prepared
        n = ids.shape[0]
        size = self.size_for(n)
        static = [(self.input_ids, ids), (self.positions, positions), (self.out_loc, out_loc)]
        if self.window_out_loc is not None:  # the sliding layers' slots (``batch.py``)
            assert batch.window_out_loc is not None
            static.append((self.window_out_loc, batch.window_out_loc))
        for buf, x in static:
            buf[:n].copy_(x)
            if size > n:
                buf[n:size].zero_()  # the dummy request's tokens
        graphs, layers, hidden = self.pieces[size]
        attn, lin = _views(self._bufs, n), _views(self._linear_bufs, n)  # lin: hybrid models
        backend, linear = self.ctx.attn_backend, self.ctx.linear_attn
        for graph, (is_linear, layer) in zip(graphs, layers):
            graph.replay()
            if is_linear:
                assert linear is not None and lin is not None
                qkv, a, b, mixed = lin
                linear.forward(layer, qkv, a, b, batch, out=mixed)
            else:
                assert attn is not None
                q, k, v, out = attn
                backend.forward(q, k, v, layer, batch, out=out)
        graphs[-1].replay()
        return hidden[:n]

    def run_eager(self, batch: Batch) -> torch.Tensor:
        """What ``forward`` replays, run eagerly with the same buffers (a shadow run records its
        kernels this way: ``minisgl.warmup``)."""
        assert batch.input_ids is not None
        n = batch.input_ids.shape[0]
        size = self.size_for(n)
        _, layers, hidden = self._run_cut(size, capture=False)
        attn, lin = _views(self._bufs, n), _views(self._linear_bufs, n)
        for is_linear, layer in layers:
            if is_linear:
                assert self.ctx.linear_attn is not None and lin is not None
                qkv, a, b, mixed = lin
                self.ctx.linear_attn.forward(layer, qkv, a, b, batch, out=mixed)
            else:
                assert attn is not None
                q, k, v, out = attn
                self.ctx.attn_backend.forward(q, k, v, layer, batch, out=out)
        return hidden[:n]

    def close(self) -> None:
        """Free the graphs (before the TP group is destroyed: ``GraphRunner.close`` says why)."""
        torch.cuda.synchronize(self.device)
        for graphs, _, _ in self.pieces.values():
            for graph in graphs:
                graph.reset()
        self.pieces.clear()
        self.pool = None


def _views(bufs: tuple[torch.Tensor, ...] | None, n: int) -> list[torch.Tensor] | None:
    return [buf[:n] for buf in bufs] if bufs is not None else None
