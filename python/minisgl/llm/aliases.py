"""vLLM's and SGLang's names of minisgl's options: one table for the server's flags
(``server/launch/cli_aliases.py``: ``--max-model-len``) and the offline ``LLM``'s keywords
(``llm_keywords``: ``LLM(max_model_len=...)``), so that code or a command line copied from either
engine works.

A name that means exactly one of ours is a second name of it (``ALIASES``); a name whose values
need translating sets our option through a converter (``attention_backend="FLASHINFER"`` is
``attn="fi"``); a name for what minisgl always does is accepted and changes nothing
(``ALWAYS_ON``); a name whose meaning differs, or that has no counterpart, is refused with what to
use instead (``DIFFERENT``).
"""

from __future__ import annotations

import difflib
import re
from typing import Any

from minisgl.utils import init_logger

logger = init_logger(__name__)

ALIASES: dict[str, tuple[str, ...]] = {
    "model": ("--model-path",),
    "tp": ("--tensor-parallel-size", "--tp-size"),
    "dp": ("--data-parallel-size", "--dp-size"),
    "max_seq_len": ("--max-model-len", "--context-length"),
    "mem_fraction": ("--gpu-memory-utilization", "--mem-fraction-static"),
    "max_running_requests": ("--max-num-seqs",),
    "max_prefill_tokens": ("--chunked-prefill-size",),
    "page_size": ("--block-size",),
    "mamba_ssm_dtype": ("--mamba-ssm-cache-dtype",),
    "sliding_pool_ratio": ("--swa-full-tokens-ratio",),  # SGLang's: sliding tokens per full one
}

# vLLM's and PyTorch's short dtype names
DTYPE_NAMES = {"half": "float16", "fp16": "float16", "bf16": "bfloat16", "float": "float32",
               "fp32": "float32"}
# what minisgl always does: accepted, and it changes nothing
ALWAYS_ON: dict[str, str] = {
    "--enable-prefix-caching": "prefix caching is on by default (--cache radix)",
    "--enable-auto-tool-choice": "tool calls are always parsed (--tool-call-parser picks the "
                                 "format)",
    "--trust-remote-code": "minisgl runs its own model code for every model it supports; no "
                           "checkpoint code is ever run",
}

DIFFERENT: dict[str, str] = {
    "--max-total-tokens": "the KV pool is sized in pages: use --num-pages (of --page-size tokens "
                          "each), or --mem-fraction / --kv-cache-memory-gb",
    "--disable-log-requests": "minisgl logs one line per request at INFO: use --log-level warning "
                              "to silence it (prompt texts are logged only with --log-requests)",
    "--disable-log-stats": "use --log-stats-interval 0",
    "--uvicorn-log-level": "use --log-level (it applies to every process)",
    "--tokenizer-path": "use --tokenizer",
    "--pipeline-parallel-size": "minisgl has no pipeline parallelism: use --tp",
    "--pp-size": "minisgl has no pipeline parallelism: use --tp",
    "--swap-space": "minisgl does not swap KV to the host: requests are retracted and re-run",
    "--served-model": "use --served-model-name",
    "--override-generation-config": "sampling defaults come from --generation-config (auto, "
                                    "none or a directory); the default output limit (vLLM's "
                                    "max_new_tokens there) is --default-max-tokens",
    "--load-format": "use --dummy-weights for random weights; checkpoints are detected by their "
                     "files",
}

# vLLM's backend names are upper case; SGLang's are lower case
_ATTN_NAMES = {
    "triton": "triton", "triton_attn": "triton", "flashinfer": "fi", "fa": "fa", "fa3": "fa",
    "flash_attn": "fa", "torch_native": "torch", "torch_sdpa": "torch", "torch": "torch",
    "trtllm_mha": "trtllm", "trtllm": "trtllm", "fi": "fi",
}


