"""Run Codex CLI and Claude Code non-interactively against a minisgl server.

    npm install -g @openai/codex @anthropic-ai/claude-code
    MINISGL_ALLOW_LONG_MAX_MODEL_LEN=1 .venv/bin/python -m minisgl --max-model-len 32768 \
        --kv-cache-memory-gb 2
    .venv/bin/python scripts/agent_clis.py --url http://127.0.0.1:1919 [--only codex|claude]

Their system prompts and tools are 10-20k tokens, beyond the default model's 8,192-token window,
hence the long window (an explicit opt-in) and a KV pool that holds it. Codex runs ``codex exec``
in a private ``CODEX_HOME`` whose ``config.toml`` holds only the model and a custom provider
(``wire_api = "responses"``): Codex's defaults otherwise, its multi-agent namespace tools offered
to the model, its web search left out by the server; Claude Code runs ``claude -p`` with
``ANTHROPIC_BASE_URL`` in a private ``HOME``, telemetry and non-essential traffic off. Each must
exit 0 with the model's answer on stdout; the small model need not solve the task. Prints one
JSON line per client.

With its full 20k-token prompt, 2.5x the positions SmolLM2-135M was trained on, that model does
not end an answer: Claude Code continues a ``max_tokens`` stop three times, then exits 1 with
"response exceeded the N output token maximum" (the protocol held: every request answered, the
continuations reuse the prompt from the prefix cache). ``--claude-lean`` drops its built-in
tools (a 1.5k-token prompt), where the same model ends its answer and Claude Code exits 0.

``--server-log PATH`` (the server's stderr) checks the protocol: every request the clients sent
during the run must have been answered (status 200), but for the context retry the docs describe
(a 400 ``exceed context limit``, after which Claude Code asks again for what fits). One more JSON
line lists the requests with their statuses and times.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import httpx

PACKAGES = {"codex": "@openai/codex", "claude": "@anthropic-ai/claude-code"}
PROMPT = "Reply with one short sentence saying hello."
CODEX_CONFIG = """\
model = "{model}"
model_provider = "minisgl"

[model_providers.minisgl]
name = "minisgl"
base_url = "{url}/v1"
wire_api = "responses"
env_key = "MINISGL_API_KEY"
request_max_retries = 0
stream_max_retries = 0
stream_idle_timeout_ms = 1800000
"""

# the request log's line (server/openai/request_log.py), after the logger's "[HH:MM:SS INFO name] "
LOGGED = re.compile(r"\[(?P<time>[\d:]+) \w+ [\w.]+\] request (?:refused: (?P<route>\S+ \S+)"
                    r"|(?P<id>\S+):) status=(?P<status>\d+)(?P<fields>.*?)"
                    r"(?: error=(?P<error>.*))?$")
CONTEXT_RETRY = "exceed context limit"


def logged_requests(log: str) -> list[dict]:
    """The ended or refused requests in a server log, with their status, fields and error."""
    found = []
    for line in log.splitlines():
        if (m := LOGGED.search(line)) is None:
            continue
        fields = dict(kv.split("=", 1) for kv in m["fields"].split() if "=" in kv)
        found.append({"time": m["time"], "request": m["id"] or m["route"],
                      "status": int(m["status"]), **fields,
                      **({"error": m["error"]} if m["error"] else {})})
    return found


def unanswered(requests: list[dict]) -> list[dict]:
    """Requests not answered: any error but the context retry."""
    return [r for r in requests if r["status"] != 200
            and not (r["status"] == 400 and CONTEXT_RETRY in r.get("error", ""))]


def served_model(url: str, key: str) -> str:
    models = httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {key}"}).json()
    return models["data"][0]["id"]


def run_codex(url: str, model: str, key: str, timeout: float,
              web_search: str | None = None) -> dict:
    """``web_search``: Codex's ``web_search`` setting (``live``, ``cached``, ``disabled``); None
    leaves it out of ``config.toml``, at Codex's default (a ``web_search`` tool is sent)."""
    home = tempfile.mkdtemp(prefix="codex-home-")
    config = CODEX_CONFIG.format(model=model, url=url)
    if web_search is not None:  # a top-level key: before the provider's table
        config = f'web_search = "{web_search}"\n' + config
    with open(os.path.join(home, "config.toml"), "w") as f:
        f.write(config)
    env = {**os.environ, "CODEX_HOME": home, "MINISGL_API_KEY": key}
    cmd = ["codex", "exec", "--skip-git-repo-check", "--sandbox", "read-only", PROMPT]
    return _run("codex", cmd, env, timeout, tempfile.mkdtemp(prefix="codex-work-"))


