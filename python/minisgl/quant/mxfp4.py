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
"""

from __future__ import annotations

import torch

GROUP = 32  # values per e8m0 scale
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
    groups = w.float().reshape(*w.shape[:-1], k // GROUP, GROUP)
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
