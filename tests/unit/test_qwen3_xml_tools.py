"""Qwen3.5 / Qwen3.6 tool calls (the Qwen3-Coder XML format): whole and streamed."""

from __future__ import annotations

import json

from minisgl.server.openai.tool_parsers import ToolCallStream, detect_parser, parse_tool_calls

TEXT = ("Let me check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis, France\n"
        "</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=opts>\n{\"unit\": \"C\"}\n"
        "</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=now>\n</function>\n"
        "</tool_call>")


def test_whole_text():
    content, calls = parse_tool_calls(TEXT, "qwen3_xml")
    assert content == "Let me check.\n"
    assert [c["function"]["name"] for c in calls] == ["get_weather", "now"]
    assert json.loads(calls[0]["function"]["arguments"]) == {
        "city": "Paris, France", "days": 3, "opts": {"unit": "C"}}
    assert json.loads(calls[1]["function"]["arguments"]) == {}


def test_streamed_pieces_concatenate_to_the_whole():
    stream, content, args = ToolCallStream("qwen3_xml"), "", {}
    for i in range(0, len(TEXT), 5):
        piece = TEXT[i:i + 5]
        delta, calls = stream.feed(piece, final=i + 5 >= len(TEXT))
        content += delta
        for call in calls:
            args[call["index"]] = args.get(call["index"], "") + call["function"]["arguments"]
    whole_content, whole = parse_tool_calls(TEXT, "qwen3_xml")
    assert content == whole_content
    assert [args[i] for i in range(2)] == [c["function"]["arguments"] for c in whole]


def test_detected_from_the_template():
    template = "...<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>"
    assert detect_parser(template) == "qwen3_xml"
    assert detect_parser('<tool_call>\n{"name": ...}</tool_call>') == "hermes"
