"""Sampling parameters: how one request samples, validated at construction."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["SamplingParams"]

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
        pairs[int(key)] = float(bias)
    return tuple(sorted(pairs.items()))


def _as_tuple(value: Any, kind: type, name: str) -> tuple:
    """Normalise a scalar or a sequence to a tuple of ``kind`` (the frozen dataclass stays
    hashable)."""
    if value is None:
        return ()
    if isinstance(value, kind) and not isinstance(value, bool):
        return (value,)
    _check(isinstance(value, (list, tuple)), name, f"must be a list of {kind.__name__}")
    items: Any = value  # a list or tuple, checked
    for item in items:
        _check(
            isinstance(item, kind) and not isinstance(item, bool),
            name,
            f"every item must be a {kind.__name__}, got {item!r}",
        )
    return tuple(items)
