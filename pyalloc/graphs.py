"""CUDA graphs under ``pyalloc.install()``: graph-private pools, as PyTorch's allocator keeps them.

A captured graph replays into the addresses it was captured with, those of the
intermediates it freed during capture too, so that memory must stay the graph's until the
graph goes. PyTorch asks its allocator for this through ``beginAllocateToPool``,
``endAllocateToPool`` and ``releasePool``, which ``CUDAPluggableAllocator`` turns into no-ops
unless hooks are set from C++. pyalloc does it from here instead, where PyTorch's Python
enters those calls, and routes them to the engine's graph pools (Note [Graph pools] in
allocator/src/block.h):

* ``torch.cuda.CUDAGraph.capture_begin``/``capture_end``: a capture's requests (on the
  capture stream and every stream being captured) go to the graph's pool; the pool is held
  until the graph is reset or collected.
* ``torch._C._cuda_beginAllocateCurrentThreadToPool`` / ``_cuda_beginAllocateToPool`` /
  ``_cuda_endAllocateToPool`` / ``_cuda_releasePool``: cudagraph trees'
  (``torch.compile(mode="reduce-overhead")``) warm-up runs.
* ``torch._C._cuda_checkPoolLiveAllocations``: cudagraph trees' check of a pool's live
  blocks, answered from the engine.
* ``torch._C._cuda_getCheckpointState`` answers with the pool's live blocks; rewinding a
  pool to such a state (``_cuda_setCheckpointPoolState``, when cudagraph trees start a new
  path of their tree) is not supported and raises saying what to do instead.
* ``torch.cuda.MemPool()`` cannot be built under any pluggable allocator (PyTorch raises
  from C++); it raises here with what to do instead.

Pools are counted as PyTorch counts them: every begin (a capture, a warm-up) holds the
pool once, every release (a graph reset or collected, ``_cuda_releasePool``) lets go once;
when nothing holds it, the engine is told its graphs are gone.
"""
from __future__ import annotations

import functools
import threading
import weakref
from typing import Any, Callable, Dict, Set, Tuple

import torch

from . import state
from .engine import Engine

_lock = threading.Lock()
_ids: Dict[Tuple[int, int], int] = {}   # PyTorch's MempoolId_t -> the engine's pool number
_holds: Dict[int, int] = {}             # pool number -> begins not yet released
_patched: Set[str] = set()   # "owner.name" of what enable() replaced (it runs once)
_RECREATE_HINT = (
    "compile with mode=\"max-autotune-no-cudagraphs\" (or torch.compile's default) instead "
    "of \"reduce-overhead\", or keep one compiled function per tree (no switching between "
    "training and evaluation on the same compiled module)")


def _engine(device: Any) -> Engine:
    if isinstance(device, torch.device):
        device = device.index
    return state.engine(None if device is None else int(device))


def _number(pool: Any) -> int:
    key = (int(pool[0]), int(pool[1]))
    with _lock:
        if key not in _ids:
            _ids[key] = len(_ids) + 1
        return _ids[key]


def _hold(number: int) -> None:
    with _lock:
        _holds[number] = _holds.get(number, 0) + 1


def _let_go(device: Any, number: int) -> None:
    with _lock:
        left = _holds.get(number, 0) - 1
        if left > 0:
            _holds[number] = left
            return
        _holds.pop(number, None)
    _engine(device).release_graph_pool(number)


