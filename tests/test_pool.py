"""Unit tests of the pool (allocator/src/pool.cpp, reclaim.cpp) through ``Engine``.

What this file proves, each on a layout small enough to reason about by hand:

* sizes round to 512 B; requests <= 1 MiB share 2 MiB small-pool segments, 1-10 MiB
  requests share 20 MiB segments, larger ones get a segment of their own rounded to 2 MiB;
* best fit returns the smallest cached block that fits (lowest address on ties);
* blocks split on allocation and free neighbours coalesce, whatever the order of frees;
* large-pool blocks are not split for a remainder of 1 MiB or less; max_split_size keeps
  big cached blocks whole;
* stream-ordered reuse (Note [Stream tags] in block.h): a block freed on stream A serves A
  again, not B while the budget can grow, and B after the fence rung waited for A;
* record_stream: a freed block is not reused while the recording stream still has work
  queued on it, checked both by address and by the memory itself;
* empty_cache, the budget (a hard cap; lowering it releases cache; "50%") and size 0.
"""
from __future__ import annotations

import ctypes
import random

import pytest

from memory_patterns import (
    KiB, LARGE_SEGMENT, MiB, SMALL_SEGMENT, assert_pattern, block_at, blocks, pool_of,
    round_size, segment_of, segment_size_for, write_pattern,
)
from pyalloc import Engine, OutOfMemoryError

SLOW_US = 150_000  # per-task delay of a "slow stream": long enough to observe, short in CI


# --- rounding and size classes ---------------------------------------------------------

@pytest.mark.parametrize("requested, rounded", [
    (1, 512), (511, 512), (512, 512), (513, 1024), (1000, 1024), (4096, 4096),
    (4097, 4608), (1 * MiB, 1 * MiB), (1 * MiB + 1, 1 * MiB + 512), (3 * MiB + 7, 3 * MiB + 512),
])
def test_sizes_round_up_to_512_bytes(make_engine, requested, rounded):
    engine = make_engine()
    ptr = engine.alloc(requested)
    _, block = block_at(engine, ptr)
    assert block["size"] == rounded
    assert block["requested_size"] == requested
    stats = engine.stats()
    assert stats["allocated_bytes.all.current"] == rounded
    assert stats["requested_bytes.all.current"] == requested
    engine.free(ptr, requested)


@pytest.mark.parametrize("requested, segment_type, segment_size", [
    (1, "small", 2 * MiB),
    (1 * MiB, "small", 2 * MiB),
    (1 * MiB + 1, "large", 20 * MiB),
    (10 * MiB - 512, "large", 20 * MiB),
    (10 * MiB, "large", 10 * MiB),
    (10 * MiB + 1, "large", 12 * MiB),
    (33 * MiB, "large", 34 * MiB),
])
def test_pool_and_segment_size_follow_the_size_class(make_engine, requested, segment_type,
                                                     segment_size):
    engine = make_engine(budget="128MiB")
    ptr = engine.alloc(requested)
    seg = segment_of(engine, ptr)
    assert (seg["segment_type"], seg["total_size"]) == (segment_type, segment_size)
    assert pool_of(requested) == segment_type and segment_size_for(requested) == segment_size
    stats = engine.stats()
    assert stats[f"reserved_bytes.{segment_type}_pool.current"] == segment_size
    other = "large" if segment_type == "small" else "small"
    assert stats[f"reserved_bytes.{other}_pool.current"] == 0
    engine.free(ptr)


def test_small_requests_share_one_segment_in_address_order(make_engine):
    engine = make_engine()
    ptrs = [engine.alloc(size) for size in (100, 700, 4096, 1 * MiB)]
    assert len({segment_of(engine, p)["address"] for p in ptrs}) == 1
    expected = ptrs[0]
    for ptr, size in zip(ptrs, (100, 700, 4096, 1 * MiB)):
        assert ptr == expected
        expected += round_size(size)
    assert engine.stats()["segment.all.current"] == 1
    for ptr in ptrs:
        engine.free(ptr)


def test_mid_size_segment_shrinks_to_the_request_when_the_budget_is_tight(make_engine):
    # A 20 MiB segment does not fit an 8 MiB budget, so grow falls back to the smallest
    # segment that holds the request (3 MiB rounds to 4 MiB at 2 MiB granularity).
    engine = make_engine(budget="8MiB")
    ptr = engine.alloc(3 * MiB)
    assert segment_of(engine, ptr)["total_size"] == 4 * MiB
    engine.free(ptr)


