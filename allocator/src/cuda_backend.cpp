// cuda_backend.cpp — Backend on a real GPU, through the CUDA driver API.
//
// libcuda is opened with dlopen on first use and never linked, so libpyalloc loads, and the
// simulated device works, on machines with no GPU and no driver. Nothing here runs at load
// time: the driver is first touched by make_cuda_backend() or cuda_device_count().
//
// Concurrency: the driver table is built once (a function-local static, whose initialisation
// C++11 makes thread-safe) and is read-only afterwards. A CudaBackend holds only values fixed
// at construction, so it has no lock; the driver API itself is thread-safe. The last error is
// thread_local, like errno, so concurrent failures never overwrite each other's message.
#include "cuda_backend.h"
#include "cuda_driver.h"  // Note [Declaring the driver API ourselves]

#include <dlfcn.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace pyalloc {
namespace {

// Note [Loading the driver with dlsym]
// cuGetProcAddress is NVIDIA's recommended lookup; what it adds is choosing per-thread-
// default-stream (_ptsz) variants and ABI versions at run time. We want neither: stream 0
// must be the legacy default stream, as in PyTorch, and structs must have the layout this
// file was compiled against. dlsym of the explicit ABI names ("cuMemGetInfo_v2",
// "cuStreamDestroy_v2", unsuffixed "cuEventRecord") pins both, and also works on drivers
// that have VMM (10.2) but predate cuGetProcAddress (11.3). Each pointer's type is decltype
// of the prototype of that same name in cuda_driver.h, which a test checks against cuda.h
// wherever a toolkit is found, so a signature cannot disagree with its symbol.
#define PYALLOC_REQUIRED_FNS(X)                                                            \
  X(cuInit) X(cuDeviceGet) X(cuDeviceGetCount) X(cuDeviceGetAttribute)                     \
  X(cuDevicePrimaryCtxRetain) X(cuCtxGetCurrent) X(cuCtxSetCurrent) X(cuCtxSynchronize)    \
  X(cuMemGetInfo_v2) X(cuMemGetAllocationGranularity) X(cuMemAddressReserve)               \
  X(cuMemAddressFree) X(cuMemCreate) X(cuMemRelease) X(cuMemMap) X(cuMemUnmap)              \
  X(cuMemSetAccess) X(cuStreamCreate) X(cuStreamDestroy_v2) X(cuStreamSynchronize)          \
  X(cuEventCreate) X(cuEventDestroy_v2) X(cuEventRecord) X(cuEventQuery)                    \
  X(cuEventSynchronize) X(cuStreamWaitEvent) X(cuMemcpyAsync) X(cuMemHostAlloc)             \
  X(cuMemFreeHost)
// Only used for messages and teardown, and to see a capture; a driver without them still
// works.
// cuMemHostRegister_v2 and cuMemHostUnregister let a host pool made at first use grow (Note
// [A host pool made at first use] in swap.cpp); without them it is pinned whole instead.
#define PYALLOC_OPTIONAL_FNS(X)                                                               \
  X(cuGetErrorString) X(cuGetErrorName) X(cuDevicePrimaryCtxRelease_v2) X(cuStreamIsCapturing) \
  X(cuMemHostRegister_v2) X(cuMemHostUnregister)

struct Driver {
#define PYALLOC_MEMBER(f) decltype(&::f) f = nullptr;
  PYALLOC_REQUIRED_FNS(PYALLOC_MEMBER)
  PYALLOC_OPTIONAL_FNS(PYALLOC_MEMBER)
#undef PYALLOC_MEMBER
  std::string load_error;  // empty iff libcuda loaded and every required symbol resolved
};

constexpr const char* kUseCpu = "Use pyalloc.install(device=\"cpu\") for the simulated device.";

Driver load_driver() {
  Driver d;
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    d.load_error = std::string("could not load libcuda.so.1 (") + (why ? why : "unknown reason") +
                   "): no NVIDIA driver on this machine. " + kUseCpu;
    return d;
  }
  // Never dlclose: contexts and mappings outlive any backend, and PyTorch uses the driver too.
#define PYALLOC_RESOLVE(f) d.f = reinterpret_cast<decltype(d.f)>(dlsym(lib, #f));
#define PYALLOC_REQUIRE(f)                                                             \
  PYALLOC_RESOLVE(f)                                                                   \
  if (d.f == nullptr && d.load_error.empty())                                          \
    d.load_error = "libcuda.so.1 has no " #f ": the NVIDIA driver is too old for CUDA " \
                   "virtual memory management; update it to R440 (CUDA 10.2) or newer. " + \
                   std::string(kUseCpu);
  PYALLOC_REQUIRED_FNS(PYALLOC_REQUIRE)
  PYALLOC_OPTIONAL_FNS(PYALLOC_RESOLVE)
#undef PYALLOC_REQUIRE
#undef PYALLOC_RESOLVE
  return d;
}
#undef PYALLOC_REQUIRED_FNS
#undef PYALLOC_OPTIONAL_FNS

