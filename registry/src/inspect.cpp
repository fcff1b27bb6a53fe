// inspect.cpp — what the registry shows: its counters as JSON, node info, the invariant check, the floor probe.
#include "own_ops.h"
#include "registry.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <string>

namespace pyalloc::registry {
// --- inspection ------------------------------------------------------------------------------

// Note [What the registry adds to a report]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The engine's report sees blocks: evictable, or not. Under recompute, activations whose
// lineage was cut (frozen: what they were made from was freed, resized or written where
// the registry could not follow) are resident nodes that can neither be recomputed nor,
// with spill off, move, and to the engine they look like parameters. FSDP2 under
// recompute ran out of memory at 0.5 of its peak with 47 MiB of them and 128 KiB evictable,
// and the report blamed fragmentation: resharding frees each gathered parameter with
// `resize_(0)`, which freezes everything recorded from it (Note [Storages resized outside
// the dispatcher] in restore.cpp). So the report asks the registry, which names those bytes
// and the ways out. Called by the engine with its own lock dropped; the registry never
// allocates while it holds its mutex (an allocation may call back to evict), so taking the
// mutex here cannot deadlock on this thread.
// The frozen line names the common ways to cut lineage: beside FSDP's resharding, a plain
// training loop that keeps the previous step's outputs (`out = model(x)`, reassigned only by
// the next call) across an optimizer step that writes the weights they were made from
// (Hugging Face's Qwen2 with a tied head kept 12 MiB of logits that way).
// A request can also fail inside a replay: restoring an evicted activation rebuilds its
// dead inputs first, each pinned while the replays above it run (Note [Pinning inside
// replays] in restore.cpp), and those pins, not fragmentation, are what the engine cannot
// move (wav2vec2 under recompute at 0.4: a replay from a layer's softmax backward reached
// back into the layer before it, with 77 MiB pinned). So a failure with replays in flight
// says how deep and how much they pin.
std::size_t Registry::describe_oom(char* out, std::size_t capacity) {
  Lock lock(mu_);
  if (!active_.load() || capacity == 0) return 0;
  // The bytes and count of the resident nodes `pick` picks.
  const auto resident = [this](auto pick) {
    std::pair<std::uint64_t, std::size_t> sum{0, 0};
    for (const Node* node = nodes_.oldest(); node; node = node->newer) {
      const c10::StorageImpl* s = node->peek();
      if (node->evicted || !s || !data_of(&*s) || !pick(*node)) continue;
      sum.first += node->nbytes;
      ++sum.second;
    }
    return sum;
  };
  std::string text;
  char line[1024];
  const auto append = [&](int n) {
    if (n > 0) text.append(line, std::min(static_cast<std::size_t>(n), sizeof line - 1));
  };
  if (replays_in_flight_ > 0) {
    const auto [pinned, count] = resident([](const Node& node) { return node.pins > 0; });
    append(std::snprintf(
        line, sizeof line,
        "  registry: the request came from a replay %d deep (an evicted activation is rebuilt "
        "from what it was made from, each input held while the replays above it run); %.2f "
        "MiB in %zu activations are pinned until it ends, which the engine can neither evict "
        "nor move. A slightly larger budget lets the chain be rebuilt; under swap or hybrid "
        "such activations come back as copies instead.%s",
        replays_in_flight_, static_cast<double>(pinned) / (1 << 20), count,
        // Such a victim is a copy with spill on (Note [Spilling under recompute] in
        // evict.cpp): RetinaNet and FCOS under recompute at half their peaks failed in
        // clip_grad_norm_, restoring a parameter's gradient evicted in backward 31-36
        // replays deep, and with a host pool trained, bit-identically
        // (tools/user_programs/tv_detection.py).
        can_relocate_ ? ""
                      : " Under recompute, the option spill (off here; on by default) sends a "
                        "victim whose replay would rebuild this much (a parameter's gradient "
                        "evicted in backward, say) to host memory instead."));
  }
  if (!can_swap_ && !can_relocate_) {  // else frozen nodes can leave
    // Frozen in a backward pass: not the program's doing (Note [How long a chain may grow]
    // in registry.cpp, Note [Gradients bound for .grad] in backward.cpp), so not its remedy.
    const auto [frozen_in_backward, backward_count] = resident(
        [](const Node& node) { return !node.lineage() && !node.fixed && node.backward; });
    if (frozen_in_backward >= (1u << 20)) {
      append(std::snprintf(
          line, sizeof line,
          "%s  registry: %.2f MiB in %zu gradients this backward pass made cannot be "
          "recomputed: buffers autograd wrote in place again and again (it sums a gradient "
          "into one buffer from each reader of a tensor: a recurrent network's timesteps, "
          "slices of one tensor), or gradients bound for a parameter's .grad; they stay until "
          "the pass lets them go. Under swap or hybrid, or with the option spill (off here; "
          "on by default), they can leave as host copies.",
          text.empty() ? "" : "\n", static_cast<double>(frozen_in_backward) / (1 << 20),
          backward_count));
    }
    if (saw_tangents_) {
      append(std::snprintf(
          line, sizeof line,
          "%s  registry: the program runs forward-mode AD (dual tensors): under recompute the "
          "tangents its ops' formulas make are not recorded and stay resident until the "
          "program lets them go. With the option spill (off here; on by default), or policy "
          "swap or hybrid, they are tracked and can leave as host copies.",
          text.empty() ? "" : "\n"));
    }
    if (saw_subclasses_) {
      append(std::snprintf(
          line, sizeof line,
          "%s  registry: the program's ops run on Python tensor subclasses (nested or jagged "
          "tensors, tensor wrappers): under recompute what they make inside is not recorded "
          "and stays resident until the program lets it go. With the option spill (off here; "
          "on by default), or policy swap or hybrid, it is tracked and can leave as host "
          "copies.",
          text.empty() ? "" : "\n"));
    }
    const auto [frozen, count] = resident(
        [](const Node& node) { return !node.lineage() && !node.fixed && !node.backward; });
    if (frozen >= (1u << 20)) {
      append(std::snprintf(
          line, sizeof line,
          "%s  registry: %.2f MiB in %zu activations can no longer be recomputed (what they "
          "were made from was written, freed or resized where the registry could not follow "
          "it: an optimizer step on the weights while the program still holds the previous "
          "step's outputs, or FSDP's resharding, which frees each gathered parameter with "
          "resize_(0)), so under recompute they stay until the program lets them go. Drop "
          "such outputs before the next step (`del out`); to let them leave, use policy swap "
          "or hybrid, or turn the option spill back on (they then move out through the host "
          "pool); with "
          "FSDP2, fully_shard(..., reshard_after_forward=False) keeps them recomputable.",
          text.empty() ? "" : "\n", static_cast<double>(frozen) / (1 << 20), count));
    }
  }
  const std::size_t n = std::min(text.size(), capacity - 1);
  std::memcpy(out, text.data(), n);
  out[n] = '\0';
  return n;
}

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
      ",\"leaf_copies\":%" PRId64 ",\"leaf_copy_bytes\":%" PRId64
      ",\"relocations\":%" PRId64 ",\"nodes\":%zu,\"resident_nodes\":%" PRId64
      ",\"evicted_bytes\":%" PRId64 ",\"backward_threads\":%" PRId64
      ",\"backward_nodes\":%" PRId64 ",\"backward_kept\":%" PRId64,
      c.ops, c.evictions, c.eager_evictions, c.recomputes, c.recompute_ns, c.frozen,
      c.leaf_copies, c.leaf_copy_bytes, c.relocations, nodes_.size(), resident, evicted_bytes,
      c.backward_threads, c.backward_nodes, c.backward_kept);
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

std::string Registry::replays_json() {
  Lock lock(mu_);
  std::string out = "{";
  for (const auto& [name, count] : replays_by_op_) {
    if (out.size() > 1) out += ",";
    // Operator names are identifiers and dots: nothing to escape.
    out += "\"" + name.name + (name.overload_name.empty() ? "" : "." + name.overload_name) +
           "\":" + std::to_string(count);
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
  out->last_resort = replay_too_dear(node);
  std::string op;
  if (node->lineage()) {
    const c10::OperatorName& name = node->steps.front().rec->op.operator_name();
    op = name.name + "." + name.overload_name;
  }
  std::snprintf(out->op, sizeof out->op, "%s", op.c_str());
  const c10::StorageImpl* s = node->evicted ? nullptr : node->peek();
  out->data = s ? reinterpret_cast<std::uintptr_t>(data_of(&*s)) : 0;
  out->cost = node->cost;
  out->dead_bytes = node->dead_bytes;
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

void Registry::set_replay_limits(int in_order, int give_up, int* was) {
  was[0] = replay_in_order_.load();
  was[1] = replay_give_up_.load();
  if (in_order > 0) replay_in_order_.store(in_order);
  if (give_up > 0) replay_give_up_.store(give_up);
}

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
