"""The scheduler's side of speculative decoding, through a few entry points: whether a step
drafts (``active``), the drafts of its decode requests (``draft``), the verdict on a verify feed
(``judge``), what came back without verification (``observe``), a request's end (``finished``),
and the host's spare time (``spare``). The drafts belong to the step's plan
(``scheduler/plan.py``), never to the request; what is kept of them is the cache's commit
(``CacheCoordinator.commit``).

A decoding request with ``k`` drafts is fed as ``k + 1`` tokens (its last token, then the drafts),
and every one of the k + 1 positions is sampled::

    fed:      ... last | d1 d2 .. dk
    sampled:          x0  x1 .. x(k-1) xk        (xj: the target's token after position L-1+j)

Row j is sampled with the request's own seed at output index ``j`` past its next one, exactly the
draw the request would make at that index without speculation (``sampling/rng.py``). The run
``x0 .. xm`` is accepted, m being the first j with ``xj != d(j+1)`` (or k). For greedy rows this is
the usual exact match. For sampled rows it is rejection sampling with a one-hot proposal: the
draft ``t`` survives with probability p(t) (the draw equals t), and on rejection the token is a
draw from p conditioned on not being t (p with t removed, renormalised); after k accepted drafts
``xk`` is the bonus token. The output is the very sequence the request would have produced
without speculation, not only the same distribution. Penalties are not applied per verified
position (their counts would need the drafts), so such requests do not speculate.

A step that drafts needs every request's last token on the host, so the forward in flight is read
back first: speculation trades overlap scheduling for several tokens per forward, and only while
the batch is small (``disable_by_batch_size``). With a ``lookahead`` proposer the step after a
verify step in flight may instead be drafted as if that step kept all its drafts
(``draft_ahead``, ``scheduler/ahead.py``).

Hybrid models: the linear-attention layers cannot give back a token, so a verifying request feeds
its k + 1 tokens through them one at a time, leaving the state after each in a draft group of the
state pool (``Feed.draft_slot``, ``kvcache/state_metadata.py``), its own slot untouched; the
commit copies the kept position's state into the request's slot. A step verifies at most as many
requests as the pool has draft groups (``DraftBudget.requests``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from minisgl.core import Feed, Req
from minisgl.utils import init_logger

from .adaptive import MISSES, Acceptance, StepCost
from .config import SpecConfig
from .registry import create_proposer
from .stats import SpecStats

if TYPE_CHECKING:
    from minisgl.engine import Engine, ForwardOutput

logger = init_logger(__name__)

# how often a request's recent verify steps must have kept all their drafts for the next step to
# be drafted on one in flight: a step drafted ahead in vain costs a verify forward, one that stands
# saves the host's planning (the read-back's wait); in the CPU simulation of a batch-1 step
# (verify_host_cost.py) it lost at about one in two kept, and broke even or won from two in three
AHEAD_MIN = 0.6
# the proposer's deferred work done per forward launched, and per idle turn of the scheduler
# (``Proposer.spare``): a slice small enough to hide behind a small model's forward
STEP_WORK, IDLE_WORK = 8, 256


@dataclass
class DraftBudget:
    """What one step's drafts may take: ``tokens`` in all, and at most ``requests`` verifying
    requests (None: any number)."""

    tokens: int
    requests: int | None = None


def create_spec_decoder(config: SpecConfig | None, engine: Engine) -> SpecDecoder | None:
    """The scheduler's ``SpecDecoder``, or None: speculation off, or a model it cannot serve."""
    if config is None:
        return None
    pool = engine.state_pool
    if pool is not None and (pool.num_draft_groups == 0
                             or pool.draft_group_size < config.max_drafts + 1):
        # the engine was built without state slots for the draft positions (EngineConfig's
        # spec_state_groups / spec_group_size; the LLM and server set them)
        logger.warning("speculative decoding is off: %s is a hybrid (recurrent) model and its "
                       "state pool has no slots for %d draft positions",
                       engine.model_config.architecture, config.max_drafts + 1)
        return None
    logger.info("speculative decoding: %s, up to %d draft tokens, off above %d running requests",
                config.method, config.max_drafts, config.disable_by_batch_size)
    return SpecDecoder(config, engine)


