// registry.cpp — nodes and their lineage: recording, readers, freezing, liveness, stats.
#include "registry.h"

#include <ATen/Context.h>
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <thread>

namespace pyalloc::registry {
namespace {

// A chain longer than this is frozen: replaying it would cost more than it saves.
constexpr std::size_t kMaxChain = 8;
// The "model" cost weighs FLOPs against bytes at this arithmetic intensity.
constexpr double kFlopsPerByte = 64.0;

c10::intrusive_ptr<c10::StorageImpl> strong(const at::Tensor& t) {
  return c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(t.storage().unsafeGetStorageImpl());
}

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
  next_sweep_ = 256;
  last_evict_sweep_ = -1;
  owner_thread_ = std::hash<std::thread::id>{}(std::this_thread::get_id());
  seen_threads_.clear();
  ordinal_ = 0;
  by_ordinal_.clear();
  in_backward_ = false;
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
  if (!active_.load()) return error;
  active_.store(false, std::memory_order_release);
  const engine_api::Api& api = engine_api::api();
  api.set_evict_callback(engine_, nullptr, nullptr);
  api.set_compact_callbacks(engine_, nullptr, nullptr, nullptr);
  // Forgetting takes each node's mark and host copy with it; the registry's own storages
  // (dead nodes' rebuilt contents, frozen inputs) are released.
  std::vector<Node*> all;
  for (auto& [h, node] : nodes_) all.push_back(node.get());
  for (Node* node : all) {
    node->pins = 0;
    forget_locked(node);
  }
  leaf_readers_.clear();
  by_ordinal_.clear();
  return error;
}

// --- lookups ---------------------------------------------------------------------------------

Node* Registry::find_locked(Handle handle) {
  auto it = nodes_.find(handle);
  return it == nodes_.end() ? nullptr : it->second.get();
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
    auto it = nodes_.find(h);
    if (it != nodes_.end() && it->second->lineage()) return true;
  }
  return false;
}

// --- recording -------------------------------------------------------------------------------

double Registry::cost_of(const OpInfo& info, const std::vector<c10::IValue>& args,
                         const std::vector<at::Tensor>& outputs, std::int64_t elapsed_ns) const {
  if (settings_.cost == CostModel::kTime) return static_cast<double>(std::max<std::int64_t>(elapsed_ns, 1));
  double out_bytes = 0;
  for (const at::Tensor& o : outputs)
    if (o.defined() && o.has_storage()) out_bytes += static_cast<double>(o.storage().nbytes());
  if (settings_.cost == CostModel::kBytes) return std::max(out_bytes, 1.0);
  double in_bytes = 0;
  auto count = [&](const c10::IValue& v) {
    if (v.isTensor() && v.toTensor().defined())
      in_bytes += static_cast<double>(v.toTensor().numel() * v.toTensor().element_size());
  };
  for (const c10::IValue& v : args) {
    if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) {
        if (t.defined()) in_bytes += static_cast<double>(t.numel() * t.element_size());
      }
    } else {
      count(v);
    }
  }
  double flops = 0;
  // Multiply-adds of the compute-bound ops (x2), from shapes.
  auto tensor_arg = [&](std::size_t i) -> const at::Tensor* {
    return i < args.size() && args[i].isTensor() ? &args[i].toTensor() : nullptr;
  };
  if (!outputs.empty() && outputs[0].defined() && info.flops != Flops::kNone) {
    const double out = static_cast<double>(outputs[0].numel());
    if (info.flops == Flops::kMatmul || info.flops == Flops::kMatmulWithBias) {
      const at::Tensor* a = tensor_arg(info.flops == Flops::kMatmul ? 0 : 1);
      if (a && a->dim() > 0) flops = 2.0 * out * static_cast<double>(a->size(-1));
    } else if (const at::Tensor* w = tensor_arg(1); w && w->dim() > 0) {
      flops = 2.0 * out * static_cast<double>(w->numel() / std::max<std::int64_t>(1, w->size(0)));
    }
  }
  return std::max(in_bytes + out_bytes, 1.0) + flops / kFlopsPerByte;
}

