"""How much memory the KV cache gets: a fixed budget on a CPU; on a GPU what is left under
``mem_fraction`` after the weights and the activations of one worst-case forward, measured by
running it. ``pool_sizes.py`` turns it into pages."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch

from minisgl.context import Context
from minisgl.core import Batch, Feed, Req, SamplingParams

from .batch import prepare_batch
from .state import attach_state_metadata

if TYPE_CHECKING:
    from minisgl.attention import BaseAttnBackend
    from minisgl.kvcache import BaseKVCachePool, StatePool
    from minisgl.linear_attn import BaseLinearAttnBackend
    from minisgl.models import BaseLLMModel

    from .config import EngineConfig


class BuildingEngine(Protocol):
    """What sizing the pool reads of the ``Engine`` being built (weights loaded, no pool yet)."""

    config: EngineConfig
    device: torch.device
    model: BaseLLMModel
    state_pool: StatePool | None
    linear_attn: BaseLinearAttnBackend | None
    page_table: torch.Tensor
    window_page_table: torch.Tensor | None
    token_pool: torch.Tensor
    dummy_row: int
    max_seq_len: int

    def make_pool(self, num_pages: int, window_pages: int | None = None
                  ) -> tuple[BaseKVCachePool, BaseAttnBackend]: ...


def kv_budget(engine: BuildingEngine) -> float:
    """Bytes for the KV pools of ``engine`` (the ``Engine`` being built: weights loaded, no pool
    yet). CPU: a fixed budget. CUDA: what is left under ``mem_fraction`` after the weights and
    the activations of one worst-case forward (measured by running it)."""
    config = engine.config
    if engine.device.type == "cuda":
        peak = profile_forward(engine)
        total = torch.cuda.mem_get_info(engine.device)[1]
        return total * config.mem_fraction - peak
    budget = config.kv_cache_memory_gb * (1 << 30)
    if engine.state_pool is not None:  # one budget for both caches
        budget -= engine.state_pool.total_bytes
    return budget


@torch.inference_mode()
def profile_forward(engine: BuildingEngine) -> int:
    """Peak bytes of one prefill of ``max_forward_tokens`` tokens (weights included)."""
    pad = engine.config.pad_tokens  # an eager forward runs at most its budget, padding included
    tokens = min(-(-engine.config.max_forward_tokens // pad) * pad, engine.max_seq_len - 1)
    pages = -(-tokens // engine.config.page_size) + 1
    windowed = engine.window_page_table is not None
    pool, backend = engine.make_pool(pages, pages if windowed else None)
    req = Req(uid=-1, input_ids=[0] * (tokens + 1), prompt_len=tokens + 1,
              sampling_params=SamplingParams(), max_device_len=tokens + 1,
              table_idx=engine.dummy_row, device_len=tokens)
    batch = Batch([Feed(req, 0, tokens, samples=0)], "prefill")
    for table in (engine.page_table, engine.window_page_table):
        if table is not None:
            table[engine.dummy_row, :tokens] = torch.arange(tokens, dtype=torch.int32)
    prepare_batch(batch, engine.page_table, engine.token_pool, 1, engine.window_page_table)
    if engine.state_pool is not None:
        attach_state_metadata(batch, engine.device)
    torch.cuda.reset_peak_memory_stats(engine.device)
    ctx = Context(engine.page_table, pool, backend, engine.state_pool, engine.linear_attn)
    with ctx.forward_batch(batch):
        backend.prepare_metadata(batch)
        hidden = engine.model(batch.input_ids, batch.positions, ctx)
    engine.model.compute_logits(engine.model.split_aux(hidden)[0][-1:])
    torch.cuda.synchronize(engine.device)
    peak = torch.cuda.max_memory_allocated(engine.device) - pool.mem_bytes
    for table in (engine.page_table, engine.window_page_table):
        if table is not None:
            table[engine.dummy_row].zero_()
    del pool, backend, ctx, hidden
    torch.cuda.empty_cache()
    return peak
