// node_pool.h — recycling of the small objects the pool churns through on every call.
//
// Each malloc/free pair inserts and erases free-set nodes, an allocated-map node, and,
// when blocks split or merge, Block objects. Taking each from the C++ heap cost about
// half of a malloc/free pair (measured with tools/bench_alloc.py); recycling them
// through free lists removes that cost.
//
// Thread safety: none for a NodeFreeList, which belongs to one Pool and is used only under
// the owning Engine's lock. A LockedFreeList has a spin lock of its own, for objects released
// from any thread (the registry's recordings: registry/src/registry.h).
//
// Header-only and free of torch: the torch-built registry uses it too.
#pragma once

#include <atomic>
#include <cstddef>
#include <new>
#include <thread>
#include <vector>

namespace pyalloc {

// Free list of equally sized chunks. Chunks are carved from 64 KiB slabs that live as
// long as the list; nothing is returned to the heap before that.
class NodeFreeList {
 public:
  NodeFreeList() = default;
  NodeFreeList(const NodeFreeList&) = delete;
  NodeFreeList& operator=(const NodeFreeList&) = delete;
  ~NodeFreeList() {
    for (void* slab : slabs_) ::operator delete(slab);
  }

  void* get(std::size_t bytes) {
    if (chunk_ == 0) chunk_ = round(bytes);
    if (round(bytes) != chunk_) return ::operator new(bytes);  // a different node type
    if (!head_) refill();
    void* p = head_;
    head_ = *static_cast<void**>(p);
    return p;
  }
  void put(void* p, std::size_t bytes) {
    if (round(bytes) != chunk_) return ::operator delete(p);
    *static_cast<void**>(p) = head_;
    head_ = p;
  }

 private:
  static std::size_t round(std::size_t n) {
    const std::size_t a = alignof(std::max_align_t);
    n = n < sizeof(void*) ? sizeof(void*) : n;
    return (n + a - 1) / a * a;
  }
  void refill() {
    constexpr std::size_t kSlab = 64 << 10;
    char* slab = static_cast<char*>(::operator new(kSlab));
    slabs_.push_back(slab);
    for (std::size_t off = 0; off + chunk_ <= kSlab; off += chunk_) {
      *reinterpret_cast<void**>(slab + off) = head_;
      head_ = slab + off;
    }
  }

  std::size_t chunk_ = 0;
  void* head_ = nullptr;
  std::vector<void*> slabs_;
};

// A NodeFreeList behind a spin lock. Its critical sections are a few pointer moves, taken
// once per recorded op and once per recording released, almost never by two threads at
// once (the program's and autograd's take turns), so a mutex's two library calls per
// section were the larger part of its cost. A waiter yields, so a holder that was
// descheduled is not spun against for long.
class LockedFreeList {
 public:
  void* get(std::size_t bytes) {
    Hold hold(busy_);
    return list_.get(bytes);
  }
  void put(void* p, std::size_t bytes) {
    Hold hold(busy_);
    list_.put(p, bytes);
  }

 private:
  class Hold {
   public:
    explicit Hold(std::atomic<bool>& busy) : busy_(busy) {
      while (busy_.exchange(true, std::memory_order_acquire))
        while (busy_.load(std::memory_order_relaxed)) std::this_thread::yield();
    }
    ~Hold() { busy_.store(false, std::memory_order_release); }
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;

   private:
    std::atomic<bool>& busy_;
  };
  std::atomic<bool> busy_{false};
  NodeFreeList list_;  // guarded by busy_
};

// A std allocator over a free list, for node-based containers (std::set,
// std::unordered_map) and std::allocate_shared. Multi-element requests (hash buckets) go
// to the heap.
template <typename T, typename List = NodeFreeList>
struct PooledAllocator {
  using value_type = T;
  List* list;

  explicit PooledAllocator(List* l) : list(l) {}
  template <typename U>
  PooledAllocator(const PooledAllocator<U, List>& other) : list(other.list) {}

  T* allocate(std::size_t n) {
    if (n != 1) return static_cast<T*>(::operator new(n * sizeof(T)));
    return static_cast<T*>(list->get(sizeof(T)));
  }
  void deallocate(T* p, std::size_t n) {
    if (n != 1) return ::operator delete(p);
    list->put(p, sizeof(T));
  }
  template <typename U>
  bool operator==(const PooledAllocator<U, List>& o) const { return list == o.list; }
  template <typename U>
  bool operator!=(const PooledAllocator<U, List>& o) const { return list != o.list; }
};

}  // namespace pyalloc
