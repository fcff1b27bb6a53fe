// swap.cpp — the swap and hybrid policies' per-op bookkeeping: host copies out and back,
// prefetch in the previous iteration's order, and what hybrid learns per iteration.
// The copies themselves are the engine's (allocator/src/swap.cpp).
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/engine.h>

#include <chrono>
#include <cstdio>

#include "registry.h"

namespace pyalloc::registry {

std::int64_t Registry::now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The compute stream the copies are ordered against: the current CUDA stream, or the
// simulated device's stream 0 (its work is synchronous).
std::uintptr_t Registry::compute_stream() const {
  if (settings_.device_type != c10::DeviceType::CUDA) return 0;
  const c10::Device device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(settings_.device_index));
  return reinterpret_cast<std::uintptr_t>(
      c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(device).native_handle());
}

bool Registry::swap_out_locked(Node* node) {
  const engine_api::Api& api = engine_api::api();
  c10::intrusive_ptr<c10::StorageImpl> s = node->storage();
  if (!s || !data_of(&*s)) return false;
  for (int attempt = 0; attempt < 2; ++attempt) {
    std::uint64_t slot = 0;
    const int rc = api.swap_out(engine_, data_of(&*s), node->nbytes, compute_stream(), &slot);
    if (rc == 0) {
      node->slot = slot;
      node->clean = true;
      ++counters_.swap_outs;
      counters_.swap_out_bytes += static_cast<std::int64_t>(node->nbytes);
      return true;
    }
    if (rc == PYALLOC_HOST_FULL) {
      if (attempt == 0 && shed_copies_locked(node->nbytes)) continue;  // clean copies made room
      ++counters_.swap_fallbacks;
      return false;
    }
    ++counters_.swap_failures;  // a copy the device refused: the tensor stays as it was
    std::fprintf(stderr, "pyalloc: warning: %s; the tensor is not copied out\n",
                 engine_api::last_error().c_str());
    return false;
  }
  return false;
}

bool Registry::allocate_data(Lock& lock, Node* node, bool may_evict) {
  c10::DataPtr data;
  {
    Unlocked unlocked(lock);
    const engine_api::Api& api = engine_api::api();
    if (!may_evict) api.set_thread_may_evict(0);
    try {
      data = node->allocator->allocate(node->nbytes);
    } catch (...) {
      if (!may_evict) api.set_thread_may_evict(1);
      if (may_evict) throw;  // torch.OutOfMemoryError for the caller
      return false;          // no room without evicting
    }
    if (!may_evict) api.set_thread_may_evict(1);
  }
  c10::intrusive_ptr<c10::StorageImpl> s = node->storage();
  if (!s || node->dead) {
    adopt_locked(node, c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(),
                                                             node->nbytes, std::move(data),
                                                             node->allocator, /*resizable=*/true));
  } else {
    refuse_data_access(s.get(), /*evicted=*/false);
    s->set_data_ptr_noswap(std::move(data));
    s->set_nbytes(node->nbytes);
  }
  return true;
}

void Registry::swap_in(Lock& lock, Node* node, bool wait, bool allocated) {
  if (!allocated) allocate_data(lock, node, /*may_evict=*/true);
  c10::intrusive_ptr<c10::StorageImpl> s = node->storage();
  const int rc = engine_api::api().swap_in(engine_, node->slot, data_of(&*s), compute_stream());
  if (rc != 0) {
    const std::string why = engine_api::last_error();
    free_data_locked(node, s.get());  // still evicted; the host copy is intact
    ++counters_.swap_failures;
    TORCH_CHECK(false, why);
  }
  node->evicted = false;
  ++counters_.swap_ins;
  counters_.swap_in_bytes += static_cast<std::int64_t>(node->nbytes);
  node->arriving = true;
  if (wait) arrive_locked(node);
}

// The compute stream waits for `node`'s swap-in (on the simulated device, the host does).
void Registry::arrive_locked(Node* node) {
  const engine_api::Api& api = engine_api::api();
  if (node->prefetched) {
    node->prefetched = false;
    ++counters_.prefetch_hits;
    if (api.swap_ready(engine_, node->slot) == 1) ++counters_.prefetch_ready;
  }
  const std::int64_t start = now_ns();
  api.swap_wait(engine_, node->slot, compute_stream());
  counters_.swap_wait_ns += now_ns() - start;
  node->arriving = false;
}

