"""The first minute of a server: time to ready, then each kind of request twice.

Starts ``python -m minisgl`` with the given flags (a model directory of random weights made by
``dummy_model.py`` works), measures from process start until ``/health`` answers 200 (and what
its body says is still compiling then), then sends each kind of request twice, one after the
other: greedy chat, sampled chat (temperature, top_p, top_k, presence penalty, log-probs), a
``response_format`` JSON schema, and a forced tool call (``tool_choice: required``: a grammar
from the tool's parameters). With ``--cache-dir`` the server gets that kernel cache (empty: a new
machine; kept from an earlier run: a restart; filled by ``python -m minisgl warmup``: a carried
cache); ``--fresh-cache``: a new empty one. ``--offline``: the offline ``LLM`` instead of a server
(from process start until ``LLM(...)`` returns, then the kinds through ``LLM.chat``; no forced
tool call there).

    python benchmark/online/first_minute.py --tag qwen3-8b_empty --fresh-cache -- \
        --model /tmp/qwen3-8b --dummy-weights
    python benchmark/online/first_minute.py --tag qwen3-8b_llm-empty --offline --fresh-cache -- \
        --model /tmp/qwen3-8b --dummy-weights
    python benchmark/online/first_minute.py --report OUT/first_minute_*.json  # one table
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

_PROMPT = [{"role": "user", "content": "Name a prime number."}]
_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                   "required": ["city"]}}}
KINDS = {
    "greedy": {"temperature": 0, "max_tokens": 8},
    "sampled": {
        "temperature": 0.7, "top_p": 0.9, "top_k": 20, "presence_penalty": 0.5, "logprobs": True,
        "top_logprobs": 3, "max_tokens": 8, "seed": 1},
    "json_schema": {
        "temperature": 0, "max_tokens": 16, "response_format": {
            "type": "json_schema", "json_schema": {
                "name": "p", "schema": {"type": "object", "properties": {"n": {"type": "integer"}},
                                        "required": ["n"]}}}},
    "tools": {"temperature": 0, "max_tokens": 24, "tools": [_TOOL], "tool_choice": "required"},
}


def wait_ready(url: str, proc: subprocess.Popen, start: float,
               timeout: float) -> tuple[float, dict]:
    """Seconds from ``start`` until ``/health`` answers 200, and its body then."""
    while time.monotonic() - start < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            r = httpx.get(f"{url}/health", timeout=1)
            if r.status_code == 200:
                return time.monotonic() - start, r.json()
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise RuntimeError("the server did not become ready")


def measure(client: httpx.Client, model: str) -> list[dict]:
    rows = []
    for name, fields in KINDS.items():
        times, tokens, error = [], [], None
        for _ in range(2):
            body = {"model": model, **fields, "messages": _PROMPT}
            t0 = time.perf_counter()
            r = client.post("/v1/chat/completions", json=body)
            times.append(time.perf_counter() - t0)
            if r.status_code != 200:
                error = f"{r.status_code}: {r.text[:200]}"
                break
            tokens.append(r.json()["usage"]["completion_tokens"])
        rows.append(_row(name, times, tokens, error))
    return rows


def _row(kind: str, times: list[float], tokens: list[int], error: str | None) -> dict:
    """A kind's two requests: their seconds and output tokens (a request that ends at its first
    token measures nothing of its kind's decoding)."""
    return {"kind": kind, "first_s": times[0], "second_s": times[1] if len(times) > 1 else None,
            "tokens": tokens, "error": error}


def run(args: argparse.Namespace) -> dict:
    cache = tempfile.mkdtemp(prefix="kernels-") if args.fresh_cache else args.cache_dir
    server_args = [a for a in args.server_args if a != "--"]
    if cache:
        server_args += ["--cache-dir", cache]
    cmd = [sys.executable, "-m", "minisgl", "--port", str(args.port), *server_args]
    os.makedirs(args.out, exist_ok=True)
    log_path = os.path.join(args.out, f"first_minute_{args.tag}.log")
    if args.offline:
        return run_offline(args, server_args, cache, log_path)
    url = f"http://127.0.0.1:{args.port}"
    start = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        ready_s, health = wait_ready(url, proc, start, args.timeout)
        with httpx.Client(base_url=url, timeout=args.timeout) as client:
            model = client.get("/v1/models").json()["data"][0]["id"]
            rows = measure(client, model)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    return {"tag": args.tag, "cache_dir": cache, "ready_s": ready_s,
            "warming_at_ready": health.get("warming", ""), "command": " ".join(cmd),
            "requests": rows}


