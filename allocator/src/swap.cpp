// swap.cpp — the host pool, and the engine's swap operations (see swap.h for the ordering).
#include <algorithm>
#include <iterator>
#include <string>
#include <utility>

#include "engine.h"

namespace pyalloc {

// ---------------------------------------------------------------------------------------
// HostPool
// ---------------------------------------------------------------------------------------

void HostPool::adopt(char* base, std::size_t capacity) {
  base_ = base;
  capacity_ = capacity;
  used_ = 0;
  by_offset_.clear();
  by_size_.clear();
  by_offset_.emplace(0, capacity);
  by_size_.emplace(capacity, 0);
}

std::size_t HostPool::largest_free() const {
  return by_size_.empty() ? 0 : by_size_.rbegin()->first;
}

bool HostPool::allocate(std::size_t bytes, std::size_t* offset) {
  const std::size_t rounded = HostPool::rounded(bytes);
  auto it = by_size_.lower_bound({rounded, 0});
  if (rounded == 0 || it == by_size_.end()) return false;
  const auto [size, at] = *it;
  by_size_.erase(it);
  by_offset_.erase(at);
  if (size > rounded) {
    by_offset_.emplace(at + rounded, size - rounded);
    by_size_.emplace(size - rounded, at + rounded);
  }
  used_ += rounded;
  *offset = at;
  return true;
}

void HostPool::release(std::size_t offset, std::size_t bytes) {
  const std::size_t rounded = HostPool::rounded(bytes);
  used_ -= rounded;
  std::size_t start = offset, size = rounded;
  auto next = by_offset_.lower_bound(offset);
  if (next != by_offset_.begin()) {  // merge with the free range just before
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      start = prev->first;
      size += prev->second;
      by_size_.erase({prev->second, prev->first});
      by_offset_.erase(prev);
    }
  }
  if (next != by_offset_.end() && next->first == offset + rounded) {  // and just after
    size += next->second;
    by_size_.erase({next->second, next->first});
    by_offset_.erase(next);
  }
  by_offset_.emplace(start, size);
  by_size_.emplace(size, start);
}

// ---------------------------------------------------------------------------------------
// Engine: swap operations
// ---------------------------------------------------------------------------------------

namespace {

// What record_stream does: the block is reused only after `stream` passes the free.
void add_stream_use(Block* block, StreamId stream) {
  if (stream == block->stream) return;
  for (StreamId s : block->stream_uses) {
    if (s == stream) return;
  }
  block->stream_uses.push_back(stream);
}

}  // namespace

// Note [A host pool made at first use]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Under policy recompute the host pool only takes what cannot be recomputed within the
// budget (option spill; Note [Spilling under recompute] in registry/src/evict.cpp), which
// most programs never meet, and then often far less than its size. Allocated whole when
// the policy starts, it would pin host memory on CUDA (cuMemHostAlloc: RAM taken from
// everything else, and a pause that synchronizes the device) for every program that turns
// recompute on, as much as the budget each. So the registry gives its size at start, and
// the engine reserves that much address space at the first swap_out (under the engine's
// lock, once) and makes it usable piece by piece as copies reach further into it
// (Backend::host_commit: cuMemHostRegister on CUDA, in pieces of a 32nd of the pool and at
// least 64 MiB, so a pool grows in a bounded number of pauses; nothing on the simulated
// device, whose reserve the kernel commits as it is touched). Best fit hands out the low
// end first, so what is usable follows the most the program has spilled at once.
// Should the reserve fail, the first swap_out says why, and every later one is refused as
// a full pool would be; should a piece fail to commit (the host is short of memory it can
// pin), that swap_out says why and the pool grows no further. Either way the victim stays,
// or is recomputed, and training goes on with what the pool has.
constexpr std::size_t kMinHostChunk = std::size_t{64} << 20;

