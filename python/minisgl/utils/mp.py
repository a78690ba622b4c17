"""Typed ZMQ PUSH/PULL queues over ``ipc://`` addresses private to one launch.

The binding side owns the address; any number of peers may connect (several tokenizer workers push
to the one scheduler, for instance). A queue carries the messages of one channel codec only.
"""

from __future__ import annotations

import os
from typing import Generic, TypeVar

import zmq
import zmq.asyncio

from minisgl.message import Codec

from .runtime_dir import make_runtime_dir, remove_runtime_dir  # noqa: F401 (launchers' names)

T = TypeVar("T")


def ipc_address(runtime_dir: str, name: str) -> str:
    return f"ipc://{os.path.join(runtime_dir, name)}"


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
