"""Compile Triton kernels for sm_90 without a GPU: the compiler's front end, LLVM and ptxas all run
on the CPU and reject what the interpreter accepts (loop-carried types, fp8 dot shapes, ...).

``compile_for_hopper(tmp_path, suite)`` runs ``python hopper_compile.py SUITE`` in a subprocess
without ``TRITON_INTERPRET`` (the test module runs its kernels interpreted, which replaces the
compiler) and skips the test when no CUDA toolchain (ptxas) is installed.
"""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
from dataclasses import replace

import pytest

# the MoE kernels as fused_moe launches its GEMVs and one-pair blocks: no alignment's sorted
# pairs or total, each pair's expert from the top-k ids (int64)
NO_ALIGNMENT = dict(sorted_ptr=None, total_ptr=None)


def compile_for_hopper(tmp_path, suite: str) -> list[str]:
    """The ``CUBIN name size [griddepcontrol]`` lines, one per compiled kernel variant."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    here = os.path.dirname(os.path.abspath(__file__))
    env.update(TRITON_CACHE_DIR=str(tmp_path), TRITON_DEFAULT_FP_FUSION="1",
               PYTHONPATH=os.pathsep.join([os.path.join(here, "..", "..", "python"),
                                           env.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, os.path.join(here, "hopper_compile.py"), suite],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    if "NO-TOOLCHAIN" in done.stdout:
        pytest.skip(done.stdout)
    assert "FAILED" not in done.stdout, done.stdout
    assert done.stdout.count("CUBIN") > 0, done.stdout
    return [line for line in done.stdout.splitlines() if line.startswith("CUBIN")]


def _fp8_kernels():
    """(kernel, {arg: type}, {constexpr: value}, num_warps) of every FP8 variant we launch."""
    from minisgl.kernel.triton import (
        decode_attention,
        extend_attention,
        fp8_gemm,
        fp8_gemv,
        fp8_quant,
        fp8_w8a16,
        fp8_w8a16_config,
        fused_moe,
        rotary,
    )

    yield fp8_gemm._quantize_act_kernel, dict(x_ptr="*bf16", q_ptr="*fp8e4nv", s_ptr="*fp32",
        K="i32", stride_x="i32", stride_q="i32", stride_sm="i32", stride_sg="i32"), dict(
        GATED=True, GROUP=128, GROUPS=8), 4
    gemm_sig = dict(a_ptr="*fp8e4nv", as_ptr="*fp32", b_ptr="*fp8e4nv", bs_ptr="*fp32",
                    c_ptr="*bf16", M="i32", N="i32", K="i32", stride_am="i32", stride_as="i32",
                    stride_bn="i32", stride_bs="i32", stride_cm="i32")
    for m in (1, 48, 200, 4096):
        cfg = fp8_gemm.pick_config(m, 4096, 4096)
        yield fp8_gemm._fp8_gemm_kernel, gemm_sig, dict(
            SCALE_BN=128, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=128,
            GROUP_M=cfg.group_m, EVEN_K=True), cfg.num_warps
    for gated, k in ((False, 4096), (True, 12288), (False, 20000)):  # the last in two passes
        block, warps = fp8_quant.pick_block(k)
        yield fp8_quant._quantize_tokens_kernel, dict(x_ptr="*bf16", q_ptr="*fp8e4nv",
            s_ptr="*fp32", K="i32", stride_x="i32", stride_q="i32"), dict(GATED=gated,
            ONE_PASS=block >= k, BLOCK=block, USE_PDL=True), warps
    for gated, channel, fused, act in ((False, False, False, False), (True, False, False, False),
                                       (True, True, True, False), (False, True, True, False),
                                       (False, True, False, False), (False, True, True, True)):
        bn, bk, warps = fp8_gemv.pick_config(4096, 4096)
        yield fp8_gemv._fp8_gemv_kernel, dict(x_ptr="*bf16", w_ptr="*fp8e4nv", s_ptr="*fp32",
            b_ptr="*bf16", r_ptr="*bf16", y_ptr="*bf16", N="i32", K="i32", stride_w="i32",
            stride_s="i32", eps="fp32"), dict(
            SCALE_BN=1 if channel else 128, SCALE_BK=1 if channel else 128, GATED=gated,
            HAS_BIAS=not gated, EVEN=True, CHANNEL=channel, NORM=fused and not gated,
            HAS_RES=fused and gated, ACT=act, BLOCK_N=bn, BLOCK_K=bk, RED=fp8_gemv.RED,
            USE_PDL=True), warps
    w8a16_sig = dict(x_ptr="*bf16", xs_ptr="*fp32", w_ptr="*fp8e4nv", s_ptr="*fp32",
                     b_ptr="*bf16", y_ptr="*bf16", M="i32", N="i32", K="i32",
                     steps_per_split="i32", stride_x="i32", stride_w="i32", stride_s="i32",
                     stride_xs="i32")
    w8a16_cases = ((2, 4096, 4096, False), (64, 6144, 4096, False), (128, 4096, 12288, True))
    w8a8_cases = ((64, 4096, 4096, False), (128, 24576, 4096, False), (200, 4096, 12288, False))
    for (m, n, k, gated), channel, a8 in itertools.chain(
            itertools.product(w8a16_cases, (True, False), (False,)),
            itertools.product(w8a8_cases, (True, False), (True,))):
        cfg = fp8_w8a16_config.pick_config(m, n, k, gated, x_bytes=1 if a8 else 2)
        if not channel:  # as ``_launch``: the tile within one 128x128 scale block
            cfg = replace(cfg, block_n=min(cfg.block_n, 128), block_k=min(cfg.block_k, 128))
        y_type = "*fp32" if cfg.split_k > 1 else "*bf16"  # split-K: fp32 partials
        yield fp8_w8a16._w8a16_kernel, dict(w8a16_sig, y_ptr=y_type,
                                            x_ptr="*fp8e4nv" if a8 else "*bf16"), dict(
            CHANNEL=channel, SCALE_BN=1 if channel else 128, SCALE_BK=1 if channel else 128,
            GATED=gated, A8=a8, HAS_BIAS=not gated, EVEN_M=m not in (2, 200),
            EVEN_K=m != 64 or a8, SPLIT=cfg.split_k > 1, DOT_PREC="tf32", BLOCK_M=cfg.block_m,
            BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, PREFETCH=2 if a8 else 0,
            USE_PDL=a8), cfg.num_warps
    # fp32 x: 64-deep K steps, no prefetch
    cfg = fp8_w8a16_config.pick_config(16, 4096, 4096, x_bytes=4)
    yield fp8_w8a16._w8a16_kernel, dict(w8a16_sig, x_ptr="*fp32", y_ptr="*fp32"), dict(
        CHANNEL=True, SCALE_BN=1, SCALE_BK=1, GATED=False, A8=False, HAS_BIAS=False, EVEN_M=True,
        EVEN_K=True, SPLIT=cfg.split_k > 1, DOT_PREC="ieee", BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, PREFETCH=0, USE_PDL=False), cfg.num_warps
    yield fp8_w8a16._sum_splits_kernel, dict(p_ptr="*fp32", b_ptr="*bf16", y_ptr="*bf16", MN="i32",
        N="i32"), dict(SPLITS=4, HAS_BIAS=True, BLOCK=1024), 4
    for gated in (False, True):
        yield fused_moe._moe_gemm_kernel, dict(a_ptr="*bf16", w_ptr="*fp8e4nv", out_ptr="*bf16",
            weights_ptr="*bf16", sorted_ptr="*i32", expert_ids_ptr="*i32", total_ptr="*i32",
            ws_ptr="*fp32", n_pairs="i32", n_out="i32", k_dim="i32", top_k="i32", n_blocks_m="i32",
            stride_am="i32", stride_we="i32", stride_wn="i32", stride_om="i32", stride_se="i32",
            stride_sn="i32", bias_ptr="*bf16", stride_be="i32", alpha="fp32",
            limit="fp32"), dict(GATED=gated, BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, GROUP_M=8,
            EVEN_K=True, PRECISION="tf32", FP8_W=True, SCALE_BN=128, SCALE_BK=128,
            HAS_BIAS=False, CLAMPED=False, GELU=False, USE_PDL=True), 4
    attn = dict(Q="*bf16", K="*fp8e4nv", V="*fp8e4nv", PageTable="*i32", Rows="*i32",
                SeqLens="*i32", Sinks="*fp32", window="i32")
    yield decode_attention._decode_stage1, dict(attn, Order="*i32", PartOut="*fp32",
        PartLse="*fp32", Out="*bf16",
        qk_scale="fp32", v_scale="fp32", num_splits="i32", **{s: "i32" for s in (
            "stride_qb", "stride_qh", "stride_kn", "stride_kh", "stride_vn", "stride_vh",
            "stride_pt", "stride_pb", "stride_ph", "stride_ps", "stride_lb", "stride_lh",
            "stride_ob", "stride_oh")}), dict(GROUP=4, GROUP_PAD=16, HEAD_DIM=128, BLOCK_D=128,
        BLOCK_N=64, DIRECT=False, DOT_PREC="tf32", HAS_ORDER=True, USE_PDL=True,
        HAS_SINKS=True), 4
    yield extend_attention._extend_kernel, dict(attn, Out="*bf16", CuSeqlens="*i32", Limits="*i32",
        qk_scale="fp32", v_scale="fp32", **{s: "i32" for s in ("stride_qt", "stride_qh",
        "stride_kn", "stride_kh", "stride_vn", "stride_vh", "stride_ot", "stride_oh",
        "stride_pt")}), dict(GROUP=4, HEAD_DIM=128, BLOCK_D=128, BLOCK_M=64, BLOCK_N=64,
        DOT_PREC="tf32", WINDOWED=True, HAS_SINKS=True, BLOCKS=False), 4
    yield rotary._rope_kernel, _rope_sig("*bf16", "*fp8e4nv"), dict(
        HAS_NORM=True, FP32_NORM=False, OFFSET=False, V_NORM=False, STORE=True, FP8=True,
        HALF=64, BLOCK_Q=32, BLOCK_K=8, USE_PDL=True), 8


def _rope_sig(weights: str, cache: str) -> dict:
    """``rotary._rope_kernel``'s argument types: bf16 q, k and v, the norms' weights and the
    cache as given."""
    return dict(q_ptr="*bf16", k_ptr="*bf16", v_ptr="*bf16", pos_ptr="*i64", cache_ptr="*fp32",
                qw_ptr=weights, kw_ptr=weights, kc_ptr=cache, vc_ptr=cache, loc_ptr="*i64",
                eps="fp32", v_eps="fp32", k_inv_scale="fp32", v_inv_scale="fp32",
                **{s: "i32" for s in (
                    "q_stride_t", "q_stride_h", "k_stride_t", "k_stride_h", "v_stride_t",
                    "v_stride_h", "c_stride_slot", "c_stride_h", "n_q", "n_k", "cache_stride")})


def _pdl_kernels():
    """The bf16 kernels of a decode step with programmatic dependent launch (the FP8 suite has
    the FP8 ones, the MXFP4 suite the MoE GEMMs): the GEMV, the norm, the attention reduction,
    the greedy sampler, Gemma 4's fused norms, RoPE and KV store, and the MoE's router (its
    top-k, and the two fused for a decode step: gpt-oss's 32 experts with a bias, Gemma 4's 128
    with its scales), alignment and top-k sum."""
    from minisgl.kernel.triton import (
        decode_attention,
        decode_step,
        fused_moe,
        gemv,
        moe_align,
        norm,
        rotary,
        topk_route,
    )

    for gated in (False, True):
        yield gemv._gemv_kernel, dict(x_ptr="*bf16", w_ptr="*bf16", b_ptr="*bf16", y_ptr="*bf16",
            N="i32", K="i32", stride_w="i32"), dict(GATED=gated, HAS_BIAS=False, EVEN=True,
            BLOCK_N=4, BLOCK_K=2048, USE_PDL=True), 4
    for quant in (False, True):  # the norm, and the norm quantizing for an FP8 layer
        yield norm._rmsnorm_kernel, dict(x_ptr="*bf16", res_ptr="*bf16", w_ptr="*bf16",
            y_ptr="*fp8e4nv" if quant else "*bf16", res_out_ptr="*bf16", s_ptr="*fp32",
            g_ptr="*bf16", m_ptr="*bf16", eps="fp32",
            **{s: "i32" for s in ("n_rows", "n_inner", "stride_x0", "stride_x1", "stride_r",
                                  "stride_y", "stride_ro", "dim", "g_inner", "stride_g0",
                                  "stride_g1")}), dict(
            HAS_RES=True, QUANT=quant, ROWS=1, BLOCK_D=4096, USE_PDL=True, FP32=False,
            OFFSET=False, HAS_W=True, POST_ADD=False, GATE=False, POST_MULT=False), 4
    greedy_sig = dict(flag_ptr="*i64", val_ptr="*fp32", idx_ptr="*i32", out_ptr="*i64",
                      pool_ptr="*i32", rows_ptr="*i64", pos_ptr="*i64", pool_stride="i32")
    for splits in (1, 64):
        yield decode_step._partial_kernel, dict(greedy_sig, logits_ptr="*bf16", stride="i32",
            V="i32", chunk="i32"), dict(SPLITS=splits, BLOCK=1024, USE_PDL=True), 4
    yield decode_step._final_kernel, greedy_sig, dict(SPLITS=64, USE_PDL=True), 1
    yield decode_attention._decode_stage2, dict(PartOut="*fp32", PartLse="*fp32", SeqLens="*i32",
        Out="*bf16", Sinks="*fp32", num_splits="i32", window="i32", **{s: "i32" for s in (
            "stride_pb", "stride_ph", "stride_ps", "stride_lb", "stride_lh", "stride_ob",
            "stride_oh")}), dict(HEAD_DIM=128, BLOCK_D=128, BLOCK_N=64, SPLITS_PAD=16,
                                 USE_PDL=True, HAS_SINKS=True), 4
    yield topk_route._topk_route_kernel, dict(logits_ptr="*bf16", weights_ptr="*bf16",
        ids_ptr="*i64", n_tokens="i32", n_experts="i32", stride_t="i32"), dict(
        K=4, BLOCK_T=16, BLOCK_E=32, SOFTMAX_FIRST=False, RENORMALIZE=False, USE_PDL=True), 4
    # Gemma 4's global layers' norms (float32 weights, the weightless v norm), RoPE and store:
    # 16 heads of 512 a program
    yield rotary._rope_kernel, _rope_sig("*fp32", "*bf16"), dict(
        HAS_NORM=True, FP32_NORM=True, OFFSET=False, V_NORM=True, STORE=True, FP8=False,
        HALF=256, BLOCK_Q=16, BLOCK_K=2, USE_PDL=True), 8
    yield moe_align._offsets_kernel, dict(ids_ptr="*i64", counts_ptr="*i32",
        expert_ids_ptr="*i32", sorted_ptr="*i32", total_ptr="*i32", n_experts="i32",
        n_pairs="i32", n_blocks="i32", capacity="i32"), dict(COUNT=True, BLOCK_M=1, BLOCK_E=32,
        BLOCK_P=64, BLOCK_B=32, FILL=1024, USE_PDL=True), 4
    yield moe_align._scatter_kernel, dict(ids_ptr="*i64", cursor_ptr="*i32", sorted_ptr="*i32",
        n="i32"), dict(BLOCK=256, USE_PDL=True), 4
    yield fused_moe._sum_kernel, dict(src_ptr="*bf16", out_ptr="*bf16", hidden="i32"), dict(
        K=4, BLOCK=1024, USE_PDL=True), 4


def _mxfp4_kernels():
    """The MXFP4 MoE GEMMs at gpt-oss's gated tile (bf16 x, biases, clamped SwiGLU) with their
    PTX decoding (``FAST``): the small-batch kernel, the swapped one at 16-row blocks (permuted
    operand order) and at 64, the GEMV, and the fragment layout's GEMM and GEMV (the GEMVs
    without the alignment's sorted pairs and total, as ``fused_moe`` runs them)."""
    from minisgl.kernel.triton import (
        moe_mxfp4,
        moe_mxfp4_frag,
        moe_mxfp4_frag_gemv,
        moe_mxfp4_gemv,
    )

    sig = dict(a_ptr="*bf16", w_ptr="*u8", out_ptr="*bf16", weights_ptr="*bf16",
               sorted_ptr="*i32", expert_ids_ptr="*i32", total_ptr="*i32", ws_ptr="*u8",
               bias_ptr="*bf16", n_pairs="i32", n_out="i32", k_dim="i32", top_k="i32",
               n_blocks_m="i32", alpha="fp32", limit="fp32", stride_am="i32", stride_we="i32",
               stride_wn="i32", stride_om="i32", stride_se="i32", stride_sn="i32",
               stride_be="i32")
    common = dict(GATED=True, HAS_BIAS=True, CLAMPED=True, GELU=False, USE_PDL=True)
    yield moe_mxfp4.moe_gemm_mx_kernel, sig, dict(common, BLOCK_M=16, BLOCK_N=64, GROUPS=6,
        GROUP_M=1, PRECISION="tf32", FAST=True), 4
    for rows, permute in ((16, True), (64, False)):
        yield moe_mxfp4.moe_gemm_mx_wide_kernel, sig, dict(common, BLOCK_M=rows, BLOCK_N=128,
            BLOCK_K=64, GROUP_M=1, EVEN_K=False, PRECISION="tf32", FAST=True,
            PERMUTE=permute), 4
    # the GEMVs as fused_moe launches them: no alignment, each pair's expert from the top-k ids
    direct_sig = dict(sig, expert_ids_ptr="*i64")
    yield moe_mxfp4_gemv.moe_gemv_mx_kernel, direct_sig, dict(common, **NO_ALIGNMENT, BLOCK_N=4,
        BLOCK_K=1024, EVEN_K=False), 1
    # the fragment layout's GEMM (32-row blocks, 8 warps of 16 rows) and GEMV
    yield moe_mxfp4_frag.moe_gemm_mx_frag_kernel, sig, dict(common, BLOCK_M=32, BLOCK_N=128,
        GROUP_M=4, PRECISION="tf32", FAST=True), 8
    for units, warps in ((4, 2), (2, 1)):
        yield moe_mxfp4_frag_gemv.moe_gemv_mx_frag_kernel, direct_sig, dict(
            common, **NO_ALIGNMENT, BLOCK_N=16, UNITS=units, EVEN_K=False), warps


