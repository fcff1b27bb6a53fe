// segments.cpp — the engine's device memory: mapping segments, growing and trimming
// expandable ones, stitching free chunks into new ranges, and giving memory back.
//
// The reclaim ladder (reclaim.cpp) decides when; these do it, under the engine lock,
// through the Backend. Every map and unmap is counted (num_segment_maps,
// num_segment_unmaps) and traced, and each is all or nothing: a mapping that fails
// half-way is undone before the call returns.
#include <algorithm>
#include <vector>

#include "engine.h"

namespace pyalloc {

std::size_t Engine::headroom_locked() const {
  const auto reserved = static_cast<std::size_t>(pool_.stats().reserved_bytes[kAllPools].current);
  return budget_ > reserved ? budget_ - reserved : 0;
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

void Engine::quiesce_for_release_locked() {
  // cuMemUnmap does not wait for kernels still using the memory (cudaFree did), and a
  // free block may still be in use by work queued on its stream. So wait for everything —
  // which also makes every cached block idle: adopting their streams lets pieces freed on
  // different streams merge, so a segment with nothing live is released whole.
  backend_->synchronize_device();
  ++pool_.stats().num_sync_all_streams;
  unmap_retired_locked(/*wait=*/true);   // their events are complete now: no wait
  unmap_kept_locked(/*wait=*/false);     // before the segments they map (Note [Keeping stitched mappings])
  for (StreamId s : pool_.tagged_streams()) pool_.adopt_stream(s);
  adopt_released_pools_locked();
}

bool Engine::release_cached_locked() {
  pool_.flush_fast();  // tagged_streams() below reads the free sets only
  bool released_free = false;  // a released graph pool's free memory (Note [Graph pools])
  for (std::uint64_t p : released_pools_) released_free |= pool_.has_free_with_tag(graph_pool_tag(p));
  if (!pool_.has_free_segment() && !has_trimmable_locked() && !released_free) return false;
  BlockedTimer timer(blocked_ns_);
  quiesce_for_release_locked();
  for (Segment* seg : pool_.take_releasable_segments()) unmap_segment_locked(seg);
  trim_expandable_locked();
  return true;
}

bool Engine::release_one_locked(std::size_t bytes) {
  pool_.flush_fast();
  if (!pool_.has_free_segment()) return false;
  BlockedTimer timer(blocked_ns_);
  quiesce_for_release_locked();
  Segment* seg = pool_.take_free_segment(bytes);
  if (!seg) return false;
  unmap_segment_locked(seg);
  return true;
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
  if (Block* block = reuse_kept_locked(runs, bytes, size, stream)) return block;
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
  ++pool_.stats().num_segment_maps;
  return add_stitched_locked(va, bytes, runs, size, stream);
}

Block* Engine::add_stitched_locked(std::uintptr_t va, std::size_t bytes,
                                   const std::vector<Pool::StitchRun>& runs, std::size_t size,
                                   StreamId stream) {
  Block* block = pool_.add_stitched(va, bytes, runs, size, stream);
  Stats& s = pool_.stats();
  ++s.num_stitches;
  s.num_stitched_bytes += static_cast<std::int64_t>(bytes);
  trace_.record(TraceAction::kStitch, va, bytes, size, stream);
  return block;
}

void Engine::unmap_range_locked(std::uintptr_t va, std::size_t bytes) {
  backend_->unmap(va, bytes);
  backend_->unreserve(va, bytes);
  ++pool_.stats().num_segment_unmaps;
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
  std::vector<std::pair<std::uintptr_t, std::size_t>> pieces;
  if (options_.keep_stitched) {
    pieces.reserve(block->segment->pieces.size());
    for (const Block* piece : block->segment->pieces) pieces.emplace_back(piece->addr, piece->size);
  }
  std::uintptr_t va = 0;
  std::size_t bytes = 0;
  pool_.dissolve_stitched(block, &va, &bytes, done ? stream : kAnyStream);
  if (options_.keep_stitched) {
    kept_ranges_.push_back(KeptRange{va, bytes, std::move(pieces), done});
    if (kept_ranges_.size() > kMaxKeptRanges) {  // the oldest goes the usual way
      const KeptRange oldest = std::move(kept_ranges_.front());
      kept_ranges_.erase(kept_ranges_.begin());
      if (oldest.event) {
        retired_ranges_.push_back(RetiredRange{oldest.va, oldest.bytes, oldest.event});
        unmap_retired_locked(/*wait=*/false);
      } else {
        unmap_range_locked(oldest.va, oldest.bytes);
      }
    }
  } else if (done) {
    retired_ranges_.push_back(RetiredRange{va, bytes, done});
    unmap_retired_locked(/*wait=*/false);
  } else {
    unmap_range_locked(va, bytes);
  }
}

// Note [Keeping stitched mappings]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Under a policy the same stitch recurs every step: the same request, at the same point of
// the step, finds the same layout and gathers the same free chunks — ResNet-50 under
// recompute on an H100 mapped and unmapped three ranges a step. A mapping is driver work
// (cuMemMap and cuMemSetAccess, then cuMemUnmap), and issue 20 asks for none in steady
// state. So a freed stitched range is not unmapped: its pieces go back to their segments as
// before (they are free blocks, which any request may take), and the range stays mapped
// over them, remembered with their addresses. When a later stitch plans exactly those
// pieces, in the same order, it takes the kept range instead of mapping a new one (GMLake
// keeps its stitched blocks the same way). Whether the pieces are free, and free for the
// stream, is what the plan already checked; the mapping itself holds no memory, so keeping
// it changes no count of reserved or allocated bytes, and the layout is the one the plan
// chose without it. A kept range only maps pages of segments the pool holds: every release
// (the only place segments or their chunks are unmapped) synchronizes the device and unmaps
// the kept ranges first. At most kMaxKeptRanges are kept; the oldest is retired beyond that.

Block* Engine::reuse_kept_locked(const std::vector<Pool::StitchRun>& runs, std::size_t bytes,
                                 std::size_t size, StreamId stream) {
  for (auto it = kept_ranges_.begin(); it != kept_ranges_.end(); ++it) {
    if (it->bytes != bytes || it->pieces.size() != runs.size()) continue;
    bool same = true;
    for (std::size_t i = 0; same && i < runs.size(); ++i)
      same = it->pieces[i].first == runs[i].start && it->pieces[i].second == runs[i].bytes;
    if (!same) continue;
    const std::uintptr_t va = it->va;
    // Its event only said when the range could be unmapped; a new block on it is ordered
    // by its pieces' streams, as a fresh range would be.
    if (it->event) spare_events_.push_back(it->event);
    kept_ranges_.erase(it);
    ++pool_.stats().num_stitch_reuses;
    return add_stitched_locked(va, bytes, runs, size, stream);
  }
  return nullptr;
}

void Engine::unmap_kept_locked(bool wait) {
  for (const KeptRange& r : kept_ranges_) {
    if (r.event) {
      if (wait) backend_->synchronize_event(r.event);
      spare_events_.push_back(r.event);
    }
    unmap_range_locked(r.va, r.bytes);
  }
  kept_ranges_.clear();
}

void Engine::unmap_retired_locked(bool wait) {
  std::size_t kept = 0;
  for (RetiredRange& r : retired_ranges_) {
    if (wait) backend_->synchronize_event(r.event);
    else if (!backend_->query_event(r.event)) {
      retired_ranges_[kept++] = r;
      continue;
    }
    unmap_range_locked(r.va, r.bytes);
    spare_events_.push_back(r.event);
  }
  retired_ranges_.resize(kept);
}

}  // namespace pyalloc
