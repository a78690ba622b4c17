"""RMSNorm and fused residual-add + RMSNorm.

Rounding follows the torch reference (``layers/norm.py``, Hugging Face semantics) step by step, so a
bf16 model gives the same bits as the reference up to the fp32 reduction order: the residual add is
rounded to the input dtype, the normalisation runs in fp32 and is rounded to the input dtype, and
the weight multiply is rounded once more. Each program normalises ``ROWS`` rows, so short rows
(per-head q/k norms, head_dim 128) still give every program enough work.

``rms_norm_quant``: the norm of a layer whose input an FP8 W8A8 GEMM quantizes per token also
quantizes its output (``fp8_quant.quantize_tokens``' arithmetic on the rounded row, held whole in
registers), one kernel instead of two.

The other families' conventions, rounded as their references (``layers/norm.py::RMSNorm``,
``layers/gated_delta.py::gated_rms_norm``):
``fp32`` (Gemma, the hybrid checkpoints): ``norm(x) * w`` in fp32 and rounded once; ``offset``
with it: weights stored centred on zero, ``(1 + w)``; no weight (Gemma 4's v and router norms):
the normalised x alone; ``add``: ``add + norm(x)`` rounded as the reference's add of two rounded
tensors (Gemma's sandwich norms, the block's output normalised as it joins the stream), times a
one-element ``mult`` after it where given (Gemma 4's layer scalar, rounded again);
``gated_rms_norm``: ``(w * norm(x)) * silu(gate)``, the gate a strided per-head view.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl as pdl_
from .fp8_quant import fp8_scale, saturate
from .pdl import wait_then_release


@triton.jit(do_not_specialize=["n_rows"])  # a bound only: one variant for every row count
def _rmsnorm_kernel(
    x_ptr, res_ptr, w_ptr, y_ptr, res_out_ptr, s_ptr, g_ptr, m_ptr,
    n_rows, n_inner, stride_x0, stride_x1, stride_r, stride_y, stride_ro, dim, eps,
    g_inner, stride_g0, stride_g1,
    HAS_RES: tl.constexpr, QUANT: tl.constexpr, ROWS: tl.constexpr, BLOCK_D: tl.constexpr,
    USE_PDL: tl.constexpr, FP32: tl.constexpr = False, OFFSET: tl.constexpr = False,
    HAS_W: tl.constexpr = True, POST_ADD: tl.constexpr = False, GATE: tl.constexpr = False,
    POST_MULT: tl.constexpr = False,
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
    if HAS_W:
        w = tl.load(w_ptr + cols, mask=cols < dim, other=0.0).to(tl.float32)
    else:  # times 1: exact
        w = tl.full([BLOCK_D], 1.0, tl.float32)
    y_ptrs = y_ptr + rows[:, None] * stride_y + cols[None, :]
    if FP32:  # w (or 1 + w) in fp32, rounded once
        y = (xf * rstd[:, None] * (w[None, :] + 1.0 if OFFSET else w[None, :]))
        y = y.to(y_ptr.dtype.element_ty)
        if POST_ADD:  # res_ptr holds the addend: its sum with the rounded norm, rounded
            a = tl.load(res_ptr + rows[:, None] * stride_r + cols[None, :], mask=mask, other=0.0)
            y = (y.to(tl.float32) + a.to(tl.float32)).to(y_ptr.dtype.element_ty)
        if POST_MULT:  # the sum times m_ptr's one value, rounded
            y = (y.to(tl.float32) * tl.load(m_ptr).to(tl.float32)).to(y_ptr.dtype.element_ty)
        tl.store(y_ptrs, y, mask=mask)
        return
    normed = (xf * rstd[:, None]).to(x_ptr.dtype.element_ty).to(tl.float32)
    if GATE:  # (w * norm(x)) rounded, times silu(gate) in fp32
        g_off = (rows // g_inner) * stride_g0 + (rows % g_inner) * stride_g1
        g = tl.load(g_ptr + g_off[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        y = (normed * w[None, :]).to(x_ptr.dtype.element_ty).to(tl.float32)
        tl.store(y_ptrs, (y * g / (1.0 + tl.exp(-g))).to(y_ptr.dtype.element_ty), mask=mask)
        return
    if QUANT:  # quantize_tokens(y): e4m3 with one scale per row, its largest magnitude -> 448
        y = (normed * w[None, :]).to(x_ptr.dtype.element_ty).to(tl.float32)
        scale = fp8_scale(tl.max(tl.abs(y), axis=1))
        tl.store(s_ptr + rows, scale, mask=row_ok)
        tl.store(y_ptrs, saturate(y, scale[:, None]).to(y_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(y_ptrs, (normed * w[None, :]).to(y_ptr.dtype.element_ty), mask=mask)


def _launch(x: torch.Tensor, weight: torch.Tensor | None, eps: float,
            residual: torch.Tensor | None, quant: bool = False, pdl: bool = False,
            offset: bool = False, gate: torch.Tensor | None = None, fp32: bool = False,
            add: torch.Tensor | None = None, mult: torch.Tensor | None = None
            ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    dim = x.shape[-1]
    fp32 = fp32 or offset or weight is None
    assert x.stride(-1) == 1, "last dimension must be contiguous"
    assert weight is None or weight.shape == (dim,)
    assert fp32 or add is None, "add: the fp32 variants"
    assert mult is None or add is not None and mult.numel() == 1, "mult: after an add"
    out_dtype = x.dtype if fp32 or gate is not None else torch.promote_types(x.dtype,
                                                                             weight.dtype)
    assert not quant or out_dtype == x.dtype and x.dim() == 2, "quantized: 2-D, x's dtype"
    y = torch.empty(x.shape, dtype=torch.float8_e4m3fn if quant else out_dtype, device=x.device)
    scale = torch.empty((x.shape[0], 1), dtype=torch.float32, device=x.device) if quant else None
    if x.dim() == 3 and residual is None:  # keep strided per-head views without a copy
        n_inner, s0, s1 = x.shape[1], x.stride(0), x.stride(1)
        xs = x
    else:
        xs = x.reshape(-1, dim)
        n_inner, s0, s1 = 1, xs.stride(0), 0
    n_rows = x.numel() // dim
    res_out = None
    if add is not None:  # read through the residual's pointer: the two never meet
        assert residual is None and add.shape == x.shape and add.is_contiguous()
        add = add.reshape(-1, dim)
    if residual is not None:
        residual = residual.reshape(-1, dim)
        assert residual.stride(-1) == 1
        res_out = torch.empty((n_rows, dim), dtype=x.dtype, device=x.device)
    g_inner, gs0, gs1 = 1, 0, 0
    if gate is not None:  # [T, H, dim] (a strided view) or [rows, dim]
        assert gate.stride(-1) == 1 and gate.shape[-1] == dim and gate.numel() == x.numel()
        g3 = gate if gate.dim() == 3 else gate.reshape(-1, 1, dim)
        g_inner, gs0, gs1 = g3.shape[1], g3.stride(0), g3.stride(1)
    block_d = triton.next_power_of_2(dim)
    rows = max(1, min(16, 2048 // block_d))
    warps = min(16, max(4, block_d * rows // 1024))
    if n_rows:
        _rmsnorm_kernel[(triton.cdiv(n_rows, rows),)](
            xs, residual if residual is not None else add if add is not None else xs,
            weight if weight is not None else xs, y,
            res_out if res_out is not None else y, scale if quant else xs,
            gate if gate is not None else xs, mult if mult is not None else xs,
            n_rows, n_inner, s0, s1,
            residual.stride(0) if residual is not None else dim if add is not None else 0, dim,
            res_out.stride(0) if res_out is not None else 0, dim, eps, g_inner, gs0, gs1,
            HAS_RES=residual is not None, QUANT=quant, ROWS=rows, BLOCK_D=block_d,
            FP32=fp32, OFFSET=offset, HAS_W=weight is not None, POST_ADD=add is not None,
            GATE=gate is not None, POST_MULT=mult is not None,
            num_warps=warps, **pdl_.launch_options(x, pdl),
        )
    return y, (res_out.view(x.shape) if res_out is not None else None), scale


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float, pdl: bool = False,
             offset: bool = False, fp32: bool = False, add: torch.Tensor | None = None,
             mult: torch.Tensor | None = None) -> torch.Tensor:
    """``weight * norm(x)`` over the last dimension (``(1 + weight) * norm(x)`` with ``offset``,
    ``norm(x)`` without a weight, the multiply in fp32 with ``fp32``; ``add + ...`` with ``add``,
    x's shape, contiguous, and that sum times ``mult`` [1] where given); x is 2-D or 3-D (may be
    a strided view). ``pdl`` (every launcher here): launch with programmatic dependent launch
    (``pdl.py``)."""
    return _launch(x, weight, eps, None, pdl=pdl, offset=offset, fp32=fp32, add=add,
                   mult=mult)[0]


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor,
                   eps: float) -> torch.Tensor:
    """``(weight * norm(x)) * silu(gate)``: x ``[T, H, D]`` contiguous, gate the same shape
    (a strided view is fine); in x's dtype."""
    assert x.is_contiguous()
    return _launch(x, weight, eps, None, gate=gate)[0]


def rms_norm_quant(x: torch.Tensor, weight: torch.Tensor, eps: float,
                   residual: torch.Tensor | None = None, pdl: bool = False
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``quantize_tokens(weight * norm(x + residual))`` in the norm's pass: (e4m3 ``[M, K]``, fp32
    scales ``[M, 1]``, ``x + residual`` or x itself), the same bits as the norm then the
    quantization kernel. x ``[M, K]`` in the weight's dtype."""
    q, res, scale = _launch(x, weight, eps, residual, quant=True, pdl=pdl)
    assert scale is not None
    return q, scale, x if res is None else res


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None, eps: float,
    pdl: bool = False, offset: bool = False, fp32: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(norm(x + residual), x + residual)`` in one pass; both outputs are new tensors."""
    y, res, _ = _launch(x, weight, eps, residual, pdl=pdl, offset=offset, fp32=fp32)
    assert res is not None
    return y, res
