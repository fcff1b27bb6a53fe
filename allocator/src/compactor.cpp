// compactor.cpp — see compactor.h.
#include "compactor.h"

#include <algorithm>
#include <limits>
#include <set>
#include <unordered_set>

#include "evictor.h"

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

  // The free blocks a mover may go to, by pool and address.
  struct Hole {
    std::uintptr_t addr;
    std::size_t size;
  };
  std::vector<Hole> holes[kPoolKinds];
  for (const auto& kv : pool.segments()) {
    for (Block* b = kv.second->first; b; b = b->next) {
      if (free_for(b, stream)) holes[static_cast<int>(kv.second->pool)].push_back({b->addr, b->size});
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
    // Best fit, largest first, into the holes outside the window, pool by pool in the
    // order of destination_pools: the same choices the engine's execution makes
    // (Pool::find_free_outside), so a plan that fits here fits there.
    std::multiset<std::size_t> room[kPoolKinds];
    for (int k = 0; k < kPoolKinds; ++k) {
      for (const Hole& h : holes[k]) {
        if (h.addr + h.size <= lo || h.addr >= hi) room[k].insert(h.size);
      }
    }
    bool fits = true;
    for (const Block* m : movers) {
      PoolKind to[2];
      const int pools = destination_pools(m->size, to);
      bool placed = false;
      for (int i = 0; i < pools && !placed; ++i) {
        std::multiset<std::size_t>& r = room[static_cast<int>(to[i])];
        auto it = r.lower_bound(m->size);
        if (it == r.end()) continue;
        // What Pool::take will leave free of that hole, by the pool's own rule (in an
        // expandable segment it leaves slivers too: counting them as nothing is safe).
        const std::size_t rest = pool.splits(to[i], *it, m->size) ? *it - m->size : 0;
        r.erase(it);
        if (rest) r.insert(rest);
        placed = true;
      }
      if (!placed) {
        fits = false;
        break;
      }
    }
    if (!fits) continue;
    plan.lo = lo;
    plan.hi = hi;
    plan.movers = std::move(movers);
    return plan;
  }
  return plan;
}

int destination_pools(std::size_t size, PoolKind out[2]) {
  int n = 0;
  if (size <= kSmallSize) out[n++] = PoolKind::kSmall;
  out[n++] = PoolKind::kLarge;
  return n;
}

namespace {

// A block a clearing window or a destination may span, and what it is there.
enum class Part { kNone, kFree, kEvict, kMove };

}  // namespace

