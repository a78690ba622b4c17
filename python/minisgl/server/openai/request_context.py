"""What every endpoint does with its request before and around the work: authorization, reading
the JSON body (size limit, strict JSON, encodable text), the model name, admission to the frontend
(503 while down or overloaded) and submitting one backend request per choice."""

from __future__ import annotations

import dataclasses
import hmac
import json
from typing import Any

from fastapi import Request
from starlette.requests import ClientDisconnect

from minisgl.message import TokenizeMsg
from minisgl.params import SamplingParams
from minisgl.server.config import ServerConfig
from minisgl.server.openai.bodies import ChoiceState
from minisgl.server.openai.call import Call
from minisgl.server.openai.errors import ApiError
from minisgl.server.openai.frontend import FrontendManager
from minisgl.server.openai.tools import model_parser
from minisgl.server.openai.validation import check_values, int64


def server_config(request: Request) -> ServerConfig:
    return request.app.state.config


def authorize(request: Request) -> None:
    """``Authorization: Bearer KEY``, or Anthropic's ``x-api-key: KEY``."""
    key = server_config(request).api_key
    if key is None:
        return
    given = request.headers.get("authorization", "")
    given = given[7:] if given.startswith("Bearer ") else request.headers.get("x-api-key")
    if given is None or not hmac.compare_digest(given.encode(), key.encode()):
        raise ApiError(401, "missing or invalid API key", code="invalid_api_key")


async def read_json(request: Request) -> Any:
    """The body as JSON, refusing oversized bodies before and while reading them, and bodies that
    say they are something else (415: ``curl -d`` sends a form unless told otherwise)."""
    authorize(request)
    kind = request.headers.get("content-type")
    media = (kind or "").split(";", 1)[0].strip().lower()
    if kind is not None and media != "application/json" and not media.endswith("+json"):
        raise ApiError(415, f"Content-Type must be application/json, got {kind[:80]!r} (with curl: "
                       "-H 'content-type: application/json')", code="unsupported_media_type")
    limit, length = server_config(request).max_body_bytes, request.headers.get("content-length")
    too_large = ApiError(413, f"request body larger than {limit} bytes", code="request_too_large")
    if length is not None and (not length.isdigit() or int(length) > limit):
        raise too_large if length.isdigit() else ApiError(400, "invalid Content-Length")
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise too_large
    except ClientDisconnect:  # nobody reads the answer; this only keeps it out of the error log
        raise ApiError(400, "the client disconnected while sending the body") from None
    try:
        data = json.loads(body.decode("utf-8"), parse_constant=_no_constant, parse_int=int64)
    except UnicodeDecodeError:
        raise ApiError(400, "request body is not valid UTF-8", code="invalid_json") from None
    except (ValueError, RecursionError) as e:
        raise ApiError(400, f"request body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise ApiError(400, "request body must be a JSON object", code="invalid_json")
    check_values(data)
    return data


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")


def check_model(request: Request, model: str | None) -> str:
    state = request.app.state
    names = {state.config.model_name, state.config.model, state.model_path}
    if model is not None and model.rstrip("/") not in {n.rstrip("/") for n in names if n}:
        raise ApiError(404, f"model {model!r} does not exist; this server serves "
                       f"{state.config.model_name!r}", "model", "model_not_found")
    return state.config.model_name


def tool_parser(request: Request) -> str:
    return model_parser(request.app.state.tokens.model_path,
                        server_config(request).tool_call_parser)


def frontend_for(request: Request, new: int = 0) -> FrontendManager:
    """The frontend, if it may take ``new`` more requests (503 while down or overloaded)."""
    frontend: FrontendManager | None = request.app.state.frontend
    if frontend is None or not frontend.ready:
        raise ApiError(503, "the server is starting", code="starting")
    if not frontend.healthy:
        raise ApiError(503, "the server is unhealthy (a worker process died)", code="unhealthy")
    conf = server_config(request)
    capacity = conf.engine.max_running_requests + conf.max_queued_requests
    if new > capacity:
        raise ApiError(400, f"n: {new} choices exceed the server's capacity {capacity}", "n")
    if frontend.in_flight + new > capacity:
        raise ApiError(503, "the server is overloaded, retry later", code="overloaded")
    return frontend


async def start_call(request: Request, specs: list[tuple[dict, SamplingParams, int]],
                 rid: str | None = None, prompt: Any = None) -> Call:
    """Submit one backend request per (prompt fields, params, prompt index). ``rid`` and (with
    ``--log-requests``) ``prompt`` go into the request's log line."""
    frontend = frontend_for(request, len(specs))
    if server_config(request).clamp_max_tokens:
        specs = [(f, dataclasses.replace(p, clamp_max_tokens=True), k) for f, p, k in specs]
    msgs = [TokenizeMsg(uid=frontend.new_uid(), sampling_params=p, **fields)
            for fields, p, _ in specs]
    states = [ChoiceState(m.uid, i, spec[2]) for i, (m, spec) in enumerate(zip(msgs, specs))]
    arrival = getattr(request.state, "arrival", None)
    prompt = prompt if server_config(request).log_requests else None
    call = Call(frontend, request.is_disconnected, states, request.app.state.metrics, arrival,
                rid, prompt)
    request.state.call = call  # its log line is the request's (the app logs refusals without one)
    return await call.start(msgs)
