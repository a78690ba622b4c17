"""The Triton sampling kernel against the torch reference: the same tokens for the same seeds.

On CPU the kernel runs under the Triton interpreter at small vocabularies; with a GPU the same tests
run compiled, and the ``gpu`` test adds Qwen's vocabulary in bfloat16.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from helpers.interpreter import import_triton

triton = import_triton()

from minisgl.core import Req, SamplingParams
from minisgl.sampling import BatchSamplingArgs, kernel_sample, sample_torch

pytestmark = pytest.mark.any_device
DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
# small tiles, chunks and candidate rows keep the interpreter fast, give every row several chunks
# of the split path and send more rows down every path
SIZES = dict(block=64, cand=64, chunk=16, cap=128) if DEV.type == "cpu" else {}

PARAMS = [
    dict(temperature=0.0),
    dict(temperature=0.8),
    dict(temperature=0.6, top_k=20, top_p=0.95),
    dict(temperature=1.0, top_k=5),
    dict(temperature=0.7, top_p=0.8),
    dict(temperature=1.3, min_p=0.05),
    dict(temperature=0.9, min_p=0.02, top_k=40, top_p=0.9),
    dict(temperature=0.6, top_k=20, top_p=0.95, presence_penalty=1.5, repetition_penalty=1.05),
    dict(temperature=1.0, frequency_penalty=0.7, top_p=0.9),
    dict(temperature=0.0, repetition_penalty=1.3, presence_penalty=0.5),
    dict(temperature=0.8, top_k=10, logit_bias={3: 100.0, 7: -100.0}),
    dict(temperature=0.0, logit_bias={11: 5.0}),
    dict(temperature=0.5, top_k=3, logprobs=True, top_logprobs=2),
]


def make_reqs(params: list[dict], seed: int, vocab: int) -> list[Req]:
    g = torch.Generator().manual_seed(seed)
    reqs = []
    for i, p in enumerate(params):
        prompt = torch.randint(0, vocab, (6,), generator=g).tolist()
        output = torch.randint(0, vocab, (int(torch.randint(0, 9, (1,), generator=g)),),
                               generator=g).tolist()
        ids = prompt + output
        reqs.append(Req(uid=i, input_ids=ids, prompt_len=len(prompt),
                        sampling_params=SamplingParams(**p), max_device_len=len(ids) + 4,
                        device_len=len(ids), seed=seed * 1000 + i))
    return reqs


def check_top_logits(logits: torch.Tensor, top: tuple[torch.Tensor, torch.Tensor], n: int) -> None:
    """The split path's top ``n`` raw logits (for top log-probs) are torch.topk's: the same values
    in the same order, ids that hold them, lower ids first among equal values."""
    ids, values = top
    assert ids.shape == values.shape == (logits.shape[0], n)
    want = logits.float().topk(n, dim=-1).values
    assert torch.equal(values, want)
    assert torch.equal(logits.float().gather(1, ids), values)
    ties = values[:, 1:] == values[:, :-1]
    assert bool((ids[:, 1:] > ids[:, :-1])[ties].all())


def compare(logits: torch.Tensor, reqs: list[Req], bitmask: torch.Tensor | None = None,
            **sizes) -> list[int]:
    """Kernel == reference (tokens, logsumexp, counts); returns the rows the split path flagged
    for the row kernel."""
    vocab = logits.shape[-1]
    args = BatchSamplingArgs.from_reqs(reqs, vocab, logits.device)
    args.token_bitmask = bitmask
    want = sample_torch(logits, args)  # reads the counts before the kernel adds its tokens
    before = args.penalties.counts.clone() if args.penalties is not None else None
    flags = torch.full((len(reqs),), -1, dtype=torch.int32, device=logits.device)
    got, lse, top = kernel_sample(logits, args, **{**SIZES, **sizes}, flags_out=flags)
    assert got.tolist() == want.tolist()
    if args.need_logprobs:  # the raw logsumexp for log-probs comes out of the same pass
        torch.testing.assert_close(lse, logits.float().logsumexp(-1), rtol=1e-5, atol=1e-5)
    if args.need_logprobs and args.max_top_logprobs > 0 and top is not None:
        check_top_logits(logits, top, args.max_top_logprobs)
    if before is not None:  # the kernel counted each penalised row's token, nothing else
        rows = args.penalties.rows.tolist()
        expect = before.clone()
        for r, t in zip(rows, got.tolist()):
            if r >= 0:
                expect[r, t] += 1
        assert torch.equal(args.penalties.counts, expect)
    return flags.tolist()


@pytest.mark.parametrize("seed,dtype", [(0, torch.float32),  # 10-12 s each in the interpreter
                                        pytest.param(1, torch.float32, marks=pytest.mark.slow),
                                        (2, torch.bfloat16)])
def test_kernel_equals_reference(seed: int, dtype: torch.dtype) -> None:
    vocab = 300
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(len(PARAMS), vocab, generator=g) * 3).to(DEV, dtype)
    compare(logits, make_reqs(PARAMS, seed, vocab))


def test_bitmask_and_ties() -> None:
    vocab = 80
    logits = torch.randn(4, vocab, generator=torch.Generator().manual_seed(1)).to(DEV)
    logits[1] = 0.5  # every token tied: ties at the boundary are all kept
    logits[2, :50] = 2.0
    params = [dict(temperature=0.7, top_k=5), dict(temperature=1.0, top_k=3, top_p=0.5),
              dict(temperature=0.9, top_p=0.3), dict(temperature=0.0)]
    words = (vocab + 31) // 32
    bitmask = torch.full((4, words), -1, dtype=torch.int32)
    bitmask[0, 0] = 0b1010  # row 0 may only take tokens 1 and 3 of the first word...
    bitmask[0, 1:] = 0
    bitmask[3, :] = 0
    bitmask[3, 2] = 1 << 5  # ... row 3 (greedy) only token 69
    for seed in range(2):
        compare(logits, make_reqs(params, seed, vocab), bitmask.to(DEV))
    args = BatchSamplingArgs.from_reqs(make_reqs(params, 0, vocab), vocab, DEV)
    args.token_bitmask = bitmask.to(DEV)
    tokens = kernel_sample(logits, args, **SIZES)[0].tolist()
    assert tokens[0] in (1, 3) and tokens[3] == 69


@pytest.mark.parametrize("split", [False, True])
def test_a_row_whose_grammar_allows_nothing_gets_a_token_in_range(split: bool) -> None:
    """Every token masked (a grammar the tokenizer cannot write): no winner exists; the id must
    still lie inside the vocabulary so that the scheduler can end the request."""
    vocab = 512
    logits = torch.randn(4, vocab, generator=torch.Generator().manual_seed(3)).to(DEV)
    params = [dict(temperature=0.7, top_k=20, top_p=0.9, presence_penalty=0.5),
              dict(temperature=1.0), dict(temperature=0.8, min_p=0.1, logprobs=True),
              dict(temperature=0.0)]
    bitmask = torch.zeros((4, vocab // 32), dtype=torch.int32).to(DEV)
    args = BatchSamplingArgs.from_reqs(make_reqs(params, 0, vocab), vocab, DEV)
    args.token_bitmask = bitmask
    sizes = SPLIT if split else SIZES
    tokens = kernel_sample(logits, args, **sizes)[0].tolist()
    assert all(0 <= t < vocab for t in tokens), tokens


def test_large_nucleus_takes_the_boundary_path() -> None:
    """A flat distribution: top_p's nucleus holds more tokens than one row may gather."""
    cand = SIZES.get("cand", 1024)
    vocab = 3 * cand
    logits = (torch.randn(3, vocab, generator=torch.Generator().manual_seed(3)) * 0.05).to(DEV)
    params = [dict(temperature=1.0, top_p=0.9), dict(temperature=1.0, min_p=0.9),
              dict(temperature=1.0, top_p=0.99, min_p=0.95)]
    for seed in range(2):
        compare(logits, make_reqs(params, seed, vocab), cand=cand, block=SIZES.get("block", 2048))


