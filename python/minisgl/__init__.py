"""minisgl: a compact, fast LLM inference server."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .params import SamplingParams

if TYPE_CHECKING:
    from .llm import LLM

__all__ = ["LLM", "SamplingParams"]
__version__ = "0.1.0"


def __getattr__(name: str):
    # The LLM pulls in torch models and transformers; import it only when asked for.
    if name == "LLM":
        from .llm import LLM

        return LLM
    raise AttributeError(f"module 'minisgl' has no attribute {name!r}")
