// oom_report.cpp — the last rung: what the engine says when a request cannot be served.
//
// The report names the request, where the budget went (allocated, awaiting other
// streams, cached free), how fragmented the cache is, what could be evicted, and one hint:
// the change most likely to help, cheapest first. A snapshot of the pool at the failure
// is kept beside it (last_oom_json), because by the time the error reaches the caller
// the failed op's temporaries are gone.
#include <algorithm>
#include <cinttypes>
#include <cstdio>

#include "engine.h"
#include "format.h"

namespace pyalloc {
namespace {
// The min_evictable the hints about small tensors suggest; they are given only where the
// option is above it.
constexpr std::size_t kSuggestedMinEvictable = std::size_t{1} << 10;
}  // namespace

void* Engine::fail_oom_locked(std::size_t size, std::size_t rounded, StreamId stream,
                              Status* status) {
  ++pool_.stats().num_ooms;
  trace_.record(TraceAction::kOom, 0, rounded, size, stream);
  const OomFigures f = oom_figures_locked(size, rounded, stream);
  *status = Status(Status::kOutOfMemory, oom_report_locked(f));
  const std::string& report = status->message();
  // The layout now, while it still holds what the request could not get past (a copy of
  // the pool as JSON: OOMs are rare, and the bisections that provoke many pay a few
  // microseconds per segment). The report goes in as a JSON string.
  std::string snapshot = snapshot_json_locked();
  snapshot.pop_back();  // the closing brace: the oom object goes inside
  char head[160];
  std::snprintf(head, sizeof head,
                ",\"oom\":{\"size\":%zu,\"rounded\":%zu,\"stream\":%" PRIuPTR ",\"report\":\"",
                size, rounded, stream);
  last_oom_json_ = snapshot + head + json_escape(report) + "\"}}";
  // What an OOM callback receives (pyalloc.on_oom): the figures, and the report.
  char figures[640];
  std::snprintf(figures, sizeof figures,
                "{\"device\":%d,\"size\":%zu,\"rounded\":%zu,\"stream\":%" PRIuPTR
                ",\"budget\":%zu,\"reserved\":%zu,\"allocated\":%zu,\"awaiting\":%zu,"
                "\"cached_free\":%zu,\"largest_free_block\":%zu,"
                "\"external_fragmentation\":%.17g,\"evictable\":%zu,\"evictable_blocks\":%zu,"
                "\"device_free\":%zu,\"device_total\":%zu,\"report\":\"",
                backend_->device(), f.size, f.rounded, f.stream, budget_, f.reserved,
                f.allocated, f.awaiting, f.frag.cached_free_bytes, f.frag.largest_free_block,
                f.frag.external_fragmentation, f.evictable, f.evictable_blocks,
                f.device.free_bytes, f.device.total_bytes);
  last_oom_info_json_ = figures + json_escape(report) + "\"}";
  after_op_locked();
  return nullptr;
}

void* Engine::out_of_memory(std::unique_lock<std::mutex>& lock, std::size_t size,
                            std::size_t rounded, StreamId stream, Status* status) {
  fail_oom_locked(size, rounded, stream, status);
  if (!oom_callback_ && !describe_callback_) return nullptr;
  OomCallback callback = oom_callback_;
  void* context = oom_context_;
  DescribeCallback describe = describe_callback_;
  void* describe_context = describe_context_;
  const std::int64_t oom_number = pool_.stats().num_ooms;
  std::string info = callback ? last_oom_info_json_ : std::string();
  lock.unlock();  // See Note [Calling out] in reclaim.cpp.
  if (describe) {
    char extra[2048];
    const std::size_t n = std::min(describe(describe_context, extra, sizeof extra), sizeof extra);
    if (n > 0) {
      // The describer's line is part of the report wherever the report goes: the error,
      // the callbacks' dict and the snapshot kept beside it (unless a later OOM replaced
      // that meanwhile). Each JSON ends with the report's closing quote and its braces.
      const std::string line = "\n" + std::string(extra, n);
      *status = Status(status->code(), status->message() + line);
      const std::string escaped = json_escape(line);
      const auto append_to_report = [&escaped](std::string& json, std::size_t closers) {
        if (json.size() > closers) json.insert(json.size() - closers - 1, escaped);
      };
      if (callback) append_to_report(info, 1);
      lock.lock();
      if (pool_.stats().num_ooms == oom_number) {
        append_to_report(last_oom_info_json_, 1);
        append_to_report(last_oom_json_, 2);
      }
      lock.unlock();
    }
  }
  if (callback) callback(context, info.c_str());
  return nullptr;
}

void Engine::set_oom_describe_callback(DescribeCallback describe, void* context) {
  std::lock_guard<std::mutex> lock(mutex_);
  describe_callback_ = describe;
  describe_context_ = context;
}

void Engine::set_oom_callback(OomCallback callback, void* context) {
  std::lock_guard<std::mutex> lock(mutex_);
  oom_callback_ = callback;
  oom_context_ = context;
}

Engine::OomFigures Engine::oom_figures_locked(std::size_t size, std::size_t rounded,
                                              StreamId stream) const {
  const Stats& s = pool_.stats();
  OomFigures f;
  f.size = size;
  f.rounded = rounded;
  f.stream = stream;
  f.frag = pool_.fragmentation();
  f.reserved = static_cast<std::size_t>(s.reserved_bytes[kAllPools].current);
  f.allocated = static_cast<std::size_t>(s.allocated_bytes[kAllPools].current);
  f.awaiting = static_cast<std::size_t>(s.active_bytes[kAllPools].current) - f.allocated;
  f.evictable = evictable_bytes(pool_, &f.evictable_blocks);
  if (evict_callback_ && options_.min_evictable > kSuggestedMinEvictable) {
    // Blocks below min_evictable, for the hints that suggest a lower one (only where it is
    // above the suggestion). Last-resort victims count as evictable here, as in f.evictable.
    LastResortVictims all;
    for (const auto& kv : pool_.segments()) {
      std::size_t small_here = 0;
      bool kept_by_others = false;
      for (const Block* b = kv.second->first; b; b = b->next) {
        if (b->state == BlockState::kFree || evictable(b)) continue;
        if (b->state == BlockState::kAllocated && b->size < options_.min_evictable) {
          f.small += b->size, ++f.small_blocks, ++small_here;
        } else {
          kept_by_others = true;
        }
      }
      if (small_here > 0 && !kept_by_others) {
        f.kept_by_small += kv.second->size;
        ++f.kept_by_small_segments;
        f.kept_by_small_blocks += small_here;
      }
    }
  }
  f.device = backend_->mem_info();
  return f;
}

std::string Engine::oom_report_locked(const OomFigures& f) const {
  char head[512];
  std::snprintf(head, sizeof head,
                "pyalloc: out of memory on %s device %d: tried to allocate %s (%zu bytes, "
                "rounded to %zu) on stream 0x%" PRIxPTR ".\n",
                backend_->name(), backend_->device(), format_bytes(f.size).c_str(), f.size,
                f.rounded, f.stream);
  std::string msg = head;
  msg += "  budget " + format_bytes(budget_) + "; reserved " + format_bytes(f.reserved) +
         " = allocated " + format_bytes(f.allocated) + " + awaiting other streams " +
         format_bytes(f.awaiting) + " + cached free " + format_bytes(f.frag.cached_free_bytes) +
         ".\n";
  char frag[64];
  std::snprintf(frag, sizeof frag, "%.1f%%", 100.0 * f.frag.external_fragmentation);
  msg += "  cached free: largest block " + format_bytes(f.frag.largest_free_block) +
         ", external fragmentation " + frag + ".\n";
  msg += "  evictable " + format_bytes(f.evictable) + " in " + std::to_string(f.evictable_blocks) +
         " blocks" + (evict_callback_ ? std::string(" (strategy ") +
                                            strategy_name(options_.evict_strategy) + ")"
                                      : std::string(" (no eviction policy is active)")) +
         (host_pool_.base() ? "; " + host_pool_report_locked() : std::string()) + ".\n";
  msg += "  device: " + format_bytes(f.device.free_bytes) + " free of " +
         format_bytes(f.device.total_bytes) + ".\n";

  // The hint names the one change most likely to help, in order of how cheap it is.
  std::string hint;
  if (f.rounded > budget_) {
    hint = "the request alone exceeds the budget: raise it (option budget, currently " +
           format_bytes(budget_) + ") or split the tensor";
  } else if (f.small >= (std::size_t{1} << 20) && 4 * f.small >= f.allocated &&
             f.evictable < f.rounded) {
    // Many tensors too small for any policy to take (a recurrent network with a small batch
    // or hidden size): they fill the budget and split what is free, and nothing can leave.
    hint = format_bytes(f.small) + " of the allocated bytes are in " +
           std::to_string(f.small_blocks) + " tensors smaller than min_evictable (" +
           format_bytes(options_.min_evictable) + "), which no policy evicts: lower the option "
           "min_evictable (\"min_evictable:1KiB\", or PYALLOC_MIN_EVICTABLE=1KiB) so that "
           "those of them that are activations can leave";
  } else if (f.kept_by_small >= f.rounded + kSmallSegment) {
    // The same tensors scattered among evictable ones (an RNN's per-timestep states beside
    // its gates): each keeps a whole segment that eviction would otherwise empty, so the
    // evictable bytes are many but no range of them is whole. (A segment more than the
    // request: the new range need not line up with the freed ones.)
    hint = std::to_string(f.kept_by_small_segments) + " segments (" +
           format_bytes(f.kept_by_small) + ") hold nothing but free or evictable bytes and " +
           std::to_string(f.kept_by_small_blocks) + " tensors smaller than min_evictable (" +
           format_bytes(options_.min_evictable) + "), which no policy evicts or moves, so none "
           "of them can be emptied for this request: lower the option min_evictable "
           "(\"min_evictable:1KiB\", or PYALLOC_MIN_EVICTABLE=1KiB) so that those of them "
           "that are activations can leave too";
  } else if (evict_callback_ && f.evictable == 0 &&
             f.frag.cached_free_bytes < f.rounded + kSmallSegment) {
    // Nothing can leave, and what is free barely exceeds the request: the budget is full of
    // what no policy takes, and joining the free bytes would only move the failure to the
    // next request. The fragmentation hint below sent users to reorder allocations that were
    // never the problem: timm's MobileNetV3 under swap at half its peak failed in Adam's
    // first zeros_like with 2.27 MiB free (largest block 2.18 MiB) for a 2.25 MiB request,
    // its parameters, gradients and optimizer state alone above the budget.
    hint = "nothing allocated can be evicted, and the free bytes barely exceed the request: the " +
           format_bytes(f.allocated) + " allocated are parameters, gradients, optimizer state, "
           "inputs, the tensors this op uses and tensors no policy can take, so the budget is "
           "too small for what the program holds: raise it (option budget, currently " +
           format_bytes(budget_) + ") or reduce the batch size";
  } else if (f.frag.cached_free_bytes >= f.rounded && !(evict_callback_ && f.evictable > 0)) {
    // Under a policy with something evictable left, the eviction rungs have already tried
    // to gather room around what cannot leave; the next hint names that (torchvision's
    // RegNetY under recompute at 0.75 of its peak: 6.9 MiB free in pieces and 20.5 MiB
    // evictable among parameters, gradients, momentum and EMA in 2 MiB segments, where
    // "allocate long-lived tensors first" told a user of a library model nothing to do).
    hint = "the cached free bytes would hold this request if they were contiguous, so the "
           "cache is fragmented: free long-lived tensors earlier or allocate them first";
    if (f.rounded > kLargeSegment && options_.max_split_size == 0) {
      hint += ", or set max_split_size (e.g. \"max_split_size:" + std::to_string(f.rounded) +
              "\") so that blocks this large are never split for small requests";
    }
  } else if (evict_callback_ && f.evictable > 0 &&
             f.frag.cached_free_bytes + f.evictable >= f.rounded) {
    // Enough bytes could be freed, but no plan (a window, whole chunks, a move) gathers
    // them: what sits between them can neither leave nor move.
    hint = "the free and evictable bytes together would hold this request, but tensors that "
           "can neither leave nor move sit between them (parameters, gradients, optimizer "
           "state, this op's inputs): raise the budget a little (option budget, currently " +
           format_bytes(budget_) + ")";
  } else if (budget_ < f.device.total_bytes && f.reserved + f.rounded <= f.device.total_bytes &&
             f.device.free_bytes >= f.rounded) {
    hint = "the device has room beyond the budget: raise the budget (option budget, "
           "currently " + format_bytes(budget_) + ")";
  } else if (!evict_callback_) {
    hint = "reduce the batch size or the model's activation memory";
  } else if (host_pool_.base() && f.evictable > 0 &&
             host_pool_.capacity() - host_pool_.used() < f.evictable) {
    hint = "tensors that could only be swapped stayed because the host pool is full: raise "
           "the option host_pool (currently " + format_bytes(host_pool_.capacity()) + ")";
  } else {
    hint = "even evicting every evictable tensor would not make room: reduce the batch size";
  }
  msg += "  hint: " + hint + ".";
  return msg;
}

}  // namespace pyalloc
