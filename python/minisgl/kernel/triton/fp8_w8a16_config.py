"""The tiles of the W8A16 and W8A8 FP8 GEMMs (``fp8_w8a16``): rules fitted to
``benchmark/kernels/bench_fp8_small.py --sweep`` on an H100, not autotuning (the layers run inside
CUDA-graph capture). The rules count programs against the device's SMs, so another GPU still fills
its own.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton


@dataclass(frozen=True)
class W8A16Config:
    block_m: int
    block_n: int
    block_k: int = 128
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 4


SMS = 132  # an H100's (and H200's) SMs: what the rules below were fitted on


@functools.lru_cache(maxsize=None)
def sm_count(device: torch.device) -> int:
    """The device's SMs, for the split-K and M-tile rules (another GPU than the H100 they were
    fitted on still fills its own SMs)."""
    return torch.cuda.get_device_properties(device).multi_processor_count


def pick_config(m: int, n: int, k: int, gated: bool = False, x_bytes: int = 2,
                sms: int = SMS) -> W8A16Config:
    """Fitted to ``bench_fp8_small.py --sweep`` on an H100 (Qwen3-8B's layers, M = 4, 16, 64, 128;
    the chosen tiles are the best or within ~10% of it). One M tile up to 128 tokens (more: several
    M tiles, whose programs share each weight tile through L2). 64-row N tiles with 4 warps; 128
    rows with 8 warps at <= 8 tokens, and for a gated input beyond 16 (its SiLU-and-mul is
    recomputed by every N tile). Split-K up to 4, as long as there are at most ~4 programs per
    SM: a program streams its weight at only ~7 GB/s (per-warp latency of the e4m3 -> bf16
    operand path), so the small layers need many programs. fp32 activations (tests, fp32 models)
    take half as deep K steps and two stages to fit in shared memory. e4m3 activations
    (``x_bytes=1``) take ``_w8a8_config``. ``sms``: the device's SMs."""
    if x_bytes == 1:
        return _w8a8_config(m, n, sms)
    block_m = min(128, max(16, triton.next_power_of_2(m)))
    block_n, warps = (128, 8) if m <= 8 or gated and m > 16 else (64, 4)
    block_k, stages = (128, 3) if x_bytes == 2 else (64, 2)
    tiles = triton.cdiv(n, block_n) * triton.cdiv(m, block_m)
    split = 4
    while split > 1 and (tiles * split > 4 * sms or k // (block_k * split) < 4):
        split //= 2
    return W8A16Config(block_m, block_n, block_k, split, warps, stages)


def _w8a8_config(m: int, n: int, sms: int) -> W8A16Config:
    """The W8A8 form's tiles, from ``bench_fp8_small.py --sweep w8a8`` and ``w8a8-wide`` (H100,
    Qwen3-8B's layers, M = 64, 128, 256: each choice the best of its (layer, M) or within 2% of
    it). No split. While the 64-row N tiles make at most one wave, the tokens are cut into as many
    M tiles as still fit in it (o and down at 64-128 tokens: 128 programs, not 64; up to 11%
    faster) and a program streams 256-deep K steps through 4-5 stages; more tiles (gate-up; qkv
    at 256 tokens) take 128-deep steps, with 128-row tiles and 8 warps beyond one M tile.

    Larger tiles over split K, which read x from L2 fewer times, are slower (the partials' sum
    costs more than the re-reads save). At 8-32 tokens these tiles are within 2% of the best of a
    sweep that adds 32- and 128-row N tiles and split K (``bench_fp8_small.py --sweep
    w8a8-small``)."""
    tiles_n = triton.cdiv(n, 64)
    block_m = min(128, max(16, triton.next_power_of_2(m)))
    while block_m > 16 and tiles_n * triton.cdiv(m, block_m // 2) <= sms:
        block_m //= 2
    if tiles_n * triton.cdiv(m, block_m) <= sms:
        return W8A16Config(block_m, 64, 256, 1, 4, 5 if block_m <= 64 else 4)
    if m <= block_m:
        return W8A16Config(block_m, 64, 128, 1, 4, 3)
    return W8A16Config(block_m, 128, 128, 1, 8, 5)
