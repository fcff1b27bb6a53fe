// swap.h — host copies of device blocks: the host pool and the swap slots.
//
// Swapping moves a block's contents to host memory so the device block can be reused,
// and back when the contents are needed. The copies run asynchronously on two dedicated
// streams the engine creates (device-to-host and host-to-device), so they overlap with
// compute. The engine methods are in swap.cpp; the ordering rules are:
//
//   swap-out  the D2H stream waits for the compute stream's work so far (an event), then
//             copies into a host slot. The device block gets the D2H stream as a user
//             (record_stream), so when the caller frees it, the engine does not reuse it
//             until the copy has completed: a stream-ordered free.
//   swap-in   the H2D stream waits for the compute stream's work so far (the destination
//             block may have just been freed there) and for the slot's swap-out, then
//             copies. The block gets the H2D stream as a user too. Nothing on the compute
//             stream reads the block until swap_wait() made it wait for the copy — a
//             separate call, so that a prefetch can start the copy long before the use.
//   release   a slot's host range is reused only once its copies have completed.
//
// The host pool is one allocation made once (pinned on CUDA, so copies are truly async
// and run at full bandwidth; PyTorch's pinned caching allocator rounds to powers of two
// and synchronizes when it grows, both of which a swap path must avoid), carved by best
// fit with coalescing. Nothing on the swap path allocates host memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <utility>

#include "backend.h"

namespace pyalloc {

// Offsets into one host allocation. Not thread safe: the engine lock guards it.
class HostPool {
 public:
  static constexpr std::size_t kAlign = 4096;
  // What a request of `bytes` takes from the pool.
  static std::size_t rounded(std::size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

  // Takes ownership of [base, base + capacity), which the backend allocated.
  void adopt(char* base, std::size_t capacity);
  char* base() const { return base_; }
  std::size_t capacity() const { return capacity_; }
  std::size_t used() const { return used_; }
  std::size_t largest_free() const;
  // Best fit; returns false when no free range holds `bytes` (rounded to kAlign).
  bool allocate(std::size_t bytes, std::size_t* offset);
  void release(std::size_t offset, std::size_t bytes);

 private:
  char* base_ = nullptr;
  std::size_t capacity_ = 0;
  std::size_t used_ = 0;
  std::map<std::size_t, std::size_t> by_offset_;            // free: offset -> size
  std::set<std::pair<std::size_t, std::size_t>> by_size_;   // free: (size, offset)
};

// One swapped-out copy.
struct SwapSlot {
  std::size_t offset = 0;   // into the host pool
  std::size_t bytes = 0;    // as requested (the pool holds HostPool::rounded(bytes))
  EventId out_done = 0;     // recorded on the D2H stream after the copy out
  EventId in_done = 0;      // recorded on the H2D stream after the last copy in (0: none yet)
};

}  // namespace pyalloc
