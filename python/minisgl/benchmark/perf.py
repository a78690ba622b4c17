"""Statistics of one benchmark run: per-request measurements in, the summary the reports show out.

Latencies are in milliseconds. TTFT is from sending the request to its first streamed chunk; TPOT
is a request's decode time divided by its tokens after the first (one value per request, so a
long answer weighs as much as a short one); ITL is the gap between consecutive chunks (one value
per gap: a server that sends several tokens in a chunk shows a longer ITL and a shorter TPOT).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Iterable

PERCENTILES = (50, 90, 99)


@dataclass
class RequestResult:
    """What the client measured of one request (times in seconds)."""

    ok: bool
    prompt_tokens: int = 0
    completion_tokens: int = 0
    expected_output: int = 0  # the max_tokens sent
    ttft: float = 0.0
    e2e: float = 0.0
    itl: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    from_usage: bool = False  # token counts from the server's usage (else estimated)
    error: str = ""

    @property
    def tpot(self) -> float | None:
        if self.completion_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.completion_tokens - 1)

    def row(self) -> dict:
        """A compact record for the JSON result (no per-chunk gaps)."""
        out = {k: v for k, v in asdict(self).items() if k != "itl"}
        out["tpot"] = self.tpot
        return out


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); NaN for no values."""
    if not values:
        return math.nan
    data = sorted(values)
    pos = (len(data) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def describe(values: Iterable[float], scale: float = 1000.0) -> dict[str, float]:
    """Mean, percentiles and maximum, multiplied by ``scale`` (seconds to milliseconds by default).
    The maximum matters for streams: one long pause is what a user watching one sees."""
    data = [v * scale for v in values]
    out = {"mean": sum(data) / len(data) if data else math.nan}
    out.update({f"p{q}": percentile(data, q) for q in PERCENTILES})
    out["max"] = max(data) if data else math.nan
    return out


def summarize(results: list[RequestResult], duration: float) -> dict:
    """The run's throughputs and latency statistics (failed requests only counted as failures)."""
    ok = [r for r in results if r.ok]
    prompt = sum(r.prompt_tokens for r in ok)
    output = sum(r.completion_tokens for r in ok)
    per_s = (lambda x: x / duration) if duration > 0 else (lambda x: math.nan)
    return {
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "duration_s": duration,
        "total_input_tokens": prompt,
        "total_output_tokens": output,
        "request_throughput": per_s(len(ok)),
        "input_throughput": per_s(prompt),
        "output_throughput": per_s(output),
        "total_token_throughput": per_s(prompt + output),
        "ttft_ms": describe(r.ttft for r in ok),
        "tpot_ms": describe(t for r in ok if (t := r.tpot) is not None),
        "itl_ms": describe(gap for r in ok for gap in r.itl),
        "e2e_ms": describe(r.e2e for r in ok),
        "early_stops": sum(r.completion_tokens < r.expected_output for r in ok),
        "counts_from_usage": all(r.from_usage for r in ok),
        "errors": sorted({r.error for r in results if not r.ok})[:10],
    }
