"""The online benchmark: workloads, an OpenAI-compatible streaming client, statistics, reports."""

from .client import ClientConfig, poisson_arrivals, run_benchmark
from .datasets import (
    BenchRequest,
    load_trace,
    random_requests,
    shared_prefix_requests,
    trace_requests,
)
from .perf import RequestResult, describe, percentile, summarize
from .report import compare, markdown, write_reports

__all__ = [
    "BenchRequest", "ClientConfig", "RequestResult", "compare", "describe", "load_trace",
    "markdown", "percentile", "poisson_arrivals", "random_requests", "run_benchmark",
    "shared_prefix_requests", "summarize", "trace_requests", "write_reports",
]
