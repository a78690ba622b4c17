"""Reasoning models: split the reasoning from the answer into ``reasoning_content``.

Thinking models write their reasoning between two tags and the answer after it: Qwen3,
DeepSeek-R1 and QwQ between ``<think>`` and ``</think>``, Gemma 4 in a ``thought`` channel,
``<|channel>thought\\n...<channel|>`` (its chat template turns it on with ``enable_thinking`` and
otherwise ends the prompt with an empty channel, so the answer comes alone). Clients (the OpenAI
SDK through ``reasoning_content``, LangChain, agents) expect the two apart, in whole messages and
in streamed deltas.

Where the reasoning starts depends on the chat template, not on the model name: Qwen3's template
lets the model open ``<think>`` itself (and with ``enable_thinking: false`` writes an empty
``<think></think>`` into the prompt), while DeepSeek-R1's and Qwen3-2507-Thinking's open it in the
prompt, so their output has only the closing tag. So the parser renders the template once per set
of ``chat_template_kwargs`` and starts inside the reasoning when the prompt ends with an open
tag; otherwise the reasoning is only what the output opens with the tag.

Streams arrive in arbitrary pieces, so a tag may be split across them (``</thi`` + ``nk>``): text
that could be the start of a tag is held back until it is resolved. Whitespace around the tags
(Qwen3 writes ``<think>\\n...\\n</think>\\n\\n``) is trimmed, also in streams.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Tags:
    """Where a family's reasoning opens and closes in the decoded text."""

    open: str
    close: str


THINK = Tags("<think>", "</think>")
# ``thought`` names Gemma 4's channel (as ``model`` names a turn): part of the tag, not reasoning
CHANNEL = Tags("<|channel>thought", "<channel|>")
TAGS = {"qwen3": THINK, "deepseek-r1": THINK, "gemma4": CHANNEL}
PARSERS = ("auto", "none", *TAGS)

_START, _REASONING, _CONTENT = "start", "reasoning", "content"
_PROBE = [{"role": "user", "content": "Hi"}]


def _partial_tag_len(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for k in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-k:]):
            return k
    return 0


class ReasoningSplitter:
    """Splits one output, fed piece by piece, into (reasoning, content) deltas.

    ``in_reasoning``: the prompt opened the tag (the output starts inside the reasoning).
    ``feed`` returns what can be shown now; ``finish`` the rest. Concatenated, the deltas equal the
    split of the whole text (``split``)."""

    def __init__(self, in_reasoning: bool, tags: Tags = THINK) -> None:
        self.state = _START
        self.in_reasoning = in_reasoning
        self.tags = tags
        self._buf = ""  # text not yet resolved (a possible tag, or whitespace to trim)
        self._trim = False  # drop whitespace at the start of the current part
        self.entered = False  # the output had a reasoning part (maybe empty)

    def feed(self, text: str) -> tuple[str, str]:
        self._buf += text
        reasoning, content = [], []
        while self._buf:
            if self.state == _START and not self._start():
                break
            if self.state == _REASONING:
                done, out = self._reasoning()
                reasoning.append(out)
                if not done:
                    break
            if self.state == _CONTENT:
                content.append(self._content())
        return "".join(reasoning), "".join(content)

    def finish(self) -> tuple[str, str]:
        """The end of the output: what was held back is resolved as it stands."""
        rest, self._buf = self._buf, ""
        if self.state == _START:
            self._enter(_REASONING if self.in_reasoning else _CONTENT, self.in_reasoning)
        if self.state == _REASONING:
            return (rest.rstrip() if not self._trim else rest.strip()), ""
        return "", rest.lstrip() if self._trim else rest

    def _start(self) -> bool:
        """Decide where the output begins; False while the opening tag may still come."""
        head, tag = self._buf.lstrip(), self.tags.open
        if head.startswith(tag):
            self._buf = head[len(tag):]
            self._enter(_REASONING, True)
            return True
        if tag.startswith(head):
            return False  # whitespace or a partial opening tag so far
        self._enter(_REASONING if self.in_reasoning else _CONTENT, self.in_reasoning)
        return True

    def _enter(self, state: str, trim: bool) -> None:
        self.state, self._trim = state, trim
        self.entered = self.entered or state == _REASONING

    def _reasoning(self) -> tuple[bool, str]:
        """Reasoning text up to the closing tag: (closed?, text to show)."""
        if self._trim:
            self._buf = self._buf.lstrip()
            if not self._buf:
                return False, ""
            self._trim = False
        close = self.tags.close
        end = self._buf.find(close)
        if end >= 0:
            out, self._buf = self._buf[:end].rstrip(), self._buf[end + len(close):]
            self.state, self._trim = _CONTENT, True
            return True, out
        keep = _partial_tag_len(self._buf, close)
        body = self._buf[: len(self._buf) - keep]
        shown = body.rstrip()  # trailing whitespace waits: it may precede the closing tag
        self._buf = body[len(shown):] + self._buf[len(body):]
        return False, shown

    def _content(self) -> str:
        out, self._buf = self._buf, ""
        if self._trim:
            out = out.lstrip()
            self._trim = not out
        return out


