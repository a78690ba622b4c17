"""Batch sampling: exactness of the filters, batch-independent reproducibility, hash quality,
penalties."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from minisgl.core import Req, SamplingParams
from minisgl.sampling import (
    BatchSamplingArgs,
    apply_penalties,
    random_uniform,
    sample,
)

CPU = torch.device("cpu")
LOGITS8 = torch.tensor([2.0, 1.6, 1.1, 0.7, 0.2, -0.4, -1.0, -2.2])
MASK64 = (1 << 64) - 1


def make_req(
    prompt: list[int], output: list[int] = (), seed: int = 0, uid: int = 0, **params
) -> Req:
    ids = list(prompt) + list(output)
    return Req(  # as the scheduler hands it to sampling: every known token fed
        uid=uid,
        input_ids=ids,
        prompt_len=len(prompt),
        sampling_params=SamplingParams(**params),
        max_device_len=len(ids) + 16,
        seed=seed,
        device_len=len(ids),
    )


def args_for(reqs: list[Req], vocab: int) -> BatchSamplingArgs:
    return BatchSamplingArgs.from_reqs(reqs, vocab, CPU)


def draw(logits: torch.Tensor, reqs: list[Req]) -> torch.Tensor:
    return sample(logits, args_for(reqs, logits.shape[-1])).next_tokens


def steps_batch(req: Req, vocab: int, n: int) -> BatchSamplingArgs:
    """One request's args repeated over ``n`` rows at steps 0..n-1: n independent draws, no n
    Reqs."""
    args = args_for([req], vocab)
    rep = {
        f.name: getattr(args, f.name).expand(n).contiguous()
        for f in dataclasses.fields(args)
        if isinstance(getattr(args, f.name), torch.Tensor)
    }
    rep["steps"] = torch.arange(n, dtype=torch.int64)
    return dataclasses.replace(args, **rep)


# --- reference implementations, written independently of the module ---------------------------


def splitmix_ref(seed: int, step: int, index: int) -> int:
    def mix(z: int) -> int:
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)

    golden = 0x9E3779B97F4A7C15
    row = mix((seed + golden) & MASK64)
    row = mix((row + (step + 1) * golden) & MASK64)
    return mix((row + (index + 1) * golden) & MASK64)


def expected_dist(
    logits: torch.Tensor, temperature: float, top_k: int = -1, top_p: float = 1.0,
    min_p: float = 0.0,
) -> torch.Tensor:
    probs = (logits.double() / temperature).softmax(-1)
    if min_p > 0:  # keep the test away from decisions float32 rounding could flip
        assert (probs / probs.max() - min_p).abs().min() > 1e-3
    keep = probs >= min_p * probs.max()
    order = probs.argsort(descending=True).tolist()
    if top_k > 0:
        for i in order[top_k:]:
            keep[i] = False
    kept = torch.where(keep, probs, 0.0)
    kept = kept / kept.sum()
    if top_p < 1:
        assert (kept.sort(descending=True).values.cumsum(0) - top_p).abs().min() > 1e-3
    mass, nucleus = 0.0, torch.zeros_like(keep)
    for i in order:
        if keep[i] and mass < top_p:
            nucleus[i] = True
            mass += kept[i].item()
    final = torch.where(nucleus, kept, 0.0)
    return final / final.sum()


# --- the hash ----------------------------------------------------------------------------------


def test_hash_matches_python_reference_including_wraparound() -> None:
    seeds = [0, 1, 12345, 2**62 + 7, 2**63 - 1, 2**64 - 1]
    steps = [0, 1, 999, 2**40]
    rows = [(s, t) for s in seeds for t in steps]
    vocab = 17
    u = random_uniform(
        torch.tensor([(s + 2**63) % 2**64 - 2**63 for s, _ in rows]),
        torch.tensor([t for _, t in rows]),
        vocab,
    )
    top63 = [[splitmix_ref(s, t, i) >> 1 for i in range(vocab)] for s, t in rows]
    expected = (torch.tensor(top63, dtype=torch.float64) * 2.0**-63 + 2.0**-64).float()
    torch.testing.assert_close(u, expected.clamp(max=1 - 2.0**-24), rtol=0, atol=0)


def test_hash_uniforms_are_uniform_and_independent() -> None:
    seeds = torch.arange(64).repeat_interleave(64)
    steps = torch.arange(64).repeat(64)
    u = random_uniform(seeds, steps, 256).double()  # 4096 x 256 ~ 1M values
    assert u.min() > 0 and u.max() < 1
    n = u.numel()
    assert abs(u.mean().item() - 0.5) < 4 * math.sqrt(1 / 12 / n)
    assert abs(u.var().item() - 1 / 12) < 1e-3
    bins = 200
    hist = torch.histc(u, bins=bins, min=0, max=1)
    chi2 = ((hist - n / bins) ** 2 / (n / bins)).sum().item()
    assert chi2 < bins + 5 * math.sqrt(2 * bins), chi2  # ~ 5 sigma for chi2 with 199 dof
    centred = u - 0.5
    bound = 5 / math.sqrt(4096 * 255)

    def corr(a: torch.Tensor, b: torch.Tensor) -> float:
        return ((a * b).mean() / (a.std() * b.std())).item()

    assert abs(corr(centred[:, 1:], centred[:, :-1])) < bound  # neighbouring vocab indices
    grid = centred.view(64, 64, 256)
    assert abs(corr(grid[:, 1:], grid[:, :-1])) < bound  # neighbouring steps
    assert abs(corr(grid[1:], grid[:-1])) < bound  # neighbouring seeds
    low_bits = (u * 2**20).floor().remainder(2)  # the low bits of the mantissa are balanced too
    assert abs(low_bits.mean().item() - 0.5) < 5 * math.sqrt(0.25 / n)


# --- greedy ------------------------------------------------------------------------------------


def test_greedy_is_argmax_and_top_k_one_is_greedy() -> None:
    torch.manual_seed(0)
    logits = torch.randn(6, 50)
    reqs = [
        make_req([1], temperature=0.0, seed=1),
        make_req([1], top_k=1, temperature=1.0, seed=2),
        make_req([1], top_k=1, temperature=1.3, top_p=0.5, seed=3),
        make_req([1], temperature=0.0, seed=4),
        make_req([1], top_k=1, seed=5),
        make_req([1], temperature=1e-7, seed=6),  # below 1e-5: treated as greedy
    ]
    args = args_for(reqs, 50)
    assert args.all_greedy
    assert torch.equal(sample(logits, args).next_tokens, logits.argmax(-1))
    mixed = reqs + [make_req([1], temperature=1.0, seed=9)]
    logits7 = torch.cat([logits, torch.randn(1, 50)])
    assert torch.equal(draw(logits7, mixed)[:6], logits.argmax(-1))


def test_low_precision_logits_are_accepted() -> None:
    logits = torch.randn(3, 40).to(torch.bfloat16)
    reqs = [make_req([1], temperature=0.0), make_req([1], top_p=0.9, seed=3),
            make_req([1], min_p=0.2)]
    out = sample(logits, args_for(reqs, 40))
    assert out.next_tokens.dtype == torch.int64
    assert out.next_tokens[0] == logits.float().argmax(-1)[0]


# --- reproducibility ---------------------------------------------------------------------------


def test_same_seed_step_logits_same_token_whatever_the_batch() -> None:
    torch.manual_seed(1)
    vocab = 1000
    probe_logits = torch.randn(vocab)

    def probe(seed, n_out):
        return make_req([5, 6], [7] * n_out, seed=seed, temperature=1.0, top_p=0.95)

    others = [
        make_req([1, 2, 3], [4, 4], seed=11, temperature=0.0),
        make_req([9], seed=12, min_p=0.05, temperature=0.8),
        make_req([3, 3], [3], seed=13, top_k=20, repetition_penalty=1.3, presence_penalty=0.5),
        make_req([8], seed=14, logprobs=True, top_logprobs=3),
    ]
    for seed in range(8):
        for n_out in (0, 3, 17):
            alone = draw(probe_logits[None], [probe(seed, n_out)])
            for pos in range(len(others) + 1):
                reqs = others[:pos] + [probe(seed, n_out)] + others[pos:]
                logits = torch.randn(len(reqs), vocab)
                logits[pos] = probe_logits
                assert draw(logits, reqs)[pos] == alone[0], (seed, n_out, pos)


def test_batch_equals_rows_sampled_one_by_one() -> None:
    torch.manual_seed(2)
    vocab = 300
    params = [
        dict(temperature=1.0),
        dict(temperature=0.6, top_k=40),
        dict(temperature=1.2, top_p=0.7),
        dict(temperature=0.9, min_p=0.1),
        dict(temperature=1.0, top_k=10, top_p=0.9, min_p=0.02),
        dict(temperature=0.0),
    ]
    reqs = [
        make_req([i % 7, 3], [i % 5] * (i % 4), seed=1000 + i, uid=i, **params[i % len(params)])
        for i in range(60)
    ]
    logits = torch.randn(len(reqs), vocab) * 2
    batched = draw(logits, reqs)
    singles = torch.cat([draw(logits[i : i + 1], [r]) for i, r in enumerate(reqs)])
    assert torch.equal(batched, singles)
    perm = torch.randperm(len(reqs))
    assert torch.equal(draw(logits[perm], [reqs[i] for i in perm.tolist()]), batched[perm])


def test_different_seeds_and_steps_give_different_tokens() -> None:
    torch.manual_seed(3)
    vocab = 200
    logits = torch.randn(vocab) * 0.5  # high entropy: repeats are rare by chance
    n = 300
    probs = logits.double().softmax(-1)
    distinct = (1 - (1 - probs) ** n).sum().item()  # expected number of distinct tokens in n draws
    by_seed = draw(logits.expand(n, vocab), [make_req([1], seed=s) for s in range(n)])
    assert by_seed.unique().numel() > distinct - 15
    a = sample(logits.expand(n, vocab), steps_batch(make_req([1], seed=1), vocab, n)).next_tokens
    b = sample(logits.expand(n, vocab), steps_batch(make_req([1], seed=2), vocab, n)).next_tokens
    collision = (probs**2).sum().item()
    assert (a == b).float().mean().item() < collision + 0.03
    assert a.unique().numel() > distinct - 15


# --- distributions -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "params",
    [
        dict(temperature=0.7),
        dict(temperature=1.0, top_p=0.8),
        dict(temperature=1.0, min_p=0.1),
        dict(temperature=1.0, top_k=3),
        dict(temperature=1.5, min_p=0.05, top_k=6, top_p=0.9),
        dict(temperature=0.5, top_p=0.99),
    ],
)
def test_empirical_distribution_matches_filtered_softmax(params: dict) -> None:
    n = 20000
    want = expected_dist(LOGITS8, **params)
    args = steps_batch(make_req([1], seed=42, **params), 8, n)
    tokens = sample(LOGITS8.expand(n, 8), args).next_tokens
    got = torch.bincount(tokens, minlength=8).double() / n
    assert got[want == 0].sum() == 0, (got, want)
    assert (got - want).abs().max() < 0.015, (got, want)
    support = want > 0
    chi2 = (n * (got - want)[support] ** 2 / want[support]).sum().item()
    assert chi2 < 40, (chi2, got, want)  # 8 cells at most; ~ 1e-6 tail for chi2 with 7 dof


# --- penalties ---------------------------------------------------------------------------------


def test_penalties_change_logits_exactly_as_defined() -> None:
    vocab = 8
    logits = torch.tensor(
        [[1.0, -1.0, 2.0, -2.0, 0.5, 0.0, 3.0, -0.5]] * 3, dtype=torch.float32
    )
    reqs = [
        # prompt has 1, 2, 4; output has 2 once, 3 three times, 5 once
        make_req([1, 2, 4], [2, 3, 3, 3, 5], repetition_penalty=2.0, presence_penalty=0.5,
                 frequency_penalty=0.25),
        make_req([1, 2, 4], [2, 3, 3, 3, 5]),  # no penalties: untouched
        make_req([6, 6, 1], [7, 99], presence_penalty=-1.0),  # 99 is out of vocab: ignored
    ]
    args = args_for(reqs, vocab)
    got = apply_penalties(logits, args)
    row0 = logits[0].clone()
    for t in {1, 2, 4, 3, 5}:  # repetition over prompt + output
        row0[t] = row0[t] / 2.0 if row0[t] > 0 else row0[t] * 2.0
    for t, count in {2: 1, 3: 3, 5: 1}.items():  # presence/frequency over output only
        row0[t] -= 0.5 + 0.25 * count
    row2 = logits[2].clone()
    row2[7] += 1.0
    torch.testing.assert_close(got, torch.stack([row0, logits[1], row2]), rtol=0, atol=1e-6)
    assert got[0, 1] == -2.0 and got[0, 4] == 0.25  # prompt-only tokens: repetition, no presence
    assert got[2, 6] == 3.0  # prompt-only token of a presence-only row is not penalised
    assert apply_penalties(logits[:1], args_for(reqs[1:2], vocab)).equal(logits[:1])


def test_greedy_uses_penalised_logits() -> None:
    logits = torch.tensor([[0.0, 5.0, 4.9, 1.0]])
    req = make_req([0], [1], temperature=0.0, frequency_penalty=1.0)
    assert draw(logits, [req]).item() == 2
    assert draw(logits, [make_req([0], [1], temperature=0.0)]).item() == 1


# --- logprobs ----------------------------------------------------------------------------------


def test_logprobs_are_raw_and_top_ids_descending() -> None:
    torch.manual_seed(4)
    vocab = 64
    logits = torch.randn(4, vocab) * 3
    reqs = [
        make_req([1], [2, 2], seed=1, temperature=0.5, logprobs=True, top_logprobs=5,
                 frequency_penalty=1.5),
        make_req([1], seed=2, top_p=0.5, logprobs=True),
        make_req([1], seed=3, temperature=0.0, top_logprobs=2),
        make_req([1], seed=4),
    ]
    args = args_for(reqs, vocab)
    assert args.need_logprobs and args.max_top_logprobs == 5
    out = sample(logits, args)
    raw = logits.log_softmax(-1)
    torch.testing.assert_close(out.logprobs, raw.gather(1, out.next_tokens[:, None]).squeeze(1))
    assert out.top_ids.shape == (4, 5) and out.top_logprobs.shape == (4, 5)
    assert (out.top_logprobs[:, :-1] >= out.top_logprobs[:, 1:]).all()
    torch.testing.assert_close(out.top_logprobs, raw.gather(1, out.top_ids))
    assert torch.equal(out.top_ids[:, 0], logits.argmax(-1))
    # sampling counts its tokens into the penalty rows: a second draw needs fresh args
    again = dataclasses.replace(args_for(reqs, vocab), need_logprobs=False)
    assert torch.equal(out.next_tokens, sample(logits, again).next_tokens)


def test_no_logprobs_requested_gives_none() -> None:
    logits = torch.randn(2, 10)
    out = sample(logits, args_for([make_req([1]), make_req([2], temperature=0.0)], 10))
    assert out.logprobs is None and out.top_ids is None and out.top_logprobs is None
    only = sample(logits, args_for([make_req([1], logprobs=True), make_req([2])], 10))
    assert only.logprobs is not None and only.top_ids is None and only.top_logprobs is None


# --- argument building and device-friendliness ---------------------------------------------------


def test_from_reqs_fields() -> None:
    reqs = [
        make_req([1, 2, 3], [4, 5], seed=2**64 - 1, top_k=500),
        make_req([1], seed=7, top_k=1),
        make_req([1], [2], seed=8, top_p=0.9, temperature=0.0),  # greedy: its filters are neutral
    ]
    args = args_for(reqs, 100)
    assert args.steps.tolist() == [2, 0, 1]
    assert args.seeds.tolist() == [-1, 7, 8]
    assert args.temperatures.tolist() == [1.0, 0.0, 0.0]
    assert args.top_k is None and args.top_p is None and args.min_p is None  # 500 >= vocab
    assert args.penalties is None and not args.all_greedy
    assert not args.need_logprobs and args.max_top_logprobs == 0
    mixed = args_for([make_req([1], top_k=5), make_req([1], min_p=0.1, top_p=0.5)], 100)
    assert mixed.top_k.tolist() == [5, 100]
    assert mixed.top_p.tolist() == [1.0, 0.5] and mixed.min_p.tolist() == pytest.approx([0.0, 0.1])


def test_argmax_only_builds_no_tensors_for_a_plain_greedy_batch() -> None:
    """The scheduler's ``argmax_only`` (no grammar): a plain greedy batch sends nothing to the
    device and samples by argmax; anything the argmax path cannot do still gets every tensor."""
    logits = torch.randn(3, 32)
    greedy = [make_req([1], temperature=0.0), make_req([2], top_k=1, temperature=0.8),
              make_req([3], temperature=1e-7)]
    args = BatchSamplingArgs.from_reqs(greedy, 32, CPU, argmax_only=True)
    assert args.all_greedy and args.temperatures is None and args.seeds is None
    assert sample(logits, args).next_tokens.tolist() == logits.argmax(-1).tolist()
    assert args_for(greedy, 32).temperatures.tolist() == [0.0, 0.0, 0.0]  # the default builds them
    for extra in (dict(logprobs=True), dict(top_logprobs=2), dict(presence_penalty=0.5),
                  dict(logit_bias=((3, 1.0),)), dict(temperature=0.5)):
        req = make_req([4], **{"temperature": 0.0, **extra})
        args = BatchSamplingArgs.from_reqs(greedy[:1] + [req], 32, CPU, argmax_only=True)
        assert args.temperatures is not None and args.seeds is not None, extra
        assert sample(logits[:2], args).next_tokens.shape == (2,)


class _NoHostSync(TorchDispatchMode):
    """Fails on ops that read tensor values back to the host (a sync point on CUDA)."""

    banned = {"_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique2", "item"}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        assert func.__name__.split(".")[0] not in self.banned, func
        return func(*args, **(kwargs or {}))


def test_sampling_path_reads_nothing_back_to_the_host() -> None:
    reqs = [
        make_req([1, 2], [3], seed=1, top_k=4, top_p=0.8, min_p=0.05, repetition_penalty=1.2,
                 presence_penalty=0.3, frequency_penalty=0.2),
        make_req([1], seed=2, temperature=0.0),
        make_req([4], seed=3, temperature=0.7),
    ]
    logits = torch.randn(3, 32)
    args = args_for(reqs, 32)
    with _NoHostSync():
        out = sample(logits, args)
    assert out.next_tokens.shape == (3,)


def test_penalty_rows_are_built_once_and_then_counted_on_the_device() -> None:
    """A request's counts row is built from its tokens when it enters the row; later steps only add
    the sampled token on the device (no host work that grows with the output)."""
    from minisgl.sampling import PROMPT_BIT, SamplingState

    vocab = 16
    state = SamplingState(4, vocab, CPU)
    req = make_req([1, 2, 2], [3, 3, 5], seed=1, temperature=0.0, repetition_penalty=1.5,
                   frequency_penalty=0.5)
    req.table_idx = 2
    args = BatchSamplingArgs.from_reqs([req], vocab, CPU, state)
    row = state.counts[2]
    assert row[1] == PROMPT_BIT and row[2] == PROMPT_BIT and row[3] == 2 and row[5] == 1
    assert int(row.count_nonzero()) == 4
    logits = torch.zeros(1, vocab)
    logits[0, 7] = 1.0
    assert sample(logits, args).next_tokens.tolist() == [7]
    assert state.counts[2, 7] == 1  # counted in place by the sampler
    req.input_ids.append(7)
    req.input_ids[req.prompt_len] = 9  # the host list is not read again while the row is owned
    BatchSamplingArgs.from_reqs([req], vocab, CPU, state)
    assert state.counts[2, 9] == 0 and state.counts[2, 3] == 2
    state.release(2)  # e.g. retracted: the next admission rebuilds from the tokens
    BatchSamplingArgs.from_reqs([req], vocab, CPU, state)
    assert state.counts[2, 9] == 1 and state.counts[2, 3] == 1 and state.counts[2, 7] == 1
