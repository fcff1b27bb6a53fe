// pool.h — the segments and blocks of one device, with best fit, split and coalesce.
//
// The Pool knows nothing about devices, budgets or streams' progress: it is the data
// structure. The Engine (engine.h) decides when to add or drop segments and when a
// stream has been fenced; the Pool keeps the blocks and the Stats consistent.
//
// Thread safety: none. Every method must be called with the owning Engine's lock held.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "address_map.h"
#include "block.h"
#include "stats.h"

namespace pyalloc {

// The stats table's pool of a segment (kSmallPool or kLargePool, stats.h).
inline int stat_pool(const Segment* s) { return s->pool == PoolKind::kSmall ? kSmallPool : kLargePool; }


// Note [Exact-size cache]
// ~~~~~~~~~~~~~~~~~~~~~~~
// Training asks for the same sizes every step (the demo's trace: 12 distinct sizes in
// 9,303 operations), so most frees are followed by a request of exactly the same size.
// A freed block that has no mergeable free neighbour and is part of a split
// segment goes onto a stack per size instead of into the ordered free set; a request of
// exactly that size pops it without any tree work. Cached blocks are free in every other
// respect: they count in the stats, show in snapshots, and a neighbour's free merges
// them as usual (which takes them out of the cache). Any request that misses the cache
// flushes it into the free sets before the best-fit search, so best fit, fences, release
// and fragmentation figures see every free block; the flush does the inserts that caching
// skipped, so its cost is amortized. The choices differ from pure best fit only in which
// of several equally sized free blocks serves an exact-size request (the newest, not the
// lowest address).
// Note [Stitching]
// ~~~~~~~~~~~~~~~~
// When no free block holds a request and the budget has no room for a segment, the free
// memory may still be there, in pieces. Stitching maps whole free 2 MiB chunks from
// anywhere into one fresh virtual range (GMLake's virtual memory stitching). In the pool:
// each chunk-aligned run taken becomes a block of state kLent in its home segment (cut out
// of its free block, which keeps the rest), and the range is a Segment with `stitched`
// set, kept apart from segments_ (it reserves no memory of its own), holding one allocated
// block. The stats count the stitched block once: its allocation, active count and
// requested bytes under large_pool, and its bytes as allocated and active bytes of the
// pools its pieces live in, so reserved == active + cached free still holds. Freeing it
// returns the pieces to their segments as free memory tagged with the block's stream, and
// the engine unmaps the range once that stream's work up to the free is done (or, if other
// streams used it too, waits for them all first and returns the pieces idle).
// Note [Expandable segments]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// With option expandable, the large pool does not map a new segment per cache miss: it
// keeps one segment whose reservation covers the whole budget and maps 2 MiB chunks at
// its end as requests need them, each chunk its own physical handle (PyTorch's
// expandable_segments, with 2 MiB pages where PyTorch maps 20 MiB ones in its large
// pool). A request no free block holds grows the segment by what the free block at its
// end lacks, if that block may serve the request's stream (Note [Stream tags]), else by
// the whole request; so blocks freed side by side merge across what would have been the
// boundaries of separate segments, and reserved memory grows only by what is missing.
// Blocks split down to 512 B, as in the small pool: a remainder at the end is where the
// next growth starts; and max_split_size does not apply (Pool::acceptable), since a big
// free block at the end is where the segment grows, not a block to keep whole. Release
// (rung release, empty_cache) unmaps the whole free chunks at the end, or the whole segment
// when nothing in it is live; free chunks inside stay mapped for best fit and for
// stitching, which maps them by their per-chunk handles. A budget raised past the
// reservation starts another segment, the one that grows from then on.
// Best fit ranks the free block at the segment's end, while the reservation has room to
// grow, above every other block (Pool::rank), as PyTorch does: it serves a request only
// where no other free block holds it. A request that fit a hole inside would otherwise
// take the end, and the next big request would grow the segment past the hole; replaying
// the GPT-2 trace (tools/bench_frag.py, simulated device) peak reserved fell from 6798 to
// 6682 MiB with this rule.
// Mappings happen only when the pool grows or shrinks, never per allocation: training the
// models of pyalloc.models under a loose budget, the segment grows in the first step only.
// Note [Lifetime classes]
// ~~~~~~~~~~~~~~~~~~~~~~~
// Best fit sees sizes, not lifetimes. A training run makes its long-lived tensors (the
// model, then the optimizer's state in its first step) while short-lived ones fill the
// small pool's 2 MiB segments, so a long-lived block lands in a hole among gradients and
// activations and keeps that segment busy for the rest of the run. The engine is told
// which phase it is in (Engine::set_long_lived: install() marks the model's construction
// and every optimizer step long-lived, forward and backward not); a small request made in
// a long-lived phase is served only from segments a long-lived request filled from empty,
// or from an empty segment, which it then marks. Short-lived requests use any segment as
// before (best fit), so the holes of long-lived segments are not wasted. Classes are
// segments' marks, not blocks': a segment changes class only when it is empty. On the
// recorded traces (tools/bench_frag.py, the simulated device) the least budget that serves
// every request fell from 106 to 104 MiB on the MLP's, whose momentum buffers had sat in
// every segment the gradients left a hole in, and from 88 to 86 MiB on the transformer's;
// the price is up to one more 2 MiB segment under a loose budget (docs/design.md).
//
// Note [Evictable placement]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Under a registry, eviction frees only what it can evict, and a large request needs one
// contiguous range: whole free small segments (given back, or stitched) or a window of a
// large one. Best fit places by size alone, so in the small pool many small evictable
// storages (an RNN's per-timestep states, say) share each 2 MiB segment with small blocks
// that stay (gradients, what cannot be replayed), and no segment ever becomes wholly free:
// seen on a GRU language model at 0.4 of its peak (with min_evictable 16 KiB), 8.8 MiB
// evictable in 232 blocks and a 3 MiB request failed. The registry knows before an op
// runs whether its outputs will be evictable and says so for the op's duration, and for
// its replays (Engine::set_thread_evictable), when the option is on. Such a small request goes only to small segments that an
// evictable request filled from empty, or to an empty one, which it then marks; other
// short-lived requests avoid those segments. Evicting a marked segment's blocks frees it
// whole (the window strategy's whole-segment and chunk plans, evictor.h). Like lifetime
// classes, the classes place blocks and never refuse memory: a request with no room in
// its class takes any hole (rung any_class) before anything is evicted. Option
// evictable_placement, off by default: measured, it lowers some models' least budget and
// raises others' (docs/design.md). Classes of the large pool (Coop's cheap and expensive
// ends) were tried as cutting evictable blocks from the high end of the free block best
// fit chose: the CNN's and the transformer's least budgets did not move (0.30, 0.26-0.27).
//
// Note [What an evictable op makes that stays]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The registry's flag covers the whole op, but not all it allocates becomes a node: an
// output below min_evictable never does (a per-timestep [B] vector of an unrolled decoder,
// the small second output of an op whose first is a node). Placed as evictable, such blocks
// stayed in the evictable segments and kept every one of them from emptying: a
// pointer-generator summariser at 0.34 of its peak failed a 733 KiB request with 4.4 MiB
// evictable, two segments 85% evictable and the rest of each about sixty 512 B blocks that
// no policy evicts. So a flagged request below min_evictable is placed as short-lived.

// Which small segments a request may use (Notes [Lifetime classes], [Evictable
// placement]). kAny: every segment (no classes apply).
enum class SegmentClass : std::uint8_t { kAny, kShortLived, kLongLived, kEvictable };

class Pool {
 public:
  explicit Pool(std::size_t max_split_size);
  ~Pool();
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  // A block of exactly `rounded` bytes of pool `kind` from the exact-size cache, or nullptr.
  // `cls`: only where a request of that class may go (fits_class).
  Block* find_exact(std::size_t rounded, StreamId stream, PoolKind kind, SegmentClass cls) const;
  // The best block of pool `kind`'s free sets (not the exact-size cache: flush it first)
  // for a request of `rounded` bytes on `stream`: the smallest that fits among blocks
  // tagged `stream` and blocks tagged kAnyStream, honouring max_split_size, and only
  // where a request of class `cls` may go. nullptr if none.
  Block* find_free_in(PoolKind kind, std::size_t rounded, StreamId stream,
                      SegmentClass cls = SegmentClass::kAny) const;
  // Whether a request of class `cls` may be served from free block `b`: in the small pool,
  // a long-lived request only from a long-lived segment, an evictable one only from an
  // evictable segment, a short-lived one from any but an evictable segment; any request
  // from a whole empty segment (which then takes its class) and outside the small pool.
  static bool fits_class(const Block* b, SegmentClass cls) {
    const Segment* s = b->segment;
    if (cls == SegmentClass::kAny || s->pool != PoolKind::kSmall || !b->is_split()) return true;
    switch (cls) {
      case SegmentClass::kLongLived: return s->long_lived;
      case SegmentClass::kEvictable: return s->evictable;
      default: return !s->evictable;
    }
  }
  // The same search, skipping free blocks that overlap [lo, hi) (compaction's window:
  // what is moved out of it must not land in it). max_split_size is not honoured: a moved
  // block fits where it can.
  Block* find_free_outside(PoolKind kind, std::size_t rounded, StreamId stream,
                           std::uintptr_t lo, std::uintptr_t hi) const;
  // For a small request the small pool cannot serve (the borrow rung): a free block of the
  // large pool of exactly `rounded` bytes, cut from the *end* of the best-fitting free
  // block, or nullptr. Borrowed blocks are small and may live long. Cut from the start
  // (as take() does), each one sat against the block below its hole; measured on the UNet
  // under recompute and on replayed traces, cutting from the end leaves free runs that
  // merge into what large requests and stitching need (tools/bench_frag.py,
  // tools/bench_remat.py: see docs/design.md, the reclaim ladder: borrow).
  Block* find_borrow(std::size_t rounded, StreamId stream);
  // Whether taking `rounded` bytes of a free block of `size` bytes in pool `kind` leaves
  // the rest as a free block of its own (otherwise the taken block keeps it).
  // `expandable`: the block is in an expandable segment (Note [Expandable segments]).
  bool splits(PoolKind kind, std::size_t size, std::size_t rounded,
              bool expandable = false) const;
  // Hands out `block` (which find_free returned) for a request, splitting off the rest
  // when it is worth keeping (splits()).
  Block* take(Block* block, std::size_t rounded, std::size_t requested, StreamId stream);
  // Registers a newly mapped segment as one free block tagged kAnyStream.
  Block* add_segment(std::uintptr_t addr, std::size_t size, PoolKind pool, PhysicalHandle phys);
  // A handed-out block whose memory other streams may still use (record_stream): it leaves
  // the allocated figures but stays active until release().
  void mark_awaiting(Block* block);
  // Returns an allocated or awaiting block to the cache, merging it with free neighbours.
  void release(Block* block);
  // Re-tags every free block of `stream` as kAnyStream (its work is known to be done)
  // and merges what can now merge. See Note [Stream tags] in block.h.
  void adopt_stream(StreamId stream);
  // True if some segment holds no live block (it may still be several free pieces with
  // different stream tags).
  bool has_free_segment() const;
  // Moves every block of the exact-size cache into the free sets.
  void flush_fast();
  bool has_fast_cached() const { return !fast_list_.empty(); }
  // Removes every segment that is one free block, and returns them; the caller unmaps
  // and frees them on the device.
  std::vector<Segment*> take_releasable_segments();
  // The smallest wholly free segment (not a graph pool's, not expandable) of at least
  // `bytes`, taken out of the pool as take_releasable_segments() takes them; nullptr if
  // none (Note [Long-lived requests do not borrow] in reclaim.cpp).
  Segment* take_free_segment(std::size_t bytes);
  void destroy_segment(Segment* segment);

