"""Tests of the metrics themselves (docs/stats.md): each figure must read what a layout
made on purpose says it should.

* Fill one segment with N equal blocks and free every other one: ``external_fragmentation``,
  ``largest_free_block``, ``cached_free_bytes`` and ``inactive_split*`` are computed here
  from the layout alone and compared exactly.
* ``utilization`` is peak allocated / peak reserved for a crafted sequence whose peaks
  happen at different times; ``reset_peak_stats`` restarts peaks from the current values.
* ``allocated``/``freed`` accumulate every increase/decrease; ``reset_accumulated_stats``
  zeroes them and the counters, not the current values.
* ``num_alloc_retries`` counts allocations that had to release cached segments;
  ``num_ooms`` counts failed allocations, including requests beyond the budget.
"""
from __future__ import annotations

from typing import List, Set

import pytest

from memory_patterns import KiB, MiB, SMALL_SEGMENT, blocks, round_size
from pyalloc import OutOfMemoryError

ARRAY_STATS = ("allocation", "segment", "active", "inactive_split", "allocated_bytes",
               "reserved_bytes", "active_bytes", "inactive_split_bytes", "requested_bytes")


def free_runs(segment_size: int, block_sizes: List[int], freed: Set[int]) -> List[int]:
    """Sizes of the free blocks a segment holds when blocks of `block_sizes` were cut from
    its start in order and the indices in `freed` were freed: freed neighbours merge, and
    so does the uncut remainder at the end."""
    pieces = [(size, i in freed) for i, size in enumerate(block_sizes)]
    remainder = segment_size - sum(block_sizes)
    if remainder:
        pieces.append((remainder, True))
    runs, current = [], 0
    for size, is_free in pieces:
        if is_free:
            current += size
        elif current:
            runs.append(current)
            current = 0
    if current:
        runs.append(current)
    return runs


@pytest.mark.parametrize("block, count, segment, free_odd", [
    (64 * KiB, 32, SMALL_SEGMENT, False),  # fills the segment exactly
    (64 * KiB, 32, SMALL_SEGMENT, True),
    (48 * KiB, 42, SMALL_SEGMENT, False),  # a 32 KiB remainder stays cached at the end
    (48 * KiB, 42, SMALL_SEGMENT, True),   # ... and merges with the freed last block
    (2 * MiB, 10, 20 * MiB, False),        # the large pool: ten blocks fill 20 MiB
])
def test_free_every_other_block_reads_the_fragmentation_made(make_engine, block, count,
                                                             segment, free_odd):
    engine = make_engine()
    ptrs = [engine.alloc(block) for _ in range(count)]
    stats = engine.stats()
    assert stats["segment.all.current"] == 1
    assert stats["reserved_bytes.all.current"] == segment
    freed = set(range(1 if free_odd else 0, count, 2))
    for i in sorted(freed):
        engine.free(ptrs[i])

    runs = free_runs(segment, [block] * count, freed)
    stats = engine.stats()
    assert stats["cached_free_bytes"] == sum(runs)
    assert stats["largest_free_block"] == max(runs)
    assert stats["external_fragmentation"] == pytest.approx(1 - max(runs) / sum(runs),
                                                            abs=1e-12, rel=0)
    assert stats["inactive_split.all.current"] == len(runs)
    assert stats["inactive_split_bytes.all.current"] == sum(runs)
    assert stats["allocated_bytes.all.current"] == block * (count - len(freed))
    # The snapshot agrees block by block.
    free_sizes = sorted(b["size"] for _, b in blocks(engine) if b["state"] == "inactive")
    assert free_sizes == sorted(runs)
    for i in range(count):
        if i not in freed:
            engine.free(ptrs[i])


