"""Tool-call parsers: a model's text -> OpenAI ``tool_calls``, whole or as streamed deltas.

Each format (Hermes/Qwen ``<tool_call>{...}</tool_call>``, Qwen3.5's XML calls, Gemma 4's
``<|tool_call>call:NAME{...}<tool_call|>`` and Gemma 3's ```` ```tool_code ```` Python calls
(``gemma_tools.py``), Llama 3's bare JSON objects, Mistral's ``[TOOL_CALLS] [...]``, and the
plain JSON that a constrained ``tool_choice`` produces) only says where the content ends and
where each call's JSON object starts. The rest is shared: a call object whose ``name`` comes first
streams its arguments as the raw text arrives, cut by a JSON scanner at the end of the arguments
value, so the fragments concatenate to exactly what a non-streamed response holds (which runs the
same code over the whole text at once).
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Callable

from minisgl.server.openai import gemma_tools
from minisgl.server.openai.call_scan import call_progress, scan_value

_WS = " \t\r\n"


def _objects(text: str, pos: int, seps: str = ",;") -> list[str]:
    """Call objects from ``pos`` on, separated by ``seps``; stops at anything else (``]``)."""
    raws = []
    while True:
        while pos < len(text) and (text[pos] in _WS or text[pos] in seps):
            pos += 1
        if pos >= len(text) or text[pos] != "{":
            return raws
        end = scan_value(text, pos)
        raws.append(text[pos: end or len(text)])
        if end is None:
            return raws
        pos = end


def _held(text: str, marker: str) -> int:
    """Length of the longest tail of ``text`` that could start ``marker`` (held back)."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


Split = tuple[str, list[str]]  # (content, raw call objects)


def _tagged(text: str, final: bool, parse: Callable[[str], list[str]],
            tags: tuple[str, str] = ("<tool_call>", "</tool_call>")) -> Split:
    """Calls inside ``<tool_call>...</tool_call>`` (or other ``tags``; the last one may still be
    open): ``parse`` turns one tag's body into its raw calls; the text before the first tag is the
    content."""
    open_tag, close_tag = tags
    start = text.find(open_tag)
    if start < 0:
        return text if final else text[: len(text) - _held(text, open_tag)], []
    raws: list[str] = []
    pos = start
    while pos >= 0:
        body = pos + len(open_tag)
        close = text.find(close_tag, body)
        raws += parse(text[body: close if close >= 0 else len(text)])
        pos = text.find(open_tag, close) if close >= 0 else -1
    return text[:start], raws


def split_hermes(text: str, final: bool) -> Split:
    return _tagged(text, final, lambda body: _objects(body, 0, "")[:1])


def _split_leading(text: str, final: bool, marker: str, array: bool) -> Split:
    """Calls when the (non-blank) text starts with ``marker`` or a JSON object/array."""
    head = text.lstrip(_WS)
    if marker and head.startswith(marker):
        head = head[len(marker):].lstrip(_WS)
    elif marker and not final and (not head or marker.startswith(head)):
        return "", []  # cannot tell yet
    if not head:
        return (text if final else ""), []
    pos = len(text) - len(head)
    if array and head[0] == "[":
        return "", _objects(text, pos + 1)
    if head[0] == "{":
        return "", _objects(text, pos)
    return text, []


def split_llama3(text: str, final: bool) -> Split:
    return _split_leading(text, final, "<|python_tag|>", array=False)


def split_json(text: str, final: bool) -> Split:
    return _split_leading(text, final, "", array=True)


def split_mistral(text: str, final: bool) -> Split:
    start = text.find("[TOOL_CALLS]")
    if start < 0:  # the marker is a special token: a detokenizer may have dropped it
        content, raws = _split_leading(text, final, "", array=True)
        if final or raws:
            return (content or ("" if raws else text)), raws
        return content[: len(content) - _held(content, "[TOOL_CALLS]")], []
    rest = text[start + len("[TOOL_CALLS]"):]
    head = rest.lstrip(_WS)
    base = len(text) - len(head)
    return text[:start], _objects(text, base + 1 if head.startswith("[") else base)


_XML_FUNCTION = re.compile(r"<function=([^>\n]+)>")
_XML_PARAM = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.S)


