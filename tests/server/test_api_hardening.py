"""What fault tests found, in-process: the real app and sockets, test_api_server's fake worker.

Lone surrogates in every string field, one set of limits for every endpoint, ``Retry-After`` on
503s, the published OpenAPI schema, the per-request log line, and the scheduler's gauges once the
workers are gone.
"""

from __future__ import annotations

import dataclasses
import logging
import threading

import httpx
import pytest
from test_api_server import fake_server, wait_until

from minisgl.message import SchedulerStatsMsg, StatsReply
from minisgl.server.openai.validation import MAX_STOP, MAX_STOP_TOKEN_IDS

KEY, MODEL = "secret", "fake-model"
CHAT = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def server():
    with fake_server(1, max_queued_requests=1, allowed_origins=("https://ui.example",)) as srv:
        yield srv


@pytest.fixture()
def http(server):
    with httpx.Client(base_url=server.url, headers={"authorization": f"Bearer {KEY}"},
                      timeout=10) as c:
        yield c


def post_raw(http, path: str, text: str) -> httpx.Response:
    return http.post(path, content=text.encode(), headers={"content-type": "application/json"})


S = '"a\\ud800b"'  # JSON text whose string decodes to a lone surrogate
SURROGATES = [  # (path, body with S in one string field, the param the 400 must name)
    ("/v1/chat/completions", f'{{"messages": [{{"role": "user", "content": {S}}}]}}',
     "messages[0].content"),
    ("/v1/chat/completions",
     f'{{"messages": [{{"role": "user", "content": [{{"type": "text", "text": {S}}}]}}]}}',
     "messages[0].content[0].text"),
    ("/v1/chat/completions", f'{{"messages": [{{"role": "user", "content": "a", "name": {S}}}]}}',
     "messages[0].name"),
    ("/v1/chat/completions", f'{{"messages": [{{"role": {S}, "content": "a"}}]}}',
     "messages[0].role"),
    ("/v1/chat/completions", f'{{"messages": [{{"role": "user", "content": "a"}}], "stop": {S}}}',
     "stop"),
    ("/v1/chat/completions", f'{{"messages": [{{"role": "user", "content": "a"}}], "model": {S}}}',
     "model"),
    ("/v1/chat/completions", f'{{"messages": [{{"role": "user", "content": "a"}}], "user": {S}}}',
     "user"),
    ("/v1/completions", f'{{"prompt": {S}}}', "prompt"),
    ("/v1/completions", '{"prompt": ["ok", "\\udfff"]}', "prompt[1]"),
    ("/v1/completions", f'{{"prompt": "a", "stop": ["x", {S}]}}', "stop[1]"),
    ("/v1/completions", f'{{"prompt": "a", {S}: 1}}', "<key>"),
    ("/generate", f'{{"text": {S}}}', "text"),
    ("/generate", f'{{"text": "a", "sampling_params": {{"stop": [{S}]}}}}',
     "sampling_params.stop[0]"),
    ("/generate", f'{{"text": "a", "sampling_params": {{{S}: 1}}}}', "sampling_params.<key>"),
]


