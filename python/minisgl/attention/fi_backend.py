"""The FlashInfer backend (``--attn fi``): FlashInfer's paged prefill and decode wrappers over
minisgl's KV pool.

FlashInfer splits attention into ``plan`` (host work: the batch's layout, its split of the work
over the GPU, copied to the device) and ``run`` (the kernels). A step plans once per kind of layer
and every layer of that kind runs on the plan::

    prepare_metadata(batch)   the batch's PagedLayout (fi_plan.py): host lists, nothing launched
    forward, first layer of a kind
                              gather the page ids from the page table (once per table), plan
                              the kind's wrapper
    forward, every layer      wrapper.run(q, (k_pages, v_pages))

A kind is what ``plan`` fixes: heads, head size, scale, window, soft-cap, and which page table
the layer reads (a sliding layer with a pool of its own reads the window table). Prefill and mixed
batches (decode rows are one-token extends) take ``BatchPrefillWithPagedKVCacheWrapper``, causal;
decode batches ``BatchDecodeWithPagedKVCacheWrapper`` (on tensor cores for GQA groups of 4 or more
and for FP8 K/V, as SGLang chooses). The pool's ``[slots, kv_heads, head_dim]`` buffers are its
pages in FlashInfer's NHD layout, viewed as ``[pages, page_size, kv_heads, head_dim]``.

CUDA graphs (decode): one graph-mode decode wrapper per captured batch size and kind, over static
indptr / page-id / last-page-length buffers; the warm-up before each capture plans it, and
``plan_replay`` re-plans it for the live batch before every replay (plan is host work and cannot
be captured). A replayed step's new slots are written into the page table by the graph itself,
after the plan: ``plan_replay`` writes them first (``write_pending_slots``).

A warm-up's shadow run (``minisgl.warmup``: fake tensors, to record Triton kernels) neither plans
nor runs: FlashInfer's C++ would read the fake tensors' memory (and crash the process), and its
kernels are not Triton's; ``forward`` gives an output of the right shape.

Not computed: attention sinks (gpt-oss): FlashInfer's paged wrappers pass them only to the
trtllm-gen kernels of Blackwell GPUs; such models are refused at start-up.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch._subclasses.fake_tensor import is_fake

from .base import AttentionSpec, BaseAttnBackend, BaseAttnMetadata
from .fi_plan import PagedLayout, gather_page_ids, paged_layout, write_pending_slots

if TYPE_CHECKING:
    from minisgl.core import Batch
    from minisgl.kvcache import BaseKVCachePool

INSTALL = "pip install -e '.[flashinfer]'"
WORKSPACE_BYTES = 256 << 20  # split-KV partial results; FlashInfer asks for 128 MB or more
# (heads, kv heads, head size, scale, window or None, soft-cap or None, reads the window table)
Kind = tuple[int, int, int, float, Any, Any, bool]


def import_flashinfer():
    """The flashinfer module, or an ImportError that says how to install it."""
    try:
        import flashinfer  # pyright: ignore[reportMissingImports]
    except ImportError as exc:
        raise ImportError(
            f"the 'fi' attention backend needs FlashInfer ({exc}): install the extra with "
            f"`{INSTALL}` (flashinfer-python; it compiles its kernels with nvcc on first use), "
            "or use --attn triton"
        ) from exc
    return flashinfer


def check_usable(kv_pool: BaseKVCachePool, page_table: torch.Tensor) -> None:
    """Refuse, before importing anything, what FlashInfer's kernels cannot run."""
    if page_table.device.type != "cuda":
        raise ValueError("attention backend 'fi' (FlashInfer) runs on CUDA only; on "
                         f"{page_table.device.type} use --attn torch")
    if kv_pool.dtype == torch.float32:
        raise ValueError("attention backend 'fi' (FlashInfer) takes float16/bfloat16 (and FP8 "
                         "K/V), not float32: use --dtype bfloat16, or --attn triton")


@dataclass
class FlashInferMetadata(BaseAttnMetadata):
    layout: PagedLayout
    decode: bool
    graph_bs: int = 0  # a captured decode batch: the graph wrappers of that size
    page_ids: dict[bool, torch.Tensor] = field(default_factory=dict)  # window table? -> ids
    planned: dict[Kind, Any] = field(default_factory=dict)  # this step's planned wrappers


