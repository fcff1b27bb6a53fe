// block.h — segments, blocks, and the size classes that decide which pool serves what.
//
// A Segment is one reserved virtual range with physical memory mapped behind it. It is
// cut into Blocks, each either handed out (kAllocated), waiting for other streams to
// finish with it (kAwaitingEvents), or cached (kFree).
//
// Invariants (checked by Pool::check_invariants()):
//   * Blocks tile their segment: first->addr == segment->addr, b->next->addr ==
//     b->addr + b->size, and the sizes add up to segment->size. prev/next are mutual.
//   * Free neighbours are merged: two adjacent kFree blocks never have compatible
//     stream tags (see Note [Stream tags]).
//   * A block is kFree iff it is in exactly one of: its pool's free set, or the exact-size
//     cache; it is in the allocated map iff it is kAllocated.
//   * Byte identities (Stats): reserved == active + cached_free, active == allocated +
//     awaiting_events, and every current figure equals a walk over the blocks.
//
// Note [Stream tags]
// ~~~~~~~~~~~~~~~~~~
// A block remembers the stream it was allocated on. When it is freed, kernels already
// queued on that stream may still be using it, so it may be reused on that stream (whose
// later work runs after them) but not on another. A free block tagged kAnyStream is known
// to be idle and can serve any stream. Blocks get that tag when the engine fences their
// stream (Engine::fence_streams_locked) or when they were only ever used on a stream
// whose work is synchronous (the simulated device's stream 0). Two free neighbours merge
// when their tags are equal, or when one is kAnyStream (the merged block keeps the
// specific tag: restricting reuse is always safe).
//
// Streams that used a block through record_stream() are a separate matter: the block
// waits in kAwaitingEvents until events recorded on those streams complete.
#pragma once

#include <cstddef>
#include <cstdint>
#include <set>
#include <vector>

#include "backend.h"
#include "node_pool.h"

