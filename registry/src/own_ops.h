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

// Note [Thread-locals on the per-op path]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The shim is a library Python loads with dlopen, so by default each thread-local it reads
// is found through a call to __tls_get_addr: several an op on the per-op path. The few plain
// words read there on every op are instead in the initial-exec model, read at a fixed
// offset from the thread pointer. A library loaded with dlopen gets such space from the
// static TLS block's reserve, a few hundred bytes that glibc sets aside for this; these
// take 40 bytes, so the rest (strings, vectors, the op cache) stay in the default model.
#define PYALLOC_HOT_TLS __attribute__((tls_model("initial-exec")))

// Note [Re-entry through Python modes]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A Python dispatch mode (TorchDispatchMode) runs below the registry's key, but PyTorch
// runs it under the thread-local dispatch state it saved when the op first entered the
// dispatcher (DispatchKey::PythonTLSSnapshot, above the registry's key), when the key was
// still included and not yet excluded. So the ops a mode calls come back to the fallback
// although the registry excluded its key around the op: they would be recorded a second
// time, and one the registry runs while it holds its mutex (a copy into a storage) would
// deadlock on it. A thread-local depth, which no saved dispatch state restores, marks
// "below the registry": the fallback passes such ops straight through. (PyTorch 2.13
// instead runs a mode's __torch_dispatch__ with the functionality keys above Python,
// DeferredInit among them, in the exclude set, so there a mode's ops do not reach the
// registry at all: one that reads an evicted tensor the op does not take raises the
// evicted-memory error. docs/results/notebook.md, eighteenth session.)
inline int& below_registry_depth() {
  thread_local PYALLOC_HOT_TLS int depth = 0;
  return depth;
}

class BelowRegistry {
 public:
  BelowRegistry() { ++below_registry_depth(); }
  ~BelowRegistry() { --below_registry_depth(); }
  BelowRegistry(const BelowRegistry&) = delete;
  BelowRegistry& operator=(const BelowRegistry&) = delete;
};

// Note [The registry's own ops]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// An op the registry runs itself — a replay, a copy between storages — must not be seen by
// the registry (it would be recorded), must not be autocast again (a recorded op is the
// one autocast already cast for), and must stay below autograd: no graph is built, and
// in-place replays on a storage's temporary views bump no version counter, so the
// program's tensors keep theirs (autograd's saved-tensor checks stay true). Nor may the
// program's Python dispatch modes see it: a replay is no op of the program's. Selective
// activation checkpointing (`checkpoint(..., context_fn=create_selective_checkpoint_contexts
// (...))`) recomputes a region under a mode that hands back, for each op in order, what the
// forward saved: a replay run under it, to restore an input the registry had evicted, was
// taken for the region's next op and given a saved tensor of another size, and the region's
// own op then found nothing in its place (a wrong-size error, or PyTorch's "invocation index
// ... not found in storage"). Tensors the registry replays on are never subclasses (an op
// that takes one is not recorded), so leaving the Python keys out changes no kernel. Nor
// do vmap's modes apply to it: a backward under the legacy vmap mode
// (`autograd.grad(..., is_grads_batched=True)`, which `autograd.functional.jacobian(...,
// vectorize=True)` uses) includes VmapMode, whose kernel for every random op raises "We do
// not yet support calling random operations inside of vmap": the replay of an evicted
// dropout mask or `torch.rand` input failed there. A recorded op ran on plain tensors and is
// replayed on plain tensors, so functorch's layer modes are left out too.
class OwnOpGuard {
 public:
  OwnOpGuard()
      : excluded_(c10::DispatchKeySet(kRegistryKey) | c10::autocast_dispatch_keyset |
                  c10::autograd_dispatch_keyset_with_ADInplaceOrView |
                  c10::DispatchKeySet({c10::DispatchKey::Python,
                                       c10::DispatchKey::PythonTLSSnapshot,
                                       c10::DispatchKey::PreDispatch,
                                       c10::DispatchKey::VmapMode,
                                       c10::DispatchKey::FuncTorchDynamicLayerFrontMode,
                                       c10::DispatchKey::FuncTorchDynamicLayerBackMode})) {}

 private:
  c10::impl::ExcludeDispatchKeyGuard excluded_;
  BelowRegistry below_;  // See Note [Re-entry through Python modes]
};

// While alive (and `on`), the calling thread's allocations are storages the registry can
// evict: the engine places them apart from what stays (Note [Evictable placement] in
// allocator/src/pool.h). Restores the thread's previous class, so scopes nest.
class EvictableScope {
 public:
  explicit EvictableScope(bool on);
  ~EvictableScope();
  EvictableScope(const EvictableScope&) = delete;
  EvictableScope& operator=(const EvictableScope&) = delete;

 private:
  int was_ = -1;  // -1: nothing changed
};

// While alive, the calling thread's allocations that cannot be served fail quietly: an
// out-of-memory error all the same, but no OOM report, count or callback (the engine's
// set_thread_tentative). For work whose failure the registry handles and the program never
// sees. Restores the thread's previous setting, so scopes nest.
class TentativeScope {
 public:
  TentativeScope();
  ~TentativeScope();
  TentativeScope(const TentativeScope&) = delete;
  TentativeScope& operator=(const TentativeScope&) = delete;

 private:
  int was_;
};

// A tensor of `dtype` with the given geometry on `storage` (no op: a replay builds its
// inputs this way, on storages the registry restored).
at::Tensor tensor_on(const c10::intrusive_ptr<c10::StorageImpl>& storage, c10::ScalarType dtype,
                     c10::IntArrayRef sizes, c10::IntArrayRef strides, std::int64_t offset);

// A tensor on `storage` with `t`'s dtype, geometry and conjugate and negative bits (no op).
at::Tensor same_view_on(const c10::intrusive_ptr<c10::StorageImpl>& storage, const at::Tensor& t);

// `t` without its autograd history: a tensor on the same storage with the same geometry
// (and conjugate and negative bits), made without an op. Tensor::variable_data() would do,
// but it may call into Python (a Python mode's detach), and the registry needs this while
// it holds its mutex, where nothing may dispatch.
at::Tensor detached_alias(const at::Tensor& t);

// The same for a sparse tensor: a sparse tensor of its own on the same parts (their
// tensors, not copies), without autograd history. A part the program's sparse tensor
// later replaces stays this one's. See Note [Sparse arguments] in node.h.
at::Tensor detached_sparse_alias(const at::Tensor& t);

// Copies the first `nbytes` of `src` into `dst` on the current stream (an op, so run it
// unlocked and under OwnOpGuard).
void copy_bytes(const c10::intrusive_ptr<c10::StorageImpl>& dst,
                const c10::intrusive_ptr<c10::StorageImpl>& src, std::size_t nbytes);

}  // namespace pyalloc::registry
