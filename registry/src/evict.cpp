// evict.cpp — the engine's side: what is offered as evictable, evicting, and compaction.
#include <cstdio>
#include <unordered_map>

#include "own_ops.h"
#include "registry.h"

namespace pyalloc::registry {
namespace {

// Under recompute with relocation, moving a storage out costs this many times its bytes'
// worth, so that the engine's strategies take anything recomputable first.
constexpr double kRelocatePenalty = 64.0;

}  // namespace

// --- marks -----------------------------------------------------------------------------------

// Note [A restore needs its dead lineage's memory]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Evicting a node frees its bytes now; bringing it back needs them again, and first every
// dead node its replay rebuilds on the way (Note [Dead inputs cost their readers] in
// liveness.cpp), each pinned while the replays above it run (Note [Pinning inside
// replays] in restore.cpp). `cost` prices the time; nothing priced the memory, and a
// gradient late in backward can only be rebuilt by replaying the backward from the loss
// down to it. Where a concatenation's gradient is consumed piece by piece, such a
// gradient lives long: autograd's CatBackward hands out slices of it, which wait in the
// input buffers of the ops that made the concatenated tensors until every later reader
// of those tensors has added its share (DenseNet: the 8 MiB gradient of a dense block's
// output, a view of which each of the block's features holds until the block's backward
// reaches it), so it grows stale between uses and the engine takes it. At 0.4 of
// DenseNet's peak (43 MiB) it did, one op before the next sum into one of its slices:
// that replay had 39 MiB of dead lineage to rebuild (the block's other gradients 30–85
// MiB), sixteen nested replays deep, whose restores evicted one another's and ran out of
// memory with everything pinned (or, where it also asked for the weight gradient, on that:
// Note [Replaying one result of a backward op]). DenseNet's least budget was 0.45 of its
// peak under both strategies, its floor 0.32.
// So a node whose dead lineage alone weighs more than a share of the budget (see below) is a
// victim of last resort (Note [Last-resort victims] in allocator/src/block.h): it stays
// resident (compaction may still move it) for as long as any other rung can serve a request,
// and is dropped only where the alternative is an out-of-memory error. With a host pool
// (`relocate`) it leaves as a host copy instead, like a node without lineage. `dead_bytes` is
// counted as `cost` is — a death adds the dead node's bytes and its own dead_bytes to each
// live node reached through dead readers, a gradient inherits its backward inputs' when it is
// made — so it can only overestimate (a dead node rebuilt and held still counts, and one
// reached along two paths counts twice), which errs towards keeping.
// A share of the budget, not a multiple of the node's bytes: the GRU's per-timestep states
// have dead lineage a hundred times their size, a few MiB, and are the victims that let
// it train; a bound of four times the node's bytes took its least budget from 0.44 to
// 0.79. Nor never dropped (the rule's first form, 3ee4208, reverted): a packed
// bidirectional LSTM's per-timestep states have dead lineage counted beyond the budget,
// and at 0.7 of its peak they were the only victims that could serve its 2.7 MiB
// requests. Under swap and hybrid backward nodes have no lineage and the rule does not
// apply. Measured with the first form (tools/bench_remat.py, window / dtr): DenseNet 0.45
// / 0.45 -> 0.42 / 0.39 (the zoo test's 0.4 trains), transformer 0.33 / 0.30 -> 0.26 /
// 0.26, zoo UNet 0.35 / 0.42 -> 0.30 / 0.35, GRU LM 0.44 / 0.44 -> 0.39 / 0.44, CNN 0.30
// unchanged.
// Since 2026-11-27 (sixteenth session) the bound is kReplayShareOfBudget of the budget, not
// all of it. A replay needs its dead lineage's bytes on top of everything that cannot
// leave meanwhile: parameters, gradients and optimizer state (up to a quarter of the zoo's
// peaks, so up to 0.6 of a budget at 0.4 of the peak), the live activations the pass
// still reads, and the inputs pinned along the replay. With the whole budget as the
// bound, such replays were still chosen and ran out of memory deep inside: the zoo's
// ResNet at 0.3 of its peak inside a replay 24 deep, rebuilding the gradient of a
// residual stream (a ReLU's, 512 KiB, whose replay went back through the backward from
// the loss and the forward to the stem: 6.9 MiB of dead lineage in a 12.6 MiB budget).
// Measured over the bound's share (tools/bench_remat.py, window, the zoo with the CNN and
// the transformer; least budget as a fraction of the peak, for 1 / 0.75 / 0.5 / 0.375 /
// 0.3 / 0.25): ResNet 0.35 / 0.35 / 0.35 / 0.29 / 0.29 / 0.29; GPT-2 0.23 / 0.23 / 0.23 /
// 0.23 / 0.21 / 0.18; TCN 0.26 / 0.21 / 0.21 / 0.21 / 0.21 / 0.26; CNN 0.30 / 0.30 / 0.26
// / 0.26 / 0.26 / 0.26; MLP-Mixer 0.18 / 0.18 / 0.18 / 0.21 / 0.21 / 0.21; DenseNet 0.38
// / 0.39 / 0.39 / 0.39 / 0.39 / 0.42 (the zoo test's 0.4 then fails); MobileNet 0.39
// throughout, with 358 / 358 / 383 / 366 / 264 / 124 evictions a step at half its peak;
// the GRU, LSTM, UNet, ViT, Llama, BERT and the transformer unchanged. 0.3 is the share
// that gains the most without losing DenseNet.
namespace {
constexpr double kReplayShareOfBudget = 0.3;
}  // namespace

bool Registry::replay_too_dear(const Node* node) const {
  return !can_swap_ && node->lineage() && budget_ > 0 &&
         (node->for_grad ||  // Note [Gradients bound for .grad] in backward.cpp
          node->dead_bytes > kReplayShareOfBudget * static_cast<double>(budget_));
}

// The budget changes rarely (Engine::set_budget); it is read when the registry starts and
// whenever the engine asks for victims, when it matters. A node marked under an older
// budget keeps its mark's kind until it is marked again (after its next use).
void Registry::refresh_budget_locked() {
  std::uint64_t unallocated = 0, allocated = 0, peak = 0;
  if (engine_api::api().unallocated(engine_, &unallocated) == 0 &&
      engine_api::api().allocated(engine_, &allocated, &peak) == 0)
    budget_ = unallocated + allocated;
}

void Registry::mark_locked(Node* node) {
  if (!try_mark_locked(node) && !node->dead && node->weak.expired()) mark_dead_locked(node);
}

bool Registry::try_mark_locked(Node* node) {
  if (node->pins || node->evicted || node->fixed || (!node->lineage() && !can_relocate_)) return true;
  const c10::StorageImpl* s = node->peek();
  void* ptr = s ? data_of(&*s) : nullptr;
  if (!ptr) return false;
  // set_evictable overwrites an earlier mark: it also updates the cost.
  const auto& api = engine_api::api();
  // Note [A restore needs its dead lineage's memory]: such a node is a victim of last resort.
  const auto set = (!can_relocate_ || node->spill_refused) && replay_too_dear(node)
                       ? api.set_last_resort_evictable
                       : api.set_evictable;
  if (set(engine_, ptr, node->handle, eviction_cost_locked(node)) == 0) {
    node->marked = true;
    node->last_tick = ++ticks_;
  } else {
    node->fixed = true;  // not the engine's memory: it could never free it
  }
  return true;
}

void Registry::unmark_locked(Node* node) {
  if (!node->marked) return;
  node->marked = false;
  const c10::StorageImpl* s = node->peek();
  if (s && data_of(&*s)) engine_api::api().set_evictable(engine_, data_of(&*s), 0, 0);
}

// Note [Touches]
// ~~~~~~~~~~~~~~
// The engine ranks victims by staleness on a logical clock that ticks once per mark and
// touch it is sent of a block of 16 KiB or more (Note [What moves the clock] in
// allocator/src/evictor.h). Most uses of a node come right after it was made (the next op
// reads it), when its mark is a tick or two old: a touch then would change its staleness by
// as much, and costs an engine call (its lock and a lookup) on most ops. So a use within
// kTouchSlack marks and touches sent of the node's last is not sent; the engine's clock
// moved by at most as many ticks, so the ranking is off by at most that many, the same way
// in every run. ticks_ counts what is sent whatever its size: counting only what moves the
// engine's clock sent fewer touches of large nodes among many small ones, and the zoo's
// GPT-2 then needed 10.5 MiB under recompute against 8.5 (bench_remat, 2026-11-28).
constexpr std::uint64_t kTouchSlack = 4;

void Registry::touch_locked(Node* node) {
  if (ticks_ - node->last_tick <= kTouchSlack) return;
  const c10::StorageImpl* s = node->peek();
  if (!s || !data_of(&*s)) return;
  engine_api::api().touch(engine_, data_of(&*s));
  node->last_tick = ++ticks_;
}

// Pinning leaves the engine's mark in place: inputs are pinned and unpinned on every op,
// and telling the engine each time would be a call per input per op. A pinned node the
// engine chooses anyway is refused (evict_locked) and leaves its set; unpinning marks it
// again. Unpinning a node still marked is a use: a touch, for staleness.
void Registry::unpin_locked(Node* node) {
  if (--node->pins > 0) return;
  if (node->marked) touch_locked(node);
  else mark_locked(node);
}

double Registry::eviction_cost_locked(const Node* node) const {
  // What evicting costs later, in the cost model's unit: the recompute, or moving the
  // bytes (out and back, or only back when the host copy is clean).
  if (!can_relocate_ ||
      (!can_swap_ && node->lineage() && (!replay_too_dear(node) || node->spill_refused)))
    return node->cost;
  double moved = static_cast<double>(node->clean ? node->nbytes : 2 * node->nbytes);
  if (settings_.cost == CostModel::kTime) moved = moved / std::max(copy_bw_, 1.0) * 1e9;
  if (!can_swap_) return moved * kRelocatePenalty;  // recompute with relocation: last
  if (!node->lineage() || settings_.policy == Policy::kSwap) return moved;
  return std::min(moved, node->cost);
}

// --- evicting --------------------------------------------------------------------------------

// Note [Spilling under recompute]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Recompute frees a victim's bytes by dropping them and replays its lineage on the next
// use. Two kinds of victim that cannot come back that way within the budget: a storage
// with no lineage (frozen: written by an op that cannot be replayed), which could never
// leave; and one whose replay would rebuild more dead lineage than the budget can spare
// (Note [A restore needs its dead lineage's memory]), which could only leave as a last
// resort, and whose replay then often ran out of memory many levels deep. A gradient of
// the residual stream late in BERT's backward is the second kind: its replay runs back
// through the attention's backward into the forward, 17–31 levels, and BERT's least
// budget was twice its floor for it. With spill on (the default since the thirty-first
// session, 2026-11-29) both leave as copies in the host pool instead (route kSwap), priced
// at kRelocatePenalty times their bytes so the engine takes anything recomputable first;
// they come back with one copy, as under swap, bit for bit. The pool is made at the first
// spill and grows as it is used (Note [A host pool made at first use] in
// allocator/src/swap.cpp), so a program that never spills holds no host memory. When the
// pool has no room for a victim too dear to replay, it stays, offered to the engine again
// at once as a victim of last resort (spill_refused), dropped only where the alternative
// is an out-of-memory error, as with spill off. Dropping it at once instead (an earlier
// form) took `selective_ckpt` under recompute at 0.4 of its peak from training to an
// out-of-memory error 27 replays deep, its pool full. Measured (tools/bench_remat.py, the
// zoo, window, least budget as a fraction of the peak, spill off -> on): BERT 0.403 ->
// 0.302, ViT 0.184 -> 0.165, DenseNet 0.391 -> 0.373, CNN 0.258 -> 0.217, transformer 0.239
// -> 0.202; the other nine the same. Of the 75 user programs that ran out of memory under
// recompute at 0.4 of their peaks, 17 train with the default pool, bit-identical, and the
// 102 that trained still do (BENCHMARKS.md).
//
// Note [How large a spill pool]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The pool's default under recompute is as much as the budget, at most a sixteenth of the
// host's RAM (pyalloc.registry.host_pool_size). Measured on the 23 user programs that ran
// out of memory under recompute at 0.4 of their peaks and trained with a 256 MiB pool (an
// earlier form, the pool allocated whole at start): with a quarter of the budget 9
// trained, with the budget itself 20. At the largest, their
// pools' peak use was 0.3 to 5.4 times the budget (clean copies kept while there is room
// count too). A sixteenth of the RAM bounds what one process pins on a host whose GPUs
// each run one.

Registry::Route Registry::route_locked(Node* node, bool eager) {
  if (node->clean) return Route::kFree;
  if (!node->lineage()) return can_relocate_ ? Route::kSwap : Route::kNone;
  if (can_relocate_ && replay_too_dear(node) && !node->spill_refused) return Route::kSwap;
  if (settings_.policy == Policy::kRecompute || eager) return Route::kDrop;  // eager: a copy would likely be wasted
  if (settings_.policy == Policy::kSwap) return Route::kSwap;
  // Hybrid (Capuchin): swap when both copies hide in the compute between the last forward
  // use and the first backward use, as measured last iteration; with no history, swap.
  auto it = gaps_prev_.find({node->ordinal, node->nbytes});
  if (it == gaps_prev_.end() ||
      2.0 * static_cast<double>(node->nbytes) * 1e9 <= static_cast<double>(it->second) * copy_bw_) {
    ++counters_.chose_swap;
    return Route::kSwap;
  }
  ++counters_.chose_recompute;
  return Route::kDrop;
}

const char* const kEvictedDataMessage =
    "pyalloc: this tensor's memory was evicted by the registry (policy recompute, swap or "
    "hybrid), and its data was read where the registry could not bring it back first; "
    "reading it would have read memory that is not there. Evicted tensors come back for aten "
    "ops on the thread that started the policy, on autograd's threads and on threads started "
    "with `threading` after it; not on a thread that was already running when the policy "
    "started, nor inside `pyalloc.registry.active().paused()`, nor for a kernel launched on "
    "tensor.data_ptr() (Triton, a CUDA extension). "
    "Start such threads after pyalloc.install(); call such kernels from a torch.library "
    "custom op, or keep their inputs resident with "
    "`with pyalloc.registry.active().holding([tensors]):`.";

void Registry::free_data_locked(Node* node, c10::StorageImpl* s) {
  // The old DataPtr's deleter returns the block to the engine (which never calls back).
  s->set_data_ptr_noswap(c10::DataPtr(nullptr, node->device));
  s->set_nbytes(0);
  refuse_data_access(s, /*evicted=*/true);  // Note [Reads of evicted memory] in node.h
}

bool Registry::evict_locked(Node* node, bool eager) {
  if (node->evicted || node->pins || node->fixed) return false;
  c10::intrusive_ptr<c10::StorageImpl> s = node->storage();
  if (!s) {
    mark_dead_locked(node);  // already gone, with its memory
    return false;
  }
  if (!s->resizable()) {  // not the allocator's memory to free: keep it, as it is
    drop_copy_locked(node);
    node->fixed = true;
    // Its lineage goes (never evicted, never recomputed), unless readers of its earlier
    // versions still replay through it (Note [Readers of an earlier version]).
    if (!node->stale_readers) freeze_locked(node);
    return false;
  }
  Route route = route_locked(node, eager);
  if (route == Route::kNone) return false;
  if (route == Route::kSwap && !swap_out_locked(node)) {
    // No room for a copy. Under recompute a victim too dear to replay stays, and is
    // offered again as a victim of last resort, to be dropped as with spill off (Note
    // [Spilling under recompute]; evict() re-marks it).
    if (!can_swap_ && node->lineage() && replay_too_dear(node)) node->spill_refused = true;
    if (!node->lineage() || replay_too_dear(node)) return false;
    route = Route::kDrop;
  }
  free_data_locked(node, s.get());
  node->evicted = true;
  node->arriving = node->prefetched = false;
  node->marked = false;
  return true;
}

std::size_t Registry::evict(const std::uint64_t* handles, std::size_t count) {
  Lock lock(mu_);
  Burial burial(*this, lock);
  if (!active_.load()) return 0;
  notice_deaths_locked(/*all=*/true);  // the dead go before anything that lives
  refresh_budget_locked();
  std::size_t done = 0;
  for (std::size_t i = 0; i < count; ++i) {
    Node* node = find_locked(handles[i]);
    if (!node) continue;  // forgotten meanwhile
    if (evict_locked(node, /*eager=*/false)) {
      ++done;
    } else {
      node->marked = false;  // the engine dropped it from its set; offered again later
      // Too dear to replay, and the pool had no room: offered again at once, as a victim
      // of last resort (Note [Spilling under recompute]). The engine calls out unlocked.
      if (node->spill_refused) mark_locked(node);
    }
  }
  counters_.evictions += static_cast<std::int64_t>(done);
  if (last_evict_sweep_ != counters_.ops) {  // memory is short: unused storages go too
    last_evict_sweep_ = counters_.ops;
    sweep_locked(/*tidy=*/false);
  }
  return done;
}

// --- compaction (Note [Relocation] in allocator/src/engine.h) ----------------------------------

namespace {
bool movable_now(const Node& n) {
  return !(n.evicted || n.pins || n.fixed || n.arriving) && n.nbytes > 0;
}
}  // namespace

std::size_t Registry::movable(std::uintptr_t* out, std::size_t capacity) {
  Lock lock(mu_);
  if (!active_.load()) return 0;
  std::size_t n = 0;
  for (Node* node = nodes_.oldest(); node; node = node->newer) {
    if (!movable_now(*node)) continue;
    c10::intrusive_ptr<c10::StorageImpl> s = node->storage();
    void* ptr = s ? data_of(&*s) : nullptr;
    if (!ptr) continue;
    if (n < capacity) out[n] = reinterpret_cast<std::uintptr_t>(ptr);
    ++n;
  }
  return n;
}

// Moves the storage at each from[i] into the block the engine reserved at to[i]: the new
// block is allocated under the engine's placement, the bytes copied on the current stream,
// and the two DataPtrs exchanged, so every tensor and view of the storage follows with
// the same bytes and the same version. Dropping the spare frees the old block.
std::size_t Registry::relocate(const std::uintptr_t* from, const std::uintptr_t* to,
                               std::size_t count) {
  Lock lock(mu_);
  if (!active_.load()) return 0;
  std::unordered_map<std::uintptr_t, Node*> at;
  for (Node* node = nodes_.oldest(); node; node = node->newer) {
    if (!movable_now(*node)) continue;
    c10::intrusive_ptr<c10::StorageImpl> s = node->storage();
    if (s && data_of(&*s)) at[reinterpret_cast<std::uintptr_t>(data_of(&*s))] = node;
  }
  const engine_api::Api& api = engine_api::api();
  std::size_t moved = 0;
  for (std::size_t i = 0; i < count; ++i) {
    auto it = at.find(from[i]);
    if (it == at.end()) continue;
    Node* node = it->second;
    c10::intrusive_ptr<c10::StorageImpl> s = node->storage();
    if (!s || !movable_now(*node)) continue;
    pin_locked(node);  // neither evicted nor moved by anyone else meanwhile
    c10::DataPtr fresh;
    bool copied = false;
    {
      Unlocked unlocked(lock);
      try {
        api.set_thread_placement(reinterpret_cast<void*>(to[i]));
        fresh = node->allocator->allocate(node->nbytes);
        api.set_thread_placement(nullptr);
        if (reinterpret_cast<std::uintptr_t>(fresh.get()) == to[i]) {
          auto spare = c10::make_intrusive<c10::StorageImpl>(
              c10::StorageImpl::use_byte_size_t(), node->nbytes, std::move(fresh),
              node->allocator, /*resizable=*/true);
          {
            OwnOpGuard guard;
            copy_bytes(spare, s, node->nbytes);
          }
          fresh = std::move(spare->mutable_data_ptr());
          spare->set_nbytes(0);
          copied = true;
        }
      } catch (const std::exception& e) {
        api.set_thread_placement(nullptr);
        std::fprintf(stderr, "pyalloc: warning: compaction could not take its destination: %s\n",
                     e.what());
      }
    }
    if (copied) {
      // The old memory goes out with `fresh` (freed into the engine at the end of scope),
      // and its evictable mark with it: unpinning marks the new block.
      fresh = s->set_data_ptr(std::move(fresh));
      node->marked = false;
      ++moved;
    }
    unpin_locked(node);
  }
  counters_.relocations += static_cast<std::int64_t>(moved);
  return moved;
}

}  // namespace pyalloc::registry
