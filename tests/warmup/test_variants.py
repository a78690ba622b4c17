"""Kernel variants as Triton keys them: recorded from launches without running them, the same
for any batch size, kept apart where a constexpr, a dtype, an alignment or an integer's class
differs, and written to JSON and back unchanged."""

from __future__ import annotations

import threading

import torch

from minisgl.core import Req
from minisgl.sampling import BatchSamplingArgs
from minisgl.sampling.sampler import kernel_sample
from minisgl.warmup.plan import sampler_cases
from minisgl.warmup.variants import Variant, arg_spec, record_launches

VOCAB = 151_936  # Qwen's: the split sampler's path


def _sampler_variants(rows: int, grammar: bool = True) -> set[Variant]:
    """What the sampler launches for every case of the plan, recorded from CPU tensors."""
    found: set[Variant] = set()
    for case in sampler_cases(grammar):
        reqs = [Req(uid=i, input_ids=[1] * 9, prompt_len=8, sampling_params=case.params,
                    max_device_len=9, table_idx=i, device_len=8) for i in range(rows)]
        args = BatchSamplingArgs.from_reqs(reqs, VOCAB, torch.device("cpu"))
        if case.params.grammar is not None:
            args.token_bitmask = torch.zeros(rows, -(-VOCAB // 32), dtype=torch.int32)
        with record_launches() as rec:
            kernel_sample(torch.empty(rows, VOCAB), args)
        assert not rec.autotuned
        found |= rec.variants
    return found


def test_the_sampler_variants_are_computed_on_a_cpu_and_do_not_depend_on_the_batch():
    two, five = _sampler_variants(2), _sampler_variants(5)
    assert two == five and len(two) == 67  # 16 stats, 3 threshold, 24 collect, 8 merge, 16 rows
    kernels = {v.short_name for v in two}
    assert kernels == {"stats_kernel", "threshold_kernel", "collect_kernel", "merge_kernel",
                       "sample_kernel"}
    assert len(_sampler_variants(2, grammar=False)) < len(two)  # no mask: fewer


def test_a_variant_is_its_specialisation_not_its_values():
    from minisgl.kernel.triton.norm import _rmsnorm_kernel

    def launch(rows: int, dim: int = 256) -> Variant:
        x = torch.empty(rows, dim, dtype=torch.float16)
        args = (x, x, x[0], x, x, x, x, x, rows, 1, dim, 0, 0, dim, 0, dim, 1e-6, 1, 0, 0)
        with record_launches() as rec:
            _rmsnorm_kernel[(1,)](*args, HAS_RES=False, QUANT=False, ROWS=4, BLOCK_D=256,
                                  USE_PDL=False, num_warps=4)
        (variant,) = rec.variants
        return variant

    assert launch(1) == launch(17) == launch(64)  # n_rows: do_not_specialize
    assert launch(3) != launch(3, dim=250)  # a stride divisible by 16 or not
    v = launch(5)
    assert v.options == (("num_warps", 4),)
    assert Variant.from_json(v.to_json()) == v


def test_arg_specs_follow_tritons_classes():
    x = torch.empty(8, dtype=torch.float32)
    assert arg_spec(x, False) == ("ptr", "float32", True)
    assert arg_spec(x[1:], False) == ("ptr", "float32", False)  # 4 bytes off: unaligned
    assert arg_spec(x[4:], False) == ("ptr", "float32", True)
    assert arg_spec(x[1:], False, align=False) == ("ptr", "float32", None)
    assert arg_spec(1, False) == ("int", "1")
    assert arg_spec(32, False) == ("int", "d1632") and arg_spec(33, False) == ("int", "any32")
    assert arg_spec(1 << 40, False) == ("int", "d1664")
    assert arg_spec(33, False, specialize=False) == arg_spec(1, False, specialize=False)
    assert arg_spec(0.5, False) == ("float",) and arg_spec(None, False) == ("none",)
    assert arg_spec(7, True) == ("const", 7)


def test_only_the_recording_thread_is_intercepted():
    from minisgl.kernel.triton.activation import silu_and_mul

    seen = []

    def other() -> None:  # launches for real (the interpreter) while the main thread records
        seen.append(silu_and_mul(torch.ones(2, 8)).shape)

    with record_launches() as rec:
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
        silu_and_mul(torch.ones(3, 8))
    assert seen == [torch.Size([2, 4])]
    assert {v.short_name for v in rec.variants} == {"_silu_and_mul_kernel"}


def test_a_shadow_runs_tables_stay_apart_from_the_engines():
    """The engine's cached rotary tables are never the fakes a shadow run computed on its own
    thread first (``utils/fake.py``)."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    from minisgl.layers.rotary import cos_sin_cache
    from minisgl.models.config import RotaryConfig

    cfg = RotaryConfig(64, 10000.0, 32)
    with FakeTensorMode():
        fake = cos_sin_cache(cfg, torch.device("cpu"))
    real = cos_sin_cache(cfg, torch.device("cpu"))
    assert isinstance(fake, FakeTensor) and not isinstance(real, FakeTensor)
    assert real.shape == (32, 64) and torch.isfinite(real).all()
