"""Every message type survives its channel's codec; a channel rejects other channels' messages."""

from __future__ import annotations

import msgspec
import pytest

from minisgl.core import SamplingParams
from minisgl.message import (
    BACKEND_CODEC,
    DETOKENIZER_CODEC,
    FRONTEND_CODEC,
    TOKENIZER_CODEC,
    AbortBackendMsg,
    AbortMsg,
    BatchBackendMsg,
    BatchDetokenizerMsg,
    BatchFrontendMsg,
    BatchTokenizerMsg,
    DetokenizeMsg,
    ExitMsg,
    RequestErrorMsg,
    RequestsAcceptedMsg,
    SchedulerStatsMsg,
    StatsReply,
    TokenizeMsg,
    UserMsg,
    UserReply,
)

PARAMS = SamplingParams(temperature=0.7, top_k=5, stop=("END",), stop_token_ids=(7,), seed=3,
                        logprobs=True, top_logprobs=2, max_tokens=9)
STATS = SchedulerStatsMsg(num_running=1, num_waiting=2, num_aborted=0, num_retractions=3,
                          kv_used_tokens=10, kv_total_tokens=100, cache_hit_tokens=4,
                          max_context_len=64)

CASES = [
    (TOKENIZER_CODEC, TokenizeMsg(uid=1, sampling_params=PARAMS,
                                  messages=[{"role": "user", "content": "é😀"}])),
    (TOKENIZER_CODEC, TokenizeMsg(uid=2, sampling_params=PARAMS, input_ids=[1, 2, 3])),
    (TOKENIZER_CODEC, BatchTokenizerMsg(msgs=[
        AbortMsg(uid=1), TokenizeMsg(uid=3, sampling_params=PARAMS, text="x")])),
    (BACKEND_CODEC, BatchBackendMsg(msgs=[UserMsg(uid=1, input_ids=[5], sampling_params=PARAMS),
                                          AbortBackendMsg(uid=2), ExitMsg()])),
    (DETOKENIZER_CODEC, BatchDetokenizerMsg(msgs=[
        RequestsAcceptedMsg(uids=[1, 4], prompt_lens=[3, 9]),
        DetokenizeMsg(uid=1, token=5, finish_reason="stop", logprob=-0.5, top_logprobs=[(5, -0.5)],
                      prompt_len=3, cached_len=1, stop=("a", "b")),
        RequestErrorMsg(uid=2, message="prompt: too long", param="prompt"), STATS])),
    (FRONTEND_CODEC, BatchFrontendMsg(msgs=[
        UserReply(uid=1, text="hé", token_ids=[1, 2], logprobs=[(1, -0.1, [(1, -0.1)])],
                  finish_reason="length", prompt_tokens=3), StatsReply(stats=STATS)])),
]


@pytest.mark.parametrize("codec, msg", CASES)
def test_round_trip(codec, msg):
    assert codec.decode(codec.encode(msg)) == msg


def test_channel_rejects_foreign_and_invalid_messages():
    with pytest.raises(msgspec.ValidationError):
        BACKEND_CODEC.decode(TOKENIZER_CODEC.encode(AbortMsg(uid=1)))
    bad = msgspec.msgpack.encode({"type": "UserMsg", "uid": 1, "input_ids": [1],
                                  "sampling_params": {"temperature": -1}})
    with pytest.raises(msgspec.ValidationError, match="temperature"):
        BACKEND_CODEC.decode(bad)
    with pytest.raises(msgspec.DecodeError):
        FRONTEND_CODEC.decode(b"\xc1 not msgpack")
