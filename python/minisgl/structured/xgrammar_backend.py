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
from typing import Any, Sequence

import numpy as np
import torch

from minisgl.utils import usable_cpus

from .tables import TokenizerTables, _xgr

KINDS = ("json_schema", "regex", "ebnf")
_CACHE_SIZE = 256  # compiled grammars kept (a compiled JSON schema is tens of kB)
_LOG_PREFIX = re.compile(r"^\[[0-9:]+\] \S+:\d+: (Check failed: .*? is false: )?")


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


def fill_threads() -> int:
    """Threads of the batched mask fill: ``MINISGL_GRAMMAR_THREADS``, else half the CPUs this
    process may run on (the scheduler's own thread and the tokenizers keep the rest), at most 8."""
    from minisgl.env import GRAMMAR_THREADS

    if GRAMMAR_THREADS.get() != "auto":
        return max(1, int(GRAMMAR_THREADS.get()))
    return max(1, min(8, usable_cpus() // 2))


def new_bitmask(batch_size: int, vocab_size: int) -> torch.Tensor:
    """An all-allowed int32 ``[B, ceil(V / 32)]`` mask on the host. (numpy fills it: torch's
    intra-op thread pool costs milliseconds here on a busy machine.)"""
    return torch.from_numpy(np.full((batch_size, (vocab_size + 31) // 32), -1, dtype=np.int32))


class GrammarCompiler:
    """Compiles grammars for one tokenizer and keeps the last ``_CACHE_SIZE`` of them.

    ``vocab_size`` is the width of the model's logits, which may exceed the tokenizer's vocabulary
    (padding): ids without a token are never allowed. xgrammar fills only the tokenizer's words
    (``fill_vocab_size``, its vocabulary rounded up to 32 ids: Qwen's 151,936 logits with a
    49,152-token tokenizer are 4,748 words, of which xgrammar writes 1,536); a constrained row's
    words past them are zero. Host masks are ``mask_vocab_size`` wide (the wider of the two) and
    cut to the logits' width. ``stop_token_ids`` are the ids that end a request once its grammar
    is complete (the model's EOS ids). ``tokenizer``: a transformers tokenizer, or its tables
    (``TokenizerTables``, which already hold the stop ids: e.g. read from a cache by
    ``load_tables``). Thread-safe: the scheduler compiles on a worker thread.
    """

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: tuple[int, ...] = (),
                 max_threads: int | None = None) -> None:
        tables = tokenizer if isinstance(tokenizer, TokenizerTables) \
            else TokenizerTables.from_tokenizer(tokenizer, stop_token_ids)
        self.vocab_size = vocab_size
        self.fill_vocab_size = tables.fill_vocab_size
        self.mask_vocab_size = max(vocab_size, self.fill_vocab_size)
        self.stop_token_ids = frozenset(tables.info.stop_token_ids)  # those that can end a grammar
        if max_threads is None:  # a schema's compile stopped gaining beyond four threads
            max_threads = min(4, max(2, fill_threads()))
        self._compiler = _xgr().GrammarCompiler(tables.info, max_threads=max_threads,
                                                cache_enabled=False)
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
        return Matcher(_xgr().GrammarMatcher(compiled), self.fill_vocab_size // 32)


class Matcher:
    """One request's position in its grammar."""

    def __init__(self, matcher: Any, fill_words: int) -> None:
        self._matcher, self._words = matcher, fill_words

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the allowed next tokens into ``bitmask[row]`` (a contiguous host tensor at least
        ``fill_words`` wide). The per-row reference of ``BatchMasks.fill``."""
        if bitmask.shape[1] == self._words:
            self._matcher.fill_next_token_bitmask(bitmask, row)
            return
        narrow = torch.empty((1, self._words), dtype=torch.int32)  # xgrammar ignores strides
        self._matcher.fill_next_token_bitmask(narrow, 0)
        bitmask[row, :self._words] = narrow[0]
        bitmask[row, self._words:] = 0

    def accept(self, token: int) -> bool:
        """Advance by ``token``; False if the grammar does not allow it."""
        return bool(self._matcher.accept_token(token))

    @property
    def terminated(self) -> bool:
        """The grammar is complete and its stop token was accepted."""
        return bool(self._matcher.is_terminated())


class BatchMasks:
    """The masks of a batch, filled by xgrammar's thread pool into a reused host buffer.

    The buffer is ``fill_words`` wide (xgrammar needs contiguous rows of its vocabulary's width)
    and pinned when CUDA is there, so the copy to the device is asynchronous; ``to_device`` widens
    it there to the logits' words (zero past the tokenizer for constrained rows, all-ones for free
    ones). Only rows whose kind changed since the last fill are reset to all-ones.
    """

    def __init__(self, compiler: GrammarCompiler, threads: int | None = None) -> None:
        self.fill_words = compiler.fill_vocab_size // 32
        self.words = (compiler.vocab_size + 31) // 32
        self.threads = threads or fill_threads()
        self._batch = _xgr().BatchGrammarMatcher(self.threads)
        self._pin = torch.cuda.is_available()
        self._buf = self._np = self._tail_np = None
        self._filled = np.zeros(0, dtype=bool)  # rows xgrammar wrote last time (others are -1)
        self._tail = None  # [rows, 1] int32: 0 for a constrained row, -1 for a free one
        self._copied = None  # the event after the last copy out of the buffer

    def _reserve(self, rows: int) -> None:
        if self._buf is not None and self._buf.shape[0] >= rows:
            return
        cap = max(64, 1 << (rows - 1).bit_length())
        with torch.inference_mode(False):  # the engine asks in inference mode; these outlive it
            self._buf = torch.full((cap, self.fill_words), -1, dtype=torch.int32,
                                   pin_memory=self._pin)
            self._tail = torch.full((cap, 1), -1, dtype=torch.int32, pin_memory=self._pin)
        self._np, self._tail_np = self._buf.numpy(), self._tail.numpy()
        self._filled = np.zeros(cap, dtype=bool)

    def fill(self, matchers: Sequence[Matcher | None]) -> torch.Tensor:
        """The ``[B, fill_words]`` host mask of a batch (None: a free row). Valid until the next
        call."""
        rows = len(matchers)
        if self._copied is not None:
            self._copied.synchronize()  # the last copy out of the buffer has finished
        self._reserve(rows)
        idx = [i for i, m in enumerate(matchers) if m is not None]
        want = np.zeros(rows, dtype=bool)
        want[idx] = True
        stale = np.flatnonzero(self._filled[:rows] & ~want)
        if stale.size:
            self._np[stale] = -1
        self._filled[:rows] = want
        self._tail_np[:rows, 0] = np.where(want, 0, -1)
        if idx:
            self._batch.batch_fill_next_token_bitmask(
                [matchers[i]._matcher for i in idx], self._buf, idx)
        return self._buf[:rows]

    def to_device(self, mask: torch.Tensor, device: torch.device) -> torch.Tensor:
        """``mask`` (from ``fill``) on ``device``, ``words`` wide."""
        rows = mask.shape[0]
        cuda = device.type == "cuda"
        if not cuda:  # numpy: torch's CPU ops cost milliseconds here on a busy machine
            out = np.empty((rows, self.words), dtype=np.int32)
            out[:, :self.fill_words] = self._np[:rows, :self.words]
            out[:, self.fill_words:] = self._tail_np[:rows]
            return torch.from_numpy(out).to(device)
        if self.words <= self.fill_words:
            out = mask[:, :self.words].to(device, non_blocking=True)
        else:
            out = torch.cat([mask.to(device, non_blocking=True), self._tail[:rows].to(
                device, non_blocking=True).expand(rows, self.words - self.fill_words)], dim=1)
        self._copied = torch.cuda.Event()
        self._copied.record()
        return out

    @staticmethod
    def accept(matchers: Sequence[Matcher], tokens: Sequence[int]) -> list[bool]:
        """Advance each matcher by its token; False where the grammar does not allow it."""
        return _xgr().BatchGrammarMatcher.batch_accept_token(
            [m._matcher for m in matchers], list(tokens))