def _gluon_kernels():
    """The fragment layout's Gluon GEMM (``moe_mxfp4_gluon``) at gpt-oss-20b's tiles: gated with
    row blocks of 8 (the words two units ahead; five, gate and up rows apart), GEMM 2 (not
    gated) at 16, x copied once; row blocks of 32 with x through rings of stages (gated, three
    stages of three units; gated with gate and up apart and GEMM 2, three of five, the words
    four ahead), and with the words staged (three of three units; nine and five of one, gate
    and up apart and GEMM 2; row blocks of 8 through nine, gate and up apart: x's copies 8
    bytes a thread), and each unit's wgmma in two halves under a register cap (row blocks of 32
    at 64 registers, gated and GEMM 2; of 16 at 56). Its pointers and strides 16-aligned, as
    a launch at those shapes specializes them (its ``cp.async`` of x needs 16-byte rows)."""
    from minisgl.kernel.triton import moe_mxfp4_gluon, moe_mxfp4_gluon_mma, moe_mxfp4_gluon_ws

    sig = dict(a_ptr="*bf16", w_ptr="*i32", out_ptr="*bf16", weights_ptr="*bf16",
               sorted_ptr="*i32", expert_ids_ptr="*i32", total_ptr="*i32", ws_ptr="*i32",
               bias_ptr="*bf16", n_pairs="i32", n_out="i32", top_k="i32", alpha="fp32",
               limit="fp32", stride_am="i32", stride_we="i32", stride_om="i32", stride_se="i32",
               stride_be="i32")
    for gated, rows, units, stages, ahead, split, staged in (
            (True, 8, 45, 1, 2, False, False), (True, 8, 45, 1, 5, True, False),
            (False, 16, 45, 1, 2, False, False), (True, 32, 3, 3, 2, False, False),
            (True, 32, 5, 3, 4, True, False), (False, 32, 5, 3, 4, False, False),
            (True, 32, 3, 3, 2, False, True), (True, 32, 1, 9, 2, True, True),
            (False, 32, 1, 5, 2, False, True), (True, 8, 1, 9, 2, True, True)):
        yield moe_mxfp4_gluon.moe_gemm_mx_frag_gluon_kernel, sig, dict(
            GATED=gated, BLOCK_M=rows, BLOCK_N=64, K_UNITS=45, X_UNITS=units, X_STAGES=stages,
            AHEAD=ahead, SPLIT=split, W_STAGED=staged, HALVES=False, HAS_BIAS=True,
            CLAMPED=True, USE_PDL=True, num_warps=4), 4
    # the mma.sync kernel (``moe_mxfp4_gluon_mma``): one token's gated rows on one warp, the
    # words four ahead; GEMM 2 of row blocks of 8 on two warps; the same through a ring of
    # words in shared memory, eight slots (45 units: a tail of five after the ring) and five
    # (one-pair blocks as fused_moe launches them: NO_ALIGNMENT)
    direct_sig = dict(sig, expert_ids_ptr="*i64")
    for gated, rows, warps, ahead, stages in ((True, 1, 1, 4, 0), (False, 8, 2, 2, 0),
                                              (True, 1, 1, 2, 8), (False, 4, 2, 2, 5)):
        yield moe_mxfp4_gluon_mma.moe_gemm_mx_frag_mma_kernel, direct_sig if rows == 1 else sig, \
            dict(GATED=gated, ROWS=rows, BLOCK_N=16 * warps, K_UNITS=45, AHEAD=ahead,
                 STAGES=stages, HAS_BIAS=True, CLAMPED=True, USE_PDL=True, num_warps=warps,
                 **(NO_ALIGNMENT if rows == 1 else {})), warps
    # the warp-specialized staged tile (``moe_mxfp4_gluon_ws``): 128 rows, GEMM 1 and GEMM 2 at
    # row blocks of 32 through a ring of eight one-unit slots
    for gated in (True, False):
        yield moe_mxfp4_gluon_ws.moe_gemm_mx_frag_ws_kernel, sig, dict(
            GATED=gated, BLOCK_M=32, BLOCK_N=128, K_UNITS=45, SLOTS=8, AHEAD=0, HAS_BIAS=True,
            CLAMPED=True, USE_PDL=True, num_warps=4), 4
    # the staged 128-row tile in halves (``HALVES``) with its registers capped as the tuner's
    # candidates are (``maxnreg``, not a kernel argument): row blocks of 32 at 64 registers
    # (gate and up apart) and GEMM 2's, row blocks of 16 gate and up apart at 56
    for gated, rows, cap in ((True, 32, 64), (False, 32, 64), (True, 16, 56)):
        yield moe_mxfp4_gluon.moe_gemm_mx_frag_gluon_kernel, sig, dict(
            GATED=gated, BLOCK_M=rows, BLOCK_N=128, K_UNITS=45, X_UNITS=1, X_STAGES=5,
            AHEAD=2, SPLIT=gated, W_STAGED=True, HALVES=True, HAS_BIAS=True, CLAMPED=True,
            USE_PDL=True, num_warps=8, maxnreg=cap), 8


