"""How much memory the KV cache gets: a fixed budget on a CPU; on a GPU what is left under
``mem_fraction`` after the weights and the activations of one worst-case forward, measured by
running it, and of a vision-language model's largest vision-tower call (``image_bytes``).
``pool_sizes.py`` turns it into pages. The two peaks are kept in the kernel cache
(``CompilingKernels.keep_peaks``): a start of the same configuration with the same code reads
them instead of running the forward and the tower again (seconds for a hybrid VLM)."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Callable, Protocol

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from minisgl.context import Context
from minisgl.core import Batch, Feed, Req, SamplingParams
from minisgl.utils import init_logger

from .batch import prepare_batch
from .state import attach_state_metadata

logger = init_logger(__name__)

if TYPE_CHECKING:
    from minisgl.attention import BaseAttnBackend
    from minisgl.kvcache import BaseKVCachePool, StatePool
    from minisgl.kvcache.spec import CacheSpec
    from minisgl.linear_attn import BaseLinearAttnBackend
    from minisgl.models import BaseLLMModel

    from .config import EngineConfig
    from .images import ImageEncoder
    from .types import CompilingKernels


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
    images: ImageEncoder | None
    kernels: CompilingKernels | None

    def make_pool(self, num_pages: int, window_pages: int | None = None
                  ) -> tuple[BaseKVCachePool, BaseAttnBackend]: ...


def chain_pages(config: EngineConfig, spec: CacheSpec) -> int:
    """Pages for a draft head's chained steps (``speculative/head.py``), after the scheduler's:
    k - 1 K/V rows of the head's layer for every request that may draft, at positions it does not
    own yet (``Engine.draft_slots``)."""
    chain = max(config.spec_group_size - 2, 0) if spec.draft is not None else 0
    return -(-config.max_running_reqs * chain // config.page_size)


def kv_budget(engine: BuildingEngine) -> float:
    """Bytes for the KV pools of ``engine`` (the ``Engine`` being built: weights loaded, no pool
    yet). CPU: a fixed budget. CUDA: what is left under ``mem_fraction`` after the weights and
    the activations of one worst-case forward and of the vision tower's largest call (measured
    by running them)."""
    config = engine.config
    if engine.device.type == "cuda":
        kernels = engine.kernels
        peaks = kernels.known_peaks() if kernels is not None else None
        if peaks is None:
            peaks = {"forward": profile_forward(engine), "tower": image_bytes(engine)}
            if kernels is not None:
                kernels.keep_peaks(peaks)
        else:
            logger.info("activation peaks read from the kernel cache: forward %.2f GiB, vision "
                        "tower %.2f GiB", peaks["forward"] / (1 << 30), peaks["tower"] / (1 << 30))
        if engine.images is not None:
            logger.info("vision tower: %.2f GiB reserved for a call of %d image tokens "
                        "(--max-image-tokens)", peaks["tower"] / (1 << 30),
                        engine.images.max_tokens)
        total = torch.cuda.mem_get_info(engine.device)[1]
        return total * config.mem_fraction - peaks["forward"] - peaks["tower"]
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


@torch.inference_mode()
def image_bytes(engine: BuildingEngine) -> int:
    """Bytes the vision tower's largest call takes beyond what is allocated before it (its
    pixels, activations and output), measured by running it on zeros: a call encodes at most
    ``max_tokens`` image tokens (``ImageEncoder``), so no step with images takes more. 0 without
    a tower. The pool is sized as if it came on top of the forward's peak: the two run one after
    the other, but the tower's output rows stay through the forward, and the sum covers them."""
    images = engine.images
    if images is None:
        return 0
    tower, tokens = images.tower, images.max_tokens
    return peak_bytes(lambda: tower(*tower.dummy_input(tokens)), engine.device)


def peak_bytes(fn: Callable[[], Any], device: torch.device) -> int:
    """The most bytes ``fn`` holds at once beyond what was allocated before it: the CUDA
    allocator's peak; on a CPU the tensors its operators create, while they live (``_LiveBytes``:
    it misses an operator's internal scratch, which the allocator's peak counts)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - base
        torch.cuda.empty_cache()
        return peak
    with _LiveBytes() as live:
        fn()
    return live.peak


class _LiveBytes(TorchDispatchMode):
    """Counts the storage of every tensor an operator returns (not an input's storage: a view
    or an in-place result) until the tensor is freed; ``peak``: the most at once."""

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = 0
        self.owned: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs))
                  if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            ptr, size = storage.data_ptr(), storage.nbytes()
            if size == 0 or ptr in inputs or ptr in self.owned:
                continue
            self.owned.add(ptr)
            self.live += size
            self.peak = max(self.peak, self.live)
            weakref.finalize(t, self._free, ptr, size)
        return out

    def _free(self, ptr: int, size: int) -> None:
        self.owned.discard(ptr)
        self.live -= size
