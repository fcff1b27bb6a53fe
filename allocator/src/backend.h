// backend.h — the one interface between the engine and a device.
//
// Everything above this file is device-agnostic. Two implementations:
//   HostBackend (host_backend.cpp): the simulated device. A fixed capacity of host
//     memory in a memfd, VMM-style reservations with mmap, one worker thread per stream.
//   CudaBackend (cuda_backend.cpp): the CUDA driver API, loaded with dlopen on first
//     use so that loading libpyalloc needs no GPU and no driver.
//
// The memory model is CUDA's virtual memory management (VMM) model:
//   reserve(bytes)            -> a range of address space with nothing behind it
//   create_physical(bytes)    -> physical memory, not yet addressable
//   map(va, phys)             -> make `phys` readable/writable at `va`
//   unmap / release_physical / unreserve undo each step.
// A segment is one reservation with one physical allocation mapped into it. Keeping the
// steps separate (rather than one `malloc`) is what later lets defragmentation map
// physical memory from several places into one fresh virtual range.
//
// Granularity: every size handed to reserve/create_physical is a multiple of
// `granularity()` (2 MiB on both backends, the minimum VMM granularity of current
// NVIDIA GPUs). The engine rounds segment sizes to it.
//
// Thread safety: every method may be called from any thread, concurrently. Backends keep
// their own locks; the engine never calls a backend method that can call back into it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace pyalloc {

// A stream or event is an opaque handle: a cudaStream_t / cudaEvent_t on CUDA, a pointer
// to a HostStream / HostEvent on the simulated device. Stream 0 is the default stream
// (CUDA's legacy default stream; on the host, the calling thread itself, synchronous).
using StreamId = std::uintptr_t;
using EventId = std::uintptr_t;

// Physical memory that is not (necessarily) mapped anywhere.
struct PhysicalHandle {
  std::uintptr_t handle = 0;  // CUmemGenericAllocationHandle, or a HostBackend chunk-run id
  std::size_t bytes = 0;
  explicit operator bool() const { return bytes != 0; }
};

struct MemInfo {
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
};

enum class CopyKind { kHostToDevice, kDeviceToHost, kDeviceToDevice };

// A backend reports failure by returning an empty value / false and describing the
// cause through last_error(); it never throws. Running out of memory is an expected
// outcome (the engine climbs its reclaim ladder), so it must be cheap and silent.
class Backend {
 public:
  virtual ~Backend() = default;

  virtual const char* name() const = 0;  // "host (simulated device)" / "cuda"
  virtual int device() const = 0;
  virtual std::size_t granularity() const = 0;
  virtual MemInfo mem_info() = 0;
  // The last failure on this thread, e.g. "cuMemCreate: out of memory".
  virtual std::string last_error() const = 0;

  // --- virtual memory --------------------------------------------------------------
  // Returns 0 on failure.
  virtual std::uintptr_t reserve(std::size_t bytes) = 0;
  virtual void unreserve(std::uintptr_t va, std::size_t bytes) = 0;
  // Returns an empty handle when the device is out of physical memory.
  virtual PhysicalHandle create_physical(std::size_t bytes) = 0;
  virtual void release_physical(PhysicalHandle phys) = 0;
  // Maps all of `phys` at `va` (which lies inside a reservation) read/write.
  virtual bool map(std::uintptr_t va, PhysicalHandle phys) = 0;
  virtual void unmap(std::uintptr_t va, std::size_t bytes) = 0;
  // Maps [offset, offset + bytes) of `phys` (granularity-aligned) at `va`, leaving its
  // other mappings as they are: the same pages then appear at two addresses. For stitching
  // (pool.h, Note [Stitching]). Returns false where the backend cannot map part of a
  // physical allocation.
  virtual bool map_part(std::uintptr_t va, PhysicalHandle phys, std::size_t offset,
                        std::size_t bytes) = 0;
  // Maps `count` physical allocations back to back from `va`, each whole; all or nothing.
  // For expandable segments (one handle per chunk; pool.h, Note [Expandable segments]).
  // Backends override it to map a run in fewer calls: the simulated device maps chunks
  // that are consecutive in its file with one mmap, CUDA sets access once for the range.
  virtual bool map_handles(std::uintptr_t va, const PhysicalHandle* handles, std::size_t count) {
    std::size_t done = 0;
    for (std::size_t i = 0; i < count; done += handles[i++].bytes) {
      if (!map(va + done, handles[i])) {
        unmap(va, done);
        return false;
      }
    }
    return true;
  }

