"""Fused-MoE tiles tuned per GPU and expert shape (``benchmark/kernels/tune_moe.py`` writes them).

One JSON file a (GPU, weight format, 2I, H): buckets of routed rows per expert (``T * top_k /
E``), each with the fastest configuration (``MoeConfig``'s fields) measured at one token count in
it. ``pick_config`` takes the bucket's tiles where a file matches and its own rule elsewhere; MXFP4
experts in the fragment layout have formats of their own (``mxfp4_fragments``, and
``mxfp4_gluon`` with the Gluon kernel's tiles), read by ``moe_mxfp4_frag.frag_tile`` before its
built-in table.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
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


@dataclass(frozen=True)
class MoeConfig:
    block_m: int
    block_n1: int  # columns of I per program in GEMM 1 (gate and up each)
    block_n2: int  # columns of H per program in GEMM 2
    block_k: int
    group_m: int = 8  # row blocks that walk the N tiles together, so their rows stay in L2
    num_warps: int = 4
    num_stages: int = 4
    # MXFP4 row blocks of 16 or 32 on the swapped-operand kernel too (``moe_gemm_mx_wide_kernel``;
    # None: from 64 rows, the default)
    swapped: bool | None = None
    # a cap on a thread's registers (ptxas's ``maxnreg``; None: none): more programs an SM where
    # the tile's registers, not its shared memory, limit them
    maxnreg: int | None = None
    # the fragment layout's Gluon GEMM (``moe_mxfp4_gluon``, with ``GluonFragmentScales``;
    # ``block_k`` and ``num_stages`` its stages of x), its units of words loaded ahead, its
    # GEMM 1's gate and up rows in separate warps (half the registers, ``block_n1 / 2`` outputs),
    # or row blocks of up to 8 on its mma.sync kernel (``moe_mxfp4_gluon_mma``); its words
    # through shared memory (``gluon_staged``: x's ring of stages; the mma.sync kernel's, a ring
    # of ``num_stages`` slots) instead of ``gluon_ahead`` units in registers; ``gluon_ws``: the
    # staged 128-row tile with its warps specialized (``moe_mxfp4_gluon_ws``: a copy warpgroup
    # and two MMA warpgroups, mbarriers instead of a CTA barrier a unit); ``gluon_halves``: each
    # unit's wgmma in two 32-deep halves, one decoded while the other runs (fewer registers live,
    # so a register cap leaves its wgmmas pipelined)
    gluon: bool = False
    gluon_ahead: int = 2
    gluon_split: bool = False
    gluon_mma: bool = False
    gluon_staged: bool = False
    gluon_ws: bool = False
    gluon_halves: bool = False


def pick_config(num_pairs: int, num_experts: int, mx: bool = False,
                key: tuple[str, int, int] | None = None, device: torch.device | None = None
                ) -> MoeConfig:
    """Block sizes by expected rows per expert: the tiles tuned for this GPU and ``key``
    (weight format, 2I, H) where ``moe_configs`` has them; else small blocks when each expert
    sees a few rows (decode is weight-bandwidth bound: more programs in flight), tensor-core
    sized tiles in prefill. MXFP4 keeps 16-row blocks longer: decoding, not the dot, bounds its
    small batches."""
    rows = num_pairs / num_experts  # picked from sweeps on an H100 (benchmark/kernels/bench_moe.py)
    if key is not None and device is not None:
        fields = tuned(rows, *key, device)
        if fields is not None:
            return MoeConfig(*fields)
    if mx and rows <= 16:  # an H200 sweep at gpt-oss-20b's shapes
        return MoeConfig(16, 32 if rows <= 4 else 64, 64, 256, 1, 4, 3)
    if mx:
        return MoeConfig(128 if rows > 128 else 64, 128, 128, 64, 8, 8 if rows > 128 else 4, 4)
    if rows <= 4:  # narrow GEMM-1 tiles: with T=1 there are only top_k row blocks to spread
        return MoeConfig(16, 32, 64, 256, 1, 4, 3)
    if rows <= 32:
        return MoeConfig(32, 64, 64, 128, 4, 4, 4)
    if rows <= 128:
        return MoeConfig(64, 128, 128, 64, 8, 4, 3)
    return MoeConfig(128, 128, 256, 64, 8, 8, 3)
