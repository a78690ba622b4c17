"""Messages between the server's processes, one module (and one codec) per channel."""

from .backend import (
    BACKEND_CODEC,
    AbortBackendMsg,
    BackendMsg,
    BatchBackendMsg,
    ExitMsg,
    FlushCacheBackendMsg,
    UserMsg,
)
from .base import Codec, Msg
from .detokenizer import (
    DETOKENIZER_CODEC,
    BatchDetokenizerMsg,
    CacheFlushedMsg,
    DetokenizeMsg,
    DetokenizerMsg,
    RequestErrorMsg,
    RequestsAcceptedMsg,
    SchedulerStatsMsg,
)
from .frontend import FRONTEND_CODEC, BatchFrontendMsg, FrontendMsg, StatsReply, UserReply
from .tokenizer import (
    TOKENIZER_CODEC,
    AbortMsg,
    BatchTokenizerMsg,
    FlushCacheMsg,
    TokenizeMsg,
    TokenizerMsg,
)

__all__ = [
    "BACKEND_CODEC", "DETOKENIZER_CODEC", "FRONTEND_CODEC", "TOKENIZER_CODEC",
    "AbortBackendMsg", "AbortMsg", "BackendMsg", "BatchBackendMsg", "BatchDetokenizerMsg",
    "BatchFrontendMsg", "BatchTokenizerMsg", "CacheFlushedMsg", "Codec", "DetokenizeMsg",
    "DetokenizerMsg", "ExitMsg", "FlushCacheBackendMsg", "FlushCacheMsg", "FrontendMsg", "Msg",
    "RequestErrorMsg", "RequestsAcceptedMsg", "SchedulerStatsMsg", "StatsReply", "TokenizeMsg",
    "TokenizerMsg", "UserMsg", "UserReply",
]
