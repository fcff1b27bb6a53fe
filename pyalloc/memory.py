"""The installed engine's figures and controls: what :func:`pyalloc.memory_stats`,
:func:`pyalloc.snapshot`, :func:`pyalloc.empty_cache` and the ``torch.cuda.memory_*``
replacements (torch_compat) answer from."""
from __future__ import annotations

from typing import Any, Dict, Optional

from . import _lib, registry, state
from .engine import Engine


def stats_of(engine: Engine) -> Dict[str, Any]:
    """``engine``'s stats, with the registry's counters (``remat.*``) when a policy runs on it."""
    stats = engine.stats()
    reg = registry.active()
    if reg is not None and reg.engine.handle == engine.handle:
        stats.update({"remat." + k: v for k, v in reg.stats().items()})
    return stats


def memory_stats(device: Optional[int] = None) -> Dict[str, Any]:
    """Allocator statistics, keyed as ``torch.cuda.memory_stats()`` keys them.

    Besides torch's keys (``allocated_bytes.all.current``, ``reserved_bytes.all.peak``,
    ``num_alloc_retries``, ...) it has ``utilization``, ``external_fragmentation``,
    ``largest_free_block`` and ``budget_bytes``, and under a policy the registry's
    ``remat.*`` counters. Every key is defined in docs/stats.md.
    """
    return stats_of(state.engine(device))


def snapshot(device: Optional[int] = None) -> Dict[str, Any]:
    """Every segment and its blocks (address, size, requested size, state, stream)."""
    return state.engine(device).snapshot()


def empty_cache() -> None:
    """Return every cached, unused segment to the device (all devices), after the
    registry, if a policy is on, has let go of what the program no longer holds (after an
    out-of-memory error, the nodes of the step it ended)."""
    reg = registry.active()
    if reg is not None:
        reg.collect()
    if state.is_installed():
        _lib.lib().pyalloc_empty_cache_hook()


def reset_peak_memory_stats(device: Optional[int] = None) -> None:
    """Peaks restart from the current values (as ``torch.cuda.reset_peak_memory_stats``)."""
    state.engine(device).reset_peak_stats()


def check_invariants(device: Optional[int] = None) -> None:
    """Raise :class:`PyallocError` if any internal invariant of the engine is broken."""
    state.engine(device).check_invariants()
