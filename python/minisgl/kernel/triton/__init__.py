"""Triton kernels. Import the submodules directly (``from minisgl.kernel.triton.norm import ...``):
each one imports triton, and this package file stays free of it so that it imports on any machine.

- ``norm``: RMSNorm and fused residual-add + RMSNorm
- ``rotary``: neox-style RoPE, in place on q and k (fused with q/k norm and the KV store)
- ``activation``: SiLU-and-mul
- ``decode_attention``, ``extend_attention``: paged attention for decode and prefill/mixed steps
- ``gemv``, ``fp8_gemv``: one-token linear layers (bf16, e4m3 weights)
- ``fp8_w8a16``: 2-256-token linear layers with e4m3 weights: bf16 x on the bf16 tensor cores
  (W8A16) or per-token e4m3 x on the FP8 tensor cores (W8A8); their tiles in ``fp8_w8a16_config``
- ``fp8_quant``, ``fp8_gemm``: activation quantization and the block-scaled FP8 GEMM
- ``topk_route``: the MoE router's top-k
- ``fused_moe``: the two grouped expert GEMMs (model dtype, FP8 blocks, MXFP4), after
  ``moe_align``'s token-to-expert alignment; ``mxfp4``: e2m1/e8m0 decoding in registers
- ``sampling``, ``sampling_rows``, ``sampling_split``: the sampler
- ``pdl``: programmatic dependent launch of the decode step's kernels (Hopper)
"""
