"""The in-place Gated DeltaNet kernels (``kernel/triton/gated_delta.py``) against the torch ops,
and the Triton linear-attention backend against the torch backend.

Without a GPU the kernels run under the Triton interpreter on fp32 data (they use no ``tl.dot``,
so bf16 states load and store exactly there too); the backend test needs fla-core's chunked
kernel and runs on CUDA only."""

from __future__ import annotations

import copy

import pytest
import torch

from helpers.interpreter import import_triton

triton = import_triton()

from minisgl.kernel.triton.gated_delta import conv_decode, conv_varlen, gdn_decode
from minisgl.layers import gated_delta as ops

DEV = "cuda" if torch.cuda.is_available() else "cpu"
HK, HV, K, V, W = 2, 4, 16, 8, 4
C = 2 * HK * K + HV * V


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.any_device
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_conv_decode_matches_the_reference(state_dtype) -> None:
    gen = _gen(0)
    x = torch.randn(3, C, generator=gen)
    weight = torch.randn(C, W, generator=gen)
    state = torch.randn(5, C, W - 1, generator=gen).to(state_dtype)
    slots = torch.tensor([3, -1, 0], dtype=torch.int32)
    ref_state = state.clone()
    dev_state = state.clone().to(DEV)
    out = conv_decode(x.to(DEV), weight.to(DEV), dev_state, slots.to(DEV)).cpu()
    for row, slot in ((0, 3), (2, 0)):
        want, ref_state[slot] = ops.causal_conv1d(x[row:row + 1], weight, None, ref_state[slot])
        torch.testing.assert_close(out[row], want[0], atol=1e-5, rtol=1e-5)
    assert out[1].abs().max() == 0  # a padding row: zeros, no slot touched
    torch.testing.assert_close(dev_state.cpu(), ref_state)