namespace pyalloc {

constexpr StreamId kAnyStream = ~StreamId{0};

// Note [Graph pools]
// ~~~~~~~~~~~~~~~~~~
// A CUDA graph replays into the addresses it was captured with, those of the intermediates
// it freed during capture too, so that memory must stay the graph's until the graph goes
// (PyTorch's private pools). Here a graph pool is a stream tag: while allocations are
// routed to pool P (Engine::route_to_graph_pool: a capture, cudagraph trees' warm-up, a
// thread under use_mem_pool), they take tag graph_pool_tag(P) instead of their stream's,
// and keep it when freed. No real stream has that tag, so no other request's best fit,
// window, stitch or compaction ever uses the memory, and fences and releases pass it by
// (Pool::tagged_streams and take_releasable_segments skip it). Requests of the pool reuse
// it, best fit as usual. Once the pool is released (its graphs are gone), the next
// device-wide synchronization (Engine::release_cached_locked) re-tags it idle, and it
// joins the cache. Requests routed to a pool and every request made while a capture is
// underway climb a short ladder (cached, grow, any_class, borrow): a capture forbids
// synchronization, and eviction would change addresses a graph has recorded.
constexpr StreamId kGraphPoolTagBit = StreamId{1} << 63;
inline StreamId graph_pool_tag(std::uint64_t pool) { return kGraphPoolTagBit | pool; }
inline bool is_graph_pool_tag(StreamId tag) {
  return tag != kAnyStream && (tag & kGraphPoolTagBit) != 0;
}

// Size classes (the same numbers PyTorch's caching allocator uses, so that figures are
// comparable; see docs/design.md "Pools and rounding"):
constexpr std::size_t kMinBlockSize = 512;                     // every size rounds up to this
constexpr std::size_t kSmallSize = std::size_t{1} << 20;       // <= 1 MiB: small pool
constexpr std::size_t kSmallSegment = std::size_t{2} << 20;    // small pool segment size
constexpr std::size_t kLargeSegment = std::size_t{20} << 20;   // segment for 1-10 MiB requests
constexpr std::size_t kMinLargeAlloc = std::size_t{10} << 20;  // >= this: segment fits request
constexpr std::size_t kRoundLarge = std::size_t{2} << 20;      // large segments round to this
constexpr std::size_t kStitchChunk = std::size_t{2} << 20;     // stitching maps 2 MiB chunks
// An oversize request (>= max_split_size) accepts a cached block at most this much larger.
constexpr std::size_t kMaxNonSplitRounding = std::size_t{20} << 20;

// kPersistent: the INPLACE_UPDATE region (parameters, gradients, optimizer state), kept
// in segments of its own so that long-lived tensors never sit between activations. A
// request's pool is pool_for(size), or kPersistent when its thread is in that region.
enum class PoolKind : std::uint8_t { kSmall = 0, kLarge = 1, kPersistent = 2 };
constexpr int kPoolKinds = 3;
// kLent: a chunk-aligned piece of free memory whose physical pages are mapped into a
// stitched range (See Note [Stitching] in pool.h); it holds that block's data.
enum class BlockState : std::uint8_t { kFree, kAllocated, kAwaitingEvents, kLent };

inline std::size_t round_up(std::size_t n, std::size_t multiple) {
  return (n + multiple - 1) / multiple * multiple;
}
inline std::size_t round_size(std::size_t size) {
  return size < kMinBlockSize ? kMinBlockSize : round_up(size, kMinBlockSize);
}
inline PoolKind pool_for(std::size_t rounded) {
  return rounded <= kSmallSize ? PoolKind::kSmall : PoolKind::kLarge;
}
// The segment a cache miss asks the device for: small requests share 2 MiB segments,
// mid-size ones share 20 MiB segments, large ones get a segment of their own size.
inline std::size_t preferred_segment_size(std::size_t rounded) {
  if (rounded <= kSmallSize) return kSmallSegment;
  if (rounded < kMinLargeAlloc) return kLargeSegment;
  return round_up(rounded, kRoundLarge);
}

struct Segment;
struct Block;

// A free block's entry in its pool's free set. Entries are ordered by (stream tag, size,
// address): lower_bound on (stream, size) finds the smallest block of that tag that fits
// (best fit), and ties go to the lowest address, which keeps live data packed toward the
// start of segments. The key is copied into the entry so that walking the tree never
// touches the Block itself: with the key behind a pointer, each tree level cost a cache
// miss, and the tree walks were most of a malloc/free pair (tools/bench_alloc.py).
struct FreeEntry {
  StreamId stream;
  std::size_t size;
  std::uintptr_t addr;
  Block* block;
  bool operator<(const FreeEntry& o) const {
    if (stream != o.stream) return stream < o.stream;
    if (size != o.size) return size < o.size;
    return addr < o.addr;
  }
};
using FreeSet = std::set<FreeEntry, std::less<FreeEntry>, PooledAllocator<FreeEntry>>;

struct Block {
  std::uintptr_t addr = 0;
  std::size_t size = 0;       // rounded; what the block occupies
  std::size_t requested = 0;  // what the caller asked for (allocated blocks only)
  Segment* segment = nullptr;
  Block* prev = nullptr;  // address-ordered neighbours inside the segment
  Block* next = nullptr;
  StreamId stream = 0;  // see Note [Stream tags]
  BlockState state = BlockState::kFree;
  int pending_events = 0;             // kAwaitingEvents: events not yet complete
  std::vector<StreamId> stream_uses;  // other streams that used it (record_stream)
  // Eviction (kAllocated only; reset when handed out): the registry's handle for the
  // storage living here (0: not evictable), what bringing it back would cost, and the
  // logical time of its last use. See evictor.h.
  std::uint64_t evict_handle = 0;
  double evict_cost = 0;
  bool evict_last = false;  // offered only as a last resort: Note [Last-resort victims]
  std::uint64_t last_use = 0;
  // kFree only: where the block is cached. Either in its pool's free set (free_pos, so
  // erasing needs no search) or, when it has no free neighbour to merge with, in the
  // exact-size cache at fast_index (See Note [Exact-size cache] in pool.h).
  FreeSet::iterator free_pos;
  bool fast_cached = false;
  std::uint32_t fast_index = 0;  // position in Pool::fast_list_
  Block* fast_prev = nullptr;    // the cache's list of free blocks of this size
  Block* fast_next = nullptr;

