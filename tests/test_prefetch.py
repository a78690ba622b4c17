"""L2 prefetch of one-token decode (``kernel/triton/prefetch.py``): off wherever it cannot run,
compiled to Hopper's bulk prefetch with PDL, and on a Hopper GPU the same tokens and logits as
without it (a prefetch moves no value)."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the first import of triton
pytest.importorskip("triton")

from engine_utils import decode_steps  # noqa: E402
from hopper_compile import compile_for_hopper  # noqa: E402
from minisgl.kernel.triton import prefetch  # noqa: E402


def test_off_on_cpu_and_by_switch(monkeypatch):
    monkeypatch.setenv("MINISGL_PREFETCH", "1")
    assert not prefetch.prefetch_enabled(torch.zeros(1))
    prefetch.prefetch_l2(torch.zeros(64))  # a no-op, not an error
    if torch.cuda.is_available():
        monkeypatch.setenv("MINISGL_PREFETCH", "0")
        assert not prefetch.prefetch_enabled(torch.zeros(1, device="cuda"))


def test_compiles_to_bulk_prefetch(tmp_path):
    """sm_90: the PTX issues ``cp.async.bulk.prefetch.L2.global``."""
    cubins = compile_for_hopper(tmp_path, "prefetch")
    assert len(cubins) == 1 and "bulk-prefetch" in cubins[0], cubins


@pytest.mark.gpu
@pytest.mark.parametrize("arch, quantization", [("qwen3", None), ("qwen3", "fp8"),
                                                ("llama", None)])
def test_prefetch_gives_the_same_tokens_and_logits(arch, quantization, tiny_checkpoints,
                                                   monkeypatch):
    """One request decoding alone (its last 16 tokens) prefetches its o weights (and, with FP8
    weights, through the GEMVs' norm and residual path); CUDA graphs on, PDL on: the same bits."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("bulk prefetch needs compute capability 9.0")
    path = str(tiny_checkpoints[arch])
    runs = {}
    for on in ("1", "0"):
        monkeypatch.setenv("MINISGL_PREFETCH", on)
        runs[on] = decode_steps(path, quantization=quantization)
    (tokens, logits), (ref_tokens, ref_logits) = runs["1"], runs["0"]
    assert tokens == ref_tokens
    assert len(logits) == len(ref_logits) >= 40
    assert sum(out.shape[0] == 1 for out in logits) >= 16
    for got, want in zip(logits, ref_logits):
        assert torch.equal(got, want)


@pytest.mark.gpu
def test_prefetched_tensor_reads_the_same():
    """Prefetching tensors that the kernel before it wrote (forked after the write, joined before
    the read) leaves every value as written."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("bulk prefetch needs compute capability 9.0")
    for n in (16, 1000, 3 << 20):
        x = torch.randn(n, device="cuda")
        y = x * 2
        prefetch.prefetch_l2(y, x)
        prefetch.join_prefetches(y)
        torch.testing.assert_close(y.clone(), x * 2, rtol=0, atol=0)
