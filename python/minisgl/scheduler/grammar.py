"""Structured output in the scheduler: one grammar matcher per constrained request.

A constrained request's grammar compiles on a worker thread while its prompt is prefilled: the
request joins the prefill queue at once, and only the token that samples waits for the grammar
(``pending``: the prefill holds its last position back meanwhile), so neither this request nor
any batch waits for a compiler. With the warm-up on, the compiler (the tokenizer's tables) and
the ``json_object`` grammar build in the background from the scheduler's start (``start``).
Before sampling the manager fills the bitmask rows of the sampled requests in one batched call
(``structured.BatchMasks``: xgrammar's threads, a reused pinned buffer; unconstrained rows allow
everything); after it, the constrained requests' matchers accept their sampled tokens in one
call, and a grammar that has terminated ends its request (one that rejected its token aborts
it: a grammar no token of the vocabulary can follow). The mask of step N+1 depends on
token N: the engine runs the forward of N+1 first and asks for the mask
(``BatchSamplingArgs.late_bitmask``) just before sampling, while the host reads N back and
advances the matchers, so only the sampling of a constrained batch waits for the host.

With tensor parallelism every rank must build the same batches, so there compilation is
synchronous (a worker thread would finish at a different step on each rank).
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Callable

import torch

from minisgl.utils import init_logger

if TYPE_CHECKING:
    from minisgl.core import Req, SamplingParams
    from minisgl.structured import BatchMasks, GrammarCompiler, Matcher

    from .config import SchedulerConfig
    from .output import FinishReason

logger = init_logger(__name__)

# ``response_format: json_object`` as the API hands it over (``server/openai/structured.py``)
JSON_OBJECT = ("json_schema", '{"type": "object"}')


class GrammarManager:
    def __init__(self, model_path: str, vocab_size: int, eos_token_ids: tuple[int, ...],
                 synchronous: bool = False, tables_dir: str | None = None) -> None:
        self.model_path, self.vocab_size, self.eos = model_path, vocab_size, eos_token_ids
        self.synchronous = synchronous
        self.tables_dir = tables_dir  # where the tokenizer's tables are kept (``load_tables``)
        self._prepared: Future | None = None
        self.matchers: dict[int, Matcher] = {}  # uid -> matcher of an admitted request
        self.compiling: dict[int, tuple[Req, Future]] = {}
        self._compiler: GrammarCompiler | None = None
        self._masks: BatchMasks | None = None  # built with the compiler
        self._pool: ThreadPoolExecutor | None = None

    @classmethod
    def start(cls, config: SchedulerConfig) -> GrammarManager:
        """The manager of ``config``'s scheduler; with the warm-up on, the compiler's tables and
        ``json_object`` start building at once, beside the engine's start-up (``prepare``), and
        on a GPU the tables are kept in the kernel cache (read back by a restart)."""
        from minisgl.models.config import ModelConfig

        tables_dir = None
        if config.warmup and config.engine.device.type == "cuda":
            from minisgl.env import kernel_cache_root

            tables_dir = config.engine.kernel_cache_dir or kernel_cache_root()
        vocab = ModelConfig.from_path(config.engine.model_path).vocab_size
        manager = cls(config.engine.model_path, vocab, tuple(config.eos_token_ids),
                      synchronous=config.engine.tp.size > 1, tables_dir=tables_dir)
        if config.warmup:
            manager.prepare()
        return manager

    @staticmethod
    def check(params: SamplingParams) -> None:
        """Raise ``ValueError`` naming the field for a grammar that does not parse."""
        if params.grammar is not None:
            from minisgl.structured import check_grammar

            check_grammar(*params.grammar)

    @property
    def active(self) -> bool:
        return bool(self.matchers or self.compiling)

    def add(self, req: Req) -> None:
        """Start ``req``'s grammar (compiled at once when synchronous, else ``pending`` until
        ``ready()`` hands it over)."""
        grammar = req.sampling_params.grammar
        if grammar is None:
            return
        if self.synchronous:
            self.matchers[req.uid] = self._compile(*grammar)
            return
        self.compiling[req.uid] = (req, self._worker().submit(self._compile, *grammar))

    def pending(self, req: Req) -> bool:
        """Whether ``req``'s grammar is still compiling (it must not sample yet)."""
        return req.uid in self.compiling

    def prepare(self) -> None:
        """Build the compiler and the ``json_object`` grammar ahead of the first request that
        needs them (in the background; at once when synchronous). Needs the tokenizer."""
        from minisgl.utils.hf import has_tokenizer

        if not has_tokenizer(self.model_path):
            return
        if self.synchronous:
            self._compile(*JSON_OBJECT)
        else:
            self._prepared = self._worker().submit(self._compile, *JSON_OBJECT)

    def wait_prepared(self, timeout: float | None = None) -> bool:
        """Block until ``prepare``'s work is over, or ``timeout`` seconds; whether it is
        (``python -m minisgl warmup``: its tables are then in the cache)."""
        if self._prepared is not None:
            wait([self._prepared], timeout)
            return self._prepared.done()
        return True

    def _worker(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="grammar")
        return self._pool

    def _compile(self, kind: str, source: str) -> Matcher:
        if self._compiler is None:
            from minisgl.structured import BatchMasks, GrammarCompiler, load_tables

            tables = load_tables(self.model_path, self.eos, self.tables_dir)
            if tables is None:
                raise ValueError(f"{kind}: structured output needs the model's tokenizer")
            compiler = GrammarCompiler(tables, self.vocab_size)
            self._masks, self._compiler = BatchMasks(compiler), compiler
        return self._compiler.matcher(self._compiler.compile(kind, source))

    def ready(self) -> tuple[list[Req], list[Req]]:
        """Requests whose grammar compiled since the last call, and those whose grammar failed
        (logged; the caller ends them)."""
        done, failed = [], []
        for uid, (req, future) in list(self.compiling.items()):
            if not future.done():
                continue
            del self.compiling[uid]
            try:
                self.matchers[uid] = future.result()
                done.append(req)
            except Exception:
                logger.exception("compiling the grammar of request %d failed", uid)
                failed.append(req)
        return done, failed

    def remove(self, req: Req) -> bool:
        """Forget ``req``; True if it was still compiling (its result is dropped)."""
        self.matchers.pop(req.uid, None)
        return self.compiling.pop(req.uid, None) is not None

    def constrains(self, reqs: list[Req]) -> bool:
        return any(req.uid in self.matchers for req in reqs)

    def bitmask(self, reqs: list[Req], device: torch.device,
                before: Callable[[], None] | None = None) -> torch.Tensor | None:
        """The allowed-token mask of a batch's sampled requests, or None if none is constrained.

        ``before`` runs first: it reads the previous forward back, so that every matcher has
        accepted the latest token. The engine calls this between the forward and sampling, inside
        inference mode; host bookkeeping must not create inference tensors, hence the exit."""
        if before is not None:
            with torch.inference_mode(False):
                before()
        matchers = [self.matchers.get(req.uid) for req in reqs]
        if not any(matchers) or self._masks is None:
            return None
        return self._masks.to_device(self._masks.fill(matchers), device)

    def accept(self, reqs: list[Req], tokens: list[int]) -> dict[int, FinishReason]:
        """Advance the grammars of ``reqs`` (one batch) by their tokens, in one call to xgrammar;
        the requests that must end, uid -> finish reason: ``stop`` where the grammar terminated,
        ``abort`` where it rejected the token (the mask should make that impossible; it happens
        when the grammar allows no token of the vocabulary at all, and the token sampled from an
        empty mask is not an answer)."""
        rows = [(req, token, self.matchers[req.uid]) for req, token in zip(reqs, tokens)
                if req.uid in self.matchers]
        if not rows:
            return {}
        from minisgl.structured import BatchMasks

        ended: dict[int, FinishReason] = {}
        assert self._compiler is not None  # a matcher exists: the compiler built it
        stops = self._compiler.stop_token_ids
        accepted = BatchMasks.accept([m for _, _, m in rows], [t for _, t, _ in rows])
        for (req, token, matcher), ok in zip(rows, accepted):
            if not ok:
                logger.error("request %d: token %d breaks its grammar; aborting it", req.uid,
                             token)
                ended[req.uid] = "abort"
            elif token in stops and matcher.terminated:  # only a stop token terminates
                ended[req.uid] = "stop"
        return ended

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