@pytest.mark.parametrize("path, body, param", SURROGATES, ids=[s[2] for s in SURROGATES])
@pytest.mark.parametrize("stream", [False, True])
def test_lone_surrogates_are_400s_naming_the_field(http, server, path, body, param, stream):
    if stream:
        body = body[:-1] + ', "stream": true}'
    seen = len(server.worker.seen)
    r = post_raw(http, path, body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and "surrogate" in error["message"]
    assert error["type"] == "invalid_request_error"
    assert len(server.worker.seen) == seen  # nothing reached the workers
    paired = body.replace("\\ud800", "\\ud83d\\ude00").replace("\\udfff", "\\ud83d\\ude00")
    r = post_raw(http, path, paired)  # a real pair is just text
    assert r.status_code < 500 and "surrogate" not in r.text


LIMITS = [  # (path, body builder, param)
    ("/v1/chat/completions", lambda v: {"messages": CHAT, **v}, ""),
    ("/v1/completions", lambda v: {"prompt": "Hi", **v}, ""),
    ("/generate", lambda v: {"text": "Hi", "sampling_params": v}, "sampling_params."),
]


@pytest.mark.parametrize("path, body, prefix", LIMITS, ids=[p for p, _, _ in LIMITS])
def test_one_set_of_limits_for_every_endpoint(http, path, body, prefix):
    assert http.post(path, json=body({"stop": ["x"] * MAX_STOP})).status_code == 200
    for given, param in (({"stop": ["x"] * (MAX_STOP + 1)}, "stop"),
                         ({"stop": ["x" * 1025]}, "stop"),
                         ({"stop_token_ids": [1] * (MAX_STOP_TOKEN_IDS + 1)}, "stop_token_ids")):
        r = http.post(path, json=body(given))
        assert r.status_code == 400, (given, r.text)
        assert r.json()["error"]["param"] == prefix + param
    r = http.post(path, json=body({"stop": ["x"] * 10000}))
    assert r.status_code == 400 and "at most 16" in r.json()["error"]["message"]


def test_503s_carry_retry_after(http, server):
    held = [threading.Thread(target=http.post, args=("/v1/completions",),
                             kwargs={"json": {"prompt": "HOLD"}}) for _ in range(2)]
    for t in held:
        t.start()
    try:
        assert wait_until(lambda: server.app.state.frontend.in_flight == 2)
        r = http.post("/v1/completions", json={"prompt": "Hi"})
        assert r.status_code == 503 and r.json()["error"]["code"] == "overloaded"
        assert int(r.headers["retry-after"]) >= 1
    finally:
        server.app.state.frontend.fail_all_threadsafe("test over")
        for t in held:
            t.join(5)
        server.worker.held.clear()
    assert "retry-after" not in http.post("/v1/completions", json={"prompt": "Hi"}).headers


def test_openapi_schema_describes_request_bodies(http, server):
    schema = httpx.get(f"{server.url}/openapi.json").json()
    paths = schema["paths"]
    for path, model in (("/v1/chat/completions", "ChatCompletionRequest"),
                        ("/v1/completions", "CompletionRequest"), ("/generate", "GenerateRequest")):
        body = paths[path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert body == {"$ref": f"#/components/schemas/{model}"}
        assert set(paths[path]["post"]["responses"]) >= {"200", "400", "401", "503"}
        assert paths[path]["post"]["security"] == [{"bearer": []}]
    models = schema["components"]["schemas"]
    assert "messages" in models["ChatCompletionRequest"]["required"]
    assert models["ChatMessage"]["properties"]["role"]["enum"][0] == "system"
    assert {"/v1/models", "/health", "/metrics", "/v1/server_info"} <= set(paths)
    docs = httpx.get(f"{server.url}/docs")
    assert docs.status_code == 200 and "openapi.json" in docs.text
    r = http.post("/v1/chat/completions", json={"messages": "nope"})  # still OpenAI's format
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"


def test_cors_allows_only_the_configured_origins(server):
    def preflight(origin: str) -> httpx.Response:
        return httpx.options(f"{server.url}/v1/completions", headers={
            "origin": origin, "access-control-request-method": "POST",
            "access-control-request-headers": "authorization,content-type"})

    ok = preflight("https://ui.example")
    assert ok.status_code == 200
    assert ok.headers["access-control-allow-origin"] == "https://ui.example"
    assert "access-control-allow-origin" not in preflight("https://evil.example").headers


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture()
def request_log():
    handler, log = Lines(), logging.getLogger("minisgl.server.openai.request_log")
    log.addHandler(handler)
    yield handler.lines
    log.removeHandler(handler)


def test_one_log_line_per_request_without_the_prompt(http, server, request_log):
    r = http.post("/v1/chat/completions",
                  json={"messages": [{"role": "user", "content": "private words"}]})
    rid = r.json()["id"]
    assert wait_until(lambda: request_log)
    (line,) = request_log
    assert line.startswith(f"request {rid}: status=200 prompt_tokens=13 output_tokens=3 "
                           "cached_tokens=1 ")
    assert "ttft=" in line and "total=" in line and line.endswith("finish=length")
    assert "private" not in line
    http.post("/v1/completions", json={"prompt": "Hi", "n": 2, "stream": True})
    assert wait_until(lambda: len(request_log) == 3)
    assert request_log[1].split(":")[0].endswith("/0") and request_log[2].endswith("finish=length")
    r = http.post("/v1/completions", json={"prompt": "TOOLONG"})
    assert r.status_code == 400 and wait_until(lambda: len(request_log) == 4)
    message = r.json()["error"]["message"]
    assert " status=400 " in request_log[3]
    assert request_log[3].endswith(f"finish=error error={message!r}")


def test_a_refused_request_logs_its_status_and_message(http, request_log):
    r = http.post("/v1/chat/completions", json={"messages": CHAT, "temperature": "hot"})
    assert r.status_code == 400
    (line,) = request_log
    assert line.startswith("request refused: POST /v1/chat/completions status=400 total=")
    assert line.endswith(f"error={r.json()['error']['message']!r}")
    r = http.get("/no/such/route")
    assert r.status_code == 404 and len(request_log) == 2
    assert request_log[1].startswith("request refused: GET /no/such/route status=404 ")


def test_log_requests_adds_the_prompt(http, server, request_log):
    config = server.app.state.config
    server.app.state.config = dataclasses.replace(config, log_requests=True)
    try:
        http.post("/generate", json={"text": "private words"})
    finally:
        server.app.state.config = config
    assert wait_until(lambda: len(request_log) == 2)
    assert request_log[1].endswith("prompt: 'private words'")


def scheduler_gauges(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics").text
    names = ("num_requests_running", "kv_cache_usage_ratio")
    return {n: float(line.split()[-1]) for line in text.splitlines()
            for n in names if line.startswith(f"minisgl:{n} ")}


def test_gauges_are_dropped_when_the_workers_are_lost(http, server):
    frontend = server.app.state.frontend
    t = threading.Thread(target=http.post, args=("/v1/completions",),
                         kwargs={"json": {"prompt": "HOLD"}})
    t.start()
    try:
        assert wait_until(lambda: scheduler_gauges(server.url)["num_requests_running"] == 1)
        frontend.workers_lost_threadsafe("the scheduler process died")
        assert wait_until(lambda: frontend.stats is None)
        assert scheduler_gauges(server.url) == {"num_requests_running": 0,
                                                "kv_cache_usage_ratio": 0}
        assert http.get("/v1/server_info").json()["scheduler"] is None
        late = StatsReply(stats=SchedulerStatsMsg(
            num_running=5, num_waiting=0, num_aborted=0, num_retractions=0, kv_used_tokens=9,
            kv_total_tokens=10, cache_hit_tokens=0, max_context_len=2048))
        server.worker.push.put(late)  # a message still in the pipe from before the death
        t.join(5)
        assert not t.is_alive()
        assert http.get("/v1/server_info").json()["scheduler"] is None
    finally:
        frontend.healthy = True
        server.worker.held.clear()

