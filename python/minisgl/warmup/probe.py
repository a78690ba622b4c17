"""A shadow engine: an engine's model, pools and backends of fake tensors, and the forwards and
samplings a warm-up plan asks of it, each run once under ``shadow_mode`` to record its kernels.

It is built from the ``EngineConfig`` alone, as the real engine builds itself (the same
``build_model``, ``make_pool``, runners), with random weights (a quantized layer's shapes come out
of loading) that cost nothing: every tensor is fake. A forward takes the path the engine would:
piecewise graphs' eager run up to their largest size, the decode graphs' for the captured batch
sizes, the eager forward otherwise.
"""

from __future__ import annotations

import torch
from torch import nn

from minisgl.context import Context
from minisgl.core import Batch, Feed, Req, SamplingParams
from minisgl.distributed import DistributedCommunicator
from minisgl.engine.batch import prepare_batch
from minisgl.engine.build import build_model, make_pool
from minisgl.engine.config import EngineConfig
from minisgl.engine.loading import load_model_config
from minisgl.engine.pool_sizes import may_window
from minisgl.engine.state import attach_state_metadata, create_state_pool
from minisgl.engine.window import window
from minisgl.kvcache.spec import AttentionSpec
from minisgl.sampling import BatchSamplingArgs, SamplingState, sample

from .plan import ForwardShape


class _ShadowComm(DistributedCommunicator):
    """A TP rank's collectives on fake tensors: the shapes, no communication."""

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        return torch.cat([x] * self.info.size, dim=dim)

    def min_int(self, value: int) -> int:
        return value


