"""MXFP4 decoding inside Triton kernels (layouts and torch reference: ``minisgl.quant.mxfp4``).

A nibble ``s e1 e0 m`` becomes a float32 by bit placement alone: its sign to bit 31, its three
magnitude bits to bits 22-24 (exponent's lowest two bits and the mantissa's first). That float is
the e2m1 value times ``2 ** -126`` (``e0 = e1 = 0, m = 1`` lands on the subnormal ``2 ** -127``,
0.5's image), so one multiply by ``2 ** 126`` gives the exact value, and the group's e8m0 scale
``2 ** (s - 127)``, a float32 built from its exponent field, multiplies a tile of partial sums
(small batches) or the weights (prefill tiles). The same placement in a 16-bit half (bits 6-8
and 15) is a bf16.

The fused MoE reads its experts in the word layout (``quant.mxfp4.to_words``): a 32-bit word's
bits permuted at load time so that each bf16 pair of its 8 values is the word rotated and
masked (``word_pairs``), with no per-value shifts. The pairs widen to float32 exactly (the low
half shifted up, the high one masked), or, for bf16 tiles on Hopper, are scaled in place by one
packed multiply (``mul.rn.bf16x2``, ``decode_words_bf16``).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _rotl(w, r: tl.constexpr):
    return (w << r) | (w >> (32 - r))


@triton.jit
def word_pairs(words):
    """Words in the word layout (int32, any shape) -> the bits of their bf16 pairs (uint32),
    each value times ``2 ** -126``: (v0, v1), (v2, v3), (v4, v5), (v6, v7), the first of each
    in the low half (``quant.mxfp4``'s table): a register holds two values adjacent in K, as an
    MMA operand register does."""
    w = words.to(tl.uint32, bitcast=True)
    return (w & 0x81C081C0, _rotl(w, 26) & 0x81C081C0, _rotl(w, 4) & 0x81C081C0,
            (_rotl(w, 6) & 0x80C080C0) | (_rotl(w, 30) & 0x01000100))


@triton.jit
def widen(pair):
    """bf16 pairs' bits (uint32) -> (the low halves, the high halves) in float32, exactly."""
    return (pair << 16).to(tl.float32, bitcast=True), (pair & 0xFFFF0000).to(tl.float32,
                                                                              bitcast=True)


@triton.jit
def by_byte(v0, v2, v4, v6):
    """One value of each byte of a group's words, by value (``[..., 4]`` each, the word last)
    -> ``[..., 16]`` in byte order (element c holds value 2c, or 2c + 1)."""
    joined = tl.join(tl.join(v0, v4), tl.join(v2, v6))  # [..., word, a, b]: value 4a + 2b
    return tl.reshape(joined, v0.shape[:-1] + (16,))


@triton.jit
def decode_words(words, dtype: tl.constexpr):
    """A group's words (int32 ``[..., 4]``, the word layout) -> (even values, odd values)
    ``[..., 16]`` in ``dtype``, unscaled (exact: e2m1 values are representable in bf16, fp16 and
    fp32)."""
    two126: tl.constexpr = 8.507059173023462e37
    p0, p1, p2, p3 = word_pairs(words)
    v0, v1 = widen(p0)
    v2, v3 = widen(p1)
    v4, v5 = widen(p2)
    v6, v7 = widen(p3)
    return ((by_byte(v0, v2, v4, v6) * two126).to(dtype),
            (by_byte(v1, v3, v5, v7) * two126).to(dtype))


@triton.jit
def e8m0(s):
    """e8m0 scales (uint8) -> ``2 ** (s - 127)`` in float32 (``s = 0``, ``2 ** -127``, flushes to
    zero: no weight group is that small)."""
    return (s.to(tl.int32) << 23).to(tl.float32, bitcast=True)


# bf16 ``2 ** 126``, twice: the multiplier that makes ``decode_words_bf16``'s values the e2m1
# values
BF16X2_TWO126 = tl.constexpr(0x7E807E80)


# outputs $0-$7: values 0 .. 7 of the word $8 (one bf16 each), times the pair $9
DECODE_WORDS_BF16 = tl.constexpr(
    "{\n.reg .b32 p, r, t;\n"
    "and.b32 p, $8, 0x81C081C0;\nmul.rn.bf16x2 p, p, $9;\nmov.b32 {$0, $1}, p;\n"
    "shf.l.wrap.b32 r, $8, $8, 26;\nand.b32 p, r, 0x81C081C0;\nmul.rn.bf16x2 p, p, $9;\n"
    "mov.b32 {$2, $3}, p;\n"
    "shf.l.wrap.b32 r, $8, $8, 4;\nand.b32 p, r, 0x81C081C0;\nmul.rn.bf16x2 p, p, $9;\n"
    "mov.b32 {$4, $5}, p;\n"
    "shf.l.wrap.b32 r, $8, $8, 6;\nshf.l.wrap.b32 t, $8, $8, 30;\nand.b32 r, r, 0x80C080C0;\n"
    "and.b32 t, t, 0x01000100;\nor.b32 p, r, t;\nmul.rn.bf16x2 p, p, $9;\n"
    "mov.b32 {$6, $7}, p;\n}")


@triton.jit
def decode_words_bf16(words, mult):
    """A group's words (int32 ``[..., 4]``, the word layout) -> (even values, odd values)
    ``[..., 16]`` in bf16, each times ``2 ** -126`` times ``mult`` (int32 ``[..., 4]``, a bf16
    pair ``(m, m)``'s bits a word: ``BF16X2_TWO126``, or ``bf16x2_pow2`` of the group's scale),
    in PTX (Hopper's ``mul.rn.bf16x2``). A word a call (``pack=1``): the compiler orders a
    thread's elements as the dot operand wants (rows may alternate before bytes do), so four
    bytes packed into one call are not always a word; a word is. Each pair is one rotation
    (``shf.l.wrap``) and a mask, or two and an and-or for ``(v6, v7)``, then one multiply; a
    value and the next (even, odd) share a register, which the tiles join back into K order."""
    v = tl.inline_asm_elementwise(
        DECODE_WORDS_BF16, "=h,=h,=h,=h,=h,=h,=h,=h,r,r", [words, mult],
        dtype=(tl.bfloat16,) * 8, is_pure=True, pack=1)
    return by_byte(v[0], v[2], v[4], v[6]), by_byte(v[1], v[3], v[5], v[7])


@triton.jit
def bf16x2_pow2(exponent):
    """int32 exponents ``e`` -> the bits of the bf16 pair ``(2 ** e, 2 ** e)``
    (``decode_words_bf16``'s ``mult``); ``e`` within bf16's normal range, -126 .. 127."""
    bits = (exponent + 127) << 7
    return bits | (bits << 16)
