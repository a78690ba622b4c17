"""A fabricated target model for CPU tests of the scheduler (vLLM's ``tests/v1/core/utils.py``
idea): the real scheduler, cache manager, engine bookkeeping and token pool, with a forward that
reads each sampled token from a script instead of running the model.

Every request follows its script, ``script[uid]``: the prompt, then the tokens the target gives.
The token sampled for position ``p`` (written to the token pool at ``p + 1``) is
``script[uid][p + 1]``, whatever was fed before it. That is what a real target does where the
fed context is right; where it is not (positions after a rejected draft) a real target's token is
garbage, which the verdict never keeps, so the script stands in for it too.

``ScriptProposer`` drafts from the same script, wrong wherever ``wrong(uid, position)`` says: a
rejected draft there, and the run after it cut. With ``lookahead`` it drafts ahead too
(``Proposer.propose_ahead``: the script after the tail, its first token the guess of the bonus).
"""

from __future__ import annotations

from typing import Callable

import torch

from minisgl import LLM
from minisgl.core import SamplingParams
from minisgl.engine.types import ForwardOutput
from minisgl.sampling import SampleOutput
from minisgl.speculative.proposer import Proposer


def scripted_forward(scheduler, script: dict[int, list[int]]) -> list[dict[int, list[int]]]:
    """Replace ``scheduler.engine.forward`` by the script's; returns the launched forwards, each
    as the positions sampled per request uid (a verify step samples several)."""
    engine = scheduler.engine
    launched: list[dict[int, list[int]]] = []

    def forward(batch, args) -> ForwardOutput:
        if args.late_bitmask is not None:
            args.token_bitmask = args.late_bitmask()
        rows, positions = (t.tolist() for t in batch.sample_loc)
        owner = {req.table_idx: req.uid for req in scheduler.reqs.values() if req.table_idx >= 0}
        tokens, sampled = [], {}
        for row, pos in zip(rows, positions):  # the token for position pos - 1 goes to pos
            uid = owner[row]
            tokens.append(script[uid][pos])
            sampled.setdefault(uid, []).append(pos - 1)
        launched.append(sampled)
        next_tokens = torch.tensor(tokens, dtype=torch.int64)
        engine.token_pool[batch.sample_loc] = next_tokens.to(torch.int32)
        return ForwardOutput(next_tokens, SampleOutput(next_tokens, None, None, None), None)

    engine.forward = forward
    return launched


class ScriptProposer(Proposer):
    """Drafts the script's next tokens, each one wrong where ``wrong(uid, position)``."""

    name = "script"

    def __init__(self, script: dict[int, list[int]],
                 wrong: Callable[[int, int], bool] = lambda uid, pos: False,
                 lookahead: bool = False) -> None:
        self.script, self.wrong, self.lookahead = script, wrong, lookahead
        self.proposed = 0

    def propose(self, req, max_len: int) -> list[int]:
        return self._from(req.uid, len(req.input_ids), max_len)

    def propose_ahead(self, req, tail: list[int], max_len: int) -> list[int]:
        return self._from(req.uid, len(req.input_ids) + len(tail), max_len)

    def _from(self, uid: int, n: int, max_len: int) -> list[int]:
        tokens = self.script[uid][n : n + max_len]
        self.proposed += 1
        return [t + 1 if self.wrong(uid, n + j) else t for j, t in enumerate(tokens)]


def scripts(prompts: list[list[int]], outputs: int, vocab: int = 200) -> dict[int, list[int]]:
    """Per uid (the prompt's index) the prompt, then ``outputs`` tokens of the target, in a
    repeating pattern so that the output is easy to read in a failure."""
    return {uid: p + [(7 * uid + 3 * j) % (vocab - 2) + 1 for j in range(outputs)]
            for uid, p in enumerate(prompts)}


def run(scheduler, prompts: list[list[int]], params: SamplingParams,
        after_step: Callable[[], None] = lambda: None) -> dict[int, list[int]]:
    """Every request to its end, calling ``after_step`` after each step; the tokens per uid."""
    for uid, prompt in enumerate(prompts):
        scheduler.add_request(uid, prompt, params)
    tokens: dict[int, list[int]] = {}
    while scheduler.has_work:
        for out in scheduler.step():
            tokens.setdefault(out.uid, []).append(out.token)
        after_step()
    scheduler.check_integrity()
    return tokens


def scripted_llm(model, script: dict[int, list[int]], wrong: Callable[[int, int], bool],
                 page: int, k: int, lookahead: bool = False, **options) -> LLM:
    """A float32 CPU ``LLM`` with ngram speculation of ``k`` fixed drafts, its proposer replaced
    by ``ScriptProposer(script, wrong, lookahead)``; its forward is still the model's."""
    options.setdefault("num_pages", 2048 // page)
    llm = LLM(str(model), device="cpu", dtype="float32", page_size=page, cache="naive",
              speculative_config={"method": "ngram", "num_speculative_tokens": k,
                                  "adaptive": False}, **options)
    llm.scheduler.spec.proposer = ScriptProposer(script, wrong, lookahead=lookahead)
    return llm
