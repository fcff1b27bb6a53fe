"""Expandable segments (option ``expandable``; docs/design.md, "Expandable segments").

The large pool keeps one segment that grows by mapping 2 MiB chunks at its end and gives
free chunks at its end back on release:

* consecutive large requests land back to back in one segment, which grows by what each
  needs, and data written before a growth is intact after it;
* a request that does not fit grows the segment by what the free block at its end lacks,
  not by the whole request, and only if that block may serve the request's stream;
* best fit takes a hole inside before the free end, which is kept for what no other
  block holds;
* release (``empty_cache``, or the ladder's release rung) unmaps the free chunks at the
  end, and the whole segment once nothing in it is live; the segment grows again in the
  same place;
* stitching maps chunks of an expandable segment (one physical handle per chunk) and the
  data are the same seen through the range and at home;
* a budget raised past the segment's reserved address space starts another segment;
* the randomized patterns run with invariants checked, and no request fails while free
  chunks would hold it;
* training under recompute, and under hybrid (swap and recompute), with expandable
  segments at half the unconstrained peak is bit-identical to an unconstrained run.
"""
from __future__ import annotations

import ctypes

import pytest

from conftest import train
from memory_patterns import MiB, assert_pattern, segment_of, write_pattern
from pyalloc.bench.patterns import PATTERNS
from pyalloc.replay import replay


def large_segments(engine):
    return [s for s in engine.snapshot()["segments"] if s["segment_type"] == "large"]


def test_large_blocks_share_one_segment_that_grows_by_what_each_needs(make_engine):
    engine = make_engine(budget="64MiB", expandable=True)
    sizes = [3 * MiB, 5 * MiB + 4096, 12 * MiB, 2 * MiB]
    ptrs = []
    for i, size in enumerate(sizes):
        ptrs.append(engine.alloc(size))
        write_pattern(ptrs[-1], size, i)
    segs = large_segments(engine)
    assert len(segs) == 1 and segs[0]["expandable"]
    # Back to back; the segment is what they need in whole chunks: 4 + 6 + 12 + 2 MiB
    # (a block keeps a remainder of at most 1 MiB, as in any large segment).
    assert ptrs[1] == ptrs[0] + 3 * MiB
    assert segs[0]["total_size"] == 24 * MiB
    assert segs[0]["reserved_address_space"] >= 64 * MiB
    stats = engine.stats()
    assert stats["num_device_alloc"] == 1 and stats["num_segment_grows"] == 3
    assert stats["reserved_bytes.large_pool.current"] == 24 * MiB
    for i, (ptr, size) in enumerate(zip(ptrs, sizes)):
        assert_pattern(ptr, size, i)   # growth moved nothing
    for ptr in ptrs:
        engine.free(ptr)


def test_the_budget_fills_to_the_last_chunk(make_engine):
    # Each 5 MiB block leaves the segment's last chunk half free; the next one starts there.
    engine = make_engine(budget="40MiB", expandable=True)
    ptrs = [engine.alloc(5 * MiB) for _ in range(8)]
    assert engine.stats()["reserved_bytes.all.current"] == 40 * MiB
    assert ptrs == [ptrs[0] + i * 5 * MiB for i in range(8)]
    for ptr in ptrs:
        engine.free(ptr)


def test_a_request_grows_the_segment_by_what_its_free_tail_lacks(make_engine):
    engine = make_engine(budget="64MiB", expandable=True)
    a = engine.alloc(4 * MiB)
    b = engine.alloc(6 * MiB)
    engine.free(b)                        # a free 6 MiB tail
    c = engine.alloc(10 * MiB)            # takes the tail and 4 MiB more
    assert c == b
    assert large_segments(engine)[0]["total_size"] == 14 * MiB
    assert engine.stats()["reserved_bytes.all.current"] == 14 * MiB
    engine.free(c)
    engine.free(a)


def test_best_fit_takes_a_hole_before_the_free_end_that_can_grow(make_engine):
    # The free end can grow to any size, so best fit ranks it above every other block (as
    # PyTorch does): a request that a hole inside holds goes there, and the end is kept
    # for what nothing else holds. Taking the end (an exact fit by size) would make the
    # 8 MiB request grow the segment by 8 MiB instead of 4.
    engine = make_engine(budget="64MiB", expandable=True)
    a = engine.alloc(6 * MiB)
    b = engine.alloc(2 * MiB)             # keeps the hole and the end apart
    c = engine.alloc(4 * MiB)
    engine.free(a)                        # a 6 MiB hole
    engine.free(c)                        # a 4 MiB free end; the segment maps 12 MiB
    d = engine.alloc(4 * MiB)
    assert d == a
    e = engine.alloc(8 * MiB)             # the end and 4 MiB more
    assert e == c
    assert engine.stats()["reserved_bytes.all.current"] == 16 * MiB
    engine.check_invariants()
    for ptr in (b, d, e):
        engine.free(ptr)


def test_max_split_size_does_not_apply_in_an_expandable_segment(make_engine):
    engine = make_engine(budget="128MiB", expandable=True, max_split_size="32MiB")
    a = engine.alloc(40 * MiB)
    engine.free(a)
    b = engine.alloc(10 * MiB)           # carved from the 40 MiB free block, nothing released
    assert b == a
    stats = engine.stats()
    assert stats["num_alloc_retries"] == 0 and stats["reserved_bytes.all.current"] == 40 * MiB
    engine.free(b)


