"""Recording traces and snapshots to files (formats in docs/formats.md).

``record_trace`` turns on the engine's event ring for a block of code and writes every
allocator event of the block, with the state before and after, to one file that
``pyalloc-stats`` reads and ``tools/replay.py`` replays.
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import Any, Dict, Iterator, List, Optional, Union

from . import _lib, files, state
from .memory import stats_of
from .engine import Engine
from .errors import PyallocError

# pyalloc's own frames are skipped when tagging an op with the user's line (torch's are
# added where torch is imported). The package folder itself, with its separator: its parent
# is site-packages, or the checkout of an editable install, where user code lives too.
_TORCH_DIRS = (os.path.dirname(os.path.abspath(__file__)) + os.sep,)


# Each engine has one event ring: the recorder using it, by engine handle.
_ring_users: Dict[int, str] = {}
_ring_lock = threading.Lock()


def claim_ring(eng: Engine, user: str) -> None:
    """Takes ``eng``'s event ring for ``user`` (record_trace or record_memory_history)."""
    with _ring_lock:
        holder = _ring_users.get(eng.handle)
        if holder is not None and holder != user:
            raise PyallocError(
                f"pyalloc: {user} cannot start while {holder} records this engine's events "
                f"(one recorder at a time): stop {holder} first")
        _ring_users[eng.handle] = user


def release_ring(eng: Engine, user: str) -> None:
    with _ring_lock:
        if _ring_users.get(eng.handle) == user:
            del _ring_users[eng.handle]


def _resolve(engine: Union[Engine, int, None]) -> Engine:
    if isinstance(engine, Engine):
        return engine
    return state.engine(engine)


def _state(engine: Engine) -> Dict[str, Any]:
    return {"snapshot": engine.snapshot(), "stats": stats_of(engine)}


def save_snapshot(path: Union[str, "os.PathLike[str]"],
                  engine: Union[Engine, int, None] = None, at_oom: bool = False) -> str:
    """Writes the engine's segments, blocks and stats to ``path`` (a pyalloc snapshot).

    ``engine``: an :class:`Engine`, a device index, or None for the installed engine of
    the current device. ``at_oom``: the layout when the last out-of-memory error was
    raised instead of now, with the failed request (``pyalloc-stats report`` says whether
    free and evictable bytes covered it). The stats are today's: counters and peaks.
    """
    eng = _resolve(engine)
    if at_oom:
        layout = eng.last_oom_snapshot()
        if layout is None:
            raise PyallocError(
                "pyalloc: save_snapshot(at_oom=True): this engine has not run out of memory "
                "yet, so there is no layout to save. Call it after catching "
                "torch.OutOfMemoryError, or drop at_oom to save the layout now.")
    else:
        layout = eng.snapshot()
    doc = {"format": files.SNAPSHOT, "version": files.VERSION, "time": files.now_iso(),
           **layout, "stats": stats_of(eng)}
    return str(files.save(path, doc))


def trace_document(eng: Engine, initial: Dict[str, Any], recorded: Dict[str, Any],
                   contexts: List[str]) -> Dict[str, Any]:
    """A pyalloc trace (docs/formats.md): the state at the start (``initial``, from
    :func:`_state`), the events ``recorded`` since (:meth:`Engine.trace_drain`), and the
    state now."""
    stats = eng.stats()
    snap = eng.snapshot()
    return {
        "format": files.TRACE, "version": files.VERSION, "time": files.now_iso(),
        "device": snap["device"], "backend": snap["backend"],
        "options": eng.options_string, "budget_bytes": stats["budget_bytes"],
        "device_total_bytes": stats["device_total_bytes"],
        "dropped_events": recorded["dropped_events"],
        "columns": ["t_ns", "action", "address", "size", "requested", "stream", "context"],
        "events": recorded["events"],
        "contexts": contexts,
        "initial": initial,
        "final": {"snapshot": snap, "stats": stats},
    }


class _OpContexts:
    """A dispatch mode that tags each op's allocations with "op @ file:line".

    The tag is the PyTorch op and the innermost Python frame outside torch and pyalloc,
    interned into a table; the engine stores the index with each event. It costs a few
    microseconds per op, which is why stacks are optional.
    """

    def __init__(self) -> None:
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode

        skip = tuple(os.path.dirname(m.__file__) for m in (torch,)) + _TORCH_DIRS
        table: List[str] = [""]
        index: Dict[str, int] = {"": 0}
        lock = threading.Lock()
        set_context = _lib.lib().pyalloc_set_trace_context

        def where() -> str:
            frame = sys._getframe(2)
            while frame is not None and frame.f_code.co_filename.startswith(skip):
                frame = frame.f_back
            if frame is None:
                return "(autograd)"  # backward ops run from C++, with no user frame
            return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                key = f"{func.__name__} @ {where()}"
                with lock:
                    ctx = index.get(key)
                    if ctx is None:
                        ctx = index[key] = len(table)
                        table.append(key)
                set_context(ctx)
                try:
                    return func(*args, **(kwargs or {}))
                finally:
                    set_context(0)

        self.table = table
        self._mode = Mode()

    def __enter__(self) -> "_OpContexts":
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._mode.__exit__(*exc)


@contextlib.contextmanager
def record_trace(path: Union[str, "os.PathLike[str]"], *, stacks: bool = False,
                 capacity: int = 1 << 20,
                 engine: Union[Engine, int, None] = None) -> Iterator[Engine]:
    """Record every allocator event of the block into ``path`` (a pyalloc trace).

    Parameters
    ----------
    path : str or PathLike
        Where to write the trace (``.gz`` to compress).
    stacks : bool
        Tag each event with the PyTorch op and the user's source line that caused it.
        Costs a few microseconds per op.
    capacity : int
        Events kept (48 bytes each in memory). If the block produces more, the oldest are
        dropped and the file's ``dropped_events`` says how many.
    engine : Engine, int or None
        The engine to trace: a standalone :class:`Engine`, a device index, or None for the
        installed engine of the current device.
    """
    eng = _resolve(engine)
    claim_ring(eng, "record_trace")
    initial = _state(eng)
    eng.trace_start(capacity)
    contexts: Optional[_OpContexts] = _OpContexts() if stacks else None
    try:
        with contexts if contexts is not None else contextlib.nullcontext():
            yield eng
    finally:
        recorded = eng.trace_stop()
        release_ring(eng, "record_trace")
        doc = trace_document(eng, initial, recorded,
                             contexts.table if contexts is not None else [""])
        files.save(path, doc)
