// reclaim.cpp — the reclaim ladder: how the engine serves a request, rung by rung, from
// the first look in the cache to the out-of-memory report.
//
// Note [The ladder]
// ~~~~~~~~~~~~~~~~~
// malloc() climbs one flat chain of named rungs (rungs.h, in this order). A rung either
// passes the request up to the next, finds a free block for it, hands it a block of its
// own (a stitched range), or makes room — evicts, moves storages, or waits for another
// thread's evictions — and sends the request back to the bottom of the ladder: nothing
// decided before the room was made is trusted after it. Each rung that serves the request
// or sends it round again is counted in the stats as "rung.<name>"; a request that passes
// the last rung is out of memory (oom_report.cpp).
//
//   cached           best fit among this stream's free blocks and idle blocks (first the
//                    frees whose events completed, and the stitched ranges retired).
//   stitch_first     option stitch_first: free chunks already cached cover a large request
//                    (or all but a rest that the budget maps): stitch them, map no more.
//   grow             a new segment within the budget (option expandable: the large pool's
//                    one segment grows at its end instead).
//   fence            wait for other streams' outstanding work, then best fit again among
//                    their cached blocks (num_stream_fences; Note [Stream tags] in block.h).
//   any_class        a request whose segment class has no room takes a hole of any class:
//                    classes place blocks, they never refuse memory that is there (Notes
//                    [Lifetime classes] and [Evictable placement] in pool.h).
//   borrow           a small request, with the budget spent on large segments, takes a
//                    piece of a large-pool free block (num_small_borrows).
//   evict_in_place   window strategy only: evict the cheapest window of evictable and free
//                    blocks inside a segment that then holds the request (Note [Evicting
//                    in place]).
//   stitch_cached    under a registry: stitch free chunks of cached segments before the
//                    release rung unmaps them.
//   release          give every wholly free cached segment back to the device (a
//                    device-wide synchronization), then grow again (num_alloc_retries).
//   stitch_map_rest  stitch free chunks, mapping a segment of what they lack if the budget
//                    has room (num_stitches; Note [Stitching] in pool.h).
//   evict            choose victims by the evict strategy (evictor.h), have the registry
//                    evict them outside the lock (num_evict_rounds, num_evictions).
//   compact          nothing left to evict: move live storages the registry can move out
//                    of a window that then holds the request (num_compactions; compactor.h
//                    and Note [Relocation] in engine.h; option compact).
//   evict_to_compact evict a window's evictables and a hole for each block in it that can
//                    only move, for the compact rung (Note [Moving what cannot leave]).
//   evict_last_resort  evict among every victim, those the registry offered only as a
//                    last resort included (Note [Last-resort victims] in block.h).
//   wait             other threads' victims are on their way out: wait for their frees, a
//                    bounded time.
//   lend             a large request of at most a small segment's size takes a hole of a
//                    small-pool segment: Note [Lending the small pool's holes].
//   evict_to_lend    no such hole: evict the cheapest window inside a small-pool segment
//                    that then holds it, and climb again (Note [Evicting to lend]).
//
// Under the window strategy the ladder is kLadderInPlace: any_class, borrow and
// evict_in_place come before the rungs that map and unmap (Note [Evicting in place]),
// and any_class and borrow are tried again after the release rung, whose synchronization
// may have made more cached blocks idle. Under every other configuration it is kLadder.
// Rungs whose option or condition is off pass at once.
//
// Swapping is not a rung of its own: the registry decides, per victim, whether to swap it
// out or drop it (swap.cpp), and either way the victim's free comes back through the evict
// rung.
//
// Note [Calling out]
// ~~~~~~~~~~~~~~~~~~
// The eviction callback runs the registry, which frees storages — re-entering the engine —
// and may need the GIL. So victims are chosen under the lock and passed by handle, the lock
// is dropped for the call, and the ladder starts over afterwards: the pool may have
// changed in between (other threads, the frees themselves), and nothing decided before the
// call is trusted after it. Lock order: GIL, then registry, then engine.
//
// Note [Evicting in place]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// Under a registry the budget is full all the time, so every request that the cache cannot
// hold would reach the rungs that change the pool's mappings: stitching maps a new range,
// release synchronizes the device and unmaps whole free segments, and the grow rung maps
// them again. Done every step, that is device-wide synchronizations and segment maps on
// the steady-state path (on an H100, 3-4 syncs and 9-11 maps a ResNet-50 step under
// recompute). Evicting a window inside a segment that already exists costs a recompute
// later, and no mapping: so with the window strategy it comes first — after the rungs that
// use free memory without mapping (any_class, borrow), since free memory beats a
// recompute — and the mapping rungs run only when no segment can hold the request (the
// first steps, while the pool takes its shape, or a request larger than any segment). dtr
// and dte keep their order: their victims are chosen by score, not by place.
//
// Note [Lending the small pool's holes]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A request above 1 MiB is the large pool's, as in PyTorch, and never looked for in the
// small pool's 2 MiB segments, which keeps those for the many small tensors. Under a
// registry the budget is always spent, and the small segments' holes can be the only free
// memory large enough: a SuperGlue-style matcher (tools/user_programs/sinkhorn_matching)
// under recompute at 0.3 of its peak ran out of memory in backward asking for 1.12 MiB with
// 7.86 MiB cached free, the largest hole 1.41 MiB, in a small segment, and nothing left to
// evict in the large pool. So, last of all, after every rung that evicts, moves or waits,
// a large request that fits in a small segment takes the best-fitting hole of one (any
// segment class) instead of failing. Last, not sooner: a hole lent so is one the small
// requests after it cannot use, and the rungs before it keep the pools apart wherever they
// can. The rung only turns failures into allocations (rung.lend counts them); the block
// is the small pool's from then on, and its free returns it there.

