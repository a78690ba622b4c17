"""How the KV memory is split into pages: one pool for every layer, or the full-attention layers'
pool beside the sliding-window layers' own, whose pages past the window go back
(``--sliding-pool-ratio``, ``scheduler/window.py``).

The sliding pool is sized from the cache spec and the engine's limits, with no ratio to work out.
A running request holds at most its window of sliding KV, plus the page the window's start
straddles and the page a radix cache keeps for a resumable end; one forward adds at most
``max_forward_tokens`` more over all requests, so::

    sliding pages = max_running_reqs * (ceil(window / page) + 2) + ceil(max_forward_tokens / page)
                    + 1 (the scratch page), never more than one pool of every layer would hold

Sized so, the sliding pool never turns away a request that one pool would have taken (it holds
every running request's window: the worst case is many requests of about a window each), and the
memory the sliding layers no longer need goes to the full-attention pool. (vLLM counts a sliding
group's need per request the same way, window + batched tokens; SGLang asks the user for the
ratio, ``--swa-full-tokens-ratio``, which is our ``--sliding-pool-ratio``.)

``auto`` (the default) keeps the two pools where they pay: when they save at least
``AUTO_MIN_SAVING`` of the KV memory that one pool of the same full-attention pages would take
(spent on more full-attention pages when the pool is sized from memory). Short contexts, or more
running requests than the memory holds windows for, leave the sliding pool about as large as the
full one, and one pool stays.
"""

from __future__ import annotations

from dataclasses import dataclass

from minisgl.kvcache.spec import CacheSpec

from .config import EngineConfig

# The two pools cost prefix hits on shared prompts longer than a window (their sliding KV is freed
# while the first request runs) and the short prompt's turn during a long chunked prefill; a
# quarter of the KV memory (a third more full-attention tokens) is worth that, a few percent not.
AUTO_MIN_SAVING = 0.25


@dataclass(frozen=True)
class PoolSizes:
    """``full_pages``: the full-attention layers' pages (every layer's, when ``window_pages`` is
    None: one pool); ``window_pages``: the sliding layers' own pool; ``why``: for the log."""

    full_pages: int
    window_pages: int | None
    why: str


def check_sliding_pool_ratio(value: object) -> float | None:
    """``LLM(sliding_pool_ratio=)``/``--sliding-pool-ratio`` as ``EngineConfig`` takes it: None
    for ``auto``, else a number in [0, 1] (0: one pool). ``ValueError`` naming the field."""
    if value == "auto":
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ValueError(f"sliding_pool_ratio: must be 'auto' or a number in [0, 1], got {value!r}")
    return float(value)


def may_window(spec: CacheSpec, ratio: float | None, whole_images: bool = False) -> bool:
    """Whether the sliding layers may get a pool of their own (``auto`` decides later, from the
    memory). An explicit ratio where it cannot work (recurrent layers) is refused.

    ``whole_images``: the model takes images whose tokens attend to each other both ways, so a
    prefill chunk runs on to its image's end past ``max_forward_tokens`` (``scheduler/
    prefill.py``) by up to an image's tokens, which the sizing does not bound (the processor
    decides them): ``auto`` keeps one pool (a pool too small for one chunk would never admit
    it); an explicit ratio is taken as given."""
    if spec.max_window is None or ratio == 0:
        return False
    if spec.has_state:
        if ratio is not None:
            raise ValueError("sliding_pool_ratio: not supported with recurrent layers")
        return False
    return ratio is not None or not whole_images


def window_demand(window: int, config: EngineConfig, max_seq_len: int) -> int:
    """Sliding pages for every running request's window and one forward (module docstring)."""
    ps = config.page_size
    per_request = -(-min(window, max_seq_len) // ps) + 2
    return config.max_running_reqs * per_request + -(-config.max_forward_tokens // ps) + 1


def size_pools(spec: CacheSpec, config: EngineConfig, max_seq_len: int, budget: float | None,
               windowed: bool) -> PoolSizes:
    """The pools' pages for ``budget`` bytes of KV (None: ``config.num_pages`` full-attention
    pages); ``windowed``: ``may_window``'s answer."""
    ps, ratio, dtype = config.page_size, config.sliding_pool_ratio, config.kv_dtype
    full_bytes = spec.kv_bytes_per_token(dtype, 0.0) * ps  # a page of the full layers
    slide_bytes = spec.kv_bytes_per_token(dtype) * ps - full_bytes
    # more than every request at full length could use is wasted memory (+1: the scratch page)
    cap = -(-config.max_running_reqs * max_seq_len // ps) + 1

    def pages(page_bytes: float, spent: float = 0.0) -> int:
        if budget is None:
            assert config.num_pages is not None
            return config.num_pages
        n = min(int((budget - spent) // page_bytes), cap)
        if n < 2:
            raise RuntimeError("no memory left for the KV cache: use a smaller model, a higher "
                               "mem_fraction, or a smaller max_prefill_tokens")
        return n

    one = pages(full_bytes + slide_bytes)
    if not windowed:
        return PoolSizes(one, None, "one pool for every layer")
    window = spec.max_window
    assert window is not None
    if ratio is not None:  # the user's ratio, and at least one request's window and a forward
        full = pages(full_bytes + ratio * slide_bytes)
        least = -(-(window + config.max_forward_tokens) // ps) + 3
        return PoolSizes(full, max(least, int(full * ratio)), f"sliding_pool_ratio {ratio:g}")
    need = min(window_demand(window, config, max_seq_len), one)
    saving = (one - need) / one * slide_bytes / (full_bytes + slide_bytes)
    pool = (f"a sliding pool for {config.max_running_reqs} requests' windows of {window} tokens "
            f"and a forward of {config.max_forward_tokens}")
    if saving < AUTO_MIN_SAVING:
        return PoolSizes(one, None, f"auto: {pool} would save {saving:.0%} of the KV memory of "
                                    f"one pool, under {AUTO_MIN_SAVING:.0%}")
    gets = "" if budget is None else ", which the full-attention layers get"
    return PoolSizes(pages(full_bytes, need * slide_bytes), need,
                     f"auto: {pool} saves {saving:.0%} of the KV memory of one pool of {one} "
                     f"pages{gets}")
