"""Tool-call parsers, tool requests and response formats, without a server: whole texts and every
streaming split."""

from __future__ import annotations

import json

import pytest

from minisgl.server.openai.call_scan import scan_value
from minisgl.server.openai.errors import ApiError
from minisgl.server.openai.protocol import ChatCompletionRequest
from minisgl.server.openai.structured import requested_grammar
from minisgl.server.openai.tool_parsers import ToolCallStream, detect_parser, parse_tool_calls
from minisgl.server.openai.tools import ChatTools
from minisgl.tokenizer.tool_prompt import describe_tools, with_argument_objects

WEATHER = {"city": "Paris", "days": [1, {"note": "a } and a \" inside"}]}
CASES = [  # parser, text, expected content, expected [(name, arguments)]
    ("hermes", 'Let me check.\n<tool_call>\n{"name": "weather", "arguments": '
     + json.dumps(WEATHER) + '}\n</tool_call>\n<tool_call>{"arguments": {"x": 1}, "name": "f"}'
     "</tool_call>", "Let me check.\n", [("weather", json.dumps(WEATHER)), ("f", '{"x": 1}')]),
    ("hermes", "No call here, only a < sign.", "No call here, only a < sign.", []),
    ("hermes", "<tool_call>not json</tool_call>", "", []),
    ("llama3", '<|python_tag|>{"name": "f", "parameters": {"q": "a\\"b"}}; {"name": "g", '
     '"parameters": {}}', "", [("f", '{"q": "a\\"b"}'), ("g", "{}")]),
    ("llama3", '  {"name": "f", "parameters": {"n": 1}}', "", [("f", '{"n": 1}')]),
    ("llama3", "Hello {not a call}", "Hello {not a call}", []),
    ("mistral", 'Sure [TOOL_CALLS] [{"name": "f", "arguments": {"a": 1}}, {"name": "g", '
     '"arguments": {"b": [2]}}]', "Sure ", [("f", '{"a": 1}'), ("g", '{"b": [2]}')]),
    ("mistral", ' [{"name": "f", "arguments": {"a": 1}}]', "", [("f", '{"a": 1}')]),
    ("mistral", "[1] is a citation", "[1] is a citation", []),
    ("json", '[{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {}}]', "",
     [("f", '{"a": 1}'), ("g", "{}")]),
    ("json", '{"name": "f", "arguments": {"a": [1, 2]}}', "", [("f", '{"a": [1, 2]}')]),
    ("json", '{"name": "f", "arguments": "{\\"a\\": 1}"}', "", [("f", '{"a": 1}')]),
    ("gemma3", 'Checking.\n```tool_code\nweather(city="Paris", days=[1, {"note": "a } and"}])\n'
     "f(x=1)\n```", "Checking.\n",
     [("weather", '{"city": "Paris", "days": [1, {"note": "a } and"}]}'), ("f", '{"x": 1}')]),
    ("gemma3", "```tool_code\nweather('Paris')\n```\nSorry.", "```tool_code\nweather('Paris')\n"
     "```\nSorry.", []),
    ("gemma3", '<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>', "",
     [("f", '{"x": 1}')]),
    ("gemma3", "Code: ```py\nx = 1\n``` and `<tool`.", "Code: ```py\nx = 1\n``` and `<tool`.", []),
]


def _stream(parser: str, text: str, step: int) -> tuple[str, list[tuple[str, str]], list[dict]]:
    stream, content, names, args, deltas = ToolCallStream(parser), "", {}, {}, []
    for i in range(0, len(text), step):
        piece, calls = stream.feed(text[i:i + step], final=i + step >= len(text))
        content += piece
        deltas += calls
        indices = [d["index"] for d in calls]
        assert len(set(indices)) == len(indices), "one delta per call in a chunk, as OpenAI sends"
        for d in calls:
            if "id" in d:  # the first delta of a call: id, type, name and the arguments so far
                assert d["type"] == "function"
                assert d["index"] == len(names) and d["id"].startswith("call_")
                names[d["index"]] = d["function"]["name"]
            else:
                assert d["index"] in names and set(d["function"]) == {"arguments"}
            args[d["index"]] = args.get(d["index"], "") + d["function"]["arguments"]
    return content, [(names[k], args.get(k, "")) for k in sorted(names)], deltas


@pytest.mark.parametrize("parser,text,content,calls", CASES)
def test_whole_text(parser, text, content, calls):
    got_content, got_calls = parse_tool_calls(text, parser)
    assert got_content == content
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in got_calls] == calls
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in got_calls)


@pytest.mark.parametrize("parser,text,content,calls", CASES)
@pytest.mark.parametrize("step", [1, 2, 3, 5, 11])
def test_streamed_fragments_concatenate_to_the_whole(parser, text, content, calls, step):
    assert _stream(parser, text, step)[:2] == (content, calls)


def test_arguments_stream_as_they_are_generated():
    text = '<tool_call>{"name": "f", "arguments": {"city": "Paris", "n": 3}}</tool_call>'
    _, _, deltas = _stream("hermes", text, 4)
    fragments = [d["function"]["arguments"] for d in deltas]
    assert len(fragments) > 3  # not one piece at the end
    assert "".join(fragments) == '{"city": "Paris", "n": 3}'