// Note [Evicting to lend]
// ~~~~~~~~~~~~~~~~~~~~~~~
// The lend rung takes a hole that is already free. Where the small tensors are evictable
// but every small segment also holds a few that cannot leave (tensors below min_evictable,
// a factory's output, an optimizer's step counter), no hole is large enough, no small
// segment ever empties for the grow rung, and no 2 MiB chunk can be cleared for stitching:
// the evict rung's plans (a window in the request's pool, whole segments, clearable chunks)
// find nothing, however much is evictable. A Tacotron-style decoder (49 per-timestep
// attention and LSTM states of 25-200 KiB beside 512-byte ones,
// tools/user_programs/tacotron_attention) ran out of memory under all three policies at
// 0.5 of its peak asking for 1.56 MiB, with 33 MiB evictable in 719 blocks and runs of free
// and evictable bytes of 1.8-2.0 MiB inside small segments. So, after lend, a large request
// that fits in a small segment evicts the cheapest window of free and evictable blocks
// inside one small-pool segment (the window strategy's cost, whatever the strategy; victims
// of last resort only when no ordinary window holds it) and climbs again; lend then takes
// the hole. Last, as lend is: the small requests after it lose that window.

// Note [Long-lived requests do not borrow]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A small request borrows a piece of a large-pool free block when the small pool is full
// and the budget has no room for another small segment. For a short-lived request that
// costs nothing lasting. For a long-lived one (an optimizer's state, made in the first
// step's optimizer.step(): Note [Lifetime classes] in pool.h) it lasts the whole run: the
// piece can be neither evicted nor moved (the registry moves only its own storages), so
// the large segment it sits in is never again empty for a request as large as itself.
// Under a registry large segments are as small as the request that made them (2 MiB), so
// one 256 KiB momentum buffer takes a whole 2 MiB segment out of every later large
// request's reach. Seen on the zoo's MobileNet under recompute at 0.4 of its peak: at the
// first step SGD's momentum buffers of the last layers (256, 256, 64, 48, 36 KiB; the
// long-lived small segment was full with the parameters) were borrowed, by best fit, into
// two large segments beside activations while three others were wholly free; in the
// second step's backward a 2 MiB request (the first block's input gradient) found 3.7 MiB
// cached free, largest piece 1.7 MiB, 0.2 MiB evictable: those two segments, free but
// for the buffers. So a long-lived request, before it borrows, gives back one wholly free
// cached segment, the smallest that makes room for a small segment (with the release
// rung's device synchronization: its blocks may still be in use, and stitched ranges may
// map its pieces), and takes a small segment of its own in its place, which lifetime
// classes then keep for long-lived requests. Once a request, and only where a segment is
// wholly free (otherwise it borrows as before); in practice once a run, in the first
// optimizer step. One segment, not every free one as the release rung does: releasing all
// of them reshaped the pool for the steps after (the large requests grew new segments of
// other sizes), and the zoo's MobileNet under swap at 0.4, at its edge, ran out of memory
// in 3 of 9 runs (0 of 9 before; 0 of 9 with one segment). The zoo test's MobileNet under
// recompute then trains down to 0.385 of its peak (0.43 before: 0.40-0.42 ran out of
// memory in the second step); bench_remat's zoo least budgets do not move.

#include <chrono>
#include <iterator>
#include <thread>

#include "engine.h"
#include "format.h"