def _xml_value(text: str) -> object:
    """A parameter's text as JSON when it is a JSON number, literal, object or array; else the
    string itself (the template writes strings bare and everything else as JSON)."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if not isinstance(value, str) else text


def _xml_call(body: str) -> str | None:
    """``<function=NAME><parameter=K>V</parameter>...`` -> the call as JSON text; the arguments
    of a call still being written hold its finished parameters and no closing brace, so the
    text only grows as the call streams in."""
    m = _XML_FUNCTION.search(body)
    if m is None:
        return None
    args = ", ".join(f"{json.dumps(k.strip())}: {json.dumps(_xml_value(v), ensure_ascii=False)}"
                     for k, v in _XML_PARAM.findall(body, m.end()))
    closed = "</function>" in body[m.end():]
    return (f'{{"name": {json.dumps(m.group(1).strip())}, "arguments": {{{args}'
            + ("}}" if closed else ""))


def split_qwen3_xml(text: str, final: bool) -> Split:
    """Qwen3-Coder, Qwen3.5 and Qwen3.6: ``<tool_call><function=NAME><parameter=KEY>VALUE
    </parameter></function></tool_call>``."""
    return _tagged(text, final,
                   lambda body: [] if (call := _xml_call(body)) is None else [call])


def split_gemma4(text: str, final: bool) -> Split:
    """Gemma 4: ``<|tool_call>call:NAME{key:<|"|>text<|"|>,n:1}<tool_call|>``."""
    return _tagged(text, final, gemma_tools.calls_in_block,
                   (gemma_tools.OPEN, gemma_tools.CLOSE))


def split_gemma3(text: str, final: bool) -> Split:
    """Gemma 3: ```` ```tool_code ```` blocks, or the ``<tool_call>`` blocks that the described
    tools ask for when one of those comes first."""
    tagged, code = text.find("<tool_call>"), text.find(gemma_tools.CODE_OPEN)
    if tagged >= 0 and (code < 0 or tagged < code):
        return split_hermes(text, final)
    content, raws = gemma_tools.split_tool_code(text, final)
    if raws or final:
        return content, raws
    return content[: len(content) - _held(content, "<tool_call>")], raws


TOOL_PARSERS: dict[str, Callable[[str, bool], Split]] = {
    "hermes": split_hermes, "llama3": split_llama3, "mistral": split_mistral, "json": split_json,
    "qwen3_xml": split_qwen3_xml, "gemma4": split_gemma4, "gemma3": split_gemma3,
}


def detect_parser(chat_template: str | None) -> str:
    """The format a chat template teaches; Hermes also for templates without tool support, whose
    tools are described in a system message that asks for that format (Gemma's turns: ``gemma3``,
    which reads that format and Gemma 3's own ``tool_code`` blocks)."""
    template = chat_template or ""
    if "[TOOL_CALLS]" in template:
        return "mistral"
    if gemma_tools.OPEN in template:
        return "gemma4"
    if "<function=" in template:
        return "qwen3_xml"
    if "<tool_call>" in template:
        return "hermes"
    if "<|python_tag|>" in template or "ipython" in template:
        return "llama3"
    if "<start_of_turn>" in template:
        return "gemma3"
    return "hermes"


class ToolCallStream:
    """Feeds a choice's text in pieces; returns the content delta and the tool-call deltas."""

    def __init__(self, parser: str) -> None:
        self.split = TOOL_PARSERS[parser]
        self.text = ""
        self.content_sent = 0
        self.sent: dict[int, list] = {}  # raw index -> [out index, id, name, args sent]

    def feed(self, piece: str, final: bool) -> tuple[str, list[dict]]:
        self.text += piece
        content, raws = self.split(self.text, final)
        new_content = content[self.content_sent:]
        self.content_sent = len(content)
        deltas: list[dict] = []
        for i, raw in enumerate(raws):
            p = call_progress(raw)
            if p.name is None:
                if p.complete or final:
                    continue  # not a call: dropped
                break  # later calls come after this one
            delta: dict | None = None
            if i not in self.sent:
                self.sent[i] = [len(self.sent), f"call_{uuid.uuid4().hex[:24]}", p.name, ""]
                index, cid = self.sent[i][:2]
                delta = {"index": index, "id": cid, "type": "function",
                         "function": {"name": p.name, "arguments": ""}}
            entry = self.sent[i]
            if len(p.args) > len(entry[3]):
                # one delta per call and chunk, as OpenAI sends: readers of tool_calls[0] see all
                delta = delta or {"index": entry[0], "function": {"arguments": ""}}
                delta["function"]["arguments"] = p.args[len(entry[3]):]
                entry[3] = p.args
            if delta is not None:
                deltas.append(delta)
        return new_content, deltas

    @property
    def called(self) -> bool:
        return bool(self.sent)

    def tool_calls(self) -> list[dict]:
        """The whole calls. A call cut off by ``max_tokens`` is left out: its arguments are not
        valid JSON, and the finish reason ``length`` says that the output was cut (a stream has
        sent its fragments already; its finish reason says the same)."""
        return [{"id": cid, "type": "function", "function": {"name": name, "arguments": args}}
                for _, cid, name, args in sorted(self.sent.values()) if _is_json(args)]


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def parse_tool_calls(text: str, parser: str) -> tuple[str, list[dict]]:
    """The whole text -> (content, tool_calls)."""
    stream = ToolCallStream(parser)
    content, _ = stream.feed(text, final=True)
    return content, stream.tool_calls()
