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

}  // namespace pyalloc