const Driver& driver() {
  static const Driver d = load_driver();
  return d;
}

// "out of memory (CUDA_ERROR_OUT_OF_MEMORY)"
std::string describe(const Driver& d, CUresult r) {
  const char* text = nullptr;
  const char* name = nullptr;
  if (d.cuGetErrorString != nullptr) d.cuGetErrorString(r, &text);  // leaves null if unknown
  if (d.cuGetErrorName != nullptr) d.cuGetErrorName(r, &name);
  return std::string(text ? text : "unknown error") + " (" +
         (name ? std::string(name) : "CUresult " + std::to_string(static_cast<int>(r))) + ")";
}

thread_local std::string t_last_error;

// Note [Current context]
// We use the device's primary context because PyTorch's runtime does: its kernels can touch
// our mappings, and cuCtxSynchronize there waits for its streams too. The current context is
// per thread, and our callers (autograd's backward thread, swap workers) may have none, or
// another device's. So every driver call runs under a ContextGuard: one cuCtxGetCurrent (a
// thread-local read in the driver) when ours is current — the usual case — else a switch
// undone on return. Undoing matters: the runtime takes its current device from the current
// context, so leaving ours behind would change torch.cuda.current_device() on that thread.
class ContextGuard {
 public:
  ContextGuard(const Driver& d, CUcontext ctx) : d_(d) {
    if (d_.cuCtxGetCurrent(&prev_) != CUDA_SUCCESS) prev_ = nullptr;
    // If the switch fails the call that follows fails too, and reports it.
    if (prev_ != ctx) switched_ = d_.cuCtxSetCurrent(ctx) == CUDA_SUCCESS;
  }
  ~ContextGuard() { if (switched_) d_.cuCtxSetCurrent(prev_); }
  ContextGuard(const ContextGuard&) = delete;
  ContextGuard& operator=(const ContextGuard&) = delete;

 private:
  const Driver& d_;
  CUcontext prev_ = nullptr;
  bool switched_ = false;
};

