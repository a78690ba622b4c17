"""How many KV pages an engine gets: a fixed budget on a CPU; on a GPU what is left under
``mem_fraction`` after the weights and the activations of one worst-case forward, measured by
running it."""

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
    from minisgl.kvcache.spec import CacheSpec
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
    window_ratio: float | None
    dummy_row: int
    max_seq_len: int

    @property
    def kv_bytes_per_token(self) -> float: ...

    def make_pool(self, num_pages: int, window_pages: int | None = None
                  ) -> tuple[BaseKVCachePool, BaseAttnBackend]: ...


def chain_pages(config: EngineConfig, spec: CacheSpec) -> int:
    """Pages for a draft head's chained steps (``speculative/head.py``), after the scheduler's:
    k - 1 K/V rows of the head's layer for every request that may draft, at positions it does not
    own yet (``Engine.draft_slots``)."""
    chain = max(config.spec_group_size - 2, 0) if spec.draft is not None else 0
    return -(-config.max_running_reqs * chain // config.page_size)


def pages_from_memory(engine: BuildingEngine) -> int:
    """Pages for ``engine`` (the ``Engine`` being built: weights loaded, no pool yet). CPU: a
    fixed budget. CUDA: what is left under ``mem_fraction`` after the weights and the activations
    of one worst-case forward (measured by running it)."""
    config = engine.config
    page_bytes = engine.kv_bytes_per_token * config.page_size
    if engine.device.type == "cuda":
        peak = profile_forward(engine)
        total = torch.cuda.mem_get_info(engine.device)[1]
        budget = total * config.mem_fraction - peak
    else:
        budget = config.kv_cache_memory_gb * (1 << 30)
        if engine.state_pool is not None:  # one budget for both caches
            budget -= engine.state_pool.total_bytes
    pages = int(budget // page_bytes)
    # more than every request at full length could ever use is wasted memory (+1: scratch page)
    pages = min(pages, -(-config.max_running_reqs * engine.max_seq_len // config.page_size) + 1)
    if pages < 2:
        raise RuntimeError(
            "no memory left for the KV cache: use a smaller model, a higher mem_fraction, "
            "or a smaller max_prefill_tokens"
        )
    return pages


@torch.inference_mode()
def profile_forward(engine: BuildingEngine) -> int:
    """Peak bytes of one prefill of ``max_forward_tokens`` tokens (weights included)."""
    pad = engine.config.pad_tokens  # an eager forward runs at most its budget, padding included
    tokens = min(-(-engine.config.max_forward_tokens // pad) * pad, engine.max_seq_len - 1)
    pages = -(-tokens // engine.config.page_size) + 1
    pool, backend = engine.make_pool(pages, pages if engine.window_ratio else None)
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
