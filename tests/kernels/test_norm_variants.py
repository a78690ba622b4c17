"""Every RMSNorm variant's Triton path (``kernel/triton/norm.py``) against the torch reference of
``layers/norm.py``: Llama's ``w * norm(x)``, the fp32 ``w`` (Gemma 4), the fp32 ``1 + w`` (Gemma 3,
the hybrid checkpoints), no weight (Gemma 4's v and router norms), each alone, after the residual
add (``add_norm``) and before the stream's add (``add_to``, Gemma's sandwich norms).

Without a GPU the kernels run under the Triton interpreter on fp32 data; on CUDA on bf16, where
they round as the reference does step by step (the norm in fp32 rounded once, the add of two
rounded tensors rounded once), so they agree to the fp32 reduction order: one bf16 rounding step."""

from __future__ import annotations

import pytest
import torch

from helpers.interpreter import import_triton

triton = import_triton()

from minisgl.kernel.triton import norm as triton_norm
from minisgl.layers import RMSNorm

DEV = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.bfloat16 if DEV == "cuda" else torch.float32
# bf16: one rounding step of values within a few units (2^-7 relative)
TOL = dict(atol=2e-2, rtol=1e-2) if DEV == "cuda" else dict(atol=1e-5, rtol=1e-5)
VARIANTS = {"llama": {}, "fp32": {"fp32": True}, "offset": {"offset": 1.0},
            "no_weight": {"scale": False}}


def _randn(*shape, seed=0, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=gen) * scale).to(DTYPE)


def _norm(variant: str, dim: int) -> RMSNorm:
    norm = RMSNorm(dim, 1e-6, **VARIANTS[variant])
    if norm.weight is not None:
        norm.weight.data = _randn(dim, seed=1, scale=0.5) + (0.0 if norm.offset else 1.0)
    return norm


def _flags(norm: RMSNorm) -> dict:
    """What ``RMSNorm`` passes its kernels (the test reaches them directly without CUDA)."""
    weight = None if norm.weight is None else norm.weight.data.to(DEV)
    return dict(weight=weight, eps=norm.eps, offset=norm.offset != 0.0, fp32=norm.fp32)


@pytest.mark.any_device
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("dim", [96, 2816])  # 2816: Gemma 4 26B's hidden size, padded to 4096
def test_norm_matches_the_reference(variant, dim) -> None:
    norm = _norm(variant, dim)
    x = _randn(5, dim, seed=2, scale=3.0)
    out = triton_norm.rms_norm(x.to(DEV), **_flags(norm))
    assert out.dtype == x.dtype
    torch.testing.assert_close(out.cpu(), norm(x), **TOL)


@pytest.mark.any_device
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_residual_add_then_norm_matches_the_reference(variant) -> None:
    norm = _norm(variant, 96)
    x, r = _randn(5, 96, seed=2), _randn(5, 96, seed=3)
    ref, ref_sum = norm.add_norm(x, r)
    f = _flags(norm)
    out, res = triton_norm.fused_add_rms_norm(x.to(DEV), r.to(DEV), f.pop("weight"), f.pop("eps"),
                                              **f)
    torch.testing.assert_close(res.cpu(), ref_sum, **TOL)
    torch.testing.assert_close(out.cpu(), ref, **TOL)


@pytest.mark.any_device
@pytest.mark.parametrize("variant", ["fp32", "offset", "no_weight"])
def test_norm_then_stream_add_matches_the_reference(variant) -> None:
    norm = _norm(variant, 96)
    h, stream = _randn(5, 96, seed=4, scale=4.0), _randn(5, 96, seed=5)
    out = triton_norm.rms_norm(h.to(DEV), add=stream.to(DEV), **_flags(norm))
    torch.testing.assert_close(out.cpu(), norm.add_to(stream, h), **TOL)
    torch.testing.assert_close(norm.add_to(stream, h), stream + norm(h))


@pytest.mark.any_device
@pytest.mark.parametrize("variant", ["fp32", "offset"])
def test_norm_then_stream_add_times_a_scalar(variant) -> None:
    """Gemma 4's layer end: ``(stream + norm(h)) * layer_scalar``, each step rounded."""
    norm = _norm(variant, 96)
    h, stream = _randn(5, 96, seed=6, scale=4.0), _randn(5, 96, seed=7)
    mult = torch.tensor([0.3]).to(stream.dtype)
    out = triton_norm.rms_norm(h.to(DEV), add=stream.to(DEV), mult=mult.to(DEV), **_flags(norm))
    torch.testing.assert_close(out.cpu(), norm.add_to(stream, h, mult), **TOL)
    torch.testing.assert_close(norm.add_to(stream, h, mult), (stream + norm(h)) * mult)


@pytest.mark.any_device
def test_no_weight_on_strided_heads() -> None:
    """Gemma 4's v norm reads the v heads as a strided view of the fused projection."""
    norm = _norm("no_weight", 64)
    fused = _randn(3, 4 * 64 + 16, seed=6)
    v = fused[:, 16:].reshape(3, 4, 64)
    out = triton_norm.rms_norm(v.to(DEV), **_flags(norm))
    torch.testing.assert_close(out.cpu(), norm(v.contiguous()), **TOL)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_the_module_takes_its_kernel_on_cuda(variant) -> None:
    """On CUDA the module's three methods run the kernels and match their own reference on CPU."""
    norm = _norm(variant, 256)
    x, r = _randn(7, 256, seed=7), _randn(7, 256, seed=8)
    gpu = _norm(variant, 256).to(DEV)
    torch.testing.assert_close(gpu(x.to(DEV)).cpu(), norm(x), **TOL)
    out, res = gpu.add_norm(x.to(DEV), r.to(DEV))
    ref, ref_sum = norm.add_norm(x, r)
    torch.testing.assert_close(out.cpu(), ref, **TOL)
    torch.testing.assert_close(res.cpu(), ref_sum, **TOL)
    torch.testing.assert_close(gpu.add_to(r.to(DEV), x.to(DEV)).cpu(), norm.add_to(r, x), **TOL)
