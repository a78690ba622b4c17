"""The HTTP front end: OpenAI-compatible endpoints and the native ``/generate``.

Every request fans out into one backend request per choice; the handler collects their replies
from the ``FrontendManager``. Streams wait for every choice's first reply before the 200 headers go
out, so that an error the backend finds (a prompt longer than the context) is still a JSON 4xx. A
client that goes away aborts its requests, so its KV cache is freed at once.
"""

from __future__ import annotations

import threading
import time
import uuid
from contextlib import asynccontextmanager
from typing import AsyncIterator, Callable

import msgspec
from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from minisgl.message import UserReply
from minisgl.server.agents import router as agent_router
from minisgl.server.app import worker_contract
from minisgl.server.app.docs import install_docs
from minisgl.server.app.health import router as health_router
from minisgl.server.app.openapi import install_openapi
from minisgl.server.launch.args import ServerConfig
from minisgl.server.openai import structured
from minisgl.server.openai.bodies import (
    ChoiceState,
    TokenTexts,
    chat_logprobs,
    chunker,
    completion_logprobs,
    finite,
    response,
    usage,
)
from minisgl.server.openai.call import respond
from minisgl.server.openai.echo import Echo, generate_prompt_logprobs, join_logprobs, prompt_text
from minisgl.server.openai.fields import ROUTER_NO_MODEL
from minisgl.server.openai.frontend import FrontendManager
from minisgl.server.openai.generation_defaults import (
    apply_defaults,
    apply_to_dict,
    load_sampling_defaults,
    log_defaults,
)
from minisgl.server.openai.metrics import MetricsMiddleware, ServerMetrics
from minisgl.server.openai.protocol import (
    ApiError,
    ChatCompletionRequest,
    CompletionRequest,
    GenerateRequest,
    error_body,
    param_path,
    parse,
)
from minisgl.server.openai.reasoning import (
    ReasoningConfig,
    ReasoningSplitter,
    delta_fields,
    message_fields,
)
from minisgl.server.openai.request_context import (
    authorize,
    check_model,
    read_json,
    server_config,
    start_call,
    tool_parser,
)
from minisgl.server.openai.tools import ChatTools, tool_delta, tool_message
from minisgl.server.openai.validation import check_limits
from minisgl.utils import init_logger

logger = init_logger(__name__)
router = APIRouter()
RETRY_AFTER_S = 1


# ------------------------------------------------------------------------------ endpoints
@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    return await run_chat(request, parse(ChatCompletionRequest, await read_json(request)))


