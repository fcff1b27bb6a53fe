"""torch.cuda.memory_* functions that report pyalloc's figures.

Under a pluggable allocator PyTorch's own ``memory_stats``, ``memory_allocated``,
``max_memory_allocated``, ``memory_reserved``, ``max_memory_reserved``, ``memory_summary``
and ``reset_peak_memory_stats`` raise, and training libraries that log them break.
:func:`patch_torch_cuda` (called by ``install(device="cuda")`` unless
``patch_torch=False``) replaces them with the functions below, which answer from the
engine. The same functions work on the simulated device, where they read the engine that
serves CPU tensors.
"""
from __future__ import annotations

import collections
from typing import Any, Callable, Dict, Optional

import torch

from . import history, memory, oom, state

_patched: Dict[str, Callable[..., Any]] = {}  # name -> torch's original


def _device_index(device: Any) -> Optional[int]:
    if state.installed_device() != "cuda":
        return 0
    if device is None:
        return None
    return torch.cuda._utils._get_device_index(device, optional=True)


def memory_stats(device: Any = None) -> "collections.OrderedDict[str, Any]":
    """``torch.cuda.memory_stats``: torch's keys (plus pyalloc's), sorted, as torch returns."""
    return collections.OrderedDict(sorted(memory.memory_stats(_device_index(device)).items()))


def memory_allocated(device: Any = None) -> int:
    return memory_stats(device).get("allocated_bytes.all.current", 0)


def max_memory_allocated(device: Any = None) -> int:
    return memory_stats(device).get("allocated_bytes.all.peak", 0)


def memory_reserved(device: Any = None) -> int:
    return memory_stats(device).get("reserved_bytes.all.current", 0)


def max_memory_reserved(device: Any = None) -> int:
    return memory_stats(device).get("reserved_bytes.all.peak", 0)


def reset_peak_memory_stats(device: Any = None) -> None:
    memory.reset_peak_memory_stats(_device_index(device))


def reset_accumulated_memory_stats(device: Any = None) -> None:
    state.engine(_device_index(device)).reset_accumulated_stats()


def reset_max_memory_allocated(device: Any = None) -> None:
    reset_peak_memory_stats(device)


def reset_max_memory_cached(device: Any = None) -> None:
    reset_peak_memory_stats(device)


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    """PyTorch's summary table over pyalloc's stats, followed by pyalloc's own figures."""
    original = _patched.get("memory_summary") or torch.cuda.memory.memory_summary
    # torch's implementation reads memory_stats() through its module globals, which
    # patch_torch_cuda points at ours; on the simulated device we lend it ours for the call.
    index = _device_index(device)
    if index is None:
        index = torch.cuda.current_device()
    saved = torch.cuda.memory.memory_stats
    torch.cuda.memory.memory_stats = memory_stats
    try:
        table = original(device=index, abbreviated=abbreviated)
    finally:
        torch.cuda.memory.memory_stats = saved
    s = memory_stats(device)
    extra = (f"|  pyalloc: utilization {100 * s['utilization']:.1f}% (peak allocated / peak "
             f"reserved), external fragmentation {100 * s['external_fragmentation']:.1f}%, "
             f"budget {s['budget_bytes'] / 2**20:,.0f} MiB")
    return table.rstrip("\n") + "\n" + extra + "\n"


_REPLACEMENTS = {
    "_record_memory_history": history.record_memory_history,
    "_snapshot": history.memory_snapshot,
    "_dump_snapshot": history.dump_snapshot,
    "memory_stats": memory_stats,
    "memory_allocated": memory_allocated,
    "max_memory_allocated": max_memory_allocated,
    "memory_reserved": memory_reserved,
    "max_memory_reserved": max_memory_reserved,
    "memory_summary": memory_summary,
    "reset_peak_memory_stats": reset_peak_memory_stats,
    "reset_accumulated_memory_stats": reset_accumulated_memory_stats,
    "reset_max_memory_allocated": reset_max_memory_allocated,
    "reset_max_memory_cached": reset_max_memory_cached,
}


def _attach_out_of_memory_observer(observer: Callable[[int, int, int, int], Any]) -> None:
    """``torch._C._cuda_attach_out_of_memory_observer``: routed to :func:`pyalloc.on_oom`."""
    oom.attach_torch_observer(observer)


_OBSERVER = "_cuda_attach_out_of_memory_observer"


def patch_torch_cuda() -> None:
    """Point torch.cuda's memory functions (both namespaces) at pyalloc's, and PyTorch's
    out-of-memory observer registration at :func:`pyalloc.on_oom`."""
    for name, fn in _REPLACEMENTS.items():
        if not hasattr(torch.cuda.memory, name):
            continue  # an older torch
        if name not in _patched:
            _patched[name] = getattr(torch.cuda.memory, name)
        for namespace in (torch.cuda.memory, torch.cuda):
            if hasattr(namespace, name):
                setattr(namespace, name, fn)
    if hasattr(torch._C, _OBSERVER) and _OBSERVER not in _patched:
        _patched[_OBSERVER] = getattr(torch._C, _OBSERVER)
        setattr(torch._C, _OBSERVER, _attach_out_of_memory_observer)


def unpatch_torch_cuda() -> None:
    """Restore PyTorch's functions (which raise under a pluggable allocator)."""
    for name, original in _patched.items():
        if name == _OBSERVER:
            setattr(torch._C, name, original)
            continue
        for namespace in (torch.cuda.memory, torch.cuda):
            if hasattr(namespace, name):
                setattr(namespace, name, original)
    _patched.clear()
