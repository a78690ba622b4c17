"""Host lists to device tensors in one transfer."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def to_device(segments: Sequence[Sequence[float]], dtype: torch.dtype,
              device: torch.device) -> list[torch.Tensor]:
    """One 1-D tensor on ``device`` per host list, all sent in a single (pinned, non-blocking) copy.

    Every tensor starts 16-byte aligned: Triton specialises compiled kernels on pointer alignment,
    so views at arbitrary offsets would compile new kernel variants in the middle of a run.
    """
    align = max(1, 16 // dtype.itemsize)
    flat: list[float] = []
    spans = []
    for values in segments:
        spans.append((len(flat), len(values)))
        flat.extend(values)
        flat.extend([0] * (-len(flat) % align))
    host = torch.tensor(flat, dtype=dtype, pin_memory=device.type == "cuda")
    dev = host.to(device, non_blocking=True)
    return [dev[start : start + n] for start, n in spans]
