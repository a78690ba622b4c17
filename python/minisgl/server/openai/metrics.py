"""Prometheus metrics of the server (``GET /metrics``), in a registry of the app's own.

Each value comes from the process that owns it. The API process counts what it sees of every
backend request (one per choice): how it ended, its tokens and its latencies, all measured from the
request's arrival at the API. The scheduler's state (running and waiting requests, KV use,
retractions) is rank 0's latest stats message, read at scrape time. Everything the API counts is
updated on the event loop that serves HTTP, so the counts are exact under any concurrency.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from minisgl.message import SchedulerStatsMsg
from minisgl.server.openai.bodies import ChoiceState

PREFIX = "minisgl:"
FINISH_REASONS = ("stop", "length", "abort")
TTFT_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 60.0, 120.0,
                300.0)
TPOT_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
QUEUE_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0,
                 300.0)


class ServerMetrics:
    """The app's metrics; ``stats()`` gives the scheduler's latest stats message (or None)."""

    def __init__(self, stats: Callable[[], SchedulerStatsMsg | None]) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter(
            PREFIX + "requests", "Backend requests (one per choice) that ended, by finish reason "
            "(abort: the client went away)", ["finish_reason"], registry=r)
        for reason in FINISH_REASONS:
            self.requests.labels(reason)
        self.errors = Counter(PREFIX + "request_errors", "HTTP requests answered with an error "
                              "status (4xx/5xx, also inside a started stream)", ["status_code"],
                              registry=r)
        self.prompt_tokens = Counter(PREFIX + "prompt_tokens", "Prompt tokens of ended requests",
                                     registry=r)
        self.generation_tokens = Counter(PREFIX + "generation_tokens",
                                         "Tokens generated for ended requests", registry=r)
        self.cache_hit_tokens = Counter(PREFIX + "prefix_cache_hit_tokens", "Prompt tokens "
                                        "served from the prefix cache", registry=r)
        self.ttft = Histogram(PREFIX + "time_to_first_token_seconds", "From arrival at the API "
                              "to the first token", buckets=TTFT_BUCKETS, registry=r)
        self.tpot = Histogram(PREFIX + "time_per_output_token_seconds", "Mean time between "
                              "output tokens after the first, per request", buckets=TPOT_BUCKETS,
                              registry=r)
        self.e2e = Histogram(PREFIX + "e2e_request_latency_seconds", "From arrival at the API to "
                             "the last token, of finished requests", buckets=E2E_BUCKETS,
                             registry=r)
        self.queue = Histogram(PREFIX + "request_queue_time_seconds", "From arrival at the API to "
                               "the request's first forward", buckets=QUEUE_BUCKETS, registry=r)
        self.num_prompt = self.num_hit = 0  # for the hit-rate gauge
        r.register(_SchedulerCollector(stats, self))

    def error(self, status: int) -> None:
        self.errors.labels(str(status)).inc()

    def finish(self, states: Iterable[ChoiceState], arrival: float, failed: bool) -> None:
        """Record the choices of one HTTP request once it is over. Unfinished choices of a request
        that failed are counted as its error status only; otherwise they were aborted."""
        for state in states:
            reason = state.finish_reason
            if reason is None and failed:
                continue
            self._choice(state, reason or "abort", arrival)

    def _choice(self, s: ChoiceState, reason: str, arrival: float) -> None:
        self.requests.labels(reason).inc()
        self.prompt_tokens.inc(s.prompt_tokens)
        self.generation_tokens.inc(len(s.token_ids))
        self.cache_hit_tokens.inc(s.cached_tokens)
        self.num_prompt += s.prompt_tokens
        self.num_hit += s.cached_tokens
        if s.first_forward_time:
            self.queue.observe(max(0.0, s.first_forward_time - arrival))
        if s.first_token_at:
            self.ttft.observe(s.first_token_at - arrival)
        if reason == "abort" or not s.last_token_at:
            return
        self.e2e.observe(s.last_token_at - arrival)
        if len(s.token_ids) > 1:
            self.tpot.observe((s.last_token_at - s.first_token_at) / (len(s.token_ids) - 1))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _SchedulerCollector:
    """Gauges of the scheduler's latest state, the retraction counter, and the prefix-cache hit rate
    (cumulative hit tokens / prompt tokens), produced at scrape time."""

    def __init__(self, stats: Callable[[], SchedulerStatsMsg | None], owner: ServerMetrics) -> None:
        self.stats, self.owner = stats, owner

    def collect(self) -> Iterator[Metric]:
        s = self.stats()

        def value(name: str) -> Any:
            return getattr(s, name) if s is not None else 0

        kv = value("kv_used_tokens") / value("kv_total_tokens") if value("kv_total_tokens") else 0.0
        hit = self.owner.num_hit / self.owner.num_prompt if self.owner.num_prompt else 0.0
        for name, doc, v in (
            ("num_requests_running", "Requests in the decode batch", value("num_running")),
            ("num_requests_waiting", "Requests waiting for a prefill", value("num_waiting")),
            ("kv_cache_usage_ratio", "Fraction of KV slots held by requests", kv),
            ("prefix_cache_hit_rate", "Prefix-cache hit tokens / prompt tokens, cumulative", hit),
            ("state_slots_used", "Hybrid models: recurrent-state slots held by requests",
             value("state_slots_used")),
            ("state_slots_total", "Hybrid models: recurrent-state slots for requests",
             value("state_slots_total")),
            ("state_snapshots", "Hybrid models: state snapshots the prefix cache holds",
             value("state_snapshots")),
            ("state_pool_bytes", "Hybrid models: bytes of the recurrent-state pool",
             value("state_pool_bytes")),
        ):
            yield GaugeMetricFamily(PREFIX + name, doc, value=v)
        yield CounterMetricFamily(PREFIX + "retractions", "Requests retracted (preempted) when the "
                                  "KV cache ran out", value=value("num_retractions"))
        if s is not None and s.spec_method:
            yield from _spec_metrics(s)


def _spec_metrics(s: SchedulerStatsMsg) -> Iterator[Metric]:
    """Speculative decoding, labelled by method (vLLM's spec_decode_* names)."""
    steps, drafts, accepted = s.spec_verify_steps, s.spec_draft_tokens, s.spec_accepted_tokens
    for name, doc, v, kind in (
        ("spec_decode_num_drafts", "Verify steps (one per request and step)", steps,
         CounterMetricFamily),
        ("spec_decode_num_draft_tokens", "Draft tokens proposed", drafts, CounterMetricFamily),
        ("spec_decode_num_accepted_tokens", "Draft tokens accepted", accepted,
         CounterMetricFamily),
        ("spec_decode_skipped_requests", "Requests that could not speculate (penalties, "
         "grammar)", s.spec_skipped_requests, CounterMetricFamily),
        ("spec_decode_acceptance_rate", "Accepted / proposed draft tokens, cumulative",
         accepted / drafts if drafts else 0.0, GaugeMetricFamily),
        ("spec_decode_mean_accepted_length", "Tokens emitted per verify step (accepted drafts "
         "plus one), cumulative", (accepted + steps) / steps if steps else 0.0,
         GaugeMetricFamily),
    ):
        metric = kind(PREFIX + name, doc, labels=["method"])
        metric.add_metric([s.spec_method], v)
        yield metric


class MetricsMiddleware:
    """Pure ASGI middleware: stamps each request's arrival (``request.state.arrival``, Unix time)
    and counts responses with an error status. 499 (the client went away) is an abort, not an
    error: the request's choices are counted as ``finish_reason="abort"``."""

    def __init__(self, app: Any, metrics: ServerMetrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        scope.setdefault("state", {})["arrival"] = time.time()
        started = False

        async def observe(message: dict) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started, status = True, message["status"]
                if status >= 400 and status != 499:
                    self.metrics.error(status)
            await send(message)

        try:
            await self.app(scope, receive, observe)
        except Exception:
            if not started:  # the outermost handler will answer 500
                self.metrics.error(500)
            raise