# --- best fit --------------------------------------------------------------------------

def test_best_fit_picks_the_smallest_cached_block_that_fits(make_engine):
    engine = make_engine()
    # [8K][sep][4K][sep][16K][sep][4K][sep][rest...]: freeing the non-separators leaves free
    # blocks of 8K, 4K, 16K and 4K that cannot merge with each other.
    sizes = [8 * KiB, 512, 4 * KiB, 512, 16 * KiB, 512, 4 * KiB, 512]
    ptrs = [engine.alloc(s) for s in sizes]
    assert len({segment_of(engine, p)["address"] for p in ptrs}) == 1
    for i in (0, 2, 4, 6):
        engine.free(ptrs[i])
    rest = ptrs[-1] + 512

    got = {}
    # 3000 B rounds to 3 KiB: both 4 KiB blocks fit; the lower address wins the tie.
    got["3000"] = engine.alloc(3000)
    assert got["3000"] == ptrs[2]
    # 4 KiB: the other 4 KiB block (the split-off 1 KiB remainder of the first is too small).
    got["4096"] = engine.alloc(4096)
    assert got["4096"] == ptrs[6]
    got["5000"] = engine.alloc(5000)
    assert got["5000"] == ptrs[0]
    got["9000"] = engine.alloc(9000)
    assert got["9000"] == ptrs[4]
    # Nothing cached between the separators fits 17 KiB: it comes from the segment's tail.
    got["17K"] = engine.alloc(17 * KiB)
    assert got["17K"] == rest
    assert engine.stats()["segment.all.current"] == 1
    for ptr in list(got.values()) + [ptrs[i] for i in (1, 3, 5, 7)]:
        engine.free(ptr)


def test_best_fit_among_cached_large_segments(make_engine):
    engine = make_engine(budget="128MiB")
    by_size = {mib: engine.alloc(mib * MiB) for mib in (16, 12, 14)}
    for ptr in by_size.values():
        engine.free(ptr)
    reserved = engine.stats()["reserved_bytes.all.current"]
    eleven = engine.alloc(11 * MiB)
    thirteen = engine.alloc(13 * MiB)
    assert eleven == by_size[12] and thirteen == by_size[14]
    # Remainders of exactly 1 MiB are not split off a large block.
    assert block_at(engine, eleven)[1]["size"] == 12 * MiB
    assert block_at(engine, thirteen)[1]["size"] == 14 * MiB
    assert engine.stats()["reserved_bytes.all.current"] == reserved  # nothing new
    engine.free(eleven)
    engine.free(thirteen)


# --- split and coalesce ----------------------------------------------------------------

def _free_block_count(engine, seg_address):
    return sum(1 for seg, b in blocks(engine)
               if seg["address"] == seg_address and b["state"] == "inactive")


@pytest.mark.parametrize("order", ["forward", "reverse", "evens_then_odds", "shuffled"])
@pytest.mark.parametrize("size, count", [(24 * KiB, 40), (2 * MiB, 9)])
def test_freed_neighbours_coalesce_into_one_block(make_engine, order, size, count):
    engine = make_engine(budget="128MiB")
    ptrs = [engine.alloc(size) for _ in range(count)]
    seg = segment_of(engine, ptrs[0])
    assert all(segment_of(engine, p)["address"] == seg["address"] for p in ptrs)
    indices = list(range(count))
    if order == "reverse":
        indices.reverse()
    elif order == "evens_then_odds":
        indices = indices[::2] + indices[1::2]
    elif order == "shuffled":
        random.Random(1234).shuffle(indices)
    freed = set()
    for i in indices:
        engine.free(ptrs[i])
        freed.add(i)
        # Count the runs of freed neighbours; the tail remainder joins a run that touches it.
        runs = sum(1 for j in freed if j - 1 not in freed)
        tail_free = (count - 1) in freed
        expected = runs + (0 if tail_free else 1)
        assert _free_block_count(engine, seg["address"]) == expected, (order, i)
        engine.check_invariants()
    (only,) = [b for s, b in blocks(engine) if s["address"] == seg["address"]]
    assert only["size"] == seg["total_size"] and only["state"] == "inactive"
    stats = engine.stats()
    assert stats["inactive_split_bytes.all.current"] == 0
    assert stats["inactive_split.all.current"] == 0


