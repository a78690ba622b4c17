"""Tokenization and incremental detokenization, and the worker process that runs them."""

from .detokenize import IncrementalDetokenizer
from .server import tokenize_worker
from .tokenize import TokenizeManager

__all__ = ["IncrementalDetokenizer", "TokenizeManager", "tokenize_worker"]
