"""The ``mtp`` method (SGLang's ``NEXTN``): drafts from the checkpoint's multi-token-prediction
head (``models/mtp.py``), fed by the target's last hidden states (after its final norm).

Position p takes the target's hidden state at p and the token at p + 1; a chained step takes
the head's own output as its hidden input. The embedding and the LM head are the target's. The
catch-up, the paged K/V and the batched chain are ``head.py``'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from minisgl.models.mtp import MTPHead

from .head import HeadProposer

if TYPE_CHECKING:
    from minisgl.engine import Engine


class MtpProposer(HeadProposer):
    name = "mtp"

    def __init__(self, engine: Engine, graph_rows: int = 0) -> None:
        head = getattr(engine.model, "mtp", None)  # ``add_mtp`` built it
        if not isinstance(head, MTPHead):
            raise ValueError("speculative_config: method 'mtp' needs the model's MTP head")
        self.head = head  # before the graphs are captured
        super().__init__(engine, engine.model_config.hidden_size, graph_rows)

    def run(self, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
            from_target: bool) -> torch.Tensor:
        return self.head(self.model.embed_tokens(tokens), hidden, positions, self.ctx)

    def predict(self, out: torch.Tensor) -> torch.Tensor:
        return self.model.compute_logits(out).argmax(-1)
