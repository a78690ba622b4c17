"""Incremental detokenization of one request: UTF-8-safe text deltas and stop strings.

Decoding each token alone breaks multi-byte characters (an emoji can span four byte-level tokens)
and loses the spaces some tokenizers add between tokens; decoding the whole output at every step
costs O(length) per token. So we decode a short window ``ids[prefix:]`` and diff it against the
decode of its already-emitted head ``ids[prefix:read]`` (the scheme vLLM and TGI use): the head
gives the window its context, and the delta is emitted only once it does not end in U+FFFD.

Stop strings are matched on the text, never on tokens, so a stop string split over tokens (or
over chunks of a stream) is still found. Text that could be the start of a stop string is held
back until it either completes one (then it is cut) or can no longer do so (then it is emitted).

Special tokens are left out of the text, except the markup that the tool-call and reasoning
parsers read (Gemma 4's ``<|tool_call>``, ``<tool_call|>``, ``<|"|>`` and its thinking channel's
``<|channel>``, ``<channel|>``, special tokens of its tokenizer): without them its calls and its
reasoning could not be told from text (``kept_special_ids``).
"""

from __future__ import annotations

from typing import Any

from minisgl.utils import init_logger

logger = init_logger(__name__)

_REPLACEMENT = "\ufffd"
_TRIM_IDS = 1024  # drop ids before the window once this many have piled up (bounded memory)
KEPT_SPECIAL_TOKENS = ("<|tool_call>", "<tool_call|>", '<|"|>', "<|channel>", "<channel|>")


def kept_special_ids(tokenizer: Any) -> frozenset[int]:
    """The ids of ``KEPT_SPECIAL_TOKENS`` that are special tokens of ``tokenizer``."""
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    return frozenset(i for i, tok in added.items()
                     if getattr(tok, "special", False) and str(tok) in KEPT_SPECIAL_TOKENS)


class IncrementalDetokenizer:
    """Turns a request's tokens, as they come, into the new text that is safe to show.

    ``add`` returns the new text, ``finish`` the held-back rest. ``stopped`` becomes True when a
    stop string matched: everything before it has been returned and nothing after it ever is.
    """

    def __init__(
        self, tokenizer: Any, stop: tuple[str, ...] = (), skip_special_tokens: bool = True,
        keep: frozenset[int] = frozenset(),
    ) -> None:
        self.tokenizer = tokenizer
        # special tokens shown all the same (``kept_special_ids``): the others are filtered here
        self.keep = keep
        self._special = (frozenset(getattr(tokenizer, "all_special_ids", ())) | frozenset(
            i for i, t in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items()
            if getattr(t, "special", False))) - keep if keep else frozenset()
        self.stop = tuple(s for s in stop if s)
        self.skip_special_tokens = skip_special_tokens
        self.stopped = False
        self._ids: list[int] = []
        self._prefix = 0  # window start: context for decoding (already emitted)
        self._read = 0  # end of the ids whose text is already out of the decoder
        self._held = ""  # decoded text not yet emitted: it may begin a stop string
        # Every proper prefix of a stop string: the suffixes worth holding back.
        self._prefixes = {s[:i] for s in self.stop for i in range(1, len(s))}
        self._max_hold = max((len(s) - 1 for s in self.stop), default=0)

    def add(self, token_ids: list[int]) -> str:
        """Feed new tokens; return the text they complete (maybe "")."""
        if self.stopped:
            return ""
        self._ids.extend(token_ids)
        return self._emit(self._decode_delta(final=False), final=False)

    def step(self, token: int, finish_reason: str | None) -> tuple[str, str | None]:
        """One token with the scheduler's finish reason: the text to show and the request's finish
        reason ("stop" once a stop string matched). The token that stops a request (EOS, a stop
        token id: finish reason "stop") is never shown."""
        text = self.add([token]) if finish_reason != "stop" else ""
        if finish_reason is not None:
            text += self.finish()
        return text, "stop" if self.stopped else finish_reason

    def finish(self) -> str:
        """The request ended: return everything still held back (unresolved bytes included)."""
        if self.stopped:
            return ""
        return self._emit(self._decode_delta(final=True), final=True)

    def _decode(self, ids: list[int]) -> str:
        skip = self.skip_special_tokens
        if skip and self.keep:
            ids, skip = [i for i in ids if i not in self._special], False
        return self.tokenizer.decode(
            ids,
            skip_special_tokens=skip,
            clean_up_tokenization_spaces=False,  # clean-up rewrites earlier text: no stable diff
        )

    def _decode_delta(self, final: bool) -> str:
        """Text of the ids past ``_read``; "" while it would end in a broken character."""
        if self._read == len(self._ids):
            return ""
        head = self._decode(self._ids[self._prefix : self._read])
        window = self._decode(self._ids[self._prefix :])
        if len(window) <= len(head) or (window.endswith(_REPLACEMENT) and not final):
            return ""  # nothing new (a skipped special token) or an incomplete character
        self._prefix, self._read = self._read, len(self._ids)
        if self._prefix >= _TRIM_IDS:
            del self._ids[: self._prefix]
            self._read -= self._prefix
            self._prefix = 0
        return window[len(head) :]

    def _emit(self, new_text: str, final: bool) -> str:
        """Cut at the first stop string; otherwise hold back a possible stop-string start."""
        text = self._held + new_text
        if not self.stop:
            self._held = ""
            return text
        cut = self._first_stop(text)
        if cut >= 0:
            self.stopped = True
            self._held = ""
            return text[:cut]
        hold = 0 if final else self._hold_len(text)
        self._held = text[len(text) - hold :] if hold else ""
        return text[: len(text) - hold]

    def _first_stop(self, text: str) -> int:
        """Start of the stop string that ends first (as if the text came char by char), or -1.
        Of two ending at the same place the longer wins: it started earlier."""
        found = [(i + len(s), i) for s in self.stop if (i := text.find(s)) >= 0]
        return min(found)[1] if found else -1

    def _hold_len(self, text: str) -> int:
        """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
        for k in range(min(len(text), self._max_hold), 0, -1):
            if text[-k:] in self._prefixes:
                return k
        return 0
