"""The ``mtp`` method (SGLang's ``NEXTN``): drafts from the checkpoint's multi-token-prediction
head (``models/mtp.py``), fed by the target's last hidden states (after its final norm).

Position p takes the target's hidden state at p and the token at p + 1; a chained step takes
the head's own output as its hidden input. The embedding and the LM head are the target's. The
catch-up, K/V and chaining are ``head.py``'s.
"""

from __future__ import annotations

from typing import cast

import torch

from minisgl.models import BaseLLMModel
from minisgl.models.mtp import MTPHead, MTPLayer

from .head import HeadProposer


class MtpProposer(HeadProposer):
    name = "mtp"

    def __init__(self, model: BaseLLMModel) -> None:
        head = getattr(model, "mtp", None)  # ``add_mtp`` built it
        if not isinstance(head, MTPHead):
            raise ValueError("speculative_config: method 'mtp' needs the model's MTP head")
        super().__init__()
        self.model, self.head = model, head

    def run(self, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
            keys: torch.Tensor, values: torch.Tensor,
            from_target: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.head(self.model.embed_tokens(tokens), hidden, positions, keys, values)

    def draft(self, out: torch.Tensor) -> torch.Tensor:
        return self.model.compute_logits(out)[0].argmax().view(1)

    def kv_row(self) -> tuple[tuple[int, int], torch.dtype, torch.device]:
        attn = cast(MTPLayer, self.head.layers[0]).self_attn
        weight = self.head.fc.weight
        return (attn.qkv_proj.local_kv, attn.head_dim), weight.dtype, weight.device
