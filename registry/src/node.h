// node.h — what the registry keeps per storage: its lineage, where its bytes are, its pins.
//
// The unit is a storage (c10::StorageImpl), never a tensor: every view of a storage is
// evicted and restored with it, and tensors stay valid throughout (evicting frees the
// storage's data; restoring puts data back into the same StorageImpl).
#pragma once

#include <ATen/SparseCsrTensorImpl.h>
#include <ATen/SparseTensorImpl.h>
#include <ATen/core/Generator.h>
#include <ATen/core/TensorBase.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/SmallVector.h>
#include <c10/util/intrusive_ptr.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "rng.h"

namespace pyalloc::registry {

// Note [Efficient zero tensors]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// `at::_efficientzerotensor` (what forward-mode AD's formulas use for an undefined tangent:
// torch.func.jvp's of a captured weight, of a Python scalar) has a storage of the full size
// with no memory behind it (data nullptr); its kernels (ZeroTensor key) never read it, and a
// mul by one returns another. Taken for a storage, such a result became a node, and a
// replay that read it through a Ref rebuilt it as a plain tensor over the null pointer: the
// add that summed a JVP's two terms segfaulted in backward under recompute. A zero tensor
// has no storage here: never a node, kept by a recording as it is (a leaf that holds no
// memory).

// The storage of `t` (nullptr for an undefined tensor, one without storage, or a zero
// tensor). Reads the field directly: TensorImpl::has_storage() and storage() are virtual
// calls with checks, and the per-op path asks this of every argument.
inline c10::StorageImpl* storage_of(const at::TensorBase& t) {
  if (!t.defined()) return nullptr;
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  if (impl->key_set().has(c10::DispatchKey::ZeroTensor)) return nullptr;
  return impl->unsafe_storage().unsafeGetStorageImpl();
}

// Note [Sparse arguments]
// ~~~~~~~~~~~~~~~~~~~~~~~
// A sparse tensor has no storage of its own: its indices and values are dense tensors inside
// it, which its kernels read through the SparseTensorImpl, with no op. So an op that takes a
// sparse (COO or compressed) tensor reads its dense parts, and an op that writes one writes
// them: they are restored and pinned like any argument, and a write settles what was
// recorded from them (run_op).
// Where a part is a node (`nn.Embedding(sparse=True)`'s gradient wraps values made in
// backward), the op is not recorded: its replay would read that part through the sparse
// tensor, and nothing would restore it first (when it was evicted, the sparse kernel that
// summed two such gradients read it in place: "this tensor's memory was evicted by the
// registry"). Where no part is a node (a graph's adjacency), the sparse tensor is a plain
// argument: the op is recorded, its parts are the recording's leaves, and it keeps them in a
// sparse tensor of its own (detached_sparse_alias), so a part the program's tensor replaces
// later (sparse add_) stays the one the op read. Not recorded, the op made no node: the
// product of `torch.sparse.mm(adj, lin(x))` was a plain tensor, and `+ bias` after it, which
// saves nothing, held it as a leaf for as long as its own lineage lived, where plain
// PyTorch frees it when the layer returns. But lineage holds the parts as long as it lives,
// where the sparse tensor may be a temporary (`adj.t()` in sparse.mm's backward): as with
// Note [What plain inputs derive] in dispatch.cpp, a result is recorded only where it weighs
// at least twice the parts (record_creation_locked). A remembered fill that is a part is
// forgotten: a recording holds it as a leaf, never as a node.
// Calls `f` on `t`'s dense parts; false where `t` is no sparse tensor.
template <class F>
bool for_each_sparse_part(const at::TensorBase& t, F&& f) {
  switch (t.layout()) {
    case c10::kSparse: {
      const auto* impl = static_cast<const at::SparseTensorImpl*>(t.unsafeGetTensorImpl());
      f(impl->indices());
      f(impl->values());
      return true;
    }
    case c10::kSparseCsr:
    case c10::kSparseCsc:
    case c10::kSparseBsr:
    case c10::kSparseBsc: {
      const auto* impl = static_cast<const at::SparseCsrTensorImpl*>(t.unsafeGetTensorImpl());
      f(impl->compressed_indices());
      f(impl->plain_indices());
      f(impl->values());
      return true;
    }
    default:
      return false;
  }
}

// Calls fn(tensor) for each tensor in argument `v` (a tensor, a tensor list, a Tensor?[]).
template <typename Fn>
void for_each_tensor(const c10::IValue& v, Fn&& fn) {
  if (v.isTensor()) {
    fn(v.toTensor());
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList()) fn(t);
  } else if (v.isList() && !v.isIntList() && !v.isDoubleList() && !v.isBoolList()) {
    for (const c10::IValue& e : v.toListRef())
      if (e.isTensor()) fn(e.toTensor());
  }
}

