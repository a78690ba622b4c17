"""The MXFP4 MoE kernels' machine code without a GPU: each kernel compiled for sm_90 (Hopper) by
Triton's own ptxas, disassembled with its ``nvdisasm``, and the instructions of its K loop counted
by opcode: what a change to the decoding costs, on a machine where nothing can be timed.

    python benchmark/kernels/sass_moe.py [--kernel gemv small wide frag fgemv gluon] [--tile BN BK]
        [--warps W] [--stages S] [--maxnreg R] [--ahead A] [--split] [--staged] [--gemm2]
        [--sass DIR]

Every kernel takes gpt-oss-20b's gated tile (bf16 x, biases, clamped SwiGLU; ``--gemm2``: GEMM 2's,
not gated), by default the one the H200 table (``moe_configs``) picks for it: row blocks of 1
(``gemv``: BLOCK_N 16, BLOCK_K 256, 3 stages), 16 (``small``: 64, 128) and 64 (``wide``: 128, 64),
4 warps; the fragment layout's ``frag`` and ``fgemv``, and its Gluon GEMM ``gluon`` (``--tile BN 64
--rows 8|16``, x copied once; ``--tile BN 192 --stages 3 --rows 32``, x through a ring of three
stages of three units; ``--ahead A``, the words A units ahead, its loop holding A + 1 64-deep
units, counted a unit; ``--split``, GEMM 1's gate and up rows in separate warps; ``--staged``, the
words through x's ring, ``--stages`` 3 or more) and its mma.sync GEMM ``gmma`` (``--tile BN 64
--rows 1..8``: BN / 16 warps, the words ``--ahead`` units ahead). A K step handles ``BLOCK_N *
BLOCK_K * 2`` weights (gate and up; half with ``--split`` or ``--gemm2``); "a weight" is the loop's
instructions, summed over the threads, over that. Spills show as LDL/STL; wgmmas that ptxas
serialized (each waited on before the next) are counted. Instruction counts are not times: a loop
with fewer instructions may still wait on memory, and the Triton here may not be the GPU machine's.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402
from triton.experimental.gluon._runtime import GluonASTSource  # noqa: E402

from minisgl.kernel.triton import (  # noqa: E402
    moe_mxfp4,
    moe_mxfp4_frag,
    moe_mxfp4_frag_gemv,
    moe_mxfp4_gemv,
    moe_mxfp4_gluon,
    moe_mxfp4_gluon_mma,
    moe_mxfp4_gluon_ws,
)
from minisgl.kernel.triton.fused_moe import permuted_tile as permuted  # noqa: E402

ARGS = {  # the launcher's arguments (``fused_moe._gemm``), as Triton types
    "a_ptr": "*bf16", "w_ptr": "*u8", "out_ptr": "*bf16", "weights_ptr": "*fp32",
    "sorted_ptr": "*i32", "expert_ids_ptr": "*i32", "total_ptr": "*i32", "ws_ptr": "*u8",
    "bias_ptr": "*bf16", "n_pairs": "i32", "n_out": "i32", "k_dim": "i32", "top_k": "i32",
    "n_blocks_m": "i32", "alpha": "fp32", "limit": "fp32", "stride_am": "i32",
    "stride_we": "i32", "stride_wn": "i32", "stride_om": "i32", "stride_se": "i32",
    "stride_sn": "i32", "stride_be": "i32"}
COMMON = {"GATED": True, "HAS_BIAS": True, "CLAMPED": True, "GELU": False, "USE_PDL": True}
# a GEMV's pairs in pair order, its experts the top-k ids (int64): no sorted pairs nor total
DIRECT = {"sorted_ptr": None, "total_ptr": None}
# the arguments a launch at gpt-oss-20b's shapes passes as multiples of 16 (Triton specializes
# on it: the runtime's code assumes those alignments, so this compile does too)
# the Gluon GEMM's (``moe_mxfp4_gluon.launch_gluon``: words and scales as int32)
GLUON_ARGS = {"a_ptr": "*bf16", "w_ptr": "*i32", "out_ptr": "*bf16", "weights_ptr": "*fp32",
              "sorted_ptr": "*i32", "expert_ids_ptr": "*i32", "total_ptr": "*i32",
              "ws_ptr": "*i32", "bias_ptr": "*bf16", "n_pairs": "i32", "n_out": "i32",
              "top_k": "i32", "alpha": "fp32", "limit": "fp32", "stride_am": "i32",
              "stride_we": "i32", "stride_om": "i32", "stride_se": "i32", "stride_be": "i32"}
ALIGNED = {"a_ptr", "w_ptr", "out_ptr", "weights_ptr", "sorted_ptr", "expert_ids_ptr",
           "total_ptr", "ws_ptr", "bias_ptr", "n_out", "k_dim", "stride_am", "stride_we",
           "stride_wn", "stride_om", "stride_se", "stride_be"}


def kernel(name: str, bn: int, bk: int, rows: int | None = None, fast: bool = True,
           warps: int = 4) -> tuple[object, dict, int]:
    """(The JIT function, its constexprs, its rows per program) for ``name``; ``fast``: the
    tiles decode in PTX (``mxfp4.decode_words_bf16``), as bf16 on Hopper does."""
    if name == "gemv":  # the GEMVs as fused_moe runs them: no alignment (DIRECT)
        return (moe_mxfp4_gemv.moe_gemv_mx_kernel,
                {**COMMON, **DIRECT, "BLOCK_N": bn, "BLOCK_K": bk, "EVEN_K": False}, 1)
    if name == "small":
        return (moe_mxfp4.moe_gemm_mx_kernel,
                {**COMMON, "BLOCK_M": rows or 16, "BLOCK_N": bn, "GROUPS": bk // 32,
                 "GROUP_M": 1, "PRECISION": "tf32", "FAST": fast}, rows or 16)
    if name == "frag":  # the fragment layout's GEMM: BLOCK_N / 16 warps, K steps of 64
        return (moe_mxfp4_frag.moe_gemm_mx_frag_kernel,
                {**COMMON, "BLOCK_M": rows or 16, "BLOCK_N": bn, "GROUP_M": 1,
                 "PRECISION": "tf32", "FAST": fast}, rows or 16)
    if name == "gluon":  # the fragment layout's Gluon GEMM: BLOCK_N / 16 warps, K = 2,880
        return (moe_mxfp4_gluon.moe_gemm_mx_frag_gluon_kernel,
                {k: COMMON[k] for k in ("GATED", "HAS_BIAS", "CLAMPED", "USE_PDL")}
                | {"BLOCK_M": rows or 16, "BLOCK_N": bn, "K_UNITS": 45, "num_warps": bn // 16},
                rows or 16)
    if name == "gws":  # the warp-specialized Gluon GEMM: 128 rows, 4 + 4 + 4 warps
        return (moe_mxfp4_gluon_ws.moe_gemm_mx_frag_ws_kernel,
                {k: COMMON[k] for k in ("GATED", "HAS_BIAS", "CLAMPED", "USE_PDL")}
                | {"BLOCK_M": rows or 32, "BLOCK_N": 128, "K_UNITS": 45, "num_warps": 4},
                rows or 32)
    if name == "gmma":  # the fragment layout's mma.sync GEMM (row blocks of up to 8)
        return (moe_mxfp4_gluon_mma.moe_gemm_mx_frag_mma_kernel,
                {k: COMMON[k] for k in ("GATED", "HAS_BIAS", "CLAMPED", "USE_PDL")}
                | {"ROWS": rows or 1, "BLOCK_N": bn, "K_UNITS": 45, "num_warps": bn // 16},
                rows or 1)
    if name == "fgemv":  # the fragment layout's GEMV: BLOCK_K / 64 units a step
        return (moe_mxfp4_frag_gemv.moe_gemv_mx_frag_kernel,
                {**COMMON, **DIRECT, "BLOCK_N": bn, "UNITS": bk // 64, "EVEN_K": False}, 1)
    return (moe_mxfp4.moe_gemm_mx_wide_kernel,
            {**COMMON, "BLOCK_M": rows or 64, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 1,
             "EVEN_K": False, "PRECISION": "tf32", "FAST": fast,
             "PERMUTE": permuted(rows or 64, bn, bk, warps, True)}, rows or 64)


def loop_opcodes(sass: str, holding: str = "") -> collections.Counter:
    """Opcodes of the longest backward branch's body: the K loop; with ``holding``, the
    shortest whose text holds it (a warp-specialized kernel's MMA loop: ``HGMMA``; its
    partitions run inside a loop of their own)."""
    lines = sass.splitlines()
    labels = {m.group(1): i for i, line in enumerate(lines)
              if (m := re.match(r"^(\.L_x_\d+):", line))}
    loops = []
    for i, line in enumerate(lines):
        m = re.search(r"BRA\s+`\((\.L_x_\d+)\)", line)
        if m and labels.get(m.group(1), i) < i:
            loops.append((labels[m.group(1)], i))
    if holding:
        loops = [lp for lp in loops if holding in "\n".join(lines[lp[0]:lp[1]])]
    best = ((min if holding else max)(loops, key=lambda lp: lp[1] - lp[0])
            if loops else (0, 0))
    ops = collections.Counter()
    for line in lines[best[0]:best[1] + 1]:
        m = re.search(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)", line)
        if m:
            ops[m.group(1)] += 1
    return ops


def serialized_wgmmas(sass: str) -> tuple[int, int]:
    """(wgmmas waited on at once, wgmmas): an ``HGMMA`` whose next instruction (or the one
    after) waits for every wgmma group (``WARPGROUP.DEPBAR.LE gsb0, 0x0``) runs alone, its
    latency exposed: ptxas serializes a whole function's wgmmas so (its info C7513,
    "wgmma.mma_async instructions are serialized due to ...")."""
    lines = [line for line in sass.splitlines() if re.search(r"/\*[0-9a-f]{4}\*/", line)]
    hgmma = [i for i, line in enumerate(lines) if "HGMMA" in line]
    waited = sum(any("WARPGROUP.DEPBAR.LE gsb0, 0x0" in line for line in lines[i + 1:i + 3])
                 for i in hgmma)
    return waited, len(hgmma)


def _tool(name: str, cubin: bytes, *flags: str) -> str:
    """The standard output of Triton's own CUDA binary tool ``name`` on a cubin."""
    bin_dir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        return subprocess.run([os.path.join(bin_dir, name), *flags, path], capture_output=True,
                              text=True, check=True).stdout


