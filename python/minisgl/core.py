"""The vocabulary of the engine: requests, what one forward feeds of each, and batches.

`Req` keeps three counters over its token list (``input_ids``: the prompt, then the accepted
output; nothing else ever enters it)::

    0 ........ cached_len ........ device_len ........ len(input_ids) .... max_device_len
    |  KV stored  |  KV being computed |  known, not yet fed  |  room left to generate  |

"Stored" includes KV written by forwards already launched on the device (stream order makes it
available to every later forward). Under overlap scheduling ``input_ids`` may lag one token behind
``device_len`` while a decode forward is in flight. Everything else is derived from the counters.

A `Feed` is one request's part of one forward, fixed when the step is planned: the positions it
computes and, when it verifies drafts (speculative decoding), the draft tokens fed after its own.
Drafts belong to the step, never to the request.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import torch

from .params import SamplingParams

if TYPE_CHECKING:
    from minisgl.kvcache.base import BaseCacheHandle
    from minisgl.multimodal.prompt import MultimodalPrompt

__all__ = ["SamplingParams", "Req", "Feed", "Batch", "BatchImages", "BaseAttnMetadata"]


@dataclass(eq=False)
class Req:
    """One request inside the scheduler. See the module docstring for the three counters."""

    uid: int
    input_ids: list[int]
    prompt_len: int
    sampling_params: SamplingParams
    max_device_len: int
    table_idx: int = -1
    cached_len: int = 0
    device_len: int = 0
    cache_handle: BaseCacheHandle | None = None
    cache_hit_len: int = 0  # prompt tokens served from the prefix cache at first admission
    # hybrid models: a prefill chunk ends here so that the state there can be kept (a branch point
    # of the prefix cache without a state snapshot; kvcache/hybrid_radix.py); 0: none
    snapshot_at: int = 0
    seed: int = 0
    # a prompt with images: where they are, their pixels and content hashes (multimodal/prompt.py)
    mm: MultimodalPrompt | None = None

    def __post_init__(self) -> None:
        assert 0 <= self.cached_len <= self.device_len <= self.max_device_len, self
        # the prompt as the prefix cache keys it: an image's tokens by the image's content hash
        self._key = self.mm.cache_key() if self.mm is not None else None

    @property
    def extend_len(self) -> int:
        """Tokens computed in the current forward."""
        return self.device_len - self.cached_len

    @property
    def pending_len(self) -> int:
        """Known tokens not yet fed to the model (1 for a request that is decoding)."""
        return len(self.input_ids) - self.device_len

    @property
    def output_len(self) -> int:
        return len(self.input_ids) - self.prompt_len

    def append_token(self, token: int) -> None:
        self.input_ids.append(token)

    def cache_ids(self, end: int) -> list[int]:
        """The first ``end`` tokens as the prefix cache keys them: ``input_ids``, except that
        each image's tokens are ids derived from its content hash (two different images never
        share a cached prefix, a repeated one does)."""
        if self._key is None:
            return self.input_ids[:end]
        return self._key[:end] + self.input_ids[len(self._key):end]


@dataclass(eq=False)
class Feed:
    """Positions ``cached_len .. device_len - 1`` of ``req``'s page-table row, computed by one
    forward: its own tokens, then ``drafts`` (the last ``len(drafts)`` positions). ``samples``:
    how many of the last positions are sampled (0: a prefill chunk short of the known tokens;
    ``k + 1`` for a feed verifying k drafts). ``draft_slot``: hybrid models, the first state slot
    of the group its verified positions leave their states in (-1: none).

    The attention backends read a feed's row and counters as they would a request's; a verify
    step run as one-token decode rows is a batch of one-token feeds (``as_rows``), each a view of
    one position of the feed, whose ``drafts`` hold the draft it feeds there, if any.
    """

    req: Req
    cached_len: int
    device_len: int
    samples: int = 1
    drafts: list[int] = field(default_factory=list)
    draft_slot: int = -1
    table_idx: int = -1

    def __post_init__(self) -> None:
        if self.table_idx < 0:
            self.table_idx = self.req.table_idx

    @classmethod
    def of(cls, req: Req) -> Feed:
        """What ``req``'s counters say the forward computes (sampled when it reaches the end of
        the known tokens)."""
        return cls(req, req.cached_len, req.device_len,
                   int(req.device_len == len(req.input_ids)))

    @property
    def extend_len(self) -> int:
        return self.device_len - self.cached_len

    @property
    def uid(self) -> int:
        return self.req.uid

    def tokens(self) -> list[int]:
        """The tokens fed (host side: not for a decode row, whose token is on the device)."""
        own = self.device_len - len(self.drafts)
        return self.req.input_ids[self.cached_len : own] + self.drafts

    def as_rows(self) -> list[Feed]:
        """One one-token feed per position: the first reads the request's last token from the
        token pool, as a decode row does; each later one feeds a draft."""
        first = self.device_len - len(self.drafts) - 1
        return [Feed(self.req, p, p + 1, 1, self.drafts[p - first - 1 : p - first] if p > first
                     else [], table_idx=self.table_idx) for p in range(first, self.device_len)]


Phase = Literal["prefill", "decode", "mixed"]


@dataclass(eq=False)
class BatchImages:
    """What a forward with images reads (``engine/images.py`` builds it): the token rows whose
    embeddings the vision tower's output replaces, and where the model attends or rotates
    differently for them. ``positions``: ``[3, T]`` M-RoPE positions of every token (Qwen), or
    None; ``key_limits``: ``[T]`` the last key position each token sees (an image's tokens see
    their whole image, Gemma), or None where every token is causal."""

    rows: torch.Tensor  # [N] int64 token rows of the batch
    embeds: torch.Tensor  # [N, hidden] in the model's dtype
    positions: torch.Tensor | None = None
    key_limits: torch.Tensor | None = None


class BaseAttnMetadata:
    """Whatever tensors an attention backend derives from a batch (lengths, page-table rows, ...);
    each backend subclasses it (``minisgl.attention``)."""


@dataclass(eq=False)
class Batch:
    """The feeds of one forward and the tensors built for it.

    ``input_ids``/``positions``/``out_loc`` hold one entry per computed token (feeds back to
    back); ``out_loc`` is the KV slot each token's K/V is written to. ``logits_idx`` picks the rows
    whose logits are sampled (the last ``samples`` tokens of each feed), ``sample_loc`` where the
    sampled tokens go in the engine's token pool.

    A ``mixed`` batch is a decode step and prefill chunks in one forward: its first ``num_decode``
    feeds are decode rows (one token each, read from the token pool), the rest extend.
    """

    feeds: list[Feed]
    phase: Phase
    input_ids: torch.Tensor | None = None
    positions: torch.Tensor | None = None
    out_loc: torch.Tensor | None = None
    # the slots of the sliding-window layers' own slot space, when the engine frees their pages
    # past the window (``scheduler/cache.py``); None: every layer writes at ``out_loc``
    window_out_loc: torch.Tensor | None = None
    logits_idx: torch.Tensor | None = None
    sample_loc: tuple[torch.Tensor, torch.Tensor] | None = None  # (row, position) of new tokens
    # a decode batch that replays a CUDA graph: its new tokens' KV slots (host), which the graph
    # writes into the device page table itself (``CacheCoordinator.flush(new_tokens_of=...)``)
    out_slots: list[int] | None = None
    attn_metadata: BaseAttnMetadata | None = None
    # hybrid models: where each request's recurrent state lives (layers/linear_attention.py)
    state_metadata: Any = None
    num_decode: int = 0  # mixed batches: the leading feeds that decode
    images: BatchImages | None = None  # image embeddings and their positions (engine/images.py)

    @property
    def size(self) -> int:
        return len(self.feeds)

    @property
    def is_decode(self) -> bool:
        return self.phase == "decode"

    @property
    def is_mixed(self) -> bool:
        return self.phase == "mixed"

    @property
    def num_decode_rows(self) -> int:
        """How many leading feeds decode (all of a decode batch, none of a prefill)."""
        return self.size if self.is_decode else self.num_decode if self.is_mixed else 0

    @property
    def num_tokens(self) -> int:
        return sum(feed.extend_len for feed in self.feeds)

    @property
    def sampled(self) -> list[Feed]:
        """The feeds that sample, in batch order."""
        return [feed for feed in self.feeds if feed.samples]
