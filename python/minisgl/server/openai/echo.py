"""``echo`` on ``/v1/completions`` and prompt log-probs on ``/generate``.

lm-evaluation-harness scores each answer of a multiple-choice task by the log-likelihood of its
tokens: it sends prompt + answer with ``echo: true``, ``logprobs: 1`` and ``max_tokens: 0`` and
reads the prompt's token log-probs back. OpenAI's legacy format puts the prompt's text before the
completion, and its tokens before the completion's in ``logprobs``, the first one with a ``null``
log-prob (nothing predicts it). The engine computes them during prefill
(``engine/prompt_logprobs.py``); they arrive with a choice's first reply.
"""

from __future__ import annotations

from typing import Any

from minisgl.server.openai.bodies import ChoiceState, TokenText, finite


def prompt_text(prompt: str | list[int], tokenizer: Any, text_of: TokenText) -> str:
    """The text a prompt echoes: as given, or its token ids decoded."""
    if isinstance(prompt, str):
        return prompt
    if tokenizer is not None:
        return tokenizer.decode(prompt)
    return "".join(text_of(t) for t in prompt)


def prompt_completion_logprobs(state: ChoiceState, text_of: TokenText, top: int) -> dict:
    """The prompt's part of a legacy ``logprobs`` object (advances ``state.text_offset``)."""
    out: dict[str, list] = {k: [] for k in ("tokens", "token_logprobs", "top_logprobs",
                                            "text_offset")}
    for tid, lp, alts in state.prompt_logprobs or []:
        text = text_of(tid)
        if lp is None:
            values = (text, None, None, state.text_offset)
        else:
            tops = {text_of(a): finite(b) for a, b in alts[:top]}
            tops.setdefault(text, finite(lp))
            values = (text, finite(lp), tops, state.text_offset)
        for key, value in zip(out, values):
            out[key].append(value)
        state.text_offset += len(text)
    return out


def join_logprobs(first: dict | None, second: dict | None) -> dict | None:
    if first is None or second is None:
        return first or second
    return {key: first[key] + second[key] for key in first}


class Echo:
    """The prompt that goes before each choice's text, once per choice (streams too)."""

    def __init__(self, texts: list[str], text_of: TokenText | None, top: int | None) -> None:
        self.texts, self.text_of, self.top = texts, text_of, top
        self._done: set[int] = set()

    def prefix(self, state: ChoiceState) -> tuple[str, dict | None]:
        """The prompt's text and legacy log-probs for this choice; ("", None) after the first
        call."""
        if state.uid in self._done:
            return "", None
        self._done.add(state.uid)
        lps = None
        if self.top is not None and self.text_of is not None:
            lps = prompt_completion_logprobs(state, self.text_of, self.top)
        return self.texts[state.prompt_index], lps


def generate_prompt_logprobs(state: ChoiceState) -> dict:
    """SGLang's ``meta_info`` fields: ``[logprob, id]`` pairs and per token its top alternatives."""
    entries = state.prompt_logprobs or []
    return {
        "input_token_logprobs": [[None if lp is None else finite(lp), t] for t, lp, _ in entries],
        "input_top_logprobs": [None if lp is None else [[finite(b), a] for a, b in alts]
                               for _, lp, alts in entries],
    }
