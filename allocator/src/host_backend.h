// host_backend.h — the simulated device: a GPU's memory model, built from host memory.
//
// Physical memory is a memfd of `capacity` bytes cut into 2 MiB chunks; "creating"
// physical memory takes free chunks (not necessarily adjacent), "releasing" it punches
// the chunks out of the file so the host gets the RAM back. A reservation is an
// mmap(PROT_NONE) range; mapping places each run of chunks into it with
// mmap(MAP_FIXED|MAP_SHARED) on the memfd. So reserve/map/unmap behave as CUDA VMM does,
// and stitching chunks from several places into one range works for real.
//
// Streams are in-order worker threads; stream 0 is the calling thread itself (work on it
// runs synchronously, as CPU tensors do). Events are completion counters. Together they
// let async copies and stream-ordered reuse race for real, so ordering bugs show in CI.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "backend.h"

namespace pyalloc {

class HostStream;

class HostBackend final : public Backend {
 public:
  // Creates the memfd. On failure (no memfd support), returns nullptr and fills *error.
  // sync_stream0: stream 0 is the calling thread (CPU tensors); false makes stream 0 keep
  // GPU semantics for the engine's stream tags (replays of GPU traces).
  static std::unique_ptr<HostBackend> create(std::size_t capacity, std::string* error,
                                             bool sync_stream0 = true);
  ~HostBackend() override;

  const char* name() const override { return "host (simulated device)"; }
  int device() const override { return 0; }
  std::size_t granularity() const override { return kChunk; }
  MemInfo mem_info() override;
  std::string last_error() const override;

  std::uintptr_t reserve(std::size_t bytes) override;
  void unreserve(std::uintptr_t va, std::size_t bytes) override;
  PhysicalHandle create_physical(std::size_t bytes) override;
  void release_physical(PhysicalHandle phys) override;
  bool map(std::uintptr_t va, PhysicalHandle phys) override;
  void unmap(std::uintptr_t va, std::size_t bytes) override;
  bool map_part(std::uintptr_t va, PhysicalHandle phys, std::size_t offset,
                std::size_t bytes) override;
  bool map_handles(std::uintptr_t va, const PhysicalHandle* handles, std::size_t count) override;

  bool after_fork_in_child(std::string* error) override;
  void before_fork() override { synchronize_device(); }
  bool stream_is_synchronous(StreamId stream) const override {
    return stream == 0 && sync_stream0_;
  }
  StreamId create_stream() override;
  void destroy_stream(StreamId stream) override;
  EventId create_event() override;
  void destroy_event(EventId event) override;
  bool record_event(EventId event, StreamId stream) override;
  bool query_event(EventId event) override;
  void synchronize_event(EventId event) override;
  bool stream_wait_event(StreamId stream, EventId event) override;
  void synchronize_stream(StreamId stream) override;
  void synchronize_device() override;
  bool memcpy_async(void* dst, const void* src, std::size_t bytes, CopyKind kind,
                    StreamId stream) override;
  void* host_alloc(std::size_t bytes) override;
  void host_free(void* ptr, std::size_t bytes) override;
  // Reserved memory is committed by the kernel page by page as copies touch it; a commit
  // only checks the test hook.
  bool host_commit(void* base, std::size_t offset, std::size_t bytes) override;

  // --- test doubles (reachable through the debug C API, not used by the engine) ---
  // Runs `work` on `stream` in order with its other work (synchronously on stream 0).
  bool enqueue(StreamId stream, std::function<void()> work);
  // Every task on `stream` first sleeps this long: a slow copy engine.
  bool set_stream_delay_us(StreamId stream, unsigned microseconds);
  // The next `count` memcpy_async calls fail as a device would refuse a copy.
  void fail_next_copies(unsigned count) { failing_copies_.store(count); }
  // The next `count` host_commit calls fail (a host that cannot pin more; tests).
  void fail_next_host_commits(unsigned count) { failing_commits_.store(count); }

  static constexpr std::size_t kChunk = std::size_t{2} << 20;

 private:
  HostBackend(int fd, std::size_t capacity, bool sync_stream0);
  HostStream* find_stream(StreamId stream);
  // Maps chunks[first, first + count) of `phys` at `va`, one mmap per run of consecutive
  // chunks; all or nothing.
  bool map_chunks(std::uintptr_t va, PhysicalHandle phys, std::size_t first, std::size_t count);
  // Maps the file's `chunks` back to back from `va`, one mmap per run of consecutive ones;
  // all or nothing.
  bool map_file_chunks(std::uintptr_t va, const std::vector<std::uint32_t>& chunks);

  int fd_;  // replaced in a forked child (after_fork_in_child)
  const bool sync_stream0_;
  const std::size_t chunk_count_;

  // Guards the chunk table and the physical-handle table.
  std::mutex chunk_mutex_;
  std::vector<std::uint32_t> free_chunks_;  // a stack of free chunk indices
  std::unordered_map<std::uintptr_t, std::vector<std::uint32_t>> physical_;  // handle -> chunks
  std::uintptr_t next_handle_ = 1;

  // Guards the stream registry (streams themselves are internally synchronized).
  std::mutex stream_mutex_;
  std::unordered_map<StreamId, std::unique_ptr<HostStream>> streams_;

  std::atomic<unsigned> failing_copies_{0};  // fail_next_copies
  std::atomic<unsigned> failing_commits_{0};  // fail_next_host_commits
};

}  // namespace pyalloc