async def run_chat(request: Request, req: ChatCompletionRequest) -> Response:
    """One parsed chat request, whole or streamed; the agent APIs (``agents/``) translate onto
    it."""
    req = apply_defaults(req, request.app.state.sampling_defaults)
    model = check_model(request, req.model)
    messages = [m.to_dict() for m in req.messages]
    kwargs = req.chat_template_kwargs
    tools = ChatTools.from_request(req.tools, req.tool_choice, req.parallel_tool_calls,
                                   tool_parser(request))
    grammar = structured.requested_grammar(req, tools and tools.schema())
    await structured.check(grammar)
    extra = {grammar[0]: grammar[1]} if grammar else None
    fields = {"messages": messages, "chat_template_kwargs": kwargs,
              "tools": tools.tools if tools else None}
    specs = [(fields, check_limits(req.params(i, extra)), 0) for i in range(req.n or 1)]
    think = (await request.app.state.reasoning.mode(request.app.state.tokens, kwargs)
             if req.separate_reasoning is not False else None)  # see reasoning.py
    text_of = await request.app.state.tokens.get() if req.logprobs else None
    top = req.top_logprobs or 0
    rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
    call = await start_call(request, specs, rid, messages)
    states = list(call.states.values())
    splitters = {s.uid: ReasoningSplitter(think) if think is not None else None for s in states}
    streams = {s.index: tools.stream() for s in states} if tools else {}

    def lps(entries: list) -> dict | None:
        return chat_logprobs(entries, text_of, top) if text_of else None

    chunk = chunker("chat.completion.chunk", rid, created, model, req.include_usage)

    def piece(s: ChoiceState, r: UserReply) -> dict | None:
        # the reasoning is split off first; tool calls are parsed from the content that is left
        delta = delta_fields(splitters[s.uid], r.text, r.finish_reason is not None)
        reason = r.finish_reason
        if tools:
            parsed, reason = tool_delta(streams[s.index], delta.pop("content", ""), r.finish_reason)
            delta.update(parsed)
            if not (delta or reason or r.logprobs):
                return None  # text held back (a tool call's start, not yet its name)
        return chunk([{"index": s.index, "delta": delta, "logprobs": lps(r.logprobs or []),
                       "finish_reason": reason}])

    def message(s: ChoiceState) -> tuple[dict, str | None]:
        fields = message_fields("".join(s.text), think)
        if not tools:
            return {"role": "assistant", **fields}, s.finish_reason
        msg, reason = tool_message(streams[s.index], fields.pop("content"), s.finish_reason)
        return {**msg, **fields}, reason

    async def render() -> dict:
        choices = [{"index": s.index, "message": msg, "logprobs": lps(s.logprobs),
                    "finish_reason": reason} for s in states for msg, reason in [message(s)]]
        return response("chat.completion", rid, created, model, choices, usage=usage(states))

    head = [chunk([{"index": s.index, "delta": {"role": "assistant", "content": ""},
                    "logprobs": None, "finish_reason": None}]) for s in states]
    tail = lambda: [chunk([], usage=usage(states))] if req.include_usage else []  # noqa: E731
    return await respond(call, bool(req.stream), render, head, piece, tail)


@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    req = apply_defaults(parse(CompletionRequest, await read_json(request)),
                         request.app.state.sampling_defaults)
    model = check_model(request, req.model)
    n = req.n or 1
    grammar = structured.requested_grammar(req)
    await structured.check(grammar)
    params = [check_limits(req.params(i, {grammar[0]: grammar[1]} if grammar else None))
              for i in range(n)]
    specs = [({"text": p} if isinstance(p, str) else {"input_ids": p}, params[i], k)
             for k, p in enumerate(req.prompt) for i in range(n)]
    tokens = request.app.state.tokens
    text_of = await tokens.get() if req.logprobs is not None or req.echo else None
    echo = None
    if req.echo:
        echo = Echo([prompt_text(p, tokens.tokenizer, text_of) for p in req.prompt],
                    text_of, req.logprobs)
    rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
    call = await start_call(request, specs, rid, req.prompt)
    states = list(call.states.values())

    def lps(s: ChoiceState, entries: list) -> dict | None:
        return completion_logprobs(entries, text_of, req.logprobs, s) \
            if req.logprobs is not None else None

    def output(s: ChoiceState, text: str, entries: list) -> tuple[str, dict | None]:
        """The choice's new text and log-probs, after the echoed prompt the first time."""
        head, head_lps = echo.prefix(s) if echo is not None else ("", None)
        return head + text, join_logprobs(head_lps, lps(s, entries))

    chunk = chunker("text_completion", rid, created, model, req.include_usage)

    def piece(s: ChoiceState, r: UserReply) -> dict:
        text, logprobs = output(s, r.text, r.logprobs or [])
        return chunk([{"index": s.index, "text": text, "logprobs": logprobs,
                       "finish_reason": r.finish_reason}])

    async def render() -> dict:
        choices = [{"index": s.index, "finish_reason": s.finish_reason}
                   | dict(zip(("text", "logprobs"), output(s, "".join(s.text), s.logprobs)))
                   for s in states]
        return response("text_completion", rid, created, model, choices, usage=usage(states))

    tail = lambda: [chunk([], usage=usage(states))] if req.include_usage else []  # noqa: E731
    return await respond(call, bool(req.stream), render, [], piece, tail)


