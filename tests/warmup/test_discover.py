"""The variants of a whole engine, found by a shadow run on a CPU: Qwen3's forwards (prefill,
mixed, eager and graph decode, piecewise graphs) and its sampler, the same on every run; a
sliding-window model's piecewise graphs over the sliding layers' own pool."""

from __future__ import annotations

import json
import sys
import types
from dataclasses import replace

import pytest
import torch

from minisgl.engine import EngineConfig
from minisgl.warmup.discover import KernelSet, discover
from minisgl.warmup.plan import FEATURE_STAGES

pytestmark = pytest.mark.slow  # a shadow engine on fake CUDA tensors: ~10 s on two cores


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
    """Qwen3-0.6B's config alone: a shadow run reads no weights."""
    d = tmp_path_factory.mktemp("qwen3-0.6b")
    with open("benchmark/configs/qwen3-0.6b.json") as f:
        (d / "config.json").write_text(f.read())
    return str(d)


def _config(model: str) -> EngineConfig:
    return EngineConfig(model_path=model, device=torch.device("cuda"), dtype=torch.bfloat16,
                        attention_backend="triton", moe_backend="triton", sampler="triton",
                        max_running_reqs=64, cuda_graph_max_bs=32,
                        piecewise_cuda_graph_max_tokens=512, max_forward_tokens=1024)


def test_a_shadow_run_finds_every_kernel_of_the_plan_deterministically(qwen3_dir):
    first = discover(_config(qwen3_dir), grammar=True)
    assert not first.failed and not first.autotuned
    essential = {v.short_name for v in first.essential}
    assert {"_rmsnorm_kernel", "_rope_kernel", "_extend_kernel", "_decode_stage1",
            "_decode_stage2", "_silu_and_mul_kernel", "_gemv_kernel", "_gather_kernel",
            "_partial_kernel", "_final_kernel", "_scatter_kernel"} <= essential
    # batch sizes, token counts and graph rows collapse into few variants
    assert sum(v.short_name == "_rmsnorm_kernel" for v in first.essential) == 2  # +- residual
    assert sum(v.short_name == "_gather_kernel" for v in first.essential) == 1
    assert len(first.stages) == len(FEATURE_STAGES)
    assert sum(map(len, first.stages)) == 67  # the sampler's (test_variants.py)
    assert not set(first.essential) & {v for s in first.stages for v in s}
    again = discover(_config(qwen3_dir), grammar=True)
    assert again.essential == first.essential and again.stages == first.stages
    assert KernelSet.from_json(first.to_json()).all == first.all
    json.loads(first.to_json())  # plain JSON: the kernel cache's plan file


def test_a_hybrid_models_linear_attention_kernels_are_found(tmp_path, monkeypatch):
    """Qwen3.5's Gated DeltaNet layers: the conv and delta-rule kernels of prefill and decode
    (fla's chunked rule stands in by its shapes: it is autotuned on first use)."""
    fla = {name: types.ModuleType(name) for name in
           ("fla", "fla.ops", "fla.ops.gated_delta_rule")}
    fla["fla.ops.gated_delta_rule"].chunk_gated_delta_rule = None  # type: ignore[attr-defined]
    for name, module in fla.items():  # not installed here; never called by a shadow run
        monkeypatch.setitem(sys.modules, name, module)
    with open("benchmark/configs/qwen3.5-0.8b.json") as f:
        (tmp_path / "config.json").write_text(f.read())
    found = discover(replace(_config(str(tmp_path)), linear_attn_backend="triton"),
                     grammar=False)
    assert not found.failed
    names = {v.short_name for v in found.essential}
    assert {"_conv_varlen_kernel", "_conv_state_kernel", "_conv_decode_kernel",
            "_gdn_decode_kernel", "_qk_norm_rope_kernel", "_extend_kernel"} <= names
    # the per-request vectors' alignment makes no variant
    assert sum(v.short_name == "_conv_varlen_kernel" for v in found.essential) <= 2


def test_piecewise_graphs_store_the_sliding_layers_kv_in_their_own_pool(tmp_path, monkeypatch):
    """Gemma 3 27B may give its sliding layers a pool of their own (``sliding_pool_ratio``
    auto), so the shadow engine does: its piecewise graphs store those layers' K/V through a
    second static slot buffer (``window_out_loc``), and every forward of the plan runs."""
    from minisgl.engine.piecewise import PiecewiseRunner

    with open("benchmark/configs/gemma-3-27b-it.json") as f:
        (tmp_path / "config.json").write_text(f.read())
    windowed: list[bool] = []
    run_eager = PiecewiseRunner.run_eager

    def spy(self, batch):
        windowed.append(self.window_out_loc is not None and batch.window_out_loc is not None)
        return run_eager(self, batch)

    monkeypatch.setattr(PiecewiseRunner, "run_eager", spy)
    found = discover(_config(str(tmp_path)), grammar=False)
    assert not found.failed
    assert windowed and all(windowed)


def test_a_flashinfer_engine_is_shadowed_without_calling_flashinfer(qwen3_dir, monkeypatch):
    """``--attn fi``: FlashInfer's C++ would read the fake tensors' memory and crash the
    process (the stand-in asserts instead), and it has no Triton kernel to record; the shadow
    run finds the rest of the engine's variants, and no Triton attention."""
    from helpers import fake_flashinfer

    monkeypatch.setitem(sys.modules, "flashinfer", fake_flashinfer)
    found = discover(replace(_config(qwen3_dir), attention_backend="fi"), grammar=False)
    assert not found.failed
    names = {v.short_name for v in found.essential}
    assert {"_rmsnorm_kernel", "_rope_kernel", "_silu_and_mul_kernel", "_gemv_kernel"} <= names
    assert not names & {"_extend_kernel", "_decode_stage1", "_decode_stage2"}


FP8_BLOCK = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
             "weight_block_size": [128, 128]}


@pytest.mark.parametrize("name,quant,kernels", [
    ("gpt-oss-20b", None, {"moe_gemv_mx_kernel", "moe_gemm_mx_wide_kernel", "_topk_route_kernel"}),
    ("qwen3-0.6b", FP8_BLOCK, {"_fp8_gemv_kernel", "_fp8_gemm_kernel", "_quantize_act_kernel"}),
])
def test_quantized_weights_are_shadowed_in_their_checkpoint_format(tmp_path, name, quant,
                                                                   kernels):
    """gpt-oss's MXFP4 experts, a block-scaled FP8 checkpoint: the shadow run's uninitialised
    weights come quantized as the checkpoint holds them (blocks and scales), so they load, take
    their backend's layout, and the quantized GEMMs are found."""
    with open(f"benchmark/configs/{name}.json") as f:
        raw = json.load(f)
    raw.update(num_hidden_layers=2, vocab_size=4096)
    if "layer_types" in raw:
        raw["layer_types"] = raw["layer_types"][:2]
    if quant is not None:
        raw["quantization_config"] = quant
    (tmp_path / "config.json").write_text(json.dumps(raw))
    found = discover(_config(str(tmp_path)), grammar=False)
    assert not found.failed
    assert kernels <= {v.short_name for v in found.essential}
