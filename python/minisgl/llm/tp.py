"""Tensor parallelism for the offline ``LLM``: the caller's process is rank 0, the other ranks are
child processes that mirror its scheduler.

Rank 0 records every request and abort as a backend message and broadcasts them before each step,
exactly as the server's rank 0 does, so every rank builds the same batches.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import socket

import torch

from minisgl.core import SamplingParams
from minisgl.distributed import DistributedInfo, set_rank_threads
from minisgl.message import BACKEND_CODEC, AbortBackendMsg, BatchBackendMsg, ExitMsg, UserMsg
from minisgl.multimodal.prompt import MultimodalPrompt
from minisgl.scheduler import Scheduler, SchedulerConfig, TokenOutput


def rank_config(config: SchedulerConfig, rank: int, size: int, addr: str) -> SchedulerConfig:
    device = config.engine.device
    if device.type == "cuda":
        device = torch.device("cuda", rank)
    engine = dataclasses.replace(config.engine, tp=DistributedInfo(rank, size), dist_init_addr=addr,
                                 device=device)
    return dataclasses.replace(config, engine=engine)


def _apply(scheduler: Scheduler, msg) -> bool:
    """Apply one broadcast message; False on exit."""
    if isinstance(msg, BatchBackendMsg):
        return all(_apply(scheduler, m) for m in msg.msgs)
    if isinstance(msg, UserMsg):
        scheduler.add_request(msg.uid, msg.input_ids, msg.sampling_params, msg.mm)
    elif isinstance(msg, AbortBackendMsg):
        scheduler.abort(msg.uid)
    elif isinstance(msg, ExitMsg):
        return False
    return True


def follower_main(config: SchedulerConfig, rank: int, size: int, addr: str) -> None:
    """A rank other than 0: receive, apply, step; forever, until rank 0 says exit."""
    from minisgl.utils.stacks import enable_stack_dumps

    enable_stack_dumps()  # kill -USR1 PID prints where a rank waits
    set_rank_threads(config.engine.device, size)
    scheduler = Scheduler(rank_config(config, rank, size, addr))
    comm = scheduler.engine.comm
    while _apply(scheduler, BACKEND_CODEC.decode(comm.broadcast_bytes(None))):
        if scheduler.has_work:
            scheduler.step()
        else:  # rank 0 broadcasts before its idle turns as before its steps
            scheduler.idle()
    scheduler.engine.close()  # rank 0 closes its engine at the same time


class TPScheduler:
    """Rank 0's scheduler plus the followers; the ``Scheduler`` methods the ``LLM`` uses."""

    def __init__(self, config: SchedulerConfig, size: int) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            addr = f"127.0.0.1:{s.getsockname()[1]}"
        ctx = mp.get_context("spawn")
        self.followers = [ctx.Process(target=follower_main, args=(config, r, size, addr),
                                      daemon=True)
                          for r in range(1, size)]
        for proc in self.followers:
            proc.start()
        self.inner = Scheduler(rank_config(config, 0, size, addr))
        self.comm = self.inner.engine.comm
        self._pending: list = []

    def __getattr__(self, name: str):
        return getattr(self.inner, name)  # engine, cache, eos_token_ids, check_integrity, ...

    def add_request(self, uid: int, input_ids: list[int], params: SamplingParams,
                    mm: MultimodalPrompt | None = None):
        # validates before anyone else sees it
        req = self.inner.add_request(uid, input_ids, params, mm)
        self._pending.append(UserMsg(uid=uid, input_ids=list(input_ids), sampling_params=params,
                                     mm=mm))
        return req

    def abort(self, uid: int) -> bool:
        self._pending.append(AbortBackendMsg(uid=uid))
        return self.inner.abort(uid)

    def step(self) -> list[TokenOutput]:
        self._broadcast()
        return self.inner.step()

    def idle(self) -> bool:
        self._broadcast()
        return self.inner.idle()

    def drain(self) -> list[TokenOutput]:
        # NOTE: draining rank 0 alone would let the ranks schedule from different states; the
        # forward in flight is read back by the next step, on every rank alike.
        return []

    def _broadcast(self) -> None:
        msgs, self._pending = self._pending, []
        self.comm.broadcast_bytes(BACKEND_CODEC.encode(BatchBackendMsg(msgs=msgs)))

    def close(self) -> None:
        if not self.followers:
            return
        self._pending.append(ExitMsg())
        self._broadcast()
        self.inner.engine.close()  # graphs, then the TP group, as every follower does now
        for proc in self.followers:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
        self.followers = []
