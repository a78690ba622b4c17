"""The context window: ``--max-model-len`` against the model's ``max_position_embeddings``.

A longer window than the model was trained for is an explicit opt-in
(``MINISGL_ALLOW_LONG_MAX_MODEL_LEN=1``, as vLLM's ``VLLM_ALLOW_LONG_MAX_MODEL_LEN``) and is
logged as a warning; without it the request is an error, never silently capped. With the opt-in
the rotary tables extend to the window: the positions beyond the trained ones are computed the same
way, with whatever quality the model has there.
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