// Note [Reads of evicted memory]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// An evicted storage has no data: its pointer is null and its size 0, while every tensor on
// it keeps its shape. Ops through the dispatcher never see that (the per-op path restores
// what they read first), but code outside it would read memory that is not there: a kernel
// launched on `tensor.data_ptr()` (Triton, a CUDA extension, ctypes), an op on a thread
// without the registry's key (Note [Threads the program starts] in pyalloc/registry.py). A
// null pointer read on the CPU is a segmentation fault; on a GPU an illegal address, which
// kills the context. Where PyTorch lets a storage refuse access to its data (its
// `throw_on_immutable_data_ptr_` flag with a message, which FakeTensor uses, and a way to
// clear it), an evicted storage sets it, so such an access raises a RuntimeError that says
// what happened and what to do, and restoring clears it. The registry reads the pointer
// through data_of(), which never throws. Where that torch lacks either call, nothing is set
// (the access reads a null pointer, as before).
namespace evicted_data {
template <typename S, typename = void>
struct Guards : std::false_type {};
template <typename S>
struct Guards<S, std::void_t<decltype(std::declval<S&>().clear_data_ptr_access_error_msg_()),
                             decltype(std::declval<S&>()._mutable_data_ptr_no_checks()),
                             decltype(std::declval<S&>().release_data_and_set_meta_custom_data_ptr_error_msg_(
                                 std::optional<std::string>()))>> : std::true_type {};
}  // namespace evicted_data
constexpr bool kEvictedDataRefuses = evicted_data::Guards<c10::StorageImpl>::value;

// What such an access raises.
extern const char* const kEvictedDataMessage;

// The storage's data pointer (null while evicted), without the access check. (Templates, so
// that the branch a torch lacks is never compiled.)
template <typename S>
inline void* data_of(const S* s) {
  if constexpr (evicted_data::Guards<S>::value) {
    return const_cast<S*>(s)->_mutable_data_ptr_no_checks().get();
  } else {
    return const_cast<void*>(s->data_ptr().get());
  }
}

// Sets (evicted) or clears (restored) the storage's refusal of access to its data.
template <typename S>
inline void refuse_data_access(S* s, bool evicted) {
  if constexpr (evicted_data::Guards<S>::value) {
    if (evicted) s->release_data_and_set_meta_custom_data_ptr_error_msg_(std::string(kEvictedDataMessage));
    else s->clear_data_ptr_access_error_msg_();
  }
}

// A node's name, and what the engine knows it by. Never 0 (the engine's "not evictable").
using Handle = std::uint64_t;

// An argument of a recorded op that was a registered storage. The recorded stack holds
// None in its place (so lineage never holds a program's tensor, nor the autograd graph
// behind it); replay builds a tensor with this geometry on the node's storage.
struct Ref {
  Handle node = 0;
  std::uint32_t version = 0;  // the node's version when the op was recorded
  std::int64_t offset = 0;
  c10::SmallVector<std::int64_t, 6> sizes;
  c10::SmallVector<std::int64_t, 6> strides;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  // The lazy conjugate and negative bits of the view (x.conj(), x.conj().imag): a view of
  // the same bytes that ops below the registry read conjugated or negated. Dropped, a
  // replay read x where the op had read conj(x): a complex network's weight gradient
  // (autograd's mm backward takes saved.conj()) came back wrong, silently.
  bool conj = false;
  bool neg = false;
  std::uint16_t arg = 0;      // which argument of the stack
  std::int32_t element = -1;  // which element of a tensor list (-1: the argument itself)
};

// One recorded op: `op(*args)` under the generator state it ran with, if it is random.
// Shared by every storage the op created.
struct Recording {
  explicit Recording(const c10::OperatorHandle& h) : op(h) {}
  c10::OperatorHandle op;
  c10::SmallVector<c10::IValue, 6> args;  // the arguments, with None where `refs` go
  c10::SmallVector<Ref, 2> refs;
  // Arguments that were Python numbers PyTorch wrapped as 0-dim tensors: kept as the
  // number (args holds a Scalar there) and wrapped again at replay.
  c10::SmallVector<std::uint16_t, 2> wrapped;
  std::optional<RngSnapshot> rng;          // the generator's state before the op (rng.h)
  std::optional<at::Generator> generator;  // the generator the op drew from
  double cost = 0;                         // in the cost model's unit (Registry::cost_of)
  // Argument positions the op writes (OpInfo::written, which lives as long as the process);
  // a replay writes only the storage it rebuilds and works on copies of the others (batch
  // norm's running statistics).
  const std::vector<std::uint16_t>* written = nullptr;
  // Grad mode when the op ran. Some kernels ask for it: mkldnn_rnn_layer (an LSTM on the
  // CPU) returns its workspace only with grad mode on, and a replay during backward, where
  // it is off, gave one result fewer than the forward recorded. A replay runs in the same
  // mode; it stays below autograd either way (Note [The registry's own ops]).
  bool grad_mode = false;
  // Registry::settle_visit_ when settle_costly_lineage_locked last counted its tensors (once
  // per walk, though every output of the op shares it); guarded by the registry's mutex.
  mutable std::uint64_t settle_visit = 0;
};

// One op of a storage's chain: its creation (output: which tensor of the op's results,
// counting tensors only, is the storage) or an in-place op applied to it later.
struct Step {
  std::shared_ptr<const Recording> rec;
  std::uint32_t output = 0;
};