def offline_kinds() -> dict:
    """``KINDS`` as the offline ``LLM``'s sampling parameters (no forced tool call there)."""
    from minisgl import SamplingParams

    kinds = {}
    for name, fields in KINDS.items():
        fields = dict(fields)
        schema = fields.pop("response_format", {}).get("json_schema", {}).get("schema")
        if "tools" in fields:
            continue
        kinds[name] = SamplingParams(**fields, json_schema=schema and json.dumps(schema))
    return kinds


def offline_child(server_args: list[str]) -> None:
    """In a process of its own (started by ``run_offline``): the ``LLM`` the server's arguments
    describe (every engine option the server would take), the wall-clock time it is ready, then
    each kind twice; one JSON line on stdout."""
    from dataclasses import fields

    from minisgl import LLM
    from minisgl.server.launch.args import parse_args

    config = parse_args(server_args)
    options = {f.name: getattr(config.engine, f.name) for f in fields(config.engine)
               if getattr(config.engine, f.name) != f.default}
    llm = LLM(config.model, **options)
    ready = time.time()
    kernels = llm.scheduler.kernels
    warming = kernels.warming() if kernels is not None else ""
    rows = []
    for name, params in offline_kinds().items():
        times, tokens = [], []
        for _ in range(2):
            t0 = time.perf_counter()
            out = llm.chat(_PROMPT, params, use_tqdm=False)[0]
            times.append(time.perf_counter() - t0)
            tokens.append(len(out.token_ids))
        rows.append(_row(name, times, tokens, None))
    llm.close()
    print(json.dumps({"ready_wall": ready, "warming": warming, "requests": rows,
                      "options": {k: str(v) for k, v in options.items()}}), flush=True)


def run_offline(args: argparse.Namespace, server_args: list[str], cache: str | None,
                log_path: str) -> dict:
    """The offline ``LLM`` of the server's arguments (``cache`` among them), its first minute
    measured from its process's start."""
    cmd = [sys.executable, __file__, "--offline-child", "--", *server_args]
    start = time.time()
    with open(log_path, "w") as log:
        done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=log, text=True,
                              timeout=args.timeout, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return {"tag": args.tag, "cache_dir": cache, "ready_s": result["ready_wall"] - start,
            "warming_at_ready": result["warming"], "command": " ".join(cmd),
            "options": result["options"], "requests": result["requests"]}


def report(paths: list[str]) -> str:
    """One markdown table of the runs' JSON files, in the order given."""
    lines = ["| run | ready after | still compiling then | "
             + " | ".join(f"{k}, first / second" for k in KINDS) + " |",
             "|---|---|---|" + "---|" * len(KINDS)]
    for path in paths:
        with open(path) as f:
            r = json.load(f)
        cells = []
        by_kind = {row["kind"]: row for row in r["requests"]}
        for kind in KINDS:
            row = by_kind.get(kind)
            if row is None:
                cells.append("")
            elif row["error"]:
                cells.append(f"error {row['error'][:40]}")
            else:
                n = "/".join(map(str, row.get("tokens", [])))
                cells.append(f"{row['first_s']:.3f} / {row['second_s']:.3f} s"
                             + (f" ({n} tokens)" if n else ""))
        lines.append(f"| {r['tag']} | {r['ready_s']:.1f} s | {r['warming_at_ready'] or '-'} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tag")
    parser.add_argument("--port", type=int, default=19190)
    parser.add_argument("--fresh-cache", action="store_true",
                        help="a new, empty kernel cache (--cache-dir of a new temp directory)")
    parser.add_argument("--cache-dir", help="the server's --cache-dir (kept between runs)")
    parser.add_argument("--out", default="bench-out")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--report", nargs="+", metavar="JSON",
                        help="print one table of these runs and exit")
    parser.add_argument("--offline", action="store_true",
                        help="the offline LLM (of the server arguments' --model) instead")
    parser.add_argument("--offline-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("server_args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    if args.offline_child:
        offline_child([a for a in args.server_args if a != "--"])
        return
    if args.report:
        print(report(args.report))
        return
    if not args.tag:
        parser.error("--tag is required")
    result = run(args)
    with open(os.path.join(args.out, f"first_minute_{args.tag}.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(report([os.path.join(args.out, f"first_minute_{args.tag}.json")]))


if __name__ == "__main__":
    main()
