// registry.cpp — starting and stopping, lookups, and recording nodes and their lineage.
// Writes are in writes.cpp, deaths in liveness.cpp, inspection in inspect.cpp.
#include "own_ops.h"
#include "registry.h"

#include <ATen/Context.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/graph_task.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <thread>

namespace pyalloc::registry {
namespace {

// Note [How long a chain may grow]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A chain that would grow longer than this is frozen instead: replaying it would cost more
// than it saves. In backward that holds: a gradient buffer that autograd writes again and
// again (a GRU's, every timestep) is pinned while it is written and frozen after eight
// writes, which lets the engine's compaction move it out of the way of its evictable
// neighbours (Note [Moving what cannot leave] in allocator/src/compactor.h); kept as a
// chain there, the zoo's GRU language model ran out of memory at 0.4 of its peak. In
// forward, a buffer assembled piece by piece is common and cheap to replay (each step a
// copy): `pad_packed_sequence` writes its padded output one timestep at a time, and so
// does `out[:, t] = h` in a hand-written RNN. Frozen after eight of 96 writes, the padded
// outputs of a packed bidirectional LSTM and GRU (9 MiB) could never leave under recompute,
// which ran out of memory even at 0.9 of the program's peak; an LSTM seq2seq replayed three
// times as many ops at 0.5. So a chain begun outside backward may grow to 256 steps; the
// cost model prices the replay of all of them.
constexpr std::size_t kMaxChain = 8;
constexpr std::size_t kMaxForwardChain = 256;
// The "model" cost weighs FLOPs against bytes at this arithmetic intensity. On an H100,
// 8 and 256 chose other victims and gave the same step time under recompute at half the
// peak (docs/results/notebook.md, "Which ops recompute replays").
constexpr double kFlopsPerByte = 64.0;

}  // namespace

Registry& registry() {
  // Never destroyed: an op in flight on another thread must never find it gone, and
  // tensors' deleters may run during interpreter shutdown.
  static Registry* the_registry = new Registry();
  return *the_registry;
}

// --- life ------------------------------------------------------------------------------------

std::string Registry::start(pyalloc_engine* engine, const Settings& settings) {
  const engine_api::Api& api = engine_api::api();
  if (!api.set_evict_callback) return "the torch shim is not bound to libpyalloc";
  if (!engine) return "the engine handle is NULL";
  Lock lock(mu_);
  if (active_.load()) {
    return "eviction is already on (install(policy=...) or pyalloc.registry.enable() was "
           "called before): one registry at a time";
  }
  engine_ = engine;
  settings_ = settings;
  can_swap_ = settings.policy != Policy::kRecompute;
  can_relocate_ = can_swap_ || settings.relocate;
  saw_tangents_ = false;
  saw_subclasses_.store(false);
  refresh_budget_locked();
  copy_bw_ = 0;
  nodes_.clear();
  by_key_.clear();
  leaf_readers_.clear();
  parameter_storages_.clear();
  watched_.clear();
  counters_ = Counters{};
  ops_at_iteration_ = recomputes_at_iteration_ = 0;
  replays_by_op_.clear();
  fills_.clear();
  next_sweep_ = kSweepEvery;
  last_evict_sweep_ = -1;
  deaths_seen_ = api.freed_marked_count(engine);
  owner_thread_ = thread_hash();
  seen_threads_.clear();
  ordinal_ = 0;
  by_ordinal_.clear();
  in_backward_ = false;
  open_tasks_.clear();
  enclosing_.clear();
  backward_nodes_.clear();
  order_cur_.clear();
  order_prev_.clear();
  pos_prev_.clear();
  gaps_cur_.clear();
  gaps_prev_.clear();
  ++generation_;
  auto on_evict = [](void* self, const std::uint64_t* handles, std::size_t count) {
    return static_cast<Registry*>(self)->evict(handles, count);
  };
  auto on_movable = [](void* self, std::uintptr_t* out, std::size_t capacity) {
    return static_cast<Registry*>(self)->movable(out, capacity);
  };
  auto on_relocate = [](void* self, const std::uintptr_t* from, const std::uintptr_t* to,
                        std::size_t count) {
    return static_cast<Registry*>(self)->relocate(from, to, count);
  };
  auto on_describe = [](void* self, char* out, std::size_t capacity) {
    return static_cast<Registry*>(self)->describe_oom(out, capacity);
  };
  if (api.set_evict_callback(engine, on_evict, this) != 0 ||
      api.set_compact_callbacks(engine, on_movable, on_relocate, this) != 0 ||
      api.set_oom_describe_callback(engine, on_describe, this) != 0) {
    return engine_api::last_error();
  }
  active_.store(true, std::memory_order_release);
  return "";
}

std::string Registry::stop() {
  // Stopping always stops: a restore that fails (no memory for it) is reported, and the
  // registry lets go of everything all the same.
  std::string error;
  try {
    restore_all();
  } catch (const c10::Error& e) {
    error = e.what_without_backtrace();
  } catch (const std::exception& e) {
    error = e.what();
  }
  Lock lock(mu_);
  Burial burial(*this, lock);
  if (!active_.load()) return error;
  active_.store(false, std::memory_order_release);
  const engine_api::Api& api = engine_api::api();
  api.set_evict_callback(engine_, nullptr, nullptr);
  api.set_compact_callbacks(engine_, nullptr, nullptr, nullptr);
  api.set_oom_describe_callback(engine_, nullptr, nullptr);
  // Forgetting takes each node's mark and host copy with it; the registry's own storages
  // (dead nodes' rebuilt contents, frozen inputs) are released.
  std::vector<Node*> all;
  for (Node* node = nodes_.oldest(); node; node = node->newer) all.push_back(node);
  for (Node* node : all) {
    node->pins = 0;
    forget_locked(node);
  }
  leaf_readers_.clear();
  parameter_storages_.clear();
  watched_.clear();
  unread_.clear();
  drop_fills_locked(/*all=*/true);
  by_ordinal_.clear();
  open_tasks_.clear();
  enclosing_.clear();
  backward_nodes_.clear();
  return error;
}

// --- lookups ---------------------------------------------------------------------------------

Node* Registry::find_locked(Handle handle) {
  return nodes_.find(handle);
}

Node* Registry::by_key_locked(const c10::StorageImpl* key) {
  auto it = by_key_.find(key);
  return it == by_key_.end() ? nullptr : it->second;
}

bool Registry::program_holds_locked(const Node* node) const {
  return node->weak.use_count() > (node->held ? 1u : 0u);
}

bool Registry::has_readers_locked(const Node* node) {
  for (Handle h : node->readers) {
    const Node* reader = nodes_.find(h);
    if (reader && reader->lineage()) return true;
  }
  return false;
}

// --- recording -------------------------------------------------------------------------------

double Registry::cost_locked(const Pending& pending,
                             c10::ArrayRef<const at::Tensor*> outputs,
                             std::int64_t elapsed_ns) const {
  if (settings_.cost == CostModel::kTime) return static_cast<double>(std::max<std::int64_t>(elapsed_ns, 1));
  double out_bytes = 0;
  for (const at::Tensor* o : outputs)
    if (const c10::StorageImpl* key = storage_of(*o)) out_bytes += static_cast<double>(key->nbytes());
  if (settings_.cost == CostModel::kBytes) return std::max(out_bytes, 1.0);
  const double out = !outputs.empty() && outputs[0]->defined()
                         ? static_cast<double>(outputs[0]->numel()) : 0.0;
  return std::max(pending.in_bytes + out_bytes, 1.0) +
         out * pending.flops_per_output / kFlopsPerByte;
}

namespace {
// The number a wrapped-number tensor holds (what PyTorch made of a Python scalar argument).
std::optional<c10::Scalar> wrapped_number(const at::Tensor& t) {
  if (!t.unsafeGetTensorImpl()->is_wrapped_number() || t.device().type() != c10::DeviceType::CPU)
    return std::nullopt;
  // The untyped pointer: the dtype was just checked, and the typed accessor checks it
  // again (a wrapped number is one element on the CPU, on every op that takes a scalar).
  const void* data = t.const_data_ptr();
  switch (t.scalar_type()) {
    case c10::ScalarType::Double: return c10::Scalar(*static_cast<const double*>(data));
    case c10::ScalarType::Long: return c10::Scalar(*static_cast<const std::int64_t*>(data));
    case c10::ScalarType::Bool: return c10::Scalar(*static_cast<const bool*>(data));
    case c10::ScalarType::ComplexDouble:
      return c10::Scalar(*static_cast<const c10::complex<double>*>(data));
    default: return std::nullopt;
  }
}
}  // namespace

// Note [A detached parameter is still a parameter]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// What grad mode derives from tensors that require no grad is recorded only where it
// weighs at least twice what it reads that is no node (Note [What plain inputs derive] in
// dispatch.cpp): its lineage would keep those alive. A parameter read through a detached
// alias is no such tensor: its module keeps it alive anyway. TorchScript's profiling
// executor runs a scripted model's differentiable subgraphs that way from the second call
// on (DifferentiableGraphOp detaches every input, parameters included, runs the forward
// graph with grad mode on, and saves what its backward graph needs in its own autograd
// node): `mm(x, w.t())` read a 256 KiB weight to make a 256 KiB result, so no op of a
// scripted LSTM cell made a node, and after its first step the whole model's activations
// (26 of 28 MiB at 0.4 of tools/user_programs/scripted_cells.py's peak) could never leave.
// The same holds for `F.linear(x, w.detach())` in a user's own code. So the storages of the
// parameters that recorded ops read (of min_bytes or more; a detached alias shares its
// parameter's storage, and the first call of a scripted model reads the parameters
// themselves) are remembered weakly, and count as neither droppable nor plain bytes.
bool Registry::parameter_storage_locked(const c10::StorageImpl* key) const {
  auto it = parameter_storages_.find(key);
  return it != parameter_storages_.end() && !it->second.expired();
}

void Registry::note_parameter_storage_locked(const at::TensorBase& parameter) {
  const c10::Storage& storage = parameter.storage();
  auto it = parameter_storages_.find(storage.unsafeGetStorageImpl());
  if (it == parameter_storages_.end())
    parameter_storages_.emplace(storage.unsafeGetStorageImpl(), storage.getWeakStorageImpl());
  else if (it->second.expired())
    it->second = storage.getWeakStorageImpl();
}

// Note [Running statistics are read only in inference]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A recorded op is a reader of every argument that is no node (leaf_readers_): a later
// write of one settles the op's outputs, which freezes them, since a replay would read the
// new contents. A batch norm in training mode is no reader of its running statistics: it
// updates them, but its results depend on the batch alone, and a replay updates copies
// (Note [What a recorded op writes] in dispatch.cpp). Counted as one, a model applied
// several times before its backward froze all but the last application's batch-norm
// outputs, each one's update of the shared statistics settling the ones before: a siamese
// network's three passes through one encoder left 63 MiB in 12 activations that could never
// leave, and it ran out of memory under recompute at 0.4 of its peak
// (tools/user_programs/siamese_triplet.py), where swap trained. In inference mode a batch
// norm reads them, and stays their reader.
void Registry::prepare_locked(const c10::OperatorHandle& op, const OpInfo& info,
                              c10::ArrayRef<c10::IValue> args, Pending* pending) {
  auto rec = std::allocate_shared<Recording>(PooledAllocator<Recording, LockedFreeList>(&recordings_), op);
  rec->written = &info.written;
  rec->grad_mode = pending->grad_mode;
  NodeList* inputs = &pending->inputs;
  KeyList* leaves = &pending->leaves;
  double& in_bytes = pending->in_bytes;
  // See Note [Running statistics are read only in inference].
  const bool training_stats =
      !info.running_stats.empty() &&
      (info.training_arg < 0 ||
       (static_cast<std::size_t>(info.training_arg) < args.size() &&
        args[info.training_arg].isBool() && args[info.training_arg].toBool()));
  auto unread = [&](std::uint16_t arg) {
    return training_stats && std::find(info.running_stats.begin(), info.running_stats.end(),
                                       arg) != info.running_stats.end();
  };
  // A registered storage becomes a Ref (None in the stack); a Python number stays a
  // number; anything else is kept as it is, a tensor with an autograd history as a
  // detached alias, so lineage never keeps a graph alive.
  auto convert = [&](const at::Tensor& t, std::uint16_t arg, std::int32_t element) -> c10::IValue {
    const c10::StorageImpl* key = storage_of(t);
    if (!key) {
      // A sparse tensor no part of which is a node (Note [Sparse arguments]).
      const bool sparse = for_each_sparse_part(t, [&](const at::Tensor& part) {
        if (const c10::StorageImpl* part_key = storage_of(part)) {
          in_bytes += static_cast<double>(part.numel() * part.element_size());
          pending->sparse_bytes += part_key->nbytes();
          pending->plain_bytes += part_key->nbytes();
          leaves->push_back(part_key);
        }
      });
      return sparse ? detached_sparse_alias(t) : t;
    }
    in_bytes += static_cast<double>(t.numel() * t.element_size());
    if (element < 0) {
      if (std::optional<c10::Scalar> number = wrapped_number(t)) {
        rec->wrapped.push_back(arg);
        return *number;
      }
    }
    Node* node = by_key_locked(key);
    if (!node) {
      if (!unread(arg)) leaves->push_back(key);
      // Parameters stay with their module; anything else may be dropped by the program
      // and left to the recording (Note [Deaths worth a drain] in liveness.cpp).
      // A view of a parameter (a slice of a packed attention projection) is a parameter.
      // See Note [A detached parameter is still a parameter].
      if (key->nbytes() >= settings_.min_bytes) {
        const at::TensorBase& base = t.is_view() ? t._base() : t;
        if (base.requires_grad() && base.is_leaf()) {
          note_parameter_storage_locked(base);
        } else if (!parameter_storage_locked(key)) {
          pending->droppable_bytes += key->nbytes();
          pending->plain_bytes += key->nbytes();
        }
      } else {
        pending->plain_bytes += key->nbytes();
      }
      if (t.requires_grad() && !t.is_leaf()) return detached_alias(t);
      return t;
    }
    if (std::find(inputs->begin(), inputs->end(), node) == inputs->end()) inputs->push_back(node);
    Ref& ref = rec->refs.emplace_back();
    ref.node = node->handle;
    ref.version = node->version;
    ref.offset = t.storage_offset();
    ref.sizes.assign(t.sizes().begin(), t.sizes().end());
    ref.strides.assign(t.strides().begin(), t.strides().end());
    ref.dtype = t.scalar_type();
    ref.conj = t.is_conj();
    ref.neg = t.is_neg();
    ref.arg = arg;
    ref.element = element;
    return c10::IValue();
  };
  rec->args.reserve(args.size());
  for (std::size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& v = args[i];
    const auto arg = static_cast<std::uint16_t>(i);
    if (v.isTensor()) {
      rec->args.push_back(convert(v.toTensor(), arg, -1));
    } else if (v.isTensorList()) {
      // The list is the caller's: convert a copy.
      c10::List<at::Tensor> list = v.toTensorList().copy();
      for (std::size_t j = 0; j < list.size(); ++j) {
        c10::IValue e = convert(list.get(j), arg, static_cast<std::int32_t>(j));
        list.set(j, e.isTensor() ? e.toTensor() : at::Tensor());
      }
      rec->args.push_back(std::move(list));
    } else if (v.isList() && !v.isIntList() && !v.isDoubleList() && !v.isBoolList()) {
      c10::impl::GenericList list = v.toList().copy();  // Tensor?[] (index) and the like
      for (std::size_t j = 0; j < list.size(); ++j) {
        c10::IValue e = list.get(j);
        if (e.isTensor()) list.set(j, convert(e.toTensor(), arg, static_cast<std::int32_t>(j)));
      }
      rec->args.push_back(std::move(list));
    } else {
      rec->args.push_back(v);
    }
  }
  // Multiply-adds of the compute-bound ops (x2) per element of the result, from shapes.
  auto tensor_arg = [&](std::size_t i) -> const at::Tensor* {
    return i < args.size() && args[i].isTensor() ? &args[i].toTensor() : nullptr;
  };
  if (info.flops == Flops::kMatmul || info.flops == Flops::kMatmulWithBias) {
    const at::Tensor* a = tensor_arg(info.flops == Flops::kMatmul ? 0 : 1);
    if (a && a->dim() > 0) pending->flops_per_output = 2.0 * static_cast<double>(a->size(-1));
  } else if (info.flops == Flops::kConvolution) {
    const at::Tensor* w = tensor_arg(1);
    if (w && w->dim() > 0)
      pending->flops_per_output =
          2.0 * static_cast<double>(w->numel() / std::max<std::int64_t>(1, w->size(0)));
  }
  pending->rec = std::move(rec);
}

void Registry::add_reader_locked(Node* reader, c10::ArrayRef<Node*> inputs,
                                 c10::ArrayRef<const c10::StorageImpl*> leaves) {
  for (Node* input : inputs) {
    if (input == reader) continue;
    input->readers.push_back(reader->handle);
    // Nothing could bring a frozen input back: keep it while it is read. See Note [Who
    // holds a storage].
    if (!input->lineage() && !input->held) input->held = input->storage();
  }
  for (const c10::StorageImpl* key : leaves) leaf_readers_[key].push_back(reader->handle);
}

void Registry::record_creation_locked(Pending& pending, KeyList& read_keys,
                                      c10::ArrayRef<c10::IValue> outputs,
                                      std::int64_t elapsed_ns) {
  // The results (the stack holds them meanwhile); a tensor list's are gathered by value.
  c10::SmallVector<const at::Tensor*, 4> results;
  c10::SmallVector<at::Tensor, 4> listed;
  for (const c10::IValue& v : outputs) {
    if (v.isTensor()) {
      results.push_back(&v.toTensor());
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) listed.push_back(t);
    }
  }
  for (const at::Tensor& t : listed) results.push_back(&t);
  c10::SmallVector<std::uint32_t, 4> fresh;
  for (std::uint32_t i = 0; i < results.size(); ++i) {
    if (!can_become_node_locked(*results[i], read_keys)) continue;
    read_keys.push_back(storage_of(*results[i]));  // two results on one storage make one node
    fresh.push_back(i);
  }
  if (fresh.empty()) return;
  // A result that weighs less than twice the plain tensors its op read could keep more alive
  // than it frees (Note [What plain inputs derive] in dispatch.cpp).
  // So does one that weighs less than twice the parts of the sparse tensors it read (Note
  // [Sparse arguments] in node.h).
  if (pending.plain || pending.sparse_bytes > 0) {
    std::size_t made = 0;
    for (std::uint32_t i : fresh) made += storage_of(*results[i])->nbytes();
    const std::size_t read = pending.plain ? pending.plain_bytes : 0;
    if (2 * std::max(read, pending.sparse_bytes) > made) return;
  }
  Recording& rec = *pending.rec;
  rec.cost = cost_locked(pending, results, elapsed_ns);
  // A gradient's inputs of its own kind die as soon as it is made: it pays for them now.
  // See Note [Dead inputs cost their readers].
  const bool backward = pending.task != -1;
  double inherited = 0;
  double inherited_bytes = 0;
  if (backward)
    for (const Node* input : pending.inputs)
      if (input->backward && input->lineage()) {
        inherited += input->cost;
        inherited_bytes += static_cast<double>(input->nbytes) + input->dead_bytes;
      }
  for (std::uint32_t i : fresh) {
    Node* node = make_node_locked(results[i]->unsafeGetTensorImpl()->unsafe_storage(),
                                  Step{pending.rec, i}, rec.cost + inherited, pending.task,
                                  pending.inputs, pending.leaves, inherited_bytes);
    if (pending.task == -1 && !pending.grad_mode && pending.droppable_bytes >= settings_.min_bytes)
      watch_death_locked(node);
  }
}

