"""The fragment layout of MXFP4 experts (``quant.mxfp4_fragments``) and the swapped GEMM that
reads it (``kernel.triton.moe_mxfp4_frag``): each word holds the values its wgmma lane's A
fragment takes, the layout inverts exactly, and the fused MoE over it matches the torch backend
(float16 under the interpreter; the ``gpu`` test at gpt-oss-20b's shapes in bf16 with the PTX
decoding)."""

from __future__ import annotations

import pytest
import torch

from helpers.interpreter import import_triton

triton = import_triton()

from helpers.hopper_compile import compile_for_hopper  # noqa: E402
from helpers.mxfp4 import GPT_OSS, gpt_oss_20b_case, mx_inputs  # noqa: E402
from minisgl.kernel.moe_types import FragmentScales, GluonFragmentScales  # noqa: E402
from minisgl.kernel.triton.fused_moe import MoeConfig, fused_moe  # noqa: E402
from minisgl.moe import Mxfp4Scales  # noqa: E402
from minisgl.moe.reference import TorchMoeBackend  # noqa: E402
from minisgl.quant.mxfp4 import from_words, quantize_mxfp4, to_words  # noqa: E402
from minisgl.quant.mxfp4_fragments import from_fragments, to_fragments  # noqa: E402

pytestmark = pytest.mark.any_device


def test_each_word_holds_its_lanes_fragment_and_the_layout_inverts():
    blocks, scales = quantize_mxfp4(torch.randn(3, 48, 192, generator=torch.Generator()
                                                .manual_seed(0)))
    words, s = to_fragments(blocks, scales)
    assert (words.shape, s.shape) == (blocks.shape, scales.shape)
    back = from_fragments(words, s)
    assert torch.equal(back[0], blocks) and torch.equal(back[1], scales)
    nib = torch.stack([blocks & 15, blocks >> 4], -1).reshape(3, 48, 192)
    plain = from_words(words.reshape(3, -1, 4)).reshape(3, 3, 3, 8, 4, 4, 4)  # b, s, r, q, hg
    units = s.reshape(3, 3, 3, 8, 4)
    for e, b, step, r, q, h, g in [(0, 0, 0, 0, 0, 0, 0), (1, 2, 1, 5, 3, 1, 1),
                                   (2, 1, 2, 7, 2, 0, 1)]:
        word = plain[e, b, step, r, q, 2 * h + g]
        values = [(int(byte) >> (4 * i)) & 15 for byte in word for i in (0, 1)]
        row, k0 = 16 * b + 8 * h + r, 64 * step + 32 * g + 2 * q
        assert values == [int(nib[e, row, k0 + d]) for d in (0, 1, 8, 9, 16, 17, 24, 25)]
        assert units[e, b, step, r, 2 * h + g] == scales[e, row, 2 * step + g]
    with pytest.raises(ValueError, match="multiple of 16"):
        to_fragments(blocks[:, :40], scales[:, :40])


@pytest.mark.parametrize("config", [MoeConfig(16, 32, 64, 64, 1, 4, 2, swapped=True),
                                    MoeConfig(32, 64, 32, 64, 2, 4, 2, swapped=True),
                                    MoeConfig(64, 64, 64, 64, 2, 4, 2, swapped=True),
                                    MoeConfig(1, 16, 16, 128, 1, 4, 3),
                                    MoeConfig(1, 32, 16, 64, 1, 1, 3),
                                    MoeConfig(1, 16, 16, 256, 1, 2, 2), None, "gluon"],
                         ids=["rows16", "rows32", "rows64_as_32", "gemv_k128", "gemv_k64",
                              "gemv_k256", "picked", "gluon_scales_picked"])
