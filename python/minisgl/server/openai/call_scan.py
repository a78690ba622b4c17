"""Reading one tool call's JSON object as it streams: where a JSON value ends (``scan_value``), and
what is known of the call so far, its name and its arguments' text (``call_progress``), the
arguments cut from the raw text so that streamed fragments concatenate to the whole."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

_NAME_FIRST = re.compile(
    r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*(?=\S)')


def scan_value(text: str, start: int) -> int | None:
    """End (exclusive) of the JSON object/array/string at ``text[start]``, None if it is cut off."""
    depth, in_string, escaped = 0, False, False
    for i in range(start, len(text)):
        c = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
                if depth == 0:
                    return i + 1
        elif c == '"':
            in_string = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
    return None


@dataclass
class CallProgress:
    """What is known of one call so far. ``args`` only grows while the text grows."""

    name: str | None
    args: str
    complete: bool  # the call's object is closed
    valid: bool = True


def call_progress(raw: str) -> CallProgress:
    """Progress of the call object that ``raw`` starts (with its ``{``)."""
    end = scan_value(raw, 0)
    m = _NAME_FIRST.match(raw)
    if m is not None and raw[m.end()] in "{[":
        name = json.loads(f'"{m.group(1)}"')
        args_end = scan_value(raw, m.end())
        return CallProgress(name, raw[m.end(): args_end or len(raw)], end is not None)
    if end is None:
        return CallProgress(None, "", False)
    try:
        obj = json.loads(raw[:end])
    except ValueError:
        return CallProgress(None, "", True, valid=False)
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return CallProgress(None, "", True, valid=False)
    args = obj.get("arguments", obj.get("parameters", {}))
    text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    return CallProgress(obj["name"], text, True)
