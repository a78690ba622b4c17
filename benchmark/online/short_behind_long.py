"""Time to first token of a short request that arrives while a long prompt is being prefilled:
an agent's side request (a title, a summary) behind its main 20k-token turn.

Sends the long prompt (random token ids, one output token) as a stream, waits until the server
has taken it and its prefill is under way, then sends the short one and reports both requests'
times to first token. The server must hold the long prompt's window, e.g. on a CPU:

    MINISGL_ALLOW_LONG_MAX_MODEL_LEN=1 python -m minisgl --device cpu --max-model-len 24576 \\
        --kv-cache-memory-gb 2
    python benchmark/online/short_behind_long.py --url http://127.0.0.1:1919 --long 20000

``--abort-long`` leaves once the short request has its first token: the long one's stream closes,
the server aborts it, and the rest of its prefill is not waited for (its time to first token is
then not measured). Writes a JSON report (to a scratch folder unless ``--out`` says otherwise)
and prints it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import threading
import time

import httpx


def first_token_time(url: str, prompt: list[int], result: dict, name: str) -> None:
    """Stream ``prompt`` through /v1/completions; record the seconds to its first text chunk."""
    body = {"prompt": prompt, "max_tokens": 1, "stream": True, "temperature": 0,
            "ignore_eos": True}
    start = time.monotonic()
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=3600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                if chunk["choices"] and chunk["choices"][0]["text"] is not None:
                    result[name] = round(time.monotonic() - start, 2)
                    return


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:1919")
    parser.add_argument("--long", type=int, default=20000, help="tokens of the long prompt")
    parser.add_argument("--short", type=int, default=388, help="tokens of the short prompt")
    parser.add_argument("--delay", type=float, default=5.0,
                        help="seconds between the long request and the short one")
    parser.add_argument("--abort-long", action="store_true",
                        help="close the long request once the short one has its first token")
    parser.add_argument("--seed", type=int, default=0,
                        help="of the random prompts (another one misses the prefix cache)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    long = [rng.randint(100, 10000) for _ in range(args.long)]
    short = [rng.randint(100, 10000) for _ in range(args.short)]
    result: dict = {"long_tokens": args.long, "short_tokens": args.short, "delay_s": args.delay}
    worker = threading.Thread(target=first_token_time, args=(args.url, long, result, "long_ttft_s"),
                              daemon=True)  # with --abort-long, its socket closes as we exit
    worker.start()
    time.sleep(args.delay)
    first_token_time(args.url, short, result, "short_ttft_s")
    print(f"short request: first token after {result['short_ttft_s']} s", flush=True)
    if not args.abort_long:
        worker.join()
    out = args.out or os.path.join(tempfile.mkdtemp(prefix="short-behind-long-"), "result.json")
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result), "->", out)


if __name__ == "__main__":
    main()