namespace pyalloc {
namespace {
thread_local bool t_may_evict = true;   // set_thread_may_evict
thread_local bool t_tentative = false;  // set_thread_tentative
thread_local bool t_persistent = false; // set_thread_persistent
thread_local bool t_evictable = false;  // set_thread_evictable
thread_local std::uintptr_t t_placement = 0;  // set_thread_placement

constexpr Rung kLadder[] = {
    Rung::cached,        Rung::stitch_first, Rung::grow,     Rung::fence,
    Rung::stitch_cached, Rung::release,      Rung::any_class, Rung::borrow,
    Rung::stitch_map_rest, Rung::evict,      Rung::compact,  Rung::evict_to_compact,
    Rung::evict_last_resort, Rung::wait,     Rung::lend,  Rung::evict_to_lend,
};
constexpr Rung kLadderInPlace[] = {
    Rung::cached,    Rung::stitch_first,   Rung::grow,          Rung::fence,
    Rung::any_class, Rung::borrow,         Rung::evict_in_place, Rung::stitch_cached,
    Rung::release,   Rung::any_class,      Rung::borrow,        Rung::stitch_map_rest,
    Rung::evict,     Rung::compact,        Rung::evict_to_compact, Rung::evict_last_resort,
    Rung::wait,      Rung::lend,           Rung::evict_to_lend,
};
// Requests routed to a graph pool, and every request while a capture is underway: no
// synchronization, no unmapping, no eviction (Note [Graph pools] in block.h).
constexpr Rung kLadderGraph[] = {Rung::cached, Rung::grow, Rung::any_class, Rung::borrow};

// Each eviction round takes its victims out of the evictable set, so rounds end when
// nothing is left; the cap only guards against a registry that keeps re-marking the same
// blocks.
constexpr int kMaxEvictRounds = 1 << 16;
// Each compaction round moves at least one storage or passes; the cap bounds a request
// whose every round opens a hole that another thread takes first.
constexpr int kMaxCompactions = 4;
// How long a request waits, in all, for other threads' evictions before it fails.
constexpr int kMaxWaitUs = 200'000;
constexpr int kWaitStepUs = 50;

}  // namespace

void Engine::set_thread_may_evict(bool may_evict) { t_may_evict = may_evict; }
bool Engine::set_thread_tentative(bool tentative) {
  const bool was = t_tentative;
  t_tentative = tentative;
  return was;
}
void Engine::set_thread_persistent(bool persistent) { t_persistent = persistent; }
bool Engine::set_thread_evictable(bool evictable) {
  const bool was = t_evictable;
  t_evictable = evictable;
  return was;
}
void Engine::set_thread_placement(std::uintptr_t addr) { t_placement = addr; }

SegmentClass Engine::segment_class_locked(PoolKind kind, std::size_t size) const {
  if (kind != PoolKind::kSmall) return SegmentClass::kAny;
  if (long_lived_ && options_.lifetime_classes) return SegmentClass::kLongLived;
  // Evictable classes exist only where something evicts.
  if (!evict_callback_ || !options_.evictable_placement) return SegmentClass::kAny;
  // See Note [What an evictable op makes that stays].
  return t_evictable && size >= options_.min_evictable ? SegmentClass::kEvictable
                                                       : SegmentClass::kShortLived;
}

Status Engine::malloc(std::size_t size, StreamId stream, void** out) {
  Status status;
  *out = climb(size, stream, &status);
  return status;
}

void* Engine::climb(std::size_t size, StreamId stream, Status* status) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!routes_.empty()) stream = route_locked(stream);
  // Above kMaxRequest rounding would overflow; such a request is reported as it is.
  const std::size_t rounded = size > kMaxRequest ? size : round_size(size);
  if (t_placement) return take_placement_locked(size, stream, status);
  // A tentative allocation's failure is the caller's to handle: no report, no count, no
  // callback (set_thread_tentative).
  auto fail = [&]() -> void* {
    if (!t_tentative) return out_of_memory(lock, size, rounded, stream, status);
    *status = Status(Status::kOutOfMemory,
                     "pyalloc: no room for " + format_bytes(size) +
                         " (a tentative allocation: its caller goes on without it)");
    return nullptr;
  };
  if (size > kMaxRequest || rounded > budget_) return fail();
  const PoolKind kind = t_persistent ? PoolKind::kPersistent : pool_for(rounded);
  Climb c{size, rounded, stream, kind, segment_class_locked(kind, size), &lock, status};
  for (;; ++c.round) {
    c.fenced = false;
    c.block = nullptr;
    Climbed outcome = Climbed::kPassed;
    const bool in_place = evicts_in_place();
    const bool graph = captures_ > 0 || is_graph_pool_tag(c.stream);
    const Rung* ladder = graph ? kLadderGraph : in_place ? kLadderInPlace : kLadder;
    const std::size_t rungs = graph      ? std::size(kLadderGraph)
                              : in_place ? std::size(kLadderInPlace)
                                         : std::size(kLadder);
    for (const Rung* rung = ladder; rung != ladder + rungs; ++rung) {
      outcome = climb_locked(*rung, c);
      if (outcome == Climbed::kPassed) continue;
      if (outcome != Climbed::kOutOfMemory && outcome != Climbed::kRefused)
        ++pool_.stats().rung[static_cast<int>(*rung)];
      break;
    }
    switch (outcome) {
      case Climbed::kAgain: continue;
      case Climbed::kFound: return hand_out_locked(c, /*taken=*/false);
      case Climbed::kServed: return hand_out_locked(c, /*taken=*/true);
      case Climbed::kRefused: return nullptr;
      case Climbed::kPassed:
      case Climbed::kOutOfMemory:
        return fail();
    }
  }
}

