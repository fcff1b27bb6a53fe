// evictor.cpp — see evictor.h.
#include "evictor.h"

#include <algorithm>
#include <limits>
#include <set>

namespace pyalloc {
namespace {

double staleness(const Block* b, std::uint64_t clock) {
  return static_cast<double>(clock - std::min(clock, b->last_use)) + 1.0;
}

std::size_t free_neighbour_bytes(const Block* b) {
  std::size_t n = 0;
  if (b->prev && b->prev->state == BlockState::kFree) n += b->prev->size;
  if (b->next && b->next->state == BlockState::kFree) n += b->next->size;
  return n;
}

// Score-ordered victims until their bytes cover `bytes` (dtr / dte).
EvictPlan plan_by_score(const Pool& pool, std::size_t bytes, std::uint64_t clock,
                        bool count_neighbours) {
  struct Scored {
    double h;
    Block* block;
  };
  std::vector<Scored> candidates;
  auto consider = [&](Block* b) {
    if (!evictable(b)) return;
    double size = static_cast<double>(b->size + (count_neighbours ? free_neighbour_bytes(b) : 0));
    candidates.push_back({b->evict_cost / (size * staleness(b, clock)), b});
  };
  for (const auto& kv : pool.segments()) {
    for (Block* b = kv.second->first; b; b = b->next) consider(b);
  }
  for (const auto& kv : pool.stitched()) consider(kv.second->first);
  // Ties (equal h) go to the lower address, so plans are deterministic.
  std::sort(candidates.begin(), candidates.end(), [](const Scored& a, const Scored& b) {
    return a.h != b.h ? a.h < b.h : a.block->addr < b.block->addr;
  });
  EvictPlan plan;
  for (const Scored& s : candidates) {
    if (plan.bytes >= bytes) break;
    plan.victims.push_back(s.block);
    plan.bytes += s.block->size;
    plan.cost += s.block->evict_cost;
  }
  return plan;
}

// A block a window may span: free memory this stream can use, or an evictable block of
// this stream (once freed it merges with its neighbours; see Note [Stream tags]).
bool usable(const Block* b, StreamId stream) {
  if (b->state == BlockState::kFree) return free_for(b, stream);
  return evictable(b) && b->stream == stream;
}

}  // namespace

// Coop's cost / staleness, with size left out because the window already asks for enough
// bytes. Without the staleness term the window keeps evicting the tensors just restored,
// which the next op needs again (measured: 20x the evictions of dtr on the transformer at
// 35% of its peak).
double window_cost(const Block* b, std::uint64_t clock) {
  return b->state == BlockState::kFree ? 0.0 : b->evict_cost / staleness(b, clock);
}

namespace {

// The cheapest contiguous run holding `rounded` bytes in any segment of the request's
// pool. Two pointers per run of usable blocks: costs are non-negative, so for each right
// end the left end moves right while the window still holds the request.
// `stitched`: stitched ranges (the large pool's) are windows too.
EvictPlan plan_window(const Pool& pool, std::size_t rounded, PoolKind kind, StreamId stream,
                      std::uint64_t clock, bool stitched = true) {
  Block* best_first = nullptr;
  Block* best_last = nullptr;
  double best_cost = std::numeric_limits<double>::infinity();
  std::size_t best_size = 0;
  for (const auto& kv : pool.segments()) {
    const Segment* seg = kv.second;
    if (seg->pool != kind || seg->size < rounded) continue;
    Block* left = seg->first;
    std::size_t size = 0;
    double cost = 0;
    for (Block* right = seg->first; right; right = right->next) {
      if (!usable(right, stream)) {
        left = right->next, size = 0, cost = 0;
        continue;
      }
      size += right->size;
      cost += window_cost(right, clock);
      while (left != right && size - left->size >= rounded) {
        size -= left->size;
        cost -= window_cost(left, clock);
        left = left->next;
      }
      if (size >= rounded && (cost < best_cost || (cost == best_cost && size < best_size))) {
        best_first = left, best_last = right, best_cost = cost, best_size = size;
      }
    }
  }
  // A stitched range is a window of its own: evicting its one block returns its pieces,
  // whole chunks, which stitching gathers again for the request (the engine stitches
  // whenever a stitched range exists). Without this, memory in stitched ranges could never
  // be reclaimed by eviction.
  for (const auto& kv : pool.stitched()) {
    if (!stitched) break;
    Block* b = kv.second->first;
    if (!evictable(b) || b->stream != stream || b->size < rounded) continue;
    const double cost = window_cost(b, clock);
    if (cost < best_cost || (cost == best_cost && b->size < best_size)) {
      best_first = best_last = b, best_cost = cost, best_size = b->size;
    }
  }
  EvictPlan plan;
  if (!best_first) return plan;
  for (Block* b = best_first;; b = b->next) {
    if (b->state != BlockState::kFree) {
      plan.victims.push_back(b);
      plan.bytes += b->size;
      plan.cost += b->evict_cost;
    }
    if (b == best_last) break;
  }
  return plan;
}

// Whole segments of free and evictable blocks, cheapest first, until the segments freed
// plus the budget's headroom hold a new segment for the request.
EvictPlan plan_segments(const Pool& pool, std::size_t needed, std::size_t headroom,
                        std::uint64_t clock) {
  struct Candidate {
    double cost;
    const Segment* seg;
  };
  std::vector<Candidate> candidates;
  for (const auto& kv : pool.segments()) {
    double cost = 0;
    bool whole = true;
    bool any_live = false;
    for (const Block* b = kv.second->first; b && whole; b = b->next) {
      if (b->state == BlockState::kFree) continue;
      whole = evictable(b);
      any_live = true;
      cost += window_cost(b, clock);
    }
    if (whole && any_live) candidates.push_back({cost, kv.second});
  }
  std::sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
    return a.cost != b.cost ? a.cost < b.cost : a.seg->addr < b.seg->addr;
  });
  EvictPlan plan;
  std::size_t room = headroom;
  for (const Candidate& c : candidates) {
    if (room >= needed) break;
    for (Block* b = c.seg->first; b; b = b->next) {
      if (b->state == BlockState::kFree) continue;
      plan.victims.push_back(b);
      plan.bytes += b->size;
      plan.cost += b->evict_cost;
    }
    room += c.seg->size;
  }
  if (room < needed) return EvictPlan{};  // even all of them would not make room
  return plan;
}

