"""Tuned fused-MoE tiles (``kernel/triton/moe_configs``): the file a GPU and expert shape name,
the bucket a row count falls in, and ``pick_config`` (``frag_tile`` for the fragment layout)
taking them over its rule."""

from __future__ import annotations

import json

import torch

from minisgl.kernel.triton import moe_configs
from minisgl.kernel.triton.fused_moe import MoeConfig, pick_config
from minisgl.kernel.triton.moe_mxfp4_frag import frag_tile


def test_buckets_and_pick_config(tmp_path, monkeypatch):
    name = moe_configs.file_name("NVIDIA H200", "mxfp4", 5760, 2880)
    assert name == "nvidia-h200_mxfp4_N5760_K2880.json"
    small, big = [16, 32, 64, 256, 1, 4, 3], [128, 128, 128, 64, 8, 8, 4]
    (tmp_path / name).write_text(json.dumps({"buckets": [
        {"max_rows": 2.0, "config": small}, {"max_rows": 1e9, "config": big}]}))
    monkeypatch.setattr(moe_configs, "DIR", tmp_path)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    moe_configs._buckets.cache_clear()
    cuda = torch.device("cuda")
    assert moe_configs.tuned(0.125, "mxfp4", 5760, 2880, cuda) == tuple(small)
    assert moe_configs.tuned(2.5, "mxfp4", 5760, 2880, cuda) == tuple(big)
    assert moe_configs.tuned(1.0, "bf16", 5760, 2880, cuda) is None  # no file for bf16
    assert moe_configs.tuned(1.0, "mxfp4", 5760, 2880, torch.device("cpu")) is None
    assert pick_config(4, 32, True, ("mxfp4", 5760, 2880), cuda) == MoeConfig(*small)
    assert pick_config(4096, 32, True, ("mxfp4", 5760, 2880), cuda) == MoeConfig(*big)
    rule = pick_config(4, 32, True)  # no key: the rule
    assert pick_config(4, 32, True, ("mxfp4", 4096, 2880), cuda) == rule
    moe_configs._buckets.cache_clear()


def test_frag_tile_takes_a_tuned_table(tmp_path, monkeypatch):
    """The fragment layout's tiles: this GPU's tuned table for the layout (the Gluon kernel's
    its own) over the built-in one, which serves where none is and beyond a table's last
    bucket."""
    gluon_tile = [8, 64, 64, 64, 1, 4, 1, True, None, True, 5, True]
    (tmp_path / moe_configs.file_name("NVIDIA H200", "mxfp4_gluon", 5760, 2880)).write_text(
        json.dumps({"buckets": [{"max_rows": 4.0, "config": gluon_tile}]}))  # a tuning cut short
    monkeypatch.setattr(moe_configs, "DIR", tmp_path)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    moe_configs._buckets.cache_clear()
    cuda = torch.device("cuda")
    assert frag_tile(0.5, True, (5760, 2880), cuda) == tuple(gluon_tile)
    assert MoeConfig(*gluon_tile).gluon_split
    assert frag_tile(64.0, True, (5760, 2880), cuda) == frag_tile(64.0, True)  # beyond it
    assert frag_tile(0.5, False, (5760, 2880), cuda) == frag_tile(0.5)  # no fragments table
    assert frag_tile(0.5, True, (5760, 2880), torch.device("cpu")) == frag_tile(0.5, True)
    moe_configs._buckets.cache_clear()


def test_the_shipped_tables_are_configs():
    """Every bucket of every shipped table builds a ``MoeConfig`` (7 fields, or more with the
    MXFP4 kernel choice ``swapped`` and the fragment layout's) with row blocks its kernel knows
    (the Triton tiles' and the GEMV's; the Gluon wgmma kernel's powers of two from 8 to 256;
    its mma.sync kernel's 1 to 8), in rising bucket order."""
    paths = sorted(moe_configs.DIR.glob("*.json"))
    assert paths
    for path in paths:
        buckets = json.loads(path.read_text())["buckets"]
        tops = [b["max_rows"] for b in buckets]
        assert tops == sorted(tops), path.name
        for bucket in buckets:
            cfg = MoeConfig(*bucket["config"])
            if cfg.gluon_mma:
                assert cfg.gluon and 1 <= cfg.block_m <= 8, (path.name, bucket)
            elif cfg.gluon:
                assert cfg.block_m in (8, 16, 32, 64, 128, 256), (path.name, bucket)
            else:
                assert cfg.block_m in (1, 16, 32, 64, 128), (path.name, bucket)
            assert cfg.swapped in (None, True, False)