  Block* find_allocated(std::uintptr_t ptr) const;
  // For an error message: why `ptr` is not an allocated block ("double free", ...).
  std::string describe_unknown_pointer(std::uintptr_t ptr) const;
  // Streams (other than kAnyStream) that tag at least one free block.
  std::vector<StreamId> tagged_streams() const;
  // Whether a free block carries `tag` (after flush_fast()); the addresses of the live blocks that do (graph
  // pools, Note [Graph pools] in block.h).
  bool has_free_with_tag(StreamId tag) const;
  std::vector<std::uintptr_t> allocated_with_tag(StreamId tag) const;
  FragmentationFigures fragmentation() const;
  // "" when every invariant in block.h holds, else a description of the first violation.
  std::string check_invariants() const;
  // {"segments":[{...,"blocks":[...]}]} — addresses in order, blocks tiling each segment.
  std::string snapshot_json() const;

  // --- stitching (Note [Stitching]) ---
  struct StitchRun {
    Block* free_block;      // the free block the run is cut from
    std::uintptr_t start;   // chunk-aligned
    std::size_t bytes;      // a multiple of the chunk size
  };
  // Chunk-aligned runs of free memory usable on `stream` (small and large pools), largest
  // first, adding up to exactly `bytes`; empty if all of them together fall short. The
  // exact-size cache must be flushed first.
  std::vector<StitchRun> plan_stitch(std::size_t bytes, std::size_t chunk, StreamId stream) const;
  // What plan_stitch could gather at most: the whole chunks of free memory usable on `stream`.
  std::size_t stitchable_bytes(std::size_t chunk, StreamId stream) const;
  // Lends the runs to a new stitched range at `va` and hands out its one block.
  Block* add_stitched(std::uintptr_t va, std::size_t bytes, const std::vector<StitchRun>& runs,
                      std::size_t requested, StreamId stream);
  // Frees a stitched block: its pieces become free memory of their segments again, tagged
  // `tag` (kAnyStream: idle, usable on any stream).
  // The range is forgotten; the caller unmaps and unreserves [va, va + bytes).
  void dissolve_stitched(Block* block, std::uintptr_t* va, std::size_t* bytes, StreamId tag);
  const std::map<std::uintptr_t, Segment*>& stitched() const { return stitched_; }

