"""The command line: vLLM/SGLang spellings, the new flags, the API key from the environment, and
bench.py's commit."""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import subprocess
import sys

import pytest

from minisgl.server.launch.args import parse_args

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_vllm_and_sglang_spellings_are_aliases():
    vllm = parse_args(["--model", "m", "--tensor-parallel-size", "2", "--max-model-len", "512",
                       "--gpu-memory-utilization", "0.5", "--max-num-seqs", "8",
                       "--chunked-prefill-size", "1024", "--enforce-eager",
                       "--no-enable-prefix-caching", "--attention-backend", "TRITON_ATTN"])
    sglang = parse_args(["--model-path", "m", "--tp-size", "2", "--context-length", "512",
                         "--mem-fraction-static", "0.5", "--max-running-requests", "8",
                         "--chunked-prefill-size", "1024", "--disable-cuda-graph",
                         "--disable-radix-cache", "--attention-backend", "triton"])
    ours = parse_args(["--model", "m", "--tp", "2", "--max-seq-len", "512", "--mem-fraction", "0.5",
                       "--max-running-requests", "8", "--max-prefill-tokens", "1024",
                       "--cuda-graph-max-bs", "0", "--piecewise-cuda-graph-max-tokens", "0",
                       "--cache", "naive", "--attn", "triton"])
    assert vllm == sglang == ours
    assert parse_args(["--model", "m"]).engine.cache == "radix"  # aliases set no defaults
    # vLLM's per-step token budget is a flag of ours with the same name and meaning
    assert parse_args(["--max-num-batched-tokens", "1024"]).engine.max_num_batched_tokens == 1024
    assert parse_args(["--attention-backend", "torch_native"]).engine.attn == "torch"
    # the sliding layers' own pool: auto by default, SGLang's ratio and switch, a bad value
    assert parse_args([]).engine.sliding_pool_ratio == "auto"
    assert parse_args(["--swa-full-tokens-ratio", "0.5"]).engine.sliding_pool_ratio == 0.5
    assert parse_args(["--disable-hybrid-swa-memory"]).engine.sliding_pool_ratio == 0


