"""FP8 on CPU: checkpoints in the published format, ``--quantization fp8``, the FP8 KV cache.

The CPU path dequantizes (``minisgl.quant.fp8_dispatch``): an FP8 model computes exactly what the
model of its dequantized weights computes, so the reference is that model (ours and transformers',
float32) and the tolerances are those of the float32 parity tests (1e-4 ours, 1e-3 transformers:
only the order of the sums differs). What FP8 rounding costs is a GPU figure
(``scripts/gpu_validate.sh fp8``).
"""

from __future__ import annotations

import json

import pytest
import torch

from helpers.device import TEST_DEVICE
from helpers.engine_utils import logits_and_tokens, prefill_logits
from helpers.fp8_models import (
    dequantize,
    make_dequantized_checkpoint,
    make_fp8_checkpoint,
    make_online_reference_checkpoint,
    quantize,
    quantize_rows,
)
from helpers.hf_models import hf_greedy, hf_prefill_logits, make_tiny_checkpoint, random_prompts
from minisgl.core import SamplingParams
from minisgl.llm.config import EngineOptions
from minisgl.scheduler import Scheduler

pytestmark = pytest.mark.any_device
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
PROMPTS = random_prompts(3, [6, 19, 40], 256, seed=11)
# tests/test_tp.py's rule: TP=2 runs on CPU, or on CUDA with two GPUs (one GPU would hang the ranks)
NEEDS_TWO_RANKS = pytest.mark.skipif(TEST_DEVICE == "cuda" and torch.cuda.device_count() < 2,
                                     reason="TP=2 on CUDA needs two GPUs")
# head_dim 128 and widths that are multiples of 128: the real 128x128 blocks fall on the boundaries
# of the merged projections (hidden 64 still leaves partial column blocks)
WIDE = dict(head_dim=128, intermediate_size=256, moe_intermediate_size=128)


def scheduler(path, **options) -> Scheduler:
    opts = dict(device="cpu", dtype="float32", num_pages=512, page_size=4) | options
    return Scheduler(EngineOptions(**opts).scheduler_config(str(path), ()))


def run_greedy(path, **options) -> tuple[torch.Tensor, list[list[int]]]:
    return logits_and_tokens(scheduler(path, **options), PROMPTS, GREEDY)


CASES = [("llama", (16, 16), {}), ("qwen2", (16, 16), {}), ("qwen3", (16, 16), {}),
         ("qwen3_moe", (16, 16), {}),
         ("qwen3", (128, 128), WIDE), ("qwen3_moe", (128, 128), WIDE)]


@pytest.mark.parametrize("arch, block, dims", CASES,
                         ids=[f"{a}-{b[0]}x{b[1]}" for a, b, _ in CASES])
def test_fp8_checkpoint_matches_dequantized_model(arch, block, dims, tmp_path):
    src = make_tiny_checkpoint(arch, tmp_path / "src", **dims)
    fp8 = make_fp8_checkpoint(src, tmp_path / "fp8", block)
    ref = make_dequantized_checkpoint(fp8, tmp_path / "ref")
    logits, tokens = run_greedy(fp8)
    ref_logits, ref_tokens = run_greedy(ref)
    torch.testing.assert_close(logits, ref_logits, atol=1e-4, rtol=0)
    assert tokens == ref_tokens
    hf = torch.cat(hf_prefill_logits(str(ref), PROMPTS))
    torch.testing.assert_close(logits, hf, atol=1e-3, rtol=0)
    assert tokens == hf_greedy(str(ref), PROMPTS, GREEDY.max_tokens)
    # the quantization is not a no-op: the original weights give other logits
    assert (run_greedy(src)[0] - logits).abs().max() > 1e-2


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_moe"])
def test_online_fp8_is_per_channel(arch, tmp_path):
    """``--quantization fp8`` on a float32 checkpoint = the same weights quantized per output
    channel by the independent quantizer of the tests (experts: 128x128 blocks), dequantized."""
    src = make_tiny_checkpoint(arch, tmp_path / "src", **WIDE)
    ref = make_online_reference_checkpoint(src, tmp_path / "ref")
    logits, tokens = run_greedy(src, quantization="fp8")
    ref_logits, ref_tokens = run_greedy(ref)
    torch.testing.assert_close(logits, ref_logits, atol=1e-4, rtol=0)
    assert tokens == ref_tokens
    assert (run_greedy(src)[0] - logits).abs().max() > 1e-3  # not a no-op


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_moe"])
def test_online_fp8_block_matches_the_checkpoint_format(arch, tmp_path):
    """``--quantization fp8-block``: online quantization into the published format (128x128
    blocks)."""
    src = make_tiny_checkpoint(arch, tmp_path / "src", **WIDE)
    ref = make_dequantized_checkpoint(make_fp8_checkpoint(src, tmp_path / "fp8"), tmp_path / "ref")
    logits, tokens = run_greedy(src, quantization="fp8-block")
    ref_logits, ref_tokens = run_greedy(ref)
    torch.testing.assert_close(logits, ref_logits, atol=1e-4, rtol=0)
    assert tokens == ref_tokens


