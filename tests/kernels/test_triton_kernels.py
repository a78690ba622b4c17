"""Triton kernels (fused MoE, add+RMSNorm, RoPE, SiLU-and-mul, small-batch matmul) against the
torch references.

Without a GPU the kernels run on CPU tensors under the Triton interpreter, at small sizes and in
float32/float16/bfloat16 (bf16 only where no ``tl.dot`` is involved: the interpreter's bf16 dot is
wrong). With a GPU the same small tests run compiled, and the ``gpu`` tests add real sizes in bf16.
"""

from __future__ import annotations

import os

import pytest
import torch

from helpers.interpreter import import_triton

triton = import_triton()

from minisgl.kernel.triton.activation import silu_and_mul
from minisgl.kernel.triton.fused_moe import MoeConfig, fused_moe, moe_align
from minisgl.kernel.triton.gemv import gemv
from minisgl.kernel.triton.norm import fused_add_rms_norm, rms_norm
from minisgl.kernel.triton.rotary import apply_rope_, norm_rope_store_
from minisgl.layers.activation import silu_and_mul_ref
from minisgl.layers.norm import rms_norm as rms_norm_ref
from minisgl.layers.rotary import _rotate, cos_sin_cache
from minisgl.models.config import RotaryConfig
from minisgl.moe.reference import TorchMoeBackend

pytestmark = pytest.mark.any_device
DEV = "cuda" if torch.cuda.is_available() else "cpu"
# one ulp of the dtype (relative): the kernels round at the same points as the references, so only
# the fp32 reduction order and exp/rsqrt implementations differ
ULP = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3}
# the interpreter (triton 3.9) truncates fp32 -> bf16 casts instead of rounding to nearest even, so
# a chain of k roundings can be k ulps off there; compiled kernels round like torch
INTERPRETED = DEV == "cpu"


def close(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype, roundings: int = 2) -> None:
    """Equal up to one ulp (compiled), or ``roundings`` ulps in interpreted bf16 (truncation)."""
    ulps = float(roundings) if INTERPRETED and dtype == torch.bfloat16 else 1.0
    torch.testing.assert_close(a.float(), b.float(), rtol=ULP[dtype] * ulps, atol=ULP[dtype] * ulps)


# ---------------------------------------------------------------- MoE helpers


def skewed_routing(tokens: int, experts: int, top_k: int, seed: int):
    """Distinct top-k ids per token from a skewed law: expert 0 heavy, the last two never chosen."""
    g = torch.Generator().manual_seed(seed)
    probs = torch.linspace(8.0, 1.0, experts)
    probs[-2:] = 0
    ids = torch.multinomial(probs.expand(tokens, -1), top_k, replacement=False, generator=g)
    weights = torch.rand(tokens, top_k, generator=g).softmax(-1)
    return weights, ids


def router_routing(tokens: int, experts: int, top_k: int, seed: int):
    """What the model's router does: softmax over random logits, top-k, renormalised."""
    logits = torch.randn(tokens, experts, generator=torch.Generator().manual_seed(seed))
    weights, ids = torch.topk(logits.softmax(-1), top_k, dim=-1)
    return weights / weights.sum(-1, keepdim=True), ids


def moe_inputs(tokens, hidden, inter, experts, top_k, dtype, device, seed=0,
               routing=skewed_routing):
    g = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g, device=device)

    x = randn(tokens, hidden)
    w13 = randn(experts, 2 * inter, hidden) / hidden**0.5
    w2 = randn(experts, hidden, inter) / inter**0.5
    weights, ids = routing(tokens, experts, top_k, seed)

    def cast(t):
        return t.to(device=device, dtype=dtype)

    return cast(x), cast(w13), cast(w2), cast(weights), ids.to(device)


