"""What :func:`pyalloc.install` set up, in one place: the device it installed on, the
objects PyTorch holds raw pointers into, and the way to the installed engines.

Every module that needs the installed engine asks here; no other module keeps installed
state. It imports nothing of pyalloc but the engine's handle, so anything may import it.
"""
from __future__ import annotations

from typing import Any, List, Optional

from . import _lib
from .engine import Engine
from .errors import PyallocError

_installed_device: Optional[str] = None  # "cuda" or "cpu" once installed
_keepalive: List[Any] = []  # objects PyTorch holds raw pointers into (allocators, publishers)


def installed_device() -> Optional[str]:
    """``"cuda"``, ``"cpu"`` (the simulated device), or ``None`` before :func:`install`."""
    return _installed_device


def is_installed() -> bool:
    return _installed_device is not None


def set_installed(device: str) -> None:
    """Called once by install(), after the device's engine is in place."""
    global _installed_device
    _installed_device = device


def keep_alive(obj: Any) -> None:
    """Keep ``obj`` for the life of the process (PyTorch holds raw pointers into it)."""
    _keepalive.append(obj)


def engine(device: Optional[int] = None) -> Engine:
    """The installed engine of ``device`` (default: the current CUDA device, or 0)."""
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