bool Registry::can_become_node_locked(const at::Tensor& result, const KeyList& read_keys) const {
  // A new storage: not a view of an input, and one a node can be made of.
  const c10::StorageImpl* key = storage_of(result);
  return key && std::find(read_keys.begin(), read_keys.end(), key) == read_keys.end() &&
         storage_can_become_node_locked(key);
}

bool Registry::storage_can_become_node_locked(const c10::StorageImpl* key) const {
  // On the managed device, not small, freeable, and not known already.
  return key->device_type() == settings_.device_type && key->nbytes() >= settings_.min_bytes &&
         key->resizable() && !by_key_.count(key);
}

Node* Registry::make_node_locked(const c10::Storage& storage, std::optional<Step> step,
                                 double cost, std::int64_t task, c10::ArrayRef<Node*> inputs,
                                 c10::ArrayRef<const c10::StorageImpl*> leaves,
                                 double dead_bytes) {
  const bool backward = task != -1;
  Node* node = nodes_.create(storage);
  if (step) {
    node->steps.push_back(std::move(*step));
  } else {
    node->frozen = true;  // no lineage: it can leave only as a host copy
  }
  node->cost = cost;
  node->dead_bytes = dead_bytes;
  node->backward = backward;
  node->for_grad = backward && node->lineage() && may_become_a_grad();  // Note [Gradients bound for .grad]
  node->iteration = iterations_;
  by_key_[node->key] = node;
  if (can_swap_ && !in_backward_) {
    node->ordinal = ordinal_++;
    by_ordinal_[node->ordinal] = node->handle;
    if (settings_.policy == Policy::kHybrid) {
      node->last_use_ns = now_ns();
      node->waited_ns = static_cast<std::int64_t>(engine_api::api().blocked_ns(engine_));
    }
  }
  add_reader_locked(node, inputs, leaves);
  if (backward) {  // See Note [Backward nodes] in backward.cpp
    backward_nodes_.emplace_back(task, node->handle);
    ++counters_.backward_nodes;
  }
  mark_locked(node);
  return node;
}

