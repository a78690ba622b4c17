"""The HTTP front end in-process: the real app and ZMQ sockets, a fake worker behind them.

The fake worker stands in for tokenizer + scheduler + detokenizer: it answers "Hello world" in three
chunks (token ids 1, 2, 3), or obeys a keyword in the prompt (HOLD, SLOW, TOOLONG, SEED).
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time

import httpx
import openai
import pytest

from helpers.app_server import serve_app
from minisgl.llm.config import EngineOptions
from minisgl.message import (
    FRONTEND_CODEC,
    TOKENIZER_CODEC,
    AbortMsg,
    BatchFrontendMsg,
    BatchTokenizerMsg,
    SchedulerStatsMsg,
    StatsReply,
    TokenizeMsg,
    UserReply,
)
from minisgl.server.config import ServerConfig
from minisgl.utils.mp import (
    ServerAddrs,
    ZmqPullQueue,
    ZmqPushQueue,
)

KEY, MODEL = "secret", "fake-model"
CHAT = [{"role": "user", "content": "Hi"}]
CHUNKS = [("Hello", 1), (" wor", 2), ("ld", 3)]
CAPACITY = 4  # max_running_requests 2 + max_queued_requests 2


class FakeWorker(threading.Thread):
    def __init__(self, addrs: ServerAddrs) -> None:
        super().__init__(daemon=True)
        self.addrs, self.stopping = addrs, threading.Event()
        self.held: set[int] = set()
        self.aborted: set[int] = set()
        self.seen: list[TokenizeMsg] = []
        self.drips: set[int] = set()  # requests that get a token every loop until aborted
        self.stats_to_send: StatsReply | None = None
        self.warm_at_start = False  # fake_server: send ready stats first, as a warm scheduler does

    def run(self) -> None:
        pull = ZmqPullQueue(self.addrs.tokenizer, bind=False, codec=TOKENIZER_CODEC)
        self.push = ZmqPushQueue(self.addrs.frontend, bind=False, codec=FRONTEND_CODEC)
        if self.warm_at_start:
            self.push.put(self.stats())  # as the scheduler does once warm
        while not self.stopping.is_set():
            msg = pull.get(timeout_ms=20)
            for m in (msg.msgs if isinstance(msg, BatchTokenizerMsg) else [msg] if msg else []):
                self.handle(m)
            stats, self.stats_to_send = self.stats_to_send, None  # set by a test's thread
            if stats is not None:
                self.push.put(stats)
            for uid in list(self.drips):
                self.push.put(UserReply(uid=uid, text="x", token_ids=[9], prompt_tokens=4))
        pull.close()
        self.push.close()

    def stats(self, ready: bool = True) -> StatsReply:
        n = len(self.held)
        return StatsReply(stats=SchedulerStatsMsg(
            num_running=n, num_waiting=0, num_aborted=len(self.aborted), num_retractions=0,
            kv_used_tokens=10 * n, kv_total_tokens=1000, cache_hit_tokens=0, max_context_len=2048,
            ready=ready))

    def handle(self, msg: TokenizeMsg | AbortMsg) -> None:
        if isinstance(msg, AbortMsg):
            self.aborted.add(msg.uid)
            self.held.discard(msg.uid)
            self.drips.discard(msg.uid)
            self.push.put(self.stats())
            return
        self.seen.append(msg)
        prompt = msg.text or (msg.messages[-1]["content"] if msg.messages else str(msg.input_ids))
        sp, n_prompt = msg.sampling_params, len(prompt)
        if "TOOLONG" in prompt:
            error = "prompt has 5000 tokens, the context is 2048"
            self.push.put(UserReply(uid=msg.uid, error=error, error_param="prompt", status=400))
        elif "DRIP" in prompt:
            self.drips.add(msg.uid)
        elif "HOLD" in prompt:
            self.held.add(msg.uid)
            self.push.put(self.stats())
        elif "SEED" in prompt:
            self.push.put(UserReply(uid=msg.uid, text=f"{prompt}|seed={sp.seed}", token_ids=[7],
                                    finish_reason="stop", prompt_tokens=n_prompt))
        else:
            replies = []
            for i, (text, tid) in enumerate(CHUNKS):
                alts = [(tid, -0.5 * tid), (tid + 10, float("-inf"))]  # -inf: JSON has none
                lps = [(tid, -0.5 * tid, alts[:sp.top_logprobs])]
                replies.append(UserReply(
                    uid=msg.uid, text=text, token_ids=[tid], logprobs=lps if sp.logprobs else None,
                    finish_reason="length" if i == 2 else None, prompt_tokens=n_prompt,
                    cached_tokens=1 if i == 0 else 0))
            if "SLOW" in prompt:  # the first chunk only, then wait for an abort
                self.held.add(msg.uid)
                replies = replies[:1]
            self.push.put(BatchFrontendMsg(msgs=replies))  # batches must be unpacked too


def wait_until(cond, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return False


@contextlib.contextmanager
def fake_server(max_running: int, **options):
    """The real app on a real socket, with ``FakeWorker`` behind it; ``options``: ServerConfig's."""
    config = ServerConfig(model="/models/fake/", served_model_name=MODEL, api_key=KEY,
                          engine=EngineOptions(device="cpu", max_running_requests=max_running),
                          **options)

    def warm_worker(addrs: ServerAddrs) -> FakeWorker:
        worker = FakeWorker(addrs)
        worker.warm_at_start = True
        return worker

    with serve_app(config, warm_worker) as srv:
        yield srv