def test_fused_moe_over_the_fragment_layout(config):
    """Hidden 192 (three K steps), intermediate 64 (GEMM 2's one step; GEMM 1's 128 rows of gate
    and up); 32-row tiles leave GEMM 2's last row block ragged (192 = 3 x 64 rows of 32 x 2);
    a 64-row config runs 32-row tiles; the GEMV takes two 64-deep units a K step (GEMM 1's
    last one half masked), one, or four (all of K in one step, a unit masked; GEMM 2's one
    unit of four). ``GluonFragmentScales`` where the Gluon kernel cannot run
    (float16, the interpreter) pick the Triton kernels' tiles."""
    kind = GluonFragmentScales if config == "gluon" else FragmentScales
    config = None if config == "gluon" else config
    x, w13, w2, weights, ids, scales, bias = mx_inputs(19, 192, 64, 5, 2, torch.float16, seed=7)
    ref = TorchMoeBackend().forward(x, w13, w2, weights, ids, scales, bias=bias, act=GPT_OSS)
    f13, s13 = to_fragments(w13, scales.w13)
    f2, s2 = to_fragments(w2, scales.w2)
    out = fused_moe(x, f13, f2, weights, ids, config=config, scales=kind(s13, s2), bias=bias,
                    act=GPT_OSS)
    torch.testing.assert_close(out, ref, rtol=5e-3, atol=5e-3)


def _gluon(*fields, **kw) -> MoeConfig:
    """A tile of the Gluon kernel (``MoeConfig``'s fields from ``block_m``, swapped)."""
    return MoeConfig(*fields, swapped=True, gluon=True, **kw)


