"""Replay a growing multi-turn agent conversation through the agent APIs and report, per turn,
the prompt tokens, the cached (prefix-reused) tokens from the usage fields, and the time to the
first streamed token.

Each turn sends the whole conversation so far, as agents do: a long system prompt and tool list,
Claude Code's per-request billing header (a fresh nonce each turn, which the server strips), the
previous turns, a tool call with its result, and a new user message. With prefix caching working,
every turn after the first reuses all of the previous turn's prompt.

    python benchmark/online/agent_replay.py --url http://127.0.0.1:1919 --turns 10
    python benchmark/online/agent_replay.py --api responses --system-words 4000 --out res.json

Writes a JSON report (to a scratch folder unless ``--out`` says otherwise) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time

import httpx

TOOL = {"name": "run_shell", "description": "Run a shell command and return its output.",
        "schema": {"type": "object", "properties": {"cmd": {"type": "string"}},
                   "required": ["cmd"]}}
WORDS = ("file", "test", "build", "module", "error", "patch", "review", "commit", "branch",
         "server", "cache", "token", "request", "stream", "agent", "window", "prefix")


def system_prompt(words: int, rng: random.Random) -> str:
    return "You are a coding agent. " + " ".join(rng.choice(WORDS) for _ in range(words))


def sse_events(response: httpx.Response):
    for line in response.iter_lines():
        if line.startswith("data: "):
            yield json.loads(line[6:])


def anthropic_turn(client: httpx.Client, model: str, system: str, history: list[dict],
                   nonce: str, max_tokens: int) -> dict:
    body = {"model": model, "max_tokens": max_tokens, "stream": True, "messages": history,
            "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.0."
                        f"{nonce[:3]}; cc_entrypoint=cli; cch={nonce};"},
                       {"type": "text", "text": system}],
            "tools": [{"name": TOOL["name"], "description": TOOL["description"],
                       "input_schema": TOOL["schema"]}]}
    start, ttft, text, usage = time.perf_counter(), None, "", {}
    with client.stream("POST", "/v1/messages", json=body) as r:
        r.raise_for_status()
        for event in sse_events(r):
            if event["type"] == "message_start":
                usage = event["message"]["usage"]
            elif event["type"] == "content_block_delta":
                ttft = ttft or time.perf_counter() - start
                text += event["delta"].get("text", "")
            elif event["type"] == "message_delta":
                usage = {**usage, **event["usage"]}
    cached = usage.get("cache_read_input_tokens", 0)
    return {"prompt_tokens": usage.get("input_tokens", 0) + cached, "cached_tokens": cached,
            "ttft_s": ttft, "text": text}


def responses_turn(client: httpx.Client, model: str, system: str, history: list[dict],
                   nonce: str, max_tokens: int) -> dict:
    body = {"model": model, "max_output_tokens": max_tokens, "stream": True, "store": False,
            "instructions": system, "input": history,
            "tools": [{"type": "function", "name": TOOL["name"],
                       "description": TOOL["description"], "parameters": TOOL["schema"]}]}
    start, ttft, text, usage = time.perf_counter(), None, "", {}
    with client.stream("POST", "/v1/responses", json=body) as r:
        r.raise_for_status()
        for event in sse_events(r):
            if event["type"].endswith(".delta"):
                ttft = ttft or time.perf_counter() - start
                text += event.get("delta", "") if event["type"].endswith("text.delta") else ""
            elif event["type"] in ("response.completed", "response.incomplete"):
                usage = event["response"]["usage"]
    return {"prompt_tokens": usage.get("input_tokens", 0),
            "cached_tokens": usage.get("input_tokens_details", {}).get("cached_tokens", 0),
            "ttft_s": ttft, "text": text}


def grow(api: str, history: list[dict], turn: int, answer: str) -> None:
    """Append the turn's answer, a tool call with its result, and the next user message."""
    call_id, args = f"call_{turn}", json.dumps({"cmd": f"ls src/part{turn}"})
    output = "\n".join(f"src/part{turn}/file{i}.py" for i in range(20))
    if api == "anthropic":
        history += [{"role": "assistant", "content": [
                        {"type": "text", "text": answer or "Let me look."},
                        {"type": "tool_use", "id": f"toolu_{turn}", "name": TOOL["name"],
                         "input": json.loads(args)}]},
                    {"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": f"toolu_{turn}",
                         "content": output},
                        {"type": "text", "text": f"Now check part {turn + 1}."}]}]
    else:
        history += [{"type": "message", "role": "assistant", "content": answer or "Let me look."},
                    {"type": "function_call", "call_id": call_id, "name": TOOL["name"],
                     "arguments": args},
                    {"type": "function_call_output", "call_id": call_id, "output": output},
                    {"type": "message", "role": "user", "content": f"Now check part {turn + 1}."}]


def replay(url: str, api: str, model: str, turns: int, words: int, max_tokens: int,
           key: str, seed: int) -> list[dict]:
    rng = random.Random(seed)
    system = system_prompt(words, rng)
    first = {"role": "user", "content": "Look at the repository and fix the failing test."}
    history: list[dict] = [first if api == "anthropic" else {"type": "message", **first}]
    turn_fn = anthropic_turn if api == "anthropic" else responses_turn
    headers = {"x-api-key": key, "Authorization": f"Bearer {key}"}
    rows = []
    with httpx.Client(base_url=url, headers=headers, timeout=3600) as client:
        for turn in range(turns):
            row = turn_fn(client, model, system, history, f"{rng.getrandbits(20):05x}",
                          max_tokens)
            rows.append({"api": api, "turn": turn + 1, **row})
            grow(api, history, turn + 1, row.pop("text"))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:1919")
    ap.add_argument("--api", choices=("anthropic", "responses", "both"), default="both")
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--system-words", type=int, default=3000,
                    help="size of the system prompt (agents send 10-20k tokens)")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--api-key", default=os.environ.get("MINISGL_API_KEY", "none"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="JSON report (default: a scratch folder)")
    args = ap.parse_args()
    models = httpx.get(f"{args.url}/v1/models", headers={"Authorization":
                                                         f"Bearer {args.api_key}"}).json()
    model = models["data"][0]["id"]
    apis = ("anthropic", "responses") if args.api == "both" else (args.api,)
    rows = [row for api in apis for row in replay(args.url, api, model, args.turns,
                                                  args.system_words, args.max_tokens,
                                                  args.api_key, args.seed)]
    print(f"{'api':<10} {'turn':>4} {'prompt':>7} {'cached':>7} {'hit':>6} {'ttft_s':>8}")
    for r in rows:
        hit = r["cached_tokens"] / r["prompt_tokens"] if r["prompt_tokens"] else 0.0
        ttft = f"{r['ttft_s']:.3f}" if r["ttft_s"] is not None else "-"
        print(f"{r['api']:<10} {r['turn']:>4} {r['prompt_tokens']:>7} {r['cached_tokens']:>7} "
              f"{hit:>6.1%} {ttft:>8}")
    out = args.out or os.path.join(tempfile.mkdtemp(prefix="agent-replay-"), "report.json")
    with open(out, "w") as f:
        json.dump({"url": args.url, "model": model, "args": vars(args), "turns": rows}, f,
                  indent=1)
    print(f"report: {out}")


if __name__ == "__main__":
    main()
