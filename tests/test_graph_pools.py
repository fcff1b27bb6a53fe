"""Graph pools in the engine (Note [Graph pools] in allocator/src/block.h), on the simulated
device: what CUDA graphs and cudagraph trees rely on, tested below PyTorch.

* Memory a pool's requests got stays the pool's when freed: other requests never reuse it,
  the pool's own do; fences and empty_cache pass it by.
* Once the pool is released its free memory joins the cache at the next empty_cache, and a
  live block of it when freed.
* Routes by stream and by thread; bad arguments are refused with a message.
The GPU side (capture, replay, cudagraph trees) is tests/test_gpu.py's.
"""
from __future__ import annotations

import threading

import pytest

from memory_patterns import MiB
from pyalloc import Engine, OutOfMemoryError, PyallocError

POOL = 1


def reserved(engine) -> int:
    return engine.stats()["reserved_bytes.all.current"]


def test_a_pools_memory_serves_only_the_pool(make_engine):
    engine = make_engine()
    capture = engine.create_stream()
    engine.route_to_graph_pool(POOL, capture, Engine.ROUTE_STREAM)
    inner = engine.alloc(4 * MiB, capture)  # a graph's intermediate...
    engine.free(inner)                       # ...freed during capture
    again = engine.alloc(4 * MiB, capture)   # the pool reuses its own memory
    assert again == inner
    engine.free(again)
    engine.end_graph_pool_routes(POOL)
    # After the capture, nobody else gets it: not the capture stream, not another stream,
    # not after a fence or empty_cache.
    other = [engine.alloc(4 * MiB, capture), engine.alloc(4 * MiB, 0)]
    assert inner not in other
    engine.empty_cache()
    assert reserved(engine) >= 4 * MiB
    later = [engine.alloc(4 * MiB, 0) for _ in range(3)]
    assert inner not in later
    engine.check_invariants()
    for ptr in other + later:
        engine.free(ptr)
    engine.release_graph_pool(POOL)
    engine.empty_cache()
    assert reserved(engine) == 0


def test_released_pool_memory_joins_the_cache_at_the_next_empty_cache(make_engine):
    engine = make_engine(budget="8MiB")
    engine.route_to_graph_pool(POOL, 0, Engine.ROUTE_STREAM)
    output = engine.alloc(2 * MiB)           # a graph's output the program keeps
    scratch = engine.alloc(4 * MiB)
    engine.free(scratch)
    engine.end_graph_pool_routes(POOL)
    assert engine.graph_pool_blocks(POOL) == [output]
    with pytest.raises(OutOfMemoryError):
        engine.alloc(6 * MiB)                # the pool's 4 MiB are not the cache's
    engine.release_graph_pool(POOL)
    engine.empty_cache()
    big = engine.alloc(4 * MiB)              # now they are
    engine.free(big)
    engine.free(output)                      # a live block of a released pool
    engine.empty_cache()
    assert reserved(engine) == 0
    assert engine.graph_pool_blocks(POOL) == []
    engine.check_invariants()


def test_a_thread_route_picks_that_threads_requests_only(make_engine):
    engine = make_engine()
    got = {}

    def in_pool():
        engine.route_to_graph_pool(POOL, 0, Engine.ROUTE_THREAD)
        got["pool"] = engine.alloc(1 * MiB)
        engine.end_graph_pool_routes(POOL)

    thread = threading.Thread(target=in_pool)
    engine.route_to_graph_pool(2, 12345, Engine.ROUTE_STREAM)  # another pool, another stream
    thread.start()
    thread.join()
    outside = engine.alloc(1 * MiB)
    assert engine.graph_pool_blocks(POOL) == [got["pool"]]
    assert engine.graph_pool_blocks(2) == []
    assert outside not in engine.graph_pool_blocks(POOL)
    engine.end_graph_pool_routes(2)
    for ptr in (got["pool"], outside):
        engine.free(ptr)
    engine.release_graph_pool(POOL)
    engine.empty_cache()
    assert reserved(engine) == 0


def test_bad_graph_pool_arguments_are_refused_with_a_message(make_engine):
    engine = make_engine()
    with pytest.raises(PyallocError, match=r"graph pool id 0 must be in \[1, 2\^63\)"):
        engine.route_to_graph_pool(0, 0)
    with pytest.raises(PyallocError, match="route kind 7 must be 0 .stream., 1 .capture. or 2"):
        engine.route_to_graph_pool(POOL, 0, 7)
    engine.end_graph_pool_routes(99)   # nothing routed there: nothing to do
    engine.release_graph_pool(99)
    engine.empty_cache()


