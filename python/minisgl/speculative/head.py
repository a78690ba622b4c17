"""What the proposers that draft with a one-layer head fed by the target's hidden states share
(``mtp``: the checkpoint's MTP head; ``eagle3``: an EAGLE-3 draft model).

Each forward hands back per-position rows of the target (``ForwardOutput.hidden``); ``record``
keeps, per request, the rows of the positions the target computed and kept (a verify step's
rejected positions are dropped). ``propose`` first runs the head over the recorded positions
(position p takes the target's row at p and the token at p + 1, now known), appending their K/V
to the request's own cache of the head's attention, then chains k steps from the last one: each
step's output is the next one's hidden input, its draft the next token. The chained steps' K/V
are not kept: they stand on drafts, and the verified tokens replace them at the next ``propose``
(they are written past the cache's length, where the next append overwrites them).

Positions the target never computed for a request (a prefix-cache hit) have no row, so the
head's attention skips them: the drafts may be worse there, never wrong (verification decides
every token). The K/V cache of a request is a dense tensor per request (the head is one layer),
grown by doubling and dropped when the request ends.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass, field

import torch

from minisgl.core import Req

from .proposer import Proposer

_MAX_PENDING = 64  # recorded positions a request keeps before they are fed to the head


@dataclass
class HeadState:
    """A request's K/V of the head (``keys``/``values`` rows ``[:length]`` at ``positions``), the
    target's rows not yet fed to the head, and the head's last output."""

    keys: torch.Tensor | None = None
    values: torch.Tensor | None = None
    positions: list[int] = field(default_factory=list)
    pending: list[tuple[int, torch.Tensor]] = field(default_factory=list)  # (first pos, rows)
    last: tuple[int, torch.Tensor] | None = None  # (position, the head's output row there)


class HeadProposer(Proposer):
    """A method supplies the head's step (``run``), its token choice (``draft``) and the shape
    of one K/V row (``kv_row``)."""

    def __init__(self) -> None:
        self.states: dict[int, HeadState] = {}

    @abstractmethod
    def run(self, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
            keys: torch.Tensor, values: torch.Tensor,
            from_target: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The head at ``positions`` given the tokens at p + 1 and ``hidden``: the target's rows
        (``from_target``) or the previous step's output. Returns (output, new K, new V)."""

    @abstractmethod
    def draft(self, out: torch.Tensor) -> torch.Tensor:
        """The target token id the head's output row ``out`` ``[1, H]`` predicts, ``[1]`` on the
        device (the chain feeds it on without reading it back)."""

    @abstractmethod
    def kv_row(self) -> tuple[tuple[int, int], torch.dtype, torch.device]:
        """(K/V heads, head dim), dtype and device of the head's K/V."""

    def record(self, req: Req, start: int, rows: torch.Tensor) -> None:
        """The target's rows of positions ``start .. start + len(rows) - 1``. A request that
        does not draft for a while (a large batch) has them fed to the head every
        ``_MAX_PENDING`` positions, so what waits stays small."""
        if len(rows):
            state = self.states.setdefault(req.uid, HeadState())
            state.pending.append((start, rows))
            if sum(len(r) for _, r in state.pending) >= _MAX_PENDING:
                with torch.inference_mode():
                    self._catch_up(req, state)

    @torch.inference_mode()
    def propose(self, req: Req, max_len: int) -> list[int]:
        state = self.states.get(req.uid)
        if state is None:
            return []
        self._catch_up(req, state)
        n = len(req.input_ids)
        if state.last is None or state.last[0] != n - 2 or max_len < 1:
            return []  # the head has not seen the last fed position
        out = state.last[1][None]
        past = len(state.positions)
        keys, values = self._reserve(state, past + max_len - 1)
        # NOTE: no host sync inside the chain (one per draft would stall the GPU k times)
        positions = torch.arange(n - 1, n - 2 + max_len, device=out.device)
        drafts = [self.draft(out)]
        for j in range(1, max_len):
            row = past + j - 1  # scratch rows past the cache's length
            out, k, v = self.run(drafts[-1], out, positions[j - 1 : j], keys[:row],
                                 values[:row], False)
            keys[row], values[row] = k[0], v[0]
            drafts.append(self.draft(out))
        return torch.cat(drafts).tolist()

    def _catch_up(self, req: Req, state: HeadState) -> None:
        """Feed the recorded positions to the head (their next tokens are known now)."""
        if not state.pending:
            return
        positions = [p for start, rows in state.pending for p in range(start, start + len(rows))]
        hidden = torch.cat([rows for _, rows in state.pending])
        state.pending.clear()
        # a position whose next token is not known yet (the forward just read back) waits
        ready = sum(1 for p in positions if p + 1 < len(req.input_ids))
        if ready < len(positions):
            state.pending.append((positions[ready], hidden[ready:]))
            positions, hidden = positions[:ready], hidden[:ready]
        if not positions:
            return
        # a re-fed position (retraction) replaces what the cache holds from it on
        keep = sum(1 for p in state.positions if p < positions[0])
        del state.positions[keep:]
        device = hidden.device
        tokens = torch.tensor([req.input_ids[p + 1] for p in positions], device=device)
        keys, values = self._reserve(state, keep + len(positions))
        out, k, v = self.run(tokens, hidden, torch.tensor(positions, device=device),
                             keys[:keep], values[:keep], True)
        keys[keep : keep + len(positions)] = k
        values[keep : keep + len(positions)] = v
        state.positions += positions
        state.last = (positions[-1], out[-1])

    def _reserve(self, state: HeadState, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Room for ``rows`` K/V rows (the first ``len(positions)`` kept): the K and V
        buffers."""
        if state.keys is not None and state.values is not None and rows <= state.keys.shape[0]:
            return state.keys, state.values
        shape, dtype, device = self.kv_row()
        cap = max(64, 2 * rows)
        keys = torch.empty(cap, *shape, dtype=dtype, device=device)
        values = torch.empty(cap, *shape, dtype=dtype, device=device)
        if state.keys is not None and state.values is not None:
            n = len(state.positions)
            keys[:n], values[:n] = state.keys[:n], state.values[:n]
        state.keys, state.values = keys, values
        return keys, values

    def finished(self, req: Req, learn: bool = True) -> None:
        self.states.pop(req.uid, None)
