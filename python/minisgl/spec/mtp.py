"""The ``mtp`` method (SGLang's ``NEXTN``): drafts from the checkpoint's multi-token-prediction
head (``models/mtp.py``), fed by the target's hidden states.

Each forward hands back its hidden states (``ForwardOutput.hidden``); ``record`` keeps, per
request, the rows of the positions the target computed and kept (a verify step's rejected
positions are dropped). ``propose`` first runs the head over the recorded positions (position p
takes the hidden state at p and the token at p + 1, now known), appending their K/V to the
request's own cache of the head's attention, then chains k steps from the last one: each step's
output is the next one's hidden input, its argmax the next draft. The chained steps' K/V are not
kept: they stand on drafts, and the verified tokens replace them at the next ``propose``.

Positions the target never computed for a request (a prefix-cache hit) have no hidden state, so
the head's attention skips them: the drafts may be worse there, never wrong (verification decides
every token). The K/V cache of a request is a dense tensor per request (the head is one layer),
grown by doubling and dropped when the request ends.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from minisgl.core import Req

from .proposer import Proposer

_MAX_PENDING = 64  # recorded positions a request keeps before they are fed to the head


@dataclass
class _HeadState:
    """A request's K/V of the head (``keys``/``values`` rows ``[:length]`` at ``positions``), the
    target's hidden rows not yet fed to the head, and the head's last output."""

    keys: torch.Tensor | None = None
    values: torch.Tensor | None = None
    positions: list[int] = field(default_factory=list)
    pending: list[tuple[int, torch.Tensor]] = field(default_factory=list)  # (first pos, rows)
    last: tuple[int, torch.Tensor] | None = None  # (position, the head's output row there)


class MtpProposer(Proposer):
    name = "mtp"

    def __init__(self, model) -> None:
        if getattr(model, "mtp", None) is None:
            raise ValueError("speculative_config: method 'mtp' needs the model's MTP head")
        self.model, self.head = model, model.mtp
        self.states: dict[int, _HeadState] = {}

    def record(self, req: Req, start: int, rows: torch.Tensor) -> None:
        """The target's hidden states of positions ``start .. start + len(rows) - 1``. A request
        that does not draft for a while (a large batch) has them fed to the head every
        ``_MAX_PENDING`` positions, so what waits stays small."""
        if len(rows):
            state = self.states.setdefault(req.uid, _HeadState())
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
        hidden = state.last[1][None]
        keys, values = self._past(state)
        drafts: list[int] = []
        draft = self._argmax(hidden)
        for j in range(1, max_len):
            drafts.append(draft)
            token = torch.tensor([draft], device=hidden.device)
            pos = torch.tensor([n - 2 + j], device=hidden.device)
            hidden, k, v = self.head(self.model.embed_tokens(token), hidden, pos, keys, values)
            keys, values = torch.cat([keys, k]), torch.cat([values, v])
            draft = self._argmax(hidden)
        return drafts + [draft]

    def _argmax(self, hidden: torch.Tensor) -> int:
        return int(self.model.compute_logits(hidden)[0].argmax())

    def _catch_up(self, req: Req, state: _HeadState) -> None:
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
        keys, values = self._past(state)
        out, k, v = self.head(self.model.embed_tokens(tokens), hidden,
                              torch.tensor(positions, device=device), keys, values)
        self._append(state, positions, k, v)
        state.last = (positions[-1], out[-1])

    def _past(self, state: _HeadState) -> tuple[torch.Tensor, torch.Tensor]:
        if state.keys is None:
            attn = self.head.layers[0].self_attn
            weight = self.head.fc.weight
            empty = weight.new_empty(0, attn.qkv_proj.local_kv, attn.head_dim)
            return empty, empty
        n = len(state.positions)
        return state.keys[:n], state.values[:n]

    def _append(self, state: _HeadState, positions: list[int], k: torch.Tensor,
                v: torch.Tensor) -> None:
        n, add = len(state.positions), len(positions)
        if state.keys is None or n + add > state.keys.shape[0]:
            cap = max(64, 2 * (n + add))
            keys = k.new_empty(cap, *k.shape[1:])
            values = v.new_empty(cap, *v.shape[1:])
            if state.keys is not None:
                keys[:n], values[:n] = state.keys[:n], state.values[:n]
            state.keys, state.values = keys, values
        state.keys[n : n + add], state.values[n : n + add] = k, v
        state.positions += positions

    def finished(self, req: Req) -> None:
        self.states.pop(req.uid, None)
