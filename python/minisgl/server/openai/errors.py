"""The API's errors: ``ApiError``, raised wherever a request is handled and answered by the app's
handler, and OpenAI's ``{"error": {...}}`` body, which names the field at fault as clients spell it.
"""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """An error answered as OpenAI's ``{"error": {...}}`` body with an HTTP status."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return error_body(self.message, kind, self.param, self.code)


def error_body(message: str, kind: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def param_path(loc: Any) -> str | None:
    """A field's location as clients spell it: ``messages[0].content`` (None for the body)."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}" if out else str(part)
    return out or None
