"""OpenAI's triton_kernels as the MXFP4 MoE backend (``moe/matmul_ogs.py``): the routing it builds
from the engine's top-k (the backend against the reference: ``test_moe_libraries.py``)."""

from __future__ import annotations

import pytest
import torch

E, K = 32, 4  # gpt-oss-20b's experts and top-k


@pytest.mark.any_device
def test_routing_sorts_the_pairs_by_expert():
    """The bitmap built from the engine's ids gives triton_kernels' metadata each expert's count
    and the routed pairs in expert order (stable), their weights gathered in that order."""
    pytest.importorskip("triton_kernels")
    from helpers.interpreter import import_triton

    import_triton()
    from minisgl.moe.matmul_ogs import routing

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(0)
    weights, ids = torch.topk(torch.randn(37, E, generator=gen).softmax(-1), K, dim=-1)
    ids[3] = torch.tensor([31, 0, 30, 1])  # bit 31 of a word: the sign bit of its int32
    data, gather, scatter = routing(ids.to(dev), weights.bfloat16().to(dev), E)
    order = torch.argsort(ids.flatten(), stable=True)
    assert data.expt_hist.cpu().tolist() == torch.bincount(ids.flatten(), minlength=E).tolist()
    assert gather.src_indx.cpu().tolist() == order.tolist() == scatter.dst_indx.cpu().tolist()
    assert torch.equal(data.gate_scal.cpu(), weights.bfloat16().flatten()[order])
