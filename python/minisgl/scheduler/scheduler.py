"""The scheduler of one TP worker: the five steps of a forward, around one engine.

pick a batch (``planner.py``: every running request's decode token plus prefill chunks under a
token budget, or prefill first in the ``prefill-first`` ablation) -> allocate KV -> build the
batch tensors -> engine forward and sampling -> append tokens, check stop conditions, release
finished requests.
"""

from __future__ import annotations

import random
import time
from typing import Callable

from minisgl.core import Batch, Req, SamplingParams
from minisgl.engine import Engine, ForwardOutput
from minisgl.engine.prompt_logprobs import PromptLogprobStore
from minisgl.kvcache import create_prefix_cache
from minisgl.sampling import BatchSamplingArgs
from minisgl.spec import SpecDecoder, create_spec_decoder
from minisgl.spec.ahead import Segment, read_ahead
from minisgl.utils import init_logger

from .cache import CacheManager
from .config import SchedulerConfig
from .decode import DecodeManager
from .grammar import GrammarManager
from .output import FinishReason, TokenOutput, append_run, logprob_rows
from .planner import BatchPlanner
from .policy import AdmissionPolicy
from .prefill import PrefillManager
from .table import TableManager
from .validation import check_context, check_params, check_prompt
from .window import WindowPages

logger = init_logger(__name__)

# the batch, its sampled requests, the forward, and their ``Segment``s (with speculation)
Launched = tuple[Batch, list[Req], ForwardOutput, list[Segment] | None]


