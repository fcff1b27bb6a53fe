// pool.cpp — see pool.h: the free sets, best fit, segments, freeing and merging, queries.
// Expandable segments, stitching, and the checks and snapshot are in pool_*.cpp beside it.
// Invariants are listed in block.h.
#include <algorithm>
#include <cinttypes>
#include <cstdio>

#include "format.h"
#include "pool.h"

namespace pyalloc {

Pool::Pool(std::size_t max_split_size)
    : max_split_size_(max_split_size),
      free_{FreeSet(std::less<FreeEntry>(), PooledAllocator<FreeEntry>(&set_nodes_)),
            FreeSet(std::less<FreeEntry>(), PooledAllocator<FreeEntry>(&set_nodes_)),
            FreeSet(std::less<FreeEntry>(), PooledAllocator<FreeEntry>(&set_nodes_))} {}

Pool::~Pool() {
  for (auto& kv : stitched_) destroy_segment(kv.second);
  for (auto& kv : segments_) destroy_segment(kv.second);
}

Block* Pool::new_block() { return new (block_nodes_.get(sizeof(Block))) Block; }

void Pool::delete_block(Block* b) {
  b->~Block();
  block_nodes_.put(b, sizeof(Block));
}

void Pool::destroy_segment(Segment* segment) {
  for (Block* b = segment->first; b != nullptr;) {
    Block* next = b->next;
    delete_block(b);
    b = next;
  }
  delete segment;
}

// --- free-set bookkeeping --------------------------------------------------------------

void Pool::inactive_split_account(const Block* b, int sign) {
  if (!b->is_split()) return;
  int p = stat_pool(b->segment);
  update(stats_.inactive_split, p, sign);
  update(stats_.inactive_split_bytes, p, sign * static_cast<std::int64_t>(b->size));
}

void Pool::insert_free(Block* b) {
  b->free_pos = free_set(b).insert(FreeEntry{b->stream, b->size, b->addr, b}).first;
  inactive_split_account(b, +1);
}

void Pool::fast_push(Block* b) {
  b->fast_cached = true;
  b->fast_index = static_cast<std::uint32_t>(fast_list_.size());
  fast_list_.push_back(b);
  Block* head = fast_heads_.find(b->size);
  b->fast_prev = nullptr;
  b->fast_next = head;
  if (head) head->fast_prev = b;
  fast_heads_.assign(b->size, b);
  inactive_split_account(b, +1);
}

void Pool::fast_remove(Block* b) {
  Block* last = fast_list_.back();
  fast_list_[b->fast_index] = last;
  last->fast_index = b->fast_index;
  fast_list_.pop_back();
  if (b->fast_next) b->fast_next->fast_prev = b->fast_prev;
  if (b->fast_prev) {
    b->fast_prev->fast_next = b->fast_next;
  } else if (b->fast_next) {
    fast_heads_.assign(b->size, b->fast_next);
  } else {
    fast_heads_.erase(b->size);
  }
  b->fast_cached = false;
  b->fast_prev = b->fast_next = nullptr;
  inactive_split_account(b, -1);
}

Block* Pool::fast_find(std::size_t rounded, StreamId stream, PoolKind kind,
                       SegmentClass cls) const {
  if (fast_list_.empty()) return nullptr;
  // Newest first (pushes go to the head). Only blocks of the request's pool: a size
  // decides its pool, but a large-pool block can be small after splits.
  for (Block* b = fast_heads_.find(rounded); b; b = b->fast_next) {
    if (b->segment->pool != kind || !fits_class(b, cls)) continue;
    if (b->stream == stream || b->stream == kAnyStream) return b;
  }
  return nullptr;
}

void Pool::flush_fast() {
  // No two cached blocks are adjacent-and-mergeable (each had no mergeable free neighbour
  // when it was cached, and a later free neighbour took it out), so plain inserts keep
  // the "free neighbours are merged" invariant.
  while (!fast_list_.empty()) {
    Block* b = fast_list_.back();
    fast_remove(b);
    insert_free(b);
  }
}

void Pool::erase_free(Block* b) {
  if (b->fast_cached) return fast_remove(b);
  free_set(b).erase(b->free_pos);
  inactive_split_account(b, -1);
}

// --- best fit --------------------------------------------------------------------------

bool Pool::acceptable(const Block* b, std::size_t rounded) const {
  // An expandable segment splits any block without waste, and its free end is where it
  // grows: carving a request out of a big free block there pins nothing.
  if (max_split_size_ == 0 || b->segment->expandable) return true;
  // Don't carve small requests out of big blocks: they would pin the big block forever.
  if (rounded < max_split_size_) return b->size < max_split_size_;
  // An oversize request takes a cached block only if little of it is wasted.
  return b->size < rounded + kMaxNonSplitRounding;
}

Block* Pool::find_exact(std::size_t rounded, StreamId stream, PoolKind kind,
                        SegmentClass cls) const {
  Block* exact = fast_find(rounded, stream, kind, cls);
  return exact && acceptable(exact, rounded) ? exact : nullptr;
}

Block* Pool::find_free_in(PoolKind kind, std::size_t rounded, StreamId stream,
                          SegmentClass cls) const {
  const FreeSet& set = free_[static_cast<int>(kind)];
  if (set.empty()) return nullptr;
  // The set is ordered by tag first, so its ends bound the tags present: skip a probe
  // that cannot match (in steady state only one of the two ever can).
  const StreamId lowest = set.begin()->stream, highest = std::prev(set.end())->stream;
  Block* best = nullptr;
  for (StreamId tag : {stream, kAnyStream}) {
    if (tag < lowest || tag > highest) continue;
    Block* fit = nullptr;
    Block* end = nullptr;  // an expandable segment's growable end, if it came first
    for (auto it = set.lower_bound(FreeEntry{tag, rounded, 0, nullptr});
         it != set.end() && it->stream == tag; ++it) {
      // A request skips holes of segments of another class (the walk stops at the
      // first fit).
      if (!fits_class(it->block, cls)) continue;
      if (growable_end(it->block)) {
        if (!end) end = it->block;
        continue;
      }
      if (acceptable(it->block, rounded)) fit = it->block;
      break;
    }
    if (!fit) fit = end;
    if (fit && (!best || rank(fit) < rank(best))) best = fit;
  }
  return best;
}

bool Pool::growable_end(const Block* b) {
  return b == b->segment->last && b->segment->room() > 0;
}

std::size_t Pool::rank(const Block* b) {
  // Note [Expandable segments]: a growable end counts as larger than any block.
  return growable_end(b) ? SIZE_MAX : b->size;
}

Block* Pool::find_free_outside(PoolKind kind, std::size_t rounded, StreamId stream,
                               std::uintptr_t lo, std::uintptr_t hi) const {
  const FreeSet& set = free_[static_cast<int>(kind)];
  Block* best = nullptr;
  for (StreamId tag : {stream, kAnyStream}) {
    for (auto it = set.lower_bound(FreeEntry{tag, rounded, 0, nullptr});
         it != set.end() && it->stream == tag; ++it) {
      if (best && it->size >= best->size) break;
      if (it->addr + it->size <= lo || it->addr >= hi) {
        best = it->block;
        break;
      }
    }
  }
  return best;
}

Block* Pool::find_borrow(std::size_t rounded, StreamId stream) {
  Block* best = find_free_in(PoolKind::kLarge, rounded, stream);
  if (!best || best->size - rounded < kMinBlockSize) return best;
  // Cut the piece off the block's end: the rest stays one free block below it.
  erase_free(best);
  Block* piece = split_off(best, best->size - rounded);
  insert_free(best);
  insert_free(piece);
  return piece;
}

bool Pool::splits(PoolKind kind, std::size_t size, std::size_t rounded, bool expandable) const {
  std::size_t remaining = size - rounded;
  // Persistent segments hold tensors that live for the whole run: pack them tightly. So
  // do expandable ones (as PyTorch's): a remainder at the end is where the segment grows
  // next, and one inside merges with whatever is freed beside it.
  if (kind != PoolKind::kLarge || expandable) return remaining >= kMinBlockSize;
  // In the large pool a remainder of 1 MiB or less could only ever serve small requests,
  // which the large pool never sees; keeping it attached avoids a useless sliver.
  return remaining > kSmallSize && (max_split_size_ == 0 || rounded < max_split_size_);
}

Block* Pool::split_off(Block* b, std::size_t keep) {
  Block* rest = new_block();
  rest->addr = b->addr + keep;
  rest->size = b->size - keep;
  rest->segment = b->segment;
  rest->prev = b;
  rest->next = b->next;
  rest->stream = b->stream;  // the remainder is exactly as safe to reuse as before
  if (b->next) b->next->prev = rest;
  else b->segment->last = rest;
  b->next = rest;
  b->size = keep;
  return rest;
}

Block* Pool::take(Block* b, std::size_t rounded, std::size_t requested, StreamId stream) {
  PYALLOC_ASSERT(1, b->state == BlockState::kFree, "only a free block is handed out");
  PYALLOC_ASSERT(1, b->size >= rounded && rounded >= requested,
                 "a block holds the rounded request, which holds the request");
  erase_free(b);
  if (splits(b->segment->pool, b->size, rounded, b->segment->expandable))
    insert_free(split_off(b, rounded));
  b->state = BlockState::kAllocated;
  b->requested = requested;
  b->stream = stream;
  b->evict_handle = 0;  // a new tensor: evictable only once the registry says so
  b->evict_cost = 0;
  b->evict_last = false;
  b->last_use = 0;
  allocated_.insert(b->addr, b);

  int p = stat_pool(b->segment);
  auto bytes = static_cast<std::int64_t>(b->size);
  update(stats_.allocation, p, 1);
  update(stats_.allocated_bytes, p, bytes);
  update(stats_.active, p, 1);
  update(stats_.active_bytes, p, bytes);
  update(stats_.requested_bytes, p, static_cast<std::int64_t>(requested));
  if (is_oversize(b->size)) stats_.oversize_allocations.increase(1);
  return b;
}

// --- segments --------------------------------------------------------------------------

Block* Pool::add_segment(std::uintptr_t addr, std::size_t size, PoolKind pool,
                         PhysicalHandle phys) {
  auto* seg = new Segment;
  seg->addr = addr;
  seg->size = size;
  seg->pool = pool;
  seg->physical = phys;
  Block* b = new_block();
  b->addr = addr;
  b->size = size;
  b->segment = seg;
  b->stream = kAnyStream;  // fresh memory: no stream has touched it
  seg->first = seg->last = b;
  segments_.emplace(addr, seg);
  if (is_oversize(size)) stats_.oversize_segments.increase(1);
  insert_free(b);
  int p = stat_pool(seg);
  update(stats_.segment, p, 1);
  update(stats_.reserved_bytes, p, static_cast<std::int64_t>(size));
  return b;
}

bool Pool::has_free_segment() const {
  for (const auto& kv : segments_) {
    bool all_free = true;
    for (const Block* b = kv.second->first; b && all_free; b = b->next) {
      all_free = b->state == BlockState::kFree && !is_graph_pool_tag(b->stream);
    }
    if (all_free) return true;
  }
  return false;
}

namespace {
bool wholly_free(const Segment* seg) {
  const Block* b = seg->first;
  return b->state == BlockState::kFree && b->next == nullptr && !is_graph_pool_tag(b->stream);
}
}  // namespace

void Pool::forget_free_segment(Segment* seg) {
  erase_free(seg->first);
  Segment*& grows = expandable_[static_cast<int>(seg->pool)];
  if (grows == seg) grows = nullptr;
  int p = stat_pool(seg);
  update(stats_.segment, p, -1);
  update(stats_.reserved_bytes, p, -static_cast<std::int64_t>(seg->size));
  if (is_oversize(seg->size)) stats_.oversize_segments.decrease(1);
}

std::vector<Segment*> Pool::take_releasable_segments() {
  flush_fast();
  std::vector<Segment*> out;
  for (auto it = segments_.begin(); it != segments_.end();) {
    Segment* seg = it->second;
    if (!wholly_free(seg)) {
      ++it;
      continue;
    }
    forget_free_segment(seg);
    out.push_back(seg);
    it = segments_.erase(it);
  }
  return out;
}

Segment* Pool::take_free_segment(std::size_t bytes) {
  flush_fast();
  auto best = segments_.end();
  for (auto it = segments_.begin(); it != segments_.end(); ++it) {
    const Segment* seg = it->second;
    if (seg->expandable || seg->size < bytes || !wholly_free(seg)) continue;
    if (best == segments_.end() || seg->size < best->second->size) best = it;
  }
  if (best == segments_.end()) return nullptr;
  Segment* seg = best->second;
  forget_free_segment(seg);
  segments_.erase(best);
  return seg;
}


// --- freeing and merging ---------------------------------------------------------------

void Pool::mark_awaiting(Block* b) {
  allocated_.erase(b->addr);
  if (is_oversize(b->size)) stats_.oversize_allocations.decrease(1);
  int p = stat_pool(b->segment);
  update(stats_.allocation, p, -1);
  update(stats_.allocated_bytes, p, -static_cast<std::int64_t>(b->size));
  update(stats_.requested_bytes, p, -static_cast<std::int64_t>(b->requested));
  b->state = BlockState::kAwaitingEvents;
}

void Pool::absorb_neighbours(Block* b) {
  for (Block* n : {b->prev, b->next}) {
    if (!n || n->state != BlockState::kFree || !tags_compatible(b->stream, n->stream)) continue;
    erase_free(n);
    if (b->stream == kAnyStream) b->stream = n->stream;
    if (n == b->prev) {
      b->addr = n->addr;
      b->prev = n->prev;
      if (n->prev) n->prev->next = b;
      else b->segment->first = b;
    } else {
      b->next = n->next;
      if (n->next) n->next->prev = b;
      else b->segment->last = b;
    }
    b->size += n->size;
    delete_block(n);
  }
}

void Pool::release(Block* b) {
  PYALLOC_ASSERT(1, b->state == BlockState::kAllocated || b->state == BlockState::kAwaitingEvents,
                 "only a block handed out, or awaiting its streams, is released");
  int p = stat_pool(b->segment);
  if (b->state == BlockState::kAllocated) {
    allocated_.erase(b->addr);
    if (is_oversize(b->size)) stats_.oversize_allocations.decrease(1);
    update(stats_.allocation, p, -1);
    update(stats_.allocated_bytes, p, -static_cast<std::int64_t>(b->size));
    update(stats_.requested_bytes, p, -static_cast<std::int64_t>(b->requested));
  }
  update(stats_.active, p, -1);
  update(stats_.active_bytes, p, -static_cast<std::int64_t>(b->size));
  b->state = BlockState::kFree;
  b->requested = 0;
  b->stream_uses.clear();
  const Block* prev = b->prev;
  const Block* next = b->next;
  absorb_neighbours(b);
  // Nothing merged and the segment is split: an exact-size request will likely want it
  // back soon. See Note [Exact-size cache]. Not an expandable segment's growable end:
  // best fit ranks it last (Note [Expandable segments]), and the cache would hand it out
  // first.
  if (b->prev == prev && b->next == next && b->is_split() && !growable_end(b)) {
    fast_push(b);
  } else {
    insert_free(b);
  }
}

void Pool::adopt_stream(StreamId stream) {
  flush_fast();
  std::vector<Block*> blocks;
  for (FreeSet& set : free_) {
    for (auto it = set.lower_bound(FreeEntry{stream, 0, 0, nullptr});
         it != set.end() && it->stream == stream; ++it) {
      blocks.push_back(it->block);
    }
  }
  for (Block* b : blocks) erase_free(b);
  for (Block* b : blocks) b->stream = kAnyStream;
  for (Block* b : blocks) insert_free(b);
  // Merge in a second pass, walking segments: absorbing deletes neighbours, which may be
  // elements of `blocks`.
  std::set<Segment*> touched;
  for (Block* b : blocks) touched.insert(b->segment);
  for (Segment* seg : touched) {
    for (Block* b = seg->first; b != nullptr; b = b->next) {
      if (b->state != BlockState::kFree) continue;
      erase_free(b);
      absorb_neighbours(b);
      insert_free(b);
    }
  }
}

// --- queries ---------------------------------------------------------------------------

Block* Pool::find_allocated(std::uintptr_t ptr) const {
  return allocated_.find(ptr);
}

std::string Pool::describe_unknown_pointer(std::uintptr_t ptr) const {
  auto it = segments_.upper_bound(ptr);
  if (it != segments_.begin()) {
    const Segment* seg = std::prev(it)->second;
    if (ptr < seg->addr + seg->size) {
      for (const Block* b = seg->first; b; b = b->next) {
        if (ptr == b->addr) {
          return "double free of " + format_address(ptr) + ": the block was already freed";
        }
        if (ptr > b->addr && ptr < b->addr + b->size) {
          if (b->state == BlockState::kFree) {
            return format_address(ptr) + " lies inside cached free memory: a double free (the block was "
                   "freed and merged with a free neighbour), or a pointer pyalloc never returned";
          }
          return format_address(ptr) + " points inside a block that starts at " + format_address(b->addr) +
                 ": free the pointer the allocator returned, not an offset into it";
        }
      }
    }
  }
  return format_address(ptr) + " was not allocated by pyalloc on this device (or was already freed and "
         "its memory returned to the device)";
}

std::vector<StreamId> Pool::tagged_streams() const {
  std::set<StreamId> streams;
  for (const FreeSet& set : free_) {
    // Jump from tag to tag: the set is ordered by tag first.
    for (auto it = set.begin(); it != set.end();) {
      StreamId tag = it->stream;
      if (tag == kAnyStream) break;  // the largest tag: nothing after it
      // A graph pool's memory is no stream's (Note [Graph pools] in block.h).
      if (!is_graph_pool_tag(tag)) streams.insert(tag);
      it = set.lower_bound(FreeEntry{tag + 1, 0, 0, nullptr});
    }
  }
  return {streams.begin(), streams.end()};
}

FragmentationFigures Pool::fragmentation() const {
  FragmentationFigures f;
  f.cached_free_bytes = static_cast<std::size_t>(stats_.reserved_bytes[kAllPools].current -
                                                 stats_.active_bytes[kAllPools].current);
  for (const FreeSet& set : free_) {
    // The largest block of each tag is the last one before the next tag starts.
    for (auto it = set.begin(); it != set.end();) {
      auto last = set.upper_bound(FreeEntry{it->stream, SIZE_MAX, UINTPTR_MAX, nullptr});
      std::size_t size = std::prev(last)->size;
      if (size > f.largest_free_block) f.largest_free_block = size;
      it = last;
    }
  }
  for (const Block* b : fast_list_) {
    if (b->size > f.largest_free_block) f.largest_free_block = b->size;
  }
  std::int64_t peak_reserved = stats_.reserved_bytes[kAllPools].peak;
  f.utilization = peak_reserved == 0 ? 1.0
                                     : static_cast<double>(stats_.allocated_bytes[kAllPools].peak) /
                                           static_cast<double>(peak_reserved);
  f.external_fragmentation =
      f.cached_free_bytes == 0
          ? 0.0
          : 1.0 - static_cast<double>(f.largest_free_block) / static_cast<double>(f.cached_free_bytes);
  return f;
}

bool Pool::has_free_with_tag(StreamId tag) const {
  // The free sets only: callers flush the exact-size cache first.
  for (const FreeSet& set : free_) {
    auto it = set.lower_bound(FreeEntry{tag, 0, 0, nullptr});
    if (it != set.end() && it->stream == tag) return true;
  }
  return false;
}

std::vector<std::uintptr_t> Pool::allocated_with_tag(StreamId tag) const {
  std::vector<std::uintptr_t> out;
  for (const auto& kv : segments_)
    for (const Block* b = kv.second->first; b; b = b->next)
      if (b->state == BlockState::kAllocated && b->stream == tag) out.push_back(b->addr);
  return out;
}

}  // namespace pyalloc