@pytest.fixture(scope="module")
def server():
    with fake_server(2, max_queued_requests=2, max_body_bytes=1 << 16) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0, timeout=10)


@pytest.fixture()
def http(server):
    with httpx.Client(base_url=server.url, headers={"authorization": f"Bearer {KEY}"},
                      timeout=10) as c:
        yield c


def info(http) -> dict:
    return http.get("/v1/server_info").json()


def test_chat_stream_equals_non_stream(client):
    full = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=3)
    assert full.id.startswith("chatcmpl-") and full.object == "chat.completion"
    assert full.choices[0].message.role == "assistant"
    assert full.choices[0].message.content == "Hello world"
    assert full.choices[0].finish_reason == "length"
    u = full.usage
    assert (u.prompt_tokens, u.completion_tokens, u.total_tokens) == (2, 3, 5)
    assert full.usage.prompt_tokens_details.cached_tokens == 1
    chunks = list(client.chat.completions.create(model=MODEL, messages=CHAT, stream=True))
    first = chunks[0].choices[0].delta
    assert first.role == "assistant" and first.content == ""
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "Hello world"
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(c.usage is None for c in chunks)


def test_chat_n3_stream_with_usage_and_seeds(client, server):
    stream = client.chat.completions.create(model=MODEL, messages=CHAT, n=3, stream=True,
                                            stream_options={"include_usage": True}, seed=5)
    chunks = list(stream)
    texts = {i: "".join(c.choices[0].delta.content or "" for c in chunks
                        if c.choices and c.choices[0].index == i) for i in range(3)}
    assert texts == {i: "Hello world" for i in range(3)}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 9
    assert chunks[-1].usage.prompt_tokens == 2  # the prompt counts once, not once per choice
    seeds = [m.sampling_params.seed for m in server.worker.seen[-3:]]
    assert sorted(seeds) == [5, 6, 7]
    assert all(m.messages == CHAT for m in server.worker.seen[-3:])


def test_completions_prompt_major_choices(client):
    full = client.completions.create(model=MODEL, prompt=["SEED a", "SEED b"], n=2, seed=7)
    assert full.id.startswith("cmpl-") and full.object == "text_completion"
    got = {c.index: c.text for c in full.choices}
    assert got == {0: "SEED a|seed=7", 1: "SEED a|seed=8", 2: "SEED b|seed=7", 3: "SEED b|seed=8"}
    assert full.usage.prompt_tokens == 12 and full.usage.completion_tokens == 4
    for prompt in ([1, 2, 3], [[1, 2], [3]], "Hi"):
        assert client.completions.create(model="/models/fake", prompt=prompt).choices[0].text \
            == "Hello world"
    stream = client.completions.create(model=MODEL, prompt="Hi", stream=True)
    assert "".join(c.choices[0].text for c in stream if c.choices) == "Hello world"


def test_logprobs(client):
    chat = client.chat.completions.create(model=MODEL, messages=CHAT, logprobs=True, top_logprobs=2)
    content = chat.choices[0].logprobs.content
    assert [c.token for c in content] == ["token_id:1", "token_id:2", "token_id:3"]
    assert content[1].logprob == -1.0 and len(content[1].top_logprobs) == 2
    assert content[1].top_logprobs[1].logprob == -9999.0
    legacy = client.completions.create(model=MODEL, prompt="Hi", logprobs=1).choices[0].logprobs
    assert legacy.token_logprobs == [-0.5, -1.0, -1.5] and legacy.text_offset == [0, 10, 20]
    assert legacy.top_logprobs[0] == {"token_id:1": -0.5}
    stream = client.completions.create(model=MODEL, prompt="Hi", logprobs=0, stream=True)
    offsets = [o for c in stream if c.choices for o in c.choices[0].logprobs.text_offset]
    assert offsets == [0, 10, 20]


