"""The server's command line: a flag per field of ``ServerConfig`` and ``EngineOptions`` (defaults
come from the dataclasses), plus the aliases of ``cli_aliases.py``."""

from __future__ import annotations

import argparse
import dataclasses
import typing

from minisgl.attention import ATTN_BACKENDS
from minisgl.env import API_KEY, LOG_LEVEL
from minisgl.kvcache import PREFIX_CACHES
from minisgl.llm.config import EngineOptions
from minisgl.multimodal.config import parse_mm_limit
from minisgl.server.config import ROUTER_POLICIES, ServerConfig
from minisgl.server.launch.cli_aliases import (
    ALIASES,
    ALWAYS_ON,
    DTYPE_NAMES,
    add_translated_aliases,
    parse_known_flags,
    speculative_steps,
)
from minisgl.server.openai.options import check_options
from minisgl.utils import init_logger

logger = init_logger(__name__)

_HELP = {
    "model": "HF directory, Hugging Face repo id or .gguf file (default: SmolLM2-135M-Instruct)",
    "tokenizer": "tokenizer directory or Hugging Face repo id, if not the model's",
    "revision": "branch, tag or commit of a Hugging Face repo id (model, and tokenizer if given)",
    "chat_template": "Jinja chat template replacing the tokenizer's: a file, or the template text",
    "host": "address to bind (127.0.0.1 keeps the server local)",
    "port": "HTTP port (0: any free port, logged at start-up)",
    "served_model_name": "the model name clients use (default: --model)",
    "tp": "tensor-parallel size: one scheduler process per rank (GPU), over all nodes",
    "nnodes": "machines the TP group spans (--tp is split evenly over them)",
    "node_rank": "this machine's index; node 0 serves HTTP, the others only run scheduler ranks",
    "dist_init_addr": "host:port of the TP group's rendezvous on node 0, the same on every node "
                      "(default: a free local port; required with --nnodes > 1)",
    "dp": "data-parallel replicas: whole servers (--tp GPUs each) behind SGLang Model Gateway "
          "on --host:--port, replica i on 127.0.0.1:--port+1+i (needs minisgl[router])",
    "router_policy": "--dp: how the router picks a replica: "
                     f"{', '.join(ROUTER_POLICIES)} (default: cache_aware, the replica whose "
                     "cache holds the longest prefix unless it is much busier)",
    "num_tokenizer": "extra tokenizer processes (0: the detokenizer process also tokenizes)",
    "max_queued_requests": "requests allowed to wait beyond the running ones; more get HTTP 503",
    "api_key": "require 'Authorization: Bearer KEY' (HTTP 401 otherwise); prefer the "
               f"{API_KEY.name} environment variable: a flag is visible to every local user (ps)",
    "ssl_keyfile": "TLS private key file (serve HTTPS; needs --ssl-certfile)",
    "ssl_certfile": "TLS certificate file (serve HTTPS; needs --ssl-keyfile)",
    "allowed_origins": "CORS: origins whose browser pages may call the API ('*': any; default: "
                       "none)",
    "max_body_bytes": "largest accepted request body",
    "shutdown_timeout": "seconds to drain in-flight requests on SIGTERM/SIGINT",
    "log_stats_interval": "seconds between the scheduler's throughput log lines (0: off)",
    "watchdog_timeout": "seconds one scheduler step may take before the scheduler prints its "
                        "stacks and exits, failing the requests in flight (0: off)",
    "log_level": "debug, info, warning or error, for every process (default: "
                 f"{LOG_LEVEL.name}, else info)",
    "log_requests": "put each request's prompt in its log line (default: only token counts and "
                    "times)",
    "shell": "chat in the terminal instead of serving HTTP",
    "reasoning_parser": "split <think>...</think> into reasoning_content: auto (when the chat "
                        "template uses <think>, or Gemma 4's thought channel), none, qwen3, "
                        "gemma4 (<|channel>thought...<channel|>), deepseek-r1 (the output "
                        "starts inside the reasoning)",
    "tool_call_parser": "format of the model's tool calls: auto (from the chat template), "
                        "hermes, qwen3_xml, llama3, mistral, gemma4, gemma3 (tool_code blocks) "
                        "or json",
    "reject_unsupported_tools": "/v1/responses: answer 400 to a request offering a built-in tool "
                                "the server cannot run (web_search, file_search, ...; default: "
                                "leave it out and say so in the response's dropped_tools)",
    "clamp_max_tokens": "cut a request's max_tokens to what the context leaves after its prompt "
                        "(default: a prompt plus max_tokens beyond the context is a 400)",
    "default_max_tokens": "output limit of a chat or /v1/responses request that sets none "
                          "(default: what the context leaves after the prompt, as OpenAI and "
                          "vLLM; completions keep 16, /generate 128)",
    "generation_config": "sampling defaults for requests that omit them: auto (the model's "
                         "generation_config.json, as vLLM), none (temperature 1, no top-p/top-k) "
                         "or a directory holding a generation_config.json",
    "allowed_media_domains": "hosts whose http(s) image URLs are fetched ('*': any; default: "
                             "none, images come as data URLs)",
    "allow_private_media": "also fetch image URLs whose host resolves to a private, loopback or "
                           "link-local address (default: refused, even for a listed host)",
    "media_fetch_timeout": "seconds one image URL may take to fetch",
    "max_image_bytes": "largest encoded image accepted (a data URL's or a fetched one)",
    "max_image_pixels": "largest image accepted, in width x height pixels (checked before "
                        "decoding)",
    "limit_mm_per_prompt": "images one request may carry: a number, or vLLM's JSON "
                           "'{\"image\": N}'",
    "max_image_tokens": "vision-language models: the most tokens one image may take (a larger "
                        "one is a 400) and one vision-tower call encodes; the KV pool is sized "
                        "after reserving such a call's activations (default: the largest image "
                        "the processor makes: Qwen3.5/3.6 16384, Gemma 3 256, Gemma 4 1120)",
    "device": "cpu, cuda, cuda:N or auto",
    "dtype": "auto, float32, bfloat16 or float16 (also: half, fp16, bf16, float, fp32)",
    "quantization": "quantize a bf16/fp16 checkpoint's weights to FP8 (e4m3) at load: fp8 (one "
                    "scale per output channel; MoE experts 128x128 blocks) or fp8-block (128x128 "
                    "blocks, the FP8 checkpoints' format); FP8 checkpoints are detected from their "
                    "config (default: none)",
    "kv_cache_dtype": "auto (the model's dtype) or fp8_e4m3 (half the KV bytes; per-layer scales "
                      "from the checkpoint, else 1.0)",
    "page_size": "tokens per KV page",
    "cache": f"prefix cache: {', '.join(sorted(PREFIX_CACHES))}",
    "max_prefill_tokens": "prefill tokens of one forward at most (longer prompts are chunked)",
    "schedule_mode": "mixed: each step carries every running request's decode token plus prefill "
                     "chunks within --max-num-batched-tokens; prefill-first: prefill steps pause "
                     "the running streams (ablation)",
    "max_num_batched_tokens": "mixed: tokens of one step, decode tokens included (default on CUDA: "
                              "sized by the model's compute within the piecewise CUDA graphs, 640 "
                              "for Qwen3-8B, 4096 for Qwen3-0.6B; 256 on CPU; at most "
                              "--max-prefill-tokens)",
    "schedule_policy": "admission order: lpm (longest cached prefix first) or fcfs",
    "max_wait_steps": "lpm: a request that waited this many steps is admitted first, in "
                      "arrival order",
    "disable_prefill_yield": "a prompt fed in chunks takes the whole prefill budget even with a "
                             "shorter prompt waiting behind it (ablation)",
    "num_pages": "KV pages (default: sized from memory)",
    "kv_cache_memory_gb": "KV cache budget on CPU, in GiB",
    "mem_fraction": "fraction of GPU memory the server may use",
    "max_running_requests": "requests decoded together at most",
    "num_state_snapshots": "hybrid (Gated DeltaNet) models: recurrent-state snapshots the radix "
                           "cache keeps for prefix hits (default: a quarter of "
                           "--max-running-requests; 0 turns prefix sharing off for them)",
    "sliding_pool_ratio": "sliding-window models (Gemma 3/4, gpt-oss): the sliding layers' own KV "
                          "pool, whose pages past the window go back as requests grow (more "
                          "long requests fit; a prefix hit resumes only where the window's KV "
                          "is still held). auto: sized for every running request's window and "
                          "a forward, and on when that saves at least a quarter of the KV "
                          "memory; a number: this many tokens per token of the full-attention "
                          "layers; 0: one pool for all layers (default: auto)",
    "max_seq_len": "longest sequence, prompt and output (default: the model's)",
    "attn": f"attention backend: auto, {', '.join(ATTN_BACKENDS.names)}, or PREFILL,DECODE",
    "dummy_weights": "random weights (benchmarks without a checkpoint)",
    "moe_backend": "MoE backend: auto, torch, triton, triton_fragments (triton with MXFP4 "
                   "experts in the fragment layout), triton_fragments_gluon (its small batches "
                   "on a Gluon kernel; experimental), triton_kernels (OpenAI's MXFP4 GEMMs, "
                   "Hopper) or flashinfer (FlashInfer's CUTLASS MXFP4 MoE, Hopper)",
    "linear_attn_backend": "hybrid (Gated DeltaNet) models: auto, torch (the reference) or triton "
                           "(CUDA: in-place state kernels and fla-core's chunked rule)",
    "mamba_ssm_dtype": "hybrid models: the recurrent (delta-rule) state's dtype: auto (the "
                       "checkpoint's mamba_ssm_dtype, else float32), float32 or bfloat16 (half "
                       "the state bytes each decode step moves)",
    "disable_overlap": "read every forward back before launching the next (ablation)",
    "speculative_config": "speculative decoding, vLLM's JSON: {\"method\": \"ngram\", "
                          "\"suffix\", \"mtp\" or \"eagle3\", \"num_speculative_tokens\": 4, "
                          "\"prompt_lookup_max\": "
                          "5, \"prompt_lookup_min\": 2, \"disable_by_batch_size\": 16, ...}; "
                          "eagle3 also \"model\": the EAGLE-3 draft's directory",
    "speculative_algorithm": "speculative decoding, SGLang's spelling: NGRAM, SUFFIX, NEXTN "
                             "(MTP) or EAGLE3",
    "speculative_draft_model_path": "EAGLE3: the EAGLE-3 draft checkpoint's directory "
                                    "(LlamaForCausalLMEagle3)",
    "speculative_num_draft_tokens": "with --speculative-algorithm: tokens verified per step, "
                                    "the last accepted one included (N - 1 drafts)",
    "speculative_ngram_min_match_window_size": "NGRAM: the shortest n-gram matched",
    "speculative_ngram_max_match_window_size": "NGRAM: the longest n-gram matched",
    "disable_gemv": "one-token unquantized linear layers on CUDA through cuBLAS, not the Triton "
                    "GEMV (ablation)",
    "disable_norm_gemv": "--quantization fp8, one token: run the RMSNorm kernels instead of "
                         "normalising inside the FP8 GEMVs (ablation)",
    "disable_norm_quant": "--quantization fp8, batches: quantize the QKV and gate-up inputs in a "
                          "kernel of their own, not in the RMSNorm (ablation)",
    "cuda_graph_max_bs": "decode batches up to this size replay CUDA graphs (0: off; GPU only)",
    "cuda_graph_bs": "the decode batch sizes to capture (default: 1 2 4 8 and multiples of 16 up "
                     "to --cuda-graph-max-bs); a batch replays the smallest that holds it. Only "
                     "16 32 ...: every step of up to 16 rows runs the same kernels, so greedy "
                     "tokens with speculation equal those without it in bf16 too",
    "piecewise_cuda_graph_max_tokens": "prefill and mixed forwards of up to this many tokens "
                                       "replay CUDA graphs of all but attention (0: off; GPU "
                                       "only)",
    "piecewise_cuda_graph_tokens": "the token counts those graphs are captured for (default: "
                                   "multiples of 64 up to 1024, of 128 up to 2048, of 256 "
                                   "beyond, and the largest); a forward pads to the smallest "
                                   "that holds it",
    "seed": "seed of the sampling of requests that give none",
    "sampler": "auto (the Triton kernels on CUDA, the torch reference on CPU), torch (the "
               "reference on CUDA too) or triton-row (the one-program-per-row kernel alone, "
               "without the split-row path); for ablations",
    "pad_tokens": "eager prefill and mixed forwards on CUDA run a token count rounded up to a "
                  "multiple of this (1: no padding, for ablations): cuBLAS picks a GEMM algorithm "
                  "on the host for every new shape",
    "disable_pdl": "launch the Triton kernels without programmatic dependent launch (Hopper and "
                   "later; for ablations)",
    "cache_dir": "the kernel cache: compiled kernels and the variants each configuration needs, "
                 "per GPU and versions, one directory to carry (fill it with `python -m minisgl "
                 "warmup`; default: $MINISGL_KERNEL_CACHE_DIR, else ~/.cache/minisgl/kernels)",
    "warmup": "run every kernel variant a request can reach before /health reports ready: "
              "auto (on CUDA), on, off (the first requests of each kind then compile kernels on "
              "the request path)",
}


