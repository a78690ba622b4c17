"""The word layout of MXFP4 experts (``quant.mxfp4.to_words``) and its decoding in the kernels
(``kernel.triton.mxfp4``): the table is a permutation, the conversion round-trips, and every code
at every position of a word decodes to its e2m1 value: by a torch emulation of the rotations and
masks, by the portable Triton decoding (interpreted without a GPU) and, on Hopper, by the PTX one.
"""

from __future__ import annotations

import pytest
import torch

from helpers import mxfp4 as ref_mx
from helpers.interpreter import import_triton

triton = import_triton()
tl = triton.language

from minisgl.kernel.triton.mxfp4 import (  # noqa: E402
    bf16x2_pow2,
    decode_words,
    decode_words_bf16,
    widen,
    word_pairs,
)
from minisgl.quant.mxfp4 import WORD_BITS, dequantize_mxfp4, from_words, to_words  # noqa: E402

pytestmark = pytest.mark.any_device
DEV = "cuda" if torch.cuda.is_available() else "cpu"
M = 0x81C081C0


def every_code_everywhere() -> torch.Tensor:
    """Standard bytes [16, 16]: row i holds code (i + p) % 16 at value position p, so every code
    sits at every position of every word (a row is 4 words, one 32-value group)."""
    codes = (torch.arange(16)[:, None] + torch.arange(32)[None, :]) % 16
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)


def recipe(words: torch.Tensor) -> torch.Tensor:
    """The kernels' decoding in torch: int64 words (0 .. 2**32 - 1) -> their 8 values [..., 8],
    each bf16 pair the word rotated and masked, widened to float32, times ``2 ** 126``."""
    def rotl(r):
        return ((words << r) | (words >> (32 - r))) & 0xFFFFFFFF

    pairs = (words & M, rotl(26) & M, rotl(4) & M,
             (rotl(6) & 0x80C080C0) | (rotl(30) & 0x01000100))
    positions = ((0, 1), (2, 3), (4, 5), (6, 7))
    out = torch.empty(*words.shape, 8, dtype=torch.float64)
    for pair, (lo, hi) in zip(pairs, positions):
        for half, v in ((pair & 0xFFFF, lo), (pair >> 16, hi)):
            bits = (half << 16).to(torch.int64)
            bits = torch.where(bits >= 2**31, bits - 2**32, bits).to(torch.int32)
            out[..., v] = bits.view(torch.float32).double() * 2.0**126
    return out


def int_words(blocks: torch.Tensor) -> torch.Tensor:
    """Little-endian words of bytes [..., 4k] as int64 [..., k]."""
    b = blocks.to(torch.int64).reshape(*blocks.shape[:-1], -1, 4)
    return b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16) | (b[..., 3] << 24)


def test_the_table_is_a_permutation_and_the_layout_round_trips():
    assert sorted(bit for bits in WORD_BITS for bit in bits) == list(range(32))
    blocks = torch.randint(0, 256, (3, 7, 48), dtype=torch.uint8,
                           generator=torch.Generator().manual_seed(0))
    words = to_words(blocks)
    assert words.shape == blocks.shape and not torch.equal(words, blocks)
    assert torch.equal(from_words(words), blocks)
    with pytest.raises(ValueError, match="whole 4-byte words"):
        to_words(blocks[..., :6])


def test_the_recipe_decodes_every_code_at_every_position():
    """The rotations and masks of ``mxfp4.word_pairs`` on ``to_words``' output give back what
    ``dequantize_mxfp4`` reads from the standard bytes, bit for bit (signed zeros included)."""
    blocks = every_code_everywhere()
    expected = dequantize_mxfp4(blocks, torch.full((16, 1), 127, dtype=torch.uint8))
    got = recipe(int_words(to_words(blocks))).reshape(16, 32)
    assert torch.equal(got.float(), expected)
    assert torch.equal(torch.signbit(got), torch.signbit(expected))
    assert torch.equal(expected, ref_mx.VALUES[(torch.arange(16)[:, None]
                                                + torch.arange(32)[None, :]) % 16])


