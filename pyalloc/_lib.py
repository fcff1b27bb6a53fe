"""Loading libpyalloc and declaring its C API (csrc/pyalloc_c.h) for ctypes.

The library is found beside this file (a regular install), or at ``$PYALLOC_LIBRARY``.
Loading it needs no GPU and no driver: the CUDA backend opens the driver on first use.
"""
from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Optional

_LIB_NAME = "libpyalloc.so"


def library_path() -> Path:
    """Path of the shared library this package uses."""
    override = os.environ.get("PYALLOC_LIBRARY")
    if override:
        path = Path(override)
        if not path.is_file():
            raise FileNotFoundError(f"PYALLOC_LIBRARY={override} does not name a file")
        return path
    here = Path(__file__).resolve().parent
    for candidate in (here / _LIB_NAME, *sorted(here.parent.glob(f"build/*/{_LIB_NAME}"))):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"{_LIB_NAME} was not found beside {here}. Install pyalloc with `pip install .` "
        "(which compiles it), or point PYALLOC_LIBRARY at a built copy."
    )


_c = ctypes
_engine_p = _c.c_void_p
_SIGNATURES = {
    # name: (restype, argtypes)
    "pyalloc_last_error": (_c.c_char_p, []),
    "pyalloc_string_free": (None, [_c.c_void_p]),
    "pyalloc_version": (_c.c_char_p, []),
    "pyalloc_has_cuda_backend": (_c.c_int, []),
    "pyalloc_cuda_device_count": (_c.c_int, []),
    "pyalloc_options_table": (_c.c_char_p, []),
    "pyalloc_options_normalize": (_c.c_void_p, [_c.c_char_p]),
    "pyalloc_engine_create": (_engine_p, [_c.c_char_p, _c.c_int, _c.c_char_p]),
    "pyalloc_engine_destroy": (_c.c_int, [_engine_p]),
    "pyalloc_engine_alloc": (_c.c_int, [_engine_p, _c.c_size_t, _c.c_size_t, _c.POINTER(_c.c_void_p)]),
    "pyalloc_engine_free": (_c.c_int, [_engine_p, _c.c_void_p, _c.c_size_t]),
    "pyalloc_engine_record_stream": (_c.c_int, [_engine_p, _c.c_void_p, _c.c_size_t]),
    "pyalloc_engine_empty_cache": (_c.c_int, [_engine_p]),
    "pyalloc_engine_route_to_graph_pool": (_c.c_int, [_engine_p, _c.c_uint64, _c.c_size_t, _c.c_int]),
    "pyalloc_engine_end_graph_pool_routes": (_c.c_int, [_engine_p, _c.c_uint64]),
    "pyalloc_engine_release_graph_pool": (_c.c_int, [_engine_p, _c.c_uint64]),
    "pyalloc_engine_graph_pool_blocks": (_c.c_size_t, [_engine_p, _c.c_uint64, _c.POINTER(_c.c_size_t), _c.c_size_t]),
    "pyalloc_engine_set_budget": (_c.c_int, [_engine_p, _c.c_uint64]),
    "pyalloc_engine_set_memory_fraction": (_c.c_int, [_engine_p, _c.c_double]),
    "pyalloc_engine_stats_json": (_c.c_void_p, [_engine_p]),
    "pyalloc_engine_snapshot_json": (_c.c_void_p, [_engine_p]),
    "pyalloc_engine_last_oom_json": (_c.c_void_p, [_engine_p]),
    "pyalloc_engine_options": (_c.c_void_p, [_engine_p]),
    "pyalloc_engine_check_invariants": (_c.c_int, [_engine_p]),
    "pyalloc_engine_reset_peak_stats": (_c.c_int, [_engine_p]),
    "pyalloc_engine_reset_accumulated_stats": (_c.c_int, [_engine_p]),
    "pyalloc_engine_synchronize": (_c.c_int, [_engine_p]),
    "pyalloc_engine_set_evict_callback": (_c.c_int, [_engine_p, _c.c_void_p, _c.c_void_p]),
    "pyalloc_engine_set_evictable": (_c.c_int, [_engine_p, _c.c_void_p, _c.c_uint64, _c.c_double]),
    "pyalloc_engine_set_last_resort_evictable": (_c.c_int, [_engine_p, _c.c_void_p, _c.c_uint64,
                                                            _c.c_double]),
    "pyalloc_engine_set_oom_callback": (_c.c_int, [_engine_p, _c.c_void_p, _c.c_void_p]),
    "pyalloc_set_installed_oom_callback": (_c.c_int, [_c.c_void_p, _c.c_void_p]),
    "pyalloc_engine_touch": (_c.c_int, [_engine_p, _c.c_void_p]),
    "pyalloc_engine_set_compact_callbacks": (
        _c.c_int, [_engine_p, _c.c_void_p, _c.c_void_p, _c.c_void_p]),
    "pyalloc_engine_compact": (
        _c.c_int, [_engine_p, _c.c_size_t, _c.c_size_t, _c.POINTER(_c.c_size_t)]),
    "pyalloc_set_thread_placement": (None, [_c.c_void_p]),
    "pyalloc_engine_trace_start": (_c.c_int, [_engine_p, _c.c_uint64]),
    "pyalloc_engine_trace_drain": (_c.c_void_p, [_engine_p]),
    "pyalloc_set_trace_context": (None, [_c.c_uint32]),
    "pyalloc_engine_stream_create": (_c.c_int, [_engine_p, _c.POINTER(_c.c_size_t)]),
    "pyalloc_engine_stream_destroy": (_c.c_int, [_engine_p, _c.c_size_t]),
    "pyalloc_engine_set_host_pool": (_c.c_int, [_engine_p, _c.c_uint64]),
    "pyalloc_engine_defer_host_pool": (_c.c_int, [_engine_p, _c.c_uint64]),
    "pyalloc_engine_swap_out": (
        _c.c_int, [_engine_p, _c.c_void_p, _c.c_size_t, _c.c_size_t, _c.POINTER(_c.c_uint64)]),
    "pyalloc_engine_swap_in": (_c.c_int, [_engine_p, _c.c_uint64, _c.c_void_p, _c.c_size_t]),
    "pyalloc_engine_swap_wait": (_c.c_int, [_engine_p, _c.c_uint64, _c.c_size_t]),
    "pyalloc_engine_swap_ready": (_c.c_int, [_engine_p, _c.c_uint64]),
    "pyalloc_engine_swap_release": (_c.c_int, [_engine_p, _c.c_uint64]),
    "pyalloc_engine_swap_stream": (_c.c_int, [_engine_p, _c.c_int, _c.POINTER(_c.c_size_t)]),
    "pyalloc_engine_unallocated": (_c.c_int, [_engine_p, _c.POINTER(_c.c_uint64)]),
    "pyalloc_set_thread_may_evict": (None, [_c.c_int]),
    "pyalloc_set_thread_tentative": (_c.c_int, [_c.c_int]),
    "pyalloc_set_thread_persistent": (None, [_c.c_int]),
    "pyalloc_set_thread_evictable": (_c.c_int, [_c.c_int]),
    "pyalloc_engine_set_long_lived": (_c.c_int, [_engine_p, _c.c_int]),
    "pyalloc_set_long_lived": (None, [_c.c_int]),
    "pyalloc_engine_blocked_ns": (_c.c_uint64, [_engine_p]),
    "pyalloc_install": (_c.c_int, [_c.c_char_p, _c.c_char_p]),
    "pyalloc_after_fork_in_child": (_c.c_int, []),
    "pyalloc_before_fork": (None, []),
    "pyalloc_is_installed": (_c.c_int, []),
    "pyalloc_installed_engine": (_engine_p, [_c.c_int]),
    "pyalloc_sim_fill_async": (_c.c_int, [_engine_p, _c.c_size_t, _c.c_void_p, _c.c_size_t, _c.c_int]),
    "pyalloc_sim_set_stream_delay": (_c.c_int, [_engine_p, _c.c_size_t, _c.c_uint]),
    "pyalloc_sim_fail_copies": (_c.c_int, [_engine_p, _c.c_uint]),
    "pyalloc_sim_fail_host_commits": (_c.c_int, [_engine_p, _c.c_uint]),
    "pyalloc_stress": (_c.c_int, [_engine_p, _c.c_int, _c.c_uint64, _c.c_uint64, _c.c_size_t, _c.c_uint64]),
    "pyalloc_bench_pairs": (
        _c.c_int,
        [_c.c_int, _c.c_size_t, _c.POINTER(_c.c_size_t), _c.c_size_t, _c.c_size_t, _c.c_uint64,
         _c.POINTER(_c.c_double)],
    ),
    "pyalloc_bench_sequence": (
        _c.c_int,
        [_c.c_int, _c.c_size_t, _c.POINTER(_c.c_int64), _c.POINTER(_c.c_uint32), _c.c_size_t,
         _c.c_uint32, _c.c_int, _c.POINTER(_c.c_double)],
    ),
    # Pluggable-allocator entry points: loaded by address, never called through ctypes
    # (pyalloc_malloc throws C++ exceptions, which ctypes cannot catch).
    "pyalloc_malloc": (_c.c_void_p, [_c.c_size_t, _c.c_int, _c.c_void_p]),
    "pyalloc_free": (None, [_c.c_void_p, _c.c_size_t, _c.c_int, _c.c_void_p]),
    "pyalloc_empty_cache_hook": (None, []),
    "pyalloc_memory_fraction_hook": (None, [_c.c_double, _c.c_int]),
    "pyalloc_record_stream_hook": (None, [_c.c_void_p, _c.c_void_p]),
}

