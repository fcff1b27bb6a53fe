// trace.h — a ring buffer of allocator events, for traces, replay and plots.
//
// Off by default: recording costs one predictable branch per operation until someone
// asks for a trace (pyalloc.record_trace, or the trace_capacity option). When on, an
// event is ~48 bytes written into a preallocated ring — no allocation, no I/O — under the
// engine lock the operation already holds. A full ring overwrites its oldest events and
// counts them as dropped, so a long run degrades to "the most recent N events" rather than
// to unbounded memory.
//
// Thread safety: none; every method is called with the owning Engine's lock held, except
// set_thread_context, which writes only the calling thread's tag.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "backend.h"

namespace pyalloc {

// Names are the strings written to trace files (docs/formats.md).
#define PYALLOC_TRACE_ACTIONS(X) \
  X(kAlloc, "alloc")             \
  X(kFree, "free")               \
  X(kFreeRequested, "free_requested") \
  X(kSegmentMap, "segment_map")  \
  X(kSegmentUnmap, "segment_unmap") \
  X(kSegmentGrow, "segment_grow") \
  X(kSegmentShrink, "segment_shrink") \
  X(kOom, "oom")                 \
  X(kEmptyCache, "empty_cache")  \
  X(kSetBudget, "set_budget")    \
  X(kEvict, "evict")             \
  X(kStitch, "stitch")           \
  X(kLifetime, "lifetime")

enum class TraceAction : std::uint8_t {
#define PYALLOC_TRACE_ENUM(name, text) name,
  PYALLOC_TRACE_ACTIONS(PYALLOC_TRACE_ENUM)
#undef PYALLOC_TRACE_ENUM
};

struct TraceEvent {
  std::uint64_t t_ns;
  std::uintptr_t address;
  std::uint64_t size;
  std::uint64_t requested;
  StreamId stream;
  std::uint32_t context;
  TraceAction action;
};

class TraceRing {
 public:
  TraceRing() : start_(std::chrono::steady_clock::now()) {}

  // What the calling thread is doing (an index into the trace's context table, set from
  // Python around each op when stacks are recorded); 0 when unknown.
  static void set_thread_context(std::uint32_t context);

  bool enabled() const { return !ring_.empty(); }
  // Starts recording into a ring of `capacity` events (0: stop). Clears what was there.
  void set_capacity(std::size_t capacity);

  void record(TraceAction action, std::uintptr_t address, std::size_t size,
              std::size_t requested, StreamId stream) {
    if (ring_.empty()) return;
    record_slow(action, address, size, requested, stream);
  }

  // {"dropped_events":N,"events":[[t_ns,"alloc",address,size,requested,stream,context],...]}
  // oldest first; then empties the ring (recording continues).
  std::string drain_json();

 private:
  void record_slow(TraceAction action, std::uintptr_t address, std::size_t size,
                   std::size_t requested, StreamId stream);

  std::chrono::steady_clock::time_point start_;
  std::vector<TraceEvent> ring_;
  std::size_t next_ = 0;      // slot of the next event
  std::size_t count_ = 0;     // events in the ring (<= ring_.size())
  std::uint64_t dropped_ = 0;  // overwritten before being drained
};

}  // namespace pyalloc
