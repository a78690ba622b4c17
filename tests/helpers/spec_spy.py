"""Watch a draft-model proposer (MTP, EAGLE-3) inside a real engine: what it is handed and what it
drafts."""

from __future__ import annotations

import torch


def spy_on_proposer(proposer) -> tuple[dict[int, torch.Tensor], list[tuple[list[int], list[int]]]]:
    """Wrap ``proposer``'s ``record`` and ``propose``: returns the rows it is handed, by position
    (copies, on their device), and every ``propose`` call as (the request's tokens, the drafts)."""
    rows: dict[int, torch.Tensor] = {}
    calls: list[tuple[list[int], list[int]]] = []
    record, propose = proposer.record, proposer.propose

    def spy_record(req, start, hidden):
        rows.update({start + i: row.clone() for i, row in enumerate(hidden)})
        record(req, start, hidden)

    def spy_propose(req, max_len):
        drafts = propose(req, max_len)
        calls.append((list(req.input_ids), drafts))
        return drafts

    proposer.record, proposer.propose = spy_record, spy_propose
    return rows, calls