def test_quantization_option_picks_the_format():
    from minisgl.quant import Fp8Config, UnquantizedConfig, resolve_quantization
    from minisgl.quant.fp8_block import Fp8BlockLinearMethod
    from minisgl.quant.fp8_channel import Fp8ChannelLinearMethod
    from minisgl.quant.unquantized import UnquantizedLinearMethod

    channel = resolve_quantization(None, "fp8")
    assert channel == Fp8Config(online=True, channel=True)
    assert isinstance(channel.linear_method(), Fp8ChannelLinearMethod)
    block = resolve_quantization(None, "fp8-block")
    assert block == Fp8Config(online=True, channel=False)
    assert isinstance(block.linear_method(), Fp8BlockLinearMethod)
    assert resolve_quantization(None, None) == UnquantizedConfig()
    assert isinstance(UnquantizedConfig().linear_method(), UnquantizedLinearMethod)
    checkpoint = Fp8Config(block=(64, 64))  # the checkpoint's own format wins over the option
    assert resolve_quantization(checkpoint, "fp8") == checkpoint
    switched = resolve_quantization(None, "fp8", norm_gemv=False, gemv=False)
    assert (switched.gemv, switched.norm_gemv, switched.norm_quant) == (False, False, True)
    assert not switched.linear_method().fuses_one_token
    with pytest.raises(ValueError, match="quantization: 'tensor'"):
        resolve_quantization(None, "tensor")
    with pytest.raises(ValueError, match="per-channel"):
        Fp8Config(channel=True)


def test_fp8_weights_are_stored_as_fp8(tmp_path):
    src = make_tiny_checkpoint("qwen3_moe", tmp_path / "src", **WIDE)
    fp8 = make_fp8_checkpoint(src, tmp_path / "fp8")
    for path, opts, qkv_scale in ((fp8, {}, (8, 1)), (src, {"quantization": "fp8"}, (1024, 1)),
                                  (fp8, {"dummy_weights": True}, (8, 1))):
        sched = scheduler(path, **opts)
        model = sched.engine.model
        layer = model.layers[0]
        for w in (layer.self_attn.qkv_proj.weight, layer.self_attn.o_proj.weight, layer.mlp.w13,
                  layer.mlp.w2):
            assert w.dtype == torch.float8_e4m3fn
        # blocks: (512 + 2*256) / 128 rows; online: one scale per output channel
        assert layer.self_attn.qkv_proj.weight_scale_inv.shape == qkv_scale
        assert layer.mlp.w13_scale_inv.shape == (4, 2, 1)  # experts keep 128x128 blocks
        assert layer.mlp.gate.weight.dtype == torch.float32  # the router stays unquantized
        assert model.embed_tokens.weight.dtype == torch.float32
        sched.close()


def test_independent_quantizer_agrees_with_minisgl():
    from minisgl.quant import dequantize_block, quantize_block

    w = torch.randn(100, 70) * 3
    q, s = quantize_block(w, (32, 16))
    q2, s2 = quantize(w, (32, 16))
    torch.testing.assert_close(s, s2)
    assert torch.equal(q.view(torch.uint8), q2.view(torch.uint8))
    torch.testing.assert_close(dequantize_block(q, s, (32, 16)), dequantize(q2, s2, (32, 16)))
    # e4m3 keeps 3 mantissa bits: every element within 2^-4 of its value (relative)
    err = (dequantize_block(q, s, (32, 16)) - w).abs()
    assert (err <= w.abs() / 16 + s.max() * 2 ** -9).all()


