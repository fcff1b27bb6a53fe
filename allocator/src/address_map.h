// address_map.h — address -> Block* for the blocks handed out (the lookup every free does),
// and size -> Block* for the exact-size cache: any 512-byte-aligned nonzero key.
//
// Open addressing with linear probing and backward-shift deletion: no node per entry and
// no division, which std::unordered_map spends on every operation. Addresses are
// 512-byte aligned, so the low 9 bits carry no information and are shifted out before
// hashing. Load factor is kept at or below 1/2.
//
// Thread safety: none; guarded by the owning Engine's lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace pyalloc {

struct Block;

class AddressMap {
 public:
  AddressMap() : slots_(1024) {}

  Block* find(std::uintptr_t key) const {
    for (std::size_t i = index(key);; i = (i + 1) & mask()) {
      const Slot& s = slots_[i];
      if (s.key == key) return s.value;
      if (s.key == 0) return nullptr;
    }
  }

  void insert(std::uintptr_t key, Block* value) {  // key must be absent and nonzero
    if (2 * (size_ + 1) > slots_.size()) grow();
    place(key, value);
    ++size_;
  }

  // Inserts or updates.
  void assign(std::uintptr_t key, Block* value) {
    for (std::size_t i = index(key);; i = (i + 1) & mask()) {
      if (slots_[i].key == key) {
        slots_[i].value = value;
        return;
      }
      if (slots_[i].key == 0) break;
    }
    insert(key, value);
  }

  bool erase(std::uintptr_t key) {
    std::size_t i = index(key);
    while (slots_[i].key != key) {
      if (slots_[i].key == 0) return false;
      i = (i + 1) & mask();
    }
    // Backward-shift: pull later entries of the probe run into the hole, so lookups
    // never need tombstones.
    std::size_t hole = i;
    for (std::size_t j = (i + 1) & mask(); slots_[j].key != 0; j = (j + 1) & mask()) {
      std::size_t home = index(slots_[j].key);
      // Move j into the hole unless its home lies cyclically in (hole, j].
      bool stays = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
      if (!stays) {
        slots_[hole] = slots_[j];
        hole = j;
      }
    }
    slots_[hole] = Slot{};
    --size_;
    return true;
  }

  std::size_t size() const { return size_; }

 private:
  struct Slot {
    std::uintptr_t key = 0;
    Block* value = nullptr;
  };

  std::size_t mask() const { return slots_.size() - 1; }
  std::size_t index(std::uintptr_t key) const {
    return static_cast<std::size_t>(((key >> 9) * 0x9E3779B97F4A7C15ull) >> 20) & mask();
  }
  void place(std::uintptr_t key, Block* value) {
    std::size_t i = index(key);
    while (slots_[i].key != 0) i = (i + 1) & mask();
    slots_[i] = Slot{key, value};
  }
  void grow() {
    std::vector<Slot> old(slots_.size() * 2);
    old.swap(slots_);
    for (const Slot& s : old) {
      if (s.key) place(s.key, s.value);
    }
  }

  std::vector<Slot> slots_;  // size is a power of two
  std::size_t size_ = 0;
};

}  // namespace pyalloc
