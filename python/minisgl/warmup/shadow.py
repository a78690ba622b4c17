"""Shadow runs: the engine's own code on fake tensors, its Triton launches recorded, not run.

Which kernel variants a forward compiles depends on shapes, dtypes and the launchers' choices,
never on values. Under ``shadow_mode`` every tensor made is a fake one (torch's ``FakeTensorMode``:
shape, dtype and device, no storage, no kernel runs), real tensors the code touches are read as
fakes (nothing real is written), and every Triton launch is recorded as a ``Variant``
(``variants.record_launches``). So the set of variants of a model's forwards and of the sampler is
computed from the config alone, on any machine, in about a second of CPU time: on a GPU server
beside the loading of the weights, in tests on a CPU.

A CPU-only build of torch has fake CUDA tensors but cannot move a host tensor to them, index
them from Python or answer device queries: ``shadow_mode`` turns host-to-device copies into fresh
fake tensors (and pins no host memory), indexes through aten ops, on every machine alike, and
where no GPU is present answers device queries from ``ShadowTarget`` (an H200 unless told).
Everything here is confined to the calling thread: another thread loading weights meanwhile runs
for real.
"""

from __future__ import annotations

import threading
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Iterator

import torch
from torch.overrides import TorchFunctionMode

from .variants import Recording, record_launches


@dataclass(frozen=True)
class ShadowTarget:
    """The GPU a shadow run stands for where none is present (the capability and SM count are
    what the launchers ask)."""

    name: str = "NVIDIA H200"
    capability: tuple[int, int] = (9, 0)
    sm_count: int = 132
    total_memory: int = 140 << 30

    @classmethod
    def current(cls, device: torch.device) -> ShadowTarget:
        props = torch.cuda.get_device_properties(device)
        return cls(props.name, (props.major, props.minor), props.multi_processor_count,
                   props.total_memory)


_local = threading.local()
_patch_lock = threading.Lock()
_patched = False


def _target() -> ShadowTarget | None:
    return getattr(_local, "target", None)


def _install_device_queries() -> None:
    """``torch.cuda``'s device queries answer from the calling thread's ``ShadowTarget`` when it
    has one (a CPU-only build has no device to ask)."""
    global _patched
    with _patch_lock:
        if _patched:
            return
        props, capability = torch.cuda.get_device_properties, torch.cuda.get_device_capability

        def get_device_properties(device=None):
            t = _target()
            if t is None:
                return props(device)
            return SimpleNamespace(name=t.name, major=t.capability[0], minor=t.capability[1],
                                   multi_processor_count=t.sm_count, total_memory=t.total_memory)

        def get_device_capability(device=None):
            t = _target()
            return capability(device) if t is None else t.capability

        torch.cuda.get_device_properties = get_device_properties
        torch.cuda.get_device_capability = get_device_capability
        _patched = True


def _cuda_device(value) -> bool:
    try:
        return value is not None and torch.device(value).type == "cuda"
    except (RuntimeError, TypeError):
        return False


def _getitem(x: torch.Tensor, index) -> torch.Tensor:
    """``x[index]`` through aten ops (a CPU-only torch cannot index a fake CUDA tensor in
    Python): basic indexing first, then the tensors of advanced indexing at their dimensions."""
    index = index if isinstance(index, tuple) else (index,)
    if any(i is Ellipsis for i in index):
        at = index.index(Ellipsis)
        used = sum(i is not None for i in index if i is not Ellipsis)
        index = index[:at] + (slice(None),) * (x.dim() - used) + index[at + 1:]
    dim, advanced = 0, []
    for i in index:
        if i is None:
            x = x.unsqueeze(dim)
            advanced.append(None)
            dim += 1
        elif isinstance(i, int) and not isinstance(i, bool):
            x = torch.ops.aten.select(x, dim, i)
        elif isinstance(i, slice):
            x = torch.ops.aten.slice(x, dim, i.start, i.stop, i.step or 1)
            advanced.append(None)
            dim += 1
        else:
            t = i if isinstance(i, torch.Tensor) else torch.tensor(i, device=x.device)
            advanced.append(t)
            dim += 1
    if any(t is not None for t in advanced):
        x = torch.ops.aten.index(x, advanced)
    return x


class _HostCopiesToFakes(TorchFunctionMode):
    """A CPU-only torch under ``FakeTensorMode``: a host tensor sent to the GPU becomes a fresh
    fake CUDA tensor of its shape and dtype (values do not matter in a shadow run), pinned
    memory is ordinary memory, and the Python indexing and copies that such a torch refuses on
    fake CUDA tensors go through aten ops (a write into a fake changes nothing to record)."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device = device  # the GPU a bare "cuda" means

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        name = getattr(func, "__name__", "")
        kwargs.pop("pin_memory", None)
        if name == "pin_memory" and args:
            return args[0]
        if name == "__getitem__":
            return _getitem(*args)
        if name in ("__setitem__", "copy_"):
            return args[0] if name == "copy_" else None
        if name in ("contiguous", "clone") and isinstance(args[0], torch.Tensor):
            x = args[0]
            if name == "contiguous" and x.is_contiguous():
                return x
            return torch.empty(x.shape, dtype=x.dtype, device=x.device)
        if name in ("to", "cuda") and args and isinstance(args[0], torch.Tensor):
            src = args[0]
            target = kwargs.get("device")
            rest = args[1:]
            dtype = kwargs.get("dtype", src.dtype)
            for a in rest:
                if isinstance(a, torch.dtype):
                    dtype = a
                elif isinstance(a, torch.Tensor):
                    target, dtype = a.device, a.dtype
                elif target is None and a is not None and not isinstance(a, bool):
                    target = a
            if name == "cuda":
                target = "cuda"
            if src.device.type == "cpu" and target is not None and _cuda_device(target):
                device = torch.device(target)
                device = self.device if device.index is None else device
                return torch.empty(src.shape, dtype=dtype, device=device)
        return func(*args, **kwargs)


@contextmanager
def shadow_mode(target: ShadowTarget | None = None,
                device: torch.device = torch.device("cuda", 0)) -> Iterator[Recording]:
    """Inside: fake tensors (on ``device``), Triton launches recorded (the recording is yielded),
    device queries answered by ``target`` (default: an H200 where no GPU is present; the real GPU
    otherwise)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    _install_device_queries()
    no_gpu = not torch.cuda.is_available()
    if target is None and no_gpu:
        target = ShadowTarget()
    outer = _target()
    _local.target = target
    try:
        with ExitStack() as stack:
            rec = stack.enter_context(record_launches())
            stack.enter_context(FakeTensorMode(allow_non_fake_inputs=True))
            # on a GPU too: the same run on every machine (and no host memory pinned)
            stack.enter_context(_HostCopiesToFakes(device))
            yield rec
    finally:
        _local.target = outer
