"""Gemma 4's thinking through a real server and the official clients: a tiny Gemma 4 whose chat
template takes ``enable_thinking`` (otherwise closing an empty thought channel in the prompt) and
whose weights make its greedy answer ``<|channel>thought\\n...<channel|>`` and then the answer when
thinking, the answer alone when not (``helpers.gemma_tools_model``). The server must pick the
``gemma4`` reasoning parser from the template, keep the channel's markup (special tokens) in the
detokenized text, and return the thought as ``reasoning_content`` on chat completions (whole and
streamed), as a reasoning item on the Responses API and as a thinking block on the Anthropic
Messages API, each turned on through the template's switch."""

from __future__ import annotations

import pytest

from helpers.gemma_tools_model import ANSWER, THOUGHT, make_gemma4_thinking_model
from helpers.server_utils import served_model, start_server

pytestmark = pytest.mark.slow
ASK = [{"role": "user", "content": "Weather in Paris?"}]
THINKING = {"chat_template_kwargs": {"enable_thinking": True}}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = make_gemma4_thinking_model(tmp_path_factory.mktemp("gemma4_thinking"))
    srv = start_server(str(model), "--num-pages", "2048",
                       log_dir=str(tmp_path_factory.mktemp("logs")))
    yield srv
    assert srv.stop() == 0


@pytest.fixture(scope="module")
def client(server):
    return server.openai_client()


def _chat(client, **extra):
    return client.chat.completions.create(model=served_model(client), messages=ASK, temperature=0,
                                          max_tokens=32, extra_body=extra or None)


def test_chat_thinking_on_and_off(client):
    on = _chat(client, **THINKING)
    msg = on.choices[0].message
    assert (msg.reasoning_content, msg.content, on.choices[0].finish_reason) \
        == (THOUGHT, ANSWER, "stop")
    off = _chat(client).choices[0].message  # the prompt closed the channel: no reasoning
    assert (off.content, getattr(off, "reasoning_content", None)) == (ANSWER, None)
    raw = _chat(client, **THINKING, separate_reasoning=False).choices[0].message
    assert raw.content == f"<|channel>thought\n{THOUGHT}<channel|>{ANSWER}"


def test_chat_streamed(client):
    reasoning, content = [], []
    for chunk in client.chat.completions.create(model=served_model(client), messages=ASK,
                                                stream=True, temperature=0, max_tokens=32,
                                                extra_body=THINKING):
        for c in chunk.choices:
            reasoning.append(getattr(c.delta, "reasoning_content", None) or "")
            content.append(c.delta.content or "")
    assert "".join(reasoning) == THOUGHT and "".join(content) == ANSWER
    assert not any("channel" in piece for piece in reasoning + content)


def test_responses_api(client):
    r = client.responses.create(model=served_model(client), input="Weather in Paris?",
                                temperature=0, reasoning={"effort": "high"}, max_output_tokens=32)
    (item,) = [o for o in r.output if o.type == "reasoning"]
    assert [c.text for c in item.content] == [THOUGHT] and r.output_text == ANSWER
    quiet = client.responses.create(model=served_model(client), input="Weather in Paris?",
                                    temperature=0, reasoning={"effort": "none"},
                                    max_output_tokens=32)
    assert [o.type for o in quiet.output] == ["message"] and quiet.output_text == ANSWER


def test_anthropic_messages(server, client):
    anthropic = pytest.importorskip("anthropic")
    messages = anthropic.Anthropic(base_url=server.url, api_key="unused").messages
    m = messages.create(model=served_model(client), max_tokens=64, messages=ASK,
                        thinking={"type": "enabled", "budget_tokens": 32},
                        extra_body={"temperature": 0})
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None))
            for b in m.content] == [("thinking", THOUGHT), ("text", ANSWER)]
    with messages.stream(model=served_model(client), max_tokens=64, messages=ASK,
                         thinking={"type": "enabled", "budget_tokens": 32},
                         extra_body={"temperature": 0}) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert final.content[0].thinking == THOUGHT and final.content[1].text == ANSWER
