// engine.cpp — the public operations of Engine; the reclaim ladder is in reclaim.cpp.
#include "engine.h"

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace pyalloc {
namespace {
thread_local bool t_may_evict = true;   // set_thread_may_evict
thread_local bool t_persistent = false; // set_thread_persistent
thread_local bool t_evictable = false;  // set_thread_evictable
thread_local std::uintptr_t t_placement = 0;  // set_thread_placement
}  // namespace

void Engine::set_thread_may_evict(bool may_evict) { t_may_evict = may_evict; }
void Engine::set_thread_persistent(bool persistent) { t_persistent = persistent; }
bool Engine::set_thread_evictable(bool evictable) {
  const bool was = t_evictable;
  t_evictable = evictable;
  return was;
}
void Engine::set_thread_placement(std::uintptr_t addr) { t_placement = addr; }

SegmentClass Engine::segment_class_locked(PoolKind kind) const {
  if (kind != PoolKind::kSmall) return SegmentClass::kAny;
  if (long_lived_ && options_.lifetime_classes) return SegmentClass::kLongLived;
  // Evictable classes exist only where something evicts.
  if (!evict_callback_ || !options_.evictable_placement) return SegmentClass::kAny;
  return t_evictable ? SegmentClass::kEvictable : SegmentClass::kShortLived;
}

std::size_t Engine::unallocated_bytes() {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto allocated = static_cast<std::size_t>(pool_.stats().allocated_bytes[kAllPools].current);
  return budget_ > allocated ? budget_ - allocated : 0;
}

void Engine::allocated_bytes(std::size_t* current, std::size_t* peak) {
  std::lock_guard<std::mutex> lock(mutex_);
  const Stat& s = pool_.stats().allocated_bytes[kAllPools];
  *current = static_cast<std::size_t>(s.current);
  *peak = static_cast<std::size_t>(s.peak);
}

Engine::Engine(std::unique_ptr<Backend> backend, const Options& options)
    : backend_(std::move(backend)),
      options_(options),
      device_total_(backend_->mem_info().total_bytes),
      pool_(options.max_split_size),
      budget_(options.budget_for(device_total_)) {
  if (options.trace_capacity) trace_.set_capacity(options.trace_capacity);
}

Engine::~Engine() {
  std::lock_guard<std::mutex> lock(mutex_);
  process_events_locked(/*wait=*/true);
  unmap_retired_locked(/*wait=*/true);
  release_cached_locked();
  // Swap state: every copy is complete after the synchronization release_cached_locked
  // made (or the one below, if it had nothing to release).
  backend_->synchronize_device();
  for (auto& kv : slots_) releasing_.push_back(kv.second);
  slots_.clear();
  reap_slots_locked(/*wait=*/true);
  if (to_host_stream_) backend_->destroy_stream(to_host_stream_);
  if (to_device_stream_) backend_->destroy_stream(to_device_stream_);
  if (host_pool_.base()) backend_->host_free(host_pool_.base(), host_pool_.capacity());
  for (EventId e : spare_events_) backend_->destroy_event(e);
}

void Engine::after_op_locked() {
  if (!options_.check_invariants) return;
  std::string violation = pool_.check_invariants();
  if (!violation.empty()) {
    std::fprintf(stderr, "pyalloc: invariant violated: %s\n", violation.c_str());
    std::abort();  // requested by the check_invariants option: stop at the first violation
  }
}

void* Engine::malloc(std::size_t size, StreamId stream, std::string* error) {
  std::unique_lock<std::mutex> lock(mutex_);
  // Above kMaxRequest rounding would overflow; such a request is reported as it is.
  const std::size_t rounded = size > kMaxRequest ? size : round_size(size);
  if (t_placement) {
    // A compaction round's destination (Note [Relocation] in engine.h): already taken
    // from the pool, held for this thread.
    const std::uintptr_t addr = t_placement;
    t_placement = 0;
    auto it = placements_.find(addr);
    if (it == placements_.end() || it->second->requested != size || it->second->stream != stream) {
      *error = "pyalloc: no compaction destination of " + std::to_string(size) +
               " bytes on this stream is reserved at " + format_address(addr) +
               " (set_thread_placement must name a block of the relocate callback, once, "
               "for an allocation of the moved storage's size)";
      return nullptr;
    }
    Block* block = it->second;
    placements_.erase(it);
    trace_.record(TraceAction::kAlloc, block->addr, block->size, size, stream);
    after_op_locked();
    return reinterpret_cast<void*>(block->addr);
  }
  if (size > kMaxRequest || rounded > budget_) return fail_oom_locked(size, rounded, stream, error);
  const PoolKind kind = t_persistent ? PoolKind::kPersistent : pool_for(rounded);
  const SegmentClass cls = segment_class_locked(kind);
  // Each round takes its victims out of the evictable set, so rounds end when nothing is
  // left; the cap only guards against a registry that keeps re-marking the same blocks.
  constexpr int kMaxEvictRounds = 1 << 16;
  constexpr int kMaxWaitUs = 200'000;
  int waited_us = 0;
  // Each compaction round moves at least one storage or ends the rung; the cap bounds a
  // request whose every round opens a hole that another thread takes first.
  constexpr int kMaxCompactions = 4;
  int compactions = 0;
  for (int round = 0;; ++round) {
    bool taken = false, fenced = false;
    Block* block = find_or_grow_locked(rounded, size, stream, kind, cls, &taken, &fenced);
    // Rung 3c, evict in place (See Note [Evicting in place] in reclaim.cpp): before the
    // rungs that map and unmap. A thread that may not evict (a prefetch) skips it.
    if (!block && evicts_in_place()) block = find_elsewhere_locked(rounded, stream, kind, cls);
    if (!block && t_may_evict && evicts_in_place() && round < kMaxEvictRounds) {
      std::vector<std::uint64_t> victims = plan_in_place_locked(rounded, stream, kind);
      if (!victims.empty()) {
        evict_unlocked(lock, victims);
        continue;
      }
    }
    if (!block) block = reclaim_cache_locked(rounded, size, stream, kind, cls, &taken, fenced);
    if (block) {
      if (!taken) {
        // A block that is a whole small segment (empty or new) gives the segment the
        // request's class (Notes [Lifetime classes], [Evictable placement] in pool.h).
        if (kind == PoolKind::kSmall && block->segment->pool == PoolKind::kSmall &&
            !block->is_split()) {
          block->segment->long_lived = cls == SegmentClass::kLongLived;
          block->segment->evictable = cls == SegmentClass::kEvictable;
        }
        pool_.take(block, rounded, size, stream);
      }
      trace_.record(TraceAction::kAlloc, block->addr, block->size, size, stream);
      after_op_locked();
      // A thread that may not evict (a prefetch) must not make room for later either.
      std::vector<std::uint64_t> extra =
          t_may_evict ? plan_proactive_locked() : std::vector<std::uint64_t>{};
      if (!extra.empty()) {
        EvictCallback callback = evict_callback_;
        void* context = evict_context_;
        lock.unlock();  // See Note [Calling out] in reclaim.cpp.
        callback(context, extra.data(), extra.size());
      }
      return reinterpret_cast<void*>(block->addr);
    }
    // Rung 4c, stitch: the free memory may be there, in pieces of several segments.
    if (stitches(kind)) {
      if (Block* block = stitch_locked(rounded, size, stream, /*map_rest_from=*/1)) {
        trace_.record(TraceAction::kAlloc, block->addr, block->size, size, stream);
        after_op_locked();
        return reinterpret_cast<void*>(block->addr);
      }
    }
    // Rung 5: evict. Pick victims under the lock, call the registry without it, retry.
    if (!t_may_evict) {
      *error = "pyalloc: no room for " + format_bytes(size) + " without evicting (this thread "
               "may not evict: a prefetch)";
      return nullptr;
    }
    if (round == kMaxEvictRounds) break;
    std::vector<std::uint64_t> victims = plan_eviction_locked(rounded, stream, kind);
    // Rung 6, compact: nothing left to evict, but live storages may be moved out of the
    // way. Once per round at most; each round that moves something climbs again.
    if (victims.empty() && compactions < kMaxCompactions && evicting_ == 0) {
      ++compactions;
      if (compact_locked(lock, rounded, stream, kind)) continue;
    }
    if (victims.empty()) {
      // Other threads' victims are on their way out: wait a little for their frees rather
      // than fail. Bounded, because the waiting thread may hold the GIL those evictions
      // need (See Note [Calling out]); past the bound the request fails as it would have.
      if (evicting_ == 0 || waited_us >= kMaxWaitUs) break;
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      lock.lock();
      waited_us += 50;
      continue;
    }
    evict_unlocked(lock, victims);
    // Climb again even if the registry evicted none of them: their owners may have freed
    // them meanwhile. Termination does not depend on it either: each round's victims left
    // the evictable set, so the rounds end when it is empty.
  }
  return fail_oom_locked(size, rounded, stream, error);
}

void Engine::evict_unlocked(std::unique_lock<std::mutex>& lock,
                            const std::vector<std::uint64_t>& victims) {
  EvictCallback callback = evict_callback_;
  void* context = evict_context_;
  ++evicting_;
  lock.unlock();  // See Note [Calling out] in reclaim.cpp.
  callback(context, victims.data(), victims.size());
  lock.lock();
  --evicting_;
}

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

void Engine::set_evict_callback(EvictCallback callback, void* context) {
  std::lock_guard<std::mutex> lock(mutex_);
  evict_callback_ = callback;
  evict_context_ = context;
}

std::size_t Engine::compact(std::size_t size, StreamId stream) {
  if (size > kMaxRequest) return 0;
  const std::size_t rounded = round_size(size);
  const PoolKind kind = pool_for(rounded);
  std::unique_lock<std::mutex> lock(mutex_);
  if (find_cached_locked(rounded, stream, kind)) return 0;
  const std::int64_t before = pool_.stats().num_relocations;
  compact_locked(lock, rounded, stream, kind);
  return static_cast<std::size_t>(pool_.stats().num_relocations - before);
}

void Engine::set_compact_callbacks(MovableCallback movable, RelocateCallback relocate,
                                   void* context) {
  std::lock_guard<std::mutex> lock(mutex_);
  movable_callback_ = movable;
  relocate_callback_ = relocate;
  compact_context_ = context;
}

std::string Engine::set_evictable(void* ptr, std::uint64_t handle, double cost) {
  auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  if (!(cost >= 0) || cost > 1e300) {
    return "set_evictable: cost " + std::to_string(cost) + " must be a finite number >= 0";
  }
  std::lock_guard<std::mutex> lock(mutex_);
  Block* block = pool_.find_allocated(addr);
  if (!block) {
    return "set_evictable of " + format_address(addr) + ": no live block starts there (" +
           pool_.describe_unknown_pointer(addr) + ")";
  }
  block->evict_handle = handle;
  block->evict_cost = cost;
  block->last_use = ++clock_;
  return "";
}

void Engine::note_freed_marked_locked(Block* block) {
  // Only while a registry listens: a standalone engine's list would only grow.
  if (evict_callback_) {
    if (freed_marked_.size() < kMaxFreedMarked) freed_marked_.push_back(block->evict_handle);
    else freed_marked_overflow_ = true;
    freed_marked_count_.fetch_add(1, std::memory_order_relaxed);
  }
  block->evict_handle = 0;
}

std::size_t Engine::take_freed_marked(std::uint64_t* out, std::size_t capacity, bool* overflowed) {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::size_t n = std::min(capacity, freed_marked_.size());
  std::copy(freed_marked_.begin(), freed_marked_.begin() + static_cast<std::ptrdiff_t>(n), out);
  freed_marked_.erase(freed_marked_.begin(), freed_marked_.begin() + static_cast<std::ptrdiff_t>(n));
  *overflowed = freed_marked_overflow_;
  freed_marked_overflow_ = false;
  return n;
}

std::string Engine::touch(void* ptr) {
  auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(mutex_);
  Block* block = pool_.find_allocated(addr);
  if (!block) return "touch of " + format_address(addr) + ": no live block starts there";
  block->last_use = ++clock_;
  return "";
}

std::string Engine::free(void* ptr, std::size_t expected_size) {
  auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(mutex_);
  Block* block = pool_.find_allocated(addr);
  if (!block) {
    ++pool_.stats().num_invalid_frees;
    return "invalid free: " + pool_.describe_unknown_pointer(addr);
  }
  if (expected_size != SIZE_MAX && expected_size != block->requested) {
    ++pool_.stats().num_invalid_frees;
    return "invalid free of " + format_address(addr) + ": the caller says it holds " +
           std::to_string(expected_size) + " bytes but it was allocated with " +
           std::to_string(block->requested) + "; the block was left allocated (pass the size "
           "given to malloc)";
  }
  if (block->evict_handle != 0) note_freed_marked_locked(block);
  if (block->segment->stitched) {
    free_stitched_locked(block);
    after_op_locked();
    return "";
  }
  if (block->stream_uses.empty()) {
    release_locked(block);
    after_op_locked();
    return "";
  }
  // Other streams used it: reusable once each of them has passed this point.
  PendingFree pending{block, {}};
  for (StreamId s : block->stream_uses) {
    EventId e = acquire_event_locked();
    if (!backend_->record_event(e, s)) {
      // The stream is gone or invalid; the only safe fallback is to wait for everything.
      spare_events_.push_back(e);
      backend_->synchronize_device();
      ++pool_.stats().num_sync_all_streams;
      continue;
    }
    pending.events.push_back(e);
  }
  if (pending.events.empty()) {
    release_locked(block);
  } else {
    trace_.record(TraceAction::kFreeRequested, block->addr, block->size, block->requested,
                  block->stream);
    pool_.mark_awaiting(block);
    pending_.push_back(std::move(pending));
  }
  after_op_locked();
  return "";
}

std::string Engine::record_stream(void* ptr, StreamId stream) {
  auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(mutex_);
  Block* block = pool_.find_allocated(addr);
  if (!block) {
    return "record_stream of " + format_address(addr) + ": no live block starts there (" +
           pool_.describe_unknown_pointer(addr) + ")";
  }
  if (stream == kAnyStream) return "record_stream: stream " + format_address(stream) + " is reserved";
  if (stream == block->stream) return "";
  for (StreamId s : block->stream_uses) {
    if (s == stream) return "";
  }
  block->stream_uses.push_back(stream);
  return "";
}

void Engine::release_locked(Block* block) {
  trace_.record(TraceAction::kFree, block->addr, block->size, block->requested, block->stream);
  if (backend_->stream_is_synchronous(block->stream)) block->stream = kAnyStream;
  pool_.release(block);
}

EventId Engine::acquire_event_locked() {
  if (spare_events_.empty()) return backend_->create_event();
  EventId e = spare_events_.back();
  spare_events_.pop_back();
  return e;
}

void Engine::process_events_locked(bool wait) {
  std::size_t kept = 0;
  for (PendingFree& p : pending_) {
    bool done = true;
    for (EventId e : p.events) {
      if (wait) backend_->synchronize_event(e);
      else if (!backend_->query_event(e)) {
        done = false;
        break;
      }
    }
    if (!done) {
      // Not `pending_[kept++] = std::move(p)`: when nothing was removed yet that is a
      // self-move, and a self-moved std::vector is left empty, so the entry would lose its
      // events and the block would be released before its streams finished with it.
      if (&pending_[kept] != &p) pending_[kept] = std::move(p);
      ++kept;
      continue;
    }
    for (EventId e : p.events) spare_events_.push_back(e);
    release_locked(p.block);
  }
  pending_.resize(kept);
}

void Engine::empty_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  trace_.record(TraceAction::kEmptyCache, 0, 0, 0, 0);
  process_events_locked(/*wait=*/false);
  // Stitched ranges whose streams are done, even where no segment is wholly free (the
  // release below then returns early): a stitched block's free records its event on the
  // stream's worker, so whether the free itself could unmap the range was a race.
  unmap_retired_locked(/*wait=*/false);
  release_cached_locked();
  after_op_locked();
}