def test_per_channel_quantizer_agrees_with_the_independent_one():
    from minisgl.quant import dequantize_channel, quantize_channel

    w = torch.randn(3, 100, 70) * 3
    w[1, 5] = 0.0  # an all-zero row keeps a finite scale
    q, s = quantize_channel(w)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (3, 100, 1) and s.dtype == torch.float32
    for e in range(3):
        q2, s2 = quantize_rows(w[e])
        torch.testing.assert_close(s[e], s2)
        assert torch.equal(q[e].view(torch.uint8), q2.view(torch.uint8))
    deq = dequantize_channel(q, s)
    torch.testing.assert_close(deq, q.float() * s)
    assert (deq[1, 5] == 0).all()
    err = (deq - w).abs()
    assert (err <= w.abs() / 16 + s * 2 ** -9).all()
    # the whole rows' largest magnitudes (a row-parallel shard): the shard is quantized as TP=1
    q_full, s_full = quantize_channel(w[0])
    q_half, s_half = quantize_channel(w[0, :, 35:], amax=w[0].abs().amax(-1))
    torch.testing.assert_close(s_half, s_full)
    assert torch.equal(q_half.view(torch.uint8), q_full[:, 35:].view(torch.uint8))
    with pytest.raises(ValueError, match="per-channel weight scale"):
        dequantize_channel(q[0], s[0].T)


def test_fp8_linear_per_channel_on_cpu_is_the_dequantized_matmul():
    from minisgl.layers.activation import silu_and_mul_ref
    from minisgl.quant import fp8_linear, quantize_channel

    w = torch.randn(48, 32)
    q, s = quantize_channel(w)
    x, b = torch.randn(5, 64), torch.randn(48)
    ref = silu_and_mul_ref(x) @ (q.float() * s).T + b
    torch.testing.assert_close(fp8_linear(x, q, s, None, b, gated=True), ref)


def test_which_layers_take_a_quantized_input():
    """``takes_quantized_input``: the layers whose input the norm may quantize are exactly those
    that would quantize it per token themselves (per-channel e4m3, ``_scaled_mm``'s alignment, a
    bf16 model); and a model's dense layers are marked so only with online per-channel FP8."""
    from minisgl.quant import quantize_block, quantize_channel
    from minisgl.quant.fp8_dispatch import takes_quantized_input

    q, s = quantize_channel(torch.randn(48, 32))
    bf16 = torch.bfloat16
    assert takes_quantized_input(q, s, None, bf16)
    assert not takes_quantized_input(q, s, None, torch.float16)  # fp16: the W8A16 GEMM, x as is
    assert not takes_quantized_input(q[:, :24], s, None, bf16)  # K not a multiple of 16
    assert not takes_quantized_input(q.float(), None, None, bf16)  # an unquantized layer
    qb, sb = quantize_block(torch.randn(48, 32), (16, 16))
    assert not takes_quantized_input(qb, sb, (16, 16), bf16)  # blocks: 128-column groups


@pytest.mark.parametrize("arch, quantization, marked", [
    ("qwen3", "fp8", True), ("qwen3", None, False), ("qwen3_moe", "fp8", False)])
def test_decoder_layers_marked_for_quantized_inputs(arch, quantization, marked, tmp_path):
    src = make_tiny_checkpoint(arch, tmp_path / "src", **WIDE)
    sched = scheduler(src, dtype="bfloat16", quantization=quantization)
    assert all(layer.fusion.quantized_inputs == marked for layer in sched.engine.model.layers)
    # the norms are folded exactly where the inputs may come quantized (dense per-channel layers)
    assert all(layer.fusion.folded == marked for layer in sched.engine.model.layers)
    sched.close()