CUmemAllocationProp device_memory_prop(int device) {
  CUmemAllocationProp prop{};  // zeroed: no export handle, no compression, no RDMA flag
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

static_assert(sizeof(CUmemGenericAllocationHandle) <= sizeof(std::uintptr_t) &&
              sizeof(CUdeviceptr) <= sizeof(std::uintptr_t), "handles must fit uintptr_t");

class CudaBackend final : public Backend {
 public:
  CudaBackend(const Driver& d, int device, CUdevice dev, CUcontext ctx, std::size_t granularity)
      : d_(d), device_(device), dev_(dev), ctx_(ctx), granularity_(granularity) {}

  // Drops make_cuda_backend's reference; PyTorch's runtime holds its own, so the context
  // survives. Streams and events are the engine's to destroy first.
  ~CudaBackend() override {
    if (d_.cuDevicePrimaryCtxRelease_v2 != nullptr) d_.cuDevicePrimaryCtxRelease_v2(dev_);
  }

  const char* name() const override { return "cuda"; }
  int device() const override { return device_; }
  std::size_t granularity() const override { return granularity_; }
  std::string last_error() const override { return t_last_error; }

  MemInfo mem_info() override {
    ContextGuard guard(d_, ctx_);
    MemInfo info;
    const CUresult r = d_.cuMemGetInfo_v2(&info.free_bytes, &info.total_bytes);
    return check(r, "cuMemGetInfo") ? info : MemInfo{};
  }

  // --- virtual memory --------------------------------------------------------------
  std::uintptr_t reserve(std::size_t bytes) override {
    ContextGuard guard(d_, ctx_);
    CUdeviceptr va = 0;
    const CUresult r = d_.cuMemAddressReserve(&va, bytes, granularity_, 0, 0);
    return check(r, "cuMemAddressReserve", bytes) ? static_cast<std::uintptr_t>(va) : 0;
  }

  // The driver refuses while any part of the range is still mapped: unmap first.
  void unreserve(std::uintptr_t va, std::size_t bytes) override {
    ContextGuard guard(d_, ctx_);
    check(d_.cuMemAddressFree(va, bytes), "cuMemAddressFree", bytes);
  }

  // Note [One handle per chunk]
  // cuMemMap maps a physical allocation from its offset 0 only, so a part of one
  // cuMemCreate handle can never appear at a second address. Stitching (pool.h, Note
  // [Stitching]) maps parts of segments into fresh ranges; so a segment's physical memory
  // is made of one handle per granularity chunk (2 MiB), as PyTorch's expandable segments
  // make theirs of one handle per segment-size unit. PhysicalHandle::handle points to the
  // list of chunk handles. Each chunk is mapped, and unmapped, on its own (cuMemUnmap
  // takes only whole mappings); access is set once per range.
  struct Chunks {
    std::vector<CUmemGenericAllocationHandle> handles;
  };
  static Chunks* chunks_of(PhysicalHandle phys) { return reinterpret_cast<Chunks*>(phys.handle); }

  // CUDA_ERROR_OUT_OF_MEMORY is the expected outcome the engine's reclaim ladder handles;
  // like every failure it is only recorded, never printed.
  PhysicalHandle create_physical(std::size_t bytes) override {
    if (bytes == 0 || bytes % granularity_ != 0) {
      t_last_error = "create_physical: " + std::to_string(bytes) +
                     " bytes is not a positive multiple of the granularity";
      return {};
    }
    ContextGuard guard(d_, ctx_);
    const CUmemAllocationProp prop = device_memory_prop(device_);
    auto chunks = std::make_unique<Chunks>();
    chunks->handles.reserve(bytes / granularity_);
    for (std::size_t done = 0; done < bytes; done += granularity_) {
      CUmemGenericAllocationHandle handle = 0;
      if (!check(d_.cuMemCreate(&handle, granularity_, &prop, 0), "cuMemCreate", bytes)) {
        for (CUmemGenericAllocationHandle h : chunks->handles) d_.cuMemRelease(h);
        return {};
      }
      chunks->handles.push_back(handle);
    }
    return PhysicalHandle{reinterpret_cast<std::uintptr_t>(chunks.release()), bytes};
  }

  // Legal while still mapped: the driver frees each chunk once its last mapping goes.
  void release_physical(PhysicalHandle phys) override {
    if (!phys) return;
    ContextGuard guard(d_, ctx_);
    std::unique_ptr<Chunks> chunks(chunks_of(phys));
    for (CUmemGenericAllocationHandle h : chunks->handles)
      check(d_.cuMemRelease(h), "cuMemRelease", granularity_);
  }

  bool map(std::uintptr_t va, PhysicalHandle phys) override {
    return map_part(va, phys, 0, phys.bytes);
  }

  // Maps chunks [offset, offset + bytes) of `phys` at `va`, then makes them accessible; all
  // or nothing.
  bool map_part(std::uintptr_t va, PhysicalHandle phys, std::size_t offset,
                std::size_t bytes) override {
    if (bytes == 0 || offset % granularity_ != 0 || bytes % granularity_ != 0 ||
        offset + bytes > phys.bytes) {
      t_last_error = "map_part: offset and size must be whole chunks inside the allocation";
      return false;
    }
    ContextGuard guard(d_, ctx_);
    return map_chunk_handles(va, chunks_of(phys)->handles.data() + offset / granularity_,
                             bytes / granularity_);
  }

  // Every chunk of every handle, back to back.
  bool map_handles(std::uintptr_t va, const PhysicalHandle* handles, std::size_t count) override {
    std::vector<CUmemGenericAllocationHandle> all;
    for (std::size_t i = 0; i < count; ++i) {
      const std::vector<CUmemGenericAllocationHandle>& hs = chunks_of(handles[i])->handles;
      all.insert(all.end(), hs.begin(), hs.end());
    }
    if (all.empty()) return true;
    ContextGuard guard(d_, ctx_);
    return map_chunk_handles(va, all.data(), all.size());
  }

  // Does not wait for in-flight kernels; see synchronize_device() in backend.h.
  void unmap(std::uintptr_t va, std::size_t bytes) override {
    ContextGuard guard(d_, ctx_);
    unmap_chunks(va, bytes);
  }

  // --- streams and events ----------------------------------------------------------
  // Non-blocking, so our streams never serialise with PyTorch's legacy default stream;
  // ordering with it goes through events. On failure returns 0, the default stream: still
  // correct, only without overlap.
  StreamId create_stream() override {
    ContextGuard guard(d_, ctx_);
    CUstream stream = nullptr;
    if (!check(d_.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate")) return 0;
    return reinterpret_cast<StreamId>(stream);
  }

  void destroy_stream(StreamId stream) override {
    if (stream == 0) return;  // the default stream is not ours to destroy
    ContextGuard guard(d_, ctx_);
    check(d_.cuStreamDestroy_v2(as_stream(stream)), "cuStreamDestroy");
  }

  // Timing disabled: it makes record and query cheaper, and we never read elapsed time.
  // Returns 0 on failure; the methods below reject event 0 rather than pass it on.
  EventId create_event() override {
    ContextGuard guard(d_, ctx_);
    CUevent event = nullptr;
    if (!check(d_.cuEventCreate(&event, CU_EVENT_DISABLE_TIMING), "cuEventCreate")) return 0;
    return reinterpret_cast<EventId>(event);
  }

  void destroy_event(EventId event) override {
    if (event == 0) return;
    ContextGuard guard(d_, ctx_);
    check(d_.cuEventDestroy_v2(as_event(event)), "cuEventDestroy");
  }

  bool record_event(EventId event, StreamId stream) override {
    if (event == 0) return no_event("cuEventRecord");
    ContextGuard guard(d_, ctx_);
    return check(d_.cuEventRecord(as_event(event), as_stream(stream)), "cuEventRecord");
  }

  // Note [Event errors]
  // Only NOT_READY means "still running". Any other error (a sticky fault such as an illegal
  // address, or a destroyed context) means the work will never complete normally; answering
  // false would make the allocator hold the block forever and spin. So we record the error
  // and say "done": the fault itself resurfaces at PyTorch's next CUDA call.
  bool query_event(EventId event) override {
    if (event == 0) return !no_event("cuEventQuery");
    ContextGuard guard(d_, ctx_);
    const CUresult r = d_.cuEventQuery(as_event(event));
    if (r == CUDA_ERROR_NOT_READY) return false;
    check(r, "cuEventQuery");
    return true;
  }

  void synchronize_event(EventId event) override {
    if (event == 0) return (void)no_event("cuEventSynchronize");
    ContextGuard guard(d_, ctx_);
    check(d_.cuEventSynchronize(as_event(event)), "cuEventSynchronize");
  }

  bool stream_wait_event(StreamId stream, EventId event) override {
    if (event == 0) return no_event("cuStreamWaitEvent");
    ContextGuard guard(d_, ctx_);
    const CUresult r = d_.cuStreamWaitEvent(as_stream(stream), as_event(event), 0);
    return check(r, "cuStreamWaitEvent");
  }

  // Note [Graph pools] in block.h. The legacy-stream symbol, as everywhere here.
  bool stream_is_capturing(StreamId stream) const override {
    if (d_.cuStreamIsCapturing == nullptr) return false;
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    if (d_.cuStreamIsCapturing(as_stream(stream), &status) != CUDA_SUCCESS) return false;
    return status == CU_STREAM_CAPTURE_STATUS_ACTIVE;
  }

  void synchronize_stream(StreamId stream) override {
    ContextGuard guard(d_, ctx_);
    check(d_.cuStreamSynchronize(as_stream(stream)), "cuStreamSynchronize");
  }

  // The primary context holds PyTorch's streams as well as ours, so this waits for all of
  // them, which is what makes a following cuMemUnmap safe.
  void synchronize_device() override {
    ContextGuard guard(d_, ctx_);
    check(d_.cuCtxSynchronize(), "cuCtxSynchronize");
  }

  // With unified addressing (every 64-bit platform CUDA supports) the driver infers the
  // direction from the pointers, so `kind` is only documentation. From pageable host memory
  // the driver stages the copy and may block the host; only pinned memory truly overlaps.
  bool memcpy_async(void* dst, const void* src, std::size_t bytes, CopyKind /*kind*/,
                    StreamId stream) override {
    if (bytes == 0) return true;
    ContextGuard guard(d_, ctx_);
    const CUresult r = d_.cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(dst),
                                        reinterpret_cast<CUdeviceptr>(src), bytes,
                                        as_stream(stream));
    return check(r, "cuMemcpyAsync", bytes);
  }

  // Page-locked and mapped for every context (PORTABLE), so swap copies are true DMA that
  // overlaps with kernels. Allocated once per engine: cuMemHostAlloc is slow (it pins page
  // by page) and synchronizes the device.
  void* host_alloc(std::size_t bytes) override {
    ContextGuard guard(d_, ctx_);
    void* p = nullptr;
    if (!check(d_.cuMemHostAlloc(&p, bytes, CU_MEMHOSTALLOC_PORTABLE), "cuMemHostAlloc", bytes))
      return nullptr;
    return p;
  }

  void host_free(void* ptr, std::size_t /*bytes*/) override {
    if (ptr == nullptr) return;
    ContextGuard guard(d_, ctx_);
    check(d_.cuMemFreeHost(ptr), "cuMemFreeHost");
  }

  // A pool that grows: plain address space, page-locked piece by piece with
  // cuMemHostRegister (PORTABLE, as host_alloc's), which pins the pages it is given; copies
  // from it are DMA as from host_alloc's. Without the two entry points (a driver older
  // than CUDA 4.0), the whole pool is pinned at once.
  void* host_reserve(std::size_t bytes) override {
    if (!can_register()) return host_alloc(bytes);
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      t_last_error = "mmap of " + std::to_string(bytes) + " bytes for the host pool: " +
                     std::strerror(errno);
      return nullptr;
    }
    return p;
  }

  bool host_commit(void* base, std::size_t offset, std::size_t bytes) override {
    if (!can_register()) return true;  // pinned whole
    ContextGuard guard(d_, ctx_);
    return check(d_.cuMemHostRegister_v2(static_cast<char*>(base) + offset, bytes,
                                         CU_MEMHOSTREGISTER_PORTABLE),
                 "cuMemHostRegister", bytes);
  }

  void host_unreserve(void* base, std::size_t bytes, std::size_t chunk,
                      std::size_t committed) override {
    if (base == nullptr) return;
    if (!can_register()) return host_free(base, bytes);
    {
      ContextGuard guard(d_, ctx_);
      for (std::size_t at = 0; at < committed; at += chunk)
        check(d_.cuMemHostUnregister(static_cast<char*>(base) + at), "cuMemHostUnregister");
    }
    munmap(base, bytes);
  }

 private:
  // Whether host memory can be pinned piece by piece (the two optional entry points).
  bool can_register() const { return d_.cuMemHostRegister_v2 && d_.cuMemHostUnregister; }

  // StreamId 0 becomes a null CUstream, which the unsuffixed entry points we load read as
  // the legacy default stream (See Note [Loading the driver with dlsym]).
  static CUstream as_stream(StreamId s) { return reinterpret_cast<CUstream>(s); }
  static CUevent as_event(EventId e) { return reinterpret_cast<CUevent>(e); }

  // Under a ContextGuard: maps `count` chunk handles back to back from `va`, then makes the
  // range accessible once; all or nothing.
  bool map_chunk_handles(std::uintptr_t va, const CUmemGenericAllocationHandle* handles,
                         std::size_t count) {
    const std::size_t bytes = count * granularity_;
    std::size_t mapped = 0;
    for (std::size_t i = 0; i < count; ++i, mapped += granularity_) {
      if (!check(d_.cuMemMap(va + mapped, granularity_, 0, handles[i], 0), "cuMemMap", bytes))
        break;
    }
    // A fresh mapping is inaccessible until this succeeds, and it can fail for lack of memory
    // for page tables.
    if (mapped == bytes) {
      const CUmemAccessDesc access{{CU_MEM_LOCATION_TYPE_DEVICE, device_},
                                   CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
      if (check(d_.cuMemSetAccess(va, bytes, &access, 1), "cuMemSetAccess", bytes)) return true;
    }
    unmap_chunks(va, mapped);
    return false;
  }

  // Under a ContextGuard. Every mapping is one chunk (Note [One handle per chunk]).
  void unmap_chunks(std::uintptr_t va, std::size_t bytes) {
    for (std::size_t done = 0; done < bytes; done += granularity_)
      check(d_.cuMemUnmap(va + done, granularity_), "cuMemUnmap", granularity_);
  }

  static bool no_event(const char* call) {
    t_last_error = std::string(call) + " failed: event 0 is not an event (create_event failed?)";
    return false;
  }

  // On failure stores e.g. "cuMemCreate(2097152 bytes) failed: out of memory
  // (CUDA_ERROR_OUT_OF_MEMORY)" as this thread's last error. Success allocates nothing.
  bool check(CUresult r, const char* call, std::size_t bytes = 0) const {
    if (r == CUDA_SUCCESS) return true;
    t_last_error = std::string(call) + (bytes ? "(" + std::to_string(bytes) + " bytes)" : "") +
                   " failed: " + describe(d_, r);
    return false;
  }

  const Driver& d_;
  const int device_;
  const CUdevice dev_;
  const CUcontext ctx_;  // the retained primary context of dev_
  const std::size_t granularity_;
};

}  // namespace

int cuda_device_count(std::string* error) {
  const Driver& d = driver();
  if (!d.load_error.empty()) {
    if (error != nullptr) *error = d.load_error;
    return -1;
  }
  // cuInit is idempotent and thread-safe: after the first call it costs nothing.
  CUresult r = d.cuInit(0);
  if (r == CUDA_ERROR_NO_DEVICE) return 0;  // a driver, but no visible GPU
  int count = 0;
  if (r == CUDA_SUCCESS && (r = d.cuDeviceGetCount(&count)) == CUDA_SUCCESS) return count;
  if (error != nullptr)
    *error = "could not initialise the CUDA driver: " + describe(d, r) +
             ". The NVIDIA driver is installed but not usable (run nvidia-smi to see why). " +
             kUseCpu;
  return -1;
}

std::unique_ptr<Backend> make_cuda_backend(int device, std::string* error) {
  auto fail = [error](std::string message) {
    if (error != nullptr) *error = std::move(message);
    return nullptr;
  };
  const int count = cuda_device_count(error);
  if (count < 0) return nullptr;  // *error already says why
  const std::string which = "CUDA device " + std::to_string(device);
  if (count == 0)
    return fail("there is no CUDA device: the NVIDIA driver sees no GPU (check nvidia-smi and "
                "CUDA_VISIBLE_DEVICES). " + std::string(kUseCpu));
  if (device < 0 || device >= count)
    return fail(which + " does not exist: this machine has " + std::to_string(count) +
                " visible CUDA device(s), numbered 0 to " + std::to_string(count - 1) +
                ". Pass a device index in that range.");

  const Driver& d = driver();
  CUdevice dev = 0;
  CUresult r = d.cuDeviceGet(&dev, device);
  if (r != CUDA_SUCCESS) return fail("cuDeviceGet failed for " + which + ": " + describe(d, r));

  int vmm = 0;
  r = d.cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev);
  if (r != CUDA_SUCCESS || vmm == 0)
    return fail(which + " does not support CUDA virtual memory management (cuMemCreate / "
                "cuMemMap), which pyalloc needs; some vGPU, WSL and pre-Pascal setups lack it. "
                "Keep PyTorch's default CUDA allocator on this machine. " + std::string(kUseCpu));

  // Never below 2 MiB: backend.h and the engine's size classes assume it, and a smaller
  // unit would only multiply page-table entries.
  const CUmemAllocationProp prop = device_memory_prop(device);
  std::size_t minimum = 0;
  r = d.cuMemGetAllocationGranularity(&minimum, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  if (r != CUDA_SUCCESS)
    return fail("cuMemGetAllocationGranularity failed for " + which + ": " + describe(d, r));
  if (minimum == 0) minimum = 1;
  constexpr std::size_t kTwoMiB = std::size_t{2} << 20;
  const std::size_t granularity = (kTwoMiB + minimum - 1) / minimum * minimum;

  CUcontext ctx = nullptr;
  r = d.cuDevicePrimaryCtxRetain(&ctx, dev);
  if (r != CUDA_SUCCESS)
    return fail("could not open " + which + " (cuDevicePrimaryCtxRetain: " + describe(d, r) +
                "); it may be out of memory, or in exclusive-process mode and owned by "
                "another process. Check nvidia-smi.");
  return std::unique_ptr<Backend>(new CudaBackend(d, device, dev, ctx, granularity));
}

}  // namespace pyalloc
