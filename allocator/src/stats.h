// stats.h — the engine's counters, named and flattened as torch.cuda.memory_stats() does.
//
// Every figure is defined exactly in docs/stats.md. In short, per pool (all, small_pool,
// large_pool) each "array" stat keeps current / peak / allocated (sum of increases) /
// freed (sum of decreases), and the byte identities
//     reserved_bytes == active_bytes + cached free bytes
//     active_bytes   == allocated_bytes + bytes awaiting other streams' events
// hold at every moment the engine lock is free (Pool::check_invariants() checks them).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "check.h"
#include "rungs.h"

namespace pyalloc {

// X(name, meaning) for the per-pool stats, in torch's order.
#define PYALLOC_ARRAY_STATS(X)                                                         \
  X(allocation, "blocks handed out (count)")                                           \
  X(segment, "segments reserved from the device (count)")                              \
  X(active, "blocks handed out or awaiting other streams (count)")                     \
  X(inactive_split, "free blocks inside split segments (count)")                       \
  X(allocated_bytes, "bytes of blocks handed out (rounded sizes)")                     \
  X(reserved_bytes, "bytes of segments reserved from the device")                      \
  X(active_bytes, "bytes of blocks handed out or awaiting other streams")              \
  X(inactive_split_bytes, "free bytes inside split segments (unreleasable cache)")     \
  X(requested_bytes, "bytes callers asked for (before rounding)")

// X(name, meaning) for the plain counters.
#define PYALLOC_COUNTERS(X)                                                             \
  X(num_alloc_retries, "allocations that had to release cached segments and retry")    \
  X(num_ooms, "allocations that failed after every reclaim step")                      \
  X(num_sync_all_streams, "device-wide synchronizations before releasing memory")      \
  X(num_device_alloc, "segments created on the device")                                \
  X(num_device_free, "segments released to the device")                               \
  X(num_segment_grows, "times an expandable segment mapped more chunks at its end")     \
  X(num_segment_trims, "times an expandable segment gave free chunks at its end back")  \
  X(num_segment_maps, "device ranges mapped: segments created or grown, stitched ranges") \
  X(num_segment_unmaps, "device ranges unmapped: segments released or trimmed, stitched ranges") \
  X(num_stream_fences, "times another stream's cached blocks were fenced for reuse")   \
  X(num_invalid_frees, "frees of unknown pointers, double frees and size mismatches")  \
  X(num_small_borrows, "small requests served from a large-pool block (budget spent)")  \
  X(num_stitches, "requests served by stitching free chunks into a new range")         \
  X(num_stitched_bytes, "bytes of those ranges")                                      \
  X(num_stitch_reuses, "of those stitches, served by a kept range: no mapping")      \
  X(num_compactions, "compaction rounds: live storages moved to open a hole (rung compact)")  \
  X(num_relocations, "storages those rounds moved, device to device")                   \
  X(num_relocated_bytes, "bytes of the blocks they moved into")                          \
  X(num_evictions, "blocks the engine asked the registry to evict")                    \
  X(num_evicted_bytes, "bytes of those blocks")                                        \
  X(num_evict_rounds, "times the evict rung ran (one victim set, one callback)")       \
  X(num_thrash_fallbacks, "times window rounds' victims kept coming back and in-place eviction paused for a while") \
  X(num_proactive_evictions, "evictions made because allocated crossed evict_threshold") \
  X(num_swap_outs, "copies of device blocks to the host pool started")                  \
  X(num_swap_out_bytes, "bytes of those copies")                                        \
  X(num_swap_ins, "copies from the host pool back to the device started")               \
  X(num_swap_in_bytes, "bytes of those copies")                                         \
  X(num_swap_failures, "swap copies the device refused to start")                      \
  X(num_host_pool_full, "swap-outs refused because the host pool had no room")

struct Stat {
  std::int64_t current = 0;
  std::int64_t peak = 0;
  std::int64_t allocated = 0;
  std::int64_t freed = 0;

  void increase(std::int64_t n) {
    current += n;
    allocated += n;
    if (current > peak) peak = current;
  }
  void decrease(std::int64_t n) {
    PYALLOC_ASSERT(1, n >= 0 && current >= n, "a stat never goes below zero");
    current -= n;
    freed += n;
  }
};

enum StatPool { kAllPools = 0, kSmallPool = 1, kLargePool = 2, kStatPools = 3 };

struct Stats {
#define PYALLOC_DECLARE_ARRAY(name, doc) Stat name[kStatPools];
  PYALLOC_ARRAY_STATS(PYALLOC_DECLARE_ARRAY)
#undef PYALLOC_DECLARE_ARRAY
#define PYALLOC_DECLARE_COUNTER(name, doc) std::int64_t name = 0;
  PYALLOC_COUNTERS(PYALLOC_DECLARE_COUNTER)
#undef PYALLOC_DECLARE_COUNTER
  // Not per pool (torch's keys are "oversize_allocations.current", ...): allocated blocks
  // and segments of at least max_split_size; always 0 while that option is off.
  Stat oversize_allocations;
  Stat oversize_segments;
  // Bytes of the host pool holding swapped-out copies (swap.h), not per pool.
  Stat host_pool_used_bytes;
  // Per rung of the reclaim ladder (rungs.h): requests it served or sent round again.
  std::int64_t rung[kRungs] = {};

  // Peaks restart from the current values; accumulated totals are kept.
  void reset_peaks();
  // allocated/freed totals and counters restart from zero.
  void reset_accumulated();
};

// Adds `n` (which may be negative) to the `all` entry and to the entry of `pool`.
inline void update(Stat (&stat)[kStatPools], int pool, std::int64_t n) {
  for (int p : {int{kAllPools}, pool}) {
    if (n >= 0) stat[p].increase(n);
    else stat[p].decrease(-n);
  }
}

// Derived figures, computed from a walk of the free blocks (see docs/stats.md).
struct FragmentationFigures {
  std::size_t cached_free_bytes = 0;   // reserved - active
  std::size_t largest_free_block = 0;  // the largest single free block
  double utilization = 1.0;            // peak allocated / peak reserved
  double external_fragmentation = 0;   // 1 - largest free / cached free
};

// Renders stats as a flat JSON object with torch's key names
// ("allocated_bytes.all.current", "num_ooms", ...) plus the derived figures and `extra`
// (pre-rendered "key":value pairs, without braces, or empty).
std::string stats_json(const Stats& s, const FragmentationFigures& f, const std::string& extra);

}  // namespace pyalloc