Engine::Climbed Engine::climb_locked(Rung rung, Climb& c) {
  switch (rung) {
#define PYALLOC_CLIMB(name, doc) \
  case Rung::name:               \
    return rung_##name##_locked(c);
    PYALLOC_RUNGS(PYALLOC_CLIMB)
#undef PYALLOC_CLIMB
    case Rung::kCount: break;
  }
  return Climbed::kPassed;
}

void* Engine::take_placement_locked(std::size_t size, StreamId stream, Status* status) {
  // A compaction round's destination (Note [Relocation] in engine.h): already taken from
  // the pool, held for this thread.
  const std::uintptr_t addr = t_placement;
  t_placement = 0;
  auto it = placements_.find(addr);
  if (it == placements_.end() || it->second->requested != size || it->second->stream != stream) {
    // Reported as out of memory, as every failed allocation is: the caller (the registry's
    // relocation, through PyTorch) handles that, and the message says what went wrong.
    *status = Status(
        Status::kOutOfMemory,
        "pyalloc: no compaction destination of " + std::to_string(size) +
        " bytes on this stream is reserved at " + format_address(addr) +
        " (set_thread_placement must name a block of the relocate callback, once, for an "
        "allocation of the moved storage's size)");
    return nullptr;
  }
  Block* block = it->second;
  placements_.erase(it);
  trace_.record(TraceAction::kAlloc, block->addr, block->size, size, stream);
  after_op_locked();
  return reinterpret_cast<void*>(block->addr);
}

void* Engine::hand_out_locked(Climb& c, bool taken) {
  Block* block = c.block;
  PYALLOC_ASSERT(1, block != nullptr, "a rung that serves a request names its block");
  PYALLOC_ASSERT(1, taken == (block->state == BlockState::kAllocated),
                 "a found block is free, a served one is already the request's");
  if (!taken) {
    // A block that is a whole small segment (empty or new) gives the segment the
    // request's class (Notes [Lifetime classes], [Evictable placement] in pool.h).
    if (c.kind == PoolKind::kSmall && block->segment->pool == PoolKind::kSmall &&
        !block->is_split()) {
      block->segment->long_lived = c.cls == SegmentClass::kLongLived;
      block->segment->evictable = c.cls == SegmentClass::kEvictable;
    }
    pool_.take(block, c.rounded, c.size, c.stream);
  }
  trace_.record(TraceAction::kAlloc, block->addr, block->size, c.size, c.stream);
  after_op_locked();
  // A thread that may not evict (a prefetch) must not make room for later either.
  std::vector<std::uint64_t> extra = t_may_evict && captures_ == 0
                                         ? plan_proactive_locked()
                                         : std::vector<std::uint64_t>{};
  if (!extra.empty()) {
    EvictCallback callback = evict_callback_;
    void* context = evict_context_;
    c.lock->unlock();  // See Note [Calling out].
    callback(context, extra.data(), extra.size());
  }
  return reinterpret_cast<void*>(block->addr);
}

// --- the rungs, in the ladder's order ---

Engine::Climbed Engine::rung_cached_locked(Climb& c) {
  // A capture forbids querying events (Note [Graph pools] in block.h): they wait.
  if (!pending_.empty() && captures_ == 0) process_events_locked(/*wait=*/false);
  if (!retired_ranges_.empty() && captures_ == 0) unmap_retired_locked(/*wait=*/false);
  return found(c, find_cached_locked(c.rounded, c.stream, c.kind, c.cls));
}

