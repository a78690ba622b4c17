"""The vocabulary of the engine: sampling parameters, requests and batches.

`Req` keeps three counters over its token list (``input_ids``: prompt, then generated tokens)::

    0 ........ cached_len ........ device_len ........ len(input_ids) .... max_device_len
    |  KV stored  |  KV being computed |  known, not yet fed  |  room left to generate  |

"Stored" includes KV written by forwards already launched on the device (stream order makes it
available to every later forward). Under overlap scheduling ``input_ids`` may lag one token behind
``device_len`` while a decode forward is in flight. Everything else is derived from the counters.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch

if TYPE_CHECKING:
    from minisgl.kvcache.base import BaseCacheHandle

__all__ = ["SamplingParams", "Req", "Batch", "BaseAttnMetadata"]

_MAX_TOP_LOGPROBS = 20


def _check(ok: bool, field_name: str, message: str) -> None:
    if not ok:
        raise ValueError(f"{field_name}: {message}")


@dataclass(frozen=True)
class SamplingParams:
    """How one request samples. Validated at construction; a bad value raises ``ValueError``
    naming it.

    ``temperature == 0`` means greedy. ``top_k == -1`` (or 0) disables top-k. ``seed=None`` draws a
    fresh seed per request; a fixed seed gives the same tokens whatever else shares the batch.
    ``logprobs`` asks for the chosen token's log-probability, ``top_logprobs`` for that many
    alternatives as well. ``prompt_logprobs`` asks for the log-probs of the prompt's tokens from
    index ``logprob_start_len`` on (index 0 has none), with ``top_logprobs`` alternatives each;
    ``max_tokens == 0`` runs the prompt only (for its log-probs) and generates nothing. A prompt
    plus ``max_tokens`` beyond the model's context is refused (``ValueError`` naming max_tokens),
    unless ``clamp_max_tokens``: then ``max_tokens`` is a ceiling, cut to what the context leaves.
    """

    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    max_tokens: int = 16
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int = 0
    # token id -> bias in [-100, 100] added to the logit before temperature (OpenAI's logit_bias);
    # a dict is accepted and kept as sorted (id, bias) pairs so that the params stay hashable
    logit_bias: tuple[tuple[int, float], ...] = ()
    # structured output: at most one grammar, whose allowed-token mask the sampler applies
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None
    prompt_logprobs: bool = False
    logprob_start_len: int = 0
    clamp_max_tokens: bool = False

    def __post_init__(self) -> None:
        def number(name: str) -> float:
            value = getattr(self, name)
            _check(
                isinstance(value, (int, float)) and not isinstance(value, bool),
                name,
                f"must be a number, got {value!r}",
            )
            _check(math.isfinite(value), name, f"must be finite, got {value!r}")
            return value

        def integer(name: str) -> int:
            value = getattr(self, name)
            _check(
                isinstance(value, int) and not isinstance(value, bool),
                name,
                f"must be an integer, got {value!r}",
            )
            return value

        _check(number("temperature") >= 0, "temperature", "must be >= 0")
        _check(integer("top_k") >= -1, "top_k", "must be -1 (disabled) or >= 1")
        _check(0 < number("top_p") <= 1, "top_p", "must be in (0, 1]")
        _check(0 <= number("min_p") <= 1, "min_p", "must be in [0, 1]")
        _check(-2 <= number("presence_penalty") <= 2, "presence_penalty", "must be in [-2, 2]")
        _check(-2 <= number("frequency_penalty") <= 2, "frequency_penalty", "must be in [-2, 2]")
        _check(number("repetition_penalty") > 0, "repetition_penalty", "must be > 0")
        _check(integer("max_tokens") >= 0, "max_tokens", "must be >= 0")
        _check(isinstance(self.ignore_eos, bool), "ignore_eos", "must be a boolean")
        _check(isinstance(self.clamp_max_tokens, bool), "clamp_max_tokens", "must be a boolean")
        _check(isinstance(self.logprobs, bool), "logprobs", "must be a boolean")
        _check(isinstance(self.prompt_logprobs, bool), "prompt_logprobs", "must be a boolean")
        _check(integer("logprob_start_len") >= 0, "logprob_start_len", "must be >= 0")
        top = integer("top_logprobs")
        _check(0 <= top <= _MAX_TOP_LOGPROBS, "top_logprobs",
               f"must be in [0, {_MAX_TOP_LOGPROBS}]")
        if self.seed is not None:
            _check(integer("seed") >= 0, "seed", "must be a non-negative integer")
        object.__setattr__(self, "stop_token_ids",
                           _as_tuple(self.stop_token_ids, int, "stop_token_ids"))
        object.__setattr__(self, "stop", _as_tuple(self.stop, str, "stop"))
        for token in self.stop_token_ids:
            _check(token >= 0, "stop_token_ids", f"token ids must be >= 0, got {token}")
        for text in self.stop:
            _check(len(text) > 0, "stop", "stop strings must not be empty")
        object.__setattr__(self, "logit_bias", _as_bias(self.logit_bias))
        grammars = [name for name in ("json_schema", "regex", "ebnf")
                    if getattr(self, name) is not None]
        for name in grammars:
            _check(isinstance(getattr(self, name), str), name, "must be a string")
        _check(len(grammars) <= 1, grammars[-1] if grammars else "", "give at most one of "
               "json_schema, regex and ebnf")

    @property
    def grammar(self) -> tuple[str, str] | None:
        """``(kind, source)`` of the structured-output grammar, or None."""
        for kind in ("json_schema", "regex", "ebnf"):
            if getattr(self, kind) is not None:
                return kind, getattr(self, kind)
        return None

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1

    @property
    def needs_penalties(self) -> bool:
        return (
            self.presence_penalty != 0
            or self.frequency_penalty != 0
            or self.repetition_penalty != 1
        )


_MAX_LOGIT_BIAS = 100.0


def _as_bias(value: Any) -> tuple[tuple[int, float], ...]:
    """Normalise ``logit_bias`` (a mapping or (id, bias) pairs; JSON gives string keys) to sorted
    pairs of ``(token id >= 0, bias in [-100, 100])``."""
    if value is None:
        return ()
    items = value.items() if isinstance(value, dict) else value
    _check(isinstance(items, (list, tuple)) or isinstance(value, dict), "logit_bias",
           "must be a mapping of token id to bias")
    pairs: dict[int, float] = {}
    for item in items:
        _check(isinstance(item, (list, tuple)) and len(item) == 2, "logit_bias",
               "must be a mapping of token id to bias")
        key, bias = item
        if isinstance(key, str) and key.strip().lstrip("-").isdigit():
            key = int(key)
        _check(isinstance(key, int) and not isinstance(key, bool) and key >= 0, "logit_bias",
               f"keys must be token ids >= 0, got {key!r}")
        _check(isinstance(bias, (int, float)) and not isinstance(bias, bool)
               and math.isfinite(bias) and abs(bias) <= _MAX_LOGIT_BIAS, "logit_bias",
               f"the bias of token {key} must be a number in [-100, 100], got {bias!r}")
        pairs[key] = float(bias)
    return tuple(sorted(pairs.items()))


def _as_tuple(value: Any, kind: type, name: str) -> tuple:
    """Normalise a scalar or a sequence to a tuple of ``kind`` (the frozen dataclass stays
    hashable)."""
    if value is None:
        return ()
    if isinstance(value, kind) and not isinstance(value, bool):
        return (value,)
    _check(isinstance(value, (list, tuple)), name, f"must be a list of {kind.__name__}")
    for item in value:
        _check(
            isinstance(item, kind) and not isinstance(item, bool),
            name,
            f"every item must be a {kind.__name__}, got {item!r}",
        )
    return tuple(value)


@dataclass(eq=False)
class Req:
    """One request inside the scheduler. See the module docstring for the three counters."""

    uid: int
    input_ids: list[int]
    prompt_len: int
    sampling_params: SamplingParams
    max_device_len: int
    table_idx: int = -1
    cached_len: int = 0
    device_len: int = 0
    cache_handle: BaseCacheHandle | None = None
    cache_hit_len: int = 0  # prompt tokens served from the prefix cache at first admission
    # hybrid models: a prefill chunk ends here so that the state there can be kept (a branch point
    # of the prefix cache without a state snapshot; kvcache/hybrid_radix.py); 0: none
    snapshot_at: int = 0
    seed: int = 0
    # speculative decoding: draft tokens at the end of ``input_ids`` that the forward in flight
    # verifies (``minisgl/spec/``); 0 outside a verify step
    draft_len: int = 0
    # hybrid models: the first state slot of the draft group this verify step writes (-1: none)
    draft_slot: int = -1

    def __post_init__(self) -> None:
        assert 0 <= self.cached_len <= self.device_len <= self.max_device_len, self

    @property
    def extend_len(self) -> int:
        """Tokens computed in the current forward."""
        return self.device_len - self.cached_len

    @property
    def pending_len(self) -> int:
        """Known tokens not yet fed to the model (1 for a request that is decoding)."""
        return len(self.input_ids) - self.device_len

    @property
    def output_len(self) -> int:
        return len(self.input_ids) - self.prompt_len

    def append_token(self, token: int) -> None:
        self.input_ids.append(token)


Phase = Literal["prefill", "decode", "mixed"]


class BaseAttnMetadata:
    """Whatever tensors an attention backend derives from a batch (lengths, page-table rows, ...);
    each backend subclasses it (``minisgl.attention``)."""


@dataclass(eq=False)
class Batch:
    """The requests of one forward and the tensors built for it.

    ``input_ids``/``positions``/``out_loc`` hold one entry per computed token (requests back to
    back); ``out_loc`` is the KV slot each token's K/V is written to. ``logits_idx`` picks the rows
    whose logits are sampled (the last token of each sampled request), ``sample_loc`` where the
    sampled tokens go in the engine's token pool.

    A ``mixed`` batch is a decode step and prefill chunks in one forward: its first ``num_decode``
    requests are decoding (one token each, read from the token pool), the rest are prefilling.
    """

    reqs: list[Req]
    phase: Phase
    input_ids: torch.Tensor | None = None
    positions: torch.Tensor | None = None
    out_loc: torch.Tensor | None = None
    # the slots of the sliding-window layers' own slot space, when the engine frees their pages
    # past the window (``scheduler/cache.py``); None: every layer writes at ``out_loc``
    window_out_loc: torch.Tensor | None = None
    logits_idx: torch.Tensor | None = None
    sample_loc: tuple[torch.Tensor, torch.Tensor] | None = None  # (row, position) of new tokens
    # a decode batch that replays a CUDA graph: its new tokens' KV slots (host), which the graph
    # writes into the device page table itself (``CacheManager.flush(new_tokens_of=...)``)
    out_slots: list[int] | None = None
    attn_metadata: BaseAttnMetadata | None = None
    # hybrid models: where each request's recurrent state lives (layers/linear_attention.py)
    state_metadata: Any = None
    num_decode: int = 0  # mixed batches: the leading requests that decode
    # a verify step fed as one-token decode rows (``spec/rows.py``): ``reqs`` are the rows, these
    # their requests (what is sampled), and the drafts written to the token pool first
    # (page-table rows, positions, tokens)
    row_reqs: list[Req] | None = None
    draft_tokens: list[list[int]] | None = None

    @property
    def size(self) -> int:
        return len(self.reqs)

    @property
    def is_prefill(self) -> bool:
        return self.phase == "prefill"

    @property
    def is_decode(self) -> bool:
        return self.phase == "decode"

    @property
    def is_mixed(self) -> bool:
        return self.phase == "mixed"

    @property
    def num_decode_rows(self) -> int:
        """How many leading requests decode (all of a decode batch, none of a prefill)."""
        return self.size if self.is_decode else self.num_decode if self.is_mixed else 0

    @property
    def num_tokens(self) -> int:
        return sum(req.extend_len for req in self.reqs)

    @property
    def sampled_reqs(self) -> list[Req]:
        """Requests that get a new token: every decode request, and the prefills that feed their
        last known token. (Under overlap scheduling a decoding request's ``input_ids`` may lag one
        token behind its counters, so decode does not look at them.)"""
        if self.is_decode:
            return self.reqs if self.row_reqs is None else self.row_reqs
        n = self.num_decode_rows
        fed = [req for req in self.reqs[n:] if req.device_len == len(req.input_ids)]
        return self.reqs[:n] + fed
