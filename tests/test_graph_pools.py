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
