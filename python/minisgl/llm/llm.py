"""The offline interface: the same scheduler and engine as the server, in-process, no ZMQ."""

from __future__ import annotations

import dataclasses
import time
import weakref
from dataclasses import dataclass
from typing import Sequence

from tqdm import tqdm

from minisgl.core import SamplingParams
from minisgl.message import TokenizeMsg
from minisgl.models import load_eos_token_ids
from minisgl.models.weight import resolve_model_path
from minisgl.multimodal.prompt import MultimodalPrompt
from minisgl.scheduler import Scheduler, TokenOutput
from minisgl.scheduler.config import WAITING_POLL_S
from minisgl.scheduler.warmup import warm_up
from minisgl.tokenizer.detokenize import IncrementalDetokenizer
from minisgl.tokenizer.harmony import Harmony, is_harmony_model
from minisgl.utils import init_logger
from minisgl.utils.hf import load_tokenizer
from minisgl.utils.startup import Phases, process_age

from .aliases import llm_keywords
from .config import EngineOptions
from .inputs import (
    Message,
    Prompt,
    as_params_list,
    as_prompt_list,
    checked,
    has_non_text,
    wants_logprobs,
)

logger = init_logger(__name__)

_OPTIONS = {f.name for f in dataclasses.fields(EngineOptions)} | {"model", "tp"}


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top_logprobs: list[tuple[int, float]]


@dataclass
class GenerateOutput:
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str  # "stop" or "length" ("tool_calls": ``chat`` of a harmony model)
    logprobs: list[TokenLogprob] | None = None
    # with SamplingParams.prompt_logprobs: from logprob_start_len on; index 0's logprob is None
    prompt_logprobs: list[TokenLogprob] | None = None
    # ``chat`` of a harmony model (gpt-oss): the assistant message read from the output, in the
    # OpenAI shape: ``content``, ``reasoning_content``, ``tool_calls``
    message: dict | None = None


