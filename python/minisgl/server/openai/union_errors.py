"""pydantic's validation errors as a client reads them. For a field typed as a union, pydantic
reports one error per member, each located under the member's tag (``input.str``,
``input.list[dict[str,any]]``); clients know the field, not the member."""

from __future__ import annotations

from typing import Any

_KINDS = {"str": "a string", "int": "an integer", "float": "a number", "bool": "a boolean",
          "list": "a list", "dict": "an object"}


def _member(part: Any) -> str | None:
    """The kind a union member's tag in a location stands for, or None for a field or index."""
    if not isinstance(part, str):
        return None
    base = part.split("[", 1)[0]
    return _KINDS.get(base) if base in _KINDS and (base == part or "[" in part) else None


def first_error(errors: list[dict]) -> tuple[tuple, dict, str | None]:
    """The first error's location without union tags, the error, and for a value no member of a
    union accepted a message naming the kinds allowed. Among the members' errors the deepest
    wins: ``input: [5]`` is an error of ``input[0]``, not of ``input``."""
    def strip(err: dict) -> tuple:
        return tuple(p for p in err["loc"] if _member(p) is None)

    field = strip(errors[0])
    same = [e for e in errors if strip(e)[:len(field)] == field]
    err = max(same, key=lambda e: len(strip(e)))
    loc = strip(err)
    kinds = [k for e in same if strip(e) == field for k in map(_member, e["loc"]) if k]
    message = f"must be {' or '.join(dict.fromkeys(kinds))}" if loc == field and len(kinds) > 1 \
        else None
    return loc, err, message
