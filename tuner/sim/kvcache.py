"""The KV block pool of one replica, with vLLM V1's prefix cache.

vLLM (``v1/core/block_pool.py``, ``kv_cache_utils.py``) keeps every free block in one
LRU queue; a freed block that holds a full, hashed block of tokens stays cached until it
is popped for reuse (evicted). A request frees its blocks tail first, so the tail of a
prompt is evicted before its head. Hashes are chained (hash of the parent block's hash
and this block's tokens), so a hit is always a prefix.

Simulating every block would cost a Python operation per block; instead the pool holds
*units*: runs of blocks that live and die together.

* a **shared unit** ``(chain_hash, n)`` — the ``n`` full engine blocks whose content is
  fixed by the workload's ``hash_ids`` up to one id (``block_tokens`` tokens), mapped onto
  the engine's ``block_size``; referenced by every running request that shares it;
* an **own unit** — the full blocks of one preempted request beyond its shared units, which
  only that request can hit again when it resumes;
* **plain** blocks — uncached (partial blocks, finished requests' private content).

A unit in the free queue can be evicted partly (from its tail: its count shrinks); a
partly evicted shared unit no longer hits. One block of ``num_gpu_blocks`` is vLLM's null
block and is never handed out.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field


@dataclass(slots=True)
class PrefixPlan:
    """What a request finds in the cache at admission."""

    units: list[tuple[object, int]] = field(default_factory=list)   # referenced shared units
    shared_blocks: int = 0      # blocks in those units
    own_blocks: int = 0         # blocks of its own unit hit (after a preemption)
    touched_free: int = 0       # hit blocks now in the free queue (they stop being free)
    cap: int = 0                # at most this many blocks count as computed (num_tokens - 1)

    @property
    def cached_blocks(self) -> int:
        """Blocks the request gets from the cache (its block table starts with them)."""
        return self.shared_blocks + self.own_blocks

    @property
    def hit_blocks(self) -> int:
        """Blocks whose tokens need no recompute: the cached ones, capped so that the last
        prompt token is always computed (vLLM's ``max_cache_hit_length = num_tokens - 1``)."""
        return min(self.shared_blocks + self.own_blocks, self.cap)


class BlockPool:
    """Counts of free and used blocks, the LRU free queue of units, and the prefix cache."""

    def __init__(self, num_gpu_blocks: int, enable_caching: bool) -> None:
        self.num_gpu_blocks = int(num_gpu_blocks)
        self.capacity = self.num_gpu_blocks - 1           # the null block is held back
        self.caching = bool(enable_caching)
        self.free = self.capacity                         # blocks in the free queue
        self._plain_seq = 0
        # free queue, head = next to evict: key -> block count
        self._lru: OrderedDict[object, int] = OrderedDict()
        if self.capacity > 0:
            self._lru[self._plain_key()] = self.capacity
        self._ref: dict[object, int] = {}                 # referenced shared unit -> refcount
        self._ref_blocks = 0                              # blocks in referenced shared units

    # -- bookkeeping ----------------------------------------------------------------------
    def _plain_key(self) -> tuple[str, int]:
        self._plain_seq += 1
        return ("plain", self._plain_seq)

    @property
    def cached_free(self) -> int:
        """Free blocks that still hold a cached unit (hittable or own)."""
        return sum(c for k, c in self._lru.items() if k[0] != "plain")

    def usage(self) -> float:
        """vLLM's ``get_usage``: 1 - free / (num_gpu_blocks - 1)."""
        return 1.0 - self.free / self.capacity if self.capacity > 0 else 1.0

    # -- allocation -----------------------------------------------------------------------
    def allocate(self, n: int) -> None:
        """Take ``n`` blocks from the head of the free queue (evicting cached units)."""
        if n <= 0:
            return
        if n > self.free:
            raise RuntimeError(f"allocate {n} blocks with {self.free} free")  # scheduler bug
        self.free -= n
        lru = self._lru
        while n:
            key = next(iter(lru))
            c = lru[key]
            if c > n:
                lru[key] = c - n                # its tail is evicted; a shared unit stops hitting
                return
            del lru[key]
            n -= c

    def release_plain(self, n: int) -> None:
        """Return ``n`` uncached blocks to the tail of the free queue."""
        if n <= 0:
            return
        self.free += n
        lru = self._lru
        if lru:
            last = next(reversed(lru))
            if last[0] == "plain":
                lru[last] += n
                return
        lru[self._plain_key()] = n

    # -- prefix cache ---------------------------------------------------------------------
    def lookup(self, units: list[tuple[object, int]], own_key: object, own_start: int,
               max_blocks: int) -> PrefixPlan:
        """Longest cached prefix of a request: whole shared units in chain order, then its
        own unit if it starts right after them. At most ``max_blocks`` blocks count as hit;
        a unit the cap cuts is still referenced (its capped tail is recomputed in place)."""
        plan = PrefixPlan(cap=max_blocks)
        if not self.caching:
            return plan
        lru, ref = self._lru, self._ref
        for key, n in units:
            if plan.shared_blocks >= max_blocks:
                break
            if key not in ref:
                if lru.get(key, 0) != n:
                    break
                plan.touched_free += n
            plan.units.append((key, n))
            plan.shared_blocks += n
        if own_key is not None and own_start == plan.shared_blocks < max_blocks:
            c = min(lru.get(own_key, 0), max_blocks - plan.shared_blocks)
            if c > 0:
                plan.own_blocks = c
                plan.touched_free += c
        return plan

    def acquire(self, plan: PrefixPlan, own_key: object) -> None:
        """Reference what :meth:`lookup` found (free hits leave the free queue)."""
        lru, ref = self._lru, self._ref
        for key, n in plan.units:
            if key in ref:
                ref[key] += 1
            else:
                del lru[key]
                self.free -= n
                ref[key] = 1
                self._ref_blocks += n
        if plan.own_blocks:
            c = lru.pop(own_key)
            self.free -= plan.own_blocks
            self._push_head_plain(c - plan.own_blocks)   # beyond the capped hit: uncached

    def _push_head_plain(self, n: int) -> None:
        """Turn ``n`` blocks already counted free into uncached ones at the queue head."""
        if n > 0:
            key = self._plain_key()
            self._lru[key] = n
            self._lru.move_to_end(key, last=False)

    def forget(self, key: object) -> None:
        """Drop a cached unit that can no longer hit (its blocks stay free, uncached)."""
        c = self._lru.pop(key, 0)
        self._push_head_plain(c)

    def publish(self, units: list[tuple[object, int]]) -> tuple[list[tuple[object, int]], int, int]:
        """A request finished computing the blocks of ``units`` (chain order, not yet
        referenced by it) in its private blocks. Cache them: returns the units it now
        references, how many private blocks moved into new units, and how many private
        blocks were duplicates of cached ones (released)."""
        lru, ref = self._lru, self._ref
        moved = dup = 0
        for key, n in units:
            if key in ref:
                ref[key] += 1
                dup += n
            else:
                c = lru.pop(key, 0)
                if c == n:                      # cached and free: take it, drop our copy
                    self.free -= n
                    dup += n
                else:                           # absent, or partly evicted: ours replaces it
                    self._push_head_plain(c)    # its remnant stays free, uncached
                    moved += n
                ref[key] = 1
                self._ref_blocks += n
        if dup:
            self.release_plain(dup)
        return units, moved, dup

    def release(self, units: list[tuple[object, int]], own_key: object, own_blocks: int,
                plain_blocks: int) -> None:
        """Free a request's blocks, tail first: plain blocks, its own unit (kept cached when
        ``own_key`` is given), then its shared units from last to first."""
        self.release_plain(plain_blocks)
        if own_blocks > 0:
            if own_key is not None and self.caching:
                self.forget(own_key)
                self.free += own_blocks
                self._lru[own_key] = own_blocks
            else:
                self.release_plain(own_blocks)
        ref, lru = self._ref, self._lru
        for key, n in reversed(units):
            r = ref[key] - 1
            if r:
                ref[key] = r
            else:
                del ref[key]
                self._ref_blocks -= n
                lru[key] = n
                self.free += n

    @property
    def shared_referenced(self) -> int:
        return self._ref_blocks
