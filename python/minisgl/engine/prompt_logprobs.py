"""Prompt log-probs: the log-probability of every prompt token given the tokens before it.

Evaluation harnesses score a multiple-choice answer by the log-likelihood of its tokens (OpenAI's
``echo`` with ``logprobs``, SGLang's ``logprob_start_len``). They come from the prefill's hidden
states: the row of position ``p`` predicts the token at ``p + 1``. A long prompt is already split
into chunks by chunked prefill; inside one forward the rows are projected in blocks, so that
``[prompt_len, vocab]`` logits never exist at once (a 32k-token prompt of a 150k-token vocabulary
would need 19 GB in float32).

Two things keep the values complete and counted once:

- tokens served from the prefix cache have no hidden state in this forward, so a request that wants
  prompt log-probs matches at most ``logprob_start_len - 1`` cached tokens (``prefix_limit``);
- a retracted request re-feeds its prompt later, but only requests with no output yet are scored.

Layout of one request in a prefill forward (rows are the forward's token rows)::

    prompt index:   0 ... cached_len ........ device_len-1 | device_len ...
    hidden rows:          r0 ............... r0+extend-1
    predicts index:       cached_len+1 ..... device_len     (only those < prompt_len are prompt)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable

import torch

from minisgl.core import Batch, Req
from minisgl.utils.transfer import to_device

if TYPE_CHECKING:
    from minisgl.models import BaseLLMModel

# one block of logits rows stays under this many bytes (float32)
_BLOCK_BYTES = 256 << 20

# (token id, log-prob or None for the first prompt token, [(id, log-prob)] alternatives)
Entry = tuple[int, "float | None", list[tuple[int, float]]]


def wants_prompt_logprobs(req: Req) -> bool:
    return req.sampling_params.prompt_logprobs and req.output_len == 0


def prefix_limit(req: Req) -> int:
    """How many leading tokens ``req`` may take from the prefix cache."""
    limit = len(req.input_ids) - 1  # at least one token is computed (its logits are sampled)
    if wants_prompt_logprobs(req):
        limit = min(limit, max(req.sampling_params.logprob_start_len - 1, 0))
    return limit


@dataclass
class PromptLogprobs:
    """The prompt log-probs one forward computed: per request a span of consecutive prompt indices.

    ``spans``: (uid, first prompt index scored, count, top-k asked); the tensors hold the rows of
    all spans back to back (device tensors until ``to_host``).
    """

    spans: list[tuple[int, int, int, int]]
    targets: list[int]
    logprobs: torch.Tensor  # [R] float32
    top_ids: torch.Tensor | None = None  # [R, K] int64
    top_logprobs: torch.Tensor | None = None  # [R, K] float32

    def to_host(self, non_blocking: bool) -> PromptLogprobs:
        def host(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to("cpu", non_blocking=non_blocking)

        return PromptLogprobs(self.spans, self.targets,
                              self.logprobs.to("cpu", non_blocking=non_blocking),
                              host(self.top_ids), host(self.top_logprobs))

    def entries(self) -> Iterable[tuple[int, int, list[Entry]]]:
        """Per span: (uid, first prompt index, entries). Call on host copies, after the wait."""
        lps = self.logprobs.tolist()
        ids = self.top_ids.tolist() if self.top_ids is not None else None
        tops = self.top_logprobs.tolist() if self.top_logprobs is not None else None
        row = 0
        for uid, start, count, k in self.spans:
            out = []
            for r in range(row, row + count):
                alts = (list(zip(ids[r][:k], tops[r][:k]))
                        if k and ids is not None and tops is not None else [])
                out.append((self.targets[r], lps[r], alts))
            yield uid, start, out
            row += count


def compute_prompt_logprobs(model: BaseLLMModel, hidden: torch.Tensor, batch: Batch,
                            vocab_size: int) -> PromptLogprobs | None:
    """Score the prompt tokens that this prefill forward predicts, for the requests that ask."""
    rows, targets, spans = [], [], []
    offset = 0
    for feed in batch.feeds:
        req = feed.req
        if wants_prompt_logprobs(req):
            params = req.sampling_params
            first = max(feed.cached_len, params.logprob_start_len - 1, 0)
            last = min(feed.device_len, req.prompt_len - 1)
            if last > first:
                start = offset + first - feed.cached_len
                rows += range(start, start + last - first)
                targets += req.input_ids[first + 1 : last + 1]
                spans.append((req.uid, first + 1, last - first, params.top_logprobs))
        offset += feed.extend_len
    if not spans:
        return None
    k = max(s[3] for s in spans)
    row_idx, target_idx = to_device([rows, targets], torch.int64, hidden.device)  # no host sync
    block = max(1, _BLOCK_BYTES // (4 * vocab_size))
    lps, top_ids, top_lps = [], [], []
    for i in range(0, len(rows), block):
        logits = model.compute_logits(hidden[row_idx[i : i + block]]).float()
        logp = torch.log_softmax(logits, dim=-1)
        del logits
        lps.append(logp.gather(1, target_idx[i : i + block, None]).squeeze(1))
        if k:
            values, ids = logp.topk(k, dim=-1)
            top_lps.append(values)
            top_ids.append(ids)
    return PromptLogprobs(spans, targets, torch.cat(lps),
                          torch.cat(top_ids) if k else None, torch.cat(top_lps) if k else None)


@dataclass
class PromptLogprobStore:
    """The scheduler's side: prompt log-probs gathered over a request's prefill chunks, handed out
    with its first output. ``forget`` a request that ends before that."""

    _by_uid: dict[int, list[Entry]] = field(default_factory=dict)

    def add(self, result: PromptLogprobs | None, alive: dict[int, Req]) -> None:
        if result is None:
            return
        for uid, _, entries in result.entries():
            if uid in alive:
                self._by_uid.setdefault(uid, []).extend(entries)

    def pop(self, req: Req) -> list[Entry] | None:
        """The request's prompt log-probs from ``logprob_start_len`` on (index 0 has None)."""
        entries = self._by_uid.pop(req.uid, [])
        if not req.sampling_params.prompt_logprobs:
            return None
        if req.sampling_params.logprob_start_len == 0:
            entries = [(req.input_ids[0], None, []), *entries]
        return entries

    def forget(self, uid: int) -> None:
        self._by_uid.pop(uid, None)
