"""No request field is silently ignored: each is honoured, accepted as metadata, or a 400 naming it.

Runs against the real app with the fake worker of ``test_api_server`` (the audit lives in the API).
"""

from __future__ import annotations

import pytest
from test_api_server import CHAT, KEY, MODEL, client, http, server  # noqa: F401 (fixtures)

from minisgl.server.agents.anthropic_messages import MessagesRequest
from minisgl.server.agents.responses_api import ResponsesRequest
from minisgl.server.openai.fields import UNSUPPORTED, check_fields
from minisgl.server.openai.protocol import ChatCompletionRequest, CompletionRequest, GenerateRequest

CHAT_BODY = {"messages": CHAT, "max_tokens": 3}
COMPLETION_BODY = {"prompt": "Hi", "max_tokens": 3}
GENERATE_BODY = {"text": "Hi", "sampling_params": {"max_new_tokens": 3}}
BASES = {"/v1/chat/completions": CHAT_BODY, "/v1/completions": COMPLETION_BODY,
         "/generate": GENERATE_BODY}

REFUSED = [  # (path, field, value): each is a 400 whose param is the field
    ("/v1/chat/completions", "modalities", ["text", "audio"]),
    ("/v1/chat/completions", "audio", {"voice": "alloy", "format": "wav"}),
    ("/v1/chat/completions", "prediction", {"type": "content", "content": "x"}),
    ("/v1/chat/completions", "reasoning_effort", "low"),
    ("/v1/chat/completions", "verbosity", "low"),
    ("/v1/chat/completions", "web_search_options", {}),
    ("/v1/chat/completions", "functions", [{"name": "f", "parameters": {}}]),
    ("/v1/chat/completions", "function_call", "auto"),
    ("/v1/chat/completions", "max_token", 3),  # misspelt: unknown
    ("/v1/completions", "suffix", "end"),
    ("/v1/completions", "json_schema", "{}"),  # top level: response_format carries the schema
    ("/v1/completions", "prompt_logprobs", 1),  # vLLM's, not ours: unknown
    ("/generate", "image_data", "x.png"),
    ("/generate", "lora_path", "a"),
    ("/generate", "return_text_in_logprobs", True),
]
ACCEPTED = [  # (path, field, value): metadata, or a null, or text-only modalities: a 200
    ("/v1/chat/completions", "user", "u1"),
    ("/v1/chat/completions", "metadata", {"a": "b"}),
    ("/v1/chat/completions", "store", False),
    ("/v1/chat/completions", "service_tier", "auto"),
    ("/v1/chat/completions", "safety_identifier", "x"),
    ("/v1/chat/completions", "prompt_cache_key", "k"),
    ("/v1/chat/completions", "modalities", ["text"]),
    ("/v1/chat/completions", "audio", None),
    ("/v1/chat/completions", "reasoning_effort", None),
    ("/v1/completions", "user", "u1"),
    ("/v1/completions", "suffix", None),
    ("/v1/completions", "store", True),
    ("/generate", "rid", "abc"),
]


@pytest.mark.parametrize("path, name, value", REFUSED, ids=[f"{p}:{n}" for p, n, _ in REFUSED])
def test_unsupported_field_is_a_400_naming_it(http, path, name, value):
    r = http.post(path, json={**BASES[path], name: value})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == name and error["message"].startswith(f"{name}: ")
    assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize("path, name, value", ACCEPTED, ids=[f"{p}:{n}" for p, n, _ in ACCEPTED])
def test_metadata_field_is_accepted(http, path, name, value):
    r = http.post(path, json={**BASES[path], name: value})
    assert r.status_code == 200, r.text
    assert "Hello world" in r.text


@pytest.mark.parametrize("key, value, status", [
    ("name", "bob", 200), ("refusal", None, 200), ("annotations", [], 200),
    ("audio", {"id": "a1"}, 400), ("function_call", {"name": "f", "arguments": "{}"}, 400),
    ("colour", "red", 400),
])
def test_message_fields(http, key, value, status):
    messages = [{"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Yo", key: value}]
    r = http.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 3})
    assert r.status_code == status, r.text
    if status == 400:
        assert r.json()["error"]["param"] == f"messages[1].{key}"


def test_stream_options_fields(http):
    body = {**COMPLETION_BODY, "stream": True}
    r = http.post("/v1/completions",
                  json={**body, "stream_options": {"include_obfuscation": False}})
    assert r.status_code == 200
    r = http.post("/v1/completions", json={**body, "stream_options": {"include_usage": True,
                                                                       "chunk_size": 4}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream_options.chunk_size"


def test_the_official_client_extra_body_is_audited(client):
    import openai

    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=CHAT, reasoning_effort="high")
    assert e.value.body["param"] == "reasoning_effort"
    ok = client.chat.completions.create(model=MODEL, messages=CHAT, user="me", store=False,
                                        metadata={"k": "v"}, extra_body={"top_k": 5})
    assert ok.choices[0].message.content == "Hello world"


def test_every_refused_field_is_in_the_tables():
    """The tables name every OpenAI field this server does not implement; none is also honoured."""
    models = {"ChatCompletionRequest": ChatCompletionRequest,
              "CompletionRequest": CompletionRequest, "GenerateRequest": GenerateRequest,
              "ResponsesRequest": ResponsesRequest, "MessagesRequest": MessagesRequest}
    for kind, table in UNSUPPORTED.items():
        honoured = set(models[kind].model_fields)
        assert not honoured & set(table), (kind, honoured & set(table))
    assert check_fields(CompletionRequest, {"prompt": "a", "echo": True}) is None
