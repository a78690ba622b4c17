"""The ``eagle3`` method: drafts from an EAGLE-3 draft model (``models/eagle3.py``), fed by the
residual streams of a few target layers (``BaseLLMModel.capture_aux``).

Position p takes the target's aux states at p (through the draft's ``fc``) and the token at
p + 1; a chained step takes the draft's own pre-norm output in place of the fc of aux states, as
SGLang and vLLM chain it. The draft predicts over its own (smaller) vocabulary; ``d2t`` maps its
argmax to a target id. One greedy chain, no tree. The catch-up, K/V and chaining are
``head.py``'s.
"""

from __future__ import annotations

import torch

from minisgl.models import BaseLLMModel
from minisgl.models.eagle3 import Eagle3Draft

from .head import HeadProposer


class Eagle3Proposer(HeadProposer):
    name = "eagle3"

    def __init__(self, model: BaseLLMModel) -> None:
        head = getattr(model, "eagle3", None)  # the engine loads it after the target
        if not isinstance(head, Eagle3Draft):
            raise ValueError("speculative_config: method 'eagle3' needs an EAGLE-3 draft "
                             "(speculative_config.model)")
        super().__init__()
        self.model, self.head = model, head

    def run(self, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
            keys: torch.Tensor, values: torch.Tensor,
            from_target: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        head = self.head
        embed = head.embed_tokens if head.embed_tokens is not None else self.model.embed_tokens
        return head(embed(tokens), hidden, positions, keys, values, from_target)

    def draft(self, out: torch.Tensor) -> torch.Tensor:
        head = self.head
        normed = head.norm(out)
        if head.lm_head is None:  # the target's head over the target's vocabulary
            return self.model.compute_logits(normed)[0].argmax().view(1)
        return head.to_target(head.lm_head(normed)[0].argmax()).view(1)

    def kv_row(self) -> tuple[tuple[int, int], torch.dtype, torch.device]:
        cfg, weight = self.head.cfg, self.head.fc.weight
        return (cfg.num_kv_heads, cfg.head_dim), weight.dtype, weight.device
