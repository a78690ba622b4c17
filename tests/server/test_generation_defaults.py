"""The checkpoint's generation_config.json sampling is the default of requests that omit it."""

from __future__ import annotations

import json

import httpx
import pytest
from test_health import fake_stack

AUTH = {"authorization": "Bearer key"}
RECOMMENDED = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "do_sample": True,
               "repetition_penalty": -1}  # an invalid value is dropped, not applied


@pytest.fixture()
def model_dir(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps(RECOMMENDED))
    return str(tmp_path)


def _params(url: str, worker, path: str, body: dict):
    r = httpx.post(f"{url}{path}", json=body, headers=AUTH, timeout=10)
    assert r.status_code == 200, r.text
    return worker.seen[-1].sampling_params


def test_omitted_sampling_fields_take_the_checkpoints_values(model_dir):
    with fake_stack(model_dir) as (url, app, config, scheduler, worker):
        chat = {"messages": [{"role": "user", "content": "hi"}]}
        p = _params(url, worker, "/v1/chat/completions", chat)
        assert (p.temperature, p.top_p, p.top_k, p.repetition_penalty) == (0.6, 0.95, 20, 1.0)
        p = _params(url, worker, "/v1/chat/completions", {**chat, "temperature": 0, "top_k": None})
        assert (p.temperature, p.top_p, p.top_k) == (0, 0.95, 20)  # given wins; null is omitted
        p = _params(url, worker, "/v1/completions", {"prompt": "hi", "top_p": 0.5})
        assert (p.temperature, p.top_p) == (0.6, 0.5)
        p = _params(url, worker, "/generate", {"text": "hi", "sampling_params": {"top_k": 5}})
        assert (p.temperature, p.top_k) == (0.6, 5)
        card = httpx.get(f"{url}/v1/models", headers=AUTH).json()["data"][0]
        assert card["sampling_defaults"] == {"temperature": 0.6, "top_p": 0.95, "top_k": 20}


def test_generation_config_none_keeps_the_servers_defaults(model_dir):
    with fake_stack(model_dir, generation_config="none") as (url, app, config, scheduler, worker):
        p = _params(url, worker, "/v1/completions", {"prompt": "hi"})
        assert (p.temperature, p.top_p, p.top_k) == (1.0, 1.0, -1)
        card = httpx.get(f"{url}/v1/models", headers=AUTH).json()["data"][0]
        assert card["sampling_defaults"] == {}


def test_generation_config_must_be_a_choice_or_a_directory():
    from minisgl.server.launch.args import parse_args

    with pytest.raises(ValueError, match="generation_config"):
        parse_args(["--generation-config", "/no/such/dir"])
