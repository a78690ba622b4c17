"""MXFP4 decoding inside Triton kernels (layout and torch reference: ``minisgl.quant.mxfp4``).

Bit operations instead of a table: a nibble's magnitude times 4 is an integer (``2m`` when the
exponent bits are 0, else ``(2 + m) << e``), and the group's scale ``2 ** (s - 127)``, divided by
that 4, is a float32 built from its exponent field, so a decoded value costs a few integer ops and
one multiply. Scales below ``2 ** -124`` (e8m0 < 3) flush to zero (no real weight group is that
small).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def e2m1_scaled(nib, s):
    """``nib`` (int32, 0..15) times ``2 ** (s - 127)`` (``s``: int32 e8m0), as float32."""
    e = (nib >> 1) & 3
    m = nib & 1
    mag4 = tl.where(e == 0, 2 * m, (2 + m) << e)
    quarter = tl.where(s >= 3, ((s - 2) << 23).to(tl.float32, bitcast=True), 0.0)
    val = mag4.to(tl.float32) * quarter
    return tl.where((nib & 8) != 0, -val, val)


@triton.jit
def decode_pair(packed, s, dtype: tl.constexpr):
    """A tile of packed bytes and its scales (same shape) -> (even values, odd values) in
    ``dtype``: the low and the high nibble of every byte."""
    b = packed.to(tl.int32)
    si = s.to(tl.int32)
    return e2m1_scaled(b & 15, si).to(dtype), e2m1_scaled(b >> 4, si).to(dtype)
