"""Images through a real server (all its processes, the engine running the vision tower) of a
tiny random Qwen3.5 checkpoint, float32, as a user sends them: the openai SDK's chat with an
``image_url`` part (whole and streamed) gets the same answer each time and a usage that counts
the image's tokens; the same chat again is a prefix-cache hit (``cached_tokens``, and the hit
counter of ``/metrics``); ``/generate``'s ``image_data`` gives transformers' greedy tokens; the
anthropic SDK's ``image`` block is answered too."""

from __future__ import annotations

import anthropic
import httpx
import pytest

from helpers.server_utils import served_model, start_server
from helpers.vision_models import make_vision_checkpoint
from helpers.vision_reference import chat, data_url, hf_vision_greedy, random_image

pytestmark = pytest.mark.slow
IMAGE = random_image(32, 48, seed=1)
TOKENS = 8


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return str(make_vision_checkpoint("qwen3_5", tmp_path_factory.mktemp("vl") / "qwen3_5"))


@pytest.fixture(scope="module")
def server(checkpoint, tmp_path_factory):
    srv = start_server(checkpoint, "--num-pages", "2048", "--dtype", "float32",
                       log_dir=str(tmp_path_factory.mktemp("logs")))
    yield srv
    assert srv.stop() == 0


@pytest.fixture(scope="module")
def client(server):
    return server.openai_client()


PROMPT = ("<|im_start|>user\nLook:<|vision_start|><|image_pad|><|vision_end|>what is it?"
          "<|im_end|>\n<|im_start|>assistant\n")  # the chat template's text for chat([IMAGE])


def test_generate_image_data_matches_transformers(checkpoint, server):
    from minisgl.utils.hf import load_tokenizer

    tokenizer = load_tokenizer(checkpoint)
    assert tokenizer.apply_chat_template(chat([IMAGE]), tokenize=False,
                                         add_generation_prompt=True) == PROMPT
    body = {"text": PROMPT, "image_data": [data_url(IMAGE)],
            "sampling_params": {"max_new_tokens": TOKENS, "temperature": 0, "ignore_eos": True}}
    r = httpx.post(f"{server.url}/generate", json=body, timeout=60)
    assert r.status_code == 200, r.text
    out = r.json()
    ids = tokenizer.encode(PROMPT.replace("<|image_pad|>", "<|image_pad|>" * 24),
                           add_special_tokens=False)
    assert out["meta_info"]["prompt_tokens"] == len(ids)  # the image's 24 tokens counted
    assert out["output_ids"] == hf_vision_greedy(checkpoint, "qwen3_5", ids, [IMAGE], TOKENS)[0]
    r = httpx.post(f"{server.url}/generate", json={**body, "image_data": []}, timeout=60)
    assert r.status_code == 400 and "holds the image token" in r.json()["error"]["message"]


def test_openai_chat_with_an_image(client):
    ask = dict(model=served_model(client), messages=chat([IMAGE]), max_tokens=TOKENS, temperature=0,
               extra_body={"ignore_eos": True})
    first = client.chat.completions.create(**ask)
    text = first.choices[0].message.content
    text_only = client.chat.completions.create(
        **{**ask, "messages": [{"role": "user", "content": "Look:what is it?"}]})
    # the image's 24 tokens (a 32 x 48 image: 8 x 12 patches of 4, merged 2 x 2) and its markers
    assert first.usage.prompt_tokens - text_only.usage.prompt_tokens == 26
    again = client.chat.completions.create(**ask)
    assert again.choices[0].message.content == text
    assert again.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 1
    stream = client.chat.completions.create(**ask, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == text


def test_metrics_count_the_hits(server, client):
    metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
    hits = [line for line in metrics.splitlines()
            if line.startswith("minisgl:prefix_cache_hit_tokens")]
    assert hits and float(hits[0].split()[-1]) > 0


def test_anthropic_image_block(server, client):
    import base64

    png = base64.b64decode(data_url(IMAGE).split(",", 1)[1])
    msgs = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
    content = [{"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                            "data": base64.b64encode(png).decode()}},
               {"type": "text", "text": "What is it?"}]
    messages = [{"role": "user", "content": content}]
    out = msgs.messages.create(model=served_model(client), max_tokens=4, messages=messages)
    assert out.usage.input_tokens > 24 and out.usage.output_tokens >= 1
    count = msgs.messages.count_tokens(model=served_model(client), messages=messages)
    assert count.input_tokens == out.usage.input_tokens  # the image's 24 tokens counted


def test_responses_input_image_usage(client):
    """The Responses API's ``input_image`` is the chat's ``image_url``: the same prompt, so the
    same usage and (greedy) the same answer."""
    ask = dict(model=served_model(client), max_output_tokens=TOKENS, temperature=0)
    parts = chat([IMAGE])[0]["content"]
    content = [{"type": "input_text", "text": p["text"]} if p["type"] == "text" else
               {"type": "input_image", "image_url": p["image_url"]["url"], "detail": "high"}
               for p in parts]
    out = client.responses.create(**ask, input=[{"role": "user", "content": content}])
    chat_out = client.chat.completions.create(model=served_model(client), messages=chat([IMAGE]),
                                              max_tokens=TOKENS, temperature=0)
    assert out.usage.input_tokens == chat_out.usage.prompt_tokens
    assert out.output_text == chat_out.choices[0].message.content