// Note [Who holds a storage]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// The registry holds a node's storage weakly: when the program and autograd drop the last
// tensor on it, PyTorch frees its memory at once, as it would with no registry, and the
// node outlives it only as lineage (DTR's "eager eviction", with no sweep to wait for).
// Such a node is *dead*: its key leaves by_key, and when a reader's replay needs its
// contents they are rebuilt into a storage of the registry's own (`held`), which the
// program never sees. A node whose contents could not be rebuilt (frozen: no lineage) is
// held strongly while recorded ops read it, since nothing could bring it back.
//
// Invariants (Registry::check_invariants):
//   evicted            => the storage, if it lives, has no data (nbytes 0)
//   !evicted && !dead  => the program's storage lives and holds nbytes
//   dead               => key is not in by_key; held is the only storage (or null)
//   frozen             => steps is empty; never recomputed again
//   marked             => resident, not pinned, and offered to the engine as evictable
//   pins > 0           => resident (a pinned node is restored first and never evicted)
struct Node {
  Node(Handle h, const c10::Storage& s)
      : handle(h), weak(s.getWeakStorageImpl()), key(s.unsafeGetStorageImpl()),
        allocator(s.allocator()), nbytes(s.nbytes()), device(s.device()) {}

  Handle handle;
  c10::weak_intrusive_ptr<c10::StorageImpl> weak;  // the storage (the program's, or `held`)
  c10::intrusive_ptr<c10::StorageImpl> held;       // the registry's own reference, if any
  c10::StorageImpl* key;                           // by_key's key while not dead
  c10::Allocator* allocator;                       // what the storage allocates with
  std::size_t nbytes;
  c10::Device device;
  c10::SmallVector<Step, 1> steps;  // creation, then in-place steps; empty once frozen
  double cost = 0;                // bringing it back by replaying `steps`
  // The bytes of the dead nodes a replay rebuilds on the way, as `cost` counts their ops
  // (Note [A restore needs its dead lineage's memory] in evict.cpp).
  double dead_bytes = 0;
  std::uint32_t version = 0;      // in-place ops seen (with lineage: steps.size() - 1)
  std::int64_t partial = -1;      // midway through a restore: the version its data has
  bool stale_readers = false;     // read at an earlier version too (writes.cpp)
  c10::SmallVector<Handle, 2> readers;  // nodes recorded from the current contents
  int pins = 0;                   // ops and replays using it now
  std::uint64_t last_tick = 0;    // Registry::ticks_ at its last mark or touch
  std::uint64_t charge_visit = 0; // Registry::charge_visit_ when a death's walk last reached it
  // Dead, in epoch `frontier_epoch` of Registry::frontiers_: the nodes its death charged,
  // a range of it (Note [Charging a batch of deaths] in liveness.cpp).
  std::uint64_t frontier_epoch = 0;
  std::uint32_t frontier_begin = 0, frontier_end = 0;
  bool evicted = false;
  bool dead = false;              // the program's storage is gone (see above)
  bool frozen = false;            // lineage invalid: never recomputed again
  bool fixed = false;             // its data cannot be freed (not resizable)
  bool marked = false;            // offered to the engine as evictable
  bool backward = false;          // made in a backward pass (Note [Backward nodes])
  bool for_grad = false;          // may become a leaf's .grad (Note [Gradients bound for .grad])
  // Swapping (policy swap/hybrid).
  std::uint64_t slot = 0;         // the engine's host slot holding a copy, or 0
  bool clean = false;             // that copy equals the contents (no write since)
  bool arriving = false;          // resident, but the swap-in may still be in flight
  bool prefetched = false;        // brought back ahead of use, not used yet
  // Recompute with spill: too dear to replay, and the pool had no room for it; a victim of
  // last resort from then on (Note [Spilling under recompute] in evict.cpp).
  bool spill_refused = false;
  bool bwd_seen = false;          // backward has used it this iteration
  std::uint64_t iteration = 0;    // Registry::iterations_ when it was made
  std::int64_t ordinal = -1;      // creation index within the iteration (forward only)
  std::int64_t last_use_ns = 0;   // host clock of its last forward use (hybrid)
  std::int64_t waited_ns = 0;     // the engine's blocked time at that use
  Node* older = nullptr;          // creation order (NodeTable)
  Node* newer = nullptr;

  bool lineage() const { return !steps.empty(); }
  // Appends the nodes its lineage reads (each Ref's node but its own) to `out`.
  template <typename Handles>
  void append_inputs(Handles& out) const {
    for (const Step& step : steps)
      for (const Ref& ref : step.rec->refs)
        if (ref.node != handle) out.push_back(ref.node);
  }
  // The storage, if it still exists (the program's or the registry's): a strong reference,
  // for changing it.
  c10::intrusive_ptr<c10::StorageImpl> storage() const { return weak.lock(); }
  // The same for reading only: the weak reference keeps the object allocated, so this is
  // safe to read even when the program just let go of it (its data is then null).
  const c10::StorageImpl* peek() const { return dead ? held.get() : key; }
};

}  // namespace pyalloc::registry
