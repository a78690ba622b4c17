"""Counter-based randomness of the sampler: a uniform per ``(seed, step, vocab index)``.

A splitmix64 hash evaluated with vectorised int64 ops turns each triple into a uniform, so a draw
depends on nothing but its own request's seed and step (no per-request ``torch.Generator``). The
Triton kernels (``kernels/row.py``: ``draw_state``, ``log_e``) compute the same hash.
"""

from __future__ import annotations

import torch


def wrap_i64(value: int) -> int:
    """Wrap a Python int into int64 two's complement, the way torch's int64 arithmetic wraps."""
    return (value + (1 << 63)) % (1 << 64) - (1 << 63)


_GOLDEN = wrap_i64(0x9E3779B97F4A7C15)
_MIX1 = wrap_i64(0xBF58476D1CE4E5B9)
_MIX2 = wrap_i64(0x94D049BB133111EB)


def _shr(x: torch.Tensor, shift: int) -> torch.Tensor:
    """Logical right shift: torch's ``>>`` on int64 is arithmetic, so mask the copied sign bits."""
    return (x >> shift) & ((1 << (64 - shift)) - 1)


def _mix64(z: torch.Tensor) -> torch.Tensor:
    """splitmix64 finaliser (a bijection on 64 bits); mutates ``z``, which callers own."""
    z.bitwise_xor_(_shr(z, 30)).mul_(_MIX1)
    z.bitwise_xor_(_shr(z, 27)).mul_(_MIX2)
    return z.bitwise_xor_(_shr(z, 31))


def random_uniform(seeds: torch.Tensor, steps: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Uniforms in (0, 1), shape [B, V], from a counter-based hash of (seed, step, index).

    Row ``b`` seeds a splitmix64 stream at ``mix(mix(seed + G) + (step + 1) * G)`` and index
    ``i`` is its ``i``-th output, so a value depends on nothing but its own triple. The top 63
    bits become a float32 through an int->float conversion, which keeps full relative precision
    near 0: the race needs ``E = -log1p(-u)`` accurate for tiny E, where unlikely tokens win.
    """
    row = _mix64(seeds.to(torch.int64) + _GOLDEN)
    row = _mix64(row + (steps.to(torch.int64) + 1) * _GOLDEN)
    idx = torch.arange(1, vocab_size + 1, dtype=torch.int64, device=seeds.device)
    h = _mix64(idx.mul_(_GOLDEN).unsqueeze(0) + row.unsqueeze(1))
    u = _shr(h, 1).to(torch.float32).mul_(2.0**-63).add_(2.0**-64)
    return u.clamp_(max=1.0 - 2.0**-24)  # values within 2**-25 of 1 round to 1.0 in float32