std::shared_ptr<Recording> Registry::make_recording_locked(
    const c10::OperatorHandle& op, const OpInfo& info, const std::vector<c10::IValue>& args,
    std::vector<Node*>* inputs, std::vector<const c10::StorageImpl*>* leaves) {
  auto rec = std::make_shared<Recording>(op);
  rec->args = args;
  rec->written = info.written;
  // A registered storage becomes a Ref; anything else is kept as it is. A tensor with an
  // autograd history is kept as a detached alias, so lineage never keeps a graph alive.
  auto convert = [&](const at::Tensor& t, std::uint16_t arg, std::int32_t element,
                     at::Tensor* keep) -> bool {
    if (!t.defined() || !t.has_storage()) return false;
    const c10::StorageImpl* key = t.storage().unsafeGetStorageImpl();
    Node* node = by_key_locked(key);
    if (!node) {
      leaves->push_back(key);
      if (t.requires_grad() && !t.is_leaf()) *keep = t.variable_data();
      return false;
    }
    if (std::find(inputs->begin(), inputs->end(), node) == inputs->end()) inputs->push_back(node);
    Ref ref;
    ref.node = node->handle;
    ref.version = node->version;
    ref.offset = t.storage_offset();
    ref.sizes.assign(t.sizes().begin(), t.sizes().end());
    ref.strides.assign(t.strides().begin(), t.strides().end());
    ref.dtype = t.scalar_type();
    ref.arg = arg;
    ref.element = element;
    rec->refs.push_back(std::move(ref));
    return true;
  };
  for (std::size_t i = 0; i < rec->args.size(); ++i) {
    c10::IValue& v = rec->args[i];
    const auto arg = static_cast<std::uint16_t>(i);
    if (v.isTensor()) {
      at::Tensor keep;
      if (convert(v.toTensor(), arg, -1, &keep)) v = c10::IValue();
      else if (keep.defined()) v = keep;
    } else if (v.isTensorList()) {
      // The list is the caller's: convert a copy.
      c10::List<at::Tensor> list = v.toTensorList().copy();
      for (std::size_t j = 0; j < list.size(); ++j) {
        at::Tensor keep;
        if (convert(list.get(j), arg, static_cast<std::int32_t>(j), &keep)) list.set(j, at::Tensor());
        else if (keep.defined()) list.set(j, keep);
      }
      v = list;
    } else if (v.isList() && !v.isIntList() && !v.isDoubleList() && !v.isBoolList()) {
      c10::impl::GenericList list = v.toList().copy();  // Tensor?[] (index) and the like
      for (std::size_t j = 0; j < list.size(); ++j) {
        c10::IValue e = list.get(j);
        if (!e.isTensor()) continue;
        at::Tensor keep;
        if (convert(e.toTensor(), arg, static_cast<std::int32_t>(j), &keep)) list.set(j, c10::IValue());
        else if (keep.defined()) list.set(j, keep);
      }
      v = list;
    }
  }
  return rec;
}

void Registry::add_reader_locked(Node* reader, const std::vector<Node*>& inputs,
                                 const std::vector<const c10::StorageImpl*>& leaves) {
  for (Node* input : inputs) {
    if (input == reader) continue;
    input->readers.push_back(reader->handle);
    // Nothing could bring a frozen input back: keep it while it is read. See Note [Who
    // holds a storage].
    if (!input->lineage() && !input->held) input->held = input->storage();
  }
  for (const c10::StorageImpl* key : leaves) leaf_readers_[key].push_back(reader->handle);
}

void Registry::record_creation_locked(const c10::OperatorHandle& op, const OpInfo& info,
                                      const std::vector<c10::IValue>& args,
                                      std::vector<const c10::StorageImpl*>& read_keys,
                                      c10::ArrayRef<c10::IValue> outputs,
                                      std::optional<at::Generator> rng,
                                      std::optional<at::Generator> generator,
                                      std::int64_t elapsed_ns) {
  std::vector<at::Tensor> results;
  for (const c10::IValue& v : outputs) {
    if (v.isTensor()) results.push_back(v.toTensor());
    else if (v.isTensorList())
      for (const at::Tensor& t : v.toTensorList()) results.push_back(t);
  }
  // New storages on the managed device: not a view of an input, not known already, not
  // small, and freeable.
  std::vector<std::uint32_t> fresh;
  for (std::uint32_t i = 0; i < results.size(); ++i) {
    const at::Tensor& o = results[i];
    if (!o.defined() || !o.has_storage() || o.device().type() != settings_.device_type) continue;
    c10::StorageImpl* key = o.storage().unsafeGetStorageImpl();
    if (std::find(read_keys.begin(), read_keys.end(), key) != read_keys.end()) continue;
    if (by_key_.count(key) || key->nbytes() < settings_.min_bytes || !key->resizable()) continue;
    read_keys.push_back(key);  // two results on one storage make one node
    fresh.push_back(i);
  }
  if (fresh.empty()) return;
  std::vector<Node*> inputs;
  std::vector<const c10::StorageImpl*> leaves;
  std::shared_ptr<Recording> rec = make_recording_locked(op, info, args, &inputs, &leaves);
  rec->cost = cost_of(info, args, results, elapsed_ns);
  rec->rng = std::move(rng);
  rec->generator = std::move(generator);
  for (std::uint32_t i : fresh) {
    auto owned = std::make_unique<Node>(next_handle_++, strong(results[i]));
    Node* node = owned.get();
    node->steps.push_back(Step{rec, i});
    node->cost = rec->cost;
    nodes_.emplace(node->handle, std::move(owned));
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
    mark_locked(node);
  }
}

