"""The gated MLP of every dense decoder layer: ``down(act(gate(x)) * up(x))``, gate and up one
column-parallel GEMM, down row-parallel.

``act``: the config's ``hidden_act``. SiLU (Llama, Qwen) is applied by the down projection as it
reads its input (``LinearRowParallel(gated=True)``: one kernel less); GELU-tanh (Gemma) runs
``gelu_and_mul`` before it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from minisgl.distributed import DistributedCommunicator
from minisgl.quant import QuantizationConfig

from .activation import gelu_and_mul
from .linear import LinearColParallelMerged, LinearRowParallel

if TYPE_CHECKING:
    from minisgl.models.config import ModelConfig

# hidden_act -> the activation the MLP runs
ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh"}


class GatedMLP(nn.Module):
    def __init__(self, hidden: int, inter: int, comm: DistributedCommunicator,
                 quant: QuantizationConfig | None = None, act: str = "silu") -> None:
        super().__init__()
        if act not in ACTIVATIONS:
            raise ValueError(f"hidden_act {act!r} is not supported ({', '.join(ACTIVATIONS)})")
        self.act = ACTIVATIONS[act]
        self.gate_up_proj = LinearColParallelMerged(hidden, [inter, inter], False, comm.info,
                                                    quant)
        self.down_proj = LinearRowParallel(inter, hidden, False, comm, quant)

    @classmethod
    def from_config(cls, cfg: ModelConfig, comm: DistributedCommunicator) -> GatedMLP:
        """The model's dense MLP: ``intermediate_size``, ``hidden_act``."""
        return cls(cfg.hidden_size, cfg.intermediate_size, comm, cfg.quant, act=cfg.hidden_act)

    @property
    def input_linear(self) -> LinearColParallelMerged:
        """The linear layer the norm before feeds (``layers.fusion``)."""
        return self.gate_up_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.act == "silu":
            return self.down_proj(self.gate_up_proj(x), gated=True)
        return self.down_proj(gelu_and_mul(self.gate_up_proj(x)))
