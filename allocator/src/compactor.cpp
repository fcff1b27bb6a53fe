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

// What `b` is to a clearing plan for `stream`: free memory it can use, an evictable block, a
// block only the registry can move (of `stream` alone: see plan_compaction), or none.
Part part_of(const Block* b, StreamId stream, const std::unordered_set<std::uintptr_t>& movable) {
  if (b->state == BlockState::kFree) return free_for(b, stream) ? Part::kFree : Part::kNone;
  if (b->state != BlockState::kAllocated || b->stream != stream) return Part::kNone;
  if (evictable(b)) return Part::kEvict;
  if (b->stream_uses.empty() && movable.count(b->addr) != 0) return Part::kMove;
  return Part::kNone;
}

struct Run {
  Block* first = nullptr;
  Block* last = nullptr;
  double cost = std::numeric_limits<double>::infinity();  // the window strategy's measure
};

// The cheapest minimal run of free and evictable blocks of pool `kind` holding `size` bytes,
// outside [lo, hi) and `claimed`; ties go to the smaller run. Empty (first null) if none.
Run cheapest_run(const Pool& pool, PoolKind kind, std::size_t size, std::uintptr_t lo,
                 std::uintptr_t hi, const std::unordered_set<const Block*>& claimed,
                 StreamId stream, const std::unordered_set<std::uintptr_t>& movable,
                 std::uint64_t clock) {
  Run best;
  std::size_t best_size = 0;
  for (const auto& kv : pool.segments()) {
    const Segment* seg = kv.second;
    if (seg->pool != kind || seg->size < size) continue;
    Block* first = seg->first;
    std::size_t bytes = 0;
    double cost = 0;
    for (Block* b = seg->first; b; b = b->next) {
      const Part p = part_of(b, stream, movable);
      const bool inside = b->addr < hi && b->addr + b->size > lo;
      if ((p != Part::kFree && p != Part::kEvict) || inside || claimed.count(b)) {
        first = b->next;
        bytes = 0;
        cost = 0;
        continue;
      }
      bytes += b->size;
      cost += window_cost(b, clock);
      while (first != b && bytes - first->size >= size) {
        bytes -= first->size;
        cost -= window_cost(first, clock);
        first = first->next;
      }
      if (bytes >= size && (cost < best.cost || (cost == best.cost && bytes < best_size))) {
        best = {first, b, cost};
        best_size = bytes;
      }
    }
  }
  return best;
}

}  // namespace

EvictPlan plan_clearing(const Pool& pool, std::size_t rounded, PoolKind kind, StreamId stream,
                        const std::unordered_set<std::uintptr_t>& movable, std::uint64_t clock) {
  if (movable.empty() || kind == PoolKind::kPersistent) return {};
  auto part = [&](const Block* b) { return part_of(b, stream, movable); };

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
  // cheapest run outside the window and outside the runs already chosen, in a pool the
  // mover may land in (a run of free blocks alone costs nothing, so a hole is taken where
  // one is). The cheapest whole plan wins.
  constexpr std::size_t kMaxTries = 16;
  std::vector<Block*> best;
  double best_cost = std::numeric_limits<double>::infinity();
  for (std::size_t i = 0; i < windows.size() && i < kMaxTries; ++i) {
    const Window& w = windows[i];
    if (w.cost >= best_cost) break;  // sorted, and destinations only add: none cheaper follows
    const std::uintptr_t lo = w.first->addr, hi = w.last->addr + w.last->size;
    std::vector<Block*> victims, movers;
    double cost = w.cost;
    for (Block* b = w.first;; b = b->next) {
      const Part p = part(b);
      if (p == Part::kEvict) victims.push_back(b);
      if (p == Part::kMove) movers.push_back(b);
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
      Run run;
      for (int k = 0; k < pools && !run.first; ++k)
        run = cheapest_run(pool, to[k], m->size, lo, hi, claimed, stream, movable, clock);
      if (!run.first) {
        fits = false;
        break;
      }
      for (Block* b = run.first;; b = b->next) {
        claimed.insert(b);
        if (part(b) == Part::kEvict) victims.push_back(b);
        if (b == run.last) break;
      }
      cost += run.cost;
    }
    if (fits && cost < best_cost) best = std::move(victims), best_cost = cost;
  }
  EvictPlan plan;
  for (Block* b : best) {
    plan.victims.push_back(b);
    plan.bytes += b->size;
    plan.cost += b->evict_cost;
  }
  return plan;
}

}  // namespace pyalloc
