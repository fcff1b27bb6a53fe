"""Building and loading pyalloc's torch-built library against the installed torch.

One shared library holds everything that is compiled against torch: the shim
(csrc/torch_shim.cpp: the simulated device's c10 CPU allocator, and CUDA entry points that
raise ``torch.OutOfMemoryError``) and the registry's per-op path (registry/src/: the
dispatch-key fallback behind ``policy="recompute" | "swap" | "hybrid"``). It is compiled on
first use with ``torch.utils.cpp_extension`` and cached under ``$PYALLOC_CACHE_DIR``
(default ``~/.cache/pyalloc``), keyed by torch's version and the sources' hash, so later
processes load it in milliseconds.
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
from pathlib import Path
from typing import List, Optional

from . import _lib

log = logging.getLogger("pyalloc")

_shim: Optional[ctypes.CDLL] = None


def _source_root() -> Path:
    """The folder holding ``csrc/``, ``registry/src/`` and the engine header the registry
    shares (``allocator/src/node_pool.h``): the installed copy, or the repo."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "native", here.parent):
        if (candidate / "csrc" / "torch_shim.cpp").is_file() and (candidate / "registry" / "src").is_dir():
            return candidate
    raise FileNotFoundError(
        f"pyalloc's C++ sources were not found in {here / 'native'}; reinstall pyalloc with "
        "`pip install .`")


def _sources(root: Path) -> List[Path]:
    return [root / "csrc" / "torch_shim.cpp", *sorted((root / "registry" / "src").glob("*.cpp"))]


# NDEBUG: PyTorch's headers compile their debug-only checks (dispatch tracing on every
# redispatch, debug asserts) into whatever includes them, unless it is defined.
# PYALLOC_SHIM_DEBUG_INFO=1 adds -g, for profilers that attribute cost to source lines
# (callgrind_annotate on the registry's per-op path); the code generated is the same.
#
# Note [Calls inside the library]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Built as a shared library with default visibility, every call from one of its functions to
# another it defines (by_key_locked, unpin_all_locked, the engine table's accessor, the
# instances of PyTorch's header templates it holds) went through the PLT, since the dynamic
# linker may bind such a name to another library's: an indirect jump and a stub's cache
# line per callee, and GCC would not inline across such a call inside one file. Nothing
# interposes on these names, so -fno-semantic-interposition lets GCC treat them as the
# library's own, -Wl,-Bsymbolic-functions binds the calls between files to the library's
# own definitions (functions only: data, such as a static in an inline function of
# PyTorch's headers, keeps one copy in the process), and -fno-plt calls libtorch's
# functions through the GOT directly, without a stub (Note [The per-op path's footprint]
# in registry/src/registry.h).
_CFLAGS = ["-O2", "-DNDEBUG", "-fno-semantic-interposition", "-fno-plt"] + (
    ["-g"] if os.environ.get("PYALLOC_SHIM_DEBUG_INFO") == "1" else [])
_LDFLAGS = ["-Wl,-Bsymbolic-functions"]


def _cache_dir(root: Path) -> Path:
    import torch

    digest = hashlib.sha256(" ".join(_CFLAGS + _LDFLAGS).encode())
    for path in [*_sources(root), *sorted((root / "registry" / "src").glob("*.h")),
                 root / "csrc" / "pyalloc_c.h", root / "allocator" / "src" / "node_pool.h"]:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    base = Path(os.environ.get("PYALLOC_CACHE_DIR", Path.home() / ".cache" / "pyalloc"))
    path = base / f"torch_shim-torch{torch.__version__}-{digest.hexdigest()[:12]}"
    path.mkdir(parents=True, exist_ok=True)
    return path