Engine::Climbed Engine::rung_stitch_first_locked(Climb& c) {
  // Free chunks already cached cover the request, so mapping more memory would only grow
  // the pool around its own holes. Where they cover part of it, and that part is at least
  // a large segment's worth, the pool grows by the rest only, as an expandable segment
  // grows by what is missing: on GPT-2's trace (the simulated device), the logits' 393 MiB
  // found 150 MiB of whole free chunks in a segment that activations had split, and peak
  // reserved fell from 6808 to 6606 MiB (utilization 0.968 -> 0.998). Below that the
  // saving is too small for a stitch that recurs every step: on the MLP's and the
  // transformer's traces mapping any shortfall stitched 37 and 29 times in 3 steps,
  // against 0 and 3, and saved nothing at their peaks.
  if (!stitches(c.kind) || !options_.stitch_first) return Climbed::kPassed;
  return served(c, stitch_locked(c.rounded, c.size, c.stream, kLargeSegment));
}

Engine::Climbed Engine::rung_grow_locked(Climb& c) {
  return found(c, grow_locked(c.rounded, c.kind, c.stream));
}

Engine::Climbed Engine::rung_fence_locked(Climb& c) {
  c.fenced = fence_streams_locked(c.stream);
  if (!c.fenced) return Climbed::kPassed;
  return found(c, find_cached_locked(c.rounded, c.stream, c.kind, c.cls));
}

Engine::Climbed Engine::rung_any_class_locked(Climb& c) {
  if (c.cls == SegmentClass::kAny) return Climbed::kPassed;
  return found(c, find_cached_locked(c.rounded, c.stream, c.kind, SegmentClass::kAny));
}

Engine::Climbed Engine::rung_borrow_locked(Climb& c) {
  // Seen in training under eviction: an 8 MiB free large block, a 1 MiB request, no room
  // for a 2 MiB small segment. Small requests never look in the large pool otherwise.
  if (c.kind != PoolKind::kSmall) return Climbed::kPassed;
  // A long-lived request first gets a small segment of its own where wholly free cached
  // segments can make room for one: Note [Long-lived requests do not borrow]. Once a
  // request; not while a capture forbids unmapping, nor for a graph pool's request.
  if (c.cls == SegmentClass::kLongLived && !c.own_segment && captures_ == 0 &&
      !is_graph_pool_tag(c.stream) && pool_.has_free_segment()) {
    c.own_segment = true;
    const std::size_t segment = round_up(kSmallSegment, backend_->granularity());
    const std::size_t headroom = headroom_locked();
    if (release_one_locked(headroom >= segment ? 0 : segment - headroom))
      if (Block* own = grow_locked(c.rounded, c.kind, c.stream)) return found(c, own);
  }
  Block* block = pool_.find_borrow(c.rounded, c.stream);
  if (block) ++pool_.stats().num_small_borrows;
  return found(c, block);
}

Engine::Climbed Engine::rung_evict_in_place_locked(Climb& c) {
  // A thread that may not evict (a prefetch) passes.
  if (!t_may_evict || c.round >= kMaxEvictRounds) return Climbed::kPassed;
  std::vector<std::uint64_t> victims = plan_in_place_locked(c.rounded, c.stream, c.kind);
  if (victims.empty()) return Climbed::kPassed;
  evict_unlocked(*c.lock, victims);
  return Climbed::kAgain;
}

Engine::Climbed Engine::rung_stitch_cached_locked(Climb& c) {
  // Before releasing what is cached: the release rung waits for the whole device and
  // unmaps free segments, which eviction rounds then make the engine map again (on CUDA, a
  // cuMemCreate per chunk): on an H100, ResNet-50 under recompute at half its peak went
  // from 339 to 238 ms a step with this rung. It needs stitched blocks to be eviction
  // candidates (evictor.cpp).
  // Under the window strategy only for a request no segment of its pool could hold: for
  // the others evict_in_place has just looked for room inside one segment, and a stitched
  // range takes whole chunks out of the segments it plans in, so the next requests find
  // no window either and stitch again. The zoo's UNet at 0.4 of its peak made 805
  // stitches and 2895 evictions a step (28-42x its unconstrained step); with the rung
  // kept for those alone, 0 and 41 (1.2-1.5x), and its least budget fell from 0.53 to
  // 0.35 of the peak (docs/results/notebook.md, "Stitching before release"). Dropped for
  // every request, the GRU's 4 MiB request at its loss, bigger than any of its 2 MiB small
  // segments, found nothing to stitch into under swap at 0.4.
  // Without a registry the release rung is the better first answer: stitching there
  // keeps pieces of many segments busy, so none is wholly free to give the small pool
  // (replaying the transformer's trace at 1.02x its peak, 4 requests failed that release
  // first serves). stitch_first already tried the same chunks unless the fence freed more.
  if (!stitches(c.kind) || !evict_callback_) return Climbed::kPassed;
  if (evicts_in_place() && segment_holds_locked(c.rounded, c.kind)) return Climbed::kPassed;
  if (options_.stitch_first && !c.fenced) return Climbed::kPassed;
  return served(c, stitch_locked(c.rounded, c.size, c.stream, kNeverMapRest));
}