void Registry::record_bare_locked(std::int64_t task, KeyList& read_keys,
                                  c10::ArrayRef<c10::IValue> outputs) {
  for (const c10::IValue& v : outputs) {
    if (!v.isTensor() || !can_become_node_locked(v.toTensor(), read_keys)) continue;
    read_keys.push_back(storage_of(v.toTensor()));
    make_node_locked(v.toTensor().storage(), std::nullopt, 0, task, {}, {});
  }
}

// Note [What a subclass's results keep inside]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A Python subclass's op runs its own ops on the inner plain tensors below the registry's
// key, and returns new subclass instances around new inner tensors (a jagged nested
// tensor's values): no node was ever made of them, so they could never leave. At 0.5 of its
// peak a jagged-attention program ran out of memory under every policy with 54 MiB of such
// storages resident. Under swap and hybrid the subclass's wrapped `__torch_dispatch__`
// (Note [Storage access around the dispatcher] in pyalloc/registry.py) hands the storages
// of the inner tensors of its results that none of its arguments held here, and each
// becomes a node without lineage (as a backward pass's results do: Note [Backward nodes]
// in backward.cpp): it leaves as a host copy and comes back when the next op on the
// subclass holds its inner tensors. So under recompute with spill on (the default); not
// with spill off, where nothing could rebuild it.
std::size_t Registry::adopt(const c10::StorageImpl* const* keys, std::size_t count) {
  Lock lock(mu_);
  Burial burial(*this, lock);
  if (!active_.load() || !can_relocate_) return 0;
  const std::int64_t task = torch::autograd::get_current_graph_task_id();
  std::size_t made = 0;
  for (std::size_t i = 0; i < count; ++i) {
    auto* key = const_cast<c10::StorageImpl*>(keys[i]);
    if (!key || !key->data() || !storage_can_become_node_locked(key)) continue;
    // The caller holds a tensor on it for the call: the storage is alive.
    c10::Storage storage(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(key));
    make_node_locked(storage, std::nullopt, 0, task, {}, {});
    ++made;
  }
  return made;
}