def test_large_block_is_not_split_for_a_remainder_of_one_mib_or_less(make_engine):
    engine = make_engine(budget="128MiB")
    # 11 MiB + 1 B rounds to 11 MiB + 512 B; its 12 MiB segment leaves 1 MiB - 512 B.
    ptr = engine.alloc(11 * MiB + 1)
    seg, block = block_at(engine, ptr)
    assert len(seg["blocks"]) == 1 and block["size"] == 12 * MiB
    stats = engine.stats()
    assert stats["allocated_bytes.all.current"] == 12 * MiB
    assert stats["requested_bytes.all.current"] == 11 * MiB + 1
    # 9 MiB from a 20 MiB segment leaves 11 MiB: that is split off and cached.
    mid = engine.alloc(9 * MiB)
    seg, block = block_at(engine, mid)
    assert block["size"] == 9 * MiB and len(seg["blocks"]) == 2
    assert seg["blocks"][1]["size"] == 11 * MiB and seg["blocks"][1]["state"] == "inactive"
    engine.free(ptr)
    engine.free(mid)


@pytest.mark.parametrize("max_split_size", [None, "32MiB"])
def test_max_split_size_keeps_big_cached_blocks_whole(make_engine, max_split_size):
    options = {"max_split_size": max_split_size} if max_split_size else {}
    engine = make_engine(budget="256MiB", **options)
    big = engine.alloc(40 * MiB)
    engine.free(big)
    small = engine.alloc(2 * MiB)
    if max_split_size is None:
        assert small == big  # carved out of the cached 40 MiB block
    else:
        assert segment_of(engine, small)["address"] != big
        assert segment_of(engine, small)["total_size"] == LARGE_SEGMENT
    engine.free(small)
    engine.empty_cache()

    # An oversize request takes a cached block at most 20 MiB larger, whole.
    big = engine.alloc(40 * MiB)
    huge = engine.alloc(80 * MiB)
    engine.free(big)
    engine.free(huge)
    oversize = engine.alloc(36 * MiB)
    assert oversize == big
    block = block_at(engine, oversize)[1]
    stats = engine.stats()
    if max_split_size is None:
        assert block["size"] == 36 * MiB
        assert stats["oversize_allocations.allocated"] == 0
    else:
        assert block["size"] == 40 * MiB  # not split: the 4 MiB rest stays attached
        assert stats["oversize_allocations.allocated"] == 4  # 40, 40, 80 and 36 MiB
    # Under max_split_size, 50 MiB may not take the cached 80 MiB block: 30 MiB would be
    # wasted, more than the 20 MiB an oversize request may round up by.
    fifty = engine.alloc(50 * MiB)
    if max_split_size is None:
        assert fifty == huge
    else:
        assert fifty != huge
    engine.free(fifty)
    engine.free(oversize)


@pytest.mark.parametrize("max_split_size", ["4MiB", "512KiB", "20MiB"])
def test_max_split_size_at_or_below_the_segment_size_is_refused(max_split_size):
    # Below the 20 MiB segment size the rule would stop fresh segments from being split,
    # so every allocation would take a segment of its own (PyTorch refuses these too).
    with pytest.raises(ValueError, match="more than 20 MiB"):
        Engine("host", budget="100MiB", max_split_size=max_split_size)


def test_smallest_accepted_max_split_size_still_packs_segments(make_engine):
    engine = make_engine(budget="100MiB", max_split_size="21MiB")
    ptrs = [engine.alloc(2 * MiB) for _ in range(40)]  # 40 x 2 MiB fit a 100 MiB budget
    try:
        assert engine.stats()["segment.all.current"] == 4  # 20 MiB segments of ten 2 MiB blocks
    finally:
        for ptr in ptrs:
            engine.free(ptr)


# --- stream-ordered reuse --------------------------------------------------------------

def test_block_freed_on_a_stream_is_reused_on_that_stream(make_engine):
    engine = make_engine()
    a = engine.create_stream()
    x = engine.alloc(4096, a)
    engine.free(x)
    y = engine.alloc(4096, a)
    assert y == x
    engine.free(y)


def test_other_stream_grows_instead_of_taking_a_block_still_in_use(make_engine):
    engine = make_engine(budget="4MiB")  # room for a second small segment
    a, b = engine.create_stream(), engine.create_stream()
    x = engine.alloc(4096, a)
    engine.free(x)
    y = engine.alloc(4096, b)
    assert segment_of(engine, y)["address"] != segment_of(engine, x)["address"]
    stats = engine.stats()
    assert stats["segment.all.current"] == 2
    assert stats["num_stream_fences"] == 0
    engine.free(y)


