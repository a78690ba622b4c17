from __future__ import annotations

from dataclasses import dataclass

import torch

from minisgl.distributed import DistributedInfo


@dataclass(frozen=True)
class EngineConfig:
    """What one TP worker needs to build its model, KV pool and attention backend.

    ``auto`` values are resolved before this is built (see ``minisgl.llm.config``); every field
    here is concrete.
    """

    model_path: str
    device: torch.device
    dtype: torch.dtype
    # "fp8" (per channel) / "fp8-block" (128x128 blocks): quantize an unquantized checkpoint at load
    quantization: str | None = None
    kv_cache_dtype: torch.dtype | None = None  # None: ``dtype``; float8_e4m3fn: the FP8 KV cache
    page_size: int = 1
    num_pages: int | None = None  # None: size the pool from memory (kv_cache_memory_gb on CPU)
    kv_cache_memory_gb: float = 1.0
    mem_fraction: float = 0.9
    max_running_reqs: int = 256
    max_seq_len: int | None = None  # None: the model's max_position_embeddings
    # hybrid models: state slots the radix cache keeps snapshots in (kvcache/hybrid_radix.py);
    # None: a quarter of max_running_reqs
    num_state_snapshots: int | None = None
    # speculative decoding: ``spec_group_size`` (k + 1) tokens fed per verifying request (a
    # draft head's chain writes k - 1 K/V rows past the request's pages: ``Engine.draft_slots``);
    # hybrid models: requests that may verify drafts in one step, each with state slots for
    # those tokens (``kvcache/state_pool.py``)
    spec_state_groups: int = 0
    spec_group_size: int = 0
    # the ``mtp`` speculative method: build and load the checkpoint's MTP head, and hand each
    # forward's hidden states back (``ForwardOutput.hidden``)
    mtp: bool = False
    # the ``eagle3`` speculative method: its draft's directory; the target captures the draft's
    # aux layers and hands them back (``ForwardOutput.hidden``)
    draft_model_path: str | None = None
    # the sliding-window layers in a slot space of their own whose pages past the window go back
    # to the pool: this many tokens per token of the others; None: sized from the cache spec, and
    # only where it pays (``pool_sizes.py``); 0: they share the others'
    sliding_pool_ratio: float | None = None
    attention_backend: str = "torch"
    moe_backend: str = "torch"
    linear_attn_backend: str = "torch"  # hybrid models: ``minisgl.linear_attn``
    state_dtype: torch.dtype = torch.float32  # hybrid models: the delta-rule state's dtype
    cuda_graph_max_bs: int = 0  # decode batches up to this size replay CUDA graphs; 0 disables
    cuda_graph_sizes: tuple[int, ...] = ()  # the batch sizes captured (): 1, 2, 4, 8, 16k
    # prefill/mixed forwards up to this many tokens replay piecewise CUDA graphs; 0 disables
    piecewise_cuda_graph_max_tokens: int = 0
    piecewise_cuda_graph_sizes: tuple[int, ...] = ()  # the token counts captured (): piecewise.py
    max_forward_tokens: int = 8192  # the largest forward (prefill budget): sizes the profiling run
    # vision-language models: the most tokens of one image and of one vision-tower call, whose
    # activations the profiling run reserves; None: the largest image the processor makes
    max_image_tokens: int | None = None
    dummy_weights: bool = False
    seed: int = 0
    tp: DistributedInfo = DistributedInfo()
    dist_init_addr: str = "127.0.0.1:29500"  # rendezvous of the TP group (host:port), tp > 1 only
    sampler: str = "triton"  # one of ``minisgl.sampling.SAMPLERS``; CPU logits always take torch
    # eager CUDA forwards' token counts are rounded up to a multiple of this (1: no padding):
    # cuBLAS picks a GEMM algorithm on the host for every new shape (``batch.py``)
    pad_tokens: int = 64
    pdl: bool = True  # Triton kernels launch with programmatic dependent launch (Hopper+)
    # compile every Triton variant the engine can reach on all cores while it starts, before
    # its graphs are captured (``minisgl.warmup``; CUDA only)
    precompile: bool = False
    # the kernel cache's directory (``minisgl.warmup.cache``); None: the default, and a
    # TRITON_CACHE_DIR of the user's is kept
    kernel_cache_dir: str | None = None
    # kernel switches for ablations (``quant.QuantizationConfig``): one-token unquantized layers
    # through the Triton GEMV (else cuBLAS); FP8 per-channel one-token decode normalising inside
    # the GEMVs (else the RMSNorm kernels); batches' QKV/gate-up inputs quantized by the RMSNorm
    # (else by a kernel of their own)
    gemv: bool = True
    norm_gemv: bool = True
    norm_quant: bool = True

    @property
    def kv_dtype(self) -> torch.dtype:
        return self.kv_cache_dtype or self.dtype