// --- fills (Note [Fills a write makes activations]) ---------------------------------------

void Registry::remember_fill_locked(Pending& pending, c10::ArrayRef<c10::IValue> outputs,
                                    std::int64_t elapsed_ns) {
  // Not before the first node: a model built under the policy fills its parameters and
  // buffers then (Note [Fills a write makes activations]).
  if (nodes_.size() == 0 || !pending.inputs.empty() || outputs.empty() || !outputs[0].isTensor())
    return;
  const at::Tensor& out = outputs[0].toTensor();
  if (!can_become_node_locked(out, KeyList{})) return;
  const at::Tensor* results[] = {&out};
  pending.rec->cost = cost_locked(pending, results, elapsed_ns);
  fills_.insert_or_assign(storage_of(out), Fill{out.storage().getWeakStorageImpl(), pending.rec,
                                                pending.leaves});
}

Registry::Fills::iterator Registry::bury_fill_locked(Fills::iterator it) {
  graveyard_.push_back(std::move(it->second.rec));  // Note [Releasing outside the lock]
  buried_.store(true, std::memory_order_relaxed);
  return fills_.erase(it);
}

void Registry::forget_fill_locked(const c10::StorageImpl* key) {
  auto it = fills_.find(key);
  if (it != fills_.end()) bury_fill_locked(it);
}

