"""Tokenizer package: incremental detokenization, stop strings, prompts, and the worker process."""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import time

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
    RequestErrorMsg,
    RequestsAcceptedMsg,
    SchedulerStatsMsg,
    StatsReply,
    TokenizeMsg,
    UserMsg,
    UserReply,
)
from minisgl.tokenizer import IncrementalDetokenizer, TokenizeManager, tokenize_worker
from minisgl.utils.mp import (
    ServerAddrs,
    ZmqPullQueue,
    ZmqPushQueue,
    make_runtime_dir,
    remove_runtime_dir,
)

MIXED = [
    "Héllo wörld 😀🎉 中文字符 naïve café — ok",
    "🧑‍🚀 emoji ZWJ, 🇫🇷 flags, ½ ∑ ∞ and 日本語のテキスト。",
    "Ελληνικά, русский, العربية, עברית, 한국어 — ñ ç ß ø å",
]
CHAT = [{"role": "user", "content": "What is 2 + 2?"}]


@pytest.fixture(scope="module")
def tok(default_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_dir)


class CharTokenizer:
    """One token per character (id = code point): stop-string logic without BPE in the way."""

    def decode(self, ids, skip_special_tokens=True, clean_up_tokenization_spaces=False):
        return "".join(chr(i) for i in ids)


def stream(detok: IncrementalDetokenizer, ids: list[int]) -> list[str]:
    return [detok.add([i]) for i in ids]


def stop_reference(text: str, stops: tuple[str, ...]) -> str:
    """The text cut at the first stop string to complete, char by char (the longest if several)."""
    for n in range(1, len(text) + 1):
        ends = [n - len(s) for s in stops if text[:n].endswith(s)]
        if ends:
            return text[: min(ends)]
    return text


# ---------------------------------------------------------------- UTF-8 / incremental decoding


@pytest.mark.parametrize("text", MIXED)
def test_incremental_equals_full_decode(tok, text):
    ids = tok.encode(text) + [tok.eos_token_id]
    detok = IncrementalDetokenizer(tok)
    chunks = stream(detok, ids) + [detok.finish()]
    assert all("\ufffd" not in c for c in chunks), chunks
    assert "".join(chunks) == tok.decode(ids, skip_special_tokens=True) == text
    if text == MIXED[0]:  # the case is real: some characters are split over tokens
        assert any("\ufffd" in tok.decode([i]) for i in ids)


def test_special_tokens_skipped_and_window_trimmed(tok):
    ids = (tok.encode("a b c 😀 ") * 700)[:3000] + [tok.eos_token_id]
    detok = IncrementalDetokenizer(tok)
    out = "".join(stream(detok, ids)) + detok.finish()
    assert out == tok.decode(ids, skip_special_tokens=True)
    assert len(detok._ids) < 1100  # only the window (and a bounded tail) is kept


def test_unresolved_bytes_flushed_by_finish(tok):
    ids = tok.encode("ok 😀")[:-1]  # the emoji's last byte never comes
    detok = IncrementalDetokenizer(tok)
    assert "".join(stream(detok, ids)) == "ok"
    assert detok.finish() == tok.decode(ids)[2:]


# ------------------------------------------------------------------------------- stop strings


@pytest.mark.parametrize(
    "text, stops, expected",
    [
        ("Hello world. Goodbye world.", ("Goodbye",), "Hello world. "),
        ("Say Hello big world", ("world", "Hello"), "Say "),  # the earliest of several
        ("The quick brown fox jumps", ("ck bro",), "The qui"),  # split across tokens
        ("Hello there", ("Hello",), ""),  # at the very start
        ("Hello wor", ("world",), "Hello wor"),  # never completes: flushed by finish()
        ("xaab yz", ("ab",), "xa"),
        ("中文字符 and 😀🎉 end", ("🎉",), "中文字符 and 😀"),
    ],
)
def test_stop_strings(tok, text, stops, expected):
    ids = tok.encode(text)
    detok = IncrementalDetokenizer(tok, stops)
    chunks = stream(detok, ids)
    emitted = "".join(chunks)
    for i in range(len(chunks)):  # the stream is always a prefix of the final text
        assert expected.startswith("".join(chunks[: i + 1]))
    tail = detok.finish()
    assert emitted + tail == expected
    assert detok.stopped == (expected != text)
    if detok.stopped:
        assert detok.add(tok.encode(" more")) == "" and detok.finish() == ""


