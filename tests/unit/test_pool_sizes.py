"""The KV pools' sizes (``engine/pool_sizes.py``): the sliding layers' own pool sized from the
cache spec for every running request's window and a forward, the memory it saves given to the
full-attention layers, and ``auto`` keeping it only where it saves a quarter of the KV memory;
with the cache specs of real models (built on the meta device from ``benchmark/configs/``)."""

from __future__ import annotations

import json
import os

import pytest
import torch

from minisgl.distributed import DistributedCommunicator, DistributedInfo
from minisgl.engine.config import EngineConfig
from minisgl.engine.pool_sizes import (
    AUTO_MIN_SAVING,
    check_sliding_pool_ratio,
    may_window,
    size_pools,
    window_demand,
)
from minisgl.kvcache.spec import AttentionSpec, CacheSpec
from minisgl.kvcache.state_pool import StateShape
from minisgl.llm.config import EngineOptions
from minisgl.models import ModelConfig, get_model_class
from minisgl.moe import create_moe_backend

CONFIGS = os.path.join(os.path.dirname(__file__), "..", "..", "benchmark", "configs")
GiB = 1 << 30


def model_spec(name: str) -> tuple[CacheSpec, int]:
    """The cache spec of ``benchmark/configs/<name>.json``'s model and its context length."""
    with open(os.path.join(CONFIGS, name + ".json")) as f:
        mc = ModelConfig.from_dict(json.load(f))
    with torch.device("meta"):
        model = get_model_class(mc.architecture)(
            mc, DistributedCommunicator(DistributedInfo()), create_moe_backend("torch"))
    return model.cache_spec(), mc.max_position


def config(ratio: float | None = None, **limits) -> EngineConfig:
    limits.setdefault("page_size", 16)
    return EngineConfig(model_path="m", device=torch.device("cpu"), dtype=torch.bfloat16,
                        sliding_pool_ratio=ratio, **limits)


def page_bytes(spec: CacheSpec, page_size: int) -> tuple[float, float]:
    """A page's K/V bytes in the full-attention layers and in the sliding ones (bfloat16)."""
    full = spec.kv_bytes_per_token(torch.bfloat16, 0.0) * page_size
    return full, spec.kv_bytes_per_token(torch.bfloat16) * page_size - full


