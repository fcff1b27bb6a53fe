// pool_stitch.cpp — the Pool's side of stitching: which free chunks a stitched range
// takes, and the stitched block lent over them (Note [Stitching] in pool.h).
#include <algorithm>
#include <cinttypes>
#include <cstdio>

#include "format.h"
#include "pool.h"

namespace pyalloc {

std::size_t Pool::stitchable_bytes(std::size_t chunk, StreamId stream) const {
  std::size_t total = 0;
  for (const StitchRun& run : plan_stitch(SIZE_MAX, chunk, stream, /*all=*/true)) total += run.bytes;
  return total;
}

std::vector<Pool::StitchRun> Pool::plan_stitch(std::size_t bytes, std::size_t chunk,
                                               StreamId stream) const {
  return plan_stitch(bytes, chunk, stream, /*all=*/false);
}

std::vector<Pool::StitchRun> Pool::plan_stitch(std::size_t bytes, std::size_t chunk,
                                               StreamId stream, bool all) const {
  std::vector<StitchRun> runs;
  for (int kind : {static_cast<int>(PoolKind::kSmall), static_cast<int>(PoolKind::kLarge)}) {
    for (const FreeEntry& e : free_[kind]) {
      if (e.stream != stream && e.stream != kAnyStream) continue;
      const std::uintptr_t first = round_up(e.addr, chunk);
      const std::uintptr_t last = (e.addr + e.size) / chunk * chunk;
      if (last > first) runs.push_back({e.block, first, last - first});
    }
  }
  // Largest first: fewest pieces, fewest mappings. Ties by address, for determinism.
  std::sort(runs.begin(), runs.end(), [](const StitchRun& a, const StitchRun& b) {
    return a.bytes != b.bytes ? a.bytes > b.bytes : a.start < b.start;
  });
  std::size_t total = 0;
  std::size_t used = 0;
  for (; used < runs.size() && total < bytes; ++used) {
    runs[used].bytes = std::min(runs[used].bytes, bytes - total);
    total += runs[used].bytes;
  }
  if (all) return runs;
  if (total < bytes) return {};
  runs.resize(used);
  return runs;
}

Block* Pool::add_stitched(std::uintptr_t va, std::size_t bytes,
                          const std::vector<StitchRun>& runs, std::size_t requested,
                          StreamId stream) {
  auto* range = new Segment;
  range->addr = va;
  range->size = bytes;
  range->pool = PoolKind::kLarge;
  range->stitched = true;
  Block* sb = new_block();
  sb->addr = va;
  sb->size = bytes;
  sb->segment = range;
  sb->state = BlockState::kAllocated;
  sb->requested = requested;
  sb->stream = stream;
  range->first = range->last = sb;
  for (const StitchRun& run : runs) {
    Block* b = run.free_block;
    Segment* seg = b->segment;
    erase_free(b);
    if (run.start > b->addr) {  // the part before the run stays free
      Block* before = b;
      b = split_off(before, run.start - before->addr);
      insert_free(before);
    }
    if (b->size > run.bytes) insert_free(split_off(b, run.bytes));  // and so does the rest
    b->state = BlockState::kLent;
    b->lent_to = sb;
    b->stream = stream;
    range->pieces.push_back(b);
    int p = stat_pool(seg);
    update(stats_.allocated_bytes, p, static_cast<std::int64_t>(b->size));
    update(stats_.active_bytes, p, static_cast<std::int64_t>(b->size));
  }
  update(stats_.allocation, kLargePool, 1);
  update(stats_.active, kLargePool, 1);
  update(stats_.requested_bytes, kLargePool, static_cast<std::int64_t>(requested));
  stitched_.emplace(va, range);
  allocated_.insert(va, sb);
  return sb;
}

void Pool::dissolve_stitched(Block* sb, std::uintptr_t* va, std::size_t* bytes, StreamId tag) {
  Segment* range = sb->segment;
  *va = range->addr;
  *bytes = range->size;
  allocated_.erase(sb->addr);
  update(stats_.allocation, kLargePool, -1);
  update(stats_.active, kLargePool, -1);
  update(stats_.requested_bytes, kLargePool, -static_cast<std::int64_t>(sb->requested));
  for (Block* b : range->pieces) {
    int p = stat_pool(b->segment);
    update(stats_.allocated_bytes, p, -static_cast<std::int64_t>(b->size));
    update(stats_.active_bytes, p, -static_cast<std::int64_t>(b->size));
    b->state = BlockState::kFree;
    b->lent_to = nullptr;
    b->stream = tag;  // kAnyStream if the caller waited for every stream that used it
    absorb_neighbours(b);
    insert_free(b);
  }
  stitched_.erase(range->addr);
  destroy_segment(range);
}

}  // namespace pyalloc
