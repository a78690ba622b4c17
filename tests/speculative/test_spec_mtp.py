"""The MTP speculative method on a tiny Qwen3.5 (and Qwen3.5-MoE) checkpoint given a random
``mtp.`` head: the head's forward is the checkpoint's layout (against a plain-torch
reimplementation from the raw tensors), and greedy outputs with MTP drafts are the outputs
without speculation (exactness is the verification's)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open

from helpers.device import TEST_DEVICE
from helpers.hf_models import random_prompts
from helpers.hybrid_models import add_mtp_head, make_hybrid_checkpoint
from helpers.spec_spy import fake_request, run_head, spy_on_proposer
from minisgl import LLM, SamplingParams

pytestmark = pytest.mark.any_device
MTP = {"method": "mtp", "num_speculative_tokens": 3, "adaptive": False}


@pytest.fixture(scope="module")
def mtp_checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("mtp")
    paths = {}
    for arch in ("qwen3_5", "qwen3_5_moe"):
        paths[arch] = make_hybrid_checkpoint(arch, root / arch)
        add_mtp_head(paths[arch])
    return paths


def make_llm(path, spec=None, **options) -> LLM:
    options.setdefault("num_pages", 4096 // options.get("page_size", 1))
    return LLM(str(path), device=TEST_DEVICE, dtype="float32", speculative_config=spec,
               **options)


def _norm(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1 + w)


def _rope(x, pos, rot=8, theta=10000.0):
    inv = 1.0 / theta ** (torch.arange(0, rot, 2, dtype=torch.float32) / rot)
    ang = pos[:, None].float() * inv[None]
    cos, sin = ang.cos()[:, None], ang.sin()[:, None]
    x1, x2, rest = x[..., : rot // 2], x[..., rot // 2 : rot], x[..., rot:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], -1)


def reference_head(w: dict, embeds, hidden, pos, past_k, past_v):
    """The Qwen3.5 MTP layout in plain torch, from the checkpoint's tensors (4 query heads, 2 KV
    heads of 16 dims, half of them rotated)."""
    x = torch.cat([_norm(embeds, w["pre_fc_norm_embedding.weight"]),
                   _norm(hidden, w["pre_fc_norm_hidden.weight"])], -1) @ w["fc.weight"].T
    t, L = x.shape[0], "layers.0."
    h = _norm(x, w[L + "input_layernorm.weight"])
    qg = (h @ w[L + "self_attn.q_proj.weight"].T).view(t, 4, 32)
    q, gate = qg[..., :16], qg[..., 16:].reshape(t, -1)
    k = (h @ w[L + "self_attn.k_proj.weight"].T).view(t, 2, 16)
    v = (h @ w[L + "self_attn.v_proj.weight"].T).view(t, 2, 16)
    q = _rope(_norm(q, w[L + "self_attn.q_norm.weight"]), pos)
    k = _rope(_norm(k, w[L + "self_attn.k_norm.weight"]), pos)
    keys, values = torch.cat([past_k, k]), torch.cat([past_v, v])
    p = past_k.shape[0]
    out = torch.empty(t, 4, 16)
    for i in range(t):
        for head in range(4):
            kk, vv = keys[: p + i + 1, head // 2], values[: p + i + 1, head // 2]
            att = torch.softmax(kk @ q[i, head] / 4.0, 0)
            out[i, head] = att @ vv
    a = (out.reshape(t, -1) * torch.sigmoid(gate)) @ w[L + "self_attn.o_proj.weight"].T
    res = x + a
    h = _norm(res, w[L + "post_attention_layernorm.weight"])
    mlp = (F.silu(h @ w[L + "mlp.gate_proj.weight"].T) * (h @ w[L + "mlp.up_proj.weight"].T)) \
        @ w[L + "mlp.down_proj.weight"].T
    return _norm(mlp + res, w["norm.weight"]), k, v


def test_the_head_is_the_checkpoint_layout(mtp_checkpoints):
    path = mtp_checkpoints["qwen3_5"]
    llm = make_llm(path, MTP)
    head = llm.scheduler.engine.model.mtp
    with safe_open(str(path / "mtp.safetensors"), "pt") as f:
        w = {k.removeprefix("mtp."): f.get_tensor(k) for k in f.keys()}
    torch.manual_seed(0)
    past_k, past_v = torch.randn(5, 2, 16), torch.randn(5, 2, 16)
    embeds, hidden = torch.randn(3, 64), torch.randn(3, 64)
    pos = torch.tensor([5, 6, 7])
    engine = llm.scheduler.engine
    dev = engine.device
    with torch.inference_mode():
        out, k, v = run_head(
            engine, head.layers[0].self_attn.spec.kv_layer,
            lambda positions: head(embeds.to(dev), hidden.to(dev), positions, engine.ctx),
            past_k.to(dev), past_v.to(dev), 3)
    ref, ref_k, ref_v = reference_head(w, embeds, hidden, pos, past_k, past_v)
    torch.testing.assert_close(out.cpu(), ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(k.cpu(), ref_k, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(v.cpu(), ref_v, atol=1e-4, rtol=1e-4)
    llm.close()


@pytest.mark.parametrize("arch, page_size", [("qwen3_5", 1),
                                             pytest.param("qwen3_5", 16, marks=pytest.mark.slow),
                                             pytest.param("qwen3_5_moe", 4,
                                                          marks=pytest.mark.slow)])
def test_greedy_equals_no_speculation(mtp_checkpoints, arch, page_size):
    """Prompts sharing a prefix (the second is a radix hit), chunks of 16 tokens."""
    path = mtp_checkpoints[arch]
    base = random_prompts(3, [20, 30, 25], 256, seed=3)
    prompts = [p + p[:10] + p for p in base] + [base[0] * 2 + base[1]]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    options = dict(page_size=page_size, max_prefill_tokens=16, max_num_batched_tokens=24)
    expected = [o.token_ids for o in make_llm(path, **options).generate(prompts, params)]
    llm = make_llm(path, MTP, **options)
    assert [o.token_ids for o in llm.generate(prompts, params)] == expected
    llm.scheduler.check_integrity()
    stats = llm.scheduler.spec.stats
    assert stats.verify_steps > 10 and stats.draft_tokens > 3 * 10
    assert not llm.scheduler.spec.proposer.states  # every request's head state was dropped
    llm.close()


def test_a_checkpoint_without_a_head_is_refused(tmp_path):
    path = make_hybrid_checkpoint("qwen3_5", tmp_path / "plain")
    with pytest.raises(ValueError, match="mtp"):
        make_llm(path, MTP)


def test_incremental_drafts_equal_drafts_from_scratch(mtp_checkpoints):
    """The proposer feeds the head a step's positions at a time, against the K/V the pool keeps;
    the drafts at every step equal those of a fresh proposer fed the whole history at once (the
    same target hidden states)."""
    from minisgl.speculative.mtp import MtpProposer

    path = mtp_checkpoints["qwen3_5"]
    llm = make_llm(path, MTP)
    rows, calls = spy_on_proposer(llm.scheduler.spec.proposer)  # rows: the hidden states
    prompt = random_prompts(1, [40], 256, seed=7)[0]
    llm.generate([prompt], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    assert len(calls) > 5 and all(drafts for _, drafts in calls)
    engine = llm.scheduler.engine
    for ids, drafts in calls:
        fresh = MtpProposer(engine)
        req = fake_request(engine, ids, len(ids) - 1)
        fresh.record(req, 0, torch.stack([rows[p] for p in range(len(ids) - 1)]))
        assert fresh.propose(req, len(drafts)) == drafts
        engine.page_table[0].zero_()
    llm.close()


def test_dummy_weights_include_the_head(mtp_checkpoints):
    """``--dummy-weights`` on a config with ``mtp_num_hidden_layers`` gives the head random
    weights too (timing MTP on a config alone); without ``mtp`` they are skipped."""
    path = mtp_checkpoints["qwen3_5"]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    for spec in (MTP, None):
        llm = make_llm(path, spec, dummy_weights=True)
        assert len(llm.generate([[1, 2, 3, 4]], params)[0].token_ids) == 6
        assert (getattr(llm.scheduler.engine.model, "mtp", None) is None) == (spec is None)
        llm.close()
