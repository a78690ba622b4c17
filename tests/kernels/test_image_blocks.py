"""Image blocks (Gemma's vision-language models: an image's tokens attend to each other both ways)
in the Triton extend kernel, against a float64 dense reference, with and without a sliding
window, and the Triton backend against the torch backend through ``AttentionSpec.image_blocks``.

Without a GPU the kernels run under the Triton interpreter in float32/float16. The images lie
inside a chunk, at its start and at its end, and span several kernel blocks."""

from __future__ import annotations

import pytest
import torch

from helpers.attention_reference import reference
from helpers.interpreter import import_triton

triton = import_triton()

from test_window_sinks import DEV, TOL, paged, scene  # noqa: E402

from minisgl.attention.torch_backend import TorchBackend  # noqa: E402
from minisgl.attention.triton_backend import TritonBackend  # noqa: E402
from minisgl.core import BatchImages  # noqa: E402
from minisgl.kernel.triton.extend_attention import extend_attention  # noqa: E402
from minisgl.kvcache.spec import AttentionSpec  # noqa: E402

pytestmark = pytest.mark.any_device
EXTEND, CACHED = [1, 37, 5, 70], [0, 19, 64, 3]
SPANS = [[], [(25, 40)], [], [(3, 20), (50, 73)]]  # [offset, end) of each request's images


def limits_of(cached: list[int], extend: list[int], spans) -> list[int]:
    """Per new token, the last key it sees: its image's last token, or itself."""
    out = []
    for c, e, images in zip(cached, extend, spans):
        for p in range(c, c + e):
            out.append(next((end - 1 for start, end in images if start <= p < end), p))
    return out


@pytest.mark.parametrize("window", [0, 6, 40])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_extend_kernel_image_blocks(dtype, window):
    gen = torch.Generator().manual_seed(window)
    hq, hkv, dim = 4, 2, 32
    seq_lens = [e + c for e, c in zip(EXTEND, CACHED)]
    k, v, table, rows, slots_of = paged(seq_lens, hkv, dim, dtype, gen)
    q = torch.randn(sum(EXTEND), hq, dim, generator=gen).to(dtype).to(DEV)
    cu = [0] + torch.tensor(EXTEND).cumsum(0).tolist()
    limits = limits_of(CACHED, EXTEND, SPANS)
    out = extend_attention(q, k, v, table, rows, torch.tensor(cu, dtype=torch.int32, device=DEV),
                           torch.tensor(seq_lens, dtype=torch.int32, device=DEV), max(EXTEND),
                           0.3, window=window,
                           key_limits=torch.tensor(limits, dtype=torch.int32, device=DEV))
    qs = [q[cu[b]: cu[b + 1]] for b in range(len(EXTEND))]
    ref = reference(qs, k, v, slots_of, CACHED, 0.3, window, limits=limits)
    torch.testing.assert_close(out.double(), ref, atol=TOL[dtype], rtol=TOL[dtype])
    causal = reference(qs, k, v, slots_of, CACHED, 0.3, window,
                       limits=limits_of(CACHED, EXTEND, [[]] * 4))
    assert not torch.allclose(out.double(), causal, atol=1e-2)  # the blocks changed something


@pytest.mark.parametrize("window", [None, 8])
def test_triton_backend_matches_torch(window):
    spec = AttentionSpec(1, 4, 2, 32, 0.25, sliding_window=window, image_blocks=True)
    pool, table, batch, (q, k, v) = scene(CACHED, EXTEND, spec, torch.float32, 4, seed=3)
    limits = torch.tensor(limits_of(CACHED, EXTEND, SPANS), dtype=torch.int32, device=DEV)
    batch.images = BatchImages(rows=torch.empty(0, dtype=torch.long), embeds=torch.empty(0, 8),
                               key_limits=limits)
    outs = []
    for backend in (TorchBackend(pool, table), TritonBackend(pool, table)):
        backend.check_layers([spec])
        backend.prepare_metadata(batch)
        outs.append(backend.forward(q, k, v, spec, batch))
    torch.testing.assert_close(outs[1], outs[0], atol=2e-5, rtol=2e-5)
