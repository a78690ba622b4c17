"""What a scheduler step hands back: one ``TokenOutput`` per request that got a token."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from minisgl.core import Feed, Req
from minisgl.engine import ForwardOutput
from minisgl.engine.prompt_logprobs import Entry

if TYPE_CHECKING:
    from minisgl.speculative import SpecDecoder

    from .cache import CacheCoordinator

FinishReason = Literal["stop", "length", "abort"]


@dataclass
class TokenOutput:
    """One new token of one request (``token`` None: a ``max_tokens=0`` request, prompt only)."""

    uid: int
    token: int | None
    finish_reason: FinishReason | None = None
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] | None = None
    first: Req | None = None  # the request, on its first token only (prompt length, cache hit)
    prompt_logprobs: list[Entry] | None = None  # on its first token, when asked


def logprob_rows(out: ForwardOutput, reqs: list[Req]) -> list[tuple]:
    """Per request: (chosen token's logprob, [(id, logprob)] of its top_logprobs), or () if
    unasked."""
    if out.logprobs is None:
        return [()] * len(reqs)
    logprobs, top_ids, top_logprobs = out.logprobs
    assert logprobs is not None
    chosen = logprobs.tolist()
    ids = top_ids.tolist() if top_ids is not None else [[] for _ in reqs]
    lps = top_logprobs.tolist() if top_logprobs is not None else [[] for _ in reqs]
    rows: list[tuple] = []
    for i, req in enumerate(reqs):
        k = req.sampling_params.top_logprobs
        if not req.sampling_params.logprobs and k == 0:
            rows.append(())
        else:
            rows.append((chosen[i], list(zip(ids[i][:k], lps[i][:k]))))
    return rows


def finish_reason(req: Req, token: int, eos_token_ids: frozenset[int]) -> FinishReason | None:
    """Whether ``token``, just appended, ends ``req``: a stop or EOS token, or its length."""
    params = req.sampling_params
    if token in params.stop_token_ids or (token in eos_token_ids and not params.ignore_eos):
        return "stop"
    if req.output_len >= params.max_tokens or len(req.input_ids) >= req.max_device_len:
        return "length"
    return None


def append_run(req: Req, run: list[tuple[int, tuple]],
               eos_token_ids: frozenset[int]) -> FinishReason | None:
    """Append a run of tokens (one, or a verified draft's accepted run) up to the first that ends
    the request; the rest is dropped."""
    reason = None
    for n, (token, _) in enumerate(run, 1):
        req.append_token(token)
        reason = finish_reason(req, token, eos_token_ids)
        if reason is not None:
            del run[n:]
            break
    return reason


def apply_runs(live: list[tuple[Feed, list[tuple[int, tuple]]]], out: ForwardOutput,
               spec: SpecDecoder | None, cache: CacheCoordinator,
               eos_token_ids: frozenset[int]) -> dict[Feed, FinishReason | None]:
    """Append each live feed's run (a verify feed's accepted one, ``spec.judge``), cut at its
    first stop; commit the KV of what verify feeds kept; tell speculation what came back. The
    finish reason per feed that appended (none for a prompt-only request)."""
    reasons: dict[Feed, FinishReason | None] = {}
    plain: list[tuple[Req, list[int]]] = []
    kept: list[tuple[Req, int, Feed]] = []
    for feed, run in live:
        req = feed.req
        if req.sampling_params.max_tokens == 0:
            continue
        if feed.drafts:
            assert spec is not None  # only speculation plans drafts
            del run[spec.judge(feed, [token for token, _ in run]) + 1:]
        reasons[feed] = append_run(req, run, eos_token_ids)
        if feed.drafts:  # the KV of its kept tokens, the last excepted (never fed)
            kept.append((req, len(req.input_ids) - 1, feed))
        else:
            plain.append((req, [token for token, _ in run]))
    if kept:
        cache.commit_many(kept)
    if spec is not None:
        spec.observe(plain, out)
    return reasons
