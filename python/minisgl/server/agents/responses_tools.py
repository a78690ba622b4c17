"""The Responses API's ``tools`` as chat tools.

- ``function`` tools are chat function tools.
- A ``namespace`` tool groups function tools (Codex CLI's multi-agent tools): each function is
  offered to the model as ``{namespace}__{name}`` (chat tool names allow letters, digits, ``_``
  and ``-`` only), and a call of one comes back as the Responses API shapes it: ``name`` the
  function's own, ``namespace`` beside it. A ``function_call`` input item with a ``namespace``
  goes into the chat history under the joined name, so the model sees what it called.
- Every other kind (``web_search``, ``file_search``, ``code_interpreter``, ``custom``, ...) is a
  tool the server cannot run: it is left out of what the model is offered, and the response
  (``dropped_tools``) and the server log say so. ``--reject-unsupported-tools`` answers 400
  instead, naming the first one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from minisgl.server.openai.errors import ApiError

SEPARATOR = "__"


def chat_name(namespace: str | None, name: str) -> str:
    """The name a (namespace, function) pair is offered to the model under."""
    return f"{namespace}{SEPARATOR}{name}" if namespace else name


def _bad(param: str, message: str) -> ApiError:
    return ApiError(400, f"{param}: {message}", param)


def _function(tool: dict, param: str, namespace: str | None = None) -> dict:
    if not isinstance(tool.get("name"), str):
        raise _bad(f"{param}.name", "must be a string")
    fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
    fn["name"] = chat_name(namespace, tool["name"])
    return {"type": "function", "function": fn}


@dataclass
class ResponsesTools:
    """``tools``: the chat tools offered; ``namespaces``: chat name -> (namespace, function);
    ``dropped``: the tools left out, ``{"index": i, "type": kind}`` (``index`` of ``tools``;
    inside a namespace also ``namespace`` and the index there)."""

    tools: list[dict] = field(default_factory=list)
    namespaces: dict[str, tuple[str, str]] = field(default_factory=dict)
    dropped: list[dict] = field(default_factory=list)

    @classmethod
    def from_request(cls, tools: list[dict] | None, strict: bool) -> ResponsesTools:
        """``strict``: a tool the server cannot run is a 400 instead of being left out."""
        out = cls()
        for i, tool in enumerate(tools or ()):
            kind, param = tool.get("type"), f"tools[{i}]"
            if kind == "function":
                out.tools.append(_function(tool, param))
            elif kind == "namespace":
                out._namespace(tool, param, i, strict)
            else:
                out._drop(f"{param}.type", {"index": i, "type": kind}, strict)
        return out

    def _namespace(self, tool: dict, param: str, index: int, strict: bool) -> None:
        namespace, inner = tool.get("name"), tool.get("tools")
        if not isinstance(namespace, str) or not namespace:
            raise _bad(f"{param}.name", "must be a non-empty string")
        if not isinstance(inner, list):
            raise _bad(f"{param}.tools", "must be a list of tools")
        for j, member in enumerate(inner):
            if not isinstance(member, dict) or member.get("type") != "function":
                kind = member.get("type") if isinstance(member, dict) else None
                self._drop(f"{param}.tools[{j}].type", {"index": index, "namespace": namespace,
                                                        "tool_index": j, "type": kind}, strict)
                continue
            chat = _function(member, f"{param}.tools[{j}]", namespace)
            self.namespaces[chat["function"]["name"]] = (namespace, member["name"])
            self.tools.append(chat)

    def _drop(self, param: str, what: dict, strict: bool) -> None:
        if strict:
            raise _bad(param, f"{what['type']!r} tools are not supported: the server runs no "
                       "built-in tools (function and namespace tools only; without "
                       "--reject-unsupported-tools they are left out)")
        self.dropped.append(what)

    def chat_tools(self) -> list[dict] | None:
        return self.tools or None

    def chat_tool_choice(self, choice: Any) -> Any:
        if choice is None or isinstance(choice, str):
            return choice
        if isinstance(choice, dict) and choice.get("type") == "function":
            name = choice.get("name")
            if isinstance(name, str) and isinstance(choice.get("namespace"), str):
                name = chat_name(choice["namespace"], name)
            return {"type": "function", "function": {"name": name}}
        raise _bad("tool_choice", "must be 'none', 'auto', 'required' or "
                   "{'type': 'function', 'name': ...}")

    def describe_dropped(self) -> str:
        """The log's words for what was left out: ``tools[8] (web_search), ...``."""
        return ", ".join(
            f"tools[{d['index']}]" + (f".tools[{d['tool_index']}]" if "namespace" in d else "")
            + f" ({d['type']})" for d in self.dropped)