_c = ctypes
_SIGNATURES = {
    # name: (restype, argtypes)
    "pyalloc_shim_bind": (_c.c_int, [_c.c_char_p]),
    "pyalloc_shim_last_error": (_c.c_char_p, []),
    "pyalloc_shim_last_error_is_oom": (_c.c_int, []),
    "pyalloc_shim_string_free": (None, [_c.c_void_p]),
    "pyalloc_cpu_shim_install": (_c.c_int, [_c.c_void_p]),
    "pyalloc_cpu_shim_uninstall": (_c.c_int, []),
    "pyalloc_cpu_shim_active": (_c.c_int, []),
    "pyalloc_registry_register": (_c.c_int, []),
    "pyalloc_registry_start": (_c.c_int, [_c.c_void_p, _c.c_int, _c.c_int, _c.c_uint64, _c.c_int,
                                          _c.c_int, _c.c_int, _c.c_int]),
    "pyalloc_registry_stop": (_c.c_int, []),
    "pyalloc_registry_restore_all": (_c.c_int, []),
    "pyalloc_registry_collect": (None, []),
    "pyalloc_registry_hold": (_c.c_size_t, [_c.POINTER(_c.c_void_p), _c.c_size_t,
                                            _c.POINTER(_c.c_uint64)]),
    "pyalloc_registry_release": (None, [_c.POINTER(_c.c_uint64), _c.c_size_t]),
    "pyalloc_registry_expose": (_c.c_int, [_c.c_void_p, _c.c_int]),
    "pyalloc_registry_adopt": (_c.c_size_t, [_c.POINTER(_c.c_void_p), _c.c_size_t]),
    "pyalloc_registry_before_resize": (_c.c_int, [_c.c_void_p]),
    "pyalloc_registry_active": (_c.c_int, []),
    "pyalloc_registry_evicted_data_refuses": (_c.c_int, []),
    "pyalloc_registry_thread_enable": (_c.c_int, [_c.c_int]),
    "pyalloc_registry_interrupt": (None, [_c.c_int]),
    "pyalloc_registry_evict": (_c.c_uint64, [_c.POINTER(_c.c_uint64), _c.c_size_t]),
    "pyalloc_registry_stats_json": (_c.c_void_p, []),
    "pyalloc_registry_replays_json": (_c.c_void_p, []),
    "pyalloc_registry_handles": (_c.c_size_t, [_c.POINTER(_c.c_uint64), _c.c_size_t]),
    "pyalloc_registry_node_info": (_c.c_int, [_c.c_uint64, _c.c_void_p]),
    "pyalloc_registry_handle_of": (_c.c_uint64, [_c.c_void_p]),
    "pyalloc_registry_check_invariants": (_c.c_int, []),
    "pyalloc_registry_set_copy_bandwidth": (None, [_c.c_double]),
    "pyalloc_registry_set_floor_probe": (None, [_c.c_int]),
    "pyalloc_registry_set_replay_limits": (None, [_c.c_int, _c.c_int, _c.POINTER(_c.c_int)]),
    "pyalloc_registry_floor_json": (_c.c_void_p, []),
}


def _build(root: Path, build_dir: Path, name: str) -> Path:
    """Compiles the library into ``build_dir`` unless a finished build is there already;
    returns the library's file.

    Processes that start together (a test suite, the ranks of a job) build it once: the
    first takes an flock, the others wait on it and then find the build finished. flock,
    not torch's lock file, is what guards it, because the kernel lets go of an flock when
    its process dies: a build killed half way (a timeout's SIGKILL, an OOM kill) leaves
    torch's ``lock`` file behind, and cpp_extension then waits on it forever in every
    later process. Under the flock no other build can be running, so that file is stale.
    """
    import fcntl

    built, finished = build_dir / f"{name}.so", build_dir / f"{name}.finished"
    if finished.is_file() and built.is_file():
        return built
    with open(build_dir / "pyalloc.flock", "w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        if finished.is_file() and built.is_file():
            return built
        (build_dir / "lock").unlink(missing_ok=True)
        log.warning("pyalloc: compiling the torch shim and the registry against this torch "
                    "(once, a minute or more; cached in %s)", build_dir)
        from torch.utils import cpp_extension

        cpp_extension.load(
            name=name,
            sources=[str(p) for p in _sources(root)],
            extra_include_paths=[str(root / "csrc"), str(root / "registry" / "src"),
                                 str(root / "allocator" / "src")],
            extra_cflags=_CFLAGS,
            extra_ldflags=_LDFLAGS,
            build_directory=str(build_dir),
            is_python_module=False,
            verbose=False,
        )
        finished.write_text("built\n")
    return built


def load() -> ctypes.CDLL:
    """Builds (once), loads and binds the library; returns it with its functions declared."""
    global _shim
    if _shim is not None:
        return _shim
    root = _source_root()
    built = _build(root, _cache_dir(root), "pyalloc_torch_shim")
    shim = ctypes.CDLL(str(built))
    for fn, (restype, argtypes) in _SIGNATURES.items():
        getattr(shim, fn).restype = restype
        getattr(shim, fn).argtypes = argtypes
    _lib.lib()   # libpyalloc is loaded before the shim binds to it
    if shim.pyalloc_shim_bind(str(_lib.library_path()).encode()) != 0:
        raise RuntimeError(shim.pyalloc_shim_last_error().decode())
    _shim = shim
    return shim


def last_error() -> str:
    """The reason the calling thread's last failed call into the library gave."""
    return load().pyalloc_shim_last_error().decode(errors="replace")


def last_exception() -> Exception:
    """The calling thread's last failure as the exception to raise: pyalloc's
    OutOfMemoryError (a torch.OutOfMemoryError) when it was out of memory, so that a
    training loop's ``except torch.OutOfMemoryError`` sees it, else a RuntimeError."""
    message = last_error()
    if not message.startswith("pyalloc"):
        message = "pyalloc: " + message
    if load().pyalloc_shim_last_error_is_oom():
        from .errors import OutOfMemoryError
        return OutOfMemoryError(message)
    return RuntimeError(message)


def take_string(ptr: Optional[int]) -> str:
    """A string the library returned (its char*), released after reading."""
    if not ptr:
        raise RuntimeError(last_error())
    try:
        return ctypes.string_at(ptr).decode()
    finally:
        load().pyalloc_shim_string_free(ptr)


def path() -> str:
    """The built library's file (for CUDAPluggableAllocator)."""
    if _shim is None:
        load()
    return _shim._name
