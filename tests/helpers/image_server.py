"""The real app and the real tokenizer role (``tokenizer/roles.py``'s ``TokenizeRole``, with a
checkpoint's image preprocessing) in-process, a stand-in scheduler behind them that answers
every prompt with "ok". Enough to take images through every API down to the tokenizer worker's
output (``sent``: its ``UserMsg``s, images included) without starting an engine."""

from __future__ import annotations

import contextlib
import threading

from helpers.app_server import serve_app
from minisgl.llm.config import EngineOptions
from minisgl.message import (
    FRONTEND_CODEC,
    TOKENIZER_CODEC,
    BatchFrontendMsg,
    BatchTokenizerMsg,
    SchedulerStatsMsg,
    StatsReply,
    UserMsg,
    UserReply,
)
from minisgl.server.config import ServerConfig
from minisgl.utils.mp import (
    ServerAddrs,
    ZmqPullQueue,
    ZmqPushQueue,
)

MODEL = "tiny-vl"


class TokenizerThread(threading.Thread):
    def __init__(self, addrs: ServerAddrs, model_dir: str, config: ServerConfig) -> None:
        super().__init__(daemon=True)
        self.addrs, self.stopping = addrs, threading.Event()
        self.model_dir, self.config = model_dir, config
        self.seen: list = []  # the TokenizeMsgs, as the worker got them
        self.sent: list = []  # the UserMsgs the worker sent the scheduler

    def run(self) -> None:
        from minisgl.multimodal.processor import ImageProcessor
        from minisgl.tokenizer.roles import TokenizeRole
        from minisgl.utils.hf import load_tokenizer

        tokenizer = load_tokenizer(self.model_dir)
        images = ImageProcessor.for_model(self.model_dir, tokenizer, self.config.media)
        role = TokenizeRole(tokenizer, None, images)
        pull = ZmqPullQueue(self.addrs.tokenizer, bind=False, codec=TOKENIZER_CODEC)
        push = ZmqPushQueue(self.addrs.frontend, bind=False, codec=FRONTEND_CODEC)
        push.put(StatsReply(stats=SchedulerStatsMsg(  # a warm scheduler's first word
            num_running=0, num_waiting=0, num_aborted=0, num_retractions=0, kv_used_tokens=0,
            kv_total_tokens=1000, cache_hit_tokens=0, max_context_len=4096, ready=True)))
        while not self.stopping.is_set():
            msg = pull.get(timeout_ms=20)
            msgs = msg.msgs if isinstance(msg, BatchTokenizerMsg) else [msg] if msg else []
            self.seen += msgs
            front, back = role.handle(msgs)
            for reply in back:  # the scheduler and detokenizer's part: one "ok" per prompt
                if isinstance(reply, UserMsg):
                    self.sent.append(reply)
                    front.append(UserReply(uid=reply.uid, text="ok", token_ids=[7],
                                           finish_reason="stop",
                                           prompt_tokens=len(reply.input_ids)))
            if front:
                push.put(BatchFrontendMsg(msgs=front))
        pull.close()
        push.close()


@contextlib.contextmanager
def image_server(model_dir: str, **options):
    """``options``: ServerConfig's (the media limits)."""
    config = ServerConfig(model=model_dir, served_model_name=MODEL,
                          engine=EngineOptions(device="cpu"), **options)
    with serve_app(config, lambda addrs: TokenizerThread(addrs, model_dir, config),
                   model_path=model_dir) as srv:
        yield srv
