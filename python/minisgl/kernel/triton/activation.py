"""SiLU-and-mul: ``silu(gate) * up`` for ``x = [gate | up]`` on the last dimension.

Rounded like the torch reference (silu's result in the input dtype, then the product), so bf16
outputs match it bit for bit up to the exp implementation.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def silu_mul(gate, up, dt):
    """``silu(gate) * up`` of fp32 values, rounded to ``dt`` after each op as the torch reference
    is (the SiLU, then the product); in ``dt``. Every kernel that applies SiLU-and-mul calls it."""
    return ((gate / (1.0 + tl.exp(-gate))).to(dt).to(tl.float32) * up).to(dt)


@triton.jit
def gelu_tanh_mul(gate, up, dt):
    """``gelu(gate, approximate="tanh") * up`` of fp32 values (Gemma's gated MLPs), rounded as
    ``silu_mul`` is. ``0.5 * (1 + tanh(y)) == sigmoid(2 * y)``, so the GELU is
    ``gate * sigmoid(2 * y)`` with ``y = sqrt(2 / pi) * (gate + 0.044715 * gate ** 3)``."""
    y2 = 1.5957691216057308 * (gate + 0.044715 * gate * gate * gate)
    return ((gate / (1.0 + tl.exp(-y2))).to(dt).to(tl.float32) * up).to(dt)


@triton.jit
def _silu_and_mul_kernel(x_ptr, y_ptr, n_cols, stride_x, stride_y, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    dt = y_ptr.dtype.element_ty
    g = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + row * stride_x + n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * stride_y + cols, silu_mul(g, u, dt), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [..., 2I] -> [..., I]; the last dimension must be contiguous."""
    two_i = x.shape[-1]
    assert two_i % 2 == 0 and x.stride(-1) == 1
    inter = two_i // 2
    x2 = x.reshape(-1, two_i)
    y = torch.empty((x2.shape[0], inter), dtype=x.dtype, device=x.device)
    if x2.shape[0]:
        block = min(1024, triton.next_power_of_2(inter))
        _silu_and_mul_kernel[(x2.shape[0], triton.cdiv(inter, block))](
            x2, y, inter, x2.stride(0), y.stride(0), BLOCK=block, num_warps=4
        )
    return y.view(*x.shape[:-1], inter)
