"""The context window: ``--max-model-len`` against the model's ``max_position_embeddings`` and
against the KV pool.

A longer window than the model was trained for is an explicit opt-in
(``MINISGL_ALLOW_LONG_MAX_MODEL_LEN=1``, as vLLM's ``VLLM_ALLOW_LONG_MAX_MODEL_LEN``) and is
logged as a warning; without it the request is an error, never silently capped. With the opt-in
the rotary tables extend to the window: the positions beyond the trained ones are computed the same
way, with whatever quality the model has there.

The window is also what one request can hold in the KV pool: a ``--max-model-len`` the pool cannot
hold is a start-up error naming the flags that make room, not a window silently cut to the pool
(an agent told 32k that meets 23k fails at once); when no window was asked for, a pool shorter
than the model's length sets the window, and the log says so and how to lift it.
"""

from __future__ import annotations

import dataclasses

from minisgl.env import ALLOW_LONG_MAX_MODEL_LEN
from minisgl.models.config import ModelConfig
from minisgl.utils import init_logger

logger = init_logger(__name__)


def window(mc: ModelConfig, max_seq_len: int | None) -> ModelConfig:
    """``mc``, with its positions extended to ``max_seq_len`` when that is longer and allowed."""
    if max_seq_len is None or max_seq_len <= mc.max_position:
        return mc
    if ALLOW_LONG_MAX_MODEL_LEN.get() != "1":
        raise ValueError(
            f"max_seq_len: {max_seq_len} tokens exceeds the model's max_position_embeddings "
            f"({mc.max_position}); set {ALLOW_LONG_MAX_MODEL_LEN.name}=1 to allow it (the model "
            "was not trained on those positions)")
    logger.warning("the context window is %d tokens, longer than the %d positions the model was "
                   "trained on (%s=1): its output may degrade beyond them", max_seq_len,
                   mc.max_position, ALLOW_LONG_MAX_MODEL_LEN.name)
    rotary = dataclasses.replace(mc.rotary, max_position=max_seq_len)
    return dataclasses.replace(mc, max_position=max_seq_len, rotary=rotary)


def check_pool(asked: int | None, model_len: int, pool_tokens: int, page_size: int,
               bytes_per_token: float, on_cpu: bool) -> None:
    """``asked``: ``--max-model-len`` (None: the model's ``model_len``); ``pool_tokens``: what the
    KV pool holds for requests (its scratch page excluded)."""
    want = asked or model_len
    if pool_tokens >= want:
        return
    pages = -(-want // page_size) + 1  # + the scratch page
    gib = pages * page_size * bytes_per_token / (1 << 30)
    more = (f"--kv-cache-memory-gb {gib:.2f} or more" if on_cpu
            else "a higher --mem-fraction (--gpu-memory-utilization)")
    if asked is not None:
        raise ValueError(
            f"max_seq_len: a window of {asked} tokens (--max-model-len) does not fit the KV pool, "
            f"which holds {pool_tokens} tokens; give --num-pages {pages} or {more}, or a smaller "
            "--max-model-len")
    logger.warning("the context window is %d tokens, what the KV pool holds, not the model's %d: "
                   "--num-pages %d or %s lifts it", pool_tokens, model_len, pages, more)