def test_fence_rung_waits_for_the_other_stream_before_reuse(make_engine):
    engine = make_engine(budget="2MiB")  # one small segment: B cannot grow
    a, b = engine.create_stream(), engine.create_stream()
    engine.set_stream_delay(a, SLOW_US)
    n = 64 * KiB
    x = engine.alloc(n, a)
    engine.fill_async(a, x, n, 0xAB)  # still queued on the slow stream A
    engine.free(x)  # legal: A's later work runs after the fill
    y = engine.alloc(n, b)
    assert y == x
    stats = engine.stats()
    assert stats["num_stream_fences"] == 1
    assert stats["num_alloc_retries"] == 0 and stats["num_device_free"] == 0
    # The fence waited for A: the fill has landed before the block was handed to B.
    assert ctypes.string_at(y, n) == b"\xab" * n
    write_pattern(y, n, tag=7)
    engine.synchronize()
    assert_pattern(y, n, tag=7)
    engine.free(y)


# --- record_stream ---------------------------------------------------------------------

def test_record_stream_delays_reuse_until_the_stream_is_done(make_engine):
    engine = make_engine()
    s = engine.create_stream()
    engine.set_stream_delay(s, SLOW_US)
    n = 64 * KiB
    x = engine.alloc(n)
    engine.fill_async(s, x, n, 0xCD)
    engine.record_stream(x, s)
    engine.free(x, n)
    stats = engine.stats()
    assert stats["pending_frees"] == 1
    assert stats["allocation.all.current"] == 0 and stats["active.all.current"] == 1

    y = engine.alloc(n)
    assert y != x  # the fill is still queued behind the delay
    write_pattern(y, n, tag=1)
    engine.synchronize()
    assert_pattern(y, n, tag=1)
    assert ctypes.string_at(x, n) == b"\xcd" * n  # the fill landed where it was aimed
    engine.free(y, n)

    # Once the stream has passed the recorded point, the block is reusable again.
    z = engine.alloc(n)
    assert z == x
    assert engine.stats()["pending_frees"] == 0
    engine.free(z, n)


def test_async_fill_never_clobbers_a_reused_block(make_engine):
    """Many rounds of fill-on-slow-stream / record / free, each followed by allocations
    that get host-written patterns: if any of them were handed memory the fill was still
    headed for, its pattern reads wrong after synchronize()."""
    engine = make_engine(budget="64MiB")
    streams = [engine.create_stream() for _ in range(2)]
    for s in streams:
        engine.set_stream_delay(s, 2_000)
    rng = random.Random(99)
    sizes = [512, 4 * KiB, 64 * KiB, 300 * KiB, 3 * MiB]
    live = []
    for tag in range(80):
        size = rng.choice(sizes)
        ptr = engine.alloc(size)
        write_pattern(ptr, size, tag)
        live.append((ptr, size, tag))
        if len(live) < 8:
            continue
        victim = live.pop(rng.randrange(len(live)))
        stream = rng.choice(streams)
        engine.fill_async(stream, victim[0], victim[1], 0xEE)
        engine.record_stream(victim[0], stream)
        engine.free(victim[0], victim[1])
        for ptr, size, t in live:  # a too-early reuse may already show
            assert_pattern(ptr, size, t)
    engine.synchronize()
    for ptr, size, t in live:
        assert_pattern(ptr, size, t)
        engine.free(ptr, size)


def test_record_stream_on_the_allocation_stream_does_not_delay_the_free(make_engine):
    engine = make_engine()
    s = engine.create_stream()
    x = engine.alloc(4 * KiB, s)
    engine.record_stream(x, s)  # its own stream: already ordered, nothing to wait for
    engine.free(x)
    assert engine.stats()["pending_frees"] == 0


def test_free_after_the_recorded_stream_was_destroyed_syncs_the_device(make_engine):
    engine = make_engine()
    s = engine.create_stream()
    x = engine.alloc(4 * KiB)
    engine.record_stream(x, s)
    engine.destroy_stream(s)  # its work is done, and no event can be recorded on it now
    engine.free(x)
    stats = engine.stats()
    assert stats["pending_frees"] == 0 and stats["active.all.current"] == 0
    assert stats["num_sync_all_streams"] == 1
    assert engine.alloc(4 * KiB) == x
    engine.free(x)


