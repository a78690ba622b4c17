"""The KV pool and the prefix caches: unit behaviour and a randomized scheduler-like stress test."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
import torch

from minisgl.kvcache import (
    CacheSpec,
    MHAKVCache,
    NaivePrefixCache,
    RadixPrefixCache,
    create_kvcache_pool,
    create_prefix_cache,
)
from minisgl.kvcache.spec import AttentionSpec

PAGE_SIZES = pytest.mark.parametrize("p", [1, 4])


def slots(first_page: int, n: int, p: int) -> torch.Tensor:
    """``n`` slots on consecutive pages starting at ``first_page``."""
    return torch.arange(first_page * p, first_page * p + n, dtype=torch.int32)


def toks(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def sorted_list(t: torch.Tensor) -> list[int]:
    return sorted(t.tolist())


@PAGE_SIZES
@pytest.mark.parametrize("loc_dtype", [torch.int32, torch.int64])
def test_store_kv_roundtrip(p: int, loc_dtype: torch.dtype) -> None:
    spec = CacheSpec(tuple(AttentionSpec(i, 2, 2, 8, 0.5) for i in range(3)))
    pool = create_kvcache_pool(spec, 5, p, torch.float32, "cpu")
    assert isinstance(pool, MHAKVCache) and pool.num_slots == 5 * p
    gen = torch.Generator().manual_seed(0)
    loc = torch.randperm(pool.num_slots, generator=gen)[: 2 * p + 1].to(loc_dtype)
    k, v = torch.randn(2, len(loc), 2, 8, generator=gen)
    pool.store_kv(k, v, loc, layer_id=1)
    assert torch.equal(pool.k_cache(1)[loc.long()], k)
    assert torch.equal(pool.v_cache(1)[loc.long()], v)
    assert not pool.k_cache(0).any() and not pool.v_cache(2).any()
    assert pool.k_cache(1).shape == (pool.num_slots, 2, 8)
    with pytest.raises(IndexError):
        pool.store_kv(k, v, loc, layer_id=3)


POOL_ARGS = ["num_layers", "num_kv_heads", "head_dim", "num_pages", "page_size"]


@pytest.mark.parametrize("arg", POOL_ARGS)
@pytest.mark.parametrize("bad", [0, -1, True, 2.0])
def test_pool_rejects_bad_args(arg: str, bad: object) -> None:
    kwargs = dict(num_layers=1, num_kv_heads=1, head_dim=4, num_pages=2, page_size=1)
    kwargs[arg] = bad
    with pytest.raises(ValueError, match=arg):
        MHAKVCache(**kwargs, dtype=torch.float16, device="cpu")


@PAGE_SIZES
def test_radix_match_insert_split(p: int) -> None:
    cache = RadixPrefixCache(p)
    a = toks(100, 3 * p)
    assert len(cache.insert_prefix(a, slots(0, 3 * p, p))) == 0
    hit = cache.match_prefix(a)
    assert hit.handle.cached_len == 3 * p and torch.equal(hit.indices, slots(0, 3 * p, p))
    b = a[:p] + toks(500, 2 * p)
    hit = cache.match_prefix(b)
    assert hit.handle.cached_len == p and torch.equal(hit.indices, slots(0, p, p))
    cache.check_integrity()
    b_slots = torch.cat([hit.indices, slots(10, 2 * p, p)])
    assert len(cache.insert_prefix(b, b_slots)) == 0
    cache.check_integrity()
    (shared,) = cache.root.children.values()
    assert len(shared) == p and sorted(len(c) for c in shared.children.values()) == [2 * p] * 2
    assert torch.equal(cache.match_prefix(a).indices, slots(0, 3 * p, p))
    assert torch.equal(cache.match_prefix(b).indices, b_slots)
    assert cache.match_prefix(toks(900, 2 * p)).handle.cached_len == 0
    assert cache.match_prefix(a[:p] + [1]).handle.cached_len == p
    assert cache.evictable_size == 5 * p and cache.protected_size == 0
    cache.check_integrity()


@PAGE_SIZES
def test_insert_returns_exactly_the_duplicates(p: int) -> None:
    cache = RadixPrefixCache(p)
    a = toks(0, 3 * p)
    cache.insert_prefix(a, slots(0, 3 * p, p))
    again = slots(10, 3 * p, p)
    assert torch.equal(cache.insert_prefix(a, again), again)
    mixed = torch.cat([slots(0, p, p), slots(20, 2 * p, p)])
    assert torch.equal(cache.insert_prefix(a, mixed), slots(20, 2 * p, p))
    longer = a[: 2 * p] + toks(70, p) + [7] * (p // 2)
    offered = torch.cat([slots(30, 2 * p, p), slots(40, p, p), slots(41, p // 2, p)])
    assert torch.equal(cache.insert_prefix(longer, offered), slots(30, 2 * p, p))
    assert cache.evictable_size == 4 * p
    cache.check_integrity()


@PAGE_SIZES
def test_matches_are_page_aligned(p: int) -> None:
    cache = RadixPrefixCache(p)
    assert len(cache.insert_prefix(toks(0, 7), slots(0, 7, p))) == 0
    assert cache.evictable_size == 7 // p * p
    cache.insert_prefix(toks(0, 8), slots(0, 8, p))
    hit = cache.match_prefix(toks(0, 7))
    assert hit.handle.cached_len == 7 // p * p == len(hit.indices)
    assert hit.indices.dtype == torch.int32
    assert cache.match_prefix(torch.tensor(toks(0, 8))).handle.cached_len == 8
    cache.check_integrity()


@PAGE_SIZES
def test_long_keys_diverging_mid_node(p: int) -> None:
    cache = RadixPrefixCache(p)
    long = toks(0, 200)
    cache.insert_prefix(long, slots(0, 200, p))
    other = long[:150] + toks(1000, 50)
    hit = cache.match_prefix(other)
    assert hit.handle.cached_len == 150 // p * p
    assert torch.equal(hit.indices, slots(0, 150 // p * p, p))
    cache.check_integrity()


@PAGE_SIZES
def test_lock_blocks_eviction_until_unlocked(p: int) -> None:
    cache = RadixPrefixCache(p)
    a, b = toks(0, 2 * p), toks(0, p) + toks(50, p)
    cache.insert_prefix(a, slots(0, 2 * p, p))
    cache.insert_prefix(b, torch.cat([slots(0, p, p), slots(5, p, p)]))
    hit = cache.match_prefix(b)
    cache.lock_handle(hit.handle)
    assert cache.protected_size == 2 * p and cache.evictable_size == p
    cache.check_integrity()
    with pytest.raises(RuntimeError):
        cache.evict(p + 1)
    assert torch.equal(cache.evict(1), slots(1, p, p))
    assert cache.evictable_size == 0
    with pytest.raises(RuntimeError):
        cache.evict(1)
    cache.lock_handle(hit.handle, unlock=True)
    assert cache.protected_size == 0 and cache.evictable_size == 2 * p
    assert sorted_list(cache.evict(2 * p)) == sorted_list(hit.indices)
    assert cache.evictable_size == 0 and not cache.root.children
    cache.check_integrity()


@PAGE_SIZES
def test_lock_survives_split_and_misuse_raises(p: int) -> None:
    cache = RadixPrefixCache(p)
    cache.insert_prefix(toks(0, 3 * p), slots(0, 3 * p, p))
    hit = cache.match_prefix(toks(0, 3 * p))
    with pytest.raises(RuntimeError, match="unlocked"):
        cache.lock_handle(hit.handle, unlock=True)
    cache.lock_handle(hit.handle)
    cache.match_prefix(toks(0, p))
    cache.check_integrity()
    assert len(cache.root.children) == 1 and cache.protected_size == 3 * p
    cache.lock_handle(hit.handle, unlock=True)
    assert cache.protected_size == 0 and cache.evictable_size == 3 * p
    cache.check_integrity()
    cache.evict(3 * p)
    with pytest.raises(RuntimeError, match="stale"):
        cache.lock_handle(hit.handle)


@PAGE_SIZES
def test_lru_evicts_least_recently_matched_leaf(p: int) -> None:
    cache = RadixPrefixCache(p)
    seqs = {name: toks(100 * i, p) for i, name in enumerate("abc", start=1)}
    for i, seq in enumerate(seqs.values()):
        cache.insert_prefix(seq, slots(i, p, p))
    for name in "bac":
        cache.match_prefix(seqs[name])
    assert torch.equal(cache.evict(1), slots(1, p, p))
    assert cache.match_prefix(seqs["b"]).handle.cached_len == 0
    assert torch.equal(cache.evict(1), slots(0, p, p))
    assert cache.match_prefix(seqs["c"]).handle.cached_len == p
    cache.check_integrity()


@PAGE_SIZES
def test_evicting_a_leaf_exposes_its_parent(p: int) -> None:
    cache = RadixPrefixCache(p)
    cache.insert_prefix(toks(0, p), slots(0, p, p))
    cache.insert_prefix(toks(0, 2 * p), slots(0, 2 * p, p))
    cache.insert_prefix(toks(500, p), slots(2, p, p))
    cache.match_prefix(toks(500, p))
    assert sorted_list(cache.evict(2 * p)) == sorted_list(slots(0, 2 * p, p))
    cache.check_integrity()


def test_naive_cache_keeps_nothing() -> None:
    cache = NaivePrefixCache(4)
    hit = cache.match_prefix(toks(0, 9))
    assert hit.handle.cached_len == 0 and len(hit.indices) == 0
    cache.lock_handle(hit.handle)
    cache.lock_handle(hit.handle, unlock=True)
    offered = torch.arange(9, dtype=torch.int64)
    returned = cache.insert_prefix(toks(0, 9), offered)
    assert returned.dtype == torch.int32 and returned.tolist() == list(range(8))
    assert len(cache.evict(0)) == 0
    with pytest.raises(RuntimeError):
        cache.evict(1)
    assert cache.evictable_size == cache.protected_size == 0
    cache.reset()
    cache.check_integrity()


def test_factory() -> None:
    assert isinstance(create_prefix_cache("radix", 4, "cpu"), RadixPrefixCache)
    assert isinstance(create_prefix_cache("naive", 1, torch.device("cpu")), NaivePrefixCache)
    with pytest.raises(ValueError, match="naive, radix"):
        create_prefix_cache("lru", 4, "cpu")
    with pytest.raises(ValueError, match="page_size"):
        create_prefix_cache("radix", 0, "cpu")


@dataclass
class _Req:
    ids: list[int]
    handle: object
    matched: torch.Tensor
    pages: list[int]


class _Sim:
    """A miniature scheduler: a page free list, live requests and a fake KV content per slot."""

    def __init__(self, p: int, num_pages: int, seed: int) -> None:
        self.p, self.num_pages, self.rng = p, num_pages, random.Random(seed)
        self.cache = RadixPrefixCache(p)
        self.free = list(range(num_pages))
        self.reqs: list[_Req] = []
        self.content: dict[int, int] = {}
        self.prompts = [self.tokens(3, self.rng.randrange(12)) for _ in range(4)]

    def tokens(self, vocab: int, n: int) -> list[int]:
        return [self.rng.randrange(vocab) for _ in range(n)]

    def own_slots(self, req: _Req) -> torch.Tensor:
        return torch.cat([slots(pg, self.p, self.p) for pg in req.pages] or [slots(0, 0, 1)])

    def all_slots(self, req: _Req) -> torch.Tensor:
        return torch.cat([req.matched, self.own_slots(req)])[: len(req.ids)]

    def release(self, freed: torch.Tensor) -> None:
        pages = freed.view(-1, self.p)
        assert torch.equal(pages, pages[:, :1] + torch.arange(self.p, dtype=torch.int32))
        self.free.extend((pages[:, 0] // self.p).tolist())

    def alloc(self, n: int) -> list[int] | None:
        short = (n - len(self.free)) * self.p
        if short > 0:
            if short > self.cache.evictable_size:
                return None
            self.release(self.cache.evict(short))
        taken, self.free = self.free[:n], self.free[n:]
        return taken

    def compute(self, req: _Req, start: int) -> None:
        for i, slot in enumerate(self.all_slots(req)[start:].tolist(), start):
            self.content[slot] = hash(tuple(req.ids[: i + 1]))

    def match(self, ids: list[int]):
        hit = self.cache.match_prefix(ids)
        assert hit.handle.cached_len == len(hit.indices) and hit.handle.cached_len % self.p == 0
        for i, slot in enumerate(hit.indices.tolist()):
            assert self.content[slot] == hash(tuple(ids[: i + 1])), "prefix maps to foreign KV"
        return hit

    def admit(self) -> None:
        ids = self.rng.choice(self.prompts) + self.tokens(4, self.rng.randrange(1, 10))
        hit = self.match(ids)
        self.cache.lock_handle(hit.handle)
        pages = self.alloc(-(-(len(ids) - len(hit.indices)) // self.p))
        if pages is None:
            self.cache.lock_handle(hit.handle, unlock=True)
            return
        req = _Req(ids, hit.handle, hit.indices, pages)
        self.compute(req, len(req.matched))
        self.reqs.append(req)

    def decode(self, req: _Req) -> None:
        if len(req.ids) == len(req.matched) + len(req.pages) * self.p:
            more = self.alloc(1)
            if more is None:
                return
            req.pages += more
        req.ids.append(self.rng.randrange(4))
        self.compute(req, len(req.ids) - 1)

    def give_to_cache(self, req: _Req) -> int:
        """Insert the request's tokens, free the duplicates, keep the pages past the aligned end."""
        aligned = len(req.ids) // self.p * self.p
        self.release(self.cache.insert_prefix(req.ids, self.all_slots(req)))
        req.pages = req.pages[(aligned - len(req.matched)) // self.p :]
        return aligned

    def checkpoint(self, req: _Req) -> None:
        aligned = self.give_to_cache(req)
        hit = self.match(req.ids)
        assert hit.handle.cached_len == aligned
        self.cache.lock_handle(hit.handle)
        self.cache.lock_handle(req.handle, unlock=True)
        req.handle, req.matched = hit.handle, hit.indices

    def finish(self, req: _Req) -> None:
        self.give_to_cache(req)
        self.release(self.own_slots(req))
        self.cache.lock_handle(req.handle, unlock=True)
        self.reqs.remove(req)

    def evict(self) -> None:
        n = self.rng.randrange(self.cache.evictable_size + self.p + 1)
        if n > self.cache.evictable_size:
            with pytest.raises(RuntimeError):
                self.cache.evict(n)
        else:
            freed = self.cache.evict(n)
            assert len(freed) >= n
            self.release(freed)

    def step(self) -> None:
        ops = [self.decode, self.checkpoint, self.finish, self.admit, self.evict, self.probe]
        op = self.rng.choices(ops, [4, 2, 3, 4, 1, 2])[0]
        if op in ops[:3]:
            if self.reqs:
                op(self.rng.choice(self.reqs))
        else:
            op()

    def probe(self) -> None:
        self.match(self.rng.choice(self.prompts) + self.tokens(4, 5))

    def check(self) -> None:
        self.cache.check_integrity()
        tree = [s for n in self.cache._nodes() for s in n.value.tolist()]
        held = [s for r in self.reqs for s in self.own_slots(r).tolist()]
        free = [s for pg in self.free for s in slots(pg, self.p, self.p).tolist()]
        everything = tree + held + free
        assert len(everything) == len(set(everything)) == self.num_pages * self.p
        assert len(tree) == self.cache.evictable_size + self.cache.protected_size
        for req in self.reqs:
            node, path = req.handle.node, [slots(0, 0, 1)]
            while node is not self.cache.root:
                assert node.ref_count > 0
                path, node = [node.value, *path], node.parent
            assert torch.equal(torch.cat(path), req.matched), "a locked prefix changed"


@PAGE_SIZES
@pytest.mark.parametrize("seed", [0, 1])
def test_randomized_stress(p: int, seed: int) -> None:
    sim = _Sim(p, num_pages=48 // p + 4, seed=seed)
    for _ in range(1500):
        sim.step()
        sim.check()
    while sim.reqs:
        sim.finish(sim.reqs[0])
        sim.check()
    assert sim.cache.protected_size == 0
    sim.release(sim.cache.evict(sim.cache.evictable_size))
    sim.check()
    assert len(sim.free) == sim.num_pages and not sim.cache.root.children
