"""Checks every endpoint shares, so that a request is judged the same whichever way it came in.

Two kinds: the decoded JSON body must hold only text that can be encoded again (JSON's ``\\ud800``
escape decodes to a lone surrogate, which no message encoder, tokenizer or log line can write), and
the sampling parameters a request ends up with must stay within the server's limits (a list of
10,000 stop strings costs every detokenizer step).
"""

from __future__ import annotations

from typing import Any

from minisgl.core import SamplingParams
from minisgl.server.openai.protocol import ApiError, param_path

MAX_STOP = 16  # stop strings per request
MAX_STOP_LEN = 1024  # characters of one stop string
MAX_STOP_TOKEN_IDS = 256


def check_text(data: Any) -> None:
    """Raise a 400 naming the first string (value or key) of ``data`` that is not valid Unicode."""
    param = _unencodable(data, ())
    if param is not None:
        name = _param(param)
        raise ApiError(400, f"{name}: contains a lone UTF-16 surrogate (an escape such as "
                       "\\ud800 that is not half of a pair), which is not valid text", name)


def _unencodable(value: Any, path: tuple) -> tuple | None:
    if isinstance(value, str):
        return None if _encodable(value) else path
    if isinstance(value, dict):
        for key, item in value.items():
            if not _encodable(key):
                return (*path, "<key>")
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