SPLIT = dict(block=64, cand=64, chunk=16, cap=128)  # 32 chunks per row at vocab 512


def peaked(rows: int, vocab: int, seed: int) -> torch.Tensor:
    """Logits with a few tokens far above a flat rest, spread over the chunks."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=g)
    for r in range(rows):
        top = torch.randperm(vocab, generator=g)[:6]
        logits[r, top] += 8.0 + torch.rand(6, generator=g) * 2
    return logits


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_split_path_decides_peaked_rows(seed: int) -> None:
    """Small top_k / peaked rows: the chunk and merge kernels decide alone (no flag)."""
    vocab = 512
    params = [dict(temperature=0.6, top_k=20, top_p=0.95), dict(temperature=1.0, top_k=3),
              dict(temperature=0.7, top_p=0.8), dict(temperature=1.2, min_p=0.1),
              dict(temperature=0.9, top_k=5, min_p=0.05, top_p=0.9)]
    logits = peaked(len(params), vocab, seed).to(DEV)
    assert compare(logits, make_reqs(params, seed, vocab), **SPLIT) == [0] * len(params)


@pytest.mark.parametrize("seed", [0, 1])
def test_split_path_flags_wide_nucleus(seed: int) -> None:
    """A flat distribution with top_p only: the nucleus holds more tokens than the S * C
    candidates, so the row kernel finishes these rows."""
    vocab = 512
    params = [dict(temperature=1.0, top_p=0.9), dict(temperature=0.8, top_p=0.5),
              dict(temperature=1.0, top_k=200, top_p=0.95)]
    logits = (torch.randn(len(params), vocab, generator=torch.Generator().manual_seed(seed))
              * 0.1).to(DEV)
    assert compare(logits, make_reqs(params, seed, vocab), **SPLIT) == [1] * len(params)


@pytest.mark.parametrize("seed", [0, pytest.param(1, marks=pytest.mark.slow),  # 14-15 s each
                                  pytest.param(2, marks=pytest.mark.slow)])
def test_split_path_mixed_batch(seed: int) -> None:
    """Fast and flagged rows in one batch with greedy, unfiltered, penalised, biased and masked
    rows and log-probs: counts are added once per token, whichever kernel samples it."""
    vocab = 512
    params = [dict(temperature=0.6, top_k=20, top_p=0.95, presence_penalty=1.5,
                   repetition_penalty=1.05),  # fast, penalised
              dict(temperature=1.0, top_p=0.95, frequency_penalty=0.5),  # flat: flagged
              dict(temperature=0.0, repetition_penalty=1.3),  # greedy, penalised
              dict(temperature=0.8),  # race over the whole row
              dict(temperature=0.8, top_k=4, logit_bias={3: 100.0, 7: 50.0}),
              dict(temperature=0.0, logit_bias={11: 5.0}, logprobs=True, top_logprobs=5),
              dict(temperature=0.7, top_k=10, top_p=0.9),  # masked
              dict(temperature=0.9, min_p=0.5)]  # flat: flagged
    logits = peaked(len(params), vocab, seed)
    logits[1] *= 0.02
    logits[7] *= 0.02
    words = vocab // 32
    bitmask = torch.full((len(params), words), -1, dtype=torch.int32)
    bitmask[6, ::2] = 0  # row 6: half the words disallowed
    reqs = make_reqs(params, seed, vocab)
    flags = compare(logits.to(DEV), reqs, bitmask.to(DEV), **SPLIT)
    assert flags == [0, 1, 0, 0, 0, 0, 0, 1]
    # the ablation: the row kernel alone
    compare(logits.to(DEV), make_reqs(params, seed, vocab), bitmask.to(DEV), row_only=True,
            **SPLIT)


@pytest.mark.parametrize("n", [1, 5, 8])
def test_split_path_returns_the_top_raw_logits(n: int) -> None:
    """Top log-probs come out of the split path (no topk over the vocabulary), ties included
    (bf16 logits rounded to few values); the row kernel alone leaves them to the caller."""
    vocab = 512
    params = [dict(temperature=0.0, logprobs=True, top_logprobs=n),
              dict(temperature=0.7, top_k=10, logprobs=True, top_logprobs=2,
                   presence_penalty=1.0),  # the top log-probs are of the raw logits
              dict(temperature=1.0, top_p=0.9)]
    logits = (peaked(len(params), vocab, n) * 4).round() / 4
    logits = logits.to(DEV, torch.bfloat16)
    args = BatchSamplingArgs.from_reqs(make_reqs(params, n, vocab), vocab, logits.device)
    tokens, lse, top = kernel_sample(logits, args, **SPLIT)
    assert top is not None
    check_top_logits(logits, top, max(n, 2))
    assert kernel_sample(logits, args, row_only=True, **SPLIT)[2] is None


@pytest.mark.gpu
@pytest.mark.parametrize("bsz", [1, 64, 256])
def test_kernel_equals_reference_at_qwen_vocab(bsz: int) -> None:
    vocab = 151936
    g = torch.Generator().manual_seed(bsz)
    logits = (torch.randn(bsz, vocab, generator=g) * 2).to(DEV, torch.bfloat16)
    params = [PARAMS[i % len(PARAMS)] for i in range(bsz)]
    flags = compare(logits, make_reqs(params, bsz, vocab))
    # rows with a top_k up to 40 (Qwen's settings among them) are decided by the split path; the
    # top_p-only rows of these flat logits have nuclei of hundreds of tokens (the row kernel)
    fast = [i for i, p in enumerate(params) if 0 < p.get("top_k", 0) <= 40]
    assert [flags[i] for i in fast] == [0] * len(fast)
    assert all(f in (0, 1) for f in flags)


_COMPILE = """
import sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from minisgl.sampling.kernels import row, split

