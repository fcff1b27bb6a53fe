"""Eviction in the engine: victim choice (dtr, dte, window), the callback, proactive eviction.

The registry (Python) marks blocks evictable and evicts what the engine asks for; here a
small fake registry plays that part: each handle names one allocated pointer, and
"evicting" frees it, re-entering the engine from inside the callback, as
``untyped_storage().resize_(0)`` does in training.
"""
from __future__ import annotations

import threading

import pytest

import pyalloc
from conftest import run_program
from memory_patterns import segment_of
from pyalloc import Engine, OutOfMemoryError, PyallocError

KiB = 1 << 10
MiB = 1 << 20


class FakeRegistry:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.ptrs = {}          # handle -> ptr
        self.calls = []         # the handle lists the engine asked for
        self.lock = threading.Lock()
        self.refuse = False
        engine.set_evict_callback(self.evict)

    def add(self, size: int, cost: float, handle: int, last_resort: bool = False) -> int:
        ptr = self.engine.alloc(size)
        self.engine.set_evictable(ptr, handle, cost, last_resort=last_resort)
        with self.lock:
            self.ptrs[handle] = ptr
        return ptr

    def close(self, *live):
        """Frees ``live`` and what was not evicted, checks the engine's invariants, closes it."""
        for p in [*live, *self.ptrs.values()]:
            self.engine.free(p)
        self.engine.check_invariants()
        self.engine.close()

    def evict(self, handles):
        self.calls.append(list(handles))
        if self.refuse:
            return 0
        done = 0
        for h in handles:
            with self.lock:
                ptr = self.ptrs.pop(h, None)
            if ptr is not None:
                self.engine.free(ptr)  # re-enters the engine, as resize_(0) does
                done += 1
        return done


