"""Structured-output fields of the OpenAI endpoints -> the one grammar of ``SamplingParams``.

``response_format`` (``text``, ``json_object``, ``json_schema`` strict or not), SGLang's extra
``regex`` and ``ebnf``, and the schema a forced ``tool_choice`` implies. A grammar is parsed here,
on a worker thread, so a bad one is a 400 naming its field before the request is queued.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from minisgl.server.openai.errors import ApiError

Grammar = tuple[str, str, str]  # (SamplingParams field, source, request field to blame)


def _response_format(value: Any) -> Grammar | None:
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise ApiError(400, "response_format: must be an object with a string 'type'",
                       "response_format")
    kind = value["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return "json_schema", json.dumps({"type": "object"}), "response_format"
    if kind != "json_schema":
        raise ApiError(400, f"response_format.type: {kind!r} is not one of 'text', 'json_object', "
                       "'json_schema'", "response_format.type")
    spec = value.get("json_schema")
    param = "response_format.json_schema"
    if not isinstance(spec, dict):
        raise ApiError(400, f"{param}: must be an object with 'name' and 'schema'", param)
    if not isinstance(spec.get("name"), str) or not spec["name"]:
        raise ApiError(400, f"{param}.name: must be a non-empty string", f"{param}.name")
    if not isinstance(spec.get("strict", False), (bool, type(None))):
        raise ApiError(400, f"{param}.strict: must be a boolean", f"{param}.strict")
    schema = spec.get("schema", {"type": "object"})
    if not isinstance(schema, dict):
        raise ApiError(400, f"{param}.schema: must be a JSON schema object", f"{param}.schema")
    return "json_schema", json.dumps(schema), f"{param}.schema"


_NAMED = {"regex": "regex", "ebnf": "ebnf", "guided_regex": "regex", "guided_grammar": "ebnf"}
_REGEX_SPECIAL = set("\\.^$|?*+()[]{}")


def _escape(text: str) -> str:
    """A literal in the regex dialect of the grammar library (Python's ``re.escape`` also
    escapes spaces and such, which that dialect refuses)."""
    return "".join(f"\\{c}" if c in _REGEX_SPECIAL else c for c in text)


def _guided_json(value: Any) -> Grammar:
    """vLLM's ``guided_json``: a schema, as an object or as JSON text."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise ApiError(400, "guided_json: must be a JSON schema (an object, or its JSON "
                           "text)", "guided_json") from None
    if not isinstance(value, dict):
        raise ApiError(400, "guided_json: must be a JSON schema object", "guided_json")
    return "json_schema", json.dumps(value), "guided_json"


def requested_grammar(req: Any, tools_schema: str | None = None) -> Grammar | None:
    """The grammar a chat/completions request asks for; more than one is a 400."""
    found: list[Grammar] = []
    if getattr(req, "response_format", None) is not None:
        found += [g for g in [_response_format(req.response_format)] if g]
    for name, kind in _NAMED.items():
        value = getattr(req, name, None)
        if value is not None:
            found.append((kind, value, name))
    if getattr(req, "guided_json", None) is not None:
        found.append(_guided_json(req.guided_json))
    if getattr(req, "guided_choice", None) is not None:
        found.append(("regex", "|".join(f"({_escape(c)})" for c in req.guided_choice),
                      "guided_choice"))
    if tools_schema is not None:
        found.append(("json_schema", tools_schema, "tool_choice"))
    if len(found) > 1:
        names = " and ".join(g[2].split(".")[0] for g in found)
        raise ApiError(400, f"{found[1][2]}: only one output constraint per request ({names})",
                       found[1][2])
    return found[0] if found else None


def warm_parser() -> None:
    """Import xgrammar and parse one grammar, at start-up on a worker thread: the first
    constrained request would pay for the import in ``check`` (docs/performance.md, "The first
    minute")."""
    from minisgl.structured import check_grammar

    try:
        check_grammar("json_schema", json.dumps({"type": "object"}))
    except ImportError:  # a broken install: the first constrained request says so
        pass


async def check(grammar: Grammar | None) -> None:
    """Parse the grammar (off the event loop); a bad one is a 400 naming the request field."""
    if grammar is None:
        return
    from minisgl.structured import check_grammar

    kind, source, param = grammar
    try:
        await asyncio.to_thread(check_grammar, kind, source)
    except ValueError as e:
        reason = str(e).split(": ", 1)[-1]
        raise ApiError(400, f"{param}: {reason}", param) from None
