"""Callbacks on out-of-memory: ``pyalloc.on_oom(fn)``.

Training frameworks attach an observer to out-of-memory errors, to log the figures, save a
snapshot or retry with a smaller batch. ``fn(report)`` is called on the thread whose
allocation failed, once the engine has climbed every rung of its reclaim ladder and before
the error is raised, with a dict:

    device, size, rounded, stream, budget, reserved, allocated, awaiting, cached_free,
    largest_free_block, external_fragmentation, evictable, evictable_blocks,
    device_free, device_total   (bytes, but external_fragmentation, a fraction)
    report                      the error's text
    nvml                        on CUDA, the whole GPU as NVML sees it (pyalloc.nvml): a
                                dict, or a string saying why there is none

Callbacks run in the order they were registered. One that raises is logged and the others
still run; the out-of-memory error is raised either way. The engine's lock is free while
they run, so they may read stats, save snapshots and free tensors; memory they free does
not save the failed allocation, which has already failed.

On CUDA, PyTorch's own observer registration (``torch._C._cuda_attach_out_of_memory_observer``,
which Lightning, Composer and Megatron call) is routed here by ``install()``
(:func:`attach_torch_observer`), since PyTorch never calls observers of its own allocator
under a pluggable one.
"""
from __future__ import annotations

import ctypes
import itertools
import json
import logging
import threading
from collections import OrderedDict
from dataclasses import asdict
from typing import Any, Callable, Dict, Optional

from . import _lib, nvml, state

log = logging.getLogger("pyalloc")

OomCallback = Callable[[Dict[str, Any]], Any]

_callbacks: "OrderedDict[int, OomCallback]" = OrderedDict()  # guarded by _lock
_lock = threading.Lock()
_keys = itertools.count(1)
_trampoline: Optional[Any] = None  # the C function pointer while any callback is registered


class OomCallbackHandle:
    """What :func:`on_oom` returns: ``remove()`` unregisters the callback (once; later calls
    do nothing). Also a context manager that removes it on exit."""

    def __init__(self, key: int, fn: OomCallback) -> None:
        self._key = key
        self.callback = fn

    def remove(self) -> None:
        with _lock:
            if _callbacks.pop(self._key, None) is not None and not _callbacks:
                _wire(False)

    def __enter__(self) -> "OomCallbackHandle":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()


def on_oom(fn: OomCallback) -> OomCallbackHandle:
    """Calls ``fn(report)`` on every out-of-memory failure of the installed engines (see the
    module's doc for the report's keys); returns a handle whose ``remove()`` undoes it.

    May be called before or after :func:`pyalloc.install`."""
    if not callable(fn):
        raise TypeError(f"pyalloc.on_oom expects a callable taking the report dict, got "
                        f"{type(fn).__name__}")
    with _lock:
        key = next(_keys)
        _callbacks[key] = fn
        if len(_callbacks) == 1:
            _wire(True)
    return OomCallbackHandle(key, fn)


def _dispatch(_context: Any, info_json: bytes) -> None:
    # Runs on the failing thread, from C: nothing may propagate back into it.
    try:
        report = json.loads(info_json.decode("utf-8", errors="replace"))
        if state.installed_device() == "cuda":
            view, why = nvml.device_view(report["device"])
            report["nvml"] = asdict(view) if view is not None else why
        with _lock:
            callbacks = list(_callbacks.values())
        for fn in callbacks:
            try:
                fn(dict(report))
            except BaseException:
                log.exception("pyalloc: an on_oom callback raised (the others still run, and "
                              "the out-of-memory error is raised as it would have been)")
    except BaseException:
        log.exception("pyalloc: the out-of-memory report could not be delivered")


def _wire(on: bool) -> None:
    """Sets (or clears) the callback of every installed engine. Called under _lock."""
    global _trampoline
    if on:
        _trampoline = _lib.OOM_CALLBACK(_dispatch)
        fn = ctypes.cast(_trampoline, ctypes.c_void_p)
    else:
        fn = None
    _lib.lib().pyalloc_set_installed_oom_callback(fn, None)
    if not on:
        _trampoline = None


def attach_torch_observer(observer: Callable[[int, int, int, int], Any]) -> OomCallbackHandle:
    """PyTorch's ``_cuda_attach_out_of_memory_observer(observer)`` under pyalloc:
    ``observer(device, alloc, device_allocated, device_free)``, as PyTorch calls it, on each
    out-of-memory failure (PyTorch offers no way to detach one; the handle does)."""
    if not callable(observer):
        raise TypeError(f"an out-of-memory observer must be callable, got "
                        f"{type(observer).__name__}")
    return on_oom(lambda r: observer(r["device"], r["size"], r["allocated"], r["device_free"]))