Node* Registry::promote_fill_locked(const c10::StorageImpl* key) {
  auto it = fills_.find(key);
  if (it == fills_.end()) return nullptr;
  Fill fill = std::move(it->second);
  fills_.erase(it);
  c10::intrusive_ptr<c10::StorageImpl> storage = fill.weak.lock();
  if (!storage) return nullptr;  // it died; the address is another storage's now
  const double cost = fill.rec->cost;
  return make_node_locked(c10::Storage(std::move(storage)), Step{std::move(fill.rec), 0}, cost,
                          /*task=*/-1, {}, fill.leaves);
}

bool Registry::extends_chain_locked(c10::ArrayRef<Node*> targets, bool replayable) const {
  const Node* target = targets.front();
  return targets.size() == 1 && replayable && !target->frozen && target->lineage() &&
         target->steps.size() < (target->backward ? kMaxChain : kMaxForwardChain);
}

void Registry::record_mutation_locked(Pending* pending, c10::ArrayRef<Node*> targets,
                                      std::int64_t elapsed_ns) {
  for (Node* node : targets) drop_copy_locked(node);  // their host copies are stale now
  if (!pending) {  // a write the lineage cannot follow (See extends_chain_locked)
    for (Node* node : targets) {
      ++node->version;
      freeze_locked(node);
    }
    return;
  }
  Node* target = targets.front();
  pending->rec->cost = cost_locked(*pending, {}, elapsed_ns);
  target->steps.push_back(Step{pending->rec, 0});
  ++target->version;
  target->cost += pending->rec->cost;
  add_reader_locked(target, pending->inputs, pending->leaves);
  if (target->marked) target->marked = false;  // offered again below with its new cost
  mark_locked(target);
}

}  // namespace pyalloc::registry
