"""Response builders for the OpenAI-compatible endpoints: what one choice produced so far, usage,
log-probs in the chat and the legacy completions formats, whole responses and stream chunks."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from minisgl.message import UserReply
from minisgl.utils import init_logger

logger = init_logger(__name__)

TokenText = Callable[[int], str]
LogprobEntry = tuple[int, float, list[tuple[int, float]]]


@dataclass
class ChoiceState:
    """What one choice (one backend request) produced so far."""

    uid: int
    index: int
    prompt_index: int = 0
    text: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[LogprobEntry] = field(default_factory=list)
    prompt_logprobs: list[tuple[int, float | None, list]] | None = None  # echo, logprob_start_len
    finish_reason: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    started: bool = False
    text_offset: int = 0  # of the next logprob token (legacy completions format)
    first_token_at: float = 0.0  # Unix times, for the latency metrics
    last_token_at: float = 0.0
    first_forward_time: float = 0.0

    def add(self, reply: UserReply) -> None:
        if reply.token_ids:
            self.last_token_at = time.time()
            self.first_token_at = self.first_token_at or self.last_token_at
        self.first_forward_time = reply.first_forward_time or self.first_forward_time
        self.started = True
        self.text.append(reply.text)
        self.token_ids += reply.token_ids
        self.logprobs += reply.logprobs or []
        self.prompt_logprobs = reply.prompt_logprobs or self.prompt_logprobs
        self.prompt_tokens = reply.prompt_tokens or self.prompt_tokens
        self.cached_tokens = reply.cached_tokens or self.cached_tokens
        self.finish_reason = reply.finish_reason or self.finish_reason


def usage(choices: list[ChoiceState]) -> dict:
    """Prompts count once each (not once per choice), as OpenAI counts them."""
    firsts: dict[int, ChoiceState] = {}
    for c in choices:
        firsts.setdefault(c.prompt_index, c)
    prompt = sum(c.prompt_tokens for c in firsts.values())
    completion = sum(len(c.token_ids) for c in choices)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": sum(c.cached_tokens for c in firsts.values())},
    }


class TokenTexts:
    """The text of single tokens (for logprobs); the tokenizer loads on first use, off the loop."""

    def __init__(self, model_path: str | None, cache_dir: str | None = None) -> None:
        self.model_path, self.cache_dir, self._decode = model_path, cache_dir, None
        self.tokenizer: Any = None  # loaded by the first ``get``
        self._loading: concurrent.futures.Future | None = None

    def prefetch(self) -> TokenTexts:
        """Start loading on a thread now (the launcher, while its children start)."""
        if self._loading is None:
            self._loading = concurrent.futures.Future()
            threading.Thread(target=lambda f=self._loading: f.set_result(self._load()),
                             name="tokenizer-prefetch", daemon=True).start()
        return self

    async def get(self) -> TokenText:
        if self._decode is None:
            tok = self.tokenizer = await (asyncio.wrap_future(self._loading) if self._loading
                                          else asyncio.to_thread(self._load))
            cache: dict[int, str] = {}
            self._decode = lambda t: cache.get(t) or cache.setdefault(
                t, tok.decode([t]) if tok is not None else f"token_id:{t}")
        return self._decode

    def _load(self) -> Any:
        from minisgl.utils.hf import load_tokenizer

        try:
            return (load_tokenizer(self.model_path, cache_dir=self.cache_dir) if self.model_path
                    else None)
        except Exception:
            logger.exception("no tokenizer in the API process: logprob tokens are shown as ids, no "
                             "reasoning split")
            return None


def finite(logprob: float) -> float:
    """JSON has no -inf (a token the filters removed): clamp to -9999.0, as vLLM does."""
    return logprob if logprob > -9999.0 else -9999.0


def chat_logprobs(entries: list[LogprobEntry], text_of: TokenText, top: int) -> dict:
    def one(tid: int, lp: float) -> dict:
        text = text_of(tid)
        return {"token": text, "logprob": finite(lp), "bytes": list(text.encode())}

    content = [{**one(t, lp), "top_logprobs": [one(a, b) for a, b in alts[:top]]}
               for t, lp, alts in entries]
    return {"content": content, "refusal": None}


def completion_logprobs(entries: list[LogprobEntry], text_of: TokenText, top: int,
                        state: ChoiceState) -> dict:
    """OpenAI's legacy format; the top dict holds the sampled token too (up to top + 1 keys)."""
    out: dict[str, list] = {k: [] for k in ("tokens", "token_logprobs", "top_logprobs",
                                            "text_offset")}
    for tid, lp, alts in entries:
        text = text_of(tid)
        tops = {text_of(a): finite(b) for a, b in alts[:top]}
        tops.setdefault(text, finite(lp))
        for key, value in zip(out, (text, finite(lp), tops, state.text_offset)):
            out[key].append(value)
        state.text_offset += len(text)
    return out


def response(kind: str, rid: str, created: int, model: str, choices: list[dict], **extra) -> dict:
    return {"id": rid, "object": kind, "created": created, "model": model, "choices": choices,
            **extra}


def chunker(kind: str, rid: str, created: int, model: str, include_usage: bool) -> Callable:
    """Stream chunks; with include_usage every one has ``usage: null`` but the last, as OpenAI's."""
    more = {"usage": None} if include_usage else {}
    return lambda choices, **kw: response(kind, rid, created, model, choices, **{**more, **kw})


def sse(data: dict) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"
