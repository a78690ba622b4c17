"""MXFP4 experts through OpenAI's ``triton_kernels`` (``matmul_ogs``): the grouped GEMMs vLLM and
SGLang run for gpt-oss on Hopper (``--moe-backend triton_kernels``; ``pip install
'minisgl[triton-kernels]'``, the package of the installed Triton's release).

Its kernels read the experts in their own Hopper layouts, so ``prepare_experts`` converts a
layer's packed experts once after loading and the layer releases its own copy: gate and up rows
interleaved (its SwiGLU reads column 2j as gate j, 2j + 1 as up j), values and e8m0 scales
swizzled with K the MX axis, the scales padded to whole groups of four (triton_kernels 3.6 reads
past K/32 otherwise: gpt-oss's 2,880 is 90 groups), biases in float32. A forward builds the
routing from the engine's top-k ids and weights (a bitmap of each token's experts, then
triton_kernels' own sorting and ragged-block metadata: no host sync, sizes from the batch alone,
so decode graphs capture it) and runs two ``matmul_ogs``: the first gathers the tokens and fuses
the clamped SwiGLU, the second scatters back and multiplies by the routing weights. Other experts
(bf16, FP8, other activations, other GPUs) take the fused Triton MoE (``moe.fused``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from .library import LibraryMoeBackend

_HOPPER, _NEXT = (9, 0), (11, 0)  # the capabilities whose layouts triton_kernels ships


@dataclass
class OgsExperts:
    """One layer's experts in triton_kernels' layouts (``prepare_experts``)."""

    w13: Any  # triton_kernels.tensor.Tensor [E, H, 2I], gate and up columns interleaved
    w2: Any  # [E, I, H]
    precision13: Any  # PrecisionConfig holding the swizzled scales
    precision2: Any
    bias13: torch.Tensor | None  # float32 [E, 2I], interleaved like w13
    bias2: torch.Tensor | None  # float32 [E, H]; None on tensor-parallel ranks but the first
    activation: Any  # FusedActivation: the clamped SwiGLU
    n_experts: int

    @property
    def nbytes(self) -> int:
        """Device bytes of the experts in these layouts (the model's weights count them)."""
        held = [self.w13.storage.data, self.w2.storage.data,
                self.precision13.weight_scale.storage.data,
                self.precision2.weight_scale.storage.data, self.bias13, self.bias2]
        return sum(t.numel() * t.element_size() for t in held if t is not None)


def _interleave(t: torch.Tensor) -> torch.Tensor:
    """``[E, 2I, ...]`` gate rows then up rows -> row 2j gate j, row 2j + 1 up j."""
    return torch.stack(t.chunk(2, dim=1), dim=2).flatten(1, 2).contiguous()


def _swizzle(values: torch.Tensor, scales: torch.Tensor):
    """``[E, N, K/2]`` packed e2m1 and ``[E, N, K/32]`` e8m0 -> the Hopper layouts of the
    ``[E, K, N]`` weight triton_kernels multiplies by (K, dimension 1, the MX axis)."""
    from triton_kernels.matmul_ogs import FlexCtx, PrecisionConfig
    from triton_kernels.numerics import InFlexData
    from triton_kernels.tensor import FP4, convert_layout, wrap_torch_tensor
    from triton_kernels.tensor_details import layout

    scales = F.pad(scales, (0, -scales.shape[-1] % 4))
    v_layout, v_opts = layout.make_default_matmul_mxfp4_w_layout(mx_axis=1)
    s_layout, s_opts = layout.make_default_matmul_mxfp4_w_scale_layout(mx_axis=1, num_warps=8)
    w = convert_layout(wrap_torch_tensor(values.transpose(-2, -1), dtype=FP4), v_layout, **v_opts)
    s = convert_layout(wrap_torch_tensor(scales.transpose(-2, -1)), s_layout, **s_opts)
    return w, PrecisionConfig(weight_scale=s, flex_ctx=FlexCtx(rhs_data=InFlexData()))


def routing(topk_ids: torch.Tensor, topk_weights: torch.Tensor, n_experts: int):
    """The engine's ``[T, K]`` expert ids and weights -> (``RoutingData``, ``GatherIndx``,
    ``ScatterIndx``): each token's experts as bits of a ``[T, E/32]`` word matrix (column-major,
    as triton_kernels' top-k writes it), whose metadata sorts the T * K routed pairs by expert."""
    from triton_kernels.matmul_ogs import GatherIndx, RoutingData, ScatterIndx
    from triton_kernels.tensor import BIT, Bitmatrix, SparseMatrix, make_ragged_tensor_metadata

    tokens, k = topk_ids.shape
    dev = topk_ids.device
    words = torch.zeros(((n_experts + 31) // 32, (tokens + 31) // 32 * 32), dtype=torch.int32,
                        device=dev).transpose(0, 1)[:tokens]
    ids = topk_ids.to(torch.int32)
    rows = torch.arange(tokens, device=dev)[:, None].expand(tokens, k).reshape(-1)
    flat = ids.reshape(-1)
    # a token's experts are distinct, so adding the bits is or-ing them (1 << 31 wraps, as bits)
    words.index_put_((rows, flat // 32), torch.ones_like(flat) << (flat % 32), accumulate=True)
    mask = Bitmatrix(words.view(torch.uint32), shape=[tokens, n_experts], dtype=BIT)
    meta = SparseMatrix(indx=ids.to(torch.int16), vals=topk_weights, mask=mask).mask_metadata
    combine, dispatch = meta.col_sorted_indx, meta.row_sorted_indx
    ragged = make_ragged_tensor_metadata(meta.col_sum, tokens * k)
    gate = topk_weights.reshape(-1)[combine]
    return (RoutingData(gate, meta.col_sum, n_experts, k, ragged),
            GatherIndx(combine, dispatch), ScatterIndx(dispatch, combine))


class MatmulOgsMoeBackend(LibraryMoeBackend):
    name, capabilities, layout_type = "triton_kernels", (_HOPPER, _NEXT), OgsExperts

    def __init__(self) -> None:
        import triton_kernels.matmul_ogs  # noqa: F401  (fail at start-up, not at the first step)

        super().__init__()

    def convert(self, w13, w2, scales, bias, act) -> OgsExperts:
        from triton_kernels.matmul_ogs import FnSpecs, FusedActivation
        from triton_kernels.swiglu import swiglu_fn

        b13, b2 = bias if bias is not None else (None, None)
        w13_t, pc13 = _swizzle(_interleave(w13), _interleave(scales.w13))
        w2_t, pc2 = _swizzle(w2, scales.w2)
        swiglu = FusedActivation(FnSpecs("swiglu", swiglu_fn, ("alpha", "limit"), reduction_n=2),
                                 (act.alpha, act.limit))
        return OgsExperts(w13_t, w2_t, pc13, pc2,
                          None if b13 is None else _interleave(b13).float(),
                          None if b2 is None else b2.float(), swiglu, w13.shape[0])

    def run(self, x, topk_weights, topk_ids, layout: OgsExperts) -> torch.Tensor:
        from triton_kernels.matmul_ogs import matmul_ogs

        e = layout
        data, gather, scatter = routing(topk_ids, topk_weights.to(x.dtype), e.n_experts)
        h = matmul_ogs(x, e.w13, e.bias13, data, gather_indx=gather,
                       precision_config=e.precision13, fused_activation=e.activation)
        return matmul_ogs(h, e.w2, e.bias2, data, scatter_indx=scatter,
                          precision_config=e.precision2, gammas=data.gate_scal)
