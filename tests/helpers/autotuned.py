"""A kernel behind ``triton.autotune``, as a library ships one, for
tests/kernels/test_autotune_choices.py (the package its autotuners are looked up in:
``helpers.autotuned``)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.autotune(configs=[triton.Config({"BLOCK": 16}, num_warps=1),
                          triton.Config({"BLOCK": 32}, num_warps=2)], key=["n"])
@triton.jit
def add_one_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)


def add_one(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    add_one_kernel[lambda meta: (triton.cdiv(x.numel(), meta["BLOCK"]),)](x, out, x.numel())
    return out