CTA_BARRIER = re.compile(r"bar\.sync\s+\d+;")  # every thread of the CTA (no thread count)


def serialized_wgmmas(cubin: bytes) -> int:
    """wgmmas the machine code waits on one at a time (``sass_moe.serialized_wgmmas``): ptxas
    serializes a kernel's wgmmas so (its info C7513), as it did the Gluon tile's where two warps
    copied the same values of x."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                    "benchmark", "kernels"))
    from sass_moe import disassemble
    from sass_moe import serialized_wgmmas as count

    return count(disassemble(cubin))[0]


def loop_conversions(ttgir: str) -> int:
    """Layout conversions (``ttg.convert_layout``) inside the first loop of a kernel's TTGIR: its
    K loop, where one may cost shared-memory stores, loads and CTA barriers every step."""
    count, depth = 0, None
    for line in ttgir.splitlines():
        if depth is None and "scf.for" in line:
            depth = 0
        if depth is not None:
            count += line.count("ttg.convert_layout")
            depth += line.count("{") - line.count("}")
            if depth <= 0 and "}" in line:
                break
    return count


def main(suite: str) -> None:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from minisgl.kernel.triton.moe_mxfp4_gluon_ws import MAXNREG as WS_MAXNREG

    kernels = {"fp8": _fp8_kernels, "pdl": _pdl_kernels, "mxfp4": _mxfp4_kernels,
               "gluon": _gluon_kernels}[suite]
    for kernel, sig, consts, warps in kernels():
        # a register cap: the warp-specialized tile's launch sets one, a case may name its own
        maxnreg = consts.pop("maxnreg", WS_MAXNREG if "SLOTS" in consts else None)
        fn = getattr(kernel, "fn", kernel)
        missing = set(kernel.arg_names) - set(sig) - set(consts)
        assert not missing, f"{fn.__name__}: no type for {missing}"
        full = dict(sig, **{name: "constexpr" for name in consts})
        kw = {}
        if suite == "gluon":
            from triton.experimental.gluon._runtime import GluonASTSource as ASTSource
            kw["attrs"] = {(kernel.arg_names.index(n),): [["tt.divisibility", 16]]
                           for n in sig if n.endswith("_ptr") or n.startswith("stride")
                           or n == "n_out"}
        src = ASTSource(fn=kernel, signature={n: full[n] for n in kernel.arg_names},
                        constexprs={(kernel.arg_names.index(n),): v for n, v in consts.items()},
                        **kw)
        try:
            compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                                      options={"num_warps": warps,
                                               **({"maxnreg": maxnreg} if maxnreg else {})})
        except Exception as e:  # noqa: BLE001  (CompilationError, RuntimeError: report them all)
            if "ptxas" in str(e) and "not found" in str(e).lower():
                print("NO-TOOLCHAIN", e)
                return
            print("FAILED", fn.__name__, consts, str(e)[-2000:])
            continue
        ptx = compiled.asm["ptx"]
        mma = ptx.find("wgmma.mma_async")  # CTA barriers once the first wgmma is issued
        after = ptx[mma:].count("bar.sync") if mma >= 0 else 0
        print("CUBIN", fn.__name__, len(compiled.asm["cubin"]),
              ",".join(f"{k}={v}" for k, v in consts.items()
                       if k in ("GATED", "BLOCK_M", "ROWS", "SPLIT", "W_STAGED",
                                "STAGES", "HALVES")),
              f"maxnreg={maxnreg}" if maxnreg else "",
              f"barriers-after-mma={after}", f"barriers={ptx.count('bar.sync')}",
              f"shared={compiled.metadata.shared}",
              f"loop-conversions={loop_conversions(compiled.asm['ttgir'])}",
              f"mbarrier-waits={ptx.count('mbarrier.try_wait')}",
              f"copy-arrivals={ptx.count('cp.async.mbarrier.arrive.noinc')}",
              f"cta-barriers={len(CTA_BARRIER.findall(ptx))}",
              f"wgmma-serialized={serialized_wgmmas(compiled.asm['cubin']) if mma >= 0 else 0}",
              "griddepcontrol" if "griddepcontrol.wait" in ptx else "")


if __name__ == "__main__":
    main(sys.argv[1])