@pytest.mark.any_device
def test_conv_varlen_matches_the_reference() -> None:
    """Chunks of 1, 2 (shorter than the window), 3 and 9 tokens, some continuing a window."""
    gen = _gen(1)
    lens, slots, init = [3, 1, 9, 2], [4, 0, 2, 1], [1, 0, 1, 1]
    x = torch.randn(sum(lens), C, generator=gen)
    weight = torch.randn(C, W, generator=gen)
    state = torch.randn(5, C, W - 1, generator=gen)
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    seq = [i for i, n in enumerate(lens) for _ in range(n)]
    as_dev = lambda v: torch.tensor(v, dtype=torch.int32, device=DEV)  # noqa: E731
    dev_state = state.clone().to(DEV)  # .to('cpu') would not copy
    out = conv_varlen(x.to(DEV), weight.to(DEV), dev_state, as_dev(slots), as_dev(cu),
                      as_dev(seq), as_dev(init)).cpu()
    ref = state.clone()
    for i, slot in enumerate(slots):
        if not init[i]:
            ref[slot].zero_()
        want, ref[slot] = ops.causal_conv1d(x[cu[i]:cu[i + 1]], weight, None, ref[slot])
        torch.testing.assert_close(out[cu[i]:cu[i + 1]], want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(dev_state.cpu(), ref)


@pytest.mark.any_device
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_gdn_decode_matches_the_reference(state_dtype) -> None:
    """The fused step (gating, L2 norm, delta rule) on three slots and a padding row."""
    gen = _gen(2)
    x = torch.randn(4, C, generator=gen)
    a, b = torch.randn(4, HV, generator=gen), torch.randn(4, HV, generator=gen)
    a_log, dt_bias = torch.randn(HV, generator=gen) * 0.5, torch.randn(HV, generator=gen)
    state = (torch.randn(6, HV, K, V, generator=gen) * 0.3).to(state_dtype)
    slots = [5, 0, -1, 2]
    dev_state = state.clone().to(DEV)  # .to('cpu') would not copy
    out = gdn_decode(x.to(DEV), a.to(DEV), b.to(DEV), a_log.to(DEV), dt_bias.to(DEV), dev_state,
                     torch.tensor(slots, dtype=torch.int32, device=DEV), HK, K, K ** -0.5).cpu()
    g, beta = ops.gdn_gating(a, b, a_log, dt_bias)
    ref = state.clone()
    for row, slot in enumerate(slots):
        if slot < 0:
            assert out[row].abs().max() == 0
            continue
        q, k, v = x[row:row + 1].split([HK * K, HK * K, HV * V], dim=-1)
        q, k = ops.l2norm(q.view(1, HK, K)), ops.l2norm(k.view(1, HK, K))
        o, s = ops.recurrent_gated_delta_rule(q, k, v.view(1, HV, V), g[row:row + 1],
                                              beta[row:row + 1], ref[slot].float(), K ** -0.5)
        ref[slot] = s.to(state_dtype)
        torch.testing.assert_close(out[row], o[0], atol=1e-5, rtol=1e-4)
    tol = 1e-5 if state_dtype == torch.float32 else 1e-2
    torch.testing.assert_close(dev_state.cpu().float(), ref.float(), atol=tol, rtol=tol)


def _torch_chunk_rule(q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens,
                      cu_seqlens_cpu, use_qk_l2norm_in_kernel, use_gate_in_kernel, A_log,
                      dt_bias):
    """fla's ``chunk_gated_delta_rule`` (varlen, batch 1; the q/k L2 norm and the decay's gating
    inside) in terms of the torch ops: the stand-in that lets the Triton backend's own code run
    on CPU."""
    assert use_qk_l2norm_in_kernel and use_gate_in_kernel
    q, k = ops.l2norm(q).to(q.dtype), ops.l2norm(k).to(k.dtype)
    g = ops.gdn_gating(g, beta, A_log, dt_bias)[0]
    outs, finals, cu = [], [], cu_seqlens_cpu.tolist()
    for n in range(len(cu) - 1):
        lo, hi = cu[n], cu[n + 1]
        o, s = ops.chunk_gated_delta_rule(q[0, lo:hi], k[0, lo:hi], v[0, lo:hi], g[0, lo:hi],
                                          beta[0, lo:hi], initial_state[n], scale)
        outs.append(o)
        finals.append(s)
    return torch.cat(outs)[None].to(v.dtype), torch.stack(finals)


def _backend_case(dtype, state_dtype, dev, k_dim):
    """A layer, one pool and the two backends over copies of it."""
    from minisgl.distributed import DistributedCommunicator, DistributedInfo
    from minisgl.kvcache.state_pool import StatePool, StateShape
    from minisgl.linear_attn.torch_backend import TorchLinearAttnBackend
    from minisgl.linear_attn.triton_backend import TritonLinearAttnBackend
    from minisgl.models.config import LinearAttnConfig
    from minisgl.models.qwen3_5 import Qwen3_5GatedDeltaNet

    cfg = LinearAttnConfig(num_key_heads=2, num_value_heads=4, key_head_dim=k_dim,
                           value_head_dim=k_dim, conv_kernel=4)
    torch.manual_seed(0)
    with torch.device(dev):
        layer = Qwen3_5GatedDeltaNet(cfg, 64, 1e-6, 0,
                                     DistributedCommunicator(DistributedInfo()), None)
        for p in layer.parameters():
            p.data.normal_(0, 0.5)
    layer = layer.to(dtype)
    layer.A_log.data, layer.dt_bias.data = layer.A_log.float(), layer.dt_bias.float()
    shape = StateShape(layer.conv_dim, 4, layer.num_v_heads, k_dim, k_dim)
    pool = StatePool(shape, 1, 4, 0, dtype, dev, ssm_dtype=state_dtype, num_draft_groups=2,
                     draft_group_size=5)  # slots 5 .. 14: two requests' draft positions
    pool.conv[0].normal_()
    pool.ssm[0].copy_(torch.randn_like(pool.ssm[0], dtype=torch.float32) * 0.1)
    pools = [pool, copy.deepcopy(pool)]
    if dev == "cuda":
        triton_backend = TritonLinearAttnBackend(pools[0])
    else:  # fla's chunked kernel needs CUDA: the torch ops stand in for it
        triton_backend = TritonLinearAttnBackend.__new__(TritonLinearAttnBackend)
        triton_backend.state_pool, triton_backend.chunk_rule = pools[0], _torch_chunk_rule
    return layer, pools, [triton_backend, TorchLinearAttnBackend(pools[1])]


def _compare_backends(dtype, state_dtype, dev, k_dim, tol):
    """A mixed batch (decode rows, a fresh prefill, a continuing prefill, padding tokens), a
    decode batch, then decode rows, two requests verifying drafts (5 and 3 tokens, their states
    into draft slots) and a prefill, through both backends from the same pool: outputs and pool
    states (the draft slots included)."""
    from minisgl.core import Batch
    from minisgl.kvcache.state_metadata import StateMetadata

    layer, pools, backends = _backend_case(dtype, state_dtype, dev, k_dim)
    for lens, fresh, nd, pad, drafts in (
            ([1, 1, 70, 9], [False, False, True, False], 2, 16, None),
            ([1, 1, 1, 1], [False] * 4, 4, 0, None),
            ([1, 5, 3, 9], [False] * 4, 1, 8, [5, 10])):
        meta = StateMetadata.build([0, 1, 2, 3], lens, fresh, nd, torch.device(dev), drafts)
        batch = Batch([], "mixed", state_metadata=meta)
        x = torch.randn(sum(lens) + pad, 64, device=dev, dtype=dtype)
        qkv, _, b, a = layer.project(x)
        outs = [be.forward(layer, qkv, a, b, batch).float() for be in backends]
        torch.testing.assert_close(outs[0], outs[1], atol=tol, rtol=tol)
        if pad:
            assert outs[0][sum(lens):].abs().max() == 0
        torch.testing.assert_close(pools[0].ssm[0].float(), pools[1].ssm[0].float(), atol=tol,
                                   rtol=tol)
        torch.testing.assert_close(pools[0].conv[0].float(), pools[1].conv[0].float())


@pytest.mark.skipif(DEV == "cuda", reason="CUDA runs the real fla kernel (the test below)")
def test_triton_backend_glue_matches_the_torch_backend() -> None:
    """CPU: the Triton backend's own code (kernels in the interpreter, metadata, the chunk
    path's gather and write-back) with the torch ops standing in for fla's kernel."""
    _compare_backends(torch.float32, torch.float32, "cpu", 8, 1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,state_dtype", [(torch.float32, torch.float32),
                                               (torch.bfloat16, torch.float32),
                                               (torch.bfloat16, torch.bfloat16)])
def test_triton_backend_matches_the_torch_backend(dtype, state_dtype) -> None:
    pytest.importorskip("fla")
    tol = 2e-3 if dtype == torch.float32 and state_dtype == torch.float32 else 5e-2
    _compare_backends(dtype, state_dtype, "cuda", 128, tol)
