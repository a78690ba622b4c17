"""Where one batch's requests keep their recurrent state: the metadata linear-attention backends
read beside the state pool (``state_pool.py``).

A batch's requests lie back to back, decode rows first::

    rows    0 ...... num_decode - 1 | + num_verify         | ............................. B - 1
    tokens  one each, onto the      | k + 1 each: verifying | chunks: request n (counted from the
            state their slot holds  | drafts (speculative   | first chunk) owns chunk tokens
                                    | decoding), states     | chunk_cu[n]:chunk_cu[n + 1], from
                                    | into draft slots      | zeros unless has_init[n]

A verifying request's tokens run through the recurrent rule one position at a time, and the state
after each is left in its draft slots (``draft_slot + j``); its own slot is not written (the
scheduler copies the accepted position's state there, ``speculative/decoder.py``).

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
class VerifyMetadata:
    """The verifying requests (device tensors, int32, one entry each): their first token
    (``starts``, counted from the first verifying token), token count, own slot and first draft
    slot (position j's state goes to ``drafts + j``)."""

    starts: torch.Tensor
    lengths: torch.Tensor
    slots: torch.Tensor
    drafts: torch.Tensor
    num_tokens: int


@dataclass
class StateMetadata:
    num_decode: int
    slots: torch.Tensor  # [B] int32, decode rows first
    chunks: ChunkMetadata | None = None
    verify: VerifyMetadata | None = None
    # host copies (the torch reference reads them; absent inside a decode CUDA graph)
    slot_list: list[int] | None = None
    cu_seqlens: list[int] | None = None  # [B + 1] over the whole batch
    fresh: list[bool] | None = None
    draft_slots: list[int] | None = None  # [num_verify]: each verifying request's first

    @property
    def num_verify(self) -> int:
        return len(self.draft_slots) if self.draft_slots else 0

    @property
    def chunk_start(self) -> int:
        """The first prefill-chunk token (after the decode rows and the verifying requests)."""
        return self.num_decode + (self.verify.num_tokens if self.verify else 0)

    @property
    def num_tokens(self) -> int:
        return self.chunk_start + (self.chunks.num_tokens if self.chunks else 0)

    @classmethod
    def for_decode(cls, slots: torch.Tensor) -> StateMetadata:
        return cls(num_decode=slots.shape[0], slots=slots)

    @classmethod
    def build(cls, slots: list[int], lengths: list[int], fresh: list[bool], num_decode: int,
              device: torch.device, draft_slots: list[int] | None = None) -> StateMetadata:
        """From the host: each request's slot, token count and whether it starts from zeros; the
        first ``num_decode`` are decode rows (one token, not fresh), the next
        ``len(draft_slots)`` verify drafts (not fresh), writing their states from
        ``draft_slots[i]`` on. One host-to-device copy."""
        draft_slots = list(draft_slots or [])
        cu = [0]
        for n in lengths:
            cu.append(cu[-1] + n)
        first = num_decode + len(draft_slots)  # the first chunk's request
        chunk_lens = lengths[first:]
        chunk_cu = [c - cu[first] for c in cu[first:]]
        token_seq = [n for n, length in enumerate(chunk_lens) for _ in range(length)]
        has_init = [int(not f) for f in fresh[first:]]
        verifying = range(num_decode, first)
        flat = ([cu[r] - cu[num_decode] for r in verifying] + [lengths[r] for r in verifying]
                + [slots[r] for r in verifying] + draft_slots)
        host = torch.tensor(slots + chunk_cu + token_seq + has_init + flat, dtype=torch.int32,
                            pin_memory=device.type == "cuda")
        dev = host.to(device, non_blocking=True)
        b, n = len(slots), len(chunk_lens)
        t = chunk_cu[-1]
        chunks = verify = None
        if n:
            parts = dev[b : b + 2 * n + 1 + t].split([n + 1, t, n])
            chunks = ChunkMetadata(chunk_cu, parts[0], parts[1], parts[2], dev[first:b])
        if draft_slots:
            # after the slots, chunk_cu (n + 1 entries, even for n = 0), token_seq and has_init
            parts = dev[b + 2 * n + 1 + t:].split(len(draft_slots))
            verify = VerifyMetadata(parts[0], parts[1], parts[2], parts[3],
                                    cu[first] - cu[num_decode])
        return cls(num_decode, dev[:b], chunks, verify, list(slots), cu, list(fresh),
                   draft_slots)

