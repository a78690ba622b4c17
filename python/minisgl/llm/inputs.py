"""What ``LLM.generate`` and ``LLM.chat`` accept, checked and normalised: prompts (text, token
ids, a chat with images), chats and sampling parameters; a bad one is a ``ValueError`` naming
the field."""

from __future__ import annotations

from typing import Sequence, Union

from minisgl.multimodal.prompt import MultimodalPrompt
from minisgl.params import SamplingParams

Prompt = Union[str, Sequence[int], MultimodalPrompt]  # the last: a chat with images
Message = dict


def checked(messages) -> list[Message]:
    """``messages`` as a chat, or ``ValueError`` naming the field."""
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise ValueError("messages: must be a list of {'role': ..., 'content': ...} dicts")
    return messages


def has_non_text(message: Message) -> bool:
    """Whether a message carries content parts other than text (images)."""
    content = message.get("content")
    return isinstance(content, list) and any(
        not isinstance(p, dict) or p.get("type") != "text" for p in content)


def wants_logprobs(params: SamplingParams) -> bool:
    return params.logprobs or params.top_logprobs > 0


def as_prompt_list(prompts) -> list[Prompt]:
    """One prompt or a list of them as a list, or ``ValueError`` naming the field."""
    if isinstance(prompts, (str, MultimodalPrompt)):
        return [prompts]
    if isinstance(prompts, Sequence) and prompts and all(isinstance(t, int) for t in prompts):
        return [prompts]  # one prompt of token ids
    if not isinstance(prompts, Sequence) or not prompts:
        raise ValueError("prompts: must be a non-empty string, token-id list, or list of them")
    for p in prompts:
        if isinstance(p, (str, MultimodalPrompt)):
            continue
        if not isinstance(p, Sequence) or not all(isinstance(t, int) for t in p):
            raise ValueError("prompts: each prompt must be a string or a list of token ids, "
                             f"got {p!r}")
    return list(prompts)


def as_params_list(params, n: int) -> list[SamplingParams]:
    """One ``SamplingParams`` for every prompt, or ``n`` of them."""
    if params is None:
        return [SamplingParams()] * n
    if isinstance(params, SamplingParams):
        return [params] * n
    params = list(params)
    if len(params) != n or not all(isinstance(p, SamplingParams) for p in params):
        raise ValueError(f"sampling_params: expected one SamplingParams or a list of {n}")
    return params
