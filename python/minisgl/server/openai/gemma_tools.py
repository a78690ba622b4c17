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

Gemma 3's template renders text only: it gets the tools described in a system message that asks
for ``<tool_call>`` blocks (``tokenizer/tool_prompt.py``), while the prompts of Google's
function-calling guide, which its users copy, have it write Python calls in a fenced block::

    ```tool_code
    get_weather(city="Paris", days=3)
    ```
    -> {"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}

A block is read with ``ast`` (never run): calls of a name (``default_api.f`` is ``f``), one a line
or in a list, whose arguments are keywords with literal values (``true``/``false``/``null`` too).
Anything else (positional arguments, expressions, a syntax error) is not a call, and the block stays
in the content. A block's calls are known only once its fence closes, so they stream whole.
"""

from __future__ import annotations

import ast
import json
import math
import re
import textwrap
from functools import lru_cache

OPEN, CLOSE, QUOTE = "<|tool_call>", "<tool_call|>", '<|"|>'
CODE_OPEN, CODE_CLOSE = "```tool_code", "```"
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


_JSON_NAMES = {"true": True, "false": False, "null": None}


def _literal(node: ast.expr) -> object:
    """A literal argument value as JSON data; ``ValueError`` for anything else (a name, a call,
    bytes, a set, a complex or non-finite number)."""
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_literal(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        keys = [None if k is None else _literal(k) for k in node.keys]
        if not all(isinstance(k, str) for k in keys):
            raise ValueError("keys must be strings")
        return dict(zip(keys, (_literal(v) for v in node.values)))
    value = ast.literal_eval(node)
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("not a JSON number")
    if value is not None and not isinstance(value, (str, int, float)):
        raise ValueError("not a JSON value")
    return value


def _call(node: ast.expr) -> str:
    """One call as a JSON call object."""
    if not isinstance(node, ast.Call) or node.args:
        raise ValueError("a call with keyword arguments only")
    name, func = None, node.func
    while isinstance(func, ast.Attribute):  # a dotted name: its last part
        name, func = name or func.attr, func.value
    if not isinstance(func, ast.Name):
        raise ValueError("a call of a name")
    name = name or func.id
    if any(k.arg is None for k in node.keywords):
        raise ValueError("no **kwargs")
    args = {k.arg: _literal(k.value) for k in node.keywords}
    return json.dumps({"name": name, "arguments": args}, ensure_ascii=False)


@lru_cache(maxsize=64)  # a stream re-reads its closed blocks at every chunk
def code_calls(source: str) -> tuple[str, ...] | None:
    """The calls of one ``tool_code`` block as JSON call objects; None when it is not calls."""
    try:
        body = ast.parse(textwrap.dedent(source).strip(), mode="exec").body
        nodes = []
        for stmt in body:
            if not isinstance(stmt, ast.Expr):
                return None
            value = stmt.value
            nodes += value.elts if isinstance(value, (ast.List, ast.Tuple)) else [value]
        calls = tuple(_call(n) for n in nodes)
    except (ValueError, TypeError, SyntaxError, RecursionError):
        return None
    return calls or None


def split_tool_code(text: str, final: bool) -> tuple[str, list[str]]:
    """(content, calls) of an output with ``tool_code`` blocks. The content is the text before
    the first block of calls; a block that is not calls is content, one still open is held back
    (as is a tail that may start a block), so the content of a prefix is a prefix of the whole's."""
    raws: list[str] = []
    content, pos = None, 0
    while (start := text.find(CODE_OPEN, pos)) >= 0:
        body = start + len(CODE_OPEN)
        close = text.find(CODE_CLOSE, body)
        if close < 0 and not final:
            return (text[:start] if content is None else content), raws
        end = close if close >= 0 else len(text)
        calls = code_calls(text[body:end])
        if calls and content is None:
            content = text[:start]
        raws += calls or []
        pos = end + len(CODE_CLOSE) if close >= 0 else len(text)
    if content is not None:
        return content, raws
    if final:
        return text, raws
    held = next((n for n in range(min(len(CODE_OPEN) - 1, len(text)), 0, -1)
                 if CODE_OPEN.startswith(text[-n:])), 0)
    return text[: len(text) - held], raws
