// torch_shim.cpp — the only code built against torch: PyTorch-typed faces of the engine.
//
// 1. The simulated device: a c10 CPU allocator that serves PyTorch CPU tensors from a
//    pyalloc engine (pyalloc_cpu_shim_install).
// 2. CUDA entry points for CUDAPluggableAllocator that throw c10::OutOfMemoryError, so an
//    OOM reaches Python as torch.OutOfMemoryError (catchable as such) rather than the
//    plain RuntimeError that libpyalloc's own pyalloc_malloc must raise without torch.
//
// 3. Compaction's last step: swapping the memory behind two storages of the same size
//    (pyalloc_shim_swap_storage_data), which Python cannot do.
//
// Built against the installed torch on first use (pyalloc/_torch_shim.py) and cached, so
// libpyalloc itself never depends on torch. It talks to libpyalloc only through function
// pointers handed over by pyalloc_shim_bind(), which keeps the two libraries' symbols
// apart.
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

#include "pyalloc_c.h"

namespace {

using AllocFn = int (*)(pyalloc_engine*, size_t, uintptr_t, void**);
using FreeFn = int (*)(pyalloc_engine*, void*, size_t);
using LastErrorFn = const char* (*)();
using InstalledEngineFn = pyalloc_engine* (*)(int);
using PluggableFreeFn = void (*)(void*, size_t, int, void*);

struct EngineApi {
  AllocFn alloc = nullptr;
  FreeFn free = nullptr;
  LastErrorFn last_error = nullptr;
  InstalledEngineFn installed_engine = nullptr;
  PluggableFreeFn pluggable_free = nullptr;
  pyalloc_engine* engine = nullptr;  // the simulated device's (CPU shim only)
};
// Written once by pyalloc_shim_bind, before any allocator is registered; read-only after.
EngineApi g_api;
c10::Allocator* g_previous = nullptr;

// Turns a failed engine allocation into the error PyTorch users expect.
[[noreturn]] void throw_alloc_error(int rc) {
  if (rc == PYALLOC_OOM) {
    TORCH_CHECK_WITH(OutOfMemoryError, false, g_api.last_error());
  }
  TORCH_CHECK(false, "pyalloc: ", g_api.last_error());
  __builtin_unreachable();
}

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

// Hands over libpyalloc's entry points. Call once, before installing anything.
PYALLOC_SHIM_API int pyalloc_shim_bind(void* alloc_fn, void* free_fn, void* last_error_fn,
                                       void* installed_engine_fn, void* pluggable_free_fn) {
  if (!alloc_fn || !free_fn || !last_error_fn || !installed_engine_fn || !pluggable_free_fn) {
    return 1;
  }
  g_api.alloc = reinterpret_cast<AllocFn>(alloc_fn);
  g_api.free = reinterpret_cast<FreeFn>(free_fn);
  g_api.last_error = reinterpret_cast<LastErrorFn>(last_error_fn);
  g_api.installed_engine = reinterpret_cast<InstalledEngineFn>(installed_engine_fn);
  g_api.pluggable_free = reinterpret_cast<PluggableFreeFn>(pluggable_free_fn);
  return 0;
}

// --- CUDA: the functions CUDAPluggableAllocator loads from this library -------------------
// Same signatures as pyalloc_malloc / pyalloc_free in libpyalloc (cudaStream_t as void*).
PYALLOC_SHIM_API void* pyalloc_torch_malloc(size_t size, int device, void* stream) {
  pyalloc_engine* engine = g_api.installed_engine(device);
  TORCH_CHECK(engine != nullptr, "pyalloc: ", g_api.last_error());
  void* ptr = nullptr;
  int rc = g_api.alloc(engine, size, reinterpret_cast<uintptr_t>(stream), &ptr);
  if (rc != 0) throw_alloc_error(rc);
  return ptr;
}

PYALLOC_SHIM_API void pyalloc_torch_free(void* ptr, size_t size, int device, void* stream) {
  g_api.pluggable_free(ptr, size, device, stream);  // never throws; reports bad frees itself
}

// --- CPU: the simulated device --------------------------------------------------------
PYALLOC_SHIM_API int pyalloc_cpu_shim_install(void* engine) {
  if (!engine || !g_api.alloc) return 1;
  g_api.engine = static_cast<pyalloc_engine*>(engine);
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

// --- compaction: repointing a storage -------------------------------------------------
// `a` and `b` are StorageImpl pointers (UntypedStorage._cdata). Their DataPtrs — memory,
// deleter and context — trade places, so every tensor and view of `a` sees b's memory and
// vice versa; nothing else about either storage changes (no version bump, no copy). The
// registry copies a's bytes into b first, then drops b, which frees a's old memory through
// its own deleter. 1: the storages differ in size or device, or either is not resizable
// (its memory is not the allocator's to move).
PYALLOC_SHIM_API int pyalloc_shim_swap_storage_data(void* a, void* b) {
  auto* sa = static_cast<c10::StorageImpl*>(a);
  auto* sb = static_cast<c10::StorageImpl*>(b);
  if (!sa || !sb || sa == sb) return 1;
  if (sa->nbytes() != sb->nbytes() || sa->device() != sb->device()) return 1;
  if (!sa->resizable() || !sb->resizable()) return 1;
  c10::DataPtr from_a = sa->set_data_ptr(std::move(sb->mutable_data_ptr()));
  sb->set_data_ptr_noswap(std::move(from_a));
  return 0;
}
