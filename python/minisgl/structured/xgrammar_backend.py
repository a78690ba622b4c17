"""The grammar backend, on xgrammar (the default of SGLang and vLLM).

xgrammar splits the vocabulary once per tokenizer into tokens whose acceptance depends on the
grammar's stack and tokens it can decide up front, so filling one request's mask is a small amount
of work per step (tens of microseconds). The mask layout is xgrammar's: int32 ``[B, ceil(V / 32)]``,
bit ``id % 32`` of word ``id // 32`` set means allowed; the sampler reads the same layout.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from typing import Any

import numpy as np
import torch

KINDS = ("json_schema", "regex", "ebnf")
_CACHE_SIZE = 256  # compiled grammars kept (a compiled JSON schema is tens of kB)
_LOG_PREFIX = re.compile(r"^\[[0-9:]+\] \S+:\d+: (Check failed: .*? is false: )?")


def _xgr() -> Any:
    try:
        import xgrammar
    except ImportError as e:  # a runtime dependency; only a broken install gets here
        raise ImportError("structured output needs xgrammar: pip install xgrammar") from e
    return xgrammar


def _message(e: BaseException) -> str:
    """xgrammar's C++ errors start with a timestamp and a source location: keep the reason."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return _LOG_PREFIX.sub("", text)


def _json_schema_grammar(source: str) -> Any:
    # compact separators and no free whitespace: a model cannot stall in endless blank space
    return _xgr().Grammar.from_json_schema(source, any_whitespace=False)


def check_grammar(kind: str, source: str) -> None:
    """Parse a grammar without a tokenizer; a bad one raises ``ValueError`` naming ``kind``."""
    if kind not in KINDS:
        raise ValueError(f"{kind}: unknown grammar kind (expected one of {', '.join(KINDS)})")
    if not isinstance(source, str) or not source.strip():
        raise ValueError(f"{kind}: must be a non-empty string")
    xgr = _xgr()
    parse = {"json_schema": _json_schema_grammar, "regex": xgr.Grammar.from_regex,
             "ebnf": xgr.Grammar.from_ebnf}[kind]
    try:
        parse(source)
    except Exception as e:  # xgrammar raises RuntimeError/ValueError with a C++ message
        raise ValueError(f"{kind}: invalid {kind.replace('_', ' ')}: {_message(e)}") from None


def new_bitmask(batch_size: int, vocab_size: int) -> torch.Tensor:
    """An all-allowed int32 ``[B, ceil(V / 32)]`` mask on the host. (numpy fills it: torch's
    intra-op thread pool costs milliseconds here on a busy machine.)"""
    return torch.from_numpy(np.full((batch_size, (vocab_size + 31) // 32), -1, dtype=np.int32))


class GrammarCompiler:
    """Compiles grammars for one tokenizer and keeps the last ``_CACHE_SIZE`` of them.

    ``vocab_size`` is the width of the model's logits, which may exceed the tokenizer's vocabulary
    (padding): ids without a token are never allowed. Masks are filled ``mask_vocab_size`` wide
    (the wider of the two) and cut to the logits' width. ``stop_token_ids`` are the ids that end
    a request once its grammar is complete (the model's EOS ids). Thread-safe: the scheduler compiles
    on a worker thread.
    """

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: tuple[int, ...] = (),
                 max_threads: int = 2) -> None:
        xgr = _xgr()
        self.vocab_size = vocab_size
        self.mask_vocab_size = max(vocab_size, len(tokenizer))
        info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=self.mask_vocab_size, stop_token_ids=list(stop_token_ids) or None)
        self._compiler = xgr.GrammarCompiler(info, max_threads=max_threads, cache_enabled=False)
        self._cache: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self._lock = threading.Lock()

    def compile(self, kind: str, source: str) -> Any:
        """The compiled grammar; a bad one raises ``ValueError`` naming ``kind``."""
        key = (kind, source)
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        check_grammar(kind, source)
        try:
            if kind == "json_schema":
                compiled = self._compiler.compile_grammar(_json_schema_grammar(source))
            elif kind == "regex":
                compiled = self._compiler.compile_regex(source)
            else:
                compiled = self._compiler.compile_grammar(source)
        except Exception as e:
            raise ValueError(f"{kind}: cannot compile: {_message(e)}") from None
        with self._lock:
            self._cache[key] = compiled
            while len(self._cache) > _CACHE_SIZE:
                self._cache.popitem(last=False)
        return compiled

    def matcher(self, compiled: Any) -> Matcher:
        return Matcher(_xgr().GrammarMatcher(compiled))


class Matcher:
    """One request's position in its grammar."""

    def __init__(self, matcher: Any) -> None:
        self._matcher = matcher

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the allowed next tokens into ``bitmask[row]`` (a host tensor of the compiler's
        ``mask_vocab_size``)."""
        self._matcher.fill_next_token_bitmask(bitmask, row)

    def accept(self, token: int) -> bool:
        """Advance by ``token``; False if the grammar does not allow it."""
        return bool(self._matcher.accept_token(token))

    @property
    def terminated(self) -> bool:
        """The grammar is complete and its stop token was accepted."""
        return bool(self._matcher.is_terminated())
