"""A stream that fell behind: the replies of one choice already queued are merged into one."""

from __future__ import annotations

import asyncio

import pytest

from minisgl.message import UserReply
from minisgl.server.openai.bodies import ChoiceState
from minisgl.server.openai.call import Call
from minisgl.server.openai.errors import ApiError


class QueuedFrontend:
    """Every reply is already queued when the handler first looks (the event loop was busy)."""

    def __init__(self, replies: list[UserReply]) -> None:
        self.replies = replies

    async def submit(self, msgs) -> asyncio.Queue:
        queue: asyncio.Queue = asyncio.Queue()
        for reply in self.replies:
            queue.put_nowait(reply)
        return queue

    def abort_nowait(self, uids) -> None:
        pass


async def _connected() -> bool:
    return False


def drain(replies: list[UserReply], uids=(1, 2)) -> list[tuple[int, str, list[int], object]]:
    async def run():
        states = [ChoiceState(uid=u, index=i) for i, u in enumerate(uids)]
        call = await Call(QueuedFrontend(replies), _connected, states).start([])
        got = []
        while not call.done:
            state, reply = await call.next()
            got.append((state.uid, reply.text, reply.token_ids, reply.finish_reason))
        call.close()
        return got, states

    return asyncio.run(run())


def test_queued_replies_of_a_choice_become_one():
    lp = lambda t: [(t, -0.5, [])]  # noqa: E731
    replies = [UserReply(uid=1, text="a", token_ids=[10], logprobs=lp(10), prompt_tokens=7),
               UserReply(uid=1, text="b", token_ids=[11], logprobs=lp(11)),
               UserReply(uid=2, text="x", token_ids=[20], finish_reason="length"),
               UserReply(uid=1, text="c", token_ids=[12], logprobs=lp(12), finish_reason="stop"),
               UserReply(uid=1, text="never", token_ids=[13])]  # after the finish: not merged
    got, states = drain(replies)
    assert got == [(1, "ab", [10, 11], None), (2, "x", [20], "length"), (1, "c", [12], "stop")]
    assert "".join(states[0].text) == "abc" and states[0].token_ids == [10, 11, 12]
    assert [e[0] for e in states[0].logprobs] == [10, 11, 12] and states[0].prompt_tokens == 7


def test_an_error_behind_is_not_merged():
    replies = [UserReply(uid=1, text="a", token_ids=[10]),
               UserReply(uid=1, error="boom", status=500)]
    with pytest.raises(ApiError):
        drain(replies, uids=(1,))
