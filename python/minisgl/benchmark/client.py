"""An online benchmark client for any OpenAI-compatible server.

It streams ``POST /v1/completions`` (token-id or text prompts) and uses nothing else but
``GET /v1/models`` (to find the model when none is given), so the same run can target minisgl,
SGLang or vLLM. Output lengths are forced with ``max_tokens`` and ``ignore_eos`` (an extra body
field that a server may ignore: the summary counts the requests that stopped early), and tokens
are counted from the ``usage`` of the stream (``stream_options.include_usage``).

Requests arrive by a seeded Poisson process at a given rate, all at once (``inf``), at the times a
trace gives, and in every case at most ``max_concurrency`` are in flight when that is set.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from dataclasses import dataclass
from typing import AsyncIterator

import httpx
from tqdm.asyncio import tqdm

from .datasets import BenchRequest
from .perf import RequestResult, summarize


@dataclass(frozen=True)
class ClientConfig:
    base_url: str = "http://127.0.0.1:1919"
    model: str | None = None  # None: the first model of /v1/models
    api_key: str | None = None
    max_concurrency: int | None = None
    ignore_eos: bool = True
    temperature: float = 0.0
    timeout_s: float = 600.0
    seed: int = 0
    progress: bool = True

    @property
    def root(self) -> str:
        """The server's root URL, whether or not ``base_url`` ends with ``/v1``."""
        url = self.base_url.rstrip("/")
        return url[: -len("/v1")] if url.endswith("/v1") else url

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


def poisson_arrivals(n: int, rate: float, seed: int = 0) -> list[float]:
    """Send times (seconds from the start) of ``n`` requests at ``rate`` per second on average;
    ``rate = inf`` sends them all at once."""
    if rate <= 0:
        raise ValueError(f"request rate must be > 0, got {rate}")
    if math.isinf(rate):
        return [0.0] * n
    rng, t, times = random.Random(seed), 0.0, []
    for _ in range(n):
        times.append(t)
        t += rng.expovariate(rate)
    return times


async def discover_model(http: httpx.AsyncClient, cfg: ClientConfig) -> str:
    resp = await http.get(f"{cfg.root}/v1/models", headers=cfg.headers)
    resp.raise_for_status()
    return resp.json()["data"][0]["id"]


def request_body(req: BenchRequest, model: str, cfg: ClientConfig) -> dict:
    body = {"model": model, "prompt": req.prompt, "max_tokens": req.output_len,
            "temperature": cfg.temperature, "stream": True,
            "stream_options": {"include_usage": True}}
    if cfg.ignore_eos:
        body["ignore_eos"] = True
    return body


async def _sse_events(resp: httpx.Response) -> AsyncIterator[dict]:
    """The JSON events of a server-sent-event stream, up to ``[DONE]``."""
    async for line in resp.aiter_lines():
        data = line[5:].strip() if line.startswith("data:") else ""
        if data == "[DONE]":
            return
        if data:
            yield json.loads(data)


async def send(http: httpx.AsyncClient, req: BenchRequest, model: str,
               cfg: ClientConfig) -> RequestResult:
    """Stream one completion and time it; an error becomes ``ok=False`` (never raised)."""
    res = RequestResult(ok=False, expected_output=req.output_len)
    start = last = time.perf_counter()
    chunks = 0
    try:
        async with http.stream("POST", f"{cfg.root}/v1/completions", headers=cfg.headers,
                               json=request_body(req, model, cfg)) as resp:
            if resp.status_code != 200:
                res.error = f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
                return res
            async for event in _sse_events(resp):
                if "error" in event:
                    err = event["error"]
                    res.error = str(err.get("message", err) if isinstance(err, dict) else err)[:200]
                    return res
                now = time.perf_counter()
                if event.get("choices"):
                    choice = event["choices"][0]
                    if chunks == 0:
                        res.ttft = now - start
                    else:
                        res.itl.append(now - last)
                    chunks, last = chunks + 1, now
                    res.finish_reason = choice.get("finish_reason") or res.finish_reason
                if event.get("usage"):
                    res.prompt_tokens = event["usage"]["prompt_tokens"]
                    res.completion_tokens = event["usage"]["completion_tokens"]
                    res.from_usage = True
    except (httpx.HTTPError, json.JSONDecodeError, KeyError) as e:
        res.error = f"{type(e).__name__}: {e}"[:200]
        return res
    res.e2e = time.perf_counter() - start
    if not res.from_usage:  # estimates: the chunks seen, the prompt as generated
        res.prompt_tokens, res.completion_tokens = req.input_len, chunks
    res.ok, res.error = chunks > 0, "" if chunks else "the stream carried no tokens"
    return res


async def run_requests(requests: list[BenchRequest], arrivals: list[float],
                       cfg: ClientConfig) -> tuple[list[RequestResult], float, str]:
    """Send every request at its arrival time; return the results (in request order), the wall
    time from the first send to the last answer, and the model used."""
    limit = cfg.max_concurrency or len(requests) or 1
    limits = httpx.Limits(max_connections=limit, max_keepalive_connections=limit)
    async with httpx.AsyncClient(timeout=httpx.Timeout(cfg.timeout_s), limits=limits) as http:
        model = cfg.model or await discover_model(http, cfg)
        gate = asyncio.Semaphore(limit)
        bar = tqdm(total=len(requests), disable=not cfg.progress, desc="requests", leave=False)
        start = time.perf_counter()

        async def one(req: BenchRequest, at: float) -> RequestResult:
            await asyncio.sleep(max(0.0, at - (time.perf_counter() - start)))
            async with gate:
                result = await send(http, req, model, cfg)
            bar.update(1)
            return result

        results = await asyncio.gather(*(one(r, a) for r, a in zip(requests, arrivals)))
        duration = time.perf_counter() - start
        bar.close()
    return list(results), duration, model


def run_benchmark(requests: list[BenchRequest], cfg: ClientConfig,
                  rate: float = math.inf) -> dict:
    """One run: requests with ``arrival`` set (a trace) keep it, the others arrive at ``rate``.
    Returns the summary of ``perf.summarize`` with the rate ("trace" for a trace), the model and
    per-request rows."""
    poisson = poisson_arrivals(len(requests), rate, cfg.seed)
    arrivals = [r.arrival if r.arrival is not None else t for r, t in zip(requests, poisson)]
    results, duration, model = asyncio.run(run_requests(requests, arrivals, cfg))
    summary = summarize(results, duration)
    traced = bool(requests) and all(r.arrival is not None for r in requests)
    summary.update(request_rate="trace" if traced else rate, model=model,
                   max_concurrency=cfg.max_concurrency, requests=[r.row() for r in results])
    return summary
