"""User-facing engine options, shared by the offline ``LLM`` and the server's CLI.

``auto`` values (device, dtype, attention backend) are resolved here, once, before the frozen
engine and scheduler configs are built (the device and the dtypes by ``resolve.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minisgl.attention import check_backend_name, resolve_attention_backend
from minisgl.engine import EngineConfig
from minisgl.engine.pool_sizes import check_sliding_pool_ratio
from minisgl.env import KERNEL_CACHE_DIR, kernel_cache_root
from minisgl.kvcache import PREFIX_CACHES
from minisgl.linear_attn import LINEAR_ATTN_BACKENDS, resolve_linear_attn_backend
from minisgl.llm.resolve import (
    DTYPES,
    STATE_DTYPES,
    resolve_device,
    resolve_dtype,
    resolve_state_dtype,
)
from minisgl.models import ModelConfig
from minisgl.moe import MOE_BACKENDS, resolve_moe_backend
from minisgl.quant import KV_CACHE_DTYPES, QUANTIZATIONS
from minisgl.sampling import SAMPLERS
from minisgl.scheduler import SchedulerConfig
from minisgl.scheduler.config import check_schedule
from minisgl.speculative import SpecConfig, from_sglang_flags, parse_speculative_config

WARMUP_MODES = ("auto", "on", "off")
_SAMPLERS = ("auto", *SAMPLERS)


@dataclass(frozen=True)
class EngineOptions:
    device: str = "auto"  # "auto": cuda when a GPU is present, else cpu
    # "auto": float32 on CPU; on GPU the checkpoint's dtype (float32 -> bfloat16)
    dtype: str = "auto"
    # "fp8" (per channel) or "fp8-block" (128x128 blocks): quantize the weights at load (FP8
    # checkpoints need none)
    quantization: str | None = None
    # "auto": the model's dtype; "fp8_e4m3": FP8 K/V with per-layer scales
    kv_cache_dtype: str = "auto"
    page_size: int = 1
    cache: str = "radix"
    max_prefill_tokens: int = 8192
    num_pages: int | None = None
    kv_cache_memory_gb: float = 1.0
    mem_fraction: float = 0.9
    max_running_requests: int = 256
    # hybrid models: recurrent-state snapshots the radix cache may keep (None: max_running / 4)
    num_state_snapshots: int | None = None
    # sliding-window models: the sliding layers' own pool, whose pages past the window are freed:
    # "auto" (sized from the cache spec, on where it pays: ``engine/pool_sizes.py``), tokens per
    # token of the full layers', or 0 (one pool for all layers)
    sliding_pool_ratio: float | str = "auto"
    max_seq_len: int | None = None
    attn: str = "auto"
    moe_backend: str = "auto"  # "auto": torch on CPU; CUDA: triton (Hopper: triton_fragments_gluon)
    # hybrid models: the linear-attention backend ("auto": triton on CUDA, torch on CPU) and the
    # delta-rule state's dtype ("auto": the checkpoint's mamba_ssm_dtype, else float32)
    linear_attn_backend: str = "auto"
    mamba_ssm_dtype: str = "auto"
    cuda_graph_max_bs: int = 256  # 0 disables CUDA graphs (GPU only)
    # the decode batch sizes captured (SGLang's --cuda-graph-bs); (): 1, 2, 4, 8, multiples of 16
    cuda_graph_bs: tuple[int, ...] = ()
    # prefill/mixed forwards of up to this many tokens: piecewise CUDA graphs (0: off; GPU only)
    piecewise_cuda_graph_max_tokens: int = 4096
    # their token counts (SGLang's --piecewise-cuda-graph-tokens); (): multiples of 64 to 1,024, of
    # 128 to 2,048, of 256 beyond
    piecewise_cuda_graph_tokens: tuple[int, ...] = ()
    disable_overlap: bool = False  # read every forward back before launching the next
    # kernel ablations (``EngineConfig``'s gemv, norm_gemv, norm_quant): one-token unquantized
    # layers through cuBLAS; fp8 one-token decode through the RMSNorm kernels; fp8 batches' inputs
    # quantized by a kernel of their own
    disable_gemv: bool = False
    disable_norm_gemv: bool = False
    disable_norm_quant: bool = False
    schedule_mode: str = "mixed"  # "mixed": decode tokens and prefill chunks share steps
    # tokens of one mixed step; None: see ``default_batched_tokens``
    max_num_batched_tokens: int | None = None
    # vision-language models: the most tokens one image may take (a larger one is a 400); the
    # memory profile reserves a vision-tower call of this many. None: the largest image the
    # checkpoint's processor makes (Qwen3.5/3.6 16384, Gemma 3 256, Gemma 4 1120)
    max_image_tokens: int | None = None
    schedule_policy: str = "lpm"  # admission order: "lpm" (longest cached prefix) or "fcfs"
    max_wait_steps: int = 64
    disable_prefill_yield: bool = False  # ablation: a long prompt's chunks never yield
    dummy_weights: bool = False
    seed: int = 0
    # ablations: "auto" (Triton kernels on CUDA, the torch reference on CPU), "torch", "triton-row"
    sampler: str = "auto"
    pad_tokens: int = 64  # eager CUDA forwards padded to a multiple of this many tokens (1: off)
    disable_pdl: bool = False  # Triton kernels without programmatic dependent launch (Hopper+)
    # run every kernel variant before serving (scheduler/warmup.py); "auto": on CUDA only (the
    # CPU path compiles nothing)
    warmup: str = "auto"
    # the kernel cache (``minisgl.warmup.cache``): compiled kernels and the variants each
    # configuration needs, one directory to carry; None: $MINISGL_KERNEL_CACHE_DIR, else
    # $MINISGL_CACHE_DIR/kernels
    cache_dir: str | None = None
    # speculative decoding (minisgl/speculative/): vLLM's JSON (offline also a dict), e.g.
    # {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}; or SGLang's flags
    speculative_config: str | None = None
    speculative_algorithm: str | None = None  # NGRAM, SUFFIX, NEXTN (MTP) or EAGLE3
    speculative_num_draft_tokens: int | None = None  # SGLang's N: N - 1 drafts per step
    speculative_draft_model_path: str | None = None  # EAGLE3: the draft's directory
    speculative_ngram_min_match_window_size: int | None = None
    speculative_ngram_max_match_window_size: int | None = None

    def __post_init__(self) -> None:
        def positive(name: str, allow_none: bool = False) -> None:
            value = getattr(self, name)
            if allow_none and value is None:
                return
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}: must be a positive integer, got {value!r}")

        for name in ("page_size", "max_prefill_tokens", "max_running_requests", "pad_tokens"):
            positive(name)
        positive("num_pages", allow_none=True)
        if self.num_state_snapshots is not None and (
                not isinstance(self.num_state_snapshots, int) or self.num_state_snapshots < 0):
            raise ValueError(f"num_state_snapshots: must be an integer >= 0, "
                             f"got {self.num_state_snapshots!r}")
        positive("max_num_batched_tokens", allow_none=True)
        positive("max_image_tokens", allow_none=True)
        check_schedule(self.schedule_mode, self.schedule_policy)
        if (not isinstance(self.max_wait_steps, int) or isinstance(self.max_wait_steps, bool)
                or self.max_wait_steps < 0):
            raise ValueError(
                f"max_wait_steps: must be an integer >= 0, got {self.max_wait_steps!r}")
        positive("max_seq_len", allow_none=True)
        if self.dtype != "auto" and self.dtype not in DTYPES:
            raise ValueError(f"dtype: {self.dtype!r} is not one of auto, {', '.join(DTYPES)}")
        if self.quantization is not None and self.quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization: {self.quantization!r} is not one of "
                             f"{', '.join(QUANTIZATIONS)}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype: {self.kv_cache_dtype!r} is not one of "
                             f"{', '.join(KV_CACHE_DTYPES)}")
        if self.cache not in PREFIX_CACHES:
            raise ValueError(f"cache: {self.cache!r} is not one of "
                             f"{', '.join(sorted(PREFIX_CACHES))}")
        check_backend_name(self.attn)
        if self.moe_backend != "auto" and self.moe_backend not in MOE_BACKENDS:
            raise ValueError(f"moe_backend: {self.moe_backend!r} is not one of auto, "
                             f"{', '.join(MOE_BACKENDS.names)}")
        if (self.linear_attn_backend != "auto"
                and self.linear_attn_backend not in LINEAR_ATTN_BACKENDS):
            raise ValueError(f"linear_attn_backend: {self.linear_attn_backend!r} is not one of "
                             f"auto, {', '.join(LINEAR_ATTN_BACKENDS.names)}")
        if self.mamba_ssm_dtype not in ("auto", *STATE_DTYPES):
            raise ValueError(f"mamba_ssm_dtype: {self.mamba_ssm_dtype!r} is not one of auto, "
                             f"{', '.join(STATE_DTYPES)}")
        if self.warmup not in WARMUP_MODES:
            raise ValueError(f"warmup: {self.warmup!r} is not one of {', '.join(WARMUP_MODES)}")
        if not isinstance(self.cuda_graph_max_bs, int) or self.cuda_graph_max_bs < 0:
            raise ValueError("cuda_graph_max_bs: must be an integer >= 0, "
                             f"got {self.cuda_graph_max_bs!r}")
        if any(not isinstance(bs, int) or isinstance(bs, bool)
               or not 0 < bs <= self.cuda_graph_max_bs for bs in self.cuda_graph_bs):
            raise ValueError(f"cuda_graph_bs: batch sizes from 1 to cuda_graph_max_bs "
                             f"({self.cuda_graph_max_bs}), got {list(self.cuda_graph_bs)}")
        if (not isinstance(self.piecewise_cuda_graph_max_tokens, int)
                or self.piecewise_cuda_graph_max_tokens < 0):
            raise ValueError("piecewise_cuda_graph_max_tokens: must be an integer >= 0, got "
                             f"{self.piecewise_cuda_graph_max_tokens!r}")
        if any(not isinstance(n, int) or isinstance(n, bool)
               or not 0 < n <= self.piecewise_cuda_graph_max_tokens
               for n in self.piecewise_cuda_graph_tokens):
            raise ValueError("piecewise_cuda_graph_tokens: token counts from 1 to "
                             f"piecewise_cuda_graph_max_tokens "
                             f"({self.piecewise_cuda_graph_max_tokens}), got "
                             f"{list(self.piecewise_cuda_graph_tokens)}")
        if not 0 < self.mem_fraction <= 1:
            raise ValueError(f"mem_fraction: must be in (0, 1], got {self.mem_fraction}")
        if not self.kv_cache_memory_gb > 0:
            raise ValueError(f"kv_cache_memory_gb: must be > 0, got {self.kv_cache_memory_gb}")
        check_sliding_pool_ratio(self.sliding_pool_ratio)
        device = resolve_device(self.device)
        if self.sampler not in _SAMPLERS:
            raise ValueError(f"sampler: {self.sampler!r} is not one of {', '.join(_SAMPLERS)}")
        if self.sampler in ("triton", "triton-row") and device.type != "cuda":
            raise ValueError(f"sampler: {self.sampler!r} runs Triton kernels, which need a CUDA "
                             "device (CPU samples with the torch reference: auto or torch)")
        if not isinstance(self.disable_pdl, bool):
            raise ValueError(f"disable_pdl: must be a boolean, got {self.disable_pdl!r}")
        self.spec_config()  # a bad speculative setting fails here, naming its field

    def spec_config(self) -> SpecConfig | None:
        """The speculative-decoding config from either spelling (not both)."""
        sglang = from_sglang_flags(self.speculative_algorithm, self.speculative_num_draft_tokens,
                                   self.speculative_ngram_min_match_window_size,
                                   self.speculative_ngram_max_match_window_size,
                                   self.speculative_draft_model_path)
        if sglang is not None and self.speculative_config:
            raise ValueError("speculative_config: give it or --speculative-algorithm, not both")
        return parse_speculative_config(sglang if sglang is not None else self.speculative_config)

    def tokenizer_cache_dir(self) -> str | None:
        """Where the class ``AutoTokenizer`` chose for the tokenizer is kept
        (``utils/tokenizer_class.py``): the kernel cache, where the warm-up uses one (a GPU), as
        the grammar tables are; else None."""
        if self.warmup == "off" or resolve_device(self.device).type != "cuda":
            return None
        return self.cache_dir or kernel_cache_root()

    def default_batched_tokens(self, device: torch.device, online: bool,
                               model_path: str | None = None) -> int:
        """``max_num_batched_tokens`` when none is given. Offline nobody watches a stream, so a
        step may be as large as a prefill (throughput). A server keeps steps short enough that a
        running stream never pauses for long: on a GPU a budget sized by the model's compute and
        kept within the piecewise CUDA graphs (``step_budget``: 640 tokens for an 8B model, 4096
        for a 0.6B one), on CPU 256 tokens (the default model takes about half a second for them
        on two cores)."""
        if not online:
            return self.max_prefill_tokens
        if device.type != "cuda":
            return min(self.max_prefill_tokens, 256)
        from .step_budget import gpu_step_budget

        return gpu_step_budget(model_path, self.max_prefill_tokens,
                               self.piecewise_cuda_graph_max_tokens)

    def scheduler_config(self, model_path: str, eos_token_ids: tuple[int, ...],
                         online: bool = False) -> SchedulerConfig:
        """``online``: for a server (the default step budget keeps streams smooth)."""
        device = resolve_device(self.device)
        batched = (self.max_num_batched_tokens
                   or self.default_batched_tokens(device, online, model_path))
        mixed = self.schedule_mode == "mixed"
        warm = self.warmup == "on" or (self.warmup == "auto" and device.type == "cuda")
        spec = self.spec_config()
        if spec is not None and spec.method == "eagle3":  # a bad draft fails here, not in a rank
            from minisgl.models.eagle3_config import read_config

            read_config(spec.model, ModelConfig.from_path(model_path))
        engine = EngineConfig(
            model_path=model_path,
            device=device,
            dtype=resolve_dtype(self.dtype, model_path, device),
            quantization=self.quantization,
            kv_cache_dtype=torch.float8_e4m3fn if self.kv_cache_dtype == "fp8_e4m3" else None,
            page_size=self.page_size,
            num_pages=self.num_pages,
            kv_cache_memory_gb=self.kv_cache_memory_gb,
            mem_fraction=self.mem_fraction,
            max_running_reqs=self.max_running_requests,
            num_state_snapshots=0 if self.cache == "naive" else self.num_state_snapshots,
            # hybrid models: state slots for each verifying request's draft positions
            spec_state_groups=(min(spec.hybrid_verify_requests, spec.disable_by_batch_size,
                                   self.max_running_requests) if spec else 0),
            spec_group_size=spec.num_speculative_tokens + 1 if spec else 0,
            mtp=spec is not None and spec.method == "mtp",
            draft_model_path=spec.model if spec is not None else None,
            sliding_pool_ratio=check_sliding_pool_ratio(self.sliding_pool_ratio),
            max_seq_len=self.max_seq_len,
            attention_backend=resolve_attention_backend(self.attn, device),
            moe_backend=resolve_moe_backend(self.moe_backend, device),
            linear_attn_backend=resolve_linear_attn_backend(self.linear_attn_backend, device),
            state_dtype=resolve_state_dtype(self.mamba_ssm_dtype, model_path),
            cuda_graph_max_bs=self.cuda_graph_max_bs if device.type == "cuda" else 0,
            cuda_graph_sizes=tuple(self.cuda_graph_bs),
            piecewise_cuda_graph_max_tokens=(self.piecewise_cuda_graph_max_tokens
                                             if device.type == "cuda" else 0),
            piecewise_cuda_graph_sizes=tuple(self.piecewise_cuda_graph_tokens),
            max_forward_tokens=max(batched if mixed else self.max_prefill_tokens,
                                   self.max_running_requests),
            max_image_tokens=self.max_image_tokens,
            dummy_weights=self.dummy_weights,
            seed=self.seed,
            sampler=("triton" if device.type == "cuda" else "torch") if self.sampler == "auto"
            else self.sampler,
            pad_tokens=self.pad_tokens,
            pdl=not self.disable_pdl,
            gemv=not self.disable_gemv,
            norm_gemv=not self.disable_norm_gemv,
            norm_quant=not self.disable_norm_quant,
            precompile=warm and device.type == "cuda",
            kernel_cache_dir=self.cache_dir or KERNEL_CACHE_DIR.get() or None,
        )
        return SchedulerConfig(
            engine=engine,
            max_prefill_tokens=self.max_prefill_tokens,
            cache=self.cache,
            eos_token_ids=eos_token_ids,
            overlap=not self.disable_overlap,
            schedule_mode=self.schedule_mode,
            max_num_batched_tokens=batched,
            schedule_policy=self.schedule_policy,
            max_wait_steps=self.max_wait_steps,
            prefill_yield=not self.disable_prefill_yield,
            warmup=warm,
            spec=spec,
        )
