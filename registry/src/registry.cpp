// registry.cpp — nodes and their lineage: recording, readers, freezing, liveness, stats.
#include "own_ops.h"
#include "registry.h"

#include <ATen/Context.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <thread>

namespace pyalloc::registry {
namespace {

// A chain longer than this is frozen: replaying it would cost more than it saves.
constexpr std::size_t kMaxChain = 8;
// The backstop sweep runs every this many ops at least (and every 8 ops per node): deaths
// the engine could not note (a storage that died while evicted or unmarked) wait that long.
constexpr std::int64_t kSweepEvery = 4096;
// Deaths noted by the engine are taken this many at a time on the per-op path.
constexpr std::uint64_t kDeathsPerDrain = 16;
// The "model" cost weighs FLOPs against bytes at this arithmetic intensity.
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
  copy_bw_ = 0;
  nodes_.clear();
  by_key_.clear();
  leaf_readers_.clear();
  counters_ = Counters{};
  next_sweep_ = kSweepEvery;
  last_evict_sweep_ = -1;
  deaths_seen_ = api.freed_marked_count(engine);
  owner_thread_ = std::hash<std::thread::id>{}(std::this_thread::get_id());
  seen_threads_.clear();
  ordinal_ = 0;
  by_ordinal_.clear();
  in_backward_ = false;
  open_tasks_.clear();
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
  if (api.set_evict_callback(engine, on_evict, this) != 0 ||
      api.set_compact_callbacks(engine, on_movable, on_relocate, this) != 0) {
    return engine_api::last_error();
  }
  active_.store(true, std::memory_order_release);
  return "";
}

std::string Registry::stop() {
  std::string error = restore_all();
  Lock lock(mu_);
  Burial burial(*this, lock);
  if (!active_.load()) return error;
  active_.store(false, std::memory_order_release);
  const engine_api::Api& api = engine_api::api();
  api.set_evict_callback(engine_, nullptr, nullptr);
  api.set_compact_callbacks(engine_, nullptr, nullptr, nullptr);
  // Forgetting takes each node's mark and host copy with it; the registry's own storages
  // (dead nodes' rebuilt contents, frozen inputs) are released.
  std::vector<Node*> all;
  for (Node* node = nodes_.oldest(); node; node = node->newer) all.push_back(node);
  for (Node* node : all) {
    node->pins = 0;
    forget_locked(node);
  }
  leaf_readers_.clear();
  by_ordinal_.clear();
  open_tasks_.clear();
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

void Registry::prepare_locked(const c10::OperatorHandle& op, const OpInfo& info,
                              c10::ArrayRef<c10::IValue> args, Pending* pending) {
  auto rec = std::allocate_shared<Recording>(PooledAllocator<Recording, LockedFreeList>(&recordings_), op);
  rec->written = &info.written;
  rec->grad_mode = pending->grad_mode;
  NodeList* inputs = &pending->inputs;
  KeyList* leaves = &pending->leaves;
  double& in_bytes = pending->in_bytes;
  // A registered storage becomes a Ref (None in the stack); a Python number stays a
  // number; anything else is kept as it is, a tensor with an autograd history as a
  // detached alias, so lineage never keeps a graph alive.
  auto convert = [&](const at::Tensor& t, std::uint16_t arg, std::int32_t element) -> c10::IValue {
    const c10::StorageImpl* key = storage_of(t);
    if (!key) return t;
    in_bytes += static_cast<double>(t.numel() * t.element_size());
    if (element < 0) {
      if (std::optional<c10::Scalar> number = wrapped_number(t)) {
        rec->wrapped.push_back(arg);
        return *number;
      }
    }
    Node* node = by_key_locked(key);
    if (!node) {
      leaves->push_back(key);
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
  // New storages on the managed device: not a view of an input, not known already, not
  // small, and freeable.
  c10::SmallVector<std::uint32_t, 4> fresh;
  for (std::uint32_t i = 0; i < results.size(); ++i) {
    const at::Tensor& o = *results[i];
    c10::StorageImpl* key = storage_of(o);
    if (!key || o.device().type() != settings_.device_type) continue;
    if (key->nbytes() < settings_.min_bytes || !key->resizable()) continue;
    if (std::find(read_keys.begin(), read_keys.end(), key) != read_keys.end()) continue;
    if (by_key_.count(key)) continue;
    read_keys.push_back(key);  // two results on one storage make one node
    fresh.push_back(i);
  }
  if (fresh.empty()) return;
  Recording& rec = *pending.rec;
  rec.cost = cost_locked(pending, results, elapsed_ns);
  // A gradient's inputs of its own kind die as soon as it is made: it pays for them now.
  // See Note [Dead inputs cost their readers].
  const bool backward = pending.task != -1;
  double inherited = 0;
  if (backward)
    for (const Node* input : pending.inputs)
      if (input->backward && input->lineage()) inherited += input->cost;
  for (std::uint32_t i : fresh) {
    Node* node = nodes_.create(results[i]->unsafeGetTensorImpl()->unsafe_storage());
    node->steps.push_back(Step{pending.rec, i});
    node->cost = rec.cost + inherited;
    node->backward = backward;
    by_key_[node->key] = node;
    if (can_swap_ && !in_backward_) {
      node->ordinal = ordinal_++;
      by_ordinal_[node->ordinal] = node->handle;
      if (settings_.policy == Policy::kHybrid) {
        node->last_use_ns = now_ns();
        node->waited_ns = static_cast<std::int64_t>(engine_api::api().blocked_ns(engine_));
      }
    }
    add_reader_locked(node, pending.inputs, pending.leaves);
    if (backward) {  // See Note [Backward nodes] in backward.cpp
      backward_nodes_.emplace_back(pending.task, node->handle);
      ++counters_.backward_nodes;
    }
    mark_locked(node);
  }
}

bool Registry::extends_chain_locked(c10::ArrayRef<Node*> targets, bool replayable) const {
  const Node* target = targets.front();
  return targets.size() == 1 && replayable && !target->frozen && target->lineage() &&
         target->steps.size() < kMaxChain;
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

// --- writes ----------------------------------------------------------------------------------

// Note [Readers of an earlier version]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A write that extends a node's chain leaves its earlier contents recomputable: they are
// the chain's first steps. So the ops recorded from them keep their lineage, with a Ref to
// the version they read, and replaying one rebuilds that version apart from the node — or
// takes it from the node itself when the node is midway through its own restore and holds
// that version (restoring `g` after `g.add_(c)`, where `c` was made from `g`, passes
// through exactly that). Nothing is frozen or rebuilt at the write. Backward does this in
// every residual block: autograd sums the two gradients of a skip connection in place,
// into the gradient that went down the skip, after the block's batch norm backward read
// it; freezing what was made from it, or rebuilding the dead batch norm gradient to hold
// it, made the CNN's unconstrained backward hold twice stock's memory (57 MiB where stock
// held 29) and replay 18 ops a step with nothing evicted.
// A chain frozen later (a write it cannot follow, the end of a backward pass) takes its
// early versions with it, so its readers of those are settled first, like any reader of
// overwritten contents (settle_readers_locked).
void Registry::invalidate_readers(Lock& lock, const c10::StorageImpl* key, bool keep) {
  c10::SmallVector<Handle, 4> readers;
  Node* node = by_key_locked(key);
  if (node) {
    if (node->readers.empty()) return;
    if (keep) {
      node->stale_readers = true;
      return;
    }
    readers.assign(node->readers.begin(), node->readers.end());
    node->readers.clear();
    node->stale_readers = false;
  } else {
    auto it = leaf_readers_.find(key);
    if (it == leaf_readers_.end()) return;
    readers.assign(it->second.begin(), it->second.end());
    leaf_readers_.erase(it);
  }
  settle_readers_locked(lock, readers, [&](c10::ArrayRef<Handle> rest) {
    // The write will not happen (the op fails): the readers not yet frozen still read the
    // current contents.
    if (Node* n = by_key_locked(key)) {
      n->readers.insert(n->readers.end(), rest.begin(), rest.end());
    } else {
      auto& leaf = leaf_readers_[key];
      leaf.insert(leaf.end(), rest.begin(), rest.end());
    }
  });
}

bool Registry::reads_earlier_locked(const Node* reader, const Node* node) const {
  for (const Step& step : reader->steps)
    for (const Ref& ref : step.rec->refs)
      if (ref.node == node->handle && ref.version < node->version) return true;
  return false;
}

void Registry::freeze_now(Lock& lock, Node* node) {
  if (node->frozen) return;
  if (node->stale_readers) {
    const Handle h = node->handle;
    c10::SmallVector<Handle, 4> stale;
    c10::SmallVector<Handle, 2> current;
    for (Handle r : node->readers) {
      const Node* reader = find_locked(r);
      if (reader && reads_earlier_locked(reader, node)) stale.push_back(r);
      else current.push_back(r);
    }
    node->readers.assign(current.begin(), current.end());
    node->stale_readers = false;
    settle_readers_locked(lock, stale, [&](c10::ArrayRef<Handle> rest) {
      if (Node* n = find_locked(h)) {
        n->readers.insert(n->readers.end(), rest.begin(), rest.end());
        n->stale_readers = true;
      }
    });
    node = find_locked(h);
    if (!node || node->frozen) return;
  }
  freeze_locked(node);
}

template <typename PutBack>
void Registry::settle_readers_locked(Lock& lock, c10::ArrayRef<Handle> readers, PutBack&& put_back) {
  bool swept = false;
  for (std::size_t i = 0; i < readers.size(); ++i) {
    Node* reader = find_locked(readers[i]);
    if (!reader || reader->frozen) continue;
    if (!reader->dead && reader->weak.expired()) mark_dead_locked(reader);
    if (reader->pins == 0 && !program_holds_locked(reader)) {
      // Only lineage holds it. Whether lineage still needs it is transitive (its readers
      // may be dead too: last step's activations at the optimizer's step), and a sweep
      // forgets whole dead chains: without one, every write to a parameter would rebuild
      // the activations recorded from it, only to freeze them.
      if (!swept) {
        sweep_locked(/*tidy=*/false);
        swept = true;
        reader = find_locked(readers[i]);
        if (!reader || reader->frozen) continue;
      }
      if (!has_readers_locked(reader)) {
        forget_locked(reader);  // nothing uses it: no need to keep it recomputable
        continue;
      }
      if (reader->dead && freeze_dependents_locked(lock, reader)) continue;
    }
    try {
      if (reader->evicted) {
        restore_now(lock, reader);  // while its inputs still hold what it was made from
        reader = find_locked(readers[i]);
        if (!reader) continue;
      }
      freeze_now(lock, reader);
    } catch (...) {
      put_back(readers.slice(i));
      throw;
    }
  }
}

template <typename Visit>
bool Registry::walk_readers_locked(const Node* start, Visit&& visit) {
  const std::uint64_t stamp = ++charge_visit_;
  charge_stack_.clear();
  charge_stack_.push_back({start, 0, 0});
  while (!charge_stack_.empty()) {
    const WalkFrom from = charge_stack_.back();
    charge_stack_.pop_back();
    const std::size_t count = from.node ? from.node->readers.size() : from.end - from.begin;
    for (std::size_t i = 0; i < count; ++i) {
      // (frontiers_ may grow during the visits: indexed afresh each time.)
      const Handle h = from.node ? from.node->readers[i] : frontiers_[from.begin + i];
      Node* reader = find_locked(h);
      if (!reader || reader == start || !reader->lineage() || reader->charge_visit == stamp)
        continue;
      reader->charge_visit = stamp;
      switch (visit(reader)) {
        case Walk::kInto: charge_stack_.push_back({reader, 0, 0}); break;
        case Walk::kOver: break;
        case Walk::kFrontier:
          charge_stack_.push_back({nullptr, reader->frontier_begin, reader->frontier_end});
          break;
        case Walk::kStop: return false;
      }
    }
  }
  return true;
}

// Note [Writes under dead readers]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A storage about to be overwritten was read by an op whose result is dead (the program
// let it go) but still needed as lineage: live nodes were made from it, directly or
// through more dead ones. Once the write lands, nothing could rebuild it. Rebuilding it
// now, to hold it, costs a replay and its bytes for as long as those live nodes last; the
// live nodes themselves are on the device already (when none was evicted), and freezing
// them costs neither. When a live dependent is evicted, bringing it back would rebuild
// the dead reader anyway: then the dead reader is rebuilt and kept, as any reader is.
bool Registry::freeze_dependents_locked(Lock& lock, Node* dead) {
  c10::SmallVector<Handle, 4> live;
  c10::SmallVector<Handle, 16> dead_nodes{dead->handle};
  const bool all_resident = walk_readers_locked(dead, [&](Node* reader) {
    // Dead or dying, without marking it here: mark_dead_locked walks readers itself.
    if (reader->dead || reader->weak.expired()) {
      if (reader->pins) return Walk::kStop;  // being replayed: leave it to the rebuild
      dead_nodes.push_back(reader->handle);
      return Walk::kInto;
    }
    if (reader->evicted) return Walk::kStop;
    live.push_back(reader->handle);
    return Walk::kOver;
  });
  if (!all_resident) return false;
  for (Handle h : live)
    if (Node* node = find_locked(h)) freeze_now(lock, node);
  release_dead_locked(dead_nodes);  // no lineage reads them now
  return true;
}

void Registry::freeze_locked(Node* node) {
  if (node->frozen) return;
  if (!node->dead && node->weak.expired()) mark_dead_locked(node);
  unmark_locked(node);
  node->frozen = true;
  const c10::intrusive_ptr<c10::StorageImpl> held = node->held;
  bury_locked(node);  // its lineage goes, releasing its inputs
  node->held = held;
  ++counters_.frozen;
  // Read by recorded ops: nothing could bring it back, so the registry keeps it.
  if (has_readers_locked(node) && !node->held) node->held = node->storage();
  mark_locked(node);  // it can still be swapped
}

// --- liveness --------------------------------------------------------------------------------

void Registry::mark_dead_locked(Node* node) {
  if (node->dead) return;
  if (!node->evicted && has_readers_locked(node)) ++counters_.eager_evictions;
  node->dead = true;
  node->evicted = true;
  node->marked = false;  // the engine's mark went with the block
  node->arriving = node->prefetched = false;
  if (node->key) {
    auto it = by_key_.find(node->key);
    if (it != by_key_.end() && it->second == node) by_key_.erase(it);
    node->key = nullptr;
  }
  // The host copy, if clean, still holds the contents: a reader's replay may use it.
  charge_readers_locked(node);
}

// Note [Dead inputs cost their readers]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Replaying a node rebuilds its dead inputs first (their contents exist nowhere else), and
// theirs, back to inputs that are still there. So what evicting a node costs is its own op
// plus every dead node its replay passes through, and a death reprices every live node
// downstream of it along dead readers: the dead node's readers, and, where a reader is
// itself dead, that reader's readers, and so on. Backward makes this the rule: each
// forward activation dies once its gradient is made, after the activations made from it
// (autograd runs in reverse), so the gradient with respect to an early layer's output is
// rebuilt only by replaying the forward from the last live activation and the backward
// from the loss down to it. Priced at its own op alone, or with its inputs' deaths only, it
// looks as cheap as an activation and the engine takes it first — then every use replays
// the chain, and the replays evict each other (the MLP at 0.35 of its peak did not finish a
// step, the transformer took 30 s). So a death adds the dead node's cost to each live node
// reached through dead readers, once per death (deaths are final), and the engine is told
// the new price. A gradient made in backward is priced with the gradients it read when it
// is made (they die at once, and deaths are noticed in batches, after the engine may have
// chosen), so its own death charges nobody again; the deaths of its ancestors still pass
// through it. Diamonds between live nodes count a dead node once per live node, which is
// the truth; a live node charged by two paths of one inherited gradient is an overestimate,
// which errs towards evicting something else. Evicted inputs that are not dead are not
// charged (they come back and go again; DTR's evicted-neighbourhood sum would need updates
// both ways).
//
// Note [Charging a batch of deaths]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Deaths come in batches (Note [Noticing deaths]), newest first, and a chain of
// activations that died together is the common case (a step's elementwise ops): each
// death walks down through the dead readers to the live nodes below, n(n+1)/2 steps for a
// chain of n. So while a batch is released each death keeps the live nodes it charged
// (its frontier), and a later death of the batch that reaches a dead node with a frontier
// walks that instead of the dead nodes below it: the same live nodes, each charged once
// per death as before, in one step each. A frontier node that died since is walked into
// like any dead reader.
void Registry::charge_readers_locked(Node* dead) {
  if (!dead->lineage() || dead->backward || dead->readers.empty()) return;
  const auto begin = static_cast<std::uint32_t>(frontiers_.size());
  walk_readers_locked(dead, [&](Node* reader) {
    if (reader->dead) {  // rebuilt only after `dead`: its readers pay
      const bool known = releasing_batch_ && reader->frontier_batch == death_batch_;
      return known ? Walk::kFrontier : Walk::kInto;
    }
    reader->cost += dead->cost;
    if (reader->marked) mark_locked(reader);  // set_evictable updates the engine's cost
    if (releasing_batch_) frontiers_.push_back(reader->handle);
    return Walk::kOver;
  });
  if (releasing_batch_) {
    dead->frontier_batch = death_batch_;
    dead->frontier_begin = begin;
    dead->frontier_end = static_cast<std::uint32_t>(frontiers_.size());
  }
}

void Registry::adopt_locked(Node* node, c10::intrusive_ptr<c10::StorageImpl> storage) {
  // Dead first: the program's storage is gone, and its address, which by_key still maps
  // to this node if the death went unnoticed, may already belong to a new storage.
  mark_dead_locked(node);
  node->held = std::move(storage);
  node->weak = c10::weak_intrusive_ptr<c10::StorageImpl>(node->held);
}

void Registry::bury_locked(Node* node) {
  for (Step& step : node->steps) graveyard_.push_back(std::move(step.rec));
  node->steps.clear();
  if (node->held) graveyard_storages_.push_back(std::move(node->held));
  buried_.store(true, std::memory_order_relaxed);
}

Registry::Burial::~Burial() {
  if (!registry_.buried_.load(std::memory_order_relaxed)) return;
  // The thread's own lists, swapped with the registry's: each side keeps the other's
  // capacity, so a burial on every op (the chain of dead activations a step leaves)
  // allocates nothing. A nested Burial on this thread (a recording's release running an
  // entry point) finds the lists in use and takes fresh ones.
  thread_local std::vector<std::shared_ptr<const Recording>> t_recordings;
  thread_local std::vector<c10::intrusive_ptr<c10::StorageImpl>> t_storages;
  thread_local bool t_busy = false;
  std::vector<std::shared_ptr<const Recording>> fresh_recordings;
  std::vector<c10::intrusive_ptr<c10::StorageImpl>> fresh_storages;
  const bool own = !t_busy;
  auto& recordings = own ? t_recordings : fresh_recordings;
  auto& storages = own ? t_storages : fresh_storages;
  if (!lock_.owns_lock()) lock_.lock();
  recordings.swap(registry_.graveyard_);
  storages.swap(registry_.graveyard_storages_);
  registry_.buried_.store(false, std::memory_order_relaxed);
  lock_.unlock();
  // Released here, with no lock held.
  if (own) t_busy = true;
  recordings.clear();
  storages.clear();
  if (own) t_busy = false;
}

void Registry::forget_locked(Node* node) {
  if (node->marked && program_holds_locked(node)) unmark_locked(node);
  drop_copy_locked(node);
  if (node->ordinal >= 0) {
    auto it = by_ordinal_.find(node->ordinal);
    if (it != by_ordinal_.end() && it->second == node->handle) by_ordinal_.erase(it);
  }
  if (node->key) {
    auto it = by_key_.find(node->key);
    if (it != by_key_.end() && it->second == node) by_key_.erase(it);
  }
  bury_locked(node);  // its lineage and own storage go once the lock is dropped
  nodes_.destroy(node);
}

// Note [Noticing deaths]
// ~~~~~~~~~~~~~~~~~~~~~~
// A node's storage dies when the program and autograd drop their last tensor on it (Note
// [Who holds a storage] in node.h); the registry is not told. But the storage's memory goes
// back to the engine, and a block still marked evictable when its owner frees it is noted
// there (Engine::take_freed_marked): its handle is a death, or a block the registry freed
// itself, which the node's state tells apart. Each op reads a counter and, when it moved,
// takes the handles and forgets the dead nodes no recorded op reads, then whatever only
// they read, at once. That keeps lineage from holding what it no longer needs (the small
// tensors recorded ops took as arguments) and spares walking every node to find the dead.
// The handles are taken kDeathsPerDrain at a time (each take is a call under the engine's
// lock), and all of them before anything is evicted.
// Deaths the engine cannot see — a storage dropped while evicted, or while unmarked — wait
// for the backstop sweep.
void Registry::notice_deaths_locked(bool all) {
  const engine_api::Api& api = engine_api::api();
  const std::uint64_t count = api.freed_marked_count(engine_);
  if (count == deaths_seen_ || (!all && count - deaths_seen_ < kDeathsPerDrain)) return;
  deaths_seen_ = count;
  c10::SmallVector<Handle, 16> work;
  std::uint64_t buf[64];
  int overflowed = 0;
  for (std::size_t n; (n = api.take_freed_marked(engine_, buf, 64, &overflowed)) > 0;)
    work.append(buf, buf + n);
  if (overflowed) {
    sweep_locked(/*tidy=*/false);
    return;
  }
  release_dead_locked(work);
}

void Registry::release_dead_locked(c10::SmallVectorImpl<Handle>& work) {
  // A batch for Note [Charging a batch of deaths] (release_dead_locked never nests).
  ++death_batch_;
  frontiers_.clear();
  releasing_batch_ = true;
  struct EndBatch {
    bool& on;
    ~EndBatch() { on = false; }
  } end_batch{releasing_batch_};
  while (!work.empty()) {
    Node* node = find_locked(work.back());
    work.pop_back();
    if (!node || node->pins) continue;
    if (!node->dead && node->weak.expired()) mark_dead_locked(node);
    if (program_holds_locked(node)) continue;
    if (has_readers_locked(node)) {
      if (node->stale_readers && node->dead) forget_dead_cycle_locked(node, work);
      continue;
    }
    for (const Step& step : node->steps) {  // its inputs lose a reader: look at them again
      for (const Ref& ref : step.rec->refs)
        if (ref.node != node->handle) work.push_back(ref.node);
    }
    forget_locked(node);
  }
}

// Readers of an earlier version close cycles of readers: `g.add_(c)` after `b` read `g`
// and `c` was made from `b` gives g -> b -> c -> g. Once all of a cycle is dead, each of
// its nodes still has a reader and none is ever forgotten, so a dead node with such
// readers has what it feeds walked: if nothing there is live, pinned or held by the
// program, all of it goes.
bool Registry::forget_dead_cycle_locked(Node* node, c10::SmallVectorImpl<Handle>& work) {
  c10::SmallVector<Node*, 16> members{node};
  const bool all_dead = walk_readers_locked(node, [&](Node* reader) {
    // Dead or dying, without marking it here: mark_dead_locked walks readers itself.
    const bool dead = reader->dead || reader->weak.expired();
    if (!dead || reader->pins || program_holds_locked(reader)) return Walk::kStop;
    members.push_back(reader);
    return Walk::kInto;
  });
  if (!all_dead) return false;
  for (Node* member : members)
    for (const Step& step : member->steps)
      for (const Ref& ref : step.rec->refs)
        if (ref.node != member->handle) work.push_back(ref.node);
  for (Node* member : members) forget_locked(member);
  return true;
}

void Registry::collect() {
  Lock lock(mu_);
  Burial burial(*this, lock);
  if (!active_.load()) return;
  end_stale_backwards_locked(lock);
  notice_deaths_locked(/*all=*/true);
  sweep_locked(/*tidy=*/true);
}

void Registry::sweep_locked(bool tidy) {
  std::vector<Node*> order;
  order.reserve(nodes_.size());
  for (Node* node = nodes_.oldest(); node; node = node->newer) order.push_back(node);
  // Newest first: readers before their inputs, so a whole chain goes in one pass.
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    Node* node = *it;
    if (node->pins) continue;
    if (!node->dead && node->weak.expired()) mark_dead_locked(node);
    if (program_holds_locked(node)) continue;
    if (!has_readers_locked(node)) {
      forget_locked(node);
    } else if (!node->evicted && evict_locked(node, /*eager=*/true)) {
      ++counters_.eager_evictions;  // a storage only lineage needed (the registry's own)
    }
  }
  // Dead cycles through readers of earlier versions (see forget_dead_cycle_locked).
  c10::SmallVector<Handle, 16> cyclic, work;
  for (Node* node = nodes_.oldest(); node; node = node->newer)
    if (node->stale_readers && node->dead && !node->pins) cyclic.push_back(node->handle);
  for (Handle h : cyclic) {
    Node* node = find_locked(h);
    if (node && !program_holds_locked(node)) forget_dead_cycle_locked(node, work);
  }
  release_dead_locked(work);
  if (!tidy) return;
  for (auto it = leaf_readers_.begin(); it != leaf_readers_.end();) {
    auto& readers = it->second;
    readers.erase(std::remove_if(readers.begin(), readers.end(),
                                 [&](Handle h) {
                                   Node* r = find_locked(h);
                                   return !r || !r->lineage();
                                 }),
                  readers.end());
    it = readers.empty() ? leaf_readers_.erase(it) : std::next(it);
  }
  for (Node* node = nodes_.oldest(); node; node = node->newer) {
    auto& readers = node->readers;
    readers.erase(std::remove_if(readers.begin(), readers.end(),
                                 [&](Handle r) { return nodes_.find(r) == nullptr; }),
                  readers.end());
  }
  next_sweep_ = counters_.ops + std::max<std::int64_t>(kSweepEvery, 8 * static_cast<std::int64_t>(nodes_.size()));
}

// --- inspection ------------------------------------------------------------------------------

std::string Registry::stats_json() {
  Lock lock(mu_);
  std::int64_t resident = 0, evicted_bytes = 0, swapped_bytes = 0;
  for (Node* node = nodes_.oldest(); node; node = node->newer) {
    if (!node->dead && node->weak.expired()) mark_dead_locked(node);
    if (!node->evicted) ++resident;
    if (node->evicted) evicted_bytes += static_cast<std::int64_t>(node->nbytes);
    if (node->evicted && node->clean) swapped_bytes += static_cast<std::int64_t>(node->nbytes);
  }
  const Counters& c = counters_;
  char buf[2048];
  int n = std::snprintf(
      buf, sizeof buf,
      "{\"ops\":%" PRId64 ",\"evictions\":%" PRId64 ",\"eager_evictions\":%" PRId64
      ",\"recomputes\":%" PRId64 ",\"recompute_ns\":%" PRId64 ",\"frozen\":%" PRId64
      ",\"relocations\":%" PRId64 ",\"nodes\":%zu,\"resident_nodes\":%" PRId64
      ",\"evicted_bytes\":%" PRId64 ",\"backward_threads\":%" PRId64
      ",\"backward_nodes\":%" PRId64 ",\"backward_kept\":%" PRId64,
      c.ops, c.evictions, c.eager_evictions, c.recomputes, c.recompute_ns, c.frozen,
      c.relocations, nodes_.size(), resident, evicted_bytes, c.backward_threads,
      c.backward_nodes, c.backward_kept);
  std::string out(buf, static_cast<std::size_t>(n));
  if (can_relocate_) {
    n = std::snprintf(
        buf, sizeof buf,
        ",\"swap_outs\":%" PRId64 ",\"swap_out_bytes\":%" PRId64 ",\"swap_ins\":%" PRId64
        ",\"swap_in_bytes\":%" PRId64 ",\"swap_wait_ns\":%" PRId64 ",\"swap_fallbacks\":%" PRId64
        ",\"swap_failures\":%" PRId64 ",\"prefetches\":%" PRId64 ",\"prefetch_hits\":%" PRId64
        ",\"prefetch_ready\":%" PRId64 ",\"chose_swap\":%" PRId64 ",\"chose_recompute\":%" PRId64
        ",\"swapped_bytes\":%" PRId64,
        c.swap_outs, c.swap_out_bytes, c.swap_ins, c.swap_in_bytes, c.swap_wait_ns,
        c.swap_fallbacks, c.swap_failures, c.prefetches, c.prefetch_hits, c.prefetch_ready,
        c.chose_swap, c.chose_recompute, swapped_bytes);
    out.append(buf, static_cast<std::size_t>(n));
  }
  return out + "}";
}

std::vector<Handle> Registry::handles() {
  Lock lock(mu_);
  std::vector<Handle> out;
  out.reserve(nodes_.size());
  for (Node* node = nodes_.oldest(); node; node = node->newer) out.push_back(node->handle);
  return out;
}

bool Registry::node_info(Handle handle, NodeInfo* out) {
  Lock lock(mu_);
  Node* node = find_locked(handle);
  if (!node) return false;
  if (!node->dead && node->weak.expired()) mark_dead_locked(node);
  out->handle = node->handle;
  out->key = reinterpret_cast<std::uintptr_t>(node->key);
  out->nbytes = node->nbytes;
  out->pins = node->pins;
  out->chain = static_cast<std::int32_t>(node->steps.size());
  out->readers = static_cast<std::int32_t>(node->readers.size());
  out->evicted = node->evicted;
  out->dead = node->dead;
  out->frozen = node->frozen;
  out->fixed = node->fixed;
  out->clean = node->clean;
  out->marked = node->marked;
  std::string op;
  if (node->lineage()) {
    const c10::OperatorName& name = node->steps.front().rec->op.operator_name();
    op = name.name + "." + name.overload_name;
  }
  std::snprintf(out->op, sizeof out->op, "%s", op.c_str());
  const c10::StorageImpl* s = node->evicted ? nullptr : node->peek();
  out->data = s ? reinterpret_cast<std::uintptr_t>(s->data_ptr().get()) : 0;
  return true;
}

Handle Registry::handle_of(const void* storage_impl) {
  Lock lock(mu_);
  Node* node = by_key_locked(static_cast<const c10::StorageImpl*>(storage_impl));
  return node ? node->handle : 0;
}

void Registry::set_copy_bandwidth(double bytes_per_s) {
  Lock lock(mu_);
  copy_bw_ = bytes_per_s;
}

std::string Registry::check_invariants() {
  Lock lock(mu_);
  for (Node* node = nodes_.oldest(); node; node = node->newer) {
    char where[64];
    std::snprintf(where, sizeof where, "node %" PRIu64 ": ", node->handle);
    // A storage the program dropped since the last look: its death is noticed lazily.
    if (!node->dead && node->weak.expired()) mark_dead_locked(node);
    c10::intrusive_ptr<c10::StorageImpl> s = node->storage();
    if (node->evicted && s && s->nbytes() != 0 && !node->dead)
      return std::string(where) + "evicted, but its storage still holds data";
    if (!node->evicted && !node->dead && (!s || s->nbytes() != node->nbytes))
      return std::string(where) + "resident, but its storage is gone or holds another size";
    if (node->dead && node->key) return std::string(where) + "dead, but still keyed";
    if (node->frozen && node->lineage()) return std::string(where) + "frozen with lineage";
    if (node->pins < 0) return std::string(where) + "negative pins";
    if (node->pins > 0 && node->evicted) return std::string(where) + "pinned while evicted";
    if (node->key) {
      Node* keyed = by_key_locked(node->key);
      if (keyed != node) return std::string(where) + "by_key does not lead back to it";
    }
    for (const Step& step : node->steps) {
      for (const Ref& ref : step.rec->refs) {
        if (ref.node != node->handle && !find_locked(ref.node))
          return std::string(where) + "its lineage reads a forgotten node";
      }
    }
  }
  return "";
}

}  // namespace pyalloc::registry

namespace pyalloc::registry {

void Registry::set_floor_probe(bool on) {
  Lock lock(mu_);
  floor_probe_ = on;
  floor_bytes_ = floor_allocated_ = floor_droppable_ = 0;
  floor_op_.clear();
}

std::string Registry::floor_json() {
  Lock lock(mu_);
  std::string op;
  for (char c : floor_op_) op += c == ':' ? '.' : c;  // "aten::mul.Tensor" -> "aten..mul..."
  // PyTorch names ops "aten.mul.Tensor" in Python: one dot for the namespace's "::".
  std::string name;
  for (std::size_t i = 0; i < op.size(); ++i) {
    if (op[i] == '.' && i + 1 < op.size() && op[i + 1] == '.') continue;
    name += op[i];
  }
  char buf[256];
  std::snprintf(buf, sizeof buf, "{\"bytes\":%" PRIu64 ",\"allocated\":%" PRIu64
                ",\"droppable\":%" PRIu64 ",\"op\":\"", floor_bytes_, floor_allocated_,
                floor_droppable_);
  return buf + name + "\"}";
}

}  // namespace pyalloc::registry
