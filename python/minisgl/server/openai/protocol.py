"""OpenAI-compatible request models (the responses are built in ``bodies.py``, errors in
``errors.py``).

Requests are validated strictly (no "1" for 1, no true for 1.0), as OpenAI does, so that a client's
mistake is a 400 naming the field instead of a silent coercion. A field that no model here declares
is refused or accepted on purpose by ``fields.py`` (never silently ignored).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from minisgl.params import SamplingParams
from minisgl.server.openai.errors import ApiError, param_path
from minisgl.server.openai.fields import check_fields
from minisgl.server.openai.union_errors import first_error
from minisgl.utils import init_logger

logger = init_logger(__name__)
M = TypeVar("M", bound=BaseModel)
MAX_N = 128
# the output limit of a request that sets none: the scheduler cuts it to what the context leaves
# after the prompt (``clamp_max_tokens``), as OpenAI, vLLM and SGLang bound such a request
TO_THE_WINDOW = 1 << 31


def parse(model: type[M], data: Any) -> M:
    """Validate a decoded JSON body; the first problem becomes a 400 naming its field."""
    try:
        parsed = model.model_validate(data)
    except ValidationError as e:
        loc, err, msg = first_error(e.errors())
        param = param_path(loc)
        msg = msg or err["msg"].removeprefix("Value error, ")
        if err["type"] in ("model_type", "model_attributes_type", "dict_type"):
            msg = "must be an object"  # not pydantic's "... or instance of ToolCall"
        raise ApiError(400, f"{param}: {msg}" if param else msg, param) from None
    if (ignored := check_fields(model, data)) is not None:
        raise ApiError(400, ignored[1], ignored[0])
    return parsed


def _first(*values: Any) -> Any:
    return next(v for v in values if v is not None)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class StreamOptions(_Strict):
    include_usage: bool = False


class _SamplingFields(_Strict):
    """Fields shared by chat and completions; ``None`` (JSON null) always means the default."""

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    n: int | None = Field(None, ge=1, le=MAX_N)
    stop: list[str] | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = None
    ignore_eos: bool | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    logit_bias: dict[str, float] | None = None
    # structured output (server/openai/structured.py turns these into the request's grammar)
    response_format: Any = None
    regex: str | None = None
    ebnf: str | None = None
    # vLLM's spellings of the same constraints
    guided_json: Any = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = Field(None, min_length=1)
    guided_grammar: str | None = None

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_list(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value  # limits: validation.check_limits

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    def sampling_params(self, max_tokens: int | None, default_max: int | None,
                        top_logprobs: int | None, choice: int,
                        extra: dict | None = None) -> SamplingParams:
        """The engine's parameters of choice ``choice`` (seeded ``seed + choice``); ``extra``:
        more ``SamplingParams`` fields (the grammar). Without ``max_tokens`` the request gets
        ``default_max`` (None: no limit but the context), cut to what the context leaves; a given
        one must fit."""
        given = {
            name: getattr(self, name)
            for name in ("temperature", "top_p", "top_k", "min_p", "presence_penalty",
                         "frequency_penalty", "repetition_penalty", "stop", "stop_token_ids",
                         "ignore_eos", "logit_bias")
            if getattr(self, name) is not None
        }
        given.update(extra or {})
        if self.seed is not None:
            given["seed"] = self.seed + choice
        if top_logprobs is not None:
            given.update(logprobs=True, top_logprobs=top_logprobs)
        try:
            return SamplingParams(max_tokens=_first(max_tokens, default_max, TO_THE_WINDOW),
                                  clamp_max_tokens=max_tokens is None, **given)
        except ValueError as e:
            param = str(e).split(":", 1)[0]
            raise ApiError(400, str(e), param) from None


class ToolCallFunction(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    name: str
    arguments: str | dict[str, Any] = "{}"  # OpenAI sends JSON text; an object is accepted too


class ToolCall(BaseModel):
    """A call in an assistant message of the history (its shape is checked: the chat template
    reads it, and a wrong one would fail there as a server error)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    id: str | None = None
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts(cls, value: Any) -> Any:
        """OpenAI's content parts: text parts alone are joined into one string; with other parts
        (``image_url``) the list stays, for the chat path to read (``openai/images.py``)."""
        if not isinstance(value, list):
            return value
        if not all(isinstance(part, dict) for part in value):
            raise ValueError("content parts must be objects")
        if any(part.get("type") != "text" for part in value):
            return value
        if not all(isinstance(part.get("text"), str) for part in value):
            raise ValueError("a text part needs a string 'text'")
        return "".join(part["text"] for part in value)

    def to_dict(self) -> dict:
        out = self.model_dump(exclude_none=True)
        out["role"] = "system" if self.role == "developer" else self.role
        out["content"] = self.content or ""
        return out