def test_pytorchs_pool_calls_route_through_pyalloc_graphs():
    # pyalloc/graphs.py's side, on the simulated device: the torch._C calls of cudagraph
    # trees and use_mem_pool, hold counting, the live-allocation check and the refusal to
    # rewind a pool. The capture side runs on a GPU (tests/test_gpu.py).
    from conftest import run_program

    assert run_program("graph_pool_routing").rstrip().endswith("ok")


# --- randomized: a pool's memory never serves anyone else ------------------------------

from hypothesis import HealthCheck, settings, strategies as st  # noqa: E402
from hypothesis.stateful import (  # noqa: E402
    Bundle, RuleBasedStateMachine, consumes, invariant, rule,
)

from memory_patterns import pattern_mismatch, write_pattern  # noqa: E402

_SIZES = st.one_of(st.integers(1, 1 << 20), st.integers(1 << 20, 12 << 20))


class GraphPoolMachine(RuleBasedStateMachine):
    """Allocations on a capture stream, routed to the current pool or not, frees, pools
    released and replaced, fences (requests on a second stream under a tight budget) and
    empty_cache, in any order. Model: every byte range a held pool's requests ever got.
    Checked: a request outside the pool never overlaps one of them, and they stay mapped;
    every live block keeps its contents; the engine's invariants hold; at the end
    everything comes back."""
    blocks = Bundle("blocks")

    def __init__(self) -> None:
        super().__init__()
        self.engine = Engine("host", budget="48MiB", sim_capacity="96MiB")
        self.capture = self.engine.create_stream()
        self.other = self.engine.create_stream()
        self.pool = 1
        self.routed = False
        self.pool_ranges: list = []   # (start, end) the held pool ever had
        self.live: dict = {}          # ptr -> (size, tag)
        self.tags = iter(range(1, 1 << 30))

    @rule(on=st.booleans())
    def route(self, on):
        if on and not self.routed:
            self.engine.route_to_graph_pool(self.pool, self.capture, Engine.ROUTE_STREAM)
        elif not on and self.routed:
            self.engine.end_graph_pool_routes(self.pool)
        self.routed = on

    @rule()
    def release_pool(self):
        self.engine.release_graph_pool(self.pool)
        self.engine.empty_cache()
        self.pool += 1
        self.pool_ranges = [r for r in self.pool_ranges if r[2] == self.pool]
        if self.routed:
            self.engine.route_to_graph_pool(self.pool, self.capture, Engine.ROUTE_STREAM)

    @rule(target=blocks, size=_SIZES, on_capture=st.booleans())
    def alloc(self, size, on_capture):
        stream = self.capture if on_capture else self.other
        try:
            ptr = self.engine.alloc(size, stream)
        except OutOfMemoryError:
            return None
        routed = self.routed and on_capture
        if routed:
            self.pool_ranges.append((ptr, ptr + size, self.pool))
        else:
            for start, end, _ in self.pool_ranges:
                assert ptr + size <= start or ptr >= end, \
                    f"a request outside pool {self.pool} got its memory at 0x{ptr:x}"
        tag = next(self.tags)
        write_pattern(ptr, size, tag)
        self.live[ptr] = (size, tag)
        return ptr

    @rule(ptr=consumes(blocks))
    def free(self, ptr):
        if ptr is None:
            return
        size, tag = self.live.pop(ptr)
        assert not pattern_mismatch(ptr, size, tag)
        self.engine.free(ptr, size)

    @rule()
    def empty_cache(self):
        self.engine.empty_cache()

    @invariant()
    def contents_and_invariants_hold(self):
        self.engine.check_invariants()
        # A held pool's memory stays mapped: its graphs replay into it.
        segments = [(seg["address"], seg["address"] + seg["total_size"])
                    for seg in self.engine.snapshot()["segments"]]
        for start, end, _ in self.pool_ranges:
            assert any(a <= start and end <= b for a, b in segments), \
                f"pool {self.pool}'s memory at 0x{start:x} was given back to the device"
        for ptr, (size, tag) in self.live.items():
            problem = pattern_mismatch(ptr, size, tag)
            assert not problem, problem

    def teardown(self):
        for ptr, (size, _) in list(self.live.items()):
            self.engine.free(ptr, size)
        self.engine.end_graph_pool_routes(self.pool)
        self.engine.release_graph_pool(self.pool)
        self.engine.empty_cache()
        assert self.engine.stats()["reserved_bytes.all.current"] == 0
        for stream in (self.capture, self.other):
            self.engine.destroy_stream(stream)
        self.engine.close()


GraphPoolMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestGraphPoolMachine = GraphPoolMachine.TestCase