def split(text: str, in_reasoning: bool, tags: Tags = THINK) -> tuple[str | None, str]:
    """``(reasoning or None, content)`` of a whole output."""
    splitter = ReasoningSplitter(in_reasoning, tags)
    r1, c1 = splitter.feed(text)
    r2, c2 = splitter.finish()
    return (r1 + r2 if splitter.entered else None), c1 + c2


@dataclass(frozen=True)
class Mode:
    """How one request's output is split: the model's tags, and whether its prompt opened them."""

    tags: Tags
    in_reasoning: bool

    def splitter(self) -> ReasoningSplitter:
        return ReasoningSplitter(self.in_reasoning, self.tags)


class ReasoningConfig:
    """The server's choice (``--reasoning-parser``), resolved against the model's chat template.

    ``auto`` turns the split on when the template mentions a family's tags (Gemma 4's channel,
    else ``<think>``); ``qwen3`` and ``gemma4`` always (the start is found from the template);
    ``deepseek-r1`` always, starting inside the reasoning."""

    def __init__(self, name: str) -> None:
        if name not in PARSERS:
            raise ValueError(f"reasoning_parser: must be one of {', '.join(PARSERS)}, got {name!r}")
        self.name = name
        self._starts: dict[tuple[int, str], bool] = {}  # (tokenizer, kwargs) -> opened

    def tags(self, tokenizer: Any) -> Tags | None:
        """The tags this model's reasoning is split at; None: no split."""
        if self.name != "auto":
            return TAGS.get(self.name)
        template = getattr(tokenizer, "chat_template", None) or ""
        if not isinstance(template, str):
            return None
        return next((t for t in (CHANNEL, THINK) if t.open in template or t.close in template),
                    None)

    def enabled(self, tokenizer: Any) -> bool:
        return self.tags(tokenizer) is not None

    def starts_in_reasoning(self, tokenizer: Any, kwargs: dict | None) -> bool:
        """Whether the generation prompt (with these template kwargs) ends inside the reasoning."""
        if self.name == "deepseek-r1":
            return True
        key = self._key(tokenizer, kwargs)
        if key not in self._starts:
            try:
                prompt = tokenizer.apply_chat_template(_PROBE, tokenize=False,
                                                       add_generation_prompt=True, **(kwargs or {}))
            except Exception:  # the request's own templating reports the problem
                prompt = ""
            tags = self.tags(tokenizer) or THINK
            self._starts[key] = prompt.rstrip().endswith(tags.open)
        return self._starts[key]

    @staticmethod
    def _key(tokenizer: Any, kwargs: dict | None) -> tuple[int, str]:
        return id(tokenizer), json.dumps(kwargs or {}, sort_keys=True, default=str)

    async def mode(self, tokens: Any, kwargs: dict | None) -> Mode | None:
        """For one chat request: None (no split), else its tags and whether its output starts
        inside the reasoning. ``tokens``: the API's ``TokenTexts`` (it loads the tokenizer once)."""
        if self.name == "none":
            return None
        await tokens.get()
        tokenizer = tokens.tokenizer
        tags = self.tags(tokenizer) if tokenizer is not None else None
        if tags is None:
            return None
        if self.name != "deepseek-r1" and self._key(tokenizer, kwargs) not in self._starts:
            await asyncio.to_thread(self.starts_in_reasoning, tokenizer, kwargs)  # renders once
        return Mode(tags, self.starts_in_reasoning(tokenizer, kwargs))


def message_fields(text: str, mode: Mode | None) -> dict:
    """A whole message's ``content`` (and ``reasoning_content`` when the split is on)."""
    if mode is None:
        return {"content": text}
    reasoning, content = split(text, mode.in_reasoning, mode.tags)
    return {"content": content, "reasoning_content": reasoning}


def delta_fields(splitter: ReasoningSplitter | None, text: str, final: bool) -> dict:
    """A stream delta's fields for the new ``text`` (empty ones left out)."""
    if splitter is None:
        return {"content": text} if text else {}
    reasoning, content = splitter.feed(text)
    if final:
        more = splitter.finish()
        reasoning, content = reasoning + more[0], content + more[1]
    return {k: v for k, v in (("reasoning_content", reasoning), ("content", content)) if v}