class LLM:
    """``LLM(model=None, tp=1, **options)``; ``model=None`` is the built-in default model.

    Options are the fields of ``EngineOptions`` (device, dtype, page_size, cache,
    max_prefill_tokens, num_pages, max_running_requests, ...), also under vLLM's and SGLang's
    names as the server's flags take them (``tensor_parallel_size``, ``max_model_len``,
    ``gpu_memory_utilization``, ``max_num_seqs``, ``enable_prefix_caching``, ...: ``aliases.py``);
    an unknown one raises ``TypeError`` with the closest names. ``tp > 1`` runs ranks 1.. in child
    processes (one GPU each). ``close()`` (or leaving a ``with LLM(...) as llm`` block) releases
    the CUDA graphs, the TP group and its processes at once; otherwise that happens when the
    object is collected or at exit.
    """

    def __init__(self, model: str | None = None, tp: int | None = None, **options) -> None:
        given = {k: v for k, v in (("model", model), ("tp", tp)) if v is not None}
        options = llm_keywords({**given, **options}, _OPTIONS)
        model, tp = options.pop("model", None), options.pop("tp", 1)
        opts = EngineOptions(**options)
        if not isinstance(tp, int) or tp < 1:
            raise ValueError(f"tp: must be a positive integer, got {tp!r}")
        # where the start-up's seconds go (the "LLM ready" line): the first part is the process's
        # life before this call (Python's start, the imports, the caller's own work)
        phases = Phases(launch="before LLM()", launched=process_age())
        self.model_path = resolve_model_path(model)
        self.tokenizer = load_tokenizer(self.model_path, cache_dir=opts.tokenizer_cache_dir())
        phases.mark("tokenizer")
        eos = load_eos_token_ids(self.model_path, self.tokenizer)
        config = opts.scheduler_config(self.model_path, eos)
        if tp == 1:
            self.scheduler = Scheduler(config)
        else:
            from .tp import TPScheduler

            self.scheduler = TPScheduler(config, tp)
        self._finalizer = weakref.finalize(self, self.scheduler.close)
        self._next_uid = 0
        self._harmony: Harmony | None = None  # gpt-oss's chat format (on first use)
        phases.mark("engine")
        if config.warmup:
            warm_up(self.scheduler)
            phases.mark("warm-up")
        logger.info("LLM ready: %s", phases)

    def close(self) -> None:
        """Release the engine now (idempotent); the object cannot generate afterwards."""
        self._finalizer()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool | None = None,
    ) -> list[GenerateOutput]:
        """Generate for every prompt (text or token ids); results come back in input order."""
        if not self._finalizer.alive:
            raise RuntimeError("LLM: generate() after close()")
        batch = as_prompt_list(prompts)
        params = as_params_list(sampling_params, len(batch))
        token_lists = [self._encode(p) for p in batch]
        uids = []
        try:
            for prompt, ids, sp in zip(batch, token_lists, params):
                mm = prompt if isinstance(prompt, MultimodalPrompt) else None
                uids.append(self._add(ids, sp, mm))
        except ValueError:
            for uid in uids:
                self.scheduler.abort(uid)
            raise
        return self._run(uids, token_lists, params, use_tqdm)

    def chat(
        self,
        conversations: list[Message] | list[list[Message]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool | None = None,
        chat_template_kwargs: dict | None = None,
        tools: list[dict] | None = None,
    ) -> list[GenerateOutput]:
        """Apply the model's chat template to each conversation, then generate.
        ``chat_template_kwargs`` are extra template variables
        (e.g. ``{"enable_thinking": False}``); ``tools`` (OpenAI function tools) go to it too.

        gpt-oss speaks harmony, not a template: its chats are rendered by openai-harmony
        (``reasoning_effort`` in ``chat_template_kwargs``), and each output's ``message`` holds
        what the server would return: the reasoning, the tool calls (finish reason
        ``tool_calls``) and the answer."""
        if conversations and isinstance(conversations[0], dict):
            conversations = [conversations]  # type: ignore[list-item]
        kwargs = dict(chat_template_kwargs or {})
        harmony = self._harmony_codec()
        if harmony is None:
            if tools is not None:
                kwargs["tools"] = tools
            prompts = [self.apply_chat_template(c, **kwargs)
                       for c in conversations]  # type: ignore[arg-type]
            return self.generate(prompts, sampling_params, use_tqdm)
        prompts = [harmony.render(checked(c), tools, kwargs)
                   for c in conversations]  # type: ignore[arg-type]
        outputs = self.generate(prompts, sampling_params, use_tqdm)
        for out in outputs:
            out.message, out.finish_reason = harmony.stream().message(out.token_ids,
                                                                       out.finish_reason)
        return outputs

    def apply_chat_template(self, messages: list[Message],
                            **kwargs) -> list[int] | MultimodalPrompt:
        """A chat's prompt ids. Content parts are OpenAI's: ``text``, and ``image_url`` (data
        URLs) for a model with a vision tower, whose chat becomes a ``MultimodalPrompt`` (its ids
        and images), which ``generate`` takes as it takes ids."""
        tokenizer = self._require_tokenizer("chat")
        messages = checked(messages)
        if any(map(has_non_text, messages)):
            return self._image_chat(messages, kwargs)
        text = tokenizer.apply_chat_template(messages, tokenize=False,
                                             add_generation_prompt=True, **kwargs)
        return tokenizer.encode(text, add_special_tokens=False)

    def _image_chat(self, messages: list[Message], kwargs: dict) -> MultimodalPrompt:
        """A chat with images, read and preprocessed (a bad part: ``ValueError`` naming it)."""
        from minisgl.multimodal.config import MediaOptions
        from minisgl.multimodal.fetch import load_image
        from minisgl.multimodal.items import check_count, split_images
        from minisgl.multimodal.processor import ImageProcessor
        from minisgl.tokenizer.tokenize import TokenizeManager

        processor = ImageProcessor.for_model(self.model_path, self.tokenizer)
        if processor is None:
            i = next(i for i, m in enumerate(messages) if has_non_text(m))
            raise ValueError(f"messages[{i}].content: only text content parts are supported "
                             "(the model has no vision tower)")
        messages, refs = split_images(messages)
        media = MediaOptions()
        check_count(refs, media.limit_mm_per_prompt)
        kwargs = dict(kwargs)
        tools = kwargs.pop("tools", None)
        msg = TokenizeMsg(uid=0, sampling_params=SamplingParams(), messages=messages,
                          chat_template_kwargs=kwargs, tools=tools,
                          images=[load_image(ref, media) for ref in refs])
        return TokenizeManager(self.tokenizer, images=processor).multimodal(msg)

    def _harmony_codec(self) -> Harmony | None:
        if self._harmony is None and is_harmony_model(self.model_path):
            self._harmony = Harmony()
        return self._harmony

    def _require_tokenizer(self, what: str):
        if self.tokenizer is None:
            raise ValueError(f"{what}: the model at {self.model_path!r} has no tokenizer; "
                             "pass token ids")
        return self.tokenizer

    # ---- internals --------------------------------------------------------------------------

    def _encode(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, MultimodalPrompt):
            return list(prompt.input_ids)
        if isinstance(prompt, str):
            return self._require_tokenizer("prompts").encode(prompt)
        return list(prompt)

    def _add(self, ids: list[int], params: SamplingParams,
             mm: MultimodalPrompt | None = None) -> int:
        uid, self._next_uid = self._next_uid, self._next_uid + 1
        self.scheduler.add_request(uid, ids, params, mm)
        return uid

    def _run(self, uids, token_lists, params, use_tqdm) -> list[GenerateOutput]:
        index = {uid: i for i, uid in enumerate(uids)}
        outputs = [
            GenerateOutput(ids, [], "", "length", [] if wants_logprobs(sp) else None)
            for ids, sp in zip(token_lists, params)
        ]
        detoks = [IncrementalDetokenizer(self.tokenizer, sp.stop) if self.tokenizer else None
                  for sp in params]
        show = use_tqdm if use_tqdm is not None else len(uids) >= 16
        bar = tqdm(total=len(uids), desc="Generating", unit="req", disable=not show)
        pending = set(uids)
        while pending:
            if self.scheduler.only_waiting:  # for a compiler
                time.sleep(WAITING_POLL_S)
            for tok in self.scheduler.step():
                if tok.uid not in pending:
                    continue
                i = index[tok.uid]
                if self._append(outputs[i], tok, detoks[i]):
                    pending.discard(tok.uid)
                    bar.update(1)
        self.scheduler.drain()  # a request stopped by a stop string may still have a step in flight
        while self.scheduler.idle():  # deferred work (suffix decoding learning the answers) is
            pass  # done before the next call: it may draft from them
        bar.close()
        if getattr(self.scheduler, "spec", None) is not None:
            logger.info(self.scheduler.spec.stats.line())  # cumulative over this LLM's runs
        return outputs

    def _append(self, out: GenerateOutput, tok: TokenOutput, detok) -> bool:
        """Record one token; True when the request is done (finished, or a stop string matched)."""
        if tok.prompt_logprobs is not None:
            out.prompt_logprobs = [TokenLogprob(*entry) for entry in tok.prompt_logprobs]
        if tok.token is None:  # max_tokens=0: the prompt only
            out.finish_reason = tok.finish_reason or "length"
            return True
        out.token_ids.append(tok.token)
        if out.logprobs is not None and tok.logprob is not None:
            out.logprobs.append(TokenLogprob(tok.token, tok.logprob, tok.top_logprobs or []))
        finish = tok.finish_reason
        if detok is not None:
            text, finish = detok.step(tok.token, finish)
            out.text += text
            if detok.stopped and tok.finish_reason is None:
                self.scheduler.abort(tok.uid)  # a stop string matched: the scheduler can stop
        if finish is not None:
            out.finish_reason = finish
        return finish is not None
