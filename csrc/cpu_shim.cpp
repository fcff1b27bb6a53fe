// cpu_shim.cpp — routes PyTorch CPU tensors into a pyalloc engine: the simulated device.
//
// Built against the installed torch on first use (pyalloc/_cpu_shim.py) and cached, so
// libpyalloc itself never depends on torch. It talks to libpyalloc only through function
// pointers handed over by pyalloc_cpu_shim_install(), which keeps the two libraries'
// symbols apart.
//
// Lifetime: once installed, tensors carry shim_delete as their deleter, so the shim and
// the engine must outlive every such tensor. Neither is ever unloaded or destroyed.
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <cstdint>
#include <cstdio>

#include "pyalloc_c.h"

namespace {

using AllocFn = int (*)(pyalloc_engine*, size_t, uintptr_t, void**);
using FreeFn = int (*)(pyalloc_engine*, void*, size_t);
using LastErrorFn = const char* (*)();

struct EngineApi {
  AllocFn alloc = nullptr;
  FreeFn free = nullptr;
  LastErrorFn last_error = nullptr;
  pyalloc_engine* engine = nullptr;
};
// Written once, before the allocator is registered; read-only afterwards.
EngineApi g_api;
c10::Allocator* g_previous = nullptr;

void shim_delete(void* ptr) {
  if (!ptr) return;
  // Called from tensor destructors: report, never throw.
  if (g_api.free(g_api.engine, ptr, SIZE_MAX) != 0) {
    std::fprintf(stderr, "pyalloc: warning: %s\n", g_api.last_error());
  }
}

class ShimAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    void* ptr = nullptr;
    // CPU work is synchronous: everything runs on the simulated device's stream 0.
    int rc = g_api.alloc(g_api.engine, nbytes, 0, &ptr);
    if (rc == PYALLOC_OOM) {
      TORCH_CHECK_WITH(OutOfMemoryError, false, g_api.last_error());
    }
    TORCH_CHECK(rc == 0, "pyalloc: ", g_api.last_error());
    return {ptr, ptr, &shim_delete, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &shim_delete; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

ShimAllocator g_shim;

// Above the default CPU allocator's priority (0), so the registration takes effect.
constexpr uint8_t kPriority = 100;

}  // namespace

extern "C" __attribute__((visibility("default"))) int pyalloc_cpu_shim_install(
    void* alloc_fn, void* free_fn, void* last_error_fn, void* engine) {
  if (!alloc_fn || !free_fn || !last_error_fn || !engine) return 1;
  g_api.alloc = reinterpret_cast<AllocFn>(alloc_fn);
  g_api.free = reinterpret_cast<FreeFn>(free_fn);
  g_api.last_error = reinterpret_cast<LastErrorFn>(last_error_fn);
  g_api.engine = static_cast<pyalloc_engine*>(engine);
  g_previous = c10::GetCPUAllocator();
  c10::SetCPUAllocator(&g_shim, kPriority);
  return 0;
}

// New CPU tensors come from the previous allocator again; tensors the shim allocated
// keep their deleter and are freed into the engine as usual.
extern "C" __attribute__((visibility("default"))) int pyalloc_cpu_shim_uninstall() {
  if (!g_previous) return 1;
  c10::SetCPUAllocator(g_previous, kPriority);
  g_previous = nullptr;
  return 0;
}

extern "C" __attribute__((visibility("default"))) int pyalloc_cpu_shim_active() {
  return c10::GetCPUAllocator() == &g_shim ? 1 : 0;
}
