"""The environment variables minisgl reads. Everything else is a flag (``python -m minisgl --help``)
or an ``LLM`` option; these are the settings that must reach every process, including the ones the
server spawns, or that apply before any configuration is parsed."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class EnvVar:
    name: str
    default: str
    help: str

    def get(self) -> str:
        return os.environ.get(self.name) or self.default


CACHE_DIR = EnvVar("MINISGL_CACHE_DIR", "~/.cache/minisgl",
                   "where the default model is converted to and kept")
LOG_LEVEL = EnvVar("MINISGL_LOG_LEVEL", "INFO", "logging level of every minisgl process")
SAMPLER = EnvVar("MINISGL_SAMPLER", "auto", "torch: sample with the torch reference on CUDA too, "
                 "not the Triton kernels; triton-row: the one-program-per-row kernel alone, not "
                 "the split-row fast path (for ablations)")
API_KEY = EnvVar("MINISGL_API_KEY", "", "the API key when --api-key is not given (a flag is "
                 "visible to every local user through ps and /proc)")
GEMV = EnvVar("MINISGL_GEMV", "1", "0: one-token linear layers on CUDA use cuBLAS, not the Triton "
              "GEMV (for ablations)")
GRAMMAR_THREADS = EnvVar("MINISGL_GRAMMAR_THREADS", "auto", "threads that fill a batch's grammar "
                         "masks (auto: half the CPUs the scheduler may use, at most 8)")
PAD_TOKENS = EnvVar("MINISGL_PAD_TOKENS", "64", "eager forwards (prefill and mixed steps) on CUDA "
                   "run a token count rounded up to a multiple of this (1: none, for ablations): "
                   "cuBLAS picks a GEMM algorithm on the host for every new shape")

NORM_GEMV = EnvVar("MINISGL_NORM_GEMV", "1", "0: one-token decode of --quantization fp8 models "
                   "runs the RMSNorm kernels instead of normalising inside the FP8 GEMVs (for "
                   "ablations)")
NORM_QUANT = EnvVar("MINISGL_NORM_QUANT", "1", "0: batches of --quantization fp8 models quantize "
                    "the QKV and gate-up inputs in a kernel of their own, not in the RMSNorm "
                    "(for ablations)")
PDL = EnvVar("MINISGL_PDL", "1", "0: Triton kernels on Hopper and later launch without "
              "programmatic dependent launch (for ablations)")

FP8_GEMM = EnvVar("MINISGL_FP8_GEMM", "channel", "block: --quantization fp8 quantizes dense weights "
                  "into 128x128 blocks and runs the block-scaled Triton GEMM (the FP8 checkpoints' "
                  "format) instead of per-channel scales and torch._scaled_mm (for ablations)")

ALLOW_LONG_MAX_MODEL_LEN = EnvVar(
    "MINISGL_ALLOW_LONG_MAX_MODEL_LEN", "0", "1: --max-model-len may exceed the model's "
    "max_position_embeddings (positions the model was not trained on: its output may degrade); "
    "without it such a length is an error")


def set_process_defaults() -> None:
    """Settings of third-party libraries that minisgl's processes want unless the user chose:
    tokenizers' own thread pool off (the server runs tokenizers in processes of their own)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
