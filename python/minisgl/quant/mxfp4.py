"""MXFP4 (OCP microscaling, as gpt-oss's checkpoints store their experts): the torch reference.

Layout of a weight ``[..., N, K]`` (N output rows, K the reduction dimension, a multiple of 32):

```
blocks  uint8 [..., N, K/2]   byte j of a row: value 2j in the low nibble, 2j+1 in the high one
scales  uint8 [..., N, K/32]  e8m0: the 32 values k in [32g, 32g + 32) are scaled by 2**(s - 127)
```

A nibble is e2m1: sign bit, two exponent bits (bias 1), one mantissa bit, so its magnitudes are
0, 0.5, 1, 1.5, 2, 3, 4, 6. The checkpoint keeps the blocks as ``[..., N, K/32, 16]``; the engine
flattens the last two dimensions. The Triton GEMM (``kernel.triton.fused_moe``) decodes the
nibbles with bit operations; this module is what it is checked against, and what CPU runs.

The word layout (``to_words``): the fused MoE's kernels read each little-endian 32-bit word of a
row (8 values, ``v0 .. v7`` in K order) with its bits permuted once at load time, so that every
bf16 pair its decoding makes is the word rotated and masked: a value's magnitude bits ``m e0 e1``
must land on bits 6-8 of a 16-bit half and its sign on bit 15 (``kernel.triton.mxfp4``'s bf16
placement), and the permutation puts each pair of values where one rotation brings them there::

    pair (low half, high half)   register            storage bits (m, e0, e1, s of each value)
    (v0, v1)                     W & M               6 7 8 15      22 23 24 31
    (v2, v3)                     rotl(W, 26) & M     12 13 14 21   28 29 30 5
    (v4, v5)                     rotl(W, 4) & M      2 3 4 11      18 19 20 27
    (v6, v7)                     rotl(W, 6) & M'     0 1 10 9      16 17 26 25
                                 | rotl(W, 30) & M''

with ``M = 0x81C081C0``; the last pair's exponent bits come through a second rotation
(``M' = 0x80C080C0``, ``M'' = 0x01000100``), since no rotation lands all of its bits.
"""

from __future__ import annotations

import torch

GROUP = 32  # values per e8m0 scale
# the word layout: WORD_BITS[v][r] is the storage bit of value v's bit r (m, e0, e1, s: the
# nibble's bits 0-3) in a word of 8 values; the table above, by value
WORD_BITS = ((6, 7, 8, 15), (22, 23, 24, 31), (12, 13, 14, 21), (28, 29, 30, 5),
             (2, 3, 4, 11), (18, 19, 20, 27), (0, 1, 10, 9), (16, 17, 26, 25))
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
               -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
# rounding boundaries between consecutive magnitudes (0.25 lies between 0 and 0.5, ...)
_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_EMAX = 2  # exponent of e2m1's largest value (6 = 1.5 * 2**2)


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor,
                     dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``blocks [..., N, K/2]``, ``scales [..., N, K/32]`` -> ``[..., N, K]`` in ``dtype``
    (exact: every e2m1 value times a power of two is representable in float32)."""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise ValueError(f"MXFP4 blocks and scales must be uint8, got {blocks.dtype} and "
                         f"{scales.dtype}")
    k = blocks.shape[-1] * 2
    if scales.shape[-1] * GROUP != k or blocks.shape[:-1] != scales.shape[:-1]:
        raise ValueError(f"MXFP4 scales {tuple(scales.shape)} do not match blocks "
                         f"{tuple(blocks.shape)} (one scale per {GROUP} values)")
    lut = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=blocks.device)
    values = torch.stack([lut[(blocks & 0x0F).long()], lut[(blocks >> 4).long()]], dim=-1)
    values = values.reshape(*blocks.shape[:-1], k // GROUP, GROUP)
    out = torch.ldexp(values, (scales.to(torch.int32) - 127).unsqueeze(-1).float())
    return out.reshape(*blocks.shape[:-1], k).to(dtype)


def quantize_mxfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``w [..., N, K]`` -> (blocks, scales) as above, the OCP recipe: each group of 32 shares
    ``2 ** (floor(log2(amax)) - 2)`` and every value rounds to the nearest e2m1 (saturating at
    6). Used for random MXFP4 weights (``--dummy-weights``); the tests quantize on their own."""
    k = w.shape[-1]
    if k % GROUP:
        raise ValueError(f"MXFP4 rows must be a multiple of {GROUP} values long, got {k}")
    groups = w.float().contiguous().reshape(*w.shape[:-1], k // GROUP, GROUP)
    amax = groups.abs().amax(dim=-1, keepdim=True)
    exp = torch.where(amax > 0, torch.floor(torch.log2(amax)) - _EMAX, torch.full_like(amax, -127))
    exp = exp.clamp(-127, 127)
    scaled = groups / torch.exp2(exp)
    bounds = torch.tensor(_MIDPOINTS, device=w.device)
    codes = torch.bucketize(scaled.abs(), bounds).to(torch.uint8)  # magnitude 0..7, saturating
    codes |= (scaled < 0).to(torch.uint8) << 3
    codes = codes.reshape(*w.shape[:-1], k // 2, 2)
    blocks = codes[..., 0] | (codes[..., 1] << 4)
    scales = (exp.squeeze(-1) + 127).to(torch.uint8)
    return blocks.contiguous(), scales.contiguous()


def _moves(inverse: bool) -> list[tuple[int, int]]:
    """The word layout as (mask of source bits, left shift) moves, one per distinct distance
    (a dozen whole-tensor operations, not one per bit); ``inverse``: storage to standard."""
    moves: dict[int, int] = {}
    for v, bits in enumerate(WORD_BITS):
        for r, stored in enumerate(bits):
            src, dst = (stored, 4 * v + r) if inverse else (4 * v + r, stored)
            moves[dst - src] = moves.get(dst - src, 0) | (1 << src)
    return sorted((mask, shift) for shift, mask in moves.items())


def _permute_words(blocks: torch.Tensor, inverse: bool) -> torch.Tensor:
    if blocks.dtype != torch.uint8 or blocks.shape[-1] % 4:
        raise ValueError(f"MXFP4 words: uint8 rows of whole 4-byte words expected, got "
                         f"{blocks.dtype} {tuple(blocks.shape)}")
    b = blocks.to(torch.int64).reshape(*blocks.shape[:-1], -1, 4)
    words = b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16) | (b[..., 3] << 24)
    out = torch.zeros_like(words)
    for mask, shift in _moves(inverse):
        part = words & mask
        out |= part << shift if shift >= 0 else part >> -shift
    out = torch.stack([(out >> (8 * i)) & 0xFF for i in range(4)], dim=-1)
    return out.to(torch.uint8).reshape(blocks.shape)


def to_words(blocks: torch.Tensor) -> torch.Tensor:
    """Standard MXFP4 bytes ``[..., K/2]`` -> the word layout (the same shape; bytes 4i .. 4i + 3
    of a row are word i, little-endian). Rows of a whole number of words: K a multiple of 8."""
    return _permute_words(blocks, inverse=False)


def from_words(words: torch.Tensor) -> torch.Tensor:
    """The inverse of ``to_words``."""
    return _permute_words(words, inverse=True)
