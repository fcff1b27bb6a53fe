// compactor.h — compaction: moving live storages out of the way so that a hole opens.
//
// The last rung before an OOM (reclaim.cpp). By then nothing evictable is left and the
// free memory, although enough in bytes, lies in pieces too small to hold the request and
// too broken for stitching (which gathers whole 2 MiB chunks only). A storage that the
// registry can move — resident, not in use by an op, its bytes copyable — need not stay
// where it is: copied into a free block elsewhere, its old place joins the free blocks
// around it. The engine plans (it knows addresses and neighbours), the registry moves
// (it knows which tensors live where and can repoint their storage); see Note
// [Relocation] in engine.h for the hand-over.
//
// The plan: a *window* — a run of consecutive blocks of one segment, each free memory the
// request's stream can use or a movable block of that stream, together at least as large
// as the request — whose movable blocks fit, best fit, largest first, into free blocks
// outside it. Of the windows that fit, the one with the fewest bytes to move; ties go to
// the lower address.
//
// Thread safety: none; called with the owning Engine's lock held.
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_set>
#include <vector>

#include "evictor.h"
#include "pool.h"

namespace pyalloc {

struct CompactPlan {
  std::uintptr_t lo = 0, hi = 0;  // the window, [lo, hi)
  std::vector<Block*> movers;     // its movable blocks, largest first
};

// A plan that makes room for `rounded` bytes of pool `kind` on `stream`, moving only
// blocks whose address is in `movable`; empty movers when none exists.
CompactPlan plan_compaction(const Pool& pool, std::size_t rounded, PoolKind kind,
                            StreamId stream, const std::unordered_set<std::uintptr_t>& movable);

// The pools a moved block of `size` bytes may land in, in order of preference; returns how
// many it wrote to `out`. The engine's execution (Engine::compact_locked) tries them in the
// same order as the plan.
int destination_pools(std::size_t size, PoolKind out[2]);

// Note [Moving what cannot leave]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Eviction plans windows of free and evictable blocks; compaction plans windows of free
// and movable ones, and moves into free holes. Neither serves a layout that training
// under recompute makes all the time: a segment almost all evictable, with one block
// that cannot leave in the middle (a parameter's gradient made in backward and frozen,
// borrowed into a large segment when the small pool was full), and no free hole anywhere
// because the budget is spent. Seen on the zoo's GRU language model at 0.4 of its peak: a
// 4 MiB request failed with 3.8 MiB of one 4 MiB segment evictable around a frozen
// 192 KiB gradient, while the small pool was full of evictable per-timestep tensors.
// The evict_to_compact rung plans both at once: a window of free, evictable and movable
// blocks (movable but not evictable, or evicting would do), and for each mover a
// destination outside it — a run of free and evictable blocks of a pool the mover may
// land in (destination_pools), the cheapest that holds it. It evicts the window's
// evictables and the destinations' and climbs again; the compact rung then finds the
// window free but for the movers, and holes for them. Cost: the window's evictions plus the
// destinations', cheapest first; the movers' copies are not counted (a copy is one pass over
// bytes that a recompute would rebuild with at least one).
// A plan that lets a request of `rounded` bytes of pool `kind` on `stream` be served by
// evicting its victims and then compacting, moving only blocks whose address is in
// `movable`; no victims when none exists (or when eviction or compaction alone would serve
// it).
EvictPlan plan_clearing(const Pool& pool, std::size_t rounded, PoolKind kind, StreamId stream,
                        const std::unordered_set<std::uintptr_t>& movable, std::uint64_t clock);

}  // namespace pyalloc
