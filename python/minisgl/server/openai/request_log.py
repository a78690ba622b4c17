"""One INFO line per ended request (per choice): what an operator greps for when a user reports
"my request was slow" or "it stopped early". Prompt texts stay out of the log unless the server was
started with ``--log-requests``: they may be private.
"""

from __future__ import annotations

import time
from typing import Any, Iterable

from minisgl.server.openai.bodies import ChoiceState
from minisgl.utils import init_logger

logger = init_logger(__name__)
MAX_PROMPT_CHARS = 2000  # of a logged prompt (its repr); the rest is elided


def log_request(rid: str, states: Iterable[ChoiceState], arrival: float, failed: bool,
                prompt: Any = None) -> None:
    """Log each choice of one HTTP request that ended; ``prompt`` (when given) is logged once."""
    now = time.time()
    states = list(states)
    for state in states:
        reason = state.finish_reason or ("error" if failed else "abort")
        ttft = f"{state.first_token_at - arrival:.3f}s" if state.first_token_at else "-"
        name = rid if len(states) == 1 else f"{rid}/{state.index}"
        logger.info("request %s: prompt_tokens=%d output_tokens=%d cached_tokens=%d ttft=%s "
                    "total=%.3fs finish=%s", name, state.prompt_tokens, len(state.token_ids),
                    state.cached_tokens, ttft, now - arrival, reason)
    if prompt is not None:
        text = repr(prompt)
        if len(text) > MAX_PROMPT_CHARS:
            text = f"{text[:MAX_PROMPT_CHARS]}... ({len(text)} characters)"
        logger.info("request %s prompt: %s", rid, text)