def moe_fp32_truth(x, w13, w2, weights, ids) -> torch.Tensor:
    """Dense fp32 MoE: every routed (token, expert) pair computed in float32, no rounding
    between."""
    x, w13, w2, weights = x.float(), w13.float(), w2.float(), weights.float()
    h = torch.einsum("th,tkih->tki", x, w13[ids])
    gate, up = h.chunk(2, dim=-1)
    act = torch.nn.functional.silu(gate) * up
    return torch.einsum("tki,tkhi->th", act * weights[..., None], w2[ids])


# ---------------------------------------------------------------- MoE (interpreter-sized)


@pytest.mark.parametrize("block_m", [16, 32])
@pytest.mark.parametrize("tokens", [37, 300])  # one program (two chunks of pairs) / atomics
def test_moe_align_segments(block_m, tokens):
    experts, top_k = 8, 2
    _, ids = skewed_routing(tokens, experts, top_k, seed=1)
    sorted_ids, expert_ids, total = moe_align(ids.to(DEV), experts, block_m)
    sorted_ids, expert_ids, total = sorted_ids.cpu(), expert_ids.cpu(), int(total)
    flat, n = ids.flatten(), ids.numel()
    counts = torch.bincount(flat, minlength=experts)
    padded = (counts + block_m - 1) // block_m * block_m
    assert total == int(padded.sum())
    start = 0
    for e in range(experts):
        seg = sorted_ids[start : start + int(padded[e])]
        real = seg[seg < n]
        mine = (flat == e).nonzero().flatten().tolist()
        # one program (up to 256 pairs) scatters them in pair order; atomics in any order
        assert (real.tolist() if n <= 256 else sorted(real.tolist())) == mine
        assert (seg[int(counts[e]):] == n).all()  # padding after the real rows
        assert (expert_ids[start // block_m : (start + int(padded[e])) // block_m] == e).all()
        start += int(padded[e])
    assert (sorted_ids[total:] == n).all()


@pytest.mark.parametrize("tokens", [1, 5, 33, 150])  # 150: past the one-program counting
@pytest.mark.parametrize("top_k", [2, 4])
@pytest.mark.parametrize("shape", [(64, 32), (96, 40)], ids=["even", "ragged"])
def test_fused_moe_fp32(tokens, top_k, shape):
    hidden, inter = shape
    args = moe_inputs(tokens, hidden, inter, 8, top_k, torch.float32, DEV, seed=tokens)
    out = fused_moe(*args)
    torch.testing.assert_close(out, moe_fp32_truth(*args), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("config", [MoeConfig(16, 16, 32, 32, 1), MoeConfig(32, 32, 16, 16, 4),
                                    MoeConfig(64, 64, 64, 64, 8)], ids=["m16", "m32", "m64"])
def test_fused_moe_block_configs(config):
    """Row blocks spanning several experts' segments, grouped tile order, several K steps."""
    args = moe_inputs(50, 64, 48, 8, 4, torch.float32, DEV, seed=7)
    out = fused_moe(*args, config=config)
    torch.testing.assert_close(out, moe_fp32_truth(*args), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("tokens", [1, 17])
def test_fused_moe_fp16_matches_reference_backend(tokens):
    """Same rounding points as the torch backend; only the K-sum is fp32 here (sequential there)."""
    args = moe_inputs(tokens, 64, 32, 8, 2, torch.float16, DEV, seed=3)
    out = fused_moe(*args)
    ref = TorchMoeBackend().forward(*args)
    truth = moe_fp32_truth(*args)
    torch.testing.assert_close(out.float(), truth, rtol=5e-3, atol=5e-3)
    torch.testing.assert_close(out, ref, rtol=5e-3, atol=5e-3)


def test_fused_moe_empty_batch():
    args = moe_inputs(0, 64, 32, 8, 2, torch.float32, DEV)
    assert fused_moe(*args).shape == (0, 64)


# ---------------------------------------------------------------- RMSNorm


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("dim", [64, 96])
def test_fused_add_rms_norm(dtype, dim):
    g = torch.Generator().manual_seed(dim)
    x, r = (torch.randn(13, dim, generator=g).to(DEV, dtype) for _ in range(2))
    w = (1 + 0.1 * torch.randn(dim, generator=g)).to(DEV, dtype)
    y, res = fused_add_rms_norm(x, r, w, 1e-6)
    res_ref = x + r
    if INTERPRETED and dtype == torch.bfloat16:
        close(res, res_ref, dtype)
    else:
        assert torch.equal(res, res_ref)
    close(y, rms_norm_ref(res_ref, w, 1e-6), dtype)
    close(rms_norm(x, w, 1e-6), rms_norm_ref(x, w, 1e-6), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_strided_heads(dtype):
    """Per-head q norm on a view sliced out of a fused QKV activation (Qwen3)."""
    g = torch.Generator().manual_seed(0)
    qkv = torch.randn(7, (4 + 2 + 2) * 32, generator=g).to(DEV, dtype)
    q = qkv[:, : 4 * 32].view(7, 4, 32)
    w = (1 + 0.1 * torch.randn(32, generator=g)).to(DEV, dtype)
    assert not q.is_contiguous()
    close(rms_norm(q, w, 1e-6), rms_norm_ref(q, w, 1e-6), dtype)


# ---------------------------------------------------------------- RoPE and SiLU-and-mul


def rope_case(tokens, n_q, n_kv, head_dim, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(tokens, (n_q + 2 * n_kv) * head_dim, generator=g).to(device, dtype)
    q, k, v = qkv.split([n_q * head_dim, n_kv * head_dim, n_kv * head_dim], dim=-1)

    def shape(t, h):
        return t.view(tokens, h, head_dim)

    positions = torch.randint(0, 500, (tokens,), generator=g).to(device)
    return qkv, shape(q, n_q), shape(k, n_kv), v, positions


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads", [(4, 2), (6, 6), (40, 8)])  # 40: three 16-head programs a token
def test_rope_in_place(dtype, heads):
    cfg = RotaryConfig(head_dim=32, base=10000.0, max_position=512)
    _, q, k, v, pos = rope_case(9, *heads, 32, dtype, DEV)
    v_before = v.clone()
    cos, sin = cos_sin_cache(cfg, q.device)[pos].unsqueeze(1).chunk(2, dim=-1)
    cos, sin = cos.to(dtype), sin.to(dtype)
    q_ref, k_ref = _rotate(q, cos, sin), _rotate(k, cos, sin)
    apply_rope_(pos, q, k, cos_sin_cache(cfg, q.device))
    close(q, q_ref, dtype)
    close(k, k_ref, dtype)
    assert torch.equal(v, v_before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("qk_norm", [True, False])
@pytest.mark.parametrize("loc_dtype", [torch.int32, torch.int64])
def test_norm_rope_store(dtype, qk_norm, loc_dtype):
    """The fused kernel equals q/k RMSNorm, then RoPE, then the pool's store_kv."""
    from minisgl.kvcache.mha_pool import MHAKVCache

    cfg = RotaryConfig(head_dim=32, base=10000.0, max_position=512)
    tokens, n_q, n_kv = 7, 20, 2  # q heads over two programs a token (16 and 4)
    _, q, k, v, pos = rope_case(tokens, n_q, n_kv, 32, dtype, DEV, seed=3)
    v = v.view(tokens, n_kv, 32)
    g = torch.Generator().manual_seed(1)
    qw, kw = ((1 + 0.1 * torch.randn(32, generator=g)).to(DEV, dtype) for _ in range(2))
    loc = torch.randperm(20, generator=g)[:tokens].to(DEV, loc_dtype)
    pools = [MHAKVCache(2, n_kv, 32, 20, 1, dtype, DEV) for _ in range(2)]
    q_ref, k_ref = (rms_norm_ref(q, qw, 1e-6), rms_norm_ref(k, kw, 1e-6)) if qk_norm else (q, k)
    cos, sin = (t.to(dtype)
                for t in cos_sin_cache(cfg, q.device)[pos].unsqueeze(1).chunk(2, dim=-1))
    q_ref, k_ref = _rotate(q_ref, cos, sin), _rotate(k_ref, cos, sin)
    pools[0].store_kv(k_ref, v, loc, layer_id=1)
    v_before = v.clone()
    norm_rope_store_(pos, q, k, v, cos_sin_cache(cfg, q.device), pools[1].k_cache(1),
                     pools[1].v_cache(1), loc, *((qw, kw, 1e-6) if qk_norm else ()))
    chain = 5 if qk_norm else 2  # norm, weight, two products, sum: each truncates when interpreted
    close(q, q_ref, dtype, chain)
    close(k, k_ref, dtype, chain)
    assert torch.equal(v, v_before)
    close(pools[1].k_cache(1), pools[0].k_cache(1), dtype, chain)
    assert torch.equal(pools[1].v_cache(1), pools[0].v_cache(1))
    assert torch.equal(pools[1].k_cache(1)[loc.long()], k)  # the pool holds the returned k
    assert not pools[1].k_cache(0).any() and not pools[1].v_cache(0).any()  # other layer untouched


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("inter", [48, 1500])
def test_silu_and_mul(dtype, inter):
    x = torch.randn(5, 2 * inter, generator=torch.Generator().manual_seed(inter)).to(DEV, dtype)
    close(silu_and_mul(x), silu_and_mul_ref(x), dtype)
    assert silu_and_mul(x.view(5, 1, -1)).shape == (5, 1, inter)


def linear_fp32(x, w, b=None) -> torch.Tensor:
    return torch.nn.functional.linear(x.float(), w.float(), None if b is None else b.float())


@pytest.mark.parametrize("shape", [(48, 1024), (37, 300)], ids=["even", "ragged"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
def test_gemv(shape, dtype, bias):
    n, k = shape
    g = torch.Generator().manual_seed(n)
    x, w, b = (torch.randn(*s, generator=g).to(DEV, dtype) for s in [(1, k), (n, k), (n,)])
    y = gemv(x, w, b if bias else None)
    assert y.shape == (1, n) and y.dtype == dtype
    # fp32 accumulation in another order, then one rounding to the dtype
    ref = linear_fp32(x, w, b if bias else None)
    torch.testing.assert_close(y.float(), ref, rtol=ULP[dtype],
                               atol=ULP[dtype] * ref.abs().max().item())


@pytest.mark.parametrize("shape,config", [((40, 384), (2, 128, 4)), ((37, 300), (4, 128, 4)),
                                          ((37, 300), (2, 64, 2))],
                         ids=["even", "ragged", "ragged_many"])
def test_gemv_walks_k_in_chunks(shape, config):
    """K in several chunks: whole ones, and a last one cut short (300 = 2 x 128 + 44,
    4 x 64 + 44), rows cut short too."""
    n, k = shape
    g = torch.Generator().manual_seed(k)
    x, w, b = (torch.randn(*s, generator=g).to(DEV) for s in [(1, k), (n, k), (n,)])
    y = gemv(x, w, b, config=config)
    ref = linear_fp32(x, w, b)
    torch.testing.assert_close(y, ref, rtol=ULP[torch.float32],
                               atol=ULP[torch.float32] * ref.abs().max().item())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("config", [None, (2, 128, 4)])  # the second walks K in three chunks
def test_gemv_gated_is_silu_and_mul_then_gemv(dtype, config):
    g = torch.Generator().manual_seed(5)
    x, w = (torch.randn(*s, generator=g).to(DEV, dtype) for s in [(1, 2 * 384), (40, 384)])
    expect = gemv(silu_and_mul(x), w, config=config)  # same kernel, same order: only the gate moved
    close(gemv(x, w, gated=True, config=config), expect, dtype, roundings=1)


def test_kernel_package_imports_without_triton():
    import subprocess
    import sys

    code = "import sys, minisgl.kernel, minisgl.kernel.triton; assert 'triton' not in sys.modules"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


# ---------------------------------------------------------------- GPU, real sizes

gpu = pytest.mark.gpu
QWEN3_30B_A3B = {"hidden": 2048, "inter": 768, "experts": 128, "top_k": 8}


def moe_fp32_reference(x, w13, w2, weights, ids) -> torch.Tensor:
    """The torch backend run on fp32 copies: exact up to fp32 rounding (TF32 is off by default)."""
    return TorchMoeBackend().forward(x.float(), w13.float(), w2.float(), weights.float(), ids)


@gpu
@pytest.mark.parametrize("tokens", [1, 64, 2048])
def test_fused_moe_qwen3_30b_a3b_bf16(tokens):
    """bf16 rounds the activations, so neither backend is exact: the fused kernel must be at least
    as close to the fp32 result as the torch backend is (it rounds at the same points, but sums the
    top-k outputs in fp32 where the torch backend adds them up in bf16)."""
    c = QWEN3_30B_A3B
    args = moe_inputs(tokens, c["hidden"], c["inter"], c["experts"], c["top_k"], torch.bfloat16,
                      "cuda", seed=tokens, routing=router_routing)
    truth = moe_fp32_reference(*args)
    err = (fused_moe(*args).float() - truth).abs()
    err_ref = (TorchMoeBackend().forward(*args).float() - truth).abs()
    assert err.max() <= 1.25 * err_ref.max() + 1e-3, (err.max(), err_ref.max())
    assert err.mean() <= 1.1 * err_ref.mean() + 1e-5, (err.mean(), err_ref.mean())
    assert err.max() <= 0.05 * truth.abs().max()  # a few bf16 ulps of the largest output


@gpu
@pytest.mark.parametrize("tokens", [1, 64, 300])
def test_fused_moe_qwen3_30b_a3b_fp32(tokens):
    c = QWEN3_30B_A3B
    args = moe_inputs(tokens, c["hidden"], c["inter"], c["experts"], c["top_k"], torch.float32,
                      "cuda", seed=tokens, routing=router_routing)
    torch.testing.assert_close(fused_moe(*args), moe_fp32_reference(*args), rtol=1e-4, atol=1e-4)


@gpu
def test_fused_moe_cuda_graph_replay():
    """Captured once, replayed on new tokens and new routing: no host sync, no stale sizes."""
    from minisgl.moe import create_moe_backend

    backend = create_moe_backend("triton")
    x, w13, w2, w, ids = moe_inputs(8, 256, 128, 16, 4, torch.bfloat16, "cuda", seed=0)
    backend.forward(x, w13, w2, w, ids)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = backend.forward(x, w13, w2, w, ids)
    for seed in (1, 2, 3):
        x2, _, _, w_new, ids_new = moe_inputs(8, 256, 128, 16, 4, torch.bfloat16, "cuda", seed=seed)
        x.copy_(x2), w.copy_(w_new), ids.copy_(ids_new)
        graph.replay()
        assert torch.equal(out, backend.forward(x, w13, w2, w, ids))


@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_norm_rope_silu_real_sizes(dtype):
    g = torch.Generator(device="cuda").manual_seed(0)
    x, r = (torch.randn(4096, 4096, generator=g, device="cuda").to(dtype) for _ in range(2))
    w = (1 + 0.1 * torch.randn(4096, generator=g, device="cuda")).to(dtype)
    y, res = fused_add_rms_norm(x, r, w, 1e-6)
    assert torch.equal(res, x + r)
    close(y, rms_norm_ref(x + r, w, 1e-6), dtype)
    cfg = RotaryConfig(head_dim=128, base=1e6, max_position=40960)
    _, q, k, _, pos = rope_case(2048, 32, 4, 128, dtype, "cuda")
    pos = pos * 80  # positions up to 40k
    wq = (1 + 0.1 * torch.randn(128, generator=g, device="cuda")).to(dtype)
    q_normed = rms_norm(q, wq, 1e-6)  # Qwen3 q norm on the strided view
    close(q_normed, rms_norm_ref(q, wq, 1e-6), dtype)
    cos, sin = (t.to(dtype)
                for t in cos_sin_cache(cfg, q.device)[pos].unsqueeze(1).chunk(2, dim=-1))
    q_ref, k_ref = _rotate(q_normed, cos, sin), _rotate(k, cos, sin)
    apply_rope_(pos, q_normed, k, cos_sin_cache(cfg, q.device))
    close(q_normed, q_ref, dtype)
    close(k, k_ref, dtype)
    a = torch.randn(2048, 2 * 6144, generator=g, device="cuda").to(dtype)
    close(silu_and_mul(a), silu_and_mul_ref(a), dtype)


@gpu
@pytest.mark.parametrize("shape", [(6144, 4096), (4096, 12288), (5120, 17408), (151936, 1024)])
def test_gemv_real_sizes_bf16(shape):
    """Qwen3-8B's QKV and down, Qwen3-14B's down (K not a multiple of 2048), Qwen3-0.6B's LM head:
    as close to fp32 as cuBLAS is."""
    g = torch.Generator(device="cuda").manual_seed(shape[0])
    x = torch.randn(1, shape[1], generator=g, device="cuda").bfloat16()
    w = (0.02 * torch.randn(*shape, generator=g, device="cuda")).bfloat16()
    ref = linear_fp32(x, w)
    err = (gemv(x, w).float() - ref).abs().max()
    assert err <= 1.5 * (torch.nn.functional.linear(x, w).float() - ref).abs().max() + 1e-6


@gpu
def test_layers_dispatch_to_triton_on_cuda():
    """The public layers give the CPU reference's result when their tensors live on CUDA."""
    from minisgl.layers import RMSNorm, RotaryEmbedding
    from minisgl.layers import silu_and_mul as layer_silu

    norm = RMSNorm(256, 1e-6)
    torch.nn.init.normal_(norm.weight, 1.0, 0.1)
    x, r = torch.randn(5, 256), torch.randn(5, 256)
    y_cpu, res_cpu = norm.add_norm(x, r)
    y, res = norm.cuda().add_norm(x.cuda(), r.cuda())
    torch.testing.assert_close(y.cpu(), y_cpu), torch.testing.assert_close(res.cpu(), res_cpu)
    rope = RotaryEmbedding(RotaryConfig(head_dim=64, base=10000.0, max_position=512))
    _, q, k, _, pos = rope_case(6, 4, 2, 64, torch.float32, "cpu")
    q_cpu, k_cpu = rope(pos, q.clone(), k.clone())
    q_gpu, k_gpu = rope(pos.cuda(), q.cuda(), k.cuda())
    torch.testing.assert_close(q_gpu.cpu(), q_cpu), torch.testing.assert_close(k_gpu.cpu(), k_cpu)
    a = torch.randn(3, 64)
    torch.testing.assert_close(layer_silu(a.cuda()).cpu(), layer_silu(a))


@gpu
def test_engine_parity_qwen3_moe_triton_backend(tiny_checkpoints):
    """The tiny Qwen3-MoE checkpoint on CUDA (fp32) with the fused MoE gives HF's greedy tokens."""
    from helpers.hf_models import hf_greedy, random_prompts
    from minisgl import LLM, SamplingParams

    path = tiny_checkpoints["qwen3_moe"]
    prompts = random_prompts(4, [5, 17, 33, 60], 256, seed=0)
    options = {"device": "cuda", "dtype": "float32", "num_pages": 2048, "moe_backend": "triton"}
    llm = LLM(str(path), **options)
    from minisgl.layers.moe import MoELayer

    backends = {type(m.backend).__name__ for m in llm.scheduler.engine.model.modules()
                if isinstance(m, MoELayer)}
    assert backends == {"TritonMoeBackend"}
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    outputs = llm.generate(prompts, params)
    assert [o.token_ids for o in outputs] == hf_greedy(path, prompts, 24)
