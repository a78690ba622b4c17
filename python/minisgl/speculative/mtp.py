"""The ``mtp`` method (SGLang's ``NEXTN``): drafts from the checkpoint's multi-token-prediction
head (``models/mtp.py``), fed by the target's last hidden states (after its final norm).

Position p takes the target's hidden state at p and the token at p + 1; a chained step takes
the head's own output as its hidden input. The embedding and the LM head are the target's. The
catch-up, K/V and chaining are ``head.py``'s.
"""

from __future__ import annotations

import torch

from .head import HeadProposer


class MtpProposer(HeadProposer):
    name = "mtp"

    def __init__(self, model) -> None:
        if getattr(model, "mtp", None) is None:
            raise ValueError("speculative_config: method 'mtp' needs the model's MTP head")
        super().__init__()
        self.model, self.head = model, model.mtp

    def run(self, tokens, hidden, positions, keys, values, from_target: bool):
        return self.head(self.model.embed_tokens(tokens), hidden, positions, keys, values)

    def draft(self, out: torch.Tensor) -> torch.Tensor:
        return self.model.compute_logits(out)[0].argmax().view(1)

    def kv_row(self):
        attn = self.head.layers[0].self_attn
        weight = self.head.fc.weight
        return (attn.qkv_proj.local_kv, attn.head_dim), weight.dtype, weight.device
