"""FP8 under tensor parallelism on CPU: block scales shard with their weights, online quantization
quantizes each rank's shard, and a shard boundary inside a block is an error."""

from __future__ import annotations

import pytest
import torch
from test_fp8 import NEEDS_TWO_RANKS, PROMPTS, WIDE

from helpers.fp8_models import make_fp8_checkpoint
from helpers.hf_models import make_tiny_checkpoint


@pytest.mark.slow
@NEEDS_TWO_RANKS
@pytest.mark.parametrize("arch", ["llama", "qwen3_moe"])
def test_fp8_checkpoint_tp2_matches_tp1(arch, tmp_path):
    """Block scales shard with their weights: 16x16 blocks over two ranks (8 query heads of 16,
    a KV head each, half the experts' rows)."""
    from test_tp import run_rank, run_tp

    src = make_tiny_checkpoint(arch, tmp_path / "src")
    fp8 = str(make_fp8_checkpoint(src, tmp_path / "fp8", (16, 16)))
    logits1, tokens1 = run_rank(fp8, PROMPTS, 0, 1, "")
    logits2, tokens2 = run_tp(fp8, PROMPTS, 2)
    torch.testing.assert_close(logits2, logits1.cpu(), atol=1e-4, rtol=0)
    assert tokens2 == tokens1


@pytest.mark.slow
@NEEDS_TWO_RANKS
@pytest.mark.parametrize("arch", ["qwen3", "qwen3_moe"])
def test_online_fp8_and_fp8_kv_tp2_matches_tp1(arch, tmp_path):
    """``--quantization fp8`` quantizes each rank's shard: per-channel scales of whole rows (the
    row-parallel o/down projections included) and, for the experts, 128-row/column blocks at the
    shard edges are TP=1's quantization; the FP8 KV pool holds each rank's KV heads.

    TP=2's all-reduce sums in another order, so the bound is float32's, relative to the logits'
    scale: 1e-5 of the largest (the qwen3_moe case: logits up to 51, 1.3e-4 apart; 4.1e-5 without
    FP8). With the FP8 KV cache it is looser: a K/V element that lies that close to an e4m3
    rounding boundary lands one e4m3 step away from TP=1's (seen: 3e-3 in the logits of the
    qwen3_moe case with per-channel weights)."""
    from test_tp import run_rank, run_tp

    dims = WIDE | {"moe_intermediate_size": 256}  # 128 expert rows per rank: whole blocks
    src = str(make_tiny_checkpoint(arch, tmp_path / "src", **dims))
    for opts, atol in (({"quantization": "fp8"}, None),
                       ({"quantization": "fp8", "kv_cache_dtype": "fp8_e4m3"}, 1e-2)):
        logits1, tokens1 = run_rank(src, PROMPTS, 0, 1, "", opts)
        logits2, tokens2 = run_tp(src, PROMPTS, 2, opts)
        atol = atol or 1e-5 * logits1.abs().max().item()
        torch.testing.assert_close(logits2, logits1.cpu(), atol=atol, rtol=0)
        assert tokens2 == tokens1


def test_tp_shard_that_splits_a_block_is_an_error():
    """moe_intermediate_size 32 over two ranks is 16 rows per rank: rank 1 would start inside the
    first 32-row block of the checkpoint's scales."""
    from minisgl.distributed import DistributedInfo
    from minisgl.layers import LinearColParallelMerged
    from minisgl.quant import Fp8Config

    layer = LinearColParallelMerged(64, [32, 32], False, DistributedInfo(1, 2), Fp8Config((32, 32)))
    scale = layer.weight_scale_inv
    with pytest.raises(ValueError,
                       match="FP8 block scales cannot be split at 16..32 .block size 32."):
        scale.weight_loader(scale, torch.ones(1, 2), 0)
