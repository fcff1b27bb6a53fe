// engine.h — one caching allocator per device: the lock, the budget, the reclaim ladder.
//
// The Engine owns a Backend (the device) and a Pool (the blocks). malloc() walks the
// reclaim ladder in reclaim.cpp — a chain of named steps, each counted — until a block
// is found or the request is reported as out of memory.
//
// Concurrency: one plain (non-recursive) mutex, `mutex_`, guards the pool, the pending
// frees, the event cache and the budget. Public methods take it; `*_locked` helpers
// assume it. Nothing calls out of the engine (into Python, observers or callbacks)
// while holding it. Backend calls are made under the lock: they never call back in.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "backend.h"
#include "compactor.h"
#include "evictor.h"
#include "options.h"
#include "pool.h"
#include "rungs.h"
#include "status.h"
#include "swap.h"
#include "trace.h"

namespace pyalloc {

// Requests above this are rejected outright: rounding them would overflow, and no device
// comes close to 2^62 bytes.
constexpr std::size_t kMaxRequest = std::size_t{1} << 62;

class Engine {
 public:
  Engine(std::unique_ptr<Backend> backend, const Options& options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Every operation that can fail returns a Status (status.h): ok, or a code and a
  // message naming the problem and the fix. Nothing throws.
  //
  // *out: a block of at least `size` bytes usable on `stream`; on failure nullptr and
  // kOutOfMemory with the full out-of-memory report. `stream` must not be kAnyStream (the
  // C API checks). size 0 gets a unique minimum-size block, so every successful call
  // returns a distinct pointer that must be freed.
  Status malloc(std::size_t size, StreamId stream, void** out);
  // `expected_size` is the size the caller believes it allocated (PyTorch passes it), or
  // SIZE_MAX to skip the check. A pointer that fails a check is left untouched: leaking
  // is safer than corrupting.
  Status free(void* ptr, std::size_t expected_size);
  // The block at `ptr` is also used on `stream`: on free, it is not reused until work
  // enqueued on `stream` so far has completed.
  Status record_stream(void* ptr, StreamId stream);
  // Releases every cached segment that holds no live block back to the device (nothing
  // while a capture is underway: it would synchronize).
  void empty_cache();

  // --- CUDA graph pools (Note [Graph pools] in block.h) ---
  // How a route picks the requests it sends to its pool: those on `stream`; those on
  // `stream` and on any stream being captured (a graph capture); those of the calling
  // thread (use_mem_pool).
  enum class RouteKind : int { kStream = 0, kCapture = 1, kThread = 2 };
  // From now on, the requests `kind` picks go to graph pool `pool` (>= 1).
  Status route_to_graph_pool(std::uint64_t pool, StreamId stream, RouteKind kind);
  // Stops every route to `pool`; its memory stays the pool's.
  void end_graph_pool_routes(std::uint64_t pool);
  // The pool's graphs are gone: its memory joins the cache at the next device-wide
  // synchronization (empty_cache, or the release rung), and its live blocks when freed.
  void release_graph_pool(std::uint64_t pool);
  // Addresses of the pool's live blocks.
  std::vector<std::uintptr_t> graph_pool_blocks(std::uint64_t pool);

  // Budget: a hard cap on reserved bytes. Lowering it below what is reserved releases
  // cached segments; live memory is never taken away.
  Status set_budget(std::size_t bytes);
  Status set_memory_fraction(double fraction);
  std::size_t budget() const;

  std::string stats_json();
  std::string snapshot_json();
  // The snapshot taken when the last out-of-memory failure was reported, with an "oom"
  // object (the request and the report); "" if none has happened. What the pool looked
  // like at the failure is gone by the time the exception reaches the caller: the failed
  // op's other temporaries are freed while it unwinds.
  std::string last_oom_json();
  // Called outside the engine lock, on the failing thread, after each out-of-memory
  // failure is reported and before malloc returns it, with a JSON object of the figures
  // (device, size, rounded, stream, budget, reserved, allocated, awaiting, cached_free,
  // largest_free_block, external_fragmentation, evictable, evictable_blocks, device_free,
  // device_total) and the report. The lock is free: it may call into the engine (stats,
  // snapshots, frees). nullptr: none.
  using OomCallback = void (*)(void* context, const char* info_json);
  // What a policy adds to an out-of-memory report about what it holds: at most `capacity`
  // bytes written to `out`, their count returned (0: nothing). Called with the engine's lock
  // dropped, on the failing thread, before the error goes back (Note [What the registry
  // adds to a report] in registry/src/inspect.cpp).
  using DescribeCallback = std::size_t (*)(void* context, char* out, std::size_t capacity);
  void set_oom_describe_callback(DescribeCallback describe, void* context);
  void set_oom_callback(OomCallback callback, void* context);
  std::string check_invariants();
  void reset_peak_stats();
  void reset_accumulated_stats();
  // budget - allocated bytes (what can be allocated without evicting, fragmentation aside).
  std::size_t unallocated_bytes();
  // Allocated bytes now and at their peak (the registry's floor probe reads them per op,
  // where the JSON of stats_json() would cost more than the op).
  void allocated_bytes(std::size_t* current, std::size_t* peak);
  // While false on a thread, its allocations skip the evict rung and fail quietly (not
  // counted as OOMs): prefetching must never push out what is needed sooner.
  static void set_thread_may_evict(bool may_evict);
  // While true on a thread, an allocation that cannot be served (after every rung, evicting
  // included) fails quietly: not counted in num_ooms, no report kept, no OOM callback. For
  // an allocation whose failure the caller handles and the program never sees (the
  // registry settling a backward pass's results). Returns the old value.
  static bool set_thread_tentative(bool tentative);
  // While true on a thread, its allocations come from the persistent region (segments of
  // pool kPersistent, apart from activations): INPLACE_UPDATE's parameters and state.
  static void set_thread_persistent(bool persistent);
  // While true on a thread, its allocations are storages the registry can evict: under a
  // registry (and option evictable_placement) small ones go to small segments of their
  // own (Note [Evictable placement] in pool.h). Returns the old value.
  static bool set_thread_evictable(bool evictable);
  // Whether the requests from now on are expected to live long (the model's construction,
  // optimizer steps) or not (forward, backward): small requests are placed by it (option
  // lifetime_classes; Note [Lifetime classes] in pool.h). Engine-wide, not per thread:
  // backward runs on autograd's threads. Traced as "lifetime" events, so replays see it.
  void set_long_lived(bool long_lived);
  // Nanoseconds callers have spent blocked waiting for other streams' work (fences before
  // reuse, synchronizations before releasing memory, host pool waits). Lock-free: the
  // hybrid policy reads it often, to tell compute time from time spent waiting on copies.
  std::uint64_t blocked_ns() const { return blocked_ns_.load(std::memory_order_relaxed); }
  // Blocks handed out or awaiting other streams' unfinished work.
  std::int64_t live_blocks();

  // --- eviction (evictor.h) ---
  // Called *outside* the engine lock with the handles of the storages to evict; returns
  // how many it evicted (their frees re-enter the engine). A victim it does not evict
  // stays allocated and is not offered again until the registry marks it evictable anew.
  // Called with count 0 once a request before victims are chosen (rung_evict_locked): the
  // registry lets go of what only dead lineage holds.
  using EvictCallback = std::size_t (*)(void* context, const std::uint64_t* handles,
                                        std::size_t count);
  void set_evict_callback(EvictCallback callback, void* context);
  // Marks the block at `ptr` evictable under `handle` (0: not evictable) with the cost of
  // bringing it back; `touch` records a use (the logical clock ticks, for a block not
  // below kClockQuietBytes). `last_resort`: only the evict_last_resort rung may choose it
  // (Note [Last-resort victims] in block.h).
  Status set_evictable(void* ptr, std::uint64_t handle, double cost, bool last_resort = false);
  Status touch(void* ptr);
  // The handles of blocks their owner freed while still marked evictable, oldest first:
  // how the registry learns, without scanning its nodes, that a storage it tracks died.
  // Noted only while an evict callback is set. Takes up to `capacity` into out;
  // *overflowed: some were dropped since the last call (the caller must scan instead).
  std::size_t take_freed_marked(std::uint64_t* out, std::size_t capacity, bool* overflowed);
  // Changes whenever such a free is noted; lock-free, so the registry can look every op.
  std::uint64_t freed_marked_count() const {
    return freed_marked_count_.load(std::memory_order_relaxed);
  }

  // --- compaction (compactor.h) ---
  // Note [Relocation]
  // ~~~~~~~~~~~~~~~~~
  // Moving a storage takes both sides: the engine knows where blocks are, the registry
  // knows which tensors own them. When eviction has nothing left (reclaim.cpp, the compact rung):
  //   1. `movable` (called outside the lock) writes the addresses of the blocks the
  //      registry could move now — resident storages no op is using — into out[0..capacity)
  //      and returns how many there are (called again with room for all if more).
  //   2. The engine plans (plan_compaction) and *reserves* a destination block for each
  //      mover: allocated, outside the window, held for the registry.
  //   3. `relocate` (outside the lock) gets the (from, to) pairs. For each storage it still
  //      can move, it sets the thread's placement to `to` and allocates a tensor of the
  //      storage's size — the engine hands out the reserved block (set_thread_placement)
  //      — copies the bytes on the current stream, swaps the two storages' data pointers
  //      and drops the new tensor, which frees the old block. Every view keeps its
  //      storage, and the contents are bit-for-bit the same. It returns how many it moved.
  //   4. Reserved blocks nobody took are freed, and the ladder is climbed again.
  using MovableCallback = std::size_t (*)(void* context, std::uintptr_t* out,
                                          std::size_t capacity);
  using RelocateCallback = std::size_t (*)(void* context, const std::uintptr_t* from,
                                           const std::uintptr_t* to, std::size_t count);
  void set_compact_callbacks(MovableCallback movable, RelocateCallback relocate, void* context);
  // Runs the compaction rung now, as if a request of `size` bytes on `stream` had found no
  // block (for tests and tools: the ladder runs it by itself). Returns how many storages
  // moved; 0 when a free block already holds the request, no plan exists, or option
  // compact or the callbacks are off.
  std::size_t compact(std::size_t size, StreamId stream);
  // The calling thread's next allocation is the block reserved at `addr` by a compaction
  // round (0: none). It must ask for exactly the moved storage's size.
  static void set_thread_placement(std::uintptr_t addr);

  // --- swap (swap.h; swap.cpp) ---
  // Allocates the host pool, once. Later calls leave the existing pool as it is.
  // `at_first_use`: only remember the size, and allocate at the first swap_out (Note [A
  // host pool made at first use] in swap.cpp).
  Status set_host_pool(std::size_t bytes, bool at_first_use = false);
  // Starts copying the first `bytes` of the block at `ptr` into a new host slot (*slot),
  // after the work enqueued on `compute` so far. The caller may free the block at once;
  // the engine reuses it only after the copy. On failure (kInvalid, kHostPoolFull,
  // kCopyFailed) nothing changed.
  Status swap_out(void* ptr, std::size_t bytes, StreamId compute, std::uint64_t* slot);
  // Starts copying `slot` into the block at `ptr` (at least slot's size), after the work
  // enqueued on `compute` so far. The slot stays valid: it is a clean copy until released.
  Status swap_in(std::uint64_t slot, void* ptr, StreamId compute);
  // Work enqueued on `compute` after this waits for slot's last swap-in (on the simulated
  // device's synchronous stream 0: this call blocks until it completed).
  Status swap_wait(std::uint64_t slot, StreamId compute);
  // Whether slot's copies have all completed (a prefetch that has arrived).
  bool swap_ready(std::uint64_t slot);
  // Gives the slot's host range back once its copies are done.
  Status swap_release(std::uint64_t slot);
  // The engine's copy streams (0 until the first swap); tests slow them down.
  StreamId swap_stream(bool to_host);

  // Tracing (trace.h): start a ring of `capacity` events (0 stops), and take what it holds.
  void set_trace_capacity(std::size_t capacity);
  std::string drain_trace_json();

  Backend& backend() { return *backend_; }
  const Options& options() const { return options_; }

 private:
  // --- the reclaim ladder (reclaim.cpp, Note [The ladder]) ---
  // One request's way up the ladder.
  struct Climb {
    std::size_t size;     // as asked
    std::size_t rounded;  // as the pool serves it
    StreamId stream;
    PoolKind kind;
    SegmentClass cls;  // Notes [Lifetime classes] and [Evictable placement] in pool.h
    std::unique_lock<std::mutex>* lock;  // dropped by the rungs that call out
    Status* status;                      // set by a rung that refuses
    int round = 0;          // times the request was sent back to the bottom
    bool fenced = false;    // this round's fence rung waited for something
    int compactions = 0;
    bool cleared = false;   // the evict_to_compact rung ran
    bool tidied = false;    // the evict rung asked the registry to let go of the unused
    bool own_segment = false;  // the borrow rung released for a long-lived request's segment
    int waited_us = 0;
    Block* block = nullptr;  // what the rung that served it found or handed out
  };
  // What a rung did with a request.
  enum class Climbed {
    kPassed,       // nothing for it here: the next rung
    kFound,        // c.block is free: the request takes it
    kServed,       // c.block is already the request's (a stitched range)
    kAgain,        // room was made: climb again from the bottom
    kOutOfMemory,  // stop: report out of memory
    kRefused,      // stop: *c.status says why
  };
  static Climbed found(Climb& c, Block* block) {
    c.block = block;
    return block ? Climbed::kFound : Climbed::kPassed;
  }
  static Climbed served(Climb& c, Block* block) {
    c.block = block;
    return block ? Climbed::kServed : Climbed::kPassed;
  }
  Climbed climb_locked(Rung rung, Climb& c);
#define PYALLOC_DECLARE_RUNG(name, doc) Climbed rung_##name##_locked(Climb& c);
  PYALLOC_RUNGS(PYALLOC_DECLARE_RUNG)
#undef PYALLOC_DECLARE_RUNG
  // Takes a found block (unless taken), traces the allocation and evicts proactively.
  void* hand_out_locked(Climb& c, bool taken);
  // The block a compaction round reserved for this thread (set_thread_placement).
  void* take_placement_locked(std::size_t size, StreamId stream, Status* status);
  // malloc's climb up the ladder: the block, or nullptr with *status saying why.
  void* climb(std::size_t size, StreamId stream, Status* status);
  // The class of a request of pool `kind` on this thread now (long-lived phase, the
  // thread's evictable scope).
  SegmentClass segment_class_locked(PoolKind kind, std::size_t size) const;
  Block* find_cached_locked(std::size_t rounded, StreamId stream, PoolKind kind,
                            SegmentClass cls = SegmentClass::kAny);
  // Whether some segment of `kind` is as large as `rounded` (stitch_cached under window).
  bool segment_holds_locked(std::size_t rounded, PoolKind kind) const;
  // Whether the ladder evicts in place (the window strategy under a registry).
  // Not while the thrash guard, if on, has windows off (Note [Thrash guard] in evictor.h).
  bool evicts_in_place() const {
    return evict_callback_ && options_.evict_strategy == EvictStrategy::kWindow &&
           !(options_.thrash_guard && thrash_.cooling(clock_));
  }

  // The fence rung: waits for other streams' tagged blocks; true if it waited for any.
  bool fence_streams_locked(StreamId stream);
  // evict_in_place: victims inside one segment that then holds the request; empty when
  // none would.
  std::vector<std::uint64_t> plan_in_place_locked(std::size_t rounded, StreamId stream,
                                                  PoolKind kind);
  // evict: victims by the evict strategy, their handles handed out (the caller calls
  // back unlocked).
  std::vector<std::uint64_t> plan_eviction_locked(std::size_t rounded, StreamId stream,
                                                  PoolKind kind);
  // Proactive eviction after a successful allocation (evict_threshold).
  std::vector<std::uint64_t> plan_proactive_locked();
  std::vector<std::uint64_t> take_victims_locked(const EvictPlan& plan, bool proactive);
  // A rung's plan taken (take_victims_locked) and watched by the thrash guard; empty for an
  // empty plan.
  std::vector<std::uint64_t> take_and_watch_locked(const EvictPlan& plan);
  // Window rounds' victims, for the thrash guard when it is on (Note [Thrash guard]).
  void watch_for_thrash_locked(const std::vector<std::uint64_t>& handles);
  // Hands `victims` to the registry with `lock` dropped, counted in evicting_ meanwhile.
  void evict_unlocked(std::unique_lock<std::mutex>& lock,
                      const std::vector<std::uint64_t>& victims);
  // The addresses the registry could move now (Note [Relocation], step 1), with `lock`
  // dropped around the callback.
  std::unordered_set<std::uintptr_t> movable_unlocked(std::unique_lock<std::mutex>& lock);
  // The compact rung (Note [Relocation]): true if some storage moved, so climbing again
  // may succeed. Drops and retakes `lock` around the callbacks.
  bool compact_locked(std::unique_lock<std::mutex>& lock, std::size_t rounded, StreamId stream,
                      PoolKind kind);

  // --- device memory (segments.cpp) ---
  // Bytes the budget still allows to be reserved (0 when reserved already exceeds it).
  std::size_t headroom_locked() const;
  // A new segment for a request of `rounded` bytes of pool `kind` within the budget (or
  // the expandable segment grown): its free block, or nullptr.
  Block* grow_locked(std::size_t rounded, PoolKind kind, StreamId stream);
  // Option expandable (Note [Expandable segments] in pool.h): maps what the request lacks
  // at the end of pool `kind`'s expandable segment (or starts one); the free block that
  // then holds the request, or nullptr.
  Block* expand_locked(std::size_t rounded, PoolKind kind, StreamId stream);
  // Maps `need` bytes at the end of expandable segment `seg` (nullptr: starts pool `kind`'s
  // expandable segment with them) if the budget has room; the free block that ends it.
  Block* extend_locked(Segment* seg, PoolKind kind, std::size_t need, StreamId stream);
  // Creates and maps `count` chunks from `va`, one physical handle each, into *chunks;
  // all or nothing.
  bool map_chunks_locked(std::uintptr_t va, std::size_t count,
                         std::vector<PhysicalHandle>* chunks);
  // Maps [offset, offset + bytes) of `seg`'s physical memory at `va` (stitching).
  bool map_piece_locked(std::uintptr_t va, const Segment* seg, std::size_t offset,
                        std::size_t bytes);
  // Unmaps and releases a segment the pool gave up (take_releasable_segments).
  void unmap_segment_locked(Segment* seg);
  // Gives back the free chunks at the end of each expandable segment; true if any.
  bool trim_expandable_locked();
  // Whether trim_expandable_locked() would give anything back. The tails' streams may
  // still be working: the caller synchronizes first.
  bool has_trimmable_locked() const {
    for (int k = 0; k < kPoolKinds; ++k) {
      const Segment* seg = pool_.expandable(static_cast<PoolKind>(k));
      if (seg && pool_.trimmable(seg, backend_->granularity())) return true;
    }
    return false;
  }
  // Reserves, creates and maps a segment of exactly `size` bytes (the budget is the
  // caller's to check); its one free block, or nullptr.
  Block* map_segment_locked(std::size_t size, PoolKind kind);
  // A block allocated from free chunks mapped into a fresh range (Note [Stitching] in
  // pool.h), or nullptr. Where the free chunks hold at least `map_rest_from` bytes (at
  // least 1) but not all of the request, maps a segment of what they lack if the budget
  // allows (kNeverMapRest: never).
  static constexpr std::size_t kNeverMapRest = ~std::size_t{0};
  Block* stitch_locked(std::size_t rounded, std::size_t size, StreamId stream,
                       std::size_t map_rest_from);
  // Whether a request of pool `kind` can be served by stitching (option stitch, a large
  // request, a device that maps 2 MiB chunks): the one test for every stitch rung and for
  // the evictor's chunk plans.
  bool stitches(PoolKind kind) const {
    return options_.stitch && kind == PoolKind::kLarge && backend_->granularity() == kStitchChunk;
  }
  // Frees a stitched block: waits for its streams, returns its pieces, unmaps the range.
  void free_stitched_locked(Block* block);
  // Gives every wholly free cached segment (and expandable tail) back to the device,
  // after a device-wide synchronization; false if there was nothing to give.
  bool release_cached_locked();
  // Gives back one wholly free cached segment, the smallest of at least `bytes`, with the
  // same synchronization; false if there was none (Note [Long-lived requests do not
  // borrow] in reclaim.cpp).
  bool release_one_locked(std::size_t bytes);
  // What both release first: a device-wide synchronization, retired and kept stitched
  // mappings unmapped, every cached block made idle (its stream adopted), released graph
  // pools' memory taken back; then a wholly free segment can be unmapped safely.
  void quiesce_for_release_locked();

  // --- out of memory (oom_report.cpp) ---
  // What the report and the OOM callback say, read once at the failure.
  struct OomFigures {
    std::size_t size = 0, rounded = 0;
    StreamId stream = 0;
    std::size_t reserved = 0, allocated = 0, awaiting = 0;
    FragmentationFigures frag;
    std::size_t evictable = 0, evictable_blocks = 0;
    // Under a policy: allocated blocks below min_evictable, which no policy evicts.
    std::size_t small = 0, small_blocks = 0;
    // Under a policy: segments whose every block is free or evictable but for some below
    // min_evictable (`kept_by_small_blocks` of them): evicting would free them whole if those
    // could leave too.
    std::size_t kept_by_small = 0, kept_by_small_segments = 0, kept_by_small_blocks = 0;
    MemInfo device;
  };
  OomFigures oom_figures_locked(std::size_t size, std::size_t rounded, StreamId stream) const;
  std::string oom_report_locked(const OomFigures& figures) const;
  std::string snapshot_json_locked() const;
  // Counts, traces and reports an OOM (*status, last_oom_json_, last_oom_info_json_);
  // returns nullptr for malloc to return.
  void* fail_oom_locked(std::size_t size, std::size_t rounded, StreamId stream,
                        Status* status);
  // fail_oom_locked, then the OOM callback with `lock` dropped; returns nullptr.
  void* out_of_memory(std::unique_lock<std::mutex>& lock, std::size_t size,
                      std::size_t rounded, StreamId stream, Status* status);

  // --- events for record_stream ---
  struct PendingFree {
    Block* block;
    std::vector<EventId> events;
  };
  void process_events_locked(bool wait);
  // Stitched ranges already dissolved in the pool whose streams may still be using them:
  // unmapped once `event` completes (segments.cpp, free_stitched_locked).
  struct RetiredRange {
    std::uintptr_t va;
    std::size_t bytes;
    EventId event;
  };
  // Unmaps the retired ranges whose events are complete (all of them with wait).
  void unmap_retired_locked(bool wait);
  // A freed stitched range kept mapped for the next stitch of the same pieces (Note
  // [Keeping stitched mappings] in segments.cpp): its pieces, in mapping order, and the
  // event its stream's work before the free completes by (0: none pending).
  struct KeptRange {
    std::uintptr_t va;
    std::size_t bytes;
    std::vector<std::pair<std::uintptr_t, std::size_t>> pieces;
    EventId event;
  };
  static constexpr std::size_t kMaxKeptRanges = 16;
  // The kept range mapping exactly `runs`, served as a new stitched block; else nullptr.
  Block* reuse_kept_locked(const std::vector<Pool::StitchRun>& runs, std::size_t bytes,
                           std::size_t size, StreamId stream);
  // Unmaps every kept range (wait: for their events first; else the caller synchronized).
  void unmap_kept_locked(bool wait);
  // A stitched block over `runs` at the mapped range `va` (a new mapping or a kept one).
  Block* add_stitched_locked(std::uintptr_t va, std::size_t bytes,
                             const std::vector<Pool::StitchRun>& runs, std::size_t size,
                             StreamId stream);
  // Unmaps and gives back a range of address space: a stitched range that went.
  void unmap_range_locked(std::uintptr_t va, std::size_t bytes);
  // Returns a block to the pool, tagged idle if its stream's work is already done.
  void release_locked(Block* block);
  EventId acquire_event_locked();

  void after_op_locked();  // the check_invariants option
  // A marked block is being freed by its owner: noted for take_freed_marked().
  void note_freed_marked_locked(Block* block);
  // Sets `block`'s last use to now: Note [What moves the clock] in evictor.h.
  void stamp_use_locked(Block* block);
  // --- swap (swap.cpp) ---
  Status ensure_swap_streams_locked();
  // Frees the host ranges of released slots whose copies are done (all of them with wait).
  void reap_slots_locked(bool wait);
  SwapSlot* find_slot_locked(std::uint64_t slot, const char* what, Status* status);
  // Work enqueued on `copy_stream` from now on starts after what `compute` has so far.
  bool order_after_locked(StreamId copy_stream, StreamId compute);
  // Records *event (acquired if 0) after the copy just enqueued on `copy_stream`; if it
  // cannot be recorded, waits for the copy instead and leaves *event 0 (complete).
  void mark_done_locked(EventId* event, StreamId copy_stream);
  std::string host_pool_report_locked() const;
  Status allocate_host_pool_locked(std::size_t bytes, bool grows);
  // Commits the pool up to `end` bytes; false (and *why) when it cannot grow that far.
  bool grow_host_pool_locked(std::size_t end, std::string* why);

  const std::unique_ptr<Backend> backend_;
  const Options options_;
  const std::size_t device_total_;

  mutable std::mutex mutex_;
  Pool pool_;                          // guarded by mutex_
  // Graph pools (Note [Graph pools] in block.h), guarded by mutex_: the routes in force,
  // how many of them are captures, and the pools released whose memory is not yet idle.
  struct GraphRoute {
    std::uint64_t pool;
    StreamId stream;
    RouteKind kind;
    std::thread::id thread;
  };
  std::vector<GraphRoute> routes_;
  int captures_ = 0;
  std::vector<std::uint64_t> released_pools_;
  // The tag a request on `stream` takes: its route's pool, or `stream` itself.
  StreamId route_locked(StreamId stream) const;
  void end_graph_pool_routes_locked(std::uint64_t pool);
  void adopt_released_pools_locked();
  std::size_t budget_;                 // guarded by mutex_
  std::vector<PendingFree> pending_;   // guarded by mutex_
  std::vector<EventId> spare_events_;  // guarded by mutex_
  std::vector<RetiredRange> retired_ranges_;  // guarded by mutex_
  std::vector<KeptRange> kept_ranges_;        // guarded by mutex_; oldest first
  TraceRing trace_;                    // guarded by mutex_
  bool long_lived_ = false;            // guarded by mutex_; set_long_lived
  std::string last_oom_json_;          // guarded by mutex_; last_oom_json()
  std::string last_oom_info_json_;     // guarded by mutex_; what the OOM callback gets
  OomCallback oom_callback_ = nullptr;  // guarded by mutex_
  void* oom_context_ = nullptr;         // guarded by mutex_
  DescribeCallback describe_callback_ = nullptr;  // guarded by mutex_
  void* describe_context_ = nullptr;              // guarded by mutex_
  EvictCallback evict_callback_ = nullptr;  // guarded by mutex_
  void* evict_context_ = nullptr;           // guarded by mutex_
  std::uint64_t clock_ = 0;  // guarded by mutex_; Note [What moves the clock] (evictor.h)
  ThrashGuard thrash_;                      // guarded by mutex_; what window rounds evict
  static constexpr std::size_t kMaxFreedMarked = 1 << 16;
  std::vector<std::uint64_t> freed_marked_;  // guarded by mutex_; take_freed_marked()
  bool freed_marked_overflow_ = false;       // guarded by mutex_
  std::atomic<std::uint64_t> freed_marked_count_{0};
  int evicting_ = 0;  // guarded by mutex_; threads inside an eviction callback now
  MovableCallback movable_callback_ = nullptr;    // guarded by mutex_
  RelocateCallback relocate_callback_ = nullptr;  // guarded by mutex_
  void* compact_context_ = nullptr;               // guarded by mutex_
  // Destinations reserved by compaction rounds, by address, until their thread takes them.
  std::unordered_map<std::uintptr_t, Block*> placements_;  // guarded by mutex_

  HostPool host_pool_;                                  // guarded by mutex_
  std::size_t host_pool_deferred_ = 0;  // bytes to allocate at the first swap_out; mutex_
  std::string host_pool_failure_;       // why that allocation failed, if it did; mutex_
  // A pool made at first use grows: its first host_pool_committed_ bytes are usable, in
  // pieces of host_pool_chunk_ (0: all of it was usable at once). mutex_
  std::size_t host_pool_chunk_ = 0;
  std::size_t host_pool_committed_ = 0;
  bool host_pool_growth_failed_ = false;  // a commit failed: it grows no more; mutex_
  std::unordered_map<std::uint64_t, SwapSlot> slots_;   // guarded by mutex_
  std::vector<SwapSlot> releasing_;  // guarded by mutex_; released, copies in flight
  std::uint64_t next_slot_ = 1;      // guarded by mutex_
  StreamId to_host_stream_ = 0;      // guarded by mutex_; created on the first swap
  StreamId to_device_stream_ = 0;    // guarded by mutex_
  std::atomic<std::uint64_t> blocked_ns_{0};  // blocked_ns()

  // Adds the lifetime of the guard to blocked_ns_.
  class BlockedTimer;
};

class Engine::BlockedTimer {
 public:
  explicit BlockedTimer(std::atomic<std::uint64_t>& total)
      : total_(total), start_(std::chrono::steady_clock::now()) {}
  ~BlockedTimer() {
    total_.fetch_add(static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                         std::chrono::steady_clock::now() - start_).count()),
                     std::memory_order_relaxed);
  }
  BlockedTimer(const BlockedTimer&) = delete;
  BlockedTimer& operator=(const BlockedTimer&) = delete;

 private:
  std::atomic<std::uint64_t>& total_;
  const std::chrono::steady_clock::time_point start_;
};

}  // namespace pyalloc
