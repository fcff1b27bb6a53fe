// own_ops.h — running ops on the registry's own behalf: replays and storage copies.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <cstdint>
#include <vector>

namespace pyalloc::registry {

// The dispatch key the registry's fallback is registered on (dispatch.cpp).
constexpr c10::DispatchKey kRegistryKey = c10::DispatchKey::DeferredInit;

// Note [The registry's own ops]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// An op the registry runs itself — a replay, a copy between storages — must not be seen by
// the registry (it would be recorded), must not be autocast again (a recorded op is the
// one autocast already cast for), and must stay below autograd: no graph is built, and
// in-place replays on a storage's temporary views bump no version counter, so the
// program's tensors keep theirs (autograd's saved-tensor checks stay true).
class OwnOpGuard {
 public:
  OwnOpGuard()
      : excluded_(c10::DispatchKeySet(kRegistryKey) | c10::autocast_dispatch_keyset |
                  c10::autograd_dispatch_keyset_with_ADInplaceOrView) {}

 private:
  c10::impl::ExcludeDispatchKeyGuard excluded_;
};

// A tensor of `dtype` with the given geometry on `storage` (no op: a replay builds its
// inputs this way, on storages the registry restored).
at::Tensor tensor_on(const c10::intrusive_ptr<c10::StorageImpl>& storage, c10::ScalarType dtype,
                     c10::IntArrayRef sizes, c10::IntArrayRef strides, std::int64_t offset);

// Copies the first `nbytes` of `src` into `dst` on the current stream (an op, so run it
// unlocked and under OwnOpGuard).
void copy_bytes(const c10::intrusive_ptr<c10::StorageImpl>& dst,
                const c10::intrusive_ptr<c10::StorageImpl>& src, std::size_t nbytes);

}  // namespace pyalloc::registry
