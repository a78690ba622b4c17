"""Typed ZMQ PUSH/PULL queues over ``ipc://`` addresses private to one launch, and those addresses
(``ServerAddrs``: the launcher, the API server and the tokenizer workers all read them).

The binding side owns the address; any number of peers may connect (several tokenizer workers push
to the one scheduler, for instance). A queue carries the messages of one channel codec only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Generic, TypeVar

import zmq
import zmq.asyncio

from minisgl.message import Codec

from .runtime_dir import make_runtime_dir, remove_runtime_dir  # noqa: F401 (launchers' names)

T = TypeVar("T")


def ipc_address(runtime_dir: str, name: str) -> str:
    return f"ipc://{os.path.join(runtime_dir, name)}"


@dataclass(frozen=True)
class ServerAddrs:
    """ZMQ addresses of one launch (inside its private runtime directory).

    tokenizer: API (binds, PUSH) -> tokenizer workers (PULL)
    backend: tokenizer workers and detokenizer (PUSH) -> scheduler rank 0 (binds, PULL)
    detokenizer: scheduler rank 0 (PUSH) -> detokenizer (binds, PULL)
    frontend: tokenizer workers and detokenizer (PUSH) -> API (binds, PULL)
    """

    runtime_dir: str
    tokenizer: str
    backend: str
    detokenizer: str
    frontend: str

    @classmethod
    def create(cls, runtime_dir: str) -> ServerAddrs:
        names = ("tokenizer", "backend", "detokenizer", "frontend")
        return cls(runtime_dir, *(ipc_address(runtime_dir, n) for n in names))


class _Queue(Generic[T]):
    def __init__(self, ctx: zmq.Context, kind: int, addr: str, bind: bool, codec: Codec[T]) -> None:
        self.codec = codec
        self.socket = ctx.socket(kind)
        self.socket.setsockopt(zmq.LINGER, 0)
        (self.socket.bind if bind else self.socket.connect)(addr)

    def close(self) -> None:
        self.socket.close(linger=0)


class ZmqPushQueue(_Queue[T]):
    def __init__(self, addr: str, bind: bool, codec: Codec[T]) -> None:
        super().__init__(zmq.Context.instance(), zmq.PUSH, addr, bind, codec)

    def put(self, msg: T) -> None:
        self.socket.send(self.codec.encode(msg), copy=False)


class ZmqPullQueue(_Queue[T]):
    def __init__(self, addr: str, bind: bool, codec: Codec[T]) -> None:
        super().__init__(zmq.Context.instance(), zmq.PULL, addr, bind, codec)

    def get(self, timeout_ms: int | None = None) -> T | None:
        """The next message; None if none arrives within ``timeout_ms`` (None waits forever)."""
        if timeout_ms is not None and not self.socket.poll(timeout_ms):
            return None
        return self.codec.decode(self.socket.recv(copy=False).buffer)

    def get_all_nowait(self) -> list[T]:
        msgs = []
        while self.socket.poll(0):
            msgs.append(self.codec.decode(self.socket.recv(copy=False).buffer))
        return msgs


class ZmqAsyncPushQueue(_Queue[T]):
    def __init__(self, addr: str, bind: bool, codec: Codec[T]) -> None:
        super().__init__(zmq.asyncio.Context.instance(), zmq.PUSH, addr, bind, codec)

    async def put(self, msg: T) -> None:
        await self.socket.send(self.codec.encode(msg), copy=False)


class ZmqAsyncPullQueue(_Queue[T]):
    def __init__(self, addr: str, bind: bool, codec: Codec[T]) -> None:
        super().__init__(zmq.asyncio.Context.instance(), zmq.PULL, addr, bind, codec)

    async def get(self) -> T:
        frame = await self.socket.recv(copy=False)
        return self.codec.decode(frame.buffer)
