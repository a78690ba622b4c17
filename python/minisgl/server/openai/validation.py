"""Checks every endpoint shares, so that a request is judged the same whichever way it came in.

Two kinds: the decoded JSON body must hold only values the messages can carry again (JSON's
``\\ud800`` escape decodes to a lone surrogate, which no message encoder, tokenizer or log line can
write; an integer beyond 64 bits no message encoder takes), and the sampling parameters a request
ends up with must stay within the server's limits (a list of 10,000 stop strings costs every
detokenizer step).
"""

from __future__ import annotations

from typing import Any

from minisgl.params import SamplingParams
from minisgl.server.openai.errors import ApiError, param_path

MAX_STOP = 16  # stop strings per request
MAX_STOP_LEN = 1024  # characters of one stop string
MAX_STOP_TOKEN_IDS = 256


class OutOfRange(str):
    """An integer of the body beyond 64 bits, kept as its text (``int64``) until ``check_values``
    finds where it is."""


def int64(text: str) -> int | OutOfRange:
    """``json.loads``' ``parse_int``: the integer, or ``OutOfRange`` when it needs more than 64
    bits (its length is checked first: Python refuses to convert 4,300 digits or more)."""
    if len(text.lstrip("-")) <= 19 and -(1 << 63) <= (value := int(text)) < 1 << 63:
        return value
    return OutOfRange(text)


def check_values(data: Any) -> None:
    """Raise a 400 naming the first string (value or key) of ``data`` that is not valid Unicode,
    or the first integer beyond 64 bits."""
    param = _unencodable(data, ())
    if param is None:
        return
    name, value = _param(param[0]), param[1]
    if isinstance(value, OutOfRange):
        shown = value if len(value) <= 40 else f"{value[:20]}... ({len(value)} digits)"
        raise ApiError(400, f"{name}: integer {shown} is out of range (integers must fit in 64 "
                       "bits, -2^63 to 2^63 - 1)", name)
    raise ApiError(400, f"{name}: contains a lone UTF-16 surrogate (an escape such as "
                   "\\ud800 that is not half of a pair), which is not valid text", name)


def _unencodable(value: Any, path: tuple) -> tuple[tuple, Any] | None:
    """(path, value) of the first value the messages cannot carry."""
    if isinstance(value, OutOfRange):
        return path, value
    if isinstance(value, str):
        return None if _encodable(value) else (path, value)
    if isinstance(value, dict):
        for key, item in value.items():
            if not _encodable(key):
                return (*path, "<key>"), key
            found = _unencodable(item, (*path, key))
            if found is not None:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found = _unencodable(item, (*path, i))
            if found is not None:
                return found
    return None


def _encodable(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _param(path: tuple) -> str:
    """The same spelling as request-model errors: ``messages[0].content``."""
    return param_path(path) or "body"


def check_limits(params: SamplingParams, prefix: str = "") -> SamplingParams:
    """Enforce the per-request limits on engine parameters; ``prefix`` locates them in the body
    (``"sampling_params."`` for ``/generate``)."""
    if len(params.stop) > MAX_STOP:
        _limit(prefix + "stop", f"at most {MAX_STOP} stop strings, got {len(params.stop)}")
    longest = max(map(len, params.stop), default=0)
    if longest > MAX_STOP_LEN:
        _limit(prefix + "stop", f"stop strings of at most {MAX_STOP_LEN} characters, got "
               f"{longest}")
    if len(params.stop_token_ids) > MAX_STOP_TOKEN_IDS:
        _limit(prefix + "stop_token_ids", f"at most {MAX_STOP_TOKEN_IDS} stop token ids, got "
               f"{len(params.stop_token_ids)}")
    return params


def _limit(param: str, message: str) -> None:
    raise ApiError(400, f"{param}: {message}", param)