def attention_backend(value: str) -> str:
    """vLLM's or SGLang's ``attention_backend`` as our ``attn``; ``ValueError`` for a backend
    this minisgl does not have."""
    from minisgl.attention import ATTN_BACKENDS, REFUSED

    names = [_ATTN_NAMES.get(part.strip().lower()) for part in value.split(",")]
    for name in names:
        if name in REFUSED:
            raise ValueError(f"{value!r}: {REFUSED[name]}")
    if not value or any(name not in ATTN_BACKENDS for name in names):
        raise ValueError(f"{value!r} is not a backend this minisgl has: use --attn with auto, "
                         f"{', '.join(ATTN_BACKENDS.names)} (or PREFILL,DECODE)")
    return ",".join(names)  # type: ignore[arg-type]


def keyword(flag: str) -> str:
    """``--max-model-len`` -> ``max_model_len``."""
    return flag.lstrip("-").replace("-", "_")


# LLM() keywords: the aliases, and what the offline engine makes of the rest
_KEYWORDS = {keyword(flag): ours for ours, flags in ALIASES.items() for flag in flags}
_OFFLINE_DIFFERENT = {
    **{keyword(flag): why for flag, why in DIFFERENT.items()},
    "dp": "LLM() runs one replica; data parallelism is the server's --dp",
    "enable_auto_tool_choice": "tool calls are the server's: LLM.chat(tools=...) renders them "
                               "into the prompt, the caller parses the answer",
}
_NO_GRAPHS = {"cuda_graph_max_bs": 0, "piecewise_cuda_graph_max_tokens": 0}


def llm_keywords(options: dict[str, Any], valid: set[str]) -> dict[str, Any]:
    """``LLM()``'s keywords as our option names (``valid``: those ``LLM`` takes): vLLM's and
    SGLang's names are translated, refused with the reason where minisgl differs, and an unknown
    one is a ``TypeError`` with the closest names."""
    out: dict[str, Any] = {}

    def put(name: str, value: Any, given: str) -> None:
        if name in out:
            raise TypeError(f"LLM(): {given} sets {name}, which another keyword already set; "
                            "give one of them")
        out[name] = value

    for given, value in options.items():
        name = _KEYWORDS.get(given, given)
        if name in _OFFLINE_DIFFERENT:
            raise TypeError(f"LLM(): {given}: {_as_keywords(_OFFLINE_DIFFERENT[name], valid)}")
        if name in ("enable_prefix_caching", "disable_radix_cache"):
            if bool(value) == (name == "disable_radix_cache"):
                put("cache", "naive", given)
        elif name == "disable_hybrid_swa_memory":  # SGLang's: one pool for every layer
            if value:
                put("sliding_pool_ratio", 0, given)
        elif name == "trust_remote_code":
            if value:
                logger.info("trust_remote_code: accepted; %s", ALWAYS_ON["--trust-remote-code"])
        elif name in ("enforce_eager", "disable_cuda_graph"):
            for key, off in _NO_GRAPHS.items():
                if value:
                    put(key, off, given)
        elif name == "attention_backend":
            try:
                put("attn", attention_backend(value), given)
            except ValueError as e:
                raise ValueError(f"{given}: {_as_keywords(str(e), valid)}") from None
        elif name == "dtype" and not isinstance(value, (str, type(None))):
            put(name, str(value).removeprefix("torch."), given)  # torch.bfloat16, as vLLM takes
        elif name in valid:
            put(name, DTYPE_NAMES.get(value, value) if name == "dtype" else value, given)
        else:
            raise TypeError(f"LLM() got an unexpected keyword argument {given!r}"
                            + _did_you_mean(given, valid))
    return out


def _as_keywords(reason: str, valid: set[str]) -> str:
    """A reason written for the command line, with the flags ``LLM`` takes as its keywords."""
    return re.sub(r"--[a-z][a-z-]*", lambda m: keyword(m[0]) if keyword(m[0]) in valid else m[0],
                  reason)


def _did_you_mean(name: str, valid: set[str]) -> str:
    known = valid | set(_KEYWORDS) | {"enable_prefix_caching", "trust_remote_code",
                                      "enforce_eager", "attention_backend",
                                      "disable_hybrid_swa_memory"}
    close = difflib.get_close_matches(name, sorted(known), n=3, cutoff=0.6)
    if close:
        return f" (did you mean {' or '.join(repr(c) for c in close)}?)"
    return " (its options: docs/features.md, the fields of minisgl.llm.EngineOptions)"