class ShadowEngine:
    """Build inside ``shadow_mode`` (everything is fake). ``num_pages``: the throwaway pool's
    size (kernels do not specialise on it)."""

    def __init__(self, config: EngineConfig, num_pages: int = 256) -> None:
        self.config = config
        self.device = device = torch.device("cuda", config.device.index or 0)
        self.comm = _ShadowComm(config.tp)
        self.model_config = mc = window(load_model_config(config, device), config.max_seq_len)
        self.model = build_model(config, mc, self.comm, device, shadow=True)
        self.cache_spec = spec = self.model.cache_spec()
        keep_representative_layers(self.model)
        self.max_seq_len = config.max_seq_len or mc.max_position
        self.dummy_row = config.max_running_reqs
        shape = (config.max_running_reqs + 1, self.max_seq_len)
        self.page_table = torch.zeros(shape, dtype=torch.int32, device=device)
        self.token_pool = torch.zeros(shape, dtype=torch.int32, device=device)
        self.sampling_state = SamplingState(shape[0], mc.vocab_size, device)
        self.state_pool = create_state_pool(spec, config, device)
        self.linear_attn = None
        if self.state_pool is not None:
            from minisgl.linear_attn import create_linear_attn_backend

            self.linear_attn = create_linear_attn_backend(config.linear_attn_backend,
                                                          self.state_pool, device)
            if hasattr(self.linear_attn, "chunk_rule"):  # fla's: autotuned, data-dependent
                self.linear_attn.chunk_rule = _chunk_rule_shapes  # type: ignore[attr-defined]
        # the kernels are the same at any pool size: a sliding pool wherever one may be chosen
        windowed = may_window(spec, config.sliding_pool_ratio)
        self.window_page_table = torch.zeros(shape, dtype=torch.int32,
                                             device=device) if windowed else None
        self.kv_pool, self.attn_backend = make_pool(
            config, mc, spec, self.model.kv_scales, self.page_table, self.window_page_table,
            num_pages, num_pages if windowed else None)
        self.ctx = Context(self.page_table, self.kv_pool, self.attn_backend, self.state_pool,
                           self.linear_attn)
        self.pad_tokens = config.pad_tokens if self.attn_backend.supports_padding else 1
        graphs = self.linear_attn is None or self.linear_attn.supports_cuda_graph
        self.graph_runner = self.piecewise = None
        max_bs = min(config.cuda_graph_max_bs, config.max_running_reqs)
        if max_bs > 0 and graphs and self.attn_backend.supports_cuda_graph:
            from minisgl.engine.graph import GraphRunner

            self.graph_runner = GraphRunner(self.model, self.ctx, self.token_pool, self.dummy_row,
                                            max_bs, config.pdl, self.window_page_table,
                                            config.cuda_graph_sizes, mc.rotary.mrope is not None)
        same = len({(a.num_qo_heads, a.num_kv_heads, a.head_dim) for a in spec.attention}) == 1
        if self.attn_backend.supports_padding and graphs and same:
            from minisgl.engine.piecewise import piecewise_runner

            self.piecewise = piecewise_runner(self.model, self.ctx, config, windowed)

    @property
    def vocab_size(self) -> int:
        return self.model_config.vocab_size

    @property
    def graph_sizes(self) -> list[int]:
        return self.graph_runner.sizes if self.graph_runner is not None else []

    @torch.inference_mode()
    def graph_decode(self, bs: int) -> None:
        """The decode graph of ``bs`` requests (greedy inside the graph)."""
        assert self.graph_runner is not None
        self.graph_runner.run_eager(bs)

    @torch.inference_mode()
    def forward(self, shape: ForwardShape) -> torch.Tensor:
        """An eager or piecewise forward of ``shape``'s feeds; its logits."""
        batch = self._batch(shape)
        prepare_batch(batch, self.page_table, self.token_pool, self.pad_tokens,
                      self.window_page_table)
        if self.state_pool is not None:
            attach_state_metadata(batch, self.device)
        with self.ctx.forward_batch(batch):
            self.attn_backend.prepare_metadata(batch)
            assert batch.input_ids is not None
            if self.piecewise is not None and self.piecewise.can_run(batch):
                hidden = self.piecewise.run_eager(batch)
            else:
                hidden = self.model(batch.input_ids, batch.positions, self.ctx)
        hidden, _ = self.model.split_aux(hidden)
        return self.model.compute_logits(hidden[batch.logits_idx])

    @torch.inference_mode()
    def update_tables(self) -> None:
        """The scheduler's per-step write of new pages into the page table (and a verify step's
        drafts into the token pool, a table of the same shape): one scatter kernel."""
        from minisgl.kernel.triton.scatter import scatter_2d_

        scatter_2d_(self.page_table, torch.zeros(3, 2, dtype=torch.int32, device=self.device))

    @torch.inference_mode()
    def sample(self, params: list[SamplingParams]) -> None:
        """Sample one token for each of ``params`` (one row each)."""
        reqs = [_req(i, 8, p) for i, p in enumerate(params)]
        logits = torch.empty(len(reqs), self.vocab_size, dtype=self.config.dtype,
                             device=self.device)
        args = BatchSamplingArgs.from_reqs(reqs, self.vocab_size, self.device,
                                           self.sampling_state)
        if any(p.grammar is not None for p in params):
            words = -(-self.vocab_size // 32)
            args.token_bitmask = torch.empty(len(reqs), words, dtype=torch.int32,
                                             device=self.device)
        sample(logits, args, self.config.sampler)

    def _batch(self, shape: ForwardShape) -> Batch:
        feeds = []
        row = 0
        for _ in range(shape.decode):
            req = _req(row, shape.context, SamplingParams(temperature=0.0))
            feeds.append(Feed(req, req.device_len - 1, req.device_len))
            row += 1
        for extend in shape.extends:
            req = _req(row, shape.prefix + extend, SamplingParams(temperature=0.0))
            feeds.append(Feed(req, shape.prefix, shape.prefix + extend))
            row += 1
        phase = "decode" if not shape.extends else "mixed" if shape.decode else "prefill"
        return Batch(feeds, phase, num_decode=shape.decode if phase == "mixed" else 0)


def _chunk_rule_shapes(q, k, v, *, initial_state, **_) -> tuple[torch.Tensor, torch.Tensor]:
    """fla's chunked delta rule as a shadow run sees it: its outputs' shapes. Its kernels are
    autotuned (their config is chosen by timing launches) and its index preparation depends on
    the chunks' lengths (``repeat_interleave``), so they compile, and keep their choice in the
    kernel cache, on first use."""
    return torch.empty_like(v), torch.empty_like(initial_state, dtype=torch.float32)


def _layer_signature(layer: nn.Module) -> tuple:
    """What a decoder layer's kernels depend on: its modules' classes, its parameters' shapes
    and dtypes, its attention's shape, window, sinks and soft-cap."""
    mods = tuple((name, type(m).__name__) for name, m in layer.named_modules())
    params = tuple((name, tuple(p.shape), p.dtype) for name, p in layer.named_parameters())
    specs = tuple((s.num_qo_heads, s.num_kv_heads, s.head_dim, s.sliding_window,
                   s.sinks is None, s.logit_softcap, s.rotary)
                  for m in layer.modules()
                  if isinstance(s := getattr(m, "spec", None), AttentionSpec))
    return mods, params, specs


def keep_representative_layers(model: nn.Module) -> None:
    """Keep two decoder layers of each kind (the first of a model has no residual yet): the
    others launch the same variants, and a shadow forward then costs a few layers' time."""
    layers = getattr(model, "layers", None)
    if not isinstance(layers, nn.ModuleList) or getattr(model, "aux_layers", ()):
        return
    seen: dict[tuple, int] = {}
    kept = []
    for layer in layers:
        sig = _layer_signature(layer)
        if seen.get(sig, 0) < 2:
            seen[sig] = seen.get(sig, 0) + 1
            kept.append(layer)
    model.layers = nn.ModuleList(kept)


def _req(row: int, length: int, params: SamplingParams) -> Req:
    return Req(uid=row, input_ids=[0] * (length + 1), prompt_len=length, sampling_params=params,
               max_device_len=length + 1, table_idx=row, device_len=length)
