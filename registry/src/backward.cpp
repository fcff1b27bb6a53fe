// backward.cpp — what a backward pass creates: recorded like forward activations while the
// pass runs, settled when it ends.
//
// Note [Backward nodes]
// ~~~~~~~~~~~~~~~~~~~~~
// Inside an autograd graph task with grad mode off (a plain backward()), nothing requires
// grad, so the forward rule ("an op on tensors that require grad makes an activation")
// records nothing: the gradients with respect to activations and what the loss's backward
// makes would sit on the device as storages no one can evict. Backward, at its peak, holds
// the gradients of a whole layer's activations at once, so a model that was 0.3 of its peak
// in forward stayed at 0.6-0.7 in backward. So inside a graph task every op on the managed
// device that makes a new storage is recorded, from whatever it reads, like a forward op:
// gradients are as replayable as activations (same kernels, same inputs; nothing in
// backward draws random numbers except through the generator state already recorded).
//
// A backward node lives only as long as its pass. What survives the pass is what the
// program keeps: a parameter's .grad (AccumulateGrad takes the gradient's own storage when
// .grad is None), the results of torch.autograd.grad. Those must not be recomputed from a
// chain through the pass's dead intermediates, nor evicted while the optimizer reads them,
// so when the pass ends (a final callback queued on its graph task by its first op) the
// survivors are brought back if evicted, frozen and forgotten (they become plain storages,
// like parameters), and the pass's dead nodes go with the lineage only survivors needed
// (except in a pass that builds a graph: Note [Passes that build a graph]). A pass that ends by an exception runs no final callback: the owner thread's first op
// outside any graph task settles what such passes left.
//
// With lineage under recompute only. Under swap and hybrid what the pass makes is a node
// without lineage (record_bare_locked: frozen from the start, no recording, no readers), so
// it leaves only as a host copy and comes back by one: recorded with lineage, a gradient
// was read again within the pass, soon, so a copy had no gap to hide in and the
// prefetcher, which follows the last iteration's forward order, did not know it; and
// recomputing it meant replaying forward activations those policies had just swapped out
// (measured on the CNN at 0.35 of its peak: the prefetch hit rate fell from 54% to 48%, and
// with a 4 MiB host pool the replays of dead chains took turns evicting each other until
// the budget ran out). Not recorded at all, a backward-heavy peak could not be served (a
// WGAN-GP critic's second backward at half its peak). Frozen after being recorded, the
// nodes its ops read were held by the registry (nothing could rebuild them) and the
// unconstrained peak grew 20-32%; nothing in a plain pass records a reader of a bare
// node, so nothing holds it.
//
// Note [Passes that build a graph]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A pass with create_graph=True (a gradient penalty, double backward, MAML) runs its ops
// with grad mode on: they are recorded by the forward rule, and what survives the pass is
// not only what the program keeps but what the new graph saved for the next backward —
// activations of a second forward, as many as the first's. Frozen and forgotten like a
// plain pass's survivors, none of it could ever leave (a WGAN-GP critic at half its peak:
// 22 MiB of such storages at the out-of-memory error in the penalty's backward, 6 MiB
// evictable). So a survivor whose op ran with grad mode on stays a node, as a forward
// activation does, lineage and all: its chain reads what the pass read (the first graph's
// saved tensors, kept alive by create_graph's retain_graph, or their dead lineage) and
// replays with grad mode on, bit for bit. The program's own results (autograd.grad's, a
// .grad with a graph) are such nodes too, and evictable like any activation it holds.
//
// Note [Passes inside a pass]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// torch.utils.checkpoint with use_reentrant=True (the default of many training scripts and
// of older Hugging Face gradient checkpointing) runs, inside the outer backward pass, the
// block's forward again and then a backward of its own: a second graph task, on the same
// thread, that ends long before the outer one. What survives it is mostly the gradient
// with respect to the block's input, which the checkpoint hands back to the outer pass as
// the gradient flowing on — a whole activation's worth per block. Frozen and forgotten at
// the inner pass's end, like the .grad a plain pass leaves, each of those sat on the device
// as a storage no one could evict until the outer pass let it go (a six-block MLP with two
// reentrant checkpoints at half its peak: out of memory in backward with such storages
// among what could not leave). So a pass that begins while the thread's previous op ran in
// another pass that is still open is taken to run inside it, and when it ends its
// survivors are handed to that pass, nodes with their lineage, settled when it ends (a
// parameter's .grad made inside is frozen then, before the optimizer reads it). Its dead
// nodes that nothing reads go at once, as at any pass's end.
//
// Note [Survivors that stay evicted]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Where the pass's end finds no room to bring a survivor back, it stays a node, evicted,
// and the optimizer's read brings it back. Forgotten like the others (a bare node is frozen
// from the start), its contents went with its host copy: a residual MLP of 500 layers under
// swap at half its peak lost ten weight gradients that way, and `opt.step()` stopped on
// the evicted-memory error (tools/user_programs/deep_residual_mlp.py).
//
// What a backward recording keeps as a leaf (not a node) is what existed before the pass:
// parameters, inputs, targets, forward tensors too small to be nodes; they are held until
// the pass ends at the latest.
//
// Note [Gradients bound for .grad]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A parameter's gradient is a backward node until its pass ends, and then it must be
// resident: the pass's end brings it back and freezes it (above), or, where there is no room
// then, the optimizer's first read does. Evicted in the middle of the pass, it comes back by
// a replay through the pass's dead gradients and the forward activations they read, dead by
// then too: the zoo's MobileNet at half its peak evicted such gradients and replayed them on
// every step (264 evictions and 331 recomputes a step); where the pass's end found no room,
// the optimizer's read of such a gradient replayed 28 deep. So a backward node made while
// autograd runs an AccumulateGrad (a tensor hook on a parameter) or a node with an edge into
// one (the node whose outputs include a parameter's gradient) is a victim of last resort, as
// a node whose dead lineage outweighs a share of the budget is (Note [A restore needs its
// dead lineage's memory] in evict.cpp), for as long as its pass runs: a survivor of a pass
// that builds a graph stays a node and is an ordinary victim again. The test is by node, not
// by output: a layer's backward makes the gradient with respect to its input in the same node
// (AddmmBackward, ConvolutionBackward), and that gradient is bound for the layer before, not
// for a .grad; it becomes a victim of last resort too. Measured with tools/bench_remat.py
// (window, the zoo with the CNN and the transformer): every least budget unchanged;
// MobileNet at half its peak 264 -> 87 evictions and 331 -> 89 recomputes a step, and its step
// 2.09x -> 1.34x the unconstrained one (same VM, one after the other).
#include <Python.h>  // first, as Python asks; Note [Python's references under the registry's mutex]

