"""``LLM.chat`` of gpt-oss, offline on CPU: the chat rendered by openai-harmony (tools, reasoning
effort), the output read back into ``GenerateOutput.message``. The tiny gpt-oss of
``helpers.harmony_model`` answers in harmony by construction: a call of ``get_weather`` first,
then, given the tool's result, reasoning and the answer."""

from __future__ import annotations

import json

import pytest

from helpers.harmony_model import ANSWER, ARGS, REASONING, TOOLS, make_harmony_model
from minisgl import LLM, SamplingParams

pytestmark = pytest.mark.slow
ASK = [{"role": "user", "content": "Weather in Paris?"}]
GREEDY = SamplingParams(temperature=0, max_tokens=64)


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    model = make_harmony_model(tmp_path_factory.mktemp("harmony_model"))
    with LLM(str(model), device="cpu", dtype="float32", num_pages=1024) as llm:
        yield llm


def test_reasoning_tool_call_and_answer(llm):
    (first,) = llm.chat(ASK, GREEDY, tools=TOOLS, chat_template_kwargs={"reasoning_effort": "high"})
    assert first.finish_reason == "tool_calls" and first.message["content"] is None
    (call,) = first.message["tool_calls"]
    assert (call["function"]["name"], call["function"]["arguments"]) == ("get_weather", ARGS)
    history = ASK + [first.message, {"role": "tool", "tool_call_id": call["id"],
                                     "content": json.dumps({"sky": "sunny"})}]
    (second,) = llm.chat(history, GREEDY, tools=TOOLS)
    assert second.finish_reason == "stop" and "tool_calls" not in second.message
    assert (second.message["content"], second.message["reasoning_content"]) == (ANSWER, REASONING)


def test_bad_input_names_the_field(llm):
    with pytest.raises(ValueError, match="reasoning_effort"):
        llm.chat(ASK, GREEDY, chat_template_kwargs={"reasoning_effort": "extreme"})
    with pytest.raises(ValueError, match=r"messages\[0\].role"):
        llm.chat([{"role": "robot", "content": "hi"}], GREEDY)
    with pytest.raises(ValueError, match="messages"):
        llm.chat(["hi"], GREEDY)
