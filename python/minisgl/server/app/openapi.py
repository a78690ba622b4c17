"""The published OpenAPI schema (``/openapi.json``, browsable at ``/docs``).

The handlers read and validate their bodies themselves (to answer every mistake in OpenAI's error
format, never FastAPI's 422), so FastAPI cannot see their request models; this module writes them
into the schema from the same pydantic models the handlers validate with, and declares the error
answers each route can give, so that client generators and schema-based fuzzers see the real API.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from minisgl.server.agents.anthropic_messages import CountTokensRequest, MessagesRequest
from minisgl.server.agents.responses_api import ResponsesRequest
from minisgl.server.app.worker_contract import ROUTE_ERRORS
from minisgl.server.openai.protocol import ChatCompletionRequest, CompletionRequest, GenerateRequest
from minisgl.server.openai.validation import MAX_STOP

REF = "#/components/schemas/{model}"
REQUEST_MODELS: dict[str, type[BaseModel]] = {
    "/v1/chat/completions": ChatCompletionRequest,
    "/v1/completions": CompletionRequest,
    "/generate": GenerateRequest,
    "/v1/responses": ResponsesRequest,
    "/v1/messages": MessagesRequest,
    "/v1/messages/count_tokens": CountTokensRequest,
}
_NULLABLE_STRING = {"anyOf": [{"type": "string"}, {"type": "null"}]}
ERROR_SCHEMA = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {
        "type": "object",
        "required": ["message", "type", "param", "code"],
        "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                       "param": _NULLABLE_STRING, "code": _NULLABLE_STRING},
    }},
}
# Anthropic's error body, which the /v1/messages routes answer with
ANTHROPIC_ERROR_SCHEMA = {
    "type": "object",
    "required": ["type", "error"],
    "properties": {"type": {"const": "error"}, "error": {
        "type": "object",
        "required": ["type", "message"],
        "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
    }},
}
# what the handlers accept beyond their pydantic annotations (validators normalise these)
_PROMPT = {"anyOf": [
    {"type": "string", "minLength": 1},
    {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}},
    {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}},
    {"type": "array", "minItems": 1,
     "items": {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}}},
]}
_STOP = {"anyOf": [{"type": "string"}, {"type": "null"},
                   {"type": "array", "maxItems": MAX_STOP, "items": {"type": "string"}}]}
_SSE_EVENT = {"type": "object", "required": ["data"],
              "properties": {"data": {"type": "string"}, "event": {"type": "string"}}}
_WHY = {400: "Invalid request (the error names the parameter)", 401: "Missing or wrong API key",
        404: "Unknown model or stored response", 413: "Request body too large",
        503: "Starting, overloaded, unhealthy or shutting down (see Retry-After)"}
_ERRORS = {"post": (400, 401, 404, 413, 503), "/v1/models": (401,), "/v1/server_info": (401,),
           "/health": (503,), "/health_generate": (503,), "/v1/responses/{rid}": (400, 401, 404),
           "/v1/responses/{rid}/cancel": (400, 401, 404), **ROUTE_ERRORS}


def install_openapi(app: FastAPI, bearer: bool) -> None:
    """Make ``app.openapi()`` build (once) the schema with request bodies and error answers;
    ``bearer`` declares the API key scheme (the server was given a key)."""

    def build() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = _schema(app, bearer)
        return app.openapi_schema

    app.openapi = build  # type: ignore[method-assign]


def _schema(app: FastAPI, bearer: bool) -> dict[str, Any]:
    schema = get_openapi(title=app.title, version=app.version, routes=app.routes,
                         description="OpenAI-compatible endpoints and the native /generate.")
    refs, defs = models_json_schema([(m, "validation") for m in REQUEST_MODELS.values()],
                                    ref_template=REF)
    components = schema.setdefault("components", {})
    models = defs["$defs"]
    models["CompletionRequest"]["properties"]["prompt"] = _PROMPT
    for name in ("ChatCompletionRequest", "CompletionRequest"):
        models[name]["properties"]["stop"] = _STOP
    components.setdefault("schemas", {}).update(models)
    components["schemas"]["ErrorResponse"] = ERROR_SCHEMA
    components["schemas"]["AnthropicErrorResponse"] = ANTHROPIC_ERROR_SCHEMA
    if bearer:
        components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    for path, methods in schema["paths"].items():
        for method, op in methods.items():
            model = REQUEST_MODELS.get(path) if method == "post" else None
            if model is not None:
                op["requestBody"] = {"required": True, "content": {
                    "application/json": {"schema": refs[(model, "validation")]}}}
                op["responses"]["200"] = {"description": "The answer, or with stream=true a "
                                          "server-sent event stream", "content": {
                    "application/json": {"schema": {"type": "object"}},
                    "text/event-stream": {"schema": _SSE_EVENT}}}
            error = "AnthropicErrorResponse" if path.startswith("/v1/messages") else "ErrorResponse"
            for status in _ERRORS.get(path, _ERRORS["post"] if method == "post" else ()):
                op["responses"][str(status)] = {"description": _WHY[status], "content": {
                    "application/json": {"schema": {"$ref": REF.format(model=error)}}}}
            if path == "/metrics":
                op["responses"]["200"]["content"] = {"text/plain": {"schema": {"type": "string"}}}
            if bearer and path not in ("/health", "/health_generate", "/metrics"):
                op["security"] = [{"bearer": []}]
    return schema
