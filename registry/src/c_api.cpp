// c_api.cpp — the registry's C surface, called by pyalloc/registry.py through ctypes.
//
// Same conventions as libpyalloc's (csrc/pyalloc_c.h): nothing throws across it; functions
// return 0 on success and nonzero on failure with the reason in pyalloc_shim_last_error()
// (per thread); strings returned as char* are the caller's, released with
// pyalloc_shim_string_free. ctypes drops the GIL around every call, and nothing here needs it.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "dispatch.h"
#include "registry.h"

#define PYALLOC_SHIM_API extern "C" __attribute__((visibility("default")))

using pyalloc::registry::registry;

namespace {
thread_local std::string t_error;
thread_local bool t_error_oom = false;  // the last failure was out of memory

int fail(std::string message, bool oom = false) {
  t_error = std::move(message);
  t_error_oom = oom;
  return 1;
}

char* to_c_string(const std::string& s) {
  char* out = static_cast<char*>(std::malloc(s.size() + 1));
  if (out) std::memcpy(out, s.c_str(), s.size() + 1);
  return out;
}

// Runs `fn`, turning an exception into a failure.
template <typename Fn>
int guarded(Fn&& fn) {
  try {
    return fn();
  } catch (const c10::OutOfMemoryError& e) {
    return fail(e.what_without_backtrace(), /*oom=*/true);
  } catch (const c10::Error& e) {
    return fail(e.what_without_backtrace());
  } catch (const std::exception& e) {
    return fail(e.what());
  }
}
}  // namespace

PYALLOC_SHIM_API const char* pyalloc_shim_last_error() { return t_error.c_str(); }

// Whether the calling thread's last failure was out of memory (torch.OutOfMemoryError).
PYALLOC_SHIM_API int pyalloc_shim_last_error_is_oom() { return t_error_oom ? 1 : 0; }

PYALLOC_SHIM_API void pyalloc_shim_string_free(char* s) { std::free(s); }

// Resolves libpyalloc's entry points from the copy loaded at `libpyalloc_path` (See
// engine_api.h). Call once, before anything else in this library.
PYALLOC_SHIM_API int pyalloc_shim_bind(const char* libpyalloc_path) {
  std::string error = pyalloc::engine_api::bind(libpyalloc_path);
  return error.empty() ? 0 : fail("pyalloc: binding the torch shim failed: " + error);
}

PYALLOC_SHIM_API int pyalloc_registry_register() {
  return guarded([] {
    std::string error = pyalloc::registry::register_fallback();
    return error.empty() ? 0 : fail(error);
  });
}

// policy: 0 recompute, 1 swap, 2 hybrid. cost: 0 model, 1 time, 2 bytes. device_index < 0:
// the simulated device (CPU tensors); else that CUDA device.
PYALLOC_SHIM_API int pyalloc_registry_start(void* engine, int policy, int cost, uint64_t min_bytes,
                                            int prefetch, int relocate, int device_index,
                                            int place_evictables) {
  using namespace pyalloc::registry;
  if (policy < 0 || policy > 2) return fail("policy must be 0 (recompute), 1 (swap) or 2 (hybrid)");
  if (cost < 0 || cost > 2) return fail("cost must be 0 (model), 1 (time) or 2 (bytes)");
  if (prefetch < 0) return fail("prefetch must be >= 0");
  Settings s;
  s.policy = static_cast<Policy>(policy);
  s.cost = static_cast<CostModel>(cost);
  s.min_bytes = min_bytes;
  s.prefetch = prefetch;
  s.relocate = relocate != 0;
  s.place_evictables = place_evictables != 0;
  s.device_type = device_index < 0 ? c10::DeviceType::CPU : c10::DeviceType::CUDA;
  s.device_index = device_index < 0 ? 0 : device_index;
  return guarded([&] {
    std::string error = registry().start(static_cast<pyalloc_engine*>(engine), s);
    return error.empty() ? 0 : fail(error);
  });
}

PYALLOC_SHIM_API int pyalloc_registry_stop() {
  return guarded([] {
    std::string error = registry().stop();
    return error.empty() ? 0 : fail(error);
  });
}

PYALLOC_SHIM_API int pyalloc_registry_restore_all() {
  return guarded([] {
    registry().restore_all();
    return 0;
  });
}

// Note [Holding for compiled code] in registry.h. Returns how many handles it wrote, or
// SIZE_MAX on an error (pyalloc_shim_last_error says which).
PYALLOC_SHIM_API size_t pyalloc_registry_hold(const void* const* keys, size_t count,
                                              uint64_t* handles) {
  if ((!keys || !handles) && count) return SIZE_MAX;
  std::size_t held = 0;
  const int failed = guarded([&] {
    registry().hold(reinterpret_cast<const c10::StorageImpl* const*>(keys), count, handles,
                    &held);
    return 0;
  });
  return failed ? SIZE_MAX : held;
}