  // --- expandable segments (Note [Expandable segments]) ---
  // Pool `kind`'s expandable segment, the one that grows; nullptr when none is mapped.
  Segment* expandable(PoolKind kind) const { return expandable_[static_cast<int>(kind)]; }
  // Registers `chunks` (one handle per `chunk` bytes), mapped in order from `addr`, the
  // start of a reservation of `va_bytes`, as pool `kind`'s expandable segment: one free
  // block tagged kAnyStream, as add_segment.
  Block* add_expandable(std::uintptr_t addr, std::size_t va_bytes, PoolKind kind,
                        std::vector<PhysicalHandle> chunks, std::size_t chunk);
  // Records `chunks`, just mapped at the end of `seg`, and returns the free block that now
  // ends it: the last block grown, if it is free and `stream` may use it, else a new one.
  Block* extend(Segment* seg, std::vector<PhysicalHandle> chunks, std::size_t chunk,
                StreamId stream);
  // Bytes of whole free chunks at the end of expandable segment `seg` that trim() can cut
  // (0 when its last block is live, or is its only block: then release takes it whole).
  std::size_t trimmable(const Segment* seg, std::size_t chunk) const;
  // Cuts trimmable() bytes from the end of `seg` and returns their physical chunks, which
  // the caller unmaps and releases.
  std::vector<PhysicalHandle> trim(Segment* seg, std::size_t bytes, std::size_t chunk);

