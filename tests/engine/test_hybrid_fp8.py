"""FP8 for the big hybrid checkpoints (Qwen3.5-27B, Qwen3.6-35B-A3B) on CPU, tiny random configs.

* ``--quantization fp8`` from a bf16 checkpoint in several shards: the model is the model of the
  dequantized weights, and while loading, the unquantized weights alive at once never exceed one
  decoder layer's (each layer is quantized as soon as its last tensor arrived; the bf16 model never
  resides whole). The same for ``--dummy-weights`` and for tensors that arrive out of order.
* Qwen's own FP8 checkpoints (block FP8 with ``weight_scale_inv``; the Gated DeltaNet's
  ``in_proj_b``/``in_proj_a``, the router and the shared expert's gate unquantized): the model is
  the model of the dequantized checkpoint (the CPU path dequantizes, so only the order of the sums
  differs), and ``--dummy-weights`` makes such a checkpoint's tensors.
"""

from __future__ import annotations

import dataclasses
import zlib

import pytest
import torch

from helpers.engine_utils import logits_and_tokens, prefill_logits
from helpers.fp8_models import dequantize_scaled, make_dequantized_checkpoint
from helpers.hf_models import random_prompts
from helpers.hybrid_models import (
    make_hybrid_checkpoint,
    make_qwen_fp8_checkpoint,
    save_sharded,
    stack_experts,
)
from minisgl import LLM, SamplingParams

