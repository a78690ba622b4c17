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
                   "where the default model is converted to and kept, and (as ``triton/``) the "
                   "compiled kernels unless TRITON_CACHE_DIR says otherwise")
LOG_LEVEL = EnvVar("MINISGL_LOG_LEVEL", "INFO", "logging level of every minisgl process")
API_KEY = EnvVar("MINISGL_API_KEY", "", "the API key when --api-key is not given (a flag is "
                 "visible to every local user through ps and /proc)")
GRAMMAR_THREADS = EnvVar("MINISGL_GRAMMAR_THREADS", "auto", "threads that fill a batch's grammar "
                         "masks (auto: half the CPUs the scheduler may use, at most 8)")

ALLOW_LONG_MAX_MODEL_LEN = EnvVar(
    "MINISGL_ALLOW_LONG_MAX_MODEL_LEN", "0", "1: --max-model-len may exceed the model's "
    "max_position_embeddings (positions the model was not trained on: its output may degrade); "
    "without it such a length is an error")


def set_process_defaults() -> None:
    """Settings of third-party libraries that minisgl's processes want unless the user chose:
    tokenizers' own thread pool off (the server runs tokenizers in processes of their own), and
    the compiled kernels kept with minisgl's cache."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    use_kernel_cache()


def use_kernel_cache() -> None:
    """Triton keeps compiled kernels in ``$MINISGL_CACHE_DIR/triton`` unless ``TRITON_CACHE_DIR``
    is set: a restart on the same machine loads them instead of compiling again. Set before the
    first compile (Triton reads the variable when it compiles)."""
    root = os.path.expanduser(CACHE_DIR.get())
    os.environ.setdefault("TRITON_CACHE_DIR", os.path.join(root, "triton"))