#include <c10/util/Exception.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "own_ops.h"
#include "registry.h"

namespace pyalloc::registry {
namespace {

// Holds the GIL for its scope where Python runs and is not shutting down; nothing otherwise.
class GilFirst {
 public:
  GilFirst() {
#if PY_VERSION_HEX >= 0x030D0000
    const bool finalizing = Py_IsFinalizing();
#else
    const bool finalizing = _Py_IsFinalizing();
#endif
    if (Py_IsInitialized() && !finalizing) {
      state_ = PyGILState_Ensure();
      held_ = true;
    }
  }
  ~GilFirst() {
    if (held_) PyGILState_Release(state_);
  }
  GilFirst(const GilFirst&) = delete;
  GilFirst& operator=(const GilFirst&) = delete;

 private:
  PyGILState_STATE state_{};
  bool held_ = false;
};

}  // namespace

// See Note [Gradients bound for .grad].
bool may_become_a_grad() {
  const auto current = torch::autograd::get_current_node();
  if (!current) return false;
  // AccumulateGrad runs first among ready nodes: its sequence number is UINT64_MAX (Note
  // [Sequence Number] in torch/csrc/autograd/node.h), which is also what an Error node
  // has. The number is a plain field; a dynamic_cast on every edge cost more than 800
  // instructions per backward op on the worst-case chain, so only a match is cast.
  const auto is_accumulator = [](const torch::autograd::Node* node) {
    return node->sequence_nr() == UINT64_MAX &&
           dynamic_cast<const torch::autograd::AccumulateGrad*>(node) != nullptr;
  };
  if (is_accumulator(current.get())) return true;
  for (const torch::autograd::Edge& edge : current->next_edges())
    if (edge.function && is_accumulator(edge.function.get())) return true;
  return false;
}

void Registry::enter_backward_locked(std::int64_t task, std::int64_t previous) {
  if (std::find(open_tasks_.begin(), open_tasks_.end(), task) != open_tasks_.end()) return;
  const std::uint64_t generation = generation_;
  try {
    torch::autograd::Engine::get_default_engine().queue_callback(
        [task, generation] { registry().end_backward(task, generation); });
  } catch (const c10::Error&) {
    return;  // not inside a backward pass after all: its nodes are settled by the next op
  }
  if (open_tasks_.empty()) watched_.clear();  // Note [Deaths worth a drain]: forward only
  open_tasks_.push_back(task);
  in_backward_ = true;
  // See Note [Passes inside a pass].
  if (previous != -1 && previous != task &&
      std::find(open_tasks_.begin(), open_tasks_.end(), previous) != open_tasks_.end())
    enclosing_.emplace_back(task, previous);
}

void Registry::end_backward(std::int64_t task, std::uint64_t generation) {
  {
    Lock lock(mu_);
    Burial burial(*this, lock);
    if (!active_.load() || generation != generation_ ||
        !end_backward_locked(lock, task, /*settle_costly=*/false))
      return;
  }
  // What asks Python's reference counts runs with the GIL taken before the mutex: Note
  // [Python's references under the registry's mutex].
  GilFirst gil;
  Lock lock(mu_);
  Burial burial(*this, lock);
  if (!active_.load() || generation != generation_) return;
  settle_costly_lineage_locked(lock);
}

void Registry::end_stale_backwards_locked(Lock& lock) {
  while (!open_tasks_.empty()) end_backward_locked(lock, open_tasks_.back());
}

bool Registry::end_backward_locked(Lock& lock, std::int64_t task, bool settle_costly) {
  auto open = std::find(open_tasks_.begin(), open_tasks_.end(), task);
  if (open == open_tasks_.end()) return false;
  open_tasks_.erase(open);
  if (open_tasks_.empty()) end_iteration_locked();
  // The open pass this one ran inside (Note [Passes inside a pass]): enter_backward_locked
  // notes at most one per pass.
  std::int64_t outer = -1;
  auto nested = std::find_if(enclosing_.begin(), enclosing_.end(),
                             [&](const auto& e) { return e.first == task; });
  if (nested != enclosing_.end()) {
    if (std::find(open_tasks_.begin(), open_tasks_.end(), nested->second) != open_tasks_.end())
      outer = nested->second;
    enclosing_.erase(nested);
  }
  // The pass's nodes: the survivors (the program holds them) and the dead.
  // Other passes' nodes stay, in their order (a copy in place: no buffer, as
  // std::stable_partition would take on every pass).
  std::vector<Handle> survivors;
  c10::SmallVector<Handle, 16> dead;
  // A pass's nodes are most of backward_nodes_, and nearly all are dead by now: one
  // allocation here, not a regrowth every doubling (three a pass on the worst-case chain,
  // each a realloc that consolidated the heap: ~120 instructions an op).
  dead.reserve(backward_nodes_.size());
  auto kept = backward_nodes_.begin();
  for (const auto& [owner, handle] : backward_nodes_) {
    if (owner != task) {
      *kept++ = {owner, handle};
      continue;
    }
    Node* node = find_locked(handle);
    if (!node) continue;
    if (!node->dead && node->weak.expired()) mark_dead_locked(node);
    (node->dead ? dead.emplace_back(node->handle) : survivors.emplace_back(node->handle));
  }
  backward_nodes_.erase(kept, backward_nodes_.end());
  if (outer != -1) {
    // The enclosing pass adopts what survives; what only the dead read goes now.
    for (Handle h : survivors) backward_nodes_.emplace_back(outer, h);
    release_dead_locked(dead);
    if (settle_costly) settle_costly_lineage_locked(lock);
    return true;
  }
  for (Handle& h : survivors) {
    Node* node = find_locked(h);
    if (!node || node->dead) continue;
    if (node->lineage() && node->steps.front().rec->grad_mode) {
      // Made by a pass that builds a graph: See Note [Passes that build a graph]. The
      // program's now, an ordinary victim again (Note [Gradients bound for .grad]).
      node->backward = false;
      if (std::exchange(node->for_grad, false) && node->marked) mark_locked(node);
      h = 0;
      continue;
    }
    if (node->evicted) {
      try {
        TentativeScope tentative;  // a failure here is no OOM of the program's
        restore_now(lock, node);
      } catch (const c10::Error&) {
        // No room now: it stays evicted, with its lineage or its host copy, and comes back
        // when read (an out-of-memory error there names the budget). Not worth failing
        // backward for. Its pass is over, so it is no victim of last resort once back
        // (Note [Gradients bound for .grad]).
        node = find_locked(h);
        if (node) node->for_grad = false;
        continue;
      }
      node = find_locked(h);
      if (!node || node->evicted) continue;
    }
    const std::size_t before = dead.size();
    for (const Step& step : node->steps)  // what only its lineage read may go too
      for (const Ref& ref : step.rec->refs) dead.push_back(ref.node);
    try {
      TentativeScope tentative;
      freeze_now(lock, node);
    } catch (const c10::Error&) {
      // The same: no room to bring it back (settling its readers evicted it), so it keeps
      // its lineage, and what that reads stays.
      dead.resize(before);
    }
  }
  release_dead_locked(dead);  // lineage only survivors needed goes, then what only it read
  for (Handle h : survivors) {
    Node* node = h ? find_locked(h) : nullptr;
    // An evicted one stays a node until it comes back: its contents are only in its host
    // copy, which forgetting it would drop (Note [Survivors that stay evicted]).
    if (node && node->frozen && !node->evicted && !node->pins && !has_readers_locked(node)) {
      ++counters_.backward_kept;
      forget_locked(node);
    }
  }
  revisit_unread_locked();  // what frozen survivors read: Note [Inputs a frozen node no longer reads]
  if (open_tasks_.empty()) settle_old_lineage_locked(lock);
  if (settle_costly) settle_costly_lineage_locked(lock);
  return true;
}

// Note [Lineage that outlives its iteration]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A tensor the program keeps across iterations, made anew each one from the last and from
// that iteration's activations — `running = running * 0.9 + feats.detach() * 0.1`, a queue
// rebuilt by `cat`, a warm start — is a node whose lineage runs back through every earlier
// iteration's dead nodes: each one dies while the next reads it. Nothing in that chain was
// ever forgotten, and what its recordings hold as arguments (each iteration's input batch)
// stayed with it: 0.5 MiB more allocated every step, without end, in an exponential moving
// average of a layer's output. So when an iteration ends (its outermost backward pass), a
// dead node made two or more iterations ago that lineage still keeps settles its live
// dependents: they are frozen where they are (a copy the program keeps across iterations
// is not worth a replay through every iteration before it), and the dead chain goes with
// what it held. One with an evicted dependent is left for a later iteration, when that
// dependent has come back.
//
// So is one with a dependent that a live node's recording reads. "Iteration" here counts
// outermost backward passes, and a training step can run several: autograd.grad with
// retain_graph or create_graph before the loss's backward (a PINN's derivatives, a
// saliency from activations' gradients). Two passes into the step, its own forward's dead
// nodes (a layer's pre-activation) counted as two iterations old, and their live
// dependents, activations the retained graph still saved, were frozen. A frozen node that
// recorded ops read is held by the registry for them (freeze_locked: nothing could rebuild
// it), however soon the program lets it go: a max-pool's input, read by the pooled map the
// program kept (tools/user_programs/grad_taps.py: +5 MiB at the end of the run over no
// policy), and a PINN's tanh activations, read by its derivatives' graph, outlasted the
// last backward's release of them (pinn_burgers.py: +7.3 MiB at the peak, 0.8 before).
// Left unfrozen, such a dependent dies when the program and autograd drop it, as with no
// registry; what a copy kept across iterations is read by comes later (the next
// iteration's forward), and by then its readers of this one are dead.
void Registry::settle_old_lineage_locked(Lock& lock) {
  if (iterations_ < 2) return;
  c10::SmallVector<Handle, 16> old;
  for (const Node* node = nodes_.oldest(); node; node = node->newer)
    if (node->iteration + 2 <= iterations_ && !node->frozen && !node->pins &&
        (node->dead || node->weak.expired()))
      old.push_back(node->handle);
  for (Handle h : old) {
    Node* node = find_locked(h);
    if (!node || node->frozen || node->pins) continue;
    if (!node->dead) mark_dead_locked(node);
    if (!has_readers_locked(node) || feeds_read_dependent_locked(node)) continue;
    try {
      TentativeScope tentative;  // no room for a restore here is no OOM of the program's
      freeze_dependents_locked(lock, node);
    } catch (const c10::Error&) {
    }
  }
}

// Whether a live node made from `dead` is read by a live node's recording: freezing it
// would hold it for that reader. See Note [Lineage that outlives its iteration].
bool Registry::feeds_read_dependent_locked(const Node* dead) {
  for (Handle h : dependents_locked(dead).live) {
    const Node* node = find_locked(h);
    if (node && has_live_reader_locked(node)) return true;
  }
  return false;
}

bool Registry::has_live_reader_locked(const Node* node) {
  return std::any_of(node->readers.begin(), node->readers.end(), [&](Handle r) {
    const Node* reader = find_locked(r);
    return reader && reader->lineage() && !reader->dead && !reader->weak.expired();
  });
}

// Note [Lineage that holds more than it can free]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Lineage is worth keeping for what it lets the engine free: a live node's bytes. What it
// costs is usually nothing on the device (a dead node's own storage is gone), but a dead
// node's recording can be the last thing keeping a tensor argument the program dropped, and
// a frozen input whose readers are all dead is held for them alone. A reversible network
// shows it at its worst (tools/user_programs/revnet_free.py: a custom Function whose
// backward reconstructs its inputs, runs backward passes of its own inside the outer one
// and hands the gradient on): the gradient flowing from block to block is a node whose
// lineage runs back through every block's backward so far, keeping each block's restored
// outputs (frozen) and summed gradients (arguments no one else holds), 6 MiB a block for a
// 2 MiB gradient, until the outer pass ends: 28 MiB over plain PyTorch's 37 MiB peak, and
// out of memory under recompute at that peak. So when a pass ends (a pass inside a pass
// too, where its survivors are handed on), each dead node that such bytes sit behind
// charges them to the live nodes made from it; a live node charged more than it weighs is
// frozen (it can still be swapped), and the dead chains whose every dependent is frozen go
// with what they held. A node with an evicted dependent is left alone (freezing it would
// mean rebuilding it). Each storage counts once per settling; a tensor two recordings
// share counts for neither, which errs towards keeping lineage. Nothing is charged where
// nothing but lineage-only bytes under min_bytes sit, the common case, so models whose
// recordings hold only what the program holds too are unaffected.
namespace {

// Whether the references counted in `target`'s use_count include one its own PyObject holds
// while nothing in Python holds that object (a tensor or storage the program dropped in
// Python, kept by PyTorch's PyObject preservation). Only torches whose PyObject holds a
// counted reference (those with incref_pyobject) have one; in older ones a preserved
// PyObject holds none, and the count is the C++ references alone.
template <typename T, typename = void>
struct HasUniquePyobjQuery : std::false_type {};
template <typename T>
struct HasUniquePyobjQuery<T, std::void_t<decltype(std::declval<const T&>().incref_pyobject()),
                                          decltype(std::declval<const T&>().pyobj_slot()->has_unique_reference())>>
    : std::true_type {};

// Calls `f` on each argument of `rec` that is a tensor or an element of a tensor list, as
// the IValue the recording holds (no copy of the tensor: use counts stay as they are).
template <typename F>
void for_each_recorded_tensor(const Recording& rec, F&& f) {
  for (const c10::IValue& value : rec.args) {
    if (value.isTensorList()) {
      for (const c10::IValue& element : value.toListRef()) f(element);
    } else if (value.isTensor()) {
      f(value);
    }
  }
}

// Note [Python's references under the registry's mutex]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Asking a PyObject's reference count (has_unique_reference) takes the GIL. Asked with the
// registry's mutex held, that inverted the lock order (GIL, then registry: "Locks" in
// docs/design.md) and two Python threads deadlocked: one in backward's final callback,
// holding the mutex and waiting for the GIL, the other in `torch.tensor(list)`, which keeps
// the GIL while its lift_fresh waits for the mutex (a trainer beside a thread that makes
// tensors: tools/user_programs/two_threads.py under hybrid hung in 1 of 7 runs). So the
// count is asked only by a thread that holds the GIL already; end_backward takes it before
// the mutex for the settling that asks (GilFirst). Elsewhere (a pass that ended by an
// exception, settled by the next op) the answer is "Python may hold it": the bytes are
// not counted as lineage's alone, which only keeps lineage longer.
template <typename T>
std::size_t python_side_refs(const T& target) {
  if constexpr (HasUniquePyobjQuery<T>::value) {
    if (!Py_IsInitialized() || !PyGILState_Check()) return 0;
    return target.pyobj_slot()->has_unique_reference() ? 1 : 0;
  } else {
    return 0;
  }
}

}  // namespace

std::size_t Registry::bytes_only_lineage_holds_locked(
    const Node* dead, const ska::flat_hash_map<const void*, std::size_t>& occurrences,
    ska::flat_hash_set<const void*>& counted) {
  std::size_t bytes = 0;
  auto argument = [&](const c10::IValue& value) {
    const at::Tensor& t = value.toTensor();
    if (!t.defined() || !t.has_storage() || t.device() != dead->device) return;
    const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
    const c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
    if (s->nbytes() < settings_.min_bytes || counted.count(s) != 0) return;
    // Every reference to the tensor is a dead recording's, and the tensor is the storage's
    // only one (its own PyObject, unheld in Python, aside).
    auto found = occurrences.find(impl);
    const std::size_t recorded = found == occurrences.end() ? 0 : found->second;
    const std::size_t tensor_refs = t.use_count() - python_side_refs(*impl);
    const std::size_t storage_refs =
        c10::raw::intrusive_ptr::use_count(const_cast<c10::StorageImpl*>(s)) - python_side_refs(*s);
    if (tensor_refs == recorded && storage_refs == 1 && counted.insert(s).second)
      bytes += s->nbytes();
  };
  for (const Step& step : dead->steps) {
    const Recording& rec = *step.rec;
    for_each_recorded_tensor(rec, argument);
    for (const Ref& ref : rec.refs) {
      const Node* input = nodes_.find(ref.node);
      if (!input || input == dead || !input->frozen || !input->held ||
          counted.count(input->held.get()) != 0)
        continue;
      // Held for its readers alone: no live one, and nothing but `held` (and its own
      // PyObject, unheld in Python) references the storage.
      const c10::StorageImpl* s = input->held.get();
      if (input->weak.use_count() - python_side_refs(*s) > 1) continue;
      if (!has_live_reader_locked(input) && counted.insert(s).second) bytes += input->nbytes;
    }
  }
  return bytes;
}

void Registry::settle_costly_lineage_locked(Lock& lock) {
  // How often each tensor argument appears in dead nodes' recordings (each recording once:
  // the outputs of one op share it).
  ska::flat_hash_map<const void*, std::size_t> occurrences;
  {
    const std::uint64_t visit = ++settle_visit_;
    auto note = [&](const c10::IValue& value) {
      if (value.toTensor().defined()) ++occurrences[value.toTensor().unsafeGetTensorImpl()];
    };
    for (const Node* node = nodes_.oldest(); node; node = node->newer) {
      if (!node->lineage() || !(node->dead || node->weak.expired())) continue;
      for (const Step& step : node->steps) {
        if (step.rec->settle_visit == visit) continue;
        step.rec->settle_visit = visit;
        for_each_recorded_tensor(*step.rec, note);
      }
    }
  }
  ska::flat_hash_set<const void*> counted;
  ska::flat_hash_map<Handle, std::size_t> charged;  // live node -> lineage-only bytes behind it
  c10::SmallVector<Handle, 16> dead;
  for (const Node* node = nodes_.oldest(); node; node = node->newer) {
    if (node->pins || !node->lineage() || !(node->dead || node->weak.expired())) continue;
    const std::size_t bytes = bytes_only_lineage_holds_locked(node, occurrences, counted);
    if (bytes < settings_.min_bytes) continue;
    Dependents found = dependents_locked(node);
    if (found.replaying || !found.evicted.empty() || found.live.empty()) continue;
    for (Handle h : found.live) charged[h] += bytes;
    dead.push_back(node->handle);
    dead.append(found.dead.begin(), found.dead.end());
  }
  if (dead.empty()) return;
  for (const auto& [handle, bytes] : charged) {
    Node* node = find_locked(handle);
    if (!node || node->frozen || node->pins || node->evicted || bytes <= node->nbytes) continue;
    try {
      TentativeScope tentative;  // settling its readers may replay: no OOM of the program's
      freeze_now(lock, node);
    } catch (const c10::Error&) {
    }
  }
  release_dead_locked(dead);  // the chains no live node needs now, and what they held
  revisit_unread_locked();
}

}  // namespace pyalloc::registry
