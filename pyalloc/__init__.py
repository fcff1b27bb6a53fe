"""pyalloc — a GPU memory manager for PyTorch training.

Two lines::

    import pyalloc
    pyalloc.install(budget="10GiB")   # before the model is created

Then ordinary PyTorch. :func:`memory_stats` and :func:`snapshot` show where the memory
went; without a GPU, ``install()`` sets up the simulated device (CPU tensors under a
budget) so the same code runs anywhere.
"""
from __future__ import annotations

from ._lib import library_path
from .engine import Engine
from .errors import OutOfMemoryError, PyallocError
from .install import install
from .lifetime import long_lived
from .memory import check_invariants, empty_cache, memory_stats, reset_peak_memory_stats, snapshot
from .options import options_table
from .registry import recompute
from .state import engine as _engine  # the installed engine of a device (tests, tools)
from .state import installed_device, is_installed
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
