"""MXFP4 decoding inside Triton kernels (layout and torch reference: ``minisgl.quant.mxfp4``).

A nibble ``s e1 e0 m`` becomes a float32 by bit placement alone: its sign to bit 31, its three
magnitude bits to bits 22-24 (exponent's lowest two bits and the mantissa's first). That float is
the e2m1 value times ``2 ** -126`` (``e0 = e1 = 0, m = 1`` lands on the subnormal ``2 ** -127``,
0.5's image), so one multiply by ``2 ** 126`` gives the exact value, and the group's e8m0 scale
``2 ** (s - 127)``, a float32 built from its exponent field, multiplies a tile of partial sums
(small batches) or the weights (prefill tiles). A byte costs about six integer operations for
its two values. Read as 32-bit words (``pair_bits``), two values (4 apart) cost a shift to the
tops of the word's halves, a shift and two masks (a bf16 pair) and two operations to widen it.

On Hopper, bf16 tiles decode in PTX (``decode_bf16``): four bytes spread over two registers
(``prmt``) put each nibble at the top of a 16-bit half, a shift and two masks place two values at
once, and one packed bf16 multiply (``mul.rn.bf16x2``) scales them: fewer instructions than the
float32 path and its conversion.
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
def pair_bits(words, j: tl.constexpr):
    """Values ``j`` and ``j + 4`` (``j < 4``; value ``i`` at bits ``4i .. 4i + 3``, K order: a
    byte's low nibble first) of 32-bit words (any shape) as float32 times ``2 ** -126``, two at a
    time: one shift puts both nibbles at the tops of the words' 16-bit halves, where a shift and
    two masks make the bf16 pair (``decode_bf16``'s placement), which widens exactly to float32
    (the low value shifted up, the high one masked). A caller that scales its sums anyway folds
    the ``2 ** 126`` in there (the MoE GEMV)."""
    t = words << (12 - 4 * j)
    pair = ((t >> 6) & 0x01C001C0) | (t & -2147450880)  # sign bits 15 and 31: 0x80008000
    lo = (pair << 16).to(tl.float32, bitcast=True)
    hi = (pair & -65536).to(tl.float32, bitcast=True)  # the low half cleared: 0xFFFF0000
    return lo, hi


@triton.jit
def e8m0(s):
    """e8m0 scales (uint8) -> ``2 ** (s - 127)`` in float32 (``s = 0``, ``2 ** -127``, flushes to
    zero: no weight group is that small)."""
    return (s.to(tl.int32) << 23).to(tl.float32, bitcast=True)


# bf16 ``2 ** 126``, twice: the multiplier that makes ``decode_bf16``'s values the e2m1 values
BF16X2_TWO126 = tl.constexpr(0x7E807E80)


def _place(src: str, out: str, mult: str) -> str:
    """PTX: the nibbles at bits 12-15 and 28-31 of ``src`` -> bf16 pair ``out``, times ``mult``."""
    return (f"shr.b32 a, {src}, 6;\nand.b32 a, a, 0x01C001C0;\nand.b32 b, {src}, 0x80008000;\n"
            f"or.b32 a, a, b;\nmul.rn.bf16x2 {out}, a, {mult};\n")


# outputs $0, $1: the low nibbles of bytes 0-1, 2-3; $2, $3: the high ones; $4: the four bytes;
# $5-$8: each byte's multiplier pair (the pairs' low halves, joined as the values are)
_DECODE_BF16 = tl.constexpr(
    "{\n.reg .b32 t, u, a, b, m, n;\n"
    "prmt.b32 m, $5, $6, 0x5410;\nprmt.b32 n, $7, $8, 0x5410;\n"
    "prmt.b32 t, $4, 0, 0x1404;\nprmt.b32 u, $4, 0, 0x3424;\n"  # bytes 0, 1 (2, 3) at 8, 24
    + _place("t", "$2", "m") + _place("u", "$3", "n")
    + "shl.b32 t, t, 4;\nshl.b32 u, u, 4;\n"  # the low nibbles up to where the high ones were
    + _place("t", "$0", "m") + _place("u", "$1", "n") + "}")


@triton.jit
def decode_bf16(packed, mult):
    """Packed bytes (uint8, any shape) -> (values of the low nibbles, of the high nibbles) in
    bf16, each times ``2 ** -126`` times ``mult`` (int32 of the same shape, every element a
    bf16 pair ``(m, m)``'s bits: ``BF16X2_TWO126`` for the e2m1 values, ``bf16x2_pow2`` for a
    group's scale). Hopper only (``mul.bf16x2``; the Triton interpreter runs no PTX).

    Four bytes a step: ``prmt`` puts bytes 0 and 1 (2 and 3) at the top of the halves of one
    register, so each high nibble sits at bits 12-15 of its half: its sign is in place, a shift
    by 6 puts its magnitude on the bf16 exponent's two lowest bits and the mantissa's first
    (``decode_pair``'s placement, halved), and a shift by 4 first does the same for the low
    nibbles. The product is exact (powers of two; e2m1's 0.5 is bf16's subnormal ``2 ** -127``
    before it, which the multiply keeps)."""
    return tl.inline_asm_elementwise(
        _DECODE_BF16, "=r,=r,=r,=r,r,r,r,r,r", [packed, mult],
        dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4)


@triton.jit
def bf16x2_pow2(exponent):
    """int32 exponents ``e`` -> the bits of the bf16 pair ``(2 ** e, 2 ** e)`` (``decode_bf16``'s
    ``mult``); ``e`` within bf16's normal range, -126 .. 127."""
    bits = (exponent + 127) << 7
    return bits | (bits << 16)
