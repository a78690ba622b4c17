"""The app: the OpenAI endpoints (``server/openai/``), the agent APIs (``server/agents/``), health
and the worker contract on one FastAPI app, with ``/v1/models``, ``/metrics``, ``/v1/server_info``
and OpenAI-style error bodies for every error."""

from __future__ import annotations

import asyncio
import threading
import time
from contextlib import asynccontextmanager
from typing import AsyncIterator, Callable

import msgspec
from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from minisgl.server.agents import router as agent_router
from minisgl.server.app import worker_contract
from minisgl.server.app.docs import install_docs
from minisgl.server.app.health import router as health_router
from minisgl.server.app.openapi import install_openapi
from minisgl.server.config import ServerConfig
from minisgl.server.openai import chat, completions, generate, structured
from minisgl.server.openai.bodies import TokenTexts
from minisgl.server.openai.errors import ApiError, error_body, param_path
from minisgl.server.openai.frontend import FrontendManager
from minisgl.server.openai.generation_defaults import load_sampling_defaults, log_defaults
from minisgl.server.openai.images import PromptCounter, has_vision
from minisgl.server.openai.metrics import MetricsMiddleware, ServerMetrics
from minisgl.server.openai.options import check_options
from minisgl.server.openai.reasoning import ReasoningConfig
from minisgl.server.openai.request_context import authorize, server_config
from minisgl.server.openai.request_log import log_refused
from minisgl.tokenizer.harmony import Harmony
from minisgl.utils import init_logger
from minisgl.utils.startup import since_launch

logger = init_logger(__name__)
router = APIRouter()
RETRY_AFTER_S = 1


@router.get("/v1/models")
async def models(request: Request) -> dict:
    authorize(request)
    state, frontend = request.app.state, request.app.state.frontend
    card = {"id": state.config.model_name, "object": "model", "created": state.created,
            "owned_by": "minisgl", "root": state.model_path,
            "sampling_defaults": state.sampling_defaults}
    if frontend is not None and frontend.stats is not None:
        card["max_model_len"] = frontend.stats.max_context_len
    elif "max_context_len" in state.server_info:
        card["max_model_len"] = state.server_info["max_context_len"]
    return {"object": "list", "data": [card]}


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    """Prometheus text format; open like ``/health`` (a scraper carries no API key)."""
    return Response(request.app.state.metrics.render(), media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/server_info")
async def server_info(request: Request) -> dict:
    authorize(request)
    conf, frontend = server_config(request), request.app.state.frontend
    stats = frontend.stats if frontend is not None else None
    return {
        **request.app.state.server_info,
        "model": conf.model_name,
        "ready": bool(frontend and frontend.ready),
        "healthy": bool(frontend and frontend.healthy),
        "in_flight": frontend.in_flight if frontend is not None else 0,
        "max_running_requests": conf.engine.max_running_requests,
        "max_queued_requests": conf.max_queued_requests,
        "scheduler": msgspec.structs.asdict(stats) if stats is not None else None,
    }


# ------------------------------------------------------------------------------ the app
def _install_error_handlers(app: FastAPI) -> None:
    """Every error, user's or ours, answers OpenAI's ``{"error": {...}}`` shape (never a 422)."""

    @app.exception_handler(ApiError)
    async def _api(request: Request, e: ApiError) -> JSONResponse:
        _log_refused(request, e.status, e.message)
        return JSONResponse(e.body(), e.status, headers=_retry_after(e.status))

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, e: RequestValidationError) -> JSONResponse:
        err = (e.errors() or [{}])[0]
        param = param_path(err.get("loc", ()))
        message = f"{param}: {err.get('msg', 'invalid request')}"
        _log_refused(request, 400, message)
        return JSONResponse(error_body(message, "invalid_request_error", param), 400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, e: StarletteHTTPException) -> JSONResponse:
        kind = "invalid_request_error" if e.status_code < 500 else "server_error"
        headers = {**_retry_after(e.status_code), **(e.headers or {})}
        _log_refused(request, e.status_code, str(e.detail))
        return JSONResponse(error_body(str(e.detail), kind), e.status_code, headers=headers)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, e: Exception) -> JSONResponse:
        # Starlette re-raises it after this answer, so uvicorn logs the traceback
        message = f"internal error: {type(e).__name__}"
        _log_refused(request, 500, message)
        return JSONResponse(error_body(message, "server_error"), 500)


def _log_refused(request: Request, status: int, message: str) -> None:
    """The request's log line, unless it reached the backend (its call logs it then)."""
    if getattr(request.state, "call", None) is None:
        log_refused(request.method, request.url.path, getattr(request.state, "arrival", None),
                    status, message)


def _retry_after(status: int) -> dict[str, str]:
    """Every 503 (starting, overloaded, shutting down) tells clients when to come back."""
    return {"Retry-After": str(RETRY_AFTER_S)} if status == 503 else {}


def create_app(config: ServerConfig, frontend_factory: Callable[[], FrontendManager],
               model_path: str | None = None, server_info: dict | None = None,
               tokens: TokenTexts | None = None) -> FastAPI:
    """The app; ``frontend_factory()`` runs inside the lifespan, on the serving event loop.

    ``app.state.frontend`` is the FrontendManager once ``app.state.frontend_created`` (a
    ``threading.Event``) is set. ``model_path`` is the resolved checkpoint (logprob token texts);
    ``server_info`` is merged into ``/v1/server_info`` (e.g. max_context_len, process ids);
    ``tokens``: the token texts (their tokenizer perhaps loading already), else made here.
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.frontend = frontend_factory()
        app.state.frontend_created.set()
        await app.state.tokens.get()  # the tokenizer loads before the port opens, not on a request
        if (launched := since_launch()) is not None:  # the port opens now: the first-minute log
            logger.info("API server up %.1f s after the launch", launched)
        parser = asyncio.create_task(asyncio.to_thread(structured.warm_parser))  # beside serving
        try:
            yield
        finally:
            parser.cancel()
            await app.state.frontend.close()

    check_options(config)
    app = FastAPI(title="minisgl", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.config, app.state.frontend = config, None
    app.state.draining = False  # set when shutdown starts (http_server): readiness turns 503
    app.state.frontend_created = threading.Event()
    app.state.model_path = model_path or config.model
    app.state.tokens = tokens or TokenTexts(config.tokenizer or app.state.model_path,
                                             config.engine.tokenizer_cache_dir())
    app.state.reasoning = ReasoningConfig(config.reasoning_parser)
    app.state.harmony = Harmony.for_model(app.state.model_path)  # gpt-oss: its output format
    app.state.vision = has_vision(app.state.model_path)  # takes image content parts
    app.state.prompt_counter = PromptCounter()  # count_tokens: prompts rendered here
    app.state.created = int(time.time())
    app.state.sampling_defaults = load_sampling_defaults(config.generation_config,
                                                         app.state.model_path)
    log_defaults(app.state.sampling_defaults)
    app.state.server_info = dict(server_info or {})
    app.state.metrics = ServerMetrics(lambda: app.state.frontend and app.state.frontend.stats)
    app.add_middleware(MetricsMiddleware, metrics=app.state.metrics)
    if config.allowed_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(config.allowed_origins),
                           allow_methods=["*"], allow_headers=["*"])
    _install_error_handlers(app)
    for endpoints in (chat.router, completions.router, generate.router, router,
                      worker_contract.router, health_router, agent_router):
        app.include_router(endpoints)
    install_openapi(app, bearer=config.api_key is not None)
    install_docs(app)
    return app
