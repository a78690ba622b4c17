"""The audit of request fields: each is honoured, accepted on purpose, or refused by name.

A client that sends a field the server ignores gets a 200 and cannot tell that its request was not
served as asked (an audio modality, a prediction, a reasoning effort). So every field of a request
body is one of:

- honoured: a field of the endpoint's request model (``protocol.py``);
- metadata: accepted on purpose because it cannot change the output (``user``, ``store``, ...);
- unsupported: a field the OpenAI (or SGLang) API defines that this server does not implement,
  refused with a 400 that names it and says why;
- router default: a field that SGLang's or vLLM's router adds to every request it forwards,
  accepted only with the value that asks for what minisgl does anyway (``skip_special_tokens:
  true``, ``no_stop_trim: false``, ...), refused with a 400 otherwise;
- unknown: anything else, refused with a 400 too (a misspelt ``max_token`` must not pass).

A JSON ``null`` means "not given", whatever the field (clients echo nulls back), so it is accepted.
``docs/features.md`` has the same tables for users.
"""

from __future__ import annotations

import difflib
import json
from typing import Any

from pydantic import BaseModel

# cannot change the output: identifiers, storage and billing hints, caching hints (minisgl shares
# prefixes by itself), and stream padding that minisgl never adds
_METADATA_COMMON = {"user", "metadata", "store", "service_tier", "safety_identifier",
                    "prompt_cache_key"}
METADATA: dict[str, frozenset[str]] = {
    "ChatCompletionRequest": frozenset(_METADATA_COMMON),
    "CompletionRequest": frozenset(_METADATA_COMMON),
    "GenerateRequest": frozenset({"rid"}),
    # agents' APIs (server/agents/): Codex sends its session ids in client_metadata
    "ResponsesRequest": frozenset(_METADATA_COMMON | {"client_metadata",
                                                      "prompt_cache_retention"}),
    "CountTokensRequest": frozenset({"cache_control"}),
    "MessagesRequest": frozenset({"cache_control", "service_tier", "inference_geo", "speed",
                                  "user_profile_id", "workspace_id"}),
}

# what the routers re-send on their own, with the value that changes nothing here: special tokens
# are skipped, stop strings trimmed, reasoning split off and streamed, metrics and logs kept
_ROUTER_OPENAI = {"no_stop_trim": False, "skip_special_tokens": True,
                  "return_hidden_states": False}
ROUTER_DEFAULTS: dict[str, dict[str, Any]] = {
    "ChatCompletionRequest": {**_ROUTER_OPENAI, "continue_final_message": False,
                              "stream_reasoning": True, "include_reasoning": True},
    "CompletionRequest": dict(_ROUTER_OPENAI),
    "GenerateRequest": {"return_text_in_logprobs": False, "return_hidden_states": False,
                        "log_metrics": True, "background": False, "no_logs": False,
                        "return_bytes": False, "return_entropy": False},
}
# the model name SGLang Model Gateway puts into a /generate body that named none
ROUTER_NO_MODEL = "unknown"

_COMMON_UNSUPPORTED = {
    "json_schema": "give the schema as response_format {\"type\": \"json_schema\", ...} (a "
                   "top-level json_schema is /generate's sampling_params field)",
}
UNSUPPORTED: dict[str, dict[str, str]] = {
    "ChatCompletionRequest": {
        **_COMMON_UNSUPPORTED,
        "functions": "the deprecated function-calling API is not supported (use tools)",
        "function_call": "the deprecated function-calling API is not supported (use tool_choice)",
        "modalities": "only the text modality is supported",
        "audio": "audio output is not supported",
        "prediction": "predicted outputs are not supported",
        "verbosity": "the verbosity cannot be set",
        "web_search_options": "web search is not supported",
    },
    "CompletionRequest": {
        **_COMMON_UNSUPPORTED,
        "suffix": "suffix (fill in the middle) is not supported",
    },
    "ResponsesRequest": {
        "background": "background mode is not supported (stream instead)",
        "conversation": "conversations are not supported (use previous_response_id)",
        "prompt": "stored prompt templates are not supported",
        "max_tool_calls": "max_tool_calls is not supported",
        "top_logprobs": "log-probs are not supported on /v1/responses (use /v1/chat/completions)",
    },
    "MessagesRequest": {
        "mcp_servers": "MCP servers (a server-side tool) are not supported",
    },
    "GenerateRequest": {
        "audio_data": "audio is not supported",
        "lora_path": "LoRA adapters are not supported",
        "return_text_in_logprobs": "log-probs carry token ids only",
        "custom_logit_processor": "custom logit processors are not supported",
        "session_params": "sessions are not supported",
        "return_hidden_states": "hidden states are not returned",
    },
}

# chat message keys beyond role and content; the honoured ones are given to the chat template
_MESSAGE_TEMPLATE = {"name", "tool_calls", "tool_call_id", "reasoning_content"}
_MESSAGE_METADATA = {"refusal", "annotations"}
_MESSAGE_UNSUPPORTED = {
    "audio": "audio in messages is not supported",
    "function_call": "the deprecated function-calling API is not supported (use tool_calls)",
}
_STREAM_OPTIONS_METADATA = {"include_obfuscation"}


def _accepted_value(name: str, value: Any) -> bool:
    """Values of a listed field that ask for nothing this server does not do."""
    return value is None or (name == "modalities" and value == ["text"])


def _did_you_mean(name: str, known: set[str]) -> str:
    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.75)
    return f" (did you mean {close[0]!r}?)" if close else ""


def check_fields(model: type[BaseModel], data: dict) -> tuple[str, str] | None:
    """``(param, message)`` of the first field of ``data`` that would be ignored, else None."""
    kind = model.__name__
    honoured = set(model.model_fields)
    metadata = METADATA.get(kind, frozenset())
    unsupported = UNSUPPORTED.get(kind, {})
    defaults = ROUTER_DEFAULTS.get(kind, {})
    for name, value in data.items():
        if name in honoured or name in metadata:
            continue
        if name in defaults and type(value) is type(defaults[name]) and value == defaults[name]:
            continue
        if name in defaults and name not in unsupported and value is not None:
            return name, (f"{name}: only {json.dumps(defaults[name])} is supported (what "
                          "minisgl does)")
        if name in unsupported:
            if not _accepted_value(name, value):
                return name, f"{name}: {unsupported[name]}"
        elif value is not None:
            return name, f"{name}: unknown field{_did_you_mean(name, honoured)}"
    return _check_nested(data)


def _check_nested(data: dict) -> tuple[str, str] | None:
    options = data.get("stream_options")
    if isinstance(options, dict):
        for name, value in options.items():
            if (name != "include_usage" and name not in _STREAM_OPTIONS_METADATA
                    and value is not None):
                return f"stream_options.{name}", f"stream_options.{name}: unknown field"
    messages = data.get("messages")
    if not isinstance(messages, list):
        return None
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            continue  # the model's validation names it
        for name, value in message.items():
            if name in ("role", "content") or name in _MESSAGE_TEMPLATE or value is None:
                continue
            param = f"messages[{i}].{name}"
            if name in _MESSAGE_UNSUPPORTED:
                return param, f"{param}: {_MESSAGE_UNSUPPORTED[name]}"
            if name not in _MESSAGE_METADATA:
                return param, f"{param}: unknown field"
    return None