def test_kernel_switches_reach_the_layers(tmp_path):
    """The ablation options are decided at load: the unquantized layers' GEMV switch, and the
    per-channel fusions (norms still folded; no one-token path, no quantized inputs)."""
    src = make_tiny_checkpoint("qwen3_moe", tmp_path / "src", mlp_only_layers=[0], **WIDE)
    sched = scheduler(src, quantization="fp8", disable_gemv=True, disable_norm_gemv=True,
                      disable_norm_quant=True)
    engine = sched.engine
    assert (engine.config.gemv, engine.config.norm_gemv, engine.config.norm_quant) == \
        (False, False, False)
    model = engine.model
    assert not model.lm_head.method.gemv
    dense = [layer for layer in model.layers if hasattr(layer.mlp, "gate_up_proj")]
    sparse = [layer for layer in model.layers if not hasattr(layer.mlp, "gate_up_proj")]
    assert dense and sparse and all(not layer.mlp.gate.method.gemv for layer in sparse)
    assert all(layer.fusion.folded and not layer.fusion.one_token
               and not layer.fusion.quantized_inputs for layer in dense)
    assert all(not layer.fusion.folded for layer in sparse)  # an MoE block takes no norm weight
    sched.close()


def test_row_parallel_shards_are_quantized_with_whole_rows():
    """Two row-parallel ranks of an online per-channel layer hold TP=1's e4m3 values and scales."""
    from types import SimpleNamespace

    from minisgl.distributed import DistributedInfo
    from minisgl.layers import LinearRowParallel
    from minisgl.quant import Fp8Config

    quant = Fp8Config(online=True, channel=True)
    w = torch.randn(32, 64)
    w[3, 40] = 50.0  # the largest of row 3 lies in rank 1's half
    layers = []
    for rank, size in ((0, 1), (0, 2), (1, 2)):
        comm = SimpleNamespace(info=DistributedInfo(rank, size))
        layer = LinearRowParallel(64, 32, False, comm, quant)
        layer.weight.weight_loader(layer.weight, w, None)
        layer.process_weights_after_loading()
        layers.append(layer)
    whole, r0, r1 = layers
    torch.testing.assert_close(r0.weight_scale_inv, whole.weight_scale_inv)
    torch.testing.assert_close(r1.weight_scale_inv, whole.weight_scale_inv)
    joined = torch.cat([r0.weight, r1.weight], dim=1)
    assert torch.equal(joined.view(torch.uint8), whole.weight.view(torch.uint8))


# ---------------------------------------------------------------- FP8 KV cache


def test_fp8_kv_pool_round_trips_within_fp8_error():
    from minisgl.kvcache import CacheSpec, create_kvcache_pool
    from minisgl.kvcache.spec import AttentionSpec

    spec = CacheSpec(tuple(AttentionSpec(i, 2, 2, 16, 0.25) for i in range(2)))
    pool = create_kvcache_pool(spec, 8, 4, torch.float8_e4m3fn, "cpu")
    assert pool.mem_bytes == 2 * 2 * 32 * 2 * 16  # one byte per element
    pool.set_kv_scales(1, 0.05, 2.0)
    g = torch.Generator().manual_seed(0)
    k, v = torch.randn(5, 2, 16, generator=g) * 4, torch.randn(5, 2, 16, generator=g) * 300
    loc = torch.tensor([3, 7, 8, 20, 31])
    for layer in (0, 1):
        pool.store_kv(k, v, loc, layer)
        k2, v2 = pool.read_kv(layer, loc, torch.float32)
        ks, vs = pool.kv_scales(layer)
        for x, y, s in ((k, k2, ks), (v, v2, vs)):
            limit = 448 * s
            exact = x.clamp(-limit, limit)  # beyond the scaled range: saturated, never NaN
            assert torch.isfinite(y).all()
            assert ((y - exact).abs() <= exact.abs() / 16 + s * 2 ** -9).all()
    # v * 300 saturates at scale 1
    assert (pool.read_kv(0, loc, torch.float32)[1].abs().max() == 448)
    assert pool.read_kv(1, loc, torch.float32)[1].abs().max() > 448  # scale 2 holds it


