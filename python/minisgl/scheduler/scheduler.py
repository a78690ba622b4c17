"""The scheduler of one TP worker: the five steps of a forward, around one engine.

plan a step (``planner.py``: every running request's decode feed, with drafts when it speculates,
plus prefill chunks under a token budget; KV allocated) -> launch it (the batch tensors, the
engine forward and sampling) -> read it back -> apply it (append tokens, commit what verify feeds
kept, check stop conditions, release finished requests).
"""

from __future__ import annotations

import random
import time
from typing import Callable

from minisgl.core import Req, SamplingParams
from minisgl.engine import Engine
from minisgl.engine.prompt_logprobs import PromptLogprobStore
from minisgl.multimodal.prompt import MultimodalPrompt
from minisgl.sampling import BatchSamplingArgs
from minisgl.speculative import create_spec_decoder
from minisgl.utils import init_logger

from .ahead import AheadPlanner
from .cache import create_cache
from .config import SchedulerConfig
from .decode import DecodeManager
from .grammar import GrammarManager
from .output import FinishReason, TokenOutput, apply_runs, logprob_rows
from .plan import Launched, StepPlan
from .planner import BatchPlanner
from .policy import AdmissionPolicy
from .prefill import PrefillManager
from .table import TableManager
from .validation import check_request
from .warming import WarmingGate

logger = init_logger(__name__)