def test_blocks_tagged_with_a_destroyed_stream_are_reclaimed_by_the_fence(make_engine):
    engine = make_engine(budget="2MiB")
    a = engine.create_stream()
    x = engine.alloc(4 * KiB, a)
    engine.free(x)
    engine.destroy_stream(a)
    y = engine.alloc(4 * KiB)
    assert y == x and engine.stats()["num_stream_fences"] == 1
    engine.free(y)


# --- empty_cache and the budget --------------------------------------------------------

def test_empty_cache_releases_every_free_segment(make_engine):
    engine = make_engine(budget="128MiB")
    ptrs = [engine.alloc(size) for size in (4 * KiB, 900 * KiB, 3 * MiB, 12 * MiB, 40 * MiB)]
    keep = engine.alloc(8 * KiB)
    for ptr in ptrs:
        engine.free(ptr)
    engine.empty_cache()
    stats = engine.stats()
    # Only keep's small segment survives.
    assert stats["reserved_bytes.all.current"] == SMALL_SEGMENT
    assert stats["num_device_free"] == stats["num_device_alloc"] - 1
    engine.free(keep)
    engine.empty_cache()
    stats = engine.stats()
    assert stats["reserved_bytes.all.current"] == 0
    assert stats["segment.all.current"] == 0
    assert engine.snapshot()["segments"] == []


def test_empty_cache_releases_segments_freed_on_different_streams(make_engine):
    engine = make_engine()
    a, b = engine.create_stream(), engine.create_stream()
    x = engine.alloc(4096, a)
    y = engine.alloc(4096, b)
    engine.free(x)
    engine.free(y)
    engine.synchronize()
    engine.empty_cache()
    assert engine.stats()["reserved_bytes.all.current"] == 0


def test_reserved_never_exceeds_the_budget(make_engine):
    budget = 48 * MiB
    engine = make_engine(budget=budget)
    rng = random.Random(5)
    live = []
    ooms = 0
    for _ in range(400):
        if live and rng.random() < 0.45:
            engine.free(live.pop(rng.randrange(len(live))))
        else:
            try:
                live.append(engine.alloc(rng.choice([
                    rng.randrange(1, 1 * MiB), rng.randrange(1 * MiB, 10 * MiB),
                    rng.randrange(10 * MiB, 30 * MiB)])))
            except OutOfMemoryError:
                ooms += 1
        stats = engine.stats()
        assert stats["reserved_bytes.all.current"] <= budget
    assert engine.stats()["reserved_bytes.all.peak"] <= budget
    assert ooms > 0  # the budget was actually tight
    for ptr in live:
        engine.free(ptr)


def test_lowering_the_budget_releases_cached_segments(make_engine):
    engine = make_engine(budget="128MiB")
    keep = engine.alloc(12 * MiB)
    for ptr in [engine.alloc(20 * MiB) for _ in range(3)]:
        engine.free(ptr)
    assert engine.stats()["reserved_bytes.all.current"] == 72 * MiB
    engine.set_budget(16 * MiB)
    stats = engine.stats()
    assert stats["budget_bytes"] == 16 * MiB
    assert stats["reserved_bytes.all.current"] == 12 * MiB  # live memory is never taken
    with pytest.raises(OutOfMemoryError):
        engine.alloc(8 * MiB)  # 12 + 8 > 16
    engine.free(keep)


@pytest.mark.parametrize("budget", ["50%", 0.5, "0.5"])
def test_fractional_budget_is_a_fraction_of_the_simulated_capacity(make_engine, budget):
    engine = make_engine(budget=budget, sim_capacity="64MiB")
    assert engine.stats()["budget_bytes"] == 32 * MiB
    ptr = engine.alloc(30 * MiB)
    with pytest.raises(OutOfMemoryError):
        engine.alloc(4 * MiB)
    engine.free(ptr)


def test_set_memory_fraction_sets_the_budget(make_engine):
    engine = make_engine(sim_capacity="64MiB")
    engine.set_memory_fraction(0.25)
    assert engine.stats()["budget_bytes"] == 16 * MiB


# --- size 0 ----------------------------------------------------------------------------

def test_size_zero_returns_a_unique_valid_pointer_each_time(make_engine):
    engine = make_engine()
    ptrs = [engine.alloc(0) for _ in range(16)]
    assert len(set(ptrs)) == 16 and all(ptrs)
    for i, ptr in enumerate(ptrs):
        _, block = block_at(engine, ptr)
        assert block["size"] == 512 and block["requested_size"] == 0
        ctypes.memset(ptr, i, 512)  # the minimum block is real, writable memory
    for i, ptr in enumerate(ptrs):
        assert ctypes.string_at(ptr, 512) == bytes([i]) * 512
    stats = engine.stats()
    assert stats["allocation.all.current"] == 16
    assert stats["requested_bytes.all.current"] == 0
    assert stats["allocated_bytes.all.current"] == 16 * 512
    for ptr in ptrs:
        engine.free(ptr, 0)