def test_a_partial_marker_is_held_back_then_released():
    stream = ToolCallStream("hermes")
    assert stream.feed("Hi <tool", final=False) == ("Hi ", [])
    assert stream.feed("box>", final=True) == ("<toolbox>", [])


def test_scan_value():
    text = '{"a": "}", "b": [1, {"c": "\\""}]} tail'
    assert text[: scan_value(text, 0)] == '{"a": "}", "b": [1, {"c": "\\""}]}'
    assert scan_value('{"a": [1, 2', 0) is None
    assert scan_value('"x\\"y" z', 0) == 6


def test_detect_parser():
    assert detect_parser("{{ '<tool_call>' }}") == "hermes"
    assert detect_parser("[TOOL_CALLS] {{ x }}") == "mistral"
    assert detect_parser("{{ '<|python_tag|>' }}") == "llama3"
    assert detect_parser(None) == "hermes"  # our system prompt asks for Hermes blocks
    assert detect_parser("<start_of_turn>{{ m.content }}") == "gemma3"


TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}},
    {"type": "function", "function": {"name": "g"}}]


@pytest.mark.parametrize("tools,choice,param", [
    ([{"type": "retrieval"}], None, "tools[0].type"),
    ([{"type": "function", "function": {"name": "bad name"}}], None, "tools[0].function.name"),
    ([{"type": "function", "function": {"name": "f", "parameters": []}}], None,
     "tools[0].function.parameters"),
    (TOOLS + TOOLS[:1], None, "tools"),
    ([], None, "tools"),
    (TOOLS, "sometimes", "tool_choice"),
    (TOOLS, {"type": "function", "function": {"name": "h"}}, "tool_choice.function.name"),
    (None, "required", "tool_choice"),
])
def test_bad_tools_name_the_field(tools, choice, param):
    with pytest.raises(ApiError) as e:
        ChatTools.from_request(tools, choice, None, "hermes")
    assert e.value.status == 400 and e.value.param == param


def test_tool_choice_modes():
    assert ChatTools.from_request(TOOLS, "none", None, "hermes") is None
    auto = ChatTools.from_request(TOOLS, None, None, "llama3")
    assert auto.parser == "llama3" and auto.schema() is None
    named = ChatTools.from_request(TOOLS, {"type": "function", "function": {"name": "f"}}, None,
                                   "llama3")
    schema = json.loads(named.schema())
    assert named.parser == "json" and schema["properties"]["name"] == {"const": "f"}
    assert schema["properties"]["arguments"] == TOOLS[0]["function"]["parameters"]
    required = json.loads(ChatTools.from_request(TOOLS, "required", False, "hermes").schema())
    assert required["minItems"] == required["maxItems"] == 1
    assert len(required["items"]["anyOf"]) == 2


def test_history_for_templates_with_and_without_tools():
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    history = [{"role": "user", "content": "hi"},
               {"role": "assistant", "content": "", "tool_calls": [call]},
               {"role": "tool", "tool_call_id": "call_1", "content": "42"}]
    assert with_argument_objects(history)[1]["tool_calls"][0]["function"]["arguments"] == {"a": 1}
    plain = describe_tools(history, TOOLS)
    assert plain[0]["role"] == "system" and '"name": "g"' in plain[0]["content"]
    assert plain[2] == {
        "role": "assistant",
        "content": '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'}
    assert plain[3] == {"role": "user", "content": "<tool_response>\n42\n</tool_response>"}
    assert parse_tool_calls(plain[2]["content"], "hermes")[1][0]["function"]["arguments"] == \
        '{"a": 1}'


def _grammar(**body):
    return requested_grammar(ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "hi"}], **body}))


def test_response_formats_become_one_grammar():
    assert _grammar() is None and _grammar(response_format={"type": "text"}) is None
    assert _grammar(response_format={"type": "json_object"}) == \
        ("json_schema", '{"type": "object"}', "response_format")
    kind, source, param = _grammar(response_format={"type": "json_schema", "json_schema": {
        "name": "p", "strict": True, "schema": {"type": "array"}}})
    assert (kind, json.loads(source), param) == \
        ("json_schema", {"type": "array"}, "response_format.json_schema.schema")
    assert _grammar(regex="a+") == ("regex", "a+", "regex")
    with pytest.raises(ApiError, match="only one output constraint") as e:
        _grammar(regex="a+", response_format={"type": "json_object"})
    assert e.value.param == "regex"
    with pytest.raises(ApiError) as e:
        _grammar(response_format={"type": "json_schema", "json_schema": {"schema": {}}})
    assert e.value.param == "response_format.json_schema.name"


@pytest.mark.parametrize("parser,text", [
    ("json", '[{"name": "f", "arguments": {"a": 1}}, {"name": "f", "arguments": {"a": 12'),
    ("hermes", '<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>\n'
               '<tool_call>{"name": "f", "arguments": {"a": "unfinish'),
])
def test_a_call_cut_off_by_max_tokens_is_dropped(parser, text):
    _, calls = parse_tool_calls(text, parser)
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == \
        [("f", '{"a": 1}')]
    # a stream has sent the cut call's fragments as they came (its finish reason is "length")
    assert [name for name, _ in _stream(parser, text, 7)[1]] == ["f", "f"]
