"""Checkpoint tensors are read lazily: a tensor-parallel rank reads only its shard of each
weight."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

from helpers.hf_models import make_tiny_checkpoint
from minisgl.models.weight import CheckpointTensor, iter_weights


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_tiny_checkpoint("qwen3", tmp_path_factory.mktemp("w") / "qwen3")


def test_narrow_slice_and_cast_read_what_they_select(checkpoint):
    weights = dict(iter_weights(str(checkpoint)))
    with safe_open(str(checkpoint / "model.safetensors"), framework="pt") as f:
        full = f.get_tensor("model.layers.0.mlp.gate_proj.weight")
    lazy = weights["model.layers.0.mlp.gate_proj.weight"]
    assert isinstance(lazy, CheckpointTensor) and lazy.shape == full.shape
    part = lazy.narrow(0, 8, 16).narrow(1, 4, 20)
    assert part.shape == (16, 20) and torch.equal(part.load(), full[8:24, 4:24])
    # rows past the end are cut, as for tensors
    assert torch.equal(lazy[100:1000].load(), full[100:])
    assert lazy.to(torch.bfloat16).narrow(1, 0, 3).load().dtype == torch.bfloat16
    with pytest.raises(ValueError, match="outside shape"):
        lazy.narrow(0, 120, 10)


def test_a_rank_reads_only_its_shard(checkpoint):
    """The model's loaders narrow before reading: rank 1 of 2 asks the file for half the rows."""
    from minisgl.distributed import DistributedInfo
    from minisgl.layers.linear import LinearColParallelMerged

    reads = []

    class Spy:
        def __init__(self, part):
            self.part = part

        def __getitem__(self, index):
            reads.append(index)
            return self.part[index]

    layer = LinearColParallelMerged(64, [128, 128], False, DistributedInfo(1, 2))
    with safe_open(str(checkpoint / "model.safetensors"), framework="pt") as f:
        part = f.get_slice("model.layers.0.mlp.up_proj.weight")
        lazy = CheckpointTensor(Spy(part), part.get_shape())
        layer.weight.weight_loader(layer.weight, lazy, 1)
        full = f.get_tensor("model.layers.0.mlp.up_proj.weight")
    assert reads == [(slice(64, 128), slice(0, 64))]
    assert torch.equal(layer.weight.data[64:], full[64:])
