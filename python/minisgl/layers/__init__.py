from .activation import gelu_and_mul, silu_and_mul
from .attention import AttentionLayer
from .embedding import ParallelLMHead, VocabParallelEmbedding
from .linear import LinearColParallelMerged, LinearQKVMerged, LinearRowParallel, ReplicatedLinear
from .mlp import GatedMLP
from .moe import MoELayer
from .norm import RMSNorm
from .rotary import RotaryEmbedding

__all__ = [
    "AttentionLayer",
    "GatedMLP",
    "LinearColParallelMerged",
    "LinearQKVMerged",
    "LinearRowParallel",
    "MoELayer",
    "ParallelLMHead",
    "RMSNorm",
    "ReplicatedLinear",
    "RotaryEmbedding",
    "VocabParallelEmbedding",
    "gelu_and_mul",
    "silu_and_mul",
]