Status Engine::allocate_host_pool_locked(std::size_t bytes, bool grows) {
  bytes = (bytes + HostPool::kAlign - 1) / HostPool::kAlign * HostPool::kAlign;
  void* base = grows ? backend_->host_reserve(bytes) : backend_->host_alloc(bytes);
  if (!base) {
    return Status::invalid("could not allocate a host pool of " + format_bytes(bytes) +
                           " for swapping: " + backend_->last_error() +
                           "; lower the option host_pool");
  }
  host_pool_.adopt(static_cast<char*>(base), bytes);
  host_pool_chunk_ = grows ? HostPool::rounded(std::max(kMinHostChunk, bytes / 32)) : 0;
  host_pool_committed_ = grows ? 0 : bytes;
  return Status();
}

bool Engine::grow_host_pool_locked(std::size_t end, std::string* why) {
  if (end <= host_pool_committed_) return true;
  if (host_pool_growth_failed_) {
    *why = "it could not grow past " + format_bytes(host_pool_committed_) + " earlier";
    return false;
  }
  while (host_pool_committed_ < end) {
    const std::size_t piece =
        std::min(host_pool_chunk_, host_pool_.capacity() - host_pool_committed_);
    if (!backend_->host_commit(host_pool_.base(), host_pool_committed_, piece)) {
      host_pool_growth_failed_ = true;
      *why = "growing it to " + format_bytes(host_pool_committed_ + piece) + " failed: " +
             backend_->last_error();
      return false;
    }
    host_pool_committed_ += piece;
  }
  return true;
}

Status Engine::set_host_pool(std::size_t bytes, bool at_first_use) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (host_pool_.base() || host_pool_deferred_) return Status();
  if (bytes < HostPool::kAlign) {
    return Status::invalid("host pool of " + std::to_string(bytes) +
                           " bytes is too small: give at least 4 KiB "
                           "(option host_pool)");
  }
  if (at_first_use) {
    host_pool_deferred_ = bytes;
    return Status();
  }
  return allocate_host_pool_locked(bytes, /*grows=*/false);
}

Status Engine::ensure_swap_streams_locked() {
  if (to_host_stream_ && to_device_stream_) return Status();
  if (!to_host_stream_) to_host_stream_ = backend_->create_stream();
  if (!to_device_stream_) to_device_stream_ = backend_->create_stream();
  if (to_host_stream_ && to_device_stream_) return Status();
  return Status(Status::kCopyFailed,
                "could not create the swap copy streams: " + backend_->last_error());
}

bool Engine::order_after_locked(StreamId copy_stream, StreamId compute) {
  EventId ready = acquire_event_locked();
  const bool ok = backend_->record_event(ready, compute) &&
                  backend_->stream_wait_event(copy_stream, ready);
  spare_events_.push_back(ready);  // the wait captured the recorded point
  return ok;
}

void Engine::mark_done_locked(EventId* event, StreamId copy_stream) {
  if (!*event) *event = acquire_event_locked();
  if (!backend_->record_event(*event, copy_stream)) {
    backend_->synchronize_stream(copy_stream);  // no event: make the copy complete now
    spare_events_.push_back(*event);
    *event = 0;
  }
}

SwapSlot* Engine::find_slot_locked(std::uint64_t slot, const char* what, Status* status) {
  auto it = slots_.find(slot);
  if (it != slots_.end()) return &it->second;
  *status = Status::invalid(std::string(what) + ": unknown swap slot " + std::to_string(slot) +
                            " (never returned by swap_out, or already released)");
  return nullptr;
}

std::string Engine::host_pool_report_locked() const {
  return "host pool " + format_bytes(host_pool_.used()) + " used of " +
         format_bytes(host_pool_.capacity()) + " (" +
         (host_pool_chunk_ ? format_bytes(host_pool_committed_) + " of it usable so far, "
                           : std::string()) +
         std::to_string(slots_.size()) + " swapped copies, largest free range " +
         format_bytes(host_pool_.largest_free()) + ")";
}