def _auto_or_float(text: str) -> str | float:
    if text == "auto":
        return text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give auto or a number") from None


# flags whose text is not their field's type
_PARSERS = {"limit_mm_per_prompt": parse_mm_limit, "sliding_pool_ratio": _auto_or_float}


def _value_type(annotation) -> type:
    """``int | None`` -> int: the type argparse converts a flag's text to."""
    kinds = [t for t in typing.get_args(annotation) if t is not type(None)] or [annotation]
    return kinds[0]


def _add(parser: argparse.ArgumentParser, f: dataclasses.Field, annotation) -> None:
    flags = ["--" + f.name.replace("_", "-"), *ALIASES.get(f.name, ())]
    if annotation is bool:
        parser.add_argument(*flags, action="store_true", default=f.default, help=_HELP[f.name])
        return
    help_text = _HELP[f.name]
    if "default" not in help_text:
        help_text += f" (default: {f.default})"
    many = {"nargs": "+"} if typing.get_origin(annotation) is tuple else {}
    kind = _PARSERS.get(f.name, _value_type(annotation))
    parser.add_argument(*flags, type=kind, default=f.default, help=help_text, **many)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m minisgl", description="minisgl: an OpenAI-compatible LLM server."
    )
    hints = typing.get_type_hints(ServerConfig)
    for f in dataclasses.fields(ServerConfig):
        if f.name != "engine":
            _add(parser, f, hints[f.name])
    group = parser.add_argument_group("engine")
    hints = typing.get_type_hints(EngineOptions)
    for f in dataclasses.fields(EngineOptions):
        _add(group, f, hints[f.name])
    add_translated_aliases(parser)
    return parser


