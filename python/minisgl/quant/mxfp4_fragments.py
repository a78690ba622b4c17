"""The fragment layout of MXFP4 experts: each thread of a Hopper wgmma tile loads, in one 16-byte
read, exactly the weights its A fragment holds (``kernel.triton.moe_mxfp4_frag``).

A wgmma's A fragment gives lane ``4 r + q`` of a warp rows ``r`` and ``r + 8`` of the warp's 16,
and in each 16-deep K chunk the value pairs ``2q, 2q + 1`` and ``2q + 8, 2q + 9``. Over a
64-deep K step that is 16 values of each of its two rows: four words of 8 values. In the word
layout (``mxfp4.to_words``) a thread's values lie in 8 bytes 4 apart, so the kernels loaded whole
groups and moved the decoded values between threads (shuffles and selects, a third of the K
loop's instructions). Here they are stored where the thread reads them::

    words  int32 [..., N/16, K/64, 8 (r), 4 (q), 4 (h, g)]   row 16 b + 8 h + r, K step s,
                                                              32-value group g of the step
    word (h, g) of lane (r, q): values v0 .. v7 = K 64 s + 32 g + (0, 1, 8, 9, 16, 17, 24, 25)
                                + 2 q, in the word layout's bit order (``to_words``)
    scales uint8 [..., N/16, K/64, 8 (r), 4 (h, g)]         the e8m0 scale of each word

so a warp's 512 bytes of a step are contiguous, and each word's scale is the byte its thread
reads beside it. N must be a multiple of 16, K of 64.
"""

from __future__ import annotations

import torch

from .mxfp4 import GROUP, from_words, to_words

ROWS, DEPTH = 16, 64  # a unit: one warp's rows and one K step


def fits_fragments(n: int, k: int) -> bool:
    """Whether the layout holds a matrix of ``n`` rows and ``k`` values a row: whole units."""
    return n % ROWS == 0 and k % DEPTH == 0


def _check(blocks: torch.Tensor, scales: torch.Tensor) -> tuple[int, int]:
    n, half_k = blocks.shape[-2:]
    k = 2 * half_k
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise ValueError("MXFP4 blocks and scales must be uint8")
    if not fits_fragments(n, k) or scales.shape[-2:] != (n, k // GROUP):
        raise ValueError(f"the fragment layout needs N a multiple of {ROWS} and K of {DEPTH} "
                         f"with one scale per {GROUP} values: blocks {tuple(blocks.shape)}, "
                         f"scales {tuple(scales.shape)}")
    return n, k


def _offsets(device: torch.device) -> torch.Tensor:
    """K offsets within a step of the 8 values of word (h, g) of lane (r, q): [q, g, 8]."""
    q = torch.arange(4, device=device).view(4, 1, 1)
    g = torch.arange(2, device=device).view(1, 2, 1)
    v = torch.tensor([0, 1, 8, 9, 16, 17, 24, 25], device=device).view(1, 1, 8)
    return 32 * g + v + 2 * q


def to_fragments(blocks: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Standard MXFP4 ``blocks [..., N, K/2]``, ``scales [..., N, K/32]`` -> the fragment
    layout's (bytes ``[..., N, K/2]``, scales ``[..., N, K/32]``): the same shapes and sizes,
    their contents in the order above (the shapes are a byte count, not rows)."""
    n, k = _check(blocks, scales)
    lead = blocks.shape[:-2]
    nib = torch.stack([blocks & 0x0F, blocks >> 4], dim=-1).reshape(*lead, n, k)
    # [..., N/16, 2 (h), 8 (r), K/64, 64] -> [..., N/16, K/64, r, q, h, g, 8 values]
    nib = nib.reshape(*lead, n // ROWS, 2, 8, k // DEPTH, DEPTH)
    off = _offsets(blocks.device)  # [q, g, 8]
    vals = nib[..., off]  # [..., N/16, 2, 8, K/64, q, g, 8]
    nd = len(lead)
    vals = vals.permute(*range(nd), nd, nd + 3, nd + 2, nd + 4, nd + 1, nd + 5, nd + 6)
    # [..., N/16, K/64, r, q, h, g, 8] -> standard bytes (value 2j low nibble, 2j + 1 high)
    pairs = vals.reshape(*vals.shape[:-1], 4, 2)
    plain = (pairs[..., 0] | (pairs[..., 1] << 4)).contiguous()
    words = to_words(plain.reshape(*lead, -1, 4)).reshape(*lead, n, k // 2)
    s = scales.reshape(*lead, n // ROWS, 2, 8, k // DEPTH, 2)  # [.., b, h, r, s, g]
    s = s.permute(*range(nd), nd, nd + 3, nd + 2, nd + 1, nd + 4)  # [.., b, s, r, h, g]
    return words, s.contiguous().reshape(*lead, n, k // GROUP)


def from_fragments(words: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The inverse of ``to_fragments``: standard (blocks, scales)."""
    n, k = _check(words, scales)
    lead = words.shape[:-2]
    nd = len(lead)
    plain = from_words(words.reshape(*lead, -1, 4)).reshape(*lead, n // ROWS, k // DEPTH, 8, 4,
                                                             2, 2, 4)
    vals = torch.stack([plain & 0x0F, plain >> 4], dim=-1).reshape(*plain.shape[:-1], 8)
    # [.., b, s, r, q, h, g, 8] -> nib [.., b, h, r, s, 64]
    nib = torch.zeros(*lead, n // ROWS, 2, 8, k // DEPTH, DEPTH, dtype=torch.uint8,
                      device=words.device)
    src = vals.permute(*range(nd), nd, nd + 4, nd + 2, nd + 1, nd + 3, nd + 5, nd + 6)
    nib[..., _offsets(words.device)] = src  # src [.., b, h, r, s, q, g, 8]
    nib = nib.reshape(*lead, n, k // 2, 2)
    blocks = nib[..., 0] | (nib[..., 1] << 4)
    s = scales.reshape(*lead, n // ROWS, k // DEPTH, 8, 2, 2)  # [.., b, s, r, h, g]
    s = s.permute(*range(nd), nd, nd + 3, nd + 2, nd + 1, nd + 4)  # [.., b, h, r, s, g]
    return blocks.contiguous(), s.contiguous().reshape(*lead, n, k // GROUP)
