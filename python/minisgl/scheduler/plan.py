"""One step's plan, from the planner to the engine and back: what each request feeds, how the
forward lays it out, and which rows it samples; and the forward in flight (``Launched``).

A plan holds three kinds of feeds (``core.Feed``), in this order, which is the batch's order and
the order of the sampled rows::

    | decode: one token each | verify: the last token + k drafts | prefill chunks |

A verify feed samples all its k + 1 positions; it extends over its request's KV as a prefill chunk
does (an extend with a prefix, causal over the drafts). A step of decode and verify feeds alone
may instead run as one-token decode rows (``Feed.as_rows``), which replay the decode CUDA graphs:
a row attends over its request's page-table row up to its own position, which is the verify
step's causal mask, and every layer stores the whole batch's K/V before any row attends, so a
row sees the drafts before it. The rows read their tokens from the token pool as decode rows do
(the engine writes the drafts there first); row j samples the token after its position and the
sampler writes it one position on, over draft j + 1, so after the verdict the pool holds the
accepted run and, where the next step reads, the corrected (or bonus) token. Not for hybrid
(recurrent) models, whose rows of one request would share a state slot, nor with a prefill chunk
in the step: its attention metadata varies step to step.

Row j of a verify feed is sampled with the request's seed at output index ``j`` past its next one
(``sample_rows``), the draw the request would make there without speculation.

A plan drafted ahead (``ahead.py``) is built on verify feeds still in flight, as if they kept all
their drafts: ``follows`` maps each of its requests to that feed, and a request whose feed
rejected a draft (or that ended) when it was read back is ``dropped`` from this plan: its rows
compute positions that do not exist, and what they give back is ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from minisgl.core import Batch, Feed, Req
from minisgl.engine import ForwardOutput


@dataclass(eq=False)
class StepPlan:
    decode: list[Feed]
    verify: list[Feed]
    prefill: list[Feed]
    batch: Batch
    follows: dict[int, Feed] = field(default_factory=dict)  # per uid, the feed drafted ahead on
    dropped: set[int] = field(default_factory=set)  # uids whose feed in this plan is void

    @classmethod
    def build(cls, decode: list[Feed], verify: list[Feed], prefill: list[Feed],
              rows_fit: Callable[[int], bool]) -> StepPlan | None:
        """The plan of these feeds, or None if there are none. ``rows_fit(n)``: whether the
        engine runs a verify step of ``n`` one-token rows as decode rows
        (``Engine.verifies_as_rows``)."""
        extend = verify + prefill
        if verify and not prefill and rows_fit(len(decode) + sum(f.samples for f in verify)):
            rows = decode + [row for feed in verify for row in feed.as_rows()]
            return cls(decode, verify, prefill, Batch(rows, "decode"))
        if not extend:
            return cls(decode, verify, prefill, Batch(decode, "decode")) if decode else None
        if not decode:
            return cls(decode, verify, prefill, Batch(extend, "prefill"))
        return cls(decode, verify, prefill,
                   Batch(decode + extend, "mixed", num_decode=len(decode)))

    @property
    def feeds(self) -> list[Feed]:
        return self.decode + self.verify + self.prefill

    @property
    def sampled(self) -> list[Feed]:
        """The feeds that sample (decode, verify, and prefill chunks that end their prompt)."""
        return self.decode + self.verify + [feed for feed in self.prefill if feed.samples]

    @property
    def settled(self) -> bool:
        """Every request of the plan was dropped: the host knows all it will give back (nothing),
        so the next step needs no read-back of it."""
        return bool(self.dropped) and all(feed.uid in self.dropped for feed in self.sampled)

    def sample_rows(self) -> tuple[list[Req], list[int] | None]:
        """Per sampled row, its request, and the output index it draws at when a feed verifies
        (None otherwise: each request's next one, ``BatchSamplingArgs.from_reqs``)."""
        sampled = self.sampled
        if not self.verify:  # a large batch's common case, on the host's critical path
            return [feed.req for feed in sampled], None
        reqs: list[Req] = []
        steps: list[int] = []
        for feed in sampled:
            first = feed.device_len - feed.samples + 1 - feed.req.prompt_len
            reqs += [feed.req] * feed.samples
            steps += range(first, first + feed.samples)
        return reqs, steps

    def split(self, tokens: list[int], logprobs: list[tuple]) -> list[list[tuple[int, tuple]]]:
        """The per-row tokens and log-prob entries of the forward, as one run per sampled
        feed."""
        if not self.verify:
            return [[row] for row in zip(tokens, logprobs)]
        runs, r = [], 0
        for feed in self.sampled:
            runs.append(list(zip(tokens[r : r + feed.samples], logprobs[r : r + feed.samples])))
            r += feed.samples
        return runs


@dataclass(eq=False)
class Launched:
    """A forward launched and not yet read back: its plan and what it hands back."""

    plan: StepPlan
    out: ForwardOutput