@pytest.mark.gpu
@pytest.mark.parametrize("tokens,gluon,config", [
    (1, False, None), (16, False, None), (256, False, None), (700, False, None),
    (2048, False, None), (16, True, None), (64, True, None), (128, True, None),
    (256, True, None), (64, True, _gluon(8, 128, 128, 64, 1, 8, 1)),
    (64, True, _gluon(16, 64, 64, 192, 1, 4, 3)), (128, True, _gluon(16, 64, 64, 192, 1, 4, 5)),
    (256, True, _gluon(32, 64, 64, 192, 1, 4, 3)),
    (700, True, _gluon(32, 64, 64, 192, 1, 4, 3, maxnreg=168)),
    (4, True, _gluon(8, 64, 64, 64, 1, 4, 1, gluon_ahead=5)),
    (256, True, _gluon(32, 64, 64, 320, 1, 4, 3, gluon_ahead=4)),
    (2048, True, _gluon(64, 64, 64, 192, 1, 4, 3)),
    (2048, True, _gluon(128, 64, 64, 192, 1, 4, 3)),
    (16, True, _gluon(8, 64, 64, 64, 1, 4, 1, gluon_split=True)),
    (32, True, _gluon(8, 64, 64, 192, 1, 4, 3, gluon_split=True)),
    (256, True, _gluon(32, 64, 64, 320, 1, 4, 3, gluon_ahead=4, gluon_split=True)),
    (2048, True, _gluon(128, 128, 128, 192, 1, 8, 3, gluon_split=True)),
    (2048, True, _gluon(128, 64, 64, 64, 1, 4, 5, gluon_split=True)),
    (2048, True, _gluon(256, 128, 128, 64, 1, 8, 3, gluon_split=True)),
    (1, True, _gluon(1, 16, 16, 64, 1, 1, 1, gluon_ahead=4, gluon_mma=True)),
    (4, True, _gluon(1, 16, 16, 64, 1, 1, 1, gluon_ahead=4, gluon_mma=True)), (4, True, None),
    (4, True, _gluon(2, 32, 32, 64, 1, 2, 1, gluon_ahead=4, gluon_mma=True)),
    (16, True, _gluon(4, 64, 64, 64, 1, 4, 1, gluon_mma=True)),
    (64, True, _gluon(8, 16, 16, 64, 1, 1, 1, gluon_ahead=4, gluon_mma=True)),
    (256, True, _gluon(32, 64, 64, 192, 1, 4, 3, gluon_staged=True)),
    (256, True, _gluon(32, 64, 64, 64, 1, 4, 9, gluon_split=True, gluon_staged=True)),
    (64, True, _gluon(16, 64, 64, 64, 1, 4, 5, gluon_split=True, gluon_staged=True)),
    (2048, True, _gluon(64, 128, 128, 64, 1, 8, 9, gluon_split=True, gluon_staged=True)),
    (1, True, _gluon(1, 16, 16, 64, 1, 1, 8, gluon_mma=True, gluon_staged=True)),
    (4, True, _gluon(2, 32, 32, 64, 1, 2, 5, gluon_ahead=4, gluon_mma=True, gluon_staged=True)),
    (64, True, _gluon(8, 16, 16, 64, 1, 1, 15, gluon_mma=True, gluon_staged=True)),
    (128, True, _gluon(32, 128, 128, 64, 1, 8, 9, gluon_split=True, gluon_staged=True)),
    (256, True, _gluon(32, 256, 256, 64, 1, 16, 9, gluon_split=True, gluon_staged=True)),
    (128, True, _gluon(32, 128, 128, 192, 1, 8, 3, gluon_split=True, gluon_staged=True)),
    (128, True, _gluon(32, 128, 128, 64, 1, 8, 8, gluon_staged=True, gluon_ws=True)),
    (64, True, _gluon(16, 128, 128, 64, 1, 8, 8, gluon_staged=True, gluon_ws=True)),
    (2048, True, _gluon(32, 128, 128, 64, 1, 8, 4, gluon_staged=True, gluon_ws=True)),
    (128, True, _gluon(32, 128, 128, 64, 1, 8, 5, maxnreg=64, gluon_split=True,
                       gluon_staged=True)),
    (128, True, _gluon(16, 128, 128, 64, 1, 8, 5, maxnreg=80, gluon_split=True,
                       gluon_staged=True)),
    (16, True, _gluon(8, 64, 64, 64, 1, 4, 9, gluon_split=True, gluon_staged=True)),
    (2048, True, _gluon(256, 128, 128, 64, 1, 8, 5, gluon_split=True, gluon_staged=True)),
    (128, True, _gluon(32, 128, 128, 64, 1, 8, 5, maxnreg=64, gluon_split=True,
                       gluon_staged=True, gluon_halves=True)),
    (128, True, _gluon(16, 128, 128, 64, 1, 8, 5, maxnreg=56, gluon_split=True,
                       gluon_staged=True, gluon_halves=True)),
    (2048, True, _gluon(128, 128, 128, 64, 1, 8, 5, maxnreg=128, gluon_split=True,
                        gluon_staged=True, gluon_halves=True)),
    (16, True, _gluon(16, 64, 64, 64, 1, 4, 1, gluon_ahead=3, gluon_halves=True)),
    (128, True, _gluon(16, 256, 256, 64, 1, 16, 5, gluon_split=True, gluon_staged=True,
                       gluon_halves=True)),
    (64, True, _gluon(8, 256, 256, 64, 1, 16, 5, gluon_split=True, gluon_staged=True,
                      gluon_halves=True))],
    ids=["1", "16", "256", "700", "2048", "gluon16", "gluon64", "gluon128", "gluon256",
         "gluon64_rows8_8warps", "gluon64_rows16_x3x3", "gluon128_rows16_x3x5",
         "gluon256_rows32_x3x3", "gluon700_rows32_x3x3_maxnreg168", "gluon4_rows8_ahead5",
         "gluon256_rows32_x5x3_ahead4", "gluon2048_rows64_x3x3", "gluon2048_rows128_x3x3",
         "gluon16_rows8_split", "gluon32_rows8_x3x3_split", "gluon256_rows32_x5x3_ahead4_split",
         "gluon2048_rows128_8warps_x3x3_split", "gluon2048_rows128_x1x5_split",
         "gluon2048_rows256_8warps_x1x3_split", "mma1_rows1_1warp_ahead4",
         "mma4_rows1_1warp_ahead4", "gluon4",
         "mma4_rows2_2warps_ahead4", "mma16_rows4_4warps", "mma64_rows8_1warp_ahead4",
         "gluon256_rows32_x3x3_staged", "gluon256_rows32_x1x9_split_staged",
         "gluon64_rows16_x1x5_split_staged", "gluon2048_rows64_8warps_x1x9_split_staged",
         "mma1_rows1_1warp_ring8", "mma4_rows2_2warps_ring5_ahead4", "mma64_rows8_1warp_ring15",
         "gluon128_rows32_8warps_x1x9_split_staged", "gluon256_rows32_16warps_x1x9_split_staged",
         "gluon128_rows32_8warps_x3x3_split_staged", "gluon128_rows32_ws_ring8",
         "gluon64_rows16_ws_ring8", "gluon2048_rows32_ws_ring4",
         "gluon128_rows32_8warps_x1x5_split_staged_maxnreg64",
         "gluon128_rows16_8warps_x1x5_split_staged_maxnreg80",
         "gluon16_rows8_4warps_x1x9_split_staged",
         "gluon2048_rows256_8warps_x1x5_split_staged",
         "gluon128_rows32_8warps_x1x5_split_staged_maxnreg64_halves",
         "gluon128_rows16_8warps_x1x5_split_staged_maxnreg56_halves",
         "gluon2048_rows128_8warps_x1x5_split_staged_maxnreg128_halves",
         "gluon16_rows16_ahead3_halves",
         "gluon128_rows16_16warps_x1x5_split_staged_halves",
         "gluon64_rows8_16warps_x1x5_split_staged_halves"])