def test_prefix_overlap_holds_only_what_is_needed():
    detok = IncrementalDetokenizer(CharTokenizer(), ("ab",))
    assert stream(detok, [ord(c) for c in "xaab"]) == ["x", "", "a", ""]
    assert detok.stopped and detok.finish() == "" and detok.add([ord("c")]) == ""
    detok = IncrementalDetokenizer(CharTokenizer(), ("abc", "zz"))
    assert stream(detok, [ord(c) for c in "qabz"]) == ["q", "", "", "ab"]  # holds "z" only
    assert detok.finish() == "z" and not detok.stopped


def test_no_stop_means_no_latency(tok):
    ids = tok.encode("Hello world, no stop here")
    detok = IncrementalDetokenizer(tok, ("xyzzy",))
    out = ""
    for n, i in enumerate(ids, 1):
        out += detok.add([i])
        assert out == tok.decode(ids[:n])


def test_stop_fuzz_never_leaks():
    rng = random.Random(0)
    for _ in range(2000):
        text = "".join(rng.choice("aab") for _ in range(rng.randint(0, 12)))
        stops = tuple(
            "".join(rng.choice("ab") for _ in range(rng.randint(1, 4)))
            for _ in range(rng.randint(1, 3))
        )
        expected = stop_reference(text, stops)
        detok = IncrementalDetokenizer(CharTokenizer(), stops)
        out = ""
        for c in text:
            out += detok.add([ord(c)])
            assert expected.startswith(out), (text, stops, out)
        assert out + detok.finish() == expected, (text, stops)


# ------------------------------------------------------------------------------- prompts


def test_tokenize_manager(tok):
    manager = TokenizeManager(tok)
    params = SamplingParams()
    chat = tok.apply_chat_template(CHAT, tokenize=True, add_generation_prompt=True)
    chat = list(chat["input_ids"] if not isinstance(chat, list) else chat)
    assert manager.tokenize(TokenizeMsg(uid=0, sampling_params=params, messages=CHAT)) == chat
    assert manager.tokenize(TokenizeMsg(uid=0, sampling_params=params, text="Hi you")) == (
        tok.encode("Hi you")
    )
    assert manager.tokenize(TokenizeMsg(uid=0, sampling_params=params, input_ids=[5, 6])) == [5, 6]


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"text": ""}, "prompt"),
        ({"input_ids": []}, "prompt"),
        ({"input_ids": [-1]}, "prompt"),
        ({}, "prompt"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "user", "content": None}]}, "messages"),  # template TypeError
    ],
)
def test_tokenize_errors(tok, fields, param):
    with pytest.raises(ValueError, match=f"^{param}:"):
        msg = TokenizeMsg(uid=0, sampling_params=SamplingParams(), **fields)
        TokenizeManager(tok).tokenize(msg)


def test_tokenize_without_tokenizer():
    manager = TokenizeManager(None)
    params = SamplingParams()
    assert manager.tokenize(TokenizeMsg(uid=0, sampling_params=params, input_ids=[3])) == [3]
    with pytest.raises(ValueError, match="no tokenizer"):
        manager.tokenize(TokenizeMsg(uid=0, sampling_params=params, text="hi"))


# ------------------------------------------------------------------------------- detokenize role


def test_detokenize_role_in_process(tok, monkeypatch):
    from minisgl.tokenizer import roles

    role = roles.DetokenizeRole(tok)
    ids = tok.encode("one two three")
    first = DetokenizeMsg(uid=1, token=ids[0], prompt_len=4, stop=("two",))
    batch = [first, *(DetokenizeMsg(uid=1, token=t) for t in ids[1:])]
    batch.append(DetokenizeMsg(uid=2, token=ids[0], finish_reason="length", stop=("one",)))
    front, back = role.handle([BatchDetokenizerMsg(msgs=batch)])
    assert [(r.uid, r.text, r.finish_reason, r.prompt_tokens) for r in front] == [
        (1, "one ", "stop", 4), (2, "", "stop", 0)  # uid 2: the scheduler already freed it
    ]
    assert front[0].token_ids == ids[:2] and front[0].logprobs is None  # " three" is dropped
    assert back == [AbortBackendMsg(uid=1)] and not role.reqs
    assert role.handle([DetokenizeMsg(uid=1, token=ids[0])]) == ([], [])  # late token: dropped

    role.handle([DetokenizeMsg(uid=3, token=ids[0])])  # aborted by the API: no more tokens
    monkeypatch.setattr(roles, "_IDLE_S", 0.0)
    role.handle([RequestErrorMsg(uid=4, message="prompt: too long", param="prompt")])
    assert not role.reqs and not role.seen

    front, _ = roles.DetokenizeRole(None).handle([DetokenizeMsg(uid=5, token=7)])
    assert front == [UserReply(uid=5, token_ids=[7])]  # no tokenizer: ids only

    # taken by the scheduler: an empty reply with the prompt's length starts the streams
    front, back = role.handle([RequestsAcceptedMsg(uids=[6, 7], prompt_lens=[4, 9])])
    assert front == [UserReply(uid=6, prompt_tokens=4), UserReply(uid=7, prompt_tokens=9)]
    assert not back and not role.reqs