Engine::Climbed Engine::rung_release_locked(Climb& c) {
  ++pool_.stats().num_alloc_retries;
  if (!release_cached_locked()) return Climbed::kPassed;
  return found(c, grow_locked(c.rounded, c.kind, c.stream));
}

Engine::Climbed Engine::rung_stitch_map_rest_locked(Climb& c) {
  // The free memory may be there, in pieces of several segments.
  if (!stitches(c.kind)) return Climbed::kPassed;
  return served(c, stitch_locked(c.rounded, c.size, c.stream, /*map_rest_from=*/1));
}

Engine::Climbed Engine::rung_evict_locked(Climb& c) {
  if (!t_may_evict) {
    *c.status = Status(Status::kOutOfMemory, "pyalloc: no room for " + format_bytes(c.size) +
                                                 " without evicting (this thread may not "
                                                 "evict: a prefetch)");
    return Climbed::kRefused;
  }
  if (c.round >= kMaxEvictRounds) return Climbed::kOutOfMemory;
  // Before anything that lives is chosen: the registry may hold memory nothing uses any
  // more, tensors that only the lineage of dead nodes still reads, which it lets go in
  // batches (its death drain and sweep). An empty call asks it to let them go now, once a
  // request; the request climbs again if that freed something. A spiking net with a
  // non-grad input to each of 25 timesteps failed a 16 MiB request at 0.7 of its peak with
  // 4.8 MiB held so and no victim; a DEQ's no_grad solver loop held 12 MiB of dead
  // iterates while live activations were evicted for room.
  if (!c.tidied && evict_callback_) {
    c.tidied = true;
    const std::int64_t before = pool_.stats().allocated_bytes[kAllPools].current;
    evict_unlocked(*c.lock, {});
    if (pool_.stats().allocated_bytes[kAllPools].current < before) return Climbed::kAgain;
  }
  // Climb again even if the registry evicts none of them: their owners may have freed
  // them meanwhile. Termination does not depend on it either: each round's victims left
  // the evictable set, so the rounds end when it is empty.
  std::vector<std::uint64_t> victims = plan_eviction_locked(c.rounded, c.stream, c.kind);
  if (victims.empty()) return Climbed::kPassed;
  evict_unlocked(*c.lock, victims);
  return Climbed::kAgain;
}

Engine::Climbed Engine::rung_compact_locked(Climb& c) {
  // Once per round at most; each round that moves something climbs again. Not while other
  // threads evict: their frees may open the hole without moving anything.
  if (c.compactions >= kMaxCompactions || evicting_ != 0) return Climbed::kPassed;
  ++c.compactions;
  return compact_locked(*c.lock, c.rounded, c.stream, c.kind) ? Climbed::kAgain
                                                               : Climbed::kPassed;
}

Engine::Climbed Engine::rung_evict_to_compact_locked(Climb& c) {
  // See Note [Moving what cannot leave] in compactor.h. Once per request: the compact rung
  // it prepares runs in the climb it sends round again.
  if (c.cleared || !t_may_evict || evicting_ != 0 || !evict_callback_ || !options_.compact ||
      !movable_callback_ || !relocate_callback_ || c.compactions >= kMaxCompactions)
    return Climbed::kPassed;
  c.cleared = true;
  const std::unordered_set<std::uintptr_t> movable = movable_unlocked(*c.lock);
  if (movable.empty()) return Climbed::kPassed;
  if (!pending_.empty()) process_events_locked(/*wait=*/false);
  pool_.flush_fast();
  const EvictPlan plan = plan_clearing(pool_, c.rounded, c.kind, c.stream, movable, clock_);
  if (plan.victims.empty()) return Climbed::kPassed;
  evict_unlocked(*c.lock, take_victims_locked(plan, /*proactive=*/false));
  return Climbed::kAgain;
}

Engine::Climbed Engine::rung_evict_last_resort_locked(Climb& c) {
  // See Note [Last-resort victims] in block.h. Every other rung has failed this round.
  if (!t_may_evict || c.round >= kMaxEvictRounds) return Climbed::kPassed;
  std::vector<std::uint64_t> victims;
  {
    LastResortVictims all;
    victims = plan_eviction_locked(c.rounded, c.stream, c.kind);
  }
  if (victims.empty()) return Climbed::kPassed;
  evict_unlocked(*c.lock, victims);
  return Climbed::kAgain;
}

