"""Multi-threaded stress tests of the engine.

* The native loop (``Engine.stress`` → ``pyalloc_stress``): 8 threads share one engine,
  allocating log-uniform sizes on four streams (with record_stream, empty_cache and flips
  of the lifetime phase mixed in), pattern-checking every block before freeing it and checking invariants every
  ``check_every`` operations. Run on a budget-constrained engine, where the OOM, fence and
  release rungs all fire (asserted through the counters), and on a roomy one.
* The same kind of workload from 8 Python threads through the ctypes API (ctypes releases
  the GIL during each call, so the engine sees real concurrency), with a thread that keeps
  reading stats, snapshots and invariants and emptying the cache meanwhile. Unlike the
  native loop, blocks are also written by side streams as they are freed (fill_async +
  record_stream), so memory reused before those writes land reads wrong.

Size: ``--stress-ops N`` (default 200000, a few seconds); ``--stress-ops 1000000`` is the
long run. The Python-threads test scales with it at 1/50 of the operations.
"""
from __future__ import annotations

import random
import threading

import pytest

from conftest import run_program
from memory_patterns import KiB, MiB, pattern_mismatch, write_pattern
from pyalloc import OutOfMemoryError

THREADS = 8


@pytest.mark.slow
def test_native_stress_under_a_tight_budget(make_engine, stress_ops):
    engine = make_engine(budget="64MiB", sim_capacity="128MiB")
    engine.stress(threads=THREADS, ops=stress_ops, seed=1, max_size=16 * MiB,
                  check_every=997)
    stats = engine.stats()
    assert stats["reserved_bytes.all.peak"] <= 64 * MiB
    if stress_ops >= 100_000:  # long enough for every rung to have fired
        assert stats["num_ooms"] > 0
        assert stats["num_stream_fences"] > 0
        assert stats["num_alloc_retries"] > 0
    assert stats["allocation.all.current"] == 0 and stats["active.all.current"] == 0


def test_native_stress_with_room_to_spare(make_engine, stress_ops):
    engine = make_engine(budget="6GiB", sim_capacity="8GiB")
    engine.stress(threads=THREADS, ops=stress_ops, seed=2, max_size=16 * MiB,
                  check_every=997)
    stats = engine.stats()
    assert stats["num_ooms"] == 0
    assert stats["allocation.all.allocated"] > stress_ops // 4
    assert stats["allocation.all.current"] == 0 and stats["active.all.current"] == 0


def test_native_stress_small_blocks_and_max_split_size(make_engine, stress_ops):
    # Small sizes crowd the small pool's free sets; max_split_size (above the 20 MiB
    # segment size) exercises the oversize paths in the large pool.
    engine = make_engine(budget="256MiB", sim_capacity="512MiB", max_split_size="24MiB")
    engine.stress(threads=THREADS, ops=stress_ops // 2, seed=3, max_size=64 * KiB,
                  check_every=997)
    engine.stress(threads=THREADS, ops=stress_ops // 4, seed=4, max_size=48 * MiB,
                  check_every=997)
    stats = engine.stats()
    assert stats["oversize_allocations.allocated"] > 0
    assert stats["allocation.all.current"] == 0


@pytest.mark.slow
def test_stress_with_the_check_invariants_option():
    """With check_invariants:true the engine checks itself after every operation and
    aborts on a violation, so this runs in its own process."""
    run_program("stress_check_invariants")


def test_python_threads_through_the_ctypes_api(make_engine, stress_ops):
    engine = make_engine(budget="96MiB", sim_capacity="128MiB")
    streams = [0] + [engine.create_stream() for _ in range(3)]
    engine.set_stream_delay(streams[1], 300)  # one slow side stream
    ops_per_thread = max(500, stress_ops // 50 // THREADS)
    failures: list = []
    ooms = [0] * THREADS
    stop = threading.Event()

    def worker(index: int) -> None:
        rng = random.Random(index)
        live = []
        tag = index << 40
        try:
            for _ in range(ops_per_thread):
                if live and (len(live) >= 24 or rng.random() < 0.45):
                    ptr, size, t, stream = live.pop(rng.randrange(len(live)))
                    problem = pattern_mismatch(ptr, size, t)
                    if problem:
                        failures.append(problem)
                        engine.free(ptr, size)
                        return
                    if rng.random() < 0.2:
                        # A side stream writes the block as it is dropped: whoever gets
                        # this memory next must not see that write land.
                        side = streams[1 + (streams.index(stream) % 3)]
                        engine.record_stream(ptr, side)
                        engine.fill_async(side, ptr, size, 0xEE)
                    engine.free(ptr, size)
                    continue
                size = int(2 ** rng.uniform(0, 24))  # 1 B .. 16 MiB, log-uniform
                stream = rng.choice(streams)
                try:
                    ptr = engine.alloc(size, stream)
                except OutOfMemoryError as error:
                    assert "out of memory" in str(error)
                    ooms[index] += 1
                    continue
                tag += 1
                write_pattern(ptr, size, tag)
                live.append((ptr, size, tag, stream))
                if rng.random() < 0.05:
                    engine.record_stream(ptr, rng.choice(streams))
        except Exception as error:  # reported below, with the thread's index
            failures.append(f"thread {index}: {error!r}")
        finally:
            for ptr, size, t, _ in live:
                problem = pattern_mismatch(ptr, size, t)
                if problem:
                    failures.append(problem)
                engine.free(ptr, size)

    def observer() -> None:
        try:
            while not stop.is_set():
                engine.check_invariants()
                stats = engine.stats()
                assert stats["reserved_bytes.all.current"] <= 96 * MiB
                engine.snapshot()
                engine.empty_cache()
        except Exception as error:
            failures.append(f"observer: {error!r}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
    watcher = threading.Thread(target=observer)
    watcher.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    watcher.join()
    assert not failures, failures[:5]

    engine.synchronize()
    engine.empty_cache()
    engine.check_invariants()
    stats = engine.stats()
    assert stats["allocation.all.current"] == 0 and stats["active.all.current"] == 0
    assert stats["num_ooms"] == sum(ooms)
    assert stats["allocation.all.allocated"] > THREADS * ops_per_thread // 3
    for s in streams[1:]:
        engine.destroy_stream(s)