FP8 = torch.float8_e4m3fn
PROMPTS = random_prompts(3, [5, 23, 41], 256, seed=0)
GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
ARCHS = ("qwen3_5_moe", "qwen3_5")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Per family: its float32 checkpoint and the same in bf16, cut into five shards."""
    root = tmp_path_factory.mktemp("hybrid_fp8")
    out = {}
    for arch in ARCHS:
        src = make_hybrid_checkpoint(arch, root / arch)
        out[arch] = (src, save_sharded(src, root / f"{arch}_bf16", shards=5))
    return out


def make_llm(path, **options) -> LLM:
    return LLM(str(path), device="cpu", dtype="float32", num_pages=4096, **options)


def build_model(path, quantization: str | None = "fp8"):
    """The model class of ``path`` as the engine builds it (one rank, float32), not loaded."""
    from minisgl.distributed import DistributedCommunicator, DistributedInfo
    from minisgl.layers.base import restore_param_dtypes
    from minisgl.models import ModelConfig
    from minisgl.models.registry import get_model_class
    from minisgl.moe import create_moe_backend
    from minisgl.quant import resolve_quantization

    mc = ModelConfig.from_path(str(path))
    mc = dataclasses.replace(mc, quant=resolve_quantization(mc.quant, quantization))
    model = get_model_class(mc.architecture)(mc, DistributedCommunicator(DistributedInfo(0, 1)),
                                             create_moe_backend("torch"))
    model = model.to(torch.float32).eval()
    restore_param_dtypes(model)
    return model, mc


def load_watching(model, stream, names) -> list[dict[str, int]]:
    """Load ``stream`` (``(name, tensor)`` pairs, ``names`` listed up front) into ``model`` and
    record, before each tensor, the bytes of every parameter that is stored and not FP8."""
    from minisgl.models.weight import WeightStream

    snapshots = []

    def watched():
        for item in stream:
            snapshots.append({n: p.numel() * p.element_size()
                              for n, p in model.named_parameters() if p.dtype != FP8})
            yield item

    model.load_weights(WeightStream(list(names), watched()))
    return snapshots


def peak_unquantized(model, snapshots) -> tuple[int, int, int]:
    """(most bytes of to-be-FP8 weights held unquantized at once, the largest layer's, the whole
    model's): those weights are the parameters that are FP8 once loading is done."""
    quantized = {n: p.numel() * 4 for n, p in model.named_parameters() if p.dtype == FP8}
    per_layer: dict[str, int] = {}
    for name, size in quantized.items():
        layer = ".".join(name.split(".")[:2])
        per_layer[layer] = per_layer.get(layer, 0) + size
    peak = max(sum(s.get(n, 0) for n in quantized) for s in snapshots)
    return peak, max(per_layer.values()), sum(quantized.values())


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_fp8_from_bf16_shards_is_the_dequantized_model(arch, checkpoints):
    """``--quantization fp8`` on a sharded bf16 checkpoint, layers quantized while loading: the
    model of its own dequantized weights, and not the bf16 model (quantization happened)."""
    _, sharded = checkpoints[arch]
    llm = make_llm(sharded, quantization="fp8")
    model = llm.scheduler.engine.model
    linear = next(layer.linear_attn for layer in model.layers if layer.is_linear)
    attn = next(layer.self_attn for layer in model.layers if not layer.is_linear)
    for proj in (linear.in_proj_qkvz, linear.out_proj, attn.qkv_proj, attn.o_proj):
        assert proj.weight.dtype == FP8
    assert linear.in_proj_ba.weight.dtype == torch.float32  # never quantized
    ref = make_llm(sharded, cache="naive")  # run twice: no prefix hits
    bf16 = prefill_logits(ref.scheduler, PROMPTS)
    params = dict(ref.scheduler.engine.model.named_parameters())
    quantized = dict(model.named_parameters())
    for name, param in quantized.items():
        if param.dtype == FP8:
            params[name].data.copy_(dequantize_scaled(param, quantized[name + "_scale_inv"]))
    logits = prefill_logits(llm.scheduler, PROMPTS)
    torch.testing.assert_close(logits, prefill_logits(ref.scheduler, PROMPTS), atol=1e-4, rtol=0)
    assert (logits - bf16).abs().max() > 1e-3


@pytest.mark.parametrize("arch", ARCHS)
def test_loading_holds_one_layer_unquantized_at_most(arch, checkpoints):
    """The unquantized copies of the weights that end up FP8 never exceed the largest decoder
    layer's at any point of loading the shards (the model built whole in bf16 and quantized at the
    end, as before, holds all of them: several times more)."""
    from minisgl.models.weight import iter_weights

    model, _ = build_model(checkpoints[arch][1])
    stream = iter_weights(str(checkpoints[arch][1]))
    snapshots = load_watching(model, stream, stream.names)
    peak, layer, whole = peak_unquantized(model, snapshots)
    assert 0 < peak <= layer < whole / 4


@pytest.mark.parametrize("arch", ARCHS)
def test_dummy_weights_hold_one_layer_unquantized_at_most(arch, checkpoints):
    """``--dummy-weights --quantization fp8``: random tensors drawn one at a time, each layer
    quantized when complete."""
    from minisgl.models.weight import dummy_weights

    model, mc = build_model(checkpoints[arch][0])
    stream = dummy_weights(mc, 0, torch.device("cpu"), torch.float32)
    snapshots = load_watching(model, stream, stream.names)
    peak, layer, whole = peak_unquantized(model, snapshots)
    assert 0 < peak <= layer < whole / 4
    assert model.layers[0].mlp.gate_up_proj.weight.dtype == FP8 if arch == "qwen3_5" else \
        model.layers[0].mlp.experts.w13.dtype == FP8


def test_tensors_out_of_order_load_the_same_model(checkpoints):
    """Layers whose tensors arrive interleaved (the checkpoint shuffled) are processed when each is
    complete: the same FP8 model as in order."""
    from minisgl.models.weight import iter_weights

    path = checkpoints["qwen3_5_moe"][1]
    forward, _ = build_model(path)
    forward.load_weights(iter_weights(str(path)))
    backward, _ = build_model(path)
    stream = iter_weights(str(path))
    shuffled = sorted(stream, key=lambda item: zlib.crc32(item[0].encode()))
    load_watching(backward, shuffled, stream.names)
    theirs = dict(backward.named_parameters())
    for name, param in forward.named_parameters():
        assert torch.equal(param.view(torch.uint8) if param.dtype == FP8 else param,
                           theirs[name].view(torch.uint8) if param.dtype == FP8
                           else theirs[name]), name


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_qwen_fp8_checkpoint_matches_dequantized_model(arch, checkpoints, tmp_path):
    """A checkpoint in the layout of Qwen's FP8 releases (16x16 blocks at these sizes) computes
    what the float32 model of its dequantized weights computes: same tokens, logits to 1e-4."""
    src, _ = checkpoints[arch]
    fp8 = make_qwen_fp8_checkpoint(src, tmp_path / "fp8", (16, 16))
    ref = make_dequantized_checkpoint(fp8, tmp_path / "ref")
    llm = make_llm(fp8)
    model = llm.scheduler.engine.model
    linear = model.layers[0].linear_attn
    assert linear.in_proj_qkvz.weight.dtype == FP8 and linear.out_proj.weight.dtype == FP8
    assert linear.in_proj_ba.weight.dtype == torch.float32
    if arch == "qwen3_5_moe":
        mlp = model.layers[0].mlp
        assert mlp.experts.w13.dtype == FP8 and mlp.shared_expert.gate_up_proj.weight.dtype == FP8
    logits, tokens = logits_and_tokens(llm.scheduler, PROMPTS, GREEDY)
    ref_logits, ref_tokens = logits_and_tokens(make_llm(ref).scheduler, PROMPTS, GREEDY)
    torch.testing.assert_close(logits, ref_logits, atol=1e-4, rtol=0)
    assert tokens == ref_tokens


def test_unquantized_tensor_for_an_fp8_weight_is_refused(checkpoints, tmp_path):
    """A checkpoint that leaves unquantized a projection minisgl holds in FP8 (listed in its
    ``modules_to_not_convert``) fails naming the tensor, not with a silent cast."""
    import json

    from safetensors.torch import load_file, save_file

    src, _ = checkpoints["qwen3_5_moe"]
    fp8 = make_qwen_fp8_checkpoint(src, tmp_path / "fp8", (16, 16))
    tensors = load_file(str(fp8 / "model.safetensors"))
    name = "model.language_model.layers.0.linear_attn.out_proj.weight"
    tensors[name] = tensors[name].float()
    del tensors[name + "_scale_inv"]
    save_file(tensors, str(fp8 / "model.safetensors"))
    cfg = json.loads((fp8 / "config.json").read_text())
    cfg["quantization_config"]["modules_to_not_convert"].append("linear_attn.out_proj")
    (fp8 / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="out_proj.weight.*modules_to_not_convert"):
        make_llm(fp8)


@pytest.mark.parametrize("arch", ARCHS)
def test_dummy_weights_in_the_qwen_fp8_format(arch, checkpoints, tmp_path):
    """``--dummy-weights`` with an FP8 checkpoint's config: the tensors such a checkpoint holds
    (e4m3 weights and their scales, hybrid projections included), a model that generates."""
    src, _ = checkpoints[arch]
    fp8 = make_qwen_fp8_checkpoint(src, tmp_path / "fp8", (16, 16))
    llm = make_llm(fp8, dummy_weights=True)
    model = llm.scheduler.engine.model
    assert model.layers[0].linear_attn.in_proj_qkvz.weight.dtype == FP8
    out = llm.generate(PROMPTS[:2], GREEDY)
    assert [len(o.token_ids) for o in out] == [16, 16]


def test_fused_experts_quantize_per_layer_too(checkpoints, tmp_path):
    """Experts stored stacked (transformers 5's ``experts.gate_up_proj [E, 2I, H]`` and
    ``experts.down_proj [E, H, I]``) load into the same FP8 model as per-expert tensors, one
    layer unquantized at most."""
    from minisgl.models.weight import iter_weights

    src = checkpoints["qwen3_5_moe"][1]
    fused = stack_experts(src, tmp_path / "fused")
    model, _ = build_model(fused)
    stream = iter_weights(str(fused))
    peak, layer, whole = peak_unquantized(model, load_watching(model, stream, stream.names))
    assert 0 < peak <= layer < whole / 4
    reference, _ = build_model(src)
    reference.load_weights(iter_weights(str(src)))
    theirs = dict(model.named_parameters())
    for name, param in reference.named_parameters():
        bits = (lambda t: t.view(torch.uint8)) if param.dtype == FP8 else (lambda t: t)
        assert torch.equal(bits(param), bits(theirs[name])), name


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fp8_load_peak_on_the_gpu(checkpoints, tmp_path):
    """On CUDA, ``--quantization fp8 --dummy-weights`` of a hybrid MoE whose experts dominate:
    the most the GPU held while loading stays well under the bf16 weights (the FP8 model, about
    half of them, plus one of eight layers unquantized), and the model generates."""
    import json

    from minisgl.models import ModelConfig
    from minisgl.models.registry import get_model_class

    cfg = json.loads((checkpoints["qwen3_5_moe"][0] / "config.json").read_text())
    text = cfg["text_config"]
    text.update(hidden_size=1024, num_hidden_layers=8, num_attention_heads=8,
                num_key_value_heads=2, head_dim=128, vocab_size=1024, num_experts=64,
                moe_intermediate_size=256, shared_expert_intermediate_size=256,
                linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=128,
                linear_value_head_dim=128, layer_types=["linear_attention"] * 3
                + ["full_attention"] + ["linear_attention"] * 3 + ["full_attention"])
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(cfg))
    mc = ModelConfig.from_path(str(model_dir))
    bf16 = 2 * sum(torch.Size(shape).numel()
                   for _, shape in get_model_class(mc.architecture).checkpoint_shapes(mc))
    llm = LLM(str(model_dir), dummy_weights=True, quantization="fp8", dtype="bfloat16",
              num_pages=256, warmup="off")
    assert llm.scheduler.engine.load_peak_bytes < 0.8 * bf16
    out = llm.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    assert len(out[0].token_ids) == 4
    llm.close()