// Chunks for stitching: when no window and no set of whole segments serves the request,
// the 2 MiB chunks that evicting would leave wholly free, cheapest first, until they and
// the budget's headroom cover it — stitching (rung stitch_map_rest) then maps them into one range.
// Seen on the transformer at a quarter of its peak: 13 MiB evictable, but every segment
// also held something that could not go, so the window strategies found no plan and a
// 3 MiB request failed that dtr's scattered choice, stitched afterwards, served.
EvictPlan plan_chunks(const Pool& pool, std::size_t needed, std::size_t headroom,
                      StreamId stream, std::uint64_t clock, std::size_t chunk) {
  struct Candidate {
    double cost;
    std::uintptr_t start;     // the chunk, or the stitched range
    std::size_t bytes;        // what it gives the stitch rung
    const Segment* seg;
  };
  std::vector<Candidate> candidates;
  for (const auto& kv : pool.segments()) {
    const Segment* seg = kv.second;
    if (seg->pool == PoolKind::kPersistent) continue;
    const Block* b = seg->first;
    const std::uintptr_t end = seg->addr + seg->size;
    for (std::uintptr_t c = round_up(seg->addr, chunk); c + chunk <= end; c += chunk) {
      while (b && b->addr + b->size <= c) b = b->next;
      double cost = 0;
      bool clearable = true;
      for (const Block* o = b; o && o->addr < c + chunk; o = o->next) {
        if (!usable(o, stream)) {
          clearable = false;
          break;
        }
        cost += window_cost(o, clock);
      }
      if (clearable) candidates.push_back({cost, c, chunk, seg});
    }
  }
  // A stitched range gives back its pieces, whole chunks, when its block goes.
  for (const auto& kv : pool.stitched()) {
    const Block* b = kv.second->first;
    if (evictable(b) && b->stream == stream) {
      candidates.push_back({window_cost(b, clock), b->addr, b->size, kv.second});
    }
  }
  std::sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
    return a.cost != b.cost ? a.cost < b.cost : a.start < b.start;
  });
  EvictPlan plan;
  std::size_t room = headroom / chunk * chunk;
  std::set<const Block*> taken;
  for (const Candidate& c : candidates) {
    if (room >= needed) break;
    for (Block* o = c.seg->first; o && o->addr < c.start + c.bytes; o = o->next) {
      if (o->addr + o->size <= c.start || o->state == BlockState::kFree) continue;
      if (!taken.insert(o).second) continue;
      plan.victims.push_back(o);
      plan.bytes += o->size;
      plan.cost += o->evict_cost;
    }
    room += c.bytes;
  }
  if (room < needed || plan.victims.empty()) return EvictPlan{};
  return plan;
}