class Scheduler:
    def __init__(self, config: SchedulerConfig, engine: Engine | None = None) -> None:
        self.config = config
        self.engine = engine or Engine(config.engine)
        page_size = config.engine.page_size
        self.table = TableManager(config.max_running_reqs)
        engine, window = self.engine, None
        cache_name = config.cache
        max_window = None
        if engine.window_pages:  # the sliding layers' pages past the window are freed
            max_window = engine.cache_spec.max_window
            window = WindowPages(engine.window_pages, page_size, max_window,
                                 engine.window_page_table, resumable=cache_name != "naive")
        prefix_cache = create_prefix_cache(cache_name, page_size, engine.device, engine.state_pool,
                                           max_window)
        self.cache = CacheManager(engine.num_pages, page_size, prefix_cache, engine.page_table,
                                  window)
        policy = AdmissionPolicy(config.schedule_policy, config.max_wait_steps, self.cache.hit_len)
        self.prefill = PrefillManager(self.cache, self.table, config.max_prefill_tokens, policy,
                                      config.prefill_yield)
        self.decode = DecodeManager(self.cache, self._retract)
        self.planner = BatchPlanner(config, self.prefill, self.decode,
                                    lambda: self.num_retractions)
        self.reqs: dict[int, Req] = {}
        self.eos_token_ids = frozenset(config.eos_token_ids)
        self.num_retractions = 0
        self._inflight: Launched | None = None
        self._seeds = random.Random(config.engine.seed)
        self.prompt_logprobs = PromptLogprobStore()
        self.grammar = GrammarManager(config.engine.model_path, self.engine.vocab_size,
                                      tuple(config.eos_token_ids),
                                      synchronous=config.engine.tp.size > 1)
        self.spec = create_spec_decoder(config.spec, self.engine, self.cache)
        self._drafting = False  # this step speculates (decided before the batch is picked)
        self._ahead: frozenset[int] = frozenset()  # requests drafted on a verify step in flight
        self._launch_segs: dict[int, Segment] = {}  # the launching forward's, by request uid

    # ---- requests in and out ----------------------------------------------------------------

    @property
    def max_context_len(self) -> int:
        """The longest sequence (prompt + output) one request may reach."""
        return min(self.engine.max_seq_len, self.cache.num_tokens)

    def add_request(self, uid: int, input_ids: list[int], params: SamplingParams) -> Req:
        """Queue a request; raise ``ValueError`` for an unusable prompt."""
        if uid in self.reqs:
            raise ValueError(f"request id {uid} is already in use")
        vocab = self.engine.vocab_size
        check_prompt(input_ids, vocab, self.max_context_len)
        check_params(params, vocab, self.grammar)
        check_context(len(input_ids), params, self.max_context_len)
        req = Req(
            uid=uid,
            input_ids=list(input_ids),
            prompt_len=len(input_ids),
            sampling_params=params,
            max_device_len=min(len(input_ids) + params.max_tokens, self.max_context_len),
            seed=params.seed if params.seed is not None else self._seeds.getrandbits(63),
        )
        ready = self.grammar.add(req)  # False: it waits for its grammar to compile
        self.reqs[uid] = req
        if ready:
            self.prefill.add(req)
        return req

    def abort(self, uid: int) -> bool:
        """Drop a request wherever it is and free its KV. False if it is unknown or finished."""
        req = self.reqs.get(uid)
        if req is None:
            return False
        self._release(req)
        return True

    @property
    def has_work(self) -> bool:
        return bool(self.reqs) or self._inflight is not None

    def _speculates(self) -> bool:
        """Whether the next step drafts (``SpecDecoder.active``)."""
        return self.spec is not None and self.spec.active(self.decode.running)

    # ---- one step ---------------------------------------------------------------------------

    def step(self) -> list[TokenOutput]:
        """Run one forward and return new tokens.

        With overlap scheduling the forward just launched is read back on the next call: this call
        returns the tokens of the previous forward, so the host prepares step N+1 while the device
        still computes step N (penalties and biases live on the device, so they need no sync). A
        grammar's mask for step N+1 needs token N: the forward of N+1 is
        launched first, and its sampler waits while the host reads N back and advances the
        grammars (``_launch``'s ``before_mask``). A verify step stays in flight the same way: the
        next one drafts as if all its drafts were accepted (``spec/ahead.py``).
        """
        start = time.perf_counter()
        prev, self._inflight = self._inflight, None
        outputs: list[TokenOutput] = self._admit_compiled()
        self._drafting = self._speculates()
        ahead = read_ahead(self, prev[1:] if prev is not None else None, self._drafting)
        if prev is not None and (not self.config.overlap or ahead is None and (
                self._drafting or prev[3] is not None and any(s.k for s in prev[3]))):
            outputs, prev = outputs + self._finish(*prev), None
        self._ahead = ahead or frozenset()
        self._launch_segs = {}

        def finish_prev() -> None:
            nonlocal prev
            if prev is not None:
                done, prev = prev, None
                outputs.extend(self._finish(*done, successor=self._launch_segs))

        launched = self._launch(finish_prev)
        if launched is not None and self.spec is not None:
            self.spec.spare(idle=False)  # while the forward computes
        finish_prev()
        if launched is not None:
            batch, segs = launched[0], launched[3]
            verified = segs is not None and any(seg.k for seg in segs)
            # steps that only decode (and verify) are timed: what a verify step costs against a
            # plain one (spec/adaptive.py)
            decoding = all(r.draft_len for r in batch.reqs[batch.num_decode_rows:])
            if self.config.overlap and (not verified or batch.row_reqs is not None
                                        and self.spec.proposer.lookahead):
                self._inflight = launched
            else:  # a verify forward whose successor could not be drafted ahead: read it now
                outputs += self._finish(*launched)
            if self.spec is not None and decoding:
                self.spec.timed(verified, time.perf_counter() - start, bool(self._ahead))
        return outputs

    def drain(self) -> list[TokenOutput]:
        """Read back the forward in flight, if any (overlap leaves one after the last step)."""
        prev, self._inflight = self._inflight, None
        return self._finish(*prev) if prev is not None else []

    def _admit_compiled(self) -> list[TokenOutput]:
        """Queue the requests whose grammar compiled; end (abort) those whose grammar failed."""
        done, failed = self.grammar.ready()
        for req in done:
            self.prefill.add(req)
        for req in failed:
            del self.reqs[req.uid]
        return [TokenOutput(req.uid, next(iter(self.eos_token_ids), 0), "abort") for req in failed]

    def _launch(self, before_mask: Callable[[], None]) -> Launched | None:
        """Schedule and launch a forward; ``before_mask`` reads the previous one back (at the
        latest when the grammars' mask is built, which the sampler asks for)."""
        batch = self._schedule()
        if batch is None:
            self.cache.flush()
            return None
        if self._drafting:  # a step of decodes and verifies alone: as decode rows (spec/rows.py)
            batch = self.spec.as_rows(batch, self.engine)
        # a decode graph writes its new tokens' slots into the device page table itself
        replays = self.engine.replays_graph(batch)
        batch.out_slots = self.cache.flush(new_tokens_of=batch.reqs if replays else None)
        self.engine.prepare(batch)
        sampled = batch.sampled_reqs  # fixed now: a later retraction changes the counters
        # a step that neither drafts nor follows a verify step in flight feeds one token each:
        # no ``Segment``s (the per-request bookkeeping a large batch's host cannot spare)
        segs = (self.spec.segments(sampled)
                if self.spec is not None and (self._drafting or self._ahead) else None)
        if segs is not None:
            self._launch_segs = {req.uid: seg for req, seg in zip(sampled, segs)}
        rows, steps = SpecDecoder.rows(sampled)  # a verifying request samples k + 1 rows
        constrained = self.grammar.constrains(sampled)
        args = BatchSamplingArgs.from_reqs(rows, self.engine.vocab_size, self.engine.device,
                                           self.engine.sampling_state, argmax_only=not constrained,
                                           steps=steps)
        if constrained:
            args.late_bitmask = lambda: self.grammar.bitmask(rows, self.engine.device,
                                                             before_mask)
        return batch, sampled, self.engine.forward(batch, args), segs

    def _schedule(self) -> Batch | None:
        return self.planner.schedule(self.spec if self._drafting else None, self._ahead)

    def _finish(self, batch: Batch, sampled: list[Req], out: ForwardOutput,
                segs: list[Segment] | None, successor: dict[int, Segment] | None = None,
                ) -> list[TokenOutput]:
        """Read a forward back: append its tokens, check stops, release finished requests.

        A request may have finished or been aborted since the batch was launched: its tokens are
        dropped. A retracted one keeps its token (it re-feeds everything it has when re-admitted).
        A request that verified drafts gets its accepted run, cut at the first stop; one whose
        part was built on drafts since rejected (``Segment.dropped``) gets nothing.
        ``successor``: the forward launched since, per request (``SpecDecoder.verdict``).
        """
        out.wait()
        self.prompt_logprobs.add(out.prompt_logprobs, self.reqs)
        verified = {i for i, seg in enumerate(segs) if seg.k} if segs else set()
        runs = self._runs(sampled, out, segs, successor or {})
        live = [(i, req, runs[i]) for i, req in enumerate(sampled)
                if self.reqs.get(req.uid) is req  # not finished or aborted while this forward ran
                and not (segs and segs[i].dropped)]
        reasons: dict[int, FinishReason | None] = {}
        for i, req, run in live:
            if req.sampling_params.max_tokens != 0:
                reasons[i] = append_run(req, run, self.eos_token_ids, self.spec)
                if self.spec is not None and i not in verified:
                    self.spec.observe(req, [token for token, _ in run])
                elif self.spec is not None and reasons[i] is None:
                    self.spec.take_tail(req)
        ended = set()  # the grammars advance in one batch: those that terminated end the request
        if self.grammar.active:
            going = [(req, run[-1][0]) for i, req, run in live
                     if i in reasons and reasons[i] is None]
            ended = self.grammar.accept([r for r, _ in going], [t for _, t in going])
        results = []
        for i, req, run in live:
            if i not in reasons:  # max_tokens 0, the prompt alone: its token is dropped
                results.append(TokenOutput(req.uid, None, "length", first=req,
                                           prompt_logprobs=self.prompt_logprobs.pop(req)))
                self._release(req)
                continue
            reason = reasons[i]
            if reason is None and req.uid in ended:
                reason = "stop"  # the grammar is complete
            results += [TokenOutput(req.uid, token, None, *lp) for token, lp in run[:-1]]
            result = TokenOutput(req.uid, run[-1][0], reason, *run[-1][1])
            if req.output_len == 1:
                result.first = req
                result.prompt_logprobs = self.prompt_logprobs.pop(req)
            if result.finish_reason is not None:
                self._release(req)
            elif i >= batch.num_decode_rows and req.table_idx >= 0 and i not in verified:
                # its prefill ended
                self.prefill.remove(req)
                self.decode.add(req)
                self.cache.cache_prefix(req)  # later requests with this prompt reuse it now
            results.append(result)
        return results

    def _runs(self, sampled: list[Req], out: ForwardOutput, segs: list[Segment] | None,
              successor: dict[int, Segment]) -> list[list[tuple[int, tuple]]]:
        """Per sampled request its new tokens with their log-prob entries: one, or the accepted
        run of a request that verified drafts (``SpecDecoder.verdict``)."""
        ks = [seg.k for seg in segs] if segs else [0] * len(sampled)
        rows = SpecDecoder.expand(sampled, ks)
        runs = SpecDecoder.split(ks, out.next_tokens.tolist(), logprob_rows(out, rows))
        for i, req in enumerate(sampled):
            seg = segs[i] if segs else None
            if seg is None or not seg.k or seg.dropped or self.reqs.get(req.uid) is not req:
                continue
            tokens = [t for t, _ in runs[i]]
            runs[i] = runs[i][: len(self.spec.verdict(req, tokens, seg, successor.get(req.uid)))]
        if self.spec is not None:
            self.spec.after_forward(out)  # recurrent states, MTP's hidden states
        return runs

    # ---- releasing requests -----------------------------------------------------------------

    def _release(self, req: Req) -> None:
        """Finished or aborted: free everything the request holds."""
        if self.spec is not None:
            self.spec.finished(req)
        if self.grammar.remove(req):  # still compiling: in no queue, holds nothing
            del self.reqs[req.uid]
            return
        if req in self.decode.running:
            self.decode.remove(req)
            self._free(req)
        else:
            if req.table_idx >= 0:
                self._free(req)
            self.prefill.remove(req)
        del self.reqs[req.uid]
        self.prompt_logprobs.forget(req.uid)

    def _free(self, req: Req) -> None:
        self.engine.sampling_state.release(req.table_idx)
        self.cache.release(req)
        self.table.free(req.table_idx)
        req.table_idx = -1

    def _retract(self, req: Req) -> None:
        """Out of KV during decode: release ``req`` and queue it again at the front, tokens kept."""
        self._free(req)
        req.cached_len = req.device_len = 0
        self.prefill.add_front([req])
        self.num_retractions += 1
        logger.debug("retracted request %d at %d tokens", req.uid, len(req.input_ids))

    def close(self) -> None:
        """Release the engine's device resources (CUDA graphs, the TP group)."""
        self.grammar.close()
        self.engine.close()

    def idle(self) -> bool:
        """No request to run: the host's time is spare (``SpecDecoder.spare``); whether deferred
        work is left."""
        return self.spec is not None and self.spec.spare(idle=True)

    def check_integrity(self) -> None:
        self.cache.check_integrity(self.decode.running + self.prefill.admitted())
