"""Qwen3.5 (``Qwen3_5ForConditionalGeneration``), and Qwen3.5-MoE and Qwen3.6
(``Qwen3_5MoeForConditionalGeneration``, the same class, ``registry.py``): the Qwen3-Next decoder
with separate linear-attention projections, served as a text model. Which layers' MLPs are routed
experts beside a shared expert (``SharedExpertMoE``) comes from the config
(``ModelConfig.is_sparse_layer``).

The checkpoint is a vision-language model: the text decoder's weights live under
``model.language_model.``, its config under ``text_config`` (``ModelConfig`` reads it). The
vision tower (``model.visual.``) is not loaded, and the MTP head (``mtp.``) only for the ``mtp``
speculative method; loading says so. Image inputs are not accepted (the tower is
``models/vision/qwen3_5_vit.py``, its positions ``multimodal/mrope.py``; the engine does not run
them yet). Rotary positions are the text positions of the checkpoints' mRoPE.
"""

from __future__ import annotations

import torch

from minisgl.distributed import DistributedCommunicator
from minisgl.layers.linear_attention import GatedDeltaNet, SplitColumnLinear

from .hybrid import HybridModel


class Qwen3_5GatedDeltaNet(GatedDeltaNet):
    """``in_proj_qkv`` (q | k | v over all heads) and ``in_proj_z`` load into one GEMM, parts
    ``[q, k, v, z]``; ``in_proj_b`` and ``in_proj_a`` into another, parts ``[b, a]``."""

    def __init__(self, cfg, hidden_size: int, eps: float, state_index: int,
                 comm: DistributedCommunicator, quant) -> None:
        super().__init__(cfg, hidden_size, eps, state_index, comm, quant)
        hv = cfg.num_value_heads
        parts = self.conv_parts + [cfg.value_size]
        self.in_proj_qkvz = SplitColumnLinear(hidden_size, parts, comm, quant)
        self.in_proj_ba = SplitColumnLinear(hidden_size, [hv, hv], comm)

    def project(self, x: torch.Tensor):
        t = x.shape[0]
        qkv, z = self.in_proj_qkvz(x).split([self.conv_dim, self.value_size], dim=-1)
        b, a = self.in_proj_ba(x).split([self.num_v_heads, self.num_v_heads], dim=-1)
        return qkv, z.reshape(t, self.num_v_heads, self.v_dim), b, a


class Qwen3_5ForConditionalGeneration(HybridModel):
    linear_cls = Qwen3_5GatedDeltaNet
    prefix = "model.language_model."
    skipped = {
        "model.visual.": "the vision tower (image and video inputs are not supported)",
        "mtp.": HybridModel.skipped["mtp."],
    }
    split_projs = {"in_proj_qkv": ("in_proj_qkvz", (0, 1, 2)), "in_proj_z": ("in_proj_qkvz", (3,)),
                   "in_proj_b": ("in_proj_ba", (0,)), "in_proj_a": ("in_proj_ba", (1,))}

    @staticmethod
    def linear_shapes(h: int, hk: int, hv: int, dk: int, dv: int):
        yield "in_proj_qkv.weight", (2 * hk * dk + hv * dv, h)
        yield "in_proj_z.weight", (hv * dv, h)
        yield "in_proj_b.weight", (hv, h)
        yield "in_proj_a.weight", (hv, h)
