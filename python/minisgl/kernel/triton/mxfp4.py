"""MXFP4 decoding inside Triton kernels (layout and torch reference: ``minisgl.quant.mxfp4``).

A nibble ``s e1 e0 m`` becomes a float32 by bit placement alone: its sign to bit 31, its three
magnitude bits to bits 22-24 (exponent's lowest two bits and the mantissa's first). That float is
the e2m1 value times ``2 ** -126`` (``e0 = e1 = 0, m = 1`` lands on the subnormal ``2 ** -127``,
0.5's image), so one multiply by ``2 ** 126`` gives the exact value, and the group's e8m0 scale
``2 ** (s - 127)``, a float32 built from its exponent field, multiplies a tile of partial sums
(small batches) or the weights (prefill tiles). A byte costs about six integer operations for
its two values; read as 32-bit words (``decode_nibble``), a value costs two shifts and two masks.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def decode_pair(packed, dtype: tl.constexpr):
    """Packed bytes (any shape) -> (values of the low nibbles, of the high nibbles) in ``dtype``,
    unscaled (exact: e2m1 values are representable in bf16, fp16 and fp32)."""
    b = packed.to(tl.int32)
    lo = ((b & 7) << 22) | ((b & 8) << 28)
    hi = ((b & 0x70) << 18) | ((b & 0x80) << 24)
    two126: tl.constexpr = 8.507059173023462e37
    return ((lo.to(tl.float32, bitcast=True) * two126).to(dtype),
            (hi.to(tl.float32, bitcast=True) * two126).to(dtype))


@triton.jit
def decode_nibble(words, j: tl.constexpr):
    """Value ``j`` (bits ``4j .. 4j + 3``, K order: a byte's low nibble first) of 32-bit words
    (any shape) as float32, unscaled, by the same bit placement as ``decode_pair``: two shifts
    by constants and two masks a value, no conversion of the byte first."""
    if j < 6:
        mag = (words << (22 - 4 * j)) & 0x01C00000
    else:
        mag = (words >> (4 * j - 22)) & 0x01C00000
    sign = (words << (28 - 4 * j)) & -2147483648  # bit 31
    two126: tl.constexpr = 8.507059173023462e37
    return (mag | sign).to(tl.float32, bitcast=True) * two126


@triton.jit
def e8m0(s):
    """e8m0 scales (uint8) -> ``2 ** (s - 127)`` in float32 (``s = 0``, ``2 ** -127``, flushes to
    zero: no weight group is that small)."""
    return (s.to(tl.int32) << 23).to(tl.float32, bitcast=True)
