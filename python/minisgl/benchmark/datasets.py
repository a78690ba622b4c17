"""Workloads of the online benchmark: what to send (prompt, output length) and, for traces, when.

Prompts are token ids (exact lengths, for servers that accept them in ``/v1/completions``) or
random words (any server; about one token per word with BPE tokenizers, the server's ``usage``
gives the real count). Everything is drawn from a seeded ``random.Random``: the same seed gives the
same workload, so runs against different servers or flags compare like with like.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Literal

PromptKind = Literal["ids", "words"]
DEFAULT_ID_RANGE = (100, 10000)  # skips the low ids, where tokenizers keep their special tokens
WORDS = tuple("""
time year people way day man thing woman life child world school state family student group
country problem hand part place case week company system program question work government number
night point home water room mother area money story fact month lot right study book eye job word
business issue side kind head house service friend father power hour game line end member law car
city community name president team minute idea kid body information back parent face others level
office door health person art war history party result change morning reason research girl guy
moment air teacher force education foot boy age policy music market sense nation plan college
interest death experience effect class control care field development role effort rate heart drug
show leader light voice wife police mind price report decision son view relationship town road
arm difference value building action model season society tax director position player record
paper space ground form event official matter center couple site project activity star table need
court oil situation cost industry figure street image phone data picture practice piece land
""".split())


@dataclass
class BenchRequest:
    """One request: ``input_len`` is exact for token ids, approximate for words."""

    prompt: str | list[int]
    input_len: int
    output_len: int
    arrival: float | None = None  # seconds after the start (traces); None: set by the arrivals


def _length(rng: random.Random, bounds: tuple[int, int]) -> int:
    lo, hi = bounds
    if not 1 <= lo <= hi:
        raise ValueError(f"length range must satisfy 1 <= min <= max, got {bounds}")
    return rng.randint(lo, hi)


def random_tokens(rng: random.Random, n: int, kind: PromptKind,
                  id_range: tuple[int, int] = DEFAULT_ID_RANGE) -> list[int] | list[str]:
    if kind == "ids":
        return [rng.randrange(*id_range) for _ in range(n)]
    return [rng.choice(WORDS) for _ in range(n)]


def as_prompt(tokens: list, kind: PromptKind) -> str | list[int]:
    return list(tokens) if kind == "ids" else " ".join(tokens)


def random_requests(n: int, input_len: tuple[int, int], output_len: tuple[int, int], seed: int = 0,
                    kind: PromptKind = "ids",
                    id_range: tuple[int, int] = DEFAULT_ID_RANGE) -> list[BenchRequest]:
    """``n`` independent prompts; lengths uniform in the inclusive ranges."""
    rng = random.Random(seed)
    reqs = []
    for _ in range(n):
        ilen, olen = _length(rng, input_len), _length(rng, output_len)
        tokens = random_tokens(rng, ilen, kind, id_range)
        reqs.append(BenchRequest(as_prompt(tokens, kind), ilen, olen))
    return reqs


def shared_prefix_requests(groups: int, per_group: int, prefix_len: int, question_len: int,
                           output_len: tuple[int, int], seed: int = 0, kind: PromptKind = "ids",
                           id_range: tuple[int, int] = DEFAULT_ID_RANGE) -> list[BenchRequest]:
    """``groups`` system prompts of ``prefix_len`` tokens, each followed by ``per_group`` distinct
    questions of ``question_len`` tokens; shuffled, so groups interleave as users would. A prefix
    cache computes each system prompt once; without one, every request pays for it."""
    rng = random.Random(seed)
    reqs = []
    for _ in range(groups):
        prefix = random_tokens(rng, prefix_len, kind, id_range)
        for _ in range(per_group):
            question = random_tokens(rng, question_len, kind, id_range)
            reqs.append(BenchRequest(as_prompt(prefix + question, kind), prefix_len + question_len,
                                     _length(rng, output_len)))
    rng.shuffle(reqs)
    return reqs


def load_trace(path: str) -> list[dict]:
    """A JSONL trace: one object per request with ``timestamp``, ``input_length``,
    ``output_length`` and optionally ``hash_ids`` (the Qwen / Mooncake usage-trace fields)."""
    records = []
    with open(path) as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            rec = json.loads(line)
            missing = {"timestamp", "input_length", "output_length"} - rec.keys()
            if missing:
                raise ValueError(f"{path}:{i}: missing {sorted(missing)}")
            records.append(rec)
    return sorted(records, key=lambda r: float(r["timestamp"]))


def trace_requests(records: list[dict], scale: float = 1.0, time_unit: float = 1.0,
                   block_size: int = 16, seed: int = 0, kind: PromptKind = "ids",
                   max_requests: int | None = None,
                   id_range: tuple[int, int] = DEFAULT_ID_RANGE) -> list[BenchRequest]:
    """Requests at the trace's times: ``(timestamp - first) * time_unit * scale`` seconds after the
    start (``time_unit`` 0.001 for millisecond timestamps; ``scale`` 0.5 replays twice as fast).

    With ``hash_ids``, block ``h`` of a prompt is always the same ``block_size`` tokens (drawn
    from a generator seeded by ``h`` and ``seed``), so prompts share prefixes exactly where the
    traced ones did and a prefix cache sees the trace's hit pattern.
    """
    if scale <= 0:
        raise ValueError(f"trace scale must be > 0, got {scale}")
    records = records[:max_requests] if max_requests is not None else records
    rng = random.Random(seed)
    start = float(records[0]["timestamp"]) if records else 0.0
    reqs = []
    for rec in records:
        ilen, olen = max(1, int(rec["input_length"])), max(1, int(rec["output_length"]))
        tokens: list = []
        for h in rec.get("hash_ids") or []:
            tokens += random_tokens(random.Random(f"{seed}:{h}"), block_size, kind, id_range)
        tokens = tokens[:ilen] + random_tokens(rng, max(0, ilen - len(tokens)), kind, id_range)
        at = (float(rec["timestamp"]) - start) * time_unit * scale
        reqs.append(BenchRequest(as_prompt(tokens, kind), ilen, olen, at))
    return reqs
