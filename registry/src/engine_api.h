// engine_api.h — the engine's C API (csrc/pyalloc_c.h) as the torch-built code calls it.
//
// libpyalloc is built without torch, and the torch-built library (the shim and the
// registry) is built without libpyalloc: neither links the other. When Python loads the
// torch-built library it hands over the path of the libpyalloc it already loaded, and
// bind() resolves every entry point below from that same loaded copy (dlopen with
// RTLD_NOLOAD), so both sides use one set of engines. Written once, before anything else
// runs; read-only after.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "pyalloc_c.h"

namespace pyalloc::engine_api {

struct Api {
  int (*alloc)(pyalloc_engine*, size_t, uintptr_t, void**) = nullptr;
  int (*free)(pyalloc_engine*, void*, size_t) = nullptr;
  const char* (*last_error)() = nullptr;
  pyalloc_engine* (*installed_engine)(int) = nullptr;
  void (*pluggable_free)(void*, size_t, int, void*) = nullptr;
  int (*set_evict_callback)(pyalloc_engine*, pyalloc_evict_fn, void*) = nullptr;
  int (*set_compact_callbacks)(pyalloc_engine*, pyalloc_movable_fn, pyalloc_relocate_fn,
                               void*) = nullptr;
  int (*set_oom_describe_callback)(pyalloc_engine*, pyalloc_describe_fn, void*) = nullptr;
  int (*set_evictable)(pyalloc_engine*, void*, uint64_t, double) = nullptr;
  int (*set_last_resort_evictable)(pyalloc_engine*, void*, uint64_t, double) = nullptr;
  int (*touch)(pyalloc_engine*, void*) = nullptr;
  size_t (*take_freed_marked)(pyalloc_engine*, uint64_t*, size_t, int*) = nullptr;
  uint64_t (*freed_marked_count)(pyalloc_engine*) = nullptr;
  void (*set_thread_placement)(void*) = nullptr;
  void (*set_thread_may_evict)(int) = nullptr;
  int (*set_thread_tentative)(int) = nullptr;
  int (*set_thread_evictable)(int) = nullptr;
  int (*swap_out)(pyalloc_engine*, void*, size_t, uintptr_t, uint64_t*) = nullptr;
  int (*swap_in)(pyalloc_engine*, uint64_t, void*, uintptr_t) = nullptr;
  int (*swap_wait)(pyalloc_engine*, uint64_t, uintptr_t) = nullptr;
  int (*swap_ready)(pyalloc_engine*, uint64_t) = nullptr;
  int (*swap_release)(pyalloc_engine*, uint64_t) = nullptr;
  int (*unallocated)(pyalloc_engine*, uint64_t*) = nullptr;
  uint64_t (*blocked_ns)(pyalloc_engine*) = nullptr;
  int (*allocated)(pyalloc_engine*, uint64_t*, uint64_t*) = nullptr;
  int (*reset_peak_stats)(pyalloc_engine*) = nullptr;
};

// The bound API (all null before bind()).
const Api& api();

// Resolves every entry point from the libpyalloc loaded at `library_path`. Returns "" or
// what is missing (a libpyalloc older than this build, or a path that is not loaded).
std::string bind(const char* library_path);

// The last error of the engine's C API on this thread, as a string.
inline std::string last_error() {
  const char* e = api().last_error ? api().last_error() : nullptr;
  return e ? e : "unknown error";
}

}  // namespace pyalloc::engine_api
