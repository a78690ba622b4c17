"""One INFO line per ended request (per choice), and one per request refused before it reached the
backend: what an operator greps for when a user reports "my request was slow", "it stopped early"
or "I got a 400". Each line has the HTTP status; a refusal or an error carries the message the
client got. Prompt texts stay out of the log unless the server was started with
``--log-requests``: they may be private.
"""

from __future__ import annotations

import time
from typing import Any, Iterable

from minisgl.server.openai.bodies import ChoiceState
from minisgl.server.openai.errors import ApiError
from minisgl.utils import init_logger

logger = init_logger(__name__)
MAX_PROMPT_CHARS = 2000  # of a logged prompt (its repr); the rest is elided


def log_request(rid: str, states: Iterable[ChoiceState], arrival: float, failed: bool,
                prompt: Any = None, error: ApiError | None = None) -> None:
    """Log each choice of one HTTP request that ended; ``prompt`` (when given) is logged once;
    ``error``: what the client was answered, when the request failed."""
    now = time.time()
    states = list(states)
    for state in states:
        reason = state.finish_reason or ("error" if failed else "abort")
        status = error.status if error is not None else 499 if reason == "abort" else 200
        ttft = f"{state.first_token_at - arrival:.3f}s" if state.first_token_at else "-"
        name = rid if len(states) == 1 else f"{rid}/{state.index}"
        logger.info("request %s: status=%d prompt_tokens=%d output_tokens=%d cached_tokens=%d "
                    "ttft=%s total=%.3fs finish=%s%s", name, status, state.prompt_tokens,
                    len(state.token_ids), state.cached_tokens, ttft, now - arrival, reason,
                    _error(error))
    if prompt is not None:
        text = repr(prompt)
        if len(text) > MAX_PROMPT_CHARS:
            text = f"{text[:MAX_PROMPT_CHARS]}... ({len(text)} characters)"
        logger.info("request %s prompt: %s", rid, text)


def log_refused(method: str, path: str, arrival: float | None, status: int, message: str) -> None:
    """A request answered with an error before any backend request was made (a bad field, a
    missing key, an overloaded server)."""
    total = f"{time.time() - arrival:.3f}s" if arrival is not None else "-"
    logger.info("request refused: %s %s status=%d total=%s error=%s", method, path, status, total,
                _quote(message))


def _error(error: ApiError | None) -> str:
    return f" error={_quote(error.message)}" if error is not None else ""


def _quote(message: str) -> str:
    text = repr(message)
    return text if len(text) <= MAX_PROMPT_CHARS else f"{text[:MAX_PROMPT_CHARS]}..."