# ------------------------------------------------------------------------------- worker process


def test_worker_start_error_is_reported(tmp_path):
    reader, writer = mp.Pipe(duplex=False)
    addrs = ServerAddrs.create(str(tmp_path / "missing"))  # cannot bind there
    tokenize_worker(str(tmp_path), addrs, tokenize=False, detokenize=True, ready=writer)
    status, message = reader.recv()
    assert status == "error" and "\n" not in message and "failed to start" in message


def replies(queue: ZmqPullQueue, until_finished: int | None = None, timeout: float = 10.0) -> list:
    """Frontend messages (batches flattened) until ``until_finished`` finishes, or a quiet 0.3 s."""
    out, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        msg = queue.get(timeout_ms=300 if until_finished is None else 100)
        if msg is None and until_finished is None:
            break
        out += [] if msg is None else msg.msgs if isinstance(msg, BatchFrontendMsg) else [msg]
        if until_finished is not None and any(
            isinstance(r, UserReply) and r.uid == until_finished and r.finish_reason for r in out
        ):
            break
    return out


def backend_msgs(queue: ZmqPullQueue) -> list:
    msg = queue.get(timeout_ms=10_000)
    assert msg is not None, "nothing reached the scheduler"
    return msg.msgs if isinstance(msg, BatchBackendMsg) else [msg]


def test_worker_process_end_to_end(tok, default_model_dir):
    runtime = make_runtime_dir()
    addrs = ServerAddrs.create(runtime)
    api_out = ZmqPushQueue(addrs.tokenizer, True, TOKENIZER_CODEC)
    api_in = ZmqPullQueue(addrs.frontend, True, FRONTEND_CODEC)
    sched_in = ZmqPullQueue(addrs.backend, True, BACKEND_CODEC)
    ctx = mp.get_context("spawn")
    reader, writer = ctx.Pipe(duplex=False)
    kwargs = dict(tokenize=True, detokenize=True, ready=writer)
    proc = ctx.Process(target=tokenize_worker, args=(default_model_dir, addrs), kwargs=kwargs)
    proc.start()
    sched_out = None
    try:
        assert reader.poll(60) and reader.recv() == ("ok", None)
        sched_out = ZmqPushQueue(addrs.detokenizer, False, DETOKENIZER_CODEC)
        _check_tokenize(tok, api_out, api_in, sched_in)
        _check_detokenize(tok, sched_out, api_in, sched_in)
        proc.terminate()
        proc.join(10)
        assert proc.exitcode == 0, proc.exitcode  # a clean exit, not a kill
    finally:
        if proc.is_alive():
            proc.kill()
        for queue in (api_out, api_in, sched_in, sched_out):
            if queue is not None:
                queue.close()
        remove_runtime_dir(runtime)
    assert not os.path.exists(runtime)


def _check_tokenize(tok, api_out, api_in, sched_in) -> None:
    params = SamplingParams(max_tokens=7, stop=("x",))
    api_out.put(TokenizeMsg(uid=1, sampling_params=params, text="Hello world"))
    [msg] = backend_msgs(sched_in)
    assert msg == UserMsg(uid=1, input_ids=tok.encode("Hello world"), sampling_params=params)
    batch = [TokenizeMsg(uid=2, sampling_params=params, messages=CHAT), AbortMsg(uid=1)]
    api_out.put(BatchTokenizerMsg(msgs=batch))
    user, abort = backend_msgs(sched_in)
    chat = tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert user.input_ids == tok.encode(chat, add_special_tokens=False)
    assert abort == AbortBackendMsg(uid=1)
    api_out.put(TokenizeMsg(uid=3, sampling_params=params, text=""))
    [error] = replies(api_in)
    assert error.uid == 3 and error.status == 400 and error.error_param == "prompt"


