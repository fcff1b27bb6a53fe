// reclaim.cpp — what the engine does when a request does not fit, step by step.
//
// Engine::malloc climbs this ladder; each rung runs only if the ones before it failed,
// and each is counted in the stats:
//
//   1. cached     best fit among free blocks of this stream and idle blocks.
//   2. grow       a new segment from the device, if the budget allows it (option
//                 expandable: grow the large pool's one segment at its end instead).
//   3. fence      wait for other streams' outstanding work, then reuse their cached
//                 blocks (num_stream_fences). See Note [Stream tags] in block.h.
//      in place   under a registry with the window strategy: first the free memory rungs
//                 4a and 4b below need no mapping either; then evict the cheapest window
//                 of evictable and free blocks inside a segment that then holds the
//                 request, and climb again. See Note [Evicting in place].
//      stitch     if free 2 MiB chunks of the cached segments cover a large request, map
//                 them into one new range rather than release and map again (option
//                 stitch; under a registry only; with stitch_first this runs before
//                 rung 2).
//   4. release    give every wholly free cached segment back to the device and grow
//                 again (num_alloc_retries, num_sync_all_streams); then, for a small
//                 long-lived request, take a hole of a short-lived segment (Note
//                 [Lifetime classes] in pool.h); then, for a small request, borrow a
//                 piece of a large-pool free block (num_small_borrows).
//      stitch     again, now also mapping a segment of what the free chunks lack if
//                 the budget has room (num_stitches; Note [Stitching] in pool.h).
//   5. evict      choose evictable blocks (evictor.h, option evict_strategy), have the
//                 registry evict them outside the lock, and climb again from rung 1
//                 (num_evict_rounds, num_evictions, num_evicted_bytes).
//   6. compact    nothing is left to evict: move live storages the registry can move out
//                 of a window that then holds the request, into free blocks elsewhere,
//                 and climb again (num_compactions, num_relocations; compactor.h and
//                 Note [Relocation] in engine.h; option compact).
//   7. oom        report what is allocated, cached, fragmented and evictable, and what
//                 would help (num_ooms).
//
// Note [Calling out]
// ~~~~~~~~~~~~~~~~~~
// The eviction callback runs Python (the registry), which frees storages — re-entering
// the engine — and may need the GIL. So victims are chosen under the lock and passed by
// handle, the lock is dropped for the call, and the ladder starts over afterwards: the
// pool may have changed in between (other threads, the frees themselves), and nothing
// decided before the call is trusted after it. Lock order: GIL, then engine.
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
// use free memory without mapping (a long-lived request's any hole, a small request's
// borrow), since free memory beats a recompute — and the mapping rungs run only when no
// segment can hold the request (the first steps, while the pool takes its shape, or a
// request larger than any segment). dtr and dte keep their order: their victims are
// chosen by score, not by place.
//
// Swapping is not a rung of its own: the registry decides, per victim, whether to swap it
// out or drop it (swap.cpp), and either way the victim's free comes back through rung 5.
// Stitching runs after 3 and again between 4 and 5.
#include <cinttypes>
#include <cstdio>

#include "engine.h"