  const std::map<std::uintptr_t, Segment*>& segments() const { return segments_; }
  Stats& stats() { return stats_; }
  const Stats& stats() const { return stats_; }
  void set_max_split_size(std::size_t bytes) { max_split_size_ = bytes; }

 private:
  FreeSet& free_set(const Block* b) { return free_[static_cast<int>(b->segment->pool)]; }
  bool is_oversize(std::size_t bytes) const { return max_split_size_ && bytes >= max_split_size_; }
  // Takes a wholly free segment's block out of the free sets and the segment out of the
  // stats (the caller erases it from segments_).
  void forget_free_segment(Segment* seg);
  bool acceptable(const Block* block, std::size_t rounded) const;
  // The free block at the end of an expandable segment that can still grow, and the size
  // best fit ranks a block by (Note [Expandable segments]).
  static bool growable_end(const Block* block);
  static std::size_t rank(const Block* block);
  void insert_free(Block* block);  // + inactive-split accounting
  void erase_free(Block* block);   // - inactive-split accounting
  void inactive_split_account(const Block* block, int sign);
  // Merges free, tag-compatible neighbours into `block` (which is not in a free set).
  void absorb_neighbours(Block* block);
  static bool tags_compatible(StreamId a, StreamId b) {
    return a == b || a == kAnyStream || b == kAnyStream;
  }

  // Cuts `block` (not in a free set) after its first `keep` bytes; returns the rest, a new
  // block of the same segment and stream tag, linked after it and in no free set.
  Block* split_off(Block* block, std::size_t keep);
  void fast_push(Block* block);
  void fast_remove(Block* block);
  Block* fast_find(std::size_t rounded, StreamId stream, PoolKind kind, SegmentClass cls) const;
  Block* new_block();
  void delete_block(Block* b);

  // Declared first: the containers below allocate from them until they are destroyed.
  NodeFreeList block_nodes_, set_nodes_;
  std::size_t max_split_size_;
  FreeSet free_[kPoolKinds];                      // indexed by PoolKind
  std::map<std::uintptr_t, Segment*> segments_;   // by address
  std::map<std::uintptr_t, Segment*> stitched_;   // stitched ranges, by address
  Segment* expandable_[kPoolKinds] = {};          // the segment of each pool that grows
  // plan_stitch, or with `all` every run there is (trimmed to `bytes` in total otherwise).
  std::vector<StitchRun> plan_stitch(std::size_t bytes, std::size_t chunk, StreamId stream,
                                     bool all) const;
  AddressMap allocated_;                          // kAllocated blocks by address
  // The exact-size cache: every cached block (so a flush costs what it holds), and the
  // head of each size's list (an open-addressing table: no allocation per push or pop).
  std::vector<Block*> fast_list_;
  AddressMap fast_heads_;
  Stats stats_;
};

}  // namespace pyalloc
