"""Chat chunks -> a Responses API object and its typed stream events.

One builder serves both ways of answering: it turns each chat chunk into the events that
announce, extend and close output items (``reasoning``, ``message``, ``function_call``), each event
numbered by ``sequence_number``; a whole response is the builder's state once the chunks are in,
so the streamed and the whole answer cannot disagree.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from copy import deepcopy

from minisgl.server.agents.responses_tools import chat_name


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class ResponseBuilder:
    """``base``: the response object's request echo (model, tools, ...); ``summary``: reasoning
    summaries were asked for; ``encrypted``: reasoning items carry ``encrypted_content`` (the
    reasoning text itself, not encrypted, so a stateless client can send it back);
    ``count``: tokens of a text (reasoning tokens in the usage); ``namespaces``: chat tool name
    -> (namespace, function) of the functions offered from namespace tools."""

    def __init__(self, base: dict, summary: bool, encrypted: bool,
                 count: Callable[[str], int],
                 namespaces: dict[str, tuple[str, str]] | None = None) -> None:
        self.base, self.summary, self.encrypted, self.count = base, summary, encrypted, count
        self.namespaces = namespaces or {}
        self.output: list[dict] = []
        self.calls: dict[int, dict] = {}  # chat tool-call index -> its item
        self.open: dict | None = None
        self.seq = 0
        self.status, self.finish_reason = "in_progress", None
        self.usage: dict | None = None
        self.error: dict | None = None
        self.incomplete: dict | None = None

    # ------------------------------------------------------------------ the object
    def response(self) -> dict:
        return {**self.base, "status": self.status, "output": self.output, "error": self.error,
                "incomplete_details": self.incomplete, "usage": self.usage}

    def event(self, kind: str, **fields) -> dict:
        self.seq += 1
        return {"type": kind, "sequence_number": self.seq - 1, **fields}

    def start(self) -> list[dict]:
        return [self.event("response.created", response=self.response()),
                self.event("response.in_progress", response=self.response())]

    # ------------------------------------------------------------------ chat chunks
    def feed(self, chunk: dict) -> list[dict]:
        out: list[dict] = []
        if chunk.get("usage"):
            self._usage(chunk["usage"])
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("reasoning_content"):
                out += self._reasoning(delta["reasoning_content"])
            if delta.get("content"):
                out += self._text(delta["content"])
            for call in delta.get("tool_calls") or []:
                out += self._call(call)
            self.finish_reason = choice.get("finish_reason") or self.finish_reason
        return out

    def _opening(self, item: dict) -> list[dict]:
        """Close the open item and open ``item``."""
        out = self._close()
        self.open = item
        self.output.append(item)
        return out + [self.event("response.output_item.added",
                                 output_index=len(self.output) - 1, item=deepcopy(item))]

    def _where(self, item: dict) -> dict:
        return {"item_id": item["id"], "output_index": self.output.index(item)}

    def _text(self, text: str) -> list[dict]:
        out: list[dict] = []
        if self.open is None or self.open["type"] != "message":
            item = {"type": "message", "id": _id("msg"), "status": "in_progress",
                    "role": "assistant", "content": []}
            out += self._opening(item)
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            item["content"].append(part)
            out.append(self.event("response.content_part.added", **self._where(item),
                                  content_index=0, part=deepcopy(part)))
        item = self.open
        item["content"][0]["text"] += text
        return out + [self.event("response.output_text.delta", **self._where(item),
                                 content_index=0, delta=text, logprobs=[])]

    def _reasoning(self, text: str) -> list[dict]:
        out: list[dict] = []
        if self.open is None or self.open["type"] != "reasoning":
            item = {"type": "reasoning", "id": _id("rs"), "status": "in_progress", "summary": [],
                    "content": [{"type": "reasoning_text", "text": ""}]}
            out += self._opening(item)
            if self.summary:
                item["summary"].append({"type": "summary_text", "text": ""})
                out.append(self.event("response.reasoning_summary_part.added",
                                      **self._where(item), summary_index=0,
                                      part=deepcopy(item["summary"][0])))
        item = self.open
        item["content"][0]["text"] += text
        out.append(self.event("response.reasoning_text.delta", **self._where(item),
                              content_index=0, delta=text))
        if self.summary:
            item["summary"][0]["text"] += text
            out.append(self.event("response.reasoning_summary_text.delta", **self._where(item),
                                  summary_index=0, delta=text))
        return out

    def _call(self, delta: dict) -> list[dict]:
        out: list[dict] = []
        fn = delta.get("function") or {}
        index = delta.get("index", 0)
        if index not in self.calls:
            item = {"type": "function_call", "id": _id("fc"),
                    "call_id": delta.get("id") or _id("call"), "name": fn.get("name") or "",
                    "arguments": "", "status": "in_progress"}
            if item["name"] in self.namespaces:
                item["namespace"], item["name"] = self.namespaces[item["name"]]
            self.calls[index] = item
            out += self._opening(item)
        item = self.calls[index]
        if fn.get("arguments"):
            item["arguments"] += fn["arguments"]
            out.append(self.event("response.function_call_arguments.delta", **self._where(item),
                                  delta=fn["arguments"]))
        return out

    def _close(self) -> list[dict]:
        item, self.open = self.open, None
        if item is None:
            return []
        where, out = self._where(item), []
        if item["type"] == "message":
            part = item["content"][0]
            out += [self.event("response.output_text.done", **where, content_index=0,
                               text=part["text"], logprobs=[]),
                    self.event("response.content_part.done", **where, content_index=0,
                               part=deepcopy(part))]
        elif item["type"] == "reasoning":
            text = item["content"][0]["text"]
            out.append(self.event("response.reasoning_text.done", **where, content_index=0,
                                  text=text))
            if self.summary:
                out += [self.event("response.reasoning_summary_text.done", **where,
                                   summary_index=0, text=text),
                        self.event("response.reasoning_summary_part.done", **where,
                                   summary_index=0, part=deepcopy(item["summary"][0]))]
            if self.encrypted:
                item["encrypted_content"] = text
        else:
            out.append(self.event("response.function_call_arguments.done", **where,
                                  name=item["name"], arguments=item["arguments"]))
        item["status"] = "completed"
        return out + [self.event("response.output_item.done", output_index=where["output_index"],
                                 item=deepcopy(item))]

    def _usage(self, usage: dict) -> None:
        prompt, completion = usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        reasoning = sum(self.count(i["content"][0]["text"]) for i in self.output
                        if i["type"] == "reasoning")
        self.usage = {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached},
                      "output_tokens": completion,
                      "output_tokens_details": {"reasoning_tokens": min(reasoning, completion)},
                      "total_tokens": prompt + completion}

    # ------------------------------------------------------------------ the end
    def finish(self) -> list[dict]:
        out = self._close()
        if self.finish_reason == "length":
            self.status, self.incomplete = "incomplete", {"reason": "max_output_tokens"}
            return out + [self.event("response.incomplete", response=self.response())]
        self.status = "completed"
        return out + [self.event("response.completed", response=self.response())]

    def fail(self, message: str, code: str = "server_error", status: str = "failed") -> list[dict]:
        """A response that ended early: ``status`` ``failed``, or ``cancelled`` by the client."""
        out = self._close()
        self.status, self.error = status, {"code": code, "message": message}
        return out + [self.event("response.failed", response=self.response())]

    def history(self) -> dict | None:
        """The output as one assistant chat message (what a continuation's history holds)."""
        msg: dict = {"role": "assistant", "content": ""}
        for item in self.output:
            if item["type"] == "reasoning":
                msg["reasoning_content"] = item["content"][0]["text"]
            elif item["type"] == "message":
                msg["content"] += item["content"][0]["text"]
            else:
                msg.setdefault("tool_calls", []).append(
                    {"id": item["call_id"], "type": "function",
                     "function": {"name": chat_name(item.get("namespace"), item["name"]),
                                  "arguments": item["arguments"]}})
        return msg if len(msg) > 2 or msg["content"] else None
