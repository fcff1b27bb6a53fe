// engine_api.cpp — resolving libpyalloc's C API from the copy Python loaded.
#include "engine_api.h"

#include <dlfcn.h>

namespace pyalloc::engine_api {
namespace {
Api g_api;  // See engine_api.h: written by bind(), read-only after.

template <typename Fn>
bool resolve(void* lib, const char* name, Fn* out, std::string* missing) {
  void* sym = dlsym(lib, name);
  if (!sym) {
    *missing += missing->empty() ? std::string(name) : std::string(", ") + name;
    return false;
  }
  *out = reinterpret_cast<Fn>(sym);
  return true;
}
}  // namespace

const Api& api() { return g_api; }

std::string bind(const char* library_path) {
  if (!library_path) return "the path of libpyalloc is NULL";
  // RTLD_NOLOAD: the copy Python already loaded, never a second one with engines of its own.
  void* lib = dlopen(library_path, RTLD_NOW | RTLD_NOLOAD);
  if (!lib) {
    return std::string("libpyalloc is not loaded from ") + library_path +
           " (load it with pyalloc._lib.lib() first): " + dlerror();
  }
  Api a;
  std::string missing;
  resolve(lib, "pyalloc_engine_alloc", &a.alloc, &missing);
  resolve(lib, "pyalloc_engine_free", &a.free, &missing);
  resolve(lib, "pyalloc_last_error", &a.last_error, &missing);
  resolve(lib, "pyalloc_installed_engine", &a.installed_engine, &missing);
  resolve(lib, "pyalloc_free", &a.pluggable_free, &missing);
  resolve(lib, "pyalloc_engine_set_evict_callback", &a.set_evict_callback, &missing);
  resolve(lib, "pyalloc_engine_set_compact_callbacks", &a.set_compact_callbacks, &missing);
  resolve(lib, "pyalloc_engine_set_oom_describe_callback", &a.set_oom_describe_callback, &missing);
  resolve(lib, "pyalloc_engine_set_evictable", &a.set_evictable, &missing);
  resolve(lib, "pyalloc_engine_set_last_resort_evictable", &a.set_last_resort_evictable, &missing);
  resolve(lib, "pyalloc_engine_touch", &a.touch, &missing);
  resolve(lib, "pyalloc_engine_take_freed_marked", &a.take_freed_marked, &missing);
  resolve(lib, "pyalloc_engine_freed_marked_count", &a.freed_marked_count, &missing);
  resolve(lib, "pyalloc_set_thread_placement", &a.set_thread_placement, &missing);
  resolve(lib, "pyalloc_set_thread_may_evict", &a.set_thread_may_evict, &missing);
  resolve(lib, "pyalloc_set_thread_tentative", &a.set_thread_tentative, &missing);
  resolve(lib, "pyalloc_set_thread_evictable", &a.set_thread_evictable, &missing);
  resolve(lib, "pyalloc_engine_swap_out", &a.swap_out, &missing);
  resolve(lib, "pyalloc_engine_swap_in", &a.swap_in, &missing);
  resolve(lib, "pyalloc_engine_swap_wait", &a.swap_wait, &missing);
  resolve(lib, "pyalloc_engine_swap_ready", &a.swap_ready, &missing);
  resolve(lib, "pyalloc_engine_swap_release", &a.swap_release, &missing);
  resolve(lib, "pyalloc_engine_unallocated", &a.unallocated, &missing);
  resolve(lib, "pyalloc_engine_blocked_ns", &a.blocked_ns, &missing);
  resolve(lib, "pyalloc_engine_allocated", &a.allocated, &missing);
  resolve(lib, "pyalloc_engine_reset_peak_stats", &a.reset_peak_stats, &missing);
  dlclose(lib);  // drops only the reference RTLD_NOLOAD took; Python's keeps it loaded
  if (!missing.empty()) {
    return "libpyalloc at " + std::string(library_path) + " lacks " + missing +
           " (a build older than its Python package: reinstall pyalloc)";
  }
  g_api = a;
  return "";
}

}  // namespace pyalloc::engine_api