def disassemble(cubin: bytes) -> str:
    """A cubin's machine code (SASS), as ``nvdisasm`` prints it."""
    return _tool("nvdisasm", cubin, "-c")


def resources(cubin: bytes) -> str:
    """Registers a thread and spilled bytes, as ``cuobjdump`` reads them from the cubin."""
    out = _tool("cuobjdump", cubin, "--dump-resource-usage")
    reg = re.search(r"REG:(\d+)", out)
    stack = re.search(r"STACK:(\d+)", out)
    return f"{reg.group(1) if reg else '?'} registers, stack {stack.group(1) if stack else '?'}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernel", nargs="+", default=["gemv", "small", "wide"],
                        choices=["gemv", "small", "wide", "frag", "fgemv", "gluon", "gmma",
                                 "gws"])
    parser.add_argument("--tile", type=int, nargs=2, default=None, metavar=("BN", "BK"))
    parser.add_argument("--rows", type=int, default=None, help="row block (small, wide)")
    parser.add_argument("--float32-decode", action="store_true",
                        help="the tiles' decoding in float32 (other dtypes, GPUs before Hopper)")
    parser.add_argument("--warps", type=int, default=4)
    parser.add_argument("--stages", type=int, default=None, help="default: the table's")
    parser.add_argument("--maxnreg", type=int, default=None, help="cap on registers a thread")
    parser.add_argument("--ahead", type=int, default=2,
                        help="gluon: units of words loaded ahead (the loop unrolled by one more)")
    parser.add_argument("--split", action="store_true",
                        help="gluon: gate and up rows in separate warps")
    parser.add_argument("--staged", action="store_true",
                        help="gluon: the words through x's ring of stages (--stages 3 or more)")
    parser.add_argument("--halves", action="store_true",
                        help="gluon: each unit's two 32-deep halves decoded and multiplied apart")
    parser.add_argument("--gemm2", action="store_true",
                        help="GEMM 2's tile (not gated; --split does not apply)")
    parser.add_argument("--sass", default=None, help="keep each kernel's disassembly here")
    args = parser.parse_args()
    COMMON["GATED"] = not args.gemm2
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    tiles = {"gemv": (16, 256, 3), "small": (64, 128, 4), "wide": (128, 64, 4),
             "frag": (128, 64, 4), "fgemv": (16, 256, 2), "gluon": (64, 64, 1),
             "gmma": (16, 64, 1), "gws": (128, 64, 9)}
    for name in args.kernel:
        bn, bk = args.tile or tiles[name][:2]
        stages = args.stages or tiles[name][2]
        fn, consts, rows = kernel(name, bn, bk, args.rows, not args.float32_decode, args.warps)
        gluon = name in ("gluon", "gmma", "gws")  # Gluon kernels (GluonASTSource, int32 words)
        if name == "gws":  # a ring of ``stages`` one-unit slots, its loops not unrolled
            consts["SLOTS"], consts["AHEAD"] = stages, 0
        elif name == "gmma":
            consts["AHEAD"], consts["STAGES"] = args.ahead, stages if args.staged else 0
        elif gluon:  # x copied once (1 stage), or a ring of ``stages`` stages of BK
            consts["AHEAD"], consts["SPLIT"] = args.ahead, args.split and not args.gemm2
            consts["W_STAGED"], consts["HALVES"] = args.staged, args.halves
            consts["X_UNITS"], consts["X_STAGES"] = moe_mxfp4_gluon.x_stages(45, rows, bk, stages)
        source, kargs = (GluonASTSource, GLUON_ARGS) if gluon else (ASTSource, ARGS)
        if "sorted_ptr" in consts:
            kargs = dict(kargs, expert_ids_ptr="*i64")
        warps = 4 if name == "gws" else bn // 16 if gluon else args.warps
        # the warp-specialized tile's launch caps the registers where the tile does not
        maxnreg = args.maxnreg or (moe_mxfp4_gluon_ws.MAXNREG if name == "gws" else None)
        attrs = {(i,): [["tt.divisibility", 16]] for i, arg in enumerate(kargs) if arg in ALIGNED}
        signature = {**kargs, **dict.fromkeys(consts, "constexpr")}
        compiled = triton.compile(source(fn=fn, signature=signature, constexprs=consts,
                                         attrs=attrs),
                                  target=GPUTarget("cuda", 90, 32),
                                  options={"num_warps": warps, "num_stages": stages,
                                           **({"maxnreg": maxnreg} if maxnreg else {})})
        sass, regs = disassemble(compiled.asm["cubin"]), resources(compiled.asm["cubin"])
        if args.sass:
            os.makedirs(args.sass, exist_ok=True)
            with open(os.path.join(args.sass, f"{name}.sass"), "w") as f:
                f.write(sass)
        ops = loop_opcodes(sass, "HGMMA" if name == "gws" else "")
        total = sum(ops.values())
        units = 1
        if name == "gws":  # the MMA loop: a warpgroup's unit of its 64 rows
            bk = 64
        elif gluon:  # a K step per unit of 64 (the loop body holds ahead + 1, or the ring's)
            x_units, x_rings = consts.get("X_UNITS", 1), consts.get("X_STAGES", 1)
            units = (x_units * x_rings if x_rings > 1 else consts.get("STAGES")
                     or args.ahead + 1)
            total, bk = total // units, 64
        # split: gate or up rows a warp; gws: a warpgroup's 64 rows
        weights = 64 * bk if name == "gws" else bn * bk * (
            1 if args.gemm2 or gluon and args.split else 2)
        per_weight = total * 32 * warps / weights
        top = (f"the loop's {units} units: " if gluon else "") + ", ".join(
            f"{op} {n}" for op, n in ops.most_common(12))
        waited, n_mma = serialized_wgmmas(sass)
        serial = f"; wgmmas serialized: {waited} of {n_mma}" if n_mma else ""
        print(f"{name} (rows {rows}, BLOCK_N {bn}, BLOCK_K {bk}, {warps} warps, {stages} "
              f"stages, {regs}): {total} instructions a K step of {weights} weights, "
              f"{per_weight:.1f} a weight; {top}{serial}")


if __name__ == "__main__":
    main()
