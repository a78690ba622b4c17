"""Gemma's tool calls without a model: Gemma 4's ``<|tool_call>call:NAME{...}<tool_call|>`` parsed
whole and streamed character by character (the argument deltas concatenate to the whole call's),
the parser picked from the template, the markup kept by the detokenizer although its tokens are
special; Gemma 3's ``tool_code`` blocks parsed whole and streamed at every cut, blocks that are not
calls left as text; Gemma 3's template (alternating turns, no tools) rendering a whole tool
exchange."""

from __future__ import annotations

import itertools
import json

import pytest

from helpers.gemma_tools_model import GEMMA3_TEMPLATE, GEMMA4_TEMPLATE, byte_tokenizer
from minisgl.server.openai.gemma_tools import arguments_json
from minisgl.server.openai.tool_parsers import ToolCallStream, detect_parser, parse_tool_calls
from minisgl.tokenizer.detokenize import IncrementalDetokenizer, kept_special_ids
from minisgl.tokenizer.tool_prompt import describe_tools, with_argument_objects

Q = '<|"|>'
TEXT = (f"Checking.<|tool_call>call:get_weather{{city:{Q}Paris, {{FR}}: \"x\"\\{Q},days:3,"
        f"ok:true,opts:{{unit:{Q}C{Q},list:[1,{Q}a{Q},{{x:null}}]}},{Q}q k{Q}:-2.5e3}}"
        "<tool_call|><|tool_call>call:get_time{}<tool_call|>")
ARGS = {"city": 'Paris, {FR}: "x"\\', "days": 3, "ok": True,
        "opts": {"unit": "C", "list": [1, "a", {"x": None}]}, "q k": -2500.0}


def test_whole_output():
    content, calls = parse_tool_calls(TEXT, "gemma4")
    assert content == "Checking."
    assert [c["function"]["name"] for c in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[0]["function"]["arguments"]) == ARGS
    assert calls[1]["function"]["arguments"] == "{}"


@pytest.mark.parametrize("step", [1, 3, 7])
def test_streamed_output_is_the_whole_one(step):
    stream, content, args, names = ToolCallStream("gemma4"), "", {}, {}
    for i in range(0, len(TEXT), step):
        text, deltas = stream.feed(TEXT[i: i + step], final=False)
        content += text
        for d in deltas:
            names.setdefault(d["index"], d["function"].get("name"))
            args[d["index"]] = args.get(d["index"], "") + d["function"]["arguments"]
    text, deltas = stream.feed("", final=True)
    assert content + text == "Checking." and not deltas
    assert names == {0: "get_weather", 1: "get_time"}
    assert json.loads(args[0]) == ARGS and args[1] == "{}"


def test_arguments_grow_only():
    body = TEXT[TEXT.index("{"):]
    settled = [arguments_json(body[:n], 0)[0] for n in range(1, len(body) + 1)]
    assert all(b.startswith(a) for a, b in zip(settled, settled[1:]))
    assert arguments_json(body, 0)[1] is not None


def test_parser_from_the_template():
    assert detect_parser(GEMMA4_TEMPLATE) == "gemma4"
    assert detect_parser(GEMMA3_TEMPLATE) == "gemma3"  # tool_code, and the described tools'


def test_detokenizer_keeps_the_markup():
    tok = byte_tokenizer(GEMMA4_TEMPLATE)
    ids = tok.encode(TEXT, add_special_tokens=False)
    assert tok.decode(ids, skip_special_tokens=True) != TEXT  # the markup is special
    keep = kept_special_ids(tok)
    assert len(keep) == 5  # the tool-call markup and the thought channel's
    for source in (TEXT, "<|channel>thought\nHmm.<channel|>Yes."):
        ids = tok.encode(source, add_special_tokens=False)
        detok = IncrementalDetokenizer(tok, keep=keep)
        text = "".join(detok.add([i]) for i in [tok.bos_token_id, *ids, tok.eos_token_id])
        assert text + detok.finish() == source


CODE = ('I will look.\n```tool_code\nget_weather(city="Paris, \\"FR\\"", days=3, ok=true,\n'
        '            opts={"unit": "C", "list": [1, "a", None, -2.5e3]})\n'
        "default_api.get_time(zone='UTC')\n```\n")
CODE_CALLS = [("get_weather", {"city": 'Paris, "FR"', "days": 3, "ok": True,
                               "opts": {"unit": "C", "list": [1, "a", None, -2500.0]}}),
              ("get_time", {"zone": "UTC"})]


def _gemma3_stream(text: str, cut: list[int]) -> tuple[str, list[tuple[str, dict]]]:
    """Content and calls of ``text`` fed in the pieces that ``cut`` makes."""
    stream, content, names, args = ToolCallStream("gemma3"), "", {}, {}
    bounds = [0, *cut, len(text)]
    for a, b in zip(bounds, bounds[1:]):
        piece, deltas = stream.feed(text[a:b], final=b == len(text))
        content += piece
        for d in deltas:
            names.setdefault(d["index"], d["function"].get("name"))
            args[d["index"]] = args.get(d["index"], "") + d["function"]["arguments"]
    return content, [(names[i], json.loads(args[i])) for i in sorted(names)]


