// node_table.h — the registry's nodes: found by handle in O(1), kept in creation order,
// and made and unmade without a heap allocation each (one per op is on the per-op path).
//
// Handles are (generation << 32) | slot. A slot is reused by a later node with the next
// generation, so a stale handle — the engine may offer one after its node was forgotten —
// finds nothing. Generations start at 1, so no handle is 0 (the engine's "not evictable").
//
// Thread safety: none; the owning Registry's mutex guards it.
#pragma once

#include <cstdint>
#include <new>
#include <vector>

#include "node.h"

namespace pyalloc::registry {

class NodeTable {
 public:
  NodeTable() = default;
  ~NodeTable() {
    clear();
    for (Node* chunk : chunks_) ::operator delete(static_cast<void*>(chunk));
  }
  NodeTable(const NodeTable&) = delete;
  NodeTable& operator=(const NodeTable&) = delete;

  // A new node for `storage`, the newest.
  Node* create(const c10::Storage& storage) {
    std::uint32_t slot;
    if (!free_slots_.empty()) {
      slot = free_slots_.back();
      free_slots_.pop_back();
    } else {
      slot = static_cast<std::uint32_t>(slots_.size());
      slots_.push_back(Slot{});
    }
    Slot& s = slots_[slot];
    if (++s.generation == 0) s.generation = 1;
    Node* node = new (take_memory()) Node((Handle{s.generation} << 32) | slot, storage);
    s.node = node;
    node->older = newest_;
    (newest_ ? newest_->newer : oldest_) = node;
    newest_ = node;
    ++size_;
    return node;
  }

  void destroy(Node* node) {
    (node->older ? node->older->newer : oldest_) = node->newer;
    (node->newer ? node->newer->older : newest_) = node->older;
    const auto slot = static_cast<std::uint32_t>(node->handle);
    slots_[slot].node = nullptr;
    free_slots_.push_back(slot);
    node->~Node();
    free_memory_.push_back(node);
    --size_;
  }

  Node* find(Handle handle) const {
    const auto slot = static_cast<std::uint32_t>(handle);
    if (slot >= slots_.size()) return nullptr;
    Node* node = slots_[slot].node;
    return node && node->handle == handle ? node : nullptr;
  }

  Node* oldest() const { return oldest_; }
  Node* newest() const { return newest_; }
  std::size_t size() const { return size_; }
  void clear() {
    while (oldest_) destroy(oldest_);
  }

 private:
  static constexpr std::size_t kChunk = 64;  // nodes per allocation

  void* take_memory() {
    if (free_memory_.empty()) {
      Node* chunk = static_cast<Node*>(::operator new(sizeof(Node) * kChunk));
      chunks_.push_back(chunk);
      for (std::size_t i = kChunk; i-- > 0;) free_memory_.push_back(chunk + i);
    }
    Node* mem = free_memory_.back();
    free_memory_.pop_back();
    return mem;
  }

  struct Slot {
    Node* node = nullptr;
    std::uint32_t generation = 0;
  };
  std::vector<Slot> slots_;
  std::vector<std::uint32_t> free_slots_;
  std::vector<Node*> free_memory_;  // raw memory of destroyed nodes
  std::vector<Node*> chunks_;
  Node* oldest_ = nullptr;
  Node* newest_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace pyalloc::registry
