"""pyalloc — a GPU memory manager for PyTorch training.

Two lines::

    import pyalloc
    pyalloc.install(budget="10GiB")   # before the model is created

Then ordinary PyTorch. :func:`memory_stats` and :func:`snapshot` show where the memory
went; without a GPU, ``install()`` sets up the simulated device (CPU tensors under a
budget) so the same code runs anywhere.
"""
from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any, List

# What `import pyalloc` offers, by the module that defines it. Loaded on first use (PEP 562):
# most of pyalloc imports torch, which takes seconds, and `pyalloc-stats` (which reads
# files and needs no torch) imports this package first.
_EXPORTS = {
    "library_path": "._lib",
    "Engine": ".engine",
    "OutOfMemoryError": ".errors",
    "PyallocError": ".errors",
    "install": ".installer",
    "long_lived": ".lifetime",
    "record_memory_history": ".history",
    "memory_snapshot": ".history",
    "dump_snapshot": ".history",
    "check_invariants": ".memory",
    "empty_cache": ".memory",
    "memory_stats": ".memory",
    "reset_peak_memory_stats": ".memory",
    "snapshot": ".memory",
    "on_oom": ".oom",
    "options_table": ".options",
    "recompute": ".registry",
    "installed_device": ".state",
    "is_installed": ".state",
    "record_trace": ".trace",
    "save_snapshot": ".trace",
}
_PRIVATE = {"_engine": (".state", "engine")}  # the installed engine of a device (tests, tools)

if TYPE_CHECKING:
    from ._lib import library_path
    from .engine import Engine
    from .errors import OutOfMemoryError, PyallocError
    from .installer import install
    from .history import dump_snapshot, memory_snapshot, record_memory_history
    from .lifetime import long_lived
    from .memory import (check_invariants, empty_cache, memory_stats, reset_peak_memory_stats,
                         snapshot)
    from .oom import on_oom
    from .options import options_table
    from .registry import recompute
    from .state import installed_device, is_installed
    from .trace import record_trace, save_snapshot


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        module, attribute = _EXPORTS[name], name
    elif name in _PRIVATE:
        module, attribute = _PRIVATE[name]
    elif not name.startswith("__") and importlib.util.find_spec(f"{__name__}.{name}"):
        # A submodule, as `import pyalloc` made every one of them an attribute before.
        return importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module 'pyalloc' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), attribute)
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__() -> List[str]:
    return sorted([*globals(), *_EXPORTS])


__version__ = "0.1.0"

__all__ = [
    "Engine",
    "OutOfMemoryError",
    "PyallocError",
    "check_invariants",
    "dump_snapshot",
    "empty_cache",
    "install",
    "installed_device",
    "is_installed",
    "library_path",
    "long_lived",
    "memory_snapshot",
    "memory_stats",
    "on_oom",
    "options_table",
    "recompute",
    "record_memory_history",
    "record_trace",
    "save_snapshot",
    "reset_peak_memory_stats",
    "snapshot",
]
