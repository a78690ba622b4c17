"""Recurrent state of linear-attention (Gated DeltaNet) layers: a pool of per-request slots.

A request's state does not grow with its length: one slot holds, per linear layer, the conv
state (the last ``W - 1`` inputs of the causal conv) and the fp32 delta-rule state. Slots are laid
out as::

    slot  0 .......... max_running_reqs - 1 | max_running_reqs | + 1 .. + num_snapshots | drafts
          | the request in page-table row r  | the dummy row   | snapshots (radix cache) |

A live request's slot is its page-table row (``Req.table_idx``): admission already hands out a
row per request, so counting rows counts slots, retraction frees both at once, and a CUDA graph
that takes the batch's rows as input takes its state slots with them. The dummy row's slot is
scratch, written by padding rows. Snapshot slots are handed out by ``alloc_snapshot`` to the
prefix cache, which copies a request's state into one at a boundary worth keeping. Draft slots
(speculative decoding, ``minisgl/speculative/``) come in groups of ``draft_group_size``: a request
verifying k drafts leaves the state after each of its k + 1 fed tokens in one group's slots, and
the accepted position's is copied back into its own slot (``copy_slots``), so a rejection resumes
from there without recomputing anything.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import check_positive_int


@dataclass(frozen=True)
class StateShape:
    """One linear layer's state per slot, on this rank: conv ``[conv_dim, W - 1]`` (model dtype)
    and delta-rule ``[v_heads, k_dim, v_dim]`` (fp32 by default; bf16 halves a decode step's state
    traffic)."""

    conv_dim: int
    conv_width: int
    v_heads: int
    k_dim: int
    v_dim: int

    def bytes_per_slot(self, conv_dtype: torch.dtype,
                       ssm_dtype: torch.dtype = torch.float32) -> int:
        conv = self.conv_dim * (self.conv_width - 1) * conv_dtype.itemsize
        return conv + self.v_heads * self.k_dim * self.v_dim * ssm_dtype.itemsize


class StatePool:
    """Conv and delta-rule state of ``num_layers`` linear layers for every slot."""

    def __init__(self, shape: StateShape, num_layers: int, max_running_reqs: int,
                 num_snapshots: int, dtype: torch.dtype, device: torch.device | str,
                 ssm_dtype: torch.dtype = torch.float32, num_draft_groups: int = 0,
                 draft_group_size: int = 0) -> None:
        self.shape = shape
        self.num_layers = check_positive_int("num_linear_layers", num_layers)
        self.max_running_reqs = check_positive_int("max_running_reqs", max_running_reqs)
        if num_snapshots < 0:
            raise ValueError(f"num_snapshots: must be >= 0, got {num_snapshots}")
        self.num_snapshots = num_snapshots
        if num_draft_groups < 0 or draft_group_size < 0:
            raise ValueError("num_draft_groups, draft_group_size: must be >= 0")
        self.num_draft_groups = num_draft_groups if draft_group_size else 0
        self.draft_group_size = draft_group_size
        self.first_draft_slot = max_running_reqs + 1 + num_snapshots
        self.num_slots = self.first_draft_slot + self.num_draft_groups * draft_group_size
        self.dtype, self.ssm_dtype, self.device = dtype, ssm_dtype, torch.device(device)
        n, s = self.num_slots, shape
        self.conv = [torch.zeros(n, s.conv_dim, s.conv_width - 1, dtype=dtype, device=self.device)
                     for _ in range(num_layers)]
        self.ssm = [torch.zeros(n, s.v_heads, s.k_dim, s.v_dim, dtype=ssm_dtype,
                                device=self.device) for _ in range(num_layers)]
        first = max_running_reqs + 1
        self._free_snapshots = list(range(first + num_snapshots - 1, first - 1, -1))

    @property
    def bytes_per_slot(self) -> int:
        return self.shape.bytes_per_slot(self.dtype, self.ssm_dtype) * self.num_layers

    @property
    def total_bytes(self) -> int:
        return self.bytes_per_slot * self.num_slots

    @property
    def scratch_slot(self) -> int:
        return self.max_running_reqs

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(conv ``[slots, C, W - 1]``, ssm ``[slots, H, K, V]``) of linear layer ``index``."""
        return self.conv[index], self.ssm[index]

    # --- snapshot slots (owned by the prefix cache) ---
    @property
    def num_free_snapshots(self) -> int:
        return len(self._free_snapshots)

    def alloc_snapshot(self) -> int | None:
        """A free snapshot slot, or None when every one is taken."""
        return self._free_snapshots.pop() if self._free_snapshots else None

    def free_snapshot(self, slot: int) -> None:
        assert self._is_snapshot(slot) and slot not in self._free_snapshots, \
            f"bad snapshot slot {slot}"
        self._free_snapshots.append(slot)

    def draft_slot(self, group: int) -> int:
        """The first slot of draft group ``group``: draft position j's state is in slot + j."""
        assert 0 <= group < self.num_draft_groups, f"bad draft group {group}"
        return self.first_draft_slot + group * self.draft_group_size

    def copy_slots(self, dst: list[int], src: list[int]) -> None:
        """``copy_slot`` for many pairs: two gathers and scatters per layer, whatever the count
        (a verify step's accepted states, one per request)."""
        if not dst:
            return
        d = torch.tensor(dst, device=self.device)
        s = torch.tensor(src, device=self.device)
        for conv, ssm in zip(self.conv, self.ssm):
            conv.index_copy_(0, d, conv.index_select(0, s))
            ssm.index_copy_(0, d, ssm.index_select(0, s))

    def copy_slot(self, dst: int, src: int) -> None:
        """Every layer's state of slot ``src`` into ``dst`` (device copies, stream-ordered)."""
        for conv, ssm in zip(self.conv, self.ssm):
            conv[dst].copy_(conv[src])
            ssm[dst].copy_(ssm[src])

    def _is_snapshot(self, slot: int) -> bool:
        return self.max_running_reqs < slot < self.first_draft_slot

    def check_integrity(self, held: list[int]) -> None:
        """free + ``held`` (the prefix cache's snapshots) == every snapshot slot, none twice."""
        everything = self._free_snapshots + list(held)
        assert len(set(everything)) == len(everything), "a snapshot slot is owned twice"
        assert all(self._is_snapshot(s) for s in everything), "a snapshot slot is out of range"
        assert len(everything) == self.num_snapshots, \
            f"snapshot slots leaked: {len(everything)} accounted of {self.num_snapshots}"
