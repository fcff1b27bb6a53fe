"""pyalloc — a GPU memory manager for PyTorch training.

Two lines::

    import pyalloc
    pyalloc.install(budget="10GiB")   # before the model is created

Then ordinary PyTorch. :func:`memory_stats` and :func:`snapshot` show where the memory
went; without a GPU, ``install()`` sets up the simulated device (CPU tensors under a
budget) so the same code runs anywhere.
"""
from __future__ import annotations

from typing import Any, Dict, Optional

from ._lib import library_path
from .engine import Engine
from .errors import OutOfMemoryError, PyallocError
from .install import install, installed_device, is_installed
from .lifetime import long_lived
from .options import options_table
from .registry import recompute
from .trace import record_trace, save_snapshot

__version__ = "0.1.0"

__all__ = [
    "Engine",
    "OutOfMemoryError",
    "PyallocError",
    "check_invariants",
    "empty_cache",
    "install",
    "installed_device",
    "is_installed",
    "library_path",
    "long_lived",
    "memory_stats",
    "options_table",
    "recompute",
    "record_trace",
    "save_snapshot",
    "reset_peak_memory_stats",
    "snapshot",
]


def _engine(device: Optional[int]) -> Engine:
    """The installed engine of ``device`` (default: the current CUDA device, or 0)."""
    from . import _lib

    kind = installed_device()
    if kind is None:
        raise PyallocError("pyalloc is not installed: call pyalloc.install() first")
    if device is None:
        import torch

        device = torch.cuda.current_device() if kind == "cuda" else 0
    handle = _lib.lib().pyalloc_installed_engine(device)
    if not handle:
        raise PyallocError(_lib.last_error())
    return Engine._wrap(handle)


def memory_stats(device: Optional[int] = None) -> Dict[str, Any]:
    """Allocator statistics, keyed as ``torch.cuda.memory_stats()`` keys them.

    Besides torch's keys (``allocated_bytes.all.current``, ``reserved_bytes.all.peak``,
    ``num_alloc_retries``, ...) it has ``utilization``, ``external_fragmentation``,
    ``largest_free_block`` and ``budget_bytes``. Every key is defined in docs/stats.md.
    """
    from .trace import _stats

    return _stats(_engine(device))   # with the registry's counters under policy="recompute"


def snapshot(device: Optional[int] = None) -> Dict[str, Any]:
    """Every segment and its blocks (address, size, requested size, state, stream)."""
    return _engine(device).snapshot()


def empty_cache() -> None:
    """Return every cached, unused segment to the device (all devices), after the
    registry, if a policy is on, has let go of what the program no longer holds (after an
    out-of-memory error, the nodes of the step it ended)."""
    from . import _lib, registry

    reg = registry.active()
    if reg is not None:
        reg.collect()
    if is_installed():
        _lib.lib().pyalloc_empty_cache_hook()


def reset_peak_memory_stats(device: Optional[int] = None) -> None:
    """Peaks restart from the current values (as ``torch.cuda.reset_peak_memory_stats``)."""
    _engine(device).reset_peak_stats()


def check_invariants(device: Optional[int] = None) -> None:
    """Raise :class:`PyallocError` if any internal invariant of the engine is broken."""
    _engine(device).check_invariants()