def test_tool_code_whole():
    content, calls = parse_tool_calls(CODE, "gemma3")
    assert content == "I will look.\n"
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] \
        == CODE_CALLS


def test_tool_code_streamed_at_every_cut():
    """Cut once anywhere, twice at every pair of places 7 characters apart or more, char by
    char: the content and the calls are the whole output's."""
    n = len(CODE)
    cuts = [[i] for i in range(1, n)] + [list(range(1, n))]
    cuts += [[a, b] for a, b in itertools.combinations(range(1, n), 2) if b - a >= 7 and a % 3]
    for cut in cuts:
        assert _gemma3_stream(CODE, cut) == ("I will look.\n", CODE_CALLS), cut


NOT_CALLS = [
    "```tool_code\nget_weather('Paris')\n```",  # positional: no names to give it
    "```tool_code\nx = get_weather(city='Paris')\n```",
    "```tool_code\nget_weather(city=os.environ['HOME'])\n```",  # not a literal
    "```tool_code\n__import__('os').system(cmd='true')\n```",  # a call of a call
    "```tool_code\nget_weather(city='Paris'\n```",  # syntax error
    "```tool_code\nget_weather(**{'city': 'Paris'})\n```",
    "```tool_code\nf(x=b'raw')\n```",
    "```tool_code\nf(x={1, 2})\n```",
    "```tool_code\nf(x=1e999)\n```",
    "```tool_code\nf(x={1: 2})\n```",
    "```tool_code\n```",
    "```python\nget_weather(city='Paris')\n```",  # another language's block
    "Three ``` and ```tool_ are text.",
    "```tool_code\nget_weather(city='Par",  # cut off by max_tokens
]


@pytest.mark.parametrize("text", NOT_CALLS)
def test_blocks_that_are_not_calls_stay_text(text):
    assert parse_tool_calls(text, "gemma3") == (text, [])
    assert _gemma3_stream(text, list(range(1, len(text)))) == (text, [])


def test_tool_code_after_text_blocks_and_hermes_blocks():
    text = "```tool_code\nf(1)\n```\nRetrying.\n```tool_code\nf(n=1)\n```"
    assert _gemma3_stream(text, list(range(1, len(text)))) == \
        ("```tool_code\nf(1)\n```\nRetrying.\n", [("f", {"n": 1})])
    assert parse_tool_calls("```tool_code\n[f(n=1), g()]", "gemma3")[1][1]["function"] == \
        {"name": "g", "arguments": "{}"}  # an unclosed block at the end: still read
    hermes = 'Sure.<tool_call>{"name": "f", "arguments": {"n": 1}}</tool_call>'
    assert _gemma3_stream(hermes, list(range(1, len(hermes)))) == ("Sure.", [("f", {"n": 1})])


def test_gemma3_renders_a_tool_exchange():
    """Two results of parallel calls and the next user message are one user turn: Gemma 3's
    template refuses two user turns in a row."""
    tok = byte_tokenizer(GEMMA3_TEMPLATE)
    calls = [{"id": f"c{i}", "type": "function",
              "function": {"name": "f", "arguments": json.dumps({"n": i})}} for i in range(2)]
    history = [{"role": "system", "content": "Be brief."},
               {"role": "user", "content": "Two numbers?"},
               {"role": "assistant", "content": None, "tool_calls": calls},
               {"role": "tool", "tool_call_id": "c0", "content": "4"},
               {"role": "tool", "tool_call_id": "c1", "content": "2"},
               {"role": "user", "content": "And now?"}]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    with pytest.raises(Exception, match="alternate"):
        tok.apply_chat_template([{"role": "user", "content": "a"}] * 2, tokenize=False)
    text = tok.apply_chat_template(describe_tools(history, tools), tokenize=False,
                                   add_generation_prompt=True)
    assert text.count("<start_of_turn>user") == 2
    assert "<tool_response>\n4\n</tool_response>\n<tool_response>\n2\n</tool_response>\nAnd now?" \
        in text
    assert '<tool_call>\n{"name": "f", "arguments": {"n": 1}}\n</tool_call>' in text
    assert "Be brief." in text and '"name": "f"' in text


def test_tool_results_are_named_for_templates_that_take_tools():
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"n": 1}'}}
    history = [{"role": "user", "content": "?"},
               {"role": "assistant", "content": None, "tool_calls": [call]},
               {"role": "tool", "tool_call_id": "c1", "content": "2"},
               {"role": "tool", "tool_call_id": "other", "content": "3"}]
    out = with_argument_objects(history)
    assert out[1]["tool_calls"][0]["function"]["arguments"] == {"n": 1}
    assert out[2]["name"] == "f" and "name" not in out[3]
    assert history[2] == {"role": "tool", "tool_call_id": "c1", "content": "2"}  # not mutated
