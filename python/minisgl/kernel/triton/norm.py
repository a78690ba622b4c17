"""RMSNorm and fused residual-add + RMSNorm.

Rounding follows the torch reference (``layers/norm.py``, Hugging Face semantics) step by step, so a
bf16 model gives the same bits as the reference up to the fp32 reduction order: the residual add is
rounded to the input dtype, the normalisation runs in fp32 and is rounded to the input dtype, and the
weight multiply is rounded once more. Each program normalises ``ROWS`` rows, so short rows (per-head
q/k norms, head_dim 128) still give every program enough work.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl
from .pdl import wait_then_release


@triton.jit
def _rmsnorm_kernel(
    x_ptr, res_ptr, w_ptr, y_ptr, res_out_ptr,
    n_rows, n_inner, stride_x0, stride_x1, stride_r, stride_y, stride_ro, dim, eps,
    HAS_RES: tl.constexpr, ROWS: tl.constexpr, BLOCK_D: tl.constexpr, USE_PDL: tl.constexpr,
):
    wait_then_release(USE_PDL)
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_D)
    row_ok = rows < n_rows
    mask = row_ok[:, None] & (cols < dim)[None, :]
    rows = tl.where(row_ok, rows, 0).to(tl.int64)
    # x may be a strided 3-D view [outer, inner, dim] (q/k heads sliced out of the fused QKV output)
    x_off = (rows // n_inner) * stride_x0 + (rows % n_inner) * stride_x1
    x = tl.load(x_ptr + x_off[:, None] + cols[None, :], mask=mask, other=0.0)
    if HAS_RES:
        r = tl.load(res_ptr + rows[:, None] * stride_r + cols[None, :], mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(res_out_ptr + rows[:, None] * stride_ro + cols[None, :], x, mask=mask)
    xf = x.to(tl.float32)
    rstd = tl.math.rsqrt(tl.sum(xf * xf, axis=1) / dim + eps)
    normed = (xf * rstd[:, None]).to(x_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=cols < dim, other=0.0).to(tl.float32)
    y = (normed * w[None, :]).to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + rows[:, None] * stride_y + cols[None, :], y, mask=mask)


def _launch(x: torch.Tensor, weight: torch.Tensor, eps: float,
            residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    dim = x.shape[-1]
    assert x.stride(-1) == 1 and weight.shape == (dim,), "last dimension must be contiguous"
    out_dtype = torch.promote_types(x.dtype, weight.dtype)
    y = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    if x.dim() == 3 and residual is None:  # keep strided per-head views without a copy
        n_inner, s0, s1 = x.shape[1], x.stride(0), x.stride(1)
        xs = x
    else:
        xs = x.reshape(-1, dim)
        n_inner, s0, s1 = 1, xs.stride(0), 0
    n_rows = x.numel() // dim
    res_out = None
    if residual is not None:
        residual = residual.reshape(-1, dim)
        assert residual.stride(-1) == 1
        res_out = torch.empty((n_rows, dim), dtype=x.dtype, device=x.device)
    block_d = triton.next_power_of_2(dim)
    rows = max(1, min(16, 2048 // block_d))
    warps = min(16, max(4, block_d * rows // 1024))
    if n_rows:
        _rmsnorm_kernel[(triton.cdiv(n_rows, rows),)](
            xs, residual if residual is not None else xs, weight, y,
            res_out if res_out is not None else y,
            n_rows, n_inner, s0, s1,
            residual.stride(0) if residual is not None else 0, dim,
            res_out.stride(0) if res_out is not None else 0, dim, eps,
            HAS_RES=residual is not None, ROWS=rows, BLOCK_D=block_d, num_warps=warps,
            **pdl.launch_options(x),
        )
    return y, (res_out.view(x.shape) if res_out is not None else None)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * norm(x)`` over the last dimension; x is 2-D or 3-D (may be a strided view)."""
    return _launch(x, weight, eps, None)[0]


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(norm(x + residual), x + residual)`` in one pass; both outputs are new tensors."""
    y, res = _launch(x, weight, eps, residual)
    assert res is not None
    return y, res