@router.post("/generate")
async def generate(request: Request) -> Response:
    req = parse(GenerateRequest, await read_json(request))
    req.sampling_params = apply_to_dict(req.sampling_params, request.app.state.sampling_defaults)
    check_model(request, None if req.model == ROUTER_NO_MODEL else req.model)
    fields = {"text": req.text} if req.text is not None else {"input_ids": req.input_ids}
    params = check_limits(req.params(), "sampling_params.")
    if params.grammar is not None:
        await structured.check((*params.grammar, f"sampling_params.{params.grammar[0]}"))
    call = await start_call(request, [(fields, params, 0)], None, req.text or req.input_ids)
    (state,) = call.states.values()

    def body() -> dict:
        meta = {"id": str(state.uid), "prompt_tokens": state.prompt_tokens,
                "completion_tokens": len(state.token_ids), "cached_tokens": state.cached_tokens,
                "finish_reason": state.finish_reason}
        if req.return_logprob or state.logprobs:
            meta["output_token_logprobs"] = [[finite(lp), t] for t, lp, _ in state.logprobs]
            meta["output_top_logprobs"] = [[[finite(b), a] for a, b in top]
                                           for _, _, top in state.logprobs]
        if state.prompt_logprobs is not None:
            meta.update(generate_prompt_logprobs(state))
        return {"text": "".join(state.text), "output_ids": state.token_ids, "meta_info": meta}

    async def render() -> dict:
        return body()

    return await respond(call, req.stream, render, [], lambda s, r: body(), lambda: [])


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
    async def _api(_: Request, e: ApiError) -> JSONResponse:
        return JSONResponse(e.body(), e.status, headers=_retry_after(e.status))

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, e: RequestValidationError) -> JSONResponse:
        err = (e.errors() or [{}])[0]
        param = param_path(err.get("loc", ()))
        message = f"{param}: {err.get('msg', 'invalid request')}"
        return JSONResponse(error_body(message, "invalid_request_error", param), 400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, e: StarletteHTTPException) -> JSONResponse:
        kind = "invalid_request_error" if e.status_code < 500 else "server_error"
        headers = {**_retry_after(e.status_code), **(e.headers or {})}
        return JSONResponse(error_body(str(e.detail), kind), e.status_code, headers=headers)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, e: Exception) -> JSONResponse:
        # Starlette re-raises it after this answer, so uvicorn logs the traceback
        return JSONResponse(error_body(f"internal error: {type(e).__name__}", "server_error"), 500)


def _retry_after(status: int) -> dict[str, str]:
    """Every 503 (starting, overloaded, shutting down) tells clients when to come back."""
    return {"Retry-After": str(RETRY_AFTER_S)} if status == 503 else {}


def create_app(config: ServerConfig, frontend_factory: Callable[[], FrontendManager],
               model_path: str | None = None, server_info: dict | None = None) -> FastAPI:
    """The app; ``frontend_factory()`` runs inside the lifespan, on the serving event loop.

    ``app.state.frontend`` is the FrontendManager once ``app.state.frontend_created`` (a
    ``threading.Event``) is set. ``model_path`` is the resolved checkpoint (logprob token texts);
    ``server_info`` is merged into ``/v1/server_info`` (e.g. max_context_len, process ids).
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.frontend = frontend_factory()
        app.state.frontend_created.set()
        await app.state.tokens.get()  # the tokenizer loads before the port opens, not on a request
        try:
            yield
        finally:
            await app.state.frontend.close()

    app = FastAPI(title="minisgl", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.config, app.state.frontend = config, None
    app.state.draining = False  # set when shutdown starts (http_server): readiness turns 503
    app.state.frontend_created = threading.Event()
    app.state.model_path = model_path or config.model
    app.state.tokens = TokenTexts(config.tokenizer or app.state.model_path)
    app.state.reasoning = ReasoningConfig(config.reasoning_parser)
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
    app.include_router(router)
    app.include_router(worker_contract.router)
    app.include_router(health_router)
    app.state.run_chat = run_chat  # the agent APIs translate onto it
    app.include_router(agent_router)
    install_openapi(app, bearer=config.api_key is not None)
    install_docs(app)
    return app
