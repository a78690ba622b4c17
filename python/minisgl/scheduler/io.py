"""The scheduler process of the server: messages in, one engine step, tokens out, in a loop.

Rank 0 receives user messages from the tokenizer workers and sends new tokens to the detokenizer,
the scheduler's state every 0.5 s (for ``/metrics``), and logs its throughput every
``log_stats_interval`` seconds.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from multiprocessing.connection import Connection

import torch

from minisgl.distributed import DistributedInfo, set_rank_threads
from minisgl.message import (
    BACKEND_CODEC,
    DETOKENIZER_CODEC,
    AbortBackendMsg,
    BackendMsg,
    BatchBackendMsg,
    BatchDetokenizerMsg,
    CacheFlushedMsg,
    DetokenizeMsg,
    ExitMsg,
    FlushCacheBackendMsg,
    RequestErrorMsg,
    RequestsAcceptedMsg,
    SchedulerStatsMsg,
    UserMsg,
)
from minisgl.utils import init_logger
from minisgl.utils.mp import ZmqPullQueue, ZmqPushQueue
from minisgl.utils.startup import Phases, since_launch
from minisgl.utils.watchdog import Watchdog

from .config import WAITING_POLL_S
from .output import TokenOutput
from .scheduler import Scheduler
from .stats import FirstForwards, LiveStats, spec_stats, state_stats
from .warmup import warm_up

logger = init_logger(__name__)

_STATS_INTERVAL_S = 0.5
_IDLE_POLL_MS = 100


class _NoOutbox:
    """Ranks other than 0 compute the same tokens but tell nobody."""

    def put(self, msg) -> None:
        pass

    def close(self) -> None:
        pass


class SchedulerIO:
    """Runs a ``Scheduler`` against its ZMQ queues until an ``ExitMsg`` or a signal.

    With tensor parallelism, rank 0 alone owns the queues: every loop it broadcasts the messages it
    received (possibly none) to the other ranks, so that every rank handles the same messages in
    the same order and builds the same batches.
    """

    def __init__(self, scheduler: Scheduler, backend_addr: str, detokenizer_addr: str,
                 log_stats_interval: float = 10.0, watchdog_timeout: float = 0.0) -> None:
        self.scheduler = scheduler
        self.comm = scheduler.engine.comm
        self.primary = self.comm.info.is_primary
        self.inbox = (ZmqPullQueue(backend_addr, bind=True, codec=BACKEND_CODEC)
                      if self.primary else None)
        self.outbox = (ZmqPushQueue(detokenizer_addr, bind=False, codec=DETOKENIZER_CODEC)
                       if self.primary else _NoOutbox())
        self.running = True
        self.num_aborted = 0
        self._last_stats = 0.0
        self.first_forwards = FirstForwards()
        self.live = LiveStats(log_stats_interval)
        self._parent = os.getppid()
        self.watchdog_timeout = watchdog_timeout
        # readiness: the API's /health_generate answers 503 until a stats message says ready;
        # a warm-up inside the loop comes first (one before run() delays the first stats)
        self.ready = not scheduler.config.warmup
        self._idle_work = False  # the scheduler has deferred work for its idle turns
        self._stepped = False  # a step ran since the caches' accounts were last checked

    def run(self) -> None:
        # TP: only rank 0 acts on SIGTERM; it forwards an ExitMsg, so every rank leaves the loop
        # after the same step and the ranks close their engines together
        signal.signal(signal.SIGTERM, (lambda *_: self.stop()) if self.primary else signal.SIG_IGN)
        try:
            if not self.ready:
                self.outbox.put(self.stats())  # readiness: 503 while warming up
                # NOTE: every rank runs the same plan without messages, so the ranks stay in step;
                # with TP a SIGTERM waits for the end of it (rank 0 stopping alone would leave
                # the others inside a collective)
                alone = self.comm.info.size == 1
                warm_up(self.scheduler, should_stop=lambda: alone and not self.running)
                self.live.fed_tokens = self.scheduler.prefill.fed_tokens  # not the warm-up's
                self.ready = True
                self._maybe_send_stats(at_once=True)  # readiness at once, not at the next interval
                kernels = self.scheduler.kernels
                if kernels is not None and kernels.warming():
                    logger.info("ready; compiling in the background: %s (batches that need "
                                "them sample on the torch reference meanwhile)", kernels.warming())
            launched = since_launch()
            if launched is not None and self.primary:
                logger.info("ready %.1f s after the launch", launched)
            watchdog = Watchdog(self.watchdog_timeout, f"scheduler rank {self.comm.info.rank}")
            while os.getppid() == self._parent:
                watchdog.beat()
                self._receive()
                if not self.running:
                    break
                if self.scheduler.has_work:
                    self._send(self._step())
                    self._stepped = True
                else:
                    self._idle_work = self.scheduler.idle()
                    if self._stepped:  # once idle: the counts (a request arriving waits for it)
                        self.scheduler.check_integrity(thorough=False)
                        self._stepped = False
                self._maybe_send_stats()
        finally:
            if self.inbox is not None:
                self.inbox.close()
            self.outbox.close()
            if not self.running:  # asked to stop (not a crash, not a vanished launcher)
                self.scheduler.engine.close()

    def stop(self) -> None:
        self.running = False

    def _step(self) -> list[TokenOutput]:
        launched_at = time.time()
        outputs = self.scheduler.step()
        self.first_forwards.mark(launched_at, self.scheduler.reqs)
        self.live.add(outputs, self.scheduler.prefill.fed_tokens)
        return outputs

    def _receive(self) -> None:
        msgs: list[BackendMsg] = []
        if self.inbox is not None:
            if self.scheduler.has_work and not self.scheduler.only_waiting:
                msgs = self.inbox.get_all_nowait()
            else:
                # idle: wait for a request, only a glance while deferred work is left; a short
                # wait while requests wait for a compiler (no spinning beside it)
                wait = (int(WAITING_POLL_S * 1000) if self.scheduler.only_waiting else
                        0 if self._idle_work else _IDLE_POLL_MS)
                first = self.inbox.get(timeout_ms=wait)
                msgs = [] if first is None else [first, *self.inbox.get_all_nowait()]
        if self.comm.info.size > 1:
            if not self.running:
                msgs.append(ExitMsg())
            # one batch of the messages, a batch received flattened into it
            flat = [m for msg in msgs
                    for m in (msg.msgs if isinstance(msg, BatchBackendMsg) else [msg])]
            data = BACKEND_CODEC.encode(BatchBackendMsg(msgs=flat)) if self.primary else None
            msgs = [BACKEND_CODEC.decode(self.comm.broadcast_bytes(data))]
        accepted: list[UserMsg] = []
        for msg in msgs:
            self._handle(msg, accepted)
        if accepted:  # streams start now, not at their first token
            self.outbox.put(RequestsAcceptedMsg(uids=[m.uid for m in accepted],
                                                prompt_lens=[len(m.input_ids) for m in accepted]))

    def _handle(self, msg: BackendMsg, accepted: list[UserMsg]) -> None:
        if isinstance(msg, BatchBackendMsg):
            for m in msg.msgs:
                self._handle(m, accepted)
        elif isinstance(msg, UserMsg):
            try:
                req = self.scheduler.add_request(msg.uid, msg.input_ids, msg.sampling_params,
                                                 msg.mm)
                self.first_forwards.add(req)
                accepted.append(msg)
            except ValueError as e:
                param = getattr(e, "param", None) or (
                    str(e).split(":", 1)[0] if ":" in str(e) else None)
                self.outbox.put(RequestErrorMsg(uid=msg.uid, message=str(e), param=param))
        elif isinstance(msg, AbortBackendMsg):
            self.num_aborted += self.scheduler.abort(msg.uid)
            self.first_forwards.forget(msg.uid)
        elif isinstance(msg, FlushCacheBackendMsg):
            self._flush_cache(msg.uid)
        elif isinstance(msg, ExitMsg):
            self.stop()

    def _flush_cache(self, uid: int) -> None:
        """Every rank gets the same message after the same step, so all of them flush or none."""
        s = self.scheduler
        if s.has_work:
            busy = f"{len(s.reqs)} requests are running or waiting"
            self.outbox.put(RequestErrorMsg(uid=uid, message=f"cache not flushed: {busy}"))
            return
        freed = s.cache.flush_prefix_cache()
        logger.info("prefix cache flushed (%d tokens)", freed)
        self.outbox.put(CacheFlushedMsg(uid=uid, freed_tokens=freed))

    def _send(self, outputs: list[TokenOutput]) -> None:
        if not outputs:
            return
        msgs = [self._detokenize_msg(out) for out in outputs]
        self.outbox.put(msgs[0] if len(msgs) == 1 else BatchDetokenizerMsg(msgs=[*msgs]))

    def _detokenize_msg(self, out: TokenOutput) -> DetokenizeMsg:
        msg = DetokenizeMsg(
            uid=out.uid, token=out.token, finish_reason=out.finish_reason,
            logprob=out.logprob, top_logprobs=out.top_logprobs,
        )
        if out.first is not None:
            msg.prompt_len = out.first.prompt_len
            msg.cached_len = out.first.cache_hit_len
            msg.stop = out.first.sampling_params.stop
            msg.first_forward_time = self.first_forwards.pop(out.uid)
            msg.prompt_logprobs = out.prompt_logprobs
        return msg

    def _maybe_send_stats(self, at_once: bool = False) -> None:
        """Send the stats when ``_STATS_INTERVAL_S`` has passed since the last (``at_once``:
        now)."""
        now = time.monotonic()
        if not at_once and now - self._last_stats < _STATS_INTERVAL_S:
            return
        self._last_stats = now
        stats = self.stats()
        self.outbox.put(stats)
        if not self.live.due(now):
            return
        fed = self.scheduler.prefill.admitted()  # half-fed prompts
        prefilling = (sum(r.device_len for r in fed), sum(len(r.input_ids) for r in fed))
        if (line := self.live.roll(now, stats, prefilling)) is not None:
            logger.info(line)
            if self.scheduler.spec is not None:
                logger.info(self.scheduler.spec.stats.line())

    def stats(self) -> SchedulerStatsMsg:
        s = self.scheduler
        cache = s.cache
        free = cache.free_tokens + cache.prefix_cache.evictable_size
        return SchedulerStatsMsg(
            num_running=len(s.decode),
            num_waiting=len(s.prefill),
            num_aborted=self.num_aborted,
            num_retractions=s.num_retractions,
            kv_used_tokens=cache.num_tokens - free,
            kv_total_tokens=cache.num_tokens,
            cache_hit_tokens=cache.num_hit_tokens,
            max_context_len=s.max_context_len,
            ready=self.ready,
            warming=s.kernels.warming() if s.kernels is not None else "",
            **state_stats(s),
            **spec_stats(s),
        )


def run_scheduler_process(
    options, model_path: str, backend_addr: str, detokenizer_addr: str, *, ready: Connection,
    log_stats_interval: float = 10.0, watchdog_timeout: float = 0.0,
    tp: DistributedInfo = DistributedInfo(), dist_init_addr: str = "", local_index: int = 0,
) -> None:
    """Entry point of a scheduler child process (one per TP rank); reports ``("ok", info)`` or
    ``("error", line)``. ``log_stats_interval``: seconds between throughput log lines (0: none);
    ``watchdog_timeout``: seconds one loop iteration may take before the process dumps its stacks
    and exits (0: never); ``local_index``: which GPU of this machine the rank uses."""
    from minisgl.models import eos_token_ids
    from minisgl.utils.heap import freeze_heap

    phases = Phases(launch="spawned")
    try:
        eos = eos_token_ids(model_path)
        phases.mark("tokenizer")
        config = options.scheduler_config(model_path, eos, online=True)
        device = config.engine.device
        if device.type == "cuda":
            device = torch.device("cuda", local_index)
        set_rank_threads(device, tp.size)
        engine = dataclasses.replace(config.engine, tp=tp, dist_init_addr=dist_init_addr,
                                     device=device)
        scheduler = Scheduler(dataclasses.replace(config, engine=engine))
        phases.mark("engine")
        io = SchedulerIO(scheduler, backend_addr, detokenizer_addr, log_stats_interval,
                         watchdog_timeout)
    except Exception as e:  # report any start-up failure in one line
        ready.send(("error", f"scheduler failed to start: {type(e).__name__}: {e}"))
        return
    logger.info("scheduler rank %d started: %s", tp.rank, phases)
    ready.send(("ok", {"max_context_len": scheduler.max_context_len,
                       "max_total_num_tokens": scheduler.cache.num_tokens}))
    freeze_heap()
    io.run()
