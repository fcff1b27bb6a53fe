// engine.cpp — the public operations of Engine; the reclaim ladder is in reclaim.cpp.
#include "engine.h"

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace pyalloc {
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
  unmap_kept_locked(/*wait=*/true);
  release_cached_locked();
  // Swap state: every copy is complete after the synchronization release_cached_locked
  // made (or the one below, if it had nothing to release).
  backend_->synchronize_device();
  for (auto& kv : slots_) releasing_.push_back(kv.second);
  slots_.clear();
  reap_slots_locked(/*wait=*/true);
  if (to_host_stream_) backend_->destroy_stream(to_host_stream_);
  if (to_device_stream_) backend_->destroy_stream(to_device_stream_);
  if (host_pool_.base() && host_pool_chunk_) {
    backend_->host_unreserve(host_pool_.base(), host_pool_.capacity(), host_pool_chunk_,
                             host_pool_committed_);
  } else if (host_pool_.base()) {
    backend_->host_free(host_pool_.base(), host_pool_.capacity());
  }
  for (EventId e : spare_events_) backend_->destroy_event(e);
}

void Engine::after_op_locked() {
  // Option check_invariants, or a build at assertion level 2 (check.h): stop at the first
  // violation.
  if (!options_.check_invariants && PYALLOC_ASSERT_LEVEL < 2) return;
  std::string violation = pool_.check_invariants();
  if (!violation.empty()) {
    std::fprintf(stderr, "pyalloc: invariant violated: %s\n", violation.c_str());
    std::abort();
  }
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

Status Engine::set_evictable(void* ptr, std::uint64_t handle, double cost, bool last_resort) {
  auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  if (!(cost >= 0) || cost > 1e300) {
    return Status::invalid("set_evictable: cost " + std::to_string(cost) +
                           " must be a finite number >= 0");
  }
  std::lock_guard<std::mutex> lock(mutex_);
  Block* block = pool_.find_allocated(addr);
  if (!block) {
    return Status::invalid("set_evictable of " + format_address(addr) +
                           ": no live block starts there (" + pool_.describe_unknown_pointer(addr) +
                           ")");
  }
  block->evict_handle = handle;
  block->evict_cost = cost;
  block->evict_last = last_resort && handle != 0;
  stamp_use_locked(block);
  if (options_.thrash_guard && handle != 0 && thrash_.marked(handle, clock_))
    ++pool_.stats().num_thrash_fallbacks;
  return Status();
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

Status Engine::touch(void* ptr) {
  auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(mutex_);
  Block* block = pool_.find_allocated(addr);
  if (!block)
    return Status::invalid("touch of " + format_address(addr) + ": no live block starts there");
  stamp_use_locked(block);
  return Status();
}

void Engine::stamp_use_locked(Block* block) {
  // Note [What moves the clock] in evictor.h.
  block->last_use = block->size < kClockQuietBytes ? clock_ : ++clock_;
}

Status Engine::free(void* ptr, std::size_t expected_size) {
  auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(mutex_);
  Block* block = pool_.find_allocated(addr);
  if (!block) {
    ++pool_.stats().num_invalid_frees;
    return Status::invalid("invalid free: " + pool_.describe_unknown_pointer(addr));
  }
  if (expected_size != SIZE_MAX && expected_size != block->requested) {
    ++pool_.stats().num_invalid_frees;
    return Status::invalid("invalid free of " + format_address(addr) +
                           ": the caller says it holds " + std::to_string(expected_size) +
                           " bytes but it was allocated with " + std::to_string(block->requested) +
                           "; the block was left allocated (pass the size "
                           "given to malloc)");
  }
  if (block->evict_handle != 0) note_freed_marked_locked(block);
  if (block->segment->stitched) {
    free_stitched_locked(block);
    after_op_locked();
    return Status();
  }
  if (block->stream_uses.empty()) {
    release_locked(block);
    after_op_locked();
    return Status();
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
  return Status();
}

Status Engine::record_stream(void* ptr, StreamId stream) {
  auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(mutex_);
  Block* block = pool_.find_allocated(addr);
  if (!block) {
    return Status::invalid("record_stream of " + format_address(addr) +
                           ": no live block starts there (" + pool_.describe_unknown_pointer(addr) +
                           ")");
  }
  if (stream == kAnyStream)
    return Status::invalid("record_stream: stream " + format_address(stream) + " is reserved");
  if (stream == block->stream) return Status();
  for (StreamId s : block->stream_uses) {
    if (s == stream) return Status();
  }
  block->stream_uses.push_back(stream);
  return Status();
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
  if (captures_ > 0) return;  // a capture forbids the synchronization (Note [Graph pools])
  trace_.record(TraceAction::kEmptyCache, 0, 0, 0, 0);
  process_events_locked(/*wait=*/false);
  // Stitched ranges whose streams are done, even where no segment is wholly free (the
  // release below then returns early): a stitched block's free records its event on the
  // stream's worker, so whether the free itself could unmap the range was a race.
  unmap_retired_locked(/*wait=*/false);
  release_cached_locked();
  after_op_locked();
}

Status Engine::set_budget(std::size_t bytes) {
  if (bytes == 0) return Status::invalid("budget must be positive");
  std::lock_guard<std::mutex> lock(mutex_);
  trace_.record(TraceAction::kSetBudget, 0, bytes, 0, 0);
  budget_ = bytes;
  if (static_cast<std::size_t>(pool_.stats().reserved_bytes[kAllPools].current) > budget_) {
    release_cached_locked();
  }
  return Status();
}

Status Engine::set_memory_fraction(double fraction) {
  if (!(fraction > 0.0 && fraction <= 1.0)) {
    return Status::invalid("memory fraction " + std::to_string(fraction) +
                           " is out of range: expected a value "
                           "in (0, 1]");
  }
  return set_budget(static_cast<std::size_t>(fraction * static_cast<double>(device_total_)));
}

std::size_t Engine::budget() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return budget_;
}

std::string Engine::stats_json() {
  std::lock_guard<std::mutex> lock(mutex_);
  char extra[384];
  std::snprintf(extra, sizeof extra,
                "\"budget_bytes\":%zu,\"device_total_bytes\":%zu,\"pending_frees\":%zu,"
                "\"host_pool_bytes\":%zu,\"host_pool_usable_bytes\":%zu,\"swap_slots\":%zu,"
                "\"retired_stitched_ranges\":%zu,\"kept_stitched_ranges\":%zu",
                budget_, device_total_, pending_.size(), host_pool_.capacity(),
                host_pool_committed_, slots_.size(), retired_ranges_.size(), kept_ranges_.size());
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

// --- CUDA graph pools (Note [Graph pools] in block.h) ---

Status Engine::route_to_graph_pool(std::uint64_t pool, StreamId stream, RouteKind kind) {
  if (pool == 0 || (pool & kGraphPoolTagBit) != 0)
    return Status::invalid("graph pool id " + std::to_string(pool) + " must be in [1, 2^63)");
  if (kind != RouteKind::kStream && kind != RouteKind::kCapture && kind != RouteKind::kThread)
    return Status::invalid("route kind " + std::to_string(static_cast<int>(kind)) +
                           " must be 0 (stream), 1 (capture) or 2 (thread)");
  std::lock_guard<std::mutex> lock(mutex_);
  routes_.push_back(GraphRoute{pool, stream, kind, std::this_thread::get_id()});
  if (kind == RouteKind::kCapture) ++captures_;
  return Status();
}

void Engine::end_graph_pool_routes(std::uint64_t pool) {
  std::lock_guard<std::mutex> lock(mutex_);
  end_graph_pool_routes_locked(pool);
}

void Engine::end_graph_pool_routes_locked(std::uint64_t pool) {
  std::size_t kept = 0;
  for (const GraphRoute& r : routes_) {
    if (r.pool != pool) routes_[kept++] = r;
    else if (r.kind == RouteKind::kCapture) --captures_;
  }
  routes_.resize(kept);
}

void Engine::release_graph_pool(std::uint64_t pool) {
  std::lock_guard<std::mutex> lock(mutex_);
  end_graph_pool_routes_locked(pool);
  for (std::uint64_t p : released_pools_)
    if (p == pool) return;
  released_pools_.push_back(pool);
}

std::vector<std::uintptr_t> Engine::graph_pool_blocks(std::uint64_t pool) {
  std::lock_guard<std::mutex> lock(mutex_);
  return pool_.allocated_with_tag(graph_pool_tag(pool));
}

StreamId Engine::route_locked(StreamId stream) const {
  // The newest route that picks the request wins: a thread's use_mem_pool inside a
  // warm-up, say.
  const std::thread::id me = std::this_thread::get_id();
  for (auto it = routes_.rbegin(); it != routes_.rend(); ++it) {
    const bool picks = it->kind == RouteKind::kThread ? it->thread == me
                       : it->stream == stream ||
                             (it->kind == RouteKind::kCapture && backend_->stream_is_capturing(stream));
    if (picks) return graph_pool_tag(it->pool);
  }
  return stream;
}

void Engine::adopt_released_pools_locked() {
  // Called after a device-wide synchronization: nothing a released pool's graphs queued
  // is still running, so its free memory is idle. A pool stays listed while blocks of it
  // are live (a graph's outputs the program still holds): they are adopted once freed.
  std::size_t kept = 0;
  for (std::uint64_t p : released_pools_) {
    pool_.adopt_stream(graph_pool_tag(p));
    if (!pool_.allocated_with_tag(graph_pool_tag(p)).empty()) released_pools_[kept++] = p;
  }
  released_pools_.resize(kept);
}

}  // namespace pyalloc