@pytest.mark.parametrize("name, budget_gib, running", [
    ("gpt-oss-20b", 110, 256),  # the memory an H200 leaves it
    ("gemma-3-27b-it", 70, 32),
    ("gemma-4-26b-a4b", 72, 64),
])
def test_the_sliding_pool_holds_every_running_window_and_the_rest_goes_to_full(
        name, budget_gib, running):
    spec, max_len = model_spec(name)
    cfg = config(max_running_reqs=running, max_forward_tokens=8192)
    sizes = size_pools(spec, cfg, max_len, budget_gib * GiB, True)
    window = spec.max_window
    assert window is not None and sizes.window_pages is not None
    # every running request's window (+ a straddled page and a resumable end) and a forward
    assert sizes.window_pages == running * (-(-window // 16) + 2) + 8192 // 16 + 1
    full, slide = page_bytes(spec, 16)
    one = size_pools(spec, cfg, max_len, budget_gib * GiB, False).full_pages
    assert sizes.window_pages <= one < sizes.full_pages  # the full layers got the memory saved
    assert sizes.full_pages * full + sizes.window_pages * slide <= budget_gib * GiB
    assert sizes.full_pages * full + sizes.window_pages * slide > budget_gib * GiB - full
    assert "auto:" in sizes.why and "saves" in sizes.why


def test_gpt_oss_holds_about_twice_the_tokens():
    """Half its layers slide over 128 tokens: the full-attention pool gets about all their
    memory."""
    spec, max_len = model_spec("gpt-oss-20b")
    cfg = config(max_running_reqs=256, max_forward_tokens=8192)
    one = size_pools(spec, cfg, max_len, 110 * GiB, False).full_pages
    assert size_pools(spec, cfg, max_len, 110 * GiB, True).full_pages > 1.9 * one


def test_more_running_windows_than_the_memory_holds_keep_one_pool():
    """Gemma 3 27B on an H200's memory with 256 running requests: their windows alone take
    more than one pool holds, so the sliding pool would be as large as the full one."""
    spec, max_len = model_spec("gemma-3-27b-it")
    cfg = config(max_running_reqs=256, max_forward_tokens=8192)
    sizes = size_pools(spec, cfg, max_len, 70 * GiB, True)
    assert sizes.window_pages is None
    assert sizes.full_pages == size_pools(spec, cfg, max_len, 70 * GiB, False).full_pages
    assert "would save 0%" in sizes.why and f"under {AUTO_MIN_SAVING:.0%}" in sizes.why


@pytest.mark.parametrize("name, short, long", [
    ("gemma-3-27b-it", 1024, 32768),  # a context of one window: nothing to free
    ("gemma-4-26b-a4b", 1024, 32768),
    ("gpt-oss-20b", 256, 4096),  # two windows: the window holds half of every request
])
def test_a_short_context_keeps_one_pool(name, short, long):
    spec, _ = model_spec(name)
    cfg = config(max_running_reqs=32, max_forward_tokens=1024)
    assert size_pools(spec, cfg, short, 64 * GiB, True).window_pages is None
    assert size_pools(spec, cfg, long, 64 * GiB, True).window_pages is not None


def test_fixed_pages_keep_the_full_pool_and_save_memory():
    """``--num-pages``: the full-attention pool as given, the sliding pool as needed (no
    budget to hand on)."""
    spec, max_len = model_spec("gemma-3-27b-it")
    cfg = config(max_running_reqs=8, max_forward_tokens=512, num_pages=4096)
    sizes = size_pools(spec, cfg, max_len, None, True)
    assert sizes.full_pages == 4096
    assert sizes.window_pages == window_demand(1024, cfg, max_len) == 8 * 66 + 32 + 1
    assert "which the full-attention layers get" not in sizes.why
    small = config(max_running_reqs=64, max_forward_tokens=512, num_pages=4096)
    assert size_pools(spec, small, max_len, None, True).window_pages is None  # 4257 > 4096


def test_an_explicit_ratio_is_kept():
    spec, max_len = model_spec("gemma-3-27b-it")
    cfg = config(0.0635, max_running_reqs=32, max_forward_tokens=1024)
    sizes = size_pools(spec, cfg, max_len, 8 * GiB, True)
    full, slide = page_bytes(spec, 16)
    assert sizes.full_pages == int(8 * GiB // (full + 0.0635 * slide))
    assert sizes.window_pages == int(sizes.full_pages * 0.0635)
    tiny = size_pools(spec, config(0.0001, max_forward_tokens=1024), max_len, 8 * GiB, True)
    assert tiny.window_pages == (1024 + 1024) // 16 + 3  # at least a window and a forward


def test_which_models_may_get_a_sliding_pool():
    sliding = CacheSpec((AttentionSpec(0, 2, 2, 8, 0.5, sliding_window=4),
                         AttentionSpec(1, 2, 2, 8, 0.5)))
    full = CacheSpec((AttentionSpec(0, 2, 2, 8, 0.5),))
    assert may_window(sliding, None) and may_window(sliding, 0.1)
    assert not may_window(sliding, 0.0) and not may_window(full, None)
    # images that attend both ways: a chunk may run past the forward's budget (``auto``: one pool)
    assert not may_window(sliding, None, whole_images=True)
    assert may_window(sliding, 0.1, whole_images=True)
    recurrent = CacheSpec(sliding.attention, StateShape(8, 4, 2, 4, 4), 2)
    assert not may_window(recurrent, None)  # auto: one pool
    with pytest.raises(ValueError, match="sliding_pool_ratio: not supported with recurrent"):
        may_window(recurrent, 0.1)


@pytest.mark.parametrize("value, parsed", [("auto", None), (0, 0.0), (0.25, 0.25), (1, 1.0)])
def test_the_ratio_option(value, parsed):
    assert check_sliding_pool_ratio(value) == parsed
    assert EngineOptions(device="cpu", sliding_pool_ratio=value).sliding_pool_ratio == value


@pytest.mark.parametrize("value", ["on", -0.1, 1.5, True, None])
def test_a_bad_ratio_names_the_field(value):
    with pytest.raises(ValueError, match="sliding_pool_ratio: must be 'auto' or a number"):
        EngineOptions(device="cpu", sliding_pool_ratio=value)
