"""Vocabulary-parallel embedding and LM head: each rank holds a contiguous slice of the vocabulary.

The vocabulary is padded up to a multiple of the TP size; padded rows are zero and their logits are
cut off after the all-gather.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from minisgl.distributed import DistributedCommunicator
from minisgl.quant import QuantizationConfig, unquantized_method

from .base import copy_weight, new_param


class VocabParallelEmbedding(nn.Module):
    def __init__(self, vocab_size: int, hidden: int, comm: DistributedCommunicator) -> None:
        super().__init__()
        self.comm, tp = comm, comm.info
        self.vocab_size = vocab_size
        self.local_vocab = -(-vocab_size // tp.size)
        self.vocab_start = tp.rank * self.local_vocab
        self.weight = new_param(self.local_vocab, hidden, loader=self._load)

    def _load(self, param: nn.Parameter, loaded: torch.Tensor, _=None) -> None:
        part = loaded[self.vocab_start : self.vocab_start + self.local_vocab]
        param.data.zero_()
        copy_weight(param.data[: part.shape[0]], part)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.comm.info.size == 1:
            return F.embedding(input_ids, self.weight)
        local = input_ids - self.vocab_start
        mask = (local < 0) | (local >= self.local_vocab)
        out = F.embedding(local.masked_fill(mask, 0), self.weight)
        out.masked_fill_(mask.unsqueeze(-1), 0)
        return self.comm.all_reduce(out)


class ParallelLMHead(VocabParallelEmbedding):
    """Logits over this rank's vocabulary slice, gathered across ranks. May share the embedding."""

    pdl = False  # launch the Triton kernels with PDL; set by the engine (``kernel/triton/pdl.py``)

    def __init__(
        self,
        vocab_size: int,
        hidden: int,
        comm: DistributedCommunicator,
        tied: VocabParallelEmbedding | None = None,
        quant: QuantizationConfig | None = None,
    ) -> None:
        super().__init__(vocab_size, hidden, comm)
        if tied is not None:
            self.weight = tied.weight
        self.method = unquantized_method(quant)  # never quantized; ``quant`` carries its switches

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.comm.all_gather(self.method.apply(self, hidden, None), dim=-1)
        return logits[..., : self.vocab_size]
