// torch_shim.cpp — PyTorch-typed faces of the engine.
//
// 1. The simulated device: a c10 CPU allocator that serves PyTorch CPU tensors from a
//    pyalloc engine (pyalloc_cpu_shim_install).
// 2. CUDA entry points for CUDAPluggableAllocator that throw c10::OutOfMemoryError, so an
//    OOM reaches Python as torch.OutOfMemoryError (catchable as such) rather than the
//    plain RuntimeError that libpyalloc's own pyalloc_malloc must raise without torch.
//
// Built against the installed torch on first use (pyalloc/_torch_shim.py), together with
// the registry's per-op path (registry/src/), and cached, so libpyalloc itself never
// depends on torch. It reaches libpyalloc only through the entry points
// registry/src/engine_api.h resolves from the copy Python loaded, which keeps the two
// libraries' symbols apart.
//
// Lifetime: once installed, tensors carry these deleters, so the shim and the engines must
// outlive every such tensor. Neither is ever unloaded or destroyed.
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <cstdint>
#include <cstdio>

#include "engine_api.h"
#include "pyalloc_c.h"

namespace {

using pyalloc::engine_api::api;

pyalloc_engine* g_engine = nullptr;  // the simulated device's (CPU shim only)
c10::Allocator* g_previous = nullptr;

// Turns a failed engine allocation into the error PyTorch users expect.
[[noreturn]] void throw_alloc_error(int rc) {
  if (rc == PYALLOC_OOM) {
    TORCH_CHECK_WITH(OutOfMemoryError, false, api().last_error());
  }
  TORCH_CHECK(false, "pyalloc: ", api().last_error());
  __builtin_unreachable();
}

void shim_delete(void* ptr) {
  if (!ptr) return;
  // Called from tensor destructors: report, never throw.
  if (api().free(g_engine, ptr, SIZE_MAX) != 0) {
    std::fprintf(stderr, "pyalloc: warning: %s\n", api().last_error());
  }
}

class ShimAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    void* ptr = nullptr;
    // CPU work is synchronous: everything runs on the simulated device's stream 0.
    int rc = api().alloc(g_engine, nbytes, 0, &ptr);
    if (rc != 0) throw_alloc_error(rc);
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

#define PYALLOC_SHIM_API extern "C" __attribute__((visibility("default")))

// pyalloc_shim_bind(libpyalloc_path), which resolves libpyalloc's entry points before
// anything here runs, and pyalloc_shim_last_error() are with the registry's C surface
// (registry/src/c_api.cpp).

// --- CUDA: the functions CUDAPluggableAllocator loads from this library -------------------
// Same signatures as pyalloc_malloc / pyalloc_free in libpyalloc (cudaStream_t as void*).
PYALLOC_SHIM_API void* pyalloc_torch_malloc(size_t size, int device, void* stream) {
  pyalloc_engine* engine = api().installed_engine(device);
  TORCH_CHECK(engine != nullptr, "pyalloc: ", api().last_error());
  void* ptr = nullptr;
  int rc = api().alloc(engine, size, reinterpret_cast<uintptr_t>(stream), &ptr);
  if (rc != 0) throw_alloc_error(rc);
  return ptr;
}

PYALLOC_SHIM_API void pyalloc_torch_free(void* ptr, size_t size, int device, void* stream) {
  api().pluggable_free(ptr, size, device, stream);  // never throws; reports bad frees itself
}

// --- CPU: the simulated device --------------------------------------------------------
PYALLOC_SHIM_API int pyalloc_cpu_shim_install(void* engine) {
  if (!engine || !api().alloc) return 1;
  g_engine = static_cast<pyalloc_engine*>(engine);
  g_previous = c10::GetCPUAllocator();
  c10::SetCPUAllocator(&g_shim, kPriority);
  return 0;
}

// New CPU tensors come from the previous allocator again; tensors the shim allocated
// keep their deleter and are freed into the engine as usual.
PYALLOC_SHIM_API int pyalloc_cpu_shim_uninstall() {
  if (!g_previous) return 1;
  c10::SetCPUAllocator(g_previous, kPriority);
  g_previous = nullptr;
  return 0;
}

PYALLOC_SHIM_API int pyalloc_cpu_shim_active() {
  return c10::GetCPUAllocator() == &g_shim ? 1 : 0;
}