def test_every_other_block_of_an_exact_fill_is_one_minus_one_over_half(make_engine):
    # The literal statement of the requirement: N equal blocks fill a segment exactly;
    # freeing every other one leaves N/2 separate blocks, so fragmentation is 1 - 1/(N/2).
    n, block = 32, 64 * KiB
    engine = make_engine()
    ptrs = [engine.alloc(block) for _ in range(n)]
    for p in ptrs[::2]:
        engine.free(p)
    stats = engine.stats()
    assert stats["external_fragmentation"] == 1 - block / (n // 2 * block)
    assert stats["largest_free_block"] == block
    assert stats["cached_free_bytes"] == n // 2 * block
    assert stats["inactive_split_bytes.all.current"] == n // 2 * block
    assert stats["inactive_split_bytes.small_pool.current"] == n // 2 * block
    assert stats["inactive_split_bytes.large_pool.current"] == 0
    for p in ptrs[1::2]:
        engine.free(p)
    # All free again: one block, nothing split, nothing fragmented.
    stats = engine.stats()
    assert stats["external_fragmentation"] == 0
    assert stats["largest_free_block"] == stats["cached_free_bytes"] == SMALL_SEGMENT
    assert stats["inactive_split.all.current"] == 0
    assert stats["inactive_split_bytes.all.current"] == 0


def test_fragmentation_across_whole_free_segments(make_engine):
    engine = make_engine(budget="128MiB")
    a, b = engine.alloc(20 * MiB), engine.alloc(12 * MiB)
    engine.free(a)
    engine.free(b)
    stats = engine.stats()
    assert stats["cached_free_bytes"] == 32 * MiB
    assert stats["largest_free_block"] == 20 * MiB
    assert stats["external_fragmentation"] == 1 - 20 / 32
    # Whole free segments are releasable, so they are not "inactive split".
    assert stats["inactive_split_bytes.all.current"] == 0


def test_free_blocks_of_different_streams_count_separately(make_engine):
    engine = make_engine()
    a, b = engine.create_stream(), engine.create_stream()
    x = engine.alloc(4 * KiB, a)
    y = engine.alloc(4 * KiB, b)
    engine.free(x)
    engine.free(y)  # merges with the idle tail, not with x (tagged with another stream)
    stats = engine.stats()
    assert stats["cached_free_bytes"] == SMALL_SEGMENT
    assert stats["largest_free_block"] == SMALL_SEGMENT - 4 * KiB
    assert stats["external_fragmentation"] == 1 - (SMALL_SEGMENT - 4 * KiB) / SMALL_SEGMENT


def test_nothing_cached_reads_zero_fragmentation_and_full_utilization(make_engine):
    engine = make_engine()
    stats = engine.stats()
    assert stats["utilization"] == 1.0
    assert stats["external_fragmentation"] == 0
    assert stats["cached_free_bytes"] == stats["largest_free_block"] == 0
    # A segment exactly used up caches nothing either.
    p = engine.alloc(10 * MiB)
    stats = engine.stats()
    assert stats["cached_free_bytes"] == 0 and stats["external_fragmentation"] == 0
    assert stats["utilization"] == 1.0
    engine.free(p)


def test_utilization_is_peak_allocated_over_peak_reserved(make_engine):
    engine = make_engine(budget="128MiB")
    allocated = reserved = peak_allocated = peak_reserved = 0

    def note(delta_allocated=0, delta_reserved=0):
        nonlocal allocated, reserved, peak_allocated, peak_reserved
        allocated += delta_allocated
        reserved += delta_reserved
        peak_allocated = max(peak_allocated, allocated)
        peak_reserved = max(peak_reserved, reserved)

    a = engine.alloc(4 * MiB)        # a new 20 MiB segment
    note(4 * MiB, 20 * MiB)
    b = engine.alloc(12 * MiB)       # fits the 16 MiB left in it (split: 4 MiB remain)
    note(12 * MiB)
    engine.free(a)
    engine.free(b)
    note(-16 * MiB)
    c = engine.alloc(30 * MiB)       # a new 30 MiB segment: the cached 20 MiB is too small
    note(30 * MiB, 30 * MiB)
    engine.free(c)
    note(-30 * MiB)
    engine.empty_cache()
    note(0, -50 * MiB)
    d = engine.alloc(4 * KiB)
    note(4 * KiB, SMALL_SEGMENT)

    stats = engine.stats()
    assert (stats["allocated_bytes.all.peak"], stats["reserved_bytes.all.peak"]) == \
        (peak_allocated, peak_reserved) == (30 * MiB, 50 * MiB)
    assert stats["utilization"] == peak_allocated / peak_reserved == 0.6

    # Peaks restart from the current values, and utilization with them.
    engine.reset_peak_stats()
    stats = engine.stats()
    for name in ARRAY_STATS:
        for pool in ("all", "small_pool", "large_pool"):
            key = f"{name}.{pool}"
            assert stats[f"{key}.peak"] == stats[f"{key}.current"], key
    assert stats["utilization"] == (4 * KiB) / SMALL_SEGMENT
    # Accumulated totals survive a peak reset.
    assert stats["allocated_bytes.all.allocated"] == 4 * MiB + 12 * MiB + 30 * MiB + 4 * KiB
    e = engine.alloc(8 * KiB)
    assert engine.stats()["allocated_bytes.all.peak"] == 12 * KiB
    engine.free(d)
    engine.free(e)
    assert engine.stats()["allocated_bytes.all.peak"] == 12 * KiB


def test_accumulated_totals_and_their_reset(make_engine):
    engine = make_engine(budget="128MiB")
    sizes = [1, 700, 4096, 100 * KiB, 3 * MiB + 5, 15 * MiB]
    ptrs = [engine.alloc(s) for s in sizes]
    for p in ptrs[:4]:
        engine.free(p)
    stats = engine.stats()
    rounded = [round_size(s) for s in sizes]
    assert stats["allocated_bytes.all.allocated"] == sum(rounded)
    assert stats["allocated_bytes.all.freed"] == sum(rounded[:4])
    assert stats["requested_bytes.all.allocated"] == sum(sizes)
    assert stats["requested_bytes.all.freed"] == sum(sizes[:4])
    assert stats["allocation.all.allocated"] == 6 and stats["allocation.all.freed"] == 4
    assert stats["allocated_bytes.small_pool.allocated"] == sum(rounded[:4])
    assert stats["allocated_bytes.large_pool.allocated"] == sum(rounded[4:])
    for name in ARRAY_STATS:
        for pool in ("all", "small_pool", "large_pool"):
            key = f"{name}.{pool}"
            assert stats[f"{key}.current"] == stats[f"{key}.allocated"] - stats[f"{key}.freed"], key
    assert stats["num_device_alloc"] == 2  # one small segment, one 20 MiB segment

    engine.reset_accumulated_stats()
    stats = engine.stats()
    for name in ARRAY_STATS:
        assert stats[f"{name}.all.allocated"] == stats[f"{name}.all.freed"] == 0, name
    assert stats["num_device_alloc"] == 0
    assert stats["allocated_bytes.all.current"] == sum(rounded[4:])  # current is kept
    assert stats["allocated_bytes.all.peak"] == sum(rounded)        # and peaks too
    for p in ptrs[4:]:
        engine.free(p)
    stats = engine.stats()
    assert stats["allocated_bytes.all.freed"] == sum(rounded[4:])
    assert stats["allocated_bytes.all.allocated"] == 0


def test_num_alloc_retries_counts_releasing_cache_to_fit_a_request(make_engine):
    engine = make_engine(budget="24MiB")
    a = engine.alloc(12 * MiB)
    engine.free(a)  # a cached 12 MiB segment: too small for 20 MiB, and in the way
    b = engine.alloc(20 * MiB)
    stats = engine.stats()
    assert stats["num_alloc_retries"] == 1
    assert stats["num_device_free"] == 1
    assert stats["num_sync_all_streams"] == 1
    assert stats["num_ooms"] == 0
    assert stats["reserved_bytes.all.current"] == 20 * MiB
    assert (stats["rung.grow"], stats["rung.release"], stats["rung.cached"]) == (1, 1, 0)
    # A request the cache serves directly does not retry.
    engine.free(b)
    c = engine.alloc(20 * MiB)
    stats = engine.stats()
    assert stats["num_alloc_retries"] == 1
    assert (stats["rung.grow"], stats["rung.release"], stats["rung.cached"]) == (1, 1, 1)
    engine.free(c)


def test_num_ooms_counts_failed_allocations(make_engine):
    engine = make_engine(budget="24MiB")
    held = engine.alloc(20 * MiB)
    before = engine.stats()
    with pytest.raises(OutOfMemoryError, match="out of memory"):
        engine.alloc(8 * MiB)  # 20 + 8 > 24 and nothing cached to release
    with pytest.raises(OutOfMemoryError, match="exceeds the budget"):
        engine.alloc(30 * MiB)  # alone larger than the budget
    after = engine.stats()
    assert after["num_ooms"] == before["num_ooms"] + 2
    # A failed allocation changes no figure.
    for key in ("allocated_bytes.all.current", "reserved_bytes.all.current",
                "allocation.all.current", "requested_bytes.all.current"):
        assert after[key] == before[key], key
    engine.free(held)
    ok = engine.alloc(8 * MiB)  # the engine still serves requests after OOMs
    assert engine.stats()["num_ooms"] == before["num_ooms"] + 2
    engine.free(ok)


def test_pool_keys_split_the_all_figures(make_engine):
    engine = make_engine(budget="128MiB")
    ptrs = [engine.alloc(s) for s in (100, 64 * KiB, 1 * MiB, 2 * MiB, 12 * MiB)]
    stats = engine.stats()
    for name in ARRAY_STATS:
        for field in ("current", "peak", "allocated", "freed"):
            if field == "peak":
                continue  # peaks of the pools need not be simultaneous
            total = stats[f"{name}.small_pool.{field}"] + stats[f"{name}.large_pool.{field}"]
            assert stats[f"{name}.all.{field}"] == total, (name, field)
    assert stats["reserved_bytes.small_pool.current"] == SMALL_SEGMENT
    assert stats["reserved_bytes.large_pool.current"] == 20 * MiB
    for p in ptrs:
        engine.free(p)