@pytest.mark.parametrize("arch", ["qwen3", pytest.param("qwen3_moe", marks=pytest.mark.slow)])
def test_fp8_kv_cache_model(arch, tmp_path):
    """FP8 K/V change the logits by FP8's rounding only: the stored K/V are within 2^-4 (relative)
    of the exact ones, and attention averages such errors; so the logits stay within 5% of their
    magnitude here, while a wrong scale (x2) or an unconverted read moves them by far more."""
    src = make_tiny_checkpoint(arch, tmp_path / "src")
    exact, _ = run_greedy(src)
    fp8_kv, _ = run_greedy(src, kv_cache_dtype="fp8_e4m3")
    mad, magnitude = (fp8_kv - exact).abs().mean(), exact.abs().mean()
    assert 0 < mad < 0.05 * magnitude
    # per-layer scales of the checkpoint reach the pool, and a consistent scale changes little
    fp8 = make_fp8_checkpoint(src, tmp_path / "fp8", (16, 16),
                              kv_scales={0: (0.5, 0.25), 1: (2.0, 1.0)})
    sched = scheduler(fp8, kv_cache_dtype="fp8_e4m3")
    assert sched.engine.kv_pool.kv_scales(0) == (0.5, 0.25)
    assert sched.engine.kv_pool.kv_scales(1) == (2.0, 1.0)
    sched.close()
    scaled, _ = run_greedy(fp8, kv_cache_dtype="fp8_e4m3")
    unscaled_ref, _ = run_greedy(make_dequantized_checkpoint(fp8, tmp_path / "ref"))
    assert (scaled - unscaled_ref).abs().mean() < 0.05 * unscaled_ref.abs().mean()


def test_fp8_kv_cache_doubles_the_capacity(tmp_path):
    src = make_tiny_checkpoint("qwen3", tmp_path / "src")
    opts = dict(num_pages=None, kv_cache_memory_gb=2 ** -12, max_running_requests=64)
    auto, fp8 = scheduler(src, **opts), scheduler(src, kv_cache_dtype="fp8_e4m3", **opts)
    assert fp8.engine.kv_bytes_per_token * 4 == auto.engine.kv_bytes_per_token  # float32 -> 1 byte
    assert fp8.engine.num_pages == 4 * auto.engine.num_pages
    auto.close()
    fp8.close()


# ---------------------------------------------------------------- bad options


def test_bad_options_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="quantization: 'int4'"):
        EngineOptions(quantization="int4")
    with pytest.raises(ValueError, match="kv_cache_dtype: 'fp8_e5m2'"):
        EngineOptions(kv_cache_dtype="fp8_e5m2")
    from minisgl.server.launch.args import parse_args

    engine = parse_args(["--quantization", "fp8", "--kv-cache-dtype", "fp8_e4m3"]).engine
    assert (engine.quantization, engine.kv_cache_dtype) == ("fp8", "fp8_e4m3")


@pytest.mark.parametrize("change, message", [
    ({"quant_method": "awq"}, "quant_method: 'awq'"),
    ({"activation_scheme": "static"}, "activation_scheme: 'static'"),
    ({"fmt": "e5m2"}, "fmt: 'e5m2'"),
    ({"weight_block_size": None}, "weight_block_size: missing"),
    ({"weight_block_size": [128, 100]}, "power of two"),
])
def test_unsupported_checkpoint_formats_are_named(change, message, tmp_path):
    from minisgl.models import ModelConfig

    src = make_tiny_checkpoint("qwen3", tmp_path / "src")
    fp8 = make_fp8_checkpoint(src, tmp_path / "fp8", (16, 16))
    cfg = json.loads((fp8 / "config.json").read_text())
    cfg["quantization_config"].update(change)
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_dict(cfg)


def test_fp8_needs_ada_or_hopper():
    from minisgl.quant import fp8_device_error

    assert fp8_device_error("cpu", None) is None  # the dequantizing reference
    assert fp8_device_error("cuda", (9, 0)) is None and fp8_device_error("cuda", (8, 9)) is None
    message = fp8_device_error("cuda", (8, 0))
    assert "compute capability 8.9" in message and "8.0" in message


