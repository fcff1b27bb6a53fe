// pool_checks.cpp — the Pool examined: check_invariants() re-derives every identity of
// block.h and every statistic from the blocks, and snapshot_json() writes the layout.
#include <algorithm>
#include <cinttypes>
#include <cstdio>

#include "format.h"
#include "pool.h"

namespace pyalloc {
namespace {

const char* state_name(BlockState s) {
  switch (s) {
    case BlockState::kFree: return "inactive";
    case BlockState::kAllocated: return "active_allocated";
    case BlockState::kAwaitingEvents: return "active_awaiting_free";
    case BlockState::kLent: return "active_allocated";  // holds a stitched block's data
  }
  return "?";
}

}  // namespace

std::string Pool::check_invariants() const {
  Stats want;  // current figures recomputed from scratch
  std::size_t free_blocks = 0, allocated_blocks = 0;
  auto fail = [](const std::string& what, const Block* b) {
    return what + (b ? " (block " + format_address(b->addr) + ", " + std::to_string(b->size) + " bytes)" : "");
  };
  for (const auto& kv : segments_) {
    const Segment* seg = kv.second;
    if (kv.first != seg->addr) return fail("segment map key differs from segment address", nullptr);
    if (!seg->first || seg->first->addr != seg->addr || seg->first->prev) {
      return fail("segment " + format_address(seg->addr) + " does not start with its first block", seg->first);
    }
    int p = stat_pool(seg);
    want.segment[p].current++;
    want.reserved_bytes[p].current += static_cast<std::int64_t>(seg->size);
    std::size_t covered = 0;
    for (const Block* b = seg->first; b; b = b->next) {
      if (b->segment != seg) return fail("block points at the wrong segment", b);
      if (b->size == 0 || b->size % kMinBlockSize) return fail("block size not a multiple of 512", b);
      if (b->addr != seg->addr + covered) return fail("blocks do not tile their segment", b);
      if (b->next && b->next->prev != b) return fail("prev/next links are not mutual", b);
      covered += b->size;
      auto bytes = static_cast<std::int64_t>(b->size);
      switch (b->state) {
        case BlockState::kFree: {
          ++free_blocks;
          if (b->fast_cached) {
            bool listed = false;
            for (const Block* c = fast_heads_.find(b->size); c && !listed; c = c->fast_next) {
              listed = c == b;
            }
            if (b->fast_index >= fast_list_.size() || fast_list_[b->fast_index] != b || !listed) {
              return fail("cached free block missing from the exact-size cache", b);
            }
            auto mergeable = [b](const Block* n) {
              return n && n->state == BlockState::kFree && tags_compatible(b->stream, n->stream);
            };
            if (mergeable(b->prev) || mergeable(b->next) || !b->is_split()) {
              return fail("exact-size cache holds a block that could merge or is unsplit", b);
            }
          } else {
            const FreeSet& set = free_[static_cast<int>(seg->pool)];
            auto it = set.find(FreeEntry{b->stream, b->size, b->addr, nullptr});
            if (it == set.end() || it->block != b || b->free_pos != it) {
              return fail("free block missing from its free set", b);
            }
          }
          if (b->next && b->next->state == BlockState::kFree && tags_compatible(b->stream, b->next->stream)) {
            return fail("adjacent free blocks were not merged", b);
          }
          if (b->is_split()) {
            want.inactive_split[p].current++;
            want.inactive_split_bytes[p].current += bytes;
          }
          break;
        }
        case BlockState::kAllocated: {
          ++allocated_blocks;
          if (find_allocated(b->addr) != b) return fail("allocated block missing from the allocated map", b);
          if (b->requested > b->size) return fail("requested size exceeds block size", b);
          want.allocation[p].current++;
          want.allocated_bytes[p].current += bytes;
          want.requested_bytes[p].current += static_cast<std::int64_t>(b->requested);
          want.active[p].current++;
          want.active_bytes[p].current += bytes;
          break;
        }
        case BlockState::kAwaitingEvents:
          if (find_allocated(b->addr)) return fail("awaiting block is still in the allocated map", b);
          want.active[p].current++;
          want.active_bytes[p].current += bytes;
          break;
        case BlockState::kLent:
          if (!b->lent_to || !b->lent_to->segment->stitched ||
              stitched_.count(b->lent_to->segment->addr) == 0) {
            return fail("lent block does not belong to a live stitched range", b);
          }
          if (b->addr % kStitchChunk || b->size % kStitchChunk) return fail("lent block not chunk-aligned", b);
          want.allocated_bytes[p].current += bytes;
          want.active_bytes[p].current += bytes;
          break;
      }
    }
    if (covered != seg->size) return fail("block sizes do not add up to the segment size", seg->first);
    if (!seg->last || seg->last->next || seg->last->segment != seg) {
      return fail("segment " + format_address(seg->addr) + " does not end with its last block", seg->last);
    }
    if (seg->expandable ? seg->chunks.size() * seg->chunk_bytes != seg->size || seg->va_bytes < seg->size
                        : !seg->chunks.empty()) {
      return fail("segment " + format_address(seg->addr) + " maps " +
                  std::to_string(seg->chunks.size()) + " chunks for " + std::to_string(seg->size) +
                  " bytes", nullptr);
    }
  }
  for (const auto& kv : stitched_) {
    const Segment* range = kv.second;
    const Block* sb = range->first;
    if (!range->stitched || !sb || sb->next || sb->state != BlockState::kAllocated ||
        find_allocated(sb->addr) != sb) {
      return fail("stitched range is not one allocated block", sb);
    }
    std::size_t pieces = 0;
    for (const Block* b : range->pieces) {
      if (b->state != BlockState::kLent || b->lent_to != sb) return fail("stitched piece not lent to its block", b);
      pieces += b->size;
    }
    if (pieces != range->size) return fail("stitched pieces do not add up to the range", sb);
    ++allocated_blocks;
    want.allocation[kLargePool].current++;
    want.active[kLargePool].current++;
    want.requested_bytes[kLargePool].current += static_cast<std::int64_t>(sb->requested);
  }
  std::int64_t oversize_blocks = 0, oversize_segments = 0;
  for (const auto& kv : segments_) {
    if (is_oversize(kv.second->size)) ++oversize_segments;
    for (const Block* b = kv.second->first; b; b = b->next) {
      if (b->state == BlockState::kAllocated && is_oversize(b->size)) ++oversize_blocks;
    }
  }
  if (oversize_blocks != stats_.oversize_allocations.current ||
      oversize_segments != stats_.oversize_segments.current) {
    return "oversize_allocations/oversize_segments disagree with the blocks";
  }
  if (free_blocks != free_[0].size() + free_[1].size() + free_[2].size() + fast_list_.size()) {
    return "free sets or the exact-size cache hold blocks that are not free";
  }
  if (allocated_blocks != allocated_.size()) return "allocated map holds blocks that are not allocated";

  for (int p : {kSmallPool, kLargePool}) {
    for (Stat* s : {want.allocation, want.segment, want.active, want.inactive_split,
                    want.allocated_bytes, want.reserved_bytes, want.active_bytes,
                    want.inactive_split_bytes, want.requested_bytes}) {
      s[kAllPools].current += s[p].current;
    }
  }
  const char* kPoolNames[] = {"all", "small_pool", "large_pool"};
#define PYALLOC_CHECK_STAT(name, doc)                                                      \
  for (int p = 0; p < kStatPools; ++p) {                                                   \
    if (want.name[p].current != stats_.name[p].current) {                                  \
      return std::string("stat " #name ".") + kPoolNames[p] + ".current is " +             \
             std::to_string(stats_.name[p].current) + " but the blocks add up to " +       \
             std::to_string(want.name[p].current);                                          \
    }                                                                                      \
    if (stats_.name[p].peak < stats_.name[p].current) {                                    \
      return std::string("stat " #name ".") + kPoolNames[p] + " has peak below current";   \
    }                                                                                      \
  }
  PYALLOC_ARRAY_STATS(PYALLOC_CHECK_STAT)
#undef PYALLOC_CHECK_STAT
  return "";
}

std::string Pool::snapshot_json() const {
  std::string out = "{\"segments\":[";
  char buf[256];
  bool first_seg = true;
  for (const auto& kv : segments_) {
    const Segment* seg = kv.second;
    std::int64_t allocated = 0, active = 0;
    for (const Block* b = seg->first; b; b = b->next) {
      if (b->state == BlockState::kAllocated) allocated += static_cast<std::int64_t>(b->size);
      if (b->state != BlockState::kFree) active += static_cast<std::int64_t>(b->size);
    }
    std::snprintf(buf, sizeof buf,
                  "%s{\"address\":%" PRIuPTR ",\"total_size\":%zu,\"segment_type\":\"%s\","
                  "\"allocated_size\":%lld,\"active_size\":%lld,\"long_lived\":%s,"
                  "\"evictable_class\":%s,\"expandable\":%s,\"reserved_address_space\":%zu,\"blocks\":[",
                  first_seg ? "" : ",", seg->addr, seg->size,
                  seg->pool == PoolKind::kSmall ? "small"
                  : seg->pool == PoolKind::kLarge ? "large" : "persistent",
                  static_cast<long long>(allocated), static_cast<long long>(active),
                  seg->long_lived ? "true" : "false", seg->evictable ? "true" : "false",
                  seg->expandable ? "true" : "false",
                  seg->expandable ? seg->va_bytes : seg->size);
    out += buf;
    first_seg = false;
    for (const Block* b = seg->first; b; b = b->next) {
      long long stream = b->stream == kAnyStream ? -1 : static_cast<long long>(b->stream);
      std::snprintf(buf, sizeof buf,
                    "%s{\"address\":%" PRIuPTR ",\"size\":%zu,\"requested_size\":%zu,"
                    "\"state\":\"%s\",\"stream\":%lld,\"evictable\":%s}",
                    b == seg->first ? "" : ",", b->addr, b->size, b->requested,
                    state_name(b->state), stream, evictable(b) ? "true" : "false");
      out += buf;
    }
    out += "]}";
  }
  // Stitched ranges reserve nothing of their own: listed apart, with their pieces (which
  // the segments above show as allocated).
  out += "],\"stitched\":[";
  bool first_range = true;
  for (const auto& kv : stitched_) {
    const Block* sb = kv.second->first;
    long long stream = sb->stream == kAnyStream ? -1 : static_cast<long long>(sb->stream);
    std::snprintf(buf, sizeof buf,
                  "%s{\"address\":%" PRIuPTR ",\"size\":%zu,\"requested_size\":%zu,"
                  "\"stream\":%lld,\"evictable\":%s,\"pieces\":[",
                  first_range ? "" : ",", sb->addr, sb->size, sb->requested, stream,
                  evictable(sb) ? "true" : "false");
    out += buf;
    first_range = false;
    bool first_piece = true;
    for (const Block* b : kv.second->pieces) {
      std::snprintf(buf, sizeof buf, "%s[%" PRIuPTR ",%zu]", first_piece ? "" : ",", b->addr,
                    b->size);
      out += buf;
      first_piece = false;
    }
    out += "]}";
  }
  return out + "]}";
}

}  // namespace pyalloc