def crafted(strategy: str):
    """Segment A: four contiguous 5 MiB evictable blocks, costly and recently used.
    Segment B: cheap, stale 2.5 MiB evictable blocks interleaved with pinned ones.
    The 40 MiB budget allows no third segment; the request is 10 MiB."""
    e = Engine("host", budget="40MiB", evict_strategy=strategy)
    reg = FakeRegistry(e)
    pinned = []
    b_evictable = [reg.add(5 * MiB // 2, cost=1.0, handle=100 + i) for i in range(1)]
    pinned.append(e.alloc(5 * MiB // 2))
    for i in range(1, 4):
        b_evictable.append(reg.add(5 * MiB // 2, cost=1.0, handle=100 + i))
        pinned.append(e.alloc(5 * MiB // 2))
    a_blocks = [reg.add(5 * MiB, cost=10.0, handle=1 + i) for i in range(4)]
    for p in a_blocks:
        e.touch(p)  # recently used: DTR's staleness term makes them look expensive
    snap = e.snapshot()
    assert len(snap["segments"]) == 2 and e.stats()["reserved_bytes.all.current"] == 40 * MiB
    return e, reg, pinned


@pytest.mark.parametrize("strategy", ["dtr", "dte", "window"])
def test_crafted_layout_window_frees_contiguous_space(strategy):
    e, reg, pinned = crafted(strategy)
    ptr = e.alloc(10 * MiB)
    s = e.stats()
    rounds, evicted = s["num_evict_rounds"], s["num_evicted_bytes"]
    if strategy == "window":
        # One round: the two cheapest adjacent blocks of segment A, nothing else.
        assert reg.calls == [[1, 2]]
        assert (rounds, evicted) == (1, 10 * MiB)
    else:
        # DTR/DTE first free the cheap, stale 2.5 MiB blocks of segment B: their bytes
        # cover the request, but they are scattered between pinned blocks, so the
        # request still fails and another round must evict segment A's blocks anyway.
        assert sorted(reg.calls[0]) == [100, 101, 102, 103]
        assert rounds >= 2 and evicted >= 20 * MiB
    e.free(ptr)
    for p in pinned:
        e.free(p)
    reg.close()


def test_window_beats_dtr_in_bytes_and_cost():
    results = {}
    for strategy in ("dtr", "window"):
        e, reg, pinned = crafted(strategy)
        e.free(e.alloc(10 * MiB))
        results[strategy] = e.stats()["num_evicted_bytes"]
        for p in pinned + list(reg.ptrs.values()):
            e.free(p)
        e.close()
    assert results["window"] * 2 <= results["dtr"], results


def test_refusing_callback_gives_an_oom_that_names_evictable_bytes():
    e, reg, pinned = crafted("window")
    reg.refuse = True
    with pytest.raises(OutOfMemoryError) as info:
        e.alloc(10 * MiB)
    msg = str(info.value)
    assert "evictable" in msg and "(strategy window)" in msg, msg
    assert e.stats()["num_ooms"] == 1
    e.check_invariants()
    for p in pinned + list(reg.ptrs.values()):
        e.free(p)
    e.close()


@pytest.mark.parametrize("strategy", ["dtr", "dte", "window"])
def test_a_victim_of_last_resort_goes_only_when_nothing_else_serves(strategy):
    # Note [Last-resort victims] (allocator/src/block.h): the cheapest and stalest block is
    # offered only as a last resort, so a costlier ordinary one goes first; once none is
    # left, the rung evict_last_resort takes it rather than fail. The out-of-memory report
    # counts it with what was evictable.
    e = Engine("host", budget="8MiB", evict_strategy=strategy)
    reg = FakeRegistry(e)
    reg.add(2 * MiB, cost=0.1, handle=1, last_resort=True)
    kept = [e.alloc(2 * MiB)]
    ordinary = reg.add(2 * MiB, cost=10.0, handle=2)
    kept.append(e.alloc(2 * MiB))
    e.touch(ordinary)
    kept.append(e.alloc(2 * MiB))
    assert reg.calls == [[2]] and e.stats()["rung.evict_last_resort"] == 0
    kept.append(e.alloc(2 * MiB))
    assert reg.calls[-1] == [1] and e.stats()["rung.evict_last_resort"] == 1
    reg.close(*kept)


def test_an_out_of_memory_report_counts_victims_of_last_resort():
    # The window strategy evicts nothing that would not serve the request, so the victim of
    # last resort stays, and the report names it among what was evictable.
    e = Engine("host", budget="8MiB", evict_strategy="window")
    reg = FakeRegistry(e)
    kept = [e.alloc(2 * MiB) for _ in range(3)]
    reg.add(2 * MiB, cost=0.1, handle=1, last_resort=True)
    with pytest.raises(OutOfMemoryError, match="evictable 2.00 MiB in 1 blocks"):
        e.alloc(4 * MiB)
    assert not reg.calls and 1 in reg.ptrs
    reg.close(*kept)


def small_segment_with_a_window(strategy: str, refuse: bool = False):
    """A 4 MiB budget spent on one small segment and one large: the small one holds a block
    that cannot leave, three evictable 512 KiB blocks, another that cannot leave and a
    128 KiB hole; the large one a 2 MiB block that cannot leave."""
    e = Engine("host", budget="4MiB", evict_strategy=strategy)
    reg = FakeRegistry(e)
    reg.refuse = refuse
    head = e.alloc(128 * KiB)
    window = [reg.add(512 * KiB, cost=1.0 + i, handle=i + 1) for i in range(3)]
    tail = e.alloc(256 * KiB)
    large = e.alloc(2 * MiB)
    assert {segment_of(e, p)["address"] for p in (head, *window, tail)} == {segment_of(e, head)["address"]}
    assert segment_of(e, head)["segment_type"] == "small" and segment_of(e, large)["segment_type"] == "large"
    assert e.stats()["reserved_bytes.all.current"] == 4 * MiB
    return e, reg, [head, tail, large], window


@pytest.mark.parametrize("strategy", ["dtr", "dte", "window"])
def test_a_large_request_evicts_a_window_of_a_small_segment_when_nothing_else_serves(strategy):
    # Note [Evicting to lend] (allocator/src/reclaim.cpp): no segment can be emptied, no
    # chunk cleared, the large pool holds nothing evictable and no small-segment hole holds
    # 1.25 MiB, but three evictable 512 KiB blocks lie together in the small segment. The
    # request evicts them and takes their place rather than fail; the window strategy,
    # whose plans keep to the request's pool, needs the rung for it (dtr and dte choose
    # victims anywhere, and the lend rung then finds the hole).
    e, reg, kept, window = small_segment_with_a_window(strategy)
    lent = e.alloc(1280 * KiB)
    stats = e.stats()
    assert stats["num_ooms"] == 0 and stats["rung.lend"] == 1
    assert segment_of(e, lent)["segment_type"] == "small" and lent == window[0]
    assert stats["rung.evict_to_lend"] == (1 if strategy == "window" else 0)
    assert sorted(h for call in reg.calls for h in call) == [1, 2, 3]
    e.check_invariants()
    reg.close(lent, *kept)


def test_evicting_to_lend_ends_in_a_clean_out_of_memory_error_when_nothing_leaves():
    # A registry that evicts nothing: the window's blocks are offered once (they leave the
    # evictable set when chosen), then the request fails as before the rung.
    e, reg, kept, window = small_segment_with_a_window("window", refuse=True)
    with pytest.raises(OutOfMemoryError, match="out of memory"):
        e.alloc(1280 * KiB)
    assert e.stats()["rung.evict_to_lend"] == 1 and e.stats()["num_ooms"] == 1
    assert reg.calls[-1] == [1, 2, 3]
    e.check_invariants()
    reg.close(*kept)


@pytest.mark.parametrize("strategy", ["dtr", "dte", "window"])
@pytest.mark.parametrize(("small_size", "ticks"), [(4 * KiB, False), (16 * KiB, True)])
def test_uses_of_small_blocks_do_not_reorder_the_large_victims(strategy, small_size, ticks):
    # Note [What moves the clock] (allocator/src/evictor.h): staleness orders victims, and
    # a program's many small tensors must not change which large one is the stalest. Two
    # 2 MiB victims: `older` (cost 1.5) was used before `newer` (cost 1.0). With the clock
    # as they left it, older is cheaper per staleness (1.5 / 2 against 1.0 / 1); after 1,000
    # further ticks both are about equally stale and newer is the cheaper. Uses of a block
    # under 16 KiB leave the clock alone; from 16 KiB they tick.
    e = Engine("host", budget="6MiB", evict_strategy=strategy)
    reg = FakeRegistry(e)
    reg.add(2 * MiB, cost=1.5, handle=1)
    reg.add(2 * MiB, cost=1.0, handle=2)
    small = e.alloc(small_size)  # in a small-pool segment of its own, too full for 2 MiB
    for _ in range(1000):
        e.touch(small)
    e.set_evictable(small, 0, 0.0)  # a mark too, as the registry's of a new node
    kept = e.alloc(2 * MiB)
    assert reg.calls == [[2 if ticks else 1]], reg.calls
    reg.close(small, kept)


def test_eviction_cannot_help_a_request_larger_than_everything():
    e, reg, pinned = crafted("dtr")
    with pytest.raises(OutOfMemoryError, match="out of memory"):
        e.alloc(39 * MiB)  # B's pinned blocks keep one whole segment busy
    e.check_invariants()
    for p in pinned + list(reg.ptrs.values()):
        e.free(p)
    e.close()


@pytest.mark.parametrize(("strategy", "stitch"),
                         [("window", True), ("window", False), ("dtr", True), ("dtr", False)])
def test_evictions_free_whole_segments_for_a_request_no_segment_holds(strategy, stitch):
    e = Engine("host", budget="40MiB", evict_strategy=strategy, stitch=stitch)
    reg = FakeRegistry(e)
    for i in range(8):
        reg.add(5 * MiB, cost=float(i + 1), handle=i + 1)  # two 20 MiB segments, all evictable
    big = e.alloc(30 * MiB)   # no segment holds it: the evictions must empty both
    stats = e.stats()
    assert stats["reserved_bytes.all.peak"] <= 40 * MiB
    assert stats["num_evictions"] >= 6, stats   # 30 MiB of 5 MiB blocks at least
    if stitch:
        # Rung stitch_cached: the free chunks of the two segments, mapped together, nothing released
        # (under window too: no segment could ever hold the request, reclaim.cpp).
        assert stats["num_stitches"] == 1 and stats["num_device_free"] == 0
    else:   # both released, a 30 MiB segment mapped
        assert stats["num_stitches"] == 0 and stats["num_device_free"] == 2
    e.free(big)
    reg.close()


def test_proactive_eviction_keeps_allocated_under_the_threshold():
    e = Engine("host", budget="64MiB", evict_threshold=0.5, evict_strategy="dtr")
    reg = FakeRegistry(e)
    for i in range(12):
        reg.add(4 * MiB, cost=1.0, handle=i + 1)
        assert e.stats()["allocated_bytes.all.current"] <= 32 * MiB + 4 * MiB
    s = e.stats()
    assert s["num_proactive_evictions"] > 0
    assert s["allocated_bytes.all.current"] <= 32 * MiB
    for p in list(reg.ptrs.values()):
        e.free(p)
    e.close()


def test_threads_allocating_and_evicting_concurrently():
    # Four threads allocate, mark evictable and free, while the engine evicts for all of
    # them through one callback. What must hold: no deadlock, no error other than OOM, the
    # invariants, and eviction actually serving requests. An OOM is a legal outcome here:
    # with real parallelism (seen on a 16-core host) every segment can hold a transient
    # blocker at once — a block just allocated and not yet marked evictable, or a victim
    # its owner is freeing — so no contiguous window exists for that moment.
    e = Engine("host", budget="96MiB", evict_strategy="window")
    reg = FakeRegistry(e)
    errors, served, ooms = [], [0], [0]

    def worker(index):
        try:
            for i in range(150):
                handle = index * 1_000_000 + i + 1
                try:
                    reg.add((1 + (i * 7919 + index) % 6) * MiB, cost=1.0 + i % 5, handle=handle)
                    served[0] += 1
                except OutOfMemoryError:
                    ooms[0] += 1
                    continue
                if i % 3 == 0:
                    with reg.lock:
                        ptr = reg.ptrs.pop(handle, None)
                    if ptr is not None:
                        e.free(ptr)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "deadlock"
    assert not errors, errors
    assert e.stats()["num_evictions"] > 0
    assert served[0] >= 0.9 * 600, (served, ooms)  # transient OOMs are rare, not the rule
    e.check_invariants()
    for p in list(reg.ptrs.values()):
        e.free(p)
    e.close()


def test_bad_eviction_input():
    e = Engine("host", budget="32MiB")
    p = e.alloc(1024)
    with pytest.raises(PyallocError, match="no live block starts there"):
        e.set_evictable(p + 512, 1, 1.0)
    with pytest.raises(PyallocError, match="must be a finite number >= 0"):
        e.set_evictable(p, 1, -1.0)
    with pytest.raises(PyallocError, match="must be a finite number >= 0"):
        e.set_evictable(p, 1, float("nan"))
    with pytest.raises(PyallocError, match="no live block starts there"):
        e.touch(p + 4096)
    with pytest.raises(ValueError, match="invalid value 'lru' for pyalloc option 'evict_strategy'"):
        Engine("host", evict_strategy="lru")
    with pytest.raises(ValueError, match="evict_threshold"):
        Engine("host", evict_threshold=1.5)
    e.free(p)
    e.close()


def test_failing_callback_is_contained():
    e = Engine("host", budget="40MiB")
    ptrs = [e.alloc(5 * MiB) for _ in range(8)]
    for i, p in enumerate(ptrs):
        e.set_evictable(p, i + 1, 1.0)

    def broken(handles):
        raise RuntimeError("registry exploded")

    e.set_evict_callback(broken)
    with pytest.raises(OutOfMemoryError):
        e.alloc(10 * MiB)
    e.set_evict_callback(None)
    e.check_invariants()
    for p in ptrs:
        e.free(p)
    e.close()


@pytest.mark.parametrize("strategy", ["window", "dtr", "dte"])
def test_a_stitched_block_is_an_eviction_candidate(strategy):
    # Pinned 4 MiB blocks with 4 MiB holes between them: a 12 MiB tensor is stitched from
    # three holes and marked evictable. A second 12 MiB request fits only if that tensor
    # goes: the evictor must see stitched ranges, or this is an OOM.
    e = Engine("host", budget="40MiB", evict_strategy=strategy)
    reg = FakeRegistry(e)
    blocks = [e.alloc(4 * MiB) for _ in range(10)]
    for p in blocks[1::2]:
        e.free(p)
    pinned = blocks[0::2]
    reg.add(12 * MiB, cost=1.0, handle=1)
    assert e.stats()["num_stitches"] == 1
    other = e.alloc(12 * MiB)
    stats = e.stats()
    assert [h for call in reg.calls for h in call] == [1]
    assert stats["num_stitches"] == 2 and stats["reserved_bytes.all.peak"] <= 40 * MiB
    e.free(other)
    e.check_invariants()
    for p in pinned:
        e.free(p)
    e.close()


def test_window_frees_chunks_for_stitching_when_neither_a_window_nor_a_segment_can():
    # Two 20 MiB segments, each starting with a pinned 2 MiB block (so neither can be
    # emptied) and then 18 MiB of evictable blocks on 2 MiB boundaries. A 24 MiB request
    # fits no segment and no whole segment can be freed: the window strategy must free
    # whole chunks in both, cheapest first, for the stitch rung. (Seen on the transformer
    # at a quarter of its peak, where this fallback took window's smallest budget from
    # 0.33 to 0.25 of the peak.)
    e = Engine("host", budget="40MiB", evict_strategy="window")
    reg = FakeRegistry(e)
    pinned, handle = [], 1
    for seg in range(2):
        pinned.append(e.alloc(2 * MiB))
        for size in (4, 4, 4, 4, 2):
            reg.add(size * MiB, cost=float(handle), handle=handle)
            handle += 1
    assert e.stats()["num_device_alloc"] == 2
    big = e.alloc(24 * MiB)
    stats = e.stats()
    evicted = sorted(h for call in reg.calls for h in call)
    assert stats["num_stitches"] == 1 and stats["reserved_bytes.all.peak"] <= 40 * MiB
    # 12 chunks needed, cheapest first by cost / staleness: handle h costs h and was
    # marked h-th, so the order is 1, 2, ..., and the first seven blocks give 13 chunks.
    assert evicted == [1, 2, 3, 4, 5, 6, 7]
    e.free(big)
    reg.close(*pinned)


def test_window_evicts_in_the_large_pool_for_a_small_request_it_can_borrow():
    # The budget is spent on one 20 MiB large segment (full of evictable blocks, with a
    # pinned sliver in it, so it can never be released whole) and one small segment full
    # of what cannot go. A 1 MiB request has no window in the small pool and no segment to
    # free: the window strategy must evict a window of the large pool for the borrow rung.
    # (Seen on the UNet at 39% of its peak: an OOM where 35% trained.)
    e = Engine("host", budget="22MiB", evict_strategy="window")
    reg = FakeRegistry(e)
    small_full = [e.alloc(1 * MiB) for _ in range(2)]
    handle = 1
    for size in (4, 4, 4):
        reg.add(size * MiB, cost=float(handle), handle=handle)
        handle += 1
    e.set_budget(22 * MiB)
    sliver = e.alloc(4 * KiB)            # borrowed: the budget has no room for a segment
    for size in (4, 3):
        reg.add(size * MiB, cost=float(handle), handle=handle)
        handle += 1
    assert e.stats()["num_small_borrows"] == 1
    assert e.stats()["reserved_bytes.all.current"] == 22 * MiB
    ptr = e.alloc(1 * MiB)
    stats = e.stats()
    assert stats["num_small_borrows"] == 2 and stats["num_evictions"] == 1
    assert reg.calls == [[1]]           # the cheapest window that holds 1 MiB
    e.free(ptr)
    reg.close(*small_full, sliver)


# --- evictable placement (Note [Evictable placement] in allocator/src/pool.h) ---------------

def interleaved_small_blocks(e: Engine, reg: FakeRegistry, pairs: int):
    """Alternating 256 KiB blocks: one that stays, one evictable (made in an evictable
    scope, as the registry makes activations); returns the ones that stay."""
    stay = []
    for i in range(pairs):
        stay.append(e.alloc(256 * KiB))
        with pyalloc.engine.evictable_allocations():
            reg.add(256 * KiB, cost=1.0, handle=i + 1)
    return stay


@pytest.mark.parametrize("placement", [True, False])
def test_small_evictable_blocks_keep_to_segments_of_their_own(placement):
    e = Engine("host", budget="64MiB", evictable_placement=placement)
    reg = FakeRegistry(e)
    stay = interleaved_small_blocks(e, reg, pairs=4)
    segments = [s for s in e.snapshot()["segments"] if s["segment_type"] == "small"]
    mixed = [s for s in segments
             if len({b["evictable"] for b in s["blocks"] if b["state"] != "inactive"}) > 1]
    if placement:   # one 2 MiB segment of each kind, half full
        assert len(segments) == 2 and not mixed
        assert sorted(s["evictable_class"] for s in segments) == [False, True]
    else:           # best fit: all eight in one segment
        assert len(segments) == 1 and len(mixed) == 1
    reg.close(*stay)


def test_what_an_evictable_scope_makes_below_min_evictable_is_placed_as_short_lived():
    # Note [What an evictable op makes that stays]: a flagged request below min_evictable
    # can never be a node; placed in the evictable segment it would keep it from emptying.
    e = Engine("host", budget="64MiB", evictable_placement=True, min_evictable="1KiB")
    reg = FakeRegistry(e)
    stay = e.alloc(256 * KiB)
    with pyalloc.engine.evictable_allocations():
        reg.add(256 * KiB, cost=1.0, handle=1)
        tiny = e.alloc(512)                        # a [128] float output of the same op
        at_the_edge = e.alloc(1 * KiB)             # min_evictable itself: may be a node
    classes = {b["address"]: s["evictable_class"]
               for s in e.snapshot()["segments"] if s["segment_type"] == "small"
               for b in s["blocks"] if b["state"] != "inactive"}
    assert classes[stay] is False and classes[tiny] is False
    assert classes[at_the_edge] is True and classes[reg.ptrs[1]] is True
    reg.close(stay, tiny, at_the_edge)


@pytest.mark.parametrize("placement", [True, False])
def test_a_large_request_is_served_by_evicting_whole_small_segments(placement):
    # The budget holds four small segments; they fill with 256 KiB blocks, half of them
    # evictable. A 3 MiB request then needs two of those segments wholly freed.
    e = Engine("host", budget="8MiB", evictable_placement=placement)
    reg = FakeRegistry(e)
    stay = interleaved_small_blocks(e, reg, pairs=16)
    assert e.stats()["reserved_bytes.all.current"] == 8 * MiB
    if placement:
        big = e.alloc(3 * MiB)   # two evictable segments emptied, released, 4 MiB mapped
        assert len(reg.calls) >= 1 and len(reg.ptrs) == 0
        assert e.stats()["reserved_bytes.all.peak"] <= 8 * MiB
        e.free(big)
    else:   # every segment keeps blocks that stay: no eviction frees a whole one
        with pytest.raises(OutOfMemoryError, match="evictable 4.00 MiB in 16 blocks"):
            e.alloc(3 * MiB)
    reg.close(*stay)


@pytest.mark.slow
@pytest.mark.parametrize("placement", ["true", "false"])
def test_the_registry_places_what_it_records_under_the_option(placement):
    # The registry says which allocations are evictable only when the engine would use it
    # (Registry::places_evictables): 256 KiB activations of a small MLP land in small
    # segments of the evictable class with the option, and in none without it.
    out = run_program("evictable_placement", "--placement", placement)

    assert f"evictable segments {placement == 'true'}" in out, out


def test_without_an_evict_callback_the_evictable_scope_changes_nothing():
    e = Engine("host", budget="64MiB")
    a = e.alloc(256 * KiB)
    with pyalloc.engine.evictable_allocations():
        b = e.alloc(256 * KiB)
    assert len(e.snapshot()["segments"]) == 1   # best fit, as with no scope at all
    e.free(a), e.free(b)
    e.close()