std::string Engine::set_budget(std::size_t bytes) {
  if (bytes == 0) return "budget must be positive";
  std::lock_guard<std::mutex> lock(mutex_);
  trace_.record(TraceAction::kSetBudget, 0, bytes, 0, 0);
  budget_ = bytes;
  if (static_cast<std::size_t>(pool_.stats().reserved_bytes[kAllPools].current) > budget_) {
    release_cached_locked();
  }
  return "";
}

std::string Engine::set_memory_fraction(double fraction) {
  if (!(fraction > 0.0 && fraction <= 1.0)) {
    return "memory fraction " + std::to_string(fraction) + " is out of range: expected a value "
           "in (0, 1]";
  }
  return set_budget(static_cast<std::size_t>(fraction * static_cast<double>(device_total_)));
}

std::size_t Engine::budget() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return budget_;
}

std::string Engine::stats_json() {
  std::lock_guard<std::mutex> lock(mutex_);
  char extra[320];
  std::snprintf(extra, sizeof extra,
                "\"budget_bytes\":%zu,\"device_total_bytes\":%zu,\"pending_frees\":%zu,"
                "\"host_pool_bytes\":%zu,\"swap_slots\":%zu,\"retired_stitched_ranges\":%zu",
                budget_, device_total_, pending_.size(), host_pool_.capacity(), slots_.size(),
                retired_ranges_.size());
  return pyalloc::stats_json(pool_.stats(), pool_.fragmentation(), extra);
}