def _capture_begin(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def capture_begin(graph: Any, pool: Any = None, *args: Any, **kwargs: Any) -> Any:
        # The pool must be known before the capture starts (graph.pool() answers only after
        # it ended): a capture without one gets a fresh handle, as PyTorch would make.
        if pool is None:
            pool = torch.cuda.graph_pool_handle()
        out = original(graph, pool, *args, **kwargs)
        number = _number(pool)
        device = torch.cuda.current_device()
        _hold(number)
        _engine(device).route_to_graph_pool(number, torch.cuda.current_stream().cuda_stream,
                                            kind=Engine.ROUTE_CAPTURE)
        graph.__pyalloc_pool__ = (device, number)
        return out

    return capture_begin


def _capture_end(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def capture_end(graph: Any) -> Any:
        try:
            return original(graph)
        finally:
            device, number = graph.__pyalloc_pool__
            _engine(device).end_graph_pool_routes(number)
            # The graph holds its pool until it is reset or collected.
            graph.__pyalloc_release__ = weakref.finalize(graph, _let_go, device, number)

    return capture_end


def _reset(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def reset(graph: Any) -> Any:
        out = original(graph)
        release = getattr(graph, "__pyalloc_release__", None)
        if release is not None:
            release()   # a finalizer runs once: collecting the graph later does nothing
        return out

    return reset


def _begin_thread(device: Any, pool: Any) -> None:
    number = _number(pool)
    _hold(number)
    _engine(device).route_to_graph_pool(number, 0, kind=Engine.ROUTE_THREAD)


def _end(device: Any, pool: Any) -> None:
    _engine(device).end_graph_pool_routes(_number(pool))


def _release(device: Any, pool: Any) -> None:
    _let_go(device, _number(pool))


def _check_live(device: Any, pool: Any, live: Any) -> bool:
    return set(_engine(device).graph_pool_blocks(_number(pool))) == {int(p) for p in live}


def _checkpoint_state(device: Any, pool: Any) -> Tuple[int, frozenset]:
    number = _number(pool)
    return number, frozenset(_engine(device).graph_pool_blocks(number))


def _set_checkpoint_state(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError(
        "pyalloc: cudagraph trees asked to rewind a graph pool to an earlier state (a new "
        "path in its tree: another function, another mode, or outputs of an earlier replay "
        "still alive), which pyalloc does not support yet. " + _RECREATE_HINT + ".")


def _mem_pool_init(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            original(self, *args, **kwargs)
        except RuntimeError as exc:
            if "pluggable" not in str(exc):
                raise
            raise RuntimeError(
                "pyalloc: torch.cuda.MemPool cannot be created under pyalloc.install(): "
                "PyTorch builds it only on its own caching allocator "
                f"({str(exc).splitlines()[0]}). CUDA graphs and torch.compile's "
                "\"reduce-overhead\" get their private pools from pyalloc without it.") from None

    return __init__


def _patch(owner: Any, name: str, replacement: Callable[..., Any]) -> None:
    if not hasattr(owner, name):
        return  # an older or newer torch without it
    key = f"{getattr(owner, '__name__', owner)}.{name}"
    if key in _patched:
        return
    _patched.add(key)
    setattr(owner, name, replacement)


def enable() -> None:
    """Routes PyTorch's graph-pool calls to the installed engine (install(device="cuda")
    calls it; idempotent)."""
    graph = torch.cuda.CUDAGraph
    _patch(graph, "capture_begin", _capture_begin(graph.capture_begin))
    _patch(graph, "capture_end", _capture_end(graph.capture_end))
    _patch(graph, "reset", _reset(graph.reset))
    _patch(torch._C, "_cuda_beginAllocateCurrentThreadToPool", _begin_thread)
    _patch(torch._C, "_cuda_beginAllocateToPool", _begin_thread)
    _patch(torch._C, "_cuda_endAllocateToPool", _end)
    _patch(torch._C, "_cuda_releasePool", _release)
    _patch(torch._C, "_cuda_checkPoolLiveAllocations", _check_live)
    _patch(torch._C, "_cuda_getCheckpointState", _checkpoint_state)
    _patch(torch._C, "_cuda_setCheckpointPoolState", _set_checkpoint_state)
    mem_pool = getattr(torch.cuda, "MemPool", None)
    if mem_pool is not None and "__init__" in vars(mem_pool):
        _patch(mem_pool, "__init__", _mem_pool_init(mem_pool.__init__))
    # torch.cuda.memory imported the thread-pool calls by name (use_mem_pool uses them).
    memory = torch.cuda.memory
    for name in ("_cuda_beginAllocateCurrentThreadToPool", "_cuda_endAllocateToPool",
                 "_cuda_releasePool"):
        if hasattr(memory, name):
            _patch(memory, name, getattr(torch._C, name))
