"""The scheduler's side of speculative decoding: drafts onto decode requests, and the verdict.

A decoding request with ``k`` drafts is fed as ``k + 1`` tokens (its last token, then the drafts).
In a step where every request decodes or verifies they are ``k + 1`` one-token decode rows, which
replay the decode CUDA graphs (``rows.py``); otherwise (a prefill chunk in the step, a hybrid
model) they go in the prefill part of the batch: an extend over the cached prefix, causal over the
drafts, beside the ordinary one-token decode rows. Every one of the k + 1 positions is sampled::

    input_ids: ... last | d1 d2 .. dk            (drafts appended for the forward only)
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

After the verdict the drafts leave ``input_ids``, the accepted run is appended as ordinary
tokens, and KV past the accepted prefix is given back (``CacheManager.shrink``): only accepted
tokens ever reach the prefix cache.

Overlap scheduling (``ahead.py``): a verify step of decode rows stays in flight while
the next one is drafted on the assumption that all of its drafts are accepted. The proposer sees
``input_ids`` ending with those drafts; its first token is a guess of the bonus token ``xk``,
kept in ``input_ids`` at its place, and the rest are the next step's drafts. That step's first row
feeds position L+k, whose token the token pool holds (the sampler of the step in flight writes
``xk`` there), so it is right whatever the guess. Each launched request's part is a ``Segment``.
The verdict of the step in flight then either accepts everything, and the next step stands (its
drafts are put back after the run; its own verdict takes none of them if the guess was wrong),
or rejects a draft, and the next step's part of that request is dropped when it is read back (its
KV past the kept tokens is freed with the rest).

Hybrid models: the linear-attention layers cannot give back a token, so a verifying request feeds
its k + 1 tokens through them one at a time, leaving the state after each in a draft group of the
state pool (``Req.draft_slot``, ``kvcache/state_metadata.py``), and its own slot untouched. The
verdict copies the accepted position's state into the request's slot (``move_states``, one batched
copy per step), so a rejection resumes from there with nothing recomputed. A step verifies at
most as many requests as the pool has draft groups.
"""

from __future__ import annotations

from minisgl.core import Batch, Req
from minisgl.utils import init_logger

from .adaptive import MISSES, Acceptance, StepCost
from .ahead import Segment
from .config import SpecConfig
from .registry import create_proposer
from .rows import as_decode_rows
from .stats import SpecStats

logger = init_logger(__name__)

# how often a request's verify steps must keep all their drafts for the next step to be drafted
# ahead, until both kinds of step are timed (``StepCost.ahead_pays``)
AHEAD_MIN = 0.5
# the proposer's deferred work done per forward launched, and per idle turn of the scheduler
# (``Proposer.spare``; for suffix decoding suffixes learned: 8 take about 0.1 ms, less than a small
# model's forward leaves the host; a turn idle polls for requests between two slices)
STEP_WORK, IDLE_WORK = 8, 256


def create_spec_decoder(config: SpecConfig | None, engine, cache) -> SpecDecoder | None:
    """The scheduler's ``SpecDecoder``, or None: speculation off, or a model it cannot serve."""
    if config is None:
        return None
    pool = engine.state_pool
    if pool is not None and (pool.num_draft_groups == 0
                             or pool.draft_group_size < config.num_speculative_tokens + 1):
        # the engine was built without state slots for the draft positions (EngineConfig's
        # spec_state_groups / spec_group_size; the LLM and server set them)
        logger.warning("speculative decoding is off: %s is a hybrid (recurrent) model and its "
                       "state pool has no slots for %d draft positions",
                       engine.model_config.architecture, config.num_speculative_tokens + 1)
        return None
    logger.info("speculative decoding: %s, up to %d draft tokens, off above %d running requests",
                config.method, config.num_speculative_tokens, config.disable_by_batch_size)
    return SpecDecoder(config, cache, pool, engine.model)