@pytest.mark.parametrize("argv, message", [
    (["--max-total-tokens", "4096"], "--max-total-tokens: the KV pool is sized in pages: use "
     "--num-pages"),
    (["--disable-log-requests"], "use --log-level warning"),
    (["--attention-backend", "FLASH_NOPE"], "use --attn with auto"),
    (["--max-num-sequences", "4"], "did you mean --max-num-seqs"),
])
def test_flags_that_differ_name_the_minisgl_flag(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_:
        parse_args(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_vllm_habits_that_change_nothing_are_accepted():
    """Flags asking for what minisgl always does, and vLLM's short dtype names."""
    plain = parse_args(["--model", "m", "--dtype", "float16"])
    assert parse_args(["--model", "m", "--enable-prefix-caching", "--trust-remote-code",
                       "--enable-auto-tool-choice", "--dtype", "half"]) == plain
    assert parse_args(["--dtype", "bf16"]).engine.dtype == "bfloat16"
    assert parse_args(["--dtype", "fp32"]).engine.dtype == "float32"
    with pytest.raises(ValueError, match="dtype"):
        parse_args(["--dtype", "fp64"])


@pytest.mark.parametrize("port", ["80000", "-5", "65536"])
def test_ports_out_of_range_are_refused_by_name(port):
    with pytest.raises(ValueError, match=r"port: must be in \[0, 65535\]"):
        parse_args(["--port", port])


def test_new_flags():
    config = parse_args(["--tokenizer", "tok/dir", "--chat-template", "t.jinja", "--revision",
                         "v1", "--log-level", "debug", "--ssl-keyfile", "k.pem", "--ssl-certfile",
                         "c.pem", "--allowed-origins", "https://a,https://b", "*",
                         "--log-requests"])
    assert (config.tokenizer, config.chat_template, config.revision) == ("tok/dir", "t.jinja", "v1")
    assert (config.log_level, config.ssl_keyfile, config.ssl_certfile) == ("debug", "k.pem",
                                                                           "c.pem")
    assert config.allowed_origins == ("https://a", "https://b", "*") and config.log_requests
    for bad, field in ((["--log-level", "loud"], "log_level"),
                       (["--ssl-keyfile", "k.pem"], "ssl_keyfile"),
                       (["--shutdown-timeout", "-1"], "shutdown_timeout")):
        with pytest.raises(ValueError, match=field):
            parse_args(bad)


def test_cuda_graph_batch_sizes():
    """SGLang's --cuda-graph-bs: the decode batch sizes captured, each up to --cuda-graph-max-bs;
    a batch replays the smallest that holds it."""
    from minisgl.engine.graph import capture_sizes

    engine = parse_args(["--cuda-graph-bs", "16", "32"]).engine
    assert engine.cuda_graph_bs == [16, 32]
    assert capture_sizes(256, (16, 32)) == [16, 32] and capture_sizes(8, (16, 32)) == [8]
    assert capture_sizes(40) == [1, 2, 4, 8, 16, 32, 40]
    for bad in (["0"], ["16", "512"]):
        with pytest.raises(ValueError, match="cuda_graph_bs"):
            parse_args(["--cuda-graph-bs", *bad])


def test_piecewise_graph_token_counts():
    """SGLang's --piecewise-cuda-graph-tokens: the prefill/mixed token counts captured, each up to
    --piecewise-cuda-graph-max-tokens, which is always captured; by default every 64 tokens up to
    1,024, then every 128 up to 2,048, then every 256: a forward pads to the smallest that holds
    it, never by more than an eighth of its tokens past 1,024."""
    from minisgl.engine.piecewise import capture_sizes

    engine = parse_args(["--piecewise-cuda-graph-tokens", "64", "512"]).engine
    assert engine.piecewise_cuda_graph_tokens == [64, 512]
    assert capture_sizes(4096, (64, 512)) == [64, 512, 4096]
    sizes = capture_sizes(4096)
    assert sizes[:16] == list(range(64, 1025, 64)) and len(sizes) == 32
    assert sizes[16:24] == list(range(1152, 2049, 128))
    assert sizes[24:] == list(range(2304, 4097, 256))
    assert capture_sizes(192) == [64, 128, 192] and capture_sizes(3008)[-2:] == [2816, 3008]
    for n in range(1025, 4097):  # the padding a forward of n tokens gets
        padded = next(s for s in sizes if s >= n)
        assert padded - n < n / 8
    for bad in (["0"], ["64", "8192"]):
        with pytest.raises(ValueError, match="piecewise_cuda_graph_tokens"):
            parse_args(["--piecewise-cuda-graph-tokens", *bad])


def test_api_key_from_the_environment(monkeypatch):
    monkeypatch.delenv("MINISGL_API_KEY", raising=False)
    assert parse_args([]).api_key is None
    monkeypatch.setenv("MINISGL_API_KEY", "from-env")
    assert parse_args([]).api_key == "from-env"
    assert parse_args(["--api-key", "flag"]).api_key == "flag"  # the flag wins


def test_revision_of_a_local_model_is_an_error(tmp_path):
    from minisgl.models.weight import resolve_model_path

    with pytest.raises(ValueError, match="revision"):
        resolve_model_path(str(tmp_path), revision="main")


def _project_commit(module_path: str) -> str:
    code = ("import importlib.util, sys; spec = importlib.util.spec_from_file_location('b', "
            f"{module_path!r}); m = importlib.util.module_from_spec(spec); "
            "spec.loader.exec_module(m); print(m.project_commit())")
    env = {k: v for k, v in os.environ.items() if k != "MINISGL_COMMIT"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_bench_records_the_projects_own_commit(tmp_path):
    bench = os.path.join(ROOT, "benchmark", "offline", "bench_common.py")
    own = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True)
    if own.returncode == 0 and importlib.util.find_spec("torch"):
        assert _project_commit(bench) == own.stdout.strip()
    outer = tmp_path / "outer"  # an exported tree (no .git) inside another repository
    export = outer / "minisgl"
    shutil.copytree(os.path.join(ROOT, "benchmark"), export / "benchmark")
    shutil.copytree(os.path.join(ROOT, "python"), export / "python",
                    ignore=shutil.ignore_patterns("__pycache__"))
    git = ["git", "-C", str(outer), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "outer"], check=True)
    assert _project_commit(str(export / "benchmark" / "offline" / "bench_common.py")) == "unknown"


def test_flags_the_device_does_not_read_say_so(caplog):
    with caplog.at_level(logging.WARNING, logger="minisgl.server.launch.args"):
        parse_args(["--device", "cpu", "--gpu-memory-utilization", "0.5"])
        parse_args(["--device", "cpu", "--kv-cache-memory-gb", "2", "--cuda-graph-max-bs", "0"])
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "--mem-fraction (--gpu-memory-utilization): no effect on this device (the CPU's KV pool "
        "is sized by --kv-cache-memory-gb or --num-pages)",
        "--cuda-graph-max-bs: no effect on this device (no CUDA graphs on a CPU)"]
