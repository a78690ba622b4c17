"""Warm-up waves: synthetic requests through the scheduler before it reports ready.

On a GPU the kernel warm-up (``minisgl.warmup``) has compiled every Triton variant by then (the
sampler's continue in the background); the waves run the greedy path of each size class
(prefill sizes across the kernels' thresholds, a prefix hit, mixed steps, decode batches too
large for a CUDA graph) so that the rest a first request would pay is paid here: cuBLAS's
algorithm choice for each new shape, fla's autotuning, the first launch of each kernel. Without
the kernel warm-up (it found no variants, or on a CPU) they also run every sampler path, a
grammar and prompt log-probs, which compiles their kernels the slow way, one wave after another.
The grammar compiler's tables are built in the background meanwhile
(``GrammarManager.prepare``) and waited for at the end (``TABLES_WAIT_S`` at most), so that a
first constrained request after ready does not wait for them. Every request runs to completion
through the ordinary ``add_request`` / ``step`` path, so every TP rank, given the same plan,
builds the same batches.

What it leaves behind: the prompts' KV as evictable prefix-cache entries (valid KV, evicted first
under pressure) and nothing else; the prefix-cache hit counter is reset.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable, Protocol

from minisgl.core import SamplingParams
from minisgl.utils import init_logger
from minisgl.utils.hf import has_tokenizer
from minisgl.warmup.plan import sampler_variants

if TYPE_CHECKING:
    from minisgl.engine import Engine
    from minisgl.speculative import SpecDecoder
    from minisgl.warmup.kernels import KernelWarmup

    from .cache import CacheCoordinator
    from .config import SchedulerConfig
    from .grammar import GrammarManager

logger = init_logger(__name__)

TABLES_WAIT_S = 60  # the longest the warm-up waits for the grammar tables after its waves


class WarmUpTarget(Protocol):
    """What the warm-up drives: a ``Scheduler``, or the offline TP front that forwards to one."""

    config: SchedulerConfig
    engine: Engine
    cache: CacheCoordinator
    spec: SpecDecoder | None
    grammar: GrammarManager
    kernels: KernelWarmup | None

    @property
    def has_work(self) -> bool: ...

    @property
    def max_context_len(self) -> int: ...

    def add_request(self, uid: int, input_ids: list[int], params: SamplingParams) -> object: ...

    def step(self) -> list: ...

# far above any id the tokenizer workers or the offline LLM hand out
WARMUP_UID_BASE = 1 << 62
# prompt lengths of the prefill wave on CUDA: 1, odd and multiple-of-16 sizes, and one on each side
# of the FP8 GEMM thresholds (32, 96, 256 tokens) and the piecewise-graph sizes
_CUDA_PREFILL_LENS = (1, 2, 7, 16, 33, 64, 97, 130, 255, 300, 520, 1000, 2100, 4100)

@dataclass
class Wave:
    """Requests run together: each enters after ``after_steps`` steps of the wave (mixed steps)."""

    name: str
    # (steps of the wave before it enters, prompt, params)
    requests: list[tuple[int, list[int], SamplingParams]] = field(default_factory=list)

    def add(self, ids: list[int], params: SamplingParams, after_steps: int = 0) -> None:
        self.requests.append((after_steps, ids, params))


def warmup_plan(*, vocab_size: int, max_context_len: int, max_prefill_tokens: int,
                max_running_reqs: int, graph_max_bs: int, cuda: bool, grammar: bool,
                avoid: frozenset[int] = frozenset(), sampler: bool = True,
                reference: bool = False) -> list[Wave]:
    """The waves to run. On CUDA every variant; on CPU (no Triton kernels, no graphs) one wave of
    one short request per sampler path, which still builds the grammar tables. ``avoid``: ids no
    prompt may hold (a vision model's image token, which comes with an image only).
    ``sampler=False``: no sampler waves (the kernel warm-up compiles those variants in the
    background, and a batch that needs one meanwhile samples on the torch reference,
    ``scheduler/warming.py``). ``reference``: one request with every sampler feature, a grammar
    too where one can be compiled, run while those stages still compile, so that the
    reference's first launch of each torch kernel (sort, scan, top-k, the mask's: loaded on
    first use) is not a first request's, nor the wait for the grammar compiler's tables."""
    rng = random.Random(0)
    low = min(1000, vocab_size // 2)

    base = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    # room for the longest output of the plan (the mixed wave's 24 tokens)
    longest = max(1, max_context_len - 25)

    def prompt(n: int) -> list[int]:
        ids = [rng.randrange(low, vocab_size) for _ in range(min(n, longest))]
        return [low if t in avoid else t for t in ids]

    waves: list[Wave] = []
    if cuda:
        lens = sorted({min(n, longest) for n in (*_CUDA_PREFILL_LENS, max_prefill_tokens + 37)})
        for n in lens:  # one wave each: a forward of exactly that many tokens
            waves.append(Wave(f"prefill {n}", [(0, prompt(n), base)]))
        shared = prompt(min(600, longest // 2))
        hit = Wave("prefix hit")
        hit.add(shared, base)
        extra = prompt(min(45, longest - len(shared)))
        hit.add(shared + extra, base, after_steps=4)  # off a page boundary
        waves.append(hit)
        mixed = Wave("mixed steps")
        mixed.add(prompt(20), replace(base, max_tokens=24))
        for i, n in enumerate((100, 700, 3000)):
            mixed.add(prompt(n), base, after_steps=2 + 3 * i)
        waves.append(mixed)
        if max_running_reqs > graph_max_bs:  # eager decode batches (also with graphs off)
            big = Wave("decode beyond the graphs")
            rows = graph_max_bs + 1 if graph_max_bs else 33  # 33: odd, past one 32-row tile
            for _ in range(min(max_running_reqs, rows)):
                big.add(prompt(4), replace(base, max_tokens=4))
            waves.append(big)
    length = 40 if cuda else 8
    variants = sampler_variants(base, grammar)
    if not sampler:
        if reference:
            every = "penalties+bias+grammar+logprobs20" if grammar else "penalties+bias+logprobs20"
            waves.append(Wave("sampler reference", [(0, prompt(length), variants[every])]))
        return waves
    for name, params in variants.items() if cuda else ():  # each alone, two rows (batched kernels)
        wave = Wave(f"sampler {name}")
        wave.add(prompt(length), params)
        wave.add(prompt(length + 3), params)
        waves.append(wave)
    together = Wave("sampler paths together")
    for params in variants.values():
        together.add(prompt(length), params)
    waves.append(together)
    return waves


def run_warmup(scheduler: WarmUpTarget, waves: list[Wave],
               should_stop: Callable[[], bool] = lambda: False) -> float:
    """Run ``waves`` through ``scheduler``; return the seconds it took. Outputs are dropped;
    every request runs to its end."""
    start = time.perf_counter()
    uid = WARMUP_UID_BASE
    for wave in waves:
        pending = sorted(wave.requests, key=lambda r: r[0])
        steps = 0
        while pending or scheduler.has_work:
            if should_stop():
                return time.perf_counter() - start
            while pending and pending[0][0] <= steps:
                _, ids, params = pending.pop(0)
                try:
                    scheduler.add_request(uid, ids, params)
                except ValueError as e:  # a kind this engine serves to nobody (no tokenizer)
                    logger.info("warm-up: skipped a request (%s)", e)
                uid += 1
            scheduler.step()
            steps += 1
    scheduler.cache.flush_prefix_cache()  # its random prompts are nobody's prefix
    scheduler.cache.num_hit_tokens = 0
    return time.perf_counter() - start


def warm_up(scheduler: WarmUpTarget, should_stop: Callable[[], bool] = lambda: False) -> None:
    """Plan the waves for ``scheduler``'s engine and run them, logging what and how long."""
    engine, config, kernels = scheduler.engine, scheduler.config, scheduler.kernels
    waves = warmup_plan(
        vocab_size=engine.vocab_size, max_context_len=scheduler.max_context_len,
        max_prefill_tokens=config.max_prefill_tokens, max_running_reqs=config.max_running_reqs,
        graph_max_bs=config.engine.cuda_graph_max_bs, cuda=engine.device.type == "cuda",
        # without a tokenizer no request can have a grammar
        grammar=has_tokenizer(config.engine.model_path),
        avoid=frozenset([engine.images.image_token_id] if engine.images is not None else []),
        # compiled in parallel by the kernel warm-up (when it found its variants); the waves
        # load the rest (cuBLAS, fla's autotuning, the first launch of each kernel) on the
        # greedy path
        sampler=kernels is None or kernels.kernels is None,
        reference=kernels is not None and not kernels.done,
    )
    num = sum(len(w.requests) for w in waves)
    logger.info("warm-up: %d requests in %d waves (prefill sizes, mixed steps, %d sampler "
                "variants)", num, len(waves), sum(w.name.startswith("sampler") for w in waves))
    seconds = run_warmup(scheduler, waves, should_stop)
    # ready means a constrained request compiles at once: the compiler's tables, built in the
    # background on an empty cache (seconds beside the kernels' compilation), are waited for,
    # within reason (a constrained request waits for the rest)
    if not scheduler.grammar.wait_prepared(TABLES_WAIT_S):
        logger.warning("warm-up: the grammar compiler's tables are not built after %d s more; "
                       "ready without them (constrained requests wait for them)", TABLES_WAIT_S)
    if scheduler.spec is not None:
        scheduler.spec.reset()
    logger.info("warm-up done in %.1f s", seconds)