class SpecDecoder:
    def __init__(self, config: SpecConfig, cache, state_pool=None, model=None) -> None:
        self.config, self.cache, self.state_pool, self.model = config, cache, state_pool, model
        self.reset()
        # hybrid models: (request slot, draft slot) copies of this step's verdicts, and per
        # verified request ``draft_slot - L`` (the slot of the state after n tokens is this + n)
        self._moves: list[tuple[int, int]] = []
        self._state_at: dict[int, int] = {}

    def reset(self) -> None:
        """Forget every request and what the proposer learned, and zero the statistics (after the
        warm-up, whose random requests must not count nor teach the suffix trees)."""
        self.proposer = create_proposer(self.config, self.model)
        self.stats = SpecStats(self.config.method)
        self.accept_state: dict[int, Acceptance] = {}
        self.ineligible: set[int] = set()
        self.cost = StepCost()
        self.large = False  # the running batch is above disable_by_batch_size
        self._guesses: dict[int, tuple[int, int]] = {}  # this launch's (see ``Segment``)
        self.drafted_ahead = 0  # drafts made on a verify step in flight (``add_drafts``)
        self.dropped = 0  # of those, the ones whose verify step rejected a draft
        self._tails: dict[int, list[int]] = {}  # drafts of a step in flight, kept out of a run

    def active(self, running: list[Req]) -> bool:
        """Whether this step drafts: not once the batch is large (it is compute-bound), not while
        the plain decode step is measured (``StepCost``), nor when no running request would (then
        the step keeps overlap scheduling)."""
        self.large = len(running) > self.config.disable_by_batch_size
        if self.large or not running or (self.config.adaptive and self.cost.probe()):
            return False
        return any(self._draft_len(req) for req in running if self._eligible(req))

    def timed(self, verified: bool, seconds: float, ahead: bool = False) -> None:
        """The wall time of a step that only decoded (``verified``: and verified drafts;
        ``ahead``: drafted while the step before was in flight), at a batch small enough to
        speculate."""
        if not self.large:
            self.cost.add(verified, seconds, ahead)

    def drafts_ahead(self, reqs: list[Req]) -> bool:
        """Whether the next step drafts for ``reqs`` while their verify step is in flight
        (``ahead.py``). It saves the read-back's wait when that step keeps all its drafts, and
        costs a forward when it does not (the next step's part is dropped): with adaptive draft
        lengths, only while each request's recent steps kept all their drafts often enough
        (``StepCost.ahead_pays``)."""
        if not self.proposer.lookahead:
            return False
        return not self.config.adaptive or all(
            self.cost.ahead_pays(self.accept_state[req.uid].full, AHEAD_MIN) for req in reqs)

    def _draft_len(self, req: Req) -> int:
        k_max = self.config.num_speculative_tokens
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

    def add_drafts(self, reqs: list[Req], budget: int,
                   ahead: frozenset[int] = frozenset()) -> list[Req]:
        """Give this step's decode requests (counters already advanced by one) their drafts, as
        far as ``budget`` tokens and free KV allow; return those that verify.

        ``ahead``: requests whose verify step is still in flight (``Scheduler.step``): their
        ``input_ids`` end with that step's drafts, as if all were accepted, and the token this
        step feeds first is its bonus token, not yet known. The proposer's first token is taken
        as a guess of it (kept in ``input_ids`` at its place) and the rest are the drafts, which
        count only if the guess was right."""
        verify: list[Req] = []
        self._state_at.clear()
        self._guesses.clear()
        groups = self.state_pool.num_draft_groups if self.state_pool is not None else len(reqs)
        for req in reqs:
            if budget <= 0 or len(verify) == groups:
                break
            if not self._eligible(req):
                continue
            # NOTE: the last sampled position, device_len + k, must stay inside the page table
            # and token pool (< max_device_len), as a decode step's does
            k = min(self._draft_len(req), budget, req.max_device_len - req.device_len - 1)
            if k <= 0:
                continue
            lookahead = req.uid in ahead
            draft = self.proposer.propose(req, k + lookahead)
            state = self.accept_state[req.uid]
            state.misses = 0 if draft else state.misses + 1
            if lookahead:
                if len(draft) < 2:
                    continue
                self._guesses[req.uid] = (len(req.input_ids), draft[0])
                self.drafted_ahead += 1
                req.input_ids.append(draft[0])
                draft = draft[1:]
            if not draft:
                continue
            new_len = req.device_len + len(draft)
            if self.cache.tokens_needed(req, new_len) > self.cache.available_tokens:
                if lookahead:
                    req.input_ids.pop()
                    del self._guesses[req.uid]
                continue
            self.cache.allocate(req, new_len)
            req.input_ids += draft
            req.device_len, req.draft_len = new_len, len(draft)
            if self.state_pool is not None:
                req.draft_slot = self.state_pool.draft_slot(len(verify))
            budget -= len(draft)
            verify.append(req)
        return verify

    def segments(self, sampled: list[Req]) -> list[Segment]:
        """Each sampled request's ``Segment`` of the forward being launched."""
        return [Segment(req.draft_len, len(req.input_ids) - req.draft_len,
                        self._guesses.pop(req.uid, None)) for req in sampled]

    @staticmethod
    def as_rows(batch: Batch, engine) -> Batch:
        """A step in which every request decodes or verifies, as one-token decode rows where the
        engine can run them so (``rows.py``: they replay the decode CUDA graphs)."""
        if not any(req.draft_len for req in batch.reqs):
            return batch
        rows = as_decode_rows(batch)
        if rows is None or not engine.verifies_as_rows(rows.size):
            return batch
        return rows

    @staticmethod
    def rows(sampled: list[Req]) -> tuple[list[Req], list[int] | None]:
        """One entry per sampled row (a verifying request has k + 1), and each row's output
        index when any request verifies (None otherwise: the default of one row each)."""
        if not any(req.draft_len for req in sampled):
            return sampled, None
        rows = SpecDecoder.expand(sampled, [req.draft_len for req in sampled])
        steps = [req.device_len - req.draft_len - req.prompt_len + j
                 for req in sampled for j in range(req.draft_len + 1)]
        return rows, steps

    @staticmethod
    def expand(sampled: list[Req], ks: list[int]) -> list[Req]:
        """Each request once per row it samples (``ks``: its drafts in the forward)."""
        return [req for req, k in zip(sampled, ks) for _ in range(k + 1)]

    @staticmethod
    def split(ks: list[int], tokens: list, logprobs: list) -> list[list[tuple]]:
        """The per-row tokens and log-prob entries of a forward, grouped per request (``ks``:
        each request's drafts in that forward)."""
        runs, r = [], 0
        for k in ks:
            runs.append(list(zip(tokens[r : r + k + 1], logprobs[r : r + k + 1])))
            r += k + 1
        return runs

    def verdict(self, req: Req, sampled: list[int], seg: Segment,
                successor: Segment | None = None) -> list[int]:
        """The accepted run of a verifying request (its k + 1 sampled tokens in); the drafts leave
        ``input_ids`` and the KV past the accepted prefix is freed.

        ``successor``: the request's ``Segment`` in the forward launched after this one, built on
        all of these drafts being accepted. If they are, it stands: its drafts are kept aside
        (``take_tail``) and the counters are left as it set them. Otherwise it is dropped."""
        k, base = seg.k, seg.base
        drafts = req.input_ids[base : base + k]
        m = 0
        if seg.guess is None or req.input_ids[seg.guess[0]] == seg.guess[1]:
            while m < k and sampled[m] == drafts[m]:
                m += 1
        stands = successor is not None and m == k
        if stands:  # after the bonus token (in the run), the successor's guess and drafts
            self._tails[req.uid] = req.input_ids[base + k + 1 :]
        del req.input_ids[base:]
        if not stands:
            if successor is not None:
                successor.dropped = True
                self.dropped += successor.k > 0
            # KV is valid for positions .. L-1+m: the last real token and the m accepted drafts
            self.cache.shrink(req, base + m)
            req.cached_len = req.device_len = base + m
            req.draft_len = 0
        if req.draft_slot >= 0:  # the state after the accepted position becomes the request's
            self._moves.append((req.table_idx, req.draft_slot + m))
            self._state_at[req.uid] = req.draft_slot - base
            req.draft_slot = -1
        self.stats.add(k, m)
        self.accept_state[req.uid].record(m, k)
        return sampled[: m + 1]

    def take_tail(self, req: Req) -> None:
        """After a run was appended: put back the drafts of the forward in flight that
        ``verdict`` kept aside."""
        req.input_ids += self._tails.pop(req.uid, [])

    def after_forward(self, out) -> None:
        """After the verdicts of a forward: copy the accepted recurrent states into their
        requests' slots (hybrid models; before the next forward, which reads them), and hand a
        proposer that drafts from the target's hidden states (MTP) the rows of the positions
        that were kept."""
        if self._moves:
            self.state_pool.copy_slots(*map(list, zip(*self._moves)))
            self._moves.clear()
        record = getattr(self.proposer, "record", None)
        if record is None or out.hidden is None:
            return
        hidden, layout = out.hidden
        row = 0
        for req, start, n in layout:  # batch rows: requests back to back, decode rows first
            keep = min(n, req.device_len - start) if req.table_idx >= 0 else 0
            if keep > 0:
                record(req, start, hidden[row : row + keep])
            row += n

    def observe(self, req: Req, tokens: list[int]) -> None:
        """Tokens a request got without verifying drafts (now in ``input_ids``): score its shadow
        draft, and draft a new one while the request does not speculate. Called when a forward is
        read back, when the tokens are current even under overlap scheduling."""
        state = self.accept_state.get(req.uid)
        if state is None or req.uid in self.ineligible or self.large:
            return  # no shadow drafts in a batch too large to speculate: pure host time
        if state.shadow:
            state.observe(tokens)
        if not state.shadow and self._draft_len(req) == 0:
            draft = self.proposer.propose(req, self.config.num_speculative_tokens)
            if state.misses >= MISSES:  # it stopped for want of drafts: one is back
                if draft:
                    state.misses = 0
            else:
                state.shadow = draft

    def spare(self, idle: bool) -> bool:
        """Host time to spare: the proposer's deferred work (the suffix trie learning finished
        answers), a slice while a forward computes (none in a batch too large to speculate, whose
        host is the bottleneck), more while the scheduler is idle; whether some is left."""
        return self.proposer.spare(IDLE_WORK if idle else 0 if self.large else STEP_WORK)

    def finished(self, req: Req) -> None:
        self._tails.pop(req.uid, None)
        self.proposer.finished(req, learn=not self.large)
        self.accept_state.pop(req.uid, None)
        self.ineligible.discard(req.uid)

    def trim(self, req: Req) -> None:
        """A stop inside an accepted run left KV past the last kept token: give it back (the
        request is about to be released, and only its kept tokens may enter the prefix cache).
        As without speculation, the last token's KV is not kept: that token was never fed."""
        n = len(req.input_ids) - 1
        if req.device_len > n:
            self.cache.shrink(req, n)
            req.cached_len = req.device_len = n
            if req.uid in self._state_at:  # the state after exactly n tokens, for the snapshot
                self.state_pool.copy_slot(req.table_idx, self._state_at[req.uid] + n)