  // In a process just forked from the one that made this backend: gives the child memory of
  // its own with the same contents at the same addresses, where the backend's memory would
  // otherwise stay shared with the parent (Note [The simulated device after fork] in
  // host_backend.cpp). A GPU's memory is not inherited: nothing to do.
  virtual bool after_fork_in_child(std::string* /*error*/) { return true; }
  // In the process about to fork: leaves nothing in flight that the child would wait for
  // (the simulated device drains its streams). A GPU: nothing to do.
  virtual void before_fork() {}

  // --- streams and events ----------------------------------------------------------
  // True if work on `stream` completes before the call that enqueued it returns (the
  // simulated device's stream 0). Blocks freed on such a stream are idle at once.
  virtual bool stream_is_synchronous(StreamId /*stream*/) const { return false; }
  // Whether a CUDA graph capture is recording `stream` (Note [Graph pools] in block.h).
  virtual bool stream_is_capturing(StreamId /*stream*/) const { return false; }
  virtual StreamId create_stream() = 0;
  virtual void destroy_stream(StreamId stream) = 0;
  virtual EventId create_event() = 0;
  virtual void destroy_event(EventId event) = 0;
  // Marks the point in `stream` after all work enqueued so far.
  virtual bool record_event(EventId event, StreamId stream) = 0;
  // True once all work before the recorded point has completed.
  virtual bool query_event(EventId event) = 0;
  virtual void synchronize_event(EventId event) = 0;
  // Work enqueued on `stream` after this call waits for `event`.
  virtual bool stream_wait_event(StreamId stream, EventId event) = 0;
  virtual void synchronize_stream(StreamId stream) = 0;
  // Waits for all work on every stream of the device. The engine calls it before
  // unmapping memory: unlike cudaFree, cuMemUnmap does not wait for in-flight kernels.
  virtual void synchronize_device() = 0;
  virtual bool memcpy_async(void* dst, const void* src, std::size_t bytes, CopyKind kind,
                            StreamId stream) = 0;

  // --- host memory for swapping ----------------------------------------------------
  // Host memory that async copies can use at full speed (page-locked on CUDA), or nullptr.
  // Called once per engine, never on the swap path: pinning is slow and may synchronize.
  virtual void* host_alloc(std::size_t bytes) = 0;
  virtual void host_free(void* ptr, std::size_t bytes) = 0;
  // A host pool that becomes usable piece by piece (Note [A host pool made at first use] in
  // swap.cpp): host_reserve returns its address space (nullptr: failed, last_error says
  // why); host_commit makes [base + offset, base + offset + bytes) usable by copies at full
  // speed (pinned on CUDA; it may synchronize); host_unreserve gives it all back, the first
  // `committed` bytes having been committed in pieces of `chunk` (the last maybe shorter).
  // The defaults reserve with host_alloc, so all of it is usable at once.
  virtual void* host_reserve(std::size_t bytes) { return host_alloc(bytes); }
  virtual bool host_commit(void* /*base*/, std::size_t /*offset*/, std::size_t /*bytes*/) {
    return true;
  }
  virtual void host_unreserve(void* base, std::size_t bytes, std::size_t /*chunk*/,
                              std::size_t /*committed*/) {
    host_free(base, bytes);
  }
};

}  // namespace pyalloc