# apply_chat_template's own arguments: a template variable must not override them
_TEMPLATE_ARGS = frozenset({
    "conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
    "continue_final_message", "tokenize", "padding", "truncation", "max_length",
    "return_tensors", "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs",
})


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    chat_template_kwargs: dict[str, Any] | None = None  # e.g. {"enable_thinking": false}
    separate_reasoning: bool | None = None  # SGLang's: false keeps <think>... in content
    reasoning_effort: str | None = None  # harmony models (gpt-oss) only: low, medium, high

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_kwargs(cls, value: dict | None) -> dict | None:
        for name in value or {}:
            if name in _TEMPLATE_ARGS:
                raise ValueError(f"{name!r} is an argument of the templating, not a variable")
        return value
    tools: Any = None  # validated in server/openai/tools.py
    tool_choice: Any = None
    parallel_tool_calls: Any = None

    def params(self, choice: int, extra: dict | None = None,
               default_max: int | None = None) -> SamplingParams:
        """``default_max``: the output limit when the request sets none (the server's
        ``--default-max-tokens``; None: what the context leaves)."""
        if self.top_logprobs and not self.logprobs:
            raise ApiError(400, "top_logprobs: requires logprobs=true", "top_logprobs")
        top = (self.top_logprobs or 0) if self.logprobs else None
        max_tokens = self.max_completion_tokens or self.max_tokens
        return self.sampling_params(max_tokens, default_max, top, choice, extra)


class CompletionRequest(_SamplingFields):
    prompt: Any
    max_tokens: int | None = Field(None, ge=0)  # 0: the prompt only (its log-probs, with echo)
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool | None = None
    best_of: int | None = None

    @field_validator("prompt")
    @classmethod
    def _prompts(cls, value: Any) -> list[str | list[int]]:
        """Normalise to a list of prompts: texts or token-id lists."""
        def ids(x: Any) -> bool:
            return isinstance(x, list) and all(isinstance(i, int) and not isinstance(i, bool)
                                               and i >= 0 for i in x)
        if isinstance(value, str):
            value = [value]
        if isinstance(value, list) and value:
            if all(isinstance(p, str) and p for p in value):
                return value
            if ids(value):
                return [value]
            if all(ids(p) and p for p in value):
                return value
        raise ValueError("must be a non-empty string, a list of them, a list of token ids (>= 0) "
                         "or a list of non-empty token-id lists")

    def params(self, choice: int, extra: dict | None = None) -> SamplingParams:
        if self.best_of is not None and self.best_of != (self.n or 1):
            raise ApiError(400, "best_of: only best_of == n is supported", "best_of")
        params = self.sampling_params(self.max_tokens, 16, self.logprobs, choice, extra)
        if self.echo and self.logprobs is not None:  # the prompt's log-probs go before the output's
            params = dataclasses.replace(params, prompt_logprobs=True)
        return params


class GenerateRequest(_Strict):
    """The native endpoint: ``sampling_params`` are ``SamplingParams``' own fields."""

    model: str | None = None
    text: str | None = None
    input_ids: list[int] | None = Field(None, min_length=1)
    sampling_params: dict[str, Any] = {}
    stream: bool = False
    # SGLang's log-probs: of the output, and with logprob_start_len >= 0 of the prompt from there on
    return_logprob: bool = False
    logprob_start_len: int = Field(-1, ge=-1)
    top_logprobs_num: int = Field(0, ge=0, le=20)
    # SGLang's images of a text prompt (data URLs or http(s) URLs), one per placeholder in it
    image_data: str | list[str] | None = None

    def params(self) -> SamplingParams:
        if (self.text is None) == (self.input_ids is None):
            raise ApiError(400, "text: give exactly one of text and input_ids", "text")
        given = dict(self.sampling_params)
        if "max_tokens" not in given and "max_new_tokens" not in given:
            given.setdefault("clamp_max_tokens", True)  # the default is cut to the context
        given.setdefault("max_tokens", given.pop("max_new_tokens", 128))
        for name in ("logprob_start_len", "top_logprobs_num"):
            if name in self.model_fields_set and not self.return_logprob:
                raise ApiError(400, f"{name}: requires return_logprob=true", name)
        if self.return_logprob:
            given.update(logprobs=True, top_logprobs=self.top_logprobs_num)
        if self.return_logprob and self.logprob_start_len >= 0:
            given.update(prompt_logprobs=True, logprob_start_len=self.logprob_start_len)
        names = SamplingParams.__dataclass_fields__
        for name in given:
            if name not in names:
                param = f"sampling_params.{name}"
                raise ApiError(400, f"{param}: unknown parameter", param)
        try:
            return SamplingParams(**given)
        except ValueError as e:
            param = "sampling_params." + str(e).split(":")[0]
            raise ApiError(400, f"sampling_params.{e}", param) from None
