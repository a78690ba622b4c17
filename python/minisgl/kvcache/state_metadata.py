"""Where one batch's requests keep their recurrent state: the metadata linear-attention backends
read beside the state pool (``state_pool.py``).

A batch's requests lie back to back, decode rows first::

    rows    0 ........ num_decode - 1 | num_decode ..................... B - 1
    tokens  one each, onto the state  | chunks: request num_decode + n owns chunk tokens
            their slot holds          | chunk_cu[n]:chunk_cu[n + 1] (counted from the first
                                      | chunk token), from zeros unless has_init[n]

Padding tokens after the last request's belong to no request (their outputs are zeros). A decode
CUDA graph builds its metadata from its static slot row (``for_decode``): no host lists then.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch


@dataclass
class ChunkMetadata:
    """The prefill chunks of a batch (device tensors, int32, and the host offsets)."""

    cu: list[int]  # [N + 1] token offsets, from 0
    cu_dev: torch.Tensor  # the same on the device
    token_seq: torch.Tensor  # [cu[-1]]: the chunk of each token
    has_init: torch.Tensor  # [N]: 1 continues from the slot's state, 0 starts from zeros
    slots: torch.Tensor  # [N]

    @functools.cached_property
    def cu_long(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The offsets as int64 on the device and on the host (what fla's kernels take), made
        once per batch rather than once per layer."""
        return self.cu_dev.long(), torch.tensor(self.cu, dtype=torch.long)

    @property
    def num_tokens(self) -> int:
        return self.cu[-1]


@dataclass
class StateMetadata:
    num_decode: int
    slots: torch.Tensor  # [B] int32, decode rows first
    chunks: ChunkMetadata | None = None
    # host copies (the torch reference reads them; absent inside a decode CUDA graph)
    slot_list: list[int] | None = None
    cu_seqlens: list[int] | None = None  # [B + 1] over the whole batch
    fresh: list[bool] | None = None

    @property
    def num_tokens(self) -> int:
        return self.num_decode + (self.chunks.num_tokens if self.chunks else 0)

    @classmethod
    def for_decode(cls, slots: torch.Tensor) -> StateMetadata:
        return cls(num_decode=slots.shape[0], slots=slots)

    @classmethod
    def build(cls, slots: list[int], lengths: list[int], fresh: list[bool], num_decode: int,
              device: torch.device) -> StateMetadata:
        """From the host: each request's slot, token count and whether it starts from zeros; the
        first ``num_decode`` are decode rows (one token, not fresh). One host-to-device copy."""
        cu = [0]
        for n in lengths:
            cu.append(cu[-1] + n)
        chunk_lens = lengths[num_decode:]
        chunk_cu = [c - cu[num_decode] for c in cu[num_decode:]]
        token_seq = [n for n, length in enumerate(chunk_lens) for _ in range(length)]
        has_init = [int(not f) for f in fresh[num_decode:]]
        host = torch.tensor(slots + chunk_cu + token_seq + has_init, dtype=torch.int32,
                            pin_memory=device.type == "cuda")
        dev = host.to(device, non_blocking=True)
        b, n = len(slots), len(chunk_lens)
        chunks = None
        if n:
            t = chunk_cu[-1]
            parts = dev[b:].split([n + 1, t, n])
            chunks = ChunkMetadata(chunk_cu, parts[0], parts[1], parts[2], dev[num_decode:b])
        return cls(num_decode, dev[:b], chunks, list(slots), cu, list(fresh))
