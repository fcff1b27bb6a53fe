"""Fragmentation: the randomized allocation patterns (pyalloc.patterns) replayed through the
engine, and the requirement VMM stitching must meet.

* The patterns are well formed (every free matches a live allocation, nothing is left
  live, a seed gives the same trace) and the engine stays consistent through them
  (invariants checked every 50 events).
* ``covered_failures`` counts what it claims: on the checkerboard with stitching off every
  failure is one the free memory would hold.
* With stitching (the default), no request fails while free memory in whole 2 MiB chunks
  would hold it, and the fragmenting patterns really needed it (best fit alone fails them).
* Stitched ranges hold data: writes through the range land in the pieces of the segments
  they were lent from, survive the range being unmapped, and nothing else is touched.
"""
from __future__ import annotations

import pytest

from conftest import run_in_subprocess
from pyalloc.patterns import PATTERNS, checkerboard
from pyalloc.replay import replay

FRAGMENTING = ["interleaved", "mixed_sizes", "checkerboard"]


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_patterns_are_well_formed_and_deterministic(name):
    trace = PATTERNS[name](seed=3)
    assert trace == PATTERNS[name](seed=3)
    assert trace != PATTERNS[name](seed=4) or name == "checkerboard"
    live = {}
    for _, action, ident, size, requested, _, _ in trace["events"]:
        if action == "alloc":
            assert ident not in live and size == requested > 0
            live[ident] = size
        else:
            assert live.pop(ident) == size
    assert not live
    assert trace["budget_bytes"] % (2 << 20) == 0
    assert trace["budget_bytes"] >= trace["peak_live_bytes"]


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_engine_stays_consistent_through_each_pattern(name):
    for seed in range(2):
        result = replay(PATTERNS[name](seed=seed), check_every=50)
        assert result.allocs + result.failures == sum(
            1 for e in PATTERNS[name](seed=seed)["events"] if e[1] == "alloc")
        assert 0 <= result.covered_failures <= result.failures
        assert 0 < result.utilization <= 1


def test_checkerboard_failures_are_all_covered_by_free_chunks():
    result = replay(checkerboard(), {"stitch": "false"})
    # 60 blocks of 4 MiB fill the budget; 30 are freed; 8 MiB requests find no hole.
    assert result.failures > 0
    assert result.covered_failures == result.failures


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_no_request_fails_while_free_chunks_would_hold_it(name):
    for seed in range(3):
        trace = PATTERNS[name](seed=seed)
        stitched = replay(trace, check_every=25)
        assert stitched.covered_failures == 0, (name, seed)
        if name in FRAGMENTING:
            best_fit = replay(trace, {"stitch": "false"})
            assert best_fit.covered_failures > 0, (name, seed)   # the pattern needs it
            assert stitched.num_stitches > 0


def punch_holes(engine, stream: int = 0) -> list:
    """Fills a 40 MiB budget with ten 4 MiB blocks (block i holds pattern i) and frees
    every other one: 20 MiB free, in 4 MiB holes. Returns all ten addresses."""
    from memory_patterns import write_pattern

    blocks = [engine.alloc(4 << 20, stream) for _ in range(10)]
    for i, ptr in enumerate(blocks):
        write_pattern(ptr, 4 << 20, i)
    for ptr in blocks[1::2]:
        engine.free(ptr)
    return blocks


def test_stitched_ranges_hold_data_across_map_and_unmap(make_engine):
    import ctypes

    from memory_patterns import assert_pattern, write_pattern

    engine = make_engine(budget="40MiB")
    blocks = punch_holes(engine)
    big = engine.alloc(12 << 20)                 # no hole holds it: stitched
    stats = engine.stats()
    assert stats["num_stitches"] == 1 and stats["num_stitched_bytes"] == 12 << 20
    assert stats["reserved_bytes.all.current"] <= 40 << 20
    engine.check_invariants()
    write_pattern(big, 12 << 20, 99)
    ranges = engine.snapshot()["stitched"]
    assert len(ranges) == 1 and ranges[0]["address"] == big
    pieces = ranges[0]["pieces"]
    assert sum(size for _, size in pieces) == 12 << 20
    offset = 0
    for address, size in pieces:               # the same pages, seen at home
        assert ctypes.string_at(address, size) == ctypes.string_at(big + offset, size)
        offset += size
    for i, ptr in enumerate(blocks[0::2]):     # the survivors were not touched
        assert_pattern(ptr, 4 << 20, 2 * i)
    engine.free(big)
    engine.check_invariants()
    assert engine.snapshot()["stitched"] == []
    # The pieces are free memory again, and still hold what was written through the range.
    again = [engine.alloc(4 << 20) for _ in range(3)]
    for ptr in again:
        write_pattern(ptr, 4 << 20, 7)
    for i, ptr in enumerate(blocks[0::2]):
        assert_pattern(ptr, 4 << 20, 2 * i)
    for ptr in again + blocks[0::2]:
        engine.free(ptr)


RELOCATE = """
import torch, pyalloc
pyalloc.install(device="cpu", budget="2GiB", evict_strategy="dtr")
engine = pyalloc._engine(None)
x = torch.randn(1024, 1024, requires_grad=True)         # 4 MiB
with pyalloc.recompute(min_bytes=0, host_pool={host_pool}) as reg:
    a = x * 2
    for _ in range(9):       # a chain too long to replay: recompute cannot evict it
        a.add_(1)
    view = a[100:200].t()
    want, want_view = a.detach().clone(), view.detach().clone()
    s = pyalloc.memory_stats()
    engine.set_budget(int(s["reserved_bytes.all.current"]))
    # More than the cached free bytes: it fits only if `a` leaves its place.
    request = int(s["reserved_bytes.all.current"] - s["allocated_bytes.all.current"]) + (1 << 20)
    try:
        big = torch.empty(request, dtype=torch.uint8)
        print("served")
        del big
    except torch.OutOfMemoryError:
        print("oom")
    print("moved", reg.stats().get("swap_outs", 0))
    old = a.data_ptr()
    print("intact", torch.equal(a, want) and torch.equal(view, want_view))
    engine.set_budget(2 << 30)
    pyalloc.check_invariants()
"""


