"""Triton kernels. Import the submodules directly (``from minisgl.kernel.triton.norm import ...``):
each one imports triton, and this package file stays free of it so that it imports on any machine.

- ``norm``: RMSNorm and fused residual-add + RMSNorm
- ``rotary``: neox-style RoPE, in place on q and k
- ``activation``: SiLU-and-mul
- ``fused_moe``: token-to-expert alignment and the two grouped expert GEMMs
"""
