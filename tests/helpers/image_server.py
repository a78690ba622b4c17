"""The real app and the real tokenizer role (``tokenizer/server.py``'s ``_TokenizeRole``, with a
checkpoint's image preprocessing) in-process, a stand-in scheduler behind them that answers
every text prompt with "ok". Enough to take images through every API down to the tokenizer
worker's output without starting an engine."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

import uvicorn

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
from minisgl.server.app.api_server import create_app
from minisgl.server.config import ServerConfig
from minisgl.server.openai.frontend import FrontendManager
from minisgl.utils.mp import (
    ServerAddrs,
    ZmqPullQueue,
    ZmqPushQueue,
    make_runtime_dir,
    remove_runtime_dir,
)

MODEL = "tiny-vl"


class TokenizerThread(threading.Thread):
    def __init__(self, addrs: ServerAddrs, model_dir: str, config: ServerConfig) -> None:
        super().__init__(daemon=True)
        self.addrs, self.stopping = addrs, threading.Event()
        self.model_dir, self.config = model_dir, config
        self.seen: list = []  # the TokenizeMsgs, as the worker got them

    def run(self) -> None:
        from minisgl.multimodal.processor import ImageProcessor
        from minisgl.tokenizer.server import _TokenizeRole
        from minisgl.utils.hf import load_tokenizer

        tokenizer = load_tokenizer(self.model_dir)
        images = ImageProcessor.for_model(self.model_dir, tokenizer, self.config.media)
        role = _TokenizeRole(tokenizer, None, images)
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
                    front.append(UserReply(uid=reply.uid, text="ok", token_ids=[7],
                                           finish_reason="stop",
                                           prompt_tokens=len(reply.input_ids)))
            if front:
                push.put(BatchFrontendMsg(msgs=front))
        pull.close()
        push.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def image_server(model_dir: str, **options):
    """``options``: ServerConfig's (the media limits)."""
    runtime = make_runtime_dir()
    addrs = ServerAddrs.create(runtime)
    config = ServerConfig(model=model_dir, served_model_name=MODEL,
                          engine=EngineOptions(device="cpu"), **options)
    app = create_app(config, lambda: FrontendManager(addrs), model_path=model_dir,
                     server_info={"processes": {}})
    port = _free_port()
    http = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=http.run, daemon=True)
    thread.start()
    worker = TokenizerThread(addrs, model_dir, config)
    worker.start()
    deadline = time.monotonic() + 30
    while not http.started and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        yield type("Srv", (), {"url": f"http://127.0.0.1:{port}", "app": app,
                               "worker": worker})
    finally:
        http.should_exit = True
        thread.join(10)
        worker.stopping.set()
        worker.join(5)
        remove_runtime_dir(runtime)
