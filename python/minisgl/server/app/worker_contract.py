"""The routes that SGLang's and vLLM's routers call on a worker, so minisgl replicas can run
behind them (``--dp N`` starts such a router; ``docs/deployment.md`` shows how by hand).

- ``/server_info``, ``/get_server_info``: the launch (model, served name, sizes), read by the
  router when it registers a worker;
- ``/model_info``, ``/get_model_info``: what the model is (the checkpoint's ``config.json``);
- ``/v1/loads``: SGLang's load report, one entry per data-parallel rank (minisgl serves one), which
  SGLang Model Gateway (``smg``) polls for its load-aware policies;
- ``/get_load``: the object with an integer ``load`` that vLLM's router (and the older SGLang
  router) polls, with SGLang's per-rank fields beside it;
- ``/flush_cache``: empties the prefix cache; refused (400) while requests run, as SGLang does.

Each value comes from the launch configuration or from the scheduler's latest stats message (sent
every 0.5 s); the readiness route that generates lives with the other health routes.
"""

from __future__ import annotations

import json
import os
import time
from datetime import datetime, timezone
from functools import lru_cache

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

import minisgl
from minisgl.message import SchedulerStatsMsg
from minisgl.server.openai.errors import ApiError
from minisgl.server.openai.request_context import authorize, frontend_for, server_config

router = APIRouter()

# sections of SGLang's /v1/loads; minisgl reports the core one (the others are left out, which is
# how SGLang answers for a section it has nothing to say about)
LOAD_SECTIONS = frozenset({"core", "memory", "spec", "lora", "disagg", "queues", "all"})
# the error statuses each route can answer, for the published schema (openapi.py)
ROUTE_ERRORS: dict[str, tuple[int, ...]] = {
    **{p: (401,) for p in ("/server_info", "/get_server_info", "/model_info", "/get_model_info")},
    "/v1/loads": (400, 401, 503), "/get_load": (401, 503), "/flush_cache": (400, 401, 503),
}


@router.get("/server_info")
@router.get("/get_server_info")
async def server_info(request: Request) -> dict:
    authorize(request)
    state, conf = request.app.state, server_config(request)
    stats = _stats(request)
    info = state.server_info
    return {
        "model_path": state.model_path,
        "tokenizer_path": conf.tokenizer or state.model_path,
        "served_model_name": conf.model_name,
        "dp_size": 1,  # each replica is a worker of its own behind the router
        "tp_size": conf.tp,
        "nnodes": conf.nnodes,
        "max_total_num_tokens": (stats.kv_total_tokens if stats is not None
                                 else info.get("max_total_num_tokens")),
        "max_running_requests": conf.engine.max_running_requests,
        "max_queued_requests": conf.max_queued_requests,
        "context_length": info.get("max_context_len"),
        "max_req_input_len": info.get("max_context_len"),
        "page_size": conf.engine.page_size,
        "chunked_prefill_size": conf.engine.max_prefill_tokens,
        "disable_radix_cache": conf.engine.cache != "radix",
        "device": conf.engine.device,
        "version": minisgl.__version__,
    }


@router.get("/model_info")
@router.get("/get_model_info")
async def model_info(request: Request) -> dict:
    authorize(request)
    state, conf = request.app.state, server_config(request)
    hf = _hf_config(state.model_path)
    return {
        "model_path": state.model_path,
        "tokenizer_path": conf.tokenizer or state.model_path,
        "served_model_name": conf.model_name,
        "is_generation": True,
        "model_type": hf.get("model_type"),
        "architectures": hf.get("architectures"),
    }


@router.get("/v1/loads")
async def loads(request: Request, include: str = "core") -> dict:
    authorize(request)
    sections = {s.strip() for s in include.split(",") if s.strip()}
    if unknown := sorted(sections - LOAD_SECTIONS):
        raise ApiError(400, f"include: unknown section {unknown[0]!r} (one of "
                       f"{', '.join(sorted(LOAD_SECTIONS))})", "include")
    return {"timestamp": datetime.now(timezone.utc).isoformat(), "version": minisgl.__version__,
            "dp_rank_count": 1, "loads": [_rank_load(request)]}


@router.get("/get_load")
async def get_load(request: Request) -> dict:
    """``load`` is the requests the replica holds (running + waiting): what a request routed here
    waits behind."""
    authorize(request)
    rank = _rank_load(request)
    return {"load": rank["num_total_reqs"], "dp_rank": 0, "num_reqs": rank["num_total_reqs"],
            "num_waiting_reqs": rank["num_waiting_reqs"], "num_tokens": rank["num_used_tokens"]}


# one operation id per method: a route of several methods gets one id for all (a duplicate)
@router.get("/flush_cache", operation_id="flush_cache_flush_cache_get")
@router.post("/flush_cache", operation_id="flush_cache_flush_cache_post")
async def flush_cache(request: Request) -> JSONResponse:
    authorize(request)
    started = time.monotonic()
    reply = await frontend_for(request).flush_cache()
    if reply.error is not None:
        raise ApiError(reply.status if reply.status != 200 else 400, reply.error,
                       code="cache_not_flushed")
    return JSONResponse({"success": True, "message": "prefix cache flushed",
                         "seconds": round(time.monotonic() - started, 3)})


def _stats(request: Request) -> SchedulerStatsMsg | None:
    frontend = request.app.state.frontend
    return frontend.stats if frontend is not None else None


def _rank_load(request: Request) -> dict:
    """SGLang's per-rank load entry, from the scheduler's latest stats (503 while unhealthy)."""
    frontend = frontend_for(request)
    conf, metrics = server_config(request), request.app.state.metrics
    stats = frontend.stats
    running = stats.num_running if stats else 0
    waiting = stats.num_waiting if stats else 0
    used = stats.kv_used_tokens if stats else 0
    total = stats.kv_total_tokens if stats else 0
    return {
        "dp_rank": 0,
        "num_running_reqs": running,
        "num_waiting_reqs": waiting,
        "num_total_reqs": running + waiting,
        "num_used_tokens": used,
        "max_total_num_tokens": total,
        "token_usage": used / total if total else 0.0,
        "cache_hit_rate": metrics.num_hit / metrics.num_prompt if metrics.num_prompt else 0.0,
        "max_running_requests": conf.engine.max_running_requests,
    }


@lru_cache(maxsize=4)
def _hf_config(model_path: str) -> dict:
    """The checkpoint's ``config.json`` (empty for a .gguf file or an unreadable one)."""
    try:
        with open(os.path.join(model_path, "config.json"), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}