Engine::Climbed Engine::rung_wait_locked(Climb& c) {
  // Bounded, because the waiting thread may hold the GIL those evictions need (Note
  // [Calling out]); past the bound the request fails as it would have.
  if (evicting_ == 0 || c.waited_us >= kMaxWaitUs) return Climbed::kPassed;
  c.lock->unlock();
  std::this_thread::sleep_for(std::chrono::microseconds(kWaitStepUs));
  c.lock->lock();
  c.waited_us += kWaitStepUs;
  return Climbed::kAgain;
}

Engine::Climbed Engine::rung_lend_locked(Climb& c) {
  // Note [Lending the small pool's holes]. Only a large request no bigger than a small
  // segment: a persistent one keeps to its own segments, a small one has the borrow rung.
  if (c.kind != PoolKind::kLarge || c.rounded > kSmallSegment) return Climbed::kPassed;
  return found(c, find_cached_locked(c.rounded, c.stream, PoolKind::kSmall, SegmentClass::kAny));
}

Engine::Climbed Engine::rung_evict_to_lend_locked(Climb& c) {
  // Note [Evicting to lend]: what the lend rung would take, once a window is evicted.
  if (c.kind != PoolKind::kLarge || c.rounded > kSmallSegment) return Climbed::kPassed;
  if (!t_may_evict || !evict_callback_ || c.round >= kMaxEvictRounds) return Climbed::kPassed;
  EvictPlan plan = plan_lend(pool_, c.rounded, c.stream, clock_);
  if (plan.victims.empty()) {
    LastResortVictims all;
    plan = plan_lend(pool_, c.rounded, c.stream, clock_);
  }
  std::vector<std::uint64_t> victims = take_and_watch_locked(plan);
  if (victims.empty()) return Climbed::kPassed;
  evict_unlocked(*c.lock, victims);
  return Climbed::kAgain;
}

// --- what the rungs use ---

bool Engine::segment_holds_locked(std::size_t rounded, PoolKind kind) const {
  for (const auto& [addr, segment] : pool_.segments())
    if (segment->pool == kind && segment->size >= rounded) return true;
  return false;
}

Block* Engine::find_cached_locked(std::size_t rounded, StreamId stream, PoolKind kind,
                                  SegmentClass cls) {
  // An exact-size hit needs no search. On a miss, every cached block joins the free sets
  // first, so best fit (and every later rung) sees all free memory: See Note
  // [Exact-size cache] in pool.h.
  if (Block* exact = pool_.find_exact(rounded, stream, kind, cls)) return exact;
  pool_.flush_fast();
  return pool_.find_free_in(kind, rounded, stream, cls);
}

bool Engine::fence_streams_locked(StreamId stream) {
  BlockedTimer timer(blocked_ns_);
  bool progress = false;
  if (!pending_.empty()) {
    process_events_locked(/*wait=*/true);
    progress = true;
  }
  for (StreamId other : pool_.tagged_streams()) {
    if (other == stream) continue;
    // Blocking under the lock is acceptable here: this rung runs only when the cache
    // and the budget are both exhausted, and the alternative is failing the request.
    backend_->synchronize_stream(other);
    pool_.adopt_stream(other);
    ++pool_.stats().num_stream_fences;
    progress = true;
  }
  return progress;
}

std::vector<std::uint64_t> Engine::take_victims_locked(const EvictPlan& plan, bool proactive) {
  std::vector<std::uint64_t> handles;
  handles.reserve(plan.victims.size());
  for (Block* b : plan.victims) {
    handles.push_back(b->evict_handle);
    trace_.record(TraceAction::kEvict, b->addr, b->size, b->requested, b->stream);
    // Not chosen again (by another thread) while the registry works on it.
    b->evict_handle = 0;
  }
  Stats& s = pool_.stats();
  ++s.num_evict_rounds;
  s.num_evictions += static_cast<std::int64_t>(handles.size());
  s.num_evicted_bytes += static_cast<std::int64_t>(plan.bytes);
  if (proactive) s.num_proactive_evictions += static_cast<std::int64_t>(handles.size());
  return handles;
}

std::vector<std::uint64_t> Engine::plan_eviction_locked(std::size_t rounded, StreamId stream,
                                                        PoolKind kind) {
  if (!evict_callback_) return {};
  return take_and_watch_locked(plan_eviction(pool_, options_.evict_strategy, rounded, kind,
                                             stream, clock_, headroom_locked(),
                                             backend_->granularity(), stitches(kind)));
}

std::vector<std::uint64_t> Engine::plan_in_place_locked(std::size_t rounded, StreamId stream,
                                                         PoolKind kind) {
  return take_and_watch_locked(plan_in_place(pool_, rounded, kind, stream, clock_));
}