void Registry::record_mutation_locked(const c10::OperatorHandle& op, const OpInfo& info,
                                      const std::vector<c10::IValue>& args,
                                      const std::vector<Node*>& targets, bool replayable,
                                      std::optional<at::Generator> rng,
                                      std::optional<at::Generator> generator,
                                      std::int64_t elapsed_ns) {
  for (Node* node : targets) drop_copy_locked(node);  // their host copies are stale now
  Node* target = targets.front();
  if (targets.size() > 1 || !replayable || target->frozen || !target->lineage() ||
      target->steps.size() >= kMaxChain) {
    for (Node* node : targets) {
      ++node->version;
      freeze_locked(node);
    }
    return;
  }
  std::vector<Node*> inputs;
  std::vector<const c10::StorageImpl*> leaves;
  std::shared_ptr<Recording> rec = make_recording_locked(op, info, args, &inputs, &leaves);
  rec->cost = cost_of(info, args, {}, elapsed_ns);
  rec->rng = std::move(rng);
  rec->generator = std::move(generator);
  target->steps.push_back(Step{rec, 0});
  ++target->version;
  target->cost += rec->cost;
  add_reader_locked(target, inputs, leaves);
  if (target->marked) target->marked = false;  // offered again below with its new cost
  mark_locked(target);
}

// --- writes ----------------------------------------------------------------------------------

void Registry::invalidate_readers(Lock& lock, const c10::StorageImpl* key) {
  std::vector<Handle> readers;
  if (Node* node = by_key_locked(key)) {
    readers.swap(node->readers);
  } else {
    auto it = leaf_readers_.find(key);
    if (it == leaf_readers_.end()) return;
    readers.swap(it->second);
    leaf_readers_.erase(it);
  }
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
    }
    if (reader->evicted) {
      try {
        restore_now(lock, reader);  // while its inputs still hold what it was made from
      } catch (...) {
        // The write will not happen (the op fails): the readers not yet frozen still read
        // the current contents.
        std::vector<Handle> rest(readers.begin() + static_cast<std::ptrdiff_t>(i), readers.end());
        if (Node* node = by_key_locked(key)) {
          node->readers.insert(node->readers.end(), rest.begin(), rest.end());
        } else {
          auto& leaf = leaf_readers_[key];
          leaf.insert(leaf.end(), rest.begin(), rest.end());
        }
        throw;
      }
      reader = find_locked(readers[i]);
      if (!reader) continue;
    }
    freeze_locked(reader);
  }
}

void Registry::freeze_locked(Node* node) {
  if (node->frozen) return;
  if (!node->dead && node->weak.expired()) mark_dead_locked(node);
  unmark_locked(node);
  node->frozen = true;
  node->steps.clear();  // releases its inputs
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
  nodes_.erase(node->handle);  // releases `held`: the registry's own storage is freed
}

void Registry::sweep_locked(bool tidy) {
  std::vector<Node*> order;
  order.reserve(nodes_.size());
  for (auto& [h, node] : nodes_) order.push_back(node.get());
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
  for (auto& [h, node] : nodes_) {
    auto& readers = node->readers;
    readers.erase(std::remove_if(readers.begin(), readers.end(),
                                 [&](Handle r) { return nodes_.find(r) == nodes_.end(); }),
                  readers.end());
  }
  next_sweep_ = counters_.ops + std::max<std::int64_t>(256, 2 * static_cast<std::int64_t>(nodes_.size()));
}

// --- inspection ------------------------------------------------------------------------------

std::string Registry::stats_json() {
  Lock lock(mu_);
  std::int64_t resident = 0, evicted_bytes = 0, swapped_bytes = 0;
  for (auto& [h, node] : nodes_) {
    if (!node->dead && node->weak.expired()) mark_dead_locked(node.get());
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
      ",\"evicted_bytes\":%" PRId64 ",\"backward_threads\":%" PRId64,
      c.ops, c.evictions, c.eager_evictions, c.recomputes, c.recompute_ns, c.frozen,
      c.relocations, nodes_.size(), resident, evicted_bytes, c.backward_threads);
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
  for (auto& [h, node] : nodes_) out.push_back(h);
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
  for (auto& [h, owned] : nodes_) {
    Node* node = owned.get();
    char where[64];
    std::snprintf(where, sizeof where, "node %" PRIu64 ": ", h);
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
