"""Fused-MoE tiles tuned per GPU and expert shape (``benchmark/kernels/tune_moe.py`` writes them).

One JSON file a (GPU, weight format, 2I, H): buckets of routed rows per expert (``T * top_k /
E``), each with the fastest configuration measured at one token count in it. ``fused_moe``'s
``pick_config`` takes the bucket's tiles where a file matches and its own rule elsewhere; MXFP4
experts in the fragment layout have formats of their own (``mxfp4_fragments``, and
``mxfp4_gluon`` with the Gluon kernel's tiles), read by ``moe_mxfp4_frag.frag_tile`` before its
built-in table.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

import torch

DIR = Path(__file__).parent


def file_name(gpu: str, fmt: str, n: int, k: int) -> str:
    """``fmt``: ``bf16`` | ``fp8`` | ``mxfp4``; ``n`` = 2I (gate and up rows), ``k`` = H."""
    slug = re.sub(r"[^A-Za-z0-9]+", "-", gpu).strip("-").lower()
    return f"{slug}_{fmt}_N{n}_K{k}.json"


@functools.cache
def _buckets(device: torch.device, fmt: str, n: int, k: int
             ) -> tuple[tuple[float, tuple], ...] | None:
    """The table of this GPU and shape, read once (``fused_moe`` asks on every call)."""
    path = DIR / file_name(torch.cuda.get_device_name(device), fmt, n, k)
    if not path.exists():
        return None
    rows = json.loads(path.read_text())["buckets"]
    return tuple((float(b["max_rows"]), tuple(b["config"])) for b in rows)


def tuned(rows: float, fmt: str, n: int, k: int, device: torch.device) -> tuple | None:
    """The tuned tiles (``MoeConfig``'s fields in order) for ``rows`` per expert, or None (no
    table, or rows beyond its last bucket: a tuning its budget cut short)."""
    if device.type != "cuda":
        return None
    buckets = _buckets(device, fmt, n, k)
    if buckets is None:
        return None
    return next((cfg for top, cfg in buckets if rows <= top), None)