// A small request may also borrow a piece of a large-pool free block (the engine's borrow
// rung): a window there is often far cheaper than a whole segment to give back. Seen on
// the UNet at 39% of its peak: a 1 MiB request, 20 MiB evictable in the one large segment
// (split by borrowed blocks, so not whole), the small segments full of what cannot go: an
// OOM, where 35% of the peak trained, with another layout.
EvictPlan plan_borrow(const Pool& pool, std::size_t rounded, StreamId stream, std::uint64_t clock) {
  return plan_window(pool, rounded, PoolKind::kLarge, stream, clock);
}

}  // namespace

EvictPlan plan_in_place(const Pool& pool, std::size_t rounded, PoolKind kind, StreamId stream,
                        std::uint64_t clock) {
  EvictPlan plan = plan_window(pool, rounded, kind, stream, clock);
  if (plan.victims.empty() && kind == PoolKind::kSmall) return plan_borrow(pool, rounded, stream, clock);
  return plan;
}

EvictPlan plan_lend(const Pool& pool, std::size_t rounded, StreamId stream, std::uint64_t clock) {
  return plan_window(pool, rounded, PoolKind::kSmall, stream, clock, /*stitched=*/false);
}

EvictPlan plan_eviction(const Pool& pool, EvictStrategy strategy, std::size_t rounded,
                        PoolKind kind, StreamId stream, std::uint64_t clock,
                        std::size_t headroom, std::size_t granularity, bool stitch) {
  switch (strategy) {
    case EvictStrategy::kDtr: return plan_by_score(pool, rounded, clock, false);
    case EvictStrategy::kDte: return plan_by_score(pool, rounded, clock, true);
    case EvictStrategy::kWindow: {
      EvictPlan plan = plan_window(pool, rounded, kind, stream, clock);
      if (!plan.victims.empty()) return plan;
      plan = plan_segments(pool, round_up(rounded, granularity), headroom, clock);
      if (kind == PoolKind::kSmall) {
        EvictPlan borrow = plan_borrow(pool, rounded, stream, clock);
        if (!borrow.victims.empty() && (plan.victims.empty() || borrow.cost < plan.cost)) {
          return borrow;
        }
      }
      if (!plan.victims.empty() || !stitch) return plan;
      return plan_chunks(pool, round_up(rounded, granularity), headroom, stream, clock,
                         granularity);
    }
  }
  return {};
}

EvictPlan plan_reduction(const Pool& pool, std::size_t bytes, std::uint64_t clock) {
  return plan_by_score(pool, bytes, clock, false);
}

void ThrashGuard::evicted(std::uint64_t handle, std::uint64_t clock) {
  // One sample at a time: its victims, then kBounceTicks for the last of them to come back.
  if (cooling(clock) || sampled_ >= kSample) return;
  evicted_at_[handle] = Victim{clock, false};  // again, if it came back and went again
  if (++sampled_ == kSample) full_at_ = clock;
}

bool ThrashGuard::marked(std::uint64_t handle, std::uint64_t clock) {
  if (sampled_ == 0) return false;
  if (auto it = evicted_at_.find(handle); it != evicted_at_.end() && !it->second.back) {
    if (clock - it->second.at <= kBounceTicks) ++bounced_;
    it->second.back = true;
  }
  if (sampled_ < kSample || clock - full_at_ <= kBounceTicks) return false;
  // The last kWindow samples together: one sample of churn is common where windows
  // still make progress (DenseNet at 0.46 of its peak: 28 and 31 of 32 between 8 and 19).
  recent_[next_ % kWindow] = bounced_;
  ++next_;
  sampled_ = bounced_ = 0;
  evicted_at_.clear();
  if (next_ < kWindow) return false;
  std::uint32_t bounced = 0;
  for (std::uint32_t b : recent_) bounced += b;
  if (20 * bounced < 17 * kSample * kWindow) return false;  // less than 85% came back
  next_ = 0;
  off_until_ = clock + kCooldownTicks;
  return true;
}

std::size_t evictable_bytes(const Pool& pool, std::size_t* blocks) {
  LastResortVictims all;  // what the last rung could choose from
  std::size_t bytes = 0, count = 0;
  for (const auto& kv : pool.segments()) {
    for (const Block* b = kv.second->first; b; b = b->next) {
      if (evictable(b)) bytes += b->size, ++count;
    }
  }
  for (const auto& kv : pool.stitched()) {
    if (evictable(kv.second->first)) bytes += kv.second->first->size, ++count;
  }
  if (blocks) *blocks = count;
  return bytes;
}

}  // namespace pyalloc