class FlashInferBackend(BaseAttnBackend):
    supports_cuda_graph = True
    graph_metadata_rows = 0  # everything a replay reads is in the wrappers' own buffers
    supports_padding = True  # run() sees only the rows of qo_indptr
    supports_window = supports_softcap = True

    def __init__(self, kv_pool: BaseKVCachePool, page_table: torch.Tensor,
                 flashinfer: Any = None) -> None:
        self.fi = flashinfer if flashinfer is not None else import_flashinfer()
        self.kv_pool, self.page_table = kv_pool, page_table
        self.page_size = kv_pool.page_size
        self.device = page_table.device
        self.dummy_row = page_table.shape[0] - 1
        self.workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        self._prefill: dict[Kind, Any] = {}
        self._decode: dict[Kind, Any] = {}
        self._graph: dict[int, dict[Kind, Any]] = {}  # captured batch size -> kind -> wrapper
        self._graph_bufs: dict[str, torch.Tensor] = {}
        self._events: dict[int, torch.cuda.Event] = {}  # wrapper -> its last plan's copies
        self._q_dtype: torch.dtype | None = None  # the model's, seen by the first forward

    def check_layers(self, specs: list[AttentionSpec]) -> None:
        for spec in specs:
            if spec.sinks is not None:
                raise ValueError(
                    f"attention backend 'fi' (FlashInfer {self.fi.__version__}) does not compute "
                    f"attention sinks (KV layer {spec.kv_layer}; gpt-oss's layers have them): its "
                    "paged wrappers pass sinks only to the trtllm-gen kernels of Blackwell GPUs. "
                    "Use --attn triton")
        super().check_layers(specs)

    def kind(self, spec: AttentionSpec) -> Kind:
        windowed = spec.sliding_window is not None and self.window_page_table is not None
        return (spec.num_qo_heads, spec.num_kv_heads, spec.head_dim, spec.scale,
                spec.sliding_window, spec.logit_softcap, windowed)

    # -- metadata and plans -----------------------------------------------------------------

    def prepare_metadata(self, batch: Batch) -> None:
        batch.attn_metadata = FlashInferMetadata(paged_layout(batch.feeds, self.page_size),
                                                 decode=batch.is_decode)

    def _page_ids(self, meta: FlashInferMetadata, windowed: bool) -> torch.Tensor:
        if windowed not in meta.page_ids:
            table = self.window_page_table if windowed else self.page_table
            assert table is not None
            meta.page_ids[windowed] = gather_page_ids(table, meta.layout, self.page_size)
        return meta.page_ids[windowed]

    def _wrapper(self, meta: FlashInferMetadata, kind: Kind) -> Any:
        hq, hkv = kind[0], kind[1]
        tensor_cores = self.kv_pool.is_fp8 or hq // hkv >= 4
        if meta.graph_bs:
            wrappers = self._graph.setdefault(meta.graph_bs, {})
            if kind not in wrappers:
                bs, bufs = meta.graph_bs, self._graph_bufs
                wrappers[kind] = self.fi.BatchDecodeWithPagedKVCacheWrapper(
                    self.workspace, "NHD", use_cuda_graph=True, use_tensor_cores=tensor_cores,
                    paged_kv_indptr_buffer=bufs["indptr"][: bs + 1],
                    paged_kv_indices_buffer=bufs[f"ids{int(kind[6])}"],
                    paged_kv_last_page_len_buffer=bufs["last"][:bs])
            return wrappers[kind]
        if meta.decode:
            if kind not in self._decode:
                self._decode[kind] = self.fi.BatchDecodeWithPagedKVCacheWrapper(
                    self.workspace, "NHD", use_tensor_cores=tensor_cores)
            return self._decode[kind]
        if kind not in self._prefill:
            self._prefill[kind] = self.fi.BatchPrefillWithPagedKVCacheWrapper(self.workspace,
                                                                               "NHD")
        return self._prefill[kind]

    def _plan(self, meta: FlashInferMetadata, kind: Kind, q_dtype: torch.dtype) -> Any:
        """Plan ``kind``'s wrapper for this step (the first layer of that kind)."""
        hq, hkv, dim, scale, window, softcap, windowed = kind
        wrapper = self._wrapper(meta, kind)
        ids = self._page_ids(meta, windowed)
        qo, kv, last = meta.layout.host_tensors(pin=self.device.type == "cuda")
        common = dict(sm_scale=scale, window_left=-1 if window is None else window - 1,
                      logits_soft_cap=softcap, q_data_type=q_dtype,
                      kv_data_type=self.kv_pool.dtype, non_blocking=True)
        # NOTE: plan copies its schedule from a pinned buffer of the wrapper's, asynchronously;
        # with overlap scheduling the previous step's copy may still be queued: wait for it
        # before that buffer is overwritten (almost always done already)
        event = self._events.get(id(wrapper))
        if event is not None:
            event.synchronize()
        elif self.device.type == "cuda":
            event = self._events[id(wrapper)] = torch.cuda.Event()
        if meta.decode:
            wrapper.plan(kv, ids, last, hq, hkv, dim, self.page_size, **common)
        else:
            wrapper.plan(qo, kv, ids, last, hq, hkv, dim, self.page_size, causal=True, **common)
        if event is not None:
            event.record()
        meta.planned[kind] = wrapper
        return wrapper

    # -- forward ------------------------------------------------------------------------------

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: AttentionSpec,
        batch: Batch, out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        meta = batch.attn_metadata
        assert isinstance(meta, FlashInferMetadata), "prepare_metadata was not called"
        if is_fake(q):  # a shadow run (module docstring)
            return torch.empty_like(q) if out is None else out
        kind = self.kind(spec)
        self._q_dtype = q.dtype
        wrapper = meta.planned[kind] if kind in meta.planned else self._plan(meta, kind, q.dtype)
        pool, n = self.kv_pool, meta.layout.num_tokens
        out = torch.empty_like(q) if out is None else out
        shape = (-1, self.page_size, spec.num_kv_heads, spec.head_dim)
        pages = (pool.k_cache(spec.kv_layer).view(shape), pool.v_cache(spec.kv_layer).view(shape))
        ks, vs = pool.kv_scales(spec.kv_layer) if pool.is_fp8 else (1.0, 1.0)
        wrapper.run(q[:n].contiguous(), pages, out=out[:n], k_scale=None if ks == 1.0 else ks,
                    v_scale=None if vs == 1.0 else vs, enable_pdl=self.pdl)
        if q.shape[0] > n:  # padding rows: zeros, never stale memory (a NaN there reaches routers)
            out[n:].zero_()
        return out

    # -- CUDA graphs ----------------------------------------------------------------------------

    def init_cuda_graph(self, max_bs: int) -> None:
        """Static indptr, page-id (one per page table) and last-page-length buffers, shared by
        every captured size: the most pages a padded batch of ``max_bs`` can list."""
        most = max_bs * -(-self.page_table.shape[1] // self.page_size)
        sizes = {"indptr": max_bs + 1, "last": max_bs, "ids0": most}
        if self.window_page_table is not None:
            sizes["ids1"] = most
        self._graph_bufs = {name: torch.zeros(n, dtype=torch.int32, device=self.device)
                            for name, n in sizes.items()}
        self._graph.clear()

    def prepare_for_capture(self, batch: Batch, bufs: torch.Tensor) -> None:
        assert self._graph_bufs, "init_cuda_graph was not called"
        bs = batch.size
        batch.attn_metadata = FlashInferMetadata(paged_layout(batch.feeds, self.page_size),
                                                 decode=True, graph_bs=bs)

    def replay_metadata(self, batch: Batch, padded_bs: int) -> list[list[int]]:
        return []

    def plan_replay(self, batch: Batch, padded_bs: int) -> None:
        """Re-plan the graph wrappers of ``padded_bs`` for the live ``batch`` (its new tokens'
        slots written into the page table first: the graph writes them only when it runs)."""
        if is_fake(self.page_table):  # a shadow run
            return
        write_pending_slots(self.page_table, batch.feeds, batch.out_slots)
        layout = paged_layout(batch.feeds, self.page_size, padded_bs, self.dummy_row)
        meta = FlashInferMetadata(layout, decode=True, graph_bs=padded_bs)
        assert self._q_dtype is not None, "plan_replay before any captured forward"
        for kind in self._graph.get(padded_bs, {}):
            self._plan(meta, kind, self._q_dtype)
