"""Qwen3.5-MoE and Qwen3.6 (``Qwen3_5MoeForConditionalGeneration``): the Qwen3.5 decoder whose
MLPs are routed experts plus a shared expert scaled by its sigmoid gate (``SharedExpertMoE``);
which layers are sparse comes from the config (``ModelConfig.is_sparse_layer``)."""

from __future__ import annotations

from .qwen3_5 import Qwen3_5ForConditionalGeneration


class Qwen3_5MoeForConditionalGeneration(Qwen3_5ForConditionalGeneration):
    pass
