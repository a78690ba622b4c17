"""The kernel cache a deployment carries: its layout, its keys, the plan files, where Triton is
pointed; and ``python -m minisgl warmup``, which fills it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

from minisgl.engine import EngineConfig
from minisgl.env import kernel_cache_root
from minisgl.llm.config import EngineOptions
from minisgl.server.launch.warmup_cli import parse
from minisgl.warmup import cache as cache_mod
from minisgl.warmup.cache import KernelCache, Platform, model_key, open_kernel_cache
from minisgl.warmup.discover import KernelSet
from minisgl.warmup.variants import Variant

H200 = Platform("NVIDIA H200", (9, 0), "12.8", "2.11.0+cu128", "3.6.0")


@pytest.fixture
def model_dir(tmp_path):
    with open("benchmark/configs/qwen3-0.6b.json") as f:
        (tmp_path / "config.json").write_text(f.read())
    return str(tmp_path)


def _engine(model: str, **fields) -> EngineConfig:
    return EngineConfig(model_path=model, device=torch.device("cuda", 0), dtype=torch.bfloat16,
                        **fields)


def test_the_platform_directory_names_gpu_driver_and_versions():
    assert H200.dirname == "NVIDIA-H200-sm90-driver12.8-torch2.11.0-triton3.6.0"
    cache = KernelCache("/opt/kernels", H200)
    assert cache.triton_dir == f"/opt/kernels/{H200.dirname}/triton"
    assert cache.plan_path("k") == f"/opt/kernels/{H200.dirname}/plans/k.json"


def test_the_driver_version_is_read_from_libcuda(monkeypatch):
    import ctypes

    from minisgl.warmup import cache as cache_mod

    class Driver:  # what cuDriverGetVersion answers for a 12.8 driver
        def cuDriverGetVersion(self, out) -> int:
            out._obj.value = 12080
            return 0

    monkeypatch.setattr(ctypes, "CDLL", lambda name: Driver())
    assert cache_mod._driver_version() == "12.8"

    def missing(name):
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(ctypes, "CDLL", missing)
    assert cache_mod._driver_version() == "unknown"


def test_the_model_key_is_what_decides_the_variants(model_dir, tmp_path):
    key, what = model_key(_engine(model_dir), grammar=True)
    assert key.startswith("Qwen3ForCausalLM-") and key == model_key(_engine(model_dir), True)[0]
    assert what["model"]["hidden_size"] == 1024 and what["grammar"] is True
    # what changes no kernel leaves the key alone: pool sizes, seeds, which GPU of the machine
    same = _engine(model_dir, num_pages=99, seed=3, mem_fraction=0.5)
    assert model_key(same, True)[0] == key
    assert model_key(replace(_engine(model_dir), device=torch.device("cuda", 3)), True)[0] == key
    for other in (_engine(model_dir, max_running_reqs=8), _engine(model_dir, page_size=16),
                  _engine(model_dir, cuda_graph_max_bs=64)):
        assert model_key(other, True)[0] != key
    assert model_key(_engine(model_dir), grammar=False)[0] != key
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 2}))
    assert model_key(_engine(model_dir), True)[0] != key


def test_plans_are_written_whole_and_read_back(tmp_path):
    cache = KernelCache(str(tmp_path), H200)
    assert cache.load_plan("k") is None
    v = Variant("m:k", (("ptr", "float32", True), ("int", "any32"), ("const", 4)),
                (("num_warps", 4),))
    plan = KernelSet([v], [[], [v]], ["fla:chunk"], [])
    cache.save_plan("k", plan, {"model": {"x": 1}})
    assert cache.load_plan("k").all == plan.all  # type: ignore[union-attr]
    readable = json.loads((tmp_path / H200.dirname / "plans" / "k.config.json").read_text())
    assert readable["platform"]["gpu"] == "NVIDIA H200" and readable["model"] == {"x": 1}
    assert not [p for p in os.listdir(tmp_path / H200.dirname / "plans") if p.endswith(".tmp")]
    (tmp_path / H200.dirname / "plans" / "k.json").write_text("{not json")
    assert cache.load_plan("k") is None  # found again, not a failure


def test_triton_is_pointed_at_the_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(cache_mod.Platform, "current", classmethod(lambda cls, device: H200))
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    monkeypatch.delenv("TRITON_CACHE_AUTOTUNING", raising=False)
    monkeypatch.delenv("MINISGL_KERNEL_CACHE_DIR", raising=False)
    monkeypatch.setenv("MINISGL_CACHE_DIR", str(tmp_path / "home"))
    default = open_kernel_cache(None, torch.device("cuda", 0))
    assert default.root == str(tmp_path / "home" / "kernels")
    assert os.environ["TRITON_CACHE_DIR"] == default.triton_dir
    assert os.path.isdir(default.triton_dir) and os.environ["TRITON_CACHE_AUTOTUNING"] == "1"
    # a TRITON_CACHE_DIR of the user's is kept, unless a cache directory is given
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "mine"))
    open_kernel_cache(None, torch.device("cuda", 0))
    assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "mine")
    given = open_kernel_cache(str(tmp_path / "carried"), torch.device("cuda", 0))
    assert os.environ["TRITON_CACHE_DIR"] == given.triton_dir
    assert given.triton_dir.startswith(str(tmp_path / "carried"))
    monkeypatch.setenv("MINISGL_KERNEL_CACHE_DIR", str(tmp_path / "env"))
    assert kernel_cache_root() == str(tmp_path / "env")


def test_a_moved_cache_still_hits(tmp_path, monkeypatch):
    """Triton's group files name their kernel's files by absolute path and a lookup skips paths
    that do not exist: a cache filled in one directory and moved (a container image) must be
    found where it lies now."""
    from triton.runtime.cache import FileCacheManager

    monkeypatch.setattr(cache_mod.Platform, "current", classmethod(lambda cls, device: H200))
    built = open_kernel_cache(str(tmp_path / "built"), torch.device("cuda", 0))
    monkeypatch.setenv("TRITON_CACHE_DIR", built.triton_dir)
    writer = FileCacheManager("k3y")
    paths = {name: writer.put(b"binary", name) for name in ("kernel.cubin", "kernel.json")}
    writer.put_group("kernel.json", paths)
    os.rename(tmp_path / "built", tmp_path / "carried")
    carried = open_kernel_cache(str(tmp_path / "carried"), torch.device("cuda", 0))
    assert os.environ["TRITON_CACHE_DIR"] == carried.triton_dir
    group = FileCacheManager("k3y").get_group("kernel.json")
    assert group is not None and sorted(group) == ["kernel.cubin", "kernel.json"]
    assert all(p.startswith(carried.triton_dir) and os.path.exists(p) for p in group.values())
    assert cache_mod.relocate_triton_groups(carried.triton_dir) == 0  # once is enough


def test_the_cache_dir_option_reaches_the_engine(model_dir, monkeypatch):
    monkeypatch.delenv("MINISGL_KERNEL_CACHE_DIR", raising=False)
    config = EngineOptions(cache_dir="/opt/k").scheduler_config(model_dir, ())
    assert config.engine.kernel_cache_dir == "/opt/k"
    assert EngineOptions().scheduler_config(model_dir, ()).engine.kernel_cache_dir is None
    monkeypatch.setenv("MINISGL_KERNEL_CACHE_DIR", "/from/env")
    assert EngineOptions().scheduler_config(model_dir, ()).engine.kernel_cache_dir == "/from/env"


def test_the_warmup_command_takes_the_servers_flags(model_dir):
    config = parse(["--model", model_dir, "--cache-dir", "/opt/k", "--dtype", "float16",
                    "--max-running-requests", "32", "--warmup", "off"])
    assert config.engine.cache_dir == "/opt/k" and config.engine.max_running_requests == 32
    assert config.engine.dummy_weights and config.engine.warmup == "on"  # no checkpoint read
    with pytest.raises(ValueError, match="^--cache-dir"):
        parse(["--model", model_dir])
    with pytest.raises(ValueError, match="^tp, dp, nnodes"):
        parse(["--model", model_dir, "--cache-dir", "/opt/k", "--tp", "2"])
    with pytest.raises(ValueError, match="^device"):
        parse(["--model", model_dir, "--cache-dir", "/opt/k", "--device", "cpu"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only answer")
def test_the_warmup_command_needs_a_gpu(model_dir, tmp_path):
    cache = tmp_path / "cache"
    out = subprocess.run([sys.executable, "-m", "minisgl", "warmup", "--model", model_dir,
                          "--cache-dir", str(cache)], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONPATH": "python"})
    assert out.returncode == 2 and "GPU" in out.stderr and not cache.exists()
    bad = subprocess.run([sys.executable, "-m", "minisgl", "warmup", "--model", model_dir],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": "python"})
    assert bad.returncode == 2 and "--cache-dir" in bad.stderr


def test_the_activation_peaks_are_kept_for_the_code_that_measured_them(tmp_path, monkeypatch):
    """The peaks that size the KV pool come back for the same key and the same sources; another
    key, or a change to minisgl's sources, finds none (measured anew)."""
    cache = KernelCache(str(tmp_path), H200)
    assert cache.load_peaks("m-1") is None
    cache.save_peaks("m-1", {"forward": 3 << 30, "tower": 0})
    assert cache.load_peaks("m-1") == {"forward": 3 << 30, "tower": 0}
    assert cache.load_peaks("m-2") is None
    monkeypatch.setattr(cache_mod, "source_digest", lambda: "another tree")
    assert cache.load_peaks("m-1") is None
    (tmp_path / H200.dirname / "plans" / "m-3.peaks.json").write_text("{not json")
    assert cache.load_peaks("m-3") is None


def test_the_source_digest_follows_the_sources():
    digest = cache_mod.source_digest()
    assert len(digest) == 20 and digest == cache_mod.source_digest.__wrapped__()


def test_a_warm_up_that_did_not_finish_is_not_taken_for_one_that_did(tmp_path):
    """Without the mark a restart compiles the sampler's stages in processes, as on a new
    cache (a first run stopped before its background stages finished left them uncompiled)."""
    cache = KernelCache(str(tmp_path), H200)
    assert not cache.finished("m-1")
    cache.mark_finished("m-1")
    assert cache.finished("m-1") and not cache.finished("m-2")