def test_native_generate(http):
    r = http.post("/generate", json={"text": "Hi", "sampling_params": {"max_new_tokens": 3}})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["text"] == "Hello world" and body["output_ids"] == [1, 2, 3]
    assert body["meta_info"] | {"id": 0} == {"id": 0, "prompt_tokens": 2, "completion_tokens": 3,
                                              "cached_tokens": 1, "finish_reason": "length"}
    params = {"logprobs": True, "top_logprobs": 2, "stop": ["x"]}
    r = http.post("/generate", json={"text": "Hi", "sampling_params": params})
    meta = r.json()["meta_info"]
    assert meta["output_token_logprobs"][0] == [-0.5, 1]
    assert meta["output_top_logprobs"][0] == [[-0.5, 1], [-9999.0, 11]]
    with http.stream("POST", "/generate", json={"input_ids": [1], "stream": True}) as r:
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and json.loads(events[-2])["text"] == "Hello world"


def test_models_health_and_info(client, http, server):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert httpx.get(f"{server.url}/health").status_code == 200  # open without the key
    assert info(http)["in_flight"] == 0 and info(http)["processes"] == {}
    frontend = server.app.state.frontend
    frontend.healthy = False
    try:
        r = httpx.get(f"{server.url}/health")
        assert r.status_code == 503 and r.json()["error"]["code"] == "unhealthy"
        assert http.post("/v1/completions", json={"prompt": "Hi"}).status_code == 503
    finally:
        frontend.healthy = True


def test_health_is_503_while_the_scheduler_warms_up(client, server):
    """Readiness follows the scheduler's stats: 503 ``warming_up`` until they say ready; a request
    sent meanwhile is taken (it waits for the warm-up, it is not refused)."""
    worker = server.worker
    worker.stats_to_send = worker.stats(ready=False)
    try:
        assert wait_until(lambda: httpx.get(f"{server.url}/health").status_code == 503)
        r = httpx.get(f"{server.url}/health")
        assert r.json()["error"]["code"] == "warming_up"
        out = client.completions.create(model=MODEL, prompt="Hi", max_tokens=3)
        assert out.choices[0].text == "Hello world"
    finally:
        worker.stats_to_send = worker.stats()
    assert wait_until(lambda: httpx.get(f"{server.url}/health").status_code == 200)


BAD = [  # (name, path, body, status, param)
    ("malformed json", "/v1/chat/completions", b'{"messages": ', 400, None),
    ("not an object", "/v1/chat/completions", b"[1, 2]", 400, None),
    ("invalid utf-8", "/v1/completions", b'{"prompt": "\xff\xfe"}', 400, None),
    ("NaN", "/v1/completions", b'{"prompt": "a", "temperature": NaN}', 400, None),
    ("messages missing", "/v1/chat/completions", {"max_tokens": 4}, 400, "messages"),
    ("messages not a list", "/v1/chat/completions", {"messages": "hi"}, 400, "messages"),
    ("messages empty", "/v1/chat/completions", {"messages": []}, 400, "messages"),
    ("bad role", "/v1/chat/completions", {"messages": [{"role": "x", "content": "a"}]}, 400,
     "messages[0].role"),
    ("image part", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400,
     "messages[0].content"),
    ("prompt missing", "/v1/completions", {"max_tokens": 4}, 400, "prompt"),
    ("prompt mixed", "/v1/completions", {"prompt": [1, "a"]}, 400, "prompt"),
    ("prompt empty", "/v1/completions", {"prompt": ""}, 400, "prompt"),
    ("temperature string", "/v1/completions", {"prompt": "a", "temperature": "hot"}, 400,
     "temperature"),
    ("temperature 3", "/v1/completions", {"prompt": "a", "temperature": 3}, 400, "temperature"),
    ("top_p zero", "/v1/completions", {"prompt": "a", "top_p": 0}, 400, "top_p"),
    ("top_p 1.5", "/v1/completions", {"prompt": "a", "top_p": 1.5}, 400, "top_p"),
    ("top_k -5", "/v1/completions", {"prompt": "a", "top_k": -5}, 400, "top_k"),
    ("max_tokens -3", "/v1/completions", {"prompt": "a", "max_tokens": -3}, 400, "max_tokens"),
    ("max_tokens float", "/v1/completions", {"prompt": "a", "max_tokens": 1.5}, 400, "max_tokens"),
    ("n 1000", "/v1/chat/completions", {"messages": CHAT, "n": 1000}, 400, "n"),
    ("presence_penalty 9", "/v1/completions", {"prompt": "a", "presence_penalty": 9}, 400,
     "presence_penalty"),
    ("seed negative", "/v1/completions", {"prompt": "a", "seed": -1}, 400, "seed"),
    ("seed 10**30", "/v1/completions", {"prompt": "a", "seed": 10**30}, 400, "seed"),
    ("stop_token_ids str", "/v1/completions", {"prompt": "a", "stop_token_ids": ["x"]}, 400,
     "stop_token_ids[0]"),
    ("stop 20", "/v1/completions", {"prompt": "a", "stop": ["x"] * 20}, 400, "stop"),
    ("top_logprobs 50", "/v1/chat/completions",
     {"messages": CHAT, "logprobs": True, "top_logprobs": 50}, 400, "top_logprobs"),
    ("logprobs 30", "/v1/completions", {"prompt": "a", "logprobs": 30}, 400, "logprobs"),
    ("unknown model", "/v1/completions", {"prompt": "a", "model": "nope"}, 404, "model"),
    ("generate both", "/generate", {"text": "a", "input_ids": [1]}, 400, "text"),
    ("generate param", "/generate", {"text": "a", "sampling_params": {"temp": 1}}, 400,
     "sampling_params.temp"),
    ("too long prompt", "/v1/completions", {"prompt": "TOOLONG"}, 400, "prompt"),
    ("too long, streamed", "/v1/completions", {"prompt": "TOOLONG", "stream": True}, 400, "prompt"),
    ("body too large", "/v1/completions", {"prompt": "a" * 70000}, 413, None),
    ("unknown route", "/v1/nothing", {}, 404, None),
]


