"""Whether the calling thread runs under torch's ``FakeTensorMode`` (a shadow run of the kernel
warm-up, ``minisgl.warmup``, on another thread than the engine's): a tensor computed there is a
fake, which a cache shared with the real engine must keep apart from real ones."""

from __future__ import annotations

import torch


def faking() -> bool:
    return torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is not None