Status Engine::swap_out(void* ptr, std::size_t bytes, StreamId compute, std::uint64_t* slot_id) {
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(mutex_);
  Block* block = pool_.find_allocated(addr);
  if (!block) {
    return Status(Status::kInvalid, "swap_out of " + format_address(addr) +
                                        ": no live block starts there (" +
                                        pool_.describe_unknown_pointer(addr) + ")");
  }
  if (bytes == 0 || bytes > block->size) {
    return Status(Status::kInvalid,
                  "swap_out of " + format_address(addr) + ": " + std::to_string(bytes) +
                      " bytes asked, but the block holds " + std::to_string(block->size));
  }
  if (!host_pool_.base() && host_pool_deferred_) {  // Note [A host pool made at first use]
    const std::size_t deferred = std::exchange(host_pool_deferred_, 0);
    if (Status made = allocate_host_pool_locked(deferred, /*grows=*/true); !made.ok()) {
      host_pool_failure_ = made.message();
      return Status(Status::kCopyFailed, made.message());
    }
  }
  if (!host_pool_.base() && !host_pool_failure_.empty()) {
    ++pool_.stats().num_host_pool_full;
    return Status(Status::kHostPoolFull, "swap_out of " + format_bytes(bytes) +
                                             ": no host pool (" + host_pool_failure_ + ")");
  }
  if (!host_pool_.base()) {
    return Status(Status::kInvalid,
                  "swap_out: this engine has no host pool; set one first (option host_pool, or "
                  "policy swap/hybrid, which sets it up)");
  }
  if (Status streams = ensure_swap_streams_locked(); !streams.ok()) return streams;
  std::size_t offset = 0;
  bool placed = host_pool_.allocate(bytes, &offset);
  // Released slots whose copies are still in flight hold ranges: take those that are
  // done, then wait for the rest before giving up.
  for (bool wait : {false, true}) {
    if (placed || releasing_.empty()) break;
    BlockedTimer timer(blocked_ns_);
    reap_slots_locked(wait);
    placed = host_pool_.allocate(bytes, &offset);
  }
  if (!placed) {
    ++pool_.stats().num_host_pool_full;
    return Status(Status::kHostPoolFull, "swap_out of " + format_bytes(bytes) + ": the " +
                                             host_pool_report_locked() +
                                             " has no room; raise the option host_pool");
  }
  const bool grew_before = !host_pool_growth_failed_;
  if (std::string why; !grow_host_pool_locked(offset + HostPool::rounded(bytes), &why)) {
    host_pool_.release(offset, bytes);
    const bool first = grew_before;  // the failure is said once; later refusals are quiet
    if (!first) ++pool_.stats().num_host_pool_full;
    return Status(first ? Status::kCopyFailed : Status::kHostPoolFull,
                  "swap_out of " + format_bytes(bytes) + ": the host pool made at first use " +
                      "has " + format_bytes(host_pool_committed_) + " usable and " + why +
                      "; set the option host_pool lower, or free host memory");
  }
  // The copy reads what the compute stream wrote: start it after that work.
  bool ok = order_after_locked(to_host_stream_, compute);
  ok = ok && backend_->memcpy_async(host_pool_.base() + offset, ptr, bytes,
                                    CopyKind::kDeviceToHost, to_host_stream_);
  if (!ok) {
    host_pool_.release(offset, bytes);
    ++pool_.stats().num_swap_failures;
    return Status(Status::kCopyFailed,
                  "swap_out of " + format_bytes(bytes) + " at " + format_address(addr) +
                      " failed: " + backend_->last_error() + ". The block was left as it was");
  }
  SwapSlot slot;
  slot.offset = offset;
  slot.bytes = bytes;
  mark_done_locked(&slot.out_done, to_host_stream_);
  add_stream_use(block, to_host_stream_);
  const std::uint64_t id = next_slot_++;
  slots_.emplace(id, slot);
  Stats& s = pool_.stats();
  ++s.num_swap_outs;
  s.num_swap_out_bytes += static_cast<std::int64_t>(bytes);
  s.host_pool_used_bytes.increase(static_cast<std::int64_t>(HostPool::rounded(bytes)));
  *slot_id = id;
  return Status();
}

