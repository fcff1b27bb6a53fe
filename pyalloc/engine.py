"""A handle on one allocator engine, for tests, tools and replay.

Training code does not need this: :func:`pyalloc.install` sets up the process-wide
engines PyTorch allocates through. An :class:`Engine` is a separate instance with its own
options, for example the simulated device with a small budget inside a test.
"""
from __future__ import annotations

import contextlib
import ctypes
import json
import logging
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from . import _lib
from .errors import HostPoolFullError, OutOfMemoryError, PyallocError, SwapCopyError
from .options import Budget, build_options

_SIZE_MAX = (1 << 64) - 1
_OOM = 2  # PYALLOC_OOM in csrc/pyalloc_c.h
_HOST_FULL = 3  # PYALLOC_HOST_FULL
_COPY_FAILED = 4  # PYALLOC_COPY_FAILED


def _pointer(ptr: object) -> int:
    if ptr is None:
        return 0  # the engine answers a NULL free with its own message
    if not isinstance(ptr, int) or isinstance(ptr, bool):
        raise TypeError(f"ptr must be an int address, not {type(ptr).__name__}")
    if not 0 <= ptr < 2**64:
        raise ValueError(f"ptr {ptr} is not a valid address")
    return ptr


def _byte_count(name: str, value: object, minimum: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int number of bytes, not {type(value).__name__}")
    if not minimum <= value < _SIZE_MAX:
        raise ValueError(f"{name} must be in [{minimum}, 2**64 - 1), got {value}")
    return value


def _check(rc: int) -> None:
    if rc == _OOM:
        raise OutOfMemoryError(_lib.last_error())
    if rc == _HOST_FULL:
        raise HostPoolFullError(_lib.last_error())
    if rc == _COPY_FAILED:
        raise SwapCopyError(_lib.last_error())
    if rc != 0:
        raise PyallocError(_lib.last_error())


@contextlib.contextmanager
def evictable_allocations() -> Iterator[None]:
    """Allocations on this thread inside the block are storages a registry can evict.

    Under an evict callback (and option ``evictable_placement``) small ones go to small
    segments of their own, so evicting them frees whole segments (Note [Evictable
    placement] in allocator/src/pool.h). pyalloc's registry does this itself around every
    op whose outputs it records and every replay; this is for other registries and tests.
    """
    was = _lib.lib().pyalloc_set_thread_evictable(1)
    try:
        yield
    finally:
        _lib.lib().pyalloc_set_thread_evictable(was)


class Engine:
    """An allocator engine on ``backend`` ("host" is the simulated device, or "cuda").

    Parameters
    ----------
    backend : str
        ``"host"`` or ``"cuda"``.
    device : int
        Device index (always 0 on the simulated device).
    budget : int, float or str, optional
        Hard cap on reserved bytes; see :func:`pyalloc.install`.
    **options
        Any option of :func:`pyalloc.options_table`. ``PYALLOC_CONF`` is ignored here:
        an engine made for a test should not change with the environment.
    """

    def __init__(self, backend: str = "host", device: int = 0, budget: Budget = None,
                 **options: Any) -> None:
        text = build_options(budget, options, environ={})
        handle = _lib.lib().pyalloc_engine_create(backend.encode(), device, text.encode())
        if not handle:
            raise PyallocError(_lib.last_error())
        self._handle: Optional[int] = handle
        self._owned = True

    @classmethod
    def _wrap(cls, handle: int) -> "Engine":
        engine = cls.__new__(cls)
        engine._handle = handle
        engine._owned = False  # the installed engines live as long as the process
        return engine

    @property
    def handle(self) -> int:
        if self._handle is None:
            raise PyallocError("this engine was closed")
        return self._handle

    # --- allocation ---------------------------------------------------------------------
    def alloc(self, size: int, stream: int = 0) -> int:
        """Allocates ``size`` bytes usable on ``stream``; returns the address."""
        if not isinstance(size, int) or isinstance(size, bool) or size < 0 or size > _SIZE_MAX:
            raise ValueError(f"size must be an int in [0, 2**64), got {size!r}")
        out = ctypes.c_void_p()
        _check(_lib.lib().pyalloc_engine_alloc(self.handle, size, stream, ctypes.byref(out)))
        return out.value

    def free(self, ptr: int, size: Optional[int] = None) -> None:
        """Frees ``ptr``; ``size``, if given, must be the size it was allocated with."""
        expected = _SIZE_MAX if size is None else _byte_count("size", size)
        _check(_lib.lib().pyalloc_engine_free(self.handle, _pointer(ptr), expected))

    def record_stream(self, ptr: int, stream: int) -> None:
        """``ptr`` is also used on ``stream``: don't reuse it until that work is done."""
        _check(_lib.lib().pyalloc_engine_record_stream(self.handle, _pointer(ptr), stream))

    def empty_cache(self) -> None:
        _check(_lib.lib().pyalloc_engine_empty_cache(self.handle))

    # --- CUDA graph pools (Note [Graph pools] in allocator/src/block.h; pyalloc/graphs.py) ---
    ROUTE_STREAM, ROUTE_CAPTURE, ROUTE_THREAD = 0, 1, 2

    def route_to_graph_pool(self, pool: int, stream: int = 0, kind: int = ROUTE_STREAM) -> None:
        """From now on the requests ``kind`` picks go to graph pool ``pool`` (>= 1):
        ROUTE_STREAM, those on ``stream``; ROUTE_CAPTURE, those on ``stream`` and on every
        stream a CUDA graph capture is recording; ROUTE_THREAD, the calling thread's. Memory
        a pool's requests got stays the pool's when freed: only its own requests reuse it."""
        _check(_lib.lib().pyalloc_engine_route_to_graph_pool(self.handle, pool, stream, kind))

    def end_graph_pool_routes(self, pool: int) -> None:
        """Stops every route to ``pool``; its memory stays the pool's."""
        _check(_lib.lib().pyalloc_engine_end_graph_pool_routes(self.handle, pool))

    def release_graph_pool(self, pool: int) -> None:
        """The pool's graphs are gone: its free memory joins the cache at the next
        device-wide synchronization (:meth:`empty_cache`, or when a request needs it), and
        its live blocks once freed."""
        _check(_lib.lib().pyalloc_engine_release_graph_pool(self.handle, pool))

    def graph_pool_blocks(self, pool: int) -> List[int]:
        """Addresses of the pool's live blocks."""
        lib = _lib.lib()
        for _ in range(4):  # the pool may grow between the two calls
            n = lib.pyalloc_engine_graph_pool_blocks(self.handle, pool, None, 0)
            out = (ctypes.c_size_t * max(n, 1))()
            got = lib.pyalloc_engine_graph_pool_blocks(self.handle, pool, out, n)
            if got <= n:
                return list(out[:got])
        raise RuntimeError("pyalloc: graph_pool_blocks: the pool kept growing")

    def set_budget(self, nbytes: int) -> None:
        _check(_lib.lib().pyalloc_engine_set_budget(self.handle, _byte_count("budget", nbytes, 1)))

    def set_memory_fraction(self, fraction: float) -> None:
        _check(_lib.lib().pyalloc_engine_set_memory_fraction(self.handle, fraction))

    def set_long_lived(self, long_lived: bool) -> None:
        """Whether this engine's requests from now on are expected to live long (option
        ``lifetime_classes``; :mod:`pyalloc.lifetime` sets it for installed engines)."""
        _check(_lib.lib().pyalloc_engine_set_long_lived(self.handle, int(bool(long_lived))))

    # --- streams (simulated device: worker threads) -----------------------------------
    def create_stream(self) -> int:
        out = ctypes.c_size_t()
        _check(_lib.lib().pyalloc_engine_stream_create(self.handle, ctypes.byref(out)))
        return out.value

    def destroy_stream(self, stream: int) -> None:
        _check(_lib.lib().pyalloc_engine_stream_destroy(self.handle, stream))

    def synchronize(self) -> None:
        _check(_lib.lib().pyalloc_engine_synchronize(self.handle))

    def fill_async(self, stream: int, ptr: int, nbytes: int, value: int) -> None:
        """Simulated device: enqueue ``memset(ptr, value, nbytes)`` on ``stream``."""
        _check(_lib.lib().pyalloc_sim_fill_async(self.handle, stream, ptr, nbytes, value))

    def set_stream_delay(self, stream: int, microseconds: int) -> None:
        """Simulated device: every task on ``stream`` first sleeps this long."""
        _check(_lib.lib().pyalloc_sim_set_stream_delay(self.handle, stream, microseconds))

    def fail_copies(self, count: int) -> None:
        """Simulated device: the next ``count`` async copies fail to start (fault tests)."""
        _check(_lib.lib().pyalloc_sim_fail_copies(self.handle, _byte_count("count", count)))

    def fail_host_commits(self, count: int) -> None:
        """Simulated device: the next ``count`` growths of a host pool made at first use
        fail, as pinning more host memory can on CUDA (fault tests)."""
        _check(_lib.lib().pyalloc_sim_fail_host_commits(self.handle,
                                                        _byte_count("count", count)))

    # --- swap (allocator/src/swap.h; used by the tensor registry) ----------------------
    def set_host_pool(self, nbytes: int, at_first_use: bool = False) -> None:
        """Allocates the host pool for swapped-out copies, once (pinned on CUDA). Later
        calls keep the existing pool. ``at_first_use``: allocate it at the first swap-out
        instead (its failure then refuses that swap-out and every later one)."""
        entry = (_lib.lib().pyalloc_engine_defer_host_pool if at_first_use
                 else _lib.lib().pyalloc_engine_set_host_pool)
        _check(entry(self.handle, _byte_count("host pool", nbytes, 1)))

    def swap_out(self, ptr: int, nbytes: int, stream: int = 0) -> int:
        """Starts copying ``nbytes`` at ``ptr`` to a new host slot after the work enqueued on
        ``stream`` so far; returns the slot. ``ptr`` may be freed at once: the engine reuses
        it only after the copy. Raises HostPoolFullError or SwapCopyError."""
        slot = ctypes.c_uint64()
        _check(_lib.lib().pyalloc_engine_swap_out(self.handle, _pointer(ptr),
                                                  _byte_count("nbytes", nbytes), stream,
                                                  ctypes.byref(slot)))
        return slot.value

    def swap_in(self, slot: int, ptr: int, stream: int = 0) -> None:
        """Starts copying ``slot`` back into the block at ``ptr``; see :meth:`swap_wait`."""
        _check(_lib.lib().pyalloc_engine_swap_in(self.handle, slot, _pointer(ptr), stream))

    def swap_wait(self, slot: int, stream: int = 0) -> None:
        """Work enqueued on ``stream`` from now on waits for ``slot``'s swap-in (on the
        simulated device's stream 0, this call waits)."""
        _check(_lib.lib().pyalloc_engine_swap_wait(self.handle, slot, stream))

    def swap_ready(self, slot: int) -> bool:
        """Whether ``slot``'s copies have completed."""
        return _lib.lib().pyalloc_engine_swap_ready(self.handle, slot) == 1

    def swap_release(self, slot: int) -> None:
        """Gives ``slot``'s host memory back (once its copies are done)."""
        _check(_lib.lib().pyalloc_engine_swap_release(self.handle, slot))

    def swap_stream(self, to_host: bool) -> int:
        """The engine's device-to-host (``to_host``) or host-to-device copy stream."""
        out = ctypes.c_size_t()
        _check(_lib.lib().pyalloc_engine_swap_stream(self.handle, int(bool(to_host)),
                                                     ctypes.byref(out)))
        return out.value

    def blocked_ns(self) -> int:
        """Nanoseconds callers have spent blocked on other streams' work (copies)."""
        return _lib.lib().pyalloc_engine_blocked_ns(self.handle)

    def unallocated(self) -> int:
        """budget - allocated bytes: what can be allocated without evicting."""
        out = ctypes.c_uint64()
        _check(_lib.lib().pyalloc_engine_unallocated(self.handle, ctypes.byref(out)))
        return out.value

    # --- introspection ------------------------------------------------------------------
    def stats(self) -> Dict[str, Any]:
        """The flat stats dict; keys are defined in docs/stats.md."""
        return json.loads(_lib.take_string(_lib.lib().pyalloc_engine_stats_json(self.handle)))

    def snapshot(self) -> Dict[str, Any]:
        """Segments and their blocks, in address order."""
        return json.loads(_lib.take_string(_lib.lib().pyalloc_engine_snapshot_json(self.handle)))

    def last_oom_snapshot(self) -> Optional[Dict[str, Any]]:
        """The snapshot taken when the last out-of-memory error was raised, with ``"oom"``:
        the request's ``size`` and ``rounded`` bytes, its ``stream`` and the error's
        ``report``; None if there has been none. By the time the error reaches Python, the
        failed op's other temporaries are freed: this is the layout that failed."""
        text = _lib.take_string(_lib.lib().pyalloc_engine_last_oom_json(self.handle))
        return json.loads(text) if text else None

    @property
    def options_string(self) -> str:
        """The options this engine runs with, normalized: ``"budget:...,sim_capacity:..."``."""
        return _lib.take_string(_lib.lib().pyalloc_engine_options(self.handle))

    def check_invariants(self) -> None:
        """Raises :class:`PyallocError` describing the first broken invariant."""
        _check(_lib.lib().pyalloc_engine_check_invariants(self.handle))

    def reset_peak_stats(self) -> None:
        _check(_lib.lib().pyalloc_engine_reset_peak_stats(self.handle))

    def reset_accumulated_stats(self) -> None:
        _check(_lib.lib().pyalloc_engine_reset_accumulated_stats(self.handle))

    # --- eviction (used by the tensor registry) --------------------------------------
    def set_evict_callback(self, callback: Optional[Callable[[List[int]], int]]) -> None:
        """``callback(handles) -> evicted`` is called (outside the engine's lock) with the
        handles of storages the engine wants evicted; it must free them and return how
        many it freed. ``None`` turns eviction off."""
        if callback is None:
            self._evict_fn = None
            _check(_lib.lib().pyalloc_engine_set_evict_callback(self.handle, None, None))
            return

        def trampoline(_context, handles, count):
            if count == 0:  # "let go of what nothing uses": a registry's call, none of ours
                return 0
            try:
                return int(callback([handles[i] for i in range(count)]))
            except BaseException:  # an exception cannot cross back into C++
                import logging
                logging.getLogger("pyalloc").exception("pyalloc: the eviction callback failed")
                return 0

        self._evict_fn = _lib.EVICT_CALLBACK(trampoline)  # kept alive with the engine
        fn = ctypes.cast(self._evict_fn, ctypes.c_void_p)
        _check(_lib.lib().pyalloc_engine_set_evict_callback(self.handle, fn, None))

    def set_compact_callbacks(
            self, movable: Optional[Callable[[], List[int]]],
            relocate: Optional[Callable[[List[Tuple[int, int]]], int]]) -> None:
        """Compaction (docs/design.md, "Compaction"): ``movable() -> addresses`` lists the
        blocks whose storages can be moved now; ``relocate([(from, to), ...]) -> moved``
        moves each into the block reserved at ``to`` (allocating it under
        :meth:`placement`). Both run outside the engine's lock. ``None``: compaction off."""
        if movable is None or relocate is None:
            self._compact_fns = None
            _check(_lib.lib().pyalloc_engine_set_compact_callbacks(self.handle, None, None, None))
            return
        log = logging.getLogger("pyalloc")

        def movable_trampoline(_context, out, capacity):
            try:
                addresses = movable()
                for i, address in enumerate(addresses[:capacity]):
                    out[i] = address
                return len(addresses)
            except BaseException:  # an exception cannot cross back into C++
                log.exception("pyalloc: the compaction callback (movable) failed")
                return 0

        def relocate_trampoline(_context, sources, destinations, count):
            try:
                return int(relocate([(sources[i], destinations[i]) for i in range(count)]))
            except BaseException:
                log.exception("pyalloc: the compaction callback (relocate) failed")
                return 0

        self._compact_fns = (_lib.MOVABLE_CALLBACK(movable_trampoline),
                             _lib.RELOCATE_CALLBACK(relocate_trampoline))  # kept alive here
        _check(_lib.lib().pyalloc_engine_set_compact_callbacks(
            self.handle, *(ctypes.cast(fn, ctypes.c_void_p) for fn in self._compact_fns), None))

    def compact(self, nbytes: int, stream: int = 0) -> int:
        """Runs compaction now, as if a request of ``nbytes`` on ``stream`` had found no
        free block: moves storages the registry can move out of the cheapest window that
        then holds it. For tests and tools (allocation runs it by itself when needed).
        Returns how many storages moved (0 if a free block holds ``nbytes`` already)."""
        moved = ctypes.c_size_t()
        _check(_lib.lib().pyalloc_engine_compact(
            self.handle, _byte_count("nbytes", nbytes, 1), stream, ctypes.byref(moved)))
        return moved.value

    @staticmethod
    @contextlib.contextmanager
    def placement(address: int) -> Iterator[None]:
        """The calling thread's next allocation inside the block is the compaction
        destination reserved at ``address``."""
        _lib.lib().pyalloc_set_thread_placement(_pointer(address))
        try:
            yield
        finally:
            _lib.lib().pyalloc_set_thread_placement(None)

    @staticmethod
    @contextlib.contextmanager
    def tentative() -> Iterator[None]:
        """The calling thread's allocations inside the block fail quietly when they cannot
        be served: an :class:`OutOfMemoryError` all the same, but not counted in
        ``num_ooms``, with no OOM report kept and no ``on_oom`` callback — for a caller that
        handles the failure itself (the registry settling a backward pass does)."""
        was = _lib.lib().pyalloc_set_thread_tentative(1)
        try:
            yield
        finally:
            _lib.lib().pyalloc_set_thread_tentative(was)

    def set_evictable(self, ptr: int, handle: int, cost: float = 1.0, *,
                      last_resort: bool = False) -> None:
        """Mark the block at ``ptr`` evictable as ``handle`` (0: not evictable) with the
        cost of bringing it back. ``last_resort``: chosen only once every other way to serve
        a request has failed (rung ``evict_last_resort``; Note [Last-resort victims] in
        allocator/src/block.h)."""
        mark = (_lib.lib().pyalloc_engine_set_last_resort_evictable if last_resort
                else _lib.lib().pyalloc_engine_set_evictable)
        _check(mark(self.handle, _pointer(ptr), handle, cost))

    def touch(self, ptr: int) -> None:
        """Record a use of the block at ``ptr`` (the staleness term of the heuristics)."""
        _check(_lib.lib().pyalloc_engine_touch(self.handle, _pointer(ptr)))

    def trace_start(self, capacity: int = 1 << 20) -> None:
        """Record the most recent ``capacity`` events (48 bytes each) until trace_stop()."""
        _check(_lib.lib().pyalloc_engine_trace_start(self.handle, capacity))

    def trace_drain(self) -> Dict[str, Any]:
        """``{"dropped_events": n, "events": [[t_ns, action, address, size, requested,
        stream, context], ...]}``, oldest first; recording continues."""
        return json.loads(_lib.take_string(_lib.lib().pyalloc_engine_trace_drain(self.handle)))

    def trace_stop(self) -> Dict[str, Any]:
        """Stops recording and returns what :meth:`trace_drain` would."""
        events = self.trace_drain()
        self.trace_start(0)
        return events

    def stress(self, threads: int = 8, ops: int = 100_000, seed: int = 0,
               max_size: int = 16 << 20, check_every: int = 0) -> None:
        """Runs the native multi-threaded stress loop; raises on the first failure."""
        _check(_lib.lib().pyalloc_stress(self.handle, threads, ops, seed, max_size, check_every))

    # --- lifetime -----------------------------------------------------------------------
    def close(self) -> None:
        """Releases the engine's memory. Fails while blocks are still allocated."""
        if self._handle is not None and self._owned:
            _check(_lib.lib().pyalloc_engine_destroy(self._handle))
        self._handle = None

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass  # still-live blocks: leak the engine rather than free memory in use
