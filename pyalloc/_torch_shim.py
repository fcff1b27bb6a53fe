"""Building and loading the torch shim (csrc/torch_shim.cpp) against the installed torch.

The shim gives the engine PyTorch-typed faces: the simulated device's c10 CPU allocator,
and CUDA entry points that raise ``torch.OutOfMemoryError``. It is compiled on first use with ``torch.utils.cpp_extension`` and cached under
``$PYALLOC_CACHE_DIR`` (default ``~/.cache/pyalloc``), keyed by torch's version and the
source's hash, so later processes load it in milliseconds.
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
from pathlib import Path
from typing import Optional

from . import _lib

log = logging.getLogger("pyalloc")

_shim: Optional[ctypes.CDLL] = None


def _source_dir() -> Path:
    here = Path(__file__).resolve().parent
    for candidate in (here / "csrc", here.parent / "csrc"):  # installed copy, then repo
        if (candidate / "torch_shim.cpp").is_file():
            return candidate
    raise FileNotFoundError(
        f"torch_shim.cpp was not found in {here / 'csrc'}; reinstall pyalloc with `pip install .`"
    )


def _cache_dir(source: Path) -> Path:
    import torch

    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:12]
    root = Path(os.environ.get("PYALLOC_CACHE_DIR", Path.home() / ".cache" / "pyalloc"))
    path = root / f"torch_shim-torch{torch.__version__}-{digest}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def load() -> ctypes.CDLL:
    """Builds (once), loads and binds the shim; returns it with its functions declared."""
    global _shim
    if _shim is not None:
        return _shim
    from torch.utils import cpp_extension

    src = _source_dir()
    build_dir = _cache_dir(src / "torch_shim.cpp")
    name = "pyalloc_torch_shim"
    built = build_dir / f"{name}.so"
    if not built.is_file():
        log.info("pyalloc: compiling the torch shim (once; cached in %s)", build_dir)
    cpp_extension.load(
        name=name,
        sources=[str(src / "torch_shim.cpp")],
        extra_include_paths=[str(src)],
        extra_cflags=["-O2"],
        build_directory=str(build_dir),
        is_python_module=False,
        verbose=False,
    )
    shim = ctypes.CDLL(str(built))
    shim.pyalloc_shim_bind.restype = ctypes.c_int
    shim.pyalloc_shim_bind.argtypes = [ctypes.c_void_p] * 5
    shim.pyalloc_cpu_shim_install.restype = ctypes.c_int
    shim.pyalloc_cpu_shim_install.argtypes = [ctypes.c_void_p]
    shim.pyalloc_cpu_shim_uninstall.restype = ctypes.c_int
    shim.pyalloc_cpu_shim_active.restype = ctypes.c_int
    shim.pyalloc_shim_swap_storage_data.restype = ctypes.c_int
    shim.pyalloc_shim_swap_storage_data.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    rc = shim.pyalloc_shim_bind(
        _lib.address_of("pyalloc_engine_alloc"),
        _lib.address_of("pyalloc_engine_free"),
        _lib.address_of("pyalloc_last_error"),
        _lib.address_of("pyalloc_installed_engine"),
        _lib.address_of("pyalloc_free"),
    )
    if rc != 0:
        raise RuntimeError("pyalloc: binding the torch shim failed (a null function pointer)")
    _shim = shim
    return shim


def path() -> str:
    """The built shim's file (for CUDAPluggableAllocator)."""
    if _shim is None:
        load()
    return _shim._name
