"""Prompt -> token ids for one TokenizeMsg (text, chat messages or ids given as they are); a chat
with images -> a ``MultimodalPrompt`` (``minisgl.multimodal``)."""

from __future__ import annotations

from typing import Any

from minisgl.message import TokenizeMsg
from minisgl.multimodal.items import MediaError
from minisgl.multimodal.processor import ImageProcessor
from minisgl.multimodal.prompt import MultimodalPrompt
from minisgl.params import SamplingParams
from minisgl.utils import init_logger

from .harmony import Harmony
from .tool_prompt import describe_tools, template_takes_tools, with_argument_objects

logger = init_logger(__name__)


class TokenizeManager:
    """Tokenizes prompts. Every problem the client caused is a ``ValueError`` whose message names
    the field at fault ("prompt" or "messages"), so the API can answer it with an HTTP 400."""

    def __init__(self, tokenizer: Any, harmony: Harmony | None = None,
                 images: ImageProcessor | None = None) -> None:
        self.tokenizer = tokenizer  # None: the model ships no tokenizer, only ids are accepted
        self.harmony = harmony  # gpt-oss: chats render in harmony, not through the template
        self.images = images  # a vision-language model's image preprocessing

    def prompt(self, msg: TokenizeMsg) -> tuple[list[int], MultimodalPrompt | None]:
        """The prompt's ids, and with images the ``MultimodalPrompt`` the engine takes."""
        if msg.images:
            mm = self.multimodal(msg)
            return mm.input_ids, mm
        return self.tokenize(msg), None

    def tokenize(self, msg: TokenizeMsg) -> list[int]:
        if msg.images:
            return self.multimodal(msg).input_ids
        if msg.input_ids is not None:
            ids = list(msg.input_ids)
            if any(i < 0 for i in ids):
                raise ValueError("prompt: token ids must be >= 0")
        elif msg.messages is not None and self.harmony is not None:
            if not msg.messages:
                raise ValueError("messages: at least one message is required")
            ids = self.harmony.render(msg.messages, msg.tools, msg.chat_template_kwargs or {})
        elif msg.messages is not None:
            text = self._template(msg.messages, msg.chat_template_kwargs or {}, msg.tools)
            ids = self._encode(text, add_special_tokens=False)
        elif msg.text is not None:
            ids = self._encode(msg.text, add_special_tokens=True)
        else:
            raise ValueError("prompt: one of a prompt or messages is required")
        if not ids:
            field = "messages" if msg.messages is not None else "prompt"
            raise ValueError(f"{field}: the prompt is empty (no tokens)")
        return ids

    def multimodal(self, msg: TokenizeMsg) -> MultimodalPrompt:
        """A chat (or a text prompt, ``/generate``) with images: the template's (the text's)
        placeholders expanded to each image's tokens."""
        param = "messages" if msg.messages is not None else "prompt"
        if self.images is None:
            raise MediaError(param, "this model takes no images (it has no vision tower)")
        if msg.messages is not None:
            text = self._template(msg.messages, msg.chat_template_kwargs or {}, msg.tools)
            special = False
        elif msg.text is not None:
            text, special = msg.text, True
        else:
            raise MediaError("prompt", "images come with chat messages or a text prompt, not "
                             "token ids")
        return self.images.prompt(text, list(msg.images or ()),
                                  lambda t: self._encode(t, add_special_tokens=special), param)

    def warm_up(self) -> None:
        """Run the chat template, with and without tools, the encoder and the decoder once: the
        first call imports and compiles the template engine, which would otherwise stall the
        first chat request for seconds. A template that fails here fails again for the user, as
        a 400."""
        if self.tokenizer is None:
            return
        tools = [{"type": "function", "function": {
            "name": "f", "description": "d", "parameters": {"type": "object", "properties": {}}}}]
        for extra in ({}, {"tools": tools}):
            try:
                self.tokenize(TokenizeMsg(uid=0, sampling_params=SamplingParams(),
                                          messages=[{"role": "user", "content": "Hi"}], **extra))
            except ValueError:
                pass
        ids = self.tokenize(TokenizeMsg(uid=0, sampling_params=SamplingParams(), text="Hi"))
        self.tokenizer.decode(ids)

    def _require_tokenizer(self, field: str) -> Any:
        if self.tokenizer is None:
            raise ValueError(f"{field}: this model has no tokenizer; send token ids instead")
        return self.tokenizer

    def _template(self, messages: list[dict], kwargs: dict[str, Any],
                  tools: list[dict] | None = None) -> str:
        tokenizer = self._require_tokenizer("messages")
        if not messages:
            raise ValueError("messages: at least one message is required")
        extra: dict[str, Any] = {}
        if template_takes_tools(tokenizer):
            messages = with_argument_objects(messages)
            extra = {"tools": tools} if tools else {}
        else:
            messages = describe_tools(messages, tools)
        try:
            text = tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True, **kwargs, **extra
            )
        except Exception as e:  # jinja errors, a missing template, malformed messages...
            raise ValueError(f"messages: the chat template failed: {one_line(e)}") from e
        if not isinstance(text, str):
            raise ValueError(f"messages: the chat template gave {type(text).__name__}, not text")
        return text

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        tokenizer = self._require_tokenizer("prompt")
        return list(tokenizer.encode(text, add_special_tokens=add_special_tokens))


def one_line(e: BaseException) -> str:
    """``Type: first line of the message``: errors travel as one line (logs, HTTP bodies)."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__