ClearPlan plan_clearing(const Pool& pool, std::size_t rounded, PoolKind kind, StreamId stream,
                        const std::unordered_set<std::uintptr_t>& movable, std::uint64_t clock) {
  ClearPlan best;
  if (movable.empty() || kind == PoolKind::kPersistent) return best;
  auto part = [&](const Block* b) {
    if (b->state == BlockState::kFree) return free_for(b, stream) ? Part::kFree : Part::kNone;
    if (b->state != BlockState::kAllocated || b->stream != stream) return Part::kNone;
    if (evictable(b)) return Part::kEvict;
    // Only blocks of the request's own stream move (see plan_compaction).
    if (b->stream_uses.empty() && movable.count(b->addr) != 0) return Part::kMove;
    return Part::kNone;
  };

  // Every minimal window of free, evictable and movable blocks holding the request, with
  // at least one mover and one victim (without a mover the evict rung's window would have
  // served; without a victim, compaction).
  struct Window {
    Block* first;
    Block* last;
    double cost;
  };
  std::vector<Window> windows;
  for (const auto& kv : pool.segments()) {
    const Segment* seg = kv.second;
    if (seg->pool != kind || seg->size < rounded) continue;
    Block* first = seg->first;
    std::size_t bytes = 0, moved = 0, evicted = 0;
    double cost = 0;
    for (Block* b = seg->first; b; b = b->next) {
      const Part p = part(b);
      if (p == Part::kNone) {
        first = b->next;
        bytes = moved = evicted = 0;
        cost = 0;
        continue;
      }
      bytes += b->size;
      if (p == Part::kMove) moved += b->size;
      if (p == Part::kEvict) evicted += b->size, cost += window_cost(b, clock);
      while (first != b && bytes - first->size >= rounded) {
        const Part q = part(first);
        bytes -= first->size;
        if (q == Part::kMove) moved -= first->size;
        if (q == Part::kEvict) evicted -= first->size, cost -= window_cost(first, clock);
        first = first->next;
      }
      if (bytes >= rounded && moved > 0 && evicted > 0) windows.push_back({first, b, cost});
    }
  }
  std::sort(windows.begin(), windows.end(), [](const Window& a, const Window& b) {
    return a.cost != b.cost ? a.cost < b.cost : a.first->addr < b.first->addr;
  });

  // For each of the cheapest windows, a destination for each mover, largest first: the
  // cheapest minimal run of free and evictable blocks outside the window and outside the
  // runs already chosen, in a pool the mover may land in (a run of free blocks alone costs
  // nothing, so a hole is taken where one is). The cheapest whole plan wins.
  constexpr std::size_t kMaxTries = 16;
  for (std::size_t i = 0; i < windows.size() && i < kMaxTries; ++i) {
    const Window& w = windows[i];
    if (!best.victims.empty() && w.cost >= best.cost) break;  // sorted: none cheaper follows
    const std::uintptr_t lo = w.first->addr, hi = w.last->addr + w.last->size;
    ClearPlan plan;
    plan.cost = w.cost;
    std::vector<Block*> movers;
    for (Block* b = w.first;; b = b->next) {
      const Part p = part(b);
      if (p == Part::kEvict) plan.victims.push_back(b);
      if (p == Part::kMove) movers.push_back(b), plan.moved += b->size;
      if (b == w.last) break;
    }
    std::sort(movers.begin(), movers.end(), [](const Block* a, const Block* b) {
      return a->size != b->size ? a->size > b->size : a->addr < b->addr;
    });
    std::unordered_set<const Block*> claimed;
    bool fits = true;
    for (const Block* m : movers) {
      PoolKind to[2];
      const int pools = destination_pools(m->size, to);
      Block* run_first = nullptr;
      Block* run_last = nullptr;
      for (int k = 0; k < pools && !run_first; ++k) {
        double run_cost = std::numeric_limits<double>::infinity();
        std::size_t run_size = 0;
        for (const auto& kv : pool.segments()) {
          const Segment* seg = kv.second;
          if (seg->pool != to[k] || seg->size < m->size) continue;
          Block* first = seg->first;
          std::size_t bytes = 0;
          double cost = 0;
          for (Block* b = seg->first; b; b = b->next) {
            const Part p = part(b);
            const bool inside = b->addr < hi && b->addr + b->size > lo;
            if ((p != Part::kFree && p != Part::kEvict) || inside || claimed.count(b)) {
              first = b->next;
              bytes = 0;
              cost = 0;
              continue;
            }
            bytes += b->size;
            cost += window_cost(b, clock);
            while (first != b && bytes - first->size >= m->size) {
              bytes -= first->size;
              cost -= window_cost(first, clock);
              first = first->next;
            }
            if (bytes >= m->size && (cost < run_cost || (cost == run_cost && bytes < run_size))) {
              run_first = first, run_last = b, run_cost = cost, run_size = bytes;
            }
          }
        }
      }
      if (!run_first) {
        fits = false;
        break;
      }
      for (Block* b = run_first;; b = b->next) {
        claimed.insert(b);
        if (part(b) == Part::kEvict) plan.victims.push_back(b), plan.cost += window_cost(b, clock);
        if (b == run_last) break;
      }
    }
    if (fits && (best.victims.empty() || plan.cost < best.cost)) best = std::move(plan);
  }
  return best;
}

}  // namespace pyalloc
