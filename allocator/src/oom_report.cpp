// oom_report.cpp — the last rung: what the engine says when a request cannot be served.
//
// The report names the request, where the budget went (allocated, awaiting other
// streams, cached free), how fragmented the cache is, what could be evicted, and one hint:
// the change most likely to help, cheapest first. A snapshot of the pool at the failure
// is kept beside it (last_oom_json), because by the time the error reaches the caller
// the failed op's temporaries are gone.
#include <cinttypes>
#include <cstdio>

#include "engine.h"
#include "format.h"

namespace pyalloc {

void* Engine::fail_oom_locked(std::size_t size, std::size_t rounded, StreamId stream,
                              std::string* error) {
  ++pool_.stats().num_ooms;
  trace_.record(TraceAction::kOom, 0, rounded, size, stream);
  *error = oom_report_locked(size, rounded, stream);
  // The layout now, while it still holds what the request could not get past (a copy of
  // the pool as JSON: OOMs are rare, and the bisections that provoke many pay a few
  // microseconds per segment). The report goes in as a JSON string.
  std::string snapshot = snapshot_json_locked();
  snapshot.pop_back();  // the closing brace: the oom object goes inside
  char head[160];
  std::snprintf(head, sizeof head,
                ",\"oom\":{\"size\":%zu,\"rounded\":%zu,\"stream\":%" PRIuPTR ",\"report\":\"",
                size, rounded, stream);
  last_oom_json_ = snapshot + head + json_escape(*error) + "\"}}";
  after_op_locked();
  return nullptr;
}

std::string Engine::oom_report_locked(std::size_t size, std::size_t rounded, StreamId stream) {
  const Stats& s = pool_.stats();
  FragmentationFigures f = pool_.fragmentation();
  const auto reserved = static_cast<std::size_t>(s.reserved_bytes[kAllPools].current);
  const auto allocated = static_cast<std::size_t>(s.allocated_bytes[kAllPools].current);
  const auto awaiting =
      static_cast<std::size_t>(s.active_bytes[kAllPools].current) - allocated;
  MemInfo info = backend_->mem_info();

  char head[512];
  std::snprintf(head, sizeof head,
                "pyalloc: out of memory on %s device %d: tried to allocate %s (%zu bytes, "
                "rounded to %zu) on stream 0x%" PRIxPTR ".\n",
                backend_->name(), backend_->device(), format_bytes(size).c_str(), size, rounded,
                stream);
  std::string msg = head;
  msg += "  budget " + format_bytes(budget_) + "; reserved " + format_bytes(reserved) +
         " = allocated " + format_bytes(allocated) + " + awaiting other streams " +
         format_bytes(awaiting) + " + cached free " + format_bytes(f.cached_free_bytes) + ".\n";
  char frag[64];
  std::snprintf(frag, sizeof frag, "%.1f%%", 100.0 * f.external_fragmentation);
  msg += "  cached free: largest block " + format_bytes(f.largest_free_block) +
         ", external fragmentation " + frag + ".\n";
  std::size_t evictable_blocks = 0;
  const std::size_t evictable = evictable_bytes(pool_, &evictable_blocks);
  msg += "  evictable " + format_bytes(evictable) + " in " + std::to_string(evictable_blocks) +
         " blocks" + (evict_callback_ ? std::string(" (strategy ") +
                                            strategy_name(options_.evict_strategy) + ")"
                                      : std::string(" (no eviction policy is active)")) +
         (host_pool_.base() ? "; " + host_pool_report_locked() : std::string()) + ".\n";
  msg += "  device: " + format_bytes(info.free_bytes) + " free of " +
         format_bytes(info.total_bytes) + ".\n";

  // The hint names the one change most likely to help, in order of how cheap it is.
  std::string hint;
  if (rounded > budget_) {
    hint = "the request alone exceeds the budget: raise it (option budget, currently " +
           format_bytes(budget_) + ") or split the tensor";
  } else if (f.cached_free_bytes >= rounded) {
    hint = "the cached free bytes would hold this request if they were contiguous, so the "
           "cache is fragmented: free long-lived tensors earlier or allocate them first";
    if (rounded > kLargeSegment && options_.max_split_size == 0) {
      hint += ", or set max_split_size (e.g. \"max_split_size:" + std::to_string(rounded) +
              "\") so that blocks this large are never split for small requests";
    }
  } else if (budget_ < info.total_bytes && reserved + rounded <= info.total_bytes &&
             info.free_bytes >= rounded) {
    hint = "the device has room beyond the budget: raise the budget (option budget, "
           "currently " + format_bytes(budget_) + ")";
  } else if (!evict_callback_) {
    hint = "reduce the batch size or the model's activation memory";
  } else if (host_pool_.base() && evictable > 0 &&
             host_pool_.capacity() - host_pool_.used() < evictable) {
    hint = "tensors that could only be swapped stayed because the host pool is full: raise "
           "the option host_pool (currently " + format_bytes(host_pool_.capacity()) + ")";
  } else {
    hint = "even evicting every evictable tensor would not make room: reduce the batch size";
  }
  msg += "  hint: " + hint + ".";
  return msg;
}

}  // namespace pyalloc
