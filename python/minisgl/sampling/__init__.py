"""Batch sampling: the per-batch settings (``BatchSamplingArgs``), the device-side penalty and
bias rows (``SamplingState``), ``sample`` with its Triton kernels (``kernels/``) and the torch
reference (``torch_ref``). Importing this package never imports triton."""

from .args import BatchSamplingArgs, BiasArgs, PenaltyArgs
from .rng import random_uniform
from .sampler import SAMPLERS, SampleOutput, kernel_sample, sample
from .state import COUNT_MASK, PROMPT_BIT, SamplingState
from .torch_ref import apply_penalties, apply_token_bitmask, sample_torch, unpack_bitmask

__all__ = [
    "BatchSamplingArgs",
    "BiasArgs",
    "PenaltyArgs",
    "SampleOutput",
    "SamplingState",
    "SAMPLERS",
    "COUNT_MASK",
    "PROMPT_BIT",
    "sample",
    "kernel_sample",
    "sample_torch",
    "apply_penalties",
    "apply_token_bitmask",
    "unpack_bitmask",
    "random_uniform",
]