def parse_args(argv: list[str] | None = None) -> ServerConfig:
    ns = vars(parse_known_flags(build_parser(), argv))
    for flag in ns.pop("always_on", ()):
        logger.info("%s: accepted; %s", flag, ALWAYS_ON[flag])
    speculative_steps(ns)
    ns["dtype"] = DTYPE_NAMES.get(ns["dtype"], ns["dtype"])
    ns["api_key"] = ns["api_key"] or API_KEY.get() or None
    for name in ("allowed_origins", "allowed_media_domains"):
        ns[name] = tuple(o for arg in ns[name] for o in arg.split(",") if o)
    engine_names = {f.name for f in dataclasses.fields(EngineOptions)}
    engine = EngineOptions(**{k: v for k, v in ns.items() if k in engine_names})
    config = ServerConfig(engine=engine, **{k: v for k, v in ns.items() if k not in engine_names})
    check_options(config)
    warn_unused(engine)
    return config


# engine options that one kind of device reads: set for the other, they change nothing
DEVICE_ONLY = {
    "mem_fraction": ("cuda", "--mem-fraction (--gpu-memory-utilization)",
                     "the CPU's KV pool is sized by --kv-cache-memory-gb or --num-pages"),
    "kv_cache_memory_gb": ("cpu", "--kv-cache-memory-gb",
                           "a GPU's KV pool is sized by --mem-fraction or --num-pages"),
    "cuda_graph_max_bs": ("cuda", "--cuda-graph-max-bs", "no CUDA graphs on a CPU"),
    "cuda_graph_bs": ("cuda", "--cuda-graph-bs", "no CUDA graphs on a CPU"),
    "piecewise_cuda_graph_max_tokens": ("cuda", "--piecewise-cuda-graph-max-tokens",
                                        "no CUDA graphs on a CPU"),
    "piecewise_cuda_graph_tokens": ("cuda", "--piecewise-cuda-graph-tokens",
                                    "no CUDA graphs on a CPU"),
    "disable_pdl": ("cuda", "--disable-pdl", "a CPU runs no Triton kernels"),
    "disable_gemv": ("cuda", "--disable-gemv", "a CPU runs no Triton kernels"),
}


def warn_unused(engine: EngineOptions) -> None:
    """Say at start-up which given options the device will not read (as the flags that are
    always on say they are accepted)."""
    import torch

    cuda = engine.device.startswith("cuda") or (engine.device == "auto"
                                                 and torch.cuda.is_available())
    defaults = {f.name: f.default for f in dataclasses.fields(EngineOptions)}
    for name, (device, flag, why) in DEVICE_ONLY.items():
        if getattr(engine, name) != defaults[name] and device != ("cuda" if cuda else "cpu"):
            logger.warning("%s: no effect on this device (%s)", flag, why)