class SpecDecoder:
    def __init__(self, config: SpecConfig, engine: Engine | None = None) -> None:
        self.config, self.engine = config, engine
        self.reset()

    def reset(self) -> None:
        """Forget every request and what the proposer learned, and zero the statistics (after the
        warm-up, whose random requests must not count nor teach the suffix trees)."""
        self.proposer = create_proposer(self.config, self.engine)
        self.stats = SpecStats(self.config.method)
        self.accept_state: dict[int, Acceptance] = {}
        self.ineligible: set[int] = set()
        self.cost = StepCost()
        self.large = False  # the running batch is above disable_by_batch_size

    def active(self, running: list[Req]) -> bool:
        """Whether this step drafts: not once the batch is large (it is compute-bound), not while
        the plain decode step is measured (``StepCost``), nor when no running request would (then
        the step keeps overlap scheduling)."""
        self.large = len(running) > self.config.disable_by_batch_size
        if self.large or not running or (self.config.adaptive and self.cost.probe()):
            return False
        return any(self._draft_len(req) for req in running if self._eligible(req))

    def timed(self, verified: bool, seconds: float) -> None:
        """The wall time of a step that only decoded (``verified``: and verified drafts), at a
        batch small enough to speculate."""
        if not self.large:
            self.cost.add(verified, seconds)

    def draft(self, reqs: list[Req], budget: DraftBudget) -> list[list[int]]:
        """Drafts for this step's decode requests (counters already advanced by one), each
        possibly empty, within ``budget``; one call to the proposer for all of them."""
        asked: list[Req] = []
        lens: list[int] = []
        tokens, slots = budget.tokens, budget.requests
        for req in reqs:
            if tokens <= 0 or slots == 0:
                break
            # NOTE: the last sampled position, device_len + k, must stay inside the page table
            # and token pool (< max_device_len), as a decode step's does
            k = min(self._draft_len(req), tokens,
                    req.max_device_len - req.device_len - 1) if self._eligible(req) else 0
            if k > 0:
                asked.append(req)
                lens.append(k)
                tokens -= k
                slots = None if slots is None else slots - 1
        found = dict(zip(map(id, asked), self.proposer.propose_many(asked, lens)))
        for req in asked:
            state = self.accept_state[req.uid]
            state.misses = 0 if found[id(req)] else state.misses + 1
        return [found.get(id(req), []) for req in reqs]

    def draft_ahead(self, feeds: list[Feed], budget: DraftBudget) -> list[list[int]] | None:
        """Drafts for the step after ``feeds`` (verify feeds in flight), as if each kept all its
        drafts: the proposer drafts one token more after them, the first a guess of the token the
        target adds (which the next step feeds first, from the token pool: right whatever the
        guess, and the verdict holds whatever was drafted). None if one of them gets no draft, or
        its requests' verify steps reject drafts too often (``AHEAD_MIN``)."""
        if not self.proposer.lookahead:
            return None
        drafts: list[list[int]] = []
        tokens = budget.tokens
        for feed in feeds:
            req = feed.req
            state = self.accept_state.get(req.uid)
            if state is None or self.config.adaptive and state.full < AHEAD_MIN:
                return None
            # NOTE: the next step samples up to position feed.device_len + k, < max_device_len
            k = min(self._draft_len(req), tokens, req.max_device_len - feed.device_len - 2)
            draft = self.proposer.propose_ahead(req, feed.drafts, k + 1)[1:] if k > 0 else []
            if not draft:
                return None
            drafts.append(draft)
            tokens -= len(draft)
        return drafts

    def judge(self, feed: Feed, sampled: list[int]) -> int:
        """How many of ``feed``'s drafts the target's ``sampled`` tokens (one per position)
        accept; the request's run is the first that many + 1 of them."""
        drafts, m = feed.drafts, 0
        while m < len(drafts) and sampled[m] == drafts[m]:
            m += 1
        self.stats.add(len(drafts), m)
        self.accept_state[feed.uid].record(m, len(drafts))
        return m

    def observe(self, plain: list[tuple[Req, list[int]]], out: ForwardOutput) -> None:
        """A forward read back (its verify feeds committed): ``plain``, the requests that got
        tokens without verifying drafts (now in ``input_ids``), score their shadow drafts and
        draft new ones while they do not speculate; a proposer that drafts from the target's
        hidden states (MTP, EAGLE-3) is handed the rows of the positions kept."""
        for req, tokens in plain:
            self._shadow(req, tokens)
        if out.hidden is None:
            return
        hidden, layout = out.hidden
        row = 0
        for req, start, n in layout:  # batch rows: feeds back to back, decode rows first
            keep = min(n, req.device_len - start) if req.table_idx >= 0 else 0
            if keep > 0:
                self.proposer.record(req, start, hidden[row : row + keep])
            row += n

    def spare(self, idle: bool) -> bool:
        """Host time to spare: the proposer's deferred work (the suffix trie learning finished
        answers), a slice while a forward computes (none in a batch too large to speculate, whose
        host is the bottleneck), more while the scheduler is idle; whether some is left."""
        return self.proposer.spare(IDLE_WORK if idle else 0 if self.large else STEP_WORK)

    def finished(self, req: Req) -> None:
        self.proposer.finished(req, learn=not self.large)
        self.accept_state.pop(req.uid, None)
        self.ineligible.discard(req.uid)

    def _draft_len(self, req: Req) -> int:
        k_max = self.config.max_drafts
        state = self.accept_state.get(req.uid)
        if state is None:
            state = self.accept_state[req.uid] = Acceptance(float(k_max))
        if not self.config.adaptive:
            return k_max
        # a verify step pays when its accepted drafts + 1 beat its cost in decode steps
        threshold = max(self.config.min_expected_accept, self.cost.ratio - 1.0)
        return state.draft_len(k_max, threshold)

    def _eligible(self, req: Req) -> bool:
        if req.uid in self.ineligible:
            return False
        params = req.sampling_params
        reason = ("penalties" if params.needs_penalties
                  else "grammar" if params.grammar is not None else None)
        if reason is None:
            return True
        self.ineligible.add(req.uid)
        self.stats.skip(reason)
        return False

    def _shadow(self, req: Req, tokens: list[int]) -> None:
        """Tokens a request got without verifying drafts: score its shadow draft, and draft a new
        one while it does not speculate. Called when a forward is read back, when the tokens are
        current even under overlap scheduling."""
        state = self.accept_state.get(req.uid)
        if state is None or req.uid in self.ineligible or self.large:
            return  # no shadow drafts in a batch too large to speculate: pure host time
        if state.shadow:
            state.observe(tokens)
        if not state.shadow and self._draft_len(req) == 0:
            draft = self.proposer.propose(req, self.config.max_drafts)
            if state.misses >= MISSES:  # it stopped for want of drafts: one is back
                if draft:
                    state.misses = 0
            else:
                state.shadow = draft
