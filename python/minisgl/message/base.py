"""Typed messages between processes, serialized with msgspec (msgpack).

Every channel has one base type; its concrete messages are tagged structs, so the decoder of a
channel knows exactly which classes may arrive and never looks a name up (nothing is unpickled).
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

import msgspec

T = TypeVar("T")


class Msg(msgspec.Struct, tag=True, kw_only=True, omit_defaults=True):
    """Base of every message: tagged with its class name."""


class Codec(Generic[T]):
    """Encoder/decoder of one channel: ``Codec(Union[A, B, ...])``."""

    def __init__(self, kind: Any) -> None:
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(kind)

    def encode(self, msg: T) -> bytes:
        return self._encoder.encode(msg)

    def decode(self, data: bytes) -> T:
        return self._decoder.decode(data)