@triton.jit
def _decode_kernel(words_ptr, lo_ptr, hi_ptr, pairs_ptr):
    """16 groups: their values by ``decode_words``, and the GEMV's ``word_pairs`` widened."""
    offs = tl.arange(0, 16)[:, None] * 4 + tl.arange(0, 4)[None, :]
    words = tl.load(words_ptr + offs)
    lo, hi = decode_words(words, tl.float32)
    out = tl.arange(0, 16)[:, None] * 16 + tl.arange(0, 16)[None, :]
    tl.store(lo_ptr + out, lo)
    tl.store(hi_ptr + out, hi)
    pairs = word_pairs(words)
    for j in tl.static_range(4):
        a, b = widen(pairs[j])
        tl.store(pairs_ptr + offs * 8 + 2 * j, a * 8.507059173023462e37)
        tl.store(pairs_ptr + offs * 8 + 2 * j + 1, b * 8.507059173023462e37)


def test_the_triton_decoding_every_code_at_every_position():
    """``decode_words`` (the tiles' float32 decoding): element c of (even, odd) is value 2c,
    2c + 1 of the group; ``word_pairs`` (the GEMV's): the pairs (v0, v1), (v2, v3), (v4, v5),
    (v6, v7) of each word."""
    blocks = every_code_everywhere()
    expected = dequantize_mxfp4(blocks, torch.full((16, 1), 127, dtype=torch.uint8))
    words = to_words(blocks).view(torch.int32).to(DEV)
    lo = torch.empty(16, 16, device=DEV)
    hi, pairs = torch.empty_like(lo), torch.empty(16, 4, 8, device=DEV)
    _decode_kernel[(1,)](words, lo, hi, pairs)
    assert torch.equal(lo.cpu(), expected[:, 0::2]) and torch.equal(hi.cpu(), expected[:, 1::2])
    by_pair = expected.reshape(16, 4, 8)
    assert torch.equal(pairs.cpu(), by_pair)


@triton.jit
def _decode_bf16_kernel(words_ptr, exp_ptr, lo_ptr, hi_ptr):
    offs = tl.arange(0, 64)[:, None] * 4 + tl.arange(0, 4)[None, :]
    mult = bf16x2_pow2(tl.load(exp_ptr + tl.arange(0, 64)))
    lo, hi = decode_words_bf16(tl.load(words_ptr + offs),
                               tl.broadcast_to(mult[:, None], (64, 4)))
    out = tl.arange(0, 64)[:, None] * 16 + tl.arange(0, 16)[None, :]
    tl.store(lo_ptr + out, lo)
    tl.store(hi_ptr + out, hi)


@pytest.mark.gpu
def test_gpu_decode_words_bf16_every_code_and_multiplier():
    """``mxfp4.decode_words_bf16`` (the tiles' PTX decoding on Hopper): every code at every
    position, each group with its own power-of-two multiplier (the wide tiles' scales times
    ``2 ** -64``, and ``2 ** 126``, which gives the e2m1 values), exactly."""
    blocks = every_code_everywhere().repeat(4, 1)
    exponents = torch.tensor([126, 1, 40, 60, 85, 17, 3, 33])[torch.arange(64) % 8]
    lo = torch.empty(64, 16, dtype=torch.bfloat16, device="cuda")
    hi = torch.empty_like(lo)
    _decode_bf16_kernel[(1,)](to_words(blocks).view(torch.int32).cuda(),
                              exponents.int().cuda(), lo, hi)
    values = dequantize_mxfp4(blocks, torch.full((64, 1), 127, dtype=torch.uint8)).double()
    values = values * torch.pow(2.0, exponents.double() - 126)[:, None]
    assert torch.equal(lo.double().cpu(), values[:, 0::2])
    assert torch.equal(hi.double().cpu(), values[:, 1::2])
