"""Per-request sampling state that lives on the device: token counts for the penalties, logit_bias.

Both are dense ``[rows, vocab]`` buffers indexed like the page table's rows (one row per running
request), allocated on first use. A row is (re)built from the request's token list once, when the
request is admitted to it; after that the sampler adds each sampled token on the device, so no host
work grows with the output length and the next step can launch before this one is read back::

    counts[row, t] = (t in prompt) << 30 | (times t was generated)     int32
    bias[row, t]   = logit_bias of the request for t (0 elsewhere)     float32

The repetition penalty applies where ``counts != 0`` (prompt or output), presence/frequency read the
low 30 bits (output only).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from minisgl.utils.transfer import to_device

if TYPE_CHECKING:
    from minisgl.core import Req

PROMPT_BIT = 1 << 30
COUNT_MASK = PROMPT_BIT - 1


def _uses_counts(req: Req) -> bool:
    return req.sampling_params.needs_penalties


def _uses_bias(req: Req) -> bool:
    return bool(req.sampling_params.logit_bias)


class SamplingState:
    """The device-side counts and biases of the requests in each row, and who owns each row."""

    def __init__(self, num_rows: int, vocab_size: int, device: torch.device) -> None:
        self.num_rows, self.vocab_size, self.device = num_rows, vocab_size, device
        self.counts: torch.Tensor | None = None
        self.bias: torch.Tensor | None = None
        self._owner: dict[int, tuple[int, Req]] = {}  # row -> (what was built, the request)

    def release(self, row: int) -> None:
        """The row's request left it (finished, aborted or retracted): rebuild before reuse."""
        self._owner.pop(row, None)

    def prepare(self, reqs: list[Req], rows: list[int]) -> None:
        """Build the rows of requests that have not been built in their current row.

        NOTE: called when a batch is launched. A request's token list is complete at that point
        whenever its row is new (a retracted request re-enters only after its last forward was
        read back), so tokens in flight are never lost by a rebuild.
        """
        todo = []
        for req, row in zip(reqs, rows):
            want = _uses_counts(req) | _uses_bias(req) << 1
            if want and self._owner.get(row, (0, None))[1] is not req:
                todo.append((req, row, want))
                self._owner[row] = (want, req)
        if todo:
            self._build(todo)

    def _build(self, todo: list[tuple[Req, int, int]]) -> None:
        vocab = self.vocab_size
        counted: list[tuple[int, int, int]] = []  # (row, token, value)
        biased: list[tuple[int, int, float]] = []
        for req, row, want in todo:
            if want & 1:
                counts: dict[int, int] = {}
                for t in req.input_ids[req.prompt_len:]:
                    counts[t] = counts.get(t, 0) + 1
                if req.sampling_params.repetition_penalty != 1:
                    for t in req.input_ids[: req.prompt_len]:
                        counts[t] = counts.get(t, 0) | PROMPT_BIT
                counted += [(row, t, n) for t, n in counts.items() if 0 <= t < vocab]
            if want & 2:
                biased += [(row, t, b) for t, b in req.sampling_params.logit_bias if t < vocab]
        c_rows, c_ids, c_vals = (list(col) for col in zip(*counted)) if counted else ([], [], [])
        b_rows, b_ids, b_vals = (list(col) for col in zip(*biased)) if biased else ([], [], [])
        if any(want & 1 for _, _, want in todo):
            counted_rows = [r for _, r, w in todo if w & 1]
            self.counts = self._zero_rows(self.counts, torch.int32, counted_rows)
            rows, ids, vals = to_device([c_rows, c_ids, c_vals], torch.int64, self.device)
            self.counts[rows, ids] = vals.to(torch.int32)
        if any(want & 2 for _, _, want in todo):
            self.bias = self._zero_rows(self.bias, torch.float32, [r for _, r, w in todo if w & 2])
            rows, ids = to_device([b_rows, b_ids], torch.int64, self.device)
            (vals,) = to_device([b_vals], torch.float32, self.device)
            self.bias[rows, ids] = vals

    def _zero_rows(self, buf: torch.Tensor | None, dtype: torch.dtype, rows: list[int]):
        if buf is None:
            return torch.zeros(self.num_rows, self.vocab_size, dtype=dtype, device=self.device)
        (idx,) = to_device([rows], torch.int64, self.device)
        buf[idx] = 0
        return buf