def test_gpu_fragment_moe_gpt_oss_20b_shapes(tokens, gluon, config):
    """gpt-oss-20b's experts in bf16, decoded in PTX, against the dequantizing reference; with
    ``GluonFragmentScales`` the table's picks (the Gluon kernel's row blocks of 8 up to 4 rows an
    expert: 16 tokens) and the Gluon kernel's tiles: row blocks of 8 on 8 warps, of 8 to 256
    with x through rings of stages (one, three or five units a stage, three or five stages;
    register caps of 168, 80, 64 and 56; x's copies of 16 rows on 8 warps and of 8 on 4, its
    threads 8 bytes each; each unit's wgmma in two 32-deep halves, x staged or copied once,
    256 weight rows on 16 warps in halves),
    the words two, four or five units ahead or through x's ring with it (nine or five stages
    of a unit on 4, 8 or 16 warps, or three of three units), GEMM 1's gate and up rows in the
    same warps or apart; the warp-specialized 128-row tile (row blocks
    of 16 and 32, rings of four and eight slots); row blocks of 1 to 8 on the mma.sync kernel,
    1 to 4 warps, the words in registers or through a ring of 5-15 slots."""
    x, w13, w2, weights, ids, scales, bias = gpt_oss_20b_case(tokens)
    ref = TorchMoeBackend().forward(x, w13, w2, weights, ids, scales, bias=bias, act=GPT_OSS)
    (f13, t13), (f2, t2) = to_fragments(w13, scales.w13), to_fragments(w2, scales.w2)
    kind = GluonFragmentScales if gluon else FragmentScales
    out = fused_moe(x, f13, f2, weights, ids, config=config, scales=kind(t13, t2), bias=bias,
                    act=GPT_OSS)
    err = (out.float() - ref.float()).norm() / ref.float().norm()
    assert err <= 2e-2, err
    if gluon:  # the same sums as the Triton tiles' (a stale unit of x would stand out)
        triton_out = fused_moe(x, f13, f2, weights, ids, scales=FragmentScales(t13, t2),
                               bias=bias, act=GPT_OSS)
        assert (out.float() - triton_out.float()).abs().max() <= 1e-2 * ref.float().abs().max()


