// restore.cpp — bringing evicted storages back: replaying lineage, pinning what a user needs.
#include <ATen/ScalarOps.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>

#include "own_ops.h"
#include "registry.h"

namespace pyalloc::registry {
namespace {

// Note [Deep replays]: how many replays are nested on this thread now.
thread_local int t_replay_depth = 0;

// Runs `op` with `generator` set to the state `saved` for the call, and put back after.
// The generator's state is read and written under its mutex, as PyTorch's own callers
// do; the op itself takes the mutex, so it runs without it.
class GeneratorState {
 public:
  GeneratorState(at::Generator generator, const at::Generator& saved)
      : generator_(std::move(generator)) {
    at::Tensor state = saved.get_state();
    std::lock_guard<std::mutex> lock(generator_.mutex());
    current_ = generator_.clone();
    generator_.set_state(state);
  }
  ~GeneratorState() {
    at::Tensor state = current_.get_state();
    std::lock_guard<std::mutex> lock(generator_.mutex());
    generator_.set_state(state);
  }
  GeneratorState(const GeneratorState&) = delete;
  GeneratorState& operator=(const GeneratorState&) = delete;

 private:
  at::Generator generator_;
  at::Generator current_;
};

std::vector<at::Tensor> tensors_of(const torch::jit::Stack& stack) {
  std::vector<at::Tensor> out;
  for (const c10::IValue& v : stack) {
    if (v.isTensor()) out.push_back(v.toTensor());
    else if (v.isTensorList())
      for (const at::Tensor& t : v.toTensorList()) out.push_back(t);
  }
  return out;
}

// A Python number as PyTorch passes it to an op: a 0-dim CPU tensor marked as wrapped (so
// type promotion treats it as a number).
at::Tensor wrap_number(const c10::Scalar& number) {
  at::Tensor t = at::scalar_to_tensor(number);
  t.unsafeGetTensorImpl()->set_wrapped_number(true);
  return t;
}

// A copy of argument `value` with every tensor cloned (an argument a replay must not write).
c10::IValue cloned(const c10::IValue& value) {
  if (value.isTensor()) return value.toTensor().defined() ? value.toTensor().clone() : value;
  if (value.isTensorList()) {
    c10::List<at::Tensor> list = value.toTensorList().copy();
    for (std::size_t i = 0; i < list.size(); ++i)
      if (list.get(i).defined()) list.set(i, list.get(i).clone());
    return list;
  }
  return value;
}

// Note [Replaying one result of a backward op]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Backward formulas that make several gradients at once take a `bool[N] output_mask`
// (convolution_backward, native_batch_norm_backward, native_layer_norm_backward,
// native_group_norm_backward, ...): autograd asks for every gradient some edge needs. A
// replay restores one result, the node's storage, and drops the rest — but with the
// recorded mask it computed them all, and with them their scratch: on the CPU,
// mkldnn's weight gradient reorders the whole input into a buffer of the input's size.
// That is memory a restore needs on top of its rebuilt inputs and its result, at the
// moment memory is short. DenseNet at 0.4 of its peak under recompute first ran out of
// memory on exactly that: in backward, autograd summed a gradient into a slice of the
// evicted gradient of a 1x1 transition (a torch.cat's gradient, 8 MiB), whose replay of
// convolution_backward, with its dead input (the concatenation, 8 MiB) and its dead
// output gradient (4 MiB) rebuilt, asked for 8 MiB more for the weight gradient it then
// threw away. (That gradient is no longer dropped at all: Note [A restore needs its dead
// lineage's memory] in evict.cpp; the saving holds for every such replay.) So a creation
// step replayed for one result passes a mask with only that result set. Each gradient is computed by its own kernel from the same inputs, so the
// result kept is the same bits (the zoo's training-equivalence tests).
// Only where the mask has one entry per result and every result is a tensor, so that
// `Step::output` is the mask's index.
void narrow_output_mask(const c10::FunctionSchema& schema, torch::jit::Stack& stack,
                        std::uint32_t output) {
  const auto& returns = schema.returns();
  if (output >= returns.size()) return;
  for (const c10::Argument& r : returns)
    if (r.type()->kind() != c10::TypeKind::TensorType) return;
  const auto& args = schema.arguments();
  for (std::size_t i = 0; i < args.size() && i < stack.size(); ++i) {
    if (args[i].name() != "output_mask" || !stack[i].isBoolList()) continue;
    c10::List<bool> recorded = stack[i].toBoolList();
    if (recorded.size() != returns.size() || !recorded.get(output)) return;
    c10::List<bool> mask;
    for (std::size_t k = 0; k < recorded.size(); ++k) mask.push_back(k == output);
    stack[i] = mask;
    return;
  }
}

}  // namespace

void Registry::unpin_all_locked(c10::ArrayRef<Node*> nodes) {
  for (Node* node : nodes) unpin_locked(node);
}

// Pins `nodes` with every one of them resident, so nothing the caller needs is evicted
// while it runs. Evicted ones are restored *before* the resident ones are pinned: pinning
// first would hold every resident input along a recursive recompute (each level's dropout
// mask, say) at once, which is exactly the memory that is short. A restore may evict a
// node restored just before, so this repeats; after a few rounds it pins first.
void Registry::pin_all(Lock& lock, c10::ArrayRef<Node*> nodes) {
  for (int round = 0; round < 3; ++round) {
    for (Node* node : nodes) {
      if (!node->dead && !node->evicted && node->weak.expired()) mark_dead_locked(node);
      if (node->evicted) restore_now(lock, node);
    }
    if (std::none_of(nodes.begin(), nodes.end(), [](Node* n) { return n->evicted; })) {
      for (Node* node : nodes) {
        if (node->arriving) arrive_locked(node);
        pin_locked(node);
      }
      return;
    }
  }
  // Each node is pinned once, in one of two passes, resident ones first. The second pins
  // the rest whether or not they are still evicted then: restoring one may have restored
  // others it needed (a replay's inputs), which must be pinned all the same. A pass that
  // skipped them left them offered to the engine while the op ran: a packed bidirectional
  // LSTM's `cat` of its time steps read freed memory (a crash) under recompute at 0.6 of
  // its peak.
  pin_in_two_passes(lock, nodes, /*evicted_first=*/false);
}

// Note [Pinning inside replays]
// A replay's inputs are pinned as they are restored, with no rounds: pin_all's rounds
// unpin what they restored so that nothing is held along a recursive recompute, but inside
// a replay every level did that, and each level's restores evicted what the previous round
// had just brought back: the demo at 1.1x its batch-16 peak with batch 64 made 9,586
// evictions in 193 ops before a 40 s watchdog stopped it. First the evicted inputs are
// restored and pinned one by one (what a later restore could evict is only an input not
// yet pinned), then the rest are pinned, each restored first if a restore evicted it.
void Registry::pin_in_two_passes(Lock& lock, c10::ArrayRef<Node*> nodes, bool evicted_first) {
  NodeList pinned;
  c10::SmallVector<bool, 16> held(nodes.size(), false);
  try {
    for (int pass = 0; pass < 2; ++pass) {
      for (std::size_t i = 0; i < nodes.size(); ++i) {
        Node* node = nodes[i];
        if (held[i] || (pass == 0 && node->evicted != evicted_first)) continue;
        // A storage that died is noticed before it is pinned: in the first pass always,
        // in the second where restores came first (they run the program's ops).
        if ((pass == 0 || evicted_first) && !node->dead && !node->evicted &&
            node->weak.expired())
          mark_dead_locked(node);
        pin_locked(node);
        pinned.push_back(node);
        held[i] = true;
        if (node->evicted) restore(lock, node);
      }
    }
    for (Node* node : nodes)
      if (node->arriving) arrive_locked(node);
  } catch (...) {
    unpin_all_locked(pinned);
    throw;
  }
}

void Registry::restore_now(Lock& lock, Node* node) {
  pin_locked(node);
  try {
    restore(lock, node);
  } catch (...) {
    unpin_locked(node);
    throw;
  }
  unpin_locked(node);
}

at::Tensor Registry::view_of_locked(Node* node, const Ref& ref) {
  return tensor_on(node->storage(), ref.dtype, ref.sizes, ref.strides, ref.offset);
}

namespace {
// The view bits a Ref recorded (Ref::conj, Ref::neg), set on the tensor a replay rebuilt.
at::Tensor& with_view_bits(at::Tensor& t, const Ref& ref) {
  if (ref.conj) t.unsafeGetTensorImpl()->_set_conj(true);
  if (ref.neg) t.unsafeGetTensorImpl()->_set_neg(true);
  return t;
}
}  // namespace

std::vector<at::Tensor> Registry::replay(Lock& lock, const Step& step, Node* target,
                                        c10::intrusive_ptr<c10::StorageImpl> into,
                                        std::optional<std::uint32_t> only_output) {
  const Recording& rec = *step.rec;
  const Handle target_handle = target ? target->handle : 0;
  PinScope inputs(*this);
  NodeList needed;
  c10::SmallVector<const Ref*, 2> earlier;  // inputs read at a version they have left
  for (const Ref& ref : rec.refs) {
    if (ref.node == target_handle) continue;
    Node* node = find_locked(ref.node);
    TORCH_CHECK(node, "pyalloc: cannot recompute a tensor: an input it was made from was "
                      "forgotten. This is a registry bug; please report it.");
    if (node->version != ref.version) {
      TORCH_CHECK(ref.version < node->version && node->lineage() &&
                      node->version + 1 == node->steps.size(),
                  "pyalloc: cannot recompute a tensor: its input was modified in place after "
                  "it was recorded (version ", node->version, ", recorded ", ref.version,
                  "). This is a registry bug; please report it.");
      earlier.push_back(&ref);
      continue;
    }
    if (std::find(needed.begin(), needed.end(), node) == needed.end()) needed.push_back(node);
  }
  pin_in_two_passes(lock, needed, /*evicted_first=*/true);  // Note [Pinning inside replays]
  inputs.nodes = needed;
  // Inputs read at an earlier version: rebuilt apart from the node (See Note [Readers of
  // an earlier version] in writes.cpp), unless the node holds that version now, midway
  // through its own restore.
  c10::SmallVector<std::pair<const Ref*, c10::intrusive_ptr<c10::StorageImpl>>, 2> rebuilt;
  for (const Ref* ref : earlier) {
    Node* node = find_locked(ref->node);
    TORCH_CHECK(node, "pyalloc: cannot recompute a tensor: an input it was made from was "
                      "forgotten. This is a registry bug; please report it.");
    if (!node->evicted && node->partial == static_cast<std::int64_t>(ref->version)) {
      pin_locked(node);
      inputs.nodes.push_back(node);
      rebuilt.emplace_back(ref, node->storage());
    } else {
      rebuilt.emplace_back(ref, version_of(lock, node, ref->version));
    }
  }
  // The arguments, with each Ref rebuilt as a tensor on its (now resident) storage. Lists
  // are copied before an element is set: the recording's lists are shared.
  torch::jit::Stack stack(rec.args.begin(), rec.args.end());
  for (std::uint16_t arg : rec.wrapped) stack[arg] = wrap_number(stack[arg].toScalar());
  std::vector<std::uint16_t> copied;
  for (const Ref& ref : rec.refs) {
    at::Tensor t;
    auto found = std::find_if(rebuilt.begin(), rebuilt.end(),
                              [&](const auto& e) { return e.first == &ref; });
    if (found != rebuilt.end()) {
      t = tensor_on(found->second, ref.dtype, ref.sizes, ref.strides, ref.offset);
    } else if (ref.node == target_handle && into) {
      t = tensor_on(into, ref.dtype, ref.sizes, ref.strides, ref.offset);
    } else {
      t = view_of_locked(ref.node == target_handle ? target : find_locked(ref.node), ref);
    }
    with_view_bits(t, ref);
    c10::IValue& slot = stack[ref.arg];
    if (ref.element < 0) {
      slot = t;
      continue;
    }
    const bool fresh_copy =
        std::find(copied.begin(), copied.end(), ref.arg) == copied.end();
    if (fresh_copy) copied.push_back(ref.arg);
    if (slot.isTensorList()) {
      c10::List<at::Tensor> list = fresh_copy ? slot.toTensorList().copy() : slot.toTensorList();
      list.set(static_cast<std::size_t>(ref.element), t);
      slot = list;
    } else {
      c10::impl::GenericList list = fresh_copy ? slot.toList().copy() : slot.toList();
      list.set(static_cast<std::size_t>(ref.element), t);
      slot = list;
    }
  }
  if (only_output) narrow_output_mask(rec.op.schema(), stack, *only_output);
  // Arguments the op writes, other than the storage being rebuilt, are written on copies:
  // a replay never writes (say) batch norm's running statistics a second time.
  std::vector<std::uint16_t> to_clone;
  for (std::uint16_t pos : *rec.written) {
    const bool rebuilds_target = std::any_of(rec.refs.begin(), rec.refs.end(), [&](const Ref& r) {
      return r.arg == pos && r.node == target_handle && target_handle != 0;
    });
    if (!rebuilds_target && pos < stack.size()) to_clone.push_back(pos);
  }
  {
    Unlocked unlocked(lock);  // the op allocates: See Note [Calling out] in reclaim.cpp
    OwnOpGuard guard;
    for (std::uint16_t pos : to_clone) stack[pos] = cloned(stack[pos]);
    EvictableScope evictable(places_evictables());  // a replay rebuilds a node
    std::optional<GeneratorState> state;
    if (rec.rng && rec.generator) state.emplace(*rec.generator, rec.rng->generator());
    at::AutoGradMode grad_mode(rec.grad_mode);
    rec.op.callBoxed(stack);
  }
  ++replays_by_op_[rec.op.operator_name()];  // See Registry::replays_json
  return tensors_of(stack);
}

at::Tensor Registry::replay_creation(Lock& lock, const Step& step) {
  std::vector<at::Tensor> out = replay(lock, step, nullptr, {}, step.output);
  TORCH_CHECK(step.output < out.size() && out[step.output].defined(), "pyalloc: recomputing ",
              step.rec->op.schema().name(),
              " gave fewer results than recorded. This is a registry bug; please report it.");
  return out[step.output];
}

void Registry::install(Lock& lock, Node* node, const at::Tensor& fresh) {
  c10::StorageImpl* from = storage_of(fresh);
  c10::intrusive_ptr<c10::StorageImpl> s = node->storage();
  if (!s || node->dead) {
    // Dead: the replay's storage becomes the registry's own (Note [Who holds a storage]).
    adopt_locked(node, c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(from));
  } else if (from != s.get() && from->nbytes() == node->nbytes &&
             c10::raw::intrusive_ptr::use_count(from) == 1) {
    // Only the replay's result holds it: take its memory rather than copy.
    refuse_data_access(s.get(), /*evicted=*/false);
    s->set_data_ptr_noswap(std::move(from->mutable_data_ptr()));
    from->set_nbytes(0);
    s->set_nbytes(node->nbytes);
  } else {
    // Shared with another result of the op: copied, with the lock dropped (an allocation
    // and an op). The caller's pin keeps the node.
    c10::DataPtr data;
    {
      Unlocked unlocked(lock);
      {
        EvictableScope evictable(places_evictables());  // a node's storage
        data = node->allocator->allocate(node->nbytes);
      }
      auto spare = c10::make_intrusive<c10::StorageImpl>(
          c10::StorageImpl::use_byte_size_t(), node->nbytes, std::move(data), node->allocator,
          /*resizable=*/true);
      OwnOpGuard guard;
      copy_bytes(spare, c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(from), node->nbytes);
      data = std::move(spare->mutable_data_ptr());
    }
    refuse_data_access(s.get(), /*evicted=*/false);
    s->set_data_ptr_noswap(std::move(data));
    s->set_nbytes(node->nbytes);
  }
  node->evicted = false;
}

void Registry::restore(Lock& lock, Node* node) {
  check_interrupt();
  // A copy that fails leaves the host copy intact. Where there is no lineage to recompute
  // from (what a backward pass makes, under swap and hybrid: Note [Backward nodes]) it is
  // tried again before the op fails: a transformer under swap with one copy in twenty
  // refused lost a training step that way, where the next copy went through.
  constexpr int kSwapInAttempts = 3;
  for (int attempt = 1; node->clean && node->evicted; ++attempt) {
    try {
      swap_in(lock, node, /*wait=*/true, /*allocated=*/false);
      return;
    } catch (const c10::Error& e) {
      const bool oom = dynamic_cast<const c10::OutOfMemoryError*>(&e) != nullptr;
      if (!node->lineage() && !oom && attempt < kSwapInAttempts) continue;
      // Out of memory stays out of memory: a training loop that catches
      // torch.OutOfMemoryError (to skip a batch, or halve it) must see this one too.
      if (!node->lineage()) {
        const std::string what = c10::str(
            "pyalloc: cannot bring back a swapped-out tensor (", node->nbytes,
            " bytes) and it has no lineage to recompute it from: ", e.what_without_backtrace());
        TORCH_CHECK_WITH(OutOfMemoryError, !oom, what);
        TORCH_CHECK(false, what);
      }
      // Once: under a tight budget a hybrid run may fall back on every step.
      static std::atomic<bool> warned{false};
      if (!warned.exchange(true))
        std::fprintf(stderr, "pyalloc: warning: %s; recomputing the tensor instead (shown "
                     "once; later fallbacks are silent)\n", e.what_without_backtrace());
      break;
    }
  }
  if (!node->evicted) return;  // another thread restored it meanwhile
  TORCH_CHECK(node->lineage(), "pyalloc: an evicted tensor has no lineage left to recompute it "
                               "from (node ", node->handle, ", ", node->nbytes, " bytes",
              node->frozen ? ", frozen" : "", node->dead ? ", dead" : "",
              node->held ? ", held" : "", "). This is a registry bug; please report it.");
  // Counts a replay in `depth` while it runs.
  struct Nesting {
    int& depth;
    explicit Nesting(int& d) : depth(d) { ++depth; }
    ~Nesting() { --depth; }
  };
  const Nesting on_thread(t_replay_depth);  // See Note [Deep replays].
  TORCH_CHECK_WITH(OutOfMemoryError, t_replay_depth <= replay_give_up_.load(std::memory_order_relaxed),
                   "pyalloc: out of memory while recomputing an evicted tensor: rebuilding it "
                   "needed replays nested ", t_replay_depth, " deep, because each replay's inputs "
                   "were evicted again before it could run (the budget holds too little beside "
                   "what cannot leave). Raise the budget (option budget), or use policy swap or "
                   "hybrid, which bring activations back as copies.");
  if (t_replay_depth > replay_in_order_.load(std::memory_order_relaxed)) {
    restore_lineage_in_order(lock, node);
    if (!node->evicted) return;
  }
  const auto start = std::chrono::steady_clock::now();
  const c10::SmallVector<Step, 1> steps = node->steps;  // the node may gain steps while unlocked
  // Entered and left with the lock held (Unlocked takes it back before returning or throwing).
  const Nesting in_flight(replays_in_flight_);
  {
    const at::Tensor fresh = replay_creation(lock, steps.front());
    TORCH_CHECK(fresh.storage().nbytes() == node->nbytes, "pyalloc: recomputing ",
                steps.front().rec->op.schema().name(), " gave ", fresh.storage().nbytes(),
                " bytes, expected ", node->nbytes);
    if (!node->evicted) return;  // another thread restored it while this one replayed
    install(lock, node, fresh);
  }
  try {
    for (std::size_t i = 1; i < steps.size(); ++i) {  // in place
      node->partial = static_cast<std::int64_t>(i) - 1;
      replay(lock, steps[i], node);
    }
    node->partial = -1;
  } catch (...) {
    node->partial = -1;
    c10::intrusive_ptr<c10::StorageImpl> s = node->storage();
    if (s) free_data_locked(node, s.get());  // half restored is not restored
    node->evicted = true;
    throw;
  }
  ++counters_.recomputes;
  counters_.recompute_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(
                                std::chrono::steady_clock::now() - start).count();
}

// Note [Deep replays]
// ~~~~~~~~~~~~~~~~~~~~
// A replay restores its evicted inputs first, each by a replay of its own: the recursion
// is as deep as the chain of evicted nodes behind the tensor, and each level takes about
// 2.4 KB of the thread's stack. A residual MLP of 4,000 layers under recompute at 0.55 of
// its peak (tools/user_programs/deep_residual_mlp.py) rebuilt a gradient through 3,400
// evicted activations and crashed the process (a stack overflow: 8 MiB on the main thread,
// often less on others). So past 32 levels on a thread (replay_in_order_), a restore first
// walks back through the evicted lineage it needs (iteratively, its own stack on the heap)
// and restores those nodes one by one, oldest first: each finds its inputs resident and replays without recursing. The
// nodes come back unpinned, and a later one's replay pins what it reads, so what a deep
// chain holds at once is one replay's inputs and output, not the whole chain. Shallower
// chains (every zoo model's, where the deepest seen was 73) restore as before. Where memory
// is so short that restoring one node evicts what the next needs, the replays nest again;
// past 256 levels (replay_give_up_) the restore gives up with an out-of-memory error that names
// the cause, well before the stack would run out.
// Nodes with a host copy come back by a copy, and inputs read at an earlier version by
// version_of: both end the walk there (the replay that reads them takes them as before).
void Registry::restore_lineage_in_order(Lock& lock, Node* node) {
  const auto needs_replay = [](const Node* n) {
    return n->evicted && !n->clean && n->lineage();
  };
  struct Frame {
    Handle node;
    std::size_t step = 0, ref = 0;
  };
  std::vector<Frame> work{{node->handle}};
  ska::flat_hash_set<Handle> seen;
  seen.insert(node->handle);
  std::vector<Handle> order;  // inputs before their readers
  while (!work.empty()) {
    Frame& top = work.back();
    Node* n = find_locked(top.node);
    Node* next = nullptr;
    while (n && !next && top.step < n->steps.size()) {
      const Recording& rec = *n->steps[top.step].rec;
      if (top.ref >= rec.refs.size()) {
        ++top.step;
        top.ref = 0;
        continue;
      }
      const Ref& ref = rec.refs[top.ref++];
      Node* in = find_locked(ref.node);
      if (in && in != n && in->version == ref.version && needs_replay(in) &&
          seen.insert(in->handle).second)
        next = in;
    }
    if (next) {
      work.push_back({next->handle});  // `top` is not used after this
      continue;
    }
    if (top.node != node->handle) order.push_back(top.node);
    work.pop_back();
  }
  for (Handle h : order) {
    Node* n = find_locked(h);
    if (n && n->evicted) restore_now(lock, n);
  }
}

c10::intrusive_ptr<c10::StorageImpl> Registry::version_of(Lock& lock, Node* node,
                                                          std::uint32_t version) {
  const c10::SmallVector<Step, 1> steps(node->steps.begin(),
                                        node->steps.begin() + version + 1);
  c10::intrusive_ptr<c10::StorageImpl> storage = c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(
      storage_of(replay_creation(lock, steps.front())));
  for (std::size_t i = 1; i < steps.size(); ++i) replay(lock, steps[i], node, storage);
  ++counters_.recomputes;
  return storage;
}

void Registry::hold(const c10::StorageImpl* const* keys, std::size_t count,
                    Handle* handles, std::size_t* held) {
  Lock lock(mu_);
  Burial burial(*this, lock);
  *held = 0;
  if (!active_.load()) return;
  NodeList nodes;
  for (std::size_t i = 0; i < count; ++i) {
    Node* node = by_key_locked(keys[i]);
    if (node && std::find(nodes.begin(), nodes.end(), node) == nodes.end()) nodes.push_back(node);
  }
  pin_all(lock, nodes);  // all pinned, or none on a throw
  for (Node* node : nodes) handles[(*held)++] = node->handle;
}

void Registry::release(const Handle* handles, std::size_t count) {
  Lock lock(mu_);
  Burial burial(*this, lock);
  NodeList nodes;
  for (std::size_t i = 0; i < count; ++i)
    if (Node* node = find_locked(handles[i])) nodes.push_back(node);
  unpin_all_locked(nodes);
}

// Brings `node` back, freezes it and fixes it (never evicted, swapped or moved again): a
// storage whose bytes now belong to the program's business outside the dispatcher (Notes
// [Storages the program reads itself] and [Storages resized outside the dispatcher]).
void Registry::fix_now(Lock& lock, Node* node) {
  const Handle h = node->handle;
  {
    PinScope pins(*this);
    pin_all(lock, {node});
    pins.nodes.push_back(node);
  }
  if (!(node = find_locked(h))) return;
  freeze_now(lock, node);
  if ((node = find_locked(h)) && !node->fixed) {
    unmark_locked(node);
    node->fixed = true;
  }
}

// Note [Storages the program reads itself]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Some of PyTorch's Python API reads a storage's bytes without an op: copy.deepcopy and
// pickle (torch.save) take `tensor.untyped_storage()` and its nbytes() — 0 while evicted,
// so deepcopy made an empty copy and set_() failed — and `tolist()` reads the data pointer.
// `numpy()`, `__dlpack__` and `__cuda_array_interface__` go further: they hand the memory
// itself to another library, which reads it (and may write it) for as long as it keeps the
// array. While a policy runs, pyalloc/registry.py puts those methods behind a call here
// (Note [Storage access around the dispatcher] there): the node of `key`, if any,
// comes back first. An exported one (`fix`) is also frozen — settling what was recorded
// from it, since whatever holds the memory may write it unseen — and fixed: never evicted,
// swapped or moved again, as the other library needs its bytes where it was told they are.
void Registry::expose(const c10::StorageImpl* key, bool fix) {
  Lock lock(mu_);
  Burial burial(*this, lock);
  if (!active_.load()) return;
  Node* node = by_key_locked(key);
  if (!node || node->dead) return;
  if (fix) {
    fix_now(lock, node);
  } else {
    PinScope pins(*this);
    pin_all(lock, {node});
    pins.nodes.push_back(node);
  }
}

// Note [Storages resized outside the dispatcher]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// `tensor.untyped_storage().resize_(0)` frees a storage's memory with no op, and
// `resize_(n)` gives it back uninitialized: FSDP frees each layer's gathered parameters so
// after its forward and gathers them again before its backward, writing them with an op.
// That write settled what was recorded from the parameter (invalidate_readers) by replaying
// from what the storage held then — memory just allocated, not yet written — so under
// recompute an activation of the layer came back from garbage, silently. A resize is a
// write of everything the storage holds: pyalloc/registry.py calls this first (Note
// [Storage access around the dispatcher] there), and what was recorded from the storage is
// restored while it still holds what it read, then frozen. A node resized this way is
// brought back, frozen and fixed (its size is the program's business from then on).
void Registry::before_resize(const c10::StorageImpl* key) {
  Lock lock(mu_);
  Burial burial(*this, lock);
  if (!active_.load()) return;
  invalidate_leaf_readers(lock, key);
  Node* node = by_key_locked(key);
  if (!node || node->dead) return;
  const Handle h = node->handle;
  invalidate_readers(lock, key);
  if ((node = find_locked(h))) fix_now(lock, node);
}

void Registry::restore_all() {
  Lock lock(mu_);
  Burial burial(*this, lock);
  if (!active_.load()) return;
  std::vector<Handle> order;
  for (Node* node = nodes_.oldest(); node; node = node->newer) order.push_back(node->handle);
  for (Handle h : order) {  // oldest first: each chain is rebuilt front to back
    Node* node = find_locked(h);
    if (!node) continue;
    if (!node->dead && node->weak.expired()) mark_dead_locked(node);
    if (node->evicted && !node->dead && program_holds_locked(node)) restore_now(lock, node);
    if (node->arriving) arrive_locked(node);
  }
}

// Note [Replays that dominate an iteration]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Just above its least budget a model can train while recompute keeps evicting what it must
// bring back soon: on 2026-11-26 the zoo's GRU language model at 0.40-0.43 of its peak took
// 4-6 s a step against 0.07 s unconstrained, bit-identical and silent, and a user saw only a
// run slow for no reason given. So when an iteration (its outermost backward pass ended)
// restored by replay at least as many tensors as it ran ops, the registry says so, once per
// process, with the figures and what to change. A replay runs at least one op, so such an
// iteration computed about everything twice; with memory to spare nothing is replayed, and
// at half the peak a few percent of the ops are (the CNN 11 for 185 ops, ResNet-50 on an
// H100 29 for 584, GPT-2 small at four times stock's batch ~550 for ~1,700).
constexpr std::int64_t kReplaysPerOpToWarn = 1;

void Registry::warn_if_replays_dominate_locked() {
  const std::int64_t ops = counters_.ops - ops_at_iteration_;
  const std::int64_t replays = counters_.recomputes - recomputes_at_iteration_;
  ops_at_iteration_ = counters_.ops;
  recomputes_at_iteration_ = counters_.recomputes;
  static std::atomic<bool> warned{false};
  if (ops <= 0 || replays < kReplaysPerOpToWarn * ops || warned.exchange(true)) return;
  refresh_budget_locked();  // read when the engine last asked for victims: maybe since changed
  std::fprintf(stderr,
               "pyalloc: warning: the last training iteration recomputed %lld evicted tensors "
               "while it ran %lld ops: at this budget (%.1f MiB) recompute keeps evicting what "
               "it must soon bring back, so each step computes much of its work twice or more. "
               "Raise the budget or lower the batch size, or try policy=\"swap\" or "
               "\"hybrid\". (Shown once.)\n",
               static_cast<long long>(replays), static_cast<long long>(ops),
               static_cast<double>(budget_) / (1 << 20));
}

}  // namespace pyalloc::registry
