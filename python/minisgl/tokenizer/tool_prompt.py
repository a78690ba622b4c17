"""Tools and tool messages for the chat template.

A template that takes ``tools`` gets them as they are, and the history's tool-call arguments as
objects (templates serialise them; OpenAI sends JSON text). A template without tool support gets
a system message that describes the tools and asks for Hermes-style ``<tool_call>`` blocks (which
the ``hermes`` parser reads back), and the history is rewritten into plain text in that format.
Tool results become user messages, merged with the user messages beside them: templates such as
Gemma 3's raise an error unless user and assistant turns alternate.
"""

from __future__ import annotations

import json
from typing import Any

_INSTRUCTIONS = (
    "You can call functions to help with the user's request. The functions are described in "
    "JSON schema inside <tools></tools>:\n<tools>\n{tools}\n</tools>\n"
    "To call a function, answer with one block per call, and nothing else:\n"
    '<tool_call>\n{{"name": <function name>, "arguments": <arguments as a JSON object>}}\n'
    "</tool_call>"
)


def template_takes_tools(tokenizer: Any) -> bool:
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):
        template = " ".join(template.values())
    return "tools" in template


def _arguments(call: dict) -> dict:
    fn = dict(call.get("function") or {})
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            fn["arguments"] = json.loads(args)
        except ValueError:
            pass  # not JSON: the template shows it as the text it is
    return {**call, "function": fn}


def with_argument_objects(messages: list[dict]) -> list[dict]:
    """The history for a template that takes tools: call arguments as objects, and each tool
    result named after its call (OpenAI gives only ``tool_call_id``; templates such as Gemma 4's
    render the function's name with the result)."""
    names: dict[str, str] = {}
    out = []
    for m in messages:
        if m.get("tool_calls"):
            calls = [_arguments(c) for c in m["tool_calls"]]
            names.update({c.get("id"): (c.get("function") or {}).get("name") for c in calls
                          if isinstance(c.get("id"), str)})
            m = {**m, "tool_calls": calls}
        elif m.get("role") == "tool" and not m.get("name") and m.get("tool_call_id") in names:
            m = {**m, "name": names[m["tool_call_id"]]}
        out.append(m)
    return out


def _as_text(message: dict) -> dict:
    if message.get("role") == "tool":
        return {"role": "user",
                "content": f"<tool_response>\n{message.get('content') or ''}\n</tool_response>"}
    if message.get("tool_calls"):
        blocks = []
        for call in message["tool_calls"]:
            fn = call.get("function") or {}
            args = _arguments(call)["function"].get("arguments", {})
            blocks.append("<tool_call>\n" + json.dumps({"name": fn.get("name"), "arguments": args},
                                                       ensure_ascii=False) + "\n</tool_call>")
        text = "\n".join(([message["content"]] if message.get("content") else []) + blocks)
        return {"role": message["role"], "content": text}
    return message


def _merge_results(messages: list[dict]) -> list[dict]:
    """Adjacent user messages one of which is a tool result, as one message."""
    out: list[dict] = []
    for original, message in messages:
        prev = out[-1] if out else None
        if (prev is not None and prev[1]["role"] == message["role"] == "user"
                and "tool" in (prev[0], original.get("role"))
                and isinstance(prev[1]["content"], str) and isinstance(message["content"], str)):
            out[-1] = ("tool", {"role": "user",
                                "content": prev[1]["content"] + "\n" + message["content"]})
        else:
            out.append((original.get("role"), message))
    return [m for _, m in out]


def describe_tools(messages: list[dict], tools: list[dict] | None) -> list[dict]:
    """The conversation for a template without tool support."""
    out = _merge_results([(m, _as_text(m)) for m in messages])
    if not tools:
        return out
    listing = "\n".join(json.dumps(t.get("function", t), ensure_ascii=False) for t in tools)
    text = _INSTRUCTIONS.format(tools=listing)
    if out and out[0].get("role") == "system":
        return [{**out[0], "content": f"{out[0].get('content') or ''}\n\n{text}"}, *out[1:]]
    return [{"role": "system", "content": text}, *out]
