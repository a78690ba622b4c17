"""The first minute of a server: time to ready, then each kind of request twice.

Starts ``python -m minisgl`` with the given flags (a model directory of random weights made by
``dummy_model.py`` works), waits for ``/health`` to answer 200, then sends three kinds of request
one after another, each twice: greedy chat, sampled chat (temperature, top_p, top_k, presence
penalty, log-probs) and a ``response_format`` JSON schema. On a fresh machine (empty kernel cache:
``--fresh-cache``) the first of each kind used to compile kernels on the request path; with the
warm-up it should take about as long as the second.

    python benchmark/online/first_minute.py --tag qwen3-8b --fresh-cache -- \
        --model /tmp/qwen3-8b --dummy-weights
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import httpx

KINDS = {
    "greedy chat, 8 tokens": {"temperature": 0, "max_tokens": 8},
    "sampled (T, top_p, top_k, presence, logprobs)": {
        "temperature": 0.7, "top_p": 0.9, "top_k": 20, "presence_penalty": 0.5, "logprobs": True,
        "top_logprobs": 3, "max_tokens": 8, "seed": 1},
    "response_format json_schema": {
        "temperature": 0, "max_tokens": 16, "response_format": {
            "type": "json_schema", "json_schema": {
                "name": "p", "schema": {"type": "object", "properties": {"n": {"type": "integer"}},
                                        "required": ["n"]}}}},
}


def wait_ready(url: str, proc: subprocess.Popen, timeout: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return time.monotonic() - start
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError("the server did not become ready")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tag", required=True)
    parser.add_argument("--port", type=int, default=19190)
    parser.add_argument("--fresh-cache", action="store_true",
                        help="compile every kernel anew (an empty TRITON_CACHE_DIR)")
    parser.add_argument("--cache-dir", help="TRITON_CACHE_DIR to use (kept between runs)")
    parser.add_argument("--out", default="bench-out")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("server_args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    env = dict(os.environ)
    if args.fresh_cache:
        env["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton-")
    elif args.cache_dir:
        env["TRITON_CACHE_DIR"] = args.cache_dir
    server_args = [a for a in args.server_args if a != "--"]
    cmd = [sys.executable, "-m", "minisgl", "--port", str(args.port), *server_args]
    os.makedirs(args.out, exist_ok=True)
    log_path = os.path.join(args.out, f"first_minute_{args.tag}.log")
    url = f"http://127.0.0.1:{args.port}"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        ready_s = wait_ready(url, proc, args.timeout)
        rows = []
        with httpx.Client(base_url=url, timeout=args.timeout) as client:
            model = client.get("/v1/models").json()["data"][0]["id"]
            for name, fields in KINDS.items():
                times = []
                for _ in range(2):
                    body = {"model": model, **fields,
                            "messages": [{"role": "user", "content": "Name a prime number."}]}
                    t0 = time.perf_counter()
                    r = client.post("/v1/chat/completions", json=body)
                    times.append(time.perf_counter() - t0)
                    r.raise_for_status()
                rows.append({"kind": name, "first_s": times[0], "second_s": times[1],
                             "ratio": times[0] / times[1]})
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    result = {"tag": args.tag, "fresh_cache": args.fresh_cache, "ready_s": ready_s,
              "command": " ".join(cmd), "requests": rows}
    with open(os.path.join(args.out, f"first_minute_{args.tag}.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(f"## {args.tag}: ready after {ready_s:.1f} s (fresh kernel cache: {args.fresh_cache})")
    print("| request | first (s) | second (s) | first / second |\n|---|---|---|---|")
    for row in rows:
        print(f"| {row['kind']} | {row['first_s']:.3f} | {row['second_s']:.3f} | "
              f"{row['ratio']:.1f}x |")


if __name__ == "__main__":
    main()