  // kLent only: the stitched block whose data this piece holds.
  Block* lent_to = nullptr;

  bool is_split() const { return prev != nullptr || next != nullptr; }
};

// A free block a request on `stream` may use: tagged with that stream or idle (Note
// [Stream tags]).
inline bool free_for(const Block* b, StreamId stream) {
  return b->state == BlockState::kFree && (b->stream == stream || b->stream == kAnyStream);
}

// Note [Last-resort victims]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The registry may offer a block as a victim of last resort: evicting it is possible but
// likely to cost more memory later than it frees now (a node whose replay must rebuild
// more dead lineage than 0.3 of the budget: Note [A restore needs its dead lineage's
// memory] in registry/src/evict.cpp). Such a block counts as evictable only while the
// evict_last_resort rung plans, after every other rung — stitching, releasing, evicting
// the rest, compacting, moving what cannot leave — has failed: to the earlier rungs it is
// a live block (one the compactor may move). A cost penalty was not enough: it kept such a
// block out of the windows a cheaper one could fill, but not out of the evict rung's plan
// when the compact rung after it would have served the request without evicting anything.
// Set, for the calling thread, while the evict_last_resort rung plans and while the
// out-of-memory report counts what was evictable.
inline thread_local bool t_last_resort_victims = false;

// An allocated block the registry has offered for eviction and not taken back.
inline bool evictable(const Block* b) {
  return b->state == BlockState::kAllocated && b->evict_handle != 0 &&
         (!b->evict_last || t_last_resort_victims);
}

// Makes last-resort victims evictable for the scope's duration (this thread).
class LastResortVictims {
 public:
  LastResortVictims() : was_(t_last_resort_victims) { t_last_resort_victims = true; }
  ~LastResortVictims() { t_last_resort_victims = was_; }
  LastResortVictims(const LastResortVictims&) = delete;
  LastResortVictims& operator=(const LastResortVictims&) = delete;

 private:
  bool was_;
};

struct Segment {
  std::uintptr_t addr = 0;
  std::size_t size = 0;
  PoolKind pool = PoolKind::kLarge;
  // Physical memory: one handle for the whole segment, or, for an expandable segment,
  // one handle per 2 MiB chunk in `chunks` (so it can grow and shrink at its end);
  // none for a stitched range, whose pages belong to other segments.
  PhysicalHandle physical;
  std::vector<PhysicalHandle> chunks;
  Block* first = nullptr;
  Block* last = nullptr;  // the block that ends at addr + size
  // An expandable segment (Note [Expandable segments] in pool.h) reserved `va_bytes` of
  // address space and maps its first `size` bytes; it grows by mapping chunks at its end.
  bool expandable = false;
  std::size_t va_bytes = 0;
  std::size_t chunk_bytes = 0;  // the size of each of `chunks` (the device's granularity)
  // What an expandable segment can still map at its end (0 for any other segment).
  std::size_t room() const { return expandable ? va_bytes - size : 0; }
  // A stitched range (Note [Stitching]): one allocated block, `first`, whose pages are the
  // lent pieces of other segments, in address order of the range.
  bool stitched = false;
  std::vector<Block*> pieces;
  // Small pool only: the segment was last filled from empty by a long-lived request (Note
  // [Lifetime classes] in pool.h); long-lived requests look for room only in such
  // segments and in empty ones.
  bool long_lived = false;
  // Small pool only, under a registry: last filled from empty by a storage the registry
  // can evict (Note [Evictable placement] in pool.h). Such segments take only evictable
  // requests (others as a last resort), so evicting their blocks frees them whole.
  bool evictable = false;
};

}  // namespace pyalloc
