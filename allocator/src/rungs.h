// rungs.h — the names of the reclaim ladder's rungs (reclaim.cpp, Note [The ladder]), in
// the order a request climbs them. The engine dispatches on them, and the stats count,
// for each, the requests it served or sent round again ("rung.<name>").
#pragma once

namespace pyalloc {

// X(name, what a count of it means)
#define PYALLOC_RUNGS(X)                                                                    \
  X(cached, "requests served from the cache (best fit, exact-size hits included)")          \
  X(stitch_first, "large requests served by stitching cached chunks before growing (option stitch_first)") \
  X(grow, "requests served by a new segment, or by growing the expandable one")            \
  X(fence, "requests served after waiting for other streams' cached blocks")               \
  X(any_class, "requests served by a hole of another segment class")                       \
  X(borrow, "small requests served from a large-pool free block")                          \
  X(evict_in_place, "times a window inside one segment was evicted, then the ladder climbed again (window)") \
  X(stitch_cached, "large requests served by stitching cached chunks before releasing them") \
  X(release, "requests served after cached segments were released and the pool grew again") \
  X(stitch_map_rest, "large requests served by stitching free chunks and mapping what they lack") \
  X(evict, "times victims were evicted, then the ladder climbed again")                    \
  X(compact, "times live storages were moved, then the ladder climbed again")              \
  X(evict_to_compact, "times evictions made room for the compact rung to move what cannot leave, then the ladder climbed again") \
  X(evict_last_resort, "times victims of last resort were evicted (every other rung had failed), then the ladder climbed again") \
  X(wait, "times a request waited for other threads' evictions, then climbed again")       \
  X(lend, "large requests (at most a small segment) served from a hole of a small-pool segment, every other rung having failed") \
  X(evict_to_lend, "times a window inside a small-pool segment was evicted for a large request no other rung served, which the lend rung then took")

enum class Rung : int {
#define PYALLOC_RUNG_ENUM(name, doc) name,
  PYALLOC_RUNGS(PYALLOC_RUNG_ENUM)
#undef PYALLOC_RUNG_ENUM
  kCount
};
constexpr int kRungs = static_cast<int>(Rung::kCount);

}  // namespace pyalloc