@pytest.mark.parametrize("name, path, body, status, param", BAD, ids=[b[0] for b in BAD])
def test_bad_requests(http, name, path, body, status, param):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = http.post(path, content=content, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    ok = http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2, "user": "u1"})
    assert ok.status_code == 200 and ok.json()["choices"][0]["text"] == "Hello world"


def test_auth_body_limits_and_methods(http, server):
    for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": KEY}):
        r = httpx.post(f"{server.url}/v1/completions", json={"prompt": "Hi"}, headers=headers)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(f"{server.url}/v1/models").status_code == 401
    chunked = http.post("/v1/completions", content=iter([b'{"prompt": "', b"a" * 70000, b'"}']))
    assert chunked.status_code == 413 and chunked.json()["error"]["code"] == "request_too_large"
    r = http.get("/v1/completions")
    assert r.status_code == 405 and "error" in r.json()


def _hold(server, body: dict) -> socket.socket:
    """A request the fake worker never answers, on a raw socket the test closes to disconnect."""
    data = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", int(server.url.rsplit(":", 1)[1])))
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                 + f"authorization: Bearer {KEY}\r\ncontent-length: {len(data)}\r\n\r\n".encode()
                 + data)
    return sock


@pytest.mark.parametrize("stream", [False, True])
def test_overload_then_disconnect_aborts(http, server, stream):
    socks = [_hold(server, {"prompt": "HOLD", "stream": stream}) for _ in range(CAPACITY)]
    assert wait_until(lambda: info(http)["in_flight"] == CAPACITY)
    r = http.post("/v1/completions", json={"prompt": "Hi"})
    assert r.status_code == 503 and r.json()["error"]["code"] == "overloaded"
    held = set(server.worker.held)
    for sock in socks:
        sock.close()
    assert wait_until(lambda: info(http)["in_flight"] == 0)
    assert wait_until(lambda: held <= server.worker.aborted)
    assert wait_until(lambda: info(http)["scheduler"]["num_running"] == 0)  # the worker freed them
    assert http.post("/v1/completions", json={"prompt": "Hi"}).status_code == 200


def test_non_stream_disconnect_while_tokens_flow(http, server):
    sock = _hold(server, {"prompt": "DRIP"})
    assert wait_until(lambda: server.worker.drips)
    uid = next(iter(server.worker.drips))
    sock.close()
    assert wait_until(lambda: uid in server.worker.aborted and not server.worker.drips, 3)
    assert wait_until(lambda: info(http)["in_flight"] == 0)


def test_disconnect_mid_stream_aborts(http, server):
    body = {"prompt": "SLOW", "stream": True}
    with http.stream("POST", "/v1/completions", json=body) as r:
        first = next(line for line in r.iter_lines() if line.startswith("data: "))
        assert json.loads(first[6:])["choices"][0]["text"] == "Hello"
        uid = server.worker.seen[-1].uid
    assert wait_until(lambda: uid in server.worker.aborted)
    assert wait_until(lambda: info(http)["in_flight"] == 0)


def test_fail_all_ends_requests(http, server):
    frontend = server.app.state.frontend
    results: list = []
    t = threading.Thread(target=lambda: results.append(
        http.post("/v1/completions", json={"prompt": "HOLD"})))
    t.start()
    with http.stream("POST", "/v1/chat/completions",
                     json={"messages": [{"role": "user", "content": "SLOW"}], "stream": True}) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")  # the role chunk: the stream is open
        assert wait_until(lambda: info(http)["in_flight"] == 2)
        frontend.fail_all_threadsafe("the scheduler process died")
        events = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    assert events[-1]["error"]["message"] == "the scheduler process died"
    t.join(5)
    assert results[0].status_code == 503
    assert results[0].json()["error"]["message"] == "the scheduler process died"
    assert info(http)["in_flight"] == 0
