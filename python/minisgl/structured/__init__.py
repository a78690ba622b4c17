"""Structured output: grammars (JSON schema, regex, EBNF) compiled into per-token masks.

``check_grammar`` validates a grammar without a tokenizer (the API server answers a bad one with a
400 before the request is queued); ``GrammarCompiler`` compiles for one tokenizer and caches by
``(kind, source)``; a ``Matcher`` follows one request's tokens and fills its row of the bitmask;
``BatchMasks`` fills the rows of a whole batch on xgrammar's threads into a reused host buffer;
``load_tables`` builds a tokenizer's tables for the compiler, or reads them from a cache.
"""

from .tables import TokenizerTables, load_tables
from .xgrammar_backend import (
    BatchMasks,
    GrammarCompiler,
    Matcher,
    check_grammar,
    fill_threads,
    new_bitmask,
)

__all__ = ["BatchMasks", "GrammarCompiler", "Matcher", "TokenizerTables", "check_grammar",
           "fill_threads", "load_tables", "new_bitmask"]