def test_recompute_relocates_what_it_cannot_recompute_through_the_host_pool():
    # Compaction through host memory: under recompute with a host pool, a storage with no
    # lineage left is moved out of the way as a last resort (contents and views kept) and
    # comes back, wherever best fit puts it, on its next use. Without the pool: OOM.
    without = run_in_subprocess(RELOCATE.format(host_pool=None))
    assert "oom" in without and "moved 0" in without and "intact True" in without
    with_pool = run_in_subprocess(RELOCATE.format(host_pool=16 << 20))
    assert "served" in with_pool and "moved 1" in with_pool and "intact True" in with_pool


def test_a_freed_stitched_range_is_reused_on_its_stream_without_waiting(make_engine):
    import ctypes

    from memory_patterns import assert_pattern

    engine = make_engine(budget="40MiB")
    stream = engine.create_stream()
    blocks = punch_holes(engine, stream)
    big = engine.alloc(12 << 20, stream)
    assert engine.stats()["num_stitches"] == 1
    # Slow work still queued on the stream when the range is freed: the free must not wait
    # for it (the pieces are reusable on the same stream at once), and the range must not
    # be unmapped under it.
    engine.set_stream_delay(stream, 300_000)
    engine.fill_async(stream, big, 12 << 20, 0x5A)
    blocked = engine.blocked_ns()
    engine.free(big)
    stats = engine.stats()
    assert engine.blocked_ns() == blocked
    assert stats["retired_stitched_ranges"] == 1 and engine.snapshot()["stitched"] == []
    assert stats["allocated_bytes.all.current"] == 5 * (4 << 20)
    again = engine.alloc(12 << 20, stream)     # stitched again from the same pieces, no fence
    after = engine.stats()
    assert after["num_stitches"] == 2 and after["num_stream_fences"] == stats["num_stream_fences"]
    engine.fill_async(stream, again, 12 << 20, 0x33)
    engine.set_stream_delay(stream, 0)
    engine.synchronize()
    engine.check_invariants()
    # Stream order held: the second fill landed after the first, through the second range.
    assert ctypes.string_at(again, 12 << 20) == b"\x33" * (12 << 20)
    for i, ptr in enumerate(blocks[0::2]):   # the survivors were not touched
        assert_pattern(ptr, 4 << 20, 2 * i)
    engine.free(again)
    engine.synchronize()
    engine.empty_cache()                        # unmaps what is retired, then releases
    assert engine.stats()["retired_stitched_ranges"] == 0
    for ptr in blocks[0::2]:
        engine.free(ptr)



def test_a_stitched_range_another_stream_used_is_unmapped_only_after_that_stream():
    # Stream 0 is synchronous on the simulated device, but a side stream recorded on the
    # block is not: freeing must wait for it before unmapping, or its write lands on an
    # unmapped range (a crash, so this runs in its own process).
    out = run_in_subprocess("""
        import ctypes
        from pyalloc import Engine
        engine = Engine("host", budget="40MiB", sim_capacity="256MiB")
        side = engine.create_stream()
        blocks = [engine.alloc(4 << 20) for _ in range(10)]
        for ptr in blocks[1::2]:
            engine.free(ptr)
        big = engine.alloc(12 << 20)
        pieces = engine.snapshot()["stitched"][0]["pieces"]
        engine.record_stream(big, side)
        engine.set_stream_delay(side, 200_000)
        engine.fill_async(side, big, 12 << 20, 0xEE)
        blocked = engine.blocked_ns()
        engine.free(big)
        assert engine.blocked_ns() > blocked            # it waited for the side stream
        assert engine.stats()["retired_stitched_ranges"] == 0
        for address, size in pieces:                     # the write landed, in the pieces
            assert ctypes.string_at(address, size) == b"\\xee" * size
        for ptr in blocks[0::2]:
            engine.free(ptr)
        engine.check_invariants()
        print("ok")
    """)
    assert out.startswith("ok")


@pytest.mark.parametrize("first", [False, True])
def test_stitch_first_serves_from_free_chunks_before_growing(make_engine, first):
    # A budget with room to grow: by default a request no hole holds maps a new segment;
    # with stitch_first the free chunks are stitched instead, and segments grow by the
    # request's size, not 20 MiB.
    engine = make_engine(budget="100MiB", stitch_first=first)
    blocks = punch_holes(engine)
    segments = engine.stats()["num_device_alloc"]
    big = engine.alloc(12 << 20)
    stats = engine.stats()
    assert stats["num_stitches"] == (1 if first else 0)
    assert stats["num_device_alloc"] == segments + (0 if first else 1)
    engine.free(big)
    engine.check_invariants()
    for ptr in blocks[0::2]:
        engine.free(ptr)
    fresh = make_engine(budget="100MiB", stitch_first=first)
    ptr = fresh.alloc(6 << 20)
    assert fresh.stats()["reserved_bytes.all.current"] == (6 << 20 if first else 20 << 20)
    fresh.free(ptr)
