"""The offline ``LLM`` takes vLLM's and SGLang's keyword names as the server's command line takes
their flags (one table: ``llm/aliases.py``), refuses those minisgl has no counterpart for with the
reason, and answers an unknown keyword with the closest names."""

from __future__ import annotations

import logging

import pytest
import torch

from helpers.device import TEST_DEVICE
from minisgl import LLM, SamplingParams
from minisgl.llm.aliases import llm_keywords
from minisgl.llm.llm import _OPTIONS

pytestmark = pytest.mark.any_device


@pytest.mark.parametrize("given, ours", [
    ({"model": "m"}, {"model": "m"}),
    ({"model_path": "m"}, {"model": "m"}),
    ({"tensor_parallel_size": 2}, {"tp": 2}),
    ({"tp_size": 2}, {"tp": 2}),
    ({"max_model_len": 4096}, {"max_seq_len": 4096}),
    ({"context_length": 4096}, {"max_seq_len": 4096}),
    ({"gpu_memory_utilization": 0.5}, {"mem_fraction": 0.5}),
    ({"mem_fraction_static": 0.5}, {"mem_fraction": 0.5}),
    ({"enable_prefix_caching": True}, {}),
    ({"enable_prefix_caching": False}, {"cache": "naive"}),
    ({"disable_radix_cache": True}, {"cache": "naive"}),
    ({"disable_hybrid_swa_memory": True}, {"sliding_pool_ratio": 0}),
    ({"swa_full_tokens_ratio": 0.5}, {"sliding_pool_ratio": 0.5}),
    ({"max_num_seqs": 8}, {"max_running_requests": 8}),
    ({"dtype": "half"}, {"dtype": "float16"}),
    ({"dtype": "bfloat16"}, {"dtype": "bfloat16"}),
    ({"dtype": torch.bfloat16}, {"dtype": "bfloat16"}),
    ({"quantization": "fp8"}, {"quantization": "fp8"}),
    ({"seed": 7}, {"seed": 7}),
    ({"trust_remote_code": True}, {}),
    ({"trust_remote_code": False}, {}),
    ({"enforce_eager": True}, {"cuda_graph_max_bs": 0, "piecewise_cuda_graph_max_tokens": 0}),
    ({"block_size": 16}, {"page_size": 16}),
    ({"max_num_batched_tokens": 512}, {"max_num_batched_tokens": 512}),
])
def test_vllm_keywords_are_our_options(given, ours):
    assert llm_keywords(given, _OPTIONS) == ours


def test_trust_remote_code_says_why_it_changes_nothing(caplog):
    with caplog.at_level(logging.INFO, logger="minisgl.llm.aliases"):
        llm_keywords({"trust_remote_code": True}, _OPTIONS)
    assert "no checkpoint code is ever run" in caplog.text


@pytest.mark.parametrize("given, error, words", [
    ({"max_model_length": 4096}, TypeError, "did you mean 'max_model_len'"),
    ({"tensor_paralel_size": 2}, TypeError, "did you mean 'tensor_parallel_size'"),
    ({"gpu_memory_util": 0.5}, TypeError, "did you mean 'gpu_memory_utilization'"),
    ({"no_such_thing": 1}, TypeError, "unexpected keyword argument 'no_such_thing' (its options"),
    ({"swap_space": 4}, TypeError, "swap_space: minisgl does not swap KV to the host"),
    ({"pipeline_parallel_size": 2}, TypeError, "no pipeline parallelism: use tp"),
    ({"data_parallel_size": 2}, TypeError, "LLM() runs one replica"),
    ({"max_total_tokens": 9}, TypeError, "use num_pages (of page_size tokens each)"),
    ({"tp": 2, "tensor_parallel_size": 2}, TypeError, "tensor_parallel_size sets tp"),
    ({"max_seq_len": 64, "max_model_len": 64}, TypeError, "max_model_len sets max_seq_len"),
    ({"attention_backend": "NO_SUCH"}, ValueError, "use attn with auto"),
])
def test_keywords_minisgl_does_not_take_say_why(given, error, words):
    with pytest.raises(error) as info:
        llm_keywords(given, _OPTIONS)
    assert words in str(info.value)


def test_an_llm_built_with_vllm_keywords(tiny_checkpoints):
    llama = str(tiny_checkpoints["llama"])
    with LLM(model=llama, tensor_parallel_size=1, max_model_len=48, gpu_memory_utilization=0.5,
             enable_prefix_caching=False, max_num_seqs=3, dtype="float", seed=11,
             trust_remote_code=True, device=TEST_DEVICE, num_pages=256) as llm:
        config = llm.scheduler.config
        assert llm.scheduler.max_context_len == 48
        assert config.cache == "naive" and config.engine.max_running_reqs == 3
        assert config.engine.dtype == torch.float32 and config.engine.seed == 11
        assert config.engine.mem_fraction == 0.5
        out = llm.generate([list(range(3, 43))], SamplingParams(
            temperature=0, max_tokens=20, ignore_eos=True, clamp_max_tokens=True))[0]
        assert len(out.token_ids) == 8 and out.finish_reason == "length"  # 48 - 40
    with pytest.raises(ValueError, match="quantization: 'awq' is not one of"):
        LLM(llama, quantization="awq", device=TEST_DEVICE)
