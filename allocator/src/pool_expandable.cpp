// pool_expandable.cpp — the Pool's expandable segments: one segment per pool that grows by
// mapping chunks at its end and gives free chunks at its end back (Note [Expandable
// segments] in pool.h).
#include <algorithm>
#include <cinttypes>
#include <cstdio>

#include "format.h"
#include "pool.h"

namespace pyalloc {

Block* Pool::add_expandable(std::uintptr_t addr, std::size_t va_bytes, PoolKind kind,
                            std::vector<PhysicalHandle> chunks, std::size_t chunk) {
  Block* b = add_segment(addr, chunks.size() * chunk, kind, PhysicalHandle{});
  Segment* seg = b->segment;
  seg->expandable = true;
  seg->va_bytes = va_bytes;
  seg->chunk_bytes = chunk;
  seg->chunks = std::move(chunks);
  expandable_[static_cast<int>(kind)] = seg;
  return b;
}

Block* Pool::extend(Segment* seg, std::vector<PhysicalHandle> chunks, std::size_t chunk,
                    StreamId stream) {
  const std::size_t bytes = chunks.size() * chunk;
  const bool was_oversize = is_oversize(seg->size);
  seg->chunks.insert(seg->chunks.end(), chunks.begin(), chunks.end());
  Block* tail = seg->last;
  if (tail->state == BlockState::kFree && (tail->stream == stream || tail->stream == kAnyStream)) {
    erase_free(tail);
    tail->size += bytes;  // the fresh chunks are idle: the tail keeps its tag
  } else {
    Block* fresh = new_block();
    fresh->addr = seg->addr + seg->size;
    fresh->size = bytes;
    fresh->segment = seg;
    fresh->prev = tail;
    // Next to a free block of another stream an idle block would merge into it and take
    // its tag; tagged with the requesting stream (always safe) it stays apart.
    const bool tail_free = tail->state == BlockState::kFree;
    fresh->stream = tail_free ? stream : kAnyStream;
    if (tail_free) erase_free(tail);  // it becomes split: re-file it (inactive_split)
    tail->next = fresh;
    if (tail_free) insert_free(tail);
    seg->last = tail = fresh;
  }
  seg->size += bytes;
  insert_free(tail);
  if (!was_oversize && is_oversize(seg->size)) stats_.oversize_segments.increase(1);
  update(stats_.reserved_bytes, stat_pool(seg), static_cast<std::int64_t>(bytes));
  return tail;
}

std::size_t Pool::trimmable(const Segment* seg, std::size_t chunk) const {
  const Block* tail = seg->last;
  if (!seg->expandable || tail->state != BlockState::kFree || tail == seg->first ||
      is_graph_pool_tag(tail->stream))
    return 0;
  return seg->addr + seg->size - round_up(tail->addr, chunk);
}

std::vector<PhysicalHandle> Pool::trim(Segment* seg, std::size_t bytes, std::size_t chunk) {
  Block* tail = seg->last;
  const bool was_oversize = is_oversize(seg->size);
  erase_free(tail);
  if (bytes < tail->size) {
    tail->size -= bytes;
    insert_free(tail);
  } else {  // the tail began at a chunk boundary: it goes whole
    Block* prev = tail->prev;
    const bool prev_free = prev->state == BlockState::kFree;
    if (prev_free) erase_free(prev);  // it may become unsplit: re-file it (inactive_split)
    seg->last = prev;
    prev->next = nullptr;
    delete_block(tail);
    if (prev_free) insert_free(prev);
  }
  seg->size -= bytes;
  if (was_oversize && !is_oversize(seg->size)) stats_.oversize_segments.decrease(1);
  update(stats_.reserved_bytes, stat_pool(seg), -static_cast<std::int64_t>(bytes));
  const auto keep = static_cast<std::ptrdiff_t>(seg->size / chunk);
  std::vector<PhysicalHandle> out(seg->chunks.begin() + keep, seg->chunks.end());
  seg->chunks.resize(static_cast<std::size_t>(keep));
  return out;
}

}  // namespace pyalloc
