// recording_pool.h — memory for Recordings (node.h), one per recorded op.
//
// A step's Recording is allocated when its op is recorded and released when the last node
// made by it is forgotten, a hundred or more at a time at the end of a step: that pattern
// overflows malloc's per-thread caches, and showed as the most expensive part of recording
// an op. Freed blocks are kept on a free list instead. It has a lock of its own: a
// Recording is released wherever its last reference goes, which is deliberately not under
// the registry's mutex (See Note [Releasing outside the lock] in registry.h).
#pragma once

#include <cstddef>
#include <mutex>
#include <new>
#include <vector>

namespace pyalloc::registry {

class BlockPool {
 public:
  BlockPool() = default;
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;
  ~BlockPool() {
    for (void* p : free_) ::operator delete(p);
  }
  void* take(std::size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (block_ == 0) block_ = bytes;
      if (bytes == block_ && !free_.empty()) {
        void* p = free_.back();
        free_.pop_back();
        return p;
      }
    }
    return ::operator new(bytes);
  }
  void give(void* p, std::size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (bytes == block_ && free_.size() < kMaxFree) {
        free_.push_back(p);
        return;
      }
    }
    ::operator delete(p);
  }

 private:
  static constexpr std::size_t kMaxFree = 1 << 16;  // ~40 MiB of Recordings at most
  std::mutex mu_;
  std::size_t block_ = 0;    // guarded by mu_: the one size pooled (the first asked for)
  std::vector<void*> free_;  // guarded by mu_
};

// The allocator std::allocate_shared uses for a Recording and its control block.
template <typename T>
struct PoolAllocator {
  using value_type = T;
  explicit PoolAllocator(BlockPool* p) : pool(p) {}
  template <typename U>
  PoolAllocator(const PoolAllocator<U>& other) : pool(other.pool) {}
  T* allocate(std::size_t n) { return static_cast<T*>(pool->take(sizeof(T) * n)); }
  void deallocate(T* p, std::size_t n) { pool->give(p, sizeof(T) * n); }
  template <typename U>
  bool operator==(const PoolAllocator<U>& other) const { return pool == other.pool; }
  template <typename U>
  bool operator!=(const PoolAllocator<U>& other) const { return pool != other.pool; }
  BlockPool* pool;
};

}  // namespace pyalloc::registry