@pytest.mark.gpu
@pytest.mark.parametrize("kv", ["auto", "fp8_e4m3"])
def test_gpu_fp8_model_close_to_dequantized_reference(kv, tmp_path):
    """On CUDA (bf16, Triton GEMM/GEMV/fused MoE, CUDA graphs) the FP8 model also quantizes the
    activations: its logits stay within 10% (mean) of the fp32 dequantized model on CPU, and decode
    with CUDA graphs gives the tokens that eager decode gives.

    10%: e4m3 keeps 3 mantissa bits, so each quantized activation is off by up to 1/16 of itself
    (about 3% on average); the tiny random model's logits have been seen 5.8% (bf16 cache) and 6.8%
    (e4m3 cache) off on an H100. A wrong scale or block layout is off by the logits' own size."""
    src = make_tiny_checkpoint("qwen3_moe", tmp_path / "src", **WIDE)
    fp8 = make_fp8_checkpoint(src, tmp_path / "fp8")
    ref, _ = run_greedy(make_dequantized_checkpoint(fp8, tmp_path / "ref"))
    opts = dict(device="cuda", dtype="bfloat16", kv_cache_dtype=kv, attn="triton")
    logits, tokens = run_greedy(fp8, **opts)
    assert (logits.float().cpu() - ref).abs().mean() < 0.10 * ref.abs().mean()
    _, eager = run_greedy(fp8, cuda_graph_max_bs=0, **opts)
    assert tokens == eager


@pytest.mark.gpu
def test_gpu_one_token_gemv_norms(tmp_path):
    """``--quantization fp8``, one token: the GEMVs normalise and add the residual themselves
    (``LlamaDecoderLayer._forward_one_token``). Against the same model through the norm kernels
    (``disable_norm_gemv``): one-token logits within 1% (mean; bf16 roundings differ: the folded
    path skips the norm's rounding of x), the same greedy tokens of one request decoded with CUDA
    graphs."""
    src = make_tiny_checkpoint("qwen3", tmp_path / "src", **WIDE)
    opts = dict(device="cuda", dtype="bfloat16", attn="triton", quantization="fp8")
    prompts = [[17], [93]]

    def run(norm_gemv: bool) -> tuple[torch.Tensor, list[list[int]]]:
        sched = scheduler(src, disable_norm_gemv=not norm_gemv, **opts)
        layer = sched.engine.model.layers[0]
        assert layer.fusion.folded and (layer.input_layernorm.weight == 1).all()
        assert layer.fusion.one_token == norm_gemv
        one = torch.cat([prefill_logits(sched, [p]) for p in prompts]).float()
        return one, logits_and_tokens(sched, PROMPTS[:1], GREEDY)[1]

    fused, fused_tokens = run(True)
    kernels, kernel_tokens = run(False)
    assert (fused - kernels).abs().mean() < 0.01 * kernels.abs().mean()
    assert not torch.equal(fused, kernels)  # the fused path ran
    assert fused_tokens == kernel_tokens


@pytest.mark.gpu
def test_gpu_norms_quantize_fp8_inputs(tmp_path):
    """``--quantization fp8``, batches of 2+ tokens: the RMSNorms before QKV and gate-up quantize
    their output per token (``rms_norm_quant``) in place of the layers' own quantization kernel
    (``disable_norm_quant``). The same e4m3 operands reach the same GEMMs, so prefill logits and
    the greedy tokens of three requests decoded together (CUDA graphs) are the same bits."""
    src = make_tiny_checkpoint("qwen3", tmp_path / "src", **WIDE)
    opts = dict(device="cuda", dtype="bfloat16", attn="triton", quantization="fp8")

    def run(norm_quant: bool) -> tuple[torch.Tensor, list[list[int]]]:
        sched = scheduler(src, disable_norm_quant=not norm_quant, **opts)
        assert all(layer.fusion.quantized_inputs == norm_quant
                   for layer in sched.engine.model.layers)
        return logits_and_tokens(sched, PROMPTS, GREEDY)

    fused, fused_tokens = run(True)
    kernels, kernel_tokens = run(False)
    assert torch.equal(fused, kernels) and fused_tokens == kernel_tokens