Status Engine::swap_in(std::uint64_t slot_id, void* ptr, StreamId compute) {
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(mutex_);
  Status status;
  SwapSlot* slot = find_slot_locked(slot_id, "swap_in", &status);
  if (!slot) return status;
  Block* block = pool_.find_allocated(addr);
  if (!block) {
    return Status(Status::kInvalid, "swap_in to " + format_address(addr) +
                                        ": no live block starts there (" +
                                        pool_.describe_unknown_pointer(addr) + ")");
  }
  if (block->size < slot->bytes) {
    return Status(Status::kInvalid, "swap_in of " + std::to_string(slot->bytes) + " bytes to " +
                                        format_address(addr) + ": the block holds only " +
                                        std::to_string(block->size));
  }
  if (Status streams = ensure_swap_streams_locked(); !streams.ok()) return streams;
  // The destination may have been freed on the compute stream with work still queued, and
  // the host copy may still be arriving from the swap-out: wait for both.
  bool ok = order_after_locked(to_device_stream_, compute);
  if (ok && slot->out_done) ok = backend_->stream_wait_event(to_device_stream_, slot->out_done);
  ok = ok && backend_->memcpy_async(ptr, host_pool_.base() + slot->offset, slot->bytes,
                                    CopyKind::kHostToDevice, to_device_stream_);
  if (!ok) {
    ++pool_.stats().num_swap_failures;
    return Status(Status::kCopyFailed,
                  "swap_in of " + format_bytes(slot->bytes) + " to " + format_address(addr) +
                      " failed: " + backend_->last_error() + ". The host copy (slot " +
                      std::to_string(slot_id) + ") is intact");
  }
  mark_done_locked(&slot->in_done, to_device_stream_);
  add_stream_use(block, to_device_stream_);
  Stats& s = pool_.stats();
  ++s.num_swap_ins;
  s.num_swap_in_bytes += static_cast<std::int64_t>(slot->bytes);
  return Status();
}

Status Engine::swap_wait(std::uint64_t slot_id, StreamId compute) {
  EventId in_done;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Status status;
    SwapSlot* slot = find_slot_locked(slot_id, "swap_wait", &status);
    if (!slot) return status;
    in_done = slot->in_done;
  }
  // Outside the lock: on the simulated device's stream 0 this blocks until the copy is
  // done, and other threads' allocations need not wait for it. The slot (and its event)
  // belong to the caller, who does not release it concurrently.
  BlockedTimer timer(blocked_ns_);   // nothing on CUDA; the copy's wait on stream 0 here
  if (in_done && !backend_->stream_wait_event(compute, in_done)) {
    return Status::invalid("swap_wait: " + backend_->last_error());
  }
  return Status();
}

bool Engine::swap_ready(std::uint64_t slot_id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = slots_.find(slot_id);
  if (it == slots_.end()) return true;
  const SwapSlot& slot = it->second;
  return (!slot.out_done || backend_->query_event(slot.out_done)) &&
         (!slot.in_done || backend_->query_event(slot.in_done));
}

Status Engine::swap_release(std::uint64_t slot_id) {
  std::lock_guard<std::mutex> lock(mutex_);
  Status status;
  SwapSlot* slot = find_slot_locked(slot_id, "swap_release", &status);
  if (!slot) return status;
  releasing_.push_back(*slot);
  slots_.erase(slot_id);
  reap_slots_locked(/*wait=*/false);
  return Status();
}

void Engine::reap_slots_locked(bool wait) {
  std::size_t kept = 0;
  for (std::size_t i = 0; i < releasing_.size(); ++i) {
    SwapSlot& slot = releasing_[i];
    bool done = true;
    for (EventId e : {slot.out_done, slot.in_done}) {
      if (!e) continue;
      if (wait) backend_->synchronize_event(e);
      else if (!backend_->query_event(e)) done = false;
    }
    if (!done) {
      if (kept != i) releasing_[kept] = slot;
      ++kept;
      continue;
    }
    for (EventId e : {slot.out_done, slot.in_done}) {
      if (e) spare_events_.push_back(e);
    }
    host_pool_.release(slot.offset, slot.bytes);
    pool_.stats().host_pool_used_bytes.decrease(
        static_cast<std::int64_t>(HostPool::rounded(slot.bytes)));
  }
  releasing_.resize(kept);
}

StreamId Engine::swap_stream(bool to_host) {
  std::lock_guard<std::mutex> lock(mutex_);
  // 0 when the streams cannot be created: the caller (a test) checks.
  (void)ensure_swap_streams_locked();
  return to_host ? to_host_stream_ : to_device_stream_;
}

}  // namespace pyalloc