def test_the_gluon_kernel_compiles_for_hopper(tmp_path):
    """The fragment layout's Gluon GEMM (``moe_mxfp4_gluon``) through Triton's compiler and ptxas
    for sm_90, gated at row blocks of 8 and 16 and not gated with x copied once, and at row
    blocks of 32 with x through a ring of stages: its decoded words are the wgmma operand as
    loaded (``convert_layout(..., assert_trivial=True)`` compiles only then), it waits on the
    kernel before (PDL), and after its first wgmma no CTA barrier where x is copied once, one
    a stage where it is staged, two more where gate and up rows are apart (the epilogue pairs
    them through shared memory); its words two, four or five units ahead (the K loop unrolled
    by three or six, or by the ring's units), or travelling with x's stages (gated in three of
    three units, gate and up apart in nine of one, GEMM 2 in five of one: still one barrier a
    stage, each thread reading back only the words it copied). Its mma.sync kernel
    (``moe_mxfp4_gluon_mma``, one token gated on a warp, GEMM 2 of row blocks of 8 on two): no
    CTA barrier and no shared memory at all, unless its words go through a ring of slots in
    shared memory (eight slots of a warp's gate and up words: 10 KB). Its warp-specialized
    tile (``moe_mxfp4_gluon_ws``, GEMM 1 and GEMM 2): no CTA barrier at all, its partitions
    meeting on mbarriers, each copying thread's ``cp.async`` completion an arrival, in 80 KB
    of shared memory (two programs an SM)."""
    pytest.importorskip("triton.experimental.gluon")
    cubins = compile_for_hopper(tmp_path, "gluon")
    assert len(cubins) == 19, cubins
    for line in cubins[14:16]:
        assert "moe_gemm_mx_frag_ws_kernel" in line and "cta-barriers=0" in line, line
        assert "copy-arrivals=1" in line and "mbarrier-waits=0" not in line, line
        assert int(line.split("shared=")[1].split()[0]) <= 84 * 1024, line
    assert all(line.endswith("griddepcontrol") for line in cubins), cubins
    assert all("barriers=0 shared=0" in line for line in cubins[10:12]), cubins[10:12]
    assert "shared=10240" in cubins[12], cubins[12]
    # x's copies of row blocks of 8 on four warps, each thread its own values: its wgmmas
    # pipelined (a warp copying another's values made ptxas serialize all of them)
    assert "BLOCK_M=8,SPLIT=True,W_STAGED=True" in cubins[9], cubins[9]
    assert "wgmma-serialized=0" in cubins[9], cubins[9]
    # each unit's wgmma in two halves under the tuner's register caps (64 at row blocks of 32,
    # 56 at 16): the wgmmas still pipelined (whole units at those caps: 13 of 20 and 19 of 20
    # serialized)
    for line in cubins[16:]:
        assert "HALVES=True" in line and "maxnreg=" in line, line
        assert "wgmma-serialized=0" in line, line
    # staged: one a stage (the loop's three: each of the ring's slots is an allocation of its
    # own, so Triton adds none between the copies and the wgmmas); gate and up rows apart: two
    # more, before the epilogue's store of the sums (its shared memory may be x's) and between
    # it and the loads of the pairs
    assert [line.split("barriers-after-mma=")[1].split()[0] for line in cubins[:10]] == [
        "0", "2", "0", "3", "5", "3", "3", "11", "5", "11"], cubins


def test_halves_are_the_wgmma_tiles_own():
    """``gluon_halves`` splits the wgmma tile's units: with the mma.sync kernel, the
    warp-specialized tile or one-row blocks it is a ``ValueError`` before any launch."""
    from minisgl.kernel.triton.moe_mxfp4_frag import launch_frag

    meta = dict(HALVES=True, MMA=False, WS=False)
    for bad in (dict(MMA=True), dict(WS=True)):
        with pytest.raises(ValueError, match="gluon_halves"):
            launch_frag((1,), (), dict(meta, **bad), False, 128, 64, 2880, True, gluon=True)
    with pytest.raises(ValueError, match="gluon_halves"):
        launch_frag((1,), (), meta, True, 16, 64, 2880, True, gluon=True)


def test_the_warp_specialized_tile_refuses_what_it_cannot_run():
    """``launch_gluon_ws`` takes 128-row tiles of row blocks of 16 or 32 pairs; anything else
    (64-row blocks came out NaN on the GPU) is a ``ValueError`` naming it, before a launch."""
    pytest.importorskip("triton.experimental.gluon")
    from minisgl.kernel.triton.moe_mxfp4_gluon_ws import launch_gluon_ws

    with pytest.raises(ValueError, match="row blocks of 16 or 32 pairs, not 64"):
        launch_gluon_ws((), {"BLOCK_M": 64}, 128, 2880)
    with pytest.raises(ValueError, match="128 rows wide, not 64"):
        launch_gluon_ws((), {"BLOCK_M": 32}, 64, 2880)


