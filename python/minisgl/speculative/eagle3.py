"""The ``eagle3`` method: drafts from an EAGLE-3 draft model (``models/eagle3.py``), fed by the
residual streams of a few target layers (``BaseLLMModel.capture_aux``).

Position p takes the target's aux states at p (through the draft's ``fc``) and the token at
p + 1; a chained step takes the draft's own pre-norm output in place of the fc of aux states, as
SGLang and vLLM chain it. The draft predicts over its own (smaller) vocabulary; ``d2t`` maps its
argmax to a target id. One greedy chain, no tree. The catch-up, the paged K/V and the batched
chain are ``head.py``'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from minisgl.models.eagle3 import Eagle3Draft

from .head import HeadProposer

if TYPE_CHECKING:
    from minisgl.engine import Engine


class Eagle3Proposer(HeadProposer):
    name = "eagle3"

    def __init__(self, engine: Engine, graph_rows: int = 0) -> None:
        head = getattr(engine.model, "eagle3", None)  # the engine loads it after the target
        if not isinstance(head, Eagle3Draft):
            raise ValueError("speculative_config: method 'eagle3' needs an EAGLE-3 draft "
                             "(speculative_config.model)")
        self.head = head  # before the graphs are captured
        super().__init__(engine, head.cfg.hidden_size, graph_rows)

    def run(self, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
            from_target: bool) -> torch.Tensor:
        head = self.head
        embed = head.embed_tokens if head.embed_tokens is not None else self.model.embed_tokens
        return head(embed(tokens), hidden, positions, self.ctx, from_target)

    def predict(self, out: torch.Tensor) -> torch.Tensor:
        head = self.head
        normed = head.norm(out)
        if head.lm_head is None:  # the target's head over the target's vocabulary
            return self.model.compute_logits(normed).argmax(-1)
        return head.to_target(head.lm_head(normed).argmax(-1))