namespace pyalloc {

std::size_t Engine::headroom_locked() const {
  const auto reserved = static_cast<std::size_t>(pool_.stats().reserved_bytes[kAllPools].current);
  return budget_ > reserved ? budget_ - reserved : 0;
}

Block* Engine::find_or_grow_locked(std::size_t rounded, std::size_t size, StreamId stream,
                                  PoolKind kind, SegmentClass cls, bool* taken, bool* fenced) {
  if (!pending_.empty()) process_events_locked(/*wait=*/false);
  if (!retired_ranges_.empty()) unmap_retired_locked(/*wait=*/false);
  Block* block = find_cached_locked(rounded, stream, kind, cls);
  // Rung 1b, stitch first: free chunks already cached cover the request, so mapping more
  // memory would only grow the pool around its own holes. Where they cover part of it, and
  // that part is at least a large segment's worth, the pool grows by the rest only, as an
  // expandable segment grows by what is missing: on GPT-2's trace (the simulated device),
  // the logits' 393 MiB found 150 MiB of whole free chunks in a segment that activations had
  // split, and peak reserved fell from 6808 to 6606 MiB (utilization 0.968 -> 0.998). Below
  // that the saving is too small for a stitch that recurs every step: on the MLP's and the
  // transformer's traces mapping any shortfall stitched 37 and 29 times in 3 steps, against 0
  // and 3, and saved nothing at their peaks.
  if (!block && stitches(kind) && options_.stitch_first) {
    block = stitch_locked(rounded, size, stream, kLargeSegment);
    *taken = block != nullptr;
    if (block) return block;
  }
  if (!block) block = grow_locked(rounded, kind, stream);
  if (!block && (*fenced = fence_streams_locked(stream)))
    block = find_cached_locked(rounded, stream, kind, cls);
  return block;
}

Block* Engine::reclaim_cache_locked(std::size_t rounded, std::size_t size, StreamId stream,
                                    PoolKind kind, SegmentClass cls, bool* taken, bool fenced) {
  Block* block = nullptr;
  // Rung 3b, under a registry: stitch from what is cached, before releasing it. The
  // release rung waits for the whole device and unmaps free segments, which eviction
  // rounds then make the engine map again (on CUDA, a cuMemCreate per chunk): on an H100,
  // ResNet-50 under recompute at half its peak went from 339 to 238 ms a step with this
  // rung. It needs stitched blocks to be eviction candidates (evictor.cpp).
  // Under the window strategy only for a request no segment of its pool could hold: for
  // the others its rung 3c has just looked for room inside one segment, and a stitched
  // range takes whole chunks out of the segments it plans in, so the next requests find
  // no window either and stitch again. The zoo's UNet at 0.4 of its peak made 805
  // stitches and 2895 evictions a step (28-42x its unconstrained step); with the rung
  // kept for those alone, 0 and 41 (1.2-1.5x), and its least budget fell from 0.53 to
  // 0.35 of the peak (docs/results/notebook.md, "Stitching before release"). Dropped for every
  // request, the GRU's 4 MiB request at its loss, bigger than any of its 2 MiB small
  // segments, found nothing to stitch into under swap at 0.4.
  // Without a registry the release rung is the better first answer: stitching there
  // keeps pieces of many segments busy, so none is wholly free to give the small pool
  // (replaying the transformer's trace at 1.02x its peak, 4 requests failed that release
  // first serves). Rung 1b already tried the same chunks unless the fence freed more.
  if (stitches(kind) && evict_callback_ &&
      (!evicts_in_place() || !segment_holds_locked(rounded, kind)) &&
      (!options_.stitch_first || fenced)) {
    block = stitch_locked(rounded, size, stream, kNeverMapRest);
    *taken = block != nullptr;
    if (block) return block;
  }
  ++pool_.stats().num_alloc_retries;
  if (release_cached_locked()) block = grow_locked(rounded, kind, stream);
  if (!block) block = find_elsewhere_locked(rounded, stream, kind, cls);
  return block;
}

bool Engine::segment_holds_locked(std::size_t rounded, PoolKind kind) const {
  for (const auto& [addr, segment] : pool_.segments())
    if (segment->pool == kind && segment->size >= rounded) return true;
  return false;
}

Block* Engine::find_elsewhere_locked(std::size_t rounded, StreamId stream, PoolKind kind,
                                     SegmentClass cls) {
  Block* block = nullptr;
  // Rung 4a: a request with no room of its class left takes any hole rather than fail:
  // segment classes place blocks, they never refuse memory that is there.
  if (cls != SegmentClass::kAny)
    block = find_cached_locked(rounded, stream, kind, SegmentClass::kAny);
  if (!block && kind == PoolKind::kSmall) {
    // Rung 4b, borrow: with the budget spent on large segments, their free bytes are the
    // only memory left, and small requests never look there. Take a piece of one rather
    // than fail (seen in training under eviction: an 8 MiB free large block, a 1 MiB
    // request, no room for a 2 MiB small segment).
    block = pool_.find_borrow(rounded, stream);
    if (block) ++pool_.stats().num_small_borrows;
  }
  return block;
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
  EvictPlan plan = plan_eviction(pool_, options_.evict_strategy, rounded, kind, stream, clock_,
                                 headroom_locked(), backend_->granularity(), stitches(kind));
  if (plan.victims.empty()) return {};
  return take_victims_locked(plan, /*proactive=*/false);
}

std::vector<std::uint64_t> Engine::plan_in_place_locked(std::size_t rounded, StreamId stream,
                                                         PoolKind kind) {
  EvictPlan plan = plan_in_place(pool_, rounded, kind, stream, clock_);
  if (plan.victims.empty()) return {};
  return take_victims_locked(plan, /*proactive=*/false);
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

Block* Engine::find_cached_locked(std::size_t rounded, StreamId stream, PoolKind kind,
                                  SegmentClass cls) {
  // An exact-size hit needs no search. On a miss, every cached block joins the free sets
  // first, so best fit (and every later rung) sees all free memory: See Note
  // [Exact-size cache] in pool.h.
  if (Block* exact = pool_.find_exact(rounded, stream, kind, cls)) return exact;
  pool_.flush_fast();
  return pool_.find_free_in(kind, rounded, stream, cls);
}

Block* Engine::grow_locked(std::size_t rounded, PoolKind kind, StreamId stream) {
  if (options_.expandable && kind == PoolKind::kLarge) return expand_locked(rounded, kind, stream);
  const std::size_t gran = backend_->granularity();
  const std::size_t headroom = headroom_locked();
  // Try the segment size that amortizes best first; under budget pressure fall back to
  // the smallest segment that holds the request.
  const std::size_t exact = round_up(rounded, gran);
  // With stitch_first a large request needs no segment larger than itself: the free chunks
  // of many small segments serve later requests as well as one big segment would, and
  // the pool grows by what is missing, not by 20 MiB at a time (on the recorded model
  // traces peak reserved fell by 8-12%; tools/bench_frag.py). The cost: a remainder of
  // up to kSmallSize in the last chunk stays in the block (large blocks keep such tails).
  const bool tight = options_.stitch && options_.stitch_first && kind == PoolKind::kLarge;
  const std::size_t preferred = tight ? exact : round_up(preferred_segment_size(rounded), gran);
  const std::size_t candidates[] = {preferred, exact};
  for (int i = 0; i < (exact == preferred ? 1 : 2); ++i) {
    const std::size_t size = candidates[i];
    if (size > headroom) continue;
    if (Block* block = map_segment_locked(size, kind)) return block;
  }
  return nullptr;
}

Block* Engine::map_segment_locked(std::size_t size, PoolKind kind) {
  std::uintptr_t va = backend_->reserve(size);
  if (!va) return nullptr;
  PhysicalHandle phys = backend_->create_physical(size);
  if (!phys) {
    backend_->unreserve(va, size);
    return nullptr;
  }
  if (!backend_->map(va, phys)) {
    backend_->release_physical(phys);
    backend_->unreserve(va, size);
    return nullptr;
  }
  ++pool_.stats().num_device_alloc;
  ++pool_.stats().num_segment_maps;
  trace_.record(TraceAction::kSegmentMap, va, size, 0, 0);
  return pool_.add_segment(va, size, kind, phys);
}

Block* Engine::expand_locked(std::size_t rounded, PoolKind kind, StreamId stream) {
  const std::size_t gran = backend_->granularity();
  Segment* seg = pool_.expandable(kind);
  // What the request lacks beyond the free block that ends the segment, if it may use it.
  const Block* tail = seg ? seg->last : nullptr;
  const std::size_t have = tail && free_for(tail, stream) ? tail->size : 0;
  if (have >= rounded) return nullptr;  // best fit refused that block (max_split_size)
  const std::size_t need = round_up(rounded - have, gran);
  // A full reservation (the budget was raised since) starts another segment.
  if (seg && need > seg->room()) return extend_locked(nullptr, kind, round_up(rounded, gran),
                                                       stream);
  return extend_locked(seg, kind, need, stream);
}

Block* Engine::extend_locked(Segment* seg, PoolKind kind, std::size_t need, StreamId stream) {
  const std::size_t gran = backend_->granularity();
  if (need > headroom_locked()) return nullptr;
  std::uintptr_t va = 0;
  std::size_t va_bytes = 0;
  if (seg) {
    va = seg->addr + seg->size;
  } else {
    // Address space is cheap and physical memory is mapped as needed: reserve room for the
    // whole budget, so that the segment never has to move (PyTorch reserves 9/8 of the
    // device).
    va_bytes = round_up(std::max(budget_, need), gran);
    // Where that much address space is refused, a segment of just what is needed still
    // serves the request (the next growth then starts another segment).
    if (!(va = backend_->reserve(va_bytes)) && !(va = backend_->reserve(va_bytes = need)))
      return nullptr;
  }
  std::vector<PhysicalHandle> chunks;
  if (!map_chunks_locked(va, need / gran, &chunks)) {
    if (!seg) backend_->unreserve(va, va_bytes);
    return nullptr;
  }
  Stats& s = pool_.stats();
  if (!seg) {
    ++s.num_device_alloc;
    trace_.record(TraceAction::kSegmentMap, va, need, 0, 0);
    return pool_.add_expandable(va, va_bytes, kind, std::move(chunks), gran);
  }
  ++s.num_segment_grows;
  trace_.record(TraceAction::kSegmentGrow, va, need, 0, 0);
  return pool_.extend(seg, std::move(chunks), gran, stream);
}

bool Engine::map_chunks_locked(std::uintptr_t va, std::size_t count,
                               std::vector<PhysicalHandle>* chunks) {
  const std::size_t gran = backend_->granularity();
  chunks->reserve(count);
  while (chunks->size() < count) {
    PhysicalHandle phys = backend_->create_physical(gran);
    if (!phys) break;
    chunks->push_back(phys);
  }
  if (chunks->size() == count && backend_->map_handles(va, chunks->data(), count)) {
    ++pool_.stats().num_segment_maps;
    return true;
  }
  for (PhysicalHandle c : *chunks) backend_->release_physical(c);  // all or nothing
  chunks->clear();
  return false;
}

bool Engine::map_piece_locked(std::uintptr_t va, const Segment* seg, std::size_t offset,
                              std::size_t bytes) {
  if (!seg->expandable) return backend_->map_part(va, seg->physical, offset, bytes);
  const std::size_t gran = backend_->granularity();
  return backend_->map_handles(va, seg->chunks.data() + offset / gran, bytes / gran);
}

void Engine::unmap_segment_locked(Segment* seg) {
  trace_.record(TraceAction::kSegmentUnmap, seg->addr, seg->size, 0, 0);
  backend_->unmap(seg->addr, seg->size);
  ++pool_.stats().num_segment_unmaps;
  if (seg->expandable) {
    for (PhysicalHandle c : seg->chunks) backend_->release_physical(c);
    backend_->unreserve(seg->addr, seg->va_bytes);
  } else {
    backend_->release_physical(seg->physical);
    backend_->unreserve(seg->addr, seg->size);
  }
  ++pool_.stats().num_device_free;
  pool_.destroy_segment(seg);
}

bool Engine::trim_expandable_locked() {
  const std::size_t gran = backend_->granularity();
  bool trimmed = false;
  for (int k = 0; k < kPoolKinds; ++k) {
    Segment* seg = pool_.expandable(static_cast<PoolKind>(k));
    const std::size_t bytes = seg ? pool_.trimmable(seg, gran) : 0;
    if (bytes == 0) continue;
    const std::uintptr_t va = seg->addr + seg->size - bytes;
    trace_.record(TraceAction::kSegmentShrink, va, bytes, 0, 0);
    std::vector<PhysicalHandle> chunks = pool_.trim(seg, bytes, gran);
    backend_->unmap(va, bytes);
    for (PhysicalHandle c : chunks) backend_->release_physical(c);
    ++pool_.stats().num_segment_trims;
    ++pool_.stats().num_segment_unmaps;
    trimmed = true;
  }
  return trimmed;
}

Block* Engine::stitch_locked(std::size_t rounded, std::size_t size, StreamId stream,
                             std::size_t map_rest_from) {
  const std::size_t chunk = backend_->granularity();
  if (rounded <= kSmallSize || chunk != kStitchChunk) return nullptr;
  const std::size_t bytes = round_up(rounded, chunk);
  pool_.flush_fast();
  std::vector<Pool::StitchRun> runs = pool_.plan_stitch(bytes, chunk, stream);
  if (runs.empty()) {
    if (map_rest_from == kNeverMapRest) return nullptr;
    // The free chunks fall short, but the budget may have room for the rest, too little
    // for a segment of the whole request: map a segment of just the rest, and stitch.
    const std::size_t have = pool_.stitchable_bytes(chunk, stream);
    const std::size_t rest = bytes - std::min(bytes, have);
    if (have < map_rest_from || rest == 0 || rest > headroom_locked()) return nullptr;
    // With expandable segments the rest is mapped at the end of the large pool's, where
    // it may join the free block there.
    Segment* grown = pool_.expandable(PoolKind::kLarge);
    if (grown && rest > grown->room()) grown = nullptr;
    if (!(options_.expandable ? extend_locked(grown, PoolKind::kLarge, rest, stream)
                              : map_segment_locked(rest, PoolKind::kLarge)))
      return nullptr;
    runs = pool_.plan_stitch(bytes, chunk, stream);
    if (runs.empty()) return nullptr;
  }
  const std::uintptr_t va = backend_->reserve(bytes);
  if (!va) return nullptr;
  std::size_t mapped = 0;
  for (const Pool::StitchRun& run : runs) {
    const Segment* seg = run.free_block->segment;
    if (!map_piece_locked(va + mapped, seg, run.start - seg->addr, run.bytes)) {
      backend_->unmap(va, mapped);  // all or nothing
      backend_->unreserve(va, bytes);
      return nullptr;
    }
    mapped += run.bytes;
  }
  Block* block = pool_.add_stitched(va, bytes, runs, size, stream);
  Stats& s = pool_.stats();
  ++s.num_stitches;
  ++s.num_segment_maps;
  s.num_stitched_bytes += static_cast<std::int64_t>(bytes);
  trace_.record(TraceAction::kStitch, va, bytes, size, stream);
  return block;
}

void Engine::free_stitched_locked(Block* block) {
  // cuMemUnmap does not wait for kernels, so the range may be unmapped only once the
  // streams that used it are done. The pieces themselves need no wait to be reused on the
  // block's own stream (its later work is ordered after the range's last use, as for any
  // freed block): so, when only that stream used it, the pieces go back to their segments
  // tagged with it at once, and the range is retired, to be unmapped when an event
  // recorded now completes (unmap_retired_locked). Waiting here instead would stall the
  // host on the GPU at every free of a stitched block, under memory pressure, where they
  // are frequent. Other streams, or an event that cannot be recorded, fall back to waiting.
  trace_.record(TraceAction::kFree, block->addr, block->size, block->requested, block->stream);
  const StreamId stream = block->stream;
  const bool synchronous = backend_->stream_is_synchronous(stream);
  EventId done = 0;
  if (!synchronous && block->stream_uses.empty()) {
    done = acquire_event_locked();
    if (!backend_->record_event(done, stream)) {
      spare_events_.push_back(done);
      done = 0;
    }
  }
  if (done == 0) {
    BlockedTimer timer(blocked_ns_);
    if (!synchronous) backend_->synchronize_stream(stream);
    for (StreamId s : block->stream_uses) backend_->synchronize_stream(s);
  }
  std::uintptr_t va = 0;
  std::size_t bytes = 0;
  pool_.dissolve_stitched(block, &va, &bytes, done ? stream : kAnyStream);
  if (done) {
    retired_ranges_.push_back(RetiredRange{va, bytes, done});
    unmap_retired_locked(/*wait=*/false);
  } else {
    backend_->unmap(va, bytes);
    backend_->unreserve(va, bytes);
    ++pool_.stats().num_segment_unmaps;
  }
}

void Engine::unmap_retired_locked(bool wait) {
  std::size_t kept = 0;
  for (RetiredRange& r : retired_ranges_) {
    if (wait) backend_->synchronize_event(r.event);
    else if (!backend_->query_event(r.event)) {
      retired_ranges_[kept++] = r;
      continue;
    }
    backend_->unmap(r.va, r.bytes);
    backend_->unreserve(r.va, r.bytes);
    ++pool_.stats().num_segment_unmaps;
    spare_events_.push_back(r.event);
  }
  retired_ranges_.resize(kept);
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

bool Engine::release_cached_locked() {
  pool_.flush_fast();  // tagged_streams() below reads the free sets only
  if (!pool_.has_free_segment() && !has_trimmable_locked()) return false;
  BlockedTimer timer(blocked_ns_);
  // cuMemUnmap does not wait for kernels still using the memory (cudaFree did), and a
  // free block may still be in use by work queued on its stream. So wait for everything —
  // which also makes every cached block idle: adopting their streams lets pieces freed on
  // different streams merge, so a segment with nothing live is released whole.
  backend_->synchronize_device();
  ++pool_.stats().num_sync_all_streams;
  unmap_retired_locked(/*wait=*/true);   // their events are complete now: no wait
  for (StreamId s : pool_.tagged_streams()) pool_.adopt_stream(s);
  for (Segment* seg : pool_.take_releasable_segments()) unmap_segment_locked(seg);
  trim_expandable_locked();
  return true;
}

bool Engine::compact_locked(std::unique_lock<std::mutex>& lock, std::size_t rounded,
                            StreamId stream, PoolKind kind) {
  if (!options_.compact || !movable_callback_ || !relocate_callback_) return false;
  MovableCallback movable_fn = movable_callback_;
  RelocateCallback relocate_fn = relocate_callback_;
  void* context = compact_context_;
  // 1. What the registry could move. See Note [Calling out]: the lock is dropped, and
  // nothing learnt before is trusted after.
  std::vector<std::uintptr_t> addrs(256);
  lock.unlock();
  std::size_t n = movable_fn(context, addrs.data(), addrs.size());
  if (n > addrs.size()) {
    addrs.resize(n);
    n = std::min(n, movable_fn(context, addrs.data(), addrs.size()));
  }
  lock.lock();
  if (n == 0) return false;
  const std::unordered_set<std::uintptr_t> movable(addrs.begin(), addrs.begin() + n);

  // 2. Plan, and reserve a destination for each mover, as planned.
  if (!pending_.empty()) process_events_locked(/*wait=*/false);
  pool_.flush_fast();
  CompactPlan plan = plan_compaction(pool_, rounded, kind, stream, movable);
  if (plan.movers.empty()) return false;
  std::vector<std::uintptr_t> from, to;
  std::vector<std::size_t> sizes;
  for (Block* m : plan.movers) {
    Block* hole = pool_.find_free_outside(kind, m->size, stream, plan.lo, plan.hi);
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

std::string Engine::oom_report_locked(std::size_t size, std::size_t rounded, StreamId stream) {
  const Stats& s = pool_.stats();
  FragmentationFigures f = pool_.fragmentation();
  const auto reserved = static_cast<std::size_t>(s.reserved_bytes[kAllPools].current);
  const auto allocated = static_cast<std::size_t>(s.allocated_bytes[kAllPools].current);
  const auto awaiting =
      static_cast<std::size_t>(s.active_bytes[kAllPools].current) - allocated;
  MemInfo info = backend_->mem_info();

  char head[512];
  std::snprintf(head, sizeof head,
                "pyalloc: out of memory on %s device %d: tried to allocate %s (%zu bytes, "
                "rounded to %zu) on stream 0x%" PRIxPTR ".\n",
                backend_->name(), backend_->device(), format_bytes(size).c_str(), size, rounded,
                stream);
  std::string msg = head;
  msg += "  budget " + format_bytes(budget_) + "; reserved " + format_bytes(reserved) +
         " = allocated " + format_bytes(allocated) + " + awaiting other streams " +
         format_bytes(awaiting) + " + cached free " + format_bytes(f.cached_free_bytes) + ".\n";
  char frag[64];
  std::snprintf(frag, sizeof frag, "%.1f%%", 100.0 * f.external_fragmentation);
  msg += "  cached free: largest block " + format_bytes(f.largest_free_block) +
         ", external fragmentation " + frag + ".\n";
  std::size_t evictable_blocks = 0;
  const std::size_t evictable = evictable_bytes(pool_, &evictable_blocks);
  msg += "  evictable " + format_bytes(evictable) + " in " + std::to_string(evictable_blocks) +
         " blocks" + (evict_callback_ ? std::string(" (strategy ") +
                                            strategy_name(options_.evict_strategy) + ")"
                                      : std::string(" (no eviction policy is active)")) +
         (host_pool_.base() ? "; " + host_pool_report_locked() : std::string()) + ".\n";
  msg += "  device: " + format_bytes(info.free_bytes) + " free of " +
         format_bytes(info.total_bytes) + ".\n";

  // The hint names the one change most likely to help, in order of how cheap it is.
  std::string hint;
  if (rounded > budget_) {
    hint = "the request alone exceeds the budget: raise it (option budget, currently " +
           format_bytes(budget_) + ") or split the tensor";
  } else if (f.cached_free_bytes >= rounded) {
    hint = "the cached free bytes would hold this request if they were contiguous, so the "
           "cache is fragmented: free long-lived tensors earlier or allocate them first";
    if (rounded > kLargeSegment && options_.max_split_size == 0) {
      hint += ", or set max_split_size (e.g. \"max_split_size:" + std::to_string(rounded) +
              "\") so that blocks this large are never split for small requests";
    }
  } else if (budget_ < info.total_bytes && reserved + rounded <= info.total_bytes &&
             info.free_bytes >= rounded) {
    hint = "the device has room beyond the budget: raise the budget (option budget, "
           "currently " + format_bytes(budget_) + ")";
  } else if (!evict_callback_) {
    hint = "reduce the batch size or the model's activation memory";
  } else if (host_pool_.base() && evictable > 0 &&
             host_pool_.capacity() - host_pool_.used() < evictable) {
    hint = "tensors that could only be swapped stayed because the host pool is full: raise "
           "the option host_pool (currently " + format_bytes(host_pool_.capacity()) + ")";
  } else {
    hint = "even evicting every evictable tensor would not make room: reduce the batch size";
  }
  msg += "  hint: " + hint + ".";
  return msg;
}

}  // namespace pyalloc