def _send_tokens(sched_out, uid: int, ids: list[int], stop=(), last=None) -> None:
    for n, token in enumerate(ids):
        first = dict(prompt_len=5, cached_len=2, stop=stop) if n == 0 else {}
        end = last if n == len(ids) - 1 else None
        top = [(token, -0.5), (token + 1, -1.5)]
        sched_out.put(DetokenizeMsg(
            uid=uid, token=token, finish_reason=end, logprob=-0.5, top_logprobs=top, **first
        ))


def _check_detokenize(tok, sched_out, api_in, sched_in) -> None:
    text = "Héllo 😀🎉 中文 world!"
    ids = tok.encode(text) + [tok.eos_token_id]
    _send_tokens(sched_out, 10, ids, last="stop")
    got = [r for r in replies(api_in, until_finished=10) if r.uid == 10]
    assert "".join(r.text for r in got) == text
    assert [t for r in got for t in r.token_ids] == ids
    assert got[0].prompt_tokens == 5 and got[0].cached_tokens == 2
    assert got[-1].finish_reason == "stop" and all(r.finish_reason is None for r in got[:-1])
    assert [lp[:2] for r in got for lp in r.logprobs] == [(t, -0.5) for t in ids]
    assert all("\ufffd" not in r.text for r in got)

    stop_text = "Hello big world and more"
    _send_tokens(sched_out, 11, tok.encode(stop_text), stop=("world",))
    got = [r for r in replies(api_in, until_finished=11) if r.uid == 11]
    assert "".join(r.text for r in got) == "Hello big "
    assert got[-1].finish_reason == "stop"
    assert AbortBackendMsg(uid=11) in backend_msgs(sched_in)
    sched_out.put(DetokenizeMsg(uid=11, token=ids[0], finish_reason="abort"))  # late: dropped
    stats = SchedulerStatsMsg(
        num_running=1, num_waiting=2, num_aborted=3, num_retractions=0,
        kv_used_tokens=4, kv_total_tokens=8, cache_hit_tokens=1, max_context_len=16,
    )
    sched_out.put(stats)
    assert replies(api_in) == [StatsReply(stats=stats)]


def _orphaning_parent(model_dir: str, addrs: ServerAddrs, conn) -> None:
    """Starts a worker, reports its pid, then dies without a goodbye (as a crashed launcher)."""
    ctx = mp.get_context("spawn")
    reader, writer = ctx.Pipe(duplex=False)
    kwargs = dict(tokenize=True, detokenize=False, ready=writer)
    proc = ctx.Process(target=tokenize_worker, args=(model_dir, addrs), kwargs=kwargs)
    proc.start()
    conn.send((proc.pid, reader.recv()))
    os._exit(0)


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in "ZX"  # a zombie has exited
    except FileNotFoundError:
        return True


def test_worker_exits_when_parent_dies(default_model_dir):
    runtime = make_runtime_dir()
    ctx = mp.get_context("spawn")
    reader, writer = ctx.Pipe(duplex=False)
    args = (default_model_dir, ServerAddrs.create(runtime), writer)
    parent = ctx.Process(target=_orphaning_parent, args=args)
    parent.start()
    try:
        assert reader.poll(60)
        pid, status = reader.recv()
        assert status == ("ok", None)
        parent.join(10)
        deadline = time.monotonic() + 10  # interpreter teardown (torch) takes ~1 s, more if busy
        while not _gone(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _gone(pid), "the worker outlived its parent"
    finally:
        parent.join(1)
        remove_runtime_dir(runtime)


def test_a_long_prompt_logs_no_tokenizer_length_warning(default_model_dir):
    """The window is the scheduler's to enforce; transformers' own limit only made noise."""
    import logging

    from minisgl.utils.hf import load_tokenizer

    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    log = logging.getLogger("transformers")
    log.addHandler(handler)
    try:
        assert len(load_tokenizer(default_model_dir).encode("hello " * 9000)) > 9000
    finally:
        log.removeHandler(handler)
    assert not [m for m in seen if "longer than the specified maximum" in m]