std::string Engine::snapshot_json() {
  std::lock_guard<std::mutex> lock(mutex_);
  return snapshot_json_locked();
}

std::string Engine::last_oom_json() {
  std::lock_guard<std::mutex> lock(mutex_);
  return last_oom_json_;
}

std::string Engine::snapshot_json_locked() const {
  std::string pool = pool_.snapshot_json();
  char head[256];
  std::snprintf(head, sizeof head,
                "{\"device\":%d,\"backend\":\"%s\",\"budget_bytes\":%zu,\"evicting\":%s,"
                "\"stitching\":%s,\"granularity_bytes\":%zu,",
                backend_->device(), backend_->name(), budget_,
                evict_callback_ ? "true" : "false", stitches(PoolKind::kLarge) ? "true" : "false",
                backend_->granularity());
  return head + pool.substr(1);  // splice the pool's object into ours
}

std::string Engine::check_invariants() {
  std::lock_guard<std::mutex> lock(mutex_);
  return pool_.check_invariants();
}

void Engine::set_trace_capacity(std::size_t capacity) {
  std::lock_guard<std::mutex> lock(mutex_);
  trace_.set_capacity(capacity);
  // A replay starts in the phase the live run was in.
  trace_.record(TraceAction::kLifetime, 0, long_lived_ ? 1 : 0, 0, 0);
}

void Engine::set_long_lived(bool long_lived) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (long_lived == long_lived_) return;
  long_lived_ = long_lived;
  trace_.record(TraceAction::kLifetime, 0, long_lived ? 1 : 0, 0, 0);
}

std::string Engine::drain_trace_json() {
  std::lock_guard<std::mutex> lock(mutex_);
  return trace_.drain_json();
}

std::int64_t Engine::live_blocks() {
  std::lock_guard<std::mutex> lock(mutex_);
  // A free waiting only on events that have since completed is not live any more.
  if (!pending_.empty()) process_events_locked(/*wait=*/false);
  return pool_.stats().active[kAllPools].current;
}

void Engine::reset_peak_stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  pool_.stats().reset_peaks();
}

void Engine::reset_accumulated_stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  pool_.stats().reset_accumulated();
}

}  // namespace pyalloc
