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
                   "where the default model is converted to and kept, and (as ``kernels/``) "
                   "the kernel cache unless MINISGL_KERNEL_CACHE_DIR or --cache-dir says "
                   "otherwise")
KERNEL_CACHE_DIR = EnvVar("MINISGL_KERNEL_CACHE_DIR", "", "the kernel cache when --cache-dir is "
                          "not given: compiled kernels and the variants each configuration "
                          "needs, per GPU and versions (default: $MINISGL_CACHE_DIR/kernels)")


def kernel_cache_root() -> str:
    """The kernel cache's directory (``minisgl.warmup.cache``) when no ``--cache-dir`` names one."""
    return os.path.expanduser(KERNEL_CACHE_DIR.get() or os.path.join(CACHE_DIR.get(), "kernels"))


LOG_LEVEL = EnvVar("MINISGL_LOG_LEVEL", "INFO", "logging level of every minisgl process")
API_KEY = EnvVar("MINISGL_API_KEY", "", "the API key when --api-key is not given (a flag is "
                 "visible to every local user through ps and /proc)")
GRAMMAR_THREADS = EnvVar("MINISGL_GRAMMAR_THREADS", "auto", "threads that fill a batch's grammar "
                         "masks (auto: half the CPUs the scheduler may use, at most 8)")

LAUNCHED_AT = EnvVar("MINISGL_LAUNCHED_AT", "", "the wall-clock time (seconds since the epoch) a "
                     "launch began, set by ``python -m minisgl`` for the processes it starts: "
                     "their start-up log lines count from it")

ALLOW_LONG_MAX_MODEL_LEN = EnvVar(
    "MINISGL_ALLOW_LONG_MAX_MODEL_LEN", "0", "1: --max-model-len may exceed the model's "
    "max_position_embeddings (positions the model was not trained on: its output may degrade); "
    "without it such a length is an error")


def set_process_defaults() -> None:
    """Settings of third-party libraries that minisgl's processes want unless the user chose:
    tokenizers' own thread pool off (the server runs tokenizers in processes of their own). The
    compiled kernels' directory is set by the process that compiles them
    (``minisgl.warmup.cache``)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