def run_claude(url: str, model: str, key: str, timeout: float, max_output_tokens: int = 256,
               lean: bool = False) -> dict:
    """``lean``: without Claude Code's built-in tools (a 1.5k-token prompt instead of 20k)."""
    home = tempfile.mkdtemp(prefix="claude-home-")
    env = {**os.environ, "HOME": home, "ANTHROPIC_BASE_URL": url, "ANTHROPIC_API_KEY": key,
           "ANTHROPIC_MODEL": model, "ANTHROPIC_SMALL_FAST_MODEL": model,
           "ANTHROPIC_DEFAULT_HAIKU_MODEL": model, "DISABLE_TELEMETRY": "1",
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1",
           "API_TIMEOUT_MS": str(int(timeout * 1000)),
           # a turn of a 20k-token prompt takes minutes on a CPU: Claude Code's stream watchdogs
           # (300 s) follow --timeout
           "CLAUDE_STREAM_IDLE_TIMEOUT_MS": str(int(timeout * 1000)),
           "CLAUDE_BYTE_STREAM_IDLE_TIMEOUT_MS": str(int(timeout * 1000)),
           # it asks for 32,000 (cut to the window after a retry): a short answer is the test
           "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(max_output_tokens)}
    cmd = ["claude", "-p", PROMPT, "--model", model, "--max-turns", "1",
           *(["--tools", ""] if lean else [])]
    return _run("claude", cmd, env, timeout, home)


def _run(name: str, cmd: list[str], env: dict, timeout: float, cwd: str) -> dict:
    if shutil.which(cmd[0]) is None:
        return {"client": name, "skipped": f"{cmd[0]} is not installed"}
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired as e:
        return {"client": name, "rc": None, "error": f"timed out after {timeout} s",
                "stderr_tail": (e.stderr or b"")[-2000:].decode(errors="replace")
                if isinstance(e.stderr, bytes) else (e.stderr or "")[-2000:]}
    return {"client": name, "rc": proc.returncode, "seconds": round(time.monotonic() - start, 1),
            "stdout": proc.stdout.strip()[-2000:], "stderr_tail": proc.stderr.strip()[-2000:]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:1919")
    ap.add_argument("--api-key", default=os.environ.get("MINISGL_API_KEY", "none"))
    ap.add_argument("--only", choices=("codex", "claude"))
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per client")
    ap.add_argument("--server-log", help="the server's log: check that every request was answered")
    ap.add_argument("--codex-web-search", choices=("live", "cached", "disabled"),
                    help="Codex's web_search setting (default: left out, at Codex's default)")
    ap.add_argument("--claude-output-tokens", type=int, default=256,
                    help="CLAUDE_CODE_MAX_OUTPUT_TOKENS (decoding at a 20k context is slow on CPU)")
    ap.add_argument("--claude-lean", action="store_true",
                    help="Claude Code without its built-in tools (a small model ends its answer)")
    args = ap.parse_args()
    model = served_model(args.url, args.api_key)
    log_start = os.path.getsize(args.server_log) if args.server_log else 0
    ok = True
    for name, fn in (("codex", run_codex), ("claude", run_claude)):
        if args.only in (None, name):
            extra = ({"lean": args.claude_lean, "max_output_tokens": args.claude_output_tokens}
                     if name == "claude" else {"web_search": args.codex_web_search})
            result = fn(args.url, model, args.api_key, args.timeout, **extra)
            print(json.dumps(result), flush=True)
            ok = ok and ("skipped" in result or (result["rc"] == 0 and bool(result["stdout"])))
    if args.server_log:
        time.sleep(1.0)  # the last request's line
        with open(args.server_log, errors="replace") as f:
            f.seek(log_start)
            requests = logged_requests(f.read())
        print(json.dumps({"requests": requests, "unanswered": unanswered(requests)}), flush=True)
        ok = ok and not unanswered(requests)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