def test_x_stages_picks_a_ring_or_all_of_k():
    """``moe_mxfp4_gluon.x_stages``: below three stages x is copied once, all of K (where it
    fits in shared memory); from three, a ring whose units divide K's; anything else is
    refused, not run otherwise."""
    from minisgl.kernel.triton.moe_mxfp4_gluon import x_stages

    assert x_stages(45, 8, 64, 1) == (45, 1)
    assert x_stages(45, 32, 192, 3) == (3, 3)
    assert x_stages(45, 32, 320, 3) == (5, 3)
    assert x_stages(45, 128, 64, 5) == (1, 5)
    for args in ((45, 32, 192, 4), (45, 32, 128, 3), (45, 64, 64, 1)):
        with pytest.raises(ValueError):
            x_stages(*args)


@pytest.mark.parametrize("name,kind", [("triton_fragments", FragmentScales),
                                       ("triton_fragments_gluon", GluonFragmentScales)])
def test_the_fragments_backend_converts_a_layers_experts(name, kind):
    """``--moe-backend triton_fragments`` (and ``_gluon``): ``prepare_experts`` holds the layer's
    experts in the fragment layout, and its forward matches the torch backend (here, in
    float16 under the interpreter, on the Triton kernels for both)."""
    from minisgl.moe import create_moe_backend

    x, w13, w2, weights, ids, scales, bias = mx_inputs(9, 128, 64, 4, 2, torch.float16, seed=3)
    ref = TorchMoeBackend().forward(x, w13, w2, weights, ids, scales, bias=bias, act=GPT_OSS)
    backend = create_moe_backend(name)
    layout = backend.prepare_experts(w13, w2, scales, bias, GPT_OSS)
    assert type(layout.scales) is kind
    assert torch.equal(layout.w13[1], to_fragments(w13[1], scales.w13[1])[0])
    empty = w13.new_empty(0)
    out = backend.forward(x, empty, empty, weights, ids, Mxfp4Scales(empty, empty),
                          act=GPT_OSS, layout=layout)
    torch.testing.assert_close(out, ref, rtol=5e-3, atol=5e-3)


def test_auto_takes_the_gluon_tiles_on_hopper_only():
    from minisgl.moe import auto_cuda_backend, resolve_moe_backend

    assert auto_cuda_backend((9, 0)) == "triton_fragments_gluon"
    assert auto_cuda_backend((8, 0)) == auto_cuda_backend((10, 0)) == "triton"
    assert resolve_moe_backend("auto", torch.device("cpu")) == "torch"
    assert resolve_moe_backend("triton", torch.device("cpu")) == "triton"


def test_experts_the_fragment_layout_cannot_hold_run_in_the_word_layout(caplog):
    """K = 96 (a unit and a half): both fragment backends keep these experts in the word layout
    and give the torch backend's output; the warning comes once for the shape, not once a
    layer."""
    from minisgl.moe import create_moe_backend
    from minisgl.moe.fused import _warn_word_layout

    _warn_word_layout.cache_clear()
    caplog.set_level("WARNING", logger="minisgl.moe.fused")
    x, w13, w2, weights, ids, scales, bias = mx_inputs(5, 96, 64, 4, 2, torch.float16, seed=5)
    ref = TorchMoeBackend().forward(x, w13, w2, weights, ids, scales, bias=bias, act=GPT_OSS)
    for name in ("triton_fragments", "triton_fragments_gluon", "triton_fragments_gluon"):
        layout = create_moe_backend(name).prepare_experts(w13, w2, scales, bias, GPT_OSS)
        assert type(layout.scales) is Mxfp4Scales
        assert torch.equal(layout.w13, torch.stack([to_words(w) for w in w13]))
        empty = w13.new_empty(0)
        out = create_moe_backend(name).forward(x, empty, empty, weights, ids,
                                               Mxfp4Scales(empty, empty), act=GPT_OSS,
                                               layout=layout)
        torch.testing.assert_close(out, ref, rtol=5e-3, atol=5e-3)
    assert caplog.text.count("so they run in the word layout") == 1