// Releases `node`'s host copy (its contents are about to change, or it is forgotten). Never
// for an evicted node that is still needed: that copy is its data.
void Registry::drop_copy_locked(Node* node) {
  if (!node->slot) return;
  engine_api::api().swap_release(engine_, node->slot);
  node->slot = 0;
  node->clean = false;
}

// Releases clean host copies of resident storages (they only save a copy) until `needed`
// bytes are freed; true if any was released.
bool Registry::shed_copies_locked(std::size_t needed) {
  std::size_t freed = 0;
  for (Node* node = nodes_.oldest(); node; node = node->newer) {
    if (!node->slot || node->evicted || node->arriving) continue;
    freed += node->nbytes;
    drop_copy_locked(node);
    if (node->marked) mark_locked(node);  // its cost went up
    if (freed >= needed) break;
  }
  return freed > 0;
}

// Starts bringing back the storages backward is expected to use after `node`: the previous
// iteration's order, else reverse creation order. Stops at the first that does not fit
// without evicting.
void Registry::prefetch_after(Lock& lock, Node* node) {
  if (node->ordinal < 0 || settings_.prefetch <= 0) return;
  std::vector<std::int64_t> ahead;
  auto pos = pos_prev_.find(node->ordinal);
  if (pos != pos_prev_.end()) {
    for (std::size_t i = pos->second + 1;
         i < order_prev_.size() && ahead.size() < static_cast<std::size_t>(settings_.prefetch); ++i)
      ahead.push_back(order_prev_[i]);
  } else {
    for (std::int64_t o = node->ordinal - 1; o >= 0 && node->ordinal - o <= settings_.prefetch; --o)
      ahead.push_back(o);
  }
  const std::size_t used_bytes = node->nbytes;
  for (std::int64_t ordinal : ahead) {
    auto it = by_ordinal_.find(ordinal);
    Node* other = it == by_ordinal_.end() ? nullptr : find_locked(it->second);
    if (!other || !other->evicted || !other->clean || other->pins) continue;
    // Room for it and as much again: backward's next allocations (the gradient of what was
    // just used, about its size) must not have to evict it again.
    std::uint64_t room = 0;
    engine_api::api().unallocated(engine_, &room);
    if (room < other->nbytes + used_bytes) return;
    const Handle handle = other->handle;
    pin_locked(other);
    const bool got = allocate_data(lock, other, /*may_evict=*/false);
    other = find_locked(handle);
    if (!other) return;
    if (!got) {
      unpin_locked(other);
      return;
    }
    try {
      swap_in(lock, other, /*wait=*/false, /*allocated=*/true);
    } catch (const c10::Error&) {
      unpin_locked(other);
      return;
    }
    other->prefetched = true;
    ++counters_.prefetches;
    unpin_locked(other);  // resident and clean: offered again, cheap to evict
  }
}

// Backward used `node`: learn the order and (hybrid) the gap from its last forward use,
// for the next iteration. (enter_backward_locked has arranged for the pass's end.)
void Registry::backward_use_locked(Node* node) {
  if (node->bwd_seen || node->ordinal < 0) return;
  node->bwd_seen = true;
  order_cur_.push_back(node->ordinal);
  if (node->last_use_ns) {  // compute time only: waits for copies would hide nothing
    const auto blocked = static_cast<std::int64_t>(engine_api::api().blocked_ns(engine_));
    gaps_cur_[{node->ordinal, node->nbytes}] =
        now_ns() - node->last_use_ns - (blocked - node->waited_ns);
  }
}

// The last backward pass ended: what it learned is next iteration's guide.
void Registry::end_iteration_locked() {
  in_backward_ = false;
  ++iterations_;
  warn_if_replays_dominate_locked();
  if (!order_cur_.empty()) {
    order_prev_.swap(order_cur_);
    order_cur_.clear();
    pos_prev_.clear();
    for (std::size_t i = 0; i < order_prev_.size(); ++i) pos_prev_[order_prev_[i]] = i;
    gaps_prev_.swap(gaps_cur_);
    gaps_cur_.clear();
  }
  ordinal_ = 0;
  by_ordinal_.clear();
}

}  // namespace pyalloc::registry