PYALLOC_SHIM_API void pyalloc_registry_release(const uint64_t* handles, size_t count) {
  if (handles || !count) registry().release(handles, count);
}

// Note [What a subclass's results keep inside] in registry.cpp. How many nodes it made, or
// SIZE_MAX on an error.
PYALLOC_SHIM_API size_t pyalloc_registry_adopt(const void* const* keys, size_t count) {
  if (!keys && count) return SIZE_MAX;
  std::size_t made = 0;
  const int failed = guarded([&] {
    made = registry().adopt(reinterpret_cast<const c10::StorageImpl* const*>(keys), count);
    return 0;
  });
  return failed ? SIZE_MAX : made;
}

// Note [Storages the program reads itself] in restore.cpp. 0, or -1 on an error.
PYALLOC_SHIM_API int pyalloc_registry_expose(const void* storage_impl, int fix) {
  return guarded([&] {
    registry().expose(static_cast<const c10::StorageImpl*>(storage_impl), fix != 0);
    return 0;
  });
}

// Note [Storages resized outside the dispatcher] in restore.cpp. 0, or -1 on an error.
PYALLOC_SHIM_API int pyalloc_registry_before_resize(const void* storage_impl) {
  return guarded([&] {
    registry().before_resize(static_cast<const c10::StorageImpl*>(storage_impl));
    return 0;
  });
}

PYALLOC_SHIM_API void pyalloc_registry_collect() { registry().collect(); }

PYALLOC_SHIM_API int pyalloc_registry_active() { return registry().active() ? 1 : 0; }

// 1 when this torch lets an evicted storage refuse access to its data (Note [Reads of
// evicted memory] in node.h), so that a read outside the dispatcher raises; else 0.
PYALLOC_SHIM_API int pyalloc_registry_evicted_data_refuses() {
  return pyalloc::registry::kEvictedDataRefuses ? 1 : 0;
}

// Includes (on != 0) or removes the registry's key in the calling thread's key set; returns
// whether it was included before (0 or 1).
PYALLOC_SHIM_API int pyalloc_registry_thread_enable(int on) {
  return pyalloc::registry::set_thread_enabled(on != 0) ? 1 : 0;
}

PYALLOC_SHIM_API void pyalloc_registry_interrupt(int on) { registry().interrupt(on != 0); }

PYALLOC_SHIM_API uint64_t pyalloc_registry_evict(const uint64_t* handles, size_t count) {
  if (!handles && count) return 0;
  try {
    return registry().evict(handles, count);
  } catch (const std::exception& e) {
    fail(e.what());
    return 0;
  }
}

PYALLOC_SHIM_API char* pyalloc_registry_stats_json() {
  try {
    return to_c_string(registry().stats_json());
  } catch (const std::exception& e) {
    fail(e.what());
    return nullptr;
  }
}

PYALLOC_SHIM_API char* pyalloc_registry_replays_json() {
  try {
    return to_c_string(registry().replays_json());
  } catch (const std::exception& e) {
    fail(e.what());
    return nullptr;
  }
}

// Writes up to `capacity` handles (in creation order) to out; returns how many there are.
PYALLOC_SHIM_API size_t pyalloc_registry_handles(uint64_t* out, size_t capacity) {
  std::vector<uint64_t> all = registry().handles();
  for (size_t i = 0; i < all.size() && i < capacity; ++i) out[i] = all[i];
  return all.size();
}

// 1 and *out filled when the node exists; 0 when it does not.
PYALLOC_SHIM_API int pyalloc_registry_node_info(uint64_t handle, pyalloc::registry::NodeInfo* out) {
  if (!out) return 0;
  return registry().node_info(handle, out) ? 1 : 0;
}

// The handle of the node of a storage (a StorageImpl*, UntypedStorage._cdata), or 0.
PYALLOC_SHIM_API uint64_t pyalloc_registry_handle_of(void* storage_impl) {
  return registry().handle_of(storage_impl);
}

PYALLOC_SHIM_API int pyalloc_registry_check_invariants() {
  std::string error = registry().check_invariants();
  return error.empty() ? 0 : fail("pyalloc: registry invariant broken: " + error);
}

PYALLOC_SHIM_API void pyalloc_registry_set_copy_bandwidth(double bytes_per_s) {
  registry().set_copy_bandwidth(bytes_per_s);
}

PYALLOC_SHIM_API void pyalloc_registry_set_replay_limits(int in_order, int give_up, int* was) {
  registry().set_replay_limits(in_order, give_up, was);
}

PYALLOC_SHIM_API void pyalloc_registry_set_floor_probe(int on) {
  registry().set_floor_probe(on != 0);
}

PYALLOC_SHIM_API char* pyalloc_registry_floor_json() { return to_c_string(registry().floor_json()); }
