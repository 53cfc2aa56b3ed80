"""The KV block pool: conservation, LRU eviction tail first, chained prefix hits."""
from __future__ import annotations

from tuner.sim.kvcache import BlockPool

A = ("shared", 1, 4)
B = ("shared", 2, 4)
C = ("shared", 3, 4)


def test_null_block_is_held_back_and_usage_is_vllms() -> None:
    pool = BlockPool(11, enable_caching=True)
    assert pool.free == 10
    pool.allocate(4)
    assert pool.usage() == 1 - 6 / 10
    pool.release_plain(4)
    assert pool.usage() == 0.0


def test_hits_are_chained_prefixes_and_capped() -> None:
    pool = BlockPool(101, enable_caching=True)
    pool.allocate(12)                         # a request computes A, B, C in 12 private blocks
    pool.publish([(A, 4), (B, 4), (C, 4)])
    assert pool.free == 88 and pool.shared_referenced == 12
    # another request shares A and C but not B: only A hits (chain breaks at B)
    other = ("shared", 99, 4)
    plan = pool.lookup([(A, 4), (other, 4), (C, 4)], None, -1, max_blocks=100)
    assert plan.shared_blocks == 4 and plan.touched_free == 0
    # a request whose whole 48-token prompt is cached keeps its last token to compute: all
    # three units are referenced, 11 of their 12 blocks count as hit
    plan = pool.lookup([(A, 4), (B, 4), (C, 4)], None, -1, max_blocks=(48 - 1) // 4)
    assert plan.cached_blocks == 12 and plan.hit_blocks == 11


def test_unreferenced_units_stay_cached_until_evicted_tail_first() -> None:
    pool = BlockPool(13, enable_caching=True)     # 12 usable blocks
    pool.allocate(8)
    pool.publish([(A, 4), (B, 4)])
    pool.release([(A, 4), (B, 4)], None, 0, 0)    # the request ends; units become free but cached
    assert pool.free == 12 and pool.cached_free == 8
    hit = pool.lookup([(A, 4), (B, 4)], None, -1, 100)
    assert hit.shared_blocks == 8 and hit.touched_free == 8
    pool.allocate(4 + 2)                          # 4 plain blocks, then 2 of B (the tail) go
    assert pool.lookup([(A, 4), (B, 4)], None, -1, 100).shared_blocks == 4
    pool.allocate(2)
    assert pool.lookup([(A, 4), (B, 4)], None, -1, 100).shared_blocks == 4   # A survives B
    pool.allocate(1)
    assert pool.lookup([(A, 4), (B, 4)], None, -1, 100).shared_blocks == 0
    assert pool.free == 3


def test_shared_unit_is_freed_only_by_its_last_reference() -> None:
    pool = BlockPool(21, enable_caching=True)
    pool.allocate(4)
    pool.publish([(A, 4)])                        # request 1 caches A
    plan = pool.lookup([(A, 4)], None, -1, 100)
    pool.acquire(plan, None)                      # request 2 hits it
    pool.release([(A, 4)], None, 0, 0)
    assert pool.free == 16                        # still referenced by request 2
    pool.release([(A, 4)], None, 0, 0)
    assert pool.free == 20 and pool.cached_free == 4


def test_duplicate_publish_returns_the_copy() -> None:
    pool = BlockPool(21, enable_caching=True)
    pool.allocate(8)                              # two requests computed A concurrently
    pool.publish([(A, 4)])
    _, moved, dup = pool.publish([(A, 4)])
    assert (moved, dup) == (0, 4)
    assert pool.free == 16 and pool.shared_referenced == 4


def test_preempted_request_hits_its_own_blocks() -> None:
    pool = BlockPool(21, enable_caching=True)
    pool.allocate(7)
    pool.release([], ("own", 5), 6, 1)            # 6 full blocks computed, 1 partial
    plan = pool.lookup([], ("own", 5), 0, max_blocks=100)
    assert plan.own_blocks == 6
    assert pool.lookup([], ("own", 5), 2, max_blocks=100).own_blocks == 0   # starts elsewhere


def test_without_caching_nothing_hits() -> None:
    pool = BlockPool(21, enable_caching=False)
    assert pool.lookup([(A, 4)], None, -1, 100).hit_blocks == 0