# size_t callback(void* context, const uint64_t* handles, size_t count)
EVICT_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_size_t, ctypes.c_void_p,
                                  ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t)
# void on_oom(void* context, const char* info_json)
OOM_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_char_p)
# size_t movable(void* context, uintptr_t* out, size_t capacity)
MOVABLE_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_size_t, ctypes.c_void_p,
                                    ctypes.POINTER(ctypes.c_size_t), ctypes.c_size_t)
# size_t relocate(void* context, const uintptr_t* from, const uintptr_t* to, size_t count)
RELOCATE_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_size_t, ctypes.c_void_p,
                                     ctypes.POINTER(ctypes.c_size_t),
                                     ctypes.POINTER(ctypes.c_size_t), ctypes.c_size_t)

_lib: Optional[ctypes.CDLL] = None


def lib() -> ctypes.CDLL:
    """The loaded library, with every function's signature declared."""
    global _lib
    if _lib is None:
        loaded = ctypes.CDLL(str(library_path()))
        for name, (restype, argtypes) in _SIGNATURES.items():
            fn = getattr(loaded, name)
            fn.restype = restype
            fn.argtypes = argtypes
        _lib = loaded
    return _lib


def address_of(name: str) -> int:
    """The address of an exported C function, for PyTorch's allocator hooks."""
    return ctypes.cast(getattr(lib(), name), ctypes.c_void_p).value


def last_error() -> str:
    return (lib().pyalloc_last_error() or b"").decode("utf-8", "replace")


def take_string(ptr: Optional[int]) -> str:
    """Copies a char* the library returned, and frees it."""
    if not ptr:
        raise RuntimeError(f"pyalloc: {last_error()}")
    try:
        return ctypes.string_at(ptr).decode("utf-8")
    finally:
        lib().pyalloc_string_free(ptr)
