"""What a request that leaves things out gets, and what the log and the errors call it, in-process
(the real app and sockets, test_api_server's fake worker): the output limit when none is given,
the request id of each API in the log, and the messages of bodies the server cannot take."""

from __future__ import annotations

import json

import httpx
import pytest
from test_api_hardening import Lines
from test_api_server import fake_server, wait_until

from minisgl.server.openai.protocol import TO_THE_WINDOW

KEY, MODEL = "secret", "fake-model"
CHAT = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module", params=[None, 50], ids=["no-cap", "cap-50"])
def server(request):
    with fake_server(2, default_max_tokens=request.param) as srv:
        srv.cap = request.param
        yield srv


@pytest.fixture()
def http(server):
    with httpx.Client(base_url=server.url, headers={"authorization": f"Bearer {KEY}"},
                      timeout=10) as c:
        yield c


@pytest.fixture()
def request_log():
    import logging

    handler, log = Lines(), logging.getLogger("minisgl.server.openai.request_log")
    log.addHandler(handler)
    yield handler.lines
    log.removeHandler(handler)


def sent(server, http, path: str, body: dict):
    """The sampling parameters the request reached the backend with."""
    seen = len(server.worker.seen)
    r = http.post(path, json={"model": MODEL, **body})
    assert r.status_code == 200, r.text
    assert wait_until(lambda: len(server.worker.seen) > seen)
    return server.worker.seen[seen].sampling_params


def test_without_a_limit_the_output_runs_to_the_window(server, http):
    """Chat and Responses: no limit but the context (cut to it by the scheduler) unless the server
    sets ``--default-max-tokens``; completions keep OpenAI's 16; a given limit stays as given and
    must fit (clamp off: a prompt plus it beyond the context is a 400)."""
    window = server.cap or TO_THE_WINDOW
    for path, body in (("/v1/chat/completions", {"messages": CHAT}),
                       ("/v1/chat/completions", {"messages": CHAT, "stream": True}),
                       ("/v1/responses", {"input": "Hi"}),
                       ("/v1/responses", {"input": "Hi", "stream": True})):
        params = sent(server, http, path, body)
        assert params.max_tokens == window and params.clamp_max_tokens, path
    for path, body in (("/v1/chat/completions", {"messages": CHAT, "max_tokens": 2000}),
                       ("/v1/chat/completions", {"messages": CHAT, "max_completion_tokens": 2000}),
                       ("/v1/responses", {"input": "Hi", "max_output_tokens": 2000}),
                       ("/v1/messages", {"messages": CHAT, "max_tokens": 2000})):
        params = sent(server, http, path, body)
        assert params.max_tokens == 2000 and not params.clamp_max_tokens, path
    params = sent(server, http, "/v1/completions", {"prompt": "Hi"})
    assert params.max_tokens == 16 and params.clamp_max_tokens
    assert sent(server, http, "/generate", {"text": "Hi"}).max_tokens == 128


def test_the_log_names_requests_as_their_clients_see_them(http, request_log):
    chat = http.post("/v1/chat/completions", json={"messages": CHAT}).json()
    response = http.post("/v1/responses", json={"input": "Hi"}).json()
    message = http.post("/v1/messages", json={"model": MODEL, "messages": CHAT,
                                              "max_tokens": 8}).json()
    with http.stream("POST", "/v1/responses", json={"input": "Hi", "stream": True}) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    streamed = events[0]["response"]["id"]
    assert chat["id"].startswith("chatcmpl-") and response["id"].startswith("resp_")
    assert message["id"].startswith("msg_") and streamed.startswith("resp_")
    assert wait_until(lambda: len(request_log) == 4)
    logged = [line.split(":")[0].removeprefix("request ") for line in request_log]
    assert logged == [chat["id"], response["id"], message["id"], streamed]


@pytest.mark.parametrize("body, param, shown", [
    ('{"prompt": "a", "seed": 100000000000000000000000000000}', "seed",
     "integer 100000000000000000000000000000 is out of range"),
    ('{"prompt": "a", "stop_token_ids": [1, -9223372036854775809]}', "stop_token_ids[1]",
     "integer -9223372036854775809 is out of range"),
    ('{"prompt": "a", "seed": ' + "7" * 5000 + "}", "seed", "77777... (5000 digits) is out"),
])
def test_an_integer_beyond_64_bits_is_named_not_called_invalid_json(http, body, param, shown):
    r = http.post("/v1/completions", content=body.encode(),
                  headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["code"] is None
    assert error["message"].startswith(f"{param}: ") and shown in error["message"]
    assert "JSON" not in error["message"]
    largest = body.replace("100000000000000000000000000000", str((1 << 63) - 1))
    if largest != body:  # the largest 64-bit integer is one
        assert http.post("/v1/completions", content=largest.encode()).status_code == 200


@pytest.mark.parametrize("path, fields", [
    ("/v1/chat/completions", {"messages": CHAT}), ("/v1/responses", {"input": "Hi"}),
    ("/v1/messages", {"messages": CHAT, "max_tokens": 4})])
def test_a_body_that_is_not_json_by_its_content_type_is_a_415(http, path, fields):
    body = json.dumps({"model": MODEL, **fields})
    for kind in ("application/x-www-form-urlencoded", "text/plain"):  # curl -d; a typo
        r = http.post(path, content=body.encode(), headers={"content-type": kind})
        assert r.status_code == 415, r.text
        error = r.json()["error"]
        assert f"Content-Type must be application/json, got {kind!r}" in error["message"]
    for kind in ("application/json; charset=utf-8", "application/vnd.api+json", None):
        headers = {"content-type": kind} if kind else {}
        r = http.post(path, content=body.encode(), headers=headers)
        assert r.status_code == 200, (kind, r.text)


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
def test_an_empty_anthropic_content_list_names_that_message(http, path):
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
                {"role": "user", "content": []}]
    limit = {"max_tokens": 4} if path == "/v1/messages" else {}
    r = http.post(path, json={"model": MODEL, "messages": messages, **limit})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["message"].startswith("messages[2].content: must not be empty")
