"""A grammar no token of the vocabulary can follow (a tokenizer of whole words asked for JSON):
the token sampled from its empty mask is not an answer, so the request aborts instead of ending
as if its grammar were complete, and the engine keeps serving."""

from __future__ import annotations

import json

from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from minisgl import LLM, SamplingParams


def test_a_grammar_the_vocabulary_cannot_follow_aborts(tmp_path):
    from helpers.hf_models import make_tiny_checkpoint

    path = make_tiny_checkpoint("qwen3", tmp_path / "ckpt")
    vocab = json.loads((path / "config.json").read_text())["vocab_size"]
    core = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=core, unk_token="t0",
                            eos_token="t2").save_pretrained(path)
    with LLM(str(path), device="cpu", dummy_weights=True) as llm:
        stuck, free = llm.generate(
            [[3, 4, 5], [3, 4, 5]],
            [SamplingParams(max_tokens=4, json_schema='{"type": "object"}'),
             SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)])
        assert stuck.finish_reason == "abort"
        assert free.finish_reason == "length" and len(free.token_ids) == 4