def test_small_request_borrows_from_a_large_block_when_the_budget_is_spent(make_engine):
    # The budget holds exactly one 20 MiB large segment; a small request cannot get a
    # 2 MiB small segment, so it takes a piece of the large segment's free block.
    engine = make_engine(budget="20MiB")
    big = engine.alloc(5 * MiB)
    small = engine.alloc(4 * KiB)
    stats = engine.stats()
    assert stats["num_small_borrows"] == 1
    assert stats["reserved_bytes.all.current"] == 20 * MiB
    assert segment_of(engine, small)["segment_type"] == "large"
    assert segment_of(engine, small)["address"] == segment_of(engine, big)["address"]
    # Cut from the end of the free block, not its start: the rest stays one free run
    # right after `big` (15 MiB minus 4 KiB), which `big`'s free merges with.
    seg = segment_of(engine, big)
    assert small == seg["address"] + seg["total_size"] - 4 * KiB
    assert [b["state"] for b in seg["blocks"]] == ["active_allocated", "inactive", "active_allocated"]
    more = engine.alloc(8 * KiB)   # borrowed too, stacked right below the first
    assert more == small - 8 * KiB and engine.stats()["num_small_borrows"] == 2
    engine.check_invariants()
    engine.free(more)
    engine.free(small)
    engine.free(big)
    # With room for a small segment, small requests keep to the small pool.
    roomy = make_engine(budget="64MiB")
    b2 = roomy.alloc(5 * MiB)
    s2 = roomy.alloc(4 * KiB)
    assert segment_of(roomy, s2)["segment_type"] == "small"
    assert roomy.stats()["num_small_borrows"] == 0
    roomy.free(s2)
    roomy.free(b2)


def test_a_large_request_takes_a_small_segments_hole_rather_than_failing(make_engine):
    # Note [Lending the small pool's holes] in reclaim.cpp: the budget holds one small and one
    # large segment, both in use; the only free memory large enough is a 1.5 MiB hole of the
    # small segment. A 1.25 MiB request (the large pool's) takes it instead of failing.
    engine = make_engine(budget="4MiB")
    head = engine.alloc(128 * KiB)
    hole = [engine.alloc(1 * MiB), engine.alloc(512 * KiB)]
    tail = engine.alloc(256 * KiB)
    large = engine.alloc(2 * MiB)
    assert segment_of(engine, head)["segment_type"] == "small"
    assert segment_of(engine, large)["segment_type"] == "large"
    for ptr in hole:
        engine.free(ptr)
    assert engine.stats()["reserved_bytes.all.current"] == 4 * MiB
    lent = engine.alloc(1280 * KiB)
    stats = engine.stats()
    assert stats["rung.lend"] == 1 and stats["num_ooms"] == 0
    seg = segment_of(engine, lent)
    assert seg["segment_type"] == "small" and seg["address"] == segment_of(engine, head)["address"]
    assert lent == hole[0]   # the hole's start: best fit, taken as any block is
    ctypes.memset(lent, 7, 1280 * KiB)
    assert ctypes.string_at(lent + 1280 * KiB - 4, 4) == bytes([7]) * 4
    engine.check_invariants()
    # No hole is large enough now: a clean out-of-memory error, counted once.
    with pytest.raises(OutOfMemoryError, match="out of memory"):
        engine.alloc(1280 * KiB)
    assert engine.stats()["rung.lend"] == 1 and engine.stats()["num_ooms"] == 1
    # Freed, the lent block is the small pool's again: it merges back into one hole.
    engine.free(lent)
    engine.check_invariants()
    again = engine.alloc(1 * MiB)
    assert segment_of(engine, again)["address"] == segment_of(engine, head)["address"]
    for ptr in (again, head, tail, large):
        engine.free(ptr)
    # With room under the budget, a large request keeps to the large pool.
    roomy = make_engine(budget="64MiB")
    r = roomy.alloc(1280 * KiB)
    assert segment_of(roomy, r)["segment_type"] == "large" and roomy.stats()["rung.lend"] == 0
    roomy.free(r)