std::vector<std::uint64_t> Engine::take_and_watch_locked(const EvictPlan& plan) {
  if (plan.victims.empty()) return {};
  std::vector<std::uint64_t> handles = take_victims_locked(plan, /*proactive=*/false);
  watch_for_thrash_locked(handles);
  return handles;
}

void Engine::watch_for_thrash_locked(const std::vector<std::uint64_t>& handles) {
  if (!options_.thrash_guard || options_.evict_strategy != EvictStrategy::kWindow) return;
  for (std::uint64_t h : handles) thrash_.evicted(h, clock_);
}

std::vector<std::uint64_t> Engine::plan_proactive_locked() {
  if (!evict_callback_ || options_.evict_threshold <= 0) return {};
  const auto allocated =
      static_cast<double>(pool_.stats().allocated_bytes[kAllPools].current);
  const double limit = options_.evict_threshold * static_cast<double>(budget_);
  if (allocated <= limit) return {};
  EvictPlan plan = plan_reduction(pool_, static_cast<std::size_t>(allocated - limit), clock_);
  if (plan.victims.empty()) return {};
  return take_victims_locked(plan, /*proactive=*/true);
}

std::unordered_set<std::uintptr_t> Engine::movable_unlocked(std::unique_lock<std::mutex>& lock) {
  MovableCallback movable_fn = movable_callback_;
  void* context = compact_context_;
  // See Note [Calling out]: the lock is dropped, and nothing learnt before is trusted after.
  std::vector<std::uintptr_t> addrs(256);
  lock.unlock();
  std::size_t n = movable_fn(context, addrs.data(), addrs.size());
  if (n > addrs.size()) {
    addrs.resize(n);
    n = std::min(n, movable_fn(context, addrs.data(), addrs.size()));
  }
  lock.lock();
  return std::unordered_set<std::uintptr_t>(addrs.begin(), addrs.begin() + n);
}

bool Engine::compact_locked(std::unique_lock<std::mutex>& lock, std::size_t rounded,
                            StreamId stream, PoolKind kind) {
  if (!options_.compact || !movable_callback_ || !relocate_callback_) return false;
  RelocateCallback relocate_fn = relocate_callback_;
  void* context = compact_context_;
  // 1. What the registry could move.
  const std::unordered_set<std::uintptr_t> movable = movable_unlocked(lock);
  if (movable.empty()) return false;

  // 2. Plan, and reserve a destination for each mover, as planned.
  if (!pending_.empty()) process_events_locked(/*wait=*/false);
  pool_.flush_fast();
  CompactPlan plan = plan_compaction(pool_, rounded, kind, stream, movable);
  if (plan.movers.empty()) return false;
  std::vector<std::uintptr_t> from, to;
  std::vector<std::size_t> sizes;
  for (Block* m : plan.movers) {
    PoolKind pools[2];
    const int n = destination_pools(m->size, pools);
    Block* hole = nullptr;
    for (int i = 0; i < n && !hole; ++i)
      hole = pool_.find_free_outside(pools[i], m->size, stream, plan.lo, plan.hi);
    if (!hole) break;  // the plan's simulation and the pool disagree: move what fits
    Block* dest = pool_.take(hole, m->size, m->requested, stream);
    placements_.emplace(dest->addr, dest);
    from.push_back(m->addr);
    to.push_back(dest->addr);
    sizes.push_back(dest->size);
  }
  if (from.empty()) return false;
  Stats& s = pool_.stats();
  ++s.num_compactions;

  // 3. The registry moves what it still can.
  lock.unlock();
  const std::size_t moved = relocate_fn(context, from.data(), to.data(), from.size());
  lock.lock();

  // 4. Destinations nobody took go back (untraced: their allocation was never traced).
  std::size_t moved_bytes = 0;
  for (std::size_t i = 0; i < to.size(); ++i) {
    auto it = placements_.find(to[i]);
    if (it == placements_.end()) {
      moved_bytes += sizes[i];
      continue;
    }
    Block* dest = it->second;
    placements_.erase(it);
    if (backend_->stream_is_synchronous(dest->stream)) dest->stream = kAnyStream;
    pool_.release(dest);
  }
  s.num_relocations += static_cast<std::int64_t>(moved);
  s.num_relocated_bytes += static_cast<std::int64_t>(moved_bytes);
  return moved > 0;
}

void Engine::evict_unlocked(std::unique_lock<std::mutex>& lock,
                            const std::vector<std::uint64_t>& victims) {
  EvictCallback callback = evict_callback_;
  void* context = evict_context_;
  ++evicting_;
  lock.unlock();  // See Note [Calling out] in reclaim.cpp.
  callback(context, victims.data(), victims.size());
  lock.lock();
  --evicting_;
}

}  // namespace pyalloc
