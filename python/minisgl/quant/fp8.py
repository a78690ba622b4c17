"""FP8 (e4m3) block quantization in plain torch: the format of the published FP8 checkpoints and the
reference every FP8 kernel is checked against.

Layout (``block = (bn, bk)``)::

    weight  q [N, K] float8_e4m3fn       w[n, k] ~= q[n, k] * scale_inv[n // bn, k // bk]
    scale_inv [cdiv(N, bn), cdiv(K, bk)] float32   (the checkpoint name: ``weight_scale_inv``)
    activation  xq [M, K] e4m3, xs [M, cdiv(K, bk)] float32: one scale per token and bk columns

Per-channel (``--quantization fp8`` on a bf16 checkpoint, the dynamic-FP8 layout of vLLM/SGLang)::

    weight  q [N, K] float8_e4m3fn       w[n, k] ~= q[n, k] * scale[n, 0]
    scale     [N, 1] float32              one scale per output channel (row); the block (1, K)
    activation  xq [M, K] e4m3, xs [M, 1] float32: one scale per token

Each scale maps its block's largest magnitude onto 448, e4m3's largest finite value, so nothing
saturates and the relative rounding error of every element is at most 2^-4 (3 mantissa bits).
Leading batch dimensions (the experts of an MoE layer) are allowed everywhere.
"""

from __future__ import annotations

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)  # 448
_TINY = 1e-12  # an all-zero block keeps a finite scale


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _blocks(w: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, int, int]:
    """``w [..., N, K]`` zero-padded to whole blocks and viewed as ``[..., N/bn, bn, K/bk, bk]``."""
    bn, bk = block
    n, k = w.shape[-2:]
    pad_n, pad_k = _cdiv(n, bn) * bn - n, _cdiv(k, bk) * bk - k
    w = torch.nn.functional.pad(w.float(), (0, pad_k, 0, pad_n))
    return w.view(*w.shape[:-2], _cdiv(n, bn), bn, _cdiv(k, bk), bk), n, k


def quantize_block(w: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """``w [..., N, K]`` -> (e4m3 ``[..., N, K]``,
    float32 ``scale_inv [..., cdiv(N,bn), cdiv(K,bk)]``)."""
    blocks, n, k = _blocks(w, block)
    amax = blocks.abs().amax(dim=(-3, -1), keepdim=True).clamp_min(_TINY)
    scale_inv = amax / FP8_MAX
    q = (blocks / scale_inv).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    q = q.view(*q.shape[:-4], q.shape[-4] * q.shape[-3], q.shape[-2] * q.shape[-1])
    return q[..., :n, :k].contiguous(), scale_inv.squeeze(-1).squeeze(-2).contiguous()


def dequantize_block(q: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int],
                     dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The inverse of ``quantize_block``: ``q * scale_inv`` broadcast over each block."""
    bn, bk = block
    n, k = q.shape[-2:]
    expected = (*q.shape[:-2], _cdiv(n, bn), _cdiv(k, bk))
    if tuple(scale_inv.shape) != expected:
        raise ValueError(f"weight_scale_inv: shape {tuple(scale_inv.shape)} does not match the "
                         f"weight {tuple(q.shape)} with block {list(block)} (expected {expected})")
    s = scale_inv.float().repeat_interleave(bn, dim=-2)[..., :n, :]
    s = s.repeat_interleave(bk, dim=-1)[..., :k]
    return (q.float() * s).to(dtype)


def quantize_channel(w: torch.Tensor, amax: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """``w [..., N, K]`` -> (e4m3 ``[..., N, K]``, float32 ``scale [..., N, 1]``): one scale per
    row. ``amax [..., N]``: the rows' largest magnitudes when ``w`` is a slice of them (a
    row-parallel shard quantized with the whole row's scale, so that every TP size holds the same
    values)."""
    w = w.float()
    if amax is None:
        amax = w.abs().amax(dim=-1)
    scale = amax.float().clamp_min(_TINY).unsqueeze(-1) / FP8_MAX
    q = (w / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q.contiguous(), scale.contiguous()


def dequantize_channel(q: torch.Tensor, scale: torch.Tensor,
                       dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The inverse of ``quantize_channel``: ``q * scale`` row by row."""
    if tuple(scale.shape) != (*q.shape[:-1], 1):
        raise ValueError(f"per-channel weight scale: shape {tuple(scale.shape)} does not match the "
                         f"weight {tuple(q.shape)} (expected {(*q.shape[:-1], 1)})")
    return (q.float() * scale.float()).to(dtype)


def channel_gemm_reference(xq: torch.Tensor, xs: torch.Tensor, wq: torch.Tensor,
                           ws: torch.Tensor) -> torch.Tensor:
    """fp32 ``(xq * xs) @ (wq * ws)^T`` with per-token ``xs [M, 1]`` and per-channel ``ws [N, 1]``:
    what ``torch._scaled_mm`` with row-wise scales computes, up to the order of the sums."""
    return (xq.float() * xs.float()) @ dequantize_channel(wq, ws).T


def quantize_groups(x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic activation quantization: ``x [M, K]`` -> (e4m3 ``[M, K]``,
    scales ``[M, cdiv(K, group)]``), one scale per token and ``group`` columns (the GEMM's K step),
    so an outlier spoils only its group."""
    m, k = x.shape
    pad = _cdiv(k, group) * group - k
    g = torch.nn.functional.pad(x.float(), (0, pad)).view(m, -1, group)
    scale = g.abs().amax(dim=-1, keepdim=True).clamp_min(_TINY) / FP8_MAX
    q = (g / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8).view(m, -1)[:, :k].contiguous()
    return q, scale.squeeze(-1)


def block_gemm_reference(xq: torch.Tensor, xs: torch.Tensor, wq: torch.Tensor,
                         ws: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """fp32 ``dequant(xq, xs) @ dequant(wq, ws)^T``: what the block-scaled GEMM computes, exactly
    up to the order of the fp32 sums."""
    bk = block[1]
    x = xq.float() * xs.float().repeat_interleave(bk, dim=-1)[:, : xq.shape[1]]
    return x @ dequantize_block(wq, ws, block).T


def quantize_kv(x: torch.Tensor, scale: float) -> torch.Tensor:
    """K or V into an FP8 cache: ``x / scale`` saturated to e4m3's range (a cast alone gives NaN
    above 448 on some builds)."""
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)
