"""MXFP4 decoding inside Triton kernels (layout and torch reference: ``minisgl.quant.mxfp4``).

A nibble ``s e1 e0 m`` becomes a float32 by bit placement alone: its sign to bit 31, its three
magnitude bits to bits 22-24 (exponent's lowest two bits and the mantissa's first). That float is
the e2m1 value times ``2 ** -126`` (``e0 = e1 = 0, m = 1`` lands on the subnormal ``2 ** -127``,
0.5's image), so one multiply by ``2 ** 126`` gives the exact value, and the group's e8m0 scale
``2 ** (s - 127)``, a float32 built from its exponent field, multiplies a whole tile of partial
sums instead of every weight. A byte costs about six integer operations for its two values.
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
def e8m0(s):
    """e8m0 scales (uint8) -> ``2 ** (s - 127)`` in float32 (``s = 0``, ``2 ** -127``, flushes to
    zero: no weight group is that small)."""
    return (s.to(tl.int32) << 23).to(tl.float32, bitcast=True)


@triton.jit
def decode_pair_bf16(packed):
    """``decode_pair`` into bf16, two values per instruction: each 32-bit register of four bytes
    is spread into 16-bit lanes (``prmt``), the nibbles' bits land in bf16's sign, exponent and
    mantissa bits for two values at a time, and one packed multiply by ``2 ** 126`` makes them
    exact (e2m1's 0.5 is bf16's subnormal ``2 ** -127`` before it). CUDA only (inline PTX)."""
    return tl.inline_asm_elementwise(
        asm="""
        {
        .reg .b32 t<2>, m, s, v, two126, nzero;
        mov.b32 two126, 0x7E807E80;
        mov.b32 nzero, 0x80008000;
        prmt.b32 t0, $4, 0, 0x4140;
        prmt.b32 t1, $4, 0, 0x4342;
        and.b32 m, t0, 0x00070007; shl.b32 m, m, 6; and.b32 s, t0, 0x00080008; shl.b32 s, s, 12;
        or.b32 v, m, s; fma.rn.bf16x2 $0, v, two126, nzero;
        and.b32 m, t1, 0x00070007; shl.b32 m, m, 6; and.b32 s, t1, 0x00080008; shl.b32 s, s, 12;
        or.b32 v, m, s; fma.rn.bf16x2 $1, v, two126, nzero;
        and.b32 m, t0, 0x00700070; shl.b32 m, m, 2; and.b32 s, t0, 0x00800080; shl.b32 s, s, 8;
        or.b32 v, m, s; fma.rn.bf16x2 $2, v, two126, nzero;
        and.b32 m, t1, 0x00700070; shl.b32 m, m, 2; and.b32 s, t1, 0x00800080; shl.b32 s, s, 8;
        or.b32 v, m, s; fma.rn.bf16x2 $3, v, two126, nzero;
        }
        """,
        constraints="=r,=r,=r,=r,r",
        args=[packed],
        dtype=(tl.bfloat16, tl.bfloat16),
        is_pure=True,
        pack=4,
    )
