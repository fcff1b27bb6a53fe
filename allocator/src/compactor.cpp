// compactor.cpp — see compactor.h.
#include "compactor.h"

#include <algorithm>
#include <set>

namespace pyalloc {
namespace {

struct Window {
  Block* first;
  Block* last;
  std::size_t moved;
};

}  // namespace

CompactPlan plan_compaction(const Pool& pool, std::size_t rounded, PoolKind kind,
                            StreamId stream, const std::unordered_set<std::uintptr_t>& movable) {
  CompactPlan plan;
  if (movable.empty() || kind == PoolKind::kPersistent) return plan;
  auto moves = [&](const Block* b) {
    // Only blocks of the request's own stream: the registry copies on that stream, and the
    // old block, freed right after, must not be reused before the copy has read it.
    return b->state == BlockState::kAllocated && b->stream == stream &&
           b->stream_uses.empty() && movable.count(b->addr) != 0;
  };

  // Every minimal window: for each block that ends one, the shortest run ending there.
  std::vector<Window> windows;
  for (const auto& kv : pool.segments()) {
    const Segment* seg = kv.second;
    if (seg->pool != kind || seg->size < rounded) continue;
    Block* first = seg->first;
    std::size_t bytes = 0, moved = 0;
    for (Block* b = seg->first; b; b = b->next) {
      const bool mover = moves(b);
      if (!mover && !free_for(b, stream)) {
        first = b->next;
        bytes = moved = 0;
        continue;
      }
      bytes += b->size;
      if (mover) moved += b->size;
      while (first != b && bytes - first->size >= rounded) {
        bytes -= first->size;
        if (moves(first)) moved -= first->size;
        first = first->next;
      }
      if (bytes >= rounded && moved > 0) windows.push_back({first, b, moved});
    }
  }
  std::sort(windows.begin(), windows.end(), [](const Window& a, const Window& b) {
    return a.moved != b.moved ? a.moved < b.moved : a.first->addr < b.first->addr;
  });

  // The free blocks a mover may go to, by address.
  struct Hole {
    std::uintptr_t addr;
    std::size_t size;
  };
  std::vector<Hole> holes;
  for (const auto& kv : pool.segments()) {
    if (kv.second->pool != kind) continue;
    for (Block* b = kv.second->first; b; b = b->next) {
      if (free_for(b, stream)) holes.push_back({b->addr, b->size});
    }
  }

  // The cheapest windows first; a few tries bound the work of a rung that is rare anyway.
  constexpr std::size_t kMaxTries = 64;
  for (std::size_t i = 0; i < windows.size() && i < kMaxTries; ++i) {
    const Window& w = windows[i];
    const std::uintptr_t lo = w.first->addr, hi = w.last->addr + w.last->size;
    std::vector<Block*> movers;
    for (Block* b = w.first;; b = b->next) {
      if (moves(b)) movers.push_back(b);
      if (b == w.last) break;
    }
    std::sort(movers.begin(), movers.end(), [](const Block* a, const Block* b) {
      return a->size != b->size ? a->size > b->size : a->addr < b->addr;
    });
    // Best fit, largest first, into the holes outside the window: the same choices the
    // engine's execution makes (Pool::find_free_outside), so a plan that fits here fits there.
    std::multiset<std::size_t> room;
    for (const Hole& h : holes) {
      if (h.addr + h.size <= lo || h.addr >= hi) room.insert(h.size);
    }
    bool fits = true;
    for (const Block* m : movers) {
      auto it = room.lower_bound(m->size);
      if (it == room.end()) {
        fits = false;
        break;
      }
      // What Pool::take will leave free of that hole, by the pool's own rule (in an
      // expandable segment it leaves slivers too: counting them as nothing is safe).
      const std::size_t rest = pool.splits(kind, *it, m->size) ? *it - m->size : 0;
      room.erase(it);
      if (rest) room.insert(rest);
    }
    if (!fits) continue;
    plan.lo = lo;
    plan.hi = hi;
    plan.movers = std::move(movers);
    return plan;
  }
  return plan;
}

}  // namespace pyalloc
