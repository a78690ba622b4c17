"""Liveness and readiness.

``/health`` is liveness: cheap, no work for the backend; 200 while the API process and its workers
are up and the scheduler has finished its warm-up. ``/health_generate`` is readiness (SGLang's
route of that name): it runs a one-token generation through the whole pipeline (tokenizer worker,
scheduler, engine, detokenizer) and answers 200 only when that comes back. It is 503, without
generating, while the server starts or warms up (until the scheduler's stats say ``ready``:
``FrontendManager.warm``), once a worker process died, and while the server drains for shutdown; a
load balancer then stops sending it traffic while the requests in flight still finish. ``/``
answers that a server is there: clients probe their base URL before their first request (Claude
Code sends ``HEAD /``), and a 404 there reads as a server that is not one.
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from minisgl.message import TokenizeMsg
from minisgl.params import SamplingParams
from minisgl.server.openai.errors import ApiError
from minisgl.server.openai.frontend import FrontendManager

router = APIRouter()
# a generous bound for one token behind a full batch; a slower one means the engine is stuck
GENERATE_TIMEOUT_S = 20.0
_PROBE = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)


def _not_ready(message: str, code: str) -> ApiError:
    return ApiError(503, message, code=code)


@router.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
async def root() -> JSONResponse:
    """Open like ``/health`` and free of work: the name and where the API's schema is."""
    return JSONResponse({"name": "minisgl", "docs": "/docs", "openapi": "/openapi.json"})


@router.get("/health")
async def health(request: Request) -> JSONResponse:
    """Liveness, cheap: the process answers, no worker has died, and the warm-up is done (a
    request sent during the warm-up would wait for it, so a probe that trusts this route must
    not send traffic before)."""
    frontend = request.app.state.frontend
    if frontend is None or not frontend.ready:
        raise _not_ready("the server is starting", "starting")
    if not frontend.healthy:
        raise _not_ready("the server is unhealthy (a worker process died)", "unhealthy")
    if not frontend.warm:
        warming = frontend.stats.warming if frontend.stats is not None else ""
        raise _not_ready(f"the server is warming up its kernels{': ' if warming else ''}"
                         f"{warming}", "warming_up")
    body = {"status": "ok"}
    if frontend.stats is not None and frontend.stats.warming:
        # served already; batches that need these kernels sample on the torch reference
        body["warming"] = frontend.stats.warming
    return JSONResponse(body)


@router.get("/health_generate")
async def health_generate(request: Request) -> JSONResponse:
    """Readiness: a one-token generation through the pipeline (see the module's docstring)."""
    state = request.app.state
    frontend: FrontendManager | None = state.frontend
    if getattr(state, "draining", False):
        raise _not_ready("the server is shutting down", "shutting_down")
    if frontend is None or not frontend.ready:
        raise _not_ready("the server is starting", "starting")
    if not frontend.healthy:
        raise _not_ready("the server is unhealthy (a worker process died)", "unhealthy")
    if not frontend.warm:
        raise _not_ready("the server is warming up", "warming_up")
    error = await _generate_one(frontend)
    if error is not None:
        raise _not_ready(f"the test generation failed: {error}", "unhealthy")
    return JSONResponse({"status": "ok"})


async def _generate_one(frontend: FrontendManager) -> str | None:
    """One greedy token from a one-token prompt; None when it came back, else why not."""
    uid = frontend.new_uid()
    queue = await frontend.submit(TokenizeMsg(uid=uid, sampling_params=_PROBE, input_ids=[0]))

    async def outcome() -> str | None:
        while True:
            reply = await queue.get()
            if reply.error is not None:
                return reply.error
            if reply.finish_reason is not None:
                return None

    try:
        return await asyncio.wait_for(outcome(), GENERATE_TIMEOUT_S)
    except asyncio.TimeoutError:
        return f"no token within {GENERATE_TIMEOUT_S:g} s"
    finally:
        frontend.abort_nowait([uid])
