// evictor.h — choosing which evictable blocks to give up when a request does not fit.
//
// The registry (registry/src) marks blocks evictable and tells the engine what each would cost
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
// Staleness is measured on a logical clock (one tick per access the registry reports of a
// block of kClockQuietBytes or more: Note [What moves the clock]), which keeps runs
// deterministic and tests exact.
//
// Thread safety: none; called with the owning Engine's lock held.
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "options.h"
#include "pool.h"

namespace pyalloc {

// Note [What moves the clock]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Every mark and touch of a block of kClockQuietBytes or more ticks the clock; one of a
// smaller block stamps the block with the clock as it stands. Staleness orders the victims
// that free room, and with every access ticking, the count of a program's small tensors
// reordered its large ones: with min_evictable at 1 KiB the demo's residual CNN marks
// thousands of 1-16 KiB tensors a step, and their ticks made the window strategy choose
// other large victims than at 16 KiB, where no small block is ever marked — 726 evictions
// in six steps instead of 528, and 0.34x the stock batch's samples/s instead of 0.47x
// (docs/results/notebook.md, twenty-second and twenty-third sessions). With the quiet
// threshold the same six steps evict the same 528 at either setting: a small victim can
// join a plan, but does not change which large ones are stale. 16 KiB was min_evictable's
// default until then, so a program's large victims are ranked as they were under it.
inline constexpr std::size_t kClockQuietBytes = 16 << 10;

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

// The cheapest window of free and evictable blocks inside one small-pool segment that then
// holds a large request of at most a small segment's size, whatever the strategy (Note
// [Evicting to lend] in reclaim.cpp). Empty when no small segment would.
EvictPlan plan_lend(const Pool& pool, std::size_t rounded, StreamId stream, std::uint64_t clock);

// Victims totalling at least `bytes`, cheapest by DTR's heuristic (proactive eviction).
EvictPlan plan_reduction(const Pool& pool, std::size_t bytes, std::uint64_t clock);

// Note [Thrash guard]
// ~~~~~~~~~~~~~~~~~~~
// The window strategy evicts in place (Note [Evicting in place] in reclaim.cpp): it keeps
// the segments it has and evicts what lies together inside them, not what is stale. When
// the only windows that hold the requests of a phase contain what its next ops read, each
// round evicts blocks that come straight back (recomputed, marked evictable again) and
// the next request evicts them again. Seen on the demo's residual CNN at batch 64 under
// 1.1x the batch-16 peak: 9,586 evictions and 9,574 recomputes in 193 ops before a 40 s
// watchdog stopped it, where DTR trained two steps with 96 evictions. So the engine
// watches samples of kSample victims of window rounds: a victim marked again within
// kBounceTicks of its eviction bounced. When 85% of the last kWindow samples' victims
// bounced, the engine stops evicting in place for kCooldownTicks: requests climb the
// plain ladder, where releasing, stitching and growing segments come before eviction, so
// the pool can change its shape; the evict rung still plans windows. Then it tries in
// place again (num_thrash_fallbacks counts the switches). The demo's run switches once
// and trains.
// Option thrash_guard, off by default, because it is a heuristic with a price: bounces
// alone do not tell churn that still trains from thrash that does not (it fired in the
// demo's default run too, where windows train). The zoo GRU's small per-timestep tensors bounce as
// much as the CNN's near its least budget, and there the plain ladder's releases lose:
// its least budget (bench_remat) went from 0.44 to 0.48 of its peak. Measured and dropped
// (docs/results/notebook.md, "Untuned models, and what they found"): DTR's score as the
// fallback (BERT out of memory at 0.4, fragmented; GRU 0.51) and one sample instead of
// four (the UNet's least budget 0.35 -> 0.38, and syncs and maps at half the peak on four
// zoo models). The demo's thrash had a cause of its own, since fixed: restoring an input
// replayed ops whose own inputs were restored round by round, each round evicting what the
// previous restored; a replay's inputs are now pinned as they are restored (Note [Pinning
// inside replays] in registry/src/restore.cpp), and the demo's case trains without the
// guard, in 28-30 s.
// A sample is cheap: one hash-map insert per victim and, while a sample is open, one
// lookup per mark.
class ThrashGuard {
 public:
  static constexpr std::uint64_t kBounceTicks = 64;
  static constexpr std::uint32_t kSample = 32;
  static constexpr std::uint32_t kWindow = 4;  // samples judged together
  static constexpr std::uint64_t kCooldownTicks = 8192;

  // A window round evicted the block marked with `handle`.
  void evicted(std::uint64_t handle, std::uint64_t clock);
  // The block of `handle` was marked evictable at `clock`. True when this ends a sample
  // that found thrashing (the caller counts the switch).
  bool marked(std::uint64_t handle, std::uint64_t clock);
  // Whether windows are off at `clock`.
  bool cooling(std::uint64_t clock) const { return clock < off_until_; }

 private:
  struct Victim {
    std::uint64_t at;  // when it was (last) evicted
    bool back;         // marked again since
  };
  std::unordered_map<std::uint64_t, Victim> evicted_at_;  // the sample's victims, by handle
  std::uint32_t sampled_ = 0, bounced_ = 0;
  std::uint32_t recent_[kWindow] = {};  // the last samples' bounces
  std::uint32_t next_ = 0;              // samples judged since the last switch
  std::uint64_t full_at_ = 0;  // when the sample's last victim went
  std::uint64_t off_until_ = 0;
};

// What evicting `b` costs in the window strategies (0 for a free block): its cost to bring
// back over its staleness.
double window_cost(const Block* b, std::uint64_t clock);

// Bytes and count of blocks marked evictable (for the OOM report).
std::size_t evictable_bytes(const Pool& pool, std::size_t* blocks);

}  // namespace pyalloc