class Scheduler:
    def __init__(self, config: SchedulerConfig, engine: Engine | None = None) -> None:
        self.config = config
        self.grammar = GrammarManager.start(config)  # its tables build beside the start-up
        self.kernels = None  # the kernel warm-up, compiling beside the engine's start-up
        if engine is None:
            from minisgl.warmup.start import engine_with_warmup

            engine, self.kernels = engine_with_warmup(config.engine)
        self.engine = engine
        if self.kernels is not None and config.engine.tp.size > 1:
            self.kernels.wait_all()  # every rank must admit the same requests at the same step
        self.warming = WarmingGate(self.kernels)
        self.table = TableManager(config.max_running_reqs)
        self.cache = create_cache(self.engine, config.cache)
        policy = AdmissionPolicy(config.schedule_policy, config.max_wait_steps, self.cache.hit_len)
        images = self.engine.images
        self.prefill = PrefillManager(self.cache, self.table, config.max_prefill_tokens, policy,
                                      config.prefill_yield,
                                      images is not None and images.image_blocks,
                                      self._may_sample)
        self.decode = DecodeManager(self.cache, self._retract)
        self.spec = create_spec_decoder(config.spec, self.engine)
        self.planner = BatchPlanner(config, self.prefill, self.decode, self.cache,
                                    lambda: self.num_retractions, self.engine.verifies_as_rows)
        self.ahead = AheadPlanner(self.prefill, self.decode, self.cache,
                                  config.max_num_batched_tokens, self.engine.verifies_as_rows)
        self.reqs: dict[int, Req] = {}
        self.eos_token_ids = frozenset(config.eos_token_ids)
        self.num_retractions = 0
        self._inflight: Launched | None = None
        self._seeds = random.Random(config.engine.seed)
        self.prompt_logprobs = PromptLogprobStore()

    # ---- requests in and out ----------------------------------------------------------------

    @property
    def max_context_len(self) -> int:
        """The longest sequence (prompt + output) one request may reach."""
        return min(self.engine.max_seq_len, self.cache.num_tokens)

    def add_request(self, uid: int, input_ids: list[int], params: SamplingParams,
                    mm: MultimodalPrompt | None = None) -> Req:
        """Queue a request (``mm``: its images); raise ``ValueError`` for an unusable prompt."""
        if uid in self.reqs:
            raise ValueError(f"request id {uid} is already in use")
        mm = check_request(input_ids, params, mm, self.engine, self.grammar, self.max_context_len)
        req = Req(uid=uid, input_ids=list(input_ids), prompt_len=len(input_ids),
                  sampling_params=params, mm=mm,
                  max_device_len=min(len(input_ids) + params.max_tokens, self.max_context_len),
                  seed=params.seed if params.seed is not None else self._seeds.getrandbits(63))
        self.grammar.add(req)  # compiled while the prompt is prefilled
        self.reqs[uid] = req
        self.prefill.add(req)
        return req

    def _may_sample(self, req: Req) -> bool:
        """Whether ``req``'s grammar is compiled; until then its prefill stops short of its last
        token (sampler kernels still compiling hold nothing back: ``warming.py``)."""
        return not self.grammar.pending(req)

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

    @property
    def only_waiting(self) -> bool:
        """Every request waits, fed up to its last token, for its grammar: a step does nothing."""
        return (self._inflight is None and not self.decode.running
                and all(r.pending_len <= 1 and not self._may_sample(r)
                        for r in self.prefill.waiting))

    # ---- one step ---------------------------------------------------------------------------

    def step(self) -> list[TokenOutput]:
        """Run one forward and return new tokens: plan, launch, read back, apply.

        With overlap scheduling the forward just launched is read back on the next call: this call
        returns the tokens of the previous forward, so the host prepares step N+1 while the device
        still computes step N (penalties and biases live on the device, so they need no sync). A
        grammar's mask for step N+1 needs token N: the forward of N+1 is launched first, and its
        sampler waits while the host reads N back and advances the grammars (``_launch``'s
        ``before_mask``). A step that drafts needs every last token on the host: it reads the
        forward in flight back before it is planned, unless it can be drafted ahead on that
        forward (``ahead.py``); a verify step is read back at once unless the next may be.
        """
        start = time.perf_counter()
        prev, self._inflight = self._inflight, None
        outputs: list[TokenOutput] = self._admit_compiled()
        drafting = self.spec is not None and self.spec.active(self.decode.running)
        plan = None
        if prev is not None and drafting and self.config.overlap:
            plan = self.ahead.plan(prev.plan, self.spec)
        if plan is None and prev is not None and not prev.plan.settled and (
                drafting or prev.plan.verify or not self.config.overlap):
            outputs, prev = outputs + self._read_back(prev), None

        def read_prev() -> None:
            nonlocal prev
            if prev is not None:
                done, prev = prev, None
                outputs.extend(self._read_back(done))
                self.ahead.drop_rejected(done.plan, plan, self.reqs, self.spec)

        plan = plan or self.planner.plan(self.spec if drafting else None)
        launched = self._launch(plan, read_prev) if plan is not None else None
        if launched is None:
            self.cache.flush()
        elif self.spec is not None:
            self.spec.spare(idle=False)  # while the forward computes
        read_prev()
        if plan is not None and launched is not None:
            if self.config.overlap and (not plan.verify or self.ahead.may_follow(plan, self.spec)):
                self._inflight = launched
            else:
                outputs += self._read_back(launched)
            # steps that only decode (and verify) are timed: what a verify step costs against a
            # plain one (speculative/adaptive.py)
            if self.spec is not None and not plan.prefill:
                self.spec.timed(bool(plan.verify), time.perf_counter() - start)
        return outputs

    def drain(self) -> list[TokenOutput]:
        """Read back the forward in flight, if any (overlap leaves one after the last step)."""
        prev, self._inflight = self._inflight, None
        return self._read_back(prev) if prev is not None else []

    def _admit_compiled(self) -> list[TokenOutput]:
        """Hand the compiled grammars to their requests; end (abort) those whose grammar failed."""
        _, failed = self.grammar.ready()
        for req in failed:
            self._release(req)
        return [TokenOutput(req.uid, next(iter(self.eos_token_ids), 0), "abort") for req in failed]

    def _launch(self, plan: StepPlan, before_mask: Callable[[], None]) -> Launched:
        """Launch a planned forward; ``before_mask`` reads the previous one back (at the latest
        when the grammars' mask is built, which the sampler asks for)."""
        batch = plan.batch
        # a decode graph writes its new tokens' slots into the device page table itself
        replays = self.engine.replays_graph(batch)
        batch.out_slots = self.cache.flush(new_tokens_of=batch.feeds if replays else None)
        self.engine.prepare(batch)
        rows, steps = plan.sample_rows()  # a verify feed samples k + 1 rows
        constrained = self.grammar.constrains(rows)
        args = BatchSamplingArgs.from_reqs(rows, self.engine.vocab_size, self.engine.device,
                                           self.engine.sampling_state, argmax_only=not constrained,
                                           steps=steps)
        args.sampler = self.warming.sampler(rows)
        if constrained:
            args.late_bitmask = lambda: self.grammar.bitmask(rows, self.engine.device,
                                                             before_mask)
        return Launched(plan, self.engine.forward(batch, args))

    def _read_back(self, launched: Launched) -> list[TokenOutput]:
        """Read a forward back and apply it: append its tokens, commit what verify feeds kept,
        check stops, release finished requests.

        A request may have finished or been aborted since the forward was launched, or its feed
        been dropped (``ahead.py``): its tokens are dropped. A retracted one keeps its token (it
        re-feeds everything it has when re-admitted). A verify feed's request gets its accepted
        run (``SpecDecoder.judge``), cut at the first stop, and keeps the KV of what it kept
        (``CacheCoordinator.commit``).
        """
        plan, out = launched.plan, launched.out
        out.wait()
        self.prompt_logprobs.add(out.prompt_logprobs, self.reqs)
        rows, _ = plan.sample_rows()
        runs = plan.split(out.next_tokens.tolist(), logprob_rows(out, rows))
        live = [(feed, run) for feed, run in zip(plan.sampled, runs)  # not finished meanwhile
                if self.reqs.get(feed.uid) is feed.req and feed.uid not in plan.dropped]
        reasons = apply_runs(live, out, self.spec, self.cache, self.eos_token_ids)
        ended: dict[int, FinishReason] = {}  # the grammars advance in one batch; some end
        if self.grammar.active:
            going = [(feed.req, run[-1][0]) for feed, run in live
                     if feed in reasons and reasons[feed] is None]
            ended = self.grammar.accept([r for r, _ in going], [t for _, t in going])
        prefill = set(map(id, plan.prefill))
        results = []
        for feed, run in live:
            req = feed.req
            if feed not in reasons:  # max_tokens 0, the prompt alone: its token is dropped
                results.append(TokenOutput(req.uid, None, "length", first=req,
                                           prompt_logprobs=self.prompt_logprobs.pop(req)))
                self._release(req)
                continue
            reason = reasons[feed]
            if reason is None and req.uid in ended:
                reason = ended[req.uid]  # the grammar is complete, or rejected the token
            results += [TokenOutput(req.uid, token, None, *lp) for token, lp in run[:-1]]
            result = TokenOutput(req.uid, run[-1][0], reason, *run[-1][1])
            if req.output_len == 1:
                result.first = req
                result.prompt_logprobs = self.prompt_logprobs.pop(req)
            if result.finish_reason is not None:
                self._release(req)
            elif id(feed) in prefill:  # its prefill ended
                self.prefill.remove(req)
                self.decode.add(req)
                self.cache.cache_prefix(req)  # later requests with this prompt reuse it now
            results.append(result)
        return results

    # ---- releasing requests -----------------------------------------------------------------

    def _release(self, req: Req) -> None:
        """Finished or aborted: free everything the request holds."""
        if self.spec is not None:
            self.spec.finished(req)
        self.grammar.remove(req)
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
        self.engine.forget_images(req)
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
        """Release the engine's device resources (CUDA graphs, the TP group); stop the kernel
        warm-up if it still compiles."""
        if self.kernels is not None:
            self.kernels.close()
        self.grammar.close()
        self.engine.close()

    def idle(self) -> bool:
        """No request to run: the host's time is spare (``SpecDecoder.spare``); whether deferred
        work is left."""
        return self.spec is not None and self.spec.spare(idle=True)

    def check_integrity(self, thorough: bool = True) -> None:
        self.cache.check_integrity(self.decode.running + self.prefill.admitted(), thorough)
