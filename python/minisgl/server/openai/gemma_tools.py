"""Gemma 4's tool calls -> the JSON call objects the shared tool-call stream reads.

Gemma 4's chat template teaches ``<|tool_call>call:NAME{ARGS}<tool_call|>``, where ARGS is not
JSON: keys are bare (or quoted like strings), strings are wrapped in ``<|"|>`` (so they need no
escapes), and numbers, booleans, null, objects and arrays are written as in JSON::

    <|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:3,opts:{units:<|"|>C<|"|>}}<tool_call|>
    -> {"name": "get_weather", "arguments": {"city": "Paris", "days": 3, "opts": {"units": "C"}}}

The conversion is a left-to-right transcription that emits only what is settled (a key once its
``:`` arrived, a bare value once it ended, a string's characters as they come, never a partial
``<|"|>``), so the JSON of a prefix of the output is a prefix of the JSON of the whole: the
arguments stream as deltas that concatenate to the whole call's (``tool_parsers.ToolCallStream``).

Gemma 3 has no tool syntax of its own: its template renders text only, so it gets the tools
described in a system message and answers in ``<tool_call>`` blocks (``tokenizer/tool_prompt.py``,
the ``hermes`` parser).
"""

from __future__ import annotations

import json
import re

OPEN, CLOSE, QUOTE = "<|tool_call>", "<tool_call|>", '<|"|>'
_WS = " \t\r\n"
_CALL = re.compile(r"call:([A-Za-z0-9_.\-]+)\{")
_LITERAL = re.compile(r"-?\d+(\.\d+)?([eE][+-]?\d+)?|true|false|null")


def _partial_quote(src: str, i: int) -> bool:
    """``src[i:]`` is a proper prefix of ``<|"|>`` (may become one)."""
    rest = src[i:]
    return 0 < len(rest) < len(QUOTE) and QUOTE.startswith(rest)


def _string(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)[1:-1]


def _bare(token: str) -> str:
    """A bare value: a JSON literal as it is, anything else as a string."""
    return token if _LITERAL.fullmatch(token) else json.dumps(token, ensure_ascii=False)


def arguments_json(src: str, start: int) -> tuple[str, int | None]:
    """The Gemma 4 object at ``src[start] == '{'`` as JSON text, as far as it is settled, and
    the index just past its closing brace (None while it is still open)."""
    out: list[str] = []
    stack: list[str] = []
    key = False  # the next item is an object's key
    i = start
    while i < len(src):
        if src.startswith(QUOTE, i):
            body = i + len(QUOTE)
            end = src.find(QUOTE, body)
            if end < 0:  # an open string: its characters so far (not a key: it needs its ':')
                if not key:
                    text = src[body:]
                    held = next((n for n in range(len(QUOTE) - 1, 0, -1)
                                 if text.endswith(QUOTE[:n])), 0)
                    out.append('"' + _string(text[: len(text) - held]))
                break
            value = json.dumps(src[body:end], ensure_ascii=False)
            i = end + len(QUOTE)
            if key:
                colon = src.find(":", i)
                if colon < 0:
                    break
                value, i, key = value + ":", colon + 1, False
            out.append(value)
            continue
        if _partial_quote(src, i):
            break
        c = src[i]
        if c in _WS:
            i += 1
        elif key and c != "}":
            colon = src.find(":", i)
            if colon < 0:
                break
            out.append(json.dumps(src[i:colon].strip(), ensure_ascii=False) + ":")
            i, key = colon + 1, False
        elif c in "{[":
            stack.append(c)
            out.append(c)
            i, key = i + 1, c == "{"
        elif c in "}]":
            if not stack:
                break
            stack.pop()
            out.append(c)
            i += 1
            if not stack:
                return "".join(out), i
        elif c == ",":
            out.append(",")
            i, key = i + 1, bool(stack) and stack[-1] == "{"
        else:  # a bare value, settled once something follows it
            j = i
            while j < len(src) and src[j] not in ",}]" + _WS and not src.startswith(QUOTE, j):
                j += 1
            if j == len(src):
                break
            out.append(_bare(src[i:j]))
            i = j
    return "".join(out), None


def calls_in_block(body: str) -> list[str]:
    """The calls of one ``<|tool_call>`` block (``call:NAME{...}``, maybe several) as JSON
    call objects; the last one may be unfinished (no closing brace)."""
    raws, pos = [], 0
    while (m := _CALL.search(body, pos)) is not None:
        args, end = arguments_json(body, m.end() - 1)
        raws.append(f'{{"name": {json.dumps(m.group(1))}, "arguments": {args}'
                    + ("}" if end is not None else ""))
        if end is None:
            break
        pos = end
    return raws