features = sys.argv[1] == "1"
i64 = {"top_k_ptr", "seeds_ptr", "steps_ptr", "count_rows_ptr", "bias_rows_ptr", "tokens_ptr",
       "scratch_ptr", "cand_ptr", "rcand_ptr", "top_ids_ptr"}
i32 = {"counts_ptr", "mask_ptr", "flags_ptr", "args_ptr", "cnt_ptr"}
feats = dict(HAS_COUNTS=features, HAS_BIAS=features, HAS_MASK=features, NEED_LSE=features,
             LIBDEVICE=True)
cases = [
    (row.sample_kernel, dict(feats, BLOCK=2048, CAND=row.CAND, P=row.PIVOTS,
                             MAX_SEARCH=row.MAX_SEARCH, USE_FLAGS=features), 8),
    (split.stats_kernel, dict(feats, CHUNK=2048), 4),
    (split.threshold_kernel, dict(S_PAD=128, GUESS=16, NT=8 * features), 4),
    (split.collect_kernel, dict(HAS_COUNTS=features, HAS_BIAS=features, HAS_MASK=features,
                                CHUNK=2048, CAP=256, NT=8 * features, CPP=4), 4),
    (split.merge_kernel, dict(HAS_COUNTS=features, NEED_LSE=features, LIBDEVICE=True,
                              S_PAD=128, CAP=256, NT=32 * features, RB=1024), 4),
    (split.merge_kernel, dict(HAS_COUNTS=features, NEED_LSE=features, LIBDEVICE=True,
                              S_PAD=32, CAP=256, NT=8 * features, RB=1024), 4),
]
for kernel, consts, warps in cases:
    sig = {n: "*i64" if n in i64 else "*i32" if n in i32 else "*fp32" for n in kernel.arg_names}
    sig.update(logits_ptr="*bf16", V="i32", W="i32", S="i32", top_n="i32")
    sig = {n: sig[n] for n in kernel.arg_names}
    sig.update({name: "constexpr" for name in consts})
    src = ASTSource(fn=kernel, signature=sig,
                    constexprs={(kernel.arg_names.index(n),): v for n, v in consts.items()})
    try:
        compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                                  options={"num_warps": warps})
    except RuntimeError as e:
        print("NO-TOOLCHAIN", e)
        sys.exit(0)
    print(kernel.__name__, "CUBIN", len(compiled.asm["cubin"]), flush=True)
"""


@pytest.mark.parametrize("features", [False, True])
@pytest.mark.slow
def test_kernel_compiles_for_hopper(features: bool, tmp_path) -> None:
    """The whole compiler pipeline for sm_90 (front end, LLVM, ptxas) runs without a GPU: it
    catches what the interpreter accepts but the compiler does not (loop-carried types, ...).
    In a subprocess: this module runs the kernel interpreted, which replaces the compiler."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp_path), TRITON_DEFAULT_FP_FUSION="1",
               PYTHONPATH=os.pathsep.join([
                   os.path.join(os.path.dirname(__file__), "..", "..", "python"),
                   env.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", _COMPILE, "1" if features else "0"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    if "NO-TOOLCHAIN" in done.stdout:
        pytest.skip(done.stdout)
    sizes = [int(line.split("CUBIN")[1]) for line in done.stdout.splitlines() if "CUBIN" in line]
    assert len(sizes) == 6 and min(sizes) > 0, done.stdout
