"""gpt-oss against transformers (float32, CPU): a tiny random model with every parameter perturbed
(sinks, biases, router, experts), a sliding window of 8 on every other layer, YaRN, and the
clamped SwiGLU's limit crossed. Greedy tokens must be identical and logits within 1e-3, with
prompts longer than the window, prefill chunks that cross its edge, radix-cache hits, page sizes 1
and 16, and TP=2.

MXFP4: the checkpoint with MXFP4 experts runs against transformers on the float32 checkpoint of
the weights those experts stand for (dequantized by the tests' own code), and against the
engine's own float32 path on it.
"""

from __future__ import annotations

import pytest
import torch
from test_tp import run_rank, run_tp

from helpers.device import GPU_TEST_OPTIONS, TEST_DEVICE
from helpers.engine_utils import (
    conversation_with_radix_hits,
    prefill_logits,
    record_sampled_logits,
)
from helpers.gpt_oss_models import WINDOW, make_gpt_oss_checkpoint, make_mxfp4_pair
from helpers.hf_models import hf_greedy, hf_model, hf_prefill_logits, random_prompts
from minisgl import LLM, SamplingParams

pytestmark = pytest.mark.any_device
VOCAB = 256
LENGTHS = [5, 17, 33, 60]  # all but the first longer than the window
NEW_TOKENS = 64
GREEDY = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
SETTINGS = {
    "page1": dict(page_size=1),
    "page16": dict(page_size=16),
    # chunks of 5 and 13 tokens: chunk edges fall inside and across the 8-token window
    "chunked_across_window": dict(page_size=1, max_prefill_tokens=5),
    "chunked_page16": dict(page_size=16, max_prefill_tokens=13),
    "mixed_small_budget": dict(page_size=4, max_prefill_tokens=16, max_num_batched_tokens=20),
    "no_overlap": dict(page_size=1, max_prefill_tokens=16, disable_overlap=True),
    # the sliding layers' own pool, pages past the window given back (``--sliding-pool-ratio``)
    "window_pool": dict(page_size=1, sliding_pool_ratio=0.1, cache="naive"),
    "window_pool_page16_chunked": dict(page_size=16, max_prefill_tokens=13,
                                       sliding_pool_ratio=0.1, cache="naive"),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpt_oss")
    fp32 = make_gpt_oss_checkpoint(root / "fp32")
    mx, ref = make_mxfp4_pair(fp32, root / "mxfp4", root / "dequantized")
    return {"fp32": fp32, "mxfp4": mx, "dequantized": ref}


@pytest.fixture(scope="module")
def prompts():
    return random_prompts(len(LENGTHS), LENGTHS, VOCAB, seed=0)


@pytest.fixture(scope="module")
def reference(checkpoints, prompts):
    return {name: hf_greedy(checkpoints[name], prompts, NEW_TOKENS)
            for name in ("fp32", "dequantized")}


def make_llm(path, **options) -> LLM:
    options.setdefault("num_pages", 4096 // options.get("page_size", 1))
    return LLM(str(path), device=TEST_DEVICE, dtype="float32", **{**GPU_TEST_OPTIONS, **options})


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_greedy_matches_transformers(setting, checkpoints, prompts, reference):
    llm = make_llm(checkpoints["fp32"], **SETTINGS[setting])
    outputs = llm.generate(prompts, GREEDY)
    assert [o.token_ids for o in outputs] == reference["fp32"]
    llm.scheduler.check_integrity()


@pytest.mark.parametrize("name", ["fp32", "mxfp4"])
def test_prefill_and_decode_logits_match_transformers(name, checkpoints, prompts):
    """All positions of a batched prefill, then the sampled rows of every decode step; MXFP4
    against transformers on the dequantized weights."""
    path = checkpoints[name]
    ref_path = checkpoints["fp32" if name == "fp32" else "dequantized"]
    llm = make_llm(path, page_size=4)
    engine = llm.scheduler.engine
    logits = prefill_logits(llm.scheduler, prompts)
    torch.testing.assert_close(logits.cpu(), torch.cat(hf_prefill_logits(ref_path, prompts)),
                               atol=1e-3, rtol=0)
    recorded = record_sampled_logits(engine)
    outputs = llm.generate(prompts, GREEDY)
    model = hf_model(ref_path)
    for uid, (out, prompt) in enumerate(zip(outputs, prompts)):
        with torch.no_grad():
            ref = model(torch.tensor([prompt + out.token_ids[:-1]])).logits[0, len(prompt) - 1:]
        torch.testing.assert_close(torch.stack(recorded[uid]).cpu(), ref, atol=1e-3, rtol=0)


@pytest.mark.parametrize("page_size", [1, 16])
def test_radix_cache_hit_gives_same_tokens(page_size, checkpoints):
    path = checkpoints["fp32"]
    shared = random_prompts(1, [42], VOCAB, seed=1)[0]
    tails = random_prompts(3, [3, 9, 14], VOCAB, seed=2)
    prompts = [shared + t for t in tails]
    expected = hf_greedy(path, prompts, NEW_TOKENS)
    llm = make_llm(path, page_size=page_size, cache="radix")
    first = llm.generate(prompts[:1], GREEDY)
    rest = llm.generate(prompts[1:], GREEDY)
    assert llm.scheduler.cache.num_hit_tokens > WINDOW  # the hits reach past the window
    assert [o.token_ids for o in first + rest] == expected
    llm.scheduler.check_integrity()


@pytest.mark.parametrize("page_size", [1, 16])
def test_sliding_pool_with_radix_hits(page_size, checkpoints):
    """Turns of a conversation through the sliding layers' own pool and the radix cache: each
    resumes where the previous turn's cached KV ends."""
    conversation_with_radix_hits(checkpoints["fp32"], make_llm, page_size)


@pytest.mark.slow
@pytest.mark.skipif(TEST_DEVICE == "cuda" and torch.cuda.device_count() < 2,
                    reason="TP=2 on CUDA needs two GPUs")
def test_sliding_pool_with_radix_hits_tp2(checkpoints):
    conversation_with_radix_hits(
        checkpoints["fp32"], lambda path, **o: LLM(str(path), tp=2, device=TEST_DEVICE,
                                                   dtype="float32", num_pages=256, **o), 16)


@pytest.mark.gpu
def test_sliding_pool_under_cuda_graphs(checkpoints, prompts, reference):
    """Decode CUDA graphs over the sliding layers' own page table (sinks and the window in the
    decode kernel), then conversation turns resumed from radix hits."""
    llm = LLM(str(checkpoints["fp32"]), device="cuda", dtype="float32", num_pages=4096,
              sliding_pool_ratio=0.1, cache="radix")
    assert llm.scheduler.engine.graph_runner is not None
    assert [o.token_ids for o in llm.generate(prompts, GREEDY)] == reference["fp32"]
    llm.scheduler.check_integrity()
    conversation_with_radix_hits(
        checkpoints["fp32"], lambda path, **o: LLM(str(path), device="cuda", dtype="float32",
                                                   num_pages=4096 // o["page_size"], **o), 16)


def test_retraction_gives_the_same_tokens(checkpoints):
    """A pool too small for every request at once: the newest are retracted and resumed."""
    path = checkpoints["fp32"]
    prompts = random_prompts(5, [20, 25, 30, 18, 22], VOCAB, seed=5)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    tight = make_llm(path, num_pages=110)
    outputs = tight.generate(prompts, params)
    assert tight.scheduler.num_retractions > 0
    assert [o.token_ids for o in outputs] == hf_greedy(path, prompts, 24)
    tight.scheduler.check_integrity()


def held_experts(mlp) -> tuple[torch.Tensor, ...]:
    """An MXFP4 layer's (w13, w2, w13 scales, w2 scales) where they are held: the layer's own
    parameters, or the backend's copy that replaced them (the Triton backend's word layout)."""
    if mlp.layout is not None:
        held = mlp.layout
        return held.w13, held.w2, held.scales.w13, held.scales.w2
    return mlp.w13, mlp.w2, mlp.w13_scales, mlp.w2_scales


def test_mxfp4_matches_transformers_and_the_float32_path(checkpoints, prompts, reference):
    """MXFP4 experts (dequantized per expert on CPU) give transformers' tokens on the dequantized
    weights, and the engine's own float32 path on them to float32 rounding."""
    mx = make_llm(checkpoints["mxfp4"], page_size=16, max_prefill_tokens=13)
    assert [o.token_ids for o in mx.generate(prompts, GREEDY)] == reference["dequantized"]
    w13, _, w13_scales, _ = held_experts(mx.scheduler.engine.model.layers[0].mlp)
    assert w13.dtype == torch.uint8 and w13_scales.shape == (4, 128, 2)
    mx, fp32 = (make_llm(checkpoints[name], page_size=16) for name in ("mxfp4", "dequantized"))
    got, want = prefill_logits(mx.scheduler, prompts), prefill_logits(fp32.scheduler, prompts)
    # the same exact weights, summed in another order: the MXFP4 kernel adds each 32-value
    # group's scaled partial sum on its own, so the float32 roundings differ, by ~1e-5 of the
    # logits' size after two layers
    torch.testing.assert_close(got, want, atol=2e-5 * float(want.abs().max()), rtol=0)


@pytest.mark.slow
@pytest.mark.skipif(TEST_DEVICE == "cuda" and torch.cuda.device_count() < 2,
                    reason="TP=2 on CUDA needs two GPUs")
@pytest.mark.parametrize("name", ["fp32", "mxfp4"])
def test_tp2_matches_tp1(name, checkpoints):
    """Two ranks: two query heads and their sinks each, one KV head, half of every expert's
    intermediate rows (32: one MXFP4 group), the down bias added once."""
    path = str(checkpoints[name])
    prompts = random_prompts(3, [6, 19, 40], VOCAB, seed=11)
    logits1, tokens1 = run_rank(path, prompts, 0, 1, "")
    logits2, tokens2 = run_tp(path, prompts, 2)
    torch.testing.assert_close(logits2, logits1.cpu(), atol=1e-4, rtol=0)
    assert tokens2 == tokens1


def test_bad_config_names_the_field(tmp_path):
    from minisgl.models.gpt_oss import GptOssForCausalLM

    raw = {"architectures": ["GptOssForCausalLM"], "hidden_size": 64, "num_attention_heads": 4,
           "num_hidden_layers": 2, "vocab_size": 256, "intermediate_size": 64,
           "num_local_experts": 4, "num_experts_per_tok": 2}
    assert GptOssForCausalLM.parse_config(raw).layer_types == ("sliding_attention",
                                                               "full_attention")
    with pytest.raises(ValueError, match="layer_types"):
        GptOssForCausalLM.parse_config({**raw, "layer_types": ["sliding_attention"]})
    with pytest.raises(ValueError, match="num_local_experts"):
        GptOssForCausalLM.parse_config({**raw, "num_local_experts": 0})


def test_dummy_weights_in_mxfp4(checkpoints, tmp_path):
    """``--dummy-weights`` with an MXFP4 config (the benchmark of gpt-oss-20b): random experts
    quantized as the checkpoint holds them, loaded and run."""
    import shutil

    shutil.copy(checkpoints["mxfp4"] / "config.json", tmp_path / "config.json")
    llm = LLM(str(tmp_path), device=TEST_DEVICE, dtype="float32", num_pages=512,
              dummy_weights=True)
    _, w2, w13_scales, w2_scales = held_experts(llm.scheduler.engine.model.layers[1].mlp)
    assert w2.dtype == torch.uint8 and w2_scales.shape == (4, 64, 2)
    assert 100 < int(w13_scales.float().mean()) < 127  # groups of N(0, 0.02) values
    out = llm.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    assert len(out[0].token_ids) == 4


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["triton_kernels", "triton_fragments", "triton_fragments_gluon"])
def test_moe_backends_match_the_fused_moe(name, checkpoints, prompts):
    """A backend that holds the layers' MXFP4 experts in a layout of its own (OpenAI's
    ``matmul_ogs``; the fragment layout on the Triton kernels, or on the Gluon ones where its
    tiles pick them) takes them over and gives the fused MoE's prefill logits: the same e2m1
    weights, each GEMM's sums in float32 and h rounded to bf16 in both, so they differ by bf16
    roundings in another order (a few hundredths of the logits' size after two layers), and
    their greedy tokens agree while no two logits are that close."""
    if name == "triton_kernels":
        pytest.importorskip("triton_kernels")
    path = checkpoints["mxfp4"]
    own, fused = (LLM(str(path), device=TEST_DEVICE, dtype="bfloat16", page_size=16,
                      num_pages=256, moe_backend=backend, **GPU_TEST_OPTIONS)
                  for backend in (name, "triton"))
    layer = own.scheduler.engine.model.layers[0].mlp
    assert layer.layout is not None and layer.w13.numel() == 0  # the backend's copy alone
    got = prefill_logits(own.scheduler, prompts).float()
    want = prefill_logits(fused.scheduler, prompts).float()
    torch.testing.assert_close(got, want, atol=3e-2 * float(want.abs().max()), rtol=0)
