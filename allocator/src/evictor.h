// evictor.h — choosing which evictable blocks to give up when a request does not fit.
//
// The registry (Python) marks blocks evictable and tells the engine what each would cost
// to bring back; the engine knows addresses and neighbours, so it chooses. Three
// strategies, selectable for comparison (option evict_strategy):
//
//   dtr     DTR's heuristic h = cost / (bytes × staleness), cheapest first, until the
//           victims' bytes cover the request. Fragmentation-unaware: the bytes it frees
//           may be scattered, and the engine may need further rounds.
//   dte     MegEngine's DTE variant: the same with each victim's free neighbours counted
//           in its bytes, which favours victims whose freeing joins free space.
//   window  Coop's sliding window: the cheapest run (by cost / staleness) of
//           *contiguous* evictable and free blocks inside one segment that holds the
//           request, so one round frees space that is actually usable. When no segment can hold the request, whole
//           segments of free and evictable blocks are freed, cheapest first, so the
//           release rung can return them and a new segment can be made; failing that
//           too (with stitching on, for a large request), the 2 MiB chunks that eviction
//           would leave wholly free, cheapest first, for the stitch rung. A stitched
//           range's block is a candidate in every strategy (a window of its own).
//
// Staleness is measured on a logical clock (one tick per access the registry reports),
// which keeps runs deterministic and tests exact.
//
// Thread safety: none; called with the owning Engine's lock held.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "options.h"
#include "pool.h"

namespace pyalloc {

struct EvictPlan {
  std::vector<Block*> victims;
  std::size_t bytes = 0;  // sum of the victims' sizes
  double cost = 0;        // sum of their costs
};

// What to evict so that a request of `rounded` bytes on `stream` can be served, given
// `headroom` bytes still under the budget. Empty when nothing evictable would help.
// `kind`: the pool the request is served from. `stitch`: the engine can stitch free chunks
// for this request (Engine::stitches), so chunks freed anywhere serve it.
EvictPlan plan_eviction(const Pool& pool, EvictStrategy strategy, std::size_t rounded,
                        PoolKind kind, StreamId stream, std::uint64_t clock,
                        std::size_t headroom, std::size_t granularity, bool stitch);

// The window strategy's first answer alone: the cheapest window inside one segment of the
// request's pool (for a small request, or of a large-pool block it may borrow from) that
// then holds it. Empty when no segment would (Note [Evicting in place] in reclaim.cpp).
EvictPlan plan_in_place(const Pool& pool, std::size_t rounded, PoolKind kind, StreamId stream,
                        std::uint64_t clock);

// Victims totalling at least `bytes`, cheapest by DTR's heuristic (proactive eviction).
EvictPlan plan_reduction(const Pool& pool, std::size_t bytes, std::uint64_t clock);

// Bytes and count of blocks marked evictable (for the OOM report).
std::size_t evictable_bytes(const Pool& pool, std::size_t* blocks);

}  // namespace pyalloc
