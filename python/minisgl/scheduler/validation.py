"""What a request must satisfy before it is queued: a prompt of known token ids that leaves room
in the context, sampling parameters the vocabulary and the grammar backend accept.

The messages are the ones clients see (the server turns a ``ValueError`` into a 400 naming the
field); the context error keeps OpenAI's and vLLM's wording, which clients match on to shorten
the request."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from minisgl.core import SamplingParams
    from minisgl.engine import Engine
    from minisgl.multimodal.prompt import MultimodalPrompt

    from .grammar import GrammarManager


class ContextLengthError(ValueError):
    """Prompt + max_tokens over the context; ``param`` names the request field to blame."""

    param = "max_tokens"


def check_request(input_ids: list[int], params: SamplingParams, mm: MultimodalPrompt | None,
                  engine: Engine, grammar: GrammarManager,
                  max_context: int) -> MultimodalPrompt | None:
    """Every check below, and the engine's of the images; the request's images (None for
    none)."""
    check_prompt(input_ids, engine.vocab_size, max_context)
    check_params(params, engine.vocab_size, grammar)
    check_context(len(input_ids), params, max_context)
    mm = mm if mm is not None and mm.images else None
    engine.check_images(input_ids, mm)
    return mm


def check_prompt(input_ids: list[int], vocab: int, max_context: int) -> None:
    if len(input_ids) == 0:
        raise ValueError("prompt: must not be empty")
    bad = [t for t in input_ids if not isinstance(t, int) or not 0 <= t < vocab]
    if bad:
        raise ValueError(f"prompt_token_ids: {bad[0]!r} is outside the vocabulary [0, {vocab})")
    if len(input_ids) >= max_context:
        raise ValueError(
            f"prompt: {len(input_ids)} tokens is too long; the maximum context length is "
            f"{max_context} tokens (prompt and output together)"
        )


def check_params(params: SamplingParams, vocab: int, grammar: GrammarManager) -> None:
    bad = [t for t, _ in params.logit_bias if t >= vocab]
    if bad:
        raise ValueError(f"logit_bias: token id {bad[0]} is outside the vocabulary [0, {vocab})")
    grammar.check(params)


def check_context(prompt_len: int, params: SamplingParams, limit: int) -> None:
    """Prompt + ``max_tokens`` must fit the context, unless ``clamp_max_tokens``."""
    total = prompt_len + params.max_tokens
    if total > limit and not params.clamp_max_tokens:
        raise ContextLengthError(
            f"This model's maximum context length is {limit} tokens. However, you requested "
            f"{total} tokens ({prompt_len} in the prompt, {params.max_tokens} in the "
            "completion). Please reduce the length of the prompt or max_tokens.")