def test_a_tail_another_stream_may_still_use_is_not_built_on(make_engine):
    engine = make_engine(budget="64MiB", expandable=True)
    side = engine.create_stream()
    a = engine.alloc(4 * MiB)
    b = engine.alloc(4 * MiB, side)
    engine.free(b)                        # free, but the side stream may still use it
    c = engine.alloc(4 * MiB)             # stream 0: a fresh 4 MiB after it
    assert c == b + 4 * MiB
    seg = segment_of(engine, c)
    assert seg["total_size"] == 12 * MiB
    engine.check_invariants()
    for ptr in (a, c):
        engine.free(ptr)
    engine.synchronize()
    engine.destroy_stream(side)


def test_release_gives_back_the_free_end_and_then_the_whole_segment(make_engine):
    engine = make_engine(budget="64MiB", expandable=True)
    a = engine.alloc(5 * MiB)             # 5 MiB of a 6 MiB first growth
    write_pattern(a, 5 * MiB, 1)
    b = engine.alloc(20 * MiB)
    engine.free(b)
    engine.empty_cache()
    # The free chunks at the end are unmapped; the half chunk after `a` stays with it.
    assert large_segments(engine)[0]["total_size"] == 6 * MiB
    stats = engine.stats()
    assert stats["num_segment_trims"] == 1
    assert stats["reserved_bytes.all.current"] == 6 * MiB
    assert_pattern(a, 5 * MiB, 1)
    again = engine.alloc(8 * MiB)         # grows again where it shrank
    assert again == a + 5 * MiB
    write_pattern(again, 8 * MiB, 2)
    assert_pattern(a, 5 * MiB, 1)
    engine.free(again)
    engine.free(a)
    engine.empty_cache()
    assert large_segments(engine) == []
    assert engine.stats()["reserved_bytes.all.current"] == 0
    c = engine.alloc(4 * MiB)             # a new segment, as after any release
    assert large_segments(engine)[0]["total_size"] == 4 * MiB
    engine.free(c)


def test_the_release_rung_trims_the_large_pool_for_the_small_one(make_engine):
    # The budget is spent on the large pool; its free end is what a small segment needs.
    engine = make_engine(budget="20MiB", expandable=True)
    a = engine.alloc(10 * MiB)
    b = engine.alloc(10 * MiB)
    engine.free(b)
    small = engine.alloc(4096)
    assert segment_of(engine, small)["segment_type"] == "small"
    assert engine.stats()["num_segment_trims"] == 1
    engine.free(small)
    engine.free(a)


def test_stitched_ranges_hold_data_of_expandable_pieces(make_engine):
    engine = make_engine(budget="40MiB", expandable=True)
    blocks = [engine.alloc(4 * MiB) for _ in range(10)]
    for i, ptr in enumerate(blocks):
        write_pattern(ptr, 4 * MiB, i)
    assert len(large_segments(engine)) == 1
    for ptr in blocks[1::2]:
        engine.free(ptr)                  # 20 MiB free, in 4 MiB holes
    big = engine.alloc(12 * MiB)
    assert engine.stats()["num_stitches"] == 1
    write_pattern(big, 12 * MiB, 99)
    offset = 0
    for address, size in engine.snapshot()["stitched"][0]["pieces"]:
        assert ctypes.string_at(address, size) == ctypes.string_at(big + offset, size)
        offset += size
    for i, ptr in enumerate(blocks[0::2]):
        assert_pattern(ptr, 4 * MiB, 2 * i)
    engine.check_invariants()
    engine.free(big)
    for ptr in blocks[0::2]:
        engine.free(ptr)


def test_a_budget_raised_past_the_reservation_starts_another_segment(make_engine):
    engine = make_engine(budget="16MiB", expandable=True)
    a = engine.alloc(16 * MiB)
    assert large_segments(engine)[0]["reserved_address_space"] == 16 * MiB
    engine.set_budget(64 << 20)
    b = engine.alloc(8 * MiB)
    segs = large_segments(engine)
    assert len(segs) == 2 and all(s["expandable"] for s in segs)
    c = engine.alloc(8 * MiB)             # the new one is the one that grows
    assert c == b + 8 * MiB
    engine.check_invariants()
    for ptr in (a, b, c):
        engine.free(ptr)
    engine.empty_cache()
    assert engine.stats()["reserved_bytes.all.current"] == 0


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_patterns_with_expandable_segments(name):
    for seed in range(3):
        result = replay(PATTERNS[name](seed=seed), {"expandable": "true"}, check_every=10)
        assert result.covered_failures == 0, (name, seed)


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["recompute", "hybrid"])
def test_training_with_expandable_segments_under_a_policy_is_bit_identical(policy):
    free = train("cnn", "2GiB", steps=4)
    tight = train("cnn", int(0.5 * free["peak"]), steps=4, policy=policy, expandable=True)
    assert tight["record"] == free["record"]
    assert tight["evictions"] > 0 and tight["num_ooms"] == 0
